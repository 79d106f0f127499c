"""amplification_inconsistency: the measured cone of x̂ − b_dec against the per-latent amplification law."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from saegeo.config import option
from saegeo.report.flags import AMPLIFICATION, Flag, flag, rounded


@dataclass
class Options:
    # sampling error (U-statistic sds; tokens of one sequence are not independent, so these are low bounds) plus the
    # stated model error: the departure from independent latents not called a failure (TopK's fixed L0 alone makes
    # codes dependent). The interval, not one form: with dependent codes the norm fluctuations that separate the two
    # forms are themselves unknown.
    amplification_z: float = option(
        3.0,
        "the measured A of x̂ − b_dec lies outside [A_het, A_het_mean_cosine] by more than this × the sds ...",
        low=0,
    )
    amplification_model_error: float = option(0.1, "... plus this × the law's nearer end", low=0)
    amplification_cofiring_share: float = option(
        0.05, "the cause named is co-firing when |cofiring_share| (of E‖x̂ − b_dec‖²) ≥ this, else the rates", low=0
    )


def _pairs_text(pairs: list[Mapping[str, Any]], n: int = 5) -> str:
    return "; ".join(f"{p['i']}&{p['j']} {p['share']:+.3f}" for p in pairs[:n])


@flag(
    AMPLIFICATION,
    stage="sae",
    reads=("amplification", "cofiring_pairs", "cone_shares", "firing_frequency", "name", "cone_min_anisotropy"),
    options=Options,
    bands={"warning": "measured or predicted A ≥ 0.1 (cone_min_anisotropy)", "info": "a cone too small to explain"},
    when="the measured A of x̂ − b_dec lies outside [A_het, its mean-cosine form] by more than "
    "3·√(sd_measured² + sd_law²) + 0.1 × the nearer end; the cause is co-firing when \\|cofiring_share\\| ≥ 0.05 "
    "(the pairs are named), else the latents' rates",
    order=30,
)
def amplification_inconsistency(q: dict[str, Any], t: Any) -> Flag | None:
    """|measured A of x̂ − b_dec − law| > z·√(sd_measured² + sd_law²) + model_error·law, law the nearer end of
    [A_het, A_het_mean_cosine] (A_het alone without a row sample); the cause named: co-firing (the latents of the
    top pairs) or the latents' own rates (the cone's high-rate latents: largest cone share, then firing)."""
    import torch

    sae = q["sae"]
    amp = sae.get("amplification") or {}
    measured, a_het = amp.get("measured_recon_minus_b_dec"), amp.get("A_het")
    if measured is None or a_het is None:
        return None
    freq = torch.tensor(sae["firing_frequency"], dtype=torch.float64)
    shares = sae.get("cone_shares")
    shares_t = torch.tensor(shares, dtype=torch.float64) if shares is not None else None
    a_mc = amp.get("A_het_mean_cosine")
    ends = [(a_het, 0.0, "moment")]
    if a_mc is not None and math.isfinite(a_mc):
        ends.append((a_mc, amp.get("A_het_mean_cosine_sd") or 0.0, "mean-cosine"))
    law, law_sd, form = min(ends, key=lambda e: abs(measured - e[0]))
    lo, hi = min(e[0] for e in ends), max(e[0] for e in ends)
    sd = math.hypot(amp.get("measured_recon_minus_b_dec_sd") or 0.0, law_sd)
    tol = t.amplification_z * sd + t.amplification_model_error * abs(law)
    gap = measured - law if not lo <= measured <= hi else 0.0
    if abs(gap) <= tol:
        return None
    share = amp.get("cofiring_share") or 0.0
    pairs = list(sae.get("cofiring_pairs") or [])
    cofiring = abs(share) >= t.amplification_cofiring_share and bool(pairs)
    if cofiring:
        latents = list(dict.fromkeys(i for p in pairs for i in (p["i"], p["j"])))[: t.max_latents]
        verb = "fire together" if share > 0 else "avoid each other"
        carried = amp.get("cofiring_share_top_latents")
        spread = (
            f"; pairs of the top latents by E[a²] carry {carried / share:.0%} of it, the rest is spread wider"
            if carried is not None and share
            else ""
        )
        advice = (
            f"The cone is not that of independent latents: aligned latents {verb} ({100 * share:+.0f}% of "
            f"E‖x̂ − b_dec‖²{spread}); read it from the co-firing pairs named (top: {_pairs_text(pairs, 3)}), "
            "not from K·A_dict or the latents' rates."
        )
    else:
        score = freq.clone() if shares_t is None else shares_t + 1e-6 * freq  # cone share first, then firing
        latents = score.argsort(descending=True)[: t.max_latents].tolist()
        advice = (
            "The latents' own rates and norms do not give this cone and co-firing is small: read it from the "
            "high-rate latents with the largest cone shares listed, and check their firing against the tokens."
        )
    span = f"{lo:.3g}" if len(ends) == 1 else f"{a_het:.3g} (moment) to {a_mc:.3g} (mean-cosine)"
    material = max(measured, hi) >= t.cone_min_anisotropy  # a near-zero cone needs no explaining
    return Flag(
        AMPLIFICATION,
        "warning" if material else "info",
        {
            "measured": rounded(measured),
            "measured_sd": rounded(amp.get("measured_recon_minus_b_dec_sd")),
            "A_het": rounded(a_het),
            "A_het_mean_cosine": rounded(a_mc),
            "law_sd": rounded(law_sd),
            "gap": rounded(gap),
            "tolerance": rounded(tol),
            "z": rounded(gap / sd, 1) if sd > 0 else None,
            "cofiring_share": rounded(share),
            "cofiring_share_top_latents": rounded(amp.get("cofiring_share_top_latents")),
            "top_pairs": _pairs_text(pairs) or None,
            "cause": "co-firing" if cofiring else "rates",
            "mean_cosine_one_rate": rounded(amp.get("mean_cosine")),
            "K": rounded(amp.get("K")),
            "a_dict": rounded(amp.get("a_dict")),
        },
        advice,
        summary=(
            f"A of reconstructions − b_dec = {measured:.3g}, the per-latent law gives {span}: {gap:+.3g} from "
            f"its {form} form (tolerance {tol:.2g}); co-firing makes {100 * share:+.0f}% of E‖x̂ − b_dec‖²"
        ),
        latents=latents,
        subject=str(sae.get("name") or "sae"),
    )
