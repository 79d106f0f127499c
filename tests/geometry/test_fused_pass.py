"""The geometry pass's fast parts against independent computations: the fused compiled pass over a chunk (against
the torch path and numpy float64 brute force), the in-place row sample (against a full sort of the priorities), the
sample read-out, the pairwise-cosine histogram by blocks, the k-means within-cluster sum, json_safe's fast path.

Tolerances: two float64 sums of the same N terms in different orders differ by at most 2·N·u·Σ|terms|
(u = 2⁻⁵³, the standard bound γ_N for recursive summation, twice), which is what ``assert_sum_close`` allows."""

from __future__ import annotations

import importlib
import math

import numpy as np
import pytest
import torch

from saegeo.geometry import fused
from saegeo.geometry.accumulate import GeometryAccumulator, chunk_sums, torch_chunk_sums
from saegeo.geometry.sample import RowReservoir, row_priority

U64 = 2.0**-53

pytestmark = pytest.mark.skipif(not fused.available(), reason="numba is not installed")


@pytest.fixture(autouse=True)
def fused_for_every_size(monkeypatch):
    """The fused loop for chunks of any size (it normally starts at fused.MIN_ENTRIES entries)."""
    monkeypatch.setattr(fused, "MIN_ENTRIES", 0)


def assert_sum_close(got, want, n_terms: int, abs_terms) -> None:
    """|got − want| ≤ 2·N·u·Σ|terms| elementwise (two float64 summation orders of N terms)."""
    got, want, abs_terms = (np.asarray(torch.as_tensor(a, dtype=torch.float64)) for a in (got, want, abs_terms))
    bound = 2 * n_terms * U64 * abs_terms + 1e-300
    assert np.all(np.abs(got - want) <= bound), float(np.max(np.abs(got - want) / bound))


def awkward_rows(dtype: torch.dtype, m: int = 257, d: int = 37, seed: int = 0) -> torch.Tensor:
    """Rows with a zero row, zero entries, negative rows, a subnormal and a huge offset: every bin kind."""
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(m, d, generator=g, dtype=torch.float64) * 3 + 1).to(dtype)
    x[5] = 0
    x[7, :5] = 0
    x[9, 3] = 1e-40 if dtype == torch.float32 else 1e-310
    x[11] = -x[11].abs()
    x[13] += 1e4
    return x


def brute_force_sums(x: torch.Tensor) -> dict[str, np.ndarray]:
    """The ChunkSums quantities from numpy float64 in the plainest form."""
    a = x.double().numpy()
    sq = (a * a).sum(axis=1)
    p1 = a.sum(axis=1)
    norms = np.sqrt(sq)
    unit = np.where(norms[:, None] > 0, a / np.where(norms > 0, norms, 1)[:, None], 0)
    cols = np.stack([a.sum(0), unit.sum(0), (unit * p1[:, None]).sum(0), (unit * sq[:, None]).sum(0)])
    abs_cols = np.stack(
        [np.abs(a).sum(0), np.abs(unit).sum(0), np.abs(unit * p1[:, None]).sum(0), np.abs(unit * sq[:, None]).sum(0)]
    )
    return {"row_sq": sq, "row_p1": p1, "cols": cols, "abs_cols": abs_cols, "abs_p1": np.abs(a).sum(axis=1)}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_fused_pass_equals_brute_force_and_the_torch_path(dtype):
    x = awkward_rows(dtype)
    shift = x[:50].mean(0)
    fast, slow, want = chunk_sums(x, shift), torch_chunk_sums(x, shift), brute_force_sums(x)
    m, d = x.shape
    for got in (fast, slow):
        assert_sum_close(got.row_sq, want["row_sq"], d, want["row_sq"])
        assert_sum_close(got.row_p1, want["row_p1"], d, want["abs_p1"])
        # each unit column is a sum over m rows of products with a per-row weight of ≤ 3 roundings: N = m + d + 3
        assert_sum_close(got.unit_cols, want["cols"], m + d + 3, want["abs_cols"])
        assert got.n_nonzero == int(np.count_nonzero(x.numpy()))
        assert torch.equal(got.centred, x - shift)  # one rounding, the same in both
    for i in range(3):  # counts are integers; Σx, Σx² per bin are sums of ≤ m·d terms of one sign
        assert_sum_close(fast.entry_bins[i], slow.entry_bins[i], m * d, slow.entry_bins[i].abs())
    assert torch.equal(fast.entry_bins[0], slow.entry_bins[0])
    assert fast.entry_bins[0].sum() == m * d
    # the bins' totals are the entries' totals
    assert_sum_close(fast.entry_bins[1].sum(), want["row_p1"].sum(), m * d, want["abs_p1"].sum())


def test_fused_pass_without_a_shift_leaves_the_centred_copy_out():
    x = awkward_rows(torch.float32)
    assert chunk_sums(x).centred is None


def test_accumulator_on_the_fused_pass_equals_the_torch_path(monkeypatch):
    x = awkward_rows(torch.float32, m=600, d=24, seed=3)
    fast = GeometryAccumulator(24, chunk_rows=128).add(x)
    monkeypatch.setattr(fused, "worth_it", lambda n_entries: False)
    slow = GeometryAccumulator(24, chunk_rows=128).add(x)
    a64 = x.double()
    for name in ("_mean", "_unit_sum", "_row_power_sum", "_unit_by_row_power", "_entry_hist_sum"):
        got, want = getattr(fast, name), getattr(slow, name)
        assert torch.allclose(got, want, rtol=2 * 600 * 24 * U64 * 4, atol=1e-300), name
    assert torch.equal(fast._entry_hist_count, slow._entry_hist_count)
    # the scatter sees the same float32 rows shifted by the same float32 mean: equal to the float32 gram's rounding
    scale = float((a64 - a64.mean(0)).square().sum(0).max())
    assert float((fast._scatter - slow._scatter).abs().max()) <= 2 * math.sqrt(600) * 2.0**-24 * scale
    assert fast.n_nonzero_entries == slow.n_nonzero_entries == int(np.count_nonzero(x.numpy()))


@pytest.mark.parametrize("skip", [False, True])
def test_fused_pass_finds_the_nonfinite_row(skip):
    x = awkward_rows(torch.float32, m=300, d=16)
    x[211, 4] = float("nan")
    acc = GeometryAccumulator(16, chunk_rows=100, skip_nonfinite=skip)
    if not skip:
        with pytest.raises(Exception, match=r"row 211 \(global row 211\)"):
            acc.add(x)
        return
    acc.add(x)
    keep = torch.ones(300, dtype=torch.bool)
    keep[211] = False
    clean = GeometryAccumulator(16, chunk_rows=100).add(x[keep])
    assert acc.n_nonfinite_skipped == 1 and acc.n == 299
    assert torch.allclose(acc.mean, clean.mean, rtol=0, atol=1e-12)
    assert torch.equal(acc._entry_hist_count, clean._entry_hist_count)


def test_sample_readout_equals_brute_force():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(900, 20, generator=g) + 2
    acc = GeometryAccumulator(20, sample_rows=300).add(x)
    v_dot_s, fourth, gram = acc._unit_sample()
    rows = acc.sample.rows.double().numpy()
    unit_sum = acc._unit_sum.numpy()
    unit = rows / np.linalg.norm(rows, axis=1, keepdims=True)
    v = unit - unit_sum / acc.n_unit
    np.testing.assert_allclose(v_dot_s.numpy(), v @ unit_sum, rtol=1e-12, atol=1e-12)
    assert fourth == pytest.approx(float(((v**2).sum(1) ** 2).sum()), rel=1e-12)
    # not exact (900 > 300 rows): the gram of v rounded to float32
    np.testing.assert_allclose(gram.numpy(), v.T @ v, rtol=0, atol=4 * math.sqrt(300) * 2.0**-24 * (v**2).sum(0).max())


@pytest.mark.parametrize("masked", [True, False])
@pytest.mark.parametrize("batch", [1, 7, 64, 96, 200, 1000])  # 96 = k: one batch fills it; 200, 1000: more than k
def test_row_sample_is_the_bottom_k_of_the_priorities(batch, masked):
    n, k, d, seed = 1000, 96, 3, 5
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, d, generator=g, dtype=torch.float64)
    eligible = torch.rand(n, generator=g) > 0.3 if masked else torch.ones(n, dtype=torch.bool)
    res = RowReservoir(k, d, seed, dtype=torch.float64)
    for lo in range(0, n, batch):
        res.add(x[lo : lo + batch], eligible[lo : lo + batch])
        if lo == 5 * batch:
            _ = res.rows  # a read in the middle puts the slots in order; the stream goes on from there
    priority = row_priority(seed, np.arange(n, dtype=np.uint64))
    index = np.nonzero(eligible.numpy())[0]
    want = index[np.argsort(priority[index], kind="stable")[:k]]
    assert torch.equal(res.rows, x[torch.from_numpy(want)])
    assert np.array_equal(res.priority, priority[want])
    assert res.seen == n


def test_cosine_histogram_by_blocks_is_the_all_pairs_histogram(monkeypatch):
    report_module = importlib.import_module("saegeo.report.geometry_report")  # the module, not its function

    monkeypatch.setattr(report_module, "_COSINE_BLOCK_ROWS", 7)  # blocks of 7 rows: diagonal, off-diagonal, ragged
    rng = np.random.default_rng(2)
    x = rng.standard_normal((40, 5)) + 0.3
    x[3] = 0  # dropped
    h = report_module.cosine_histogram(torch.from_numpy(x), bins=30)
    kept = np.delete(x, 3, axis=0)
    u = kept / np.linalg.norm(kept, axis=1, keepdims=True)
    cos = (u @ u.T)[np.triu_indices(39, 1)]
    assert h["counts"] == np.histogram(cos, bins=30, range=(-1, 1))[0].tolist()
    assert h["n_pairs"] == 39 * 38 // 2 and h["n_rows"] == 39
    assert h["sample_mean"] == pytest.approx(float(cos.mean()), abs=1e-14)


def test_kmeans_within_sum_is_the_brute_force_one():
    from saegeo.geometry import diagnosis

    rng = np.random.default_rng(4)
    x = torch.from_numpy(rng.standard_normal((50, 6)))
    label = torch.from_numpy(rng.integers(0, 3, 50))
    want = sum(float(((x[label == c] - x[label == c].mean(0)) ** 2).sum()) for c in range(3))
    assert diagnosis._within_sum_of_squares(x, label, 3) == pytest.approx(want, rel=1e-12)


def test_json_safe_fast_path_still_replaces_nonfinite_values():
    from saegeo.io import json_safe

    assert json_safe([1.0, float("inf")]) == [1.0, None]
    assert json_safe([float("inf"), float("-inf")]) == [None, None]
    assert json_safe([1e308, 1e308]) == [1e308, 1e308]  # finite entries whose plain sum overflows
    assert json_safe((0.5, 2.0)) == [0.5, 2.0]
    assert json_safe([1.0, float("nan"), 2]) == [1.0, None, 2]


@pytest.mark.parametrize("d", [5, 383, 384, 700, 1031])
def test_symmetric_gram_is_the_full_product(d):
    from saegeo.geometry.accumulate import symmetric_gram

    g = torch.Generator().manual_seed(d)
    x = torch.randn(64, d, generator=g, dtype=torch.float64)
    got = symmetric_gram(x)
    want = x.numpy().T @ x.numpy()
    assert torch.equal(got, got.T)
    bound = 2 * 64 * U64 * (np.abs(x.numpy()).T @ np.abs(x.numpy()))
    assert np.all(np.abs(got.numpy() - want) <= bound)


def test_kmeans_on_rows_too_large_for_float32_distances():
    from saegeo.geometry.diagnosis import kmeans_between_share

    rng = np.random.default_rng(5)
    x = rng.standard_normal((200, 8))
    x[:100, 0] += 6.0  # two clusters along the first axis
    share, smaller = kmeans_between_share(torch.from_numpy(x))
    big_share, big_smaller = kmeans_between_share(torch.from_numpy(x * 1e25))  # squares past float32's range
    assert math.isfinite(big_share) and big_share == pytest.approx(share, rel=1e-9)
    assert big_smaller == smaller == 0.5


def _brute_force_lloyd(x: np.ndarray, centres: np.ndarray, iters: int) -> np.ndarray:
    """Textbook Lloyd in float64: nearest centre by full distances (argmin: the first on a tie), then the means."""
    label = np.argmin(((x[:, None, :] - centres[None]) ** 2).sum(-1), axis=1)
    for _ in range(iters):
        centres = np.stack([x[label == c].mean(0) if np.any(label == c) else centres[c] for c in range(len(centres))])
        new = np.argmin(((x[:, None, :] - centres[None]) ** 2).sum(-1), axis=1)
        if np.array_equal(new, label):
            break
        label = new
    return np.argmin(((x[:, None, :] - centres[None]) ** 2).sum(-1), axis=1)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_two_means_step_and_general_lloyd_are_textbook_lloyd(seed):
    """k = 2's matrix-vector step and the general loop (k = 2 and 3) give the labels of Lloyd's full-distance
    iterations from the same start."""
    from saegeo.geometry.diagnosis import _lloyd, _lloyd_two

    rng = np.random.default_rng(seed)
    x = rng.standard_normal((300, 12))
    x[: 40 + 30 * seed, :3] += 2.5  # an unequal split, so the iterations move
    x[200:, 3:6] -= 2.5  # a third group for k = 3
    for k, lloyds in ((2, (_lloyd_two, _lloyd)), (3, (_lloyd,))):
        start = x[rng.choice(300, k, replace=False)]
        for iters in (1, 3, 30):
            want = _brute_force_lloyd(x, start, iters).tolist()
            for lloyd in lloyds:
                assert lloyd(torch.from_numpy(x), torch.from_numpy(start), iters).tolist() == want, (k, lloyd)


def test_two_means_tie_stays_with_the_first_centre_and_an_empty_cluster_keeps_its_centre():
    from saegeo.geometry.diagnosis import _lloyd_two

    x = torch.tensor([[0.0, 0.0], [1.0, 0.0], [3.0, 0.0]], dtype=torch.float64)
    # row 0 is equidistant from both: argmin's first index, centre 0
    assert _lloyd_two(x, torch.tensor([[-1.0, 0.0], [1.0, 0.0]], dtype=torch.float64), 0).tolist() == [0, 1, 1]
    far = torch.tensor([[1.0, 0.0], [100.0, 0.0]], dtype=torch.float64)  # no row nearer c₁: it stays at 100
    assert _lloyd_two(x, far, 5).tolist() == [0, 0, 0]


def test_cosine_histogram_bins_pairs_near_an_edge_by_their_float64_cosine():
    """Pairs whose cosine lies 1e-9 either side of every bin edge (and at ±1) are counted in the bin of their
    float64 cosine, as numpy's histogram of the float64 products does (a float32 product would misplace some;
    the report clips to [−1, 1]: nearly parallel rows that round past ±1 count in the end bins)."""
    report_module = importlib.import_module("saegeo.report.geometry_report")  # the module, not its function

    edges = np.linspace(-1, 1, 21)
    cosines = np.concatenate([edges[1:-1] - 1e-9, edges[1:-1] + 1e-9, [1.0 - 1e-12, -1.0 + 1e-12]])
    rows = [np.array([1.0, 0.0])] + [np.array([c, np.sqrt(1 - c * c)]) for c in cosines]
    x = np.stack(rows) * np.linspace(0.5, 3, len(rows))[:, None]  # norms other than 1
    h = report_module.cosine_histogram(torch.from_numpy(x), bins=20)
    u = x / np.linalg.norm(x, axis=1, keepdims=True)
    cos = np.clip((u @ u.T)[np.triu_indices(len(rows), 1)], -1, 1)  # nearly parallel pairs round past 1
    assert h["counts"] == np.histogram(cos, bins=20, range=(-1, 1))[0].tolist()
