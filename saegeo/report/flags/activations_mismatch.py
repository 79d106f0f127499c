"""activations_mismatch: do an SAE and the activations it is read on belong together? The one decision
``check --acts``, ``report --sae`` and ``latents`` take (``saegeo.report.dictionary_check.sae_verdict``), from what
``saegeo.report.dictionary_check.activations_match_flags`` measured of the SAE on the rows (docs/design.md, "Do an SAE and a
store belong together")."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from saegeo.config import option
from saegeo.errors import BadInputError
from saegeo.report.flags import ACTIVATIONS_MISMATCH, Flag, flag, rounded


@dataclass
class Options:
    scale_error_ratio: float = option(
        2.0, "E‖x‖ vs the SAE's recorded norm off by more than this factor: error", above=1
    )
    scale_hint_ratio: float = option(
        3.0, "‖μ‖/‖b_dec‖ (no recorded norm) off by more than this factor: test x/ratio against x", above=1
    )
    scale_fve_gain: float = option(
        0.2, "the FVE of x/ratio above that of x by more than this: a scale error (b_dec alone is no evidence)", low=0
    )
    fit_accept_fve: float = option(
        0.65,
        "names missing or disagreeing: the SAE's FVE on the sampled rows at or above this accepts the pair, below "
        "fit_refuse_fve refuses it, between is a warning",
        low=-1e9,
        high=1,
    )
    fit_refuse_fve: float = option(0.0, "see fit_accept_fve", low=-1e9, high=1)
    centred_warn: float = option(
        0.05, "E|x·1|/(√d E‖x‖) above this where the SAE expects centred writing weights", low=0
    )

    def __post_init__(self) -> None:  # beyond its fields' bounds, which FlagThresholds checks
        if self.fit_refuse_fve > self.fit_accept_fve:
            raise BadInputError(
                f"fit_refuse_fve {self.fit_refuse_fve:g} is above fit_accept_fve {self.fit_accept_fve:g}"
            )


_SITES = (
    ("resid_post", ("resid_post", "hook_resid_post")),
    ("resid_pre", ("resid_pre",)),
    ("resid_mid", ("resid_mid",)),
    ("mlp_out", ("mlp_out", "hook_mlp_out")),
    ("mlp_in", ("mlp_in", "hook_mlp_in")),
    ("attn", ("hook_z", "attn_out", "hook_attn_out", "attn.", "self_attn")),
    ("embed", ("embed",)),
)


def hook_parts(name: str | None) -> tuple[int | None, str | None]:
    """(layer, site) from a transformer-lens name (blocks.6.hook_resid_post) or an HF module name (layers.6,
    model.layers.6.output = that block's residual output); None where the name does not say."""
    if not name:
        return None, None
    low = name.lower()
    m = re.search(r"(?:blocks|layers|layer|h)[._](\d+)", low)
    layer = int(m.group(1)) if m else None
    site = next((s for s, keys in _SITES if any(k in low for k in keys)), None)
    if (
        site is None
        and layer is not None
        and re.fullmatch(r"(model\.)?(gpt_neox\.|transformer\.)?(layers|h)\.\d+(\.output)?", low)
    ):
        site = "resid_post"  # the output of an HF decoder layer is the residual stream after it
    return layer, site


_SQRT_D_NOTE = (
    " -- Gemma's √d embedding scale (Gemma Scope embedding SAEs need W_enc/√d and W_dec·√d against "
    "transformer-lens hook_embed)"
)


def near_sqrt_d(ratio: float, d: int) -> bool:
    """ratio within a factor e^0.25 of √d or 1/√d."""
    return abs(abs(math.log(ratio)) - 0.5 * math.log(d)) < 0.25


@flag(
    ACTIVATIONS_MISMATCH,
    stage="match",
    reads=(
        "hook",
        "model",
        "identity",
        "fve",
        "cos",
        "mean",
        "mean_norm",
        "b_dec",
        "expected_input_norm",
        "exclude_special_tokens",
        "position0_rows",
        "n_massive",
        "ones_share",
    ),
    options=Options,
    bands={
        "error": "a cause with evidence: hook names differ, fingerprints differ, names differ and FVE < 0, a "
        "recorded norm off by > 2×, a rescaled fit better by FVE + 0.2, massive special rows the SAE excluded",
        "warning": "a doubt: names that cannot be compared, FVE between 0 and 0.65, special rows kept, uncentred rows",
    },
    when="`check --acts`, `report --sae`, `latents`: the activations are not the SAE's (below)",
    order=10,
)
def activations_mismatch(q: dict[str, Any], t: Any) -> Flag | None:
    """From the SAE's metadata (``sae.format_info``) against the store's manifest, and from the rows themselves (the
    SAE's FVE = 1 − Σ‖x − x̂‖²/Σ‖x − x̄‖² and mean cos(x, x̂) on the first rows). Refused (error) only on
    evidence; each cause with its numbers:

      hook         layer or site parsed from the names differ (transformer-lens or HF module names)
      model        fingerprints differ; or the names differ or are missing and the rows do not overrule them: FVE
                   < fit_refuse_fve an error when the names differ (a warning when one is missing), < fit_accept_fve
                   a warning; at or above fit_accept_fve the rows overrule the names, and the note says so
      scale        E‖x‖ vs the norm the SAE recorded: error beyond scale_error_ratio. Without a recorded norm,
                   ‖μ‖/‖b_dec‖ beyond scale_hint_ratio is tested, not believed: an error only when x / ratio is
                   reconstructed clearly better (FVE + scale_fve_gain); otherwise a note
      special_rows the SAE's metadata excludes BOS / special tokens but the store kept them; error when they are
                   massive-activation rows
      centred      the SAE expects centred writing weights and E|x·1|/(√d E‖x‖) > centred_warn (warning)
    One flag (its severity the worst cause's) or none; ``q["notes"]`` gets the line saying what was compared."""
    import torch

    sae, m, notes, subject = q["sae"], q["measures"], q["notes"], q["subject"]
    info, ident, fve, cos = sae.format_info, q["identity"], q["fve"], q["cos"]
    desc = m["describe"]
    causes: dict[str, dict[str, Any]] = {}

    def cause(name: str, severity: str, summary: str, **evidence: Any) -> None:
        causes[name] = {
            "severity": severity,
            "summary": summary,
            **{k: rounded(v) if isinstance(v, float) else v for k, v in evidence.items()},
        }

    fit = f"FVE {fve:.3f}, cos(x, x̂) {cos:.3f} on {m['sample'].shape[0]} rows" if fve is not None else "no fit measured"

    # hook: the names are the evidence (a wrong layer can reconstruct well: neighbouring layers are alike)
    store_hook, store_model = desc.get("hook") or None, desc.get("model") or None
    if info.hook_name and store_hook and info.hook_name != store_hook:
        (la, sa), (lb, sb) = hook_parts(info.hook_name), hook_parts(store_hook)
        differ = (la is not None and lb is not None and la != lb) or (sa is not None and sb is not None and sa != sb)
        if differ or None in (la, lb, sa, sb):
            cause(
                "hook",
                "error" if differ else "warning",
                f"hook {store_hook!r} in the store, {info.hook_name!r} in the SAE"
                + ("" if differ else " (cannot tell whether they are the same)"),
                sae_hook=info.hook_name,
                store_hook=store_hook,
            )
    if info.hook_head_index is not None:
        notes.append(
            f"the SAE reads attention head {info.hook_head_index} of {info.hook_name}: the store must hold that head only"
        )

    # model: fingerprints when both have one, then names, then the rows
    if ident["same"] is False and ident["by"] == "fingerprint":
        decided = "refused"
        cause(
            "model",
            "error",
            ident["why"],
            sae_model=info.model_name,
            store_model=store_model,
            compared_by="fingerprint",
            differ=ident["differ"],
        )
    elif ident["same"]:
        decided = "accepted"  # the names agree: the fit is reported, not judged (a poor SAE is not a wrong store)
    elif fve is None:
        decided = "refused" if ident["same"] is False else "not decided"
        if ident["same"] is False:
            cause(
                "model", "error", ident["why"], sae_model=info.model_name, store_model=store_model, compared_by="name"
            )
    else:
        severity = "error" if fve < t.fit_refuse_fve else "warning" if fve < t.fit_accept_fve else None
        if severity == "error" and ident["same"] is None:
            severity = "warning"  # a missing name is no evidence of another model: a poor fit is only a doubt
        decided = {"error": "refused", "warning": "in doubt", None: "accepted"}[severity]
        if severity is not None:
            cause(
                "model",
                severity,
                f"{ident['why']}, and the rows do not settle it: {fit} (accepted at FVE ≥ {t.fit_accept_fve:g}, "
                f"refused below {t.fit_refuse_fve:g})",
                sae_model=info.model_name,
                store_model=store_model,
                compared_by="name and rows",
                fve=fve,
                cos=cos,
            )
    by = {"fingerprint": "by fingerprint", "assumed": "by assumption", "name": "by name"}[ident["by"]]
    if ident["by"] == "name" and not ident["same"] and fve is not None:
        by = "by the rows (names do not settle it)"

    # scale: a recorded norm is evidence; ‖μ‖/‖b_dec‖ only a hypothesis the rows must confirm
    mu = m["mean"]
    b_dec = sae.b_dec.detach().cpu().to(torch.float64)
    mu_norm, b_norm = float(mu.norm()), float(b_dec.norm())
    d = int(mu.shape[0])
    gemma = "gemma" in (info.model_name or store_model or "").lower()
    expected, expected_from = info.expected_input_norm, "dataset_average_activation_norm.in"
    if expected is None and info.normalize_activations == "expected_average_only_in":
        expected, expected_from = d**0.5, "√d (normalize_activations expected_average_only_in, after rescaling)"
    if expected:
        ratio = m["mean_norm"] / expected
        if not 1 / t.scale_error_ratio <= ratio <= t.scale_error_ratio:
            sqrt_d = gemma and near_sqrt_d(ratio, d)
            cause(
                "scale",
                "error",
                f"E‖x‖ = {m['mean_norm']:.4g} in the store, {expected:.4g} expected ({expected_from}): ×{ratio:.3g}"
                + (_SQRT_D_NOTE if sqrt_d else ""),
                store_mean_norm=m["mean_norm"],
                expected_mean_norm=expected,
                expected_from=expected_from,
                ratio=ratio,
                gemma_sqrt_d=sqrt_d,
            )
    elif b_norm > 0 and mu_norm > 0:
        ratio = mu_norm / b_norm
        if not 1 / t.scale_hint_ratio <= ratio <= t.scale_hint_ratio:
            fve_rescaled = q["fve_of_rows_over"](ratio)
            confirmed = fve is not None and fve_rescaled is not None and fve_rescaled - fve > t.scale_fve_gain
            sqrt_d = gemma and near_sqrt_d(ratio, d)
            if confirmed:
                cause(
                    "scale",
                    "error",
                    f"‖μ‖ = {mu_norm:.4g} in the store against ‖b_dec‖ = {b_norm:.4g}: ×{ratio:.3g}"
                    + (_SQRT_D_NOTE if sqrt_d else "")
                    + f"; FVE rises from {fve:.3f} to {fve_rescaled:.3f} with x/{ratio:.3g}",
                    store_mean_norm=m["mean_norm"],
                    store_mean_vector_norm=mu_norm,
                    b_dec_norm=b_norm,
                    ratio=ratio,
                    fve=fve,
                    fve_rescaled=fve_rescaled,
                    gemma_sqrt_d=sqrt_d,
                )
            else:
                notes.append(
                    f"‖μ‖/‖b_dec‖ = {ratio:.3g} for {subject}, but x/{ratio:.3g} is reconstructed no better "
                    f"(FVE {fve_rescaled if fve_rescaled is None else round(fve_rescaled, 3)} against "
                    f"{fve if fve is None else round(fve, 3)}): b_dec did not absorb the mean (offset_not_absorbed), "
                    "the rows' scale is not in question" + (_SQRT_D_NOTE if sqrt_d else "")
                )
    offset = float((b_dec - mu).norm()) / mu_norm if mu_norm > 0 else None

    # BOS / special rows
    excluded = info.exclude_special_tokens
    corpus = (m["store"].corpus if m["store"] is not None else {}) or {}
    if excluded and not corpus.get("exclude_special", False):
        pos0 = m["position0_rows"]
        if pos0 is None and m["store"] is None:
            notes.append("the SAE excludes special tokens; these activations have no positions to check that against")
        elif pos0 is None or pos0 > 0:
            massive = m["n_massive"]
            cause(
                "special_rows",
                "error" if massive else "warning",
                f"the SAE's metadata excludes BOS / special tokens (exclude_special_tokens={excluded!r}) but the store kept them "
                f"(corpus.exclude_special false{f', {pos0} rows at position 0' if pos0 else ''}"
                f"{f', {massive} massive-activation rows (‖x‖ > {t.massive_row_ratio:g}× median)' if massive else ''})",
                exclude_special_tokens=excluded,
                store_exclude_special=bool(corpus.get("exclude_special", False)),
                position0_rows=pos0,
                massive_rows=massive,
                rows_read=m["n"],
            )

    # centred writing weights
    kwargs = info.model_from_pretrained_kwargs or {}
    if kwargs.get("center_writing_weights") is True and m["ones_share"] > t.centred_warn:
        cause(
            "centred",
            "warning",
            f"the SAE was trained with center_writing_weights (rows sum to 0) but these rows carry "
            f"{m['ones_share']:.3g} of their norm along the all-ones direction",
            all_ones_share=m["ones_share"],
        )

    errors = sorted(k for k, c in causes.items() if c["severity"] == "error")
    outcome = (
        f"refused ({', '.join(errors)})"
        if errors
        else "in doubt (" + ", ".join(sorted(causes)) + ")"
        if causes
        else "accepted"
    )
    notes.append(
        f"{subject} on these activations: {outcome}; model {by}: {ident['why']}; hook store {store_hook!r}, "
        f"SAE {info.hook_name!r}; d_in {int(sae.W_dec.shape[1])}, rows d {d}; {fit}"
        + ("" if decided == "accepted" or errors else f" (model {decided})")
    )
    if not causes:
        return None
    evidence = {
        "causes": sorted(causes),
        **causes,
        "rows_read": m["n"],
        "store_mean_norm": rounded(m["mean_norm"]),
        "b_dec_offset": rounded(offset) if offset is not None else None,
        "fve_sample": rounded(fve) if fve is not None else None,
        "cos_sample": rounded(cos) if cos is not None else None,
    }
    return Flag(
        ACTIVATIONS_MISMATCH,
        "error" if errors else "warning",
        evidence,
        "These activations are not the ones this SAE was trained on: cache the hook and model its metadata names, "
        "with its preprocessing (scale, special tokens, centring), before reading FVE or the amplification law.",
        summary="SAE and activations do not belong together: "
        + "; ".join(f"{k}: {c['summary']}" for k, c in sorted(causes.items())),
        subject=subject,
    )
