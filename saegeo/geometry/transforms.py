"""Fitted linear transforms of activations: centring, all-but-the-top, whitening.

Each is fitted from a :class:`~saegeo.geometry.accumulate.GeometryAccumulator` (one streaming pass, no
rows held) and carries a :class:`TransformReport` saying what it did: the share of variance (and of the
second moment) it removes and, for whitening, the noise amplification √(λ_max/λ_min) over the kept directions.

Public API
----------
``Centering.fit(acc)``                                   y = x − μ;                      inverse: y + μ.
``AllButTheTop.fit(acc, n_components=D)``                y = (x − μ)(I − U_D U_Dᵀ);     not invertible.
``Whitening.fit(acc, k=None, shrinkage=0.0, clamp=1e-6)``  y = (x − μ) U_k Λ_k^{-1/2};  inverse: y Λ_k^{1/2} U_kᵀ + μ
                                                          (exact for k = d, the projection onto the kept span otherwise).
Each has ``.apply(x) -> Tensor``, ``.inverse(y) -> Tensor`` (or BadInputError), ``.report: TransformReport``.
Shrinkage α moves the eigenvalues toward their mean, λ' = (1 − α)λ + α·mean(λ) (Ledoit–Wolf-style target);
``clamp`` floors λ' at clamp·λ'_max so near-null directions are not blown up without bound.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor

from saegeo.errors import BadInputError
from saegeo.geometry.accumulate import GeometryAccumulator, as_rows
from saegeo.geometry.diagnosis import two_means_1d
from saegeo.geometry.measures import centred_spectrum, effective_rank, spectrum_shares

# a removed / rescaled direction "carries a population split" when the 2-means split of the sample's
# projections on it explains ≥ SPLIT_SHARE of their variance (one Gaussian: 2/π ≈ 0.64) with ≥
# SPLIT_MIN_FRACTION of the rows on the smaller side
SPLIT_SHARE = 0.8
SPLIT_MIN_FRACTION = 0.05


@dataclass
class TransformReport:
    """What a fitted transform does to the data it was fitted on."""

    name: str
    n_kept: int  # output dimensions
    removed_variance_share: float  # share of tr Σ removed (0 for centring)
    removed_second_moment_share: float  # share of tr S = E‖x‖² removed (centring removes ‖μ‖²/tr S)
    noise_amplification: float | None = None  # √(λ_max/λ_min) over kept directions (whitening only)
    n_clamped: int = 0  # eigenvalues raised to the clamp floor
    invertible: bool = True
    notes: list[str] = field(default_factory=list)
    top1_share_after: float | None = None  # λ_max/Σλ of the output's covariance (fitted data)
    effective_rank_after: float | None = None  # erank of the output's covariance
    split_shares: list[float] | None = None  # per removed/rescaled direction: 2-means share of the sample's projections

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _split_notes(sample: Any, mean: Tensor, directions: Tensor, what: str) -> tuple[list[float] | None, list[str]]:
    """2-means share of the sample's projections on each direction; a note for each one that splits the rows."""
    if sample is None or directions.shape[1] == 0:
        return None, []
    rows = as_rows(sample, mean.numel()).to(torch.float64)
    proj = (rows - mean) @ directions
    shares, notes = [], []
    for j in range(directions.shape[1]):
        split = two_means_1d(proj[:, j])
        shares.append(split.between_share)
        if split.between_share >= SPLIT_SHARE and split.smaller_fraction >= SPLIT_MIN_FRACTION:
            notes.append(
                f"warning: the {what} direction {j + 1} carries a population split ({100 * split.between_share:.0f}% of "
                f"the sample's variance along it lies between two groups of {100 * split.smaller_fraction:.0f}% / "
                f"{100 - 100 * split.smaller_fraction:.0f}%): this transform erases the difference between the populations"
            )
    return shares, notes


def _rows_like(x: Any, d: int) -> Tensor:
    t = as_rows(x, d)
    return t if t.dtype in (torch.float32, torch.float64) else t.to(torch.float32)


def _n_le_d_note(acc: GeometryAccumulator) -> list[str]:
    if acc.n <= acc.d:
        return [
            f"fitted on n = {acc.n} ≤ d = {acc.d} rows: the covariance is singular, its small eigenvalues are noise"
        ]
    return []


@dataclass
class Centering:
    """x ↦ x − μ."""

    mean: Float[Tensor, " d"]
    report: TransformReport

    @classmethod
    def fit(cls, acc: GeometryAccumulator) -> Centering:
        mu = acc.mean
        trace_s = acc.mean_sq_norm  # tr S = E‖x‖²
        share = float(mu.square().sum()) / trace_s if trace_s > 0 else 0.0
        return cls(mu, TransformReport("center", acc.d, 0.0, share))

    def apply(self, x: Any) -> Float[Tensor, "n d"]:
        """y = x − μ (in the input's float dtype)."""
        t = _rows_like(x, self.mean.numel())
        return t - self.mean.to(t)

    def inverse(self, y: Any) -> Float[Tensor, "n d"]:
        t = _rows_like(y, self.mean.numel())
        return t + self.mean.to(t)


@dataclass
class AllButTheTop:
    """Mu & Viswanath's post-processing: centre, then remove the projection on the top D principal directions."""

    mean: Float[Tensor, " d"]
    components: Float[Tensor, "d D"]
    report: TransformReport

    @classmethod
    def fit(cls, acc: GeometryAccumulator, n_components: int = 1, *, sample: Any = None) -> AllButTheTop:
        """Fit on the accumulated rows; ``sample`` (a few thousand rows, optional) lets the report check whether a
        removed direction carries a population split. The report gives top-1 and erank of what is left:
        the spectrum λ_{D+1..d}."""
        if not 0 <= n_components <= acc.d:
            raise BadInputError(f"all-but-the-top: n_components must be in [0, d = {acc.d}], got {n_components}")
        spec = centred_spectrum(acc)
        lam = spec.eigenvalues.clamp(min=0)
        total = float(lam.sum())
        removed = float(lam[:n_components].sum())
        trace_s = total + float(acc.mean.square().sum())
        rest = lam[n_components:]
        shares, split_notes = _split_notes(sample, acc.mean, spec.eigenvectors[:, :n_components], "removed")
        report = TransformReport(
            name=f"all-but-the-top(D={n_components})",
            n_kept=acc.d,  # output keeps d coordinates, on a (d − D)-dimensional subspace
            removed_variance_share=removed / total if total > 0 else 0.0,
            removed_second_moment_share=(trace_s - (total - removed)) / trace_s if trace_s > 0 else 0.0,
            invertible=n_components == 0,
            notes=_n_le_d_note(acc) + split_notes,
            top1_share_after=float(spectrum_shares(rest)[0]) if rest.numel() and float(rest.sum()) > 0 else None,
            effective_rank_after=effective_rank(rest) if rest.numel() else None,
            split_shares=shares,
        )
        return cls(acc.mean, spec.eigenvectors[:, :n_components].contiguous(), report)

    def apply(self, x: Any) -> Float[Tensor, "n d"]:
        """y = (x − μ) − (x − μ) U_D U_Dᵀ."""
        t = _rows_like(x, self.mean.numel())
        centred = t - self.mean.to(t)
        u = self.components.to(t)
        return centred - (centred @ u) @ u.T

    def inverse(self, y: Any) -> Float[Tensor, "n d"]:
        if self.components.shape[1] == 0:
            t = _rows_like(y, self.mean.numel())
            return t + self.mean.to(t)
        raise BadInputError(
            "all-but-the-top is a projection: the removed components are gone and cannot be restored. "
            "Keep the original activations if you need them."
        )


@dataclass
class Whitening:
    """PCA whitening: y = (x − μ) U_k Λ_k^{-1/2}, with optional top-k truncation, shrinkage and an eigenvalue floor."""

    mean: Float[Tensor, " d"]
    components: Float[Tensor, "d k"]
    scales: Float[Tensor, " k"]  # √λ'_j of the kept directions (after shrinkage and clamping)
    report: TransformReport

    @classmethod
    def fit(
        cls,
        acc: GeometryAccumulator,
        k: int | None = None,
        shrinkage: float = 0.0,
        clamp: float = 1e-6,
        *,
        sample: Any = None,
    ) -> Whitening:
        """Fit on the accumulated rows. The report gives top-1 and erank of the whitened covariance
        (λ_j/λ'_j over the kept directions: 1/k and k unless clamped or shrunk) and, with a row ``sample``,
        warns when the top direction — rescaled to unit variance like all others — carries a population split."""
        d = acc.d
        k = d if k is None else int(k)
        if not 1 <= k <= d:
            raise BadInputError(f"whitening: k must be in [1, d = {d}], got {k}")
        if not 0.0 <= shrinkage <= 1.0:
            raise BadInputError(f"whitening: shrinkage must be in [0, 1], got {shrinkage}")
        if acc.n < 2:
            raise BadInputError(f"whitening needs at least 2 rows to estimate a covariance, got {acc.n}")
        spec = centred_spectrum(acc)
        lam = spec.eigenvalues.clamp(min=0)
        total = float(lam.sum())
        if total == 0:
            raise BadInputError("whitening is undefined: the covariance is zero (all rows identical)")
        shrunk = (1 - shrinkage) * lam + shrinkage * lam.mean()
        floor = clamp * float(shrunk.max())
        kept = shrunk[:k]
        n_clamped = int((kept < floor).sum())
        kept = kept.clamp(min=floor)
        notes = _n_le_d_note(acc)
        if n_clamped:
            notes.append(f"{n_clamped} eigenvalue(s) below {clamp:g}·λ_max were raised to the floor")
        amplification = math.sqrt(float(kept.max() / kept.min()))
        kept_variance = float(lam[:k].sum())
        trace_s = total + float(acc.mean.square().sum())
        after = lam[:k] / kept  # variance of each whitened coordinate
        shares, split_notes = _split_notes(sample, acc.mean, spec.eigenvectors[:, :1], "top (rescaled)")
        notes += split_notes
        report = TransformReport(
            name=f"whitening(k={k}, shrinkage={shrinkage:g})",
            n_kept=k,
            removed_variance_share=1.0 - kept_variance / total,
            removed_second_moment_share=1.0 - kept_variance / trace_s,
            noise_amplification=amplification,
            n_clamped=n_clamped,
            invertible=k == d,
            notes=notes,
            top1_share_after=float(spectrum_shares(after).max()),
            effective_rank_after=effective_rank(after),
            split_shares=shares,
        )
        return cls(acc.mean, spec.eigenvectors[:, :k].contiguous(), kept.sqrt(), report)

    def apply(self, x: Any) -> Float[Tensor, "n k"]:
        """y = (x − μ) U_k diag(1/√λ'_k)."""
        t = _rows_like(x, self.mean.numel())
        return ((t - self.mean.to(t)) @ self.components.to(t)) / self.scales.to(t)

    def inverse(self, y: Any) -> Float[Tensor, "n d"]:
        """x = y diag(√λ'_k) U_kᵀ + μ: exact for k = d, the projection onto the kept span for k < d."""
        t = _rows_like(y, self.scales.numel())
        return (t * self.scales.to(t)) @ self.components.to(t).T + self.mean.to(t)
