"""The layer sweep's renderings: a terminal table, Markdown (+ sweep.png), HTML with every quantity plotted
against depth, and `write_sweep`, the writer of its files.

``render_sweep_terminal / render_sweep_markdown / render_sweep_html(sweep) -> str``, ``sweep_figure(sweep) -> bytes``
``write_sweep(sweep, out_dir, formats) -> dict[str, Path]``   summary.txt, sweep.json, sweep.md (+ sweep.png), sweep.html.
"""

from __future__ import annotations

import base64
import html
import os
from collections.abc import Callable, Sequence
from pathlib import Path

from saegeo.io import atomic_write
from saegeo.render.base import (
    FORMATS,
    fmt_num,
    fmt_pct,
    html_flags,
    html_page,
    md_flags,
    md_table,
    output_dir,
    png,
    rendering_names,
    terminal_flags,
    write_renderings,
)
from saegeo.report.sweep import LayerSweep

SWEEP_FORMATS = FORMATS


def _cell(key: str, digits: int = 3) -> Callable[[dict], str]:
    return lambda r: fmt_num(r.get(key), digits)


TABLE: list[tuple[str, Callable[[dict], str]]] = [
    ("layer", lambda r: str(r["layer"])),
    ("hook", lambda r: r["hook"]),
    ("A", _cell("A")),
    ("null", _cell("A_null")),
    ("|m^|", _cell("offset")),
    ("|mu|^2", _cell("mean_sq_norm", 2)),
    ("tr S", _cell("total_variance", 2)),
    ("mean%", lambda r: fmt_pct(r["mean_share"])),
    ("erank (noise)", lambda r: f"{fmt_num(r['erank'], 1)} ({fmt_num(r['noise_erank'], 1)})"),
    ("top1", lambda r: fmt_pct(r["top1"])),
    ("top10", lambda r: fmt_pct(r["top10"])),
    ("Iso", _cell("isoscore")),
    # a spectrum without a flat MP bulk has no spike count: its power-law slope instead
    (
        "spikes",
        lambda r: str(r["mp_spikes"]) if r["mp_spikes"] is not None else f"α={fmt_num(r.get('mp_power_law_alpha'), 2)}",
    ),
    ("rogue50", lambda r: str(r["rogue_50"])),
    ("between%", lambda r: fmt_pct(r["between_share"])),
    ("SelfSim-A", _cell("self_similarity_adjusted")),
    ("IntraWin-A", _cell("intra_window_adjusted")),
    ("r(PC1,logf)", _cell("pc1_abs_corr_log_frequency", 2)),
    ("r(PC1,pos)", _cell("pc1_abs_corr_position", 2)),
    ("r(PC1,|x|)", _cell("pc1_abs_corr_norm", 2)),
]


def sweep_table(sweep: LayerSweep) -> tuple[list[str], list[list[str]]]:
    return [h for h, _ in TABLE], [[fn(r) for _, fn in TABLE] for r in sweep.layers]


def _title(sweep: LayerSweep) -> str:
    n = sweep.layers[0]["n"] if sweep.layers else 0
    return f"saegeo sweep · {sweep.model} · {len(sweep.layers)} layer(s) · {n:,} tokens each · {sweep.seconds:.1f} s"


def render_sweep_terminal(sweep: LayerSweep) -> str:
    header, rows = sweep_table(sweep)
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    fmt = lambda r: "  ".join(c.ljust(w) if i == 1 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))  # noqa: E731
    out = [_title(sweep), "", fmt(header)] + [fmt(r) for r in rows] + [""]
    out += terminal_flags(sweep.flags)
    out += [f"note: {n}" for n in sweep.notes]
    return "\n".join(out) + "\n"


def _type_lists_md(sweep: LayerSweep) -> list[str]:
    out = []
    for r in sweep.layers:
        tt = r["details"]["token_types"]
        if not tt or not tt["most_context_specific"]:
            continue
        ids = (  # noqa: E731
            lambda entries: ", ".join(
                f"{e['id']}" + (f" `{e['token']}`" if e.get("token") else "") + f" ({fmt_num(e['adjusted'], 2)})"
                for e in entries[:5]
            )
        )
        out.append(
            f"- layer {r['layer']} `{r['hook']}`: most context-specific {ids(tt['most_context_specific'])}; "
            f"least {ids(tt['least_context_specific'])} (token id, token, SelfSim − A; count ≥ {tt['min_count']})"
        )
    return out


def render_sweep_markdown(sweep: LayerSweep, figure: str | None = None) -> str:
    out = [f"# {_title(sweep)}", "", md_table(*sweep_table(sweep)), ""]
    if figure:
        out += [f"![each quantity against depth]({figure})", ""]
    out += ["## Flags", ""] + md_flags(sweep.flags)
    lists = _type_lists_md(sweep)
    if lists:
        out += ["", "## Context-specific token types", ""] + lists
    out += ["", "## Notes", ""] + [f"- {n}" for n in sweep.notes]
    out += ["", f"*saegeo {sweep.saegeo_version}, sweep schema {sweep.schema_version}.*", ""]
    return "\n".join(out)


PANELS: list[tuple[str, list[tuple[str, str]]]] = [
    ("mean pairwise cosine", [("A", "A"), ("A_null", "sign-aware null")]),
    ("offset ‖m̂‖", [("offset", "‖m̂‖")]),
    ("‖μ‖² and tr Σ", [("mean_sq_norm", "‖μ‖²"), ("total_variance", "tr Σ")]),
    ("mean share ‖μ‖²/tr S", [("mean_share", "mean share")]),
    ("effective rank", [("erank", "erank"), ("noise_erank", "isotropic noise")]),
    ("top eigenvalue shares", [("top1", "top-1"), ("top10", "top-10")]),
    ("IsoScore", [("isoscore", "IsoScore")]),
    ("MP spikes / rogue dims", [("mp_spikes", "MP spikes"), ("rogue_50", "rogue dims (50%)")]),
    ("between-type share of tr Σ", [("between_share", "corrected"), ("between_share_plugin", "plug-in")]),
    ("similarity minus A", [("self_similarity_adjusted", "SelfSim − A"), ("intra_window_adjusted", "IntraWindow − A")]),
    ("corr(‖μ_t‖², var_t)", [("norm_variance_corr", "count-weighted")]),
    (
        "|corr(PC1, ·)|",
        [
            ("pc1_abs_corr_log_frequency", "log frequency"),
            ("pc1_abs_corr_position", "position"),
            ("pc1_abs_corr_norm", "‖x‖"),
        ],
    ),
]


def sweep_figure(sweep: LayerSweep) -> bytes:
    """One PNG: a panel per quantity (PANELS) against depth."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(3, 4, figsize=(16, 10))
    depth = [r["layer"] if r["layer"] is not None else i for i, r in enumerate(sweep.layers)]
    for ax, (title, series) in zip(axes.flat, PANELS):
        for key, label in series:
            pts = [(x, r[key]) for x, r in zip(depth, sweep.layers) if r.get(key) is not None]
            if pts:
                ax.plot(*zip(*pts), "o-", ms=4, label=label)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("layer (blocks applied)", fontsize=8)
        if len(series) > 1 and ax.get_legend_handles_labels()[0]:  # a panel with no measured series has no legend
            ax.legend(fontsize=7)
    fig.suptitle(_title(sweep), fontsize=11)
    fig.tight_layout()
    return png(fig)


def render_sweep_html(sweep: LayerSweep, png: bytes | None = None) -> str:
    e = html.escape
    png = png if png is not None else sweep_figure(sweep)
    header, rows = sweep_table(sweep)
    parts = ["<table><tr>" + "".join(f"<th>{e(h)}</th>" for h in header) + "</tr>"]
    parts += ["<tr>" + "".join(f"<td>{e(c)}</td>" for c in r) + "</tr>" for r in rows] + ["</table>"]
    parts.append("<h2>Each quantity against depth</h2>")
    parts.append(f"<img alt='sweep' src=\"data:image/png;base64,{base64.b64encode(png).decode('ascii')}\">")
    parts += ["<h2>Flags</h2>"] + html_flags(sweep.flags)
    parts.append("<h2>Notes</h2><ul>" + "".join(f"<li>{e(n)}</li>" for n in sweep.notes) + "</ul>")
    parts.append(f"<h2>Terminal summary</h2><pre>{e(render_sweep_terminal(sweep))}</pre>")
    return html_page(_title(sweep), parts)


def write_sweep(
    sweep: LayerSweep, out_dir: str | os.PathLike, formats: Sequence[str] = SWEEP_FORMATS
) -> dict[str, Path]:
    """summary.txt, sweep.json, sweep.md (+ sweep.png beside it), sweep.html in ``out_dir``; returns {format: path}."""
    out = output_dir(out_dir, formats, SWEEP_FORMATS, "sweep")
    png = sweep_figure(sweep) if {"md", "html"} & set(formats) else None
    if "md" in formats:
        atomic_write(out / "sweep.png", png)
    names = rendering_names("sweep")
    writers = {
        "terminal": (names["terminal"], lambda: render_sweep_terminal(sweep)),
        "json": (names["json"], lambda: sweep.to_json()),
        "md": (names["md"], lambda: render_sweep_markdown(sweep, figure="sweep.png")),
        "html": (names["html"], lambda: render_sweep_html(sweep, png)),
    }
    return write_renderings(out, formats, writers)
