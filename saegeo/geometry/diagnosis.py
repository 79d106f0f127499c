"""Row-sample diagnostics: what one pass of sums cannot see (population splits, the cone of centred rows).

Pure math on a small uniform sample of rows (the report's reservoir), so the cost is O(k·d) whatever n is.

Public API
----------
``two_means_1d(values) -> Split``     the optimal 2-cluster split of a 1-D sample (exact, by sorting).
``kmeans_between_share(rows, k=2, ...) -> (share, smallest fraction)``   between-cluster share of the centred sum of squares (Lloyd, seeded).
``sample_diagnostics(rows, mean, direction) -> dict``  centred A, the PC1 split and the k-means share of a row sample.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
from jaxtyping import Float
from torch import Tensor

from saegeo.geometry.accumulate import anisotropy_from_unit_mean
from saegeo.runtime import single_threaded


@dataclass
class Split:
    """Best split of a 1-D sample into a low and a high group (minimum within-group sum of squares)."""

    between_share: float  # R² = 1 − W/T: 2/π ≈ 0.64 for a Gaussian, 0.75 for a uniform, → 1 for two spikes
    threshold: float  # midpoint between the two groups' extreme values
    smaller_fraction: float  # fraction of the sample in the smaller group
    separation: float  # |mean_hi − mean_lo| / pooled within-group sd

    def to_dict(self) -> dict:
        return asdict(self)


def two_means_1d(values: Float[Tensor, " k"]) -> Split:
    """Exact 2-means on a line: sort, and for every cut i the within SS is W(i) = SS(v[:i]) + SS(v[i:]) from
    prefix sums; R² = 1 − min W/T, T = Σ(v − v̄)². A constant sample gives R² = 0."""
    v = torch.as_tensor(values, dtype=torch.float64).flatten().sort().values
    k = v.numel()
    if k < 4:
        return Split(0.0, float(v.mean()) if k else 0.0, 0.0, 0.0)
    c1, c2 = v.cumsum(0), (v * v).cumsum(0)
    i = torch.arange(1, k, dtype=torch.float64)  # left group sizes 1..k−1
    left_ss = c2[:-1] - c1[:-1] ** 2 / i
    right_n = k - i
    right_sum, right_sq = c1[-1] - c1[:-1], c2[-1] - c2[:-1]
    right_ss = right_sq - right_sum**2 / right_n
    within = left_ss + right_ss
    total = float(c2[-1] - c1[-1] ** 2 / k)
    if total <= 0:
        return Split(0.0, float(v[0]), 0.0, 0.0)
    best = int(within.argmin())
    n_left = best + 1
    mean_lo, mean_hi = float(c1[best] / n_left), float(right_sum[best] / right_n[best])
    pooled_sd = (max(float(within[best]), 0.0) / max(k - 2, 1)) ** 0.5
    return Split(
        between_share=max(0.0, 1.0 - float(within[best]) / total),
        threshold=float((v[best] + v[best + 1]) / 2),
        smaller_fraction=min(n_left, k - n_left) / k,
        separation=abs(mean_hi - mean_lo) / pooled_sd if pooled_sd > 0 else float("inf"),
    )


def kmeans_between_share(
    rows: Float[Tensor, "k d"], k: int = 2, *, iters: int = 30, restarts: int = 3, seed: int = 0
) -> tuple[float, float]:
    """(B/T, fraction of rows in the smallest cluster). Between-cluster share B/T of the centred sum of squares after Lloyd's k-means (k-means++ starts, best of
    ``restarts``). Gaussian rows: ≈ (2/π)·λ₁/tr Σ for k = 2 (the split along PC1); two far clusters: → 1."""
    with single_threaded():  # many tiny matmuls: multithreaded BLAS spin-waits between them on busy cores
        return _kmeans_between_share(torch.as_tensor(rows, dtype=torch.float64), k, iters, restarts, seed)


def _kmeans_between_share(x: Tensor, k: int, iters: int, restarts: int, seed: int) -> tuple[float, float]:
    x = x - x.mean(0)
    top = float(x.abs().max()) if x.numel() else 0.0
    if top > 0:  # B/T is scale-free: a power of two (exact) brings the rows near 1, so no square leaves float32
        x = x * 2.0 ** -math.frexp(top)[1]
    total = float(x.square().sum())
    if total <= 0 or x.shape[0] <= k:
        return 0.0, 0.0
    g = torch.Generator().manual_seed(seed)
    # Lloyd's iterations only choose labels: float32 distances (half the memory traffic of float64; a label
    # differs only for a row within float32 rounding of equidistant); the within-cluster sum that is reported is
    # taken in float64 from the final labels' own means.
    # float32 unless its squared distances could overflow (|x|² · 4d past float32's range: a damaged store's rows)
    fits = float(x.abs().max()) ** 2 * 4 * x.shape[1] < torch.finfo(torch.float32).max
    x32 = x.to(torch.float32) if fits else x
    sq = x32.square().sum(1)

    best_within, best_fraction = float("inf"), 0.0
    for _ in range(restarts):
        centres = x32[torch.randint(x.shape[0], (1,), generator=g)]
        for _ in range(1, k):  # k-means++: next centre ∝ squared distance to the nearest one
            dist = _sq_dist(x32, sq, centres).min(dim=0).values.to(torch.float64)
            centres = torch.cat([centres, x32[torch.multinomial(dist / dist.sum(), 1, generator=g)]])
        label = (_lloyd_two if k == 2 else _lloyd)(x32, centres, iters)
        within = _within_sum_of_squares(x, label, k)
        if within < best_within:
            best_within = within
            best_fraction = float(torch.bincount(label, minlength=k).min()) / x.shape[0]
    return max(0.0, 1.0 - best_within / total), best_fraction


def _sq_dist(x: Float[Tensor, "m d"], sq: Float[Tensor, " m"], centres: Float[Tensor, "k d"]) -> Tensor:
    """(k, m) ‖x_i − c‖² = ‖x_i‖² − 2c·x_i + ‖c‖² by one matmul (c·xᵀ: 3× faster than x·cᵀ here), clamped at 0."""
    return (sq - 2 * (centres @ x.T) + centres.square().sum(1, keepdim=True)).clamp(min=0)


def _lloyd(x: Float[Tensor, "m d"], centres: Float[Tensor, "k d"], iters: int) -> Tensor:
    """Lloyd's iterations for any k from ``centres``; the final labels (int64): nearest centre (argmin: the first
    on a tie), then each cluster's mean (a cluster left empty keeps its centre), until no label changes."""
    sq, k = x.square().sum(1), centres.shape[0]
    label = _sq_dist(x, sq, centres).argmin(dim=0)
    for _ in range(iters):
        one_hot = torch.nn.functional.one_hot(label, k).to(x.dtype)
        size = one_hot.sum(0)
        centres = torch.where(size[:, None] > 0, (one_hot.T @ x) / size.clamp(min=1)[:, None], centres)
        new_label = _sq_dist(x, sq, centres).argmin(dim=0)
        if torch.equal(new_label, label):
            break
        label = new_label
    return _sq_dist(x, sq, centres).argmin(dim=0)


def _lloyd_two(x: Float[Tensor, "m d"], centres: Float[Tensor, "2 d"], iters: int) -> Tensor:
    """Lloyd's iterations for k = 2 from ``centres``; the final labels (int64, 0 or 1).

    The iterations of :func:`_lloyd` with one matrix-vector product per step in place of a (2, m)
    distance matrix and its argmin: row i goes to c₁ iff ‖x_i − c₁‖² < ‖x_i − c₀‖², i.e.
    x_i·(c₀ − c₁) < (‖c₀‖² − ‖c₁‖²)/2 (a tie stays with c₀, as argmin's first index); the new c₁ is the labelled
    rows' mean and c₀ = (Σ_all x − Σ_{c₁} x)/m₀ (a cluster left empty keeps its centre)."""
    total, m = x.sum(dim=0), x.shape[0]

    def labels(c: Tensor) -> Tensor:
        return x @ (c[0] - c[1]) < (c[0].square().sum() - c[1].square().sum()) / 2

    label = labels(centres)
    for _ in range(iters):
        m1 = int(label.sum())
        s1 = label.to(x.dtype) @ x
        centres = torch.stack([(total - s1) / (m - m1) if m1 < m else centres[0], s1 / m1 if m1 > 0 else centres[1]])
        new_label = labels(centres)
        if torch.equal(new_label, label):
            break
        label = new_label
    return labels(centres).long()


def _within_sum_of_squares(x: Tensor, label: Tensor, k: int) -> float:
    """W = Σ_c Σ_{i in c} ‖x_i − x̄_c‖² (float64), x̄_c the mean of the rows labelled c."""
    one_hot = torch.nn.functional.one_hot(label, k).to(x.dtype)
    size = one_hot.sum(0)
    sums = one_hot.T @ x
    # Σ‖x_i − x̄_c‖² = Σ‖x_i‖² − ‖Σ_c x_i‖²/n_c per cluster
    return float(x.square().sum() - (sums.square().sum(1) / size.clamp(min=1)).sum())


def _anisotropy_of(rows: Tensor) -> float | None:
    """A = (‖s‖² − n)/(n(n − 1)), s = Σ x_i/‖x_i‖: ``anisotropy_from_unit_mean`` written on the sum. Why not that
    function: its (n‖s/n‖² − 1)/(n − 1) rounds differently, and the report's sample_diagnostics would move in the
    last digit."""
    norms = rows.norm(dim=1)
    unit = rows[norms > 0] / norms[norms > 0, None]
    n = unit.shape[0]
    return anisotropy_from_unit_mean(unit.mean(0), n) if n >= 2 else None


def sample_diagnostics(
    rows: Float[Tensor, "k d"], mean: Float[Tensor, " d"], direction: Float[Tensor, " d"] | None
) -> dict:
    """Numbers read from a uniform row sample, with μ and the top principal direction v₁ of the full pass:
    ``anisotropy`` A of the sample rows, ``centred_anisotropy`` A of x − μ (what is left of the cone once the
    mean is removed), ``pc1_split`` :func:`two_means_1d` of (x − μ)·v₁, ``kmeans2_between_share`` and
    ``kmeans2_smaller_fraction`` (:func:`kmeans_between_share`)."""
    x = torch.as_tensor(rows, dtype=torch.float64)
    mu = torch.as_tensor(mean, dtype=torch.float64)
    out: dict = {
        "n_rows": int(x.shape[0]),
        "anisotropy": _anisotropy_of(x),
        "centred_anisotropy": _anisotropy_of(centred := x - mu),
    }
    if direction is not None and x.shape[0] >= 4:
        v = torch.as_tensor(direction, dtype=torch.float64)
        out["pc1_split"] = two_means_1d(centred @ v).to_dict()
    share, fraction = kmeans_between_share(x) if x.shape[0] >= 4 else (None, None)
    out["kmeans2_between_share"], out["kmeans2_smaller_fraction"] = share, fraction
    return out
