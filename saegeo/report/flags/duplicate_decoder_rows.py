"""duplicate_decoder_rows: near-duplicate latents that split one feature between them (weights alone)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from saegeo.config import option
from saegeo.report.flags import Flag, flag, rounded

DUPLICATES = "duplicate_decoder_rows"


@dataclass
class Options:
    duplicate_error_fraction: float = option(
        0.01, "latents in duplicate pairs above this fraction: error", low=0, high=1
    )


@flag(
    DUPLICATES,
    stage="dictionary",
    reads=("n_duplicate_pairs", "duplicate_pairs", "d_sae", "duplicate_cos"),
    options=Options,
    bands={"error": "more than 1 % of latents are in such pairs", "warning": "at most 1 %"},
    when="pairs of decoder rows with cos > 0.99 (`check --duplicate-cos`)",
    order=20,
)
def duplicate_decoder_rows(q: dict[str, Any], t: Any) -> Flag | None:
    check = q["check"]
    if not check.n_duplicate_pairs:
        return None
    n_lat, pairs, pair_cos, threshold = check.source["d_sae"], q["pairs"], q["pair_cos"], q["duplicate_cos"]
    involved: list[int] = []
    for i, j in pairs.tolist():
        involved += [x for x in (i, j) if x not in involved]
    n_involved = len(set(pairs.flatten().tolist()))
    top = check.duplicate_pairs[:3]
    return Flag(
        DUPLICATES,
        "error" if n_involved / n_lat > t.duplicate_error_fraction else "warning",
        {
            "n_pairs": check.n_duplicate_pairs,
            "n_latents_listed": n_involved,
            "max_cos": rounded(float(pair_cos[0]), 6),
            "threshold": threshold,
            "d_sae": n_lat,
        },
        "Near-duplicate latents split one feature between them (and their codes): merge or drop one of each "
        "pair before interpreting or counting features.",
        summary=(
            f"{check.n_duplicate_pairs} pair(s) of decoder rows with cos > {threshold:g}: "
            + ", ".join(f"{i}–{j} ({c:.4f})" for i, j, c in top)
            + (" …" if check.n_duplicate_pairs > 3 else "")
        ),
        latents=involved[: t.max_latents],
        subject=q["subject"],
    )
