"""Latent cards: the nearest decoder neighbours, the streaming top contexts per latent and the per-latent
table, each against brute force (full cosine matrices, full sorts of the dense code matrix)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from saegeo.geometry.dictionary import nearest_decoder_neighbours, row_norms


def _brute_neighbours(w: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Full N × N float64 cosine matrix, self and zero rows excluded, sorted by (−cos, index)."""
    norms = np.linalg.norm(w, axis=1)
    alive = norms > 0
    unit = np.where(alive[:, None], w / np.where(alive, norms, 1)[:, None], 0)
    cos = unit @ unit.T
    n = len(w)
    idx = np.full((n, k), -1)
    out = np.full((n, k), np.nan)
    for i in range(n):
        if not alive[i]:
            continue
        cand = [j for j in range(n) if j != i and alive[j]]
        cand.sort(key=lambda j: (-cos[i, j], j))
        for slot, j in enumerate(cand[:k]):
            idx[i, slot], out[i, slot] = j, cos[i, j]
    return idx, out


@pytest.mark.parametrize("block_rows", [7, 64, 4096])
def test_nearest_decoder_neighbours_equal_the_full_cosine_matrix(block_rows):
    g = torch.Generator().manual_seed(0)
    w = torch.randn(150, 9, generator=g)
    w[10] = 3.0 * w[20] + 1e-3 * torch.randn(9, generator=g)  # a near duplicate: each other's nearest
    w[33] = 0.0  # a zero row: nobody's neighbour, has none
    idx, cos = nearest_decoder_neighbours(w, 5, block_rows)
    ref_idx, ref_cos = _brute_neighbours(w.double().numpy(), 5)
    assert idx.shape == (150, 5) and cos.dtype == torch.float64
    np.testing.assert_array_equal(idx.numpy(), ref_idx)
    np.testing.assert_allclose(cos.numpy(), ref_cos, rtol=0, atol=1e-12)  # float64 recomputation
    assert idx[10, 0] == 20 and idx[20, 0] == 10 and (idx[33] == -1).all() and torch.isnan(cos[33]).all()
    assert not (idx == 33).any()


def test_nearest_decoder_neighbours_with_fewer_rows_than_k_pad_with_minus_one():
    w = torch.tensor([[1.0, 0.0], [1.0, 1.0], [0.0, 1.0]])
    idx, cos = nearest_decoder_neighbours(w, 4, 2)
    assert idx[1].tolist() == [0, 2, -1, -1]  # tie at cos = 1/√2: the smaller index first
    assert idx[0].tolist() == [1, 2, -1, -1]
    np.testing.assert_allclose(cos[0, :2].numpy(), [2**-0.5, 0.0], atol=1e-15)


# =========================================================================== streaming top-k and histogram
def _full_sort_top(codes: np.ndarray, k: int) -> list[list[tuple[float, int]]]:
    """Per latent: its (a, row) with a > 0 sorted by (−a, row), the first k (a full sort of the column)."""
    out = []
    for i in range(codes.shape[1]):
        rows = np.nonzero(codes[:, i] > 0)[0]
        ranked = sorted(((float(codes[r, i]), int(r)) for r in rows), key=lambda t: (-t[0], t[1]))
        out.append(ranked[:k])
    return out


def _sparse_codes(n, n_latents, seed):
    g = torch.Generator().manual_seed(seed)
    codes = torch.rand(n, n_latents, generator=g)
    codes = torch.where(torch.rand(n, n_latents, generator=g) < 0.15, (codes * 8).round() / 4, 0.0)  # many ties
    return codes


@pytest.mark.parametrize("layout", ["dense", "sparse"])
@pytest.mark.parametrize("batch", [1, 17, 500])
def test_streaming_top_k_equals_a_full_sort_with_ties(batch, layout):
    from saegeo.geometry.latent_stats import LatentTopK

    codes = _sparse_codes(500, 30, 0)
    codes[:, 7] = 0.0  # a latent that never fires: no entries
    acc = LatentTopK(30, 6, start=1000)
    for lo in range(0, 500, batch):  # dense: screened directly (the first batches cut to their own top k)
        part = codes[lo : lo + batch]
        acc.add(part if layout == "dense" else part.to_sparse())
    ref = _full_sort_top(codes.numpy(), 6)
    for i in range(30):
        values, rows = acc.top(i)
        assert [(float(v), int(r) - 1000) for v, r in zip(values, rows)] == ref[i], i
    assert acc.top(7)[0].numel() == 0 and acc.seen == 1500


def test_streaming_top_k_of_two_parts_merged_equals_the_whole_stream():
    from saegeo.geometry.latent_stats import LatentTopK

    codes = _sparse_codes(400, 12, 1)
    whole = LatentTopK(12, 5).add(codes)
    first, second = LatentTopK(12, 5).add(codes[:150]), LatentTopK(12, 5, start=150).add(codes[150:])
    merged = LatentTopK.from_state_dict(second.state_dict()).merge(first)  # either order
    assert torch.equal(merged.values, whole.values) and torch.equal(merged.rows, whole.rows)


def test_latent_histogram_counts_every_nonzero_activation_in_its_log_bin():
    from saegeo.geometry.latent_stats import HISTOGRAM_EDGES, LatentHistogram

    g = torch.Generator().manual_seed(2)
    codes = torch.where(torch.rand(300, 5, generator=g) < 0.4, 10 ** (10 * torch.rand(300, 5, generator=g) - 5), 0.0)
    codes[0, 1] = 2e5  # the open last bin
    codes[1, 0], codes[2, 0], codes[3, 0] = 1.0, 1.5, 2.0**-14  # exactly on an edge: in the bin it opens
    hist = LatentHistogram(5)
    for lo in range(0, 300, 64):
        hist.add(codes[lo : lo + 64])
    edges = [float(e) for e in HISTOGRAM_EDGES]
    for i in range(5):
        ref = [0] * (len(edges) - 1)
        for v in codes[:, i].tolist():  # float32 values, compared as float64 with the exact edges
            if v > 0:
                ref[next(b for b in range(len(ref)) if edges[b] <= v < edges[b + 1])] += 1
        assert hist.counts[i].tolist() == ref
        h = hist.histogram(i, max_value=float(codes[:, i].max()))
        assert sum(h["counts"]) == int((codes[:, i] > 0).sum()) and len(h["edges"]) == len(h["counts"]) + 1
        assert h["counts"][0] > 0 and h["counts"][-1] > 0  # trimmed to the occupied bins
    assert hist.histogram(1, 2e5)["edges"][-1] == 2e5


def test_a_batch_cut_at_its_own_bin_edge_keeps_the_ties_on_that_edge():
    """The first batch lets in more than 2k·N entries: they are cut per latent at the lower edge of the bin where
    the batch's count from the top reaches k. Latent 0: 2 entries at 3.5 (bin [3, 4)) and 4 at 2.0 exactly, the
    lower edge of [2, 3) where the count reaches k = 5: the k-th is one of the ties on the edge (the earliest
    rows win); a spread of smaller values below is cut. Latent 1 has fewer than k entries: nothing is cut."""
    from saegeo.geometry.latent_stats import LatentTopK

    g = torch.Generator().manual_seed(3)
    codes = torch.zeros(200, 3)
    codes[:, 0] = torch.where(torch.rand(200, generator=g) < 0.9, 0.1 + 1.8 * torch.rand(200, generator=g), 0.0)
    codes[[150, 40], 0] = 3.5
    codes[[120, 7, 180, 60], 0] = 2.0
    codes[[5, 9, 30], 1] = torch.tensor([0.5, 0.25, 0.5])
    codes[:, 2] = torch.where(torch.rand(200, generator=g) < 0.5, 2.0, 0.0)  # all tied, in one bin
    for layout in ("dense", "sparse"):
        acc = LatentTopK(3, 5).add(codes if layout == "dense" else codes.to_sparse())
        ref = _full_sort_top(codes.numpy(), 5)
        for i in range(3):
            values, rows = acc.top(i)
            assert [(float(v), int(r)) for v, r in zip(values, rows)] == ref[i], (layout, i)
    assert LatentTopK(3, 5).add(codes).top(0)[1].tolist() == [40, 150, 7, 60, 120]


def test_the_scattered_histogram_add_of_a_wide_dictionary_counts_as_the_dense_one(monkeypatch):
    """Above DENSE_COUNT_CELLS (latent, bin) cells a batch is added entry by entry: the same counts."""
    from saegeo.geometry import latent_stats

    codes = _sparse_codes(300, 20, 4)
    dense = latent_stats.LatentHistogram(20).add(codes).add(codes[:100])
    monkeypatch.setattr(latent_stats, "DENSE_COUNT_CELLS", 0)
    scattered = latent_stats.LatentHistogram(20).add(codes).add(codes[:100])
    assert torch.equal(scattered.counts, dense.counts)
    assert int(dense.counts.sum()) == int((codes > 0).sum() + (codes[:100] > 0).sum())


@pytest.mark.parametrize("latent", [7, -1])
def test_a_latent_index_outside_the_accumulators_is_a_clear_error(latent):
    from saegeo.errors import BadInputError
    from saegeo.geometry.latent_stats import LatentHistogram, LatentTopK
    from saegeo.sae.metrics import _COO

    coo = _COO(2, torch.tensor([0, 1]), torch.tensor([1, latent]), torch.tensor([1.0, 2.0]))
    for acc in (LatentTopK(4, 3), LatentHistogram(4)):
        with pytest.raises(BadInputError, match=f"latent index {latent} but"):
            acc.add(coo)


# =========================================================================== cards from a store
N_ROWS, D, WINDOW = 3000, 8, 32


def _window_positions(n):
    """Windows of WINDOW positions, except that rows 1000..1002 are missing from their window (an exclusion)."""
    pos = torch.arange(n) % WINDOW
    pos[1003:] = (torch.arange(1003, n) + 3) % WINDOW  # the window restarts its numbering after the gap
    pos[1003:1010] = torch.arange(1003, 1010) % WINDOW + 3  # …and rows 1003.. continue 3 past the gap
    return pos


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """A store with token ids and positions and a ReLU SAE whose latent i reads x_i − 1 (codes are the
    coordinates above 1): planted rows 17, 503, 1200 carry latent 3's three largest codes 8, 7, 6.5."""
    from saegeo.activations.store import ActivationStore, StoreWriter
    from saegeo.sae.model import SAE, SAEConfig

    root = tmp_path_factory.mktemp("planted")
    g = torch.Generator().manual_seed(0)
    x = torch.randn(N_ROWS, D, generator=g)
    x[:, 3] = x[:, 3].clamp(max=4.0)
    x[17, 3], x[503, 3], x[1200, 3] = 9.0, 8.0, 7.5
    token_ids = (torch.arange(N_ROWS) * 7) % 1000 + 2000
    positions = _window_positions(N_ROWS)
    with StoreWriter(root / "store", d=D, hook="blocks.0.hook_resid_post", model="toy", shard_rows=700) as w:
        for lo in range(0, N_ROWS, 300):
            w.append(x[lo : lo + 300], token_ids=token_ids[lo : lo + 300], positions=positions[lo : lo + 300])
    sae = SAE(SAEConfig(d_in=D, d_sae=6, activation="relu")).init_weights(torch.Generator().manual_seed(1))
    norms = torch.tensor([1.0, 1.0, 2.0, 1.0, 0.5, 1.0])
    with torch.no_grad():
        sae.W_enc.zero_()
        sae.W_enc[torch.arange(6), torch.arange(6)] = 1.0
        sae.b_enc.fill_(-1.0)
        sae.b_dec.zero_()
        sae.W_dec.zero_()
        sae.W_dec[torch.arange(6), torch.arange(6)] = norms
    sae.save(root / "sae")
    return {
        "store": ActivationStore(root / "store"),
        "sae": sae,
        "x": x,
        "ids": token_ids,
        "pos": positions,
        "norms": norms,
        "root": root,
    }


def _brute_contexts(p, latent, k, before=16, after=4):
    """Dense codes of every row at once, folded by the decoder norms, fully sorted; contexts from the arrays."""
    with torch.no_grad():
        codes = (p["sae"].encode(p["x"]) * p["norms"]).numpy()
    ids, pos = p["ids"].tolist(), p["pos"].tolist()
    out = []
    for a, r in _full_sort_top(codes, k)[latent]:
        lo = r
        while lo > 0 and r - lo < before and pos[lo - 1] == pos[lo] - 1:
            lo -= 1
        hi = r
        while hi + 1 < len(ids) and hi - r < after and pos[hi + 1] == pos[hi] + 1:
            hi += 1
        out.append(
            {
                "row": r,
                "activation": a,
                "token_id": ids[r],
                "position": pos[r],
                "text": f"#{ids[r]}",
                "context": [f"#{t}" for t in ids[lo:r]],
                "after": [f"#{t}" for t in ids[r + 1 : hi + 1]],
            }
        )
    return out


def test_report_cards_of_planted_latents_equal_brute_force(planted):
    from saegeo.report import ReportOptions, geometry_report

    opts = ReportOptions(progress=False, batch_rows=500, latents=(3, 2, 4), latent_contexts=8)
    report = geometry_report(planted["store"], {"planted": planted["sae"]}, options=opts)
    s = report.saes[0]
    cards = {c["id"]: c for c in s.latents}
    assert {3, 2, 4} <= set(cards) and all("asked" in cards[i]["why"] for i in (3, 2, 4))
    top = cards[3]["top_contexts"]
    assert [c["row"] for c in top[:3]] == [17, 503, 1200]
    assert [c["activation"] for c in top[:3]] == [8.0, 7.0, 6.5]  # x − 1, decoder norm 1: exact in float32
    for i in (3, 2, 4):  # every field of every context, folded by decoder norms 1, 2 and 0.5
        assert cards[i]["top_contexts"] == _brute_contexts(planted, i, 8), i
    # the window around the gap: rows 1000..1002 belong to no context of rows after them
    with torch.no_grad():
        codes = planted["sae"].encode(planted["x"]) * planted["norms"]
    assert cards[2]["firing_rate"] == pytest.approx(float((codes[:, 2] > 0).double().mean()), abs=0)
    assert sum(cards[2]["histogram"]["counts"]) == int((codes[:, 2] > 0).sum())
    assert cards[2]["decoder_norm"] == pytest.approx(2.0, abs=1e-12)
    assert cards[2]["mean_sq_activation"] == pytest.approx(float(codes[:, 2].double().square().mean()), rel=1e-12)
    table = s.latent_table
    assert table["nn_id"][0] != 0 and all(len(v) == 6 for v in table.values())
    assert s.latent_info["n_contexts"] == 8 and s.latent_info["decoded"] is False


def test_contexts_do_not_cross_a_gap_in_positions(planted):
    from saegeo.report.latent_cards import window_around

    ids, pos = planted["ids"], planted["pos"]
    before, after = window_around(ids[990:1015], pos[990:1015], 1004 - 990, 16, 4)
    assert before == ids[1003:1004].tolist()  # position 1003 follows a gap: the context starts there
    assert after == ids[1005:1009].tolist()


# =========================================================================== a real store, decoded
TINY = dict(
    d_model=32,
    n_layers=1,
    n_heads=4,
    d_head=8,
    d_mlp=64,
    n_ctx=64,
    d_vocab=30522,
    act_fn="gelu",
    normalization_type="LN",
    seed=0,
)


@pytest.fixture(scope="module")
def real_store(tmp_path_factory):
    """A store cached by `saegeo cache` from a tiny model given as a JSON config (so its manifest names a model
    whose tokenizer, MiniLM's, loads offline), over a few pages of Python's own documentation."""
    import json
    from pydoc_data.topics import topics

    from saegeo.activations.cache import CacheConfig, cache_activations
    from saegeo.activations.store import ActivationStore

    root = tmp_path_factory.mktemp("real")
    (root / "model.json").write_text(json.dumps(TINY))
    (root / "docs.jsonl").write_text("\n".join(json.dumps({"text": topics[k][:1200]}) for k in sorted(topics)[:5]))
    hook = "blocks.0.hook_resid_post"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        cache_activations(
            CacheConfig(
                model=str(root / "model.json"),
                hooks=(hook,),
                corpus=str(root / "docs.jsonl"),
                context=24,
                out=str(root / "acts"),
                shard_rows=256,
                batch_windows=4,
                max_tokens=1200,
                progress=False,
            )
        )
    finally:
        torch.set_num_threads(threads)
    return ActivationStore(root / "acts" / hook)


def test_streaming_top_k_equals_a_full_sort_on_a_real_store_and_decodes_tokens(real_store, tmp_path):
    from transformers import AutoTokenizer

    from saegeo.activations.models import minilm_path
    from saegeo.report import ReportOptions, geometry_report
    from saegeo.sae.model import SAE, SAEConfig

    sae = SAE(SAEConfig(d_in=32, d_sae=48, activation="relu")).init_weights(torch.Generator().manual_seed(3))
    batch = 100
    opts = ReportOptions(
        progress=False, batch_rows=batch, latents=tuple(range(48)), latent_contexts=20, artifact_components=0
    )
    report = geometry_report(real_store, {"r": sae}, options=opts)
    s = report.saes[0]
    x = torch.cat(list(real_store.iter_batches(batch)))
    norms = row_norms(sae.W_dec.detach()).float()  # the fold a_i·‖W_dec,i‖ of the report (float64 norms, rounded)
    with torch.no_grad():  # the same batches as the pass: the same float32 codes, then one full sort
        codes = torch.cat([sae.encode(x[lo : lo + batch]) * norms for lo in range(0, len(x), batch)]).numpy()
    ref = _full_sort_top(codes, 20)
    ids = torch.cat([real_store.read_token_ids(i) for i in range(len(real_store.shards))])
    positions = torch.cat([real_store.read_positions(i) for i in range(len(real_store.shards))])
    tok = AutoTokenizer.from_pretrained(str(minilm_path()), local_files_only=True)
    cards = {c["id"]: c for c in s.latents}
    assert set(cards) == set(range(48)) and s.latent_info["decoded"] is True
    assert sum(len(ref[i]) for i in range(48)) > 500  # most latents fire often enough to fill their 20
    for i in range(48):
        got = [(c["activation"], c["row"]) for c in cards[i]["top_contexts"]]
        assert got == [(pytest.approx(a, abs=0), r) for a, r in ref[i]], i
        for c in cards[i]["top_contexts"]:  # the pieces of the window read as the tokenizer decodes it
            r = c["row"]
            window = ids[r - len(c["context"]) : r + len(c["after"]) + 1].tolist()
            assert c["token_id"] == int(ids[r]) and len(c["context"]) == min(16, int(positions[r]))
            assert "".join(c["context"] + [c["text"]] + c["after"]) == tok.decode(window)
            alone = tok.decode([c["token_id"]])
            assert c["text"].strip() in (alone, alone.removeprefix("##"))  # a WordPiece continuation joins on


# =========================================================================== the command line
def test_saegeo_latents_end_to_end_writes_the_cards_of_the_asked_and_of_the_top_latents(planted, tmp_path, capsys):
    import json

    from saegeo.cli import main

    store, sae_dir = str(planted["store"].path), str(planted["root"] / "sae")
    out = tmp_path / "cards"
    args = ["latents", sae_dir, "--acts", store, "--latents", "3,2", "--contexts", "5", "--out", str(out)]
    assert main([*args, "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert "latent 3  [asked]" in printed and "row 17" in printed
    doc = json.loads((out / "latents.json").read_text())
    [s] = doc["saes"]
    assert [c["id"] for c in s["latents"]] == [3, 2]
    assert s["latents"][0]["top_contexts"] == _brute_contexts(planted, 3, 5)
    assert s["latents"][1]["top_contexts"] == _brute_contexts(planted, 2, 5)
    assert (out / "latents.csv").read_text().splitlines()[0].startswith("sae,id,rate,")
    assert {p.name for p in out.iterdir()} >= {"summary.txt", "latents.md", "latents.html", "latents.csv"}
    assert main([*args, "--no-progress"]) == 2  # nothing overwritten without --overwrite
    assert "--overwrite" in capsys.readouterr().err
    # --top N --by COLUMN: the N latents with the largest column (here E[a²], from the dense codes)
    out2 = tmp_path / "top"
    assert (
        main(
            [
                "latents",
                sae_dir,
                "--acts",
                store,
                "--top",
                "2",
                "--by",
                "mean_sq_activation",
                "--out",
                str(out2),
                "--no-progress",
                "--no-neighbours",
            ]
        )
        == 0
    )
    with torch.no_grad():
        codes = planted["sae"].encode(planted["x"]) * planted["norms"]
    expected = codes.double().square().mean(0).argsort(descending=True)[:2].tolist()
    cards = json.loads((out2 / "latents.json").read_text())["saes"][0]["latents"]
    assert [c["id"] for c in cards] == expected and cards[0]["why"] == ["top:mean_sq_activation"]
    assert cards[0]["neighbours"] == []


def test_saegeo_report_writes_the_latent_table_beside_report_json(planted, tmp_path, capsys):
    import csv
    import json

    from saegeo.cli import main

    out = tmp_path / "rep"
    rc = main(
        [
            "report",
            "--acts",
            str(planted["store"].path),
            "--sae",
            f"p={planted['root'] / 'sae'}",
            "--out",
            str(out),
            "--format",
            "json",
            "--latents",
            "4",
            "--no-progress",
        ]
    )
    assert rc == 0
    report = json.loads((out / "report.json").read_text())
    [s] = report["saes"]
    assert any(c["id"] == 4 and "asked" in c["why"] for c in s["latents"])
    rows = list(csv.DictReader((out / "latents.csv").open()))
    assert [int(r["id"]) for r in rows] == list(range(6)) and {r["sae"] for r in rows} == {"p"}
    assert [float(r["rate"]) for r in rows] == s["latent_table"]["rate"]  # floats written exactly
    assert json.loads((out / "latents.json").read_text())["saes"][0]["latents"] == s["latents"]


@pytest.mark.parametrize(
    "extra,message",
    [
        (["--latents", "6"], "latent 6 is not a latent of SAE 'sae': its ids are 0 … 5"),
        (["--latents", "-1"], "latents must be >= 0"),
        (["--latents", "2,x"], "cannot read a comma-separated list"),
        (["--latents", "1", "--top", "3"], "give --latents IDS or --top N"),
        (["--by", "colour"], "invalid choice"),
    ],
)
def test_bad_latent_ids_are_one_line_and_exit_2(planted, tmp_path, capsys, extra, message):
    from saegeo.cli import main

    args = ["latents", str(planted["root"] / "sae"), "--acts", str(planted["store"].path), "--out", str(tmp_path / "o")]
    try:
        rc = main([*args, *extra, "--no-progress"])
    except SystemExit as exit_:  # argparse refuses what it cannot parse
        rc = exit_.code
    err = capsys.readouterr().err
    assert rc == 2 and message in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "o").exists()


def test_saegeo_report_refuses_a_latent_outside_an_sae_before_the_pass(planted, tmp_path, capsys):
    from saegeo.cli import main

    rc = main(
        [
            "report",
            "--acts",
            str(planted["store"].path),
            "--sae",
            str(planted["root"] / "sae"),
            "--out",
            str(tmp_path / "r"),
            "--latents",
            "1,99",
            "--no-progress",
        ]
    )
    err = capsys.readouterr().err
    assert rc == 2 and "latent 99 is not a latent of SAE 'sae'" in err and len(err.strip().splitlines()) == 1


# =========================================================================== the tokenizer of a store's model
_TOKENIZER_PROBE = """import sys
from saegeo.activations.models import tokenizer_for
tok = tokenizer_for(sys.argv[1])
heavy = ('transformers', 'transformer_lens', 'huggingface_hub._snapshot_download')
print(tok is not None, sorted(m for m in heavy if m in sys.modules))
"""


def _probe_tokenizer(name: str, hf_cache) -> str:
    """tokenizer_for(name) in a fresh interpreter with HF_HUB_CACHE = hf_cache: found?, the heavy modules imported."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "HF_HUB_CACHE": str(hf_cache), "HF_HUB_OFFLINE": "1"}
    run = subprocess.run(
        [sys.executable, "-c", _TOKENIZER_PROBE, name], env=env, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr
    return run.stdout.strip()


def test_a_model_name_found_nowhere_imports_neither_transformers_nor_transformer_lens(tmp_path):
    """A store written by a script (model "bench") has no tokenizer: finding that out must not import
    transformer-lens for its name mapping (~8 CPU s, a third of a 100k-row report), transformers (~1 s) nor
    huggingface_hub's download code (~1 s)."""
    assert _probe_tokenizer("bench", tmp_path / "empty-cache") == "False []"


def test_a_repo_id_in_the_hub_cache_is_found_as_given_without_transformer_lens(tmp_path):
    """A snapshot of "acme/tok" in the Hugging Face cache (refs/main → snapshots/<commit>, MiniLM's tokenizer files):
    found under its own id, without asking transformer-lens to map the name."""
    import shutil

    from saegeo.activations.models import minilm_path

    repo = tmp_path / "hub" / "models--acme--tok"
    commit = "0" * 40
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "config.json"):
        shutil.copy(minilm_path() / name, snapshot / name)
    assert (
        _probe_tokenizer("acme/tok", tmp_path / "hub") == "True ['huggingface_hub._snapshot_download', 'transformers']"
    )


@pytest.mark.parametrize("table_max", [40, 39, 0])
def test_above_neighbour_table_max_only_the_carded_latents_get_neighbours_and_the_report_says_so(table_max):
    """At or below the cap every latent's neighbours fill the table; above it (a 262k dictionary's 3·10¹⁴ flops)
    the table's two columns are None, the cards keep their exact neighbours, and a note names which ran."""
    from saegeo.report import ReportOptions, geometry_report
    from saegeo.sae.model import SAE, SAEConfig

    g = torch.Generator().manual_seed(3)
    sae = SAE(SAEConfig(d_in=D, d_sae=40, activation="relu")).init_weights(g)
    x = torch.randn(600, D, generator=g)
    opts = ReportOptions(progress=False, latents=(5, 17, 33), neighbour_table_max=table_max)
    report = geometry_report(x, {"r": sae}, options=opts)
    [s] = report.saes
    ref_idx, ref_cos = _brute_neighbours(sae.W_dec.detach().double().numpy(), 5)
    cards = {c["id"]: c for c in s.latents}
    assert {5, 17, 33} <= set(cards)
    for i, card in cards.items():  # exact, whichever search ran
        assert [n["id"] for n in card["neighbours"]] == ref_idx[i].tolist()
        assert [n["cos"] for n in card["neighbours"]] == pytest.approx(ref_cos[i].tolist(), abs=1e-12)
    notes = [n for n in report.notes if "--neighbour-table-max" in n]
    if table_max >= 40:
        assert s.latent_info["neighbours"] == "every latent" and not notes
        assert s.latent_table["nn_id"] == ref_idx[:, 0].tolist()
    else:
        assert s.latent_info["neighbours"] == "carded latents"
        assert s.latent_table["nn_id"] == [None] * 40 and s.latent_table["nn_cos"] == [None] * 40
        assert len(notes) == 1 and "'r'" in notes[0] and f"withheld above {table_max:,} latents" in notes[0]
        assert "carded latents only" in s.latent_info["note"]


def test_latents_by_nn_cos_above_the_neighbour_table_max_is_refused_before_the_pass(planted, tmp_path, capsys):
    from saegeo.cli import main

    args = ["latents", str(planted["root"] / "sae"), "--acts", str(planted["store"].path), "--by", "nn_cos"]
    rc = main([*args, "--neighbour-table-max", "5", "--out", str(tmp_path / "o"), "--no-progress"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "--neighbour-table-max 6" in err, err
    assert not (tmp_path / "o").exists()


def test_latents_and_report_read_each_sae_file_once_and_record_its_cfg_json(planted, tmp_path, monkeypatch):
    """The command lines read each SAE once (the disk check, the verdict, the splice and the pass share it), and the
    object they pass on still reports the directory's name and its cfg.json, as a path did."""
    import json

    import saegeo.sae.model as model_module
    from saegeo.cli import main

    reads = []
    real = model_module.read_dictionary
    monkeypatch.setattr(model_module, "read_dictionary", lambda p: reads.append(str(p)) or real(p))
    store, sae_dir = str(planted["store"].path), planted["root"] / "sae"
    args = ["latents", str(sae_dir), "--acts", store, "--latents", "3", "--out", str(tmp_path / "l"), "--no-progress"]
    assert main(args) == 0
    assert reads == [str(sae_dir)]
    doc = json.loads((tmp_path / "l" / "latents.json").read_text())
    assert doc["saes"][0]["name"] == "sae"
    reads.clear()
    out = tmp_path / "r"
    rc = main(
        ["report", "--acts", store, "--sae", f"p={sae_dir}", "--out", str(out), "--format", "json", "--no-progress"]
    )
    assert rc == 0 and reads == [str(sae_dir)]
    [s] = json.loads((out / "report.json").read_text())["saes"]
    assert s["config"] == json.loads((sae_dir / "cfg.json").read_text())
