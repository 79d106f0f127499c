"""offset_dominated_cone: a cone of the raw activations that is mostly their shared mean."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from saegeo.config import option
from saegeo.report.flags import OFFSET_CONE, Flag, flag, rounded


@dataclass
class Options:
    offset_cone_min_z: float = option(3.0, "A is ≥ this many null-sds above the sign-aware null (null_z) ...")
    offset_cone_min_excess: float = option(0.05, "... and ≥ this above it (A − null − bias) ...")
    offset_cone_min_explained: float = option(
        0.5, "... the mean explains ≥ this of A (1 − A_centred/A on the row sample; without one (‖μ‖/E‖x‖)²/A) ..."
    )
    offset_cone_min_mean_share: float = option(0.05, "... and the mean's share ‖μ‖²/tr S is ≥ this")


def mean_explains(geo: Mapping[str, Any]) -> tuple[float, str]:
    """(share of A explained by the mean, how): 1 − A_centred/A wherever rows are at hand, the labelled proxy
    (‖μ‖/E‖x‖)²/A (clipped at 1) only without them."""
    a = float(geo["anisotropy"])
    a_centred = (geo.get("sample_diagnostics") or {}).get("centred_anisotropy")
    if a_centred is not None:
        return (1.0 - max(float(a_centred), 0.0) / a if a > 0 else 0.0), "1 - A(centred sample rows)/A"
    ratio = geo.get("mean_norm_ratio") or 0.0
    return (min(1.0, ratio**2 / a) if a > 0 else 0.0), "proxy (|mu|/E|x|)^2 / A, no row sample (clipped at 1)"


@flag(
    OFFSET_CONE,
    stage="activations",
    reads=(
        "anisotropy",
        "sign",
        "null_z",
        "null_bias",
        "sample_diagnostics",
        "mean_norm_ratio",
        "mean_share_of_second_moment",
        "offset",
        "rogue",
    ),
    options=Options,
    bands={"warning": "all four hold"},
    when="null_z ≥ 3, A − null − bias ≥ 0.05, the mean explains ≥ 50 % of A (1 − A of the centred sample rows / A), "
    "and the mean's share ≥ 0.05",
    order=50,
)
def offset_dominated_cone(q: dict[str, Any], t: Any) -> Flag | None:
    geo = q["geo"]
    a, sign = geo.get("anisotropy"), geo.get("sign") or {}
    null, z = sign.get("null"), geo.get("null_z")
    if a is None or null is None:
        return None
    excess = float(a) - float(null) - float(geo.get("null_bias") or 0.0)
    explained, how = mean_explains(geo)
    mean_share = geo.get("mean_share_of_second_moment")
    a_centred = (geo.get("sample_diagnostics") or {}).get("centred_anisotropy")
    if not (
        z is not None
        and z >= t.offset_cone_min_z
        and excess >= t.offset_cone_min_excess
        and explained >= t.offset_cone_min_explained
        and (mean_share or 0) >= t.offset_cone_min_mean_share
    ):
        return None
    rogue = geo.get("rogue") or {}
    return Flag(
        OFFSET_CONE,
        "warning",
        {
            "anisotropy": rounded(a),
            "sign_null": rounded(null),
            "z_vs_null": rounded(z, 1),
            "centred_anisotropy": rounded(a_centred),
            "share_of_A_explained_by_mean": rounded(explained),
            "explained_by": how,
            "mean_share_of_second_moment": rounded(mean_share),
            "offset": rounded(geo.get("offset")),
            "mean_norm_ratio": rounded(geo.get("mean_norm_ratio")),
            "coordinates_for_50pct_of_offset": rogue.get("n_for_50"),
        },
        "Cosines on the raw activations mostly measure the shared mean: centre them (or let b_dec absorb the "
        'mean, b_dec_init = "mean") before reading A, cosine similarities or nearest neighbours.',
        summary=(
            f"A = {a:.3f} is {z:.0f} null-sds above the sign-aware null {null:.3f}, and the mean explains "
            f"{100 * explained:.0f}% of it"
            + (
                f" (centred rows: A = {a_centred:.3f})"
                if a_centred is not None
                else " (proxy (‖μ‖/E‖x‖)²/A: no row sample)"
            )
            + f"; the mean is {100 * (mean_share or 0):.0f}% of E‖x‖², ‖m̂‖ = {geo.get('offset') or 0:.2f}"
        ),
    )
