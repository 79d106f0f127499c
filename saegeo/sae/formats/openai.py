"""openai/sparse_autoencoder: one .pt state dict (`Autoencoder.from_state_dict`), TopK after a per-row
LayerNorm (undone after decode), or ReLU.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path

from saegeo.errors import FormatError
from saegeo.sae.architectures import SAEConfig, by_saved_name
from saegeo.sae.formats.format_reader import PICKLE_SUFFIXES, Dictionary, FormatInfo, FormatReader, register_format
from saegeo.sae.formats.reader_checks import (
    check_config,
    dtype_name,
    expect_shape,
    make_dictionary,
    matrix_shape,
    require_keys,
    schema_types,
)
from saegeo.sae.formats.weight_files import read_pickle


@dataclass
class OpenAIFacts:
    """What an openai/sparse_autoencoder state dict records that no other format does (FormatInfo.facts)."""

    openai_activation: str | None = None  # "TopK" or "ReLU", the activation's class name


@functools.cache
def openai_schema() -> type:
    """The non-tensor entries of an openai/sparse_autoencoder state dict (what `Autoencoder.state_dict` adds
    beside the tensors): the activation's class name and its own state dict ({k, postact_fn} for TopK)."""
    T = schema_types()

    class ActivationState(T.Config):
        k: T.Size | None = None  # 0 is refused below with the reason (no dense ReLU SAE)
        postact_fn: T.Text = None

    class OpenAIStateDict(T.Config):
        activation: T.Text = None
        activation_state_dict: ActivationState | None = None

    return OpenAIStateDict


def read_openai(path: str | os.PathLike) -> Dictionary:
    """openai/sparse_autoencoder `Autoencoder.from_state_dict`: pre_bias (d_in), encoder.weight (d_sae, d_in),
    latent_bias (d_sae), decoder.weight (d_in, d_sae), activation "TopK" (k in activation_state_dict) or "ReLU".
    latents = act(encoder(x' − pre_bias) + latent_bias), recons = (decoder(latents) + pre_bias)·std + mu, where
    x' = LN(x) = (x − mu)/(std + 1e-5) per row and is applied iff activation == "TopK" (as from_state_dict does)."""
    file = Path(path)
    state = read_pickle(file)
    require_keys(file, state, ("pre_bias", "latent_bias", "encoder.weight"), "an OpenAI sparse_autoencoder state dict")
    check_config(
        file, {k: v for k, v in state.items() if k in ("activation", "activation_state_dict")}, openai_schema()
    )
    activation = state.get("activation", "ReLU")
    if activation not in ("TopK", "ReLU"):
        raise FormatError(f"{file}: OpenAI activation {activation!r} is not supported (expected TopK or ReLU)")
    enc = state["encoder.weight"]
    d_sae, d_in = matrix_shape(file, "encoder.weight", enc, "(d_sae, d_in)")
    implied = f"encoder.weight (d_sae={d_sae}, d_in={d_in})"
    if "decoder.weight" in state:
        expect_shape(file, "decoder.weight", state["decoder.weight"], (d_in, d_sae), implied)
        w_dec = state["decoder.weight"].T
    elif "decoder.linear.weight" in state:  # tied: decoder = encoder transposed
        w_dec = enc
    else:
        raise FormatError(
            f"{file}: missing decoder.weight (or decoder.linear.weight for a tied autoencoder); found {sorted(state)}"
        )
    expect_shape(file, "pre_bias", state["pre_bias"], (d_in,), implied)
    expect_shape(file, "latent_bias", state["latent_bias"], (d_sae,), implied)
    k = None
    if activation == "TopK":
        act_state = state.get("activation_state_dict") or {}
        k, post = act_state.get("k"), act_state.get("postact_fn", "ReLU")
        if isinstance(k, bool) or not isinstance(k, int) or not 0 < k <= d_sae:  # k = 0 is no dense ReLU SAE
            raise FormatError(
                f"{file}: TopK autoencoder needs an integer activation_state_dict['k'] in [1, d_sae={d_sae}] "
                f"(found {k!r})"
            )
        if post != "ReLU":
            raise FormatError(f"{file}: TopK postact_fn {post!r} gives signed codes; saegeo's contract needs ReLU")
    cfg = SAEConfig(
        d_in=int(d_in),
        d_sae=int(d_sae),
        activation=by_saved_name("openai", activation).name,  # TopK -> topk, ReLU -> relu (their modules say so)
        k=k,
        topk_order="topk_then_relu",
        apply_b_dec_to_input=True,
        input_normalization="layer_norm" if activation == "TopK" else "none",
        layer_norm_eps=1e-5,
        dtype="float32",
    )
    info = FormatInfo(
        format="openai",
        source=str(file),
        facts=OpenAIFacts(openai_activation=activation),
        source_dtype=dtype_name(state),
        hook_name=file.stem,
    )
    tensors = {"W_enc": enc.T, "b_enc": state["latent_bias"], "W_dec": w_dec, "b_dec": state["pre_bias"]}
    return make_dictionary(cfg, tensors, file, info)


register_format(
    FormatReader(
        name="openai",
        read=read_openai,
        layout="OpenAI sparse_autoencoder: one .pt state dict",
        claims_file=lambda path, keys: (
            2 if path.suffix in PICKLE_SUFFIXES and {"pre_bias", "latent_bias"} & keys() else 0
        ),
        facts=OpenAIFacts,
        priority=80,
    )
)
