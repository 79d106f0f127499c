"""Flags: each names one geometric pathology, with the numbers that show it and one sentence of advice.

A flag is computed from the JSON-safe numbers of a report (``ActivationGeometry.to_dict()`` and the
SAE sections of :class:`~saegeo.report.geometry_report.GeometryReport`), so a saved report can be re-flagged
with other thresholds without touching the activations again.

Public API
----------
``Flag``                      name, severity (info | warning | error), evidence {str: number}, advice, latents, subject.
``FlagThresholds``            every threshold below, documented; all configurable.
``activation_flags(geo, ...)``      bad input rows, rank deficiency, inputs that look whitened, a cone read against the wrong null,
                              and the diagnosis: offset-dominated cone, anisotropy invisible to A, massive activations,
                              mixed populations (the last from ``geo["sample_diagnostics"]``, the report's row sample).
``activation_diagnosis(geo, flags)``  the steps offset → shape → artifact → fix with the numbers each read.
``sae_flags(sae, geo, ...)``        mean-direction features, offset not absorbed, amplification inconsistency, dead / dense latents.
``config_flags(config, ...)``       a configuration that whitens before the SAE (with its measured cost).
``dictionary_flags(W_dec, b_dec)``  the dictionary-only variant (no activations): latents aligned with b_dec or ū.
``artifact_flags(artifact, ...)``   a top principal direction that is token frequency, position or length.
``config_whitens(config) -> str | None``  which key of a (SAELens / saegeo) config asks for whitening.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor

from saegeo.geometry.dictionary import row_cosines, row_norms, unit_row_blocks
from saegeo.geometry.measures import FieldDict, checked_geometry
from saegeo.report.options import SEVERITIES, FlagThresholds

_RANK = {s: i for i, s in enumerate(SEVERITIES)}

# Flag names (stable identifiers: tests, JSON and the renderers use them).
MEAN_DIRECTION = "mean_direction_features"
OFFSET_NOT_ABSORBED = "offset_not_absorbed"
WHITENING = "whitening_misuse"
WRONG_NULL = "wrong_null"
AMPLIFICATION = "amplification_inconsistency"
DEAD = "dead_latents"
DENSE = "dense_latents"
RANK = "rank_deficiency"
BAD_ROWS = "bad_input_rows"
ARTIFACT = "artifact_direction"
OFFSET_CONE = "offset_dominated_cone"
INVISIBLE = "anisotropy_invisible_to_A"
MASSIVE = "massive_activations"
MIXED = "mixed_populations"
ACTIVATIONS_MISMATCH = "activations_mismatch"  # raised by saegeo.report.dictionary_check.activations_match_flags
# an activations_mismatch error withholds these metrics of the SAE section (None) and the flags computed from them
WITHHELD_METRICS = ("fve", "amplification", "cone_shares")
WITHHELD_FLAGS = (AMPLIFICATION, MEAN_DIRECTION)


@dataclass
class Flag:
    """One finding: what (name, summary), how bad (severity), the numbers (evidence), what to do (advice)."""

    name: str
    severity: str  # one of SEVERITIES
    evidence: dict[str, float | int | None]
    advice: str  # one sentence
    summary: str = ""  # one line with the key numbers, for the terminal
    latents: list[int] | None = None  # the guilty latents, most guilty first
    subject: str = "activations"  # "activations", an SAE's name, or "config"

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(f"severity {self.severity!r} not in {SEVERITIES}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Flag:
        return cls(**dict(d))


def sort_flags(flags: list[Flag]) -> list[Flag]:
    """Most severe first; stable otherwise."""
    return sorted(flags, key=lambda f: -_RANK[f.severity])


def _f3(x: float | None) -> str:
    return "—" if x is None else f"{x:.3f}"


def rounded(x: float | None, digits: int = 4) -> float | None:
    """Round for evidence (None and non-finite stay None)."""
    if x is None or not math.isfinite(float(x)):
        return None
    return round(float(x), digits) if abs(float(x)) >= 1e-3 else float(f"{float(x):.4g}")


# =========================================================================== activations
FLAG_INPUT_EXTRAS = ("sample_diagnostics", "first_position")  # what flag_inputs adds to the activation geometry


def _checked(geo: Mapping[str, Any] | None) -> FieldDict | None:
    """The flags read ``geo`` through a FieldDict: a key no ActivationGeometry (or flag_inputs) carries raises."""
    return None if geo is None else checked_geometry(geo, extra=FLAG_INPUT_EXTRAS)


def flag_inputs(
    activations: Mapping[str, Any],
    artifact: Mapping[str, Any] | None,
    sample_diagnostics: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The ``geo`` mapping the activation / SAE / config flags read: the activation geometry, the row sample's
    diagnostics (when a report drew one) and what position 0 carries (from the artifact pass over a store)."""
    return checked_geometry(
        {
            **activations,
            "sample_diagnostics": sample_diagnostics,
            "first_position": (artifact or {}).get("first_position"),
        },
        extra=FLAG_INPUT_EXTRAS,
    )


def activation_flags(
    geo: Mapping[str, Any],
    *,
    thresholds: FlagThresholds | None = None,
    assumed_null: float = 0.0,
    feeds_dictionary: bool = False,
) -> list[Flag]:
    """Flags on the activations alone (``geo`` = ``ActivationGeometry.to_dict()``).

    ``assumed_null`` is the baseline a reader compares A with when nobody tells them better (0: "cosines
    centre on 0 in an isotropic space"). ``feeds_dictionary``: an SAE is trained on / applied to these
    activations (raises inputs that look whitened from info to warning).
    """
    geo, t = _checked(geo), thresholds or FlagThresholds()
    flags: list[Flag] = []
    n, d = int(geo["n"]), int(geo["d"])
    rows_seen = n + int(geo.get("n_nonfinite_skipped", 0))

    # ---- bad input rows
    n_zero, n_bad = int(geo.get("n_zero", 0)), int(geo.get("n_nonfinite_skipped", 0))
    if rows_seen and (n_zero + n_bad) / rows_seen > t.bad_rows_max_fraction:
        flags.append(
            Flag(
                BAD_ROWS,
                "error" if n_bad else "warning",
                {
                    "n_zero_rows": n_zero,
                    "n_nonfinite_rows_skipped": n_bad,
                    "n_rows": rows_seen,
                    "fraction": rounded((n_zero + n_bad) / rows_seen),
                },
                "Find where the producer emits zero or non-finite rows (padding, masked positions, overflow) and drop "
                "them before caching; they were excluded from the directional statistics here.",
                summary=f"{n_zero} zero-norm and {n_bad} non-finite row(s) of {rows_seen}",
            )
        )

    eig = [float(v) for v in geo.get("eigenvalues") or []]
    lam_max = eig[0] if eig else 0.0
    lam_min = eig[-1] if eig else 0.0
    upper, lower = float(geo["mp_upper_edge"]), float(geo["mp_lower_edge"])

    massive = _massive_evidence(geo, t)

    # ---- rank deficiency (with n > d: silent when massive rows/coordinates set λ_max — the relative tolerance
    # d·eps·λ_max then hides a full-rank bulk; massive_activations reports the number instead)
    rank = int(geo["numerical_rank"])
    if n <= d or (rank < d and massive is None):
        why = f"n = {n} ≤ d = {d}" if n <= d else f"numerical rank {rank} < d = {d}"
        # n ≤ d: every spectrum-based number describes the sample, not the population (warning);
        # rank < d with n > d: the activations really live in a subspace (info, but never whiten them).
        flags.append(
            Flag(
                RANK,
                "warning" if n <= d else "info",
                {"numerical_rank": rank, "d": d, "n": n, "rank_rel_tol": rounded(geo.get("numerical_rank_rel_tol"))},
                "Collect more tokens than dimensions (n ≫ d) before reading spectra, and do not whiten or invert Σ: "
                "the null directions have no variance to normalise.",
                summary=f"{why}: the covariance is singular ({d - rank} null direction(s))",
            )
        )

    # ---- inputs that look whitened: Σ̂ = I exactly (whitened in sample), or I plus another sample's fitting error
    mean_share = geo.get("mean_share_of_second_moment")
    sigma2 = float(geo.get("mp_sigma2_trace") or 0.0)  # tr Σ/d: variance per direction
    if eig and mean_share is not None and sigma2 > 0 and n > d and lam_min > 0:
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
        if in_sample or out_of_sample:
            how = (
                "whitened in sample: spread narrower than sampling noise"
                if in_sample
                else "whitened with a transform fitted on other rows: unit variance, λmax past the MP edge"
            )
            flags.append(
                Flag(
                    WHITENING,
                    "warning" if feeds_dictionary else "info",
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
            )

    if massive is not None:
        flags.append(_massive_flag(massive, rank, n, d))
    flags += _diagnosis_flags(geo, t)

    # ---- a cone read against the wrong null
    sign = geo.get("sign") or {}
    a, null, null_sd = geo.get("anisotropy"), sign.get("null"), geo.get("isotropic_sd")
    if a is not None and null is not None and null_sd:
        gap = float(null) - assumed_null
        z_assumed = (float(a) - assumed_null) / float(null_sd)
        if gap >= t.wrong_null_min_gap and z_assumed >= t.wrong_null_min_z:
            excess = float(a) - float(null)
            explained = min(1.0, gap / (float(a) - assumed_null)) if float(a) > assumed_null else 1.0
            flags.append(
                Flag(
                    WRONG_NULL,
                    "warning",
                    {
                        "anisotropy": rounded(a),
                        "sign_null": rounded(null),
                        "assumed_null": assumed_null,
                        "excess_over_sign_null": rounded(excess),
                        "share_explained_by_sign": rounded(explained),
                        "z_vs_assumed": rounded(z_assumed, 1),
                        "z_vs_sign_null": rounded(geo.get("isotropic_z"), 1),
                        "negative_energy_fraction": rounded(sign.get("negative_energy_fraction")),
                        "fraction_nonzero": rounded(sign.get("fraction_nonzero")),
                    },
                    f"Read A against the sign-aware null {null:.3g} ({sign.get('regime')} data), not {assumed_null:g}: "
                    "quote A − null, since sign structure alone produces that much cone.",
                    summary=(
                        f"A = {a:.3f} but the {sign.get('regime')} sign structure alone gives {null:.3f} "
                        f"({100 * explained:.0f}% of the cone); excess {excess:+.3f}"
                    ),
                )
            )
    return flags


# =========================================================================== the artifact test
_COVARIATE_WORDS = {
    "log_frequency": "log token frequency",
    "position": "position in the window",
    "norm": "the row norm ‖x‖",
}


def artifact_flags(
    artifact: Mapping[str, Any] | None,
    *,
    thresholds: FlagThresholds | None = None,
    subject: str = "activations",
) -> list[Flag]:
    """``artifact_direction``: principal direction j whose projection has |corr| > artifact_min_abs_corr with a
    covariate (``artifact`` = ``ArtifactAccumulator.correlations()``); one flag per direction, naming its
    strongest covariate and listing every covariate's |r| as evidence."""
    t = thresholds or FlagThresholds()
    if not artifact:
        return []
    flags = []
    absr = artifact.get("abs") or {}
    for j in range(int(artifact.get("k", 0))):
        values = {name: absr.get(name, [None] * (j + 1))[j] for name in _COVARIATE_WORDS}
        hits = {name: v for name, v in values.items() if v is not None and v > t.artifact_min_abs_corr}
        if not hits:
            continue
        worst = max(hits, key=hits.get)
        flags.append(
            Flag(
                ARTIFACT,
                "warning",
                {
                    "component": j + 1,
                    **{f"abs_corr_{name}": rounded(v) for name, v in values.items()},
                    "threshold": t.artifact_min_abs_corr,
                    "n": artifact.get("n"),
                },
                "For similarity use, removing this direction (all-but-the-top) is justified; for interpretability it is "
                "evidence about what the model encodes, not noise to discard.",
                summary=(
                    f"PC{j + 1} tracks {_COVARIATE_WORDS[worst]}: |corr| = {hits[worst]:.2f}"
                    + "".join(f", {_COVARIATE_WORDS[o]} {v:.2f}" for o, v in hits.items() if o != worst)
                ),
                subject=subject,
            )
        )
    return flags


# =========================================================================== activation diagnosis
def _massive_evidence(geo: Mapping[str, Any], t: FlagThresholds) -> dict[str, Any] | None:
    """Rows far above the median norm carrying a large share of Σ‖x‖², or a coordinate far above the mean RMS."""
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


def _massive_flag(ev: dict[str, Any], rank: int, n: int, d: int) -> Flag:
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


def _diagnosis_flags(geo: Mapping[str, Any], t: FlagThresholds) -> list[Flag]:
    """offset_dominated_cone, anisotropy_invisible_to_A and mixed_populations (see FlagThresholds)."""
    flags: list[Flag] = []
    n, d = int(geo["n"]), int(geo["d"])
    a, sign = geo.get("anisotropy"), geo.get("sign") or {}
    null = sign.get("null")
    z = geo.get("null_z")
    bias = geo.get("null_bias") or 0.0
    sample = geo.get("sample_diagnostics") or {}
    mean_share = geo.get("mean_share_of_second_moment")
    if a is not None and null is not None:
        excess = float(a) - float(null) - float(bias)
        a_centred = sample.get("centred_anisotropy")
        # one definition, 1 − A_centred/A, wherever rows are at hand; the proxy only without them, labelled
        if a_centred is not None:
            explained = 1.0 - max(float(a_centred), 0.0) / float(a) if float(a) > 0 else 0.0
            how = "1 - A(centred sample rows)/A"
        else:
            ratio = geo.get("mean_norm_ratio") or 0.0
            explained = min(1.0, ratio**2 / float(a)) if float(a) > 0 else 0.0
            how = "proxy (|mu|/E|x|)^2 / A, no row sample (clipped at 1)"
        if (
            z is not None
            and z >= t.offset_cone_min_z
            and excess >= t.offset_cone_min_excess
            and explained >= t.offset_cone_min_explained
            and (mean_share or 0) >= t.offset_cone_min_mean_share
        ):
            rogue = geo.get("rogue") or {}
            flags.append(
                Flag(
                    OFFSET_CONE,
                    "warning",
                    {
                        "anisotropy": rounded(a),
                        "sign_null": rounded(null),
                        "z_vs_null": rounded(z, 1),
                        "centred_anisotropy": rounded(a_centred),
                        "share_of_A_explained_by_mean": rounded(explained),
                        "explained_by": how,
                        "mean_share_of_second_moment": rounded(mean_share),
                        "offset": rounded(geo.get("offset")),
                        "mean_norm_ratio": rounded(geo.get("mean_norm_ratio")),
                        "coordinates_for_50pct_of_offset": rogue.get("n_for_50"),
                    },
                    "Cosines on the raw activations mostly measure the shared mean: centre them (or let b_dec absorb the "
                    'mean, b_dec_init = "mean") before reading A, cosine similarities or nearest neighbours.',
                    summary=(
                        f"A = {a:.3f} is {z:.0f} null-sds above the sign-aware null {null:.3f}, and the mean explains "
                        f"{100 * explained:.0f}% of it"
                        + (
                            f" (centred rows: A = {a_centred:.3f})"
                            if a_centred is not None
                            else " (proxy (‖μ‖/E‖x‖)²/A: no row sample)"
                        )
                        + f"; the mean is {100 * (mean_share or 0):.0f}% of E‖x‖², ‖m̂‖ = {geo.get('offset') or 0:.2f}"
                    ),
                )
            )
        within_band = (z is not None and abs(z) < t.invisible_max_abs_z) or abs(excess) < t.invisible_max_excess
        erank, noise = geo.get("effective_rank"), geo.get("noise_effective_rank")
        top1 = geo.get("top1_share")
        erank_ratio = float(erank) / float(noise) if erank is not None and noise else None
        concentrated = (erank_ratio is not None and erank_ratio < t.invisible_max_erank_ratio) or (
            top1 is not None and top1 >= max(t.invisible_min_top1_over_uniform / d, t.invisible_min_top1)
        )
        if within_band and concentrated and n > d:
            flags.append(
                Flag(
                    INVISIBLE,
                    "warning",
                    {
                        "anisotropy": rounded(a),
                        "sign_null": rounded(null),
                        "z_vs_null": rounded(z, 1),
                        "effective_rank": rounded(erank, 1),
                        "noise_effective_rank": rounded(noise, 1),
                        "erank_over_noise": rounded(erank_ratio),
                        "top1_share": rounded(top1),
                        "uniform_top1": rounded(1 / d),
                        "unit_effective_rank": rounded(geo.get("unit_effective_rank"), 1),
                    },
                    "A cannot see this anisotropy (directions that cancel in the mean cosine): read the spectrum "
                    "(erank, top-1, the unit-vector second moment), not A, and do not call this space isotropic.",
                    summary=(
                        f"A = {a:.3f} is within its null band ({null:.3f}) but the spectrum is concentrated: erank "
                        f"{float(erank):.1f} of {d} (noise {float(noise):.1f}), top-1 {100 * float(top1 or 0):.0f}%"
                    ),
                )
            )
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
    if by_split or by_kmeans:
        flags.append(
            Flag(
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
        )
    return flags


def activation_diagnosis(
    geo: Mapping[str, Any], flags: list[Flag] | None = None, thresholds: FlagThresholds | None = None
) -> list[dict[str, Any]]:
    """The textbook's order — offset → shape → artifact → fix — as steps {step, finding, read: {name: number}}.

    ``flags`` are the activation flags already computed (recomputed from ``geo`` when None)."""
    geo, t = _checked(geo), thresholds or FlagThresholds()
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


# =========================================================================== SAE
def sae_flags(
    sae: Mapping[str, Any],
    geo: Mapping[str, Any],
    *,
    thresholds: FlagThresholds | None = None,
) -> list[Flag]:
    """Flags on one SAE section of a report (``SAEGeometry.to_dict()``) against the activations' ``geo``."""
    geo, t = _checked(geo), thresholds or FlagThresholds()
    name = str(sae.get("name") or "sae")
    flags: list[Flag] = []
    freq = torch.tensor(sae["firing_frequency"], dtype=torch.float64)
    cos = torch.tensor(sae["cos_decoder_mean"], dtype=torch.float64)
    shares = sae.get("cone_shares")
    shares_t = torch.tensor(shares, dtype=torch.float64) if shares is not None else None
    amp = sae.get("amplification") or {}
    a_recon = amp.get("measured_recon_minus_b_dec")
    d_sae = int(sae["d_sae"])

    # ---- mean-direction features
    by_alignment = (freq >= t.mean_direction_min_frequency) & (cos.abs() >= t.mean_direction_min_cos)
    cone_material = a_recon is not None and a_recon >= t.cone_min_anisotropy and shares_t is not None
    by_share = torch.zeros_like(by_alignment)
    n_cover = None
    if cone_material:
        by_share = shares_t >= t.mean_direction_min_cone_share
        ranked = shares_t.argsort(descending=True)
        n_cover = min(int((shares_t[ranked].cumsum(0) < t.cone_cover).sum()) + 1, d_sae)
        by_share[ranked[:n_cover]] = True
    guilty = (by_alignment | by_share).nonzero().flatten()
    if guilty.numel():
        # most guilty first: largest cone share (when the cone is material), then largest firing × |cos|
        score = freq * cos.abs() + (shares_t if cone_material else 0.0)
        order = guilty[score[guilty].argsort(descending=True)].tolist()
        top = order[0]
        n_guilty = len(order)
        share_sum = float(shares_t[guilty].sum()) if shares_t is not None else None
        smeared = f"; the top {n_cover} by cone share make {100 * t.cone_cover:.0f}% of it" if n_cover else ""
        flags.append(
            Flag(
                MEAN_DIRECTION,
                "error" if float(freq[top]) >= 0.9 and abs(float(cos[top])) >= 0.9 else "warning",
                {
                    "n_latents": n_guilty,
                    "n_by_alignment": int(by_alignment.sum()),
                    "n_by_cone_share": int(by_share.sum()),
                    "n_latents_for_cone_cover": n_cover,
                    "top_latent": top,
                    "top_firing_frequency": rounded(freq[top]),
                    "top_cos_decoder_mean": rounded(cos[top]),
                    "top_cone_share": rounded(shares_t[top]) if shares_t is not None else None,
                    "cone_share_of_flagged": rounded(share_sum),
                    "anisotropy_recon_minus_b_dec": rounded(a_recon),
                },
                "These latents encode the activation mean rather than features: initialise b_dec to the activation "
                'mean (b_dec_init = "mean", the saegeo trainer\'s default) or centre the activations, and retrain.',
                summary=(
                    f"{n_guilty} latent(s) carry the mean direction (cone of x̂ − b_dec: A = {_f3(a_recon)}{smeared}); "
                    f"latent {top} fires on {100 * float(freq[top]):.0f}% of tokens with cos(decoder, μ) = "
                    f"{float(cos[top]):+.2f}"
                    + (f", cone share {float(shares_t[top]):.2f}" if shares_t is not None else "")
                ),
                latents=order[: t.max_latents],
                subject=name,
            )
        )

    # ---- offset not absorbed by b_dec
    dist, b_cos = sae.get("b_dec_distance_to_mean"), sae.get("b_dec_cos_mean")
    gamma = geo.get("outlier_severity")
    if (
        dist is not None
        and gamma is not None
        and dist >= t.offset_min_distance
        and gamma >= t.offset_min_outlier_severity
    ):
        flags.append(
            Flag(
                OFFSET_NOT_ABSORBED,
                "error" if dist >= t.offset_error_distance else "warning",
                {
                    "b_dec_distance_to_mean": rounded(dist),
                    "b_dec_cos_mean": rounded(b_cos),
                    "b_dec_norm": rounded(sae.get("b_dec_norm")),
                    "mean_norm": rounded(geo.get("mean_vector_norm")),
                    "outlier_severity": rounded(gamma),
                },
                "b_dec should absorb the activation mean: initialise it to the mean of the activations "
                "(the saegeo default) so no latent has to spend itself on the offset.",
                summary=(
                    f"‖b_dec − μ‖/‖μ‖ = {dist:.2f} (cos {b_cos if b_cos is None else round(b_cos, 2)}, "
                    f"‖b_dec‖ {sae.get('b_dec_norm', 0):.3g} vs ‖μ‖ {geo.get('mean_vector_norm', 0):.3g}, γ = {gamma:.2f})"
                ),
                subject=name,
            )
        )

    # ---- amplification law inconsistency: the measured cone against the per-latent law
    flag = _amplification_flag(sae, amp, shares_t, freq, t, name)
    if flag is not None:
        flags.append(flag)

    # ---- dead / dense latents
    n_tokens = int(sae.get("n_tokens", 0))
    dead = (freq == 0).nonzero().flatten().tolist()
    dead_frac = len(dead) / d_sae
    if dead_frac > t.dead_max_fraction:
        flags.append(
            Flag(
                DEAD,
                "error" if dead_frac >= t.dead_error_fraction else "warning",
                {"n_dead": len(dead), "dead_fraction": rounded(dead_frac), "d_sae": d_sae, "n_tokens": n_tokens},
                "Dead latents waste capacity: initialise b_dec to the mean, use AuxK (TopK) or resampling, "
                "and check on more tokens before concluding.",
                summary=f"{len(dead)} of {d_sae} latents ({100 * dead_frac:.1f}%) never fired on {n_tokens} tokens",
                latents=dead[: t.max_latents],
                subject=name,
            )
        )
    dense_mask = freq > t.dense_frequency
    dense = dense_mask.nonzero().flatten()
    if dense.numel() / d_sae > t.dense_max_fraction:
        order = dense[freq[dense].argsort(descending=True)].tolist()
        flags.append(
            Flag(
                DENSE,
                "warning",
                {
                    "n_dense": len(order),
                    "dense_fraction": rounded(len(order) / d_sae),
                    "dense_frequency": t.dense_frequency,
                    "max_firing_frequency": rounded(freq.max()),
                    "max_abs_cos_mean_of_dense": rounded(cos[dense].abs().max()),
                },
                "Latents that fire on most tokens are usually the mean or a positional direction, not features: "
                "check their cos with the mean and centre the inputs.",
                summary=f"{len(order)} latent(s) fire on > {100 * t.dense_frequency:.0f}% of tokens",
                latents=order[: t.max_latents],
                subject=name,
            )
        )
    return flags


def _pairs_text(pairs: list[Mapping[str, Any]], n: int = 5) -> str:
    return "; ".join(f"{p['i']}&{p['j']} {p['share']:+.3f}" for p in pairs[:n])


def _amplification_flag(
    sae: Mapping[str, Any], amp: Mapping[str, Any], shares_t: Tensor | None, freq: Tensor, t: FlagThresholds, name: str
) -> Flag | None:
    """``amplification_inconsistency``: the measured A of x̂ − b_dec is outside the per-latent law's interval
    [A_het, A_het_mean_cosine] (just A_het without a row sample) by more than
    z·√(sd_measured² + sd_law²) + model_error·law, law = the nearer end (see ``FlagThresholds``);
    a warning where the cone is material (max(measured, law) ≥ cone_min_anisotropy), else info.
    The cause named: co-firing (|cofiring_share| ≥ amplification_cofiring_share; the latents of the top pairs)
    or the latents' own rates (the high-rate latents of the cone: largest cone share, then firing)."""
    measured, a_het = amp.get("measured_recon_minus_b_dec"), amp.get("A_het")
    if measured is None or a_het is None:
        return None
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
        subject=name,
    )


# =========================================================================== configuration
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


def config_flags(
    config: Mapping[str, Any] | None,
    geo: Mapping[str, Any] | None = None,
    whitening_cost: Mapping[str, Any] | None = None,
    *,
    thresholds: FlagThresholds | None = None,
    subject: str = "config",
) -> list[Flag]:
    """A config that whitens before the SAE: always a warning (never a refusal) with the measured cost.

    ``whitening_cost`` is ``Whitening.fit(acc).report.to_dict()`` on these activations (noise amplification
    √(λ_max/λ_min), clamped eigenvalues); ``geo`` adds n, d and whether the space is already isotropic.
    Whitening is sometimes what the experiment wants, so the severity stays "warning" in every case; n ≤ d
    and an amplification above ``whitening_max_amplification`` are named in the summary as the worst costs.
    """
    geo, t = _checked(geo), thresholds or FlagThresholds()
    where = config_whitens(config)
    if where is None:
        return []
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
    return [
        Flag(
            WHITENING,
            "warning",
            evidence,
            "Whitening is a choice, not a default: it can help probing but costs reconstruction, ordering and a "
            "meaningful basis — keep it only if you measured that it helps, and never read principal axes after it.",
            summary=f"the config whitens before the SAE ({where})" + ("; " + "; ".join(notes) if notes else ""),
            subject=subject,
        )
    ]


# =========================================================================== dictionary only
def dictionary_flags(
    W_dec: Float[Tensor, "d_sae d_in"],
    b_dec: Float[Tensor, " d_in"] | None = None,
    *,
    thresholds: FlagThresholds | None = None,
    subject: str = "dictionary",
    norms: Float[Tensor, " d_sae"] | None = None,
    block_rows: int = 4096,
) -> list[Flag]:
    """Mean-direction features without activations: latents whose unit decoder row u_i has
    |cos(u_i, b_dec)| ≥ dictionary_min_cos, or, when b_dec is zero/absent, cos(u_i, ū) ≥ it
    (ū = mean unit decoder row, the dictionary's own mean direction). Blockwise (``row_cosines``,
    ``unit_row_blocks``): no d_sae² matrix and no float64 copy of W_dec. ``norms`` (‖w_i‖, float64, 0 for rows
    to leave out, e.g. ``DictionaryGeometry.direction_norms``) saves a pass; such rows get cos 0."""
    t = thresholds or FlagThresholds()
    w = W_dec.detach()
    norms = row_norms(w, block_rows=block_rows) if norms is None else norms.to(torch.float64)
    use_b = b_dec is not None and float(b_dec.detach().to(torch.float64).norm()) > 0
    if use_b:
        direction = b_dec.detach().to(torch.float64)
    else:
        direction = torch.zeros(w.shape[1], dtype=torch.float64)
        for block in unit_row_blocks(w, norms, block_rows=block_rows, dtype=torch.float64):
            direction += block.sum(0)
    dnorm = float(direction.norm())
    if dnorm == 0:
        return []
    cos = row_cosines(w, direction, block_rows=block_rows)
    cos[norms == 0] = 0.0
    guilty = (cos.abs() >= t.dictionary_min_cos).nonzero().flatten()
    if not guilty.numel():
        return []
    order = guilty[cos[guilty].abs().argsort(descending=True)].tolist()
    ref = "b_dec" if use_b else "the dictionary's mean direction ū"
    return [
        Flag(
            MEAN_DIRECTION,
            "warning",
            {
                "n_latents": len(order),
                "top_latent": order[0],
                "top_abs_cos": rounded(cos[order[0]].abs()),
                "reference_norm": rounded(dnorm),
                "d_sae": int(w.shape[0]),
            },
            "Latents parallel to b_dec (or to the mean decoder direction) usually encode the activation offset: "
            "check them against activations (saegeo check --acts) before interpreting them as features.",
            summary=f"{len(order)} decoder row(s) with |cos| ≥ {t.dictionary_min_cos:g} to {ref}",
            latents=order[: t.max_latents],
            subject=subject,
        )
    ]
