"""Gemma Scope: params.npz (JumpReLU, no b_dec subtraction), and Gemma Scope 2: params.safetensors +
config.json (lowercase w_enc / w_dec, architecture jump_relu).
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

from saegeo.errors import FormatError
from saegeo.sae.architectures import SAEConfig
from saegeo.sae.formats.base import (
    Dictionary,
    FormatInfo,
    check_config,
    dtype_name,
    expect_shape,
    make_dictionary,
    matrix_shape,
    read_json,
    read_npz,
    read_safetensors,
    require_keys,
    schema_types,
)


def read_gemma_scope_npz(path: str | os.PathLike) -> Dictionary:
    """Gemma Scope `params.npz`: W_enc (d_in, d_sae), W_dec (d_sae, d_in), b_enc, b_dec, threshold (d_sae).
    JumpReLU: acts = [pre > θ]·relu(pre), pre = x @ W_enc + b_enc -- x is NOT shifted by b_dec."""
    p = Path(path)
    file = p / "params.npz" if p.is_dir() else p
    raw = read_npz(file)
    params = {("W_" + k[2:] if k.startswith("w_") else k): v for k, v in raw.items()}  # older files: w_enc, w_dec
    require_keys(file, params, ("W_enc", "W_dec", "b_enc", "b_dec", "threshold"), "a Gemma Scope JumpReLU SAE")
    d_in, d_sae = matrix_shape(file, "W_enc", params["W_enc"], "(d_in, d_sae)")
    implied = f"W_enc (d_in={d_in}, d_sae={d_sae})"
    for name, shape in (("W_dec", (d_sae, d_in)), ("b_enc", (d_sae,)), ("b_dec", (d_in,)), ("threshold", (d_sae,))):
        expect_shape(file, name, params[name], shape, implied)
    cfg = SAEConfig(
        d_in=int(d_in),
        d_sae=int(d_sae),
        activation="jumprelu",
        apply_b_dec_to_input=False,
        dtype="float32",
    )
    info = FormatInfo(
        format="gemma_scope_npz",
        source=str(file),
        source_dtype=dtype_name(params),
        hook_name="/".join(file.parent.parts[-3:]),
        exclude_special_tokens=True,
    )  # not trained on BOS
    tensors = {name: params[name] for name in ("W_enc", "W_dec", "b_enc", "b_dec", "threshold")}
    return make_dictionary(cfg, tensors, file, info)


@functools.cache
def gemma_scope_2_schema() -> type:
    """The keys of a Gemma Scope 2 config.json that saegeo reads. Other keys pass unread."""
    T = schema_types()

    class GemmaScope2Config(T.Config):
        architecture: T.Text = None
        model_name: T.Text = None
        hf_hook_point_in: T.Text = None
        hf_hook_point_out: T.Text = None

    return GemmaScope2Config


def _gemma_scope_2_tensors(file: Path, raw: dict) -> dict:
    params = {{"w_enc": "W_enc", "w_dec": "W_dec"}.get(k, k): v for k, v in raw.items()}
    require_keys(
        file,
        params,
        ("W_enc", "W_dec", "b_enc", "b_dec", "threshold"),
        "a Gemma Scope 2 JumpReLU SAE (lowercase w_enc, w_dec)",
    )
    if "affine_skip_connection" in params or params["W_dec"].ndim != 2:
        key = (
            "affine_skip_connection"
            if "affine_skip_connection" in params
            else f"w_dec of shape {tuple(params['W_dec'].shape)}"
        )
        raise FormatError(
            f"{file}: Gemma Scope 2 skip transcoder / cross-layer transcoder ({key}) is outside saegeo's encode "
            "contract; load an SAE or a plain transcoder folder"
        )
    return params


def read_gemma_scope_2(path: str | os.PathLike) -> Dictionary:
    """Gemma Scope 2 folder: params.safetensors (lowercase w_enc (d_in, d_sae), w_dec (d_sae, d_in); b_enc, b_dec,
    threshold) + config.json (architecture "jump_relu", model_name, hf_hook_point_in[, hf_hook_point_out]).
    Encode as Gemma Scope: acts = relu(pre)·[pre > θ], pre = x @ W_enc + b_enc (no b_dec subtraction);
    decode acts @ W_dec + b_dec. A config with hf_hook_point_out is a transcoder (it writes another activation)."""
    p = Path(path)
    d = p.parent if p.is_file() else p
    file, config_file = d / "params.safetensors", d / "config.json"
    raw_cfg = read_json(config_file) if config_file.is_file() else {}
    check_config(config_file, raw_cfg, gemma_scope_2_schema())
    if raw_cfg.get("architecture", "jump_relu") != "jump_relu":
        raise FormatError(
            f"{config_file}: Gemma Scope 2 architecture {raw_cfg.get('architecture')!r}; saegeo reads jump_relu"
        )
    params = _gemma_scope_2_tensors(file, read_safetensors(file))
    d_in, d_sae = matrix_shape(file, "w_enc", params["W_enc"], "(d_in, d_sae)")
    implied = f"w_enc (d_in={d_in}, d_sae={d_sae})"
    for name, shape in (("W_dec", (d_sae, d_in)), ("b_enc", (d_sae,)), ("b_dec", (d_in,)), ("threshold", (d_sae,))):
        expect_shape(file, name, params[name], shape, implied)
    cfg = SAEConfig(
        d_in=int(d_in), d_sae=int(d_sae), activation="jumprelu", apply_b_dec_to_input=False, dtype="float32"
    )
    info = FormatInfo(
        format="gemma_scope_2",
        source=str(d),
        source_dtype=dtype_name(params),
        model_name=raw_cfg.get("model_name"),
        hook_name=raw_cfg.get("hf_hook_point_in") or d.name,
        transcoder="hf_hook_point_out" in raw_cfg,
        exclude_special_tokens=True,
    )
    return make_dictionary(cfg, {k: params[k] for k in ("W_enc", "W_dec", "b_enc", "b_dec", "threshold")}, file, info)
