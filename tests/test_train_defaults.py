"""Per-architecture training defaults: an option left unset (None) takes the architecture's value
(Architecture.train_defaults), the trainer trains and records that value, and `saegeo run` overrides that change
the architecture get the new architecture's defaults, not those of [train]'s."""

from __future__ import annotations

import json

import pytest
import torch

from saegeo.pipeline import load_run_config
from saegeo.sae.architectures import get_architecture
from saegeo.sae.train import TrainConfig, train_sae


def _rows(n: int = 1024, d: int = 16) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    return torch.randn(n, d, generator=g) + 3.0


def _cfg(**kw) -> TrainConfig:
    base = dict(d_sae=32, k=4, batch_tokens=128, total_tokens=128 * 6, progress=False, log_every=3, num_threads=1)
    return TrainConfig(**{**base, **kw})


@pytest.mark.parametrize("arch", ["relu", "topk", "batchtopk", "jumprelu"])
def test_unset_options_take_the_architectures_defaults(arch):
    defaults = get_architecture(arch).train_defaults
    cfg = _cfg(arch=arch)
    assert (cfg.lr, cfg.l1_coefficient, cfg.grad_clip_norm) == (None, None, None)  # unset until resolved
    done = cfg.resolved()
    assert (done.lr, done.l1_coefficient, done.grad_clip_norm) == (
        defaults["lr"],
        defaults["l1_coefficient"],
        defaults["grad_clip_norm"],
    )
    given = _cfg(arch=arch, lr=0.123, l1_coefficient=4.5, grad_clip_norm=0.0).resolved()  # never replaced
    assert (given.lr, given.l1_coefficient, given.grad_clip_norm) == (0.123, 4.5, 0.0)


def test_relu_clips_its_gradient_by_default_and_zero_turns_it_off():
    """ReLU's default clips the global gradient norm at 1 (SAELens' trainer does too); 0 never clips. On these rows
    (offset 3 in 16 dims: ‖∇‖ ≫ 1 on the SAELens objective scale) the clip changes every step's update, while a
    clip far above any gradient norm multiplies by exactly 1 and so trains the unclipped weights bit for bit."""
    x = _rows()
    assert get_architecture("relu").train_defaults["grad_clip_norm"] == 1.0
    assert get_architecture("topk").train_defaults["grad_clip_norm"] == 0.0  # FVU loss: ‖∇‖ < 1 here anyway
    clipped = train_sae(_cfg(arch="relu"), x)
    never = train_sae(_cfg(arch="relu", grad_clip_norm=0.0), x)
    far_above = train_sae(_cfg(arch="relu", grad_clip_norm=1e30), x)
    assert clipped.config.grad_clip_norm == 1.0 and never.config.grad_clip_norm == 0.0
    assert torch.equal(never.sae.W_enc, far_above.sae.W_enc) and torch.equal(never.sae.W_dec, far_above.sae.W_dec)
    assert not torch.allclose(clipped.sae.W_enc, never.sae.W_enc, atol=1e-4)


def test_the_trainer_trains_and_records_the_resolved_defaults(tmp_path):
    x = _rows()
    defaults = get_architecture("relu").train_defaults
    unset = train_sae(_cfg(arch="relu", out_dir=str(tmp_path / "a")), x, resume=False)
    given = train_sae(_cfg(arch="relu", out_dir=str(tmp_path / "b"), **defaults), x, resume=False)
    other = train_sae(_cfg(arch="relu", lr=defaults["lr"] / 3, l1_coefficient=defaults["l1_coefficient"]), x)
    assert (unset.config.lr, unset.config.l1_coefficient) == (defaults["lr"], defaults["l1_coefficient"])
    assert torch.equal(unset.sae.W_enc, given.sae.W_enc) and torch.equal(unset.sae.W_dec, given.sae.W_dec)
    assert not torch.equal(unset.sae.W_enc, other.sae.W_enc)  # the lr reached the optimiser
    saved = json.loads((tmp_path / "a" / "cfg.json").read_text())["saegeo"]["train_config"]
    assert (saved["lr"], saved["l1_coefficient"]) == (defaults["lr"], defaults["l1_coefficient"])


def test_a_run_override_of_the_architecture_gets_that_architectures_defaults(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text(
        'out = "o"\n[train]\narch = "topk"\n[saes]\nt = {}\nr = { arch = "relu" }\nq = { arch = "relu", lr = 0.5 }\n'
    )
    cfg = load_run_config(path)
    relu, topk = get_architecture("relu").train_defaults, get_architecture("topk").train_defaults
    assert cfg.sae_config("t").resolved().lr == topk["lr"]
    assert (cfg.sae_config("r").resolved().lr, cfg.sae_config("r").resolved().l1_coefficient) == (
        relu["lr"],
        relu["l1_coefficient"],
    )
    assert cfg.sae_config("q").resolved().lr == 0.5
