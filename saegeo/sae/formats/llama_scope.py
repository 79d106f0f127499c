"""Llama Scope (OpenMOSS lm-saes): hyperparams.json + checkpoints/final.safetensors, with the dataset-wise
input scale and the decoder-norm threshold folded in exactly.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from saegeo.errors import FormatError
from saegeo.sae.architectures import SAEConfig
from saegeo.sae.formats.format_reader import Dictionary, FormatInfo, FormatReader, register_format
from saegeo.sae.formats.hub import release_entry
from saegeo.sae.formats.reader_checks import (
    check_config,
    count_field,
    dtype_name,
    expect_shape,
    make_dictionary,
    matrix_shape,
    require_floating,
    require_keys,
    schema_types,
)
from saegeo.sae.formats.weight_files import read_json, read_safetensors


@dataclass
class LlamaScopeFacts:
    """What a Llama Scope folder records that no other format does (FormatInfo.facts)."""

    input_scale_folded: float | None = None  # √d / norm_in, folded into W_enc (and 1/it into W_dec, b_dec)


@functools.cache
def llama_scope_schema() -> type:
    """The keys of a Llama Scope hyperparams.json that saegeo reads (lm-saes' SAEConfig): the scalar JumpReLU
    threshold θ >= 0 (θ/‖W_dec,i‖ is a threshold on relu(pre), so negative θ were 0), the dataset-wise input norm
    (> 0: inputs are scaled by √d / it), the dimensions and switches. Other keys pass unread."""
    from pydantic import Field

    T = schema_types()

    class ActivationNorm(T.Config):
        # "in" is a Python keyword: the field is named in_ and read from the JSON key "in"
        in_: T.Positive | None = Field(None, alias="in")
        out: T.Positive | None = None

    class LlamaScopeConfig(T.Config):
        d_model: T.Count | None = None
        d_sae: T.Count | None = None
        jump_relu_threshold: T.NonNegative
        norm_activation: T.Text = None
        dataset_average_activation_norm: ActivationNorm | None = None
        apply_decoder_bias_to_pre_encoder: T.OptFlag = None
        sparsity_include_decoder_norm: T.OptFlag = None
        act_fn: T.Text = None
        hook_point_in: T.Text = None
        model_name: T.Text = None

    return LlamaScopeConfig


def read_llama_scope(path: str | os.PathLike) -> Dictionary:
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
    hp = read_json(hp_file)
    for key, refused in (("apply_decoder_bias_to_pre_encoder", True), ("act_fn", "topk")):
        if hp.get(key) == refused:
            raise FormatError(
                f"{hp_file}: Llama Scope {key}={refused!r}: saegeo reads the released jumprelu SAEs without "
                "decoder-bias subtraction only; encode this one with lm-saes itself"
            )
    if "jump_relu_threshold" not in hp:
        raise FormatError(
            f"{hp_file}: missing jump_relu_threshold (Llama Scope's scalar JumpReLU threshold); is this a Llama Scope SAE?"
        )
    check_config(hp_file, hp, llama_scope_schema())
    if not w_file.is_file():
        raise FormatError(
            f"{d}: missing checkpoints/final.safetensors next to hyperparams.json; download the whole folder"
        )
    w = read_safetensors(w_file)
    require_keys(w_file, w, ("encoder.weight", "encoder.bias", "decoder.weight", "decoder.bias"), "a Llama Scope SAE")
    d_sae, d_in = matrix_shape(w_file, "encoder.weight", w["encoder.weight"], "(d_sae, d_in)")
    implied = f"encoder.weight (d_sae={d_sae}, d_in={d_in})"
    expect_shape(w_file, "decoder.weight", w["decoder.weight"], (d_in, d_sae), implied)
    expect_shape(w_file, "encoder.bias", w["encoder.bias"], (d_sae,), implied)
    expect_shape(w_file, "decoder.bias", w["decoder.bias"], (d_in,), implied)
    require_floating(w_file, w)  # before the float64 cast below, which would read integers or booleans as numbers
    for name in ("d_model", "d_sae"):
        if name in hp and count_field(hp_file, hp, name) != (d_in if name == "d_model" else d_sae):
            raise FormatError(f"{hp_file}: {name}={hp[name]} but {w_file.name} holds {implied}")
    norm_in = None
    if hp.get("norm_activation", "dataset-wise") == "dataset-wise":
        norm_in = (hp.get("dataset_average_activation_norm") or {}).get("in")
        if not norm_in:
            raise FormatError(
                f"{hp_file}: norm_activation dataset-wise but no dataset_average_activation_norm.in; "
                "inputs must be scaled by √d / that norm, which these files do not hold"
            )
    elif hp.get("norm_activation") != "none":
        raise FormatError(
            f"{hp_file}: norm_activation={hp.get('norm_activation')!r} is not reproduced (expected dataset-wise or none)"
        )
    scale = float(d_in) ** 0.5 / float(norm_in) if norm_in else 1.0
    t = {k: v.to(torch.float64) for k, v in w.items()}
    W_dec = t["decoder.weight"].T
    theta = torch.full((d_sae,), float(hp["jump_relu_threshold"]), dtype=torch.float64)
    if hp.get("sparsity_include_decoder_norm", True):
        theta = theta / W_dec.norm(dim=1).clamp_min(1e-30)
    tensors = {
        "W_enc": t["encoder.weight"].T * scale,
        "b_enc": t["encoder.bias"],
        "W_dec": W_dec / scale,
        "b_dec": t["decoder.bias"] / scale,
        "threshold": theta,
    }
    cfg = SAEConfig(
        d_in=int(d_in), d_sae=int(d_sae), activation="jumprelu", apply_b_dec_to_input=False, dtype="float32"
    )
    info = FormatInfo(
        format="llama_scope",
        source=str(d),
        source_dtype=dtype_name(w),
        hook_name=hp.get("hook_point_in"),
        model_name=hp.get("model_name"),
        expected_input_norm=float(norm_in) if norm_in else None,
        facts=LlamaScopeFacts(input_scale_folded=scale if norm_in else None),
    )
    return make_dictionary(cfg, tensors, w_file, info)


def _releases() -> dict[str, dict]:
    """Llama Scope's releases (SAELens conversion llama_scope); the hook comes from hyperparams.json (hook_point_in)."""
    table = {}
    for site in ("r", "m", "a"):
        for width in ("8x", "32x"):
            saes = {
                f"l{layer}{site}_{width}": f"Llama3_1-8B-Base-L{layer}{site.upper()}-{width}" for layer in range(32)
            }
            table[f"llama_scope_lx{site}_{width}"] = release_entry(
                f"fnlp/Llama3_1-8B-Base-LX{site.upper()}-{width}", "meta-llama/Llama-3.1-8B", "llama_scope", saes
            )
    return table


register_format(
    FormatReader(
        name="llama_scope",
        read=read_llama_scope,
        layout="Llama Scope: hyperparams.json + checkpoints/final.safetensors",
        files=("hyperparams.json", "checkpoints/final.safetensors"),
        marker=("hyperparams.json",),
        facts=LlamaScopeFacts,
        conversions=("llama_scope",),
        releases=_releases,
        priority=60,
    )
)
