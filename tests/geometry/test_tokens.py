"""Token types, self-similarity, windows and the artifact test: closed forms, brute force, simulation."""

import math

import numpy as np
import pytest
import torch

from saegeo.errors import BadInputError
from saegeo.geometry.tokens import (
    ArtifactAccumulator,
    TokenTypeAccumulator,
    WindowSimilarityAccumulator,
    self_similarity,
    token_type_geometry,
    window_starts,
)


def _brute_decomposition(x: np.ndarray, ids: np.ndarray) -> tuple[float, float, float]:
    """(tr Σ, within, between) from the full matrix and explicit per-type means."""
    mu = x.mean(0)
    total = float(((x - mu) ** 2).sum(1).mean())
    within = between = 0.0
    for t in np.unique(ids):
        rows = x[ids == t]
        m = rows.mean(0)
        within += float(((rows - m) ** 2).sum())
        between += len(rows) * float(((m - mu) ** 2).sum())
    return total, within / len(x), between / len(x)


def test_decomposition_is_exact_on_random_data_with_repeated_ids():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3000, 16, generator=g, dtype=torch.float64) * 2 + 5  # a large mean
    ids = torch.randint(0, 200, (3000,), generator=g) ** 2 % 311  # uneven counts, many repeats
    acc = TokenTypeAccumulator(16)
    for lo in range(0, 3000, 700):  # batches of different sizes
        acc.add(x[lo : lo + 700], ids[lo : lo + 700])
    tt = token_type_geometry(acc)
    total, within, between = _brute_decomposition(x.numpy(), ids.numpy())
    assert tt.total_variance == pytest.approx(total, rel=1e-9)
    assert tt.within_plugin == pytest.approx(within, rel=1e-9)
    assert tt.between_plugin == pytest.approx(between, rel=1e-9)
    assert tt.within_plugin + tt.between_plugin == pytest.approx(tt.total_variance, rel=1e-9)
    assert tt.n_types == len(np.unique(ids.numpy()))


def test_two_gaussian_mixture_between_and_within():
    """Means ±Δ/2, covariance σ²I, equal weights: between = ‖Δ‖²/4, within = dσ²."""
    d, n, sigma = 8, 200_000, 0.5
    g = torch.Generator().manual_seed(1)
    delta = torch.arange(1, d + 1, dtype=torch.float64) / 4
    ids = torch.arange(n) % 2
    x = torch.randn(n, d, generator=g, dtype=torch.float64) * sigma + torch.where(
        ids[:, None] == 0, delta / 2, -delta / 2
    )
    tt = token_type_geometry(TokenTypeAccumulator(d).add(x, ids))
    assert tt.between == pytest.approx(float(delta.square().sum()) / 4, rel=0.01)
    assert tt.within == pytest.approx(d * sigma**2, rel=0.01)
    assert tt.within_share + tt.between_share == pytest.approx(1.0)


def test_corrected_within_is_unbiased_where_plugin_is_low():
    """Zipf-distributed types, most seen a few times: the plug-in within misses one degree of freedom per type."""
    d, n, sigma2 = 6, 600, 1.0
    truth = d * sigma2
    plug, corrected = [], []
    for seed in range(150):
        g = torch.Generator().manual_seed(seed)
        ranks = torch.arange(1, 301, dtype=torch.float64)
        ids = torch.multinomial(1 / ranks, n, replacement=True, generator=g)
        type_means = torch.randn(300, d, generator=g, dtype=torch.float64) * 3
        x = type_means[ids] + torch.randn(n, d, generator=g, dtype=torch.float64) * math.sqrt(sigma2)
        tt = token_type_geometry(TokenTypeAccumulator(d).add(x, ids))
        plug.append(tt.within_plugin)
        corrected.append(tt.within)
    assert np.mean(plug) <= 0.9 * truth  # the plug-in is ≥ 10 % low here
    assert np.mean(corrected) == pytest.approx(truth, rel=0.01)


def test_self_similarity_of_four_unit_vectors_in_a_plane():
    """Unit vectors at 20°, 25°, 65°, 70°: the mean cosine over the 6 distinct pairs is 0.802573."""
    angles = np.radians([20.0, 25.0, 65.0, 70.0])
    v = np.stack([np.cos(angles), np.sin(angles)], 1)
    brute = np.mean([v[i] @ v[j] for i in range(4) for j in range(4) if i != j])
    assert brute == pytest.approx(0.802573, abs=5e-7)
    x = torch.tensor(v) * torch.tensor([[1.0], [3.0], [0.5], [7.0]])  # norms do not matter
    acc = TokenTypeAccumulator(2).add(x, [42] * 4)
    assert float(self_similarity(acc.unit_sum[:1], acc.unit_count[:1])[0]) == pytest.approx(brute, abs=1e-12)
    tt = token_type_geometry(acc, baseline=0.3, min_count=2)
    assert tt.self_similarity == pytest.approx(brute, abs=1e-12)
    assert tt.self_similarity_adjusted == pytest.approx(brute - 0.3, abs=1e-12)
    assert tt.most_context_specific[0].id == 42


def test_most_and_least_context_specific_types_and_weighted_mean():
    g = torch.Generator().manual_seed(2)
    d = 64
    fixed = torch.randn(d, generator=g, dtype=torch.float64)
    tight = fixed + 0.01 * torch.randn(10, d, generator=g, dtype=torch.float64)  # type 7: same vector everywhere
    loose = torch.randn(30, d, generator=g, dtype=torch.float64)  # type 9: context decides everything
    x, ids = torch.cat([tight, loose]), torch.tensor([7] * 10 + [9] * 30)
    tt = token_type_geometry(TokenTypeAccumulator(d).add(x, ids))
    assert tt.most_context_specific[0].id == 9 and tt.least_context_specific[0].id == 7
    sims = {e.id: e.self_similarity for e in tt.most_context_specific}
    assert tt.self_similarity == pytest.approx((10 * sims[7] + 30 * sims[9]) / 40)


def test_norm_variance_correlation_matches_weighted_pearson():
    g = torch.Generator().manual_seed(3)
    d = 4
    counts = [3, 5, 8, 13, 21]
    scales = [0.2, 0.5, 1.0, 1.5, 2.0]
    rows, ids = [], []
    for t, (c, s) in enumerate(zip(counts, scales)):
        rows.append(
            torch.full((c, d), 3.0 / (1 + t), dtype=torch.float64)
            + s * torch.randn(c, d, generator=g, dtype=torch.float64)
        )
        ids += [t] * c
    x = torch.cat(rows)
    tt = token_type_geometry(TokenTypeAccumulator(d).add(x, ids))
    xs, idn = x.numpy(), np.array(ids)
    mean_sq = np.array([float((xs[idn == t].mean(0) ** 2).sum()) for t in range(5)])
    var = np.array([float(((xs[idn == t] - xs[idn == t].mean(0)) ** 2).sum()) / (c - 1) for t, c in enumerate(counts)])
    w = np.array(counts, float)
    cov = np.cov(mean_sq, var, aweights=w)
    assert tt.norm_variance_corr == pytest.approx(cov[0, 1] / math.sqrt(cov[0, 0] * cov[1, 1]), rel=1e-9)
    assert tt.norm_variance_corr < 0  # built so: the nearer the origin, the larger the spread


def test_max_types_pools_the_rest_and_keeps_the_decomposition_exact():
    g = torch.Generator().manual_seed(4)
    n, d = 4000, 5
    ids = torch.multinomial(1 / torch.arange(1, 501, dtype=torch.float64), n, replacement=True, generator=g)
    x = torch.randn(n, d, generator=g, dtype=torch.float64) + ids[:, None].to(torch.float64) / 100
    full = TokenTypeAccumulator(d).add(x, ids)
    keep = torch.bincount(ids).argsort(descending=True, stable=True)[:20]
    exact = TokenTypeAccumulator(d, max_types=20, keep_ids=keep)
    streamed = TokenTypeAccumulator(d, max_types=20)
    for lo in range(0, n, 500):
        exact.add(x[lo : lo + 500], ids[lo : lo + 500])
        streamed.add(x[lo : lo + 500], ids[lo : lo + 500])
    for acc in (exact, streamed):
        tt = token_type_geometry(acc)
        assert acc.n_slots <= 40
        assert tt.within_plugin + tt.between_plugin == pytest.approx(token_type_geometry(full).total_variance, rel=1e-9)
        assert tt.other_n_tokens > 0 and tt.n_types == token_type_geometry(full).n_types
    assert token_type_geometry(exact).kept_exact_top
    pooled = torch.tensor([acc_id not in set(keep.tolist()) for acc_id in ids.tolist()])
    assert token_type_geometry(exact).other_n_tokens == int(pooled.sum())


def test_merge_and_state_dict_equal_one_stream():
    g = torch.Generator().manual_seed(5)
    x = torch.randn(900, 7, generator=g, dtype=torch.float64)
    ids = torch.randint(0, 50, (900,), generator=g)
    whole = token_type_geometry(TokenTypeAccumulator(7).add(x, ids))
    a = TokenTypeAccumulator(7).add(x[:300], ids[:300])
    b = TokenTypeAccumulator.from_state_dict(TokenTypeAccumulator(7).add(x[300:], ids[300:]).state_dict())
    merged = token_type_geometry(a.merge(b))
    for key in ("total_variance", "within_plugin", "between_plugin", "within", "self_similarity", "norm_variance_corr"):
        assert getattr(merged, key) == pytest.approx(getattr(whole, key), rel=1e-12)
    assert merged.n_types == whole.n_types


def test_bad_ids_are_refused():
    with pytest.raises(BadInputError, match="one per row"):
        TokenTypeAccumulator(3).add(torch.zeros(4, 3), [1, 2])
    with pytest.raises(BadInputError, match="negative"):
        TokenTypeAccumulator(3).add(torch.zeros(2, 3), [1, -2])


def _brute_intra(x: np.ndarray, windows: list[slice]) -> float:
    sims = []
    for w in windows:
        rows = x[w]
        s = rows.mean(0)
        sims.append(np.mean(rows @ s / (np.linalg.norm(rows, axis=1) * np.linalg.norm(s))))
    return float(np.mean(sims))


def test_intra_window_similarity_matches_brute_force_across_batch_cuts():
    g = torch.Generator().manual_seed(6)
    lengths = [5, 9, 3, 12, 7]
    positions = torch.cat([torch.arange(L) for L in lengths])
    x = torch.randn(int(sum(lengths)), 10, generator=g, dtype=torch.float64) + 0.5
    bounds = np.cumsum([0] + lengths)
    brute = _brute_intra(x.numpy(), [slice(a, b) for a, b in zip(bounds[:-1], bounds[1:])])
    for cut in (1, 4, 11, 36):
        acc = WindowSimilarityAccumulator(10)
        for lo in range(0, len(x), cut):
            acc.add(x[lo : lo + cut], positions[lo : lo + cut])
        assert acc.finish().n_windows == 5
        assert acc.intra_similarity() == pytest.approx(brute, rel=1e-12)


def test_window_starts_without_position_zero():
    """With special tokens excluded positions start at 1: a window starts wherever the position does not increase."""
    assert window_starts(torch.tensor([1, 2, 3, 1, 2, 5, 1])).tolist() == [True, False, False, True, False, False, True]
    assert window_starts(torch.tensor([0, 0, 1, 1]), previous=0).tolist() == [
        True,
        True,
        False,
        True,
    ]  # equal: new window


def test_merge_of_bounded_accumulators_never_splits_a_type():
    """Each side pools different ids; after the merge every kept type holds all of its occurrences."""
    g = torch.Generator().manual_seed(8)
    n, d = 3000, 3
    ids = torch.multinomial(1 / torch.arange(1, 301, dtype=torch.float64), n, replacement=True, generator=g)
    x = torch.randn(n, d, generator=g, dtype=torch.float64)
    a, b = TokenTypeAccumulator(d, max_types=10), TokenTypeAccumulator(d, max_types=10)
    for lo in range(0, 2000, 100):
        (a if lo < 1000 else b).add(x[lo : lo + 100], ids[lo : lo + 100])
    merged = a.merge(b).add(x[2000:], ids[2000:])  # rows after the merge go where the merge put their type
    for s, i in enumerate(merged._ids):
        assert int(merged.count[s]) in (0, int(merged.id_counts[i]))
    tt = token_type_geometry(merged)
    assert tt.within_plugin + tt.between_plugin == pytest.approx(tt.total_variance, rel=1e-9)


def test_artifact_example_six_vectors():
    """Six tokens in two windows of three; PC1 projections (−1, −1, 0, −1, 0, 0) against positions (0, 1, 2, 0, 1, 2):
    |corr| = √(2/3) = 0.816497."""
    p = np.array([-1.0, -1.0, 0.0, -1.0, 0.0, 0.0])
    pos = np.array([0, 1, 2, 0, 1, 2])
    assert abs(np.corrcoef(p, pos)[0, 1]) == pytest.approx(0.816497, abs=5e-7)
    q = np.array([0.1, -0.1, 0, 0, 0, 0])  # uncorrelated with p and smaller: PC1 is the first axis
    x = torch.tensor(np.stack([10 * p + 3, q], 1))
    from saegeo.geometry import GeometryAccumulator
    from saegeo.geometry.measures import centred_spectrum

    acc = GeometryAccumulator(2, gram_dtype=torch.float64).add(x)
    art = ArtifactAccumulator(acc.mean, centred_spectrum(acc).eigenvectors[:, :1])
    art.add(x, ids=[5, 5, 6, 5, 6, 7], positions=pos)
    out = art.correlations()
    assert out["abs"]["position"][0] == pytest.approx(math.sqrt(2 / 3), abs=1e-12)
    # log frequency: counts 3, 2, 1 -> log(c/6) per row; brute-force Pearson
    logf = np.log(np.array([3, 3, 2, 3, 2, 1]) / 6)
    assert out["abs"]["log_frequency"][0] == pytest.approx(abs(np.corrcoef(p, logf)[0, 1]), abs=1e-12)
    norms = np.linalg.norm(x.numpy(), axis=1)
    assert out["abs"]["norm"][0] == pytest.approx(abs(np.corrcoef(p, norms)[0, 1]), abs=1e-12)


def test_artifact_accumulator_merges_to_the_single_stream():
    g = torch.Generator().manual_seed(9)
    x = torch.randn(1000, 6, generator=g, dtype=torch.float64) + torch.arange(1000)[:, None] % 30 / 10
    ids, pos = torch.randint(0, 40, (1000,), generator=g), torch.arange(1000) % 30
    mean, comps = x.mean(0), torch.linalg.svd(x - x.mean(0), full_matrices=False).Vh[:2].T
    whole = ArtifactAccumulator(mean, comps).add(x, ids, pos).correlations()
    part = ArtifactAccumulator(mean, comps).add(x[600:], ids[600:], pos[600:])
    merged = ArtifactAccumulator(mean, comps).add(x[:600], ids[:600], pos[:600])
    merged = merged.merge(ArtifactAccumulator.from_state_dict(part.state_dict())).correlations()
    for name in ("log_frequency", "position", "norm"):
        assert merged["r"][name] == pytest.approx(whole["r"][name], rel=1e-10)
    assert whole["abs"]["position"][0] > 0.5
