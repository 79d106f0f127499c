"""zero_decoder_rows: dead latents that write nothing (weights alone)."""

from __future__ import annotations

from typing import Any

from saegeo.report.flags import Flag, flag, rounded

ZERO_ROWS = "zero_decoder_rows"


@flag(
    ZERO_ROWS,
    stage="dictionary",
    reads=("n_zero_decoder_rows", "zero_rows", "decoder_norms", "d_sae"),
    bands={"warning": "any zero row"},
    when="rows with ‖w_i‖ ≤ 1e-6 × the median norm (`check --zero-row-rel-norm`)",
    order=10,
)
def zero_decoder_rows(q: dict[str, Any], t: Any) -> Flag | None:
    check = q["check"]
    n_lat = check.source["d_sae"]
    if not check.n_zero_decoder_rows:
        return None
    return Flag(
        ZERO_ROWS,
        "warning",
        {
            "n_zero_rows": check.n_zero_decoder_rows,
            "d_sae": n_lat,
            "fraction": rounded(check.n_zero_decoder_rows / n_lat),
            "median_decoder_norm": rounded(check.decoder_norms["median"]),
        },
        "Zero decoder rows are dead latents that write nothing: drop them before counting features or "
        "computing dictionary statistics.",
        summary=f"{check.n_zero_decoder_rows} of {n_lat} decoder rows are zero",
        latents=check.zero_rows[: t.max_latents],
        subject=q["subject"],
    )
