"""Gemma Scope: params.npz (JumpReLU, no b_dec subtraction), and Gemma Scope 2: params.safetensors +
config.json (lowercase w_enc / w_dec, architecture jump_relu).
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

from saegeo.errors import FormatError
from saegeo.sae.architectures import SAEConfig
from saegeo.sae.formats.format_reader import Dictionary, FormatInfo, FormatReader, register_format
from saegeo.sae.formats.hub import release_entry
from saegeo.sae.formats.reader_checks import (
    check_config,
    dtype_name,
    expect_shape,
    make_dictionary,
    matrix_shape,
    require_keys,
    schema_types,
)
from saegeo.sae.formats.weight_files import read_json, read_npz, read_safetensors


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


_GEMMA_2_HOOKS = {
    "res": "blocks.{layer}.hook_resid_post",
    "mlp": "blocks.{layer}.hook_mlp_out",
    "att": "blocks.{layer}.attn.hook_z",
}


def _gemma_scope_releases() -> dict[str, dict]:
    """Gemma Scope's releases (SAELens conversion gemma_2): every sae_id is its own path (layer_N/width_W/...)."""
    table = {}
    for size in ("2b", "9b", "27b"):
        for site, hook in _GEMMA_2_HOOKS.items():
            if size == "27b" and site != "res":  # not released (absent from SAELens' registry too)
                continue
            table[f"gemma-scope-{size}-pt-{site}"] = release_entry(
                f"google/gemma-scope-{size}-pt-{site}", f"google/gemma-2-{size}", "gemma_2", hook=hook
            )
    table["gemma-scope-9b-it-res"] = release_entry(
        "google/gemma-scope-9b-it-res", "google/gemma-2-9b-it", "gemma_2", hook=_GEMMA_2_HOOKS["res"]
    )
    return table


def _gemma_scope_2_releases() -> dict[str, dict]:
    """Gemma Scope 2's releases (SAELens conversion gemma_3): sae_id layer_12_width_16k_l0_medium lies in the
    site's folder (resid_post/layer_12_...)."""
    folders = {"res": "resid_post", "mlp": "mlp_out", "att": "attn_out"}
    hooks = {"res": "blocks.{layer}.hook_resid_post", "mlp": "blocks.{layer}.hook_mlp_out", "att": None}
    table = {}
    for size in ("270m", "1b", "4b", "12b", "27b"):
        for variant in ("pt", "it"):
            for site, folder in folders.items():
                for suffix, sub in (("", folder), ("-all", f"{folder}_all")):
                    if (size, variant) == ("27b", "pt") and site != "res":  # not released
                        continue
                    table[f"gemma-scope-2-{size}-{variant}-{site}{suffix}"] = release_entry(
                        f"google/gemma-scope-2-{size}-{variant}",
                        f"google/gemma-3-{size}-{variant}",
                        "gemma_3",
                        hook=hooks[site],
                        path_prefix=sub,
                    )
    return table


register_format(
    FormatReader(
        name="gemma_scope_npz",
        read=read_gemma_scope_npz,
        layout="Gemma Scope: params.npz",
        files=("params.npz",),
        claims_file=lambda path, keys: 1 if path.suffix == ".npz" else 0,
        conversions=("gemma_2",),
        releases=_gemma_scope_releases,
        priority=40,
    )
)
register_format(
    FormatReader(
        name="gemma_scope_2",
        read=read_gemma_scope_2,
        layout="Gemma Scope 2: params.safetensors + config.json",
        files=("params.safetensors", "config.json"),
        marker=("params.safetensors",),
        conversions=("gemma_3",),
        releases=_gemma_scope_2_releases,
        priority=50,
    )
)
