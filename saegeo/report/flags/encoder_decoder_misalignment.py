"""encoder_decoder_misalignment: latents whose encoder reads against the direction their decoder writes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from saegeo.config import option
from saegeo.report.flags import Flag, flag, rounded

MISALIGNED = "encoder_decoder_misalignment"


@dataclass
class Options:
    misaligned_warn_fraction: float = option(
        0.01, "misaligned latents above this fraction: a warning, else info", low=0, high=1
    )


@flag(
    MISALIGNED,
    stage="dictionary",
    reads=("encoder_decoder_cos", "zero_rows", "d_sae", "misaligned_cos"),
    options=Options,
    bands={"warning": "above 1 % of latents", "info": "at most 1 %"},
    when="latents with cos(encoder column, decoder row) < 0 (`check --misaligned-cos`)",
    order=30,
)
def encoder_decoder_misalignment(q: dict[str, Any], t: Any) -> Flag | None:
    check, enc_dec, zero, threshold = q["check"], q["enc_dec"], q["zero"], q["misaligned_cos"]
    below = ((enc_dec < threshold) & ~zero).nonzero().flatten()
    if not below.numel():
        return None
    n_lat = check.source["d_sae"]
    order = below[enc_dec[below].argsort()].tolist()
    frac = len(order) / n_lat
    return Flag(
        MISALIGNED,
        "warning" if frac > t.misaligned_warn_fraction else "info",
        {
            "n_latents": len(order),
            "fraction": rounded(frac),
            "min_cos": rounded(float(enc_dec[order[0]])),
            "median_cos": rounded(check.encoder_decoder_cos["median"]),
            "threshold": threshold,
        },
        "A latent whose encoder reads against the direction its decoder writes is usually dead or broken: "
        "check its firing on activations (saegeo check --acts) before trusting it.",
        summary=f"{len(order)} latent(s) with cos(encoder column, decoder row) < {threshold:g}",
        latents=order[: t.max_latents],
        subject=q["subject"],
    )
