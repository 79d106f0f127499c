"""SAE files. Native format: a SAELens-6-compatible directory

    DIR/cfg.json                  SAELens keys (architecture, d_in, d_sae, k, apply_b_dec_to_input,
                                  normalize_activations, dtype, device, metadata{model_name, hook_name, ...})
                                  + a "saegeo" block: the exact SAEConfig, b_dec init, data identity,
                                  preprocessing, metrics
    DIR/sae_weights.safetensors   W_enc (d_in, d_sae), W_dec (d_sae, d_in), b_enc (d_sae), b_dec (d_in)
                                  [+ threshold (d_sae) for jumprelu]
    A BatchTopK SAE is saved for inference as SAELens saves its own: architecture "jumprelu" with the
    global threshold broadcast to every latent (relu(pre)·[relu(pre) > θ] = relu(pre)·[pre > θ_i], θ_i = θ);
    the saegeo block keeps trained_as = "batchtopk" and training_k.

`SAE.load_from_disk(DIR)` in SAELens gives the same encode/decode as `load_sae(DIR)` here
(checked in benchmarks/train_bench.py). Published-format loaders live further down this file.
"""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file
from safetensors.torch import save as safetensors_bytes

from saegeo.io import atomic_write, dump_json
from saegeo.errors import FormatError
from saegeo.sae.model import SAE, FormatInfo, SAEConfig

CFG_FILENAME = "cfg.json"
WEIGHTS_FILENAME = "sae_weights.safetensors"
# SAELens architecture name <-> saegeo activation
_TO_SAELENS_ARCH = {"relu": "standard", "topk": "topk", "jumprelu": "jumprelu", "batchtopk": "batchtopk"}
_FROM_SAELENS_ARCH = {"standard": "relu", "topk": "topk", "jumprelu": "jumprelu", "batchtopk": "batchtopk"}
SAEGEO_FORMAT_VERSION = 1


# =========================================================================== native (SAELens layout)
def save_sae(sae: SAE, path: str | os.PathLike, provenance: dict | None = None) -> Path:
    """Write `sae` as a SAELens-compatible directory (cfg.json + sae_weights.safetensors).

    provenance (b_dec init, data identity, preprocessing, metrics, ...) goes under cfg["saegeo"];
    `model`/`hook` found in provenance["data"] fill SAELens' metadata.model_name / hook_name.
    Both files are written to temporary names and renamed, weights first.
    """
    cfg = sae.cfg
    provenance = dict(provenance or {})
    if cfg.activation == "batchtopk":
        provenance.update(trained_as="batchtopk", training_k=cfg.k)
        cfg = SAEConfig(**{**cfg.to_dict(), "activation": "jumprelu", "k": None})
    if cfg.input_normalization != "none":
        raise FormatError(
            f"input_normalization={cfg.input_normalization!r} has no SAELens equivalent with identical "
            "semantics; save this SAE in its original format"
        )
    data = provenance.get("data", {}) or {}
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    tensors = {
        "W_enc": sae.W_enc.detach(), "W_dec": sae.W_dec.detach(),
        "b_enc": sae.b_enc.detach(), "b_dec": sae.b_dec.detach(),
    }
    if cfg.activation == "jumprelu":
        tensors["threshold"] = sae.threshold.detach().expand(cfg.d_sae)  # batchtopk: one θ for every latent
    meta = {
        "sae_lens_version": "6.0.0",  # the config layout written here (SAELens >= 6)
        "sae_lens_training_version": None,
        "model_name": data.get("model") or None,
        "hook_name": data.get("hook") or None,
        "hook_head_index": None,
        "prepend_bos": True,
        "context_size": data.get("context_size"),
        "dataset_path": (data.get("path") or None),
    }
    saelens_cfg = {
        "architecture": _TO_SAELENS_ARCH[cfg.activation],
        "d_in": cfg.d_in,
        "d_sae": cfg.d_sae,
        "dtype": cfg.dtype,
        "device": "cpu",
        "apply_b_dec_to_input": cfg.apply_b_dec_to_input,
        "normalize_activations": "none",
        "reshape_activations": "none",
        # older readers look for these at the top level
        "model_name": meta["model_name"],
        "hook_name": meta["hook_name"],
        "metadata": meta,
    }
    if cfg.activation == "topk":
        saelens_cfg["k"] = cfg.k
        saelens_cfg["rescale_acts_by_decoder_norm"] = cfg.rescale_acts_by_decoder_norm
    saelens_cfg["saegeo"] = {"format_version": SAEGEO_FORMAT_VERSION, "sae_config": cfg.to_dict(), **provenance}

    atomic_write(out / WEIGHTS_FILENAME, safetensors_bytes({k: v.contiguous().cpu() for k, v in tensors.items()}))
    dump_json(saelens_cfg, out / CFG_FILENAME, indent=2)
    return out


def load_sae(path: str | os.PathLike, device: str = "cpu") -> SAE:
    """Load a SAELens-layout directory: saegeo-written (its saegeo block restores the exact SAEConfig) or
    written by any SAELens version (see `_saelens_config`: older key names, apply_b_dec_to_input,
    normalize_activations, JumpReLU threshold / log_threshold, finetuning scaling factors).

    Architectures: standard (ReLU), topk, jumprelu. SAELens' TopK applies ReLU after TopK
    (topk_order "topk_then_relu").
    """
    d = Path(path)
    cfg_path, w_path = d / CFG_FILENAME, d / WEIGHTS_FILENAME
    if not cfg_path.is_file() or not w_path.is_file():
        found = sorted(p.name for p in d.iterdir()) if d.is_dir() else "no such directory"
        raise FormatError(f"{d}: expected {CFG_FILENAME} and {WEIGHTS_FILENAME} (SAELens layout); found {found}")
    raw, weights = _read_json(cfg_path), _read_safetensors(w_path)

    if isinstance(raw.get("saegeo", {}).get("sae_config"), dict):
        # files of saegeo 0.1.0 also hold the since-removed keys unit_norm_decoder and extra
        kept = {k: v for k, v in raw["saegeo"]["sae_config"].items() if k not in ("unit_norm_decoder", "extra")}
        cfg = SAEConfig(**kept)
        meta = raw.get("metadata") or {}
        info = FormatInfo(format="saelens", source=str(d), written_by="saegeo", model_name=meta.get("model_name"),
                          hook_name=meta.get("hook_name"), architecture=raw["saegeo"].get("trained_as"),
                          training_k=raw["saegeo"].get("training_k"))
    else:  # any SAELens version: older key names, normalisation, scaling factors (see _saelens_config)
        cfg, info = _saelens_config(raw, cfg_path, weights)
    tensors = _saelens_tensors(cfg, info, weights, w_path, bool(raw.get("finetuning_scaling_factor", False)))
    return _assemble(cfg, tensors, w_path, device, info)


# =========================================================================== published formats (issue 7)
#
# Each loader returns the one SAE contract of saegeo.sae.model with the format's own encode/decode,
# transcribed from the library's code (not guessed):
#
#   format               files                               x − b_dec first?      activation
#   saelens              cfg.json + sae_weights.safetensors  apply_b_dec_to_input  standard: ReLU; topk: TopK then ReLU;
#                                                                                  jumprelu: ReLU(pre)·[pre > θ]
#   sparsify             cfg.json + sae.safetensors          yes (not transcoders) ReLU then TopK
#   dictionary_learning  ae.pt [+ config.json]               per class, below      per class, below
#   gemma_scope_npz      params.npz                          no                    ReLU(pre)·[pre > θ]
#   openai               <name>.pt state dict                yes (pre_bias)        TopK then ReLU after a per-row
#                                                                                  LayerNorm (undone after decode) | ReLU
#
# Pickles are only read with torch.load(weights_only=True); anything else in them is refused.
# Variants whose encode is outside the contract (gated, groupmax, skip connections, matching pursuit)
# are refused by name rather than loaded with the wrong semantics.

_EXPECTED_LAYOUTS = (
    "saelens: cfg.json + sae_weights.safetensors; sparsify: cfg.json + sae.safetensors; "
    "dictionary_learning: ae.pt [+ config.json]; Gemma Scope: params.npz; OpenAI sparse_autoencoder: one .pt state dict"
)


def _read_json(file: Path) -> dict:
    try:
        raw = json.loads(file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise FormatError(f"{file}: cannot read JSON ({err}); the file is truncated or not a config") from None
    if not isinstance(raw, dict):
        raise FormatError(f"{file}: expected a JSON object, found {type(raw).__name__}")
    return raw


def _read_safetensors(file: Path) -> dict[str, torch.Tensor]:
    try:
        return load_file(str(file))
    except Exception as err:  # SafetensorError, OSError, ... : all mean "not a readable safetensors file"
        raise FormatError(f"{file}: cannot read safetensors ({err}); the file is truncated or not safetensors, download it again") from None


def _read_pickle(file: Path) -> dict:
    """torch.load with weights_only=True: tensors and plain containers only, never code."""
    try:
        obj = torch.load(file, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()] or [type(err).__name__]
        first = next((ln for ln in lines if "Unsupported" in ln or "GLOBAL" in ln), lines[-1])  # names the offending object
        raise FormatError(
            f"{file}: refused: the pickle holds objects other than tensors and plain containers, which could run code "
            f"on load (torch.load weights_only=True rejected it: {first[:200]}). If you trust its author, re-save it "
            "as a plain state dict or as safetensors."
        ) from None
    except Exception as err:  # truncated zip, EOF, not a torch file
        raise FormatError(f"{file}: cannot read ({type(err).__name__}: {str(err)[:200]}); the file is truncated or not a torch checkpoint, download it again") from None
    if not isinstance(obj, dict):
        raise FormatError(f"{file}: expected a state dict (a dict of tensors), found {type(obj).__name__}")
    # torch.compile'd modules save keys as "_orig_mod.<name>"
    return {k.removeprefix("_orig_mod."): v for k, v in obj.items()}


def _read_npz(file: Path) -> dict[str, torch.Tensor]:
    try:
        with np.load(file, allow_pickle=False) as data:
            return {key: torch.from_numpy(np.ascontiguousarray(data[key])) for key in data.files}  # each read is a fresh array
    except Exception as err:  # BadZipFile, ValueError (pickled arrays), EOFError, OSError
        raise FormatError(f"{file}: cannot read npz ({type(err).__name__}: {err}); the file is truncated or not an npz archive, download it again") from None


def _expect_shape(where: object, name: str, tensor: torch.Tensor, shape: tuple, implied_by: str) -> None:
    got = tuple(tensor.shape)
    if got != tuple(shape):
        hint = " (it looks transposed)" if len(shape) == 2 and got == tuple(reversed(shape)) else ""
        raise FormatError(f"{where}: {name} has shape {got}, expected {tuple(shape)} from {implied_by}{hint}")


def _require(where: object, tensors: dict, names: tuple[str, ...], what: str) -> None:
    missing = [n for n in names if n not in tensors]
    if missing:
        raise FormatError(f"{where}: missing {missing} for {what}; found keys {sorted(tensors)}")


def _assemble(cfg: SAEConfig, tensors: dict[str, torch.Tensor], where: object, device: str, info: FormatInfo) -> SAE:
    """Build the SAE from tensors already in the SAELens orientation, refusing non-finite weights."""
    sae = SAE(cfg, device=device, format_info=info)
    with torch.no_grad():
        for name, value in tensors.items():
            value = value.detach()
            if value.is_floating_point() and not torch.isfinite(value).all():
                bad = (~torch.isfinite(value)).reshape(value.shape[0], -1).any(1).nonzero()[:, 0] if value.ndim else [0]
                raise FormatError(f"{where}: {name} has non-finite values (first at index {int(bad[0])}, {len(bad)} in all)")
            target = getattr(sae, name)
            target.copy_(value.reshape(target.shape).to(target.dtype))
    return sae


def _dtype_name(tensors: dict) -> str:
    dtypes = sorted({str(t.dtype).removeprefix("torch.") for t in tensors.values() if isinstance(t, torch.Tensor) and t.is_floating_point()})
    return ",".join(dtypes)


# --------------------------------------------------------------------------- SAELens
_SAELENS_NORMALIZATIONS = {  # SAELens normalize_activations -> saegeo input_normalization at inference
    "none": "none",
    "expected_average_only_in": "none",  # a constant factor folded at from_pretrained time; not in the files
    "layer_norm": "layer_norm",
    "constant_norm_rescale": "constant_norm_rescale",
}


def _saelens_config(raw: dict, where: Path, weights: dict) -> tuple[SAEConfig, FormatInfo]:
    """SAELens cfg.json (6.x, or < 6: hook_point, activation_fn_str/activation_fn_kwargs, boolean
    normalize_activations, no architecture) -> SAEConfig, as sae_lens' handle_config_defaulting reads it."""
    meta = raw.get("metadata") or {}
    version = raw.get("sae_lens_version") or meta.get("sae_lens_version")
    arch = raw.get("architecture", "standard")
    act_fn = raw.get("activation_fn", raw.get("activation_fn_str", "relu"))
    fn_kwargs = raw.get("activation_fn_kwargs") or {}
    if arch == "standard" and act_fn == "topk":  # SAELens < 6 kept TopK inside the standard architecture
        arch = "topk"
    if arch not in ("standard", "topk", "jumprelu"):
        raise FormatError(
            f"{where}: SAELens architecture {arch!r} is not supported: saegeo reproduces standard, topk and jumprelu "
            "(gated SAEs have a separate gate path; batchtopk/matryoshka training checkpoints are saved by SAELens as jumprelu)"
        )
    if arch == "standard" and act_fn != "relu":
        raise FormatError(f"{where}: activation_fn {act_fn!r} is not supported for a standard SAE (expected relu)")
    norm = raw.get("normalize_activations", "none")
    if norm is None or isinstance(norm, bool):  # SAELens < 6: a boolean meant expected_average_only_in
        norm = "expected_average_only_in" if norm else "none"
    if norm not in _SAELENS_NORMALIZATIONS:
        raise FormatError(
            f"{where}: normalize_activations={norm!r} cannot be reproduced from the files; expected one of {list(_SAELENS_NORMALIZATIONS)}"
        )
    w_enc = weights.get("W_enc")
    if w_enc is None or w_enc.ndim != 2:
        raise FormatError(f"{where.parent / WEIGHTS_FILENAME}: no 2-D W_enc (d_in, d_sae); found {sorted(weights)}")
    d_in = int(raw["d_in"]) if raw.get("d_in") is not None else int(w_enc.shape[0])
    d_sae = int(raw["d_sae"]) if raw.get("d_sae") is not None else int(w_enc.shape[1])
    k = raw.get("k", fn_kwargs.get("k")) if arch == "topk" else None
    if arch == "topk" and not isinstance(k, int):
        raise FormatError(f"{where}: a topk SAE needs an integer k (cfg key 'k', or activation_fn_kwargs.k before SAELens 6); found {k!r}")
    cfg = SAEConfig(
        d_in=d_in, d_sae=d_sae, activation={"standard": "relu"}.get(arch, arch), k=k, topk_order="topk_then_relu",
        apply_b_dec_to_input=bool(raw.get("apply_b_dec_to_input", True)),
        rescale_acts_by_decoder_norm=bool(raw.get("rescale_acts_by_decoder_norm", False)),
        input_normalization=_SAELENS_NORMALIZATIONS[norm], dtype="float32",
    )
    info = FormatInfo(
        format="saelens", source=str(where.parent), sae_lens_version=version, architecture=arch,
        normalize_activations=norm, source_dtype=_dtype_name(weights),
        model_name=raw.get("model_name", meta.get("model_name")),
        hook_name=raw.get("hook_name", raw.get("hook_point", meta.get("hook_name"))),
    )
    return cfg, info


def _saelens_tensors(cfg: SAEConfig, info: FormatInfo, weights: dict, where: Path, scaling_factor_on: bool) -> dict[str, torch.Tensor]:
    """The state dict in the contract's names: log_threshold -> threshold; a finetuning scaling factor
    s (SAELens < 6 decodes (a·s) @ W_dec) folded into the decoder rows, W_dec[i] ·= s_i."""
    weights = dict(weights)
    if "log_threshold" in weights and "threshold" not in weights:
        weights["threshold"] = weights.pop("log_threshold").exp()
    implied = f"cfg.json d_in={cfg.d_in}, d_sae={cfg.d_sae}"
    shapes = {"W_enc": (cfg.d_in, cfg.d_sae), "W_dec": (cfg.d_sae, cfg.d_in), "b_enc": (cfg.d_sae,), "b_dec": (cfg.d_in,)}
    if cfg.activation in ("jumprelu", "batchtopk"):
        shapes["threshold"] = (cfg.d_sae,) if cfg.activation == "jumprelu" else (1,)
    _require(where, weights, tuple(shapes), f"a SAELens {info.architecture or cfg.activation} SAE")
    for name, shape in shapes.items():
        _expect_shape(where, name, weights[name], shape, implied)
    tensors = {name: weights[name] for name in shapes}
    scale = weights.get("scaling_factor", weights.get("finetuning_scaling_factor"))
    if scale is not None and not torch.allclose(scale.float(), torch.ones_like(scale.float())):
        if not scaling_factor_on:
            raise FormatError(f"{where}: holds a scaling_factor that is not all ones but cfg.json has finetuning_scaling_factor false; SAELens refuses this file too")
        _expect_shape(where, "scaling_factor", scale, (cfg.d_sae,), implied)
        tensors["W_dec"] = tensors["W_dec"].to(torch.float64) * scale.to(torch.float64)[:, None]
        info.folded_scaling_factor = {"min": float(scale.min()), "max": float(scale.max())}
    return tensors


def load_saelens(path: str | os.PathLike, device: str = "cpu") -> SAE:
    """A SAELens directory (any SAELens version), or one written by `save_sae`: see `load_sae`."""
    p = Path(path)
    return load_sae(p.parent if p.is_file() else p, device=device)


# --------------------------------------------------------------------------- EleutherAI sparsify
_SPARSIFY_UNSUPPORTED = ("skip_connection", "matching_pursuit", "slice_encoder", "slice_decoder", "encoder_pkm", "encoder_kron", "monet")


def load_sparsify(path: str | os.PathLike, device: str = "cpu") -> SAE:
    """sparsify `SparseCoder.load_from_disk` layout: cfg.json + sae.safetensors with encoder.weight (d_sae, d_in),
    encoder.bias (d_sae), W_dec (d_sae, d_in), b_dec (d_in). Encode: relu(encoder(x − b_dec)) then top-k
    (transcoders skip the b_dec subtraction); decode: Σ top_acts·W_dec[top_indices] + b_dec.
    num_latents = 0 in cfg.json means expansion_factor × d_in latents."""
    d = Path(path)
    d = d.parent if d.is_file() else d
    raw = _read_json(d / "cfg.json")
    weights_file = d / "sae.safetensors"
    weights = _read_safetensors(weights_file)
    if "d_in" not in raw:
        raise FormatError(f"{d / 'cfg.json'}: missing d_in (sparsify writes it next to the SparseCoderConfig fields)")
    d_in = int(raw["d_in"])
    if raw.get("activation", "topk") != "topk":
        raise FormatError(f"{d / 'cfg.json'}: sparsify activation {raw.get('activation')!r} is not supported (saegeo reproduces topk)")
    used = [key for key in _SPARSIFY_UNSUPPORTED if raw.get(key)] + (["W_skip"] if "W_skip" in weights else [])
    if used:
        raise FormatError(f"{d}: sparsify options {used} change the encode/decode beyond TopK; not supported")
    d_sae = int(raw.get("num_latents") or 0) or int(raw.get("expansion_factor", 32)) * d_in
    implied = f"cfg.json (d_in={d_in}, num_latents={raw.get('num_latents', 0)}, expansion_factor={raw.get('expansion_factor', 32)} -> {d_sae} latents)"
    _require(weights_file, weights, ("encoder.weight", "encoder.bias", "W_dec", "b_dec"), "a sparsify SAE")
    _expect_shape(weights_file, "encoder.weight", weights["encoder.weight"], (d_sae, d_in), implied)
    _expect_shape(weights_file, "encoder.bias", weights["encoder.bias"], (d_sae,), implied)
    _expect_shape(weights_file, "W_dec", weights["W_dec"], (d_sae, d_in), implied)
    _expect_shape(weights_file, "b_dec", weights["b_dec"], (d_in,), implied)
    transcoder = bool(raw.get("transcode", False))
    cfg = SAEConfig(
        d_in=d_in, d_sae=d_sae, activation="topk", k=int(raw.get("k", 32)), topk_order="relu_then_topk",
        apply_b_dec_to_input=not transcoder, dtype="float32",
    )
    info = FormatInfo(format="sparsify", source=str(d), transcoder=transcoder, source_dtype=_dtype_name(weights),
                      normalize_decoder=bool(raw.get("normalize_decoder", True)), hook_name=d.name)
    tensors = {"W_enc": weights["encoder.weight"].T, "b_enc": weights["encoder.bias"], "W_dec": weights["W_dec"], "b_dec": weights["b_dec"]}
    return _assemble(cfg, tensors, weights_file, device, info)


# --------------------------------------------------------------------------- dictionary_learning
# dict_class -> (activation, subtracts b_dec before encoding, state-dict keys). From dictionary.py and trainers/.
_DL_CLASSES = {
    "AutoEncoder": ("relu", True, ("bias", "encoder.weight", "encoder.bias", "decoder.weight")),
    "AutoEncoderNew": ("relu", False, ("encoder.weight", "encoder.bias", "decoder.weight", "decoder.bias")),
    "AutoEncoderTopK": ("topk", True, ("encoder.weight", "encoder.bias", "decoder.weight", "b_dec", "k")),
    "BatchTopKSAE": ("batchtopk", True, ("encoder.weight", "encoder.bias", "decoder.weight", "b_dec", "k", "threshold")),
    "MatryoshkaBatchTopKSAE": ("batchtopk", True, ("W_enc", "b_enc", "W_dec", "b_dec", "k", "threshold", "group_sizes")),
    "JumpReluAutoEncoder": ("jumprelu", False, ("W_enc", "b_enc", "W_dec", "b_dec", "threshold")),
}
_DL_UNSUPPORTED = {"GatedAutoEncoder": "gated (separate gate and magnitude paths)", "CrossCoder": "a crosscoder (several layers)"}


def _dictionary_learning_class(state: dict, where: Path) -> str:
    keys = set(state)
    if {"r_mag", "gate_bias", "mag_bias"} <= keys:
        return "GatedAutoEncoder"
    if "group_sizes" in keys:
        return "MatryoshkaBatchTopKSAE"
    if {"W_enc", "threshold"} <= keys and "k" not in keys:
        return "JumpReluAutoEncoder"
    if "bias" in keys and "decoder.bias" not in keys:
        return "AutoEncoder"
    if "decoder.bias" in keys:
        return "AutoEncoderNew"
    if {"k", "threshold", "encoder.weight"} <= keys:
        raise FormatError(
            f"{where}: these keys fit both AutoEncoderTopK (per-row top-k, stored threshold ignored) and BatchTopKSAE "
            "(one global threshold), which encode differently; put the training config.json (with trainer.dict_class) next to it"
        )
    raise FormatError(f"{where}: keys {sorted(keys)} match no dictionary_learning class; expected one of {sorted(_DL_CLASSES)}")


def load_dictionary_learning(path: str | os.PathLike, device: str = "cpu") -> SAE:
    """dictionary_learning `ae.pt` (+ `config.json` whose trainer.dict_class names the class). nn.Linear layout:
    encoder.weight (d_sae, d_in), decoder.weight (d_in, d_sae); `bias` is b_dec in AutoEncoder.

    AutoEncoder: relu(encoder(x − bias)), decoder(f) + bias.  AutoEncoderNew: relu(encoder(x)), decoder(f) + decoder.bias.
    AutoEncoderTopK: relu(encoder(x − b_dec)) then per-row top-k; the stored threshold is ignored (use_threshold=False).
    BatchTopKSAE / Matryoshka: relu(pre)·[relu(pre) > threshold], one global scalar (use_threshold=True by default).
    JumpReluAutoEncoder: no b_dec subtraction; f = relu(pre·[pre > θ])·‖W_dec,i‖ and decode (f/‖W_dec,i‖) @ W_dec + b_dec,
    i.e. exactly an SAE with the decoder norms folded into the encoder (done here, so codes match f).
    """
    p = Path(path)
    pt = p / "ae.pt" if p.is_dir() else p
    if not pt.is_file():
        raise FormatError(f"{p}: no ae.pt found (dictionary_learning saves ae.pt next to config.json)")
    config_file = pt.parent / "config.json"
    trainer = (_read_json(config_file).get("trainer") or {}) if config_file.is_file() else {}
    state = _read_pickle(pt)
    dict_class = trainer.get("dict_class") or _dictionary_learning_class(state, pt)
    if dict_class in _DL_UNSUPPORTED:
        raise FormatError(f"{pt}: dictionary_learning {dict_class} is {_DL_UNSUPPORTED[dict_class]}; not in saegeo's encode contract")
    if dict_class not in _DL_CLASSES:
        raise FormatError(f"{pt}: dictionary_learning dict_class {dict_class!r} is not supported; expected one of {sorted(_DL_CLASSES)}")
    activation, subtract_b_dec, keys = _DL_CLASSES[dict_class]
    _require(pt, state, keys, f"dictionary_learning {dict_class}")
    t = {k: v for k, v in state.items() if isinstance(v, torch.Tensor)}
    if "W_enc" in keys:  # nn.Parameter layout: W_enc (d_in, d_sae), W_dec (d_sae, d_in)
        d_in, d_sae = t["W_enc"].shape
        tensors = {"W_enc": t["W_enc"], "b_enc": t["b_enc"], "W_dec": t["W_dec"], "b_dec": t["b_dec"]}
    else:  # nn.Linear layout: encoder.weight (d_sae, d_in), decoder.weight (d_in, d_sae)
        d_sae, d_in = t["encoder.weight"].shape
        b_dec = t["bias"] if dict_class == "AutoEncoder" else t["decoder.bias"] if dict_class == "AutoEncoderNew" else t["b_dec"]
        tensors = {"W_enc": t["encoder.weight"].T, "b_enc": t["encoder.bias"], "W_dec": t["decoder.weight"].T, "b_dec": b_dec}
    implied = f"{'W_enc' if 'W_enc' in keys else 'encoder.weight'} (d_in={d_in}, d_sae={d_sae})"
    for name, expected in (("activation_dim", d_in), ("dict_size", d_sae)):
        if name in trainer and int(trainer[name]) != expected:
            raise FormatError(f"{config_file}: trainer.{name}={trainer[name]} but {pt.name} holds {implied}")
    _expect_shape(pt, "W_dec" if "W_dec" in keys else "decoder.weight.T", tensors["W_dec"], (d_sae, d_in), implied)
    _expect_shape(pt, "b_enc" if "b_enc" in keys else "encoder.bias", tensors["b_enc"], (d_sae,), implied)
    _expect_shape(pt, "b_dec", tensors["b_dec"], (d_in,), implied)
    k = int(t["k"]) if "k" in t else None
    if k is not None and "k" in trainer and int(trainer["k"]) != k:
        raise FormatError(f"{pt}: k={k} in the weights but trainer.k={trainer['k']} in {config_file.name}")
    info = FormatInfo(format="dictionary_learning", source=str(pt), dict_class=dict_class, source_dtype=_dtype_name(t),
                      trainer_class=trainer.get("trainer_class"), model_name=trainer.get("lm_name"),
                      hook_name=trainer.get("submodule_name") or (f"layer {trainer['layer']}" if "layer" in trainer else None))
    if activation == "jumprelu":
        _expect_shape(pt, "threshold", t["threshold"], (d_sae,), implied)
        tensors["threshold"] = t["threshold"]
    elif activation == "batchtopk":
        if t["threshold"].numel() != 1:
            raise FormatError(f"{pt}: {dict_class} threshold must be one scalar, found shape {tuple(t['threshold'].shape)}")
        tensors["threshold"] = t["threshold"].reshape(1)
        info.threshold = float(t["threshold"])
        info.threshold_unset = info.threshold < 0  # -1 = never updated in training: every ReLU code passes (dense)
    elif activation == "topk":
        info.stored_threshold_ignored = float(t["threshold"]) if "threshold" in t else None
    if dict_class == "MatryoshkaBatchTopKSAE":
        sizes = [int(s) for s in t["group_sizes"].reshape(-1)]
        if sum(sizes) != d_sae:
            raise FormatError(f"{pt}: group_sizes {sizes} sum to {sum(sizes)}, not dict_size {d_sae}")
        info.group_sizes = sizes
    cfg = SAEConfig(
        d_in=int(d_in), d_sae=int(d_sae), activation=activation, k=k if activation == "topk" else None,
        topk_order="relu_then_topk", apply_b_dec_to_input=subtract_b_dec, dtype="float32",
    )
    if k is not None and activation != "topk":
        info.training_k = k
    sae = _assemble(cfg, tensors, pt, device, info)
    if activation == "jumprelu":
        sae.fold_decoder_norms()  # exact for JumpReLU; makes encode() return dictionary_learning's norm-scaled codes
        info.decoder_norms_folded = True
    return sae


# --------------------------------------------------------------------------- Gemma Scope
def load_gemma_scope_npz(path: str | os.PathLike, device: str = "cpu") -> SAE:
    """Gemma Scope `params.npz`: W_enc (d_in, d_sae), W_dec (d_sae, d_in), b_enc, b_dec, threshold (d_sae).
    JumpReLU: acts = [pre > θ]·relu(pre), pre = x @ W_enc + b_enc -- x is NOT shifted by b_dec."""
    p = Path(path)
    file = p / "params.npz" if p.is_dir() else p
    raw = _read_npz(file)
    params = {("W_" + k[2:] if k.startswith("w_") else k): v for k, v in raw.items()}  # older files: w_enc, w_dec
    _require(file, params, ("W_enc", "W_dec", "b_enc", "b_dec", "threshold"), "a Gemma Scope JumpReLU SAE")
    if params["W_enc"].ndim != 2:
        raise FormatError(f"{file}: W_enc must be 2-D (d_in, d_sae), found shape {tuple(params['W_enc'].shape)}")
    d_in, d_sae = params["W_enc"].shape
    implied = f"W_enc (d_in={d_in}, d_sae={d_sae})"
    for name, shape in (("W_dec", (d_sae, d_in)), ("b_enc", (d_sae,)), ("b_dec", (d_in,)), ("threshold", (d_sae,))):
        _expect_shape(file, name, params[name], shape, implied)
    cfg = SAEConfig(
        d_in=int(d_in), d_sae=int(d_sae), activation="jumprelu", apply_b_dec_to_input=False, dtype="float32",
    )
    info = FormatInfo(format="gemma_scope_npz", source=str(file), source_dtype=_dtype_name(params),
                      hook_name="/".join(file.parent.parts[-3:]))
    tensors = {name: params[name] for name in ("W_enc", "W_dec", "b_enc", "b_dec", "threshold")}
    return _assemble(cfg, tensors, file, device, info)


# --------------------------------------------------------------------------- OpenAI sparse_autoencoder
def load_openai(path: str | os.PathLike, device: str = "cpu") -> SAE:
    """openai/sparse_autoencoder `Autoencoder.from_state_dict`: pre_bias (d_in), encoder.weight (d_sae, d_in),
    latent_bias (d_sae), decoder.weight (d_in, d_sae), activation "TopK" (k in activation_state_dict) or "ReLU".
    latents = act(encoder(x' − pre_bias) + latent_bias), recons = (decoder(latents) + pre_bias)·std + mu, where
    x' = LN(x) = (x − mu)/(std + 1e-5) per row and is applied iff activation == "TopK" (as from_state_dict does)."""
    file = Path(path)
    state = _read_pickle(file)
    _require(file, state, ("pre_bias", "latent_bias", "encoder.weight"), "an OpenAI sparse_autoencoder state dict")
    activation = state.get("activation", "ReLU")
    if activation not in ("TopK", "ReLU"):
        raise FormatError(f"{file}: OpenAI activation {activation!r} is not supported (expected TopK or ReLU)")
    enc = state["encoder.weight"]
    d_sae, d_in = enc.shape
    implied = f"encoder.weight (d_sae={d_sae}, d_in={d_in})"
    if "decoder.weight" in state:
        _expect_shape(file, "decoder.weight", state["decoder.weight"], (d_in, d_sae), implied)
        w_dec = state["decoder.weight"].T
    elif "decoder.linear.weight" in state:  # tied: decoder = encoder transposed
        w_dec = enc
    else:
        raise FormatError(f"{file}: missing decoder.weight (or decoder.linear.weight for a tied autoencoder); found {sorted(state)}")
    _expect_shape(file, "pre_bias", state["pre_bias"], (d_in,), implied)
    _expect_shape(file, "latent_bias", state["latent_bias"], (d_sae,), implied)
    k = None
    if activation == "TopK":
        act_state = state.get("activation_state_dict") or {}
        k, post = act_state.get("k"), act_state.get("postact_fn", "ReLU")
        if not isinstance(k, int):
            raise FormatError(f"{file}: TopK autoencoder without an integer activation_state_dict['k'] (found {k!r})")
        if post != "ReLU":
            raise FormatError(f"{file}: TopK postact_fn {post!r} gives signed codes; saegeo's contract needs ReLU")
    cfg = SAEConfig(
        d_in=int(d_in), d_sae=int(d_sae), activation="topk" if k else "relu", k=k, topk_order="topk_then_relu",
        apply_b_dec_to_input=True,
        input_normalization="layer_norm" if activation == "TopK" else "none", layer_norm_eps=1e-5, dtype="float32",
    )
    info = FormatInfo(format="openai", source=str(file), openai_activation=activation, source_dtype=_dtype_name(state),
                      hook_name=file.stem)
    tensors = {"W_enc": enc.T, "b_enc": state["latent_bias"], "W_dec": w_dec, "b_dec": state["pre_bias"]}
    return _assemble(cfg, tensors, file, device, info)


# --------------------------------------------------------------------------- detection
def _detect_file(p: Path) -> str:
    name = p.name
    if name.endswith(".npz"):
        return "gemma_scope_npz"
    if name in (WEIGHTS_FILENAME, "sae.safetensors", CFG_FILENAME, "config.json"):
        return _detect_dir(p.parent)
    if p.suffix in (".pt", ".pth", ".ckpt"):
        if (p.parent / "config.json").is_file() and "trainer" in _read_json(p.parent / "config.json"):
            return "dictionary_learning"
        keys = set(_read_pickle(p))
        if {"pre_bias", "latent_bias"} & keys:
            return "openai"
        if keys & {"encoder.weight", "W_enc", "decoder.weight", "W_dec"}:
            return "dictionary_learning"
        raise FormatError(f"{p}: a state dict with keys {sorted(keys)[:12]} matches no known dictionary; expected {_EXPECTED_LAYOUTS}")
    raise FormatError(f"{p}: unknown dictionary file type; expected {_EXPECTED_LAYOUTS}")


def _detect_dir(d: Path) -> str:
    names = {p.name for p in d.iterdir()}
    if CFG_FILENAME in names and WEIGHTS_FILENAME in names:
        return "saelens"
    if CFG_FILENAME in names and "sae.safetensors" in names:
        return "sparsify"
    if "ae.pt" in names:
        return "dictionary_learning"
    if "params.npz" in names:
        return "gemma_scope_npz"
    pts = sorted(n for n in names if n.endswith((".pt", ".pth")))
    if len(pts) == 1:
        return _detect_file(d / pts[0])
    nested = []
    for sub in sorted(p for p in d.iterdir() if p.is_dir()):
        try:
            nested.append(f"{sub.name} ({_detect_dir(sub)})")
        except FormatError:
            continue
    if nested:
        raise FormatError(f"{d} holds {len(nested)} dictionaries: {', '.join(nested[:20])}{' ...' if len(nested) > 20 else ''}; pass one of them")
    raise FormatError(f"{d}: found {sorted(names)[:30] or 'an empty directory'}, which matches no dictionary layout; expected {_EXPECTED_LAYOUTS}")


def detect_format(path: str | os.PathLike) -> str:
    """The published format of a dictionary file or directory, one of the keys of _LOADERS, from the file names
    and (for a lone .pt) its keys; FormatError says what was found and what was expected."""
    p = Path(path)
    if not p.exists():
        raise FormatError(f"{p}: does not exist")
    return _detect_file(p) if p.is_file() else _detect_dir(p)


_LOADERS = {
    "saelens": load_saelens, "sparsify": load_sparsify, "dictionary_learning": load_dictionary_learning,
    "gemma_scope_npz": load_gemma_scope_npz, "openai": load_openai,
}


def load_dictionary(path: str | os.PathLike, device: str = "cpu") -> SAE:
    """Load a dictionary in any supported published format (auto-detected) as a saegeo SAE whose encode/decode
    reproduces its library's. `sae.format_info` records the format, the source and config facts `saegeo check` reads."""
    return _LOADERS[detect_format(path)](path, device=device)
