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
        # The kept rows and their priorities in slot order; once k are kept, a row that enters overwrites the slot
        # of the one it pushes out (only entering rows are copied: O(k·log(n/k)) row copies for a stream of n).
        # ``rows`` puts them in priority order when read (the order the sums over the sample are taken in).
        self._rows = torch.zeros(0, d, dtype=dtype)
        self._priority = np.zeros(0, dtype=np.uint64)
        self._in_order = True
        # rows offered while fewer than k are kept, not yet sorted in
        self._filling: list[tuple[np.ndarray, Tensor]] = []
        self._n_filling = 0

    @property
    def rows(self) -> Tensor:
        """The sampled rows (≤ k), in priority order."""
        self._sort()
        return self._rows

    @rows.setter
    def rows(self, value: Tensor) -> None:
        self._sort()
        self._rows = value

    @property
    def dtype(self) -> torch.dtype:
        return self._rows.dtype

    @property
    def priority(self) -> np.ndarray:
        self._sort()
        return self._priority

    def _sort(self) -> None:
        """Put the kept rows in priority order (one gather, only after rows entered by replacement)."""
        self._settle()
        if not self._in_order:
            order = np.argsort(self._priority, kind="stable")
            self._priority, self._rows = self._priority[order], self._rows[torch.from_numpy(order)]
            self._in_order = True

    def add(self, x: Float[Tensor, "m d"], eligible: Tensor | None = None) -> None:
        """Offer the next m rows of the stream (global indices seen .. seen + m − 1); ``eligible`` (bool, m):
        only those rows may enter (the others still take their index)."""
        m = x.shape[0]
        priority = row_priority(self.seed, np.arange(self.seen, self.seen + m, dtype=np.uint64))
        self.seen += m
        if self.k == 0 or m == 0:
            return
        take = np.ones(m, dtype=bool) if eligible is None else eligible.cpu().numpy().copy()  # not a view of it
        n_kept = len(self._priority) + self._n_filling
        if n_kept == self.k:  # full: only rows that beat the largest kept priority can enter
            take &= priority < self._priority.max()
        candidates = np.nonzero(take)[0]
        if len(candidates) == 0:
            return
        if n_kept < self.k:  # filling: set aside, sorted in once k are offered (or when read)
            if len(candidates) > self.k:  # only this batch's k smallest can end in the sample: copy no more
                candidates = np.sort(candidates[np.argsort(priority[candidates], kind="stable")[: self.k]])
            rows = x if len(candidates) == m else x[torch.from_numpy(candidates).to(x.device)]
            rows = rows.detach().to("cpu", self._rows.dtype, copy=True)  # a copy: the caller may reuse x
            self._filling.append((priority[candidates], rows))
            self._n_filling += len(candidates)
            if n_kept + len(candidates) >= self.k:
                self._settle()
            return
        # full: the k smallest of kept ∪ candidates (stable: on a tie the kept row stays); each candidate that makes
        # it takes the slot of a kept row that does not
        everything = np.concatenate([self._priority, priority[candidates]])
        order = np.argsort(everything, kind="stable")
        entering = order[: self.k]
        entering = entering[entering >= n_kept] - n_kept
        if len(entering) == 0:
            return
        leaving = order[self.k :]
        leaving = leaving[leaving < n_kept]
        source = torch.from_numpy(candidates[entering]).to(x.device)
        self._rows[torch.from_numpy(leaving)] = x[source].detach().to("cpu", self._rows.dtype)
        self._priority[leaving] = priority[candidates[entering]]
        self._in_order = False

    def _settle(self) -> None:
        """Sort the rows set aside while filling in: the k smallest priorities of all, in priority order."""
        if self._filling:
            parts = ([(self._priority, self._rows)] if len(self._priority) else []) + self._filling
            self._filling, self._n_filling = [], 0
            if len(parts) == 1:  # one batch offered exactly what is kept: no copy, sorted when read
                self._priority, self._rows = parts[0]
                self._in_order = len(self._priority) < 2 or bool(np.all(self._priority[1:] >= self._priority[:-1]))
            else:
                self._keep(np.concatenate([p for p, _ in parts]), torch.cat([r for _, r in parts]))

    def _keep(self, priority: np.ndarray, rows: Tensor) -> None:
        order = np.argsort(priority, kind="stable")[: self.k]  # sorted: the k smallest, in priority order
        self._priority, self._rows = priority[order], rows[torch.from_numpy(order)]
        self._in_order = True

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
        res._in_order = bool(np.all(res._priority[1:] >= res._priority[:-1]))
        return res

    def sample(self) -> Tensor:
        return self.rows
