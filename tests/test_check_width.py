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
from saegeo.report.check import CheckOptions, check_dictionary
from saegeo.sae.formats import read_dictionary
from saegeo.sae.formats.base import Dictionary, is_mapped, read_safetensors
from saegeo.sae.model import SAE

ROOT = Path(__file__).resolve().parents[1]
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
    from saegeo.report.check import CheckOptions, check_dictionary
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
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
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


def _metrics_at(monkeypatch, sae: SAE, x: torch.Tensor, rows: int, *, flush_every_block: bool = False):
    """SAEMetrics (with ‖ū‖², so the mean-cosine sum runs) and a LatentCollector fed x as one batch, encoded `rows`
    rows at a time (the budget set to exactly that); flush_every_block: the code accumulator gets each block
    on its own (the path of nearly dense codes)."""
    from saegeo.report.latents import LatentCollector
    from saegeo.sae import metrics

    d_sae = sae.cfg.d_sae
    monkeypatch.setattr(metrics, "ENCODE_BLOCK_BYTES", rows * metrics.CODE_TEMPORARIES * d_sae * 4)
    if flush_every_block:
        monkeypatch.setattr(metrics, "PENDING_CODES_BYTES", 0)
    m = metrics.SAEMetrics(sae, mean_sq_norm=0.25)
    assert m.encode_rows == rows
    collector = LatentCollector(d_sae, 5)
    m.code_observers.append(collector)
    m.add(x)
    monkeypatch.undo()
    return m, collector


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


@pytest.mark.parametrize("activation", ["jumprelu", "topk"])
def test_codes_encoded_in_row_blocks_equal_the_whole_batch_and_brute_force(monkeypatch, activation):
    """Blocks of 1 row, odd sizes and the whole batch give bit-identical SAEMetrics sums, latent top-k (ties
    across block edges: the earlier row) and histograms, equal to brute force from the dense codes; with the code
    accumulator fed block by block only the mean-cosine sum Σ_rows S/√(S²‖ū‖² + (1−‖ū‖²)Q) changes order: n float64
    terms in [0, 1/‖ū‖] summed two ways differ by at most 2(n − 1)·2⁻⁵³·Σ terms."""
    n, d, d_sae = 300, 16, 512
    sae, x = _exact_sae(d, d_sae, 0, activation), _integer_rows(n, d, 1)
    whole, whole_cards = _metrics_at(monkeypatch, sae, x, n)
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
    for rows in (1, 7, 64, 299):
        got, cards = _metrics_at(monkeypatch, sae, x, rows)
        _same_state(got.state_dict(), state, f"rows={rows}: ")
        assert torch.equal(cards.topk.values, whole_cards.topk.values), rows
        assert torch.equal(cards.topk.rows, whole_cards.topk.rows), rows
        assert torch.equal(cards.histogram.counts, whole_cards.histogram.counts), rows
    got, _ = _metrics_at(monkeypatch, sae, x, 7, flush_every_block=True)
    flushed = got.state_dict()
    ratio, ratio_whole = flushed["codes"].pop("ratio_sum"), state["codes"]["ratio_sum"]
    _same_state(flushed, {**state, "codes": {k: v for k, v in state["codes"].items() if k != "ratio_sum"}})
    assert abs(ratio - ratio_whole) <= 2 * (n - 1) * 2.0**-53 * ratio_whole


class _RowBound:
    """Wraps SAE._pre: every pre-activation block must fit the encode budget, checked before it is computed (a
    whole batch at 65k latents is refused, not allocated)."""

    def __init__(self, monkeypatch):
        from saegeo.sae import metrics

        self.metrics, self.seen, real = metrics, [], SAE._pre

        def pre(sae, xn):
            cells = xn.shape[0] * sae.cfg.d_sae
            assert cells * metrics.CODE_TEMPORARIES * 4 <= metrics.ENCODE_BLOCK_BYTES, (
                f"{xn.shape[0]} rows × {sae.cfg.d_sae} latents encoded at once"
            )
            self.seen.append(int(xn.shape[0]))
            return real(sae, xn)

        monkeypatch.setattr(SAE, "_pre", pre)


def test_no_whole_batch_of_codes_at_65k_latents(monkeypatch):
    """A batch of 600 rows × 65,536 latents (150 MB per dense copy, ~4 copies alive in an encode): the batch's sums,
    the row sample's codes and the scale test's FVE are all encoded in blocks of 256 rows, within
    ENCODE_BLOCK_BYTES (a whole batch is refused before it is computed)."""
    from saegeo.report.check import _fve
    from saegeo.report.latents import LatentCollector
    from saegeo.sae.metrics import SAEMetrics, encode_block_rows
    from saegeo.sae.model import SAEConfig

    d, d_sae, n = 8, 65_536, 600
    sae = SAE(SAEConfig(d_in=d, d_sae=d_sae, activation="jumprelu"))
    sae.init_weights(torch.Generator().manual_seed(0))
    x = torch.randn(n, d, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():  # sparse codes, as a trained SAE's (L0 ≈ 65): about 1 in 1,000 pre-activations fires
        sae.threshold.fill_(float(sae.pre_activations(x[:16]).flatten().quantile(0.999)))
    bound = _RowBound(monkeypatch)
    m = SAEMetrics(sae)
    m.code_observers.append(LatentCollector(d_sae, 4))
    m.add(x)
    m.sample_codes(x[:300])
    _fve(sae, x[:300])
    block = encode_block_rows(d_sae)
    assert block == 256 and max(bound.seen) == block
    assert sum(bound.seen) == n + 300 + 300 and m.n == n


def test_check_with_activations_identical_whatever_the_encode_block(monkeypatch, tmp_path):
    """The whole `check --acts` report (SAE pass, row sample's co-firing codes, latent cards) of an SAE on which
    float32 arithmetic is exact is the same, bit for bit, with 5-row encode blocks as with whole batches."""
    from saegeo.report.check import check_with_activations
    from saegeo.report.report import ReportOptions
    from saegeo.sae import metrics

    sae, x = _exact_sae(16, 384, 2), _integer_rows(700, 16, 3)
    opts = CheckOptions(progress=False)

    def report(rows: int) -> dict:
        monkeypatch.setattr(metrics, "ENCODE_BLOCK_BYTES", rows * metrics.CODE_TEMPORARIES * 384 * 4)
        out, _ = check_with_activations(
            sae, x, options=opts, name="x", report_options=ReportOptions(progress=False, batch_rows=256)
        )
        out = out.to_dict()
        for key in ("seconds", "tokens_per_second"):
            out.pop(key)
        return out

    whole = report(10**6)
    bound = _RowBound(monkeypatch)
    blocked = report(5)
    assert max(bound.seen) == 5
    assert blocked == whole
