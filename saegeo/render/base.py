"""What every rendering shares: number formats, the flag blocks (terminal, Markdown, HTML), the HTML page
skeleton, PNG bytes of a figure, and the one writer of rendering files (names, paths, atomic writes).
"""

from __future__ import annotations

import html
import io
import math
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from saegeo.errors import BadInputError
from saegeo.io import atomic_write
from saegeo.report.flags import SEVERITIES, Flag

FORMATS = ("terminal", "md", "json", "html")
SEVERITY_MARK = {"error": "✖", "warning": "▲", "info": "·"}


# =========================================================================== numbers
def fmt_num(x: Any, digits: int = 3) -> str:
    """Compact number: None -> '—', large/small in scientific notation."""
    if x is None:
        return "—"
    if isinstance(x, bool) or isinstance(x, int):
        return f"{x:,}" if isinstance(x, int) and not isinstance(x, bool) else str(x)
    x = float(x)
    if not math.isfinite(x):
        return "—"
    if x != 0 and (abs(x) >= 1e5 or abs(x) < 10 ** (-digits)):
        return f"{x:.{max(digits - 1, 1)}e}"
    return f"{x:.{digits}f}"


def fmt_pct(x: Any) -> str:
    return "—" if x is None else f"{100 * float(x):.1f}%"


def edge_spike_phrase(bulk: Mapping[str, Any]) -> str:
    """'; k spike(s) by <method> (gap ≥ δ)' for a bulk that is not MP-shaped and has the correlated-noise count,
    else ''. k equal to r_max reads 'at least'."""
    k = bulk.get("n_spikes_edge")
    if k is None:
        return ""
    at_least = "at least " if k == bulk.get("edge_spike_r_max") else ""
    return f"; {at_least}{k} spike(s) by {bulk.get('edge_spike_method')} (gap ≥ {fmt_num(bulk.get('edge_spike_gap'))})"


# =========================================================================== flags
def flag_counts(flags: list[Flag]) -> str:
    counts = {sev: sum(f.severity == sev for f in flags) for sev in reversed(SEVERITIES)}
    return " · ".join(f"{n} {sev}" for sev, n in counts.items() if n) or "none"


def terminal_flags(flags: list[Flag], *, max_flags: int = 12, show_subject: bool = True) -> list[str]:
    """The FLAGS block of a terminal summary: counts, then the first ``max_flags`` flags with advice."""
    out = [f"FLAGS  {flag_counts(flags)}"]
    for f in flags[:max_flags]:
        who = f"[{f.subject}] " if show_subject and f.subject != "activations" else ""
        out.append(f"  {SEVERITY_MARK[f.severity]} {f.severity:<7} {who}{f.name}: {f.summary}")
        if f.latents:
            more = "…" if len(f.latents) >= 10 else ""
            out.append(f"      latents {', '.join(map(str, f.latents[:10]))}{more}")
        out.append(f"      → {f.advice}")
    if len(flags) > max_flags:
        out.append(f"  … {len(flags) - max_flags} more in the full report")
    return out


def md_table(header: list[str], rows: list[list[str]]) -> str:
    esc = lambda c: str(c).replace("|", "\\|")  # noqa: E731
    lines = ["| " + " | ".join(esc(c) for c in header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(esc(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def md_flags(flags: list[Flag], *, show_subject: bool = True) -> list[str]:
    """One bullet per flag (severity, name, summary, advice; evidence and latents beneath), or 'No flags.'."""
    out = []
    for f in flags:
        who = f" — {f.subject}" if show_subject and f.subject != "activations" else ""
        out.append(f"- **{f.severity}** `{f.name}`{who}: {f.summary}. *{f.advice}*")
        ev = ", ".join(f"{k} = {fmt_num(v) if isinstance(v, float) else v}" for k, v in f.evidence.items())
        out.append(f"  - evidence: {ev}")
        if f.latents:
            out.append(f"  - latents: {', '.join(map(str, f.latents))}")
    return out or ["No flags."]


# =========================================================================== html
HTML_CSS = """body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}
td:first-child,th:first-child{text-align:left}.error{color:#b00}.warning{color:#b60}.info{color:#555}
.flag{margin:.6em 0}.ev{font-size:.85em;color:#555}img{max-width:100%;margin:.5em 0}
pre{background:#f6f6f6;padding:.6em;overflow-x:auto}"""


def html_flags(flags: list[Flag], *, show_subject: bool = True) -> list[str]:
    """One <div> per flag (severity, name, summary, advice, evidence, latents), or a 'No flags.' line."""
    e = html.escape
    parts = []
    for f in flags:
        who = f" — {e(f.subject)}" if show_subject and f.subject != "activations" else ""
        ev = ", ".join(f"{e(k)} = {e(fmt_num(v) if isinstance(v, float) else str(v))}" for k, v in f.evidence.items())
        lat = f"<br>latents: {e(', '.join(map(str, f.latents)))}" if f.latents else ""
        parts.append(
            f"<div class='flag'><b class='{f.severity}'>{f.severity}</b> <code>{e(f.name)}</code>{who}: "
            f"{e(f.summary)}<br><i>{e(f.advice)}</i><div class='ev'>{ev}{lat}</div></div>"
        )
    return parts or ["<p>No flags.</p>"]


def html_page(title: str, body: list[str]) -> str:
    """The page skeleton both renderings share: title, the common style sheet, the body parts in order."""
    e = html.escape
    head = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>{e(title)}</title>",
        f"<style>{HTML_CSS}</style></head><body>",
        f"<h1>{e(title)}</h1>",
    ]
    return "\n".join(head + body + ["</body></html>"])


def html_table(rows: list[tuple[str, str]]) -> list[str]:
    e = html.escape
    return (
        ["<table>"]
        + [f"<tr><td>{e(a)}</td><td style='text-align:left'>{e(b)}</td></tr>" for a, b in rows]
        + ["</table>"]
    )


# =========================================================================== figures
def png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    return buf.getvalue()


# =========================================================================== files
def rendering_names(stem: str) -> dict[str, str]:
    """The file each format is written to in an output directory (stem: report, check or sweep)."""
    return {"terminal": "summary.txt", "json": f"{stem}.json", "md": f"{stem}.md", "html": f"{stem}.html"}


def rendering_paths(out_dir: str | os.PathLike, formats: Sequence[str], stem: str) -> list[Path]:
    """The files `write_report` / `write_sweep` would write for these formats (for `refuse_overwrite`)."""
    return [Path(out_dir) / name for fmt, name in rendering_names(stem).items() if fmt in formats]


def output_dir(out_dir: str | os.PathLike, formats: Sequence[str], known: Sequence[str], what: str) -> Path:
    """out_dir, created, once every requested format is known (else one clear error naming the choices)."""
    unknown = [f for f in formats if f not in known]
    if unknown:
        raise BadInputError(f"unknown {what} format(s) {unknown}; choose from {list(known)}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    return out


def write_renderings(
    out: Path, formats: Sequence[str], writers: Mapping[str, tuple[str, Callable[[], str | bytes]]]
) -> dict[str, Path]:
    """Each requested format's rendering, atomically, as out/<file name>: {format: path}."""
    return {fmt: atomic_write(out / name, render()) for fmt, (name, render) in writers.items() if fmt in formats}
