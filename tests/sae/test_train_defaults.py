"""Per-architecture training defaults: an option left unset (None) takes the architecture's value
(Architecture.train_defaults), the trainer trains and records that value, and `saegeo run` overrides that change
the architecture get the new architecture's defaults, not those of [train]'s."""

from __future__ import annotations

import json

import pytest
import torch

from saegeo.errors import BadInputError
from saegeo.pipeline import load_run_config
from saegeo.sae.architectures import get_architecture
from saegeo.sae.architectures.topk import free_init_norm
from saegeo.sae.train import TrainConfig, train_sae


def _rows(n: int = 1024, d: int = 16, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, d, generator=g) + 3.0


K4 = {"topk": {"k": 4}, "batchtopk": {"k": 4}, "jumprelu": {"l0_target": 4}}


def _cfg(**kw) -> TrainConfig:
    base = dict(d_sae=32, batch_tokens=128, total_tokens=128 * 6, progress=False, log_every=3, num_threads=1)
    return TrainConfig(**{**base, "arch_options": K4, **kw})


@pytest.mark.parametrize("arch", ["relu", "topk", "batchtopk", "jumprelu"])
def test_unset_options_take_the_architectures_defaults(arch):
    defaults = get_architecture(arch).train_defaults
    cfg = _cfg(arch=arch)
    names = ("lr", "grad_clip_norm", "decoder_norm")
    assert [getattr(cfg, n) for n in names] == [None] * 3  # unset until resolved
    assert get_architecture(arch).unit_decoder(cfg) == (arch != "topk")  # unset reads as the default already
    done = cfg.resolved()
    assert [getattr(done, n) for n in names] == [defaults[n] for n in names]
    assert defaults["decoder_norm"] == ("free" if arch == "topk" else "unit")
    given = _cfg(arch=arch, lr=0.123, grad_clip_norm=0.0, decoder_norm="unit").resolved()
    assert [getattr(given, n) for n in names] == [0.123, 0.0, "unit"]  # never replaced


def test_free_rows_start_at_half_unless_the_run_is_too_short_to_grow_them_back():
    """n₀ = max(0.5, 1 − lr·√d·steps/10): MiniLM's grid (lr 4e-3, d 384, 90 steps) starts at 0.5; SmolLM2's demo at
    its former lr (4e-4, d 576, 40 steps) at 1 − 0.0004·24·4 = 0.9616; a run long enough for any lr at 0.5."""
    assert free_init_norm(4e-3, 384, 90) == 0.5
    assert free_init_norm(4e-4, 576, 40) == pytest.approx(0.9616)
    assert free_init_norm(2e-3, 384, 90) == pytest.approx(1 - 2e-3 * 384**0.5 * 9)
    assert free_init_norm(1e-6, 384, 1) == pytest.approx(1 - 1e-6 * 384**0.5 / 10)


@pytest.mark.parametrize("arch", ["batchtopk", "jumprelu"])
def test_free_decoder_norms_are_refused_where_folding_would_change_the_codes(arch):
    with pytest.raises(BadInputError, match=r"decoder_norm = 'free' is for \['abstopk', 'relu', 'topk'\]"):
        _cfg(arch=arch, decoder_norm="free")


def test_topk_trains_with_free_rows_chosen_by_norm_and_saves_the_folded_unit_rows(monkeypatch):
    """TopK's default (decoder_norm free, SAELens' form): rows start small with W_enc = W_decᵀ, latents are
    chosen on pre·‖w_i‖ while training, and the saved SAE has unit rows, no rescaling, and the same x̂ and codes'
    support as the last step's SAE before the fold."""
    from saegeo.sae.model import SAE

    seen = {}
    fold = SAE.fold_decoder_norms

    def spy_fold(sae):
        x = _rows(256, seed=5)
        with torch.no_grad():
            seen["rescaled"] = sae.cfg.rescale_acts_by_decoder_norm
            seen["norms"] = sae.W_dec.norm(dim=1).clone()
            seen["before"] = (sae.encode(x) > 0, sae(x))
            fold(sae)
            seen["after"] = (sae.encode(x) > 0, sae(x))

    monkeypatch.setattr(SAE, "fold_decoder_norms", spy_fold)
    init = {}
    topk = get_architecture("topk")
    start = type(topk).init_training
    monkeypatch.setattr(
        type(topk),
        "init_training",
        lambda self, sae, *a: (start(self, sae, *a), init.update(W_dec=sae.W_dec.clone(), W_enc=sae.W_enc.clone())),
    )
    done = train_sae(_cfg(arch="topk"), _rows())
    assert done.config.decoder_norm == "free" and seen["rescaled"]
    # this run is short (6 steps at lr 4e-3, d 16): rows start at 1 − lr·√d·steps/10 = 0.9904, not 0.5
    assert free_init_norm(done.config.lr, 16, 6) == pytest.approx(1 - 4e-3 * 4 * 6 / 10)
    torch.testing.assert_close(init["W_dec"].norm(dim=1), torch.full((32,), 1 - 4e-3 * 4 * 6 / 10))
    assert torch.equal(init["W_enc"], init["W_dec"].T)
    assert (seen["norms"] - 1).abs().max() > 1e-3  # the norms moved: the fold has something to do
    assert torch.equal(seen["before"][0], seen["after"][0])
    torch.testing.assert_close(seen["after"][1], seen["before"][1], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(done.sae.W_dec.norm(dim=1), torch.ones(32), rtol=0, atol=1e-6)
    assert not done.sae.cfg.rescale_acts_by_decoder_norm


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
    l1 = {"relu": {"l1_coefficient": 1.0}}  # relu's own option's default, given
    unset = train_sae(_cfg(arch="relu", out_dir=str(tmp_path / "a")), x, resume=False)
    given = train_sae(_cfg(arch="relu", out_dir=str(tmp_path / "b"), arch_options=l1, **defaults), x, resume=False)
    other = train_sae(_cfg(arch="relu", lr=defaults["lr"] / 3), x)
    assert (unset.config.lr, unset.config.options.l1_coefficient) == (defaults["lr"], 1.0)
    assert torch.equal(unset.sae.W_enc, given.sae.W_enc) and torch.equal(unset.sae.W_dec, given.sae.W_dec)
    assert not torch.equal(unset.sae.W_enc, other.sae.W_enc)  # the lr reached the optimiser
    saved = json.loads((tmp_path / "a" / "cfg.json").read_text())["saegeo"]["train_config"]
    assert saved["lr"] == defaults["lr"]
    assert saved["arch_options"] == {"relu": {"l1_coefficient": 1.0, "l1_warmup_fraction": 0.0}}


def test_a_run_override_of_the_architecture_gets_that_architectures_defaults(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text(
        'out = "o"\n[train]\narch = "topk"\n[saes]\nt = {}\nr = { arch = "relu" }\nq = { arch = "relu", lr = 0.5 }\n'
    )
    cfg = load_run_config(path)
    relu, topk = get_architecture("relu").train_defaults, get_architecture("topk").train_defaults
    assert cfg.sae_config("t").resolved().lr == topk["lr"]
    assert (cfg.sae_config("r").resolved().lr, cfg.sae_config("r").resolved().options.l1_coefficient) == (
        relu["lr"],
        1.0,
    )
    assert cfg.sae_config("q").resolved().lr == 0.5


def test_the_architecture_names_read_without_torch_are_the_registrys_own(monkeypatch):
    """TrainConfig checks `arch` before torch is loaded by reading each architecture module's
    register_architecture("name", ...) line; that must give exactly the names the package registers."""
    import sys

    from saegeo.sae.architectures import architecture_names
    from saegeo.sae.options import registered_architecture_names

    own = {a for a in architecture_names() if type(get_architecture(a)).__module__.startswith("saegeo.sae.")}
    assert registered_architecture_names() == architecture_names()  # loaded: the registry answers
    monkeypatch.delitem(sys.modules, "saegeo.sae.architectures")  # as before torch is imported
    assert set(registered_architecture_names()) == own and len(own) >= 4
    with pytest.raises(BadInputError, match=r"arch = 'nope': expected one of \['abstopk', 'batchtopk'"):
        TrainConfig(arch="nope")
