"""rank_deficiency: a singular covariance (n ≤ d, or activations living in a subspace)."""

from __future__ import annotations

from typing import Any

from saegeo.report.flags import RANK, Flag, flag, rounded
from saegeo.report.flags.massive_activations import massive_evidence


@flag(
    RANK,
    stage="activations",
    reads=("n", "d", "numerical_rank", "numerical_rank_rel_tol", "row_norm_histogram", "coordinate_rms"),
    bands={"warning": "n ≤ d", "info": "numerical rank < d with n > d"},
    when="n ≤ d, or numerical rank < d without massive activations to explain it",
    order=20,
)
def rank_deficiency(q: dict[str, Any], t: Any) -> Flag | None:
    # with n > d: silent when massive rows/coordinates set λ_max -- the relative tolerance d·eps·λ_max then hides a
    # full-rank bulk; massive_activations reports the number instead
    geo = q["geo"]
    n, d, rank = int(geo["n"]), int(geo["d"]), int(geo["numerical_rank"])
    if not (n <= d or (rank < d and massive_evidence(geo, t) is None)):
        return None
    why = f"n = {n} ≤ d = {d}" if n <= d else f"numerical rank {rank} < d = {d}"
    # n ≤ d: every spectrum-based number describes the sample, not the population (warning);
    # rank < d with n > d: the activations really live in a subspace (info, but never whiten them).
    return Flag(
        RANK,
        "warning" if n <= d else "info",
        {"numerical_rank": rank, "d": d, "n": n, "rank_rel_tol": rounded(geo.get("numerical_rank_rel_tol"))},
        "Collect more tokens than dimensions (n ≫ d) before reading spectra, and do not whiten or invert Σ: "
        "the null directions have no variance to normalise.",
        summary=f"{why}: the covariance is singular ({d - rank} null direction(s))",
    )
