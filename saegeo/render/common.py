"""What every rendering shares: number formats, the flag blocks (terminal, Markdown, HTML), the HTML page
skeleton, PNG bytes of a figure, and the one writer of rendering files (names, paths, atomic writes).
"""

from __future__ import annotations

import base64
import functools
import html
import io
import math
import os
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from saegeo.errors import BadInputError
from saegeo.io import atomic_write, output_set
from saegeo.report.display import flag_counts

if TYPE_CHECKING:  # annotations only: this module stays torch-free (the CLI imports FORMATS from it)
    from matplotlib.figure import Figure

    from saegeo.report.flags import Flag

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


def null_eigenvalue_phrase(bulk: Mapping[str, Any]) -> str:
    """'; k exactly-null eigenvalue(s) left out of the MP fit' when the spectrum had some (LayerNorm'd hooks), else ''."""
    k = bulk.get("n_null_eigenvalues") or 0
    return f"; {k} exactly-null eigenvalue(s) left out of the MP fit" if k else ""


# =========================================================================== flags
def group_flags(flags: list[Flag]) -> list[list[Flag]]:
    """The flags of one name together, in the order each name first appears (flags come most severe first):
    a kind raised at 13 layers is one block with one advice line, not 13 blocks repeating it."""
    groups: dict[str, list[Flag]] = {}
    for f in flags:
        groups.setdefault(f.name, []).append(f)
    return list(groups.values())


def _advices(group: list[Flag]) -> list[str]:
    """The distinct advice sentences of a group, each once."""
    return list(dict.fromkeys(f.advice for f in group))


def _subjects(group: list[Flag]) -> str:
    """What a group applies to: its subjects (layers, SAEs), in order, each once."""
    return ", ".join(dict.fromkeys(f.subject for f in group))


def _latent_list(latents: list[int], most: int | None = None) -> str:
    shown = latents if most is None else latents[:most]
    return ", ".join(map(str, shown)) + ("…" if most is not None and len(latents) > most else "")


def terminal_flags(flags: list[Flag], *, max_flags: int = 12, show_subject: bool = True) -> list[str]:
    """The FLAGS block of a terminal summary: counts, then the first ``max_flags`` kinds of flag, each with the
    subjects (layers, SAEs) and latents it applies to and its advice once."""
    out = [f"FLAGS  {flag_counts(flags)}"]
    groups = group_flags(flags)
    for group in groups[:max_flags]:
        f = group[0]
        if len(group) == 1:
            who = f"[{f.subject}] " if show_subject and f.subject != "activations" else ""
            out.append(f"  {SEVERITY_MARK[f.severity]} {f.severity:<7} {who}{f.name}: {f.summary}")
            if f.latents:
                out.append(f"      latents {_latent_list(f.latents, 10)}")
        else:
            n_subjects = len(set(m.subject for m in group))
            where = _subjects(group) if n_subjects <= 3 else f"{n_subjects} subjects, each below"
            out.append(f"  {SEVERITY_MARK[f.severity]} {f.severity:<7} {f.name} ×{len(group)}: {where}")
            one_advice = len(_advices(group)) == 1
            for m in group:
                sev = f"{m.severity}, " if m.severity != f.severity else ""
                out.append(f"      [{sev}{m.subject}] {m.summary}")
                if m.latents:
                    out.append(f"        latents {_latent_list(m.latents, 10)}")
                if not one_advice:
                    out.append(f"        → {m.advice}")
            if not one_advice:
                continue
        out.append(f"      → {f.advice}")
    if len(groups) > max_flags:
        out.append(f"  … {len(groups) - max_flags} more kind(s) of flag in the full report")
    return out


def text_table(header: list[str], rows: list[list[str]], *, left: Sequence[int] = (0,), indent: str = "") -> list[str]:
    """A terminal table: columns padded to their widest cell, ``left`` columns aligned left, the rest right."""
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    return [
        indent + "  ".join(c.ljust(w) if i in left else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
        for r in [header, *rows]
    ]


def md_table(header: list[str], rows: list[list[str]]) -> str:
    esc = lambda c: str(c).replace("|", "\\|")  # noqa: E731
    lines = ["| " + " | ".join(esc(c) for c in header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(esc(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def _evidence(f: Flag) -> str:
    return ", ".join(f"{k} = {fmt_num(v) if isinstance(v, float) else v}" for k, v in f.evidence.items())


def md_flags(flags: list[Flag], *, show_subject: bool = True) -> list[str]:
    """One bullet per kind of flag (severity, name, what it applies to, advice once), each instance's summary,
    evidence and latents beneath; or 'No flags.'."""
    out = []
    for group in group_flags(flags):
        f = group[0]
        if len(group) == 1:
            who = f" — {f.subject}" if show_subject and f.subject != "activations" else ""
            out.append(f"- **{f.severity}** `{f.name}`{who}: {f.summary}. *{f.advice}*")
            out.append(f"  - evidence: {_evidence(f)}")
            if f.latents:
                out.append(f"  - latents: {_latent_list(f.latents)}")
            continue
        one_advice = len(_advices(group)) == 1
        advice = f": *{f.advice}*" if one_advice else ""
        out.append(f"- **{f.severity}** `{f.name}` ×{len(group)} ({_subjects(group)}){advice}")
        for m in group:
            sev = f"**{m.severity}** " if m.severity != f.severity else ""
            lat = f"; latents {_latent_list(m.latents)}" if m.latents else ""
            own = "" if one_advice else f" *{m.advice}*"
            out.append(f"  - {sev}{m.subject}: {m.summary}{own} ({_evidence(m)}{lat})")
    return out or ["No flags."]


# =========================================================================== html
HTML_CSS = """body{font-family:system-ui,sans-serif;max-width:1240px;margin:2em auto;padding:0 1em;color:#222}
h1{font-size:1.5em;overflow-wrap:anywhere}table{border-collapse:collapse;margin:.5em 0}
td,th{border:1px solid #ccc;padding:3px 8px;text-align:right;white-space:nowrap;font-variant-numeric:tabular-nums}
td:first-child,th:first-child,td.l,th.l{text-align:left}td.txt{text-align:left;white-space:normal}
.scroll{max-width:100%;overflow-x:auto}caption{text-align:left;font-weight:bold;padding:.3em 0}
.error{color:#b00}.warning{color:#b60}.info{color:#555}
.flag{margin:.6em 0}.flag ul{margin:.2em 0 .2em 1.2em;padding:0}.ev{font-size:.85em;color:#555}
img{max-width:100%;margin:.5em 0}figure{margin:1em 0}figcaption{font-size:.9em;color:#444;max-width:60em}
pre{background:#f6f6f6;padding:.6em;overflow-x:auto}"""


def html_flags(
    flags: list[Flag], *, show_subject: bool = True, latent_tables: Mapping[str, str] | None = None
) -> list[str]:
    """One <div> per kind of flag (severity, name, what it applies to, advice once; each instance's summary,
    evidence and latents beneath), or a 'No flags.' line. ``latent_tables`` {SAE name: element id of its
    per-latent table}: the latents of that SAE's flags link to their cards there."""
    e = html.escape
    tables = latent_tables or {}

    def latent_links(f: Flag) -> str:
        if f.subject not in tables:
            return e(_latent_list(f.latents or []))
        box = e(tables[f.subject])
        return ", ".join(
            f"<a class='to-latent' href='#{box}' data-box='{box}' data-id='{int(i)}'>{int(i)}</a>"
            for i in f.latents or []
        )

    parts = []
    for group in group_flags(flags):
        f = group[0]
        one_advice = len(_advices(group)) == 1
        advice = f"<br><i>{e(f.advice)}</i>" if one_advice else ""
        if len(group) == 1:
            who = f" — {e(f.subject)}" if show_subject and f.subject != "activations" else ""
            lat = f"<br>latents: {latent_links(f)}" if f.latents else ""
            parts.append(
                f"<div class='flag'><b class='{f.severity}'>{f.severity}</b> <code>{e(f.name)}</code>{who}: "
                f"{e(f.summary)}{advice}<div class='ev'>{e(_evidence(f))}{lat}</div></div>"
            )
            continue
        items = []
        for m in group:
            sev = f"<b class='{m.severity}'>{m.severity}</b> " if m.severity != f.severity else ""
            lat = f"; latents {latent_links(m)}" if m.latents else ""
            own = "" if one_advice else f"<br><i>{e(m.advice)}</i>"
            items.append(
                f"<li>{sev}{e(m.subject)}: {e(m.summary)}{own} <span class='ev'>({e(_evidence(m))}{lat})</span></li>"
            )
        parts.append(
            f"<div class='flag'><b class='{f.severity}'>{f.severity}</b> <code>{e(f.name)}</code> ×{len(group)}, "
            f"at {e(_subjects(group))}{advice}<ul>{''.join(items)}</ul></div>"
        )
    return parts or ["<p>No flags.</p>"]


def html_page(title: str, body: list[str], *, script: str = "", css: str = "") -> str:
    """The page skeleton every rendering shares: title, the common style sheet (+ ``css``), the body parts in
    order, and an optional inline script (self-contained: nothing is fetched)."""
    e = html.escape
    head = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>{e(title)}</title>",
        "<meta name='viewport' content='width=device-width, initial-scale=1'>",
        f"<style>{HTML_CSS}{css}</style></head><body>",
        f"<h1>{e(title)}</h1>",
    ]
    tail = [f"<script>{script}</script>"] if script else []
    return "\n".join(head + body + tail + ["</body></html>"])


NOTEBOOK_SCOPE = "saegeo-out"  # the class of a notebook display's <div>: its style sheet applies inside it only
NOTEBOOK_CSS = (
    "\n.title{font-size:1.3em;font-weight:bold;margin:.4em 0}h2{font-size:1.15em;margin:.8em 0 .3em}h3{font-size:1em}"
)


def scoped_css(css: str, scope: str = NOTEBOOK_SCOPE) -> str:
    """A page's style sheet for a block inside someone else's page (a notebook): each selector prefixed with
    ``.scope`` and the body's rule given to the block itself, so nothing outside the block changes look."""
    out = []
    for selectors, body in re.findall(r"([^{}]+)\{([^{}]*)\}", css):
        if selectors.strip() == "body":  # the page's centring margins have no place in an output cell
            body = ";".join(d for d in body.split(";") if not d.startswith(("margin", "padding", "max-width")))
        out.append(
            ",".join(f".{scope}" if s.strip() == "body" else f".{scope} {s.strip()}" for s in selectors.split(","))
            + "{"
            + body
            + "}"
        )
    return "\n".join(out)


def html_block(title: str, body: list[str], *, script: str = "", css: str = "") -> str:
    """What `html_page` makes, as one self-contained <div> for a notebook's output cell: the same parts and the
    same style sheet (scoped to the block), the title as a heading, an optional inline script; nothing fetched."""
    e = html.escape
    style = scoped_css(HTML_CSS + NOTEBOOK_CSS + css)
    tail = [f"<script>{script}</script>"] if script else []
    return "\n".join(
        [
            f"<div class='{NOTEBOOK_SCOPE}'><style>{style}</style>",
            f"<div class='title'>{e(title)}</div>",
            *body,
            "</div>",
            *tail,
        ]
    )


def html_table(rows: list[tuple[str, str]]) -> list[str]:
    """A (label, text) table: labels on one line, the text wrapping."""
    e = html.escape
    return ["<table>"] + [f"<tr><td>{e(a)}</td><td class='txt'>{e(b)}</td></tr>" for a, b in rows] + ["</table>"]


def html_grid(
    header: list[str], rows: list[list[str]], *, caption: str = "", text_columns: Sequence[int] = (0,)
) -> list[str]:
    """A table of numbers (cells never wrap; ``text_columns`` aligned left) in a box that scrolls sideways
    rather than widen the page."""
    e = html.escape
    cls = lambda i: " class='l'" if i in text_columns else ""  # noqa: E731
    cap = f"<caption>{e(caption)}</caption>" if caption else ""
    return [
        f"<div class='scroll'><table>{cap}<tr>"
        + "".join(f"<th{cls(i)}>{e(h)}</th>" for i, h in enumerate(header))
        + "</tr>",
        *["<tr>" + "".join(f"<td{cls(i)}>{e(c)}</td>" for i, c in enumerate(r)) + "</tr>" for r in rows],
        "</table></div>",
    ]


def html_figure(name: str, data: bytes, caption: str = "") -> str:
    """A PNG figure embedded as a data: URI, with its caption (what its colours and lines mean)."""
    e = html.escape
    b64 = base64.b64encode(data).decode("ascii")
    cap = f"<figcaption>{e(caption)}</figcaption>" if caption else ""
    return f"<figure><img alt='{e(name)}' src=\"data:image/png;base64,{b64}\">{cap}</figure>"


# =========================================================================== figures
FIGURE_DPI = 130  # a 9-inch figure is ~1170 px: the page's width


def png(fig: Figure, dpi: int = FIGURE_DPI) -> bytes:
    """The figure as PNG bytes (Figure.savefig draws on its own Agg canvas: no backend is switched)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
    return buf.getvalue()


@functools.cache
def _shown_figure() -> type:
    """Figure that displays itself in a notebook as PNG (IPython calls ``_repr_png_``) whether or not the inline
    backend is active; defined on first use so that importing the renderers does not import matplotlib."""
    from matplotlib.figure import Figure

    class ShownFigure(Figure):
        def _repr_png_(self) -> bytes:
            return png(self)

    return ShownFigure


def new_figure(**kwargs: Any) -> Figure:
    """A matplotlib Figure made with the object-oriented API, never through pyplot: no global figure list, no
    backend chosen or switched, rcParams only read; garbage-collected like any object."""
    return _shown_figure()(**kwargs)


# =========================================================================== files
def rendering_names(stem: str) -> dict[str, str]:
    """The file each format is written to in an output directory (stem: report, check or sweep)."""
    return {"terminal": "summary.txt", "json": f"{stem}.json", "md": f"{stem}.md", "html": f"{stem}.html"}


LATENT_FILES = ("latents.csv", "latents.json")  # the per-latent table and cards, written with the json format


def rendering_paths(out_dir: str | os.PathLike, formats: Sequence[str], stem: str) -> list[Path]:
    """The files `write_report` / `write_sweep` / `write_latents` would write for these formats (for
    `refuse_overwrite`); a report's and a latents page's json format writes LATENT_FILES too."""
    paths = [Path(out_dir) / name for fmt, name in rendering_names(stem).items() if fmt in formats]
    if stem in ("report", "latents") and "json" in formats:
        paths += [Path(out_dir) / name for name in LATENT_FILES if Path(out_dir) / name not in paths]
    return paths


# bytes a report's set of files takes: a fixed part (figures, the activation sections) and, per latent of each SAE,
# its rows of the latent table in latents.csv, latents.json, report.json and report.html (1.13 kB a latent at
# 4,096 latents, every format: benchmarks/README.md "Disk space of a report"); rounded up
REPORT_FIXED_BYTES = 2 << 20
REPORT_BYTES_PER_LATENT = 1500


def report_set_bytes(d_saes: Sequence[int]) -> int:
    """The disk a report's output set needs, about: REPORT_FIXED_BYTES + REPORT_BYTES_PER_LATENT · Σ d_sae (the
    new set is staged whole beside the old one, so all of it must be free)."""
    return REPORT_FIXED_BYTES + REPORT_BYTES_PER_LATENT * sum(int(n) for n in d_saes)


def output_dir(out_dir: str | os.PathLike, formats: Sequence[str], known: Sequence[str], what: str) -> Path:
    """out_dir, created, once every requested format is known (else one clear error naming the choices)."""
    unknown = [f for f in formats if f not in known]
    if unknown:
        raise BadInputError(f"unknown {what} format(s) {unknown}; choose from {list(known)}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    return out


def write_output_set(
    out_dir: str | os.PathLike,
    formats: Sequence[str],
    known: Sequence[str],
    what: str,
    write: Callable[[Path], dict[str, Path]],
) -> dict[str, Path]:
    """``write(stage)`` writes a command's whole set of files into a staging directory; they are moved into
    out_dir as one set (saegeo.io.output_set: an interruption leaves the old set or the new one, never a mix).
    Returns {format: final path}."""
    out = output_dir(out_dir, formats, known, what)
    with output_set(out) as stage:
        written = write(stage)
    return {key: out / path.relative_to(stage) for key, path in written.items()}


def write_renderings(
    out: Path, formats: Sequence[str], writers: Mapping[str, tuple[str, Callable[[], str | bytes]]]
) -> dict[str, Path]:
    """Each requested format's rendering, atomically, as out/<file name>: {format: path}."""
    return {fmt: atomic_write(out / name, render()) for fmt, (name, render) in writers.items() if fmt in formats}
