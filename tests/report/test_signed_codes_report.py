"""A report of an SAE whose codes take both signs (AbsTopK) states the null it reads A of x̂ − b_dec against
(cone_null "signed", amplification's null_value, null_sd, null_z; a line in the text and HTML tables), withholds the cone shares while
that cone is within the null and the one-rate forms that have no meaning for signed codes, and keeps the per-latent law.
Planted: a tilted dictionary (A_dict ≈ 0.25) driven by codes of a fair sign (no cone) or of a skewed sign (a cone)."""

from __future__ import annotations

import math

import pytest
import torch

from saegeo.geometry.amplification import heterogeneous_moment_prediction
from saegeo.render.report_page import render_html, render_terminal
from saegeo.report import GeometryReport, ReportOptions, geometry_report
from saegeo.sae.model import SAE, SAEConfig

QUIET = ReportOptions(progress=False, batch_rows=1000)


def _planted(p_positive: float, n: int = 3000, seed: int = 0, activation: str = "abstopk"):
    """x = Σ a_i u_i, 8 of 256 latents a row, |a| = 0.5 + Exp(1), sign + with probability p_positive, on unit rows
    u_i = 0.5·e₀ + √0.75·v_i (A_dict ≈ 0.25); the SAE encodes with W_enc = W_decᵀ and zero biases, so its codes are
    an odd function of x: a fair sign gives reconstructions whose law is unchanged by y → −y."""
    g = torch.Generator().manual_seed(seed)
    v = torch.randn(256, 64, generator=g)
    v[:, 0] = 0
    u = 0.5 * torch.eye(64)[0] + math.sqrt(0.75) * v / v.norm(dim=1, keepdim=True)
    idx = torch.rand(n, 256, generator=g).argsort(1)[:, :8]
    mag = torch.empty(n, 8).exponential_(generator=g) + 0.5
    sign = torch.where(torch.rand(n, 8, generator=g) < p_positive, 1.0, -1.0)
    x = torch.zeros(n, 256).scatter_(1, idx, mag * sign) @ u
    sae = SAE(SAEConfig(d_in=64, d_sae=256, activation=activation, k=8))
    with torch.no_grad():
        sae.W_dec.copy_(u)
        sae.W_enc.copy_(u.T)
        sae.b_enc.zero_()
        sae.b_dec.zero_()
    return x, sae


def test_codes_of_a_fair_sign_read_against_the_signed_null_and_have_no_cone(tmp_path):
    x, sae = _planted(0.5)
    report = geometry_report(x, {"signed": sae}, options=QUIET)
    report.to_json(tmp_path / "r.json")
    assert GeometryReport.load(tmp_path / "r.json").sae.cone_null == "signed"  # a field of report.json
    s = report.sae
    amp = s.amplification
    assert s.cone_null == "signed" and amp["null_value"] == 0.0
    assert 0.4 < amp["negative_code_share"] < 0.6
    assert abs(amp["null_z"]) < 3.5 and amp["null_p"] > 0.00135  # one draw from the null
    assert abs(amp["measured_recon_minus_b_dec"]) < 4 * amp["null_sd"]
    assert s.a_dict == pytest.approx(0.25, abs=0.03)  # the tilt a non-negative code would turn into a cone
    assert s.cone_shares is None and any("signed null" in note for note in s.notes)
    assert amp["textbook"] is None and amp["mean_cosine"] is None
    assert amp["exact_moment"] == pytest.approx(0.0, abs=0.02)  # oriented: the signs' r̃ ≈ 0 leaves no cone
    assert amp["A_het"] == pytest.approx(0.0, abs=0.02)
    text, html = render_terminal(report), render_html(report)
    for page in (text, html):
        assert "null it is read against" in page and "signed: 0 ±" in page and ", p " in page
        assert "not defined for codes of both signs" in page and "(oriented " in page


def test_a_skewed_sign_makes_a_cone_the_signed_null_finds_and_the_law_reads():
    x, sae = _planted(0.8)
    s = geometry_report(x, {"signed": sae}, options=QUIET).sae
    amp = s.amplification
    assert s.cone_null == "signed" and amp["null_z"] > 10 and amp["null_p"] < 1e-6
    assert s.cone_shares is not None and sum(s.cone_shares) == pytest.approx(1.0, abs=1e-9)
    with torch.no_grad():
        codes = sae.encode(x).double()
    a_het = heterogeneous_moment_prediction(codes.mean(0), codes.square().mean(0), sae.W_dec.detach())
    assert amp["A_het"] == pytest.approx(a_het, rel=1e-6)  # the per-latent law, E[a_i] and E[a_i²] with their signs
    # this encode makes latents co-fire (a quarter of E‖x̂‖²): the moment ratio ‖M‖²/E‖x̂‖² is A_het·(1 − share),
    # which the measured mean cosine follows (measured 0.463 against 0.448; A_het alone 0.602)
    assert amp["cofiring_share"] > 0.1
    assert amp["measured_recon_minus_b_dec"] == pytest.approx(a_het * (1 - amp["cofiring_share"]), rel=0.1)
    assert amp["a_dict_oriented"] == pytest.approx(s.a_dict, abs=0.02)  # every latent's mean code is > 0 here


def test_non_negative_codes_read_against_the_sign_aware_null():
    x, sae = _planted(1.0, activation="topk")
    s = geometry_report(x, {"topk": sae}, options=QUIET).sae
    amp = s.amplification
    assert s.cone_null == "sign-aware" and amp["negative_code_share"] == 0.0
    assert amp["null_value"] == pytest.approx(s.q * s.r, rel=1e-12)
    assert amp["textbook"] is not None and s.cone_shares is not None
    assert "sign-aware q·r" in render_terminal(geometry_report(x[:500], {"topk": sae}, options=QUIET))
