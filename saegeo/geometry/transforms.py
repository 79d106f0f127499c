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
from saegeo.geometry.measures import centred_spectrum


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

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _rows_like(x: Any, d: int) -> Tensor:
    t = as_rows(x, d)
    return t if t.dtype in (torch.float32, torch.float64) else t.to(torch.float32)


def _n_le_d_note(acc: GeometryAccumulator) -> list[str]:
    if acc.n <= acc.d:
        return [f"fitted on n = {acc.n} ≤ d = {acc.d} rows: the covariance is singular, its small eigenvalues are noise"]
    return []


@dataclass
class Centering:
    """x ↦ x − μ."""

    mean: Float[Tensor, " d"]
    report: TransformReport

    @classmethod
    def fit(cls, acc: GeometryAccumulator) -> "Centering":
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
    def fit(cls, acc: GeometryAccumulator, n_components: int = 1) -> "AllButTheTop":
        if not 0 <= n_components <= acc.d:
            raise BadInputError(f"all-but-the-top: n_components must be in [0, d = {acc.d}], got {n_components}")
        spec = centred_spectrum(acc)
        lam = spec.eigenvalues.clamp(min=0)
        total = float(lam.sum())
        removed = float(lam[:n_components].sum())
        trace_s = total + float(acc.mean.square().sum())
        report = TransformReport(
            name=f"all-but-the-top(D={n_components})",
            n_kept=acc.d,  # output keeps d coordinates, on a (d − D)-dimensional subspace
            removed_variance_share=removed / total if total > 0 else 0.0,
            removed_second_moment_share=(trace_s - (total - removed)) / trace_s if trace_s > 0 else 0.0,
            invertible=n_components == 0,
            notes=_n_le_d_note(acc),
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
    ) -> "Whitening":
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
        report = TransformReport(
            name=f"whitening(k={k}, shrinkage={shrinkage:g})",
            n_kept=k,
            removed_variance_share=1.0 - kept_variance / total,
            removed_second_moment_share=1.0 - kept_variance / trace_s,
            noise_amplification=amplification,
            n_clamped=n_clamped,
            invertible=k == d,
            notes=notes,
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
