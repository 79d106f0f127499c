"""Dark matter and dense-latent structure in the report's one pass (issue 41 items 1 and 3): the planted SAE of
tests/geometry/test_dense.py measured by ``geometry_report`` against the fold-by-fold numpy ridge and brute force."""

from __future__ import annotations

import numpy as np
import pytest
import torch


def _planted():
    """A ReLU SAE with latents ±e_i (i < 3: dense antipodal pairs) reading the first 3 coordinates at 0.8 of their
    size, and rarely firing latents on the others: its error is 0.2·x on the first 3 coordinates (linear)."""
    from saegeo.sae.model import SAE, SAEConfig

    d = 6
    sae = SAE(SAEConfig(d_in=d, d_sae=2 * d, activation="relu"))
    with torch.no_grad():
        eye = torch.eye(d)
        sae.W_enc.copy_(torch.cat([eye, -eye], 1))
        sae.W_dec.copy_(0.8 * torch.cat([eye, -eye], 0))
        sae.b_enc.copy_(torch.tensor([0.0] * 3 + [-3.0] * 3 + [0.0] * 3 + [-3.0] * 3))
        sae.b_dec.zero_()
    rng = np.random.default_rng(0)
    x = torch.from_numpy(rng.normal(size=(6000, d))).float()
    x[:, 3:] = torch.from_numpy(rng.normal(size=(6000, 3)) ** 3).float()
    x[:, 0] += 0.5  # a mean with a share inside the pairs' subspace
    return sae, x


@pytest.mark.parametrize("batch_rows", [700, 6000])
def test_report_dark_matter_and_dense_pairs_equal_brute_force(batch_rows):
    from saegeo.report import ReportOptions, geometry_report
    from tests.geometry.test_dark_matter import _brute  # the fold-by-fold numpy ridge

    sae, x = _planted()
    opts = ReportOptions(progress=False, batch_rows=batch_rows, dark_matter=True)
    report = geometry_report(x, {"p": sae}, options=opts)
    s = report.saes[0]
    err = x.double().numpy() - sae(x).detach().double().numpy()
    want = _brute(x.double().numpy(), err, 5, 600, 1e-6)  # 6,000 rows: fold blocks of 6000 // (2·5) rows
    dm = s.dark_matter
    assert dm["n_rows"] == 6000
    # float32 rows: products formed in float32 per fold block (DarkMatterAccumulator.add), the ridge in float64
    assert dm["r2_vector"] == pytest.approx(want["r2_vector"], abs=1e-5)
    assert dm["r2_norm"] == pytest.approx(want["r2_norm"], abs=1e-5)
    assert dm["nonlinear_share"] == pytest.approx(1 - want["r2_vector"], abs=1e-5)
    assert dm["r2_vector_sd"] > 0
    dense = s.dense_structure
    assert set(dense["latents"]) == {0, 1, 2, 6, 7, 8}
    assert sorted((min(p["i"], p["j"]), max(p["i"], p["j"])) for p in dense["pairs"]) == [(0, 6), (1, 7), (2, 8)]
    assert all(p["decoder_cos"] == pytest.approx(-1.0) and p["cofire_share"] == 0.0 for p in dense["pairs"])
    sub = dense["subspace"]
    mu = x.double().numpy().mean(0)
    assert sub["dim"] == 3 and sub["mean"] == pytest.approx((mu[:3] ** 2).sum() / (mu**2).sum(), abs=1e-9)
    top = np.linalg.eigh(np.cov(x.double().numpy().T))[1][:, -1]  # the top PC: a heavy-tailed coordinate 3..5
    assert sub["pc1"] == pytest.approx((top[:3] ** 2).sum(), abs=1e-6)


def test_without_dark_matter_the_fields_are_none_and_every_other_number_is_the_same():
    from saegeo.report import ReportOptions, geometry_report

    sae, x = _planted()
    on = geometry_report(x, {"p": sae}, options=ReportOptions(progress=False, dark_matter=True)).saes[0].to_dict()
    off = geometry_report(x, {"p": sae}, options=ReportOptions(progress=False)).saes[0].to_dict()  # the default
    assert off["dark_matter"] is None and off["dense_structure"] is None
    new = ("dark_matter", "dense_structure", "latents")  # latents: the cards, which the dense_latent_pairs flag adds to
    assert {k: v for k, v in on.items() if k not in new} == {k: v for k, v in off.items() if k not in new}
    on_cards = {c["id"]: c for c in on["latents"]}
    for card in off["latents"]:  # each card made without dark matter is made alike with it (the flags naming it aside)
        assert {k: v for k, v in card.items() if k != "why"} == {
            k: v for k, v in on_cards[card["id"]].items() if k != "why"
        }


def test_position_direction_equals_least_squares_and_lies_in_the_planted_pairs_span():
    """Rows of a (windows, positions, d) array drift along 0.05·e₁ + 0.02·e₃ per position: the report's position
    direction is numpy's least-squares slope of x on [1, p], its explained share ‖β‖² Var(p) / tr Σ, and its
    squared cosine with the pairs' span (e₀, e₁, e₂) about 0.05² / (0.05² + 0.02²) = 0.86 (e₃ lies outside; the
    heavy-tailed e₃ … e₅ add slope noise of ~0.003)."""
    from saegeo.report import ReportOptions, geometry_report

    sae, x = _planted()
    windows, window = 60, 100
    pos = torch.arange(windows * window) % window
    x = x.clone()
    x[:, 1] += 0.05 * (pos - 49.5)  # both signs of e₁ stay dense: the pair (1, 7) is kept
    x[:, 3] += 0.02 * (pos - 49.5)  # latents ±e₃ stay below the dense rate
    opts = ReportOptions(progress=False, dark_matter=True)
    report = geometry_report(x.reshape(windows, window, -1), {"p": sae}, options=opts)
    dense = report.saes[0].dense_structure
    xd, p = x.double().numpy(), pos.double().numpy()
    coef = np.linalg.lstsq(np.stack([np.ones_like(p), p], 1), xd, rcond=None)[0]
    beta = coef[1]
    want_share = (beta**2).sum() * p.var() / xd.var(0).sum()
    got = dense["position_direction"]
    # float32 rows: the slope's sums are float32 per batch (CovariateDirection.add), numpy's lstsq float64
    assert got["n"] == 6000 and got["slope_norm"] == pytest.approx(np.linalg.norm(beta), rel=1e-5)
    assert got["explained_share"] == pytest.approx(want_share, rel=1e-5)
    assert dense["subspace"]["position"] == pytest.approx((beta[:3] ** 2).sum() / (beta**2).sum(), rel=1e-5)
    assert dense["subspace"]["position"] == pytest.approx(0.05**2 / (0.05**2 + 0.02**2), abs=0.05)  # as planted
    assert sorted(min(q["i"], q["j"]) for q in dense["pairs"]) == [0, 1, 2]
    flat = geometry_report(x, {"p": sae}, options=opts).saes[0].dense_structure
    assert flat["position_direction"] is None and "position" not in flat["subspace"]  # rows without positions
