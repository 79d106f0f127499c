"""Dark matter: the share of an SAE's error that is a linear function of its input, by a streamed ridge
regression held out by folds. Pure math: no I/O, no models.

Definition (Engels, Smith & Tegmark, "Decomposing The Dark Matter of Sparse Autoencoders", TMLR 2025, §4): for
the error e(x) = x − SAE(x), fit e ≈ Bᵀx + c by least squares over the tokens, and the norm ‖e‖₂ ≈ bᵀx + c' by
a linear probe; the fraction of variance of each explained on held-out tokens is its linearly predictable
share ("about half of the error vector and > 90 % of its norm" on their SAEs). 1 − R²_vector is the
*nonlinear* error share.

  R²_vector = 1 − Σ_rows ‖e − ê‖² / Σ_rows ‖e − ē‖²       (all d coordinates pooled)
  R²_norm   = 1 − Σ_rows (‖e‖ − n̂)² / Σ_rows (‖e‖ − mean ‖e‖)²

Streaming: rows go to K folds by contiguous blocks (row g to fold ⌊g / fold_rows⌋ mod K: the tokens of one window
stay in one fold, so a neighbour's near-copy never scores a fit it trained), and each fold keeps the float64 sums (of products formed in the rows' dtype, ``add``)
n, Σx, Σy, XᵀX, XᵀY, Σy² of y = [e, ‖e‖] (d × (d + 1) numbers per fold beside the d × d gram), on rows shifted by
the first batch's means (no cancellation from a large offset). The fit for fold f uses the other folds' sums:
B = (C_xx + λI)⁻¹ C_xy with C the centred sums, λ = ridge·tr(C_xx)/d (a relative ridge: at n ≫ d and the
default 1e-6 it is least squares, as the paper; it keeps a singular C_xx solvable). Fold f's residual sum of
squares follows from its own sums exactly (a quadratic form in B), so no row is read twice.

Reported: the pooled cross-validated R² = 1 − Σ_f SSE_f / Σ_f SST_f (SST_f about fold f's own mean), and its sd
= sd(R²_1 … R²_K)/√K, the standard error of the fold mean (folds are disjoint blocks of tokens; the fits share
training rows, which the calibration test in tests/geometry/test_dark_matter.py shows does not matter at n ≫ d).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor

from saegeo.errors import BadInputError
from saegeo.geometry.accumulate import symmetric_gram

__all__ = ["DarkMatterAccumulator", "DarkMatter", "dark_matter"]

DEFAULT_FOLDS = 5
DEFAULT_FOLD_ROWS = 1024  # contiguous rows per fold block (≥ a window of tokens)
DEFAULT_RIDGE = 1e-6  # λ / (tr C_xx / d)


class DarkMatterAccumulator:
    """Per-fold float64 sums of x (d) and y = [e, ‖e‖] (d + 1) for ``dark_matter``; mergeable (``merge``)."""

    def __init__(self, d: int, n_folds: int = DEFAULT_FOLDS, fold_rows: int = DEFAULT_FOLD_ROWS) -> None:
        if n_folds < 2:
            raise BadInputError(f"dark matter needs at least 2 folds to hold data out, got {n_folds}")
        if fold_rows < 1:
            raise BadInputError(f"fold_rows must be ≥ 1, got {fold_rows}")
        self.d, self.n_folds, self.fold_rows = d, n_folds, fold_rows
        p = d + 1
        self.n = torch.zeros(n_folds, dtype=torch.float64)
        self.sum_x = torch.zeros(n_folds, d, dtype=torch.float64)
        self.sum_y = torch.zeros(n_folds, p, dtype=torch.float64)
        self.xx = torch.zeros(n_folds, d, d, dtype=torch.float64)
        self.xy = torch.zeros(n_folds, d, p, dtype=torch.float64)
        self.yy = torch.zeros(n_folds, p, dtype=torch.float64)  # Σ y_t² per target
        self.shift_x: Tensor | None = None
        self.shift_y: Tensor | None = None
        self.rows_seen = 0

    def add(self, x: Float[Tensor, "m d"], error: Float[Tensor, "m d"], first_row: int | None = None) -> None:
        """Add rows x and their SAE errors e = x − x̂; ``first_row`` is the global index of x[0] (default: the
        rows seen so far), which sets each row's fold.

        The products over a chunk are formed in the inputs' dtype (float32 unless one is float64) on their device,
        from rows shifted by the first batch's means rounded to that dtype, and summed across chunks in float64:
        the scheme of GeometryAccumulator's gram (each sum over rows left in float32 is one fold block's, at most
        ``fold_rows`` rows; the row sums Σx, Σy, Σy² too); XᵀX from its upper triangle (``symmetric_gram``)."""
        x, e = torch.as_tensor(x), torch.as_tensor(error)
        if x.ndim != 2 or x.shape[1] != self.d or e.shape != x.shape:
            raise BadInputError(
                f"dark matter needs x and error of shape (m, {self.d}), got {tuple(x.shape)} and {tuple(e.shape)}"
            )
        dtype = torch.float64 if torch.float64 in (x.dtype, e.dtype) else torch.float32
        x, e = x.to(dtype), e.to(x.device, dtype)
        start = self.rows_seen if first_row is None else first_row
        self.rows_seen = start + x.shape[0]
        if x.shape[0] == 0:
            return
        y = torch.cat([e, torch.linalg.vector_norm(e, dim=1, keepdim=True)], 1)
        if self.shift_x is None:  # the means rounded to the compute dtype: the c the sums are about, held exactly
            self.shift_x = x.double().mean(0).to(dtype).to("cpu", torch.float64)
            self.shift_y = y.double().mean(0).to(dtype).to("cpu", torch.float64)
        xs, ys = x - self.shift_x.to(x.device, dtype), y - self.shift_y.to(x.device, dtype)
        # folds are contiguous blocks: the chunk is cut at block edges, each piece in one fold
        at = 0
        while at < x.shape[0]:
            row = start + at
            stop = min(x.shape[0], at + self.fold_rows - row % self.fold_rows)
            f = (row // self.fold_rows) % self.n_folds
            xf, yf = xs[at:stop], ys[at:stop]
            self.n[f] += xf.shape[0]
            # every sum over a block's rows in the compute dtype, like the products (a widening sum cost 8× more)
            self.sum_x[f] += xf.sum(0).to("cpu", torch.float64)
            self.sum_y[f] += yf.sum(0).to("cpu", torch.float64)
            self.xx[f] += symmetric_gram(xf).to("cpu", torch.float64)
            self.xy[f] += (xf.T @ yf).to("cpu", torch.float64)
            self.yy[f] += (yf * yf).sum(0).to("cpu", torch.float64)
            at = stop

    def _reshift(self, shift_x: Tensor, shift_y: Tensor) -> None:
        """Re-express the sums about another shift: Σ(x − c')(x − c')ᵀ from Σ(x − c)(…)ᵀ, δ = c − c'."""
        dx, dy = self.shift_x - shift_x, self.shift_y - shift_y
        n = self.n[:, None]
        xx = self.xx + self.sum_x[:, :, None] * dx[None, None, :] + dx[None, :, None] * self.sum_x[:, None, :]
        self.xx = xx + self.n[:, None, None] * torch.outer(dx, dx)
        xy = self.xy + self.sum_x[:, :, None] * dy[None, None, :] + dx[None, :, None] * self.sum_y[:, None, :]
        self.xy = xy + self.n[:, None, None] * torch.outer(dx, dy)
        self.yy = self.yy + 2 * self.sum_y * dy + n * dy.square()
        self.sum_x = self.sum_x + n * dx
        self.sum_y = self.sum_y + n * dy
        self.shift_x, self.shift_y = shift_x, shift_y

    def merge(self, other: DarkMatterAccumulator) -> None:
        """Add another accumulator's sums (same d, folds and fold_rows; rows placed by their global index)."""
        if (other.d, other.n_folds, other.fold_rows) != (self.d, self.n_folds, self.fold_rows):
            raise BadInputError("dark matter accumulators differ in d, folds or fold_rows: cannot merge")
        if other.shift_x is None:
            return
        if self.shift_x is None:
            self.shift_x, self.shift_y = other.shift_x.clone(), other.shift_y.clone()
        if not (torch.equal(other.shift_x, self.shift_x) and torch.equal(other.shift_y, self.shift_y)):
            other._reshift(self.shift_x, self.shift_y)
        for name in ("n", "sum_x", "sum_y", "xx", "xy", "yy"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.rows_seen = max(self.rows_seen, other.rows_seen)


@dataclass
class DarkMatter:
    """What ``dark_matter`` measured (see the module docstring)."""

    n_rows: int
    n_folds: int
    ridge: float
    r2_vector: float  # linearly predictable share of the error vector's variance, held out
    r2_vector_sd: float
    r2_norm: float  # linearly predictable share of the error norm's variance, held out
    r2_norm_sd: float
    fold_r2_vector: list[float]
    fold_r2_norm: list[float]

    @property
    def nonlinear_share(self) -> float:
        """1 − R²_vector: the error's share that no linear function of x predicts."""
        return 1.0 - self.r2_vector

    def to_dict(self) -> dict[str, Any]:
        return {
            "n_rows": self.n_rows,
            "n_folds": self.n_folds,
            "ridge": self.ridge,
            "r2_vector": self.r2_vector,
            "r2_vector_sd": self.r2_vector_sd,
            "r2_norm": self.r2_norm,
            "r2_norm_sd": self.r2_norm_sd,
            "nonlinear_share": self.nonlinear_share,
            "fold_r2_vector": self.fold_r2_vector,
            "fold_r2_norm": self.fold_r2_norm,
        }


def dark_matter(acc: DarkMatterAccumulator, ridge: float = DEFAULT_RIDGE) -> DarkMatter:
    """The held-out linear predictability of an SAE's error from its input (module docstring): fit on K − 1
    folds' sums, score on the K-th, for each fold; pooled R² and its fold standard error."""
    if ridge < 0 or not math.isfinite(ridge):
        raise BadInputError(f"ridge must be a finite number ≥ 0, got {ridge}")
    if bool((acc.n < 2).any()):
        raise BadInputError(
            f"dark matter needs ≥ 2 rows in each of the {acc.n_folds} folds (blocks of {acc.fold_rows} rows); "
            f"got {[int(v) for v in acc.n]}: give more rows or smaller fold blocks"
        )
    d = acc.d
    tot = {name: getattr(acc, name).sum(0) for name in ("n", "sum_x", "sum_y", "xx", "xy")}
    sse = torch.zeros(acc.n_folds, d + 1, dtype=torch.float64)
    sst = torch.zeros(acc.n_folds, d + 1, dtype=torch.float64)
    eye = torch.eye(d, dtype=torch.float64)
    for f in range(acc.n_folds):
        n = tot["n"] - acc.n[f]
        mx, my = (tot["sum_x"] - acc.sum_x[f]) / n, (tot["sum_y"] - acc.sum_y[f]) / n
        cxx = tot["xx"] - acc.xx[f] - n * torch.outer(mx, mx)
        cxy = tot["xy"] - acc.xy[f] - n * torch.outer(mx, my)
        lam = ridge * float(torch.diagonal(cxx).sum()) / d
        B = torch.linalg.solve(cxx + lam * eye, cxy)  # (d, d + 1)
        c = my - mx @ B
        nf, sx, sy = acc.n[f], acc.sum_x[f], acc.sum_y[f]
        sse[f] = (
            acc.yy[f]
            - 2 * (B * acc.xy[f]).sum(0)
            - 2 * c * sy
            + ((acc.xx[f] @ B) * B).sum(0)
            + 2 * c * (sx @ B)
            + nf * c.square()
        )
        sst[f] = acc.yy[f] - sy.square() / nf
    vec_sse, vec_sst = sse[:, :d].sum(1), sst[:, :d].sum(1)
    if float(vec_sst.sum()) <= 0:
        raise BadInputError("the SAE's error does not vary over these rows: its predictable share is undefined")
    fold_vec = (1 - vec_sse / vec_sst).tolist()
    fold_norm = (1 - sse[:, d] / sst[:, d]).tolist()
    k = acc.n_folds

    def se(values: list[float]) -> float:
        return float(torch.tensor(values, dtype=torch.float64).std()) / math.sqrt(k)

    return DarkMatter(
        n_rows=int(tot["n"]),
        n_folds=k,
        ridge=ridge,
        r2_vector=float(1 - vec_sse.sum() / vec_sst.sum()),
        r2_vector_sd=se(fold_vec),
        r2_norm=float(1 - sse[:, d].sum() / sst[:, d].sum()),
        r2_norm_sd=se(fold_norm),
        fold_r2_vector=fold_vec,
        fold_r2_norm=fold_norm,
    )
