"""Seeded uniform row samples of a stream that merge exactly across chunkings and ranks.

Public API
----------
``row_priority(seed, index) -> uint64 array``  a fixed pseudo-random priority per (seed, global row index).
``RowReservoir(k, d, seed, start=0, dtype=torch.float32)``  bottom-k sample of the rows of a stream:
    ``add(x, eligible=None)``, ``merge(other)``, ``state_dict()`` / ``from_state_dict(sd)``, ``sample()``.

The report's pairwise-cosine histogram and the GeometryAccumulator's sample behind the null test's sd
(``saegeo.geometry.accumulate``) both use it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from jaxtyping import Float
from torch import Tensor


def row_priority(seed: int, index: np.ndarray) -> np.ndarray:
    """A fixed pseudo-random uint64 per (seed, global row index): splitmix64 of index·φ + splitmix64(seed)."""

    def splitmix(z: np.ndarray) -> np.ndarray:
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))

    with np.errstate(over="ignore"):  # uint64 arithmetic wraps by design
        salt = splitmix(np.array([seed % 2**64], dtype=np.uint64) + np.uint64(0x9E3779B97F4A7C15))
        return splitmix(index.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15) + salt)


class RowReservoir:
    """Uniform sample of k rows from a stream, seeded; memory k·d.

    Bottom-k sampling: keep the k rows with the smallest priority h(seed, global row index). A row's
    priority depends only on its position in the stream, never on how the stream was cut, so partial
    samples merge exactly: ranks that each stream part of a store (torch.distributed, ``start`` = the
    global index of their first row) end with the single-process sample, its rows in priority order.
    A simple random sample without replacement of the eligible rows (k of them, or all when fewer).
    """

    def __init__(self, k: int, d: int, seed: int, start: int = 0, dtype: torch.dtype = torch.float32):
        self.k, self.d, self.seed, self.seen = int(k), int(d), int(seed), int(start)
        self._rows = torch.zeros(0, d, dtype=dtype)
        self._priority = np.zeros(0, dtype=np.uint64)
        # candidates not yet sorted in: kept until they are k more than the sample (then one sort), so a stream
        # costs O(rows admitted) copies and O(n/k) sorts instead of a sort of k rows per batch
        self._pending: list[tuple[np.ndarray, Tensor]] = []
        self._n_pending = 0

    @property
    def rows(self) -> Tensor:
        """The sampled rows (≤ k), in priority order."""
        self._compact()
        return self._rows

    @rows.setter
    def rows(self, value: Tensor) -> None:
        self._compact()
        self._rows = value

    @property
    def dtype(self) -> torch.dtype:
        return self._rows.dtype

    @property
    def priority(self) -> np.ndarray:
        self._compact()
        return self._priority

    def _compact(self) -> None:
        """Sort the pending candidates in: the k smallest priorities of all, their rows gathered once."""
        if not self._pending:
            return
        parts = [(self._priority, self._rows)] + self._pending
        self._pending, self._n_pending = [], 0
        priority = np.concatenate([p for p, _ in parts])
        order = np.argsort(priority, kind="stable")[: self.k]
        source = np.repeat(np.arange(len(parts)), [len(p) for p, _ in parts])[order]
        offset = np.cumsum([0] + [len(p) for p, _ in parts])
        rows = torch.empty(len(order), self.d, dtype=self._rows.dtype)
        for j, (_, part) in enumerate(parts):
            at = np.nonzero(source == j)[0]
            if len(at):
                rows[torch.from_numpy(at)] = part[torch.from_numpy(order[at] - offset[j])].to(rows.dtype)
        self._priority, self._rows = priority[order], rows

    def add(self, x: Float[Tensor, "m d"], eligible: Tensor | None = None) -> None:
        """Offer the next m rows of the stream (global indices seen .. seen + m − 1); ``eligible`` (bool, m):
        only those rows may enter (the others still take their index)."""
        m = x.shape[0]
        priority = row_priority(self.seed, np.arange(self.seen, self.seen + m, dtype=np.uint64))
        self.seen += m
        if self.k == 0 or m == 0:
            return
        take = np.ones(m, dtype=bool) if eligible is None else eligible.cpu().numpy().copy()  # not a view of it
        if len(self._priority) == self.k:  # full: only rows that beat the k-th of the last sort can enter
            take &= priority < self._priority[-1]
        if not take.any():
            return
        everything = bool(take.all())
        rows = (x if everything else x[torch.from_numpy(take).to(x.device)]).detach().to("cpu", self._rows.dtype)
        self._pending.append((priority[take], rows))
        self._n_pending += len(rows)
        if self._n_pending >= max(self.k, 1):
            self._compact()  # copies the rows it keeps
        elif everything and rows.data_ptr() == x.data_ptr():
            self._pending[-1] = (self._pending[-1][0], rows.clone())  # x itself: the caller may reuse it

    def _keep(self, priority: np.ndarray, rows: Tensor) -> None:
        order = np.argsort(priority, kind="stable")[: self.k]  # sorted: the k smallest, in priority order
        self._priority, self._rows = priority[order], rows[torch.from_numpy(order)]

    def merge(self, other: RowReservoir) -> RowReservoir:
        """The sample of both streams together (their rows must have distinct global indices)."""
        self._keep(
            np.concatenate([self.priority, other.priority]), torch.cat([self.rows, other.rows.to(self._rows.dtype)])
        )
        self.seen = max(self.seen, other.seen)
        return self

    def state_dict(self) -> dict[str, Any]:
        return {
            "k": self.k,
            "d": self.d,
            "seed": self.seed,
            "seen": self.seen,
            "rows": self.rows,
            "priority": self.priority,
        }

    @classmethod
    def from_state_dict(cls, sd: Mapping[str, Any]) -> RowReservoir:
        rows = torch.as_tensor(sd["rows"])
        res = cls(int(sd["k"]), int(sd["d"]), int(sd["seed"]), int(sd["seen"]), dtype=rows.dtype)
        res._rows, res._priority = rows.clone(), np.asarray(sd["priority"], dtype=np.uint64).copy()
        return res

    def sample(self) -> Tensor:
        return self.rows
