"""Latent cards and the per-latent table as files and text: latents.json (the document), latents.csv (one row
per SAE and latent), the terminal and Markdown cards; latents.html comes from ``render_latents_html``.

``latents_document(page)``     the latents.json dict of a GeometryReport (or the document itself, as given).
``latents_csv(doc)``           the table of every latent of every SAE as CSV.
``render_latents_terminal(doc, max_contexts=5)`` / ``render_latents_markdown(doc)``   the cards as text.
``write_latents(doc, out_dir, formats)``   summary.txt, latents.md, latents.json + latents.csv, latents.html.
"""

from __future__ import annotations

import csv
import html
import io
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from saegeo.io import dump_json, json_safe
from saegeo.render.base import (
    LATENT_FILES,
    fmt_num,
    fmt_pct,
    html_page,
    md_table,
    output_dir,
    rendering_names,
    write_renderings,
)
from saegeo.report.latents import LATENTS_SCHEMA_VERSION, TABLE_COLUMNS

SPARK = "▁▂▃▄▅▆▇█"


# =========================================================================== the document
def latents_document(page: Any) -> dict[str, Any]:
    """The latents.json dict: {schema_version, kind, source, saes: [{name, d_sae, n_tokens, latent_info,
    latents, latent_table}]} of a GeometryReport (SAEs without a latent table left out); a dict is returned
    as it is (the document of `saegeo latents`)."""
    if isinstance(page, Mapping):
        return dict(page)
    return json_safe(
        {
            "schema_version": LATENTS_SCHEMA_VERSION,
            "kind": "latents",
            "saegeo_version": page.saegeo_version,
            "source": page.source,
            "saes": [
                {
                    "name": s.name,
                    "d_sae": s.d_sae,
                    "n_tokens": s.n_tokens,
                    "latent_info": s.latent_info,
                    "latents": s.latents,
                    "latent_table": s.latent_table,
                }
                for s in page.saes
                if s.latent_table is not None
            ],
        }
    )


def has_latents(page: Any) -> bool:
    """Whether ``page`` (a report or a document) has a latent table to write."""
    saes = page.get("saes", []) if isinstance(page, Mapping) else getattr(page, "saes", [])
    return any((s.get("latent_table") if isinstance(s, Mapping) else getattr(s, "latent_table", None)) for s in saes)


def _csv_value(v: Any) -> Any:
    if v is None:
        return ""
    if isinstance(v, bool):
        return "true" if v else "false"
    return repr(v) if isinstance(v, float) else v


def latents_csv(doc: Mapping[str, Any]) -> str:
    """One row per (SAE, latent): sae, then ``TABLE_COLUMNS``; empty for None, true/false for booleans,
    floats written exactly (repr)."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(["sae", *TABLE_COLUMNS])
    for s in doc["saes"]:
        table = s["latent_table"]
        for i in range(len(table["id"])):
            writer.writerow([s["name"], *(_csv_value(table[c][i]) for c in TABLE_COLUMNS)])
    return buf.getvalue()


# =========================================================================== text
def sparkline(histogram: Mapping[str, list]) -> str:
    """The histogram's counts as block characters, with its first and last edge: "0.01 ▁▃█▅▁ 7.2"."""
    counts = histogram.get("counts") or []
    if not counts:
        return "—"
    top = max(counts)
    bars = "".join(SPARK[min(len(SPARK) - 1, (len(SPARK) * c) // (top + 1))] if c else " " for c in counts)
    edges = histogram["edges"]
    return f"{fmt_num(edges[0], 2)} {bars} {fmt_num(edges[-1], 2)}"


def _shown(text: str | None) -> str:
    """A token as one visible piece of a line: newlines and tabs escaped."""
    return "" if text is None else text.replace("\n", "\\n").replace("\t", "\\t")


def context_line(ctx: Mapping[str, Any], decoded: bool = True) -> str:
    """'preceding⟦token⟧following': decoded pieces joined as they are (they carry their own spacing), token ids
    ("#id") with spaces; "" without ids."""
    if ctx.get("token_id") is None:
        return ""
    sep = "" if decoded else " "
    before = sep.join(_shown(t) for t in ctx.get("context", []))
    after = sep.join(_shown(t) for t in ctx.get("after", []))
    return f"{before}{sep}⟦{_shown(ctx.get('text'))}⟧{sep}{after}".strip()


def card_header(card: Mapping[str, Any]) -> str:
    return (
        f"latent {card['id']}  [{', '.join(card['why'])}]  rate {fmt_pct(card['firing_rate'])}  "
        f"E[a] {fmt_num(card['mean_activation'])}  E[a²] {fmt_num(card['mean_sq_activation'])}  "
        f"cos(w, μ) {fmt_num(card['cos_mu'])}  cone {fmt_num(card['cone_share'])}  ‖w‖ {fmt_num(card['decoder_norm'])}"
        + ("  DEAD" if card.get("dead") else "")
        + ("  DENSE" if card.get("dense") else "")
    )


def _neighbours(card: Mapping[str, Any]) -> str:
    return ", ".join(f"{n['id']} ({fmt_num(n['cos'])})" for n in card.get("neighbours", [])) or "—"


def render_latents_terminal(doc: Mapping[str, Any], *, max_contexts: int = 5) -> str:
    """Every card of every SAE: header, neighbours, histogram sparkline, the first ``max_contexts`` contexts."""
    out = []
    for s in doc["saes"]:
        info = s.get("latent_info") or {}
        out.append(
            f"LATENTS  {s['name']}  ({len(s['latents'])} card(s), {s['d_sae']:,} latents, {s['n_tokens']:,} tokens)"
        )
        if info.get("note"):
            out.append(f"  note: {info['note']}")
        for card in s["latents"]:
            out.append("  " + card_header(card))
            out.append(f"      neighbours {_neighbours(card)}")
            out.append(f"      activations {sparkline(card['histogram'])}")
            for ctx in card["top_contexts"][:max_contexts]:
                line = context_line(ctx, info.get("decoded", True))
                out.append(f"      {fmt_num(ctx['activation']):>9}  row {ctx['row']:<9} {line}")
            if len(card["top_contexts"]) > max_contexts:
                out.append(f"      … {len(card['top_contexts']) - max_contexts} more contexts in latents.json")
    return "\n".join(out) + "\n"


def render_latents_markdown(doc: Mapping[str, Any]) -> str:
    """The cards as Markdown: per SAE a section, per latent its header line and a table of its contexts."""
    out = ["# Latent cards", ""]
    for s in doc["saes"]:
        out += [f"## {s['name']}", ""]
        decoded = (s.get("latent_info") or {}).get("decoded", True)
        note = (s.get("latent_info") or {}).get("note")
        if note:
            out += [f"*{note}*", ""]
        for card in s["latents"]:
            out += [f"### {card_header(card)}", "", f"neighbours: {_neighbours(card)}", ""]
            out += [f"activations: `{sparkline(card['histogram'])}`", ""]
            rows = [
                [
                    fmt_num(c["activation"]),
                    str(c["row"]),
                    f"`{context_line(c, decoded)}`" if c.get("token_id") is not None else "",
                ]
                for c in card["top_contexts"]
            ]
            if rows:
                out += [md_table(["activation", "row", "context ⟦token⟧"], rows), ""]
    return "\n".join(out) + "\n"


def render_latents_html(doc: Mapping[str, Any]) -> str:
    """The latents page (self-contained). A plain rendering of the cards; the pages helper owns its look."""
    e = html.escape
    parts = []
    for s in doc["saes"]:
        decoded = (s.get("latent_info") or {}).get("decoded", True)
        parts.append(f"<h2>{e(s['name'])}</h2>")
        for card in s["latents"]:
            parts.append(f"<h3 id='latent-{card['id']}'>{e(card_header(card))}</h3>")
            parts.append(f"<p>neighbours: {e(_neighbours(card))}</p>")
            parts.append("<table><tr><th>activation</th><th>row</th><th>context</th></tr>")
            for c in card["top_contexts"]:
                parts.append(
                    f"<tr><td>{e(fmt_num(c['activation']))}</td><td>{c['row']}</td>"
                    f"<td style='text-align:left'>{e(context_line(c, decoded))}</td></tr>"
                )
            parts.append("</table>")
    return html_page("saegeo latents", parts)


# =========================================================================== files
def write_latent_files(doc: Mapping[str, Any], out: Path) -> dict[str, Path]:
    """latents.csv and latents.json into ``out`` (atomically): {"latents_csv": path, "latents_json": path}."""
    return write_renderings(
        out,
        ("latents_csv", "latents_json"),
        {
            "latents_csv": (LATENT_FILES[0], lambda: latents_csv(doc)),
            "latents_json": (LATENT_FILES[1], lambda: dump_json(doc)),
        },
    )


def write_latents(
    page: Any, out_dir: str | os.PathLike, formats: Sequence[str] = ("terminal", "md", "json", "html")
) -> dict[str, Path]:
    """`saegeo latents` output: summary.txt, latents.md, latents.json + latents.csv (json), latents.html."""
    doc = latents_document(page)
    out = output_dir(out_dir, formats, ("terminal", "md", "json", "html"), "latents")
    names = rendering_names("latents")
    written = write_renderings(
        out,
        [f for f in formats if f != "json"],
        {
            "terminal": (names["terminal"], lambda: render_latents_terminal(doc)),
            "md": (names["md"], lambda: render_latents_markdown(doc)),
            "html": (names["html"], lambda: render_latents_html(doc)),
        },
    )
    if "json" in formats:
        written.update(write_latent_files(doc, out))
    return written
