"""Matryoshka BatchTopK (saegeo/sae/architectures/matryoshka.py): the two loss forms against a float64 brute force;
the nested widths read from SAELens' own save, from dictionary_learning's ae.pt and from saegeo's save as SAELens
reads it (fixtures written by the libraries: tests/fixtures/published); a short training run saved in SAELens'
layout and read back with the same codes and widths."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from saegeo.errors import BadInputError, FormatError
from saegeo.sae.model import SAE, SAEConfig
from saegeo.sae.train import TrainConfig, read_training_log, train_sae

FIXTURES = Path(__file__).parents[1] / "fixtures" / "published"


def _random_sae(widths: list[int], d_in: int = 12, k: int = 3) -> SAE:
    sae = SAE(SAEConfig(d_in, widths[-1], activation="matryoshka", k=k, matryoshka_widths=widths))
    g = torch.Generator().manual_seed(0)
    sae.init_weights(g, b_dec=torch.randn(d_in, generator=g))
    with torch.no_grad():
        sae.W_enc.add_(0.3 * torch.randn(sae.W_enc.shape, generator=g))
        sae.b_enc.copy_(0.1 * torch.randn(sae.b_enc.shape, generator=g))
    return sae


def _brute_force_fvus(sae: SAE, x: torch.Tensor) -> torch.Tensor:
    """FVU of every prefix in float64 from dense codes: the k·n largest entries of relu(pre) over the batch."""
    W_enc, b_enc, W_dec, b_dec = (t.detach().double() for t in (sae.W_enc, sae.b_enc, sae.W_dec, sae.b_dec))
    x = x.double()
    post = torch.relu((x - b_dec) @ W_enc + b_enc)
    keep = post.flatten().topk(sae.cfg.k * x.shape[0]).indices
    codes = torch.zeros(post.numel(), dtype=torch.float64)
    codes[keep] = post.flatten()[keep]
    codes = codes.view_as(post)
    centred = (x - x.mean(0)).pow(2).sum()
    return torch.stack(
        [(x - b_dec - codes[:, :w] @ W_dec[:w]).pow(2).sum() / centred for w in sae.cfg.matryoshka_widths]
    )


@pytest.mark.parametrize(
    ("loss", "weights"), [("dictionary_learning", ()), ("dictionary_learning", (0.5, 0.3, 0.2)), ("saelens", ())]
)
def test_loss_forms_equal_a_brute_force_recomputation(loss, weights):
    """dictionary_learning: mean_ℓ v_ℓ·FVU_ℓ (v = 1/G by default: Σ FVU_ℓ / G²); saelens: Σ_ℓ FVU_ℓ. AuxK off."""
    sae = _random_sae([5, 15, 40])
    x = torch.randn(64, 12, generator=torch.Generator().manual_seed(1)) + sae.b_dec.detach()
    out = sae.forward_train(x, loss=loss, group_weights=weights, aux_k=0, aux_coefficient=0.0)
    fvus = _brute_force_fvus(sae, x)
    v = torch.tensor(weights or (1 / 3,) * 3, dtype=torch.float64)
    expected = fvus.sum() if loss == "saelens" else (v * fvus).mean()
    assert float(out.loss.detach()) == pytest.approx(float(expected), rel=1e-5)
    for w, f in zip((5, 15, 40), fvus):
        assert float(out.terms[f"fvu_prefix_{w}"]) == pytest.approx(float(f), rel=1e-5)
    assert float(out.l0_sum) == 3 * 64  # BatchTopK: k codes a row on average


def test_widths_are_read_from_each_library_s_own_files():
    """SAELens' own save (jumprelu + metadata), dictionary_learning's ae.pt (group_sizes) and saegeo's save as SAELens
    read it: the widths each library has are the SAEConfig's (codes: test_published_fixtures)."""
    for name in ("saelens_matryoshka", "saegeo_matryoshka"):
        read_by_saelens = load_file(str(FIXTURES / name / "reference.safetensors"))["matryoshka_widths"].tolist()
        assert SAE.load(FIXTURES / name).cfg.matryoshka_widths == read_by_saelens
    assert (
        read_by_saelens
        == json.loads((FIXTURES / "saegeo_matryoshka" / "cfg.json").read_text())["saegeo"]["sae_config"][
            "matryoshka_widths"
        ]
    )
    sizes = torch.load(FIXTURES / "dl_matryoshka" / "ae.pt", weights_only=True)["group_sizes"]
    dl = SAE.load(FIXTURES / "dl_matryoshka")
    assert dl.cfg.activation == "matryoshka" and dl.cfg.matryoshka_widths == sizes.cumsum(0).tolist() == [16, 32, 64]


def test_bad_widths_in_a_saelens_file_are_refused_naming_it(tmp_path):
    d = tmp_path / "m"
    shutil.copytree(FIXTURES / "saelens_matryoshka", d)
    cfg = json.loads((d / "cfg.json").read_text())
    cfg["metadata"]["training_architecture_details"]["matryoshka_widths"] = [32, 16, 64]
    (d / "cfg.json").write_text(json.dumps(cfg))
    with pytest.raises(FormatError, match=r"cfg\.json.*matryoshka_widths must rise strictly"):
        SAE.load(d)


def test_group_fractions_must_sum_to_one():
    with pytest.raises(BadInputError, match="must sum to 1"):
        TrainConfig(arch="matryoshka", arch_options={"matryoshka": {"group_fractions": (0.5, 0.25)}}).options  # noqa: B018


def test_trained_saved_in_saelens_layout_and_read_back(tmp_path):
    """A short run (the synthetic generator, 60 steps): saved as SAELens saves its own (jumprelu, θ broadcast,
    training_architecture matryoshka_batchtopk with the widths), read back with the same codes and widths; each
    prefix's FVU is logged."""
    from saegeo.synthetic import SuperpositionGenerator, SyntheticConfig

    torch.set_num_threads(1)
    x, _ = SuperpositionGenerator(SyntheticConfig(d=32, n_features=96, rate=0.05, seed=3)).sample(6_000)
    options = {"k": 5, "group_fractions": (0.25, 0.25, 0.5)}
    cfg = TrainConfig(
        arch="matryoshka",
        arch_options={"matryoshka": options},
        d_sae=64,
        batch_tokens=256,
        total_tokens=60 * 256,
        heldout_fraction=0.1,
        seed=1,
        progress=False,
        out_dir=str(tmp_path / "m"),
    )
    res = train_sae(cfg, x)
    saved = json.loads((tmp_path / "m" / "cfg.json").read_text())
    assert saved["architecture"] == "jumprelu"
    assert saved["metadata"]["training_architecture"] == "matryoshka_batchtopk"
    assert saved["metadata"]["training_architecture_details"] == {"k": 5, "matryoshka_widths": [16, 32, 64]}
    weights = load_file(str(tmp_path / "m" / "sae_weights.safetensors"))
    assert torch.equal(weights["threshold"], res.sae.threshold.detach().expand(64))
    loaded = SAE.load(tmp_path / "m")
    assert loaded.cfg.matryoshka_widths == [16, 32, 64] and loaded.format_info.architecture == "matryoshka"
    with torch.no_grad():
        assert torch.equal(loaded.encode(x[-500:]), res.sae.encode(x[-500:]))
    assert 2.5 < res.heldout["l0"] < 10  # the inference threshold keeps about k codes a row
    assert all(f"fvu_prefix_{w}" in r for r in read_training_log(tmp_path / "m") for w in (16, 32, 64))


def test_b_dec_starts_at_the_training_rows_mean():
    """As every architecture: b_dec := the mean of the training rows (lr 0 keeps the start)."""
    x = torch.randn(3_000, 12, generator=torch.Generator().manual_seed(4)) + 2.0
    cfg = TrainConfig(
        arch="matryoshka",
        arch_options={"matryoshka": {"k": 3, "group_fractions": (0.25, 0.75)}},
        d_sae=32,
        lr=0.0,
        batch_tokens=256,
        total_tokens=256,
        heldout_fraction=0.1,
        progress=False,
    )
    res = train_sae(cfg, x)
    assert res.provenance["b_dec_init"] == "mean"
    torch.testing.assert_close(res.sae.b_dec.detach().double(), x[:2_700].double().mean(0), atol=1e-6, rtol=0)
