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
``symmetric_eigh(matrix, top_vectors=None) -> (λ, V)``  every eigenvalue, ascending, and all / none / the top-k
    eigenvectors (the top k through the tridiagonal form: the cost of the eigenvalues alone).
``centred_spectrum(acc, top_vectors=None) -> Spectrum``  eigh of Σ (every λ, the top vectors), descending.
``sign_null(acc) -> SignNull``                          the sign-aware null, regime, q, r and canonical forms.
``unit_moment_u_statistics(Σx̂, Σx̂x̂ᵀ, n) -> (‖m‖², tr C², mᵀCm, ‖m‖⁴)``   unbiased, over distinct rows.
``null_test(acc, A, A_null) -> NullTest``              sd of Â − A_null (non-degenerate U-statistic + the null's
    influence), the finite-d bias of the pooled null, null_z = (A − A_null − bias)/sd; it is
    ``null_test_from_sums(null_test_sums(acc), A, A_null)``, and ``null_test_sums_from_rows(rows)`` gives the same
    sums from a row sample (n × n unit gram; ``entry_marginal_from_bins`` the two-point law of the entry bins).
``signed_null_test(Σŷ, Σŷŷᵀ, n) -> SignedNullTest``  the cone of rows whose law is sign-symmetric (ŷ and −ŷ alike: codes
    of both signs, AbsTopK) has E Â = 0 and Var Â = 2 tr C²/(n(n − 1)); z = Â/sd (docs/statistics.md §9).
Summary:
``activation_geometry(acc, *, top_k_eigvecs=10, n_rogue=10, rank_rel_tol=None) -> ActivationGeometry``  every number of
    docs/design.md "The math" (except the amplification law); ``.to_dict()`` is JSON-safe (no NaN/inf: undefined → None),
    keys as the dataclass fields (A_sd, null_sd, null_bias, null_z; unit_effective_rank, unit_top1_share;
    mp_sigma2_bulk (bulk) / mp_sigma2_trace, mp_bulk, n_spikes (None: no flat bulk); row_norm_histogram, coordinate_rms),
    ``ActivationGeometry.from_dict(d)`` inverts it
    (its terminal text: ``saegeo.render.text.geometry_summary``).
Second streaming pass (the artifact test):
``project_top_components(batches, geometry_or_acc, k=1) -> Tensor (n, k)``  (x − μ)·v_j for the top-k v_j.
``top_projection_correlation(batches, metadata, geometry_or_acc, component=0) -> float``  |corr(projection, metadata)|.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch
from jaxtyping import Float
from torch import Tensor

from saegeo.errors import BadInputError
from saegeo.geometry.accumulate import (
    GeometryAccumulator,
    anisotropy_from_unit_mean,
    as_rows,
    entry_bin_sums,
    entry_marginal_from_bins,
)
from saegeo.geometry.nulls import (
    MPBulk,
    SignNull,
    anisotropy_null_sd,
    anisotropy_u_statistic_variance,
    calibrated_mp_bulk,
    iid_unit_mean_sq_norm_influence,
    isotropic_cosine_sd,
    marchenko_pastur_edges,
    noise_effective_rank,
    sign_null_from_moments,
)
from saegeo.io import json_safe
from saegeo.runtime import single_threaded

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
    """Centred spectrum: every eigenvalue of Σ descending (float64) and the top eigenvectors as columns (all d of
    them unless fewer were asked for), signs fixed."""

    eigenvalues: Float[Tensor, " d"]
    eigenvectors: Float[Tensor, "d k"]


# The top-k route pays off when k is a small part of d (the report keeps 10); below MIN_TRIDIAGONAL_D the whole
# eigh costs under a millisecond and has no edge cases.
MIN_TRIDIAGONAL_D = 32


def symmetric_eigh(matrix: Float[Tensor, "d d"], top_vectors: int | None = None) -> tuple[Tensor, Tensor | None]:
    """Eigenvalues of a symmetric float64 matrix, ascending, and eigenvectors as columns in the same order: all of
    them (``top_vectors`` None, ``torch.linalg.eigh``), none (0, ``eigvalsh``), or those of the k largest
    eigenvalues (``top_vectors`` = k: on the CPU :func:`_top_eigh`, a GPU's solvers have no such route).
    Single-threaded on the CPU (``single_threaded``: LAPACK's reduction is a chain of small BLAS-2 steps).
    """
    d = matrix.shape[0]
    on_cpu = matrix.device.type == "cpu"
    with single_threaded() if on_cpu else contextlib.nullcontext():
        if top_vectors == 0:
            return torch.linalg.eigvalsh(matrix), None
        if on_cpu and top_vectors is not None and d >= MIN_TRIDIAGONAL_D and 4 * top_vectors <= d:
            found = _top_eigh(matrix.numpy(), top_vectors)
            if found is not None:
                return torch.from_numpy(found[0]), torch.from_numpy(found[1])
        lam, vec = torch.linalg.eigh(matrix)
        return lam, vec if top_vectors is None else vec[:, d - top_vectors :]


def _top_eigh(matrix: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray] | None:
    """(every eigenvalue ascending, the eigenvectors of the k largest as columns, ascending) of a symmetric float64
    matrix A through its tridiagonal form, or None where LAPACK reports a failure (the caller takes the full eigh).
    Called inside ``symmetric_eigh``'s single-threaded block.

    A = Q T Qᵀ (dsytrd: Householder reflectors, Q = H₀H₁…H_{d−2}); the eigenvalues of T are those of A (dsterf,
    the same QL/QR as eigvalsh); T z = λz for the k largest λ (dstemr, multiple relatively robust
    representations: orthogonal vectors even in clusters); x = Q z. The reduction costs what eigvalsh costs
    (4/3·d³); the whole eigh also builds all d vectors, about three times the time at d ≥ 2,304
    (benchmarks/README.md#numbers-behind-code-comments).
    """
    from scipy.linalg import lapack

    d = matrix.shape[0]
    lwork = int(lapack.dsytrd_lwork(d, lower=1)[0])
    reflectors, diagonal, off_diagonal, tau, info = lapack.dsytrd(matrix, lower=1, lwork=lwork)
    if info != 0:
        return None
    eigenvalues, info = lapack.dsterf(diagonal, off_diagonal)
    if info != 0:
        return None
    padded = np.zeros(d)  # dstemr takes e with d entries (the last one is workspace)
    padded[:-1] = off_diagonal
    found, _, vectors, info = lapack.dstemr(diagonal, padded, 3, 0.0, 0.0, d - k + 1, d, compute_v=1)
    if info != 0 or found != k:
        return None
    vectors = np.ascontiguousarray(vectors[:, :k])
    for i in range(d - 2, -1, -1):  # x = H₀(H₁(…H_{d−2} z)), H_i = I − τ_i v vᵀ, v = (0…0, 1, A[i+2:, i])
        reflector = np.empty(d - i - 1)
        reflector[0] = 1.0
        reflector[1:] = reflectors[i + 2 :, i]
        vectors[i + 1 :] -= np.outer(reflector, tau[i] * (reflector @ vectors[i + 1 :]))
    return eigenvalues, vectors


def centred_spectrum(acc: GeometryAccumulator, top_vectors: int | None = None) -> Spectrum:
    """Every eigenvalue of the covariance Σ, descending, and its eigenvectors (all, or the ``top_vectors``
    largest), signs by EIGENVECTOR_SIGN_CONVENTION."""
    lam, vec = symmetric_eigh(acc.covariance(), top_vectors)
    if vec is None:  # top_vectors = 0
        vec = lam.new_zeros(acc.d, 0)
    return Spectrum(eigenvalues=lam.flip(0), eigenvectors=fix_eigenvector_signs(vec.flip(1)))


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


@dataclass
class NullTest:
    """Â against the sign-aware null with a valid sd (see :func:`null_test`)."""

    A_sd: float  # sd of Â itself, √Var(Â) (exact U-statistic form)
    null_sd: float  # sd of Â − Â_null (the null is estimated from the same rows)
    null_bias: float  # finite-d bias b·A_null of Â for coordinates iid from the pooled marginal
    null_bias_relative: float  # b
    null_z: float | None  # (Â − A_null − bias)/null_sd; None when undefined or withheld (null_z_withheld)
    zeta1: float  # Var(x̂·m)
    zeta2: float  # Var(x̂·ŷ)
    # relative standard error of null_sd itself, ½√((κ_L − 1)/k) from the kurtosis κ_L of the per-row influence L
    # over the k rows it is measured on (0 when the null is 0: no influence term)
    null_sd_rel_error: float = 0.0
    null_z_withheld: str | None = None  # why null_z is None although A and the null exist (the sd cannot be trusted)

    def to_dict(self) -> dict:
        return asdict(self)


def unit_moment_u_statistics(
    unit_sum: Float[Tensor, " d"], unit_outer: Float[Tensor, "d d"], n: int
) -> tuple[float, float, float, float]:
    """Unbiased (‖m‖², tr C², mᵀCm, ‖m‖⁴) from S = Σx̂_i and G = Σx̂_ix̂_iᵀ over n unit rows (m = E x̂, C = E x̂x̂ᵀ).

    Sums over distinct indices (n_k = n(n−1)…(n−k+1)), using x̂_i·x̂_i = 1:
        P  = Σ_{i≠j} x̂_i·x̂_j = ‖S‖² − n,                    T2 = Σ_{i≠j}(x̂_i·x̂_j)² = tr G² − n,
        T3 = Σ_{i,j,k distinct}(x̂_i·x̂_j)(x̂_i·x̂_k) = SᵀGS − 2‖S‖² − tr G² + 2n,
        T4 = Σ_{i,j,k,l distinct}(x̂_i·x̂_j)(x̂_k·x̂_l) = P² − 2·T2 − 4·T3,
    ‖m‖² = P/n₂, tr C² = T2/n₂, mᵀCm = T3/n₃, ‖m‖⁴ = T4/n₄. The plug-in m̂ᵀĈm̂ would be high by ~tr(C·Cov x̂)/n,
    which near the null is as large as Var(x̂·m) itself. n < 4: plug-in values.
    """
    s = torch.as_tensor(unit_sum, dtype=torch.float64)
    g = torch.as_tensor(unit_outer, dtype=torch.float64)
    return unit_moment_u_statistics_from_forms(float(s @ s), float((g * g).sum()), float(s @ g @ s), n)


def unit_moment_u_statistics_from_forms(
    s_sq: float, tr_g2: float, sgs: float, n: int
) -> tuple[float, float, float, float]:
    """:func:`unit_moment_u_statistics` from the three forms ‖S‖², tr G² and SᵀGS it needs."""
    if n < 4:
        m_sq = s_sq / n**2
        return m_sq, tr_g2 / n**2, sgs / n**3, m_sq**2
    p_pairs = s_sq - n
    t2 = tr_g2 - n
    t3 = sgs - 2 * s_sq - tr_g2 + 2 * n
    t4 = p_pairs**2 - 2 * t2 - 4 * t3
    n2, n3, n4 = n * (n - 1), n * (n - 1) * (n - 2), n * (n - 1) * (n - 2) * (n - 3)
    return p_pairs / n2, t2 / n2, t3 / n3, t4 / n4


@dataclass
class NullTestSums:
    """The sums over the n nonzero rows that :func:`null_test_from_sums` reads (x̂ = x/‖x‖, p_k = Σ_j x_j^k)."""

    n: int  # nonzero rows
    d: int
    unit_sum: Float[Tensor, " d"]  # S = Σ x̂
    unit_outer_sq_trace: float  # tr G², G = Σ x̂x̂ᵀ
    unit_sum_outer_form: float  # SᵀGS
    power_sum: Float[Tensor, " 2"]  # Σ_i (p₁, p₂)
    power_outer: Float[Tensor, "2 2"]  # Σ_i p pᵀ
    unit_by_power: Float[Tensor, "d 2"]  # Σ_i x̂_i p_k(i)
    entry_weights: np.ndarray  # the marginal law of the nonzero rows' entries: weights …
    entry_values: np.ndarray  # … and values (two points per histogram bin: GeometryAccumulator.entry_marginal)
    # zero rows beside the n nonzero ones: their d zeros belong to the law Q(F) is taken under (Q conditions on x ≠ 0
    # itself, through D = 1 − P(x = 0)^d; without them Q is that of a law with too few zeros: z −20 at q·d = 3)
    n_zero_rows: int = 0
    # the nonzero rows the per-row influence L of T is measured on: every row, or a simple random sample of them
    # (the accumulator's seeded row sample beyond SD_SAMPLE_ROWS); None: no rows (the null is 0, L = 2h)
    influence_rows: Float[Tensor, "k d"] | None = None


def null_test_sums(acc: GeometryAccumulator) -> NullTestSums:
    """The null test's sums from a streaming accumulator (the zero rows' entries taken out of the marginal)."""
    n = acc.n_unit
    total = acc.unit_mean * n
    # tr G², SᵀGS: exact up to SD_SAMPLE_ROWS nonzero rows, beyond from the accumulator's seeded row sample
    _, tr_g2, sgs = acc.unit_pair_sums()
    power_sum, power_outer, unit_by_power = acc.row_power_sums()
    weights, values = (t.numpy().copy() for t in acc.entry_marginal())
    if acc.n_zero:  # the zero rows' entries are not part of the marginal A is measured on
        weights[values == 0] -= acc.n_zero * acc.d
    return NullTestSums(
        n=n,
        d=acc.d,
        unit_sum=total,
        unit_outer_sq_trace=tr_g2,
        unit_sum_outer_form=sgs,
        power_sum=power_sum,
        power_outer=power_outer,
        unit_by_power=unit_by_power,
        entry_weights=weights,
        entry_values=values,
        n_zero_rows=acc.n_zero,
        influence_rows=acc.sample.rows,
    )


def null_test_sums_from_rows(rows: Float[Tensor, "n d"]) -> NullTestSums:
    """The same sums straight from a (small) row sample, zero rows dropped: tr G² = ‖UUᵀ‖²_F and SᵀGS = ‖US‖²
    through the n × n gram of the unit rows U (O(n²d), not O(nd²)); the entry marginal from the same 1/16-octave
    bins and two-point law as the accumulator's (:func:`entry_bin_sums`, :func:`entry_marginal_from_bins`).
    Equal to :func:`null_test_sums` of an accumulator over the same rows up to rounding."""
    x = as_rows(rows)
    if x.dtype not in (torch.float32, torch.float64):
        x = x.to(torch.float32)
    x64 = x.to(torch.float64)
    norms = torch.linalg.vector_norm(x64, dim=1)
    keep = norms > 0
    x, x64, norms = x[keep], x64[keep], norms[keep]
    unit = x64 / norms[:, None]
    total = unit.sum(0)
    powers = torch.stack([x64.sum(1), norms.square()], dim=1)
    weights, values = entry_marginal_from_bins(*entry_bin_sums(x.reshape(-1), x64.reshape(-1)))
    return NullTestSums(
        n=int(x.shape[0]),
        d=int(x.shape[1]),
        unit_sum=total,
        unit_outer_sq_trace=float((unit @ unit.T).square().sum()),
        unit_sum_outer_form=float((unit @ total).square().sum()),
        power_sum=powers.sum(0),
        power_outer=powers.T @ powers,
        unit_by_power=unit.T @ powers,
        entry_weights=weights.numpy(),
        entry_values=values.numpy(),
        n_zero_rows=int((~keep).sum()),
        influence_rows=x,
    )


def null_test(acc: GeometryAccumulator, anisotropy: float, null: float) -> NullTest:
    """:func:`null_test_from_sums` of the accumulator's sums (:func:`null_test_sums`)."""
    return null_test_from_sums(null_test_sums(acc), anisotropy, null)


# Past this relative standard error of null_sd (½√((κ_L − 1)/k), κ_L the kurtosis of the per-row influence over the
# k rows it is measured on) the sd is not trusted and no z is printed: 15 % of the sd moves a z of 3 by 0.45. (What
# light and heavy tails give: benchmarks/README.md#numbers-behind-code-comments.)
NULL_SD_MAX_REL_ERROR = 0.15
# IF is evaluated exactly on a grid of this many points per octave of |x| and linearly in log|x| between them:
# error ≲ (ln 2/64)²/8 ≈ 1.5e-5 of IF's curvature in log|x| (tests: ≤ 1e-4 of r's spread)
INFLUENCE_GRID_PER_OCTAVE = 64
_INFLUENCE_BLOCK_ROWS = 512


def row_influence_means(
    influence_at: Callable[[np.ndarray], np.ndarray], rows: Float[Tensor, "k d"]
) -> Float[np.ndarray, " k"]:
    """r_i = (1/d)·Σ_j IF(x_ij) for each row: the pooled null's influence function (IF of Q, any point:
    ``PooledNullInfluence.influence_at``) averaged over the row's entries.

    IF is computed exactly at 0 and on a grid of INFLUENCE_GRID_PER_OCTAVE points per octave of |x| (each sign)
    spanning the rows' entries, and read off linearly in log₂|x| in between."""
    rows = rows.detach().cpu()
    k, d = rows.shape
    out = np.zeros(k)
    # float64 copies one block of rows at a time, never of the whole k × d sample (the read-out's peak)
    blocks = [(start, rows[start : start + _INFLUENCE_BLOCK_ROWS]) for start in range(0, k, _INFLUENCE_BLOCK_ROWS)]
    smallest, largest, negative = math.inf, 0.0, False
    for _, part in blocks:
        mag = part.abs()
        if (mag > 0).any():
            smallest = min(smallest, float(mag[mag > 0].min()))
            largest = max(largest, float(mag.max()))
        negative = negative or bool((part < 0).any())
    if largest == 0.0:
        return out + float(influence_at(np.zeros(1))[0])
    per = INFLUENCE_GRID_PER_OCTAVE
    lo = math.floor(math.log2(smallest) * per)
    hi = max(math.ceil(math.log2(largest) * per), lo + 1)
    grid = np.exp2(np.arange(lo, hi + 1) / per)
    size = grid.size
    # one table [positive grid | negative grid | 0]: entry e reads base[i] + slope[i]·f, f ∈ [0, 1) within its cell
    values = np.concatenate(
        [influence_at(grid), influence_at(-grid) if negative else np.zeros(size), influence_at(np.zeros(1))]
    )
    base = values.copy()
    slope = np.zeros_like(values)
    slope[: size - 1], slope[size : 2 * size - 1] = np.diff(values[:size]), np.diff(values[size : 2 * size])
    for start, part in blocks:
        block = part.to(torch.float64).numpy()
        mag = np.abs(block)
        zero = mag == 0
        mag[zero] = 1.0  # any finite log; these entries read the 0 slot below
        u = np.log2(mag)
        u *= per
        u -= lo
        cell = np.minimum(u.astype(np.int64), size - 2)
        u -= cell
        cell += size * (block < 0)
        cell[zero] = 2 * size
        u[zero] = 0.0
        out[start : start + block.shape[0]] = (base[cell] + slope[cell] * u).sum(axis=1) / d
    return out


def null_test_from_sums(sums: NullTestSums, anisotropy: float, null: float) -> NullTest:
    """z of Â against the sign-aware null A_null = m̄²/s̄ and its finite-d bias, valid when A_null ≠ 0.

    Statistic: T = Â − Q(F̂), Q = N·(1 + β) = E‖E x̂‖² for coordinates iid from the pooled marginal F (N = m₁²/m₂,
    β the relative finite-d bias, m_k the pooled k-th moment of the entries), F̂ the entries of the n nonzero
    rows read off the entry histogram (two points per bin: :meth:`GeometryAccumulator.entry_marginal`).

    sd: the influence function of T, β̂'s fluctuation included (docs/statistics.md §3). Per row,
        L_i = 2·x̂_i·m − r_i,   r_i = (1/d)·Σ_j IF(x_ij),
    IF the influence of one entry on Q (:func:`~saegeo.geometry.nulls.iid_unit_mean_sq_norm_influence`, bounded in x:
    Q is scale-free), so that T ≈ (1/n)Σ_i (L_i − E L) and
        Var(T) ≈ Var(L)/n + 2E[(v·v' − uu')²]/(n(n − 1)),
    Var(L) = 4ζ₁ − 4Cov(h, r) + Var(r) measured over ``sums.influence_rows`` (every nonzero row, or a simple random
    sample of them: design-unbiased) whatever the rows' structure, ζ₁ and Cov(h, r) as U-statistics over distinct rows
    (Cov(h, r) = Σ_{i≠j}(x̂_i·x̂_j)r_i/n₂ − Σ_{i,j,l distinct}(x̂_i·x̂_j)r_l/n₃, the old cov_hq form), Var(r) the sample
    variance. v = x̂ − m (Â's degenerate kernel v·v'),
    u = (q₁ − m₁)/√m₂ − m₁(q₂ − m₂)/m₂^{3/2}, q_k = Σ_j x_j^k/d (N's quadratic Taylor term is uu'),
    E[(v·v' − uu')²] = ζ₂ − 2ζ₁ − 2‖E[x̂u]‖² + (E u²)². ζ₁ = Var(x̂·m) = mᵀCm − ‖m‖⁴ and ζ₂ = Var(x̂·ŷ) = tr C² − ‖m‖⁴
    are estimated without bias by U-statistics; under the null the plug-in m̂ᵀĈm̂ would add ~tr(C·Cov x̂)/n, as large
    as the variance itself. Null 0 (sign-symmetric): Var(L) = 4ζ₁; under isotropy everything reduces to
    √(2/(n(n−1)d)). ``A_sd`` is the sd of Â alone, exact (Hoeffding): Var(Â) = [4(n−2)ζ₁ + 2ζ₂]/(n(n−1)).

    IF is one function evaluated per entry, not split into parts: parts that each grow like x² and cancel to a
    bounded L leave a sampled difference that collapses on heavy tails. ``null_sd_rel_error``
    = ½√((κ_L − 1)/k) is the sd's own relative error; past NULL_SD_MAX_REL_ERROR no z is given
    (``null_z_withheld`` says why). Calibration: experiments/null_z_calibration.py, docs/statistics.md §3.
    """
    n, d = sums.n, sums.d
    total = sums.unit_sum  # S = Σ x̂
    m = total / n

    # the pooled moments and their per-row contributions q_k
    power_sum, power_outer, unit_by_power = sums.power_sum, sums.power_outer, sums.unit_by_power
    q_sum = power_sum / d
    mk = q_sum / n  # m₁, m₂
    cov_q = (power_outer / d**2 - n * torch.outer(mk, mk)) / max(n - 1, 1)
    m1, m2 = (float(v) for v in mk)

    tr_g2, sgs = sums.unit_outer_sq_trace, sums.unit_sum_outer_form
    m_sq, tr_c2, mcm, m_4 = unit_moment_u_statistics_from_forms(float(total @ total), tr_g2, sgs, n)
    zeta1 = max(mcm - m_4, 0.0)  # Var(x̂·m)
    zeta2 = max(tr_c2 - m_4, 0.0)  # Var(x̂·ŷ)

    # the pooled marginal of the nonzero rows' entries, two points per histogram bin (each bin's Σx and Σx²)
    weights, values = sums.entry_weights, sums.entry_values
    rel_bias, var_linear, sd_rel_error = 0.0, 4 * zeta1, 0.0
    if null > 0:
        # Q(F) and its influence under the law of all rows' entries, the zero rows' zeros included (Q is E‖m‖² given
        # x ≠ 0 for rows iid from F); N = m₁²/m₂ of the nonzero rows' entries, the null A is read against
        q_weights, q_values = weights, values
        if sums.n_zero_rows:
            q_weights, q_values = np.append(weights, sums.n_zero_rows * d), np.append(values, 0.0)
        pooled = iid_unit_mean_sq_norm_influence(q_weights, q_values, d)
        w = weights / weights.sum()
        law_m1, law_m2 = float(w @ values), float(w @ values**2)
        rel_bias = pooled.expected / (law_m1**2 / law_m2) - 1.0
        if sums.influence_rows is not None and sums.influence_rows.shape[0] >= 2 and n >= 3:
            # Var(L) = 4ζ₁ − 4Cov(h, r) + Var(r) over the same k rows (their sampling errors cancel as the terms
            # do): ζ₁ and Cov(h, r) as U-statistics over distinct rows (plug-ins of m̂ = S/n are biased by O(1/n),
            # which at n = 250 is twice Var(L) itself), Var(r) the sample variance; Σ over all rows ≈ (n/k)Σ_sample
            rows = sums.influence_rows
            h_sum = np.concatenate(  # x̂_i·S, by blocks of rows (float64 copies of one block at a time)
                [
                    (unit / torch.linalg.vector_norm(unit, dim=1, keepdim=True) @ total).numpy()
                    for unit in (part.to(torch.float64) for part in rows.split(_INFLUENCE_BLOCK_ROWS))
                ]
            )
            r = row_influence_means(pooled.influence_at, rows)
            k = r.size
            scale = n / k
            r_sum, rh_sum = scale * float(r.sum()), scale * float(r @ (h_sum - 1))  # Σr_i, Σ_{i≠j}(x̂_i·x̂_j)r_i
            p_pairs = float(total @ total) - n  # Σ_{i≠j} x̂_i·x̂_j
            cov_hr = rh_sum / (n * (n - 1)) - (p_pairs * r_sum - 2 * rh_sum) / (n * (n - 1) * (n - 2))
            var_r = float(np.var(r, ddof=1))
            # over all n + z rows (z all-zero rows: no part in Â, r = IF(0) in Q): ℓ = (2/P)(h − A)[x ≠ 0] − r and
            # Var(T) = Var(ℓ)/(n + z) = (4ζ₁ − 4P·Cov(h, r) + P·Var_all(r))/n, P = n/(n + z), Var_all(r) =
            # P·Var(r) + P(1 − P)(r̄ − IF(0))²: without the zero rows, sd(z) was 1.36 for sparse Exp at q·d = 3.2
            p_nonzero = n / (n + sums.n_zero_rows)
            if sums.n_zero_rows:
                between = (float(r.mean()) - float(pooled.influence_at(np.zeros(1))[0])) ** 2
                var_r = p_nonzero * var_r + p_nonzero * (1 - p_nonzero) * between
            var_linear = 4 * zeta1 - p_nonzero * (4 * cov_hr - var_r)
            ell = 2 * (h_sum / n - float(total @ total) / n**2) - (r - r.mean())
            second = float(np.mean(ell**2))
            if var_linear > 0 and second > 0:
                kurtosis = float(np.mean(ell**4)) / second**2
                sd_rel_error = 0.5 * math.sqrt(max(kurtosis - 1.0, 0.0) / k)
    bias = rel_bias * null

    if m2 > 0:
        e_xu = (unit_by_power[:, 0] / (d * n) - m * m1) / math.sqrt(m2) - (m1 / m2**1.5) * (
            unit_by_power[:, 1] / (d * n) - m * m2
        )
        e_uu = float(cov_q[0, 0] / m2 - 2 * (m1 / m2**2) * cov_q[0, 1] + (m1**2 / m2**3) * cov_q[1, 1])
        degenerate = zeta2 - 2 * zeta1 - 2 * float(e_xu @ e_xu) + e_uu**2
    else:
        degenerate = zeta2 - 2 * zeta1
    n2 = n * (n - 1)
    var_t = max(var_linear, 0.0) / n + 2 * max(degenerate, 0.0) / n2
    sd_t = math.sqrt(var_t)
    withheld = None
    if sd_rel_error > NULL_SD_MAX_REL_ERROR:
        withheld = (
            f"too heavy-tailed for a calibrated sd: the per-row influence has kurtosis {kurtosis:.3g} over "
            f"{k:,} rows, so the sd itself is uncertain by ±{100 * sd_rel_error:.0f} % (> "
            f"{100 * NULL_SD_MAX_REL_ERROR:.0f} %)"
        )
    return NullTest(
        A_sd=math.sqrt(anisotropy_u_statistic_variance(zeta1, zeta2, n)),
        null_sd=sd_t,
        null_bias=bias,
        null_bias_relative=rel_bias,
        null_z=(anisotropy - null - bias) / sd_t if sd_t > 0 and withheld is None else None,
        zeta1=zeta1,
        zeta2=zeta2,
        null_sd_rel_error=sd_rel_error,
        null_z_withheld=withheld,
    )


@dataclass
class SignedNullTest:
    """Â of rows against the signed null (their law unchanged by y → −y), docs/statistics.md §9."""

    anisotropy: float  # Â, the mean pairwise cosine of the n nonzero rows
    sd: float  # √(2 tr Ĉ²/(n(n − 1))): the exact sd of Â under the null, tr Ĉ² unbiased
    z: float | None  # Â/sd; None when n < 4 or tr Ĉ² ≤ 0
    tr_c2: float  # tr C² = E(ŷ·ŷ')², unbiased over distinct rows
    n: int
    # P(Â ≥ the measured one) under the null from the χ²-mixture law of nÂ (z is right-skewed: docs/statistics.md §9)
    p_value: float | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def signed_null_test(unit_sum: Float[Tensor, " d"], unit_scatter: Float[Tensor, "d d"], n: int) -> SignedNullTest:
    """Â against the signed null: rows ŷ whose law is symmetric, ŷ ≐ −ŷ (what codes of both signs with no preferred
    sign make: Σ ±a_i u_i), so that m = E ŷ = 0 whatever the dictionary, the magnitudes or the co-firing.

    Â = (‖S‖² − n)/(n(n − 1)) is then a degenerate U-statistic (ζ₁ = mᵀCm − ‖m‖⁴ = 0) and exactly
        E Â = 0,   Var Â = 2 tr C²/(n(n − 1)),   C = E ŷŷᵀ,
    with tr C² estimated without bias over distinct rows, (tr G² − n)/(n(n − 1)), G = Σ ŷŷᵀ (``unit_scatter``).
    z = Â/sd. For codes iid across latents, exchangeable, on orthonormal rows tr C² = 1/N exactly (the isotropic sd
    with d → N); in general ≈ ‖Σ_y‖²_F/(tr Σ_y)², Σ_y = E yyᵀ. A skew of the signs makes m ≠ 0 and E Â ≈ A_het
    (the per-latent law): the alternative this z detects.
    """
    total = torch.as_tensor(unit_sum, dtype=torch.float64)
    scatter = torch.as_tensor(unit_scatter, dtype=torch.float64)
    if n < 2:
        return SignedNullTest(float("nan"), float("nan"), None, float("nan"), int(n))
    anisotropy = (float(total @ total) - n) / (n * (n - 1))
    tr_c2 = (float(scatter.square().sum()) - n) / (n * (n - 1))
    sd = math.sqrt(max(2.0 * tr_c2 / (n * (n - 1)), 0.0))
    z = anisotropy / sd if n >= 4 and sd > 0 else None
    return SignedNullTest(
        anisotropy, sd, z, tr_c2, int(n), _mixture_upper_tail(float(total @ total) / n, scatter / n, tr_c2)
    )


def _mixture_upper_tail(t: float, c: Tensor, tr_c2: float) -> float | None:
    """P(Σ_k λ_k χ²_{1,k} ≥ t), λ_k the eigenvalues of C (Σλ = tr C = 1 for unit rows), by Pearson's three-moment fit
    a·χ²_ν + b: a = Σλ³/Σλ², ν = (Σλ²)³/(Σλ³)², b = 1 − aν. Under the signed null ‖S‖²/n = 1 + (n − 1)Â has this
    law as n grows; Σλ² is the unbiased tr Ĉ², Σλ³ the plug-in tr Ĉ³ (O(d³), once per SAE)."""
    from scipy.special import gammaincc

    tr_c3 = float((c @ c * c).sum())
    if tr_c2 <= 0 or tr_c3 <= 0:
        return None
    a, nu = tr_c3 / tr_c2, tr_c2**3 / tr_c3**2
    return float(gammaincc(nu / 2, max(t - (1.0 - a * nu), 0.0) / (2 * a)))


# ---------------------------------------------------------------------- the summary
class FieldDict(dict):
    """A result's dict (``to_dict()``) that refuses to read a key outside its schema (the dataclass fields):
    a reader asking for a name no result carries -- a renamed or misspelt quantity -- fails instead of reading None.
    ``get`` of a field that is absent still returns the default (an old or partial result)."""

    def __init__(self, data: Mapping[str, Any], fields: Iterable[str], name: str):
        super().__init__(data)
        self.fields, self.name = frozenset(fields), name

    def _check(self, key: Any) -> None:
        if key not in self.fields:
            raise KeyError(f"{self.name} has no field {key!r} (its fields: {', '.join(sorted(self.fields))})")

    def __getitem__(self, key: Any) -> Any:
        self._check(key)
        return super().__getitem__(key)

    def get(self, key: Any, default: Any = None) -> Any:
        self._check(key)
        return super().get(key, default)

    def __getattr__(self, key: str) -> Any:
        """A field read as an attribute, as on the dataclass itself: ``report.activations.anisotropy`` and
        ``report.activations.sign.null`` read what ``activation_geometry(acc).anisotropy`` / ``.sign.null`` do."""
        fields = self.__dict__.get("fields")
        if fields is None or key.startswith("_") or key not in fields:
            raise AttributeError(
                f"{self.__dict__.get('name', 'FieldDict')} has no field {key!r}"
                + (f" (its fields: {', '.join(sorted(fields))})" if fields else "")
            )
        return super().get(key)

    def __repr__(self) -> str:
        return f"<{self.name} ({len(self)} fields, as a dict)>"


def checked_geometry(data: Mapping[str, Any], extra: Iterable[str] = ()) -> FieldDict:
    """``ActivationGeometry.to_dict()`` (or its JSON) as a FieldDict over the dataclass fields plus ``extra``;
    ``sign``, ``rogue`` and ``mp_bulk`` are checked against SignNull, RogueDimensions and MPBulk."""
    if isinstance(data, FieldDict) and not extra:
        return data
    out = dict(data)
    for key, cls in (("sign", SignNull), ("rogue", RogueDimensions), ("mp_bulk", MPBulk)):
        if isinstance(out.get(key), Mapping):
            out[key] = FieldDict(out[key], fields_of(cls), f"{cls.__name__}")
    return FieldDict(out, [*fields_of(ActivationGeometry), *extra], "ActivationGeometry")


def fields_of(cls: type) -> list[str]:
    """The field names of a dataclass: the schema of its ``to_dict()``."""
    return [f.name for f in dataclasses.fields(cls)]


@dataclass
class ActivationGeometry:
    """Everything docs/design.md "The math" asks of one set of rows. Undefined values are None, never NaN."""

    n: int
    d: int
    n_zero: int
    n_nonfinite_skipped: int
    # offset and cone
    offset: float | None  # ‖m̂‖
    anisotropy: float | None  # A, mean pairwise cosine (i ≠ j, nonzero rows)
    isotropic_cosine_sd: float  # 1/√d
    isotropic_sd: float | None  # √(2/(n(n−1)d)): the sd of Â under isotropy (not the sd null_z divides by)
    isotropic_z: float | None  # (A − A_null)/isotropic_sd: the isotropic z against the sign-aware null
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
    # Marchenko–Pastur null for isotropic noise of the same (n, d), σ² fitted to the bulk (calibrated_mp_bulk)
    mp_sigma2_bulk: float  # σ² of the bulk (mp_sigma2_trace = tr Σ/d is the naive one)
    mp_lower_edge: float  # σ²(1 − √γ)²
    mp_upper_edge: float  # σ²(1 + √γ)² (a spike must also clear the Tracy–Widom margin in mp_bulk)
    n_spikes: int | None  # eigenvalues above edge + TW margin; None: no flat bulk, or a bulk not shaped like MP
    noise_effective_rank: float
    rogue: RogueDimensions
    top_eigenvectors: list[list[float]]  # k rows of length d
    eigenvector_sign_convention: str
    mean: list[float]
    notes: list[str] = field(default_factory=list)
    # ---- the test against the sign-aware null with a valid sd (None when undefined, e.g. n < 2): the null z
    A_sd: float | None = None  # sd of Â alone, exact U-statistic variance (Hoeffding)
    null_sd: float | None = None  # sd of Â − Â_null: the sd null_z divides by
    null_bias: float | None = None  # finite-d bias of Â for coordinates iid from the pooled marginal
    null_bias_relative: float | None = None  # the same, relative to A_null
    null_z: float | None = None  # (A − A_null − bias)/null_sd
    null_z_withheld: str | None = None  # why there is no null_z although A and the null exist (the sd is not trusted)
    # ---- the unit vectors' second moment C = E x̂x̂ᵀ ("uniformity of normalised directions")
    unit_effective_rank: float | None = None  # erank of C (d for uniform directions)
    unit_top1_share: float | None = None  # λ_max(C)/tr C (1/d for uniform directions)
    # ---- calibrated MP bulk (mp_sigma2_bulk / edges above are the bulk ones; see MPBulk)
    mp_sigma2_trace: float | None = None  # tr Σ/d, the naive scale
    mp_bulk: dict[str, Any] | None = None  # MPBulk.to_dict(): TW margin, threshold, flat bulk?, power-law α
    # ---- rows and coordinates
    row_norm_histogram: dict[str, list[float]] | None = None  # occupied log₂ bins: lower_edges, counts, sq_sums
    median_row_norm: float | None = None  # from the histogram (bin resolution 1/16 relative)
    max_row_norm_bin: float | None = None  # lower edge of the highest occupied bin
    coordinate_rms: list[float] | None = None  # √S_jj = √E[x_j²] per coordinate

    def __repr__(self) -> str:
        def num(x: float | None, spec: str = ".4f") -> str:
            return "—" if x is None else format(x, spec)

        return (
            f"<ActivationGeometry n={self.n:,} d={self.d}: A = {num(self.anisotropy)} (null {num(self.sign.null)}), "
            f"offset {num(self.offset)}, erank {num(self.effective_rank, '.1f')}, top-1 {num(self.top1_share, '.1%')}, "
            f"{'no flat bulk' if self.n_spikes is None else f'{self.n_spikes} MP spike(s)'}>"
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe dict (floats, ints, lists, None, nested dicts); json_safe copies, so no deep copy first."""
        return json_safe({f.name: getattr(self, f.name) for f in dataclasses.fields(self)})

    # Read by key as report.json holds it: g["sign"]["null"] is g.sign.null, so code written for the JSON's dict
    # reads the typed object too; a name that is not a field is a KeyError naming the fields.
    def _field(self, key: str) -> Any:
        if key not in self.__dataclass_fields__:
            raise KeyError(f"ActivationGeometry has no field {key!r} (its fields: {', '.join(sorted(self.keys()))})")
        value = getattr(self, key)
        return value.to_dict() if isinstance(value, (SignNull, RogueDimensions)) else value

    def __getitem__(self, key: str) -> Any:
        return self._field(key)

    def __getattr__(self, key: str) -> Any:  # only for a name that is not an attribute: say what there is
        names = ", ".join(sorted(type(self).__dataclass_fields__))
        raise AttributeError(f"ActivationGeometry has no field {key!r} (its fields: {names})")

    def get(self, key: str, default: Any = None) -> Any:
        """The field (None is returned as stored, as a dict holding the key returns it); a non-field raises."""
        return self._field(key)

    def keys(self) -> list[str]:
        return [f.name for f in dataclasses.fields(self)]

    def __contains__(self, key: object) -> bool:
        return key in self.__dataclass_fields__

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ActivationGeometry:
        """Inverse of :meth:`to_dict` (JSON round trip); unknown keys are ignored."""
        if isinstance(data, ActivationGeometry):
            return data
        kwargs = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        kwargs["sign"] = SignNull(**data["sign"])
        kwargs["rogue"] = RogueDimensions(**data["rogue"])
        return cls(**kwargs)

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
    notes.append(
        f"{name} = {value:.9g} from rounding is outside its range [{lo:.6g}, {hi:.6g}]; reported as {clipped:.6g}"
    )
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
    offset = anisotropy = isotropic_sd = isotropic_z = None
    if n_unit >= 1:
        unit_mean = acc.unit_mean
        offset = _clip_to_range(float(unit_mean.norm()), 0.0, 1.0, "‖m̂‖", notes)
        rogue = rogue_dimensions(unit_mean, n_rogue)
    else:
        rogue = RogueDimensions([], [], 0, 0)
        notes.append("all rows have zero norm: no directions to measure")
    sign = sign_null(acc)
    tested: NullTest | None = None
    unit_erank = unit_top1 = None
    if n_unit >= 2:
        anisotropy = _clip_to_range(
            anisotropy_from_unit_mean(acc.unit_mean, n_unit), -1.0 / (n_unit - 1), 1.0, "A", notes
        )
        isotropic_sd = anisotropy_null_sd(n_unit, d)
        isotropic_z = (anisotropy - sign.null) / isotropic_sd
        tested = null_test(acc, anisotropy, sign.null)
    if n_unit >= 1:
        unit_lam = symmetric_eigh(acc.unit_second_moment(), top_vectors=0)[0].flip(0).clamp(min=0)
        unit_erank = effective_rank(unit_lam)
        unit_top1 = float(spectrum_shares(unit_lam)[0])

    # mean against spread
    mu = acc.mean
    mean_vector_norm = float(mu.norm())
    mean_row_norm = acc.mean_norm
    k = min(top_k_eigvecs, d)
    spec = centred_spectrum(acc, top_vectors=k)
    lam = spec.eigenvalues.clamp(min=0)
    total_variance = float(lam.sum())
    second_moment_trace = total_variance + mean_vector_norm**2
    p = spectrum_shares(lam)
    has_spread = total_variance > 0
    if not has_spread and n > 1:
        notes.append("all rows are identical: the covariance is zero")

    rel_tol = rank_rel_tol if rank_rel_tol is not None else d * max(acc.gram_eps, torch.finfo(torch.float64).eps)
    sigma2_trace = total_variance / d
    bulk = calibrated_mp_bulk(lam.numpy(), n, d, null_rel_tol=rel_tol) if has_spread and n >= 2 else None
    sigma2 = bulk.sigma2_bulk if bulk is not None else sigma2_trace
    lower, upper = marchenko_pastur_edges(sigma2, n, d - (bulk.n_null_eigenvalues if bulk is not None else 0))
    edges, counts, sq_sums = acc.row_norm_histogram()
    cum = counts.cumsum(0)
    median_norm = float(edges[int((cum < 0.5 * float(cum[-1])).sum())]) if counts.numel() else None
    coordinate_rms = torch.diagonal(acc.second_moment()).clamp(min=0).sqrt()
    iso = isoscore(lam) if has_spread or d == 1 else None
    return ActivationGeometry(
        n=n,
        d=d,
        n_zero=acc.n_zero,
        n_nonfinite_skipped=acc.n_nonfinite_skipped,
        offset=offset,
        anisotropy=anisotropy,
        isotropic_cosine_sd=isotropic_cosine_sd(d),
        isotropic_sd=isotropic_sd,
        isotropic_z=isotropic_z,
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
        mp_sigma2_bulk=sigma2,
        mp_lower_edge=lower,
        mp_upper_edge=upper,
        n_spikes=(bulk.n_spikes if bulk is not None else 0),
        noise_effective_rank=noise_effective_rank(n, d),
        rogue=rogue,
        top_eigenvectors=spec.eigenvectors[:, :k].T.tolist(),
        eigenvector_sign_convention=EIGENVECTOR_SIGN_CONVENTION,
        mean=mu.tolist(),
        notes=notes,
        A_sd=tested.A_sd if tested else None,
        null_sd=tested.null_sd if tested else None,
        null_bias=tested.null_bias if tested else None,
        null_bias_relative=tested.null_bias_relative if tested else None,
        null_z=tested.null_z if tested else None,
        null_z_withheld=tested.null_z_withheld if tested else None,
        unit_effective_rank=unit_erank,
        unit_top1_share=unit_top1,
        mp_sigma2_trace=sigma2_trace,
        mp_bulk=bulk.to_dict() if bulk is not None else None,
        row_norm_histogram={"lower_edges": edges.tolist(), "counts": counts.tolist(), "sq_sums": sq_sums.tolist()},
        median_row_norm=median_norm,
        max_row_norm_bin=float(edges[-1]) if counts.numel() else None,
        coordinate_rms=coordinate_rms.tolist(),
    )


# ---------------------------------------------------------------------- second pass: the artifact test
def _mean_and_components(
    geometry_or_acc: ActivationGeometry | GeometryAccumulator, k: int
) -> tuple[Float[Tensor, " d"], Float[Tensor, "d k"]]:
    if isinstance(geometry_or_acc, GeometryAccumulator):
        spec = centred_spectrum(geometry_or_acc, top_vectors=min(k, geometry_or_acc.d))
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
