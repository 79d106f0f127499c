"""The latents in HTML: the per-latent table of an SAE (every latent; sorts, filters, rows rendered lazily from
embedded JSON by a small inline script, no network) whose rows open the latent's card (top contexts with the
activating token marked, activation histogram, stats, nearest latents by decoder cosine), and the latents page.

``latent_section_html(name, table, cards) -> list[str]``   one SAE's table and cards (the report's and the latents page's).
``latent_card_html(card, name) -> str``                     one card.
``histogram_svg(edges, counts) -> str``                     a small inline SVG of an activation histogram.
``render_latents_html(doc) -> str``                       the page of a latents.json document (one section per SAE).

``table`` is column-oriented, {column: [one value per latent]} (LATENT_COLUMNS; ``id`` required, others
optional); ``cards`` a list of card dicts ({id, why, firing_rate, mean_activation, mean_sq_activation, cos_mu,
cone_share, decoder_norm, dead, dense, histogram{edges, counts}, neighbours[{id, cos}], top_contexts[{row,
activation, token_id, position, text, context, after}]}).

Files and text:
``latents_document(page)``     the latents.json dict of a GeometryReport (or the document itself, as given).
``latents_csv(doc)``           the table of every latent of every SAE as CSV.
``render_latents_terminal(doc, max_contexts=5)`` / ``render_latents_markdown(doc)``   the cards as text.
``write_latents(doc, out_dir, formats)``   summary.txt, latents.md, latents.json + latents.csv, latents.html.
"""

from __future__ import annotations

import csv
import html
import io
import json
import math
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from saegeo.io import dump_json, json_safe
from saegeo.render.common import (
    LATENT_FILES,
    fmt_num,
    fmt_pct,
    html_page,
    md_table,
    rendering_names,
    write_output_set,
    write_renderings,
)
from saegeo.report.latent_cards import LATENTS_SCHEMA_VERSION, TABLE_COLUMNS

# (column key in the table, header, what the JS sort/format treats it as)
LATENT_COLUMNS: list[tuple[str, str, str]] = [
    ("id", "latent", "int"),
    ("rate", "firing rate", "num"),
    ("mean_activation", "E[a]", "num"),
    ("mean_sq_activation", "E[a²]", "num"),
    ("cos_mu", "cos(u_i, μ)", "num"),
    ("cone_share", "cone share c_i", "num"),
    ("decoder_norm", "‖u_i‖", "num"),
    ("dead", "dead", "bool"),
    ("dense", "dense", "bool"),
    ("nn_id", "nearest", "int"),
    ("nn_cos", "cos(nearest)", "num"),
    ("norm_corr", "r(a, ‖x‖)", "num"),
    ("position_corr", "r(a, position)", "num"),
    ("log_frequency_corr", "r(a, log freq)", "num"),
]
INITIAL_ROWS = 100  # rows rendered at first and per "show more": a 100k-latent table stays usable

LATENTS_CSS = """.latents .scroll{max-height:80vh;overflow-y:auto;display:inline-block}
.latents thead th{position:sticky;top:0;background:#fff;z-index:1}.latents .controls{margin:.4em 0}.latents input.filter{width:28em;font:inherit}
.latents input.bad{outline:2px solid #b00}.latents th{cursor:pointer;user-select:none}
.latents th.asc::after{content:' ▲'}.latents th.desc::after{content:' ▼'}
.latents tr.lat:hover{background:#f2f6ff;cursor:pointer}.latents tr.lat.has-card td:first-child{font-weight:bold}
.latents tr.open{background:#eef3ff}.latents td.cardcell{text-align:left;white-space:normal;background:#fafafa}
.card{border:1px solid #bbb;border-radius:4px;padding:.5em .8em;margin:.3em 0;background:#fff;max-width:1180px}
.card{overflow-x:auto}.card h4{margin:.2em 0 .4em}.card .top{display:flex;flex-wrap:wrap;gap:1.2em;align-items:flex-start}
.card table.ctx th:last-child{text-align:left}.card table.ctx td{text-align:left;white-space:normal;font-family:ui-monospace,monospace;font-size:.85em}
.card table.ctx td.num{text-align:right;white-space:nowrap;font-family:inherit}
.card .after{color:#888}.card .tok{white-space:pre;border-right:1px solid #e4e4e4;padding:0 1px}.card mark{background:#ffd54f;padding:0 1px;border-radius:2px;font-weight:bold}.card svg{display:block}"""

LATENTS_JS = r"""(function(){
const fmt = (v, kind) => {
  if (v === null || v === undefined || (typeof v === 'number' && !isFinite(v))) return '—';
  if (kind === 'bool') return v ? 'yes' : '';
  if (kind === 'int') return v < 0 ? '—' : String(v);  // nn_id −1: a zero decoder row has no neighbour
  const a = Math.abs(v);
  return (a !== 0 && (a >= 1e5 || a < 1e-3)) ? v.toExponential(2) : v.toFixed(3);
};
const OPS = {'<': (a, b) => a < b, '<=': (a, b) => a <= b, '>': (a, b) => a > b, '>=': (a, b) => a >= b,
             '=': (a, b) => a === b, '==': (a, b) => a === b, '!=': (a, b) => a !== b};
function parse(text, keys) {  // "1200 2902", "rate>0.5 cos_mu<-0.2", "dense", "card": all must hold
  const ids = [], tests = [];
  for (const tok of text.split(/[\s,]+/).filter(Boolean)) {
    let m;
    if (/^\d+$/.test(tok)) ids.push(Number(tok));
    else if ((m = tok.match(/^([a-z_]+)(<=|>=|==|!=|<|>|=)(-?[\d.]+(?:e-?\d+)?)$/i)) && keys.includes(m[1]))
      tests.push([m[1], OPS[m[2]], Number(m[3])]);
    else if (keys.includes(tok)) tests.push([tok, (a) => !!a, null]);
    else if (tok === 'card') tests.push(['__card', (a) => !!a, null]);
    else return null;
  }
  return {ids: new Set(ids), tests};
}
function init(box) {
  const data = JSON.parse(box.querySelector('script.lt-data').textContent);
  const cols = data.columns, rows = data.rows, n = rows.id.length;
  const cards = new Map([...box.querySelectorAll('template.lt-card')].map(t => [Number(t.dataset.id), t]));
  rows.__card = rows.id.map(i => cards.has(i));
  const keys = cols.map(c => c.key);
  const tbody = box.querySelector('tbody'), more = box.querySelector('button.more');
  const input = box.querySelector('input.filter'), count = box.querySelector('.count');
  let view = [...Array(n).keys()], shown = 0, sortKey = null, sortDir = 1;
  function rowEl(i) {
    const tr = document.createElement('tr');
    tr.className = 'lat' + (rows.__card[i] ? ' has-card' : '');
    tr.dataset.id = rows.id[i];
    for (const c of cols) {
      const td = document.createElement('td');
      td.textContent = fmt(rows[c.key] ? rows[c.key][i] : null, c.kind);
      tr.appendChild(td);
    }
    tr.addEventListener('click', () => toggle(tr, i));
    return tr;
  }
  function toggle(tr, i) {
    const next = tr.nextElementSibling;
    if (next && next.classList.contains('card-row')) { next.remove(); tr.classList.remove('open'); return; }
    const row = document.createElement('tr'), td = document.createElement('td');
    row.className = 'card-row'; td.className = 'cardcell'; td.colSpan = cols.length;
    const t = cards.get(rows.id[i]);
    if (t) td.appendChild(t.content.cloneNode(true));
    else {
      const div = document.createElement('div');
      div.className = 'card';
      div.textContent = 'latent ' + rows.id[i] + ': no top contexts collected for it in this pass (' +
        cols.filter(c => c.key !== 'id').map(c => c.label + ' ' + fmt(rows[c.key] ? rows[c.key][i] : null, c.kind))
          .join(', ') + '). ' + data.hint;
      td.appendChild(div);
    }
    row.appendChild(td); tr.after(row); tr.classList.add('open');
  }
  function addRows(k) {
    const frag = document.createDocumentFragment();
    for (const i of view.slice(shown, shown + k)) frag.appendChild(rowEl(i));
    tbody.appendChild(frag); shown = Math.min(view.length, shown + k);
    more.hidden = shown >= view.length;
    more.textContent = 'show ' + Math.min(data.page, view.length - shown) + ' more (' + (view.length - shown) + ' left)';
    count.textContent = view.length + ' of ' + n + ' latents' + (shown < view.length ? ', ' + shown + ' shown' : '');
  }
  function redraw() { tbody.textContent = ''; shown = 0; addRows(data.page); }
  function apply() {
    const q = parse(input.value, keys);
    input.classList.toggle('bad', q === null);
    if (q === null) return;
    let idx = [...Array(n).keys()].filter(i => (!q.ids.size || q.ids.has(rows.id[i])) &&
      q.tests.every(([k, f, v]) => rows[k] && rows[k][i] !== null && f(rows[k][i], v)));
    if (sortKey) {
      const col = rows[sortKey];
      idx.sort((a, b) => {
        const x = col[a], y = col[b];
        if (x === null) return 1; if (y === null) return -1;
        return (x < y ? -1 : x > y ? 1 : 0) * sortDir;
      });
    }
    view = idx; redraw();
  }
  box.querySelectorAll('th[data-key]').forEach(th => th.addEventListener('click', () => {
    const k = th.dataset.key;
    sortDir = (sortKey === k) ? -sortDir : (th.dataset.kind === 'num' ? -1 : 1); sortKey = k;
    box.querySelectorAll('th').forEach(h => h.classList.remove('asc', 'desc'));
    th.classList.add(sortDir > 0 ? 'asc' : 'desc'); apply();
  }));
  input.addEventListener('input', apply);
  more.addEventListener('click', () => addRows(data.page));
  box.querySelectorAll('a.open-latent').forEach(a => a.addEventListener('click', ev => {
    ev.preventDefault(); input.value = a.dataset.id; apply();
    const tr = tbody.querySelector('tr.lat'); if (tr) tr.click();
  }));
  apply();
}
// idempotent: a notebook runs this once per output; each box is set up once, the document listener added once
document.querySelectorAll('.latents:not([data-ready])').forEach(box => { box.dataset.ready = '1'; init(box); });
if (window.saegeoLatentLinks) return;
window.saegeoLatentLinks = true;
document.addEventListener('click', ev => {  // a latent a flag names: its table filtered to it, its card open
  const a = ev.target.closest('a.to-latent'), box = a && document.getElementById(a.dataset.box);
  if (!box) return;
  ev.preventDefault();
  const input = box.querySelector('input.filter');
  input.value = a.dataset.id; input.dispatchEvent(new Event('input'));
  const tr = box.querySelector('tbody tr.lat');
  if (tr && !tr.classList.contains('open')) tr.click();
  box.scrollIntoView();
});
})();"""


def latent_table_id(name: str) -> str:
    """The element id of an SAE's per-latent table (flags link their latents to it)."""
    return f"latents-{_slug(name)}"


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]+", "-", name).strip("-") or "sae"


def _compact(v: Any) -> Any:
    """A JSON-friendly value at 4 significant digits (the table shows 3); NaN/inf → null."""
    if isinstance(v, bool) or v is None or isinstance(v, int):
        return v
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return float(f"{x:.4g}") if math.isfinite(x) else None


def histogram_svg(edges: Sequence[float], counts: Sequence[float], *, width: int = 300, height: int = 90) -> str:
    """Bars of an activation histogram on a log₁₀(1 + count) scale, with its range beneath (inline SVG)."""
    counts = [float(c) for c in counts]
    if not counts or len(edges) != len(counts) + 1:
        return "<p class='ev'>no histogram</p>"
    top = max(math.log10(1 + c) for c in counts) or 1.0
    plot_h, bw = height - 18, width / len(counts)
    bars = "".join(
        f"<rect x='{i * bw:.2f}' y='{plot_h - plot_h * math.log10(1 + c) / top:.2f}' width='{max(bw - 0.5, 0.5):.2f}' "
        f"height='{plot_h * math.log10(1 + c) / top:.2f}' fill='#4c72b0'><title>[{fmt_num(edges[i])}, "
        f"{fmt_num(edges[i + 1])}): {int(c):,}</title></rect>"
        for i, c in enumerate(counts)
        if c > 0
    )
    e = html.escape
    label = (
        f"<text x='0' y='{height - 4}' font-size='10'>{e(fmt_num(edges[0]))}</text>"
        f"<text x='{width / 2}' y='{height - 4}' font-size='10' text-anchor='middle'>activation → (height: log count)</text>"
        f"<text x='{width}' y='{height - 4}' font-size='10' text-anchor='end'>{e(fmt_num(edges[-1]))}</text>"
    )
    return (
        f"<svg role='img' aria-label='activation histogram' width='{width}' height='{height}' "
        f"viewBox='0 0 {width} {height}'>"
        f"<line x1='0' y1='{plot_h}' x2='{width}' y2='{plot_h}' stroke='#888'/>{bars}{label}</svg>"
    )


def _tokens_html(part: Any) -> str:
    """A run of tokens, each in its own box (a list, each token as decoded alone, so word pieces stay
    visibly apart: ``##ing``, `` the``), or a string as it is; escaped."""
    e = html.escape
    if isinstance(part, list):
        return "<wbr>".join(f"<span class='tok'>{e(str(t))}</span>" for t in part)  # a line breaks between tokens
    return e(str(part or ""))


def _context_html(ctx: Mapping[str, Any]) -> str:
    """The preceding tokens, the activating token marked (its id where no tokenizer decoded it), then the
    following tokens greyed."""
    e = html.escape
    token = ctx.get("text")
    token = f"#{ctx.get('token_id')}" if token in (None, "") else str(token)
    after = _tokens_html(ctx.get("after"))
    return (
        f"{_tokens_html(ctx.get('context'))}<mark title='token id {e(str(ctx.get('token_id')))}'>{e(token)}</mark>"
        + (f"<span class='after'>{after}</span>" if after else "")
    )


def _firing_rate(rate: float | None) -> str:
    """A rate as a percentage; below 0.1 % with two significant digits, so a latent that fired is never "0.0%"."""
    if rate is None:
        return "—"
    return f"{100 * rate:.2g}%" if 0 < rate < 1e-3 else fmt_pct(rate)


def latent_card_html(card: Mapping[str, Any], name: str = "") -> str:
    """One latent's card: why it is shown, its stats, histogram, nearest latents, and its top contexts
    (highest activation first) with the activating token marked."""
    e = html.escape
    lid = card["id"]
    stats = [
        ("firing rate", _firing_rate(card.get("firing_rate"))),
        ("E[a]", fmt_num(card.get("mean_activation"))),
        ("E[a²]", fmt_num(card.get("mean_sq_activation"))),
        ("cos(u_i, μ)", fmt_num(card.get("cos_mu"))),
        ("cone share c_i", fmt_num(card.get("cone_share"))),
        ("‖u_i‖", fmt_num(card.get("decoder_norm"))),
        ("dead / dense", f"{'yes' if card.get('dead') else 'no'} / {'yes' if card.get('dense') else 'no'}"),
    ]
    stat_rows = "".join(f"<tr><td>{e(k)}</td><td>{e(v)}</td></tr>" for k, v in stats)
    neighbours = card.get("neighbours") or []
    nn = (
        "<table><tr><th>nearest</th><th>cos(u_i, u_j)</th></tr>"
        + "".join(f"<tr><td>{int(n['id'])}</td><td>{e(fmt_num(n.get('cos')))}</td></tr>" for n in neighbours)
        + "</table>"
        if neighbours
        else "<p class='ev'>no neighbours</p>"
    )
    hist = card.get("histogram") or {}
    contexts = card.get("top_contexts") or []
    ctx_rows = "".join(
        f"<tr><td class='num'>{i + 1}</td><td class='num'>{e(fmt_num(c.get('activation')))}</td>"
        f"<td class='num'>{e(str(c.get('row')))}</td><td class='num'>{e(str(c.get('position', '—')))}</td>"
        f"<td>{_context_html(c)}</td></tr>"
        for i, c in enumerate(contexts)
    )
    ctx = (
        "<table class='ctx'><tr><th>#</th><th>activation</th><th>store row</th><th>position</th>"
        f"<th>context → <mark>token</mark></th></tr>{ctx_rows}</table>"
        if contexts
        else "<p class='ev'>no top contexts (the latent never fired in the pass, or none were collected)</p>"
    )
    heading = f"<p><b>top {len(contexts)} contexts</b> (highest activation first)</p>" if contexts else ""
    why = card.get("why")
    why = ", ".join(map(str, why)) if isinstance(why, list) else why
    why = f" — {e(str(why))}" if why else ""
    where = f"{e(name)}: " if name else ""
    return (
        f"<div class='card' id='card-{_slug(name)}-{lid}'><h4>{where}latent {lid}{why}</h4><div class='top'>"
        f"<table>{stat_rows}</table><div>{histogram_svg(hist.get('edges') or [], hist.get('counts') or [])}</div>"
        f"{nn}</div>{heading}{ctx}</div>"
    )


HINT = "For its contexts: saegeo latents SAE --acts STORE --latents ID."


def latent_section_html(
    name: str, table: Mapping[str, Sequence[Any]] | None, cards: Iterable[Mapping[str, Any]] | None
) -> list[str]:
    """One SAE's per-latent table (every latent; click a header to sort, type a filter, click a row for its
    card) and its cards (templates the rows open). Without a table, the cards alone, open."""
    e = html.escape
    cards = list(cards or [])
    if not table or not table.get("id"):
        return [latent_card_html(c, name) for c in cards] or ["<p>No per-latent data.</p>"]
    columns = [(k, label, kind) for k, label, kind in LATENT_COLUMNS if k in table]
    data = {
        "columns": [{"key": k, "label": label, "kind": kind} for k, label, kind in columns],
        "rows": {k: [_compact(v) for v in table[k]] for k, _, _ in columns},
        "page": INITIAL_ROWS,
        "hint": HINT,
    }
    payload = json.dumps(data, separators=(",", ":"), allow_nan=False).replace("</", "<\\/")
    head = "".join(f"<th data-key='{k}' data-kind='{kind}'>{e(label)}</th>" for k, label, kind in columns)
    links = ", ".join(f"<a href='#' class='open-latent' data-id='{int(c['id'])}'>{int(c['id'])}</a>" for c in cards)
    templates = "".join(
        f"<template class='lt-card' data-id='{int(c['id'])}'>{latent_card_html(c, name)}</template>" for c in cards
    )
    return [
        f"<div class='latents' id='{latent_table_id(name)}'>",
        "<div class='controls'><input class='filter' type='search' placeholder='filter: 1200 2902 · rate&gt;0.5 · "
        "cos_mu&lt;-0.2 · dense · card' aria-label='filter latents'> <span class='count'></span></div>",
        (f"<p>Cards (top contexts): {links}. " if cards else "<p>")
        + "Click a header to sort, a row to open its card; bold ids have top contexts.</p>",
        f"<div class='scroll'><table class='lt'><thead><tr>{head}</tr></thead><tbody></tbody></table></div>",
        "<button class='more' type='button' hidden>show more</button>",
        f"<script type='application/json' class='lt-data'>{payload}</script>",
        templates,
        "</div>",
    ]


def render_latents_html(doc: Mapping[str, Any]) -> str:
    """The latents page (`saegeo latents`, a latents.json document): for each SAE its table and cards."""
    e = html.escape
    src = doc.get("source") or {}
    title = " · ".join(str(p) for p in ("saegeo latents", src.get("model"), src.get("hook"), src.get("path")) if p)
    parts = []
    for s in doc.get("saes") or []:
        info = s.get("latent_info") or {}
        parts.append(f"<h2>{e(str(s['name']))}</h2>")
        meta = [f"{s.get('d_sae', len((s.get('latent_table') or {}).get('id') or [])):,} latents"]
        if s.get("n_tokens"):
            meta.append(f"{s['n_tokens']:,} tokens")
        if info.get("tokenizer"):
            meta.append(f"contexts decoded by {info['tokenizer']}")
        if info.get("note"):
            meta.append(str(info["note"]))
        parts.append(f"<p class='ev'>{e(' · '.join(meta))}</p>")
        parts += latent_section_html(str(s["name"]), s.get("latent_table"), s.get("latents"))
    return html_page(title, parts, script=LATENTS_JS, css=LATENTS_CSS)


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
        n = len(table["id"])
        columns = [table.get(c) or [None] * n for c in TABLE_COLUMNS]  # a table written before a column existed
        for i in range(n):
            writer.writerow([s["name"], *(_csv_value(col[i]) for col in columns)])
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
    out = [f"  {f['severity'].upper():8} {f['name']}  {f['summary']}" for f in doc.get("flags", [])]
    out += [f"  note: {n}" for n in doc.get("notes", [])]
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
    names = rendering_names("latents")

    def write(out: Path) -> dict[str, Path]:
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

    return write_output_set(out_dir, formats, ("terminal", "md", "json", "html"), "latents", write)
