"""The superposition generator: truth is what the rows are made of, streams are deterministic."""

import math

import numpy as np
import pytest
import torch

from saegeo.errors import BadInputError
from saegeo.synthetic import SuperpositionGenerator, SyntheticConfig, SyntheticTruth, magnitude_moments, preset
from saegeo.synthetic.superposition import BLOCK_ROWS

SMALL = dict(d=64, n_features=256, rate=0.05)


def _mean_pairwise_cosine(x: torch.Tensor) -> float:
    unit = x.double() / x.double().norm(dim=1, keepdim=True)
    n = len(unit)
    s = unit.sum(0)
    return (float(s @ s) - n) / (n * (n - 1))


def test_rows_are_the_truth_applied_to_the_codes():
    gen = SuperpositionGenerator(SyntheticConfig(**SMALL, tilt=0.3, offset=2.0, seed=5))
    x, codes = gen.sample(1500)
    rebuilt = codes.to_dense() @ gen.truth.dictionary + gen.truth.offset
    assert torch.allclose(x, rebuilt, atol=1e-5)
    assert float(gen.truth.offset.norm()) == pytest.approx(2.0 * gen.truth.signal_rms, rel=1e-6)
    assert (codes.values > 0).all()


def test_stream_is_deterministic_and_independent_of_batch_size():
    cfg = SyntheticConfig(**SMALL, tilt=0.2, noise=0.1, seed=7)
    n = 2 * BLOCK_ROWS + 300
    whole_x, whole_c = SuperpositionGenerator(cfg).sample(n)
    parts = list(SuperpositionGenerator(cfg).batches(n, batch_size=777))
    assert [len(p[0]) for p in parts] == [777, 777, 777, n - 3 * 777]
    assert torch.equal(torch.cat([p[0] for p in parts]), whole_x)
    dense = torch.cat([p[1].to_dense() for p in parts])
    assert torch.equal(dense, whole_c.to_dense())
    # any range can be regenerated on its own
    mid_x, _ = SuperpositionGenerator(cfg).sample(500, start=BLOCK_ROWS - 100)
    assert torch.equal(mid_x, whole_x[BLOCK_ROWS - 100 : BLOCK_ROWS + 400])
    other = SuperpositionGenerator(SyntheticConfig(**SMALL, tilt=0.2, noise=0.1, seed=8)).sample(10)[0]
    assert not torch.allclose(other, whole_x[:10])


def test_tilt_is_the_cosine_with_the_common_direction():
    gen = SuperpositionGenerator(SyntheticConfig(d=128, n_features=500, tilt=0.4, seed=2))
    u, c = gen.truth.dictionary.double(), gen.truth.common_direction.double()
    assert torch.allclose(u.norm(dim=1), torch.ones(500, dtype=torch.float64), atol=1e-6)
    assert torch.allclose(u @ c, torch.full((500,), 0.4, dtype=torch.float64), atol=1e-6)
    # brute-force mean pairwise cosine equals the stored A_dict, and ≈ tilt² (random parts ≈ orthogonal)
    assert gen.truth.a_dict == pytest.approx(_mean_pairwise_cosine(u), abs=1e-9)
    assert gen.truth.a_dict == pytest.approx(0.16, abs=0.01)


@pytest.mark.parametrize("target", [0.01, 0.05, 0.3, 0.8])
def test_target_a_dict_is_hit(target):
    gen = SuperpositionGenerator(SyntheticConfig(d=96, n_features=400, target_a_dict=target, seed=4))
    measured = _mean_pairwise_cosine(gen.truth.dictionary)
    assert abs(measured - target) < 0.05 * target
    assert abs(measured - target) < 1e-5  # the tilt is solved exactly, not searched


def test_unreachable_target_is_refused():
    with pytest.raises(BadInputError, match="below what"):
        SuperpositionGenerator(SyntheticConfig(d=8, n_features=50, target_a_dict=1e-6, seed=0))


@pytest.mark.parametrize("law", ["exp", "half_normal", "log_normal", "constant"])
def test_rates_and_magnitude_moments(law):
    q, n_features, n = 0.05, 200, 6000
    gen = SuperpositionGenerator(
        SyntheticConfig(d=16, n_features=n_features, rate=q, magnitude=law, log_normal_sigma=0.5, seed=1)
    )
    _, codes = gen.sample(n)
    trials = n * n_features
    fired = codes.values.numel()
    assert abs(fired / trials - q) < 4 * math.sqrt(q * (1 - q) / trials)
    values = codes.values.double().numpy()
    # closed forms, computed here independently of magnitude_moments
    expected = {
        "exp": (1.0, 2.0, 6.0, 24.0),
        "half_normal": (math.sqrt(2 / math.pi), 1.0, 2 * math.sqrt(2 / math.pi), 3.0),
        "log_normal": tuple(math.exp(k * k * 0.25 / 2) for k in (1, 2, 3, 4)),
        "constant": (1.0, 1.0, 1.0, 1.0),
    }[law]
    m1, m2, _, m4 = expected
    assert abs(values.mean() - m1) <= 4 * math.sqrt(max(m2 - m1 * m1, 1e-12) / len(values)) + 1e-9
    assert abs((values**2).mean() - m2) <= 4 * math.sqrt(max(m4 - m2 * m2, 1e-12) / len(values)) + 1e-9
    assert magnitude_moments(law, 0.5) == pytest.approx((m1, m2))
    assert gen.truth.r == pytest.approx(m1 * m1 / m2)


def test_zipf_rates():
    gen = SuperpositionGenerator(
        SyntheticConfig(d=16, n_features=1000, rate=0.005, rate_law="zipf", zipf_exponent=1.0, seed=0)
    )
    rates = gen.truth.rates.double()
    assert float(rates.mean()) == pytest.approx(0.005, rel=1e-6)
    assert float(rates[0] / rates[9]) == pytest.approx(10.0, rel=1e-5)
    _, codes = gen.sample(20000)
    freq0 = float((codes.cols == 0).sum()) / 20000
    p0 = float(rates[0])
    assert abs(freq0 - p0) < 4 * math.sqrt(p0 * (1 - p0) / 20000)


def test_cofiring_groups_fire_together():
    gen = SuperpositionGenerator(SyntheticConfig(d=32, n_features=100, rate=0.1, n_groups=5, group_size=3, seed=2))
    _, codes = gen.sample(4000)
    support = codes.to_dense() > 0
    for members in gen.truth.groups:
        cols = support[:, members]
        assert torch.equal(cols[:, 0:1].expand_as(cols), cols)
        assert abs(float(cols[:, 0].double().mean()) - 0.1) < 4 * math.sqrt(0.09 / 4000)
    # a grouped pair is perfectly correlated, an ungrouped pair is not
    both = float((support[:, 20] & support[:, 21]).double().mean())
    assert both < 0.03


def test_population_moments_match_the_rows():
    gen = SuperpositionGenerator(
        SyntheticConfig(**SMALL, tilt=0.3, offset=1.0, noise=0.5, n_groups=10, group_size=2, seed=9)
    )
    x, codes = gen.sample(30000)
    x = x.double()
    truth = gen.truth
    mean_err = (x.mean(0) - truth.population_mean.double()).norm()
    cov = torch.cov(x.T)
    pop = truth.covariance()
    assert float(mean_err) < 0.05 * float(truth.population_mean.norm())
    assert float((cov - pop).norm() / pop.norm()) < 0.05
    signal_mean = truth.mean_code @ truth.dictionary.double()
    signal_sq = float(torch.trace(pop)) - truth.noise_std**2 * 64 + float(signal_mean @ signal_mean)
    assert signal_sq == pytest.approx(truth.signal_rms**2, rel=1e-6)
    noise_part = x - (codes.to_dense().double() @ truth.dictionary.double() + truth.offset.double())
    assert float(noise_part.std()) == pytest.approx(truth.noise_std, rel=0.02)


def test_presets_show_their_regimes():
    # dense ReLU: coordinates are ReLU(N(0,1)) → mean 1/√(2π), half zeros, A near 1/π.
    x, _ = SuperpositionGenerator(preset("dense_relu", d=256, seed=0)).sample(4000)
    assert float(x.min()) >= 0.0
    assert float((x > 0).double().mean()) == pytest.approx(0.5, abs=0.01)
    assert float(x.double().mean()) == pytest.approx(1 / math.sqrt(2 * math.pi), abs=0.01)
    assert _mean_pairwise_cosine(x) == pytest.approx(1 / math.pi, abs=0.01)
    # whitened: zero mean and identity covariance by construction
    x, _ = SuperpositionGenerator(preset("whitened", d=32, n_features=256, seed=0)).sample(30000)
    cov = torch.cov(x.double().T)
    assert float((cov - torch.eye(32, dtype=torch.float64)).abs().max()) < 0.1
    assert float(x.double().mean(0).norm()) < 0.05
    # large offset: the rows point along b
    gen = SuperpositionGenerator(preset("large_offset", d=64, n_features=256, seed=0))
    x, _ = gen.sample(2000)
    assert _mean_pairwise_cosine(x) > 0.85
    # isotropic codes over a random dictionary: A ≈ the sign null q·r = 0.02/2 (K ≈ 20 active per row)
    x, _ = SuperpositionGenerator(preset("isotropic", d=256, n_features=1024, seed=0)).sample(4000)
    assert _mean_pairwise_cosine(x) == pytest.approx(0.01, rel=0.15)
    with pytest.raises(BadInputError, match="unknown synthetic preset"):
        preset("nope")
    # unset (None) overrides keep the preset's values; the identity dictionary follows d
    cfg = preset("dense_relu", d=48, n_features=None, tilt=None)
    assert cfg.n_features == 48 and cfg.rate == 0.5 and cfg.magnitude == "half_normal"


def test_bad_configs_are_refused():
    for bad, says in (
        (dict(rate=1.5), r"rate must be in \(0, 1\], got 1.5"),
        (dict(tilt=1.2), r"tilt must be in \[0, 1\], got 1.2"),
        (dict(magnitude="cauchy"), r"unknown magnitude law 'cauchy'"),
        (dict(rate_law="pareto"), r"rate_law must be 'uniform' or 'zipf', got 'pareto'"),
        (dict(n_groups=3, group_size=1), r"3 co-firing groups of 1 need group_size >= 2"),
    ):
        with pytest.raises(BadInputError, match=says):
            SuperpositionGenerator(SyntheticConfig(**{**SMALL, **bad}))
    with pytest.raises(BadInputError, match="> 1; lower the rate"):
        SuperpositionGenerator(SyntheticConfig(d=8, n_features=100, rate=0.5, rate_law="zipf"))


def test_truth_round_trip_and_store(tmp_path):
    gen = SuperpositionGenerator(preset("whitened", d=16, n_features=64, seed=3))
    path = gen.truth.save(tmp_path / "t.safetensors")
    back = SyntheticTruth.load(path)
    assert back.config == gen.truth.config
    for name in ("dictionary", "rates", "offset", "whitening", "population_mean", "common_direction"):
        assert torch.equal(getattr(back, name), getattr(gen.truth, name))
    assert back.a_dict == gen.truth.a_dict and back.tilt == gen.truth.tilt

    from saegeo.activations.store import ActivationStore
    from saegeo.pipeline import write_synthetic_store

    gen = SuperpositionGenerator(SyntheticConfig(**SMALL, tilt=0.2, seed=1))
    store = write_synthetic_store(gen, tmp_path / "store", 2500, batch_rows=600, shard_rows=1000)
    assert len(store) == 2500
    assert torch.equal(ActivationStore(tmp_path / "store").read_rows(0, 2500), gen.sample(2500)[0])
    assert SyntheticTruth.load(tmp_path / "store" / "truth.safetensors").a_dict == gen.truth.a_dict


def test_cli_synth_writes_store_and_truth(tmp_path, capsys):
    from saegeo.activations.store import ActivationStore
    from saegeo.cli import main

    out = tmp_path / "synth"
    rc = main(
        [
            "synth",
            "--preset",
            "tilted",
            "--n",
            "3000",
            "--d",
            "32",
            "--n-features",
            "128",
            "--seed",
            "4",
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    truth = SyntheticTruth.load(out / "truth.safetensors")
    assert truth.tilt == pytest.approx(0.3)
    rows = ActivationStore(out).read_rows(0, 3000)
    assert torch.equal(rows, SuperpositionGenerator(truth.config).sample(3000)[0])
    printed = capsys.readouterr().out
    assert "A_dict" in printed and str(out) in printed
    assert main(["synth", "--preset", "tilted", "--n", "10", "--out", str(out)]) == 2  # refuses to overwrite
    # one safetensors file plus its truth, readable by `saegeo geometry`
    single = tmp_path / "acts.safetensors"
    assert main(["synth", "--preset", "dense_relu", "--d", "16", "--n", "700", "--out", str(single)]) == 0
    from safetensors.torch import load_file

    rows = load_file(str(single))["activations"]
    truth = SyntheticTruth.load(tmp_path / "acts.truth.safetensors")
    assert rows.shape == (700, 16) and torch.equal(rows, SuperpositionGenerator(truth.config).sample(700)[0])


def test_untilted_dictionary_spans_the_whole_space():
    """tilt 0 means plain random directions: N > d of them span R^d (numpy's rank), and their mean cosine with the
    common direction is chance level (|cos| ~ 1/√d), not the exact 0 of rows confined to c's complement."""
    truth = SuperpositionGenerator(SyntheticConfig(d=32, n_features=128, tilt=0.0, seed=5)).truth
    rows = truth.dictionary.double().numpy()
    assert np.linalg.matrix_rank(rows, tol=1e-6) == 32
    cos_common = rows @ truth.common_direction.double().numpy()
    assert np.abs(cos_common).max() > 0.05
