"""Goodfire: one .pth state dict (encoder_linear.*, decoder_linear.*), ReLU without b_dec subtraction."""

from __future__ import annotations

import os
from pathlib import Path

from saegeo.errors import FormatError
from saegeo.sae.architectures import SAEConfig
from saegeo.sae.formats.format_reader import PICKLE_SUFFIXES, Dictionary, FormatInfo, FormatReader, register_format
from saegeo.sae.formats.reader_checks import dtype_name, expect_shape, make_dictionary, matrix_shape, require_keys
from saegeo.sae.formats.weight_files import read_pickle


def read_goodfire(path: str | os.PathLike) -> Dictionary:
    """Goodfire: one .pth state dict, encoder_linear.weight (d_sae, d_in), encoder_linear.bias, decoder_linear.weight
    (d_in, d_sae), decoder_linear.bias (d_in). codes = relu(x @ encoder_linear.weightᵀ + encoder_linear.bias) (no b_dec
    subtraction); x̂ = codes @ decoder_linear.weightᵀ + decoder_linear.bias."""
    file = Path(path)
    if file.is_dir():
        pths = sorted(file.glob("*.pth"))
        if len(pths) != 1:
            raise FormatError(f"{file}: expected one Goodfire .pth, found {[q.name for q in pths]}")
        file = pths[0]
    state = read_pickle(file)
    require_keys(
        file,
        state,
        ("encoder_linear.weight", "encoder_linear.bias", "decoder_linear.weight", "decoder_linear.bias"),
        "a Goodfire SAE",
    )
    d_sae, d_in = matrix_shape(file, "encoder_linear.weight", state["encoder_linear.weight"], "(d_sae, d_in)")
    implied = f"encoder_linear.weight (d_sae={d_sae}, d_in={d_in})"
    expect_shape(file, "decoder_linear.weight", state["decoder_linear.weight"], (d_in, d_sae), implied)
    expect_shape(file, "decoder_linear.bias", state["decoder_linear.bias"], (d_in,), implied)
    cfg = SAEConfig(d_in=int(d_in), d_sae=int(d_sae), activation="relu", apply_b_dec_to_input=False, dtype="float32")
    info = FormatInfo(format="goodfire", source=str(file), source_dtype=dtype_name(state), hook_name=file.stem)
    tensors = {
        "W_enc": state["encoder_linear.weight"].T,
        "b_enc": state["encoder_linear.bias"],
        "W_dec": state["decoder_linear.weight"].T,
        "b_dec": state["decoder_linear.bias"],
    }
    return make_dictionary(cfg, tensors, file, info)


register_format(
    FormatReader(
        name="goodfire",
        read=read_goodfire,
        layout="Goodfire: one .pth (encoder_linear.*, decoder_linear.*)",
        claims_file=lambda path, keys: 2 if path.suffix in PICKLE_SUFFIXES and "encoder_linear.weight" in keys() else 0,
        priority=70,
    )
)
