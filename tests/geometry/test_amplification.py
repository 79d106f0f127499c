"""The amplification law against brute force, closed forms and generated data with known truth."""

import itertools
import math

import numpy as np
import pytest
import torch

from saegeo.errors import BadInputError
from saegeo.geometry.amplification import (
    CodeMomentAccumulator,
    anisotropy_sampling_sd,
    cofiring_pairs,
    cofiring_share,
    cone_shares,
    dictionary_anisotropy,
    exact_moment_prediction,
    heterogeneous_moment_prediction,
    independent_codes_anisotropy,
    independent_second_moment,
    mean_cosine_prediction,
    textbook_prediction,
)
from saegeo.geometry.dictionary import dictionary_geometry
from saegeo.synthetic import SuperpositionGenerator, SyntheticConfig


def test_dictionary_anisotropy_equals_brute_force_pairwise_mean(brute_mean_cosine):
    rng = np.random.default_rng(0)
    rows = rng.normal(size=(300, 16)) + 0.7  # tilted, unnormalised
    a_dict, mean_sq_norm = dictionary_anisotropy(torch.from_numpy(rows), block_rows=37)
    assert a_dict == pytest.approx(brute_mean_cosine(rows), abs=1e-12)
    unit = rows / np.linalg.norm(rows, axis=1, keepdims=True)
    assert mean_sq_norm == pytest.approx(float(np.sum(unit.mean(0) ** 2)), abs=1e-12)


def test_dictionary_anisotropy_leaves_out_the_zero_rows_dictionary_geometry_leaves_out(brute_mean_cosine):
    # one zero-row rule for A_dict: a zero row and a row of rounding noise (1e-9 × the median norm) have no direction
    rng = np.random.default_rng(1)
    rows = rng.normal(size=(40, 6)) + 0.5
    rows[7], rows[21] = 0.0, rows[21] * 1e-9
    a_dict, mean_sq_norm = dictionary_anisotropy(torch.from_numpy(rows), block_rows=9)
    alive = np.delete(rows, [7, 21], axis=0)
    assert a_dict == pytest.approx(brute_mean_cosine(alive), abs=1e-12)
    geometry = dictionary_geometry(torch.from_numpy(rows), block_rows=9)
    assert geometry.zero.nonzero().flatten().tolist() == [7, 21]
    assert (a_dict, mean_sq_norm) == pytest.approx((geometry.a_dict, geometry.mean_sq_norm), abs=1e-12)


def test_dictionary_anisotropy_names_a_non_finite_row():
    rows = torch.randn(10, 4)
    rows[7, 2] = float("nan")
    with pytest.raises(BadInputError, match="row 7"):
        dictionary_anisotropy(rows)


def test_textbook_closed_form():
    # K·A_dict/2 = 100·0.02/2 = 1 → A = 1/2; an isotropic dictionary reads 0 (its known failure).
    assert textbook_prediction(100, 0.02) == pytest.approx(0.5)
    assert textbook_prediction(100, 0.0) == 0.0


def _enumerated_moment_ratio(unit: np.ndarray, q: float, m1: float, m2: float) -> float:
    """E[x·y]/E‖x‖² by summing over all 2^N firing patterns (independent features)."""
    n = len(unit)
    gram = unit @ unit.T
    mean_x = q * m1 * unit.sum(0)
    second = 0.0
    for pattern in itertools.product([0, 1], repeat=n):
        active = [i for i in range(n) if pattern[i]]
        p = q ** len(active) * (1 - q) ** (n - len(active))
        # E[a_i a_j] = m2 on the diagonal, m1² off it
        second += p * sum(gram[i, j] * (m2 if i == j else m1 * m1) for i in active for j in active)
    return float(mean_x @ mean_x) / second


@pytest.mark.parametrize("q,m1,m2", [(0.3, 1.0, 2.0), (0.1, math.sqrt(2 / math.pi), 1.0), (0.6, 1.0, 1.0)])
def test_exact_moment_form_equals_enumerated_moments(q, m1, m2):
    rng = np.random.default_rng(1)
    rows = rng.normal(size=(6, 3)) + np.array([1.0, 0.0, 0.0])
    unit = rows / np.linalg.norm(rows, axis=1, keepdims=True)
    n = len(unit)
    mean_sq_norm = float(np.sum(unit.mean(0) ** 2))
    predicted = exact_moment_prediction(K=q * n, q=q, r=m1 * m1 / m2, mean_sq_norm=mean_sq_norm)
    assert predicted == pytest.approx(_enumerated_moment_ratio(unit, q, m1, m2), rel=1e-12)


def test_exact_moment_form_reduces_to_sign_null_for_isotropic_dictionary():
    # ‖ū‖² = 1/N (orthonormal rows): A = q·r whatever N.
    n, q, r = 512, 0.03, 2 / math.pi
    assert exact_moment_prediction(q * n, q, r, 1.0 / n) == pytest.approx(q * r, rel=1e-12)


def test_mean_cosine_form_on_hand_computed_codes():
    # Orthonormal dictionary (‖ū‖² = 1/N): S/√(S²/N + (1−1/N)Q) per code, averaged, squared, times 1/N.
    n_latents = 4
    codes = torch.tensor([[1.0, 2.0, 0.0, 0.0], [0.0, 0.0, 3.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    acc = CodeMomentAccumulator(n_latents, mean_sq_norm=1 / n_latents).add(codes)
    s, q = np.array([3.0, 3.0]), np.array([5.0, 9.0])
    ratios = s / np.sqrt(s**2 / 4 + 0.75 * q)
    expected_ratio = ratios.sum() / 3  # the all-zero code counts with ratio 0
    assert acc.expected_ratio == pytest.approx(expected_ratio, rel=1e-12)
    assert mean_cosine_prediction(acc.expected_ratio, 0.25) == pytest.approx(0.25 * expected_ratio**2, rel=1e-12)
    assert acc.K == pytest.approx(1.0) and acc.q == pytest.approx(0.25)
    assert acc.r == pytest.approx((6 / 3) ** 2 / (14 / 3))


def test_code_accumulator_merge_state_and_sparse_input_agree():
    gen = SuperpositionGenerator(SyntheticConfig(d=32, n_features=200, rate=0.05, tilt=0.2, seed=3))
    x, codes = gen.sample(3000)
    whole = CodeMomentAccumulator(200, gen.truth.mean_sq_norm).add(codes)
    parts = [
        CodeMomentAccumulator(200, gen.truth.mean_sq_norm).add(codes.slice(a, b)) for a, b in [(0, 1000), (1000, 3000)]
    ]
    merged = parts[0] + parts[1]
    dense = CodeMomentAccumulator(200, gen.truth.mean_sq_norm).add(codes.to_dense())
    restored = CodeMomentAccumulator.from_state_dict(merged.state_dict())
    for other in (merged, dense, restored):
        assert other.n == whole.n
        for name in ("K", "r", "expected_ratio"):
            assert getattr(other, name) == pytest.approx(getattr(whole, name), rel=1e-12)
        assert torch.allclose(other.mean_code, whole.mean_code, rtol=1e-12)
        assert torch.equal(other.fire_count, whole.fire_count)
    # Against numpy on the dense matrix.
    dense_np = codes.to_dense().double().numpy()
    nz = dense_np[dense_np > 0]
    assert whole.K == pytest.approx((dense_np > 0).sum(1).mean())
    assert whole.r == pytest.approx(nz.mean() ** 2 / (nz**2).mean(), rel=1e-10)
    assert np.allclose(whole.firing_frequency.numpy(), (dense_np > 0).mean(0))
    assert not whole.signed and whole.oriented_r == pytest.approx(whole.r, rel=1e-12)
    with pytest.raises(BadInputError, match="not finite"):
        CodeMomentAccumulator(3).add(torch.tensor([[0.5, float("nan"), 0.0]]))
    # codes of both signs (AbsTopK): counted as codes, r with their signs, r̃ with each latent oriented by its mean
    signed = torch.tensor([[0.5, -1.0, 0.0], [-0.5, -2.0, 3.0], [0.0, 0.0, -1.0]], dtype=torch.float64)
    acc = CodeMomentAccumulator(3).add(signed)
    nz = signed[signed != 0]
    assert acc.signed and acc.K == pytest.approx(6 / 3) and acc.negative_share == pytest.approx(4 / 6)
    assert acc.r == pytest.approx(float(nz.mean()) ** 2 / float(nz.square().mean()), rel=1e-12)
    oriented = signed * torch.tensor([1.0, -1.0, 1.0])  # latent 1's mean is < 0: flipped; latents 0 and 2 are ≥ 0
    assert torch.equal(acc.orientation, torch.tensor([1.0, -1.0, 1.0], dtype=torch.float64))
    assert acc.oriented_r == pytest.approx(float(oriented[oriented != 0].mean()) ** 2 / float(nz.square().mean()))
    with pytest.raises(BadInputError, match="merge"):
        whole.merge(CodeMomentAccumulator(201, gen.truth.mean_sq_norm))


def test_cone_shares_closed_form():
    # u1 = e1, u2 = (e1 + e2)/√2, u3 = e3 with E[a] = (1, 2, 0.5): M = (1 + √2, √2, 0.5).
    rows = torch.tensor([[1.0, 0, 0], [1.0, 1.0, 0], [0, 0, 1.0]], dtype=torch.float64)
    mean_code = torch.tensor([1.0, 2.0, 0.5], dtype=torch.float64)
    m = np.array([1 + math.sqrt(2), math.sqrt(2), 0.5])
    m2 = m @ m
    expected = [1 * m[0] / m2, 2 * (m[0] + m[1]) / math.sqrt(2) / m2, 0.5 * m[2] / m2]
    shares = cone_shares(mean_code, rows)  # rows normalised inside
    assert np.allclose(shares.numpy(), expected, atol=1e-12)
    assert float(shares.sum()) == pytest.approx(1.0, abs=1e-12)
    # A feature pointing against the cone gets a negative share.
    shares = cone_shares(torch.tensor([1.0, 1.0, 0.2]), torch.tensor([[1.0, 0.0], [0.8, 0.6], [-1.0, 0.0]]))
    assert float(shares[2]) < 0 and float(shares.sum()) == pytest.approx(1.0, abs=1e-6)
    with pytest.raises(BadInputError, match="no cone"):
        cone_shares(torch.zeros(3), rows)


# ------------------------------------------------------------------ against generated data
LAWS = ["exp", "half_normal", "log_normal", "constant"]


@pytest.fixture(scope="module")
def measured_grid():
    """Measured A and E[x·y]/E‖x‖² on generated rows, with the code statistics, per (law, tilt).

    Built single-threaded: the work is 12 small generations (≈0.25 s on one core), and on a loaded
    2-core machine OpenMP threads competing with other processes made it ≈10× slower (13 s seen)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _measure_grid()
    finally:
        torch.set_num_threads(before)


def _measure_grid() -> dict:
    out = {}
    for law in LAWS:
        for tilt in (0.0, 0.05, 0.2):
            gen = SuperpositionGenerator(
                SyntheticConfig(d=128, n_features=1024, rate=0.02, tilt=tilt, magnitude=law, seed=11)
            )
            x, codes = gen.sample(8192)
            x = x.double()
            n = len(x)
            unit_sum = (x / x.norm(dim=1, keepdim=True)).sum(0)
            measured_a = (float(unit_sum @ unit_sum) / n - 1) / (n - 1)
            total = x.sum(0)
            sq = float(x.square().sum())
            moment_ratio = (float(total @ total) - sq) / (n * (n - 1)) / (sq / n)
            acc = CodeMomentAccumulator(1024, gen.truth.mean_sq_norm).add(codes)
            out[law, tilt] = (measured_a, moment_ratio, acc, gen.truth)
    return out


@pytest.mark.parametrize("law", LAWS)
def test_mean_cosine_form_within_0p01_of_measured_a(measured_grid, law):
    for tilt in (0.0, 0.05, 0.2):
        measured_a, _, acc, truth = measured_grid[law, tilt]
        predicted = mean_cosine_prediction(acc.expected_ratio, truth.mean_sq_norm)
        assert abs(predicted - measured_a) < 0.01, (law, tilt, predicted, measured_a)


@pytest.mark.parametrize("law", ["exp", "half_normal", "constant"])
def test_exact_moment_form_matches_data_moment_ratio(measured_grid, law):
    # log-normal's heavy tail makes E[x·y]/E‖x‖² itself noisy at this n; the other laws pin it to 0.003.
    for tilt in (0.0, 0.05, 0.2):
        _, moment_ratio, acc, truth = measured_grid[law, tilt]
        predicted = exact_moment_prediction(truth.K, truth.q, truth.r, truth.mean_sq_norm)
        assert abs(predicted - moment_ratio) < 0.003, (law, tilt, predicted, moment_ratio)
        # the same from the measured code statistics
        measured_codes = exact_moment_prediction(acc.K, acc.q, acc.r, truth.mean_sq_norm)
        assert abs(measured_codes - moment_ratio) < 0.003


def test_textbook_form_is_2x_off_for_constant_magnitudes(measured_grid):
    # The documented failure: at small k the textbook k = K·A_dict/2 is half the exact k = K·r·‖ū‖².
    measured_a, _, acc, truth = measured_grid["constant", 0.05]
    textbook = textbook_prediction(truth.K, truth.a_dict)
    assert measured_a > 1.6 * textbook


def test_heterogeneous_form_reduces_to_exact_moment_form():
    rng = np.random.default_rng(5)
    rows = torch.from_numpy(rng.normal(size=(50, 7)) + 0.5)
    a_dict, mean_sq_norm = dictionary_anisotropy(rows)
    q, m1, m2 = 0.07, 1.3, 2.9
    homogeneous = exact_moment_prediction(q * 50, q, m1 * m1 / m2, mean_sq_norm)
    per_latent = heterogeneous_moment_prediction(
        torch.full((50,), q * m1, dtype=torch.float64), torch.full((50,), q * m2, dtype=torch.float64), rows
    )
    assert per_latent == pytest.approx(homogeneous, rel=1e-12)


def test_heterogeneous_form_matches_zipf_data():
    # Zipf rates: one global q and r no longer describe the codes; the per-latent form stays exact.
    gen = SuperpositionGenerator(
        SyntheticConfig(
            d=64,
            n_features=400,
            rate=0.02,
            rate_law="zipf",
            zipf_exponent=0.8,
            tilt=0.15,
            magnitude="half_normal",
            seed=2,
        )
    )
    x, codes = gen.sample(30000)
    x = x.double()
    n = len(x)
    total = x.sum(0)
    sq = float(x.square().sum())
    moment_ratio = (float(total @ total) - sq) / (n * (n - 1)) / (sq / n)
    acc = CodeMomentAccumulator(400, gen.truth.mean_sq_norm).add(codes)
    forms = acc.predictions(gen.truth.a_dict, gen.truth.dictionary)
    assert abs(forms["heterogeneous_moment"] - moment_ratio) < 0.003, (forms, moment_ratio)
    # the global form weights every direction alike and misses the frequent features' share
    assert moment_ratio - forms["exact_moment"] > 0.03


# ------------------------------------------------------------------ the per-latent law and the co-firing term
def _brute_force_law(dense: np.ndarray, unit: np.ndarray) -> dict:
    """A_het, E‖x‖² and the co-firing share by the explicit double sum over i ≠ j on dense codes (numpy)."""
    n_latents = dense.shape[1]
    m1, m2 = dense.mean(0), (dense**2).mean(0)
    gram = unit @ unit.T
    signal = sum(m1[i] * m1[j] * gram[i, j] for i in range(n_latents) for j in range(n_latents))  # ‖Σ E[a_i] u_i‖²
    cross = sum(m1[i] * m1[j] * gram[i, j] for i in range(n_latents) for j in range(n_latents) if i != j)
    x = dense @ unit
    second = float((x**2).sum(1).mean())
    cov = dense.T @ dense / len(dense) - np.outer(m1, m1)
    pair = {(i, j): 2 * cov[i, j] * gram[i, j] / second for i in range(n_latents) for j in range(i + 1, n_latents)}
    return {
        "A_het": signal / (m2.sum() + cross),
        "independent": m2.sum() + cross,
        "second": second,
        "cofiring": (second - m2.sum() - cross) / second,
        "pairs": pair,
    }


def test_per_latent_law_and_cofiring_share_equal_the_double_sum():
    gen = SuperpositionGenerator(
        SyntheticConfig(
            d=12,
            n_features=30,
            rate=0.15,
            rate_law="zipf",
            zipf_exponent=0.6,
            tilt=0.4,
            n_groups=3,
            group_size=3,
            seed=4,
        )
    )
    x, codes = gen.sample(3000)
    dense = codes.to_dense().double()
    unit = gen.truth.dictionary.double().numpy()
    unit /= np.linalg.norm(unit, axis=1, keepdims=True)  # float32 rows are unit to 1e-7 only
    brute = _brute_force_law(dense.numpy(), unit)
    acc = CodeMomentAccumulator(30).add(codes)
    assert heterogeneous_moment_prediction(acc.mean_code, acc.mean_sq_code, gen.truth.dictionary) == pytest.approx(
        brute["A_het"], rel=1e-9
    )
    assert independent_second_moment(acc.mean_code, acc.mean_sq_code, gen.truth.dictionary) == pytest.approx(
        brute["independent"], rel=1e-9
    )
    assert cofiring_share(brute["second"], acc.mean_code, acc.mean_sq_code, gen.truth.dictionary) == pytest.approx(
        brute["cofiring"], abs=1e-9
    )
    assert brute["cofiring"] > 0.03  # the planted groups make a term worth checking
    # the pairs (the sample is every row here, so they are exact) against the double sum
    pairs, total = cofiring_pairs(
        codes, acc.mean_code, acc.mean_sq_code, gen.truth.dictionary, brute["second"], n_latents=30, n_pairs=435
    )
    assert len(pairs) == 435
    for p in pairs:
        assert p["share"] == pytest.approx(brute["pairs"][min(p["i"], p["j"]), max(p["i"], p["j"])], abs=1e-12)
    assert total == pytest.approx(brute["cofiring"], abs=1e-9)  # all latents kept: the pairs carry the whole term
    assert [p["share"] for p in pairs] == sorted((p["share"] for p in pairs), reverse=True)


def test_anisotropy_sampling_sd_matches_repeated_samples():
    # sd of Â over 400 independent samples of n = 300 tilted unit vectors against the U-statistic formula
    rng = np.random.default_rng(0)
    direction = np.eye(8)[0]
    values = []
    for _ in range(400):
        y = rng.normal(size=(300, 8)) + 0.6 * direction
        y /= np.linalg.norm(y, axis=1, keepdims=True)
        values.append(((y.sum(0) @ y.sum(0)) - 300) / (300 * 299))
    y = rng.normal(size=(300, 8)) + 0.6 * direction
    u = torch.from_numpy(y / np.linalg.norm(y, axis=1, keepdims=True))
    sd = anisotropy_sampling_sd(u.sum(0), u.T @ u, 300)
    assert sd == pytest.approx(np.std(values), rel=0.15)


def _law_on_generated(config: SyntheticConfig, n: int, sample_rows: int = 2048) -> dict:
    """Measured A, its sd and E‖x‖² of x = Σ a_i u_i (brute force on the rows), beside the law from the codes."""
    gen = SuperpositionGenerator(config)
    x, codes = gen.sample(n)
    x = x.double()
    x = x[x.norm(dim=1) > 0]
    u = x / x.norm(dim=1, keepdim=True)
    measured = (float(u.sum(0) @ u.sum(0)) - len(u)) / (len(u) * (len(u) - 1))
    acc = CodeMomentAccumulator(config.n_features).add(codes)
    second = float(x.square().sum(1).mean()) * len(x) / n  # zero rows count in E‖x‖²
    mc, mc_sd = independent_codes_anisotropy(codes.slice(0, sample_rows), gen.truth.dictionary, seed=1)
    return {
        "measured": measured,
        "sd": anisotropy_sampling_sd(u.sum(0), u.T @ u, len(u)),
        "mc": mc,
        "mc_sd": mc_sd,
        "A_het": heterogeneous_moment_prediction(acc.mean_code, acc.mean_sq_code, gen.truth.dictionary),
        "cofiring": cofiring_share(second, acc.mean_code, acc.mean_sq_code, gen.truth.dictionary),
        "truth": gen.truth,
        "acc": acc,
        "codes": codes,
        "second": second,
    }


@pytest.mark.parametrize("magnitude", ["exp", "constant"])
def test_per_latent_law_explains_iid_zipf_codes_from_a_001_to_0p9(magnitude):
    """iid codes, Zipf-like rates: the per-latent law's mean-cosine form is within 3 sampling sd of the measured A
    over tilts that take A from ≈ 0.05 (exp; 0.08 constant) to ≈ 0.96, the co-firing share is ≈ 0, and the one-rate forms are far off."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        seen = []
        for tilt in (0.0, 0.1, 0.3, 0.6, 0.9):
            cfg = SyntheticConfig(
                d=64,
                n_features=512,
                rate=0.02,
                rate_law="zipf",
                zipf_exponent=0.7,
                tilt=tilt,
                magnitude=magnitude,
                seed=2,
            )
            r = _law_on_generated(cfg, 8192)
            seen.append(r["measured"])
            sd = math.hypot(r["sd"], r["mc_sd"])
            assert abs(r["measured"] - r["mc"]) < 3 * sd, (tilt, r["measured"], r["mc"], sd)
            assert abs(r["cofiring"]) < 0.01, (tilt, r["cofiring"])
        assert min(seen) < 0.1 and max(seen) > 0.9
    finally:
        torch.set_num_threads(before)


def test_per_latent_law_at_small_a_with_an_isotropic_dictionary():
    # A ≈ 0.01: a flat Zipf law (s = 0.3) in a large isotropic dictionary; the moment form is exact here too
    cfg = SyntheticConfig(
        d=128, n_features=1024, rate=0.01, rate_law="zipf", zipf_exponent=0.3, magnitude="exp", seed=5
    )
    r = _law_on_generated(cfg, 16384)
    assert 0.005 < r["measured"] < 0.02
    assert abs(r["measured"] - r["mc"]) < 3 * math.hypot(r["sd"], r["mc_sd"])
    assert abs(r["cofiring"]) < 0.01


def _planted_cofiring_closed_form(truth) -> tuple[float, set]:
    """Σ_g q_g(1 − q_g)·E[a]²·(‖Σ_{i∈g} u_i‖² − g) / E‖x‖²: in a group every pair i ≠ j fires together with the
    group's rate q_g, so Cov(a_i, a_j) = q_g E[a]² − q_g² E[a]²; magnitudes are independent, other pairs have Cov 0.
    E‖x‖² = Σ_i Var(a_i) + that term + ‖Σ_i E[a_i] u_i‖² (the generator's definition)."""
    m1, m2 = truth.magnitude_moments
    u = truth.dictionary.double()
    q = truth.rates.double()
    term = 0.0
    planted = set()
    for members in truth.groups.tolist():
        qg = float(q[members[0]])
        term += qg * (1 - qg) * m1 * m1 * (float(u[members].sum(0).square().sum()) - len(members))
        planted |= {(min(i, j), max(i, j)) for i in members for j in members if i != j}
    mean = (q * m1) @ u
    second = float((q * m2 - (q * m1) ** 2).sum()) + term + float(mean @ mean)
    return term / second, planted


def test_planted_cofiring_groups_give_the_closed_form_share_and_the_planted_pairs():
    cfg = SyntheticConfig(d=256, n_features=60, rate=0.05, tilt=0.5, magnitude="exp", n_groups=10, group_size=3, seed=6)
    r = _law_on_generated(cfg, 20000, sample_rows=4096)
    closed, planted = _planted_cofiring_closed_form(r["truth"])
    assert closed > 0.05
    assert r["cofiring"] == pytest.approx(closed, abs=0.01)
    pairs, _ = cofiring_pairs(
        r["codes"].slice(0, 4096),
        r["acc"].mean_code,
        r["acc"].mean_sq_code,
        r["truth"].dictionary,
        r["second"],
        n_pairs=len(planted),
    )
    assert {(min(p["i"], p["j"]), max(p["i"], p["j"])) for p in pairs} == planted
