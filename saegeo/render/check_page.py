"""The dictionary check page (`saegeo check` without activations): terminal summary, Markdown and HTML."""

from __future__ import annotations

import html

from saegeo.geometry.nulls import anisotropy_null_sd
from saegeo.render.common import (
    flag_counts,
    fmt_num,
    fmt_pct,
    html_block,
    html_flags,
    html_page,
    html_table,
    md_flags,
    md_table,
    terminal_flags,
)
from saegeo.report.dictionary_check import DictionaryCheck


def check_lines(check: DictionaryCheck) -> list[tuple[str, str]]:
    """(label, text) rows of the dictionary numbers, shared by every rendering of a check."""
    f = fmt_num
    s, sp, n, ed, b = (
        check.source,
        check.dictionary_spectrum,
        check.decoder_norms,
        check.encoder_decoder_cos,
        check.b_dec,
    )
    return [
        (
            "format",
            f"{s['format']}  d_in {s['d_in']:,}  d_sae {s['d_sae']:,}  {s['activation']}"
            + (f" k={s['k']}" if s.get("k") else "")
            + f"  b_dec subtracted: {s['apply_b_dec_to_input']}"
            + (f"  input norm: {s['input_normalization']}" if s["input_normalization"] != "none" else ""),
        ),
        (
            "A_dict",
            f"{f(check.a_dict, 4)}  (‖ū‖² {f(check.dict_mean_sq_norm, 4)}; isotropic rows: 0 ± {f(anisotropy_null_sd(s['d_sae'], s['d_in']), 2)})",
        ),
        (
            "spectrum",
            f"erank {f(sp.get('effective_rank'), 4)} of {s['d_in']}  top-1 {fmt_pct(sp.get('top1_share'))}  "
            f"top-10 {fmt_pct(sp.get('top10_share'))}  IsoScore {f(sp.get('isoscore'))}  spikes {sp.get('n_spikes')}",
        ),
        (
            "dec norms",
            f"min {f(n['min'])}  median {f(n['median'])}  max {f(n['max'])}  cv {f(n['cv'])}  zero rows {check.n_zero_decoder_rows}",
        ),
        (
            "duplicates",
            f"{check.n_duplicate_pairs} pair(s) with cos > {check.options['duplicate_cos']:g}"
            + (
                f"; most similar {check.duplicate_pairs[0][0]}–{check.duplicate_pairs[0][1]} ({check.duplicate_pairs[0][2]:.4f})"
                if check.duplicate_pairs
                else ""
            ),
        ),
        *_nearest_line(check),
        (
            "enc·dec",
            f"cos(encoder, decoder) median {f(ed['median'])}  min {f(ed['min'])}  below {check.options['misaligned_cos']:g}: {ed['n_below']}",
        ),
        (
            "b_dec",
            f"‖b_dec‖ {f(b['norm'])} ({f(b['norm_over_median_decoder_norm'])}× median ‖w‖)  cos(b_dec, ū) {f(b['cos_mean_direction'])}",
        ),
    ]


def _nearest_line(check: DictionaryCheck) -> list[tuple[str, str]]:
    """The nearest-neighbour cosine row: exact, or sampled with its 95 % error (older checks: none)."""
    nn = check.nearest_neighbour_cos
    if not nn or nn.get("mean") is None:
        return []
    q = nn["quantiles"]
    if nn["method"] == "exact":
        how = f"all {nn['n_rows']:,} latents"
        mean = fmt_num(nn["mean"], 4)
        median = fmt_num(q["0.5"], 4)
    else:
        lo, hi = nn["quantile_intervals"]["0.5"]
        how = f"{nn['n_queries']:,} sampled latents (seed {nn['seed']}), {nn['confidence']:.0%} error"
        mean = f"{fmt_num(nn['mean'], 4)} ± {fmt_num(nn['mean_error_bound'], 2)}"
        median = f"{fmt_num(q['0.5'], 4)} [{fmt_num(lo, 4)}, {fmt_num(hi, 4)}]"
    return [
        (
            "nearest",
            f"max_j cos(w_i, w_j): mean {mean}  median {median}  p99 {fmt_num(q['0.99'], 4)}  "
            f"max {fmt_num(nn['max'], 4)}  ({how})",
        )
    ]


def _check_title(check: DictionaryCheck) -> str:
    return f"saegeo check — {check.source['name']}"


def render_check_terminal(check: DictionaryCheck, *, max_flags: int = 12) -> str:
    """Same layout as `render_terminal`: title, flags with advice on top, then the numbers."""
    s = check.source
    out = [f"{_check_title(check)} ({s['format']}, {s['d_sae']:,} latents × {s['d_in']:,}, {check.seconds:.1f} s)", ""]
    out += terminal_flags(check.flags, max_flags=max_flags, show_subject=False)
    out += ["", "DICTIONARY"] + [f"  {label:<11}{text}" for label, text in check_lines(check)]
    out += [f"note: {n}" for n in check.notes]
    return "\n".join(out) + "\n"


def render_check_markdown(check: DictionaryCheck) -> str:
    out = [f"# {_check_title(check)}", "", f"## Flags ({flag_counts(check.flags)})", ""]
    out += md_flags(check.flags, show_subject=False)
    out += ["", "## Dictionary", "", md_table(["", ""], [[a, b] for a, b in check_lines(check)])]
    if check.duplicate_pairs:
        out += [
            "",
            "## Near-duplicate pairs",
            "",
            md_table(["i", "j", "cos"], [[str(i), str(j), f"{c:.6f}"] for i, j, c in check.duplicate_pairs]),
        ]
    if check.notes:
        out += ["", "## Notes", ""] + [f"- {n}" for n in check.notes]
    out += ["", f"*saegeo check schema {check.schema_version}.*", ""]
    return "\n".join(out)


def render_check_html(check: DictionaryCheck) -> str:
    return html_page(_check_title(check), check_html_parts(check))


def check_html_parts(check: DictionaryCheck, *, summary: bool = True) -> list[str]:
    """The check page's body (the page and the notebook display): flags with advice, the dictionary's numbers,
    (``summary``) the terminal summary."""
    e = html.escape
    parts = [f"<h2>Flags ({e(flag_counts(check.flags))})</h2>"]
    parts += html_flags(check.flags, show_subject=False)
    parts.append("<h2>Dictionary</h2>")
    parts += html_table(check_lines(check))
    if summary:
        parts.append(f"<h2>Terminal summary</h2><pre>{e(render_check_terminal(check))}</pre>")
    return parts


def check_block(check: DictionaryCheck) -> str:
    return html_block(_check_title(check), check_html_parts(check, summary=False))
