"""Dense latents: their antipodal pairs, the subspace the pairs span, and its alignment with given directions
(the mean μ, top principal components, a position direction). Pure math: no I/O, no models.

Sun, Stolfo, Engels et al., "Dense SAE Latents Are Features, Not Bugs" (2025) find that an SAE's dense latents
(those that fire on a large share of tokens) come as nearly antipodal pairs that together reconstruct one
direction of the residual stream (one latent for each sign of the projection), and that these directions
(position, context binding, entropy / null-space ones) are a property of the activations, not of training.

Definitions used here
---------------------
* dense latent: firing rate P(a_i > 0) ≥ ``min_rate``.
* antipodal pair (i, j) of dense latents: decoder cosine cos(w_i, w_j) ≤ −``min_anticos`` (near −1) and
  complementary firing: the co-firing share n_ij / min(n_i, n_j) ≤ ``max_cofire`` (n_i: rows where i fires,
  n_ij: rows where both fire; 0 = they never fire together). Pairs are taken greedily from the most negative
  cosine, each latent in one pair at most.
* the pair's axis v = (u_i − u_j)/‖u_i − u_j‖ (u = w/‖w‖): the signed direction the pair reconstructs.
* the pairs' subspace: the span of their axes, orthonormal basis Q (k columns, directions whose singular value
  is below 1e-6 of the largest dropped).
* the position direction: the least-squares slope of the rows on their position p, β = Σ(x − x̄)(p − p̄) /
  Σ(p − p̄)² (``CovariateDirection``), with the share of the rows' variance it explains ‖β‖² Var(p) / tr Σ.
* alignment of a direction r with it: ‖Qᵀr‖²/‖r‖² ∈ [0, 1], the squared cosine of the angle between r and the
  subspace; a random direction of R^d gives k/d on average (``chance``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from jaxtyping import Float, Int
from torch import Tensor

from saegeo.errors import BadInputError

__all__ = [
    "DenseCofiring",
    "AntipodalPair",
    "CovariateDirection",
    "dense_latents",
    "antipodal_pairs",
    "pair_subspace",
    "subspace_alignment",
]


def dense_latents(fire_count: Int[Tensor, " N"], n_rows: int, min_rate: float = 0.1) -> Int[Tensor, " m"]:
    """Indices of the latents firing on at least ``min_rate`` of ``n_rows`` rows, densest first."""
    if n_rows < 1:
        raise BadInputError("dense_latents needs at least one row")
    rate = fire_count.to(torch.float64) / n_rows
    idx = (rate >= min_rate).nonzero().flatten()
    return idx[rate[idx].argsort(descending=True, stable=True)]


class DenseCofiring:
    """Streaming counts of the chosen latents' firing: n_i and the co-firing n_ij over the rows (int64)."""

    def __init__(self, latents: Int[Tensor, " m"]) -> None:
        self.latents = torch.as_tensor(latents, dtype=torch.long)
        m = self.latents.numel()
        self.n_rows = 0
        self.fire = torch.zeros(m, dtype=torch.long)
        self.cofire = torch.zeros(m, m, dtype=torch.long)

    def add(self, codes: Float[Tensor, "b N"]) -> None:
        """Add a batch of dense codes (b, N): only the chosen latents' columns are read."""
        on = (torch.as_tensor(codes)[:, self.latents] > 0).to(torch.float64)
        self.n_rows += on.shape[0]
        self.fire += on.sum(0).round().long()
        self.cofire += (on.T @ on).round().long()  # exact: integer counts well below 2^53

    def add_coo(self, n_rows: int, rows: Int[Tensor, " nnz"], cols: Int[Tensor, " nnz"], values: Tensor) -> None:
        """Add a batch of n_rows rows given as COO codes (row, latent, value): the same counts as ``add`` of the
        dense matrix, with no (rows × N) matrix (only the chosen latents' (rows × m) indicator)."""
        column = torch.full((int(cols.max()) + 1 if cols.numel() else 0,), -1, dtype=torch.long)
        keep_latents = self.latents[self.latents < column.numel()]
        column[keep_latents] = (self.latents < column.numel()).nonzero().flatten()
        cols = cols.long()
        at = column[cols] if cols.numel() else cols
        keep = (at >= 0) & (torch.as_tensor(values) > 0)
        on = torch.zeros(n_rows, self.latents.numel(), dtype=torch.float64)
        on[rows.long()[keep], at[keep]] = 1.0
        self.n_rows += n_rows
        self.fire += on.sum(0).round().long()
        self.cofire += (on.T @ on).round().long()


@dataclass
class AntipodalPair:
    i: int  # latent ids (of the whole dictionary)
    j: int
    decoder_cos: float
    cofire_share: float  # n_ij / min(n_i, n_j)
    union_rate: float  # (n_i + n_j − n_ij) / n: the rows on which the pair's axis is read
    encoder_cos: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _unit(rows: Tensor) -> Tensor:
    rows = rows.to("cpu", torch.float64)
    norms = rows.norm(dim=1, keepdim=True)
    return torch.where(norms > 0, rows / norms.clamp_min(1e-300), 0.0)


def antipodal_pairs(
    W_dec: Float[Tensor, "N d"],
    cofiring: DenseCofiring,
    *,
    min_anticos: float = 0.9,
    max_cofire: float = 0.1,
    W_enc: Float[Tensor, "d N"] | None = None,
) -> list[AntipodalPair]:
    """The antipodal pairs among ``cofiring.latents`` (module docstring), most negative decoder cosine first."""
    latents = cofiring.latents
    if latents.numel() < 2:
        return []
    unit = _unit(W_dec[latents])
    cos = unit @ unit.T
    enc = None
    if W_enc is not None:
        e = _unit(W_enc[:, latents].T)
        enc = e @ e.T
    fire = cofiring.fire.to(torch.float64)
    smaller = torch.minimum(fire[:, None], fire[None, :])
    share = torch.where(smaller > 0, cofiring.cofire.to(torch.float64) / smaller.clamp_min(1), 1.0)
    m = latents.numel()
    upper = torch.triu(torch.ones(m, m, dtype=torch.bool), diagonal=1)
    ok = upper & (cos <= -min_anticos) & (share <= max_cofire)
    a, b = ok.nonzero(as_tuple=True)
    order = cos[a, b].argsort(stable=True)
    taken: set[int] = set()
    pairs = []
    n = max(cofiring.n_rows, 1)
    for p in order.tolist():
        x, y = int(a[p]), int(b[p])
        if x in taken or y in taken:
            continue
        taken |= {x, y}
        union = float(fire[x] + fire[y] - cofiring.cofire[x, y]) / n
        pairs.append(
            AntipodalPair(
                i=int(latents[x]),
                j=int(latents[y]),
                decoder_cos=float(cos[x, y]),
                cofire_share=float(share[x, y]),
                union_rate=union,
                encoder_cos=None if enc is None else float(enc[x, y]),
            )
        )
    return pairs


def pair_subspace(
    W_dec: Float[Tensor, "N d"], pairs: list[AntipodalPair], rel_tol: float = 1e-6
) -> Float[Tensor, "d k"]:
    """An orthonormal basis Q (d, k) of the span of the pairs' axes (u_i − u_j)/‖u_i − u_j‖ (float64)."""
    d = W_dec.shape[1]
    if not pairs:
        return torch.zeros(d, 0, dtype=torch.float64)
    ui = _unit(W_dec[torch.tensor([p.i for p in pairs])])
    uj = _unit(W_dec[torch.tensor([p.j for p in pairs])])
    axes = _unit(ui - uj)
    u, s, _ = torch.linalg.svd(axes.T, full_matrices=False)
    keep = s > rel_tol * float(s.max()) if s.numel() else s > 0
    return u[:, keep]


def subspace_alignment(basis: Float[Tensor, "d k"], directions: dict[str, Tensor]) -> dict[str, Any]:
    """‖Qᵀr‖²/‖r‖² for each named direction r (None for r = 0), with ``chance`` = k/d and ``dim`` = k."""
    d, k = basis.shape
    out: dict[str, Any] = {"dim": k, "chance": k / d}
    for name, r in directions.items():
        r = torch.as_tensor(r).to("cpu", torch.float64).flatten()
        if r.numel() != d:
            raise BadInputError(f"direction {name!r} has {r.numel()} entries, the subspace lives in d = {d}")
        norm_sq = float(r.square().sum())
        out[name] = float((basis.T @ r).square().sum()) / norm_sq if norm_sq > 0 else None
    return out


class CovariateDirection:
    """The regression of rows x ∈ R^d on one per-row covariate p (the token's position), streamed:

        β = Σ(x − x̄)(p − p̄) / Σ(p − p̄)²        (d: how x moves per unit of p; the position direction)
        explained share = ‖β‖² · Σ(p − p̄)² / Σ‖x − x̄‖²   (the rows' variance a linear term in p accounts for)

    from float64 sums n, Σx', Σ‖x'‖², Σp', Σp'², Σx'p' of x' = x − c, p' = p − c_p (c, c_p: the first batch's
    means, so a large mean loses no digits). O(m·d) per batch, in x's dtype (``add``)."""

    def __init__(self, d: int) -> None:
        self.d, self.n = int(d), 0
        self.shift_x: Tensor | None = None
        self.shift_p = 0.0
        self.sum_x = torch.zeros(self.d, dtype=torch.float64)
        self.sum_xp = torch.zeros(self.d, dtype=torch.float64)
        self.sum_x_sq = self.sum_p = self.sum_p_sq = 0.0

    def add(self, x: Float[Tensor, "m d"], p: Float[Tensor, " m"]) -> CovariateDirection:
        """One batch of rows and their covariate. The O(m·d) sums are formed in x's dtype (float32 rows: float32,
        on their device; a float64 copy of every batch cost 3× the rest) from rows shifted by the first batch's
        mean rounded to that dtype, and added in float64."""
        x = torch.as_tensor(x)
        x = x if x.dtype in (torch.float32, torch.float64) else x.float()
        p = torch.as_tensor(p).to(x.device, torch.float64).flatten()
        if x.ndim != 2 or x.shape[1] != self.d or p.numel() != x.shape[0]:
            raise BadInputError(
                f"CovariateDirection needs rows (m, {self.d}) and m covariates, got {tuple(x.shape)}, {p.numel()}"
            )
        if x.shape[0] == 0:
            return self
        if self.shift_x is None:  # the mean rounded to x's dtype, held exactly: the c the sums are about
            self.shift_x = x.double().mean(0).to(x.dtype).to("cpu", torch.float64)
            self.shift_p = float(p.mean())
        xs = x - self.shift_x.to(x.device, x.dtype)
        ps = p - self.shift_p
        self.n += x.shape[0]
        self.sum_x += xs.sum(0).to("cpu", torch.float64)
        self.sum_xp += (xs.T @ ps.to(x.dtype)).to("cpu", torch.float64)
        self.sum_x_sq += float((xs * xs).sum())
        self.sum_p += float(ps.sum())
        self.sum_p_sq += float(ps.square().sum())
        return self

    def result(self) -> tuple[Float[Tensor, " d"] | None, dict[str, Any]]:
        """(β or None when p or x does not vary, {"n", "explained_share", "slope_norm"})."""
        n = self.n
        spread_p = self.sum_p_sq - self.sum_p**2 / n if n else 0.0
        spread_x = self.sum_x_sq - float(self.sum_x.square().sum()) / n if n else 0.0
        if n < 2 or spread_p <= 0 or spread_x <= 0:
            return None, {"n": n, "explained_share": None, "slope_norm": None}
        beta = (self.sum_xp - self.sum_x * (self.sum_p / n)) / spread_p
        share = float(beta.square().sum()) * spread_p / spread_x
        return beta, {"n": n, "explained_share": share, "slope_norm": float(beta.norm())}
