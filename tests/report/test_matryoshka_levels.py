"""The report's per-level figures of a Matryoshka SAE (saegeo/report/nesting.py) against a float64 brute force
from the dense codes of every row, and their rows in the rendered SAE table."""

from __future__ import annotations

import pytest
import torch

from saegeo.render.report_page import render_terminal
from saegeo.report.geometry_report import geometry_report
from saegeo.report.options import ReportOptions
from saegeo.sae.model import SAE, SAEConfig

WIDTHS = [6, 20, 48]
FAST = {"progress": False, "latent_cards": False, "cosine_sample_rows": 256}


def _sae() -> SAE:
    """A Matryoshka SAE with spread decoder norms, a threshold that keeps a few codes a row, and a dead latent."""
    sae = SAE(SAEConfig(16, 48, activation="matryoshka", k=4, matryoshka_widths=WIDTHS))
    g = torch.Generator().manual_seed(2)
    sae.init_weights(g, b_dec=0.5 * torch.randn(16, generator=g))
    with torch.no_grad():
        sae.W_dec.mul_(0.5 + torch.rand(48, 1, generator=g))
        sae.W_enc.add_(0.3 * torch.randn(16, 48, generator=g))
        sae.b_enc.copy_(0.2 * torch.randn(48, generator=g) + 0.3)
        sae.b_enc[3] = -100.0  # never fires: a dead latent in level 1
        sae.threshold.fill_(0.8)
    return sae


def _brute_force(sae: SAE, x: torch.Tensor) -> list[dict]:
    codes = sae.encode(x).double()
    W_dec, b_dec, x = sae.W_dec.detach().double(), sae.b_dec.detach().double(), x.double()
    unit = W_dec / W_dec.norm(dim=1, keepdim=True)
    folded = codes * W_dec.norm(dim=1)  # the weights of the unit rows in x̂ − b_dec
    m = folded.mean(0)
    M = m @ unit
    shares = m * (unit @ M) / (M @ M)
    centred = (x - x.mean(0)).square().sum()
    out = []
    for w in WIDTHS:
        y = codes[:, :w] @ W_dec[:w]  # x̂_w − b_dec
        y = y[y.norm(dim=1) > 0]
        s = (y / y.norm(dim=1, keepdim=True)).sum(0)
        u = unit[:w]
        K = float((codes[:, :w] > 0).double().sum(1).mean())
        a_dict = float((u.sum(0).square().sum() - w) / (w * (w - 1)))
        k = K * a_dict / 2
        out.append(
            {
                "width": w,
                "fve": float(1 - (x - b_dec - codes[:, :w] @ W_dec[:w]).square().sum() / centred),
                "mean_l0": K,
                "dead_share": float((codes[:, :w] > 0).sum(0).eq(0).double().mean()),
                "a_dict": a_dict,
                "cone_share": float(shares[:w].sum()),
                "law_textbook": k / (1 + k),
                "measured_recon_minus_b_dec": float((s @ s - len(y)) / (len(y) * (len(y) - 1))),
            }
        )
    return out


def test_levels_equal_a_brute_force_recomputation():
    """Rows in batches of 2,500 (chunks of 1,024 and a ragged tail): the streamed prefixes must line up with their rows."""
    sae = _sae()
    x = torch.randn(3_000, 16, generator=torch.Generator().manual_seed(3)) * 1.5 + 0.7
    report = geometry_report(x, {"m": sae}, options=ReportOptions(**FAST, batch_rows=2_500))
    levels = report.saes[0].levels
    with torch.no_grad():
        expected = _brute_force(sae, x)
    assert 0 < expected[0]["dead_share"] < 1  # the dead latent counted in its level
    assert [lv.keys() for lv in levels] == [e.keys() for e in expected]
    for got, want in zip(levels, expected):
        for key, value in want.items():
            assert got[key] == pytest.approx(value, rel=1e-4, abs=1e-6), (got["width"], key)
    assert levels[-1]["fve"] == pytest.approx(report.saes[0].fve, rel=1e-6)  # the last level is the whole SAE
    text = render_terminal(report)
    assert "level 3: width / FVE / L0 / dead" in text and "K·A_dict law vs A(x̂_1 − b_dec)" in text


def test_no_level_rows_without_nesting():
    sae = SAE(SAEConfig(16, 48, activation="batchtopk", k=4))
    sae.init_weights(torch.Generator().manual_seed(0))
    report = geometry_report(torch.randn(500, 16), {"b": sae}, options=ReportOptions(**FAST))
    assert report.saes[0].levels is None and "level 1:" not in render_terminal(report)
