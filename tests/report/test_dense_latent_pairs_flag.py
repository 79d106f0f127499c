"""dense_latent_pairs (issue 41 item 1): a planted SAE whose dense latents are antipodal pairs ±e_0, ±e_1, ±e_2
(decoder cos −1, never firing together) is flagged by `report --dark-matter` as a warning when the pairs' span holds
the activation mean μ, as info when it holds the top principal component and not μ, and not at all when it holds
neither; the alignments in the evidence are numpy's (‖Pr‖²/‖r‖², P the projection on e_0..e_2)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

D = 6


def _planted(mean: dict[int, float], scale: dict[int, float]):
    """Rows N(0, 1) per coordinate, coordinate c scaled by scale[c] and shifted by mean[c]; a ReLU SAE with latents
    ±e_i (i < 3 fire when x_i > 0: dense, antipodal; i ≥ 3 never fire)."""
    from saegeo.sae.model import SAE, SAEConfig

    sae = SAE(SAEConfig(d_in=D, d_sae=2 * D, activation="relu"))
    with torch.no_grad():
        eye = torch.eye(D)
        sae.W_enc.copy_(torch.cat([eye, -eye], 1))
        sae.W_dec.copy_(torch.cat([eye, -eye], 0))
        sae.b_enc.copy_(torch.tensor(([0.0] * 3 + [-100.0] * 3) * 2))
        sae.b_dec.zero_()
    x = np.random.default_rng(0).normal(size=(6000, D))
    for c, v in scale.items():
        x[:, c] *= v
    for c, v in mean.items():
        x[:, c] += v
    return sae, torch.from_numpy(x).float()


def _brute(x: np.ndarray) -> dict[str, float]:
    """Share of μ and of the top 3 principal components inside span(e_0, e_1, e_2)."""
    mu = x.mean(0)
    vectors = np.linalg.eigh(np.cov(x.T))[1]
    out = {"mean": float((mu[:3] ** 2).sum() / (mu**2).sum())}
    for k in range(3):
        out[f"pc{k + 1}"] = float((vectors[:3, -1 - k] ** 2).sum())
    return out


def _flags(sae, x):
    from saegeo.report import ReportOptions, geometry_report

    report = geometry_report(x, {"p": sae}, options=ReportOptions(progress=False, dark_matter=True, latent_cards=False))
    return [f for f in report.flags if f.name == "dense_latent_pairs"], report


@pytest.mark.parametrize(
    "case, mean, scale, severity",
    [
        ("offset", {0: 1.0}, {}, "warning"),  # μ along e_0
        ("pc", {3: 2.0}, {0: 3.0}, "info"),  # PC1 = e_0, μ along e_3
        ("neither", {3: 2.0}, {3: 2.5, 4: 3.0, 5: 2.0}, None),  # top 3 PCs e_4, e_3, e_5
    ],
)
def test_each_band_holds_its_planted_case_with_numpys_alignments(case, mean, scale, severity):
    sae, x = _planted(mean, scale)
    found, report = _flags(sae, x)
    want = _brute(x.double().numpy())
    sub = report.saes[0].dense_structure["subspace"]
    assert sub["dim"] == 3 and sub["mean"] == pytest.approx(want["mean"], abs=1e-9)
    if severity is None:
        assert not found and max(want.values()) < 0.5
        return
    [f] = found
    assert f.severity == severity, case
    assert f.evidence["n_pairs"] == 3 and f.evidence["subspace_dim"] == 3
    assert f.evidence["mean_alignment"] == pytest.approx(want["mean"], abs=1e-4)
    best = max((1, 2, 3), key=lambda k: want[f"pc{k}"])
    assert f.evidence["best_pc"] == best
    assert f.evidence["best_pc_alignment"] == pytest.approx(want[f"pc{best}"], abs=1e-4)
    assert f.evidence["min_abs_decoder_cos"] == pytest.approx(1.0) and f.evidence["max_cofire_share"] == 0.0
    assert sorted(f.latents) == [0, 1, 2, 6, 7, 8]
    assert ("mean" in f.summary) == (severity == "warning")


def test_without_dark_matter_there_is_no_pair_structure_and_no_flag():
    from saegeo.report import ReportOptions, geometry_report

    sae, x = _planted({0: 1.0}, {})
    report = geometry_report(x, {"p": sae}, options=ReportOptions(progress=False, latent_cards=False))
    assert report.saes[0].dense_structure is None
    assert "dense_latent_pairs" not in [f.name for f in report.flags]
