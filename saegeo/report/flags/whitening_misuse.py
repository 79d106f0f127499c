"""whitening_misuse: inputs that look whitened, a config that whitens before the SAE, and a whitening folded into
an SAE's weights (a family of three)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from saegeo.config import option
from saegeo.report.flags import WHITENING, Flag, flag, rounded

# Calibrated in tests (clean, ZCA and PCA whitened in sample, whitened with fits on 10d and 50d other rows): in sample,
# Σ̂ = I exactly (narrower than sampling noise allows); with a transform fitted on other rows, Σ̂ ≈ I plus that fit's
# error (a fit on m rows leaves a variance per direction ≈ m/(m − d)). Clean iid N(0, 1) rows are neither.


@dataclass
class Options:
    whitened_max_mean_share: float = option(1e-3, "whitened in sample: mean share ‖μ‖²/tr S ≤ this ...", low=0)
    whitened_max_edge_ratio: float = option(1.1, "... λ_max ≤ this × the MP upper edge ...", low=0)
    whitened_narrow_fraction: float = option(
        0.5, "... and λ_max/λ_min ≤ 1 + this × (the MP edge ratio − 1): narrower than sampling noise", low=0
    )
    whitened_oos_max_mean_share: float = option(1e-2, "whitened with a fit on other rows: mean share ≤ this ...", low=0)
    whitened_oos_max_edge_ratio: float = option(
        10.0, "... λ_max between whitened_max_edge_ratio and this × the MP edge ...", low=0
    )
    whitened_unit_variance_tol: float = option(0.5, "... and variance per direction tr Σ/d within this of 1", low=0)


@dataclass
class ConfigOptions:
    whitening_max_amplification: float = option(
        100.0, "a config's whitening: the noise amplification √(λ_max/λ_min) its summary calls huge", low=0
    )


@flag(
    WHITENING,
    stage="activations",
    label="(inputs)",
    reads=(
        "eigenvalues",
        "mp_upper_edge",
        "mp_lower_edge",
        "mean_share_of_second_moment",
        "mp_sigma2_trace",
        "n_spikes",
        "n",
        "d",
    ),
    options=Options,
    bands={"warning": "an SAE reads these inputs", "info": "no SAE reads them"},
    when="whitened in sample: mean share ≤ 1e-3, λ_max ≤ 1.1 × the calibrated MP edge and λ_max/λ_min ≤ 1 + 0.5 × "
    "(the MP edge ratio − 1), narrower than sampling noise allows; or with a transform fitted on other rows: mean "
    "share ≤ 1e-2, λ_max 1.1–10 × the MP edge, variance per direction tr Σ/d within 0.5 of 1. Clean iid N(0, 1) rows "
    "(λ_max at the edge, the full MP spread) raise nothing",
    order=30,
)
def whitened_inputs(q: dict[str, Any], t: Any) -> Flag | None:
    geo = q["geo"]
    n, d = int(geo["n"]), int(geo["d"])
    eig = [float(v) for v in geo.get("eigenvalues") or []]
    lam_max = eig[0] if eig else 0.0
    lam_min = eig[-1] if eig else 0.0
    upper, lower = float(geo["mp_upper_edge"]), float(geo["mp_lower_edge"])
    mean_share = geo.get("mean_share_of_second_moment")
    sigma2 = float(geo.get("mp_sigma2_trace") or 0.0)  # tr Σ/d: variance per direction
    if not (eig and mean_share is not None and sigma2 > 0 and n > d and lam_min > 0):
        return None
    edge_ratio = lam_max / upper if upper > 0 else math.inf
    spread = lam_max / lam_min
    mp_spread = upper / lower if lower > 0 else math.inf
    # iid N(0, 1) rows fill the MP interval; rows whitened in sample are narrower than sampling noise allows
    in_sample = (
        mean_share <= t.whitened_max_mean_share
        and edge_ratio <= t.whitened_max_edge_ratio
        and spread <= 1 + t.whitened_narrow_fraction * (mp_spread - 1)
    )
    out_of_sample = (
        mean_share <= t.whitened_oos_max_mean_share
        and t.whitened_max_edge_ratio < edge_ratio <= t.whitened_oos_max_edge_ratio
        and abs(sigma2 - 1.0) <= t.whitened_unit_variance_tol
    )
    if not (in_sample or out_of_sample):
        return None
    how = (
        "whitened in sample: spread narrower than sampling noise"
        if in_sample
        else "whitened with a transform fitted on other rows: unit variance, λmax past the MP edge"
    )
    return Flag(
        WHITENING,
        "warning" if q["feeds_dictionary"] else "info",
        {
            "mean_share_of_second_moment": rounded(mean_share),
            "lambda_max_over_mp_edge": rounded(edge_ratio),
            "n_spikes": geo.get("n_spikes", 0),
            "variance_per_direction": rounded(sigma2),
            "eigenvalue_spread": rounded(spread),
            "mp_spread": rounded(mp_spread),
            "in_sample": in_sample,
        },
        "If these inputs were whitened, an SAE learns an arbitrary rotation of a flat space (no variance "
        "ordering, noise amplified along weak directions): train on the raw or mean-centred activations "
        "unless the whitening is the point of the experiment.",
        summary=(
            f"looks {how} (mean share {mean_share:.1e}, λmax/edge {edge_ratio:.2f}, "
            f"variance per direction {sigma2:.3g}, λmax/λmin {spread:.3g} against MP's {mp_spread:.3g})"
        ),
    )


_WHITENING_VALUES = ("covariance_whitening", "whiten", "whitening", "zca", "pca_whitening")


def config_whitens(config: Mapping[str, Any] | None) -> str | None:
    """The key path of a config that asks for whitening before the SAE (SAELens ``normalize_activations =
    "covariance_whitening"``, saegeo provenance ``preprocessing`` naming a whitening), or None."""
    if not config:
        return None

    def walk(node: Any, path: str) -> str | None:
        if isinstance(node, Mapping):
            for k, v in node.items():
                found = walk(v, f"{path}.{k}" if path else str(k))
                if found:
                    return found
        elif isinstance(node, str) and path.split(".")[-1] in ("normalize_activations", "preprocessing"):
            if any(w in node.lower() for w in _WHITENING_VALUES):
                return f"{path} = {node!r}"
        return None

    return walk(config, "")


@flag(
    WHITENING,
    stage="config",
    label="(config)",
    reads=("config", "whitening_cost", "n", "d", "n_spikes", "top1_share", "effective_rank", "mp_bulk"),
    options=ConfigOptions,
    bands={"warning": "always, never a refusal (whitening is sometimes what the experiment wants)"},
    when='a config whitens before the SAE (e.g. SAELens `normalize_activations = "covariance_whitening"`); the '
    "summary names the noise amplification (huge above 100), n ≤ d, a power-law spectrum, an isotropic space",
    order=10,
)
def whitening_in_config(q: dict[str, Any], t: Any) -> Flag | None:
    """``whitening_cost`` is ``Whitening.fit(acc).report.to_dict()`` on these activations (noise amplification
    √(λ_max/λ_min), clamped eigenvalues); ``geo`` adds n, d and whether the space is already isotropic."""
    geo, whitening_cost = q.get("geo"), q.get("whitening_cost")
    where = config_whitens(q.get("config"))
    if where is None:
        return None
    evidence: dict[str, float | int | None] = {}
    notes = []
    amp = (whitening_cost or {}).get("noise_amplification")
    if amp is not None:
        evidence["noise_amplification"] = rounded(amp, 2)
        evidence["n_clamped_eigenvalues"] = int((whitening_cost or {}).get("n_clamped", 0))
        huge = " (huge)" if amp > t.whitening_max_amplification else ""
        notes.append(f"it amplifies noise along the weakest direction {amp:.3g}×{huge}")
    if any("population split" in str(note) for note in (whitening_cost or {}).get("notes", [])):
        notes.append("its top direction carries a population split, which whitening shrinks to unit variance")
    if geo is not None:
        n, d = int(geo["n"]), int(geo["d"])
        spikes = geo.get("n_spikes", 0)  # calibrated: σ² of the bulk, edge + Tracy–Widom margin; None: no flat bulk
        evidence.update(
            n=n,
            d=d,
            n_spikes=None if spikes is None else int(spikes),
            top1_share=rounded(geo.get("top1_share")),
            effective_rank=rounded(geo.get("effective_rank"), 1),
        )
        if n <= d:
            notes.append(f"it is fitted on n = {n} ≤ d = {d} rows (singular covariance)")
        if spikes is None:
            alpha = (geo.get("mp_bulk") or {}).get("power_law_alpha")
            notes.append(
                "it flattens a spectrum with no flat bulk (a power law"
                + (f", slope α = {alpha:.2f}" if alpha is not None else "")
                + "), erasing its variance ordering"
            )
        elif int(spikes) == 0:
            notes.append(
                "the space is already isotropic (no eigenvalue above the calibrated MP edge), so it only adds noise"
            )
        else:
            notes.append(f"it erases the variance ordering of {int(spikes)} spike direction(s)")
    return Flag(
        WHITENING,
        "warning",
        evidence,
        "Whitening is a choice, not a default: it can help probing but costs reconstruction, ordering and a "
        "meaningful basis — keep it only if you measured that it helps, and never read principal axes after it.",
        summary=f"the config whitens before the SAE ({where})" + ("; " + "; ".join(notes) if notes else ""),
        subject=q.get("subject", "config"),
    )


@dataclass
class FoldedOptions:
    folded_whitening_gain: float = option(
        0.2,
        "a whitening folded into the weights: median cos(e, G⁻¹w) above median cos(e, w) by more than this ...",
        low=0,
    )
    folded_whitening_min_cos: float = option(
        0.5, "... and at least this (encoder and 'whitened' decoder plainly aligned)", low=-1, high=1
    )


@flag(
    WHITENING,
    stage="dictionary",
    label="(folded)",
    reads=("whitening_alignment", "normalize_activations"),
    options=FoldedOptions,
    bands={"warning": "always"},
    when="the weights carry a folded covariance whitening (SAELens' `fold_activation_whitening` sets "
    '`normalize_activations` to "none", so no config says so): on up to max(1,024, 2d) latents, median '
    "cos(e_i, G⁻¹w_i) above median cos(e_i, w_i) by more than 0.2 and at least 0.5 (G = the decoder rows' second "
    "moment; trained on whitened rows and folded, e_i ∝ Σ⁻¹w_i ∝ G⁻¹w_i). Measured: SAELens 6.54-trained raw SAEs "
    "(TopK, BatchTopK, standard) 0.69–0.82 raw against 0.15–0.30 whitened; the published test fixtures −0.004–0.55 "
    "against −0.003–0.37; a TopK trained on PCA-whitened rows (d 64, eigenvalues 1–100) and folded 0.40 against "
    "0.96, unfolded 0.98 against 0.96; a TopK trained by SAELens' own SAETrainer with `normalize_activations = "
    '"covariance_whitening"` on MiniLM blocks.3 rows (768 latents, folded at save) 0.39 against 0.77, its raw-trained '
    "twin 0.81 against 0.36 (tests/report/test_folded_whitening.py). With activations, raw rows into such "
    "an SAE raise no input flag; rows whitened again do. An SAE whose config still whitens gets the config flag",
    order=110,
)
def folded_whitening(q: dict[str, Any], t: Any) -> Flag | None:
    """``whitening_alignment`` is `saegeo.geometry.dictionary.whitening_alignment(W_enc, W_dec)`: the encoder columns
    e_i against G⁻¹ × the decoder rows w_i and against the rows themselves (medians over the sampled latents)."""
    alignment = q["whitening_alignment"]
    if alignment is None or q["sae"].format_info.normalize_activations == "covariance_whitening":
        return None
    raw, white = alignment["median_cos"], alignment["median_cos_whitened"]
    if not (white - raw > t.folded_whitening_gain and white >= t.folded_whitening_min_cos):
        return None
    return Flag(
        WHITENING,
        "warning",
        {
            "folded": True,
            "median_cos": rounded(raw),
            "median_cos_whitened": rounded(white),
            "latents": alignment["latents"],
        },
        "This SAE was trained on whitened activations and the whitening is folded into its weights: feed it raw "
        "activations, never whitened ones; its decoder rows carry the data's covariance, so A_dict, the "
        "dictionary spectrum and the decoder norms describe Σ as much as the features.",
        summary=f"the weights carry a folded covariance whitening: the encoder columns match Σ⁻¹ × the decoder "
        f"rows (median cos {white:.2f}), not the rows themselves ({raw:.2f})",
        subject=q["subject"],
    )
