"""Native SAE format (SAELens layout): save -> load gives identical outputs, cfg.json carries the
SAELens keys and the saegeo provenance, a plain SAELens cfg (no saegeo block) loads with SAELens
semantics, bad directories get clear errors; `saegeo train` writes such a directory."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from saegeo.activations.store import write_store
from saegeo.cli import main
from saegeo.errors import FormatError
from saegeo.sae.architectures import architecture_names, get_architecture
from saegeo.sae.model import SAE, SAEConfig


def _random_sae(activation: str, seed: int = 0) -> SAE:
    sae = SAE(SAEConfig(24, 96, activation=activation, k=8 if activation == "topk" else None))
    g = torch.Generator().manual_seed(seed)
    sae.init_weights(g, b_dec=torch.randn(24, generator=g))
    with torch.no_grad():
        sae.b_enc.copy_(0.1 * torch.randn(96, generator=g))
        sae.W_enc.add_(0.2 * torch.randn(24, 96, generator=g))
    return sae


@pytest.mark.parametrize("activation", ["topk", "relu"])
def test_save_load_round_trip_identical_outputs(tmp_path, activation):
    sae = _random_sae(activation)
    prov = {
        "b_dec_init": "mean",
        "data": {"model": "minilm", "hook": "blocks.3.hook_resid_post"},
        "metrics": {"heldout": {"fve": 0.9}},
    }
    sae.save(tmp_path / "sae", prov)
    cfg = json.loads((tmp_path / "sae" / "cfg.json").read_text())
    assert cfg["architecture"] == {"topk": "topk", "relu": "standard"}[activation]
    assert (cfg["d_in"], cfg["d_sae"], cfg["apply_b_dec_to_input"], cfg["normalize_activations"]) == (
        24,
        96,
        True,
        "none",
    )
    assert cfg["metadata"]["hook_name"] == "blocks.3.hook_resid_post" and cfg["metadata"]["model_name"] == "minilm"
    assert cfg["saegeo"]["b_dec_init"] == "mean" and cfg["saegeo"]["metrics"]["heldout"]["fve"] == 0.9
    if activation == "topk":
        assert cfg["k"] == 8
    w = load_file(str(tmp_path / "sae" / "sae_weights.safetensors"))
    assert w["W_enc"].shape == (24, 96) and w["W_dec"].shape == (96, 24)
    loaded = SAE.load(tmp_path / "sae")
    x = torch.randn(50, 24) + sae.b_dec.detach()
    assert torch.equal(loaded.encode(x), sae.encode(x))
    assert torch.equal(loaded(x), sae(x))
    for name, p in sae.state_dict().items():
        assert torch.equal(p, loaded.state_dict()[name]), name


@pytest.mark.parametrize("name", architecture_names())
def test_every_registered_architecture_round_trips_through_save_and_load(tmp_path, name):
    """SAE.save then SAE.load: the same codes and reconstructions, and the config it was saved as (BatchTopK is
    saved as the JumpReLU with its threshold broadcast; the loader says what it was trained as)."""
    arch = get_architecture(name)
    widths = [24, 48, 96] if name == "matryoshka" else None  # the one architecture that needs its nesting
    cfg = SAEConfig(24, 96, activation=name, k=8 if arch.uses_k else None, matryoshka_widths=widths)
    sae = SAE(cfg)
    g = torch.Generator().manual_seed(5)
    sae.init_weights(g, b_dec=torch.randn(24, generator=g))
    with torch.no_grad():
        sae.b_enc.copy_(0.1 * torch.randn(96, generator=g))
        sae.W_enc.add_(0.2 * torch.randn(24, 96, generator=g))
        sae.threshold.copy_(0.3 * torch.rand(sae.threshold.shape, generator=g))
    sae.save(tmp_path / name, {"b_dec_init": "mean"})
    loaded = SAE.load(tmp_path / name)
    saved_as, extra = arch.saved_form(cfg)
    assert loaded.cfg == saved_as and (saved_as == cfg) == (not extra)
    assert loaded.format_info.written_by == "saegeo"
    assert loaded.format_info.architecture == extra.get("trained_as")
    assert loaded.format_info.training_k == extra.get("training_k")
    x = torch.randn(200, 24, generator=g) + sae.b_dec.detach()
    with torch.no_grad():
        codes = sae.encode(x)
        assert 0 < (codes > 0).float().mean() < 0.9  # some latents fire, not all: the threshold/selection matters
        assert torch.equal(loaded.encode(x), codes)
        assert torch.equal(loaded(x), sae(x))


def test_plain_saelens_directory_loads_with_saelens_semantics(tmp_path):
    """A cfg.json as SAELens 6 writes it (no saegeo block): TopK = ReLU of the top-k of pre."""
    g = torch.Generator().manual_seed(3)
    W_enc, W_dec = torch.randn(10, 30, generator=g), torch.randn(30, 10, generator=g)
    b_enc, b_dec = torch.randn(30, generator=g), torch.randn(10, generator=g)
    d = tmp_path / "saelens"
    d.mkdir()
    save_file({"W_enc": W_enc, "W_dec": W_dec, "b_enc": b_enc, "b_dec": b_dec}, str(d / "sae_weights.safetensors"))
    (d / "cfg.json").write_text(
        json.dumps(
            {
                "architecture": "topk",
                "d_in": 10,
                "d_sae": 30,
                "k": 4,
                "dtype": "float32",
                "device": "cpu",
                "apply_b_dec_to_input": False,
                "normalize_activations": "none",
                "metadata": {},
            }
        )
    )
    sae = SAE.load(d)
    x = torch.randn(20, 10, generator=g)
    pre = x @ W_enc + b_enc  # apply_b_dec_to_input False: no subtraction
    idx = pre.topk(4, dim=1).indices
    codes = torch.zeros_like(pre).scatter(1, idx, pre.gather(1, idx).clamp_min(0))
    torch.testing.assert_close(sae.encode(x), codes)
    torch.testing.assert_close(sae(x), codes @ W_dec + b_dec)


def test_bad_directories_are_named(tmp_path):
    with pytest.raises(FormatError, match="cfg.json"):
        SAE.load(tmp_path)
    sae = _random_sae("relu")
    sae.save(tmp_path / "s")
    w = load_file(str(tmp_path / "s" / "sae_weights.safetensors"))
    w["W_dec"] = w["W_dec"][:, :20].contiguous()
    save_file(w, str(tmp_path / "s" / "sae_weights.safetensors"))
    with pytest.raises(FormatError, match=r"W_dec has shape \(96, 20\)"):
        SAE.load(tmp_path / "s")
    (tmp_path / "s" / "sae_weights.safetensors").write_bytes(b"\x00" * 10)
    with pytest.raises(FormatError, match="safetensors"):
        SAE.load(tmp_path / "s")


def test_cli_train_writes_a_loadable_sae_and_a_summary(tmp_path, capsys):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3000, 16, generator=g) + 5.0  # a large mean: b_dec := mean must find it
    write_store(tmp_path / "acts", x, shard_rows=1000)
    (tmp_path / "t.toml").write_text('[train]\narch = "topk"\nbatch_tokens = 256\nlr = 3e-3\n')
    rc = main(
        [
            "train",
            "--acts",
            str(tmp_path / "acts"),
            "--config",
            str(tmp_path / "t.toml"),
            "--topk.k",
            "4",
            "--expansion",
            "4",
            "--total-tokens",
            "5k",
            "--out",
            str(tmp_path / "sae"),
            "--no-progress",
        ]
    )
    assert rc == 0
    out = capsys.readouterr().out
    assert "held-out FVE" in out and "dead latents" in out
    sae = SAE.load(tmp_path / "sae")
    assert sae.cfg.d_sae == 64 and sae.cfg.k == 4
    cfg = json.loads((tmp_path / "sae" / "cfg.json").read_text())
    assert cfg["saegeo"]["train_config"]["total_tokens"] == 5000
    assert cfg["saegeo"]["train_config"]["batch_tokens"] == 256  # from the TOML file
    torch.testing.assert_close(sae.b_dec.detach(), x[:2700].mean(0), atol=0.05, rtol=0)
    with pytest.raises(SystemExit) as exit_info:  # argparse reports the bad --total-tokens value and exits 2
        main(["train", "--acts", str(tmp_path / "acts"), "--total-tokens", "lots"])
    assert exit_info.value.code == 2
