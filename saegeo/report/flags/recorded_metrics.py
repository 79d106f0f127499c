"""What the SAE's training recorded about itself (``FormatInfo.recorded_metrics``: SAELens metadata l0,
num_dead_features and explained_variance, a BatchTopK's training k) against the rows ``check --acts`` read: a family
of two flags."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from saegeo.config import option
from saegeo.report.flags import Flag, flag, rounded

THRESHOLD_NOT_APPLIED = "threshold_not_applied"
RECORDED_CONTRADICTED = "recorded_metrics_contradicted"


@dataclass
class Options:
    recorded_l0_factor: float = option(
        3.0, "L0 on the rows above this × the recorded L0 (else the training k): not what training used", above=0
    )
    # FVE of one SAE on three 4,096-row sets of its own store spreads up to 0.065 (docs/design.md,
    # benchmarks/recorded_metrics_table.py), so a smaller gap is no evidence
    recorded_fve_tolerance: float = option(
        0.07, "|recorded explained variance − FVE on the rows| above this: contradicted", low=0
    )
    recorded_about_zero_match: float = option(
        0.01, "recorded within this of 1 − Σ‖x − x̂‖²/Σ‖x‖² (and not of FVE): measured about zero", low=0
    )
    recorded_dead_share: float = option(0.5, "at least this share of latents never fire on the rows ...", low=0, high=1)
    recorded_dead_max_recorded: float = option(
        0.1, "... where training recorded at most this share dead (num_dead_features): contradicted", low=0, high=1
    )


def _l0_flag(q: dict[str, Any], t: Any, thresholded: bool) -> Flag | None:
    l0, expected, rows = q["l0"], q["expected_l0"], q["rows"]
    if q["thresholded"] != thresholded or not (
        expected is not None and expected > 0 and l0 > t.recorded_l0_factor * expected
    ):
        return None
    recorded, t_max = q["recorded"], q["max_abs_threshold"]
    return Flag(
        THRESHOLD_NOT_APPLIED if thresholded else RECORDED_CONTRADICTED,
        "error" if thresholded else "warning",
        {
            "l0_on_rows": rounded(l0),
            "recorded_l0": rounded(recorded.get("l0")),
            "training_k": recorded.get("training_k") or q["k"],
            "max_abs_threshold": rounded(t_max),
            "rows": rows,
        },
        "The threshold this SAE was trained with is missing, zero or not applied: its codes are dense and "
        "every number computed from them is not the trained SAE's; load the threshold (or the k) it recorded."
        if thresholded
        else "The SAE's codes on these rows are far denser than training recorded: check the loader and the "
        "sparsity settings before trusting its codes.",
        summary=f"L0 {l0:.1f} on {rows} rows against {expected:g} recorded in training"
        + (f" (max |threshold| {t_max:.3g})" if thresholded and t_max is not None else ""),
        subject=q["subject"],
    )


@flag(
    THRESHOLD_NOT_APPLIED,
    stage="recorded",
    reads=("l0", "expected_l0", "recorded", "max_abs_threshold", "thresholded"),
    options=Options,
    bands={"error": "always"},
    when="`check --acts`, `report --sae`, `latents`: a JumpReLU SAE (BatchTopK / Matryoshka saved as one) whose L0 "
    "on the rows is above 3 × the L0 its training recorded (else its training k): the threshold is missing, zero or "
    "not applied (SAELens issue 608)",
    order=10,
)
def threshold_not_applied(q: dict[str, Any], t: Any) -> Flag | None:
    return _l0_flag(q, t, thresholded=True)


def _dead_flag(q: dict[str, Any], t: Any) -> Flag | None:
    """The dead count training recorded against the latents that never fired on these rows (a latent rarer than 1 in
    ``rows`` rows looks dead here, so smaller gaps are no evidence)."""
    recorded_dead, dead, rows = q["recorded"].get("num_dead_features"), q["dead"], q["rows"]
    if recorded_dead is None:
        return None
    n_lat, n_dead = int(dead.numel()), int(dead.sum())
    if not (n_dead >= t.recorded_dead_share * n_lat and recorded_dead <= t.recorded_dead_max_recorded * n_lat):
        return None
    return Flag(
        RECORDED_CONTRADICTED,
        "warning",
        {"recorded_dead": int(recorded_dead), "dead_on_rows": n_dead, "d_sae": n_lat, "rows": rows},
        "Most latents never fire on these rows though training recorded them alive: check the loader, the "
        "encoder bias or threshold, and the rows (scale, hook) before trusting its codes.",
        summary=f"{n_dead} of {n_lat} latents never fire on {rows:,} rows; training recorded {int(recorded_dead)} dead",
        latents=dead.nonzero().flatten().tolist()[: t.max_latents],
        subject=q["subject"],
    )


@flag(
    RECORDED_CONTRADICTED,
    stage="recorded",
    reads=("l0", "expected_l0", "recorded", "fve", "explained_variance_about_zero", "dead", "rows"),
    options=Options,
    bands={"warning": "any contradiction"},
    when="the same rows contradict what training recorded: L0 above 3 × the recorded L0 (any other SAE), or a "
    "recorded explained variance more than 0.07 from FVE on the rows, or within 0.01 of 1 − Σ‖x − x̂‖²/Σ‖x‖² (and not "
    "of FVE): measured about zero (SAELens issue 659); at least half the latents never fire on the rows where "
    "training recorded at most 10 % dead (`num_dead_features`; a note gives both counts always)",
    order=20,
)
def recorded_metrics_contradicted(q: dict[str, Any], t: Any) -> list[Flag]:
    flags = [f for f in (_dead_flag(q, t), _l0_flag(q, t, thresholded=False)) if f is not None]
    ev, fve, about_zero = q["recorded"].get("explained_variance"), q["fve"], q["explained_variance_about_zero"]
    if ev is None or fve is None:
        return flags
    # the recorded figure is the about-zero one (told apart from FVE about the mean), or simply far from FVE
    zero_baseline = abs(ev - about_zero) <= t.recorded_about_zero_match < abs(ev - fve)
    if not (zero_baseline or abs(ev - fve) > t.recorded_fve_tolerance):
        return flags
    flags.append(
        Flag(
            RECORDED_CONTRADICTED,
            "warning",
            {
                "recorded_explained_variance": rounded(ev),
                "fve_on_rows": rounded(fve),
                "explained_variance_about_zero": rounded(about_zero),
                "measured_about_zero": zero_baseline,
            },
            "Read the FVE measured here: the recorded explained variance does not describe these rows"
            + (" (it was measured about zero, not about the mean)." if zero_baseline else "."),
            summary=f"recorded explained variance {ev:.3f}, FVE on these rows {fve:.3f}"
            + (
                f": the recorded figure is the variance explained about zero ({about_zero:.3f}), not about the "
                "mean (SAELens before 6.45.1, its issue 659)"
                if zero_baseline
                else ""
            ),
            subject=q["subject"],
        )
    )
    return flags
