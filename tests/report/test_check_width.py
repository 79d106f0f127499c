"""Dictionaries of published width: weights read through a memory map (no copy), the check's results the same as
from weights in memory, no full-matrix copies while checking, and the sampled nearest-neighbour cosines within
their stated error of the exact ones."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from saegeo.geometry.dictionary import nearest_decoder_neighbours, nearest_neighbour_summary
from saegeo.report.dictionary_check import CheckOptions, check_dictionary
from saegeo.sae.formats import Dictionary, read_dictionary
from saegeo.sae.formats.weight_files import is_mapped, read_safetensors
from saegeo.sae.model import SAE

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "fixtures" / "published" / "saelens_jumprelu"
LINUX = sys.platform.startswith("linux")


def _mapped_path(address: int) -> str | None:
    """The file /proc/self/maps names for the mapping holding `address` (None: anonymous or not found)."""
    for line in Path("/proc/self/maps").read_text().splitlines():
        parts = line.split()
        lo, hi = (int(x, 16) for x in parts[0].split("-"))
        if lo <= address < hi:
            return parts[5] if len(parts) > 5 else None
    return None


def test_mapped_read_equals_the_copying_read():
    mapped = read_safetensors(FIXTURE / "sae_weights.safetensors")
    copied = read_safetensors(FIXTURE / "sae_weights.safetensors", mapped=False)
    assert sorted(mapped) == sorted(copied)
    for name, value in copied.items():
        assert mapped[name].dtype == value.dtype and torch.equal(mapped[name], value), name
        assert is_mapped(mapped[name]) and not is_mapped(value)


@pytest.mark.skipif(not LINUX, reason="reads /proc/self/maps")
def test_loaded_weights_are_views_of_the_file_and_writes_stay_private(tmp_path):
    import shutil

    d = tmp_path / "sae"
    shutil.copytree(FIXTURE, d)
    before = (d / "sae_weights.safetensors").read_bytes()
    sae = SAE.load(d)
    weights = (d / "sae_weights.safetensors").resolve()
    for name in ("W_enc", "W_dec", "b_enc", "b_dec", "threshold"):
        t = getattr(sae, name)
        assert _mapped_path(t.data_ptr()) == str(weights), name  # the file's pages, not a heap copy
    with torch.no_grad():
        sae.W_dec.mul_(2.0)  # copy-on-write: this process's pages only
    assert (d / "sae_weights.safetensors").read_bytes() == before


def test_check_and_codes_equal_on_mapped_and_in_memory_weights():
    mapped = SAE.load(FIXTURE)
    found = read_dictionary(FIXTURE)
    copied = SAE.load(Dictionary(found.cfg, {k: v.clone() for k, v in found.tensors.items()}, found.info))
    assert is_mapped(mapped.W_dec) and not is_mapped(copied.W_dec)
    x = torch.randn(16, mapped.cfg.d_in, generator=torch.Generator().manual_seed(0))
    assert torch.equal(mapped.encode(x), copied.encode(x)) and torch.equal(mapped(x), copied(x))
    opts = CheckOptions(progress=False)
    a, b = (check_dictionary(s, options=opts, name="x").to_dict() for s in (mapped, copied))
    a.pop("seconds"), b.pop("seconds")
    assert a == b


CHILD = textwrap.dedent(
    """
    import json, sys, threading, time
    from pathlib import Path
    import torch
    torch.set_num_threads(1)
    from saegeo.report.dictionary_check import CheckOptions, check_dictionary
    from saegeo.sae.model import SAE

    def status(key):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    from saegeo.geometry import fused
    if fused.available():  # the compiled loops' runtime (~45 MB once a process) is part of the baseline, like torch
        import numpy as np
        rows = np.ones((2, 4), np.float32)
        fused.fused_chunk_sums(rows, None, 8, 23), fused.unit_sample_rows(rows, np.zeros(4), np.zeros(4), np.float32)
    # LAPACK's float64 workspace (allocated once a process, by the first Cholesky) is part of the baseline too
    a = torch.ones(64, 64, dtype=torch.float64) + 64 * torch.eye(64, dtype=torch.float64)
    torch.cholesky_solve(a, torch.linalg.cholesky(a))
    peak = {"anon": 0, "rss": 0, "file": 0}
    stop = threading.Event()
    def poll():
        while not stop.is_set():
            peak["anon"] = max(peak["anon"], status("RssAnon"))
            peak["rss"] = max(peak["rss"], status("VmRSS"))
            peak["file"] = max(peak["file"], status("RssFile"))
            time.sleep(0.002)
    base_anon, base_rss, base_file = status("RssAnon"), status("VmRSS"), status("RssFile")
    thread = threading.Thread(target=poll, daemon=True)
    thread.start()
    sae = SAE.load(sys.argv[1])
    time.sleep(0.05)
    after_load = status("RssAnon") - base_anon
    opts = CheckOptions(progress=False, block_rows=512, nearest_exact_rows=2, nearest_sample=256)
    check = check_dictionary(sae, options=opts, name="x")
    time.sleep(0.05)
    stop.set()
    thread.join()
    print(json.dumps({"after_load_anon": after_load, "peak_anon": peak["anon"] - base_anon,
                      "peak_rss": peak["rss"] - base_rss, "peak_file": peak["file"] - base_file,
                      "pairs": check.n_duplicate_pairs}))
    """
)


@pytest.mark.skipif(not LINUX, reason="reads /proc/self/status")
def test_a_100_mb_dictionary_is_loaded_and_checked_without_a_copy(tmp_path):
    """W_enc and W_dec of 100 MB each (32,768 × 768). Loading adds no anonymous memory of that order (the pages
    are the file's); the whole check's anonymous peak is the duplicate screen's 2·N·(128 + 2) float32 plus blocks
    (< 0.5 matrix at block_rows 512), and its file-backed peak W_dec's pages: W_enc is handed back. A float64
    copy, zero-filled parameters or W_enc kept resident each add ≥ one matrix. RSS polled every 2 ms in a child."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from check_bench import write_saelens

    n, d = 32_768, 768
    write_saelens(tmp_path / "sae", n, d, n_dup=2)
    matrix, screens = n * d * 4, 2 * n * (128 + 2) * 4
    # glibc's mmap threshold rises after each large free, so freed blocks stay in the heap and RssAnon would count
    # the allocator's leftovers (73-96 MB over five runs); a fixed threshold makes it count what the check holds
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "MALLOC_MMAP_THRESHOLD_": "131072"}
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(tmp_path / "sae")], capture_output=True, text=True, env=env, timeout=900
    )
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["pairs"] == 2
    assert got["after_load_anon"] < 0.3 * matrix, got
    assert got["peak_anon"] < screens + 0.5 * matrix, got
    assert got["peak_file"] < 1.6 * matrix, got  # W_dec's pages + a chunk of W_enc's; W_enc kept: ≥ 2 matrices


def _population(n: int, d: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, d, generator=g)
    w[: n // 4] += 2.0 * torch.randn(1, d, generator=g)  # a cluster: a skewed, two-humped NN distribution
    w[5] = 0.0
    return w


def test_sampled_neighbours_are_the_exact_ones_of_the_sampled_rows():
    w = _population(600, 12, 0)
    _, exact_cos = nearest_decoder_neighbours(w, 3)
    q = torch.tensor([0, 17, 17, 599, 300])
    idx, cos = nearest_decoder_neighbours(w, 3, 64, queries=q)
    ref_idx, _ = nearest_decoder_neighbours(w, 3)
    assert torch.equal(idx, ref_idx[q]) and torch.allclose(cos, exact_cos[q], rtol=0, atol=1e-12)


def test_sampled_nearest_summary_within_its_stated_error_of_the_exact():
    """Over 60 seeds the exact mean lies within mean ± mean_error_bound (95 % CLT interval) and every exact
    quantile within its DKW interval at the stated rates (≥ 95 % expected; binomial sd over 60 seeds is 2.8 %,
    so ≥ 85 % is 3.5 sd below), and ε = √(ln(2/α)/(2m))."""
    w = _population(3000, 16, 1)
    exact = nearest_neighbour_summary(w, exact_max_rows=10**9)
    assert exact["method"] == "exact" and exact["n_queries"] == exact["n_rows"] == 2999
    mean_hits, quantile_hits, seeds, m = 0, 0, 60, 300
    for seed in range(seeds):
        s = nearest_neighbour_summary(w, exact_max_rows=100, sample=m, seed=seed)
        assert s["method"] == "sampled" and s["n_queries"] == m
        assert s["dkw_epsilon"] == pytest.approx(math.sqrt(math.log(2 / 0.05) / (2 * m)))
        mean_hits += abs(s["mean"] - exact["mean"]) <= s["mean_error_bound"]
        inside = []
        for q, (lo, hi) in s["quantile_intervals"].items():
            true = exact["quantiles"][q]
            inside.append((lo is None or lo <= true) and (hi is None or true <= hi))
        quantile_hits += all(inside)  # DKW holds for all quantiles at once
        assert s["max"] <= exact["max"]  # a sample's max never exceeds the population's
    assert mean_hits / seeds >= 0.85, mean_hits
    assert quantile_hits / seeds >= 0.85, quantile_hits


def test_sampled_error_shrinks_as_one_over_root_m():
    w = _population(3000, 16, 2)
    small = nearest_neighbour_summary(w, exact_max_rows=100, sample=250, seed=0)
    large = nearest_neighbour_summary(w, exact_max_rows=100, sample=1000, seed=0)
    ratio = small["mean_error_bound"] / large["mean_error_bound"]
    assert 1.5 < ratio < 2.7  # √4 = 2, times the ratio of the two sample sd's
    assert small["dkw_epsilon"] / large["dkw_epsilon"] == pytest.approx(2.0)
    assert np.isfinite(small["mean"])


# =========================================================================== check --acts at published width
def _exact_sae(d: int, d_sae: int, seed: int, activation: str = "jumprelu") -> SAE:
    """An SAE on which float32 arithmetic is exact, so any row blocking must give identical bits: W_enc in
    {−1, 0, 1}, b_enc in {−2 … 2} and threshold 1.5 make integer pre-activations (|pre| ≤ 2d + 2 for inputs in
    {−2 … 2}) that never tie the threshold; each decoder row holds four ±1 (‖w_i‖ = 2 exactly, so the folded codes
    are integers too) and b_dec is in {−1, 0, 1}, so x̂ and every sum of codes is an integer below 2^24. TopK (k 8):
    b_enc also carries i/1024 for latent i (d_sae ≤ 1024), so no two latents of a row tie, the codes keep 10 binary
    places and every sum of them and their squares stays exact (< 2^53 in float64, x̂ < 2^24 in float32)."""
    from saegeo.sae.model import SAEConfig

    g = torch.Generator().manual_seed(seed)
    topk = activation == "topk"
    sae = SAE(SAEConfig(d_in=d, d_sae=d_sae, activation=activation, k=8 if topk else None))
    w_dec = torch.zeros(d_sae, d)
    cols = torch.rand(d_sae, d, generator=g).argsort(dim=1)[:, :4]
    w_dec.scatter_(1, cols, torch.randint(0, 2, (d_sae, 4), generator=g).float() * 2 - 1)
    with torch.no_grad():
        sae.W_enc.copy_(torch.randint(-1, 2, (d, d_sae), generator=g).float())
        sae.b_enc.copy_(torch.randint(-2, 3, (d_sae,), generator=g).float())
        if topk:
            sae.b_enc.add_(torch.arange(d_sae) / 1024)
        else:
            sae.threshold.fill_(1.5)
        sae.W_dec.copy_(w_dec)
        sae.b_dec.copy_(torch.randint(-1, 2, (d,), generator=g).float())
    return sae


def _integer_rows(n: int, d: int, seed: int) -> torch.Tensor:
    return torch.randint(-2, 3, (n, d), generator=torch.Generator().manual_seed(seed)).float()


def _metrics_at(monkeypatch, sae: SAE, x: torch.Tensor, latent_block: int, group_rows: int, *, flush: bool = False):
    """SAEMetrics (with ‖ū‖², so the mean-cosine sum runs) and a LatentCollector fed x as one batch, encoded in
    groups of `group_rows` rows, `latent_block` latents at a time; flush: the code accumulator gets each group on
    its own (the path of nearly dense codes)."""
    from saegeo.report.latent_cards import LatentCollector
    from saegeo.sae import metrics

    d_sae = sae.cfg.d_sae
    monkeypatch.setattr(metrics, "encode_latent_block", lambda rows, n, size=4: latent_block)
    if flush:
        monkeypatch.setattr(metrics, "PENDING_CODES_BYTES", 0)
    m = metrics.SAEMetrics(sae, mean_sq_norm=0.25)
    m._group_rows = group_rows
    blocks = _BlockLog(monkeypatch)
    collector = LatentCollector(d_sae, 5)
    m.code_observers.append(collector)
    m.add(x)
    monkeypatch.undo()
    assert max(blocks.latents) == min(latent_block, d_sae) and max(blocks.rows) == min(group_rows, x.shape[0])
    return m, collector


class _BlockLog:
    """Wraps SAE.pre_activation_blocks: the rows and latents of every pre-activation block formed; a whole
    (rows × d_sae) pre-activation matrix through SAE._pre is refused."""

    def __init__(self, monkeypatch, budget: int | None = None):
        self.rows, self.latents = [], []
        real = SAE.pre_activation_blocks

        def blocks(sae, xn, latent_block, after_block=None):
            for latents, pre in real(sae, xn, latent_block, after_block):
                if budget is not None:
                    assert pre.numel() * 4 * 4 <= budget, f"{tuple(pre.shape)} pre-activations at once"
                self.rows.append(pre.shape[0])
                self.latents.append(pre.shape[1])
                yield latents, pre

        def whole(sae, xn):
            raise AssertionError(f"{xn.shape[0]} rows × {sae.cfg.d_sae} latents encoded at once")

        monkeypatch.setattr(SAE, "pre_activation_blocks", blocks)
        monkeypatch.setattr(SAE, "_pre", whole)


def _same_state(a: dict, b: dict, path: str = "") -> None:
    assert a.keys() == b.keys(), path
    for key in a:
        va, vb = a[key], b[key]
        if isinstance(va, dict):
            _same_state(va, vb, f"{path}{key}.")
        elif isinstance(va, torch.Tensor):
            assert va.dtype == vb.dtype and torch.equal(va, vb), f"{path}{key}"
        else:
            assert va == vb, f"{path}{key}: {va!r} != {vb!r}"


ARCHITECTURES = ["relu", "jumprelu", "batchtopk", "topk"]


def _brute_force_codes(sae: SAE, x: torch.Tensor) -> torch.Tensor:
    """Each row's codes from its definition, latent by latent in Python floats (float64): pre_i = (x − b_dec)·W_enc[:, i]
    + b_enc[i]; relu max(pre, 0); JumpReLU pre·[pre > θ_i]; BatchTopK at inference relu(pre)·[relu(pre) > θ];
    TopK (relu first) the k largest relu(pre_i) of the row, by sorting."""
    cfg = sae.cfg
    w, b = sae.W_enc.detach().double().tolist(), sae.b_enc.detach().double().tolist()
    theta = sae.threshold.detach().double().tolist()
    xc = (x.double() - (sae.b_dec.detach().double() if cfg.apply_b_dec_to_input else 0)).tolist()
    out = torch.zeros(x.shape[0], cfg.d_sae, dtype=torch.float64)
    for r, row in enumerate(xc):
        pre = [sum(row[j] * w[j][i] for j in range(cfg.d_in)) + b[i] for i in range(cfg.d_sae)]
        if cfg.activation == "relu":
            codes = [max(p, 0.0) for p in pre]
        elif cfg.activation == "jumprelu":
            codes = [p if p > theta[i] else 0.0 for i, p in enumerate(pre)]
        elif cfg.activation == "batchtopk":
            codes = [max(p, 0.0) if max(p, 0.0) > theta[0] else 0.0 for p in pre]
        else:
            keep = sorted(range(cfg.d_sae), key=lambda i: -max(pre[i], 0.0))[: cfg.k]
            codes = [max(pre[i], 0.0) if i in keep else 0.0 for i in range(cfg.d_sae)]
        out[r] = torch.tensor(codes, dtype=torch.float64)
    return out


@pytest.mark.parametrize("activation", ARCHITECTURES)
def test_codes_by_latent_blocks_equal_the_whole_batch_and_brute_force(activation):
    """SAE.sparse_codes by blocks of 1, 7, 64, d_sae − 1 and d_sae latents: the row-major COO of the whole batch's
    dense codes, bit for bit on exact arithmetic (TopK: the top-k of the union of the blocks' top-ks), equal to
    the codes computed one latent at a time from their definition; x̂ from the COO equals the dense decode."""
    d, d_sae, n = 12, 96, 40
    sae, x = _exact_sae(d, d_sae, 0, activation), _integer_rows(n, d, 1)
    with torch.no_grad():
        dense = sae.encode(x)
        want = _brute_force_codes(sae, x)
        recon = sae.decode(dense)
    assert torch.equal(dense.double(), want)
    rows, cols = want.nonzero(as_tuple=True)
    assert 0 < rows.numel() < n * d_sae / 2
    for block in (1, 7, 64, d_sae - 1, d_sae):
        with torch.no_grad():
            got_rows, got_cols, values = sae.sparse_codes(x, latent_block=block)
            x_hat = sae.decode_coo(got_rows, got_cols, values, n)
        assert torch.equal(got_rows, rows) and torch.equal(got_cols, cols), block
        assert torch.equal(values.double(), want[rows, cols]), block
        assert torch.equal(x_hat, recon), block


@pytest.mark.parametrize(
    "activation, topk_order, rescale",
    [(a, "relu_then_topk", False) for a in ARCHITECTURES]
    + [("topk", "topk_then_relu", False), ("topk", "relu_then_topk", True), ("topk", "topk_then_relu", True)],
)
def test_codes_by_latent_blocks_on_float_weights(activation, topk_order, rescale):
    """Random float weights, every architecture and TopK option: the blocks' COO names the same (row, latent)
    entries as the dense codes, values within the float32 rounding of a GEMM of another width."""
    from saegeo.sae.model import SAEConfig

    d, d_sae, n = 16, 300, 50
    g = torch.Generator().manual_seed(3)
    cfg = SAEConfig(d_in=d, d_sae=d_sae, activation=activation, k=7 if activation == "topk" else None)
    cfg.topk_order, cfg.rescale_acts_by_decoder_norm = topk_order, rescale
    sae = SAE(cfg).init_weights(g)
    with torch.no_grad():
        sae.W_dec.mul_(torch.rand(d_sae, 1, generator=g) + 0.5)
        sae.b_enc.normal_(0, 0.3, generator=g)
        sae.b_dec.normal_(0, 0.1, generator=g)
        sae.threshold.uniform_(0.2, 0.6, generator=g)
    x = torch.randn(n, d, generator=g)
    with torch.no_grad():
        dense = sae.encode(x)
        rows, cols = dense.nonzero(as_tuple=True)
        for block in (1, 7, 64, d_sae):
            got_rows, got_cols, values = sae.sparse_codes(sae.normalize_input(x)[0], latent_block=block)
            assert torch.equal(got_rows, rows) and torch.equal(got_cols, cols), block
            torch.testing.assert_close(values, dense[rows, cols], rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(sae.decode_coo(rows, cols, values, n), sae.decode(dense), rtol=1e-5, atol=1e-5)


def test_merge_topk_is_the_topk_of_the_union():
    """Each row's top-k of two candidate sets merged equals the top-k of all the keys at once (distinct keys)."""
    from saegeo.sae.architectures.topk import merge_topk

    g = torch.Generator().manual_seed(0)
    keys = torch.randperm(40 * 50, generator=g).reshape(40, 50).float()
    k = 6
    want = keys.topk(k, dim=1).values
    a_keys, a_idx = keys[:, :23].topk(k, dim=1)
    b_keys, b_idx = keys[:, 23:].topk(k, dim=1)
    top, idx = merge_topk(a_keys, a_idx, b_keys, b_idx + 23, k)
    assert torch.equal(top.sort(dim=1, descending=True).values, want)
    assert torch.equal(keys.gather(1, idx), top)


@pytest.mark.parametrize("activation", ARCHITECTURES)
def test_metrics_by_latent_blocks_and_row_groups_equal_the_whole_batch_and_brute_force(monkeypatch, activation):
    """Latent blocks of 1, 7, 64 and all, in groups of 1, 7, 64, 299 rows and the whole batch: bit-identical
    SAEMetrics sums, latent top-k (ties across group edges: the earlier row) and histograms, equal to brute force
    from the dense codes; with the code accumulator fed group by group only the mean-cosine sum
    Σ_rows S/√(S²‖ū‖² + (1−‖ū‖²)Q) changes order: n float64 terms in [0, 1/‖ū‖] summed two ways differ by at most
    2(n − 1)·2⁻⁵³·Σ terms."""
    n, d, d_sae = 300, 16, 512
    sae, x = _exact_sae(d, d_sae, 0, activation), _integer_rows(n, d, 1)
    whole, whole_cards = _metrics_at(monkeypatch, sae, x, d_sae, n)
    with torch.no_grad():
        codes = (sae.encode(x) * 2.0).double()  # folded: ‖w_i‖ = 2
        recon = sae.decode(sae.encode(x)).double()
    state = whole.state_dict()
    assert 0 < whole.codes.l0_sum < n * d_sae / 2  # sparse enough to be codes, dense enough to tie (JumpReLU)
    assert torch.equal(state["codes"]["fire_count"], (codes > 0).sum(0).double())
    assert torch.equal(state["codes"]["latent_sum"], codes.sum(0))  # integers: exact in any order
    assert torch.equal(state["codes"]["latent_sq_sum"], codes.square().sum(0))
    assert state["sse"] == float((x.double() - recon).square().sum())
    assert state["recon_sq_sum"] == float((recon - sae.b_dec.detach().double()).square().sum())
    k = whole_cards.topk.k
    for latent in range(0, d_sae, 37):
        column = codes[:, latent].tolist()
        order = sorted((r for r in range(n) if column[r] > 0), key=lambda r: (-column[r], r))[:k]
        assert whole_cards.topk.rows[latent, : len(order)].tolist() == order, latent
        assert whole_cards.topk.values[latent, : len(order)].tolist() == [column[r] for r in order], latent
    for latent_block, group_rows in ((1, n), (7, 7), (64, 1), (d_sae, 64), (64, 299), (7, 10**6)):
        got, cards = _metrics_at(monkeypatch, sae, x, latent_block, group_rows)
        where = f"latents {latent_block}, rows {group_rows}: "
        _same_state(got.state_dict(), state, where)
        assert torch.equal(cards.topk.values, whole_cards.topk.values), where
        assert torch.equal(cards.topk.rows, whole_cards.topk.rows), where
        assert torch.equal(cards.histogram.counts, whole_cards.histogram.counts), where
    got, _ = _metrics_at(monkeypatch, sae, x, 7, 7, flush=True)
    flushed = got.state_dict()
    ratio, ratio_whole = flushed["codes"].pop("ratio_sum"), state["codes"]["ratio_sum"]
    _same_state(flushed, {**state, "codes": {k: v for k, v in state["codes"].items() if k != "ratio_sum"}})
    assert abs(ratio - ratio_whole) <= 2 * (n - 1) * 2.0**-53 * ratio_whole


def test_nearly_dense_codes_are_encoded_again_in_smaller_groups(monkeypatch):
    """A group whose codes pass PENDING_CODES_BYTES is encoded again in quarter groups (the same sums), and later
    batches keep the smaller groups."""
    from saegeo.sae import metrics

    n, d, d_sae = 256, 16, 512
    sae, x = _exact_sae(d, d_sae, 0, "relu"), _integer_rows(n, d, 1)
    want = metrics.SAEMetrics(sae).add(x).state_dict()
    nnz = int((sae.encode(x) > 0).sum())
    monkeypatch.setattr(metrics, "PENDING_CODES_BYTES", (nnz // 8) * metrics.COO_ENTRY_BYTES)  # a group ≤ n/8 rows
    m = metrics.SAEMetrics(sae)
    m._group_rows = n
    blocks = _BlockLog(monkeypatch)
    m.add(x)
    assert m._group_rows == n // 16 and max(blocks.rows[-4:]) == n // 16
    got = m.state_dict()
    ratio, ratio_want = got["codes"].pop("ratio_sum"), want["codes"].pop("ratio_sum")
    _same_state(got, want)
    assert ratio == 0.0 == ratio_want  # no ‖ū‖² given: the mean-cosine sum is not taken


def test_no_whole_batch_of_codes_at_65k_latents(monkeypatch):
    """A batch of 600 rows × 65,536 latents (150 MB per dense copy, ~4 copies alive in an encode): the batch's sums,
    the row sample's codes and the scale test's FVE all form their pre-activations by latent blocks within
    ENCODE_BLOCK_BYTES (a whole (rows × d_sae) matrix is refused before it is computed), each block's W_enc
    columns handed back after it."""
    from saegeo.report.dictionary_check import _fve
    from saegeo.report.latent_cards import LatentCollector
    from saegeo.sae import metrics
    from saegeo.sae.metrics import SAEMetrics, encode_latent_block
    from saegeo.sae.model import SAEConfig

    d, d_sae, n = 8, 65_536, 600
    sae = SAE(SAEConfig(d_in=d, d_sae=d_sae, activation="jumprelu"))
    sae.init_weights(torch.Generator().manual_seed(0))
    x = torch.randn(n, d, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():  # sparse codes, as a trained SAE's (L0 ≈ 65): about 1 in 1,000 pre-activations fires
        sae.threshold.fill_(float(sae.pre_activations(x[:16]).flatten().quantile(0.999)))
    released = []
    monkeypatch.setattr(metrics, "release_pages", lambda t: released.append(t.data_ptr()))
    blocks = _BlockLog(monkeypatch, budget=metrics.ENCODE_BLOCK_BYTES)
    m = SAEMetrics(sae)
    m.code_observers.append(LatentCollector(d_sae, 4))
    m.add(x)
    m.sample_codes(x[:300])
    _fve(sae, x[:300])
    assert blocks.latents[0] == encode_latent_block(n, d_sae) < d_sae and max(blocks.latents) < d_sae
    assert sum(blocks.latents) == 3 * d_sae and m.n == n
    assert len(released) == len(blocks.latents)  # every block's columns of W_enc handed back
    starts = range(0, d_sae, blocks.latents[0])
    assert released[: len(starts)] == [sae.W_enc[:, lo:].data_ptr() for lo in starts]


def test_check_with_activations_identical_whatever_the_encode_block(monkeypatch, tmp_path):
    """The whole `check --acts` report (SAE pass, row sample's co-firing codes, scale test, latent cards) of an SAE
    on which float32 arithmetic is exact is the same, bit for bit, with 5-latent blocks in 3-row groups as with
    every latent of a batch at once."""
    from saegeo.report.dictionary_check import check_with_activations
    from saegeo.report.geometry_report import ReportOptions
    from saegeo.sae import metrics

    sae, x = _exact_sae(16, 384, 2), _integer_rows(700, 16, 3)
    opts = CheckOptions(progress=False)

    def report(latent_block: int, group_rows: int) -> dict:
        monkeypatch.setattr(metrics, "encode_latent_block", lambda rows, n, size=4: latent_block)
        monkeypatch.setattr(metrics, "max_group_rows", lambda n, size=4: group_rows)
        out, _ = check_with_activations(
            sae, x, options=opts, name="x", report_options=ReportOptions(progress=False, batch_rows=256)
        )
        out = out.to_dict()
        for key in ("seconds", "tokens_per_second"):
            out.pop(key)
        return out

    whole = report(384, 10**6)
    blocks = _BlockLog(monkeypatch)
    blocked = report(5, 3)
    assert max(blocks.latents) == 5 and max(blocks.rows) == 3
    assert blocked == whole
