"""bad_input_rows: zero-norm or non-finite rows among the activations."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from saegeo.config import option
from saegeo.report.flags import BAD_ROWS, Flag, flag, rounded


@dataclass
class Options:
    bad_rows_max_fraction: float = option(
        0.0, "zero-norm or skipped non-finite rows above this fraction of rows", low=0
    )


@flag(
    BAD_ROWS,
    stage="activations",
    reads=("n", "n_zero", "n_nonfinite_skipped"),
    options=Options,
    bands={"error": "any row was non-finite", "warning": "only zero-norm rows"},
    when="any zero-norm or skipped non-finite row (the allowed fraction is 0)",
    order=10,
)
def bad_input_rows(q: dict[str, Any], t: Any) -> Flag | None:
    geo = q["geo"]
    n = int(geo["n"])
    n_zero, n_bad = int(geo.get("n_zero", 0)), int(geo.get("n_nonfinite_skipped", 0))
    rows_seen = n + n_bad
    if not (rows_seen and (n_zero + n_bad) / rows_seen > t.bad_rows_max_fraction):
        return None
    return Flag(
        BAD_ROWS,
        "error" if n_bad else "warning",
        {
            "n_zero_rows": n_zero,
            "n_nonfinite_rows_skipped": n_bad,
            "n_rows": rows_seen,
            "fraction": rounded((n_zero + n_bad) / rows_seen),
        },
        "Find where the producer emits zero or non-finite rows (padding, masked positions, overflow) and drop "
        "them before caching; they were excluded from the directional statistics here.",
        summary=f"{n_zero} zero-norm and {n_bad} non-finite row(s) of {rows_seen}",
    )
