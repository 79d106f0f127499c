"""Per-latent streaming statistics of SAE codes for latent cards: the top-k rows of every latent and a
log-binned histogram of its nonzero activations -- in memory k·N + N·B, independent of the number of rows.

``LatentTopK(n_latents, k, start=0)``   the k largest activations a_i > 0 of every latent and their global row
    indices; equal to a full sort of each latent's column by (−a, row) (ties: the earlier row first).
``LatentHistogram(n_latents)``          counts of a_i > 0 in fixed log-spaced bins (``HISTOGRAM_EDGES``).
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

__all__ = ["LatentTopK", "LatentHistogram", "HISTOGRAM_EDGES", "BINS_PER_DECADE"]

BINS_PER_DECADE = 8
_LOW_EXP, _HIGH_EXP = -4, 4
# [0, 1e-4), then 8 log-spaced bins per decade up to 1e4, then [1e4, ∞)
HISTOGRAM_EDGES = np.concatenate(
    [[0.0], 10.0 ** np.linspace(_LOW_EXP, _HIGH_EXP, (_HIGH_EXP - _LOW_EXP) * BINS_PER_DECADE + 1), [np.inf]]
)


class LatentTopK:
    """The k largest positive activations of each of ``n_latents`` latents over a stream of code batches,
    with the global index of their rows (batch row j of the t-th batch is ``start`` + rows seen before + j).

    Per batch only the entries above their latent's current k-th value enter (one gather and compare over the
    nonzero codes); those are merged with the latents' kept entries by one lexicographic sort on
    (latent, −a, row). State: values (N, k) float32 (0 = empty slot) and rows (N, k) int64 (−1 = empty).
    """

    def __init__(self, n_latents: int, k: int, start: int = 0):
        if n_latents < 1 or k < 0:
            raise BadInputError(f"LatentTopK needs n_latents ≥ 1 and k ≥ 0, got {n_latents} and {k}")
        self.n_latents, self.k, self.seen = int(n_latents), int(k), int(start)
        self.values = torch.zeros(self.n_latents, self.k, dtype=torch.float32)
        self.rows = torch.full((self.n_latents, self.k), -1, dtype=torch.long)

    def add(self, codes: Any) -> LatentTopK:
        """Add one batch of codes (its rows are the next rows of the stream)."""
        n_rows, rows, cols, values = coo_codes(codes)
        start = self.seen
        self.seen += n_rows
        if self.k == 0 or values.numel() == 0:
            return self
        rows, cols = rows.to("cpu", torch.long), cols.to("cpu", torch.long)
        values = values.detach().to("cpu", torch.float32)
        if int(cols.max()) >= self.n_latents:
            raise BadInputError(f"codes have latent index {int(cols.max())} but LatentTopK has N = {self.n_latents}")
        enter = values > self.values[cols, -1]  # beats the k-th kept (0 while a slot is empty): a > 0 only
        if bool(enter.any()):
            self._merge_entries(cols[enter], values[enter], rows[enter] + start)
        return self

    def _merge_entries(self, cols: Tensor, values: Tensor, rows: Tensor) -> None:
        touched = torch.unique(cols)
        k = self.k
        kept_v, kept_r = self.values[touched], self.rows[touched]
        occupied = kept_r.flatten() >= 0
        all_c = torch.cat([touched.repeat_interleave(k)[occupied], cols]).numpy()
        all_v = torch.cat([kept_v.flatten()[occupied], values]).numpy()
        all_r = torch.cat([kept_r.flatten()[occupied], rows]).numpy()
        order = np.lexsort((all_r, -all_v, all_c))  # by latent, then largest a, then earliest row
        c_sorted = all_c[order]
        slot_of = np.searchsorted(touched.numpy(), c_sorted)
        first = np.searchsorted(c_sorted, touched.numpy(), side="left")
        rank = np.arange(len(order)) - first[slot_of]
        keep = rank < k
        new_v = torch.zeros(len(touched), k, dtype=torch.float32)
        new_r = torch.full((len(touched), k), -1, dtype=torch.long)
        s, r = torch.from_numpy(slot_of[keep]), torch.from_numpy(rank[keep])
        new_v[s, r] = torch.from_numpy(all_v[order][keep])
        new_r[s, r] = torch.from_numpy(all_r[order][keep])
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
            self._merge_entries(cols, other.values[filled], other.rows[filled])
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


class LatentHistogram:
    """Counts of each latent's nonzero activations a_i > 0 in the fixed bins ``HISTOGRAM_EDGES``:
    [0, 1e-4), ``BINS_PER_DECADE`` log-spaced bins per decade up to 1e4, [1e4, ∞). State (N, B) int64."""

    def __init__(self, n_latents: int):
        self.n_latents = int(n_latents)
        self.counts = torch.zeros(self.n_latents, len(HISTOGRAM_EDGES) - 1, dtype=torch.long)
        self._inner = torch.from_numpy(HISTOGRAM_EDGES[1:-1]).to(torch.float64)

    def add(self, codes: Any) -> LatentHistogram:
        _, _, cols, values = coo_codes(codes)
        values = values.detach().to("cpu", torch.float64)
        positive = values > 0
        cols, values = cols.to("cpu", torch.long)[positive], values[positive]
        if values.numel():
            bins = torch.bucketize(values, self._inner, right=True)  # edges[b] ≤ a < edges[b + 1]
            flat = cols * self.counts.shape[1] + bins
            self.counts.view(-1).index_add_(0, flat, torch.ones_like(flat))
        return self

    def histogram(self, latent: int, max_value: float | None = None) -> dict[str, list]:
        """{"edges", "counts"} of one latent trimmed to its first..last occupied bin; the open last edge (∞) is
        replaced by ``max_value`` (e.g. its largest activation) or 10× the previous edge. Empty when it never fired."""
        counts = self.counts[latent]
        occupied = counts.nonzero().flatten()
        if occupied.numel() == 0:
            return {"edges": [], "counts": []}
        lo, hi = int(occupied[0]), int(occupied[-1])
        edges = HISTOGRAM_EDGES[lo : hi + 2].tolist()
        if not np.isfinite(edges[-1]):
            edges[-1] = float(max_value) if max_value is not None and max_value >= edges[-2] else 10.0 * edges[-2]
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
