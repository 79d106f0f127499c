"""The Gated SAE (saegeo/sae/architectures/gated.py): its encode against SAELens' GatedSAE formula written out
here (a separate magnitude matrix W_enc ⊙ exp(r_mag)), a file in SAELens' gated layout (cfg.json architecture
"gated"; W_enc, b_gate, b_mag, r_mag, W_dec, b_dec) read by SAE.load and written back the same way, and training on
the synthetic generator with its ground-truth features recovered (saegeo.synthetic.recovery)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from saegeo.sae.model import SAE, SAEConfig
from saegeo.sae.train import TrainConfig, read_training_log, train_sae
from saegeo.synthetic import SuperpositionGenerator, SyntheticConfig
from saegeo.synthetic.recovery import recovery


def _saelens_gated_codes(x, t: dict) -> torch.Tensor:
    """SAELens' GatedSAE.encode: sae_in = x − b_dec; gate = [sae_in W_enc + b_gate > 0];
    magnitude = relu(sae_in (W_enc ⊙ exp(r_mag)) + b_mag); codes = gate · magnitude."""
    sae_in = x.double() - t["b_dec"].double()
    gate = (sae_in @ t["W_enc"].double() + t["b_gate"].double()) > 0
    w_mag = t["W_enc"].double() * t["r_mag"].double().exp()
    return gate * torch.relu(sae_in @ w_mag + t["b_mag"].double())


def _gated_tensors(d=12, d_sae=40, seed=0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "W_enc": torch.randn(d, d_sae, generator=g) / d**0.5,
        "b_gate": torch.randn(d_sae, generator=g) * 0.3,
        "b_mag": torch.randn(d_sae, generator=g) * 0.3,
        "r_mag": torch.randn(d_sae, generator=g) * 0.5,
        "W_dec": torch.randn(d_sae, d, generator=g) / d**0.5,
        "b_dec": torch.randn(d, generator=g),
    }


def test_a_saelens_gated_file_is_read_encoded_and_written_back_in_its_layout(tmp_path):
    t = _gated_tensors()
    folder = tmp_path / "saelens_gated"
    folder.mkdir()
    save_file(t, str(folder / "sae_weights.safetensors"))
    cfg = {"architecture": "gated", "d_in": 12, "d_sae": 40, "dtype": "float32", "apply_b_dec_to_input": True}
    (folder / "cfg.json").write_text(json.dumps({**cfg, "normalize_activations": "none"}))
    sae = SAE.load(folder)
    assert sae.cfg.activation == "gated" and sae.format_info.format == "saelens"
    x = torch.randn(300, 12, generator=torch.Generator().manual_seed(1)) + 0.5
    want = _saelens_gated_codes(x, t)
    assert 0 < int((want > 0).sum()) < want.numel()  # some gates open, some shut, some magnitudes at zero
    with torch.no_grad():
        torch.testing.assert_close(sae.encode(x).double(), want, rtol=1e-5, atol=1e-6)
        blocks = sae.sparse_codes(sae.normalize_input(x)[0], latent_block=7)  # latent-wise: blocks agree
        dense = torch.zeros(300, 40).index_put_(blocks[:2], blocks[2])
        torch.testing.assert_close(dense, sae.encode(x), rtol=1e-5, atol=1e-6)  # float32 blocks vs the whole
    sae.save(tmp_path / "again")
    written = load_file(str(tmp_path / "again" / "sae_weights.safetensors"))
    assert set(written) == set(t)  # SAELens' names: b_gate, no b_enc
    assert all(torch.equal(written[k], t[k]) for k in t)
    assert json.loads((tmp_path / "again" / "cfg.json").read_text())["architecture"] == "gated"
    with torch.no_grad():
        assert torch.equal(SAE.load(tmp_path / "again").encode(x), sae.encode(x))


def test_a_gated_sae_refuses_decoder_norm_rescaling():
    from saegeo.errors import FormatError

    with pytest.raises(FormatError, match="gated SAE does not rescale"):
        SAEConfig(8, 16, activation="gated", rescale_acts_by_decoder_norm=True)


def test_gated_trains_on_the_synthetic_generator_and_recovers_its_features(tmp_path):
    """N = 256 true features in d = 64, 5 active a row (the TopK recovery test's data): at l1 3, lr 1e-2 the gated
    SAE finds 0.906 of them at cos ≥ 0.9 (measured; TopK: ≥ 0.95), from a random decoder that finds almost none;
    both loss terms are logged, and what it saved is what it encodes."""
    torch.set_num_threads(1)
    gen = SuperpositionGenerator(SyntheticConfig(d=64, n_features=256, rate=5 / 256, seed=1))
    x, _ = gen.sample(20_000)
    cfg = TrainConfig(
        arch="gated",
        arch_options={"gated": {"l1_coefficient": 3.0}},
        d_sae=512,
        lr=1e-2,
        batch_tokens=512,
        total_tokens=200 * 512,
        dead_window_tokens=10_240,
        heldout_fraction=0.05,
        seed=7,
        progress=False,
        out_dir=str(tmp_path / "gated"),
    )
    res = train_sae(cfg, x)
    rep = recovery(gen.truth.dictionary, res.sae.W_dec.detach(), threshold=0.9, match=False)
    assert rep.frac_recovered >= 0.8, rep.summary()
    assert res.heldout["fve"] > 0.6 and 1 < res.heldout["l0"] < 10
    log = read_training_log(tmp_path / "gated")
    assert all(r["l1_loss"] > 0 and r["aux_recon_loss"] > 0 for r in log)
    assert not torch.equal(res.sae.r_mag.detach(), torch.zeros(512))  # the magnitude path trained
    saved = load_file(str(tmp_path / "gated" / "sae_weights.safetensors"))
    with torch.no_grad():
        torch.testing.assert_close(
            SAE.load(tmp_path / "gated").encode(x[:500]).double(),
            _saelens_gated_codes(x[:500], saved),
            rtol=1e-5,
            atol=1e-5,
        )


# a small script for the SAELens venv: SAELens loads a folder and writes its own encode/decode of x
_SAELENS_READS = r"""
import sys, torch
from safetensors.torch import load_file, save_file
from sae_lens import SAE
sae = SAE.load_from_disk(sys.argv[1], device="cpu")
x = load_file(sys.argv[2])["x"]
with torch.no_grad():
    codes = sae.encode(x)
    save_file({"codes": codes, "recon": sae.decode(codes)}, sys.argv[3])
print(type(sae).__name__)
"""


def _saelens_python() -> Path | None:
    """The SAELens venv (`make .venv-saelens/.installed`), or the one SAEGEO_SAELENS_PYTHON names; None if absent."""
    named = os.environ.get("SAEGEO_SAELENS_PYTHON")
    python = Path(named) if named else Path(__file__).parents[2] / ".venv-saelens" / "bin" / "python"
    return python if python.exists() else None


@pytest.mark.skipif(_saelens_python() is None, reason="no SAELens venv (make .venv-saelens/.installed)")
def test_saelens_loads_a_saegeo_trained_gated_sae_with_equal_codes(tmp_path):
    """SAELens 6.54's own SAE.load_from_disk reads the folder saegeo's training wrote as a GatedSAE, and its
    encode/decode equal saegeo's on rows where gates open and shut."""
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(4096, 16, generator=g) @ torch.randn(16, 16, generator=g) + 0.3
    cfg = TrainConfig(arch="gated", d_sae=48, batch_tokens=256, total_tokens=40 * 256, heldout_fraction=0.0, seed=2,
                      progress=False, out_dir=str(tmp_path / "gated"))  # fmt: skip
    sae = train_sae(cfg, x).sae
    assert not torch.equal(sae.r_mag.detach(), torch.zeros(48))  # a magnitude path of its own, not the gate's
    rows = x[:300].contiguous()
    save_file({"x": rows}, str(tmp_path / "x.safetensors"))
    script = tmp_path / "saelens_reads.py"
    script.write_text(_SAELENS_READS)
    out = tmp_path / "saelens.safetensors"
    proc = subprocess.run(
        [str(_saelens_python()), str(script), str(tmp_path / "gated"), str(tmp_path / "x.safetensors"), str(out)],
        capture_output=True,
        text=True,
        env={**os.environ, "TQDM_DISABLE": "1", "WANDB_MODE": "disabled", "PYTHONPATH": ""},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split()[-1] == "GatedSAE"
    theirs = load_file(str(out))
    with torch.no_grad():
        codes = SAE.load(tmp_path / "gated").encode(rows)
        recon = SAE.load(tmp_path / "gated").decode(codes)
    assert 0 < int((codes > 0).sum()) < codes.numel()
    assert torch.equal(theirs["codes"] > 0, codes > 0)
    torch.testing.assert_close(theirs["codes"], codes, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(theirs["recon"], recon, rtol=1e-5, atol=1e-5)
