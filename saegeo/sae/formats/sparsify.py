"""EleutherAI sparsify: cfg.json + sae.safetensors (`SparseCoder.save_to_disk`).

W_dec and encoder.weight are both (d_sae, d_in); b_dec is subtracted before encoding (not by transcoders),
ReLU then TopK; with ``signed: true`` (an option older sparsify releases had; 1.3.3 no longer has it) the top k of
|pre| with their signs, read as abstopk (saegeo/sae/architectures/abstopk.py). (SAELens 6.54's sparsify converter transposes W_dec and drops the b_dec subtraction: not
copied here.)
"""

from __future__ import annotations

import dataclasses
import functools
import os
from dataclasses import dataclass
from pathlib import Path

from saegeo.errors import FormatError
from saegeo.sae.architectures import SAEConfig, by_saved_name
from saegeo.sae.formats.format_reader import Dictionary, FormatInfo, FormatReader, register_format
from saegeo.sae.formats.reader_checks import (
    check_config,
    count_field,
    dtype_name,
    expect_shape,
    make_dictionary,
    require_keys,
    schema_types,
)
from saegeo.sae.formats.weight_files import read_json, read_safetensors


@dataclass
class SparsifyFacts:
    """What a sparsify cfg.json records that no other format does (FormatInfo.facts)."""

    normalize_decoder: bool | None = None


_SPARSIFY_UNSUPPORTED = (
    "skip_connection",
    "matching_pursuit",
    "slice_encoder",
    "slice_decoder",
    "encoder_pkm",
    "encoder_kron",
    "monet",
)


@functools.cache
def sparsify_schema() -> type:
    """The keys of a sparsify cfg.json that saegeo reads (SparseCoderConfig + d_in): counts, the activation name
    and every switch (a string "false" would be truthy where sparsify tests the switch). Other keys pass unread."""
    T = schema_types()
    switches = {key: (T.OptFlag, None) for key in ("signed", "transcode", "normalize_decoder", *_SPARSIFY_UNSUPPORTED)}
    from pydantic import create_model

    return create_model(
        "SparsifyConfig",
        __base__=T.Config,
        d_in=(T.Count | None, None),
        num_latents=(T.Size | None, None),
        expansion_factor=(T.Count | None, None),
        k=(T.Count | None, None),
        activation=(T.Text, None),
        **switches,
    )


def read_sparsify(path: str | os.PathLike) -> Dictionary:
    """sparsify `SparseCoder.load_from_disk` layout: cfg.json + sae.safetensors with encoder.weight (d_sae, d_in),
    encoder.bias (d_sae), W_dec (d_sae, d_in), b_dec (d_in). Encode: relu(encoder(x − b_dec)) then top-k
    (transcoders skip the b_dec subtraction); decode: Σ top_acts·W_dec[top_indices] + b_dec.
    num_latents = 0 in cfg.json means expansion_factor × d_in latents."""
    d = Path(path)
    d = d.parent if d.is_file() else d
    raw = read_json(d / "cfg.json")
    weights_file = d / "sae.safetensors"
    weights = read_safetensors(weights_file)
    return sparsify_state_dictionary(raw, weights, d / "cfg.json", weights_file, str(d), hook_name=d.name)


def sparsify_state_dictionary(
    raw: dict, weights: dict, cfg_file: object, weights_file: object, source: str, hook_name: str | None = None
) -> Dictionary:
    """sparsify's cfg.json (`{**SparseCoderConfig.to_dict(), "d_in": d_in}`, what `save_to_disk` writes) and its
    state dict (a file's, or a SparseCoder's `state_dict()` in memory) -> the Dictionary (see read_sparsify)."""
    if "d_in" not in raw:
        raise FormatError(f"{cfg_file}: missing d_in (sparsify writes it next to the SparseCoderConfig fields)")
    check_config(cfg_file, raw, sparsify_schema())
    d_in = count_field(cfg_file, raw, "d_in")
    # signed: true (the top k of |pre|, signs kept) is its own architecture, read under the name "signed topk"
    activation = ("signed " if raw.get("signed") else "") + str(raw.get("activation", "topk"))
    if by_saved_name("sparsify", activation) is None:
        raise FormatError(f"{cfg_file}: sparsify activation {activation!r} is not supported (saegeo reproduces topk)")
    used = [key for key in _SPARSIFY_UNSUPPORTED if raw.get(key)] + (["W_skip"] if "W_skip" in weights else [])
    if used:
        raise FormatError(f"{source}: sparsify options {used} change the encode/decode beyond TopK; not supported")
    num_latents = count_field(cfg_file, raw, "num_latents", 0, minimum=0) if raw.get("num_latents") is not None else 0
    d_sae = num_latents or count_field(cfg_file, raw, "expansion_factor", 32) * d_in
    k = count_field(cfg_file, raw, "k", 32)
    if k > d_sae:
        raise FormatError(f"{cfg_file}: k={k} exceeds the {d_sae} latents")
    implied = f"cfg.json (d_in={d_in}, num_latents={raw.get('num_latents', 0)}, expansion_factor={raw.get('expansion_factor', 32)} -> {d_sae} latents)"
    require_keys(weights_file, weights, ("encoder.weight", "encoder.bias", "W_dec", "b_dec"), "a sparsify SAE")
    expect_shape(weights_file, "encoder.weight", weights["encoder.weight"], (d_sae, d_in), implied)
    expect_shape(weights_file, "encoder.bias", weights["encoder.bias"], (d_sae,), implied)
    expect_shape(weights_file, "W_dec", weights["W_dec"], (d_sae, d_in), implied)
    expect_shape(weights_file, "b_dec", weights["b_dec"], (d_in,), implied)
    transcoder = bool(raw.get("transcode", False))
    cfg = SAEConfig(
        d_in=d_in,
        d_sae=d_sae,
        activation=by_saved_name("sparsify", activation).name,
        k=k,
        topk_order="relu_then_topk",
        apply_b_dec_to_input=not transcoder,
        dtype="float32",
    )
    info = FormatInfo(
        format="sparsify",
        source=source,
        transcoder=transcoder,
        source_dtype=dtype_name(weights),
        facts=SparsifyFacts(normalize_decoder=bool(raw.get("normalize_decoder", True))),
        hook_name=hook_name,
    )
    tensors = {
        "W_enc": weights["encoder.weight"].T,
        "b_enc": weights["encoder.bias"],
        "W_dec": weights["W_dec"],
        "b_dec": weights["b_dec"],
    }
    return make_dictionary(cfg, tensors, weights_file, info)


def read_sparsify_object(obj) -> Dictionary | None:
    """A sparsify SparseCoder in memory (obj.cfg a SparseCoderConfig, obj.d_in, obj.encoder an nn.Linear, W_dec,
    b_dec) -> what `save_to_disk` would give ({**cfg.to_dict(), "d_in": d_in} and the state dict); None otherwise."""
    cfg = getattr(obj, "cfg", None)
    if cfg is None or not all(hasattr(obj, a) for a in ("state_dict", "encoder", "W_dec", "d_in")):
        return None
    where = f"in memory: {type(obj).__name__}"
    raw_cfg = cfg.to_dict() if hasattr(cfg, "to_dict") else dataclasses.asdict(cfg)
    state = {k: v.detach().cpu() for k, v in obj.state_dict().items()}
    return sparsify_state_dictionary({**raw_cfg, "d_in": obj.d_in}, state, where, where, where)


register_format(
    FormatReader(
        name="sparsify",
        read=read_sparsify,
        layout="sparsify: cfg.json + sae.safetensors",
        files=("cfg.json", "sae.safetensors"),
        facts=SparsifyFacts,
        conversions=("sparsify",),
        read_object=read_sparsify_object,
        object_kinds="sparsify's SparseCoder (cfg, d_in, encoder, W_dec, b_dec)",
        priority=20,
    )
)
