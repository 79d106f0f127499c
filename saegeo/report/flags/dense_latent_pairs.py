"""dense_latent_pairs: dense latents that come as antipodal pairs spanning a known direction of the activations.

Sun, Stolfo, Engels et al. ("Dense SAE Latents Are Features, Not Bugs", 2025): dense latents come as nearly antipodal
pairs (decoder cosine near −1, complementary firing), one latent for each sign of one residual direction. The report
measures the pairs and the squared cosine of μ and of the top principal components with the subspace their axes span
(``SAEGeometry.dense_structure``, `report --dark-matter`; saegeo.geometry.dense). A pair spanning μ is an offset the
SAE splits into two dense latents; one spanning a top principal component reads a direction of the activations'
variance (position, context binding in the paper) with the two signs of one feature.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from saegeo.config import option
from saegeo.report.flags import Flag, flag, rounded

DENSE_PAIRS = "dense_latent_pairs"


@dataclass
class Options:
    dense_pair_min_alignment: float = option(
        0.5,
        "dense antipodal pairs whose subspace holds at least this share ‖Qᵀr‖²/‖r‖² of μ or of a top principal "
        "component r span that direction",
        above=0,
        high=1,
    )


@flag(
    DENSE_PAIRS,
    stage="sae",
    reads=("dense_structure",),
    options=Options,
    bands={
        "warning": "the pairs' subspace holds μ: an offset split into two dense latents",
        "info": "it holds a top principal component and not μ: one signed direction read by two latents",
    },
    when="`report --dark-matter`: the dense latents (rate ≥ 0.1) form antipodal pairs (decoder cos ≤ −0.9, co-firing "
    "≤ 0.1 of the rarer one's rows) whose span holds ≥ 0.5 of μ (‖Qᵀμ‖²/‖μ‖²) or of one of the top 3 principal "
    "components",
    order=60,
)
def dense_latent_pairs(q: dict[str, Any], t: Any) -> Flag | None:
    sae = q["sae"]
    dense = sae.get("dense_structure") or {}
    pairs, subspace = dense.get("pairs") or [], dense.get("subspace") or {}
    if not pairs:
        return None
    mean = subspace.get("mean")
    pcs = {k: v for k, v in subspace.items() if k.startswith("pc") and v is not None}
    best_pc = max(pcs, key=pcs.get) if pcs else None
    spans_mean = mean is not None and mean >= t.dense_pair_min_alignment
    spans_pc = best_pc is not None and pcs[best_pc] >= t.dense_pair_min_alignment
    if not (spans_mean or spans_pc):
        return None
    members = [i for p in pairs for i in (p["i"], p["j"])]
    what = "the activation mean μ" if spans_mean else f"the principal component {best_pc[2:]}"
    advice = (
        "These dense latents are one direction read with both signs, and that direction is the activations' mean: "
        "an offset b_dec did not absorb. Initialise b_dec to the mean (or centre the inputs) so no latent pair "
        "spends itself on it; do not read the two latents as features."
        if spans_mean
        else "These dense latents are one direction of the activations read with both signs (Sun et al. 2025: "
        "position, context binding): read each pair as one signed feature, not as two dense bugs; do not resample "
        "or penalise them, and ablate the direction itself if it must go."
    )
    return Flag(
        DENSE_PAIRS,
        "warning" if spans_mean else "info",
        {
            "n_pairs": len(pairs),
            "subspace_dim": subspace.get("dim"),
            "chance": rounded(subspace.get("chance")),
            "mean_alignment": rounded(mean),
            "best_pc": int(best_pc[2:]) if best_pc else None,
            "best_pc_alignment": rounded(pcs.get(best_pc)) if best_pc else None,
            "min_abs_decoder_cos": rounded(min(abs(p["decoder_cos"]) for p in pairs)),
            "max_cofire_share": rounded(max(p["cofire_share"] for p in pairs)),
        },
        advice,
        summary=f"{len(members)} dense latents form {len(pairs)} antipodal pair(s) whose {subspace.get('dim')}-d span "
        f"holds {what} (squared cos "
        f"{(mean if spans_mean else pcs[best_pc]):.2f}; chance {subspace.get('chance', 0):.2f})",
        latents=members[: t.max_latents],
        subject=str(sae.get("name") or "sae"),
    )
