"""Per-latent streaming statistics of SAE codes for latent cards: the top-k rows of every latent and a
log-binned (half-octave) histogram of its nonzero activations -- in memory k·N + N·B, independent of the
number of rows.

``LatentTopK(n_latents, k, start=0)``   the k largest activations a_i > 0 of every latent and their global row
    indices; equal to a full sort of each latent's column by (−a, row) (ties: the earlier row first).
``LatentHistogram(n_latents)``          counts of a_i > 0 in fixed half-octave bins (``HISTOGRAM_EDGES``).
Both take a batch of codes as anything ``coo_codes`` reads (dense (m, N), torch sparse, COO), are mergeable
(``merge``, ``state_dict`` / ``from_state_dict``: ``saegeo.distributed.merge_across_ranks`` works) and exact.
Pure math on tensors: no I/O, no models.
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

__all__ = ["LatentTopK", "LatentHistogram", "HISTOGRAM_EDGES", "BINS_PER_OCTAVE", "histogram_bins"]

BINS_PER_OCTAVE = 2  # edges 2^e and 1.5·2^e: read off a float32's exponent and first mantissa bit
_LOW_EXP, _HIGH_EXP = -14, 14
_N_INNER = (_HIGH_EXP - _LOW_EXP) * BINS_PER_OCTAVE  # bins in [2^-14, 2^14)
# [0, 2^-14), then [2^e, 1.5·2^e) and [1.5·2^e, 2^(e+1)) for e = −14 … 13, then [2^14, ∞): all exact in float32
HISTOGRAM_EDGES = np.array(
    [0.0] + [m * 2.0**e for e in range(_LOW_EXP, _HIGH_EXP) for m in (1.0, 1.5)] + [2.0**_HIGH_EXP, np.inf]
)


class LatentTopK:
    """The k largest positive activations of each of ``n_latents`` latents over a stream of code batches,
    with the global index of their rows (batch row j of the t-th batch is ``start`` + rows seen before + j).

    Per batch only the entries above their latent's current k-th value enter (one compare over the batch; a
    dense batch that would let in more than 2k per latent, the first ones, is first cut to its own top k per
    latent, ties kept); those are merged with the latents' kept entries by one stable sort on the int64 key
    (latent, −a), rows in order. State: values (N, k) float32 (0 = empty slot), rows (N, k) int64 (−1 = empty).
    """

    def __init__(self, n_latents: int, k: int, start: int = 0):
        if n_latents < 1 or k < 0:
            raise BadInputError(f"LatentTopK needs n_latents ≥ 1 and k ≥ 0, got {n_latents} and {k}")
        self.n_latents, self.k, self.seen = int(n_latents), int(k), int(start)
        self.values = torch.zeros(self.n_latents, self.k, dtype=torch.float32)
        self.rows = torch.full((self.n_latents, self.k), -1, dtype=torch.long)

    def add(self, codes: Any) -> LatentTopK:
        """Add one batch of codes (its rows are the next rows of the stream): a dense (m, N) tensor is screened
        against the kept k-th values directly (no list of its nonzeros), anything else through ``coo_codes``."""
        if isinstance(codes, Tensor) and codes.layout == torch.strided and codes.ndim == 2:
            return self._add_dense(codes)
        n_rows, rows, cols, values = coo_codes(codes)
        start = self.seen
        self.seen += n_rows
        if self.k == 0 or values.numel() == 0:
            return self
        rows, cols = rows.to("cpu", torch.long), cols.to("cpu", torch.long)
        values = values.detach().to("cpu", torch.float32)
        if int(cols.max()) >= self.n_latents:
            raise BadInputError(f"codes have latent index {int(cols.max())} but LatentTopK has N = {self.n_latents}")
        enter = values > self.values[:, -1].contiguous()[cols]  # beats the k-th kept (0 while a slot is empty)
        if bool(enter.any()):
            rows, cols, values = rows[enter], cols[enter], values[enter]
            if rows.numel() > 1 and bool((rows[1:] < rows[:-1]).any()):  # COO of an unknown order: rows first
                by_row = torch.argsort(rows, stable=True)
                rows, cols, values = rows[by_row], cols[by_row], values[by_row]
            # the batch's rows come after every kept row, in order: a stable sort keeps ties in row order
            self._merge_entries(cols, values, rows + start)
        return self

    def _add_dense(self, codes: Float[Tensor, "m N"]) -> LatentTopK:
        if codes.shape[1] != self.n_latents:
            raise BadInputError(f"codes have {codes.shape[1]} latents but LatentTopK has N = {self.n_latents}")
        start = self.seen
        self.seen += codes.shape[0]
        if self.k == 0 or codes.shape[0] == 0:
            return self
        codes = codes.detach().to("cpu", torch.float32)
        enter = codes > self.values[:, -1]  # beats the k-th kept (0 while a slot is empty)
        if int(enter.sum()) > 2 * self.k * self.n_latents:  # the first batches: cut to the batch's own top k
            kth = codes.topk(min(self.k, codes.shape[0]), dim=0).values[-1]
            enter &= codes >= kth  # ≥: every entry tied with a latent's k-th stays, the sort decides by row
        rows, cols = enter.nonzero(as_tuple=True)  # row-major: rows in increasing order
        if rows.numel():
            self._merge_entries(cols, codes[rows, cols], rows + start)
        return self

    def _merge_entries(self, cols: Tensor, values: Tensor, rows: Tensor, *, rows_after_kept: bool = True) -> None:
        """Merge entries (latent, a > 0, row) into the kept ones: one stable sort by (latent, −a), ties in row
        order, the first k of each latent kept. ``rows_after_kept``: the entries' rows are in increasing order and
        after every kept row (a stream), else everything is put in row order first (a merge)."""
        touched = torch.unique(cols)
        k = self.k
        kept_v, kept_r = self.values[touched], self.rows[touched]
        occupied = kept_r.flatten() >= 0
        all_c = torch.cat([touched.repeat_interleave(k)[occupied], cols])
        all_v = torch.cat([kept_v.flatten()[occupied], values])
        all_r = torch.cat([kept_r.flatten()[occupied], rows])
        if not rows_after_kept:
            by_row = torch.argsort(all_r, stable=True)
            all_c, all_v, all_r = all_c[by_row], all_v[by_row], all_r[by_row]
        # a > 0 in float32: its bit pattern as an int increases with a, so (latent, −a) is one int64 key
        key = (all_c << 31) | (0x7FFFFFFF - all_v.contiguous().view(torch.int32).to(torch.long))
        order = torch.argsort(key, stable=True)
        c_sorted = all_c[order]
        slot_of = torch.searchsorted(touched, c_sorted)
        first = torch.searchsorted(c_sorted, touched)
        rank = torch.arange(len(order)) - first[slot_of]
        keep = rank < k
        new_v = torch.zeros(len(touched), k, dtype=torch.float32)
        new_r = torch.full((len(touched), k), -1, dtype=torch.long)
        slot, place, src = slot_of[keep], rank[keep], order[keep]
        new_v[slot, place] = all_v[src]
        new_r[slot, place] = all_r[src]
        self.values[touched], self.rows[touched] = new_v, new_r

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
            cols = torch.arange(self.n_latents).repeat_interleave(self.k)[filled.flatten()]
            self._merge_entries(cols, other.values[filled], other.rows[filled], rows_after_kept=False)
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
    bits = values.to(torch.float32).contiguous().view(torch.int32) >> 22
    return (bits.to(torch.long) - 2 * (127 + _LOW_EXP)).clamp_(-1, _N_INNER) + 1


class LatentHistogram:
    """Counts of each latent's nonzero activations a_i > 0 in the fixed half-octave bins ``HISTOGRAM_EDGES``:
    [0, 2^-14), [2^e, 1.5·2^e), [1.5·2^e, 2^(e+1)) up to 2^14, [2^14, ∞) (a in float32). State (N, B) int64."""

    def __init__(self, n_latents: int):
        self.n_latents = int(n_latents)
        self.counts = torch.zeros(self.n_latents, len(HISTOGRAM_EDGES) - 1, dtype=torch.long)

    def add(self, codes: Any) -> LatentHistogram:
        _, _, cols, values = coo_codes(codes)
        values, cols = values.detach().to("cpu", torch.float32), cols.to("cpu", torch.long)
        if bool((values <= 0).any()):  # nonzeros: only negative codes to drop
            cols, values = cols[values > 0], values[values > 0]
        if values.numel():
            flat = cols * self.counts.shape[1] + histogram_bins(values)
            if self.counts.numel() <= 1 << 23:  # a dense count of all the cells beats a scattered add
                self.counts += torch.bincount(flat, minlength=self.counts.numel()).view_as(self.counts)
            else:
                self.counts.view(-1).index_add_(0, flat, torch.ones_like(flat))
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
