"""How a dictionary expects its inputs, from its loaded config (``sae.cfg``, ``sae.format_info``): a family of
five flags that need no thresholds."""

from __future__ import annotations

from typing import Any

from saegeo.report.flags import Flag, flag, rounded

INPUT_SCALING = "input_scaling_outside_files"
INPUT_NORMALIZATION = "input_normalization"
FOLDED_SCALING = "scaling_factor_folded"
TRANSCODER = "transcoder"
UNSET_THRESHOLD = "batchtopk_threshold_unset"


@flag(
    INPUT_SCALING,
    stage="dictionary",
    reads=("normalize_activations",),
    bands={"warning": "always"},
    when="`normalize_activations = expected_average_only_in` (a factor the files do not hold)",
    order=60,
)
def input_scaling(q: dict[str, Any], t: Any) -> Flag | None:
    if q["sae"].format_info.normalize_activations != "expected_average_only_in":
        return None
    return Flag(
        INPUT_SCALING,
        "warning",
        {"normalize_activations": None},
        "This SAE expects inputs multiplied by a constant (√d / E‖x‖ of its training data) that is not in "
        "these files: rescale the activations the same way, or every code and threshold is off by that factor.",
        summary="normalize_activations = expected_average_only_in: inputs must be rescaled by a factor the files do not hold",
        subject=q["subject"],
    )


@flag(
    INPUT_NORMALIZATION,
    stage="dictionary",
    reads=("input_normalization", "layer_norm_eps"),
    bands={"info": "always"},
    when="the SAE normalises each input row",
    order=70,
)
def input_normalization(q: dict[str, Any], t: Any) -> Flag | None:
    cfg = q["sae"].cfg
    if cfg.input_normalization == "none":
        return None
    return Flag(
        INPUT_NORMALIZATION,
        "info",
        {"layer_norm_eps": cfg.layer_norm_eps if cfg.input_normalization == "layer_norm" else None},
        "Each input row is normalised before encoding and the reconstruction is mapped back: compare codes "
        "across tokens with that in mind, and feed raw (not pre-normalised) activations.",
        summary=f"the SAE normalises every input row ({cfg.input_normalization}) and undoes it after decoding",
        subject=q["subject"],
    )


@flag(
    FOLDED_SCALING,
    stage="dictionary",
    reads=("folded_scaling_factor",),
    bands={"info": "always"},
    when="a finetuning scaling factor was folded into W_dec",
    order=80,
)
def scaling_factor_folded(q: dict[str, Any], t: Any) -> Flag | None:
    folded = q["sae"].format_info.folded_scaling_factor
    if not folded:
        return None
    return Flag(
        FOLDED_SCALING,
        "info",
        {"scaling_min": rounded(folded.get("min")), "scaling_max": rounded(folded.get("max"))},
        "A per-latent finetuning scaling factor was folded into the decoder rows (decode is unchanged); "
        "decoder norms therefore include it.",
        summary="finetuning scaling factor folded into W_dec",
        subject=q["subject"],
    )


@flag(
    TRANSCODER,
    stage="dictionary",
    reads=("transcoder",),
    bands={"info": "always"},
    when="a transcoder",
    order=90,
)
def transcoder(q: dict[str, Any], t: Any) -> Flag | None:
    if not q["sae"].format_info.transcoder:
        return None
    return Flag(
        TRANSCODER,
        "info",
        {},
        "A transcoder reconstructs a different activation than it reads: b_dec and the decoder live in the "
        "output space, so compare them with the output activations, not the inputs.",
        summary="this is a transcoder (no b_dec subtraction before encoding)",
        subject=q["subject"],
    )


@flag(
    UNSET_THRESHOLD,
    stage="dictionary",
    reads=("threshold_unset", "threshold"),
    bands={"warning": "always"},
    when="a BatchTopK threshold of −1",
    order=100,
)
def batchtopk_threshold_unset(q: dict[str, Any], t: Any) -> Flag | None:
    info = q["sae"].format_info
    if not info.threshold_unset:
        return None
    return Flag(
        UNSET_THRESHOLD,
        "warning",
        {"threshold": rounded(info.threshold)},
        "The BatchTopK inference threshold was never set in training (-1): every positive pre-activation "
        "passes, so codes are dense; set the threshold from training statistics before use.",
        summary="BatchTopK threshold is -1 (unset): inference codes are dense ReLU codes",
        subject=q["subject"],
    )
