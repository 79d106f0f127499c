"""Every sd saegeo prints, checked two ways (issue 36 item 4; docs/statistics.md §8 lists them):

- its formula against an exact value: enumeration of every n-tuple of a finite law, a closed form, or quadrature;
- the reported sd against the spread of the same estimator over resamples: repeated simulation from one law, or
  disjoint subsets of real rows (MiniLM blocks.3 and SAELens-trained SAEs on them).

A spread over G resamples has a relative se of about 1/√(2(G − 1)); the bounds below are 3 of those (plus the
reported sd's own scatter where it matters). Golden numbers never come from the code under test. Other sds are
checked where they live: null_sd by tests/geometry/test_null_calibration.py (calibration over laws, and its U-statistics
against sums over distinct tuples), the dark-matter fold sds by tests/geometry/test_dark_matter.py, the nearest-neighbour
mean's interval by tests/report/test_check_width.py."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy import integrate, stats

from saegeo.geometry.accumulate import anisotropy_from_unit_mean
from saegeo.geometry.amplification import anisotropy_sampling_sd, independent_codes_anisotropy
from saegeo.geometry.measures import null_test_from_sums, null_test_sums_from_rows
from saegeo.geometry.nulls import (
    anisotropy_null_sd,
    anisotropy_u_statistic_variance,
    isotropic_cosine_sd,
    sign_aware_null,
)
from saegeo.synthetic import SuperpositionGenerator, SyntheticConfig

FIXTURES = Path(__file__).parents[1] / "fixtures" / "published"


def _spread_bound(groups: int) -> float:
    return 3 / math.sqrt(2 * (groups - 1))


def _null_test(x: torch.Tensor):
    """(A, T = A − null − bias, A_sd, null_sd) through the report's null test on the rows' own sums (equal to the
    accumulator's: tests/geometry/test_null_calibration.py)."""
    sums = null_test_sums_from_rows(x)
    a = anisotropy_from_unit_mean(sums.unit_sum / sums.n, sums.n)
    m1, m2 = (float(v) / (sums.n * sums.d) for v in sums.power_sum)
    null = sign_aware_null(m1, m2)
    test = null_test_from_sums(sums, a, null)
    return a, a - null - test.null_bias, test.A_sd, test.null_sd


# ------------------------------------------------------------------ the U-statistic sd of Â (A_sd, measured A's sd)
def _enumerated_variance(atoms: np.ndarray, probs: np.ndarray, n: int) -> float:
    """Var of Â = mean_{a≠b} x̂_a·x̂_b over all atoms^n ordered n-tuples, each with its probability."""
    gram = atoms @ atoms.T
    mean = second = 0.0
    for tup in itertools.product(range(len(atoms)), repeat=n):
        p = float(np.prod(probs[list(tup)]))
        a = sum(gram[i, j] for i, j in itertools.permutations(tup, 2)) / (n * (n - 1))
        mean += p * a
        second += p * a * a
    return second - mean * mean


def test_u_statistic_sd_of_a_equals_enumeration_over_every_tuple():
    # a four-atom law of unit vectors in the plane, n = 4: 256 tuples; ζ₁, ζ₂ from the law by direct sums
    angles = np.array([0.1, 0.9, 2.0, 4.0])
    atoms = np.stack([np.cos(angles), np.sin(angles)], 1)
    probs = np.array([0.4, 0.3, 0.2, 0.1])
    n = 4
    exact = _enumerated_variance(atoms, probs, n)
    m = probs @ atoms
    h = atoms @ m
    zeta1 = probs @ h**2 - (probs @ h) ** 2
    g = atoms @ atoms.T
    zeta2 = probs @ g**2 @ probs - (probs @ g @ probs) ** 2
    assert anisotropy_u_statistic_variance(zeta1, zeta2, n) == pytest.approx(exact, rel=1e-12)
    # the same variance from the sums the report keeps (Σ x̂ = n·m, Σ x̂x̂ᵀ = n·C: the population's)
    c = (atoms * probs[:, None]).T @ atoms
    sd = anisotropy_sampling_sd(torch.from_numpy(n * m), torch.from_numpy(n * c), n)
    assert sd**2 == pytest.approx(exact, rel=1e-12)


def test_isotropic_sds_equal_their_exact_values():
    # one cosine between uniform unit vectors: density ∝ (1 − t²)^((d−3)/2) on [−1, 1]; its variance by quadrature
    for d in (3, 7, 40):
        dens = lambda t, d=d: (1 - t * t) ** ((d - 3) / 2)  # noqa: E731
        var = integrate.quad(lambda t: t * t * dens(t), -1, 1)[0] / integrate.quad(dens, -1, 1)[0]
        assert isotropic_cosine_sd(d) == pytest.approx(math.sqrt(var), rel=1e-9)
    # Â under isotropy: the law uniform on {±e_i} (m = 0, C = I/d), every 3-tuple at d = 2 and 4-tuple at d = 3
    for n, d in ((3, 2), (4, 3)):
        atoms = np.concatenate([np.eye(d), -np.eye(d)])
        exact = _enumerated_variance(atoms, np.full(2 * d, 1 / (2 * d)), n)
        assert anisotropy_null_sd(n, d) == pytest.approx(math.sqrt(exact), rel=1e-12)


def test_isotropic_cosine_sd_matches_simulation():
    rng = np.random.default_rng(7)
    d, pairs = 24, 4000
    x, y = rng.normal(size=(2, pairs, d))
    cos = (x * y).sum(1) / np.linalg.norm(x, axis=1) / np.linalg.norm(y, axis=1)
    assert isotropic_cosine_sd(d) == pytest.approx(cos.std(ddof=1), rel=_spread_bound(pairs))


def test_a_sd_matches_repeated_simulation():
    # ReLU of a shifted Gaussian: a real cone (ζ₁ > 0) and the degenerate term both present at n = 100, d = 16
    rng = np.random.default_rng(8)
    n, d, reps = 100, 16, 200
    a, sds = [], []
    for _ in range(reps):
        x = np.maximum(rng.normal(size=(n, d)) + 0.2, 0).astype(np.float32)
        got = _null_test(torch.from_numpy(x))
        a.append(got[0])
        sds.append(got[2])
    assert np.mean(sds) == pytest.approx(np.std(a, ddof=1), rel=_spread_bound(reps))


# ------------------------------------------------------------------ the per-latent law's mean-cosine form
N_PAIRED, Q_PAIRED = 20, 0.15


def _paired_codes(rng: np.random.Generator, k: int) -> torch.Tensor:
    """Latents 2t and 2t + 1 fire together (rate q per pair), magnitude 1: each latent is Bernoulli(q)."""
    pairs = rng.random((k, N_PAIRED // 2)) < Q_PAIRED
    return torch.from_numpy(np.repeat(pairs, 2, axis=1).astype(np.float64))


def _paired_closed_form(k: int, replicates: int = 2) -> float:
    """The delta-method sd of the mean-cosine form for the identity dictionary and paired codes, in closed form.

    Under the product law the active count c is Binomial(N, q); x̂ = x/√c, so m = μ·1 with μ = E[√c | c ≥ 1]/N,
    h = m·x̂ = μ√c, φ = (μ√c − Nμ²)[c ≥ 1], ζ₁ = μ²Var(√c | c ≥ 1), and one latent's influence is
    ψ = E φ(c' + 1) − E φ(c'), c' ~ Bin(N − 1, q). V⊗ = Nq(1 − q)ψ²; the sampled rows fire in pairs, so
    Var(s) = ψ²·Var(2·Bin(N/2, q)) = 2Nq(1 − q)ψ². ζ₂ = E[o²/(c_x c_y)] − A² with the overlap o hypergeometric."""
    big_n, q, r = N_PAIRED, Q_PAIRED, replicates
    c = np.arange(1, big_n + 1)
    p_nonzero = 1 - (1 - q) ** big_n
    cond = stats.binom.pmf(c, big_n, q) / p_nonzero
    mu = cond @ np.sqrt(c) / big_n
    a = big_n * mu**2
    zeta1 = mu**2 * (cond @ c - (cond @ np.sqrt(c)) ** 2)
    c1 = np.arange(big_n)
    p1 = stats.binom.pmf(c1, big_n - 1, q)
    psi = mu * (p1 @ np.sqrt(c1 + 1)) - mu * (p1 @ np.sqrt(c1)) - big_n * mu**2 * p1[0]
    v_product = big_n * q * (1 - q) * psi**2
    var_s = 2 * v_product
    cx, cy = np.meshgrid(c, c, indexing="ij")
    e_o2 = np.outer(cond, cond) * (cx * cy / big_n**2 + (big_n - cx) * (big_n - cy) / (big_n**2 * (big_n - 1)))
    zeta2 = e_o2.sum() - a**2
    n = p_nonzero * k * r
    var = 4 / (p_nonzero**2 * k) * (var_s - v_product / r) + 4 * zeta1 / (p_nonzero * k * r) + 2 * zeta2 / (n * (n - 1))
    return math.sqrt(var)


def test_mean_cosine_sd_equals_its_closed_form_with_paired_cofiring():
    # the estimate of the sd converges on the closed form (its scatter over samples is ≈ 2 % at k = 4,000)
    rng = np.random.default_rng(9)
    k = 4000
    eye = torch.eye(N_PAIRED, dtype=torch.float64)
    sds = [independent_codes_anisotropy(_paired_codes(rng, k), eye, seed=s)[1] for s in range(4)]
    assert np.mean(sds) == pytest.approx(_paired_closed_form(k), rel=0.03)


def test_mean_cosine_sd_matches_repeated_simulation_with_paired_cofiring():
    rng = np.random.default_rng(10)
    k, reps = 400, 100
    eye = torch.eye(N_PAIRED, dtype=torch.float64)
    got = [independent_codes_anisotropy(_paired_codes(rng, k), eye, seed=s) for s in range(reps)]
    spread = np.std([a for a, _ in got], ddof=1)
    assert _paired_closed_form(k) == pytest.approx(spread, rel=_spread_bound(reps))
    assert np.mean([s for _, s in got]) == pytest.approx(spread, rel=_spread_bound(reps))


def test_mean_cosine_sd_matches_repeated_simulation_on_a_tilted_dictionary_with_cofiring_groups():
    # 40 groups of 6 latents firing together, tilt 0.5: the old sd (the permuted rows' U-statistic) read 1.8× low
    cfg = SyntheticConfig(d=64, n_features=256, rate=0.05, tilt=0.5, n_groups=40, group_size=6, seed=6)
    gen = SuperpositionGenerator(cfg)
    k, reps = 512, 60
    got = []
    for r in range(reps):
        _, codes = gen.sample(k, start=r * k)
        got.append(independent_codes_anisotropy(codes, gen.truth.dictionary, seed=r))
    spread = np.std([a for a, _ in got], ddof=1)
    assert np.mean([s for _, s in got]) == pytest.approx(spread, rel=_spread_bound(reps))


# ------------------------------------------------------------------ real rows: MiniLM blocks.3, SAELens-trained SAEs
@pytest.fixture(scope="module")
def minilm_rows(tmp_path_factory):
    from saegeo.activations.cache import CacheConfig, cache_activations
    from saegeo.activations.store import ActivationStore

    out = tmp_path_factory.mktemp("minilm_sd")
    hook = "blocks.3.hook_resid_post"
    cache_activations(
        CacheConfig(model="minilm", hooks=(hook,), context=128, max_tokens=16000, out=str(out), progress=False)
    )
    store = ActivationStore(out / hook)
    x, pos = store.read_shard(0), store.read_positions(0)
    x = x[pos > 0]  # the first position of each window is a different law (CLS)
    return x[torch.randperm(len(x), generator=torch.Generator().manual_seed(0))]


def _subsets(x: torch.Tensor, k: int):
    return [x[s * k : (s + 1) * k] for s in range(len(x) // k)]


def test_sds_of_a_on_real_rows_match_disjoint_subsets(minilm_rows):
    """A_sd of the rows, null_sd and A_sd of an SAE's codes (non-negative, sparse: the null test's own kind of
    data) and the sd of the reconstructions' A, each against its spread over disjoint 300-row subsets."""
    from saegeo.sae.model import SAE

    sae = SAE.load(FIXTURES / "saelens_trained_topk")
    subsets = _subsets(minilm_rows, 300)
    got = {"A_sd rows": [], "A_sd codes": [], "null_sd codes": [], "recon": []}
    for part in subsets:
        a, _, a_sd, _ = _null_test(part)
        got["A_sd rows"].append((a, a_sd))
        with torch.no_grad():
            codes = sae.encode(part)
            recon = (sae.decode(codes) - sae.b_dec).double()
        a, t, a_sd, null_sd = _null_test(codes)
        got["A_sd codes"].append((a, a_sd))
        got["null_sd codes"].append((t, null_sd))
        u = recon / recon.norm(dim=1, keepdim=True)
        a = (float(u.sum(0) @ u.sum(0)) - len(u)) / (len(u) * (len(u) - 1))
        got["recon"].append((a, anisotropy_sampling_sd(u.sum(0), u.T @ u, len(u))))
    for name, pairs in got.items():
        values, sds = np.array(pairs).T
        ratio = sds.mean() / values.std(ddof=1)
        assert abs(ratio - 1) < _spread_bound(len(subsets)), (name, ratio)


@pytest.mark.parametrize("name", ["saelens_trained_topk", "saelens_trained_standard_norm"])
def test_mean_cosine_sd_on_real_codes_matches_disjoint_subsets(minilm_rows, name):
    # measured with 59 subsets of 400 rows: spread/reported 0.98 (TopK) and 0.98 (ReLU); the old sd read 0.54 / 0.44
    from saegeo.sae.metrics import SAEMetrics
    from saegeo.sae.model import SAE

    sae = SAE.load(FIXTURES / name)
    metrics = SAEMetrics(sae)
    w_dec = sae.W_dec.detach()
    subsets = _subsets(minilm_rows, 300)
    got = [independent_codes_anisotropy(metrics.sample_codes(p), w_dec, seed=i) for i, p in enumerate(subsets)]
    values, sds = np.array(got).T
    ratio = sds.mean() / values.std(ddof=1)
    assert abs(ratio - 1) < _spread_bound(len(subsets)), ratio
