"""Issue 14: a valid z against the sign-aware null, and a calibrated Marchenko–Pastur bulk.

Golden numbers come from brute force (loops over index tuples), closed forms, or simulation of the
statistic itself over seeds — never from the code under test.
"""

import itertools
import math

import numpy as np
import pytest
import torch

from saegeo.geometry.accumulate import GeometryAccumulator
from saegeo.geometry.measures import activation_geometry, null_test, sign_null, unit_moment_u_statistics
from saegeo.geometry.nulls import (
    anisotropy_u_statistic_variance,
    calibrated_mp_bulk,
    finite_d_null_bias,
    iid_unit_mean_sq_norm,
    power_law_slope,
)
from saegeo.render.text import geometry_summary


def _null_rows(kind: str, n: int, d: int, g: torch.Generator) -> torch.Tensor:
    """Rows with iid coordinates from a marginal: data drawn exactly from the pooled null."""
    z = torch.randn(n, d, generator=g)
    if kind == "relu":
        return z.clamp(min=0)
    if kind == "gelu":
        return torch.nn.functional.gelu(z)
    if kind == "sparse_exp":  # q = 0.1
        return torch.empty(n, d).exponential_(generator=g) * (torch.rand(n, d, generator=g) < 0.1)
    raise ValueError(kind)


def _z_and_statistic(x: torch.Tensor) -> tuple[float, float, float]:
    """(reported null_z, Â − A_null − bias, reported sd) of one sample."""
    acc = GeometryAccumulator(x.shape[1])
    acc.add(x)
    null = sign_null(acc).null
    a = (acc.n_unit * float(acc.unit_mean.square().sum()) - 1) / (acc.n_unit - 1)
    t = null_test(acc, a, null)
    return t.null_z, a - null - t.null_bias, t.null_sd


# ---------------------------------------------------------------------- the U-statistics, by brute force
def test_unit_moment_u_statistics_match_sums_over_distinct_tuples():
    rng = np.random.default_rng(0)
    n, d = 7, 3
    x = rng.normal(size=(n, d)) + 0.5
    u = x / np.linalg.norm(x, axis=1, keepdims=True)
    dot = u @ u.T
    pairs = [(i, j) for i, j in itertools.permutations(range(n), 2)]
    m_sq = np.mean([dot[i, j] for i, j in pairs])
    tr_c2 = np.mean([dot[i, j] ** 2 for i, j in pairs])
    mcm = np.mean([dot[i, j] * dot[i, k] for i, j, k in itertools.permutations(range(n), 3)])
    m4 = np.mean([dot[i, j] * dot[k, l] for i, j, k, l in itertools.permutations(range(n), 4)])
    got = unit_moment_u_statistics(torch.from_numpy(u.sum(0)), torch.from_numpy(u.T @ u), n)
    assert got == pytest.approx((m_sq, tr_c2, mcm, m4), rel=1e-10, abs=1e-12)


def test_u_statistic_variance_formula_against_simulation():
    """Var(Â) = [4(n−2)ζ₁ + 2ζ₂]/(n(n−1)), ζ's from a large sample, against the spread of Â over 3,000 samples."""
    d, n, reps = 8, 30, 3000
    g = torch.Generator().manual_seed(1)
    big = torch.randn(400_000, d, generator=g, dtype=torch.float64).clamp(min=0) + 0.05
    u = big / big.norm(dim=1, keepdim=True)
    m = u.mean(0)
    c = u.T @ u / u.shape[0]
    zeta1 = float(m @ c @ m - (m @ m) ** 2)
    zeta2 = float((c * c).sum() - (m @ m) ** 2)
    x = torch.randn(reps, n, d, generator=g, dtype=torch.float64).clamp(min=0) + 0.05
    ux = x / x.norm(dim=2, keepdim=True)
    s = ux.sum(1)
    a_hat = (s.square().sum(1) - n) / (n * (n - 1))
    predicted = anisotropy_u_statistic_variance(zeta1, zeta2, n)
    assert float(a_hat.var()) == pytest.approx(predicted, rel=0.08)  # sampling error of a variance, 3,000 reps: 2.6%


# ---------------------------------------------------------------------- the finite-d bias of the pooled null
def _exp_marginal(q: float, k: int = 20_000) -> tuple[np.ndarray, np.ndarray]:
    """q-sparse Exp(1) as a discrete law: the zero atom and k equal-mass quantiles."""
    values = np.concatenate([[0.0], -np.log1p(-(np.arange(k) + 0.5) / k)])
    weights = np.concatenate([[1 - q], np.full(k, q / k)])
    return weights, values


def test_finite_d_bias_exact_integral_against_monte_carlo():
    """E‖E x̂‖² for iid q = 0.1 sparse Exp coordinates at d = 256, by 200,000 simulated rows."""
    d = 256
    g = torch.Generator().manual_seed(2)
    ratios = []
    for _ in range(10):
        x = torch.empty(20_000, d).exponential_(generator=g).double()
        x *= torch.rand(20_000, d, generator=g) < 0.1
        r = x.sum(1) / x.norm(dim=1)
        ratios.append(r[torch.isfinite(r)])
    r = torch.cat(ratios)
    mc = d * float(r.mean() / d) ** 2
    se = 2 * mc * float(r.std() / r.mean()) / math.sqrt(r.numel())
    w, v = _exp_marginal(0.1)
    exact = iid_unit_mean_sq_norm(w, v, d)
    assert abs(exact - mc) < 4 * se + 1e-6
    # relative bias ≈ +1.3/(q·d) at q·d = 25.6 — the DESIGN's "≈ 1.4/(q·d)", not 0
    assert finite_d_null_bias(w, v, d) * 0.1 * d == pytest.approx(1.33, abs=0.05)


@pytest.mark.parametrize("law, limit", [("relu", 0.75), ("exp_q0.5", 1.5 / 0.5 + 0.25)])
def test_finite_d_bias_has_the_second_order_limit(law, limit):
    """b·d → 1 − E x³/(m̄ s̄) + (3/4)Var(x²)/s̄² at large d (closed forms: 0.75 for ReLU(N(0,1)), 1.5/q + 1/4 for Exp)."""
    if law == "relu":
        nodes, weights = np.polynomial.hermite_e.hermegauss(200)
        v = np.concatenate([[0.0], nodes[nodes > 0]])
        w = np.concatenate([[0.5], weights[nodes > 0] / math.sqrt(2 * math.pi)])
    else:
        w, v = _exp_marginal(0.5)
    d = 5_000
    assert finite_d_null_bias(w, v, d) * d == pytest.approx(limit, rel=0.03)


# ---------------------------------------------------------------------- calibration of z by simulation
@pytest.mark.parametrize("kind", ["relu", "sparse_exp", "gelu"])
@pytest.mark.parametrize("d, n", [(256, 4000), (1024, 2000)])
def test_z_vs_null_is_calibrated_on_data_from_the_null(kind, d, n):
    zs = []
    for seed in range(20):
        z, _, _ = _z_and_statistic(_null_rows(kind, n, d, torch.Generator().manual_seed(seed)))
        zs.append(z)
    zs = np.array(zs)
    assert abs(zs.mean()) < 0.5, zs
    assert 0.6 <= zs.std(ddof=1) <= 1.5, zs


def test_isotropic_sd_is_far_too_small_under_a_nonzero_null():
    """The old z (isotropic sd) calls pure null data 'significant'; the labelled isotropic number stays reported."""
    x = _null_rows("relu", 4000, 256, torch.Generator().manual_seed(0))
    acc = GeometryAccumulator(256)
    acc.add(x)
    geo = activation_geometry(acc, top_k_eigvecs=0)
    assert geo.isotropic_sd == pytest.approx(math.sqrt(2 / (4000 * 3999 * 256)))
    assert abs(geo.isotropic_z) > 20  # includes the finite-d bias and ignores ζ₁
    assert abs(geo.null_z) < 3
    assert geo.A_sd > 5 * geo.isotropic_sd  # the sd of Â alone: ζ₁ ≠ 0
    # the unit-vector spectrum: C = E x̂x̂ᵀ is mmᵀ + (nearly) isotropic rest, top-1 ≈ ‖m‖² + (1 − ‖m‖²)/d
    m_sq = geo.anisotropy
    assert geo.unit_top1_share == pytest.approx(m_sq + (1 - m_sq) / 256, rel=0.05)


def test_planted_cone_of_five_sd_reads_z_about_five():
    """ReLU rows plus c·w (w a fixed balanced ±1/√d pattern: the pooled mean is unchanged): the planted
    excess is measured by brute force as mean/sd over seeds of Â − A_null − bias, and the reported z matches it."""
    d, n = 256, 4000
    w = torch.ones(d)
    w[1::2] = -1
    w /= math.sqrt(d)
    c = 0.152  # c²/(d·s̄) ≈ 5 sd of the statistic (s̄ = 1/2, sd ≈ 3.6e-5)
    zs, stats = [], []
    for seed in range(20):
        x = _null_rows("relu", n, d, torch.Generator().manual_seed(100 + seed)) + c * w
        z, t, _ = _z_and_statistic(x)
        zs.append(z)
        stats.append(t)
    effect = np.mean(stats) / np.std(stats, ddof=1)  # the spread over seeds is the statistic's true sd
    assert 4.0 <= effect <= 6.0  # the construction plants ≈ 5 sd
    assert np.mean(zs) == pytest.approx(effect, abs=1.0)
    assert np.mean(zs) == pytest.approx(5.0, abs=1.2)


# ---------------------------------------------------------------------- calibrated MP bulk
def _sample_spectrum(pop: torch.Tensor, n: int, g: torch.Generator) -> np.ndarray:
    d = pop.numel()
    x = torch.randn(n, d, generator=g, dtype=torch.float64) * pop.sqrt()
    x -= x.mean(0)
    return torch.linalg.eigvalsh(x.T @ x / n).flip(0).numpy()


def test_rogue_direction_does_not_hide_the_spikes():
    """10 spikes at 9× a unit bulk + one direction of variance 2,500 (d = 256, n = 5,000): tr Σ/d ≈ 11 puts the
    naive edge at ≈ 16.8 and counts 1; the bulk fit counts all 11."""
    d, n = 256, 5000
    pop = torch.ones(d, dtype=torch.float64)
    pop[0], pop[1:11] = 2500.0, 9.0
    lam = _sample_spectrum(pop, n, torch.Generator().manual_seed(0))
    bulk = calibrated_mp_bulk(lam, n, d)
    naive_edge = float(lam.sum() / d) * (1 + math.sqrt(d / n)) ** 2
    assert naive_edge > 15 and int((lam > naive_edge).sum()) == 1 == bulk.n_spikes_trace_edge
    assert bulk.has_flat_bulk
    assert bulk.n_spikes == 11
    assert bulk.sigma2_bulk == pytest.approx(1.0, rel=0.03)
    assert bulk.sigma2_trace == pytest.approx(float(lam.sum()) / d)


def test_pure_noise_counts_no_spike_in_95_percent_of_seeds():
    d, n = 200, 2000
    counts = [calibrated_mp_bulk(_sample_spectrum(torch.ones(d, dtype=torch.float64), n,
                                                  torch.Generator().manual_seed(s)), n, d).n_spikes
              for s in range(40)]
    assert all(c is not None for c in counts)
    assert sum(c == 0 for c in counts) >= 38, counts


def test_power_law_spectrum_is_reported_as_such_with_its_slope():
    d = 512
    k = np.arange(1, d + 1, dtype=np.float64)
    for alpha in (0.7, 1.0, 1.5):
        bulk = calibrated_mp_bulk(k**-alpha, 100_000, d)
        assert not bulk.has_flat_bulk and bulk.n_spikes is None
        assert bulk.power_law_alpha == pytest.approx(alpha, abs=1e-6)
    # sampled from a power-law population, n = 50·d: still no flat bulk, α within 0.05
    d, n = 256, 12_800
    pop = torch.arange(1, d + 1, dtype=torch.float64) ** -1.0
    lam = _sample_spectrum(pop, n, torch.Generator().manual_seed(3))
    bulk = calibrated_mp_bulk(lam, n, d)
    assert bulk.n_spikes is None
    assert bulk.power_law_alpha == pytest.approx(1.0, abs=0.05)
    assert power_law_slope(lam)[0] == pytest.approx(bulk.power_law_alpha)


def test_geometry_reports_both_sigma2_and_the_calibrated_count():
    d, n = 64, 3000
    g = torch.Generator().manual_seed(4)
    x = torch.randn(n, d, generator=g)
    x[:, 0] *= 50.0  # one rogue direction
    x[:, 1:4] *= 3.0  # three spikes at 9×
    acc = GeometryAccumulator(d)
    acc.add(x)
    geo = activation_geometry(acc)
    assert geo.n_spikes == 4
    assert geo.mp_sigma2_bulk == pytest.approx(1.0, rel=0.05)
    assert geo.mp_sigma2_trace == pytest.approx((2500 + 27 + 60) / 64, rel=0.1)
    assert geo.mp_bulk["n_spikes_trace_edge"] == 1
    text = geometry_summary(geo)
    assert "from the bulk" in text and "Tracy-Widom" in text and "vs null" in text
