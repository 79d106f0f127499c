"""An architecture defined only here, through the public API: registered, trained by train_sae, saved by
SAE.save, loaded by SAE.load and reported by geometry_report, with no change anywhere in saegeo.

The toy is a squared ReLU, codes = relu(pre)², trained on FVU + l1·mean_rows Σ codes with plain autograd.
Its references are written out here from the formula, not through saegeo's encode."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from saegeo.errors import BadInputError
from saegeo.report.geometry_report import ReportOptions, geometry_report
from saegeo.sae.architectures import (
    Architecture,
    TrainOutput,
    architecture_names,
    get_architecture,
    register_architecture,
    unregister_architecture,
)
from saegeo.sae.model import SAE, SAEConfig
from saegeo.sae.train import TrainConfig, train_sae


class SquaredReLU(Architecture):
    """codes = relu(pre)²."""

    init_encoder_scale = 0.5

    def encode(self, sae, pre):
        return F.relu(pre).square()

    def forward_train(self, sae, x, *, centred_ss, centred_ss_fn, dead_mask, l1_coefficient: float = 0.0, **_):
        pre = ((x - sae.b_dec) if sae.cfg.apply_b_dec_to_input else x) @ sae.W_enc + sae.b_enc
        codes = self.encode(sae, pre)
        sse = (x - (codes @ sae.W_dec + sae.b_dec)).pow(2).sum()
        l1 = codes.sum() / x.shape[0]
        fire_count = (codes.detach() > 0).sum(dim=0).float()
        return TrainOutput(
            sse / centred_ss + l1_coefficient * l1,
            sse.detach(),
            centred_ss,
            fire_count.sum(),
            l1.detach(),
            fire_count > 0,
            fire_count,
        )

    def step_options(self, tcfg, step, d_in):
        return {"l1_coefficient": 1e-3 * tcfg.l1_coefficient}


@pytest.fixture
def toy():
    """Registered for one test only, so other tests see the built-in registry."""
    register_architecture("sqrelu", SquaredReLU)
    yield get_architecture("sqrelu")
    unregister_architecture("sqrelu")


def _data(n=4000, d=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    basis = torch.randn(48, d, generator=g)
    codes = (torch.rand(n, 48, generator=g) < 0.06).float() * torch.rand(n, 48, generator=g)
    return codes @ basis + 0.05 * torch.randn(n, d, generator=g) + 2.0


def _by_formula(sae: SAE, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    W_enc, b_enc, W_dec, b_dec = (t.detach() for t in (sae.W_enc, sae.b_enc, sae.W_dec, sae.b_dec))
    codes = ((x - b_dec) @ W_enc + b_enc).clamp_min(0) ** 2
    return codes, codes @ W_dec + b_dec


def test_a_toy_architecture_trains_saves_loads_and_is_reported(toy, tmp_path):
    assert "sqrelu" in architecture_names()
    x = _data()
    cfg = TrainConfig(
        arch="sqrelu",
        d_sae=48,
        batch_tokens=250,
        total_tokens=250 * 80,
        lr=3e-3,
        seed=1,
        heldout_fraction=0.1,
        progress=False,
        out_dir=str(tmp_path / "toy"),
    )
    res = train_sae(cfg, x)
    sae = res.sae
    assert sae.cfg.activation == "sqrelu" and sae.architecture is toy
    first, last = res.history[0]["fve"], res.heldout["fve"]
    assert last > 0.5 and last > first + 0.2, (first, last)  # it learned, through the trainer's own loop

    saved = json.loads((tmp_path / "toy" / "cfg.json").read_text())
    assert saved["architecture"] == "sqrelu" and saved["saegeo"]["sae_config"]["activation"] == "sqrelu"
    loaded = SAE.load(tmp_path / "toy")
    codes, x_hat = _by_formula(sae, x)
    with torch.no_grad():
        assert torch.equal(loaded.encode(x), sae.encode(x))
        torch.testing.assert_close(loaded.encode(x), codes)
        torch.testing.assert_close(loaded(x), x_hat)

    rep = geometry_report(x, {"toy": loaded}, options=ReportOptions(progress=False))
    (s,) = rep.saes
    fve = 1 - (x - x_hat).pow(2).sum() / (x - x.mean(0)).pow(2).sum()
    assert s.architecture == "sqrelu" and s.d_sae == 48
    assert s.fve == pytest.approx(float(fve), rel=1e-4)
    assert s.mean_l0 == pytest.approx(float((codes > 0).sum(1).float().mean()), rel=1e-5)


def test_an_unregistered_architecture_is_refused_in_one_line():
    with pytest.raises(BadInputError, match=r"arch = 'sqrelu': expected one of \['batchtopk', 'jumprelu', 'relu', "):
        TrainConfig(arch="sqrelu")
    from saegeo.errors import FormatError

    with pytest.raises(FormatError, match="unknown SAE architecture 'sqrelu'; registered: batchtopk, jumprelu"):
        SAEConfig(8, 16, activation="sqrelu")
