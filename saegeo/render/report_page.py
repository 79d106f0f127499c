"""The report page (a GeometryReport) as terminal summary, Markdown, JSON and self-contained HTML, its figures,
and `write_report`, the one writer of either page's files (a report, or a DictionaryCheck: saegeo.render.check_page).

``render_terminal(report) -> str``   a few lines a person reads first, flags on top.
``render_markdown(report, figure_dir=None) -> str``   tables to paste into a paper or a bug report.
``render_json(report) -> str``       the schema-versioned JSON (``GeometryReport.load`` reads it back).
``render_html(report) -> str``       one file, plots embedded as base64 PNG (no network, no other files).
``report_figures(report) -> dict[str, Figure]``   the plots as matplotlib Figures (no pyplot, backend untouched);
``figures(report) -> dict[str, bytes]``   the same as PNG bytes: spectrum (log-log, MP band), cosines (histogram,
                                     null, isotropic band), latents (firing vs cos(u_i, μ), sized by c_i),
                                     amplification (the law's curves, the measured points, the per-latent law), rogue (shares),
                                     training (loss, FVE, L0 against tokens; only when an SAE has a training log).
``write_report(page, out_dir, formats=("terminal", "md", "json", "html")) -> dict[str, Path]``   either page's files.
"""

from __future__ import annotations

import html
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from saegeo.io import atomic_write
from saegeo.render.check_page import render_check_html, render_check_markdown, render_check_terminal
from saegeo.render.common import (
    FORMATS,
    edge_spike_phrase,
    flag_counts,
    fmt_num,
    fmt_pct,
    html_block,
    html_figure,
    html_flags,
    html_grid,
    html_page,
    html_table,
    md_flags,
    md_table,
    new_figure,
    null_eigenvalue_phrase,
    png,
    rendering_names,
    terminal_flags,
    text_table,
    write_output_set,
    write_renderings,
)
from saegeo.render.latents_page import (
    LATENTS_CSS,
    LATENTS_JS,
    has_latents,
    latent_section_html,
    latent_table_id,
    latents_document,
    write_latent_files,
)
from saegeo.render.text import artifact_text, exclusion_lines
from saegeo.report.dictionary_check import DictionaryCheck
from saegeo.report.flags import Flag
from saegeo.report.geometry_report import GeometryReport, SAEGeometry
from saegeo.report.options import FlagThresholds

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def _title(report: GeometryReport) -> str:
    src = report.source
    parts = ["saegeo report"]
    if src.get("model"):
        parts.append(str(src["model"]))
    if src.get("hook"):
        parts.append(str(src["hook"]))
    parts.append(f"{src.get('n_tokens', report.activations.n):,} tokens × d = {report.activations.d}")
    if report.seconds:
        parts.append(f"{report.seconds:.1f} s ({fmt_num(report.tokens_per_second, 0)} tok/s)")
    return " · ".join(parts)


# =========================================================================== rows shared by the renderers
def activation_lines(report: GeometryReport) -> list[tuple[str, str]]:
    """(label, text) lines summarising the activation geometry."""
    g = report.activations
    s = g.sign
    rogue = g.rogue
    top_rogue = ", ".join(f"{i} ({fmt_pct(p)})" for i, p in zip(rogue.top_indices[:3], rogue.top_shares[:3]))
    bulk = g.mp_bulk or {}
    if g.n_spikes is None and bulk.get("has_flat_bulk"):
        spikes = (
            f"{bulk.get('verdict')}: KS distance {fmt_num(bulk.get('mp_distance'))} to MP "
            f"> {fmt_num(bulk.get('mp_distance_threshold'))} (white noise), so no MP spike count; power-law slope "
            f"α = {fmt_num(bulk.get('power_law_alpha'))}{edge_spike_phrase(bulk)}"
        )
    elif g.n_spikes is None and bulk:
        spikes = (
            f"no flat MP bulk: power law, slope α = {fmt_num(bulk.get('power_law_alpha'))} over ranks "
            f"{bulk.get('power_law_ranks')}{edge_spike_phrase(bulk)}"
        )
    else:
        spikes = (
            f"{g.n_spikes} spike(s) above the calibrated MP edge {fmt_num(g.mp_upper_edge)} "
            f"+ Tracy–Widom {fmt_pct(bulk.get('tracy_widom_quantile'))} margin"
        )
    lines = [
        (
            "cone",
            f"A = {fmt_num(g.anisotropy)} against the sign-aware null {fmt_num(s.null)} ({s.regime}, "
            f"canonical {s.canonical}); offset ‖m̂‖ = {fmt_num(g.offset)}; "
            f"isotropic sd of one cosine 1/√d = {fmt_num(g.isotropic_cosine_sd)}",
        ),
    ]
    if g.null_z is not None:
        lines.append(
            (
                "vs null",
                f"z = {fmt_num(g.null_z, 1)} = (A − null − finite-d bias {fmt_num(g.null_bias)}) "
                f"/ sd {fmt_num(g.null_sd)}; sd of A alone {fmt_num(g.A_sd)}; "
                f"isotropic sd {fmt_num(g.isotropic_sd)} (isotropic z {fmt_num(g.isotropic_z, 1)})",
            )
        )
    elif g.null_z_withheld:
        lines.append(("vs null", f"no z: {g.null_z_withheld}"))
    if g.unit_effective_rank is not None:
        lines.append(
            (
                "unit x̂",
                f"E[x̂x̂ᵀ]: erank {fmt_num(g.unit_effective_rank, 1)} of {g.d}, "
                f"top-1 {fmt_pct(g.unit_top1_share)} (uniform directions: {g.d}, {fmt_pct(1 / g.d)})",
            )
        )
    lines += [
        (
            "mean",
            f"‖μ‖ = {fmt_num(g.mean_vector_norm)}, ‖μ‖/E‖x‖ = {fmt_num(g.mean_norm_ratio)}, "
            f"share of E‖x‖² = {fmt_pct(g.mean_share_of_second_moment)}, γ = ‖μ‖/√trΣ = {fmt_num(g.outlier_severity)}",
        ),
        (
            "spectrum",
            f"erank {fmt_num(g.effective_rank, 1)} of {g.d} (isotropic noise of this n, d: "
            f"{fmt_num(g.noise_effective_rank, 1)}), top-1 {fmt_pct(g.top1_share)}, top-10 {fmt_pct(g.top10_share)}, "
            f"{spikes}, numerical rank {g.numerical_rank}, IsoScore {fmt_num(g.isoscore)}",
        ),
        (
            "MP σ²",
            f"{fmt_num(g.mp_sigma2_bulk)} from the bulk, {fmt_num(g.mp_sigma2_trace)} as tr Σ/d "
            f"({bulk.get('n_spikes_trace_edge', '—')} eigenvalue(s) above that naive edge){null_eigenvalue_phrase(bulk)}",
        ),
        (
            "rogue dims",
            f"{rogue.n_for_50} coordinate(s) carry 50% of the offset, {rogue.n_for_90} carry 90%"
            + (f"; top: {top_rogue}" if top_rogue else ""),
        ),
    ]
    lines += [("excluded" if i == 0 else "", line) for i, line in enumerate(exclusion_lines(report.exclusions or {}))]
    if report.artifact:
        lines.append(("artifact", artifact_text(report.artifact)))
        first = report.artifact.get("first_position")
        if first:
            lines.append(
                (
                    "position 0",
                    f"{first['rows']:,} rows ({fmt_pct(first['row_share'])}) carry "
                    f"{fmt_pct(first['mu_share'])} of ‖μ‖² and {fmt_pct(first['trace_share'])} of tr Σ, "
                    f"RMS norm {fmt_num(first['norm_ratio'], 1)}× the average",
                )
            )
    return lines


def diagnosis_lines(report: GeometryReport) -> list[tuple[str, str]]:
    """(step, text) lines of the activation diagnosis (offset → shape → artifact → fix), with the numbers read."""
    out = []
    for step in getattr(report, "diagnosis", None) or []:
        read = ", ".join(f"{k} = {fmt_num(v) if isinstance(v, float) else v}" for k, v in step.get("read", {}).items())
        out.append((step["step"], f"{step['finding']}" + (f" [{read}]" if read else "")))
    return out


def _with_sd(amp: dict, key: str) -> str:
    """A value with its sampling sd, when the report has one."""
    sd = amp.get(f"{key}_sd")
    return fmt_num(amp.get(key)) + (f" ± {fmt_num(sd, 4) if sd < 0.001 else fmt_num(sd)}" if sd is not None else "")


def _cofiring(s: SAEGeometry) -> str:
    """The co-firing share and its top pair (i&j and the pair's own share)."""
    share = s.amplification.get("cofiring_share")
    if share is None:
        return "—"
    top = (s.cofiring_pairs or [None])[0]
    return f"{share:+.3f}" + (f" (top {top['i']}&{top['j']} {top['share']:+.3f})" if top else "")


def _max_abs_cos(s: SAEGeometry) -> float:
    return max((abs(c) for c in s.cos_decoder_mean), default=0.0)


def _top_share(s: SAEGeometry) -> str:
    """The largest c_i, or why there is none: without a cone in x̂ − b_dec, c_i = x/‖M‖² is noise."""
    a = s.amplification.get("measured_recon_minus_b_dec")
    if s.cone_shares is None or a is None or a < FlagThresholds().cone_min_anisotropy:
        return "— (no cone)"
    return f"{fmt_num(max(s.cone_shares))} (latent {s.top_latents()[0]})"


def _cone_null(s: SAEGeometry) -> str:
    """Which null A of x̂ − b_dec is read against (docs/statistics.md §9): signed (codes of both signs) or
    sign-aware (codes ≥ 0)."""
    a = s.amplification
    if s.cone_null == "signed":
        z, p = a.get("null_z"), a.get("null_p")
        return (
            f"signed: 0 ± {fmt_num(a.get('null_sd'), 4)}"
            + (f", z {z:.1f}" if z is not None else "")
            + (f", p {p:.2g}" if p is not None else "")
            + f" ({fmt_pct(a.get('negative_code_share') or 0.0)} of codes < 0)"
        )
    if s.cone_null == "sign-aware":
        return f"sign-aware q·r = {fmt_num(a.get('null_value'))} (codes ≥ 0)"
    return "—"


def _a_dict(s: SAEGeometry) -> str:
    """A_dict / ‖ū‖² of the rows, and for codes of both signs of the oriented rows too (docs/statistics.md §9)."""
    text = f"{fmt_num(s.a_dict, 4)} / {fmt_num(s.dict_mean_sq_norm, 4)}"
    oriented = s.amplification.get("a_dict_oriented")
    return text + (f" (oriented {fmt_num(oriented, 4)})" if oriented is not None else "")


def _one_rate(s: SAEGeometry, key: str) -> str:
    """A one-rate form of the law, or why it has no number: codes of both signs (docs/statistics.md §9)."""
    value = s.amplification.get(key)
    if value is None and s.cone_null == "signed":
        return "— (not defined for codes of both signs)"
    return fmt_num(value)


SAE_ROWS: list[tuple[str, Callable[[SAEGeometry], str]]] = [
    ("architecture", lambda s: f"{s.architecture or '?'}" + (f" k={s.k}" if s.k else "") + f", {s.d_sae:,} latents"),
    ("b_dec init", lambda s: s.b_dec_init or "not recorded"),
    ("FVE (all rows)", lambda s: fmt_num(s.fve)),
    ("L0 (K, all rows)", lambda s: fmt_num(s.mean_l0, 1)),
    ("FVE / L0 (held out)", lambda s: _heldout(s)),
    ("dead latents", lambda s: f"{s.n_dead:,} ({fmt_pct(s.n_dead / s.d_sae)})"),
    ("dense latents (>50%)", lambda s: f"{s.n_dense:,}"),
    ("‖b_dec − μ‖/‖μ‖", lambda s: fmt_num(s.b_dec_distance_to_mean)),
    ("cos(b_dec, μ)", lambda s: fmt_num(s.b_dec_cos_mean)),
    ("max |cos(u_i, μ)|", lambda s: fmt_num(_max_abs_cos(s))),
    ("top cone share c_i", lambda s: _top_share(s)),
    ("A_dict / ‖ū‖²", lambda s: _a_dict(s)),
    ("dictionary erank", lambda s: fmt_num(s.dictionary_spectrum.get("effective_rank"), 1)),
    ("decoder spectrum power law α", lambda s: _power_law(s)),
    ("dark matter: R² of e / ‖e‖ (5-fold CV)", lambda s: _dark_matter(s)),
    ("  nonlinear error share 1 − R²", lambda s: fmt_num((s.dark_matter or {}).get("nonlinear_share"))),
    ("dense latents: antipodal pairs", lambda s: _dense_pairs(s)),
    ("A of x̂ − b_dec (measured)", lambda s: _with_sd(s.amplification, "measured_recon_minus_b_dec")),
    ("  null it is read against", lambda s: _cone_null(s)),
    ("  law: per-latent, mean-cosine", lambda s: _with_sd(s.amplification, "A_het_mean_cosine")),
    ("  law: per-latent A_het", lambda s: fmt_num(s.amplification.get("A_het"))),
    ("  co-firing share of E‖x̂ − b_dec‖²", lambda s: _cofiring(s)),
    ("  law: one rate, mean-cosine", lambda s: _one_rate(s, "mean_cosine")),
    ("  law: one rate, exact-moment", lambda s: _one_rate(s, "exact_moment")),
    ("  law: one rate, textbook", lambda s: _one_rate(s, "textbook")),
    ("A of x − b_dec", lambda s: fmt_num(s.amplification.get("measured_x_minus_b_dec"))),
    ("CE loss recovered", lambda s: fmt_num(_splice(s, "ce_loss_recovered"), 4)),
    ("KL(clean ‖ spliced)", lambda s: fmt_num(_splice(s, "kl_div_spliced"), 4)),
    (
        "CE clean / spliced",
        lambda s: f"{fmt_num(_splice(s, 'ce_loss_clean'), 4)} / {fmt_num(_splice(s, 'ce_loss_spliced'), 4)}",
    ),
    (
        "CE zero / mean abl.",
        lambda s: (
            f"{fmt_num(_splice(s, 'ce_loss_zero_ablation'), 4)} / {fmt_num(_splice(s, 'ce_loss_mean_ablation'), 4)}"
        ),
    ),
    ("KL(clean ‖ zero)", lambda s: fmt_num(_splice(s, "kl_div_zero_ablation"), 4)),
    ("spliced FVE / L0", lambda s: f"{fmt_num(_splice(s, 'fve'))} / {fmt_num(_splice(s, 'l0'), 1)}"),
    ("embedding cos (spliced)", lambda s: fmt_num(_splice(s, "embedding_cosine_spliced"), 4)),
    ("spliced on", lambda s: _splice_on(s)),
    ("flags", lambda s: "—"),  # filled per report below
]
# rows shown only when some SAE was spliced into the model (saegeo report --model, the run's [eval])
SPLICE_ROWS = {
    "CE loss recovered",
    "KL(clean ‖ spliced)",
    "CE clean / spliced",
    "CE zero / mean abl.",
    "KL(clean ‖ zero)",
    "spliced FVE / L0",
    "spliced on",
}
ENCODER_SPLICE_ROWS = {"embedding cos (spliced)", "spliced FVE / L0", "spliced on"}


# rows shown only when some SAE records them: its b_dec init (saegeo's provenance), the rows its training held out
RECORDED_ROWS = {"b_dec init": lambda s: s.b_dec_init is not None, "FVE / L0 (held out)": lambda s: s.heldout}


def _heldout(s: SAEGeometry) -> str:
    """FVE / L0 over the rows the SAE's training held out of this store (SAEGeometry.heldout)."""
    h = s.heldout
    if not h:
        return "— (rows not recorded)"
    return f"{fmt_num(h['fve'])} / {fmt_num(h['mean_l0'], 1)} ({h['n_tokens']:,} rows)"


def _power_law(s: SAEGeometry) -> str:
    """α of λ_k ∝ k^(−α) over the unit decoder rows' covariance eigenvalues, its fit R² and rank range."""
    spec = s.dictionary_spectrum
    if spec.get("power_law_alpha") is None:
        return "—"
    lo, hi = spec.get("power_law_ranks") or (None, None)
    return f"{fmt_num(spec['power_law_alpha'])} (R² {fmt_num(spec.get('power_law_r2'))}, ranks {lo}–{hi})"


def _dark_matter(s: SAEGeometry) -> str:
    dm = s.dark_matter
    if not dm or "r2_vector" not in dm:
        return "—" if not dm else str(dm.get("error", "—"))
    return (
        f"{fmt_num(dm['r2_vector'])} ± {fmt_num(dm['r2_vector_sd'], 2)} / "
        f"{fmt_num(dm['r2_norm'])} ± {fmt_num(dm['r2_norm_sd'], 2)}"
    )


def _dense_pairs(s: SAEGeometry) -> str:
    """The dense latents, their antipodal pairs, and the squared cosine of μ and of the position direction with the
    pairs' subspace."""
    d = s.dense_structure
    if not d:
        return "—"
    text = f"{d['n_dense']:,} at rate ≥ {fmt_num(d['rate'])}, {len(d.get('pairs') or []):,} pairs"
    sub = d.get("subspace") or {}
    if sub.get("dim") and sub.get("mean") is not None:
        text += f"; μ in their span {fmt_num(sub['mean'])} (chance {fmt_num(sub['chance'])})"
    if sub.get("dim") and sub.get("position") is not None:
        share = (d.get("position_direction") or {}).get("explained_share")
        text += f"; position direction {fmt_num(sub['position'])} (explains {fmt_num(share)} of tr Σ)"
    return text


def _splice(s: SAEGeometry, key: str) -> Any:
    return (s.splice or {}).get(key)


def _splice_on(s: SAEGeometry) -> str:
    if not s.splice:
        return "—"
    passed = s.splice["passed_through"]
    special = ",".join(passed["special_positions"]) or "none passed"
    return f"{s.splice['tokens']:,} tok, {passed['positions']:,} passed ({special})"


def _sae_table(report: GeometryReport) -> tuple[list[str], list[list[str]]]:
    return sae_table(report.saes, report.flags)


def sae_table(saes: list[SAEGeometry], flags: list[Flag]) -> tuple[list[str], list[list[str]]]:
    """The side-by-side table (header, rows): one column per SAE, a row per SAE_ROWS entry (the splice rows only
    when some SAE was spliced), the last row each SAE's flag counts."""
    header = ["", *[s.name for s in saes]]
    rows = []
    spliced = [s.splice for s in saes if s.splice]
    shown = set()
    if any("ce_loss_clean" in r for r in spliced):
        shown |= SPLICE_ROWS
    if any("embedding_cosine_spliced" in r for r in spliced):
        shown |= ENCODER_SPLICE_ROWS
    for label, fn in SAE_ROWS:
        if label in SPLICE_ROWS | ENCODER_SPLICE_ROWS and label not in shown:
            continue
        if label in RECORDED_ROWS and not any(RECORDED_ROWS[label](s) for s in saes):
            continue
        if label == "flags":
            rows += level_rows(saes)
            cells = [flag_counts([f for f in flags if f.subject == s.name]) for s in saes]
        else:
            cells = [fn(s) for s in saes]
        rows.append([label, *cells])
    return header, rows


def level_rows(saes: list[SAEGeometry]) -> list[list[str]]:
    """Two rows per nesting level of the Matryoshka SAEs among `saes` (SAEGeometry.levels), "—" for the others."""
    rows = []
    for i in range(max((len(s.levels or []) for s in saes), default=0)):
        level = [(s.levels or [])[i] if i < len(s.levels or []) else None for s in saes]
        rows.append(
            [f"level {i + 1}: width / FVE / L0 / dead"]
            + [
                "—"
                if v is None
                else f"{v['width']:,} / {fmt_num(v['fve'])} / {fmt_num(v['mean_l0'], 1)} / {fmt_pct(v['dead_share'])}"
                for v in level
            ]
        )
        rows.append(
            [f"  A_dict / cone share / K·A_dict law vs A(x̂_{i + 1} − b_dec)"]
            + [
                "—"
                if v is None
                else f"{fmt_num(v['a_dict'], 4)} / {fmt_num(v['cone_share'])} / "
                f"{fmt_num(v['law_textbook'])} vs {fmt_num(v['measured_recon_minus_b_dec'])}"
                for v in level
            ]
        )
    return rows


# =========================================================================== terminal
def render_terminal(report: GeometryReport, *, max_flags: int = 12) -> str:
    """The summary a person reads first: title, flags (most severe first) with advice, then the numbers."""
    out = [_title(report), ""]
    out += terminal_flags(report.flags, max_flags=max_flags)
    out += ["", "ACTIVATIONS"]
    out += [f"  {label:<11}{text}" for label, text in activation_lines(report)]
    if diagnosis_lines(report):
        out += ["", "DIAGNOSIS"]
        out += [f"  {label:<11}{text}" for label, text in diagnosis_lines(report)]
    if report.saes:
        header, rows = _sae_table(report)
        out += ["", "SAE" + (" (side by side)" if len(report.saes) > 1 else "")]
        out += text_table(header, rows, indent="  ")
    for note in report.notes:
        out.append(f"note: {note}")
    return "\n".join(out) + "\n"


# =========================================================================== markdown
def render_markdown(report: GeometryReport, figure_dir: str | None = None) -> str:
    """Markdown: flags with evidence, the activation geometry, the SAE table, links to figures if written."""
    out = [f"# {_title(report)}", "", f"## Flags ({flag_counts(report.flags)})", ""]
    out += md_flags(report.flags)
    out += ["", "## Activations", "", md_table(["", ""], [[a, b] for a, b in activation_lines(report)])]
    if diagnosis_lines(report):
        out += [
            "",
            "## Diagnosis",
            "",
            md_table(["step", "finding [numbers read]"], [[a, b] for a, b in diagnosis_lines(report)]),
        ]
    if report.saes:
        out += ["", "## SAE" + ("s side by side" if len(report.saes) > 1 else ""), ""]
        out.append(md_table(*_sae_table(report)))
    if figure_dir is not None:
        out += ["", "## Figures", ""]
        names = FIGURE_NAMES + ((TRAINING_FIGURE,) if _has_curve(report) else ())
        out += [f"![{name}]({figure_dir}/{name}.png)" for name in names]
    if report.notes:
        out += ["", "## Notes", ""] + [f"- {n}" for n in report.notes]
    out += ["", f"*saegeo {report.saegeo_version}, report schema {report.schema_version}.*", ""]
    return "\n".join(out)


def render_json(report: GeometryReport) -> str:
    return report.to_json()


# =========================================================================== figures
FIGURE_NAMES = ("spectrum", "cosines", "latents", "amplification", "rogue")  # every report has these
TRAINING_FIGURE = "training"  # only a report with an SAE that has a training log


def _has_curve(report: GeometryReport) -> bool:
    return any(s.training_curve for s in report.saes)


def training_figure(report: GeometryReport) -> Figure | None:
    """Loss, FVE and L0 of each SAE's training log against tokens (the records saegeo.sae.train wrote beside
    the SAE, thinned by the report), one line per SAE; None when no SAE has a log."""
    if not _has_curve(report):
        return None
    fig = new_figure(figsize=(9, 2.6))
    axes = fig.subplots(1, 3)
    losses = []
    for i, s in enumerate(report.saes):
        curve = s.training_curve or {}
        tokens = curve.get("tokens") or []
        for ax, key in zip(axes, ("loss", "fve", "l0")):
            points = [(t, v) for t, v in zip(tokens, curve.get(key) or []) if t is not None and v is not None]
            if points:
                dots = "o" if len(points) < 5 else None  # a short run logs few points: a line alone would not show
                ax.plot(*zip(*points), "-", marker=dots, ms=3, color=f"C{i}", lw=1.2, label=s.name)
                losses += [v for _, v in points] if key == "loss" else []
    for ax, label in zip(axes, ("training loss", "FVE (live, per interval)", "L0")):
        ax.set_xlabel("tokens", fontsize=8)
        ax.set_title(label, fontsize=9)
        ax.tick_params(labelsize=7)
    if losses and min(losses) > 0 and max(losses) > 10 * min(losses):  # a loss falling by decades: log scale
        axes[0].set_yscale("log")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    return fig


# what each figure's colours, lines and markers mean (the HTML's captions)
FIGURE_CAPTIONS = {
    "spectrum": "Eigenvalues of the activations' covariance Σ by rank (log-log). Grey band: the Marchenko–Pastur "
    "range of isotropic noise with the same n, d and tr Σ; eigenvalues above it are structure. Thin lines: "
    "each dictionary's own spectrum, rescaled to the same trace (shape only).",
    "cosines": "Histogram of sampled pairwise cosines cos(x_i, x_j). Dashed line: the sign-aware null (what "
    "independent rows of this sign pattern would give); grey band: null ± 2/√d; red line: the measured mean A.",
    "latents": "One point per latent: firing frequency (log; dead latents at the left edge) against the cosine of "
    "its decoder row with the activation mean μ. Red: latents the mean_direction_features flag names; size ∝ "
    "|cone share c_i| when the codes have a cone. Dotted line: the dense threshold (latents right of it fire on "
    "more than that share of tokens).",
    "amplification": "The amplification law: the mean pairwise cosine A of x̂ − b_dec against K·‖ū‖² (log). "
    "Dotted: the textbook k/(1+k); solid: each SAE's one-rate exact-moment curve. Markers at each SAE's own "
    "K·‖ū‖² (one colour per SAE): measured A (filled circle) and the law's predictions.",
    "rogue": "The coordinates carrying most of the offset: each one's share m̂_j²/‖m̂‖² of the mean unit row.",
}
LEGEND_OUTSIDE = {"loc": "upper left", "bbox_to_anchor": (1.01, 1.0), "fontsize": 8, "frameon": False}


def spectrum_figure(report: GeometryReport) -> Figure:
    """Spectrum, log-log, with the Marchenko–Pastur band of isotropic noise of the same (n, d, tr Σ)."""
    import numpy as np

    g = report.activations
    fig = new_figure(figsize=(7, 4.2))
    ax = fig.add_subplot()
    lam = np.asarray(g.eigenvalues, dtype=float)
    pos = lam > 0
    ax.loglog(np.arange(1, lam.size + 1)[pos], lam[pos], ".-", ms=3, label="activations Σ")
    ax.axhspan(
        max(g.mp_lower_edge, lam[pos].min() if pos.any() else 1e-12),
        g.mp_upper_edge,
        color="tab:gray",
        alpha=0.25,
        label="MP band (isotropic noise)",
    )
    for s in report.saes:  # the dictionaries' own spectra, scaled to the same trace for shape comparison
        dl = np.asarray(s.dictionary_spectrum.get("eigenvalues") or [], dtype=float)
        if dl.size and dl.sum() > 0 and lam.sum() > 0:
            dl = dl * lam.sum() / dl.sum()
            ax.loglog(
                np.arange(1, dl.size + 1)[dl > 0],
                dl[dl > 0],
                "-",
                lw=1,
                alpha=0.7,
                label=f"dictionary {s.name} (rescaled)",
            )
    ax.set_xlabel("rank")
    ax.set_ylabel("eigenvalue of Σ")
    ax.set_title(
        f"centred spectrum: {'no flat bulk' if g.n_spikes is None else str(g.n_spikes) + ' spikes'}, "
        f"erank {g.effective_rank:.1f} of {g.d}",
        fontsize=10,
    )
    ax.legend(**LEGEND_OUTSIDE)
    return fig


def cosines_figure(report: GeometryReport) -> Figure:
    """Sampled pairwise cosines with the sign-aware null and the isotropic ±2/√d band around it."""
    import numpy as np

    g = report.activations
    h = report.cosine_histogram
    fig = new_figure(figsize=(7, 4.2))
    ax = fig.add_subplot()
    edges = np.asarray(h["edges"], dtype=float)
    counts = np.asarray(h["counts"], dtype=float)
    width = np.diff(edges)
    dens = counts / max(counts.sum(), 1) / width
    ax.bar(
        edges[:-1],
        dens,
        width=width,
        align="edge",
        color="tab:blue",
        alpha=0.7,
        label=f"{h['n_pairs']:,} pairs of {h['n_rows']:,} sampled rows",
    )
    null = g.sign.null
    band = 2 * g.isotropic_cosine_sd
    ax.axvspan(null - band, null + band, color="tab:gray", alpha=0.3, label="null ± 2/√d (isotropic)")
    ax.axvline(null, color="k", ls="--", lw=1, label=f"sign-aware null {null:.3f}")
    if g.anisotropy is not None:
        ax.axvline(g.anisotropy, color="tab:red", lw=1.5, label=f"measured A = {g.anisotropy:.3f}")
    ax.set_xlim(-1, 1)
    ax.set_xlabel("cos(x_i, x_j)")
    ax.set_ylabel("density")
    ax.set_title("pairwise cosines", fontsize=10)
    ax.legend(**LEGEND_OUTSIDE)
    return fig


def latents_figure(report: GeometryReport) -> Figure:
    """Latents: firing frequency against cos(decoder, μ), sized by cone share, one panel per SAE."""
    import numpy as np
    from matplotlib.lines import Line2D

    n_sae = max(1, len(report.saes))
    n_cols = min(n_sae, 3)
    n_rows = -(-n_sae // n_cols)
    dense_at = report.thresholds().dense_frequency  # the threshold the report's dense_latents flag used
    fig = new_figure(figsize=(4.2 * n_cols, 3.6 * n_rows))
    axes = fig.subplots(n_rows, n_cols, squeeze=False, sharey=True)
    for ax in axes.flat[n_sae:]:
        ax.set_axis_off()
    for ax, s in zip(axes.flat, report.saes or [None]):
        if s is None:
            ax.text(0.5, 0.5, "no SAE given", ha="center", va="center", transform=ax.transAxes)
            ax.set_axis_off()
            continue
        freq = np.asarray(s.firing_frequency, dtype=float)
        cos = np.asarray(s.cos_decoder_mean, dtype=float)
        share = np.asarray(s.cone_shares if s.cone_shares is not None else np.zeros_like(freq), dtype=float)
        floor = 0.5 / max(s.n_tokens, 1)
        has_cone = _top_share(s) != "— (no cone)"
        size = 4 + 400 * np.abs(share) / max(np.abs(share).max(), 1e-12) if has_cone else np.full(freq.size, 6.0)
        flagged = set()
        for f in report.flags:
            if f.subject == s.name and f.name == "mean_direction_features" and f.latents:
                flagged.update(f.latents)
        colors = ["tab:red" if i in flagged else "tab:blue" for i in range(freq.size)]
        ax.scatter(np.maximum(freq, floor), cos, s=size, c=colors, alpha=0.5, linewidths=0)
        ax.set_xscale("log")
        ax.axvline(dense_at, color="gray", ls=":", lw=1)
        ax.set_xlabel("firing frequency (log; dead at the left edge)", fontsize=8)
        ax.set_ylabel("cos(u_i, μ)", fontsize=8)
        ax.set_title(f"{s.name}: " + ("size ∝ |cone share c_i|" if has_cone else "no cone in x̂ − b_dec"), fontsize=9)
    handles = [
        Line2D([], [], marker="o", ls="", color="tab:blue", alpha=0.6, label="latent"),
        Line2D([], [], marker="o", ls="", color="tab:red", alpha=0.6, label="named by mean_direction_features"),
        Line2D([], [], ls=":", color="gray", label=f"dense threshold (fires on > {dense_at:.0%} of tokens)"),
    ]
    fig.legend(handles=handles, loc="lower center", ncol=3, fontsize=8, frameon=False, bbox_to_anchor=(0.5, -0.02))
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    return fig


def amplification_figure(report: GeometryReport) -> Figure:
    """The amplification law: A against K·‖ū‖², textbook and exact-moment curves, measured points, per-latent
    law; one colour per SAE, one marker per quantity, each explained once."""
    import numpy as np
    from matplotlib.lines import Line2D

    fig = new_figure(figsize=(7.5, 4.5))
    ax = fig.add_subplot()
    x0s = [
        max(s.amplification["K"] * s.amplification["mean_sq_norm"], 1e-3)
        for s in report.saes
        if s.amplification.get("K") is not None and s.amplification.get("mean_sq_norm") is not None
    ]
    lo, hi = (min(x0s) / 30, max(x0s) * 30) if x0s else (1e-3, 1e3)
    xs = np.logspace(np.log10(lo), np.log10(hi), 200)
    ax.plot(xs, (xs / 2) / (1 + xs / 2), "k:", lw=1)
    markers = [  # (amplification key, marker style, what it is)
        ("measured_recon_minus_b_dec", {"marker": "o", "ms": 8}, "measured A(x̂ − b_dec)"),
        ("mean_cosine", {"marker": "s", "ms": 8, "mfc": "none"}, "one-rate mean-cosine law"),
        ("A_het", {"marker": "D", "ms": 7, "mfc": "none"}, "per-latent law A_het"),
        ("A_het_mean_cosine", {"marker": "*", "ms": 11}, "per-latent mean-cosine law (±3 sd)"),
    ]
    sae_handles = []
    for i, s in enumerate(report.saes):
        a = s.amplification
        color = f"C{i}"
        sae_handles.append(Line2D([], [], color=color, lw=6, alpha=0.7, label=s.name))
        if a.get("r") is None:
            continue
        q, r = a["q"], a["r"]
        k = xs * r
        ax.plot(xs, k / (1 + k - q * r), "-", color=color, lw=1, alpha=0.7)
        x0 = max(a["K"] * a["mean_sq_norm"], 1e-3)
        for key, style, _ in markers:
            if a.get(key) is None:
                continue
            sd = a.get(f"{key}_sd") if key == "A_het_mean_cosine" else None
            ax.errorbar([x0], [a[key]], yerr=[3 * sd] if sd else None, ls="", color=color, alpha=0.85, **style)
    if not report.saes:
        ax.text(0.5, 0.5, "no SAE given", ha="center", va="center", transform=ax.transAxes)
    ax.set_xscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(-0.05, 1.05)
    ax.set_xlabel("K·‖ū‖²  (≈ K·A_dict for large N; log)")
    ax.set_ylabel("mean pairwise cosine A")
    ax.set_title("amplification law", fontsize=10)
    what = [
        Line2D([], [], color="k", ls=":", label="textbook k/(1+k), k = K·A_dict/2"),
        Line2D([], [], color="k", ls="-", label="one-rate exact-moment law"),
        *[Line2D([], [], color="k", ls="", **style, label=label) for _, style, label in markers],
    ]
    if sae_handles:  # one legend: what each line and marker is (in black), then the SAEs' colours
        what += [Line2D([], [], ls="", label="colour = SAE:"), *sae_handles]
    ax.legend(handles=what, **LEGEND_OUTSIDE)
    return fig


def rogue_figure(report: GeometryReport) -> Figure:
    """Rogue dimensions: the coordinates' shares of the offset."""
    fig = new_figure(figsize=(7, 3.5))
    ax = fig.add_subplot()
    rogue = report.activations.rogue
    idx, shares = rogue.top_indices, rogue.top_shares
    if idx:
        ax.bar(range(len(idx)), shares, color="tab:purple")
        ax.set_xticks(range(len(idx)), [str(i) for i in idx], fontsize=7)
    ax.set_xlabel("coordinate j")
    ax.set_ylabel("share m̂_j²/‖m̂‖²")
    ax.set_title(f"rogue dimensions: {rogue.n_for_50} carry 50% of the offset", fontsize=10)
    return fig


FIGURES: dict[str, Callable[[GeometryReport], Figure | None]] = {
    "spectrum": spectrum_figure,
    "cosines": cosines_figure,
    "latents": latents_figure,
    "amplification": amplification_figure,
    "rogue": rogue_figure,
    TRAINING_FIGURE: training_figure,
}


def report_figures(report: GeometryReport) -> dict[str, Figure]:
    """Every figure of the report as a matplotlib Figure (made without pyplot: the caller's backend and rcParams
    are left alone; each displays itself in a notebook); "training" only when an SAE has a training log."""
    return {name: fig for name, make in FIGURES.items() if (fig := make(report)) is not None}


def figures(report: GeometryReport) -> dict[str, bytes]:
    """The plots as PNG bytes (what the writers embed and save); "training" only when an SAE has a training log."""
    return {name: png(fig) for name, fig in report_figures(report).items()}


# =========================================================================== html
def render_html(report: GeometryReport, pngs: dict[str, bytes] | None = None) -> str:
    """One self-contained page: flags, tables and the plots as data: URIs."""
    pngs = pngs if pngs is not None else figures(report)
    return html_page(_title(report), report_html_parts(report, pngs), **latents_assets(report.saes))


def latents_assets(saes: list[SAEGeometry]) -> dict[str, str]:
    """The script and style sheet a page needs when some SAE has a per-latent table or cards (else none)."""
    return {"script": LATENTS_JS, "css": LATENTS_CSS} if _with_latents(saes) else {}


def _with_latents(saes: list[SAEGeometry]) -> list[SAEGeometry]:
    return [s for s in saes if getattr(s, "latent_table", None) or getattr(s, "latents", None)]


def report_html_parts(report: GeometryReport, pngs: dict[str, bytes], *, summary: bool = True) -> list[str]:
    """The report page's body, in order (the page and the notebook display are both made of it): flags,
    activations, diagnosis, the side-by-side SAE table, each SAE's latents, the figures, notes and (``summary``)
    the terminal summary."""
    e = html.escape
    parts = [f"<h2>Flags ({e(flag_counts(report.flags))})</h2>"]
    with_latents = _with_latents(report.saes)
    parts += html_flags(report.flags, latent_tables={s.name: latent_table_id(s.name) for s in with_latents})
    parts.append("<h2>Activations</h2>")
    parts += html_table(activation_lines(report))
    if diagnosis_lines(report):
        parts.append("<h2>Diagnosis</h2>")
        parts += html_table(diagnosis_lines(report))
    if report.saes:
        header, rows = _sae_table(report)
        parts.append("<h2>SAE" + ("s side by side" if len(report.saes) > 1 else "") + "</h2>")
        parts += html_grid(header, rows)
    for s in with_latents:
        parts.append(f"<h2>Latents of {e(s.name)}</h2>")
        parts += latent_section_html(s.name, getattr(s, "latent_table", None), getattr(s, "latents", None))
    parts += figure_parts(pngs)
    if report.notes:
        parts.append("<h2>Notes</h2><ul>" + "".join(f"<li>{e(n)}</li>" for n in report.notes) + "</ul>")
    if summary:
        parts.append(f"<h2>Terminal summary</h2><pre>{e(render_terminal(report))}</pre>")
    parts.append(
        f"<p class='ev'>saegeo {e(report.saegeo_version)}, report schema {report.schema_version}; "
        "the numbers behind this page are in report.json.</p>"
    )
    return parts


def figure_parts(pngs: dict[str, bytes]) -> list[str]:
    """The figures section: each PNG given, in the report's order, with its caption."""
    e = html.escape
    shown = [name for name in (*FIGURE_NAMES, TRAINING_FIGURE) if name in pngs]
    if not shown:
        return []
    return ["<h2>Figures</h2>"] + [
        f"<h3>{e(name)}</h3>" + html_figure(name, pngs[name], FIGURE_CAPTIONS.get(name, "")) for name in shown
    ]


# =========================================================================== notebook
def report_block(report: GeometryReport) -> str:
    """The report page's body (figures included, the terminal summary left out: the block is the summary)."""
    parts = report_html_parts(report, figures(report), summary=False)
    return html_block(_title(report), parts, **latents_assets(report.saes))


def section_block(section: SAEGeometry) -> str:
    """One SAE's section: its flags with their advice, its column of the side-by-side table, its latents."""
    e = html.escape
    flags = section.flags
    has_latents = bool(section.latent_table or section.latents)
    tables = {section.name: latent_table_id(section.name)} if has_latents else {}
    parts = [f"<h2>Flags ({e(flag_counts(flags))})</h2>", *html_flags(flags, latent_tables=tables)]
    parts += html_grid(*sae_table([section], flags))
    if has_latents:
        parts.append(f"<h2>Latents of {e(section.name)}</h2>")
        parts += latent_section_html(section.name, section.latent_table, section.latents)
    title = f"SAE {section.name} · {section.d_sae:,} latents · {section.n_tokens:,} tokens"
    return html_block(title, parts, **latents_assets([section]))


# =========================================================================== files
def write_report(
    page: GeometryReport | DictionaryCheck, out_dir: str | os.PathLike, formats: tuple[str, ...] | list[str] = FORMATS
) -> dict[str, Path]:
    """Write the requested renderings of a report (summary.txt, report.md + figures/, report.json, report.html)
    or of a dictionary check (summary.txt, check.md, check.json, check.html) into ``out_dir``; returns {format: path}."""
    is_report = isinstance(page, GeometryReport)
    pngs = figures(page) if is_report and ("html" in formats or "md" in formats) else {}
    stem = "report" if is_report else "check"

    def write(out: Path) -> dict[str, Path]:
        if is_report and "md" in formats:  # the Markdown links its figures as files
            fig_dir = out / "figures"
            fig_dir.mkdir(exist_ok=True)
            for name, data in pngs.items():
                atomic_write(fig_dir / f"{name}.png", data)
        names = rendering_names(stem)
        writers = {
            "terminal": (
                names["terminal"],
                lambda: render_terminal(page) if is_report else render_check_terminal(page),
            ),
            "json": (names["json"], lambda: page.to_json()),
            "md": (
                names["md"],
                lambda: render_markdown(page, figure_dir="figures") if is_report else render_check_markdown(page),
            ),
            "html": (names["html"], lambda: render_html(page, pngs) if is_report else render_check_html(page)),
        }
        written = write_renderings(out, formats, writers)
        if is_report and "json" in formats and has_latents(page):  # latents.csv and latents.json beside report.json
            written.update(write_latent_files(latents_document(page), out))
        return written

    return write_output_set(out_dir, formats, FORMATS, "report", write)
