"""`saegeo compare`'s text (terminal and OUT/summary.txt) and its output files (summary.txt, compare.json)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from saegeo.io import atomic_write
from saegeo.render.common import fmt_num, fmt_pct, text_table, write_output_set

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


def render_compare(result: Any) -> str:
    """The comparison as text: both matchings and the geometry of the shared and unshared latents."""
    names = tuple(Path(n).name or n for n in result.names)
    lines = [
        f"compare {names[0]} ({result.decoder['n_a']:,} latents) vs {names[1]} ({result.decoder['n_b']:,}), d = {result.d}"
    ]
    lines += _matching_lines("decoder cosines", result.decoder, names)
    if result.activations is not None:
        lines += _matching_lines("activation correlations", result.activations, names)
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
    lines += ["", "geometry of the shared and unshared latents (decoder rows):"]
    lines += text_table(header, rows, indent="  ")
    lines += [f"note: {n}" for n in result.notes]
    return "\n".join(lines) + "\n"


def write_compare(result: Any, out_dir: str | os.PathLike) -> dict[str, Path]:
    """OUT/summary.txt and OUT/compare.json, written as one set (saegeo.io.output_set)."""

    def write(out: Path) -> dict[str, Path]:
        return {
            "terminal": atomic_write(out / COMPARE_FILES[0], render_compare(result)),
            "json": atomic_write(out / COMPARE_FILES[1], result.to_json()),
        }

    return write_output_set(out_dir, ("terminal", "json"), ("terminal", "json"), "compare", write)
