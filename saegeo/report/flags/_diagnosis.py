"""The activation diagnosis: the steps offset → shape → artifact → fix with the numbers each read (not a flag:
it reads the activation flags)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from saegeo.report.flags import INVISIBLE, MASSIVE, MIXED, OFFSET_CONE, Flag, activation_flags, checked, rounded


def activation_diagnosis(geo: Mapping[str, Any], flags: list[Flag] | None, t: Any) -> list[dict[str, Any]]:
    """The textbook's order — offset → shape → artifact → fix — as steps {step, finding, read: {name: number}}.

    ``flags`` are the activation flags already computed (recomputed from ``geo`` when None)."""
    geo = checked(geo)
    if flags is None:
        flags = activation_flags(geo, thresholds=t)
    names = {f.name: f for f in flags if f.subject == "activations"}
    sign, sample = geo.get("sign") or {}, geo.get("sample_diagnostics") or {}
    bulk = geo.get("mp_bulk") or {}
    steps = []
    offset_read = {
        "A": rounded(geo.get("anisotropy")),
        "sign_null": rounded(sign.get("null")),
        "finite_d_bias": rounded(geo.get("null_bias")),
        "z_vs_null": rounded(geo.get("null_z"), 1),
        "centred_A": rounded(sample.get("centred_anisotropy")),
        "mean_share": rounded(geo.get("mean_share_of_second_moment")),
        "offset": rounded(geo.get("offset")),
    }
    if OFFSET_CONE in names:
        finding = (
            f"offset-dominated cone: the mean explains "
            f"{100 * names[OFFSET_CONE].evidence['share_of_A_explained_by_mean']:.0f}% of A"
        )
    elif geo.get("null_z") is not None and abs(geo["null_z"]) < t.offset_cone_min_z:
        finding = "A is within the null band of its sign structure"
    else:
        finding = "A is above its sign-aware null, not mainly because of the mean"
    steps.append({"step": "offset", "finding": finding, "read": offset_read})
    shape_read = {
        "erank": rounded(geo.get("effective_rank"), 1),
        "noise_erank": rounded(geo.get("noise_effective_rank"), 1),
        "top1": rounded(geo.get("top1_share")),
        "unit_erank": rounded(geo.get("unit_effective_rank"), 1),
        "n_spikes": geo.get("n_spikes"),
        "n_spikes_edge": bulk.get("n_spikes_edge"),
        "sigma2_bulk": rounded(geo.get("mp_sigma2_bulk")),
        "power_law_alpha": rounded(bulk.get("power_law_alpha")),
    }
    if INVISIBLE in names:
        finding = "anisotropy invisible to A: a concentrated spectrum with A at its null"
    elif geo.get("n_spikes") is None and bulk.get("has_flat_bulk"):
        finding = f"{bulk.get('verdict', 'no MP bulk')}, KS distance {bulk.get('mp_distance') or 0:.3g} to MP; no MP spike count"
        if bulk.get("n_spikes_edge") is not None:
            finding += f"; {bulk['n_spikes_edge']} spike(s) by {bulk.get('edge_spike_method')}"
    elif geo.get("n_spikes") is None:
        finding = f"no flat MP bulk: a power-law spectrum (alpha = {bulk.get('power_law_alpha') or 0:.2f})"
    else:
        finding = f"{geo.get('n_spikes')} spike(s) on a Marchenko–Pastur bulk"
    steps.append({"step": "shape", "finding": finding, "read": shape_read})
    split = sample.get("pc1_split") or {}
    artifact_read = {
        "pc1_split_share": rounded(split.get("between_share")),
        "kmeans2_share": rounded(sample.get("kmeans2_between_share")),
        "numerical_rank": geo.get("numerical_rank"),
    }
    found = []
    if MASSIVE in names:
        ev = names[MASSIVE].evidence
        artifact_read.update(
            massive_share=ev.get("massive_share_of_sum_sq"),
            max_over_median=ev.get("max_over_median"),
            coordinate_rms_over_mean=ev.get("coordinate_rms_over_mean"),
        )
        found.append("massive activations")
    if MIXED in names:
        found.append("mixed populations")
    steps.append(
        {
            "step": "artifact",
            "finding": ", ".join(found) if found else "no massive rows or population split",
            "read": artifact_read,
        }
    )
    fixes = [names[k].advice for k in (MASSIVE, OFFSET_CONE, MIXED, INVISIBLE) if k in names]
    steps.append(
        {
            "step": "fix",
            "finding": " ".join(fixes) if fixes else "nothing to fix before reading the geometry",
            "read": {"flags": len(fixes)},
        }
    )
    return steps
