"""`saegeo compare`'s text (terminal and OUT/summary.txt) and its output files (summary.txt, compare.json)."""

from __future__ import annotations

import html
import os
from pathlib import Path
from typing import Any

from saegeo.io import atomic_write
from saegeo.render.common import fmt_num, fmt_pct, html_block, html_grid, text_table, write_output_set

COMPARE_FILES = ("summary.txt", "compare.json")


def _matching_lines(title: str, s: dict[str, Any], names: tuple[str, str]) -> list[str]:
    method = "exact (Hungarian)" if s["method"] == "exact" else f"candidate graph, k = {s['candidates_per_row']}"
    lines = [
        f"{title}: {s['n_matched']:,} pairs matched ({method})",
        f"  pairwise MCC (mean matched similarity)   {fmt_num(s['mcc'])}"
        + ("" if s["method"] == "exact" else f"   (dense optimum ≤ {fmt_num(s['mcc_upper_bound'])})"),
        f"  shared at ≥ {s['threshold']:g}                        {s['n_shared']:,}: "
        f"{fmt_pct(s['shared_fraction_a'])} of {names[0]}, {fmt_pct(s['shared_fraction_b'])} of {names[1]}",
    ]
    if "n_shared_encoder_too" in s:
        lines.append(
            f"  … whose encoders agree too (≥ {s['threshold']:g})     {s['n_shared_encoder_too']:,} "
            f"({fmt_pct(s['shared_encoder_too_fraction_a'])} of {names[0]}); mean encoder cosine "
            f"{fmt_num(s['mean_encoder_cosine'])}"
        )
    if s.get("ambiguous"):
        lines.append(f"  latents with two counterparts above the threshold: {s['ambiguous']:,}")
    if "same_pair_as_decoder" in s:
        lines.append(
            f"  pairs the decoder matching also made     {fmt_pct(s['same_pair_as_decoder'])} ({s['n_rows']:,} rows)"
        )
    return lines


def _names(result: Any) -> tuple[str, str]:
    return tuple(Path(n).name or n for n in result.names)


def _title(result: Any) -> str:
    names = _names(result)
    return f"compare {names[0]} ({result.decoder['n_a']:,} latents) vs {names[1]} ({result.decoder['n_b']:,}), d = {result.d}"


def _matchings(result: Any) -> list[str]:
    names = _names(result)
    lines = _matching_lines("decoder cosines", result.decoder, names)
    if result.activations is not None:
        lines += _matching_lines("activation correlations", result.activations, names)
    return lines


def render_compare(result: Any) -> str:
    """The comparison as text: both matchings and the geometry of the shared and unshared latents."""
    lines = [_title(result), *_matchings(result)]
    header, rows = _geometry_table(result)
    lines += ["", "geometry of the shared and unshared latents (decoder rows):"]
    lines += text_table(header, rows, indent="  ")
    lines += [f"note: {n}" for n in result.notes]
    return "\n".join(lines) + "\n"


def compare_block(result: Any) -> str:
    """The notebook block of a comparison: the same matching lines and geometry table as the text."""
    e = html.escape
    header, rows = _geometry_table(result)
    body = [
        f"<pre>{e(chr(10).join(_matchings(result)))}</pre>",
        *html_grid(header, rows, caption="geometry of the shared and unshared latents (decoder rows)"),
        *[f"<p>note: {e(n)}</p>" for n in result.notes],
    ]
    return html_block(_title(result), body)


def _geometry_table(result: Any) -> tuple[list[str], list[list[str]]]:
    names = _names(result)
    header = ["latents", "n", "best cos to other", "A (mean pair cos)", "cos(mean, dict mean)", "mean ‖w‖"]
    rows = []
    for key, label in (
        ("a_shared", "shared"),
        ("a_unshared", "unshared"),
        ("b_shared", "shared"),
        ("b_unshared", "unshared"),
    ):
        g = result.geometry[key]
        who = names[0] if key.startswith("a") else names[1]
        rows.append(
            [
                f"{who} {label}",
                f"{g['n']:,}",
                fmt_num(g.get("mean_best_cross_cosine")),
                fmt_num(g.get("anisotropy")),
                fmt_num(g.get("cos_mean_with_dictionary_mean")),
                fmt_num(g.get("mean_decoder_norm")),
            ]
        )
    return header, rows


def write_compare(result: Any, out_dir: str | os.PathLike) -> dict[str, Path]:
    """OUT/summary.txt and OUT/compare.json, written as one set (saegeo.io.output_set)."""

    def write(out: Path) -> dict[str, Path]:
        return {
            "terminal": atomic_write(out / COMPARE_FILES[0], render_compare(result)),
            "json": atomic_write(out / COMPARE_FILES[1], result.to_json()),
        }

    return write_output_set(out_dir, ("terminal", "json"), ("terminal", "json"), "compare", write)
