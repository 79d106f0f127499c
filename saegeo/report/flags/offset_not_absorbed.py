"""offset_not_absorbed: b_dec far from the activation mean, where the mean matters."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from saegeo.config import option
from saegeo.report.flags import OFFSET_NOT_ABSORBED, Flag, flag, rounded


@dataclass
class Options:
    offset_min_distance: float = option(0.5, "‖b_dec − μ‖/‖μ‖ ≥ this: a warning ...", low=0)
    offset_error_distance: float = option(0.9, "... and an error at ≥ this", low=0)
    offset_min_outlier_severity: float = option(
        0.5, "... when the mean matters at all: outlier severity γ = ‖μ‖/√tr Σ ≥ this", low=0
    )


@flag(
    OFFSET_NOT_ABSORBED,
    stage="sae",
    reads=("b_dec_distance_to_mean", "b_dec_cos_mean", "b_dec_norm", "outlier_severity", "mean_vector_norm"),
    options=Options,
    bands={"error": "‖b_dec − μ‖/‖μ‖ ≥ 0.9", "warning": "0.5 ≤ ‖b_dec − μ‖/‖μ‖ < 0.9"},
    when="‖b_dec − μ‖/‖μ‖ ≥ 0.5 when γ ≥ 0.5",
    order=20,
)
def offset_not_absorbed(q: dict[str, Any], t: Any) -> Flag | None:
    sae, geo = q["sae"], q["geo"]
    dist, b_cos = sae.get("b_dec_distance_to_mean"), sae.get("b_dec_cos_mean")
    gamma = geo.get("outlier_severity")
    if not (
        dist is not None
        and gamma is not None
        and dist >= t.offset_min_distance
        and gamma >= t.offset_min_outlier_severity
    ):
        return None
    return Flag(
        OFFSET_NOT_ABSORBED,
        "error" if dist >= t.offset_error_distance else "warning",
        {
            "b_dec_distance_to_mean": rounded(dist),
            "b_dec_cos_mean": rounded(b_cos),
            "b_dec_norm": rounded(sae.get("b_dec_norm")),
            "mean_norm": rounded(geo.get("mean_vector_norm")),
            "outlier_severity": rounded(gamma),
        },
        "b_dec should absorb the activation mean: initialise it to the mean of the activations "
        "(the saegeo default) so no latent has to spend itself on the offset.",
        summary=(
            f"‖b_dec − μ‖/‖μ‖ = {dist:.2f} (cos {b_cos if b_cos is None else round(b_cos, 2)}, "
            f"‖b_dec‖ {sae.get('b_dec_norm', 0):.3g} vs ‖μ‖ {geo.get('mean_vector_norm', 0):.3g}, γ = {gamma:.2f})"
        ),
        subject=str(sae.get("name") or "sae"),
    )
