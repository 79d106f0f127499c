"""Per-latent streaming statistics of SAE codes for latent cards: the top-k rows of every latent and a
log-binned (half-octave) histogram of its nonzero activations -- in memory k·N + N·B, independent of the
number of rows.

``LatentTopK(n_latents, k, start=0)``   the k largest activations a_i > 0 of every latent and their global row
    indices; equal to a full sort of each latent's column by (−a, row) (ties: the earlier row first).
``LatentHistogram(n_latents)``          counts of a_i > 0 in fixed half-octave bins (``HISTOGRAM_EDGES``).
``LatentCovariates(n_latents, names)``  Pearson r(a_i, s) of every latent's activation with per-row covariates s
    (‖x‖, position: the norm-detector test), zeros included, from float64 sums.
All three take a batch of codes as anything ``coo_codes`` reads (dense (m, N), torch sparse, COO), are mergeable
(``merge``, ``state_dict`` / ``from_state_dict``: ``saegeo.distributed.merge_across_ranks`` works) and exact.
Pure math on tensors (the per-batch screen and merge run in NumPy on CPU views of the state: its gathers and sorts
cost a fraction of torch's at these sizes): no I/O, no models.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from jaxtyping import Float, Int
from torch import Tensor

from saegeo.errors import BadInputError
from saegeo.geometry.amplification import coo_codes

__all__ = ["LatentTopK", "LatentHistogram", "LatentCovariates", "HISTOGRAM_EDGES", "BINS_PER_OCTAVE", "histogram_bins"]

BINS_PER_OCTAVE = 2  # edges 2^e and 1.5·2^e: read off a float32's exponent and first mantissa bit
_LOW_EXP, _HIGH_EXP = -14, 14
_N_INNER = (_HIGH_EXP - _LOW_EXP) * BINS_PER_OCTAVE  # bins in [2^-14, 2^14)
# [0, 2^-14), then [2^e, 1.5·2^e) and [1.5·2^e, 2^(e+1)) for e = −14 … 13, then [2^14, ∞): all exact in float32
# up to this many (latent, bin) cells a batch's histogram is one bincount of all of them (8M cells: 64 MB); above,
# a scattered add of its entries only
DENSE_COUNT_CELLS = 1 << 23
HISTOGRAM_EDGES = np.array(
    [0.0] + [m * 2.0**e for e in range(_LOW_EXP, _HIGH_EXP) for m in (1.0, 1.5)] + [2.0**_HIGH_EXP, np.inf]
)


class LatentTopK:
    """The k largest positive activations of each of ``n_latents`` latents over a stream of code batches,
    with the global index of their rows (batch row j of the t-th batch is ``start`` + rows seen before + j).

    Per batch only the entries a > v_k(latent) (the latent's current k-th kept value, 0 while a slot is empty)
    enter: one gather and compare over the batch's nonzeros. When more than 2k·N enter (the first batches), they
    are first cut per latent at the lower edge of the half-octave bin (``histogram_bins``) where the count of the
    batch's entries from the top reaches k: at least k of its own entries lie at or above that edge, so nothing
    below it can be among the k largest (exact, ties included). The rest are merged with the kept entries by one
    stable sort on the int64 key (latent, −a), rows in order. State: values (N, k) float32 (0 = empty slot), rows
    (N, k) int64 (−1 = empty).
    """

    def __init__(self, n_latents: int, k: int, start: int = 0):
        if n_latents < 1 or k < 0:
            raise BadInputError(f"LatentTopK needs n_latents ≥ 1 and k ≥ 0, got {n_latents} and {k}")
        self.n_latents, self.k, self.seen = int(n_latents), int(k), int(start)
        self.values = torch.zeros(self.n_latents, self.k, dtype=torch.float32)
        self.rows = torch.full((self.n_latents, self.k), -1, dtype=torch.long)

    def _threshold(self) -> np.ndarray:
        """v_k per latent: the k-th kept value (0 while a slot is empty), contiguous for the gather."""
        return np.ascontiguousarray(self.values.numpy()[:, -1])

    def add(self, codes: Any) -> LatentTopK:
        """Add one batch of codes (its rows are the next rows of the stream): a dense (m, N) tensor is screened
        against the kept k-th values directly (no list of its nonzeros), anything else through ``coo_codes``."""
        start = self.seen
        if isinstance(codes, Tensor) and codes.layout == torch.strided and codes.ndim == 2:
            if codes.shape[1] != self.n_latents:
                raise BadInputError(f"codes have {codes.shape[1]} latents but LatentTopK has N = {self.n_latents}")
            self.seen += codes.shape[0]
            if self.k == 0 or codes.shape[0] == 0:
                return self
            dense = codes.detach().to("cpu", torch.float32).numpy()
            rows, cols = np.nonzero(dense > self._threshold())  # row-major: rows in increasing order
            self._enter(cols, dense[rows, cols], rows + start)
            return self
        n_rows, rows, cols, values = coo_codes(codes)
        self.seen += n_rows
        if self.k == 0 or values.numel() == 0:
            return self
        rows, cols = rows.to("cpu", torch.long).numpy(), cols.to("cpu", torch.long).numpy()
        values = values.detach().to("cpu", torch.float32).numpy()
        if int(cols.max()) >= self.n_latents or int(cols.min()) < 0:
            bad = int(cols.max()) if int(cols.max()) >= self.n_latents else int(cols.min())
            raise BadInputError(f"codes have latent index {bad} but LatentTopK has N = {self.n_latents}")
        enter = np.flatnonzero(values > self._threshold()[cols])  # beats the k-th kept
        if enter.size:
            rows, cols, values = rows[enter], cols[enter], values[enter]
            if rows.size > 1 and bool((rows[1:] < rows[:-1]).any()):  # COO of an unknown order: rows first
                by_row = np.argsort(rows, kind="stable")
                rows, cols, values = rows[by_row], cols[by_row], values[by_row]
            self._enter(cols, values, rows + start)
        return self

    def _enter(self, cols: np.ndarray, values: np.ndarray, rows: np.ndarray) -> None:
        """Entries of one batch that beat their latent's k-th kept value, in row order (after every kept row):
        cut at their own bin edge when there are many, then merged."""
        if cols.size > 2 * self.k * self.n_latents:
            bins = _float32_bins(values)
            n_bins = len(HISTOGRAM_EDGES) - 1
            counts = np.bincount(cols * n_bins + bins, minlength=self.n_latents * n_bins).reshape(-1, n_bins)
            from_top = counts[:, ::-1].cumsum(axis=1)[:, ::-1]  # entries in bins ≥ b
            cut = np.maximum((from_top >= self.k).sum(axis=1) - 1, 0)  # the highest bin with ≥ k at or above it
            keep = np.flatnonzero(bins >= cut[cols])
            cols, values, rows = cols[keep], values[keep], rows[keep]
        if cols.size:
            self._merge_entries(cols, values, rows)

    def _merge_entries(
        self, cols: np.ndarray, values: np.ndarray, rows: np.ndarray, *, rows_after_kept: bool = True
    ) -> None:
        """Merge entries (latent, a > 0, row) into the kept ones: one stable sort by (latent, −a), ties in row
        order, the first k of each latent kept. ``rows_after_kept``: the entries' rows are in increasing order and
        after every kept row (a stream), else everything is put in row order first (a merge)."""
        k = self.k
        new_per_latent = np.bincount(cols, minlength=self.n_latents)
        touched = np.flatnonzero(new_per_latent)
        kept_v, kept_r = self.values.numpy()[touched], self.rows.numpy()[touched]
        occupied = kept_r >= 0  # a prefix of each latent's slots
        n_kept = occupied.sum(axis=1)
        all_c = np.concatenate([np.repeat(touched, n_kept), cols])
        all_v = np.concatenate([kept_v[occupied], values])
        all_r = np.concatenate([kept_r[occupied], rows])
        if not rows_after_kept:
            by_row = np.argsort(all_r, kind="stable")
            all_c, all_v, all_r = all_c[by_row], all_v[by_row], all_r[by_row]
        # a > 0 in float32: its bit pattern as an int increases with a, so (latent, −a) is one int64 key
        key = (all_c << 31) | (0x7FFFFFFF - all_v.view(np.int32).astype(np.int64))
        order = np.argsort(key, kind="stable")
        # sorted, the entries of the t-th touched latent are one block of n_kept + new; rank = place in it
        sizes = n_kept + new_per_latent[touched]
        slot = np.repeat(np.arange(len(touched)), sizes)
        rank = np.arange(len(order)) - np.repeat(np.cumsum(sizes) - sizes, sizes)
        keep = rank < k
        new_v = np.zeros((len(touched), k), dtype=np.float32)
        new_r = np.full((len(touched), k), -1, dtype=np.int64)
        src = order[keep]
        new_v[slot[keep], rank[keep]] = all_v[src]
        new_r[slot[keep], rank[keep]] = all_r[src]
        self.values.numpy()[touched], self.rows.numpy()[touched] = new_v, new_r

    def top(self, latent: int) -> tuple[Float[Tensor, " m"], Int[Tensor, " m"]]:
        """(activations, global rows) of one latent, largest first; m ≤ k (fewer when it fired less often)."""
        filled = self.rows[latent] >= 0
        return self.values[latent][filled], self.rows[latent][filled]

    def merge(self, other: LatentTopK) -> LatentTopK:
        """The top-k of both streams together (their rows must have distinct global indices)."""
        if (other.n_latents, other.k) != (self.n_latents, self.k):
            raise BadInputError(
                f"cannot merge a LatentTopK of {other.n_latents} latents × {other.k} into {self.n_latents} × {self.k}"
            )
        filled = other.rows >= 0
        if bool(filled.any()):
            cols = np.repeat(np.arange(self.n_latents), self.k)[filled.flatten().numpy()]
            values, rows = other.values[filled].numpy(), other.rows[filled].numpy()
            self._merge_entries(cols, values, rows, rows_after_kept=False)
        self.seen = max(self.seen, other.seen)
        return self

    def state_dict(self) -> dict[str, Any]:
        return {
            "n_latents": self.n_latents,
            "k": self.k,
            "seen": self.seen,
            "values": self.values.clone(),
            "rows": self.rows.clone(),
        }

    @classmethod
    def from_state_dict(cls, sd: Mapping[str, Any]) -> LatentTopK:
        out = cls(sd["n_latents"], sd["k"], sd["seen"])
        out.values = torch.as_tensor(sd["values"]).to(torch.float32).clone()
        out.rows = torch.as_tensor(sd["rows"]).to(torch.long).clone()
        return out


def histogram_bins(values: Float[Tensor, " n"]) -> Int[Tensor, " n"]:
    """The bin of each value a ≥ 0 in ``HISTOGRAM_EDGES`` (edges[b] ≤ a < edges[b + 1]), from its float32 bits:
    bits >> 22 = 2·(exponent + 127) + first mantissa bit, i.e. 2(e + 127) for a ∈ [2^e, 1.5·2^e), one more above."""
    return torch.from_numpy(_float32_bins(values.detach().to("cpu", torch.float32).numpy()))


def _float32_bins(values: np.ndarray) -> np.ndarray:
    """``histogram_bins`` of a float32 array a ≥ 0, as int64."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.int32) >> 22
    return np.clip(bits - 2 * (127 + _LOW_EXP), -1, _N_INNER).astype(np.int64) + 1


class LatentHistogram:
    """Counts of each latent's nonzero activations a_i > 0 in the fixed half-octave bins ``HISTOGRAM_EDGES``:
    [0, 2^-14), [2^e, 1.5·2^e), [1.5·2^e, 2^(e+1)) up to 2^14, [2^14, ∞) (a in float32). State (N, B) int64."""

    def __init__(self, n_latents: int):
        self.n_latents = int(n_latents)
        self.counts = torch.zeros(self.n_latents, len(HISTOGRAM_EDGES) - 1, dtype=torch.long)

    def add(self, codes: Any) -> LatentHistogram:
        """Add one batch of codes (anything ``coo_codes`` reads): one bincount over the keys latent·B + bin of
        its positive entries."""
        _, _, cols, values = coo_codes(codes)
        if values.numel() == 0:
            return self
        values = values.detach().to("cpu", torch.float32).numpy()
        cols = cols.to("cpu", torch.long).numpy()
        if bool((values <= 0).any()):  # nonzeros: only negative or zero codes (TopK's) to drop
            cols, values = cols[values > 0], values[values > 0]
        if values.size:
            if int(cols.max()) >= self.n_latents or int(cols.min()) < 0:
                bad = int(cols.max()) if int(cols.max()) >= self.n_latents else int(cols.min())
                raise BadInputError(f"codes have latent index {bad} but LatentHistogram has N = {self.n_latents}")
            n_bins = self.counts.shape[1]
            flat = cols * n_bins + _float32_bins(values)
            if self.counts.numel() <= DENSE_COUNT_CELLS:  # a dense count of all the cells beats a scattered add
                self.counts.numpy().reshape(-1)[:] += np.bincount(flat, minlength=self.counts.numel())
            else:
                flat_t = torch.from_numpy(flat)
                self.counts.view(-1).index_add_(0, flat_t, torch.ones_like(flat_t))
        return self

    def histogram(self, latent: int, max_value: float | None = None) -> dict[str, list]:
        """{"edges", "counts"} of one latent trimmed to its first..last occupied bin; the open last edge (∞) is
        replaced by ``max_value`` (e.g. its largest activation) or twice the previous edge. Empty when it never
        fired."""
        counts = self.counts[latent]
        occupied = counts.nonzero().flatten()
        if occupied.numel() == 0:
            return {"edges": [], "counts": []}
        lo, hi = int(occupied[0]), int(occupied[-1])
        edges = HISTOGRAM_EDGES[lo : hi + 2].tolist()
        if not np.isfinite(edges[-1]):
            edges[-1] = float(max_value) if max_value is not None and max_value >= edges[-2] else 2.0 * edges[-2]
        return {"edges": edges, "counts": counts[lo : hi + 1].tolist()}

    def merge(self, other: LatentHistogram) -> LatentHistogram:
        if other.n_latents != self.n_latents:
            raise BadInputError(f"cannot merge a histogram of {other.n_latents} latents into {self.n_latents}")
        self.counts += other.counts
        return self

    def state_dict(self) -> dict[str, Any]:
        return {"n_latents": self.n_latents, "counts": self.counts.clone()}

    @classmethod
    def from_state_dict(cls, sd: Mapping[str, Any]) -> LatentHistogram:
        out = cls(sd["n_latents"])
        out.counts = torch.as_tensor(sd["counts"]).to(torch.long).clone()
        return out


class LatentCovariates:
    """Per latent i and covariate s (one value per row: ‖x‖, the row's position, ...), the Pearson correlation over
    every row, the rows where the latent is silent included (a_i = 0):

        r_i(s) = (Σ a_i s'/n − ā_i s̄') / (sd(a_i) · sd(s)),   s' = s − c,  sd² = Σ v²/n − v̄²  (1/n moments),

    from float64 sums n, Σa_i, Σa_i², Σs', Σs'², Σa_i s' (c: the first batch's mean of s, so that a covariate far
    from 0, like ‖x‖, loses no digits to cancellation; ``merge`` re-centres one state on the other's c).
    A latent "fires by norm" when r_i(‖x‖) is near 1 ("norm detectors"; the Cosine-Scored SAE paper's high-norm
    tokens claiming TopK slots). Memory 2 + |s| columns of N float64; per batch O(nnz · |s|)."""

    def __init__(self, n_latents: int, names: tuple[str, ...] = ("norm",)):
        if n_latents < 1 or not names:
            raise BadInputError(f"LatentCovariates needs n_latents ≥ 1 and a covariate, got {n_latents}, {names}")
        self.n_latents, self.names, self.n = int(n_latents), tuple(names), 0
        self.shift: Float[Tensor, " s"] | None = None  # c per covariate
        self.a_sum = torch.zeros(self.n_latents, dtype=torch.float64)
        self.a_sq_sum = torch.zeros(self.n_latents, dtype=torch.float64)
        self.s_sum = torch.zeros(len(self.names), dtype=torch.float64)
        self.s_sq_sum = torch.zeros(len(self.names), dtype=torch.float64)
        self.as_sum = torch.zeros(len(self.names), self.n_latents, dtype=torch.float64)

    def add(self, codes: Any, covariates: Float[Tensor, "m s"]) -> LatentCovariates:
        """One batch: codes (anything ``coo_codes`` reads) of m rows and their covariates (m, |names|)."""
        centred = self.centre(covariates)  # converted once, for both sums
        self.add_rows(centred, centred=True)
        return self.add_codes(codes, centred, centred=True)

    def centre(self, covariates: Float[Tensor, "m s"]) -> Float[Tensor, "m s"]:
        """s' = s − c as float64 (m, |names|); the first rows seen set c (their mean)."""
        s = torch.as_tensor(covariates).detach().to("cpu", torch.float64).reshape(-1, len(self.names))
        if self.shift is None and s.shape[0]:
            self.shift = s.mean(dim=0)
        return s if self.shift is None else s - self.shift

    def add_rows(self, covariates: Float[Tensor, "m s"], *, centred: bool = False) -> LatentCovariates:
        """The covariates' own sums (n, Σs', Σs'²) over a batch of m rows; ``add_codes`` then takes the codes of
        those rows in groups of any size (the sums do not depend on how the codes were cut). ``centred``: the
        covariates are ``centre``'s output already."""
        s = covariates if centred else self.centre(covariates)
        if s.shape[0] == 0:
            return self
        self.n += int(s.shape[0])
        self.s_sum += s.sum(dim=0)
        self.s_sq_sum += s.square().sum(dim=0)
        return self

    def add_codes(self, codes: Any, covariates: Float[Tensor, "m s"], *, centred: bool = False) -> LatentCovariates:
        """Σa_i, Σa_i², Σa_i s' over codes of m rows whose covariates ``add_rows`` has counted: each latent's
        terms are added in row order, so any cut of a batch into row groups gives the same sums. ``centred``: the
        covariates are ``centre``'s output already."""
        n_rows, rows, cols, values = coo_codes(codes)
        if n_rows == 0 or not values.numel():
            return self
        if self.shift is None:
            raise BadInputError("LatentCovariates.add_codes before add_rows: the covariates' centre is not set")
        s = (covariates if centred else self.centre(covariates)).reshape(n_rows, len(self.names))
        a = values.detach().to("cpu", torch.float64)
        cols = cols.to("cpu", torch.long)
        if int(cols.max()) >= self.n_latents or int(cols.min()) < 0:
            raise BadInputError(
                f"codes have latent index {int(cols.max())} but LatentCovariates has N = {self.n_latents}"
            )
        self.a_sum.index_add_(0, cols, a)
        self.a_sq_sum.index_add_(0, cols, a.square())
        weighted = s[rows.to("cpu", torch.long)] * a[:, None]  # (nnz, |s|)
        for j in range(len(self.names)):
            self.as_sum[j].index_add_(0, cols, weighted[:, j])
        return self

    def correlations(self) -> dict[str, list[float | None]]:
        """{covariate: r_i for every latent}; None where a latent or the covariate does not vary (or n < 2)."""
        out: dict[str, list[float | None]] = {}
        if self.n < 2:
            return {name: [None] * self.n_latents for name in self.names}
        n = self.n
        a_mean = self.a_sum / n
        a_var = (self.a_sq_sum / n - a_mean.square()).clamp_min(0)
        for j, name in enumerate(self.names):
            s_mean = self.s_sum[j] / n
            s_var = float(self.s_sq_sum[j] / n - s_mean.square())
            cov = self.as_sum[j] / n - a_mean * s_mean
            denom = (a_var * max(s_var, 0.0)).sqrt()
            # a silent latent, or one whose variance is below float64's cancellation floor of its mean, has no r
            ok = (denom > 0) & (a_var > 1e-12 * self.a_sq_sum / n)
            r = torch.where(ok, cov / torch.where(ok, denom, torch.ones_like(denom)), torch.nan).clamp(-1, 1)
            out[name] = [None if v != v else float(v) for v in r.tolist()]
        return out

    def merge(self, other: LatentCovariates) -> LatentCovariates:
        if (other.n_latents, other.names) != (self.n_latents, self.names):
            raise BadInputError(
                f"cannot merge covariates {other.names} of {other.n_latents} latents into "
                f"{self.names} of {self.n_latents}"
            )
        if other.n == 0:
            return self
        if self.n == 0:
            self.shift = other.shift.clone()
        delta = other.shift - self.shift  # other's s' = s − c_o = (s − c_s) − delta: re-centred on c_s
        self.s_sq_sum += other.s_sq_sum + 2 * delta * other.s_sum + other.n * delta.square()
        self.s_sum += other.s_sum + other.n * delta
        self.as_sum += other.as_sum + delta[:, None] * other.a_sum[None, :]
        self.a_sum += other.a_sum
        self.a_sq_sum += other.a_sq_sum
        self.n += other.n
        return self

    def state_dict(self) -> dict[str, Any]:
        keys = ("a_sum", "a_sq_sum", "s_sum", "s_sq_sum", "as_sum")
        return {
            "n_latents": self.n_latents,
            "names": list(self.names),
            "n": self.n,
            "shift": self.shift,
            **{k: getattr(self, k).clone() for k in keys},
        }

    @classmethod
    def from_state_dict(cls, sd: Mapping[str, Any]) -> LatentCovariates:
        out = cls(sd["n_latents"], tuple(sd["names"]))
        out.n = int(sd["n"])
        out.shift = None if sd["shift"] is None else torch.as_tensor(sd["shift"], dtype=torch.float64).clone()
        for k in ("a_sum", "a_sq_sum", "s_sum", "s_sq_sum", "as_sum"):
            setattr(out, k, torch.as_tensor(sd[k], dtype=torch.float64).clone())
        return out
