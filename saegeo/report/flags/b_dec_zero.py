"""b_dec_zero: a decoder bias that is exactly zero (weights alone)."""

from __future__ import annotations

from typing import Any

from saegeo.report.flags import Flag, flag, rounded

ZERO_B_DEC = "b_dec_zero"


@flag(
    ZERO_B_DEC,
    stage="dictionary",
    reads=("b_dec",),
    bands={"info": "b_dec is exactly zero"},
    when="b_dec is exactly zero",
    order=40,
)
def b_dec_zero(q: dict[str, Any], t: Any) -> Flag | None:
    b = q["check"].b_dec
    if b["norm"] != 0:
        return None
    return Flag(
        ZERO_B_DEC,
        "info",
        {"b_dec_norm": 0.0, "mean_direction_norm": rounded(b["mean_direction_norm"])},
        "b_dec is exactly zero (trained without centring, or never updated): any activation offset must be "
        "carried by latents -- run saegeo check --acts to see whether some do.",
        summary="b_dec is zero",
        subject=q["subject"],
    )
