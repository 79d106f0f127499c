"""dead_latents: latents that never fired in the pass."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from saegeo.config import option
from saegeo.report.flags import DEAD, Flag, flag, rounded


@dataclass
class Options:
    dead_max_fraction: float = option(0.01, "latents that never fire above this fraction: a warning ...", low=0)
    dead_error_fraction: float = option(0.2, "... an error at ≥ this fraction", low=0)


@flag(
    DEAD,
    stage="sae",
    reads=("firing_frequency", "d_sae", "n_tokens", "name"),
    options=Options,
    bands={"error": "≥ 20 % of latents", "warning": "1–20 % of latents"},
    when="more than 1 % of latents never fire in the pass",
    order=40,
)
def dead_latents(q: dict[str, Any], t: Any) -> Flag | None:
    sae = q["sae"]
    freq = sae["firing_frequency"]
    d_sae, n_tokens = int(sae["d_sae"]), int(sae.get("n_tokens", 0))
    dead = [i for i, f in enumerate(freq) if f == 0]
    dead_frac = len(dead) / d_sae
    if not dead_frac > t.dead_max_fraction:
        return None
    return Flag(
        DEAD,
        "error" if dead_frac >= t.dead_error_fraction else "warning",
        {"n_dead": len(dead), "dead_fraction": rounded(dead_frac), "d_sae": d_sae, "n_tokens": n_tokens},
        "Dead latents waste capacity: initialise b_dec to the mean, use AuxK (TopK) or resampling, "
        "and check on more tokens before concluding.",
        summary=f"{len(dead)} of {d_sae} latents ({100 * dead_frac:.1f}%) never fired on {n_tokens} tokens",
        latents=dead[: t.max_latents],
        subject=str(sae.get("name") or "sae"),
    )
