"""Measures: the issue's golden values (recomputed independently here), brute force, SVD, IsoScore package."""

import json
import math

import numpy as np
import pytest
import torch

from saegeo.geometry.accumulate import GeometryAccumulator
from saegeo.geometry.measures import (
    ActivationGeometry,
    activation_geometry,
    anisotropy_from_unit_mean,
    centred_spectrum,
    effective_rank,
    fix_eigenvector_signs,
    isoscore,
    numerical_rank,
    participation_ratio,
    project_top_components,
    rogue_dimensions,
    symmetric_eigh,
    top_projection_correlation,
)

SIX = np.array([[3, 1, 0], [3, 0, 1], [3, -1, 0], [3, 0, -1], [4, 0.5, 0.5], [2, -0.5, -0.5]], dtype=np.float64)


def _geometry(x, **kw):
    acc = GeometryAccumulator(x.shape[1])
    acc.add(x)
    return acc, activation_geometry(acc, **kw)


def _np_erank(lam) -> float:
    p = np.asarray(lam, dtype=np.float64)
    p = p / p.sum()
    p = p[p > 0]
    return float(np.exp(-np.sum(p * np.log(p))))


def test_golden_planar_unit_vectors():
    ang = np.deg2rad([10, 25, 40, 5, 30])
    x = np.stack([np.cos(ang), np.sin(ang)], axis=1)
    _, geo = _geometry(x)
    # brute force: mean of the cosines of all angle differences, i ≠ j
    diffs = [math.cos(a - b) for i, a in enumerate(ang) for j, b in enumerate(ang) if i != j]
    assert geo.anisotropy == pytest.approx(np.mean(diffs), abs=1e-12)
    assert geo.anisotropy == pytest.approx(0.937992, abs=5e-7)
    assert geo.offset == pytest.approx(math.hypot(np.cos(ang).mean(), np.sin(ang).mean()), abs=1e-12)
    assert geo.offset == pytest.approx(0.974881, abs=5e-7)


def test_golden_effective_ranks():
    assert effective_rank([0.9, 0.06, 0.04]) == pytest.approx(_np_erank([0.9, 0.06, 0.04]), rel=1e-12)
    assert effective_rank([0.9, 0.06, 0.04]) == pytest.approx(1.48051, abs=5e-6)
    harmonic = [1 / k for k in range(1, 6)]
    assert effective_rank(harmonic) == pytest.approx(_np_erank(harmonic), rel=1e-12)
    assert effective_rank(harmonic) == pytest.approx(4.18103, abs=5e-6)
    assert participation_ratio(harmonic) == pytest.approx(sum(harmonic) ** 2 / sum(h * h for h in harmonic))
    assert effective_rank(torch.ones(7)) == pytest.approx(7.0)
    assert participation_ratio(torch.ones(7)) == pytest.approx(7.0)


def test_golden_six_vectors_and_artifact_correlation(brute_mean_cosine):
    acc, geo = _geometry(SIX)
    unit = SIX / np.linalg.norm(SIX, axis=1, keepdims=True)
    assert geo.offset == pytest.approx(np.linalg.norm(unit.mean(0)), abs=1e-12)
    assert geo.offset == pytest.approx(0.954082, abs=5e-7)
    assert geo.anisotropy == pytest.approx(brute_mean_cosine(SIX), abs=1e-12)
    assert geo.anisotropy == pytest.approx(0.892326, abs=5e-7)
    # closed form: 6Σ = [[2,1,1],[1,2.5,.5],[1,.5,2.5]] has eigenvalues 4, 2, 1 with top vector (1,1,1)/√3
    np.testing.assert_allclose(geo.eigenvalues, np.array([4, 2, 1]) / 6, atol=1e-12)
    assert geo.top1_share == pytest.approx(4 / 7, abs=1e-12)
    assert geo.effective_rank == pytest.approx(_np_erank([4, 2, 1]), abs=1e-12)
    assert geo.effective_rank == pytest.approx(2.6005, abs=5e-5)
    np.testing.assert_allclose(geo.top_eigenvectors[0], np.ones(3) / math.sqrt(3), atol=1e-12)
    meta = np.array([10, 10, 10, 10, 14, 6], dtype=np.float64)
    # projections on (1,1,1)/√3 of the centred rows are (1,1,−1,−1,2,−2)/√3
    expected = abs(np.corrcoef(np.array([1, 1, -1, -1, 2, -2]), meta)[0, 1])
    assert expected == pytest.approx(0.816497, abs=5e-7)
    for source in (geo, acc):
        got = top_projection_correlation([SIX[:4], SIX[4:]], [meta[:4], meta[4:]], source)
        assert got == pytest.approx(expected, abs=1e-12)


def test_golden_two_clusters():
    rng = np.random.default_rng(0)
    n = 100_000
    centres = np.where(rng.random(n) < 0.5, -2.0, 2.0)
    x = rng.normal(scale=0.5, size=(n, 3))
    x[:, 0] += centres
    _, geo = _geometry(x)
    # population covariance: diag(4 + 0.25, 0.25, 0.25)
    lam = np.array([4.25, 0.25, 0.25])
    assert lam[0] / lam.sum() == pytest.approx(0.8947, abs=5e-5)
    assert _np_erank(lam) == pytest.approx(1.506, abs=5e-4)
    assert geo.top1_share == pytest.approx(lam[0] / lam.sum(), abs=3e-3)
    assert geo.effective_rank == pytest.approx(_np_erank(lam), abs=5e-3)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_anisotropy_equals_brute_force_pairwise(seed, brute_mean_cosine):
    rng = np.random.default_rng(seed)
    n, d = rng.integers(2, 500), rng.integers(2, 40)
    x = rng.normal(size=(n, d)) + rng.normal(size=d) * rng.uniform(0, 3)
    acc, geo = _geometry(x)
    assert geo.anisotropy == pytest.approx(brute_mean_cosine(x), abs=1e-10)
    assert anisotropy_from_unit_mean(acc.unit_mean, n) == geo.anisotropy


def test_spectrum_equals_numpy_svd_of_centred_matrix():
    rng = np.random.default_rng(7)
    x = rng.normal(size=(400, 24)) @ rng.normal(size=(24, 24)) + 5
    _, geo = _geometry(x)
    s = np.linalg.svd(x - x.mean(0), compute_uv=False)
    np.testing.assert_allclose(geo.eigenvalues, s**2 / len(x), rtol=1e-10, atol=1e-12)
    # the same through float32 input and the float32 gram path: relative 1e-5 of λ_max
    acc32 = GeometryAccumulator(24)
    acc32.add(x.astype(np.float32))
    geo32 = activation_geometry(acc32)
    x32 = x.astype(np.float32).astype(np.float64)
    s32 = np.linalg.svd(x32 - x32.mean(0), compute_uv=False)
    np.testing.assert_allclose(geo32.eigenvalues, s32**2 / len(x), atol=1e-5 * s32[0] ** 2 / len(x))


def test_invariances():
    rng = np.random.default_rng(8)
    x = rng.normal(size=(300, 10)) + np.linspace(0, 2, 10)
    _, geo = _geometry(x)
    scaled = x * rng.uniform(0.01, 100, size=(300, 1))  # positive row scaling
    _, geo_scaled = _geometry(scaled)
    assert geo_scaled.anisotropy == pytest.approx(geo.anisotropy, abs=1e-12)
    assert geo_scaled.offset == pytest.approx(geo.offset, abs=1e-12)
    q, _ = np.linalg.qr(rng.normal(size=(10, 10)))  # rotation
    _, geo_rot = _geometry(x @ q)
    np.testing.assert_allclose(geo_rot.eigenvalues, geo.eigenvalues, rtol=1e-10)
    assert geo_rot.anisotropy == pytest.approx(geo.anisotropy, abs=1e-12)
    assert geo_rot.isoscore == pytest.approx(geo.isoscore, abs=1e-10)


def test_isoscore_agrees_with_the_isoscore_package():
    from IsoScore import IsoScore as iso_pkg

    rng = np.random.default_rng(9)
    cases = [
        rng.normal(size=(500, 5)),  # near isotropic
        rng.normal(size=(500, 8)) * np.array([10, 1, 1, 1, 0.5, 0.1, 0.1, 0.1]),
        rng.normal(size=(300, 3)) @ rng.normal(size=(3, 12)) + rng.normal(size=(300, 12)) * 0.1,  # ~3-dim
        rng.exponential(size=(400, 6)) * np.arange(1, 7),
    ]
    for x in cases:
        _, geo = _geometry(x)
        ref = float(iso_pkg.IsoScore(x))
        # the package takes torch.sqrt of an integer tensor, i.e. √d in float32: agreement to ~1e-7
        assert geo.isoscore == pytest.approx(ref, abs=1e-6)
    assert isoscore(torch.ones(9)) == pytest.approx(1.0)
    assert isoscore(torch.tensor([1.0] + [0.0] * 9)) == pytest.approx(0.0, abs=1e-12)


def test_eigenvector_sign_convention():
    rng = np.random.default_rng(10)
    x = rng.normal(size=(200, 6)) @ rng.normal(size=(6, 6))
    _, geo = _geometry(x, top_k_eigvecs=6)
    vecs = np.array(geo.top_eigenvectors)
    for v in vecs:
        j = np.argmax(np.abs(v))
        assert v[j] > 0
    # the same eigenvectors come out of reordered and of negated data (covariance unchanged)
    for other in (x[::-1], -x):
        _, g2 = _geometry(np.ascontiguousarray(other), top_k_eigvecs=6)
        np.testing.assert_allclose(np.array(g2.top_eigenvectors), vecs, atol=1e-9)
    flipped = fix_eigenvector_signs(torch.tensor([[0.1, -0.8], [-0.9, 0.6]]))
    np.testing.assert_allclose(flipped.numpy(), [[-0.1, 0.8], [0.9, -0.6]], rtol=1e-6)


def test_projection_and_correlation_against_numpy():
    rng = np.random.default_rng(11)
    n, d = 400, 12
    length = rng.integers(1, 50, size=n).astype(np.float64)
    x = rng.normal(size=(n, d))
    direction = rng.normal(size=d)
    x += np.outer(0.3 * length, direction / np.linalg.norm(direction))  # a "length" direction
    acc, geo = _geometry(x, top_k_eigvecs=3)
    proj = project_top_components(np.array_split(x, 5), geo, k=3).numpy()
    _, _, vt = np.linalg.svd(x - x.mean(0), full_matrices=False)
    ref = (x - x.mean(0)) @ vt[:3].T
    np.testing.assert_allclose(np.abs(proj), np.abs(ref), atol=1e-9)  # signs differ by convention only
    corr = top_projection_correlation(np.array_split(x, 5), np.array_split(length, 5), geo)
    assert corr == pytest.approx(abs(np.corrcoef(ref[:, 0], length)[0, 1]), abs=1e-10)
    assert corr > 0.9


def test_rogue_dimensions_shares():
    m = torch.tensor([0.0, 3.0, 0.1, -4.0, 0.2])
    rogue = rogue_dimensions(m, top=3)
    total = 9 + 0.01 + 16 + 0.04
    assert rogue.top_indices == [3, 1, 4]
    assert rogue.top_shares == pytest.approx([16 / total, 9 / total, 0.04 / total])
    assert rogue.n_for_50 == 1 and rogue.n_for_90 == 2


def test_numerical_rank_of_low_rank_data():
    rng = np.random.default_rng(12)
    x = rng.normal(size=(300, 5)) @ rng.normal(size=(5, 30)) + 7.0
    _, geo64 = _geometry(x)
    assert geo64.numerical_rank == 5
    _, geo32 = _geometry(x.astype(np.float32))
    assert geo32.numerical_rank == 5
    assert numerical_rank(torch.tensor([1.0, 0.5, 1e-3]), 1e-2) == 2


def test_summary_is_json_safe_and_consistent():
    rng = np.random.default_rng(13)
    x = np.maximum(rng.normal(size=(500, 40)), 0)
    acc, geo = _geometry(x)
    d = json.loads(json.dumps(geo.to_dict(), allow_nan=False))
    mu = x.mean(0)
    cov = np.cov(x.T, bias=True)
    assert d["mean_vector_norm"] == pytest.approx(np.linalg.norm(mu))
    assert d["mean_norm_ratio"] == pytest.approx(np.linalg.norm(mu) / np.linalg.norm(x, axis=1).mean())
    assert d["mean_share_of_second_moment"] == pytest.approx(mu @ mu / (mu @ mu + np.trace(cov)))
    assert d["outlier_severity"] == pytest.approx(np.linalg.norm(mu) / math.sqrt(np.trace(cov)))
    assert d["isotropic_cosine_sd"] == pytest.approx(1 / math.sqrt(40))
    assert d["isotropic_sd"] == pytest.approx(math.sqrt(2 / (500 * 499 * 40)))
    assert d["isotropic_z"] == pytest.approx((d["anisotropy"] - d["sign"]["null"]) / d["isotropic_sd"])
    assert d["sign"]["regime"] == "non-negative"
    assert len(d["eigenvalues"]) == 40 and len(d["top_eigenvectors"]) == 10
    back = ActivationGeometry.from_dict(d)
    assert back.to_dict() == d and back.sign.null == geo.sign.null


def _planted_symmetric(rng, eigenvalues):
    """A = U diag(λ) Uᵀ with U a random orthogonal matrix (QR of a Gaussian): the golden λ and U by construction."""
    d = len(eigenvalues)
    u, r = np.linalg.qr(rng.normal(size=(d, d)))
    u = u * np.sign(np.diag(r))
    return (u * eigenvalues) @ u.T, u


def test_top_eigenvectors_through_the_tridiagonal_form_match_the_planted_ones():
    rng = np.random.default_rng(21)
    d, k = 200, 10
    # ten separated top eigenvalues (gaps ≥ 0.5), a bulk in [0, 1] below, one exact zero
    lam = np.concatenate([[0.0], np.sort(rng.uniform(0, 1, d - k - 1)), 2.0 + 0.5 * np.arange(k)])
    a, u = _planted_symmetric(rng, lam)
    values, vectors = symmetric_eigh(torch.from_numpy(a), top_vectors=k)
    assert vectors.shape == (d, k)
    # backward-stable: |Δλ| ≤ c·d·ε·‖A‖ (forming A rounds by as much), angles ≤ c·d·ε·‖A‖/gap; c = 10
    eps_a = 10 * d * np.finfo(np.float64).eps * lam.max()
    np.testing.assert_allclose(values.numpy(), np.sort(lam), rtol=0, atol=eps_a)
    overlap = np.abs(np.sum(vectors.numpy() * u[:, -k:], axis=0))  # both ascending; sign is free
    np.testing.assert_allclose(overlap, 1.0, rtol=0, atol=eps_a / 0.5)
    np.testing.assert_allclose(vectors.numpy().T @ vectors.numpy(), np.eye(k), rtol=0, atol=eps_a)


def test_top_eigenvectors_in_a_cluster_span_its_eigenspace():
    rng = np.random.default_rng(22)
    d, k = 128, 4
    lam = np.concatenate([rng.uniform(0, 1, d - k), [3.0, 5.0, 5.0, 5.0]])  # a triple eigenvalue at the top
    a, u = _planted_symmetric(rng, lam)
    values, vectors = symmetric_eigh(torch.from_numpy(a), top_vectors=k)
    z = vectors.numpy()
    eps_a = 10 * d * np.finfo(np.float64).eps * 5.0
    np.testing.assert_allclose(z.T @ z, np.eye(k), rtol=0, atol=eps_a)
    np.testing.assert_allclose(a @ z - z * values.numpy()[-k:], 0.0, rtol=0, atol=eps_a)  # A z = λ z
    top3 = u[:, -3:]  # the cluster's eigenspace: the same projector, whatever basis was chosen in it
    np.testing.assert_allclose(z[:, 1:] @ z[:, 1:].T, top3 @ top3.T, rtol=0, atol=eps_a / 2.0)


def test_report_spectrum_with_ten_vectors_equals_the_full_eigh():
    rng = np.random.default_rng(23)
    x = rng.normal(size=(3000, 64)) * np.logspace(0.5, -1, 64) + 2.0
    acc = GeometryAccumulator(64)
    acc.add(x)
    full, top = centred_spectrum(acc), centred_spectrum(acc, top_vectors=10)
    assert top.eigenvectors.shape == (64, 10)
    lam_max = float(full.eigenvalues[0])
    tol = 10 * 64 * np.finfo(np.float64).eps * lam_max
    np.testing.assert_allclose(top.eigenvalues.numpy(), full.eigenvalues.numpy(), rtol=0, atol=tol)
    gaps = -np.diff(full.eigenvalues.numpy()[:11])  # the top-10 angles are ≤ tol/gap
    np.testing.assert_allclose(
        top.eigenvectors.numpy(), full.eigenvectors[:, :10].numpy(), rtol=0, atol=tol / gaps.min()
    )
    _, geo = _geometry(x)
    np.testing.assert_allclose(np.array(geo.top_eigenvectors), top.eigenvectors.T.numpy(), rtol=0, atol=0)
