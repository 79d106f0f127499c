"""norm_detectors (issue 41 item 2): latents planted to fire by the row norm ‖x‖ are flagged from the report's
per-latent `norm_corr` column; the latents named are exactly those whose r(a, ‖x‖) ≥ 0.7 by numpy's corrcoef of the
dense codes, and the band is a warning at ≥ 1 % of the latents (2 of 200), info below (1 of 200)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

D, D_SAE, N_ROWS = 8, 200, 2000


def _planted(n_detectors: int):
    """Rows r·e_0 + content (N(0, 1) on the other 7 coordinates), r ~ U(2, 10); a ReLU SAE whose first
    ``n_detectors`` latents read e_0 (norm detectors) and the rest read random content directions."""
    from saegeo.sae.model import SAE, SAEConfig

    g = torch.Generator().manual_seed(0)
    x = torch.randn(N_ROWS, D, generator=g)
    x[:, 0] = 2 + 8 * torch.rand(N_ROWS, generator=g)
    content = torch.nn.functional.normalize(torch.randn(D_SAE, D, generator=g) * (torch.arange(D) > 0), dim=1)
    content[:n_detectors] = torch.eye(D)[0]
    sae = SAE(SAEConfig(d_in=D, d_sae=D_SAE, activation="relu"))
    with torch.no_grad():
        sae.W_enc.copy_(content.T)
        sae.W_dec.copy_(content)
        sae.b_enc.fill_(-1.0)
        sae.b_dec.zero_()
    return sae, x


def _brute_r(sae, x) -> np.ndarray:
    with torch.no_grad():
        codes = sae.encode(x).double().numpy()
    norms = x.double().norm(dim=1).numpy()
    return np.array([np.corrcoef(codes[:, i], norms)[0, 1] if codes[:, i].std() > 0 else np.nan for i in range(D_SAE)])


_REPORTS: dict[int, tuple] = {}


def _report(n_detectors: int):
    """(sae, x, the report) of the planted case, made once per module (every report reads 2,000 rows)."""
    from saegeo.report import ReportOptions, geometry_report

    if n_detectors not in _REPORTS:
        sae, x = _planted(n_detectors)
        opts = ReportOptions(progress=False, latent_contexts=2)
        _REPORTS[n_detectors] = sae, x, geometry_report(x, {"p": sae}, options=opts)
    return _REPORTS[n_detectors]


def _named(flags):
    return [f for f in flags if f.name == "norm_detectors"]


@pytest.mark.parametrize("n_detectors, severity", [(2, "warning"), (1, "info"), (0, None)])
def test_the_planted_norm_detectors_are_named_in_their_band(n_detectors, severity):
    sae, x, report = _report(n_detectors)
    found = _named(report.flags)
    r = _brute_r(sae, x)
    detectors = [int(i) for i in np.argsort(-np.nan_to_num(r, nan=-2), kind="stable") if r[i] >= 0.7]
    assert detectors == list(range(n_detectors))  # the planted ones, and only they, by numpy
    if severity is None:
        assert not found and np.nanmax(r) < 0.7
        return
    [f] = found
    assert f.severity == severity and f.subject == "p"
    assert f.latents == detectors
    assert f.evidence["n_norm_detectors"] == n_detectors and f.evidence["d_sae"] == D_SAE
    assert f.evidence["fraction"] == n_detectors / D_SAE
    assert f.evidence["max_norm_corr"] == pytest.approx(np.nanmax(r), abs=1e-4)
    # a saved report re-flagged from its numbers raises the same flag
    from saegeo.report import GeometryReport, compute_flags

    again = compute_flags(GeometryReport.from_dict(json.loads(report.to_json())))
    assert [g.to_dict() for g in _named(again)] == [f.to_dict()]


def test_the_thresholds_move_the_verdict():
    from saegeo.report import FlagThresholds, compute_flags

    sae, x, report = _report(1)
    above = min(float(np.nanmax(_brute_r(sae, x))) + 0.01, 1.0)
    assert not _named(compute_flags(report, FlagThresholds(norm_detector_min_corr=above)))
    [f] = _named(compute_flags(report, FlagThresholds(norm_detector_warn_fraction=0.005)))
    assert f.severity == "warning"
