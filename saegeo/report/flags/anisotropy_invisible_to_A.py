"""anisotropy_invisible_to_A: A at its null while the centred spectrum is concentrated."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from saegeo.config import option
from saegeo.report.flags import INVISIBLE, Flag, flag, rounded


@dataclass
class Options:
    invisible_max_abs_z: float = option(3.0, "A within its null band: |null_z| < this ...", low=0)
    invisible_max_excess: float = option(0.02, "... or |A − null − bias| < this; and the spectrum concentrated:", low=0)
    invisible_max_erank_ratio: float = option(0.5, "erank / noise erank < this ...", low=0)
    invisible_min_top1_over_uniform: float = option(10.0, "... or top-1 ≥ max(this / d, invisible_min_top1)", low=0)
    invisible_min_top1: float = option(0.25, "see invisible_min_top1_over_uniform", low=0)


@flag(
    INVISIBLE,
    stage="activations",
    reads=(
        "anisotropy",
        "sign",
        "null_z",
        "null_bias",
        "effective_rank",
        "noise_effective_rank",
        "top1_share",
        "unit_effective_rank",
        "n",
        "d",
    ),
    options=Options,
    bands={"warning": "A in its null band and the spectrum concentrated"},
    when="A within its null band (\\|z\\| < 3 or \\|A − null − bias\\| < 0.02) while erank/noise erank < 0.5 or "
    "top-1 ≥ max(10/d, 0.25)",
    order=60,
)
def anisotropy_invisible(q: dict[str, Any], t: Any) -> Flag | None:
    geo = q["geo"]
    n, d = int(geo["n"]), int(geo["d"])
    a, sign = geo.get("anisotropy"), geo.get("sign") or {}
    null, z = sign.get("null"), geo.get("null_z")
    if a is None or null is None:
        return None
    excess = float(a) - float(null) - float(geo.get("null_bias") or 0.0)
    within_band = (z is not None and abs(z) < t.invisible_max_abs_z) or abs(excess) < t.invisible_max_excess
    erank, noise = geo.get("effective_rank"), geo.get("noise_effective_rank")
    top1 = geo.get("top1_share")
    erank_ratio = float(erank) / float(noise) if erank is not None and noise else None
    concentrated = (erank_ratio is not None and erank_ratio < t.invisible_max_erank_ratio) or (
        top1 is not None and top1 >= max(t.invisible_min_top1_over_uniform / d, t.invisible_min_top1)
    )
    if not (within_band and concentrated and n > d):
        return None
    return Flag(
        INVISIBLE,
        "warning",
        {
            "anisotropy": rounded(a),
            "sign_null": rounded(null),
            "z_vs_null": rounded(z, 1),
            "effective_rank": rounded(erank, 1),
            "noise_effective_rank": rounded(noise, 1),
            "erank_over_noise": rounded(erank_ratio),
            "top1_share": rounded(top1),
            "uniform_top1": rounded(1 / d),
            "unit_effective_rank": rounded(geo.get("unit_effective_rank"), 1),
        },
        "A cannot see this anisotropy (directions that cancel in the mean cosine): read the spectrum "
        "(erank, top-1, the unit-vector second moment), not A, and do not call this space isotropic.",
        summary=(
            f"A = {a:.3f} is within its null band ({null:.3f}) but the spectrum is concentrated: erank "
            f"{float(erank):.1f} of {d} (noise {float(noise):.1f}), top-1 {100 * float(top1 or 0):.0f}%"
        ),
    )
