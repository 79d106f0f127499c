"""mixed_populations: the rows are a mixture of populations (from the report's row sample)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from saegeo.config import option
from saegeo.report.flags import MIXED, Flag, flag, rounded


@dataclass
class Options:
    mixed_min_split_share: float = option(
        0.8, "the 2-means split of the PC1 projections explains ≥ this of their variance (Gaussian 2/π, uniform 0.75)"
    )
    mixed_min_cluster_fraction: float = option(0.05, "with ≥ this fraction of rows on the smaller side (both tests)")
    mixed_min_kmeans_share: float = option(
        0.5, "or 2-means on the rows leaves ≥ this of the centred sum of squares between clusters ..."
    )
    mixed_min_kmeans_excess: float = option(
        1.3, "... and ≥ this × what one Gaussian with this spectrum gives ((2/π)·top-1)"
    )


@flag(
    MIXED,
    stage="activations",
    reads=("sample_diagnostics", "top1_share"),
    options=Options,
    bands={"warning": "either split"},
    when="the 2-means split of the PC1 projections leaves ≥ 80 % of their variance between groups (smaller side "
    "≥ 5 %), or 2-means on the rows leaves ≥ 50 % of the sum of squares between clusters and ≥ 1.3 × what one "
    "Gaussian of this spectrum gives",
    order=70,
)
def mixed_populations(q: dict[str, Any], t: Any) -> Flag | None:
    geo = q["geo"]
    sample = geo.get("sample_diagnostics") or {}
    split = sample.get("pc1_split") or {}
    kshare = sample.get("kmeans2_between_share")
    by_split = (
        split.get("between_share", 0) >= t.mixed_min_split_share
        and split.get("smaller_fraction", 0) >= t.mixed_min_cluster_fraction
    )
    gaussian_kshare = (2 / math.pi) * float(geo.get("top1_share") or 0.0)  # one elongated Gaussian, split along PC1
    by_kmeans = (
        kshare is not None
        and kshare >= t.mixed_min_kmeans_share
        and kshare >= t.mixed_min_kmeans_excess * gaussian_kshare
        and (sample.get("kmeans2_smaller_fraction") or 0) >= t.mixed_min_cluster_fraction
    )
    if not (by_split or by_kmeans):
        return None
    return Flag(
        MIXED,
        "warning",
        {
            "pc1_split_between_share": rounded(split.get("between_share")),
            "pc1_split_smaller_fraction": rounded(split.get("smaller_fraction")),
            "pc1_split_separation": rounded(split.get("separation"), 1),
            "kmeans2_between_share": rounded(kshare),
            "gaussian_kmeans2_share": rounded(gaussian_kshare),
            "kmeans2_smaller_fraction": rounded(sample.get("kmeans2_smaller_fraction")),
            "sample_rows": sample.get("n_rows"),
            "top1_share": rounded(geo.get("top1_share")),
        },
        "The rows are a mixture of populations: centring or all-but-the-top on the pooled cloud removes the "
        "difference between them; centre per cluster (or per token type / position) instead.",
        summary=(
            "two populations: "
            + (
                f"the PC1 projections split {100 * split['smaller_fraction']:.0f}/{100 - 100 * split['smaller_fraction']:.0f} "
                f"with {100 * split['between_share']:.0f}% of their variance between the groups"
                if by_split
                else ""
            )
            + ("; " if by_split and by_kmeans else "")
            + (
                f"2-means leaves {100 * kshare:.0f}% of the centred sum of squares between clusters"
                if by_kmeans
                else ""
            )
        ),
    )
