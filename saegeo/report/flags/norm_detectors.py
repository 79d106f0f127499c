"""norm_detectors: latents whose activation tracks the row's norm ‖x‖ rather than its direction.

"Size Doesn't Matter: Cosine-Scored SAEs" (2026): under (Batch)TopK, high-norm tokens claim slots, and some latents
fire by ‖x‖ rather than content. The per-latent table's ``norm_corr`` is Pearson's r(a_i, ‖x‖) over every row the
pass read (silent rows a_i = 0 included; saegeo.geometry.latent_stats.LatentCovariates); this flag reads it, so it
needs the table (the report's latent cards, on by default).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from saegeo.config import option
from saegeo.report.flags import Flag, flag, rounded

NORM_DETECTORS = "norm_detectors"


@dataclass
class Options:
    norm_detector_min_corr: float = option(
        0.7, "a latent whose activation has r(a, ‖x‖) ≥ this over the rows is a norm detector ...", above=0, high=1
    )
    norm_detector_warn_fraction: float = option(
        0.01, "... a warning when norm detectors are at least this fraction of the latents, else info", low=0, high=1
    )


@flag(
    NORM_DETECTORS,
    stage="latents",
    reads=("latent_table.norm_corr", "d_sae"),
    options=Options,
    bands={"warning": "norm detectors are ≥ 1 % of the latents", "info": "fewer"},
    when="a latent's activation correlates with the row norm, r(a, ‖x‖) ≥ 0.7 over the pass (the latent table's "
    "`norm_corr`)",
    order=10,
)
def norm_detectors(q: dict[str, Any], t: Any) -> Flag | None:
    sae = q["sae"]
    corr = ((sae.get("latent_table") or {}).get("norm_corr")) or []
    found = sorted(
        ((r, i) for i, r in enumerate(corr) if r is not None and r >= t.norm_detector_min_corr), key=lambda p: -p[0]
    )
    if not found:
        return None
    d_sae = int(sae["d_sae"])
    share = len(found) / d_sae
    return Flag(
        NORM_DETECTORS,
        "warning" if share >= t.norm_detector_warn_fraction else "info",
        {
            "n_norm_detectors": len(found),
            "fraction": rounded(share),
            "max_norm_corr": rounded(found[0][0]),
            "min_corr": t.norm_detector_min_corr,
            "d_sae": d_sae,
        },
        "These latents fire by the row's norm, not its direction (high-norm tokens claim their slots): read them as "
        "norm detectors, not features; normalise the inputs' norm before the SAE (SAELens normalize_activations, a "
        "cosine-scored encoder) or leave out the massive rows, and see massive_activations.",
        summary=f"{len(found)} latent(s) fire by ‖x‖: r(a, ‖x‖) ≥ {t.norm_detector_min_corr:g} "
        f"(max {found[0][0]:.2f}), {100 * share:.1f}% of {d_sae:,} latents",
        latents=[i for _, i in found][: t.max_latents],
        subject=str(sae.get("name") or "sae"),
    )
