"""Published dictionary formats: each fixture is written here with the format's own key names, shapes
and orientation, and the loaded SAE must reproduce an independent numpy reference of that library's
encode/decode (transcribed from the library's code, cited per reference). Also: auto-detection,
a saegeo SAE round trip through the SAELens layout, unsafe pickles, truncated files, wrong shapes."""

from __future__ import annotations

import json
import pathlib

import numpy as np
import pytest
import torch
from safetensors.numpy import save_file as save_numpy_safetensors

from saegeo.errors import FormatError
from saegeo.sae.formats import detect_format
from saegeo.sae.model import SAE

D_IN, D_SAE, N_ROWS = 12, 40, 64
TOL = dict(rtol=2e-4, atol=2e-4)  # float32 model vs float64 reference


def _rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def _weights(seed: int, *, unit_rows: bool = False) -> dict[str, np.ndarray]:
    """Random encoder/decoder in the SAELens orientation, decoder rows of norm 0.5–2 (not unit)."""
    rng = _rng(seed)
    w_dec = rng.standard_normal((D_SAE, D_IN))
    w_dec /= np.linalg.norm(w_dec, axis=1, keepdims=True)
    if not unit_rows:
        w_dec *= rng.uniform(0.5, 2.0, size=(D_SAE, 1))
    w_enc = w_dec.T + 0.3 * rng.standard_normal((D_IN, D_SAE))
    b_enc = 0.3 * rng.standard_normal(D_SAE)
    b_dec = 2.0 * rng.standard_normal(D_IN)  # large: subtracting it or not changes every code
    return {k: v.astype(np.float32) for k, v in dict(W_enc=w_enc, W_dec=w_dec, b_enc=b_enc, b_dec=b_dec).items()}


def _inputs(seed: int, b_dec: np.ndarray | None = None) -> np.ndarray:
    x = _rng(seed + 1000).standard_normal((N_ROWS, D_IN)) * 1.5
    if b_dec is not None:
        x = x + b_dec  # activations around the offset, as real ones are
    return x.astype(np.float32)


def _f64(d: dict) -> dict:
    return {k: np.asarray(v, dtype=np.float64) for k, v in d.items()}


def _relu(z):
    return np.maximum(z, 0.0)


def _topk_then_relu(pre: np.ndarray, k: int) -> np.ndarray:
    """SAELens TopK / OpenAI TopK: torch.topk of pre, then ReLU of the values, scattered."""
    out = np.zeros_like(pre)
    idx = np.argsort(-pre, axis=1)[:, :k]
    np.put_along_axis(out, idx, _relu(np.take_along_axis(pre, idx, axis=1)), axis=1)
    return out


def _relu_then_topk(pre: np.ndarray, k: int) -> np.ndarray:
    """sparsify / dictionary_learning TopK: ReLU first, then the top k of the rectified values."""
    post = _relu(pre)
    out = np.zeros_like(post)
    idx = np.argsort(-post, axis=1)[:, :k]
    np.put_along_axis(out, idx, np.take_along_axis(post, idx, axis=1), axis=1)
    return out


def _layer_norm(x: np.ndarray, eps: float = 1e-5):
    """OpenAI `LN` (also SAELens `layer_norm`): unbiased std (torch.std), eps added to the std."""
    mu = x.mean(axis=1, keepdims=True)
    xc = x - mu
    std = xc.std(axis=1, ddof=1, keepdims=True)
    return xc / (std + eps), mu, std


def _torch(a) -> torch.Tensor:
    return torch.as_tensor(np.asarray(a, dtype=np.float32))


def _check(sae, x: np.ndarray, ref_codes: np.ndarray, ref_recon: np.ndarray, recon_scale: float = 1.0) -> None:
    """Loaded SAE: encode(x) = reference codes; forward(x) = decode(encode(x)) = reference reconstruction
    (to a tolerance proportional to `recon_scale`, the spread of the rows)."""
    with torch.no_grad():
        codes = sae.encode(_torch(x)).double().numpy()
        recon = sae(_torch(x)).double().numpy()
    # the fixture must exercise sparsity: some but not all latents active
    assert 0 < (ref_codes > 0).mean() < 0.9
    np.testing.assert_allclose(codes, ref_codes, **TOL)
    np.testing.assert_allclose(recon, ref_recon, rtol=TOL["rtol"], atol=TOL["atol"] * recon_scale)


# ============================================================================ SAELens
def _saelens_reference(x, w, cfg):
    """sae_lens/saes/{sae,standard_sae,topk_sae,jumprelu_sae}.py (6.x) and 5.x finetuning_scaling_factor.

    process_sae_in: normalise (constant_norm_rescale: x·√d/‖x‖; layer_norm: LN), then − b_dec·apply_b_dec_to_input;
    hidden_pre = sae_in @ W_enc + b_enc; standard: ReLU; topk: TopK(k) then ReLU; jumprelu: ReLU(pre)·(pre > θ);
    decode: (acts·scaling_factor) @ W_dec + b_dec, then the normalisation's inverse.
    """
    w = _f64(w)
    x = x.astype(np.float64)
    norm = cfg.get("normalize_activations", "none")
    if norm == "constant_norm_rescale":
        coeff = np.sqrt(x.shape[1]) / np.linalg.norm(x, axis=1, keepdims=True)
        xin = x * coeff
    elif norm == "layer_norm":
        xin, mu, std = _layer_norm(x)
    else:
        xin = x
    if cfg.get("apply_b_dec_to_input", True):
        xin = xin - w["b_dec"]
    pre = xin @ w["W_enc"] + w["b_enc"]
    dec_norms = np.linalg.norm(w["W_dec"], axis=1)
    if cfg.get("rescale_acts_by_decoder_norm"):  # newer TopKSAE: hidden_pre·‖W_dec,i‖, decode codes/‖W_dec,i‖
        pre = pre * dec_norms
    arch = cfg.get("architecture", "standard")
    act_fn = cfg.get("activation_fn", cfg.get("activation_fn_str", "relu"))
    if arch == "jumprelu":
        codes = _relu(pre) * (pre > w["threshold"])
    elif arch == "topk" or act_fn == "topk":
        k = cfg["k"] if "k" in cfg else cfg["activation_fn_kwargs"]["k"]
        codes = _topk_then_relu(pre, k)
    else:
        codes = _relu(pre)
    scaled = codes * w["scaling_factor"] if cfg.get("finetuning_scaling_factor") else codes
    if cfg.get("rescale_acts_by_decoder_norm"):
        scaled = scaled / dec_norms
    out = scaled @ w["W_dec"] + w["b_dec"]
    if norm == "constant_norm_rescale":
        out = out / coeff
    elif norm == "layer_norm":
        out = out * std + mu
    return codes, out


def _write_saelens(path: pathlib.Path, w: dict, cfg: dict) -> pathlib.Path:
    path.mkdir(parents=True, exist_ok=True)
    save_numpy_safetensors({k: np.ascontiguousarray(v) for k, v in w.items()}, str(path / "sae_weights.safetensors"))
    (path / "cfg.json").write_text(json.dumps(cfg))
    return path


_V6 = {"metadata": {"sae_lens_version": "6.5.1", "hook_name": "blocks.3.hook_resid_post"}, "dtype": "float32"}


@pytest.mark.parametrize(
    "name, cfg, extra",
    [
        ("standard", {"architecture": "standard", "apply_b_dec_to_input": True, "normalize_activations": "none"}, {}),
        ("topk", {"architecture": "topk", "k": 5, "apply_b_dec_to_input": True, "normalize_activations": "none"}, {}),
        ("topk_rescale", {"architecture": "topk", "k": 5, "rescale_acts_by_decoder_norm": True}, {}),
        (
            "jumprelu_bdec",
            {"architecture": "jumprelu", "apply_b_dec_to_input": True, "normalize_activations": "none"},
            {"threshold": 0.4},
        ),
        ("jumprelu_nobdec", {"architecture": "jumprelu", "apply_b_dec_to_input": False}, {"threshold": 0.4}),
        (
            "layer_norm",
            {"architecture": "standard", "apply_b_dec_to_input": True, "normalize_activations": "layer_norm"},
            {},
        ),
        ("norm_rescale", {"architecture": "topk", "k": 6, "normalize_activations": "constant_norm_rescale"}, {}),
        # SAELens < 6: hook_point, activation_fn_str + activation_fn_kwargs, boolean normalize_activations,
        # no architecture key, finetuning scaling factor in the weights
        (
            "v5_topk",
            {
                "hook_point": "blocks.0.hook_resid_pre",
                "activation_fn_str": "topk",
                "activation_fn_kwargs": {"k": 4},
                "apply_b_dec_to_input": True,
                "normalize_activations": False,
                "sae_lens_version": "3.13.0",
            },
            {},
        ),
        (
            "v5_scaling",
            {
                "architecture": "standard",
                "activation_fn_str": "relu",
                "finetuning_scaling_factor": True,
                "sae_lens_version": "4.0.0",
            },
            {"scaling_factor": True},
        ),
    ],
)
def test_saelens_matches_reference(tmp_path, name, cfg, extra):
    w = _weights(1)
    if "threshold" in extra:
        w["threshold"] = (extra["threshold"] * _rng(2).uniform(0.5, 1.5, D_SAE)).astype(np.float32)
    if "scaling_factor" in extra:
        w["scaling_factor"] = _rng(3).uniform(0.5, 1.5, D_SAE).astype(np.float32)
    cfg = {**(_V6 if "sae_lens_version" not in cfg else {}), "d_in": D_IN, "d_sae": D_SAE, **cfg}
    path = _write_saelens(tmp_path / name, w, cfg)
    assert detect_format(path) == "saelens"
    sae = SAE.load(path)
    x = _inputs(1, w["b_dec"])
    _check(sae, x, *_saelens_reference(x, w, cfg))


def test_saelens_expected_average_only_in_is_identity_but_noted(tmp_path):
    """From disk, SAELens applies no runtime normalisation for expected_average_only_in (the factor lives
    outside the files); the loader must match that and record the missing factor for `check`."""
    w = _weights(4)
    cfg = {
        **_V6,
        "d_in": D_IN,
        "d_sae": D_SAE,
        "architecture": "standard",
        "normalize_activations": "expected_average_only_in",
    }
    sae = SAE.load(_write_saelens(tmp_path / "ea", w, cfg))
    x = _inputs(4, w["b_dec"])
    _check(sae, x, *_saelens_reference(x, w, {**cfg, "normalize_activations": "none"}))
    assert sae.format_info.normalize_activations == "expected_average_only_in"


# ============================================================================ EleutherAI sparsify
def _sparsify_reference(x, sd, k):
    """sparsify/sparse_coder.py + fused_encoder.py: x − b_dec (not a transcoder), relu(F.linear(x, encoder.weight,
    encoder.bias)), topk(k) of the rectified pre-acts; decode Σ top_acts · W_dec[top_indices] + b_dec."""
    sd = _f64(sd)
    pre = (x.astype(np.float64) - sd["b_dec"]) @ sd["encoder.weight"].T + sd["encoder.bias"]
    codes = _relu_then_topk(pre, k)
    return codes, codes @ sd["W_dec"] + sd["b_dec"]


def _sparsify_fixture(
    path: pathlib.Path, *, num_latents: int = 0, expansion: int = D_SAE // D_IN, k: int = 6, d_sae: int | None = None
):
    d_sae = d_sae or (num_latents or expansion * D_IN)
    rng = _rng(5)
    enc = rng.standard_normal((d_sae, D_IN)).astype(np.float32)
    w_dec = rng.standard_normal((d_sae, D_IN))
    w_dec = (w_dec / np.linalg.norm(w_dec, axis=1, keepdims=True)).astype(np.float32)
    sd = {
        "encoder.weight": enc,
        "encoder.bias": (0.2 * rng.standard_normal(d_sae)).astype(np.float32),
        "W_dec": w_dec,
        "b_dec": (2 * rng.standard_normal(D_IN)).astype(np.float32),
    }
    cfg = {
        "activation": "topk",
        "expansion_factor": expansion,
        "normalize_decoder": True,
        "num_latents": num_latents,
        "k": k,
        "multi_topk": False,
        "skip_connection": False,
        "transcode": False,
        "d_in": D_IN,
    }
    path.mkdir(parents=True, exist_ok=True)
    save_numpy_safetensors(sd, str(path / "sae.safetensors"))
    (path / "cfg.json").write_text(json.dumps(cfg))
    return sd, cfg


@pytest.mark.parametrize("num_latents, expansion, n_lat", [(0, 3, 36), (40, 32, 40)])  # 0 means expansion × d_in
def test_sparsify_matches_reference(tmp_path, num_latents, expansion, n_lat):
    path = tmp_path / "layers.3"
    sd, cfg = _sparsify_fixture(path, num_latents=num_latents, expansion=expansion, d_sae=n_lat)
    assert detect_format(path) == "sparsify"
    sae = SAE.load(path)
    assert sae.cfg.d_sae == n_lat
    x = _inputs(5, sd["b_dec"])
    _check(sae, x, *_sparsify_reference(x, sd, cfg["k"]))


def test_sparsify_num_latents_inconsistent_with_weights(tmp_path):
    path = tmp_path / "bad"
    _sparsify_fixture(path, num_latents=0, expansion=4, d_sae=36)  # cfg says 4 × 12 = 48 latents, weights hold 36
    with pytest.raises(FormatError, match=r"48.*36|36.*48"):
        SAE.load(path)


def test_sparsify_transposed_decoder_refused(tmp_path):
    """A W_dec stored (d_in, d_sae) -- what SAELens 6.54's sparsify converter produces -- is not sparsify's layout."""
    path = tmp_path / "t"
    sd, cfg = _sparsify_fixture(path, num_latents=36, d_sae=36)
    sd["W_dec"] = np.ascontiguousarray(sd["W_dec"].T)
    save_numpy_safetensors(sd, str(path / "sae.safetensors"))
    with pytest.raises(FormatError, match=r"W_dec.*\(12, 36\).*\(36, 12\)"):
        SAE.load(path)


def test_sparsify_parent_directory_lists_hookpoints(tmp_path):
    _sparsify_fixture(tmp_path / "run" / "layers.0", num_latents=36, d_sae=36)
    _sparsify_fixture(tmp_path / "run" / "layers.1", num_latents=36, d_sae=36)
    with pytest.raises(FormatError, match=r"layers\.0.*layers\.1"):
        SAE.load(tmp_path / "run")


# ============================================================================ dictionary_learning
def _dl_reference(x, sd, dict_class):
    """dictionary_learning/dictionary.py, trainers/top_k.py, trainers/batch_top_k.py, trainers/matryoshka_batch_top_k.py.

    AutoEncoder: ReLU(encoder(x − bias)); decoder(f) + bias.       AutoEncoderNew: ReLU(encoder(x)); decoder(f) (+ its bias).
    AutoEncoderTopK: ReLU(encoder(x − b_dec)) then per-row top-k (use_threshold=False by default: threshold ignored).
    BatchTopKSAE / Matryoshka: ReLU(pre)·(ReLU(pre) > threshold), one global scalar (use_threshold=True by default).
    JumpReluAutoEncoder: x not shifted (apply_b_dec_to_input=False); f = ReLU(pre·(pre > θ)), no decoder-norm
    scaling (0.1.0 and main); decode f @ W_dec + b_dec.
    """
    s = _f64({k: v for k, v in sd.items() if k not in ("k", "group_sizes")})
    x = x.astype(np.float64)
    if dict_class == "AutoEncoder":
        f = _relu((x - s["bias"]) @ s["encoder.weight"].T + s["encoder.bias"])
        return f, f @ s["decoder.weight"].T + s["bias"]
    if dict_class == "AutoEncoderNew":
        f = _relu(x @ s["encoder.weight"].T + s["encoder.bias"])
        return f, f @ s["decoder.weight"].T + s["decoder.bias"]
    if dict_class == "AutoEncoderTopK":
        pre = (x - s["b_dec"]) @ s["encoder.weight"].T + s["encoder.bias"]
        f = _relu_then_topk(pre, int(sd["k"]))
        return f, f @ s["decoder.weight"].T + s["b_dec"]
    if dict_class == "BatchTopKSAE":
        post = _relu((x - s["b_dec"]) @ s["encoder.weight"].T + s["encoder.bias"])
        f = post * (post > s["threshold"])
        return f, f @ s["decoder.weight"].T + s["b_dec"]
    if dict_class == "MatryoshkaBatchTopKSAE":
        post = _relu((x - s["b_dec"]) @ s["W_enc"] + s["b_enc"])
        f = post * (post > s["threshold"])
        return f, f @ s["W_dec"] + s["b_dec"]
    if dict_class == "JumpReluAutoEncoder":
        pre = x @ s["W_enc"] + s["b_enc"]
        f = _relu(pre * (pre > s["threshold"]))
        return f, f @ s["W_dec"] + s["b_dec"]
    raise AssertionError(dict_class)


def _dl_state_dict(dict_class: str) -> dict:
    w = _weights(7)  # SAELens orientation; re-key into dictionary_learning's
    t = {k: torch.from_numpy(v) for k, v in w.items()}
    enc, dec = (
        t["W_enc"].T.contiguous(),
        t["W_dec"].T.contiguous(),
    )  # nn.Linear: encoder (d_sae, d_in), decoder (d_in, d_sae)
    if dict_class == "AutoEncoder":
        return {"bias": t["b_dec"], "encoder.weight": enc, "encoder.bias": t["b_enc"], "decoder.weight": dec}
    if dict_class == "AutoEncoderNew":
        return {"encoder.weight": enc, "encoder.bias": t["b_enc"], "decoder.weight": dec, "decoder.bias": t["b_dec"]}
    if dict_class in ("AutoEncoderTopK", "BatchTopKSAE"):
        thr = 2.5 if dict_class == "AutoEncoderTopK" else 0.8  # TopK must ignore its (large) stored threshold
        return {
            "k": torch.tensor(5, dtype=torch.int),
            "threshold": torch.tensor(thr),
            "decoder.weight": dec,
            "encoder.weight": enc,
            "encoder.bias": t["b_enc"],
            "b_dec": t["b_dec"],
        }
    if dict_class == "MatryoshkaBatchTopKSAE":
        return {
            "k": torch.tensor(5, dtype=torch.int),
            "threshold": torch.tensor(0.8),
            "group_sizes": torch.tensor([8, 12, 20]),
            "W_enc": t["W_enc"],
            "b_enc": t["b_enc"],
            "W_dec": t["W_dec"],
            "b_dec": t["b_dec"],
        }
    if dict_class == "JumpReluAutoEncoder":
        thr = torch.from_numpy((0.4 * _rng(8).uniform(0.5, 1.5, D_SAE)).astype(np.float32))
        return {"W_enc": t["W_enc"], "b_enc": t["b_enc"], "W_dec": t["W_dec"], "b_dec": t["b_dec"], "threshold": thr}
    raise AssertionError(dict_class)


_DL_TRAINERS = {
    "AutoEncoder": "StandardTrainer",
    "AutoEncoderNew": "StandardTrainerAprilUpdate",
    "AutoEncoderTopK": "TopKTrainer",
    "BatchTopKSAE": "BatchTopKTrainer",
    "MatryoshkaBatchTopKSAE": "MatryoshkaBatchTopKTrainer",
    "JumpReluAutoEncoder": "JumpReluTrainer",
}


@pytest.mark.parametrize("dict_class", list(_DL_TRAINERS))
@pytest.mark.parametrize("with_config", [True, False])
def test_dictionary_learning_matches_reference(tmp_path, dict_class, with_config):
    sd = _dl_state_dict(dict_class)
    path = tmp_path / dict_class.lower()
    path.mkdir()
    torch.save(sd, path / "ae.pt")
    if not with_config and dict_class in ("AutoEncoderTopK", "BatchTopKSAE"):
        # identical keys, different encodes: the class must come from config.json, never be guessed
        with pytest.raises(FormatError, match="AutoEncoderTopK.*BatchTopKSAE.*config.json"):
            SAE.load(path)
        return
    if with_config:
        trainer = {
            "trainer_class": _DL_TRAINERS[dict_class],
            "dict_class": dict_class,
            "activation_dim": D_IN,
            "dict_size": D_SAE,
            "layer": 3,
            "lm_name": "EleutherAI/pythia-70m-deduped",
        }
        if "k" in sd:
            trainer["k"] = int(sd["k"])
        (path / "config.json").write_text(json.dumps({"trainer": trainer, "buffer": {"d_submodule": D_IN}}))
    assert detect_format(path) == "dictionary_learning"
    sae = SAE.load(path)
    sd_np = {k: v.numpy() for k, v in sd.items()}
    bdec = sd_np.get("b_dec", sd_np.get("bias", sd_np.get("decoder.bias")))
    x = _inputs(7, bdec)
    _check(sae, x, *_dl_reference(x, sd_np, dict_class))


def test_dictionary_learning_batchtopk_threshold_is_global_scalar(tmp_path):
    """BatchTopK at inference: every code above the one stored scalar survives, whatever the row (so the
    number of active latents varies by row, unlike a per-row top-k with the training k = 5)."""
    sd = _dl_state_dict("BatchTopKSAE")
    torch.save(sd, tmp_path / "ae.pt")
    (tmp_path / "config.json").write_text(json.dumps({"trainer": {"dict_class": "BatchTopKSAE", "k": 5}}))
    sae = SAE.load(tmp_path / "ae.pt")
    x = _inputs(9, sd["b_dec"].numpy())
    with torch.no_grad():
        codes = sae.encode(_torch(x)).numpy()
    post = _relu(
        (x.astype(np.float64) - sd["b_dec"].numpy()) @ sd["encoder.weight"].numpy().T.astype(np.float64)
        + sd["encoder.bias"].numpy()
    )
    np.testing.assert_array_equal(codes > 0, post > 0.8)
    counts = (codes > 0).sum(1)
    assert counts.min() != counts.max() and set(counts.tolist()) != {5}


# ============================================================================ Gemma Scope params.npz
def _gemma_scope_reference(x, p):
    """Gemma Scope JumpReLUSAE (its tutorial's reference): pre = x @ W_enc + b_enc (no b_dec subtraction),
    acts = (pre > threshold)·ReLU(pre), recon = acts @ W_dec + b_dec."""
    p = _f64(p)
    pre = x.astype(np.float64) @ p["W_enc"] + p["b_enc"]
    acts = (pre > p["threshold"]) * _relu(pre)
    return acts, acts @ p["W_dec"] + p["b_dec"]


def test_gemma_scope_npz_matches_reference(tmp_path):
    p = _weights(11)
    p["threshold"] = (0.5 * _rng(12).uniform(0.5, 1.5, D_SAE)).astype(np.float32)
    folder = tmp_path / "layer_3" / "width_16k" / "average_l0_20"
    folder.mkdir(parents=True)
    np.savez(folder / "params.npz", **p)
    for path in (folder, folder / "params.npz"):
        assert detect_format(path) == "gemma_scope_npz"
        sae = SAE.load(path)
        x = _inputs(11, p["b_dec"])
        _check(sae, x, *_gemma_scope_reference(x, p))


# ============================================================================ OpenAI sparse_autoencoder
def _openai_reference(x, sd):
    """openai/sparse_autoencoder model.py: normalize = (activation == "TopK"); LN(x) (unbiased std, + eps);
    latents = activation(encoder(x − pre_bias) + latent_bias), TopK = topk of pre then ReLU;
    recons = (decoder(latents) + pre_bias)·std + mu."""
    s = _f64(
        {
            k: v
            for k, v in sd.items()
            if isinstance(v, (np.ndarray, torch.Tensor))
            and k in ("pre_bias", "latent_bias", "encoder.weight", "decoder.weight")
        }
    )
    x = x.astype(np.float64)
    topk = sd["activation"] == "TopK"
    if topk:
        x, mu, std = _layer_norm(x)
    pre = (x - s["pre_bias"]) @ s["encoder.weight"].T + s["latent_bias"]
    lat = _topk_then_relu(pre, sd["activation_state_dict"]["k"]) if topk else _relu(pre)
    rec = lat @ s["decoder.weight"].T + s["pre_bias"]
    return lat, (rec * std + mu) if topk else rec


def _openai_state_dict(activation: str) -> dict:
    w = _weights(13)
    sd = {
        "pre_bias": torch.from_numpy(0.3 * w["b_dec"]),
        "latent_bias": torch.from_numpy(w["b_enc"]),
        "encoder.weight": torch.from_numpy(w["W_enc"].T.copy()),
        "decoder.weight": torch.from_numpy(w["W_dec"].T.copy()),
        "stats_last_nonzero": torch.zeros(D_SAE, dtype=torch.long),
        "latents_activation_frequency": torch.ones(D_SAE),
        "latents_mean_square": torch.zeros(D_SAE),
        "activation": activation,
    }
    if activation == "TopK":
        sd["activation_state_dict"] = {"k": 6, "postact_fn": "ReLU"}
    return sd


@pytest.mark.parametrize("activation, spread", [("TopK", 3.0), ("TopK", 2e-4), ("ReLU", 3.0)])
def test_openai_matches_reference(tmp_path, activation, spread):
    sd = _openai_state_dict(activation)
    path = tmp_path / "v5_32k_layer_8.pt"
    torch.save(sd, path)
    assert detect_format(path) == "openai"
    sae = SAE.load(path)
    # residual-like rows: a per-row offset and spread that the LayerNorm removes; a tiny spread makes the
    # LayerNorm's eps (added to the std on the way in, not on the way out) visible in the reconstruction
    x = _inputs(13) * spread + (5.0 if spread > 1 else 1e-3)  # (a small offset keeps float32 exact enough)
    sd_np = {k: (v.numpy() if isinstance(v, torch.Tensor) else v) for k, v in sd.items()}
    _check(sae, x, *_openai_reference(x, sd_np), recon_scale=min(spread, 1.0))


# ============================================================================ round trip, safety, bad files
def test_saegeo_sae_saved_in_saelens_layout_loads_through_detection(tmp_path):
    """A few steps of the saegeo trainer write the SAELens layout; auto-detection loads it back identical."""
    from saegeo.sae.train import TrainConfig, train_sae

    data = torch.randn(3000, D_IN, generator=torch.Generator().manual_seed(0)) + 3.0
    cfg = TrainConfig(
        arch="topk",
        arch_options={"topk": {"k": 5}},
        d_sae=D_SAE,
        batch_tokens=256,
        total_tokens=2048,
        out_dir=str(tmp_path / "mine"),
        progress=False,
        b_dec_init_tokens=1000,
    )
    train_sae(cfg, data)
    assert detect_format(tmp_path / "mine") == "saelens"
    sae = SAE.load(tmp_path / "mine")  # the trainer's own reader
    loaded = SAE.load(tmp_path / "mine")
    assert (
        loaded.format_info.format == "saelens" and float(sae.b_dec.detach().norm()) > 5
    )  # b_dec := mean, ‖3·1‖ ≈ 10.4
    x = torch.randn(N_ROWS, D_IN) + sae.b_dec.detach()
    with torch.no_grad():
        assert torch.equal(loaded.encode(x), sae.encode(x))
        assert torch.allclose(loaded(x), sae(x), atol=1e-6)


def _touch(path: str) -> None:  # what a malicious pickle would run on load
    pathlib.Path(path).touch()


class _Payload:
    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (_touch, (self.marker,))


@pytest.mark.parametrize("filename", ["ae.pt", "openai.pt"])
def test_pickle_that_runs_code_is_refused(tmp_path, filename):
    marker = tmp_path / "pwned"
    sd = _dl_state_dict("AutoEncoder") if filename == "ae.pt" else _openai_state_dict("TopK")
    sd["extra"] = _Payload(str(marker))
    path = tmp_path / filename
    torch.save(sd, path)
    with pytest.raises(FormatError, match=r"weights_only|unsafe|refus"):
        SAE.load(path)
    assert not marker.exists()
    # the fixture is genuinely dangerous: an unrestricted load would have run it
    torch.load(path, weights_only=False)
    assert marker.exists()


def _truncate(path: pathlib.Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


@pytest.mark.parametrize("fmt", ["saelens", "sparsify", "dictionary_learning", "gemma_scope_npz", "openai"])
def test_truncated_files_get_clear_errors(tmp_path, fmt):
    if fmt == "saelens":
        w = _weights(1)
        path = _write_saelens(tmp_path / "s", w, {**_V6, "d_in": D_IN, "d_sae": D_SAE, "architecture": "standard"})
        victim = path / "sae_weights.safetensors"
    elif fmt == "sparsify":
        path = tmp_path / "sp"
        _sparsify_fixture(path, num_latents=36, d_sae=36)
        victim = path / "sae.safetensors"
    elif fmt == "dictionary_learning":
        path = tmp_path / "dl"
        path.mkdir()
        torch.save(_dl_state_dict("AutoEncoder"), path / "ae.pt")
        victim = path / "ae.pt"
    elif fmt == "gemma_scope_npz":
        p = _weights(11)
        p["threshold"] = np.ones(D_SAE, np.float32)
        path = tmp_path / "params.npz"
        np.savez(path, **p)
        victim = path
    else:
        path = tmp_path / "o.pt"
        torch.save(_openai_state_dict("TopK"), path)
        victim = path
    _truncate(victim)
    with pytest.raises(FormatError) as err:
        SAE.load(path)
    assert victim.name in str(err.value)


def test_wrong_shapes_name_the_tensor(tmp_path):
    w = _weights(1)
    w["W_dec"] = np.ascontiguousarray(w["W_dec"].T)  # (d_in, d_sae): transposed
    path = _write_saelens(tmp_path / "s", w, {**_V6, "d_in": D_IN, "d_sae": D_SAE, "architecture": "standard"})
    with pytest.raises(FormatError, match=r"W_dec.*\(12, 40\).*\(40, 12\)"):
        SAE.load(path)
    # a cfg that disagrees with the weights
    w = _weights(1)
    path = _write_saelens(tmp_path / "s2", w, {**_V6, "d_in": D_IN + 1, "d_sae": D_SAE, "architecture": "standard"})
    with pytest.raises(FormatError, match=r"d_in"):
        SAE.load(path)
    # a Gemma Scope npz with a missing threshold
    p = _weights(11)
    np.savez(tmp_path / "params.npz", **p)
    with pytest.raises(FormatError, match=r"threshold"):
        SAE.load(tmp_path / "params.npz")


def test_unknown_directory_says_what_was_found_and_expected(tmp_path):
    (tmp_path / "weights.bin").write_bytes(b"\0" * 16)
    (tmp_path / "notes.txt").write_text("hi")
    with pytest.raises(FormatError) as err:
        SAE.load(tmp_path)
    msg = str(err.value)
    assert "weights.bin" in msg and "notes.txt" in msg
    assert "sae_weights.safetensors" in msg and "params.npz" in msg and "ae.pt" in msg
    with pytest.raises(FormatError, match="does not exist"):
        SAE.load(tmp_path / "nope")


def test_unsupported_variant_is_named(tmp_path):
    """An architecture no module declares as its SAELens name (a skip transcoder: a second, linear path from input
    to output) is refused by name rather than loaded with wrong semantics (gated is read: tests/sae/test_gated.py)."""
    w = _weights(1)
    g = {"W_enc": w["W_enc"], "W_dec": w["W_dec"], "b_dec": w["b_dec"], "b_enc": w["b_enc"]}
    arch = {"architecture": "skip_transcoder"}
    path = _write_saelens(tmp_path / "g", g, {**_V6, "d_in": D_IN, "d_sae": D_SAE, **arch})
    with pytest.raises(FormatError, match="'skip_transcoder' is not supported: saegeo reads .*'gated'"):
        SAE.load(path)


# ============================================================================ bad counts in configs
def test_openai_topk_with_k_zero_is_refused_not_loaded_as_dense_relu(tmp_path):
    sd = _openai_state_dict("TopK")
    sd["activation_state_dict"] = {"k": 0, "postact_fn": "ReLU"}
    torch.save(sd, tmp_path / "k0.pt")
    with pytest.raises(
        FormatError,
        match=r"k0\.pt: TopK autoencoder needs an integer activation_state_dict\['k'\] "
        r"in \[1, d_sae=40\] \(found 0\)",
    ):
        SAE.load(tmp_path / "k0.pt")


_BAD_COUNTS = [("abc", "'abc'"), (12.5, "12.5"), (True, "True"), ("12", "'12'")]


@pytest.mark.parametrize("key", ["d_in", "d_sae", "k"])
@pytest.mark.parametrize("value, shown", _BAD_COUNTS)
def test_saelens_config_counts_that_are_not_integers_are_named(tmp_path, key, value, shown):
    cfg = {**_V6, "d_in": D_IN, "d_sae": D_SAE, "architecture": "topk", "k": 5, key: value}
    path = _write_saelens(tmp_path / "s", _weights(3), cfg)
    with pytest.raises(FormatError) as err:
        SAE.load(path)
    msg = str(err.value)
    assert str(path / "cfg.json") in msg and key in msg and shown in msg and "\n" not in msg, msg


@pytest.mark.parametrize("key", ["d_in", "num_latents", "expansion_factor", "k"])
@pytest.mark.parametrize("value, shown", _BAD_COUNTS)
def test_sparsify_config_counts_that_are_not_integers_are_named(tmp_path, key, value, shown):
    path = tmp_path / "layers.3"  # expansion_factor is read only when num_latents is 0
    _, cfg = _sparsify_fixture(path, num_latents=0 if key == "expansion_factor" else 36, expansion=3, d_sae=36)
    (path / "cfg.json").write_text(json.dumps({**cfg, key: value}))
    with pytest.raises(FormatError) as err:
        SAE.load(path)
    msg = str(err.value)
    assert str(path / "cfg.json") in msg and key in msg and shown in msg and "\n" not in msg, msg


@pytest.mark.parametrize("key", ["activation_dim", "dict_size", "k"])
@pytest.mark.parametrize("value, shown", _BAD_COUNTS)
def test_dictionary_learning_config_counts_that_are_not_integers_are_named(tmp_path, key, value, shown):
    torch.save(_dl_state_dict("AutoEncoderTopK"), tmp_path / "ae.pt")
    trainer = {"dict_class": "AutoEncoderTopK", "activation_dim": D_IN, "dict_size": D_SAE, "k": 5, key: value}
    (tmp_path / "config.json").write_text(json.dumps({"trainer": trainer}))
    with pytest.raises(FormatError) as err:
        SAE.load(tmp_path / "ae.pt")
    msg = str(err.value)
    assert str(tmp_path / "config.json") in msg and f"trainer.{key}" in msg and shown in msg and "\n" not in msg, msg


def test_dictionary_learning_k_buffer_that_is_not_a_whole_number_is_named(tmp_path):
    sd = _dl_state_dict("AutoEncoderTopK")
    sd["k"] = torch.tensor(5.5)
    torch.save(sd, tmp_path / "ae.pt")
    (tmp_path / "config.json").write_text(json.dumps({"trainer": {"dict_class": "AutoEncoderTopK"}}))
    with pytest.raises(FormatError, match=r"ae\.pt: k must be one integer >= 1, found 5\.5"):
        SAE.load(tmp_path / "ae.pt")
