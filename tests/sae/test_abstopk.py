"""The AbsTopK SAE (saegeo/sae/architectures/abstopk.py): sparsify's `signed: true` config read (no longer refused)
with codes equal to the formula written out here in float64 (top k of |pre|, signs kept), SAELens' own abstopk file
(tests/fixtures/published/saelens_abstopk, written by SAELens 6.54's AbsTopKSAE) written back in its layout, and
training on planted features that fire with both signs."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file

from saegeo.sae.model import SAE
from saegeo.sae.train import TrainConfig, read_training_log, train_sae

FIXTURES = Path(__file__).parents[1] / "fixtures" / "published"


def _abs_topk(pre: torch.Tensor, k: int) -> torch.Tensor:
    """The k entries of largest |pre| of each row with their sign, zeros elsewhere (float64)."""
    top = pre.abs().argsort(dim=1, descending=True)[:, :k]
    return torch.zeros_like(pre).scatter_(1, top, pre.gather(1, top))


def test_sparsify_signed_config_is_read_and_encodes_the_top_k_of_the_magnitudes():
    folder = FIXTURES / "sparsify_signed_handbuilt" / "layers.6"
    sae = SAE.load(folder)
    assert sae.cfg.activation == "abstopk" and sae.cfg.k == 8
    w = load_file(str(folder / "sae.safetensors"))
    x = load_file(str(FIXTURES / "sparsify_topk" / "reference.safetensors"))["x"]
    pre = (x.double() - w["b_dec"].double()) @ w["encoder.weight"].double().T + w["encoder.bias"].double()
    want = _abs_topk(pre, 8)
    assert (want < 0).sum() > 100 and (want > 0).sum() > 100  # both signs are codes here
    with torch.no_grad():
        torch.testing.assert_close(sae.encode(x).double(), want, rtol=1e-5, atol=1e-5)
        coo = sae.sparse_codes(sae.normalize_input(x)[0], latent_block=5)  # the running top-k over blocks
        dense = torch.zeros(x.shape[0], 64, dtype=torch.float64).index_put_(coo[:2], coo[2].double())
        torch.testing.assert_close(dense, want, rtol=1e-5, atol=1e-5)
        recon = want @ w["W_dec"].double() + w["b_dec"].double()
        torch.testing.assert_close(sae(x).double(), recon, rtol=1e-5, atol=1e-5)


def test_saelens_abstopk_file_is_written_back_in_its_layout(tmp_path):
    """SAELens wrote the file and its codes (test_published_fixtures reads them); saegeo writes it back as abstopk with
    k and the decoder-norm rescaling, and its rescaled choice survives folding the norms."""
    src = FIXTURES / "saelens_abstopk"
    sae = SAE.load(src)
    assert sae.cfg.activation == "abstopk" and sae.cfg.rescale_acts_by_decoder_norm
    ref = load_file(str(src / "reference.safetensors"))
    sae.save(tmp_path / "again")
    cfg = json.loads((tmp_path / "again" / "cfg.json").read_text())
    assert cfg["architecture"] == "abstopk" and cfg["k"] == 8 and cfg["rescale_acts_by_decoder_norm"] is True
    written = load_file(str(tmp_path / "again" / "sae_weights.safetensors"))
    assert set(written) >= {"W_enc", "b_enc", "W_dec", "b_dec"}
    with torch.no_grad():
        again = SAE.load(tmp_path / "again")
        torch.testing.assert_close(again.encode(ref["x"]), ref["codes"], rtol=1e-5, atol=1e-5)
        again.fold_decoder_norms()  # unit rows: codes scale by ‖w_i‖, the same latents fire, the same x̂
        torch.testing.assert_close(again(ref["x"]), ref["recon"], rtol=1e-4, atol=1e-4)


def _signed_superposition(n: int, d: int = 32, n_features: int = 96, k: int = 4, seed: int = 0):
    """x = Σ a_i u_i over k of n_features random unit directions a row, a_i = ±(0.5 + Exp(1)) with a fair sign."""
    g = torch.Generator().manual_seed(seed)
    u = torch.randn(n_features, d, generator=g)
    u /= u.norm(dim=1, keepdim=True)
    idx = torch.rand(n, n_features, generator=g).argsort(1)[:, :k]
    magnitude = torch.empty(n, k).exponential_(generator=g) + 0.5
    sign = torch.where(torch.rand(n, k, generator=g) < 0.5, -1.0, 1.0)
    return torch.zeros(n, n_features).scatter_(1, idx, magnitude * sign) @ u, u


def test_abstopk_trains_on_features_of_both_signs_and_recovers_them(tmp_path):
    """96 features in d 32 fire 4 a row with a fair sign: one AbsTopK latent per feature suffices (a TopK SAE needs two,
    one a sign). Measured: 0.958 of the features found at |cos| ≥ 0.9 at lr 1e-2 (0.80 at 4e-3); half the codes < 0."""
    torch.set_num_threads(1)
    x, truth = _signed_superposition(20_000)
    cfg = TrainConfig(
        arch="abstopk",
        arch_options={"abstopk": {"k": 4}},
        d_sae=128,
        lr=1e-2,
        batch_tokens=512,
        total_tokens=200 * 512,
        dead_window_tokens=10_240,
        heldout_fraction=0.05,
        seed=7,
        progress=False,
        out_dir=str(tmp_path / "abstopk"),
    )
    res = train_sae(cfg, x)
    w = res.sae.W_dec.detach()
    found = (truth @ (w / w.norm(dim=1, keepdim=True)).T).abs().max(dim=1).values
    assert float((found >= 0.9).float().mean()) >= 0.85
    assert res.heldout["fve"] > 0.75 and res.heldout["l0"] == 4.0
    with torch.no_grad():
        codes = SAE.load(tmp_path / "abstopk").encode(x[:2000])
    negative = float((codes < 0).sum() / (codes != 0).sum())
    assert 0.4 < negative < 0.6
    saved = load_file(str(tmp_path / "abstopk" / "sae_weights.safetensors"))
    pre = (x[:2000].double() - saved["b_dec"].double()) @ saved["W_enc"].double() + saved["b_enc"].double()
    torch.testing.assert_close(codes.double(), _abs_topk(pre, 4), rtol=1e-5, atol=1e-5)
    assert "auxk_loss" in read_training_log(tmp_path / "abstopk")[-1]
