"""Issue 14: the activation diagnosis — every flag fires on its constructed case and stays silent on healthy data."""

import math

import pytest
import torch

from saegeo.geometry.accumulate import GeometryAccumulator
from saegeo.geometry.diagnosis import kmeans_between_share, two_means_1d
from saegeo.geometry.measures import effective_rank
from saegeo.geometry.transforms import AllButTheTop, Whitening
from saegeo.render import render_html, render_markdown, render_terminal
from saegeo.report import flags as F
from saegeo.report.geometry_report import GeometryReport, ReportOptions, geometry_report

DIAGNOSIS_FLAGS = {F.OFFSET_CONE, F.INVISIBLE, F.MASSIVE, F.MIXED}


def _report(x: torch.Tensor) -> GeometryReport:
    return geometry_report(x, options=ReportOptions(progress=False))


def _e1(d: int) -> torch.Tensor:
    e = torch.zeros(d)
    e[0] = 1.0
    return e


def _signs(n: int, g: torch.Generator) -> torch.Tensor:
    return torch.randint(0, 2, (n, 1), generator=g) * 2.0 - 1


def _massive_stand_in(seed: int = 0) -> torch.Tensor:
    """SmolLM2 layer 15 in miniature: 0.85 % of rows with norm ≈ 150× the median (norm ≈ 170) on two coordinates."""
    g = torch.Generator().manual_seed(seed)
    n, d = 8192, 576
    x = torch.randn(n, d, generator=g) * (170 / math.sqrt(d)) + torch.randn(d, generator=g) * 3
    rows = torch.randperm(n, generator=g)[:70]
    direction = torch.zeros(d)
    direction[[5, 77]] = torch.tensor([0.8, 0.6])
    x[rows] += direction * 25_000 * (1 + 0.05 * torch.randn(70, 1, generator=g))
    return x


# ---------------------------------------------------------------------- the building blocks
def test_two_means_1d_against_brute_force_and_the_gaussian_value():
    g = torch.Generator().manual_seed(0)
    v = torch.randn(40, generator=g, dtype=torch.float64)
    s = v.sort().values
    total = float(((s - s.mean()) ** 2).sum())
    brute = min(float(((s[:i] - s[:i].mean()) ** 2).sum() + ((s[i:] - s[i:].mean()) ** 2).sum()) for i in range(1, 40))
    assert two_means_1d(v).between_share == pytest.approx(1 - brute / total, rel=1e-10)
    # a Gaussian's optimal split explains 2/π of its variance (cut at 0, means ±√(2/π))
    big = torch.randn(200_000, generator=g, dtype=torch.float64)
    assert two_means_1d(big).between_share == pytest.approx(2 / math.pi, abs=0.005)


def test_kmeans_share_of_one_gaussian_is_two_over_pi_of_its_top_direction():
    g = torch.Generator().manual_seed(1)
    scale = torch.tensor([4.0] + [1.0] * 9, dtype=torch.float64)
    x = torch.randn(4000, 10, generator=g, dtype=torch.float64) * scale
    share, smaller = kmeans_between_share(x)
    top1 = 16 / (16 + 9)
    assert share == pytest.approx(2 / math.pi * top1, rel=0.05)
    assert smaller == pytest.approx(0.5, abs=0.05)


# ---------------------------------------------------------------------- each flag on its case
def test_bimodal_e1_cloud_is_anisotropy_invisible_to_A():
    g = torch.Generator().manual_seed(0)
    d, n = 12, 4000
    x = _signs(n, g) * 10 * _e1(d) + 0.35 * torch.randn(n, d, generator=g)
    r = _report(x)
    geo = r.activations
    assert abs(geo["anisotropy"]) < 0.01 and geo["top1_share"] > 0.98
    assert F.INVISIBLE in r.flag_names()
    assert F.MIXED in r.flag_names()  # two populations ±e₁, too
    assert F.OFFSET_CONE not in r.flag_names()


def test_mean_centred_pencil_is_anisotropy_invisible_to_A():
    g = torch.Generator().manual_seed(0)
    d, n = 12, 4000
    v = torch.randn(d, generator=g)
    v /= v.norm()
    noise = 0.0809  # erank of the population spectrum (1 + σ², σ², …): 1.5 of 12
    pop = torch.tensor([1 + noise**2] + [noise**2] * (d - 1))
    assert effective_rank(pop) == pytest.approx(1.5, abs=0.05)
    x = torch.randn(n, 1, generator=g) * v + noise * torch.randn(n, d, generator=g)
    x -= x.mean(0)
    r = _report(x)
    assert r.activations["effective_rank"] == pytest.approx(1.5, abs=0.1)
    assert F.INVISIBLE in r.flag_names()
    assert F.MIXED not in r.flag_names()  # one elongated Gaussian is not two populations


def test_two_clusters_along_one_axis_are_mixed_populations():
    g = torch.Generator().manual_seed(0)
    d, n = 12, 4000
    x = _signs(n, g) * 9.4 * _e1(d) + torch.randn(n, d, generator=g) + 3.0  # offset: not centred
    r = _report(x)
    assert r.activations["top1_share"] == pytest.approx((9.4**2 + 1) / (9.4**2 + d), abs=0.02)  # 0.89
    [flag] = [f for f in r.flags if f.name == F.MIXED]
    assert flag.evidence["pc1_split_between_share"] > 0.95
    assert flag.evidence["pc1_split_smaller_fraction"] == pytest.approx(0.5, abs=0.05)


def test_large_offset_cone_is_offset_dominated_and_says_how_much_the_mean_explains():
    g = torch.Generator().manual_seed(0)
    d, n = 64, 4000
    mu = torch.randn(d, generator=g)
    mu *= 12 / mu.norm()
    x = mu + torch.randn(n, d, generator=g)
    r = _report(x)
    [flag] = [f for f in r.flags if f.name == F.OFFSET_CONE]
    # closed form: cos(μ + ε, μ + ε') ≈ ‖μ‖²/(‖μ‖² + d) = 144/208 for ‖μ‖ = 12, d = 64
    assert flag.evidence["anisotropy"] == pytest.approx(144 / 208, abs=0.01)
    assert abs(flag.evidence["centred_anisotropy"]) < 0.01
    assert flag.evidence["share_of_A_explained_by_mean"] > 0.98
    assert "the mean explains" in flag.summary
    steps = {s["step"]: s for s in r.diagnosis}
    assert list(steps) == ["offset", "shape", "artifact", "fix"]
    assert "offset-dominated" in steps["offset"]["finding"] and steps["offset"]["read"]["centred_A"] is not None


def test_massive_activations_raised_and_rank_deficiency_not():
    x = _massive_stand_in()
    r = _report(x)
    names = r.flag_names()
    assert F.MASSIVE in names
    assert F.RANK not in names  # n = 8,192 ≫ d = 576: the low numerical rank is the dynamic range
    assert F.MIXED not in names  # 70 rows are an artifact, not a population
    [flag] = [f for f in r.flags if f.name == F.MASSIVE]
    # golden: 70 of 8,192 rows; their share of Σ‖x‖² by direct computation
    norms = x.double().norm(dim=1)
    big = norms > 10 * norms.median()
    assert flag.evidence["massive_rows"] == int(big.sum()) == 70
    assert flag.evidence["massive_share_of_sum_sq"] == pytest.approx(
        float(norms[big].square().sum() / norms.square().sum()), abs=0.002
    )
    assert r.activations["numerical_rank"] < 576
    # the same rows without the massive ones: neither flag (the stand-in's real offset remains: a cone)
    clean = _report(x[~big])
    assert F.MASSIVE not in clean.flag_names() and F.RANK not in clean.flag_names()
    assert clean.activations["effective_rank"] > 100 * r.activations["effective_rank"] / 2


def test_low_rank_data_still_raises_rank_deficiency():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2000, 5, generator=g) @ torch.randn(5, 40, generator=g)
    assert F.RANK in _report(x).flag_names()


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("case", ["isotropic", "whitened", "sparse_codes"])
def test_diagnosis_flags_silent_on_healthy_data(case, seed):
    g = torch.Generator().manual_seed(seed)
    n = 4000
    if case == "isotropic":
        x = torch.randn(n, 64, generator=g)
    elif case == "whitened":
        raw = torch.randn(n, 64, generator=g) * torch.linspace(0.2, 3.0, 64) + 5.0
        acc = GeometryAccumulator(64)
        acc.add(raw)
        x = Whitening.fit(acc).apply(raw)
    else:
        x = torch.empty(n, 256).exponential_(generator=g) * (torch.rand(n, 256, generator=g) < 0.1)
    r = _report(x)
    assert not DIAGNOSIS_FLAGS & set(r.flag_names()), r.flag_names()
    assert F.RANK not in r.flag_names()


def test_diagnosis_is_in_the_json_and_rendered(tmp_path):
    x = _massive_stand_in()
    r = _report(x)
    back = GeometryReport.from_dict(r.to_dict())
    assert back.diagnosis == r.diagnosis and [s["step"] for s in back.diagnosis] == [
        "offset",
        "shape",
        "artifact",
        "fix",
    ]
    assert "massive activations" in back.diagnosis[2]["finding"]
    assert "DIAGNOSIS" in render_terminal(back)
    assert "## Diagnosis" in render_markdown(back)
    assert "<h2>Diagnosis</h2>" in render_html(back, pngs={})


# ---------------------------------------------------------------------- transforms report what is left
def test_transform_reports_top1_and_erank_after_and_warn_on_a_split():
    g = torch.Generator().manual_seed(0)
    d, n = 12, 4000
    x = _signs(n, g) * 9.4 * _e1(d) + torch.randn(n, d, generator=g)
    acc = GeometryAccumulator(d)
    acc.add(x)
    abt = AllButTheTop.fit(acc, 1, sample=x[:2000])
    after = abt.apply(x)
    lam = torch.linalg.eigvalsh(torch.cov(after.double().T)).flip(0).clamp(min=0)
    assert abt.report.top1_share_after == pytest.approx(float(lam[0] / lam.sum()), rel=0.05)
    assert abt.report.effective_rank_after == pytest.approx(effective_rank(lam), rel=0.05)
    assert any("population split" in note for note in abt.report.notes)
    w = Whitening.fit(acc, sample=x[:2000])
    assert w.report.top1_share_after == pytest.approx(1 / d, rel=1e-6)
    assert w.report.effective_rank_after == pytest.approx(d, rel=1e-6)
    assert any("population split" in note for note in w.report.notes)
    # one Gaussian: no warning
    y = torch.randn(n, d, generator=g) * torch.linspace(1, 3, d)
    acc_y = GeometryAccumulator(d)
    acc_y.add(y)
    assert not any("population split" in note for note in AllButTheTop.fit(acc_y, 1, sample=y).report.notes)


def test_minilm_layer3_resid_post_is_an_offset_dominated_cone(tmp_path):
    """Real activations (the bundled MiniLM, 3,000 tokens): the report names the offset and how much of A it explains."""
    from saegeo.activations.cache import CacheConfig, cache_activations

    hook = "blocks.3.hook_resid_post"
    res = cache_activations(
        CacheConfig(
            model="minilm", hooks=(hook,), max_tokens=3000, context=64, out=str(tmp_path / "acts"), progress=False
        )
    )
    r = _report(res.stores[hook])
    [flag] = [f for f in r.flags if f.name == F.OFFSET_CONE]
    geo = r.activations
    # golden, from the report's own row sample by brute force: A of the centred rows is small
    assert flag.evidence["share_of_A_explained_by_mean"] > 0.8
    assert flag.evidence["centred_anisotropy"] < 0.1 < geo["anisotropy"]
    assert geo["mean_share_of_second_moment"] > 0.1
    assert f"the mean explains {100 * flag.evidence['share_of_A_explained_by_mean']:.0f}% of it" in flag.summary
    assert F.RANK not in r.flag_names()
