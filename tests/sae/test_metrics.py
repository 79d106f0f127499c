"""SAEMetrics (saegeo.sae.metrics) and dictionary_geometry (saegeo.geometry.dictionary) against brute-force
numpy on the same rows: FVE under a huge mean, merging, input normalisation, zero dictionary rows."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from saegeo.errors import BadInputError
from saegeo.geometry.accumulate import GeometryAccumulator, UnitMean
from saegeo.geometry.dictionary import dictionary_geometry
from saegeo.sae.metrics import SAEMetrics
from saegeo.sae.model import SAE, SAEConfig
from saegeo.sae.train import evaluate

BATCH = 500


def _pairwise_mean_cos(y: np.ndarray) -> float:
    y = y[np.linalg.norm(y, axis=1) > 0]
    u = y / np.linalg.norm(y, axis=1, keepdims=True)
    n = len(u)
    return float(((u @ u.T).sum() - n) / (n * (n - 1)))


def _sae(d: int, d_sae: int, activation: str, b_dec: torch.Tensor, seed: int = 0, **cfg) -> SAE:
    sae = SAE(SAEConfig(d_in=d, d_sae=d_sae, activation=activation, k=4 if activation == "topk" else None, **cfg))
    sae.init_weights(torch.Generator().manual_seed(seed), b_dec=b_dec)
    return sae


def _rows(n: int, d: int, mean_scale: float, seed: int = 0) -> torch.Tensor:
    """Float32 rows: a mean of size mean_scale along a fixed direction, unit-scale anisotropic spread."""
    g = torch.Generator().manual_seed(seed)
    direction = torch.randn(d, generator=g)
    spread = torch.randn(n, d, generator=g) * torch.linspace(0.5, 1.5, d)
    return (mean_scale * direction / direction.norm() + spread).float()


def _brute(sae: SAE, x: torch.Tensor, mu: np.ndarray | None = None) -> dict:
    """The metrics from the rows, their reconstructions and codes, in float64 numpy (two-pass centred SS)."""
    with torch.no_grad():
        recon = torch.cat([sae(x[lo : lo + BATCH]) for lo in range(0, len(x), BATCH)]).double().numpy()
        codes = torch.cat([sae.encode(x[lo : lo + BATCH]) for lo in range(0, len(x), BATCH)]).double().numpy()
    x64 = x.double().numpy()
    sse = ((x64 - recon) ** 2).sum()
    centred = ((x64 - x64.mean(0)) ** 2).sum()
    w = sae.W_dec.detach().double().numpy()
    b = sae.b_dec.detach().double().numpy()
    mu = x64.mean(0) if mu is None else mu
    cos = (w @ mu) / (np.linalg.norm(w, axis=1) * np.linalg.norm(mu))
    fired = codes > 0
    return {
        "tokens": len(x),
        "mse": sse / x64.size,
        "fve": 1 - sse / centred,
        "l0": fired.sum(1).mean(),
        "dead_fraction": (fired.sum(0) == 0).mean(),
        "dense_fraction": (fired.mean(0) > 0.5).mean(),
        "max_abs_cos_mean": np.abs(cos).max(),
        "n_latents_cos_mean_gt_0.5": int((np.abs(cos) > 0.5).sum()),
        "b_dec_norm": np.linalg.norm(b),
        "mean_norm": np.linalg.norm(mu),
        "b_dec_dist_to_mean": np.linalg.norm(b - mu) / np.linalg.norm(mu),
        "firing_frequency": fired.mean(0),
        "recon": recon,
        "b_dec": b,
    }


def _metrics(sae: SAE, x: torch.Tensor, **kw) -> SAEMetrics:
    m = SAEMetrics(sae, **kw)
    for lo in range(0, len(x), BATCH):
        m.add(x[lo : lo + BATCH])
    return m


@pytest.mark.parametrize("activation", ["relu", "topk"])
def test_fve_stays_exact_under_a_huge_mean(activation):
    """‖μ‖ = 1e6 × the spread: Σ‖x‖² − ‖Σx‖²/n cancels 12 of float64's 16 digits (FVE off by ~1e-6);
    Chan's per-batch centring keeps it to rounding (~1e-14)."""
    x = _rows(4000, 32, mean_scale=1e6)
    sae = _sae(32, 64, activation, b_dec=x.double().mean(0).float())
    got = evaluate(sae, (x[lo : lo + BATCH] for lo in range(0, len(x), BATCH)))
    want = _brute(sae, x)
    assert 0.05 < want["fve"] < 0.95  # a real fit: the spread is what is explained
    assert got["fve"] == pytest.approx(want["fve"], abs=1e-11)
    assert got["mse"] == pytest.approx(want["mse"], rel=1e-12)
    assert got["tokens"] == want["tokens"] and got["l0"] == pytest.approx(want["l0"], rel=1e-12)


def test_summary_equals_brute_force_and_evaluate_keeps_its_keys():
    x = _rows(3000, 24, mean_scale=3.0, seed=1)
    train_mean = x[:1000].double().mean(0)  # μ given (the training mean) differs from the rows' own mean
    sae = _sae(24, 96, "relu", b_dec=x.mean(0) + 0.3, seed=2)
    got = evaluate(sae, [x[lo : lo + BATCH] for lo in range(0, len(x), BATCH)], activation_mean=train_mean)
    want = _brute(sae, x, mu=train_mean.numpy())
    assert list(got) == [
        "tokens",
        "mse",
        "fve",
        "l0",
        "dead_fraction",
        "dense_fraction",
        "max_abs_cos_mean",
        "n_latents_cos_mean_gt_0.5",
        "b_dec_norm",
        "mean_norm",
        "b_dec_dist_to_mean",
    ]
    assert 0 < got["dense_fraction"] < 1 and got["n_latents_cos_mean_gt_0.5"] > 0  # both counts are exercised
    for key, value in got.items():
        assert value == pytest.approx(want[key], rel=1e-9, abs=1e-12), key
    # per-latent firing and the two measured anisotropies, all pairs
    m = _metrics(sae, x)
    assert m.codes.firing_frequency.numpy() == pytest.approx(want["firing_frequency"], abs=1e-15)
    assert m.recon_unit.anisotropy() == pytest.approx(_pairwise_mean_cos(want["recon"] - want["b_dec"]), abs=1e-6)
    assert m.input_unit.anisotropy() == pytest.approx(_pairwise_mean_cos(x.double().numpy() - want["b_dec"]), abs=1e-6)


def test_normalised_inputs_are_scored_on_the_denormalised_reconstruction():
    x = _rows(2000, 16, mean_scale=4.0, seed=3)
    sae = _sae(16, 48, "topk", b_dec=torch.zeros(16), seed=4, input_normalization="layer_norm")
    m = _metrics(sae, x)
    want = _brute(sae, x)  # sae(x) denormalises
    assert m.fve == pytest.approx(want["fve"], abs=1e-9)
    with torch.no_grad():
        xn = sae.normalize_input(x)[0].double().numpy()
    assert m.input_unit.anisotropy() == pytest.approx(_pairwise_mean_cos(xn - want["b_dec"]), abs=1e-6)


def test_merging_two_halves_equals_the_whole():
    x = _rows(3000, 20, mean_scale=50.0, seed=5)
    sae = _sae(20, 40, "relu", b_dec=x.mean(0), seed=6)
    whole = _metrics(sae, x, mean_sq_norm=0.1)
    # the halves differ in size and mean (a shifted second half), and travel through state_dict
    first = _metrics(sae, x[:1000], mean_sq_norm=0.1)
    second = SAEMetrics.from_state_dict(_metrics(sae, x[1000:] + 5.0, mean_sq_norm=0.1).state_dict(), sae=sae)
    shifted = _metrics(sae, torch.cat([x[:1000], x[1000:] + 5.0]), mean_sq_norm=0.1)
    merged = first.merge(second)
    xs = torch.cat([x[:1000], x[1000:] + 5.0]).double().numpy()
    assert merged.n == shifted.n == 3000
    assert merged.centred_ss == pytest.approx(((xs - xs.mean(0)) ** 2).sum(), rel=1e-12)
    assert merged.centred_ss == pytest.approx(shifted.centred_ss, rel=1e-12)
    assert merged.sse == pytest.approx(shifted.sse, rel=1e-12)
    assert torch.allclose(merged.mean, shifted.mean, rtol=1e-13, atol=0)
    assert merged.summary() == pytest.approx(shifted.summary(), rel=1e-12)
    assert merged.codes.ratio_sum == pytest.approx(shifted.codes.ratio_sum, rel=1e-12)
    assert merged.recon_unit.anisotropy() == pytest.approx(shifted.recon_unit.anisotropy(), rel=1e-12)
    assert merged.input_unit.anisotropy() == pytest.approx(shifted.input_unit.anisotropy(), rel=1e-12)
    assert whole.fve != pytest.approx(merged.fve, abs=1e-3)  # the shift mattered: the check above is not vacuous
    with pytest.raises(BadInputError):
        merged.merge(_metrics(_sae(20, 41, "relu", b_dec=x.mean(0)), x[:10]))


def test_unit_mean_is_the_accumulators_unit_sum_and_the_pairwise_mean():
    x = _rows(600, 12, mean_scale=2.0, seed=7)
    x[5] = 0.0  # a zero row has no direction: left out of both
    unit = UnitMean(12).add(x[:250]).merge(UnitMean(12).add(x[250:]))
    acc = GeometryAccumulator(12, gram_dtype=torch.float64).add(x.double())
    assert unit.n == acc.n_unit == 599
    assert torch.allclose(unit.unit_mean, acc.unit_mean, rtol=1e-6, atol=1e-9)
    assert unit.anisotropy() == pytest.approx(_pairwise_mean_cos(x.double().numpy()), abs=1e-7)
    assert UnitMean(12).add(x[:1]).anisotropy() is None


@pytest.mark.parametrize("gram_dtype, tol", [(torch.float64, 1e-10), (torch.float32, 1e-6)])
def test_dictionary_geometry_equals_brute_force(gram_dtype, tol):
    g = torch.Generator().manual_seed(8)
    n, d = 301, 24  # odd: the median is one row's norm
    w = torch.randn(n, d, generator=g) + 0.4 * torch.randn(d, generator=g)  # tilted rows
    w *= torch.rand(n, 1, generator=g) + 0.5
    w[[3, 100]] = 0.0
    w[200] *= 1e-8  # below zero_rel_norm × median: a "zero" row too
    geom = dictionary_geometry(w, block_rows=37, gram_dtype=gram_dtype)

    w64 = w.double().numpy()
    norms = np.linalg.norm(w64, axis=1)
    assert geom.zero.nonzero().flatten().tolist() == [3, 100, 200] and geom.n_zero == 3
    keep = np.ones(n, dtype=bool)
    keep[[3, 100, 200]] = False
    unit = w64[keep] / norms[keep, None]
    assert geom.a_dict == pytest.approx(_pairwise_mean_cos(unit), abs=tol)
    assert geom.mean_sq_norm == pytest.approx(np.linalg.norm(unit.mean(0)) ** 2, rel=tol)
    assert geom.mean_direction.numpy() == pytest.approx(unit.mean(0), abs=tol)
    eig = np.sort(np.linalg.eigvalsh(np.cov(unit.T, bias=True)))[::-1]
    assert geom.spectrum["eigenvalues"] == pytest.approx(eig.tolist(), abs=tol)
    std = norms.std(ddof=1)
    assert geom.norm_stats == pytest.approx(
        {
            "min": 0.0,
            "median": float(np.median(norms)),
            "mean": norms.mean(),
            "max": norms.max(),
            "std": std,
            "cv": std / norms.mean(),
        },
        rel=1e-12,
    )
    assert geom.direction_norms[200] == 0 and geom.direction_norms[201] == pytest.approx(norms[201])
    with pytest.raises(BadInputError):
        dictionary_geometry(torch.zeros(4, 3))
