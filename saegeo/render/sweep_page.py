"""The layer sweep's renderings: a terminal table, Markdown (+ sweep.png), HTML with every quantity plotted
against depth, and `write_sweep`, the writer of its files.

``render_sweep_terminal / render_sweep_markdown / render_sweep_html(sweep) -> str``, ``sweep_figure(sweep) -> bytes``
``write_sweep(sweep, out_dir, formats) -> dict[str, Path]``   summary.txt, sweep.json, sweep.md (+ sweep.png), sweep.html.
"""

from __future__ import annotations

import html
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from saegeo.io import atomic_write
from saegeo.render.common import (
    FORMATS,
    fmt_num,
    fmt_pct,
    html_block,
    html_figure,
    html_flags,
    html_grid,
    html_page,
    md_flags,
    md_table,
    new_figure,
    png,
    rendering_names,
    terminal_flags,
    text_table,
    write_output_set,
    write_renderings,
)
from saegeo.report.layer_sweep import LayerSweep

if TYPE_CHECKING:
    from matplotlib.figure import Figure

SWEEP_FORMATS = FORMATS


def _cell(key: str, digits: int = 3) -> Callable[[dict], str]:
    return lambda r: fmt_num(r.get(key), digits)


KEY_COLUMNS: list[tuple[str, Callable[[dict], str]]] = [
    ("layer", lambda r: str(r["layer"])),
    ("hook", lambda r: r["hook"]),
]
# The quantities, in three tables that each fit a page (the layer and hook columns repeated in each); the symbols
# are the report's (‖m̂‖ the offset, ‖μ‖² the mean's squared norm, tr Σ the total variance, tr S = E‖x‖²).
TABLE_GROUPS: list[tuple[str, list[tuple[str, Callable[[dict], str]]]]] = [
    (
        "the cone and the mean",
        [
            ("A", _cell("A")),
            ("null", _cell("A_null")),
            ("‖m̂‖", _cell("offset")),
            ("‖μ‖²", _cell("mean_sq_norm", 2)),
            ("tr Σ", _cell("total_variance", 2)),
            ("‖μ‖²/tr S", lambda r: fmt_pct(r["mean_share"])),
        ],
    ),
    (
        "the spectrum",
        [
            ("erank (noise)", lambda r: f"{fmt_num(r['erank'], 1)} ({fmt_num(r['noise_erank'], 1)})"),
            ("top-1", lambda r: fmt_pct(r["top1"])),
            ("top-10", lambda r: fmt_pct(r["top10"])),
            ("IsoScore", _cell("isoscore")),
            # a spectrum without a flat MP bulk has no spike count: its power-law slope instead
            (
                "MP spikes",
                lambda r: (
                    str(r["mp_spikes"])
                    if r["mp_spikes"] is not None
                    else f"α={fmt_num(r.get('mp_power_law_alpha'), 2)}"
                ),
            ),
            ("rogue dims", lambda r: str(r["rogue_50"])),
            ("SAE decoder α", _cell("decoder_power_law_alpha", 2)),
        ],
    ),
    (
        "token types and the artifact test",
        [
            ("between%", lambda r: fmt_pct(r["between_share"])),
            ("SelfSim − A", _cell("self_similarity_adjusted")),
            ("IntraWin − A", _cell("intra_window_adjusted")),
            ("r(PC1, log f)", _cell("pc1_abs_corr_log_frequency", 2)),
            ("r(PC1, pos)", _cell("pc1_abs_corr_position", 2)),
            ("r(PC1, ‖x‖)", _cell("pc1_abs_corr_norm", 2)),
        ],
    ),
]
TABLE = KEY_COLUMNS + [column for _, group in TABLE_GROUPS for column in group]


# columns shown only when a row has their key (the per-layer SAEs' of `sweep --saes`): header -> row key
OPTIONAL_COLUMNS = {"SAE decoder α": "decoder_power_law_alpha"}
DECODER_PANEL = ("SAE decoder spectrum (--saes)", "power-law α", [("decoder_power_law_alpha", "decoder α")])


def _shown(columns: list[tuple[str, Callable[[dict], str]]], sweep: LayerSweep) -> list:
    return [
        (h, fn) for h, fn in columns if h not in OPTIONAL_COLUMNS or any(OPTIONAL_COLUMNS[h] in r for r in sweep.layers)
    ]


def sweep_table(sweep: LayerSweep) -> tuple[list[str], list[list[str]]]:
    """Every column in one table (header, rows)."""
    table = _shown(TABLE, sweep)
    return [h for h, _ in table], [[fn(r) for _, fn in table] for r in sweep.layers]


def sweep_tables(sweep: LayerSweep) -> list[tuple[str, list[str], list[list[str]]]]:
    """The columns in TABLE_GROUPS' tables, each led by layer and hook: [(caption, header, rows)]."""
    out = []
    for caption, group in TABLE_GROUPS:
        columns = _shown(KEY_COLUMNS + group, sweep)
        out.append((caption, [h for h, _ in columns], [[fn(r) for _, fn in columns] for r in sweep.layers]))
    return out


def _title(sweep: LayerSweep) -> str:
    n = sweep.layers[0]["n"] if sweep.layers else 0
    return f"saegeo sweep · {sweep.model} · {len(sweep.layers)} layer(s) · {n:,} tokens each · {sweep.seconds:.1f} s"


def render_sweep_terminal(sweep: LayerSweep) -> str:
    out = [_title(sweep), ""]
    for caption, header, rows in sweep_tables(sweep):
        out += [caption.upper(), *text_table(header, rows, left=(1,)), ""]
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
    out = [f"# {_title(sweep)}", ""]
    for caption, header, rows in sweep_tables(sweep):
        out += [f"**{caption}**", "", md_table(header, rows), ""]
    if figure:
        out += [f"![each quantity against depth]({figure})", ""]
    out += ["## Flags", ""] + md_flags(sweep.flags)
    lists = _type_lists_md(sweep)
    if lists:
        out += ["", "## Context-specific token types", ""] + lists
    out += ["", "## Notes", ""] + [f"- {n}" for n in sweep.notes]
    out += ["", f"*saegeo {sweep.saegeo_version}, sweep schema {sweep.schema_version}.*", ""]
    return "\n".join(out)


# (title, y-axis label, [(row key, series label)]) of each panel of the sweep figure
PANELS: list[tuple[str, str, list[tuple[str, str]]]] = [
    ("mean pairwise cosine", "A", [("A", "A"), ("A_null", "sign-aware null")]),
    ("offset ‖m̂‖", "‖m̂‖ (norm of the mean unit row)", [("offset", "‖m̂‖")]),
    ("‖μ‖² and tr Σ", "squared norm", [("mean_sq_norm", "‖μ‖²"), ("total_variance", "tr Σ")]),
    ("mean share ‖μ‖²/tr S", "share of E‖x‖²", [("mean_share", "mean share")]),
    ("effective rank", "erank", [("erank", "erank"), ("noise_erank", "isotropic noise")]),
    ("top eigenvalue shares", "share of tr Σ", [("top1", "top-1"), ("top10", "top-10")]),
    ("IsoScore", "IsoScore (1 = isotropic)", [("isoscore", "IsoScore")]),
    ("MP spikes and rogue dims", "count", [("mp_spikes", "MP spikes"), ("rogue_50", "rogue dims (50% of ‖m̂‖²)")]),
    ("between-type share of tr Σ", "share", [("between_share", "corrected"), ("between_share_plugin", "plug-in")]),
    (
        "similarity minus A",
        "cosine above A",
        [("self_similarity_adjusted", "SelfSim − A"), ("intra_window_adjusted", "IntraWindow − A")],
    ),
    ("corr(‖μ_t‖², var_t)", "correlation", [("norm_variance_corr", "count-weighted")]),
    (
        "|corr(PC1, ·)|",
        "|correlation|",
        [
            ("pc1_abs_corr_log_frequency", "log frequency"),
            ("pc1_abs_corr_position", "position"),
            ("pc1_abs_corr_norm", "‖x‖"),
        ],
    ),
]
# why a series can have no value at any layer (said in its panel instead of an empty legend entry)
MISSING_REASON = {"mp_spikes": "none counted (no flat MP bulk at any layer;\nthe table gives the power-law slope α)"}


def sweep_plot(sweep: LayerSweep) -> Figure:
    """One Figure: a panel per quantity (PANELS) against depth, legends beneath the axes, a series that no layer
    measured named in its panel with the reason (made without pyplot: the caller's backend is left alone)."""
    from matplotlib.ticker import MaxNLocator

    panels = PANELS + ([DECODER_PANEL] if any("decoder_power_law_alpha" in r for r in sweep.layers) else [])
    n_rows = -(-len(panels) // 3)
    fig = new_figure(figsize=(12, 3.5 * n_rows), layout="constrained")
    axes = fig.subplots(n_rows, 3)
    for ax in axes.flat[len(panels) :]:
        ax.set_visible(False)
    depth = [r["layer"] if r["layer"] is not None else i for i, r in enumerate(sweep.layers)]
    for ax, (title, ylabel, series) in zip(axes.flat, panels):
        missing = False
        for key, label in series:
            pts = [(x, r[key]) for x, r in zip(depth, sweep.layers) if r.get(key) is not None]
            if pts:
                ax.plot(*zip(*pts), "o-", ms=4, label=label)
            else:
                missing = True  # said in the legend, beneath the axes: an empty entry with the reason
                ax.plot([], [], " ", label=f"{label}: " + MISSING_REASON.get(key, "not measured at any layer"))
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("layer (blocks applied)", fontsize=8)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # a layer is a count of blocks: no 1.5
        ax.set_ylabel(ylabel, fontsize=8)
        if len(series) > 1 and ax.get_legend_handles_labels()[0]:  # a panel with one series needs no legend
            ncol = 1 if missing else 3
            ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=ncol, frameon=False)
    fig.suptitle(_title(sweep), fontsize=11)
    return fig


def sweep_figure(sweep: LayerSweep) -> bytes:
    """The sweep figure as PNG bytes (what the writers embed and save)."""
    return png(sweep_plot(sweep), dpi=100)  # 12 inches: the page's width


def render_sweep_html(sweep: LayerSweep, png: bytes | None = None) -> str:
    png = png if png is not None else sweep_figure(sweep)
    return html_page(_title(sweep), sweep_html_parts(sweep, png))


def sweep_html_parts(sweep: LayerSweep, png: bytes, *, summary: bool = True) -> list[str]:
    """The sweep page's body (the page and the notebook display): the tables, the figure, flags, notes and
    (``summary``) the terminal summary."""
    e = html.escape
    parts = []
    for caption, header, rows in sweep_tables(sweep):
        parts += html_grid(header, rows, caption=caption, text_columns=(0, 1))
    parts.append("<h2>Each quantity against depth</h2>")
    parts.append(
        html_figure(
            "sweep",
            png,
            "One panel per quantity of the tables, against the number of blocks applied; a quantity no layer "
            "measured is named in its panel with the reason.",
        )
    )
    parts += ["<h2>Flags</h2>"] + html_flags(sweep.flags)
    parts.append("<h2>Notes</h2><ul>" + "".join(f"<li>{e(n)}</li>" for n in sweep.notes) + "</ul>")
    if summary:
        parts.append(f"<h2>Terminal summary</h2><pre>{e(render_sweep_terminal(sweep))}</pre>")
    return parts


def write_sweep(
    sweep: LayerSweep, out_dir: str | os.PathLike, formats: Sequence[str] = SWEEP_FORMATS
) -> dict[str, Path]:
    """summary.txt, sweep.json, sweep.md (+ sweep.png beside it), sweep.html in ``out_dir``; returns {format: path}."""
    png = sweep_figure(sweep) if {"md", "html"} & set(formats) else None
    names = rendering_names("sweep")
    writers = {
        "terminal": (names["terminal"], lambda: render_sweep_terminal(sweep)),
        "json": (names["json"], lambda: sweep.to_json()),
        "md": (names["md"], lambda: render_sweep_markdown(sweep, figure="sweep.png")),
        "html": (names["html"], lambda: render_sweep_html(sweep, png)),
    }

    def write(out: Path) -> dict[str, Path]:
        if "md" in formats:
            atomic_write(out / "sweep.png", png)
        return write_renderings(out, formats, writers)

    return write_output_set(out_dir, formats, SWEEP_FORMATS, "sweep", write)


def sweep_block(sweep: LayerSweep) -> str:
    return html_block(_title(sweep), sweep_html_parts(sweep, sweep_figure(sweep), summary=False))
