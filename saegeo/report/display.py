"""How a result shows itself in a notebook or a shell: the pieces of its one-line ``__repr__`` (what it is, its
size, its headline numbers), the hand-off of its ``_repr_html_`` to the renderers (saegeo.render.notebook draws
every result's HTML from the report pages' parts), and DataFrames of its tables (pandas, an optional extra).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from saegeo.report.options import SEVERITIES

if TYPE_CHECKING:  # annotations only: render.base imports this module and stays torch-free
    from saegeo.report.flags import Flag

PANDAS_HINT = "pip install 'saegeo[notebook]' (or pip install pandas)"


def short(x: Any, digits: int = 3) -> str:
    """A number for a one-line summary: None -> '—', else ``digits`` decimals (general format when tiny or huge)."""
    if x is None:
        return "—"
    x = float(x)
    return f"{x:.{digits}g}" if x != 0 and (abs(x) >= 1e5 or abs(x) < 10**-digits) else f"{x:.{digits}f}"


def flag_counts(flags: Iterable[Flag]) -> str:
    """'1 error · 2 warning' (most severe first), or 'none'."""
    flags = list(flags)
    counts = {sev: sum(f.severity == sev for f in flags) for sev in reversed(SEVERITIES)}
    return " · ".join(f"{n} {sev}" for sev, n in counts.items() if n) or "none"


def names(items: Sequence[str], most: int = 4) -> str:
    """The first ``most`` names, then how many more: a summary line stays short with 50 SAEs."""
    shown = ", ".join(items[:most])
    return shown + (f" (+{len(items) - most} more)" if len(items) > most else "")


def notebook_html(result: Any) -> str:
    """The HTML block IPython shows for a result; drawn by saegeo.render (imported here, on first display, so that
    importing a result never loads the renderers)."""
    from saegeo.render.notebook import html_of

    return html_of(result)


def pandas() -> Any:
    """The pandas module, or an ImportError that says how to install it."""
    try:
        import pandas as pd
    except ImportError:
        raise ImportError(f"DataFrames of saegeo results need pandas: {PANDAS_HINT}") from None
    return pd


def flags_frame(flags: Iterable[Flag]) -> Any:
    """The flags as a DataFrame: one row per flag (severity, name, subject, summary, advice, latents, and one
    column per evidence number, prefixed ``evidence.``), most severe first as the result holds them."""
    rows = []
    for f in flags:
        row: dict[str, Any] = {
            "severity": f.severity,
            "name": f.name,
            "subject": f.subject,
            "summary": f.summary,
            "advice": f.advice,
            "latents": list(f.latents) if f.latents else None,
        }
        row.update({f"evidence.{k}": v for k, v in f.evidence.items()})
        rows.append(row)
    columns = ["severity", "name", "subject", "summary", "advice", "latents"]
    return pandas().DataFrame(rows, columns=None if rows else columns)


def columns_frame(columns: Mapping[str, Sequence[Any]], index: str | None = None) -> Any:
    """A column-oriented table {column: values} as a DataFrame (``index``: the column that becomes its index)."""
    frame = pandas().DataFrame(dict(columns))
    return frame.set_index(index) if index is not None else frame
