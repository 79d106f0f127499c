"""massive_activations: rows or coordinates far above the rest (often position 0 / BOS or special tokens)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from saegeo.config import option
from saegeo.report.flags import MASSIVE, Flag, flag, rounded


@dataclass
class Options:
    massive_row_ratio: float = option(
        10.0, "rows with ‖x‖ > this × the median norm are massive (also what check --acts counts)", above=0
    )
    massive_min_share: float = option(0.25, "... and flagged when they carry ≥ this share of Σ‖x‖²", low=0)
    massive_coordinate_ratio: float = option(
        20.0, "or a coordinate whose RMS is > this × the mean coordinate RMS", low=0
    )
    massive_first_position_share: float = option(
        0.5, "or the first position of each window carries ≥ this share of tr Σ ...", low=0
    )
    massive_first_position_rows: float = option(0.1, "... while it is at most this fraction of the rows", low=0)


def massive_evidence(geo: Mapping[str, Any], t: Any) -> dict[str, Any] | None:
    """Rows far above the median norm carrying a large share of Σ‖x‖², or a coordinate far above the mean RMS,
    or a first position carrying most of tr Σ: the evidence, or None when none of them holds."""
    import torch

    hist = geo.get("row_norm_histogram") or {}
    median = geo.get("median_row_norm")
    evidence: dict[str, Any] = {}
    if hist.get("counts") and median:
        edges = torch.tensor(hist["lower_edges"], dtype=torch.float64)
        counts = torch.tensor(hist["counts"], dtype=torch.float64)
        sq = torch.tensor(hist["sq_sums"], dtype=torch.float64)
        big = edges >= t.massive_row_ratio * float(median)
        share = float(sq[big].sum() / sq.sum()) if float(sq.sum()) > 0 else 0.0
        evidence.update(
            massive_rows=int(counts[big].sum()),
            massive_row_fraction=rounded(float(counts[big].sum() / counts.sum())),
            massive_share_of_sum_sq=rounded(share),
            median_row_norm=rounded(median),
            max_row_norm=rounded(geo.get("max_row_norm_bin")),
            max_over_median=rounded(float(geo.get("max_row_norm_bin") or 0) / float(median), 1),
        )
    rms = geo.get("coordinate_rms")
    if rms:
        r = torch.tensor(rms, dtype=torch.float64)
        ratio = float(r.max() / r.mean()) if float(r.mean()) > 0 else 0.0
        evidence.update(top_coordinate=int(r.argmax()), coordinate_rms_over_mean=rounded(ratio, 1))
    first = geo.get("first_position") or {}
    if first:
        evidence.update(
            first_position_rows=first.get("rows"),
            first_position_row_share=rounded(first.get("row_share")),
            first_position_mu_share=rounded(first.get("mu_share")),
            first_position_trace_share=rounded(first.get("trace_share")),
        )
    rows_fire = (evidence.get("massive_share_of_sum_sq") or 0) >= t.massive_min_share and evidence.get(
        "massive_rows", 0
    ) > 0
    coords_fire = (evidence.get("coordinate_rms_over_mean") or 0) > t.massive_coordinate_ratio
    first_fire = (
        bool(first)
        and (first.get("trace_share") or 0) >= t.massive_first_position_share
        and (first.get("row_share") or 1) <= t.massive_first_position_rows
    )
    if not (rows_fire or coords_fire or first_fire):
        return None
    evidence.update(
        by_rows=rows_fire,
        by_coordinates=coords_fire,
        by_first_position=first_fire,
        top1_share=rounded(geo.get("top1_share")),
        effective_rank=rounded(geo.get("effective_rank"), 1),
    )
    return evidence


@flag(
    MASSIVE,
    stage="activations",
    reads=(
        "row_norm_histogram",
        "median_row_norm",
        "max_row_norm_bin",
        "coordinate_rms",
        "first_position",
        "numerical_rank",
        "top1_share",
        "effective_rank",
    ),
    options=Options,
    bands={"warning": "any of the three"},
    when="rows with ‖x‖ > 10 × the median carry ≥ 25 % of Σ‖x‖², or a coordinate's RMS > 20 × the mean coordinate "
    "RMS, or the first position (≤ 10 % of rows) carries ≥ 50 % of tr Σ",
    order=40,
)
def massive_activations(q: dict[str, Any], t: Any) -> Flag | None:
    geo = q["geo"]
    ev = massive_evidence(geo, t)
    if ev is None:
        return None
    n, d, rank = int(geo["n"]), int(geo["d"]), int(geo["numerical_rank"])
    ev = {**ev, "numerical_rank": rank, "d": d, "n": n}
    parts = []
    if ev["by_rows"]:
        parts.append(
            f"{ev['massive_rows']} row(s) ({100 * ev['massive_row_fraction']:.2f}%) with ‖x‖ up to "
            f"{ev['max_over_median']:g}× the median carry {100 * ev['massive_share_of_sum_sq']:.1f}% of Σ‖x‖²"
        )
    if ev["by_coordinates"]:
        parts.append(
            f"coordinate {ev['top_coordinate']} has {ev['coordinate_rms_over_mean']:g}× the mean coordinate RMS"
        )
    if ev.get("first_position_rows"):
        parts.append(
            f"the first position ({ev['first_position_rows']:,} rows, {100 * ev['first_position_row_share']:.2f}%) "
            f"carries {100 * (ev['first_position_mu_share'] or 0):.1f}% of ‖μ‖² and "
            f"{100 * (ev['first_position_trace_share'] or 0):.1f}% of tr Σ"
        )
    rank_note = (
        f"; the numerical rank {rank} < d reflects this dynamic range, not singular data" if rank < d < n else ""
    )
    return Flag(
        MASSIVE,
        "warning",
        ev,
        "Exclude or handle the massive rows/coordinates (often position 0 / BOS or special tokens) before fitting "
        "anything: they set the spectrum (top-1, erank), the mean and any whitening, and an SAE spends latents on them.",
        summary="; ".join(parts) + rank_note,
    )
