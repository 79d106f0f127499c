"""Measures of activation geometry, each a small public function, and the one-call summary.

Public API
----------
Scalar measures (pure functions, reusable by the report and other modules):
``anisotropy_from_unit_mean(unit_mean, n) -> float``   A = (n‖m̂‖² − 1)/(n − 1) (defined in accumulate.py).
``spectrum_shares(eigenvalues) -> Tensor``              p = λ/Σλ (negative rounding noise clamped to 0).
``effective_rank(eigenvalues) -> float``                exp(−Σ p log p).
``participation_ratio(eigenvalues) -> float``           (Σλ)²/Σλ².
``numerical_rank(eigenvalues, rel_tol) -> int``         #{λ > rel_tol·λ_max}.
``isoscore(eigenvalues) -> float``                      IsoScore of Rudman et al. from the PCA variances.
``rogue_dimensions(unit_mean, top=10) -> RogueDimensions``   coordinate shares m̂_j²/‖m̂‖² of A ≈ Σ m̂_j².
``fix_eigenvector_signs(vectors) -> Tensor``            sign convention: each column's largest-|entry| is positive.
``centred_spectrum(acc) -> Spectrum``                   eigh of Σ, descending, signs fixed.
``sign_null(acc) -> SignNull``                          the sign-aware null, regime, q, r and canonical forms.
Summary:
``activation_geometry(acc, *, top_k_eigvecs=10, n_rogue=10, rank_rel_tol=None) -> ActivationGeometry``  every number of
    DESIGN.md "The math" (except the amplification law); ``.to_dict()`` is JSON-safe (no NaN/inf: undefined → None),
    ``ActivationGeometry.from_dict(d)`` inverts it, ``.summary()`` is the few-line terminal text.
Second streaming pass (the artifact test):
``project_top_components(batches, geometry_or_acc, k=1) -> Tensor (n, k)``  (x − μ)·v_j for the top-k v_j.
``top_projection_correlation(batches, metadata, geometry_or_acc, component=0) -> float``  |corr(projection, metadata)|.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable

import numpy as np
import torch
from jaxtyping import Float
from torch import Tensor

from saegeo.errors import BadInputError
from saegeo.geometry.accumulate import GeometryAccumulator, anisotropy_from_unit_mean, as_rows
from saegeo.io import json_safe
from saegeo.geometry.nulls import (
    SignNull,
    anisotropy_null_sd,
    isotropic_cosine_sd,
    marchenko_pastur_edges,
    noise_effective_rank,
    sign_null_from_moments,
)

EIGENVECTOR_SIGN_CONVENTION = "each eigenvector's largest-|component| entry is positive (ties: lowest index)"


# ---------------------------------------------------------------------- scalar measures
def spectrum_shares(eigenvalues: Float[Tensor, " d"]) -> Float[Tensor, " d"]:
    """p_i = λ_i / Σλ with λ clamped at 0 (eigh returns tiny negatives for singular matrices); zeros if Σλ = 0."""
    lam = torch.as_tensor(eigenvalues, dtype=torch.float64).clamp(min=0)
    total = lam.sum()
    return lam / total if total > 0 else torch.zeros_like(lam)


def effective_rank(eigenvalues: Float[Tensor, " d"]) -> float:
    """exp(−Σ p_i log p_i), p = λ/Σλ, 0·log 0 = 0 (Roy & Vetterli). 0 for a zero spectrum."""
    p = spectrum_shares(eigenvalues)
    if p.sum() == 0:
        return 0.0
    p = p[p > 0]
    return float(torch.exp(-(p * p.log()).sum()))


def participation_ratio(eigenvalues: Float[Tensor, " d"]) -> float:
    """(Σλ)² / Σλ² (λ clamped at 0). 0 for a zero spectrum."""
    lam = torch.as_tensor(eigenvalues, dtype=torch.float64).clamp(min=0)
    sq = float(lam.square().sum())
    return float(lam.sum()) ** 2 / sq if sq > 0 else 0.0


def numerical_rank(eigenvalues: Float[Tensor, " d"], rel_tol: float) -> int:
    """#{λ_i > rel_tol · λ_max}; 0 for a zero spectrum."""
    lam = torch.as_tensor(eigenvalues, dtype=torch.float64)
    top = float(lam.max()) if lam.numel() else 0.0
    if top <= 0:
        return 0
    return int((lam > rel_tol * top).sum())


def isoscore(eigenvalues: Float[Tensor, " d"]) -> float:
    """IsoScore (Rudman et al., 2022) from the variances along the principal axes (the eigenvalues of Σ).

    With d dimensions: λ̂ = √d·λ/‖λ‖, isotropy defect δ = ‖λ̂ − 1‖/√(2(d − √d)),
    k = (d − δ²(d − √d))²/d dimensions used, ι = (k − 1)/(d − 1) ∈ [0, 1]. Scale-invariant, so the
    /n vs /(n−1) covariance convention does not matter. d = 1 is isotropic by definition (1.0).
    """
    lam = torch.as_tensor(eigenvalues, dtype=torch.float64).clamp(min=0)
    d = lam.numel()
    if d == 1:
        return 1.0
    norm = float(torch.linalg.vector_norm(lam))
    if norm == 0:
        raise BadInputError("IsoScore is undefined for a zero spectrum (no spread: all rows identical)")
    root = math.sqrt(d)
    normalised = lam * (root / norm)
    defect = float(torch.linalg.vector_norm(normalised - 1.0)) / math.sqrt(2 * (d - root))
    dims_used = (d - defect**2 * (d - root)) ** 2 / d
    return (dims_used - 1) / (d - 1)


def fix_eigenvector_signs(vectors: Float[Tensor, "d k"]) -> Float[Tensor, "d k"]:
    """Flip each column so that its largest-|component| entry is positive (first such index on ties)."""
    idx = vectors.abs().argmax(dim=0)
    signs = torch.sign(vectors[idx, torch.arange(vectors.shape[1])])
    signs[signs == 0] = 1
    return vectors * signs


@dataclass
class Spectrum:
    """Centred spectrum: eigenvalues of Σ descending (float64) and eigenvectors as columns, signs fixed."""

    eigenvalues: Float[Tensor, " d"]
    eigenvectors: Float[Tensor, "d d"]


def _eigh(matrix: Float[Tensor, "d d"]) -> tuple[Tensor, Tensor]:
    """torch.linalg.eigh, single-threaded on CPU.

    The tridiagonalisation is a chain of small BLAS-2 steps; multithreaded LAPACK spin-waits between them,
    and on a busy machine that costs 10–50× (measured on 2 loaded cores: d = 768, 14 s with 2 threads and
    1.1 s with 1; d = 2304, 20–60 s against 1.2 s).
    """
    if matrix.device.type != "cpu":
        return torch.linalg.eigh(matrix)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return torch.linalg.eigh(matrix)
    finally:
        torch.set_num_threads(threads)


def centred_spectrum(acc: GeometryAccumulator) -> Spectrum:
    """eigh of the covariance Σ, reordered to descending λ, eigenvector signs by EIGENVECTOR_SIGN_CONVENTION."""
    lam, vec = _eigh(acc.covariance())
    lam, vec = lam.flip(0), vec.flip(1)
    return Spectrum(eigenvalues=lam, eigenvectors=fix_eigenvector_signs(vec))


def sign_null(acc: GeometryAccumulator) -> SignNull:
    """The sign-aware null A_null = m̄²/s̄ of the accumulated rows, with regime, q, r and the canonical forms.

    m̄, s̄ and q are taken over the nonzero rows, the rows A is measured on: zero rows add nothing to Σx or
    Σx², only to the count, so each pooled moment is rescaled by n/n_unit (else a fraction f of zero rows
    would shrink the null by a factor 1 − f).
    """
    to_nonzero_rows = acc.n / acc.n_unit if acc.n_unit > 0 else 1.0
    return sign_null_from_moments(
        acc.pooled_mean * to_nonzero_rows,
        acc.pooled_mean_square * to_nonzero_rows,
        acc.fraction_nonzero * to_nonzero_rows,
        acc.magnitude_ratio,
        acc.negative_energy_fraction,
    )


@dataclass
class RogueDimensions:
    """Coordinates that carry the cone: A ≈ Σ_j m̂_j², share_j = m̂_j²/‖m̂‖²."""

    top_indices: list[int]
    top_shares: list[float]
    n_for_50: int  # fewest coordinates whose shares add up to ≥ 50%
    n_for_90: int

    def to_dict(self) -> dict:
        return asdict(self)


def rogue_dimensions(unit_mean: Float[Tensor, " d"], top: int = 10) -> RogueDimensions:
    """Rank coordinates by their share m̂_j²/‖m̂‖² of the offset; count how many reach 50% and 90%."""
    sq = torch.as_tensor(unit_mean, dtype=torch.float64).square()
    total = float(sq.sum())
    if total == 0:
        return RogueDimensions([], [], 0, 0)
    shares, order = (sq / total).sort(descending=True)
    cum = shares.cumsum(0)
    # Small slack so that shares summing to exactly 0.5 in exact arithmetic are not pushed one further.
    n50 = int((cum < 0.5 - 1e-12).sum()) + 1
    n90 = int((cum < 0.9 - 1e-12).sum()) + 1
    k = min(top, sq.numel())
    return RogueDimensions(order[:k].tolist(), shares[:k].tolist(), min(n50, sq.numel()), min(n90, sq.numel()))


# ---------------------------------------------------------------------- the summary
@dataclass
class ActivationGeometry:
    """Everything DESIGN.md "The math" asks of one set of rows. Undefined values are None, never NaN."""

    n: int
    d: int
    n_zero: int
    n_nonfinite_skipped: int
    # offset and cone
    offset: float | None  # ‖m̂‖
    anisotropy: float | None  # A, mean pairwise cosine (i ≠ j, nonzero rows)
    isotropic_cosine_sd: float  # 1/√d
    anisotropy_null_sd: float | None  # √(2/(n(n−1)d))
    anisotropy_z: float | None  # (A − A_null)/sd against the sign-aware null
    sign: SignNull
    # mean against spread
    mean_vector_norm: float  # ‖μ‖
    mean_row_norm: float  # E‖x‖
    mean_norm_ratio: float | None  # ‖μ‖/E‖x‖
    mean_share_of_second_moment: float | None  # ‖μ‖²/tr S
    outlier_severity: float | None  # γ = ‖μ‖/√tr Σ
    total_variance: float  # tr Σ
    # centred spectrum
    eigenvalues: list[float]  # descending
    top1_share: float | None
    top10_share: float | None
    effective_rank: float
    participation_ratio: float
    numerical_rank: int
    numerical_rank_rel_tol: float
    isoscore: float | None
    # Marchenko–Pastur null for isotropic noise of the same (n, d) and tr Σ
    mp_sigma2: float
    mp_lower_edge: float
    mp_upper_edge: float
    n_spikes: int  # eigenvalues above the upper edge
    noise_effective_rank: float
    rogue: RogueDimensions
    top_eigenvectors: list[list[float]]  # k rows of length d
    eigenvector_sign_convention: str
    mean: list[float]
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe dict (floats, ints, lists, None, nested dicts)."""
        out = asdict(self)
        return json_safe(out)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ActivationGeometry":
        """Inverse of :meth:`to_dict` (JSON round trip); unknown keys are ignored."""
        names = {f for f in cls.__dataclass_fields__}
        kwargs = {k: v for k, v in data.items() if k in names}
        kwargs["sign"] = SignNull(**data["sign"])
        kwargs["rogue"] = RogueDimensions(**data["rogue"])
        return cls(**kwargs)

    def summary(self) -> str:
        """A few lines a person reads first (used by `saegeo geometry`)."""
        f = lambda v, spec=".4f": "n/a" if v is None else format(v, spec)  # noqa: E731
        s = self.sign
        lines = [f"{self.n:,} rows x {self.d} dims"]
        z = "" if self.anisotropy_z is None else f", z = {self.anisotropy_z:,.1f}"
        lines.append(
            f"cone:      A = {f(self.anisotropy)} (mean pairwise cosine) against the sign-aware null {s.null:.4f}{z}; "
            f"offset |m^| = {f(self.offset)}; one cosine under isotropy has sd {self.isotropic_cosine_sd:.4f}"
        )
        lines.append(
            f"sign:      {s.regime}, q = {s.fraction_nonzero:.3f}, r = {s.magnitude_ratio:.3f}; null m^2/s = {s.null:.4f} "
            f"(1/pi = {s.dense_relu_null:.4f}, q/2 = {s.sparse_exp_null:.4f}; matches: {s.canonical})"
        )
        lines.append(
            f"mean:      |mu| = {self.mean_vector_norm:.4g} = {f(self.mean_norm_ratio, '.3f')} of E|x| ({self.mean_row_norm:.4g}); "
            f"share of E|x|^2 {f(self.mean_share_of_second_moment, '.1%')}; outlier severity {f(self.outlier_severity, '.3g')}"
        )
        lines.append(
            f"spectrum:  top-1 {f(self.top1_share, '.1%')}, top-10 {f(self.top10_share, '.1%')}, "
            f"erank {self.effective_rank:.1f} (isotropic noise of this n, d: {self.noise_effective_rank:.1f}), "
            f"PR {self.participation_ratio:.1f}, rank {self.numerical_rank}, IsoScore {f(self.isoscore, '.3f')}"
        )
        lines.append(
            f"MP null:   sigma^2 = {self.mp_sigma2:.4g}, bulk [{self.mp_lower_edge:.4g}, {self.mp_upper_edge:.4g}], "
            f"{self.n_spikes} eigenvalue(s) above it"
        )
        if self.rogue.top_indices:
            top = ", ".join(f"#{i} {sh:.0%}" for i, sh in zip(self.rogue.top_indices[:3], self.rogue.top_shares[:3]))
            lines.append(
                f"rogue:     {self.rogue.n_for_50} coordinate(s) carry 50% of |m^|^2, {self.rogue.n_for_90} carry 90% (top: {top})"
            )
        lines += [f"note:      {note}" for note in self.notes]
        return "\n".join(lines)

    @property
    def mean_tensor(self) -> Float[Tensor, " d"]:
        return torch.tensor(self.mean, dtype=torch.float64)

    @property
    def top_eigenvector_tensor(self) -> Float[Tensor, "d k"]:
        """The stored top eigenvectors as columns."""
        return torch.tensor(self.top_eigenvectors, dtype=torch.float64).reshape(-1, self.d).T


def _clip_to_range(value: float, lo: float, hi: float, name: str, notes: list[str]) -> float:
    """value clipped to [lo, hi] (the measure's exact range), with a note when rounding had crossed it
    (a mean of unit vectors summed in floating point can come out at ‖m̂‖ = 1.0000003)."""
    if lo <= value <= hi:
        return value
    clipped = min(max(value, lo), hi)
    notes.append(f"{name} = {value:.9g} from rounding is outside its range [{lo:.6g}, {hi:.6g}]; reported as {clipped:.6g}")
    return clipped


def activation_geometry(
    acc: GeometryAccumulator,
    *,
    top_k_eigvecs: int = 10,
    n_rogue: int = 10,
    rank_rel_tol: float | None = None,
) -> ActivationGeometry:
    """Compute every measure from one accumulator (no second pass).

    rank_rel_tol defaults to d · (unit roundoff of the grams accumulated): 9e-5 for float32 input,
    1.7e-13 for float64 at d = 768.
    """
    if acc.n < 1:
        raise BadInputError("no rows were accumulated: nothing to measure (empty input?)")
    n, d = acc.n, acc.d
    notes: list[str] = []
    if acc.n_zero:
        notes.append(f"{acc.n_zero} zero-norm row(s) excluded from the unit-vector statistics (offset, A)")
    if acc.n_nonfinite_skipped:
        notes.append(f"{acc.n_nonfinite_skipped} non-finite row(s) skipped")
    if n == 1:
        notes.append("n = 1: no pairs and no spread; A, the spectrum shares and IsoScore are undefined")
    elif n <= d:
        notes.append(
            f"n = {n} ≤ d = {d}: the covariance is singular by construction (rank ≤ n − 1 = {n - 1}); "
            "spectrum-based measures describe this sample, not the population"
        )
    if d == 1:
        notes.append("d = 1: every cosine is ±1; only the sign structure is measured")

    # offset and A over the nonzero rows
    n_unit = acc.n_unit
    offset = anisotropy = null_sd = z = None
    if n_unit >= 1:
        unit_mean = acc.unit_mean
        offset = _clip_to_range(float(unit_mean.norm()), 0.0, 1.0, "‖m̂‖", notes)
        rogue = rogue_dimensions(unit_mean, n_rogue)
    else:
        rogue = RogueDimensions([], [], 0, 0)
        notes.append("all rows have zero norm: no directions to measure")
    sign = sign_null(acc)
    if n_unit >= 2:
        anisotropy = _clip_to_range(anisotropy_from_unit_mean(acc.unit_mean, n_unit), -1.0 / (n_unit - 1), 1.0,
                                    "A", notes)
        null_sd = anisotropy_null_sd(n_unit, d)
        z = (anisotropy - sign.null) / null_sd

    # mean against spread
    mu = acc.mean
    mean_vector_norm = float(mu.norm())
    mean_row_norm = acc.mean_norm
    spec = centred_spectrum(acc)
    lam = spec.eigenvalues.clamp(min=0)
    total_variance = float(lam.sum())
    second_moment_trace = total_variance + mean_vector_norm**2
    p = spectrum_shares(lam)
    has_spread = total_variance > 0
    if not has_spread and n > 1:
        notes.append("all rows are identical: the covariance is zero")

    rel_tol = rank_rel_tol if rank_rel_tol is not None else d * max(acc.gram_eps, torch.finfo(torch.float64).eps)
    sigma2 = total_variance / d
    lower, upper = marchenko_pastur_edges(sigma2, n, d)
    k = min(top_k_eigvecs, d)
    iso = isoscore(lam) if has_spread or d == 1 else None
    return ActivationGeometry(
        n=n,
        d=d,
        n_zero=acc.n_zero,
        n_nonfinite_skipped=acc.n_nonfinite_skipped,
        offset=offset,
        anisotropy=anisotropy,
        isotropic_cosine_sd=isotropic_cosine_sd(d),
        anisotropy_null_sd=null_sd,
        anisotropy_z=z,
        sign=sign,
        mean_vector_norm=mean_vector_norm,
        mean_row_norm=mean_row_norm,
        mean_norm_ratio=mean_vector_norm / mean_row_norm if mean_row_norm > 0 else None,
        mean_share_of_second_moment=mean_vector_norm**2 / second_moment_trace if second_moment_trace > 0 else None,
        outlier_severity=mean_vector_norm / math.sqrt(total_variance) if has_spread else None,
        total_variance=total_variance,
        eigenvalues=lam.tolist(),
        top1_share=float(p[0]) if has_spread else None,
        top10_share=float(p[:10].sum()) if has_spread else None,
        effective_rank=effective_rank(lam),
        participation_ratio=participation_ratio(lam),
        numerical_rank=numerical_rank(lam, rel_tol),
        numerical_rank_rel_tol=rel_tol,
        isoscore=iso,
        mp_sigma2=sigma2,
        mp_lower_edge=lower,
        mp_upper_edge=upper,
        n_spikes=int((lam > upper).sum()) if has_spread else 0,
        noise_effective_rank=noise_effective_rank(n, d),
        rogue=rogue,
        top_eigenvectors=spec.eigenvectors[:, :k].T.tolist(),
        eigenvector_sign_convention=EIGENVECTOR_SIGN_CONVENTION,
        mean=mu.tolist(),
        notes=notes,
    )


# ---------------------------------------------------------------------- second pass: the artifact test
def _mean_and_components(
    geometry_or_acc: ActivationGeometry | GeometryAccumulator, k: int
) -> tuple[Float[Tensor, " d"], Float[Tensor, "d k"]]:
    if isinstance(geometry_or_acc, GeometryAccumulator):
        spec = centred_spectrum(geometry_or_acc)
        mean, vecs = geometry_or_acc.mean, spec.eigenvectors
    else:
        mean, vecs = geometry_or_acc.mean_tensor, geometry_or_acc.top_eigenvector_tensor
    if k > vecs.shape[1]:
        raise BadInputError(f"asked for {k} components but only {vecs.shape[1]} are available (raise top_k_eigvecs)")
    return mean, vecs[:, :k]


def project_top_components(
    batches: Iterable[Any] | Tensor | np.ndarray,
    geometry_or_acc: ActivationGeometry | GeometryAccumulator,
    k: int = 1,
) -> Float[Tensor, "n k"]:
    """Second streaming pass: P = (x − μ) V_k for the top-k centred principal directions V_k (float64).

    ``batches`` is an iterable of (m, d) batches, or a single (n, d) tensor/array. Returns the (n, k)
    projections (n·k floats; the rows themselves are not kept).
    """
    mean, vecs = _mean_and_components(geometry_or_acc, k)
    if isinstance(batches, (Tensor, np.ndarray)):
        batches = [batches]
    out = [(as_rows(b, mean.numel()).to(torch.float64) - mean) @ vecs for b in batches]
    if not out:
        raise BadInputError("project_top_components got no batches")
    return torch.cat(out)


def top_projection_correlation(
    batches: Iterable[Any] | Tensor | np.ndarray,
    metadata: Iterable[Any] | Tensor | np.ndarray,
    geometry_or_acc: ActivationGeometry | GeometryAccumulator,
    component: int = 0,
) -> float:
    """|corr(P_c, t)| between the projection on principal direction c and a metadata column t.

    The artifact test: is the dominant direction token position, length, frequency…? Streams: ``metadata``
    is either one (n,) array aligned with all rows or an iterable of per-batch (m,) arrays. The correlation
    is read from a 2-D GeometryAccumulator over the pairs (P_c, t), so it is stable for large offsets.
    """
    projections = project_top_components(batches, geometry_or_acc, component + 1)[:, component]
    if isinstance(metadata, (Tensor, np.ndarray)):
        meta = torch.as_tensor(np.asarray(metadata) if isinstance(metadata, np.ndarray) else metadata)
    else:
        meta = torch.cat([torch.as_tensor(np.asarray(m)).reshape(-1) for m in metadata])
    meta = meta.reshape(-1).to(torch.float64)
    if meta.numel() != projections.numel():
        raise BadInputError(
            f"metadata has {meta.numel()} values but there are {projections.numel()} rows; give one value per row"
        )
    pairs = GeometryAccumulator(2, gram_dtype=torch.float64)
    pairs.add(torch.stack([projections, meta], dim=1))
    cov = pairs.covariance()
    denom = float(cov[0, 0] * cov[1, 1])
    if denom <= 0:
        raise BadInputError("correlation undefined: the projection or the metadata column is constant")
    return abs(float(cov[0, 1])) / math.sqrt(denom)
