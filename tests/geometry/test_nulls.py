"""Nulls: the sign-aware null against direct simulation and quadrature; Marchenko–Pastur against simulation."""

import math

import numpy as np
import pytest
import torch
from scipy import integrate, stats

from saegeo.geometry.accumulate import GeometryAccumulator
from saegeo.geometry.measures import activation_geometry, anisotropy_from_unit_mean, effective_rank, sign_null
from saegeo.geometry.nulls import (
    anisotropy_null_sd,
    marchenko_pastur_edges,
    marchenko_pastur_mean,
    noise_effective_rank,
    sign_aware_null,
    sign_regime,
)


def _gelu_moments() -> tuple[float, float]:
    gelu = lambda z: z * stats.norm.cdf(z)  # noqa: E731  exact (erf) GELU
    m1 = integrate.quad(lambda z: gelu(z) * stats.norm.pdf(z), -np.inf, np.inf)[0]
    m2 = integrate.quad(lambda z: gelu(z) ** 2 * stats.norm.pdf(z), -np.inf, np.inf)[0]
    return m1, m2


def _sample(kind: str, rng, n: int, d: int, q: float = 0.1) -> np.ndarray:
    z = rng.normal(size=(n, d))
    if kind == "relu":
        return np.maximum(z, 0)
    if kind == "sparse_exp":
        x = rng.exponential(size=(n, d)) * (rng.random((n, d)) < q)
        x[x.sum(1) == 0, 0] = 1.0  # no all-zero rows (rare at these sizes)
        return x
    if kind == "gelu":
        return torch.nn.functional.gelu(torch.from_numpy(z)).numpy()
    if kind == "symmetric":
        return z * rng.exponential(size=(n, d))
    raise ValueError(kind)


@pytest.mark.parametrize(
    "kind, closed_form, regime, canonical",
    [
        ("relu", 1 / math.pi, "non-negative", "1/pi"),
        ("sparse_exp", 0.1 / 2, "non-negative", "q/2"),
        ("gelu", None, "sign-skewed", "none"),
        ("symmetric", 0.0, "sign-symmetric", "0"),
    ],
)
def test_sign_aware_null_against_simulation(kind, closed_form, regime, canonical, brute_mean_cosine):
    rng = np.random.default_rng(0)
    n, d = 800, 1024
    x = _sample(kind, rng, n, d)
    acc = GeometryAccumulator(d)
    acc.add(x)
    null_info = sign_null(acc)
    if closed_form is None:  # GELU(N(0,1)): m̄²/s̄ by quadrature ≈ 0.187
        m1, m2 = _gelu_moments()
        closed_form = m1**2 / m2
        assert closed_form == pytest.approx(0.187, abs=5e-4)
    null = null_info.null
    # the pooled null estimates the closed form (sampling error of m̄ and s̄ over n·d entries)
    assert null == pytest.approx(closed_form, abs=0.02 * closed_form + 2e-3)
    # …and predicts the mean pairwise cosine actually measured (brute force); finite-d bias ≈ 1.4/(q·d) relative
    measured = brute_mean_cosine(x)
    assert anisotropy_from_unit_mean(acc.unit_mean, n) == pytest.approx(measured, abs=1e-10)
    q = null_info.fraction_nonzero
    bias = 1.4 / (q * d)
    assert measured == pytest.approx(null, abs=(2 * bias + 0.02) * null + 2e-3)
    assert null_info.regime == regime and null_info.canonical == canonical
    assert null_info.dense_relu_null == pytest.approx(1 / math.pi)
    assert null_info.sparse_exp_null == pytest.approx(q / 2)


def test_sign_null_depends_on_magnitudes_not_on_q_alone(brute_mean_cosine):
    """Same q, constant magnitudes: the null is q·1, not q/2 — a fixed q-switch would be off by 2×."""
    rng = np.random.default_rng(1)
    q, n, d = 0.1, 600, 1024
    x = (rng.random((n, d)) < q).astype(np.float64)
    x[x.sum(1) == 0, 0] = 1.0
    acc = GeometryAccumulator(d)
    acc.add(x)
    null_info = sign_null(acc)
    assert null_info.magnitude_ratio == pytest.approx(1.0)
    assert null_info.null == pytest.approx(q, rel=0.03)
    assert brute_mean_cosine(x) == pytest.approx(null_info.null, rel=0.05)
    assert null_info.canonical == "none"


def test_small_helpers():
    assert sign_aware_null(0.0, 1.0) == 0.0
    assert sign_aware_null(2.0, 4.0) == 1.0
    assert sign_regime(0.0) == "non-negative" and sign_regime(0.5) == "sign-symmetric"
    assert sign_regime(0.05) == "sign-skewed"
    assert anisotropy_null_sd(1, 10) == math.inf


def test_isotropic_null_sd_by_simulation(brute_mean_cosine):
    rng = np.random.default_rng(2)
    n, d, reps = 30, 20, 400
    estimates = [brute_mean_cosine(rng.normal(size=(n, d))) for _ in range(reps)]
    sd = anisotropy_null_sd(n, d)
    assert np.mean(estimates) == pytest.approx(0.0, abs=4 * sd / math.sqrt(reps))
    assert np.std(estimates) == pytest.approx(sd, rel=0.15)


def _mp_quad_e_tlogt(gamma: float) -> float:
    """E[t log t] under MP(γ, σ²=1), by scipy's adaptive quadrature of the raw density."""
    a, b = (1 - math.sqrt(gamma)) ** 2, (1 + math.sqrt(gamma)) ** 2
    dens = lambda t: math.sqrt(max((b - t) * (t - a), 0.0)) / (2 * math.pi * gamma * t)  # noqa: E731
    return integrate.quad(lambda t: t * math.log(t) * dens(t), a, b, limit=200)[0]


def test_marchenko_pastur_golden_and_simulation():
    n, d = 5000, 768
    lower, upper = marchenko_pastur_edges(1.0, n, d)
    g = d / n
    assert (lower, upper) == pytest.approx(((1 - math.sqrt(g)) ** 2, (1 + math.sqrt(g)) ** 2))
    assert upper == pytest.approx(1.937, abs=5e-4) and lower == pytest.approx(0.370, abs=5e-4)
    # noise erank: d·exp(−E[t log t]) with the expectation by independent quadrature
    erank_quad = d * math.exp(-_mp_quad_e_tlogt(g))
    assert noise_effective_rank(n, d) == pytest.approx(erank_quad, rel=1e-6)
    assert noise_effective_rank(n, d) == pytest.approx(711, abs=0.5)
    # simulation at the same aspect ratio γ = 0.1536 (a quarter of the size keeps the test fast)
    n, d = 1250, 192
    rng = np.random.default_rng(3)
    x = rng.normal(size=(n, d)).astype(np.float32)
    acc = GeometryAccumulator(d)
    for part in np.array_split(x, 3):
        acc.add(part)
    geo = activation_geometry(acc)
    assert geo.mp_upper_edge == pytest.approx(1.937, rel=0.01)
    assert geo.mp_lower_edge == pytest.approx(0.370, rel=0.01)
    assert geo.eigenvalues[0] == pytest.approx(geo.mp_upper_edge, rel=0.03)  # the bulk fills the band
    assert geo.eigenvalues[-1] == pytest.approx(geo.mp_lower_edge, rel=0.1)  # soft edge: larger finite-d shift
    assert geo.n_spikes <= 2  # Tracy–Widom fluctuations may poke one above
    assert geo.effective_rank == pytest.approx(geo.noise_effective_rank, rel=0.003)


@pytest.mark.parametrize("n, d", [(400, 100), (150, 300), (100, 100)])
def test_noise_effective_rank_other_shapes(n, d):
    g = d / n
    e = _mp_quad_e_tlogt(g)
    if g > 1:  # the atom at 0 carries mass 1 − 1/γ and contributes nothing; the continuous part has mass 1/γ
        assert integrate.quad(
            lambda t: (
                math.sqrt(max(((1 + math.sqrt(g)) ** 2 - t) * (t - (1 - math.sqrt(g)) ** 2), 0)) / (2 * math.pi * g * t)
            ),
            (1 - math.sqrt(g)) ** 2,
            (1 + math.sqrt(g)) ** 2,
        )[0] == pytest.approx(1 / g, rel=1e-6)
    assert noise_effective_rank(n, d) == pytest.approx(d * math.exp(-e), rel=1e-6)
    # and the same Gauss–Legendre quadrature the module offers for other functionals
    assert marchenko_pastur_mean(lambda t: t * np.log(t), g) == pytest.approx(e, rel=1e-6, abs=1e-9)
    rng = np.random.default_rng(4)
    sims = []
    for _ in range(3):
        z = rng.normal(size=(n, d))
        sims.append(effective_rank(np.linalg.eigvalsh(z.T @ z)))
    assert np.mean(sims) == pytest.approx(noise_effective_rank(n, d), rel=0.03)


def test_sign_null_ignores_zero_rows_like_the_anisotropy_does():
    """A is measured on nonzero rows, so the null must be too: m̄²/s̄ and q computed in numpy on the nonzero rows
    of ReLU data half of whose rows are zero (pooling over all rows would halve the null)."""
    rng = np.random.default_rng(7)
    x = np.maximum(rng.standard_normal((4000, 64)), 0.0)
    x[::2] = 0.0
    nonzero = x[1::2]
    acc = GeometryAccumulator(64)
    acc.add(x)
    null = sign_null(acc)
    assert null.null == pytest.approx(nonzero.mean() ** 2 / np.square(nonzero).mean(), rel=1e-9)
    assert null.null == pytest.approx(1 / np.pi, rel=0.03)
    assert null.fraction_nonzero == pytest.approx(np.count_nonzero(nonzero) / nonzero.size, rel=1e-9)


def test_mp_shape_of_a_zero_bulk_is_a_number_not_nan():
    """Low-rank data leave a bulk of zeros and a fitted σ² = 0: the MP law is then a point mass, its CDF a step
    (not 0/0), and the KS distance a finite number that fails the shape test (no spike count is made on it)."""
    import warnings

    from saegeo.geometry.nulls import marchenko_pastur_cdf, mp_bulk_distance, mp_shape_threshold

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cdf = marchenko_pastur_cdf(np.array([-1.0, 0.0, 1.0]), 0.5, 0.0)
        distance = mp_bulk_distance(np.zeros(20), 0.5, 0.0)
    assert cdf.tolist() == [0.0, 1.0, 1.0]
    assert distance == 1.0 and distance > mp_shape_threshold(20)
