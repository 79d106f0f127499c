"""The layer sweep: one accumulator per store, one row per layer in the model's layer order, rendered as a
terminal table, JSON (``layers: [{hook, layer, A, ...}]``), Markdown and HTML with every quantity plotted
against depth.

``sweep_stores(stores, options=SweepOptions(), *, thresholds=None, cache=None) -> LayerSweep``
``layer_row(measures) -> dict``           the row of one store (keys in ROW_DOC).
``render_sweep_terminal / render_sweep_markdown / render_sweep_html(sweep) -> str``, ``sweep_figure(sweep) -> bytes``
``write_sweep(sweep, out_dir, formats) -> dict[str, Path]``   summary.txt, sweep.json, sweep.md (+ sweep.png), sweep.html.

"layer" is the number of blocks applied before the hook (saegeo.activations.cache.hook_depth): 0 for
blocks.0.hook_resid_pre (the embeddings), L + 1 for blocks.L.hook_resid_post.
"""

from __future__ import annotations

import base64
import html
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from saegeo.activations.cache import hook_depth
from saegeo.activations.store import ActivationStore
from saegeo.errors import BadInputError
from saegeo.config import BATCH_ROWS, check, option
from saegeo.io import atomic_write, dump_json, json_safe
from saegeo.report.flags import Flag, FlagThresholds, artifact_flags, sort_flags
from saegeo.report.layers import StoreMeasures, measure_store
from saegeo.report.render import (
    _html_page, _output_dir, _png, fmt_num, fmt_pct, html_flags, md_flags, md_table, rendering_names, terminal_flags,
    write_renderings,
)

SWEEP_SCHEMA_VERSION = 1
SWEEP_FORMATS = ("terminal", "md", "json", "html")

ROW_DOC = {
    "hook": "hook name", "layer": "blocks applied before the hook", "n": "tokens", "d": "width",
    "A": "mean pairwise cosine", "A_null": "sign-aware null", "A_z": "(A − null)/sd", "offset": "‖m̂‖",
    "mean_sq_norm": "‖μ‖²", "total_variance": "tr Σ", "mean_share": "‖μ‖²/tr S", "erank": "effective rank",
    "noise_erank": "erank of isotropic noise of this n, d", "top1": "top-1 eigenvalue share",
    "top10": "top-10 share", "isoscore": "IsoScore", "mp_spikes": "eigenvalues above the calibrated MP edge (None: no flat bulk)",
    "mp_power_law_alpha": "log-log slope of the spectrum when it has no flat MP bulk",
    "z_vs_null": "(A − A_null − finite-d bias) / sd of Â − Â_null",
    "rogue_50": "coordinates carrying 50% of ‖m̂‖²", "rogue_90": "… 90%", "n_types": "distinct token ids",
    "share_tokens_repeated": "share of tokens whose id is seen ≥ 2 times",
    "between_share": "tr(between)/tr Σ (c/(c−1)-corrected within)", "within_share": "1 − between_share",
    "between_share_plugin": "plug-in between/tr Σ", "norm_variance_corr": "count-weighted corr(‖μ_t‖², var_t)",
    "self_similarity": "token-weighted mean SelfSim_t", "self_similarity_adjusted": "… minus A",
    "intra_window": "mean IntraSim over windows", "intra_window_adjusted": "… minus A",
    "pc1_abs_corr_log_frequency": "|corr(PC1, log token frequency)|", "pc1_abs_corr_position": "|corr(PC1, position)|",
    "pc1_abs_corr_norm": "|corr(PC1, ‖x‖)|",
}


@dataclass
class LayerSweep:
    """The sweep: rows in layer order, flags (artifact directions per layer), timings."""

    schema_version: int
    model: str
    layers: list[dict[str, Any]]
    flags: list[Flag]
    seconds: float
    options: dict[str, Any]
    cache: dict[str, Any] | None = None  # how the stores were cached, when the sweep cached them
    notes: list[str] = field(default_factory=list)
    saegeo_version: str = ""

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["flags"] = [f.to_dict() for f in self.flags]
        out["columns"] = ROW_DOC
        return json_safe(out)

    def to_json(self, path: str | os.PathLike | None = None) -> str:
        return dump_json(self.to_dict(), path)


def layer_row(m: StoreMeasures) -> dict[str, Any]:
    """One row of the sweep from one store's measures (keys and meanings in ROW_DOC)."""
    g, tt, art = m.geometry, m.token_types, m.artifact
    depth = hook_depth(m.hook)
    a = g.anisotropy
    pc1 = {name: (art["abs"][name][0] if art and art["k"] else None) for name in ("log_frequency", "position", "norm")}
    sub = lambda v: None if v is None or a is None else v - a  # noqa: E731
    row = {
        "hook": m.hook, "layer": (int(depth) if depth is not None and depth == int(depth) else depth),
        "path": m.path, "model": m.model, "n": g.n, "d": g.d,
        "A": a, "A_null": g.sign.null, "A_z": g.anisotropy_z, "offset": g.offset,
        "mean_sq_norm": g.mean_vector_norm**2, "total_variance": g.total_variance,
        "mean_share": g.mean_share_of_second_moment, "erank": g.effective_rank, "noise_erank": g.noise_effective_rank,
        "top1": g.top1_share, "top10": g.top10_share, "isoscore": g.isoscore, "mp_spikes": g.n_spikes,
        "mp_power_law_alpha": (g.mp_bulk or {}).get("power_law_alpha") if g.n_spikes is None else None,
        "z_vs_null": g.z_vs_null,
        "rogue_50": g.rogue.n_for_50, "rogue_90": g.rogue.n_for_90,
        "n_types": tt.n_types if tt else None, "share_tokens_repeated": tt.share_tokens_repeated if tt else None,
        "between_share": tt.between_share if tt else None, "within_share": tt.within_share if tt else None,
        "between_share_plugin": (tt.between_plugin / tt.total_variance if tt and tt.total_variance > 0 else None),
        "norm_variance_corr": tt.norm_variance_corr if tt else None,
        "self_similarity": tt.self_similarity if tt else None,
        "self_similarity_adjusted": tt.self_similarity_adjusted if tt else None,
        "intra_window": m.intra_window, "intra_window_adjusted": sub(m.intra_window),
        **{f"pc1_abs_corr_{k}": v for k, v in pc1.items()},
        "details": {"token_types": tt.to_dict() if tt else None, "artifact": art, "n_windows": m.n_windows,
                    "memory_bytes": m.memory_bytes, "seconds": m.seconds, "notes": m.notes + list(g.notes)},
    }
    return row


def _order(stores: list[ActivationStore]) -> list[ActivationStore]:
    models = sorted({s.model for s in stores})
    if len(models) > 1:
        raise BadInputError(
            "the sweep is one model's layers, but these stores come from " + ", ".join(
                f"{s.path} ({s.model})" for s in stores) + "; sweep each model separately")
    hooks = [s.hook for s in stores]
    twice = sorted({h for h in hooks if hooks.count(h) > 1})
    if twice:
        raise BadInputError(f"hook(s) {twice} given twice: " + ", ".join(str(s.path) for s in stores if s.hook in twice)
                            + "; pass each layer's store once")
    return sorted(stores, key=lambda s: (hook_depth(s.hook) is None, hook_depth(s.hook) or 0.0, s.hook))


@dataclass
class SweepOptions:
    """`saegeo sweep`: what each store's row measures; with ``model``, which hooks are cached first and where."""

    model: str | None = option(None, "cache first: model to run (as in `saegeo cache --model`)")
    hooks: str = option("all-resid", "with --model: 'all-resid' (blocks.0.hook_resid_pre + every "
                                     "blocks.L.hook_resid_post) or a comma list")
    corpus: str = option("default", "with --model: corpus (as in `saegeo cache`)")
    context: int = option(128, "with --model: tokens per window", low=2)
    max_tokens: int | None = option(None, "tokens per layer (with --model: tokens cached)", low=1)
    cache_dir: str = option("artifacts/acts/sweep", "with --model: where the stores go")
    max_types: int | None = option(None, "keep the most frequent V token types, pool the rest (default: all)", low=1)
    artifact_k: int = option(3, "principal directions in the artifact test", low=0)
    batch_rows: int = option(BATCH_ROWS, "rows per batch", low=1)
    out: str | None = option(None, "directory for summary.txt, sweep.json, sweep.md (+ sweep.png), sweep.html")
    json: str | None = option(None, "write the sweep JSON here")
    overwrite: bool = option(False, "replace output files that exist already (refused otherwise)")
    progress: bool = option(True, "progress bars")
    skip_nonfinite: bool = option(False, "skip and count rows with NaN/inf instead of stopping")
    verify: bool = option(True, "sha256 check of each store shard as it is read")

    def __post_init__(self) -> None:
        check(self)


def sweep_stores(
    stores: Sequence[ActivationStore | str | os.PathLike],
    options: SweepOptions | None = None,
    *,
    thresholds: FlagThresholds | None = None,
    cache: dict[str, Any] | None = None,
) -> LayerSweep:
    """Measure every store (see saegeo.report.layers.measure_store) and lay the rows out in layer order.
    opts.verify=False reads store paths without their sha256; opts.skip_nonfinite skips and counts NaN/inf rows."""
    from saegeo import __version__

    opts = options or SweepOptions(progress=False)
    batch_rows, max_types, artifact_k, max_tokens = opts.batch_rows, opts.max_types, opts.artifact_k, opts.max_tokens
    if not stores:
        raise BadInputError("the sweep needs at least one activation store")
    opened = _order([s if isinstance(s, ActivationStore) else ActivationStore(s, verify=opts.verify) for s in stores])
    t0 = time.perf_counter()
    rows, flags = [], []
    it = opened
    if opts.progress:
        from tqdm.auto import tqdm

        it = tqdm(opened, desc="sweep", unit="layer")
    for store in it:
        m = measure_store(store, batch_rows=batch_rows, max_types=max_types, artifact_k=artifact_k,
                          max_tokens=max_tokens, skip_nonfinite=opts.skip_nonfinite)
        rows.append(layer_row(m))
        flags += artifact_flags(m.artifact, thresholds=thresholds, subject=store.hook)
    notes = [f"artifact test: {rows[0]['details']['artifact']['source']}"]
    options = {"batch_rows": batch_rows, "max_types": max_types, "artifact_k": artifact_k, "max_tokens": max_tokens,
               **({"skip_nonfinite": True} if opts.skip_nonfinite else {})}
    return LayerSweep(SWEEP_SCHEMA_VERSION, opened[0].model, rows, sort_flags(flags), time.perf_counter() - t0,
                      options, cache=cache, notes=notes, saegeo_version=__version__)


# =========================================================================== renderings
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
    ("spikes", lambda r: str(r["mp_spikes"]) if r["mp_spikes"] is not None
     else f"α={fmt_num(r.get('mp_power_law_alpha'), 2)}"),
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
        ids = lambda entries: ", ".join(  # noqa: E731
            f"{e['id']}" + (f" `{e['token']}`" if e.get("token") else "") + f" ({fmt_num(e['adjusted'], 2)})" for e in entries[:5])
        out.append(f"- layer {r['layer']} `{r['hook']}`: most context-specific {ids(tt['most_context_specific'])}; "
                   f"least {ids(tt['least_context_specific'])} (token id, token, SelfSim − A; count ≥ {tt['min_count']})")
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
    ("|corr(PC1, ·)|", [("pc1_abs_corr_log_frequency", "log frequency"), ("pc1_abs_corr_position", "position"),
                        ("pc1_abs_corr_norm", "‖x‖")]),
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
    return _png(fig)


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
    return _html_page(_title(sweep), parts)


def write_sweep(sweep: LayerSweep, out_dir: str | os.PathLike, formats: Sequence[str] = SWEEP_FORMATS) -> dict[str, Path]:
    """summary.txt, sweep.json, sweep.md (+ sweep.png beside it), sweep.html in ``out_dir``; returns {format: path}."""
    out = _output_dir(out_dir, formats, SWEEP_FORMATS, "sweep")
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
