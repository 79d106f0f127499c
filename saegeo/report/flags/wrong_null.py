"""wrong_null: a cone read against the wrong null (sign structure alone makes a cone)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from saegeo.config import option
from saegeo.report.flags import WRONG_NULL, Flag, flag, rounded


@dataclass
class Options:
    wrong_null_min_gap: float = option(0.05, "the sign-aware null exceeds the assumed baseline by ≥ this ...")
    wrong_null_min_z: float = option(
        3.0, "... and A is ≥ this many null-sds above the baseline (reading against it would call it a cone)"
    )


@flag(
    WRONG_NULL,
    stage="activations",
    reads=("anisotropy", "sign", "isotropic_sd", "isotropic_z", "assumed_null"),
    options=Options,
    bands={"warning": "both hold"},
    when="the sign-aware null is ≥ 0.05 above the baseline a reader assumes (0) and A is ≥ 3 null-sds above that "
    "baseline",
    order=80,
)
def wrong_null(q: dict[str, Any], t: Any) -> Flag | None:
    geo, assumed_null = q["geo"], q["assumed_null"]
    sign = geo.get("sign") or {}
    a, null, null_sd = geo.get("anisotropy"), sign.get("null"), geo.get("isotropic_sd")
    if not (a is not None and null is not None and null_sd):
        return None
    gap = float(null) - assumed_null
    z_assumed = (float(a) - assumed_null) / float(null_sd)
    if not (gap >= t.wrong_null_min_gap and z_assumed >= t.wrong_null_min_z):
        return None
    excess = float(a) - float(null)
    explained = min(1.0, gap / (float(a) - assumed_null)) if float(a) > assumed_null else 1.0
    return Flag(
        WRONG_NULL,
        "warning",
        {
            "anisotropy": rounded(a),
            "sign_null": rounded(null),
            "assumed_null": assumed_null,
            "excess_over_sign_null": rounded(excess),
            "share_explained_by_sign": rounded(explained),
            "z_vs_assumed": rounded(z_assumed, 1),
            "z_vs_sign_null": rounded(geo.get("isotropic_z"), 1),
            "negative_energy_fraction": rounded(sign.get("negative_energy_fraction")),
            "fraction_nonzero": rounded(sign.get("fraction_nonzero")),
        },
        f"Read A against the sign-aware null {null:.3g} ({sign.get('regime')} data), not {assumed_null:g}: "
        "quote A − null, since sign structure alone produces that much cone.",
        summary=(
            f"A = {a:.3f} but the {sign.get('regime')} sign structure alone gives {null:.3f} "
            f"({100 * explained:.0f}% of the cone); excess {excess:+.3f}"
        ),
    )
