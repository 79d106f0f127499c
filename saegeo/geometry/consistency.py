"""Seed and run consistency of two dictionaries: the optimal one-to-one matching of their latents, the shared
fraction at a threshold, pairwise MCC, and the geometry of what does not match. Pure math: no I/O, no models.

Definitions (as the field measures them)
----------------------------------------
s_ij = cos(a_i, b_j) = a_i·b_j/(‖a_i‖‖b_j‖) between decoder row i of dictionary A (N_A rows) and row j of B
(N_B rows), signed (an antipodal pair is not a match); 0 where a row is zero.

* matching π: the one-to-one assignment of m = min(N_A, N_B) pairs maximising Σ_i s_iπ(i) (the Hungarian
  problem on the cost 1 − s, as Song et al. 2025, "Position: Mechanistic Interpretability Should Prioritize
  Feature Consistency in SAEs", arXiv:2505.20254, and Paulo & Belrose 2025, "Sparse Autoencoders Trained on the
  Same Data Learn Different Features", arXiv:2501.16615).
* PW-MCC = (1/m) Σ_i s_iπ(i), the mean matched cosine: Song et al.'s pairwise dictionary mean correlation
  coefficient (their code: ``1 − cost[rows, cols].sum()/len(rows)`` with ``cost = 1 − Â₁Â₂ᵀ``, signed cosines).
* shared fraction at t: #{matched pairs with s ≥ t}/N_A (and /N_B): Paulo & Belrose count a latent as shared
  when its matched cosine exceeds a threshold (their 0.7; they also ask the encoders to agree, which
  ``encoder_cosines`` of the matched pairs lets a caller check).
* with activations, s_ij is instead the Pearson correlation of the two latents' activations over the same
  tokens (``CodeCorrelationAccumulator``): the classical mean correlation coefficient of identifiability
  studies, on the same Hungarian problem.

What is exact
-------------
``match_latents`` solves the dense problem exactly (scipy's ``linear_sum_assignment`` on the float64 N_A × N_B
matrix) when N_A·N_B ≤ ``exact_max_entries``. Beyond it (65,536² float32 cosines would be 17 GB) it never forms
the matrix: a blockwise pass keeps each row's k most similar rows of the other dictionary, both ways (exact: float32
tiles screen k + 4 survivors, rescored in float64); the maximum-weight matching *on that candidate graph* is
solved exactly (``scipy.sparse.csgraph.min_weight_full_bipartite_matching``); rows it leaves unmatched are
paired by an exact assignment among themselves (or, when even that is too large, in index order); last,
mutual best pairs the matching split are swapped in wherever that raises Σ s. The result is a feasible matching, so its MCC is a lower bound of the dense optimum; ``mcc_upper_bound`` =
min(Σ_i max_j s_ij, Σ_j max_i s_ij)/m (a feasible dual of the assignment LP) bounds it from above, and both are
reported. The shared set at a high threshold is the dense optimum's in the planted tests
(tests/geometry/test_consistency.py); where a latent has two counterparts above the threshold (``ambiguous`` counts
them) the two may differ.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from jaxtyping import Float, Int
from torch import Tensor

from saegeo.errors import BadInputError
from saegeo.geometry.accumulate import anisotropy_from_unit_mean
from saegeo.geometry.dictionary import DEFAULT_BLOCK_ROWS, row_norms

__all__ = [
    "EXACT_MAX_ENTRIES",
    "LatentMatching",
    "cosine_matrix",
    "cross_top_k",
    "match_latents",
    "match_similarity",
    "encoder_cosines",
    "set_geometry",
    "CodeCorrelationAccumulator",
]

EXACT_MAX_ENTRIES = 4096 * 4096  # the dense matrix (float64, 128 MiB) and scipy's assignment of it
DEFAULT_CANDIDATES = 8  # k nearest rows of the other dictionary kept per row, both ways


def _check(rows: Tensor, what: str) -> None:
    if rows.ndim != 2 or rows.shape[0] < 1:
        raise BadInputError(f"{what} needs a 2-D (N, d) matrix of rows, got shape {tuple(rows.shape)}")


def _inverse_norms(rows: Tensor) -> Tensor:
    norms = row_norms(rows)
    return torch.where(norms > 0, 1.0 / norms.clamp_min(1e-300), 0.0)


def cosine_matrix(a: Float[Tensor, "Na d"], b: Float[Tensor, "Nb d"]) -> Float[Tensor, "Na Nb"]:
    """s_ij = a_i·b_j/(‖a_i‖‖b_j‖) in float64 (0 where a row is zero): the dense matrix, for small dictionaries."""
    _check(a, "cosine_matrix")
    _check(b, "cosine_matrix")
    ua = a.to("cpu", torch.float64) * _inverse_norms(a)[:, None]
    ub = b.to("cpu", torch.float64) * _inverse_norms(b)[:, None]
    return ua @ ub.T


def cross_top_k(
    a: Float[Tensor, "Na d"],
    b: Float[Tensor, "Nb d"],
    k: int = DEFAULT_CANDIDATES,
    *,
    block_rows: int = DEFAULT_BLOCK_ROWS,
) -> tuple[Int[Tensor, "Na k"], Float[Tensor, "Na k"], Int[Tensor, "Nb k"], Float[Tensor, "Nb k"]]:
    """The k rows of B most similar to each row of A, and the k rows of A most similar to each row of B, by
    s_ij = cos(a_i, b_j), in one blockwise pass (memory (N_A + N_B)·(k + 4) + B² + 2·B·d, never N_A × N_B).

    Float32 tiles of unit rows keep a running top-(k + 4) per row and per column; the survivors are rescored in
    float64 and the best k kept, so rounding cannot drop a row closer than 4 places to the k-th. Returns
    (idx_ab, cos_ab, idx_ba, cos_ba), best first; k is capped at the other side's size."""
    _check(a, "cross_top_k")
    _check(b, "cross_top_k")
    if a.shape[1] != b.shape[1]:
        raise BadInputError(f"the dictionaries differ in d: {a.shape[1]} and {b.shape[1]}")
    if k < 1:
        raise BadInputError(f"cross_top_k needs k ≥ 1, got {k}")
    n_a, n_b = a.shape[0], b.shape[0]
    inv_a, inv_b = _inverse_norms(a), _inverse_norms(b)
    screen_a, screen_b = min(k + 4, n_b), min(k + 4, n_a)
    best_a = torch.full((n_a, screen_a), -torch.inf)
    idx_a = torch.zeros((n_a, screen_a), dtype=torch.long)
    best_b = torch.full((n_b, screen_b), -torch.inf)
    idx_b = torch.zeros((n_b, screen_b), dtype=torch.long)

    def unit(rows: Tensor, inv: Tensor, s: int) -> Tensor:
        return (rows[s : s + block_rows].to("cpu", torch.float32) * inv[s : s + block_rows, None].float()).contiguous()

    for i0 in range(0, n_a, block_rows):
        ua = unit(a, inv_a, i0)
        run_c, run_i = best_a[i0 : i0 + block_rows], idx_a[i0 : i0 + block_rows]
        for j0 in range(0, n_b, block_rows):
            tile = ua @ unit(b, inv_b, j0).T
            c, j = tile.topk(min(screen_a, tile.shape[1]), dim=1)
            merged_c, merged_i = torch.cat([run_c, c], 1), torch.cat([run_i, j + j0], 1)
            top = merged_c.topk(screen_a, dim=1).indices
            run_c, run_i = merged_c.gather(1, top), merged_i.gather(1, top)
            c, i = tile.T.topk(min(screen_b, tile.shape[0]), dim=1)  # the same tile serves B's rows
            col_c, col_i = best_b[j0 : j0 + block_rows], idx_b[j0 : j0 + block_rows]
            merged_c, merged_i = torch.cat([col_c, c], 1), torch.cat([col_i, i + i0], 1)
            top = merged_c.topk(screen_b, dim=1).indices
            best_b[j0 : j0 + block_rows], idx_b[j0 : j0 + block_rows] = merged_c.gather(1, top), merged_i.gather(1, top)
        best_a[i0 : i0 + block_rows], idx_a[i0 : i0 + block_rows] = run_c, run_i

    def rescore(rows: Tensor, inv: Tensor, other: Tensor, inv_other: Tensor, idx: Tensor, keep: int) -> tuple:
        exact = torch.empty(idx.shape, dtype=torch.float64)
        for s in range(0, idx.shape[0], 512):
            w = rows[s : s + 512].to("cpu", torch.float64)
            v = other[idx[s : s + 512]].to("cpu", torch.float64)
            exact[s : s + 512] = torch.einsum("bd,bsd->bs", w, v) * inv[s : s + 512, None] * inv_other[idx[s : s + 512]]
        # best first, ties by the smaller index
        by_index = idx.argsort(dim=1)
        exact, idx = exact.gather(1, by_index), idx.gather(1, by_index)
        order = exact.argsort(dim=1, descending=True, stable=True)[:, :keep]
        return idx.gather(1, order), exact.gather(1, order)

    ia, ca = rescore(a, inv_a, b, inv_b, idx_a, min(k, n_b))
    ib, cb = rescore(b, inv_b, a, inv_a, idx_b, min(k, n_a))
    return ia, ca, ib, cb


@dataclass
class LatentMatching:
    """A one-to-one matching of A's latents to B's (``match_latents`` / ``match_similarity``)."""

    index_a: Int[Tensor, " m"]  # matched pairs (index_a[p], index_b[p]), sorted by index_a
    index_b: Int[Tensor, " m"]
    similarity: Float[Tensor, " m"]  # s of each matched pair, float64
    n_a: int
    n_b: int
    method: str  # "exact" (dense Hungarian) | "candidates" (see the module docstring)
    best_a: Float[Tensor, " Na"]  # max_j s_ij of each A row (exact in both methods)
    best_b: Float[Tensor, " Nb"]  # max_i s_ij of each B row
    second_a: Float[Tensor, " Na"] | None = None  # the second-best s of each A row (None: one B row only)
    second_b: Float[Tensor, " Nb"] | None = None
    k: int | None = None  # candidates per row ("candidates" method)
    n_candidate_edges: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    edges: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None  # the candidate graph (i, j, s), if one was built

    @property
    def m(self) -> int:
        return min(self.n_a, self.n_b)

    @property
    def mcc(self) -> float:
        """(1/m) Σ s over the matched pairs (PW-MCC for decoder cosines)."""
        return float(self.similarity.sum()) / self.m

    @property
    def mcc_upper_bound(self) -> float:
        """min(Σ_i max_j s_ij, Σ_j max_i s_ij)/m, over the smaller side's rows: ≥ the dense optimum's MCC."""
        rows = self.best_a if self.n_a <= self.n_b else self.best_b
        return float(rows.sum()) / self.m

    def shared(self, threshold: float) -> Tensor:
        """Mask over the matched pairs with s ≥ threshold."""
        return self.similarity >= threshold

    def ambiguous(self, threshold: float) -> int:
        """Rows (either side) with two rows of the other side at s ≥ threshold: where a matching must choose."""
        count = 0
        for second in (self.second_a, self.second_b):
            if second is not None:
                count += int((second >= threshold).sum())
        return count

    def summary(self, threshold: float) -> dict[str, Any]:
        shared = int(self.shared(threshold).sum())
        return {
            "method": self.method,
            "n_a": self.n_a,
            "n_b": self.n_b,
            "n_matched": int(self.index_a.numel()),
            "threshold": threshold,
            "n_shared": shared,
            "shared_fraction_a": shared / self.n_a,
            "shared_fraction_b": shared / self.n_b,
            "mcc": self.mcc,
            "mcc_upper_bound": self.mcc_upper_bound,
            "mean_best_a": float(self.best_a.mean()),
            "mean_best_b": float(self.best_b.mean()),
            "ambiguous": self.ambiguous(threshold),
            "candidates_per_row": self.k,
            "n_candidate_edges": self.n_candidate_edges,
            **self.extra,
        }


def _second(values: Tensor) -> Tensor | None:
    """The second-largest value of each row (None with one column)."""
    if values.shape[1] < 2:
        return None
    return values.topk(2, dim=1).values[:, 1]


def match_similarity(similarity: Float[Tensor, "Na Nb"] | np.ndarray) -> LatentMatching:
    """The exact assignment maximising Σ s_iπ(i) on a dense similarity matrix (scipy's Hungarian solver)."""
    from scipy.optimize import linear_sum_assignment

    s = torch.as_tensor(similarity, dtype=torch.float64)
    if s.ndim != 2 or min(s.shape) < 1:
        raise BadInputError(f"match_similarity needs a 2-D (N_A, N_B) matrix, got shape {tuple(s.shape)}")
    if not bool(torch.isfinite(s).all()):
        raise BadInputError("match_similarity: the similarity matrix holds NaN or inf")
    rows, cols = linear_sum_assignment(s.numpy(), maximize=True)
    ia, ib = torch.from_numpy(rows).long(), torch.from_numpy(cols).long()
    return LatentMatching(
        index_a=ia,
        index_b=ib,
        similarity=s[ia, ib],
        n_a=s.shape[0],
        n_b=s.shape[1],
        method="exact",
        best_a=s.max(dim=1).values,
        best_b=s.max(dim=0).values,
        second_a=_second(s),
        second_b=_second(s.T),
    )


def _candidate_matching(
    n_a: int, n_b: int, ei: np.ndarray, ej: np.ndarray, es: np.ndarray, floor: float = 0.0
) -> tuple[np.ndarray, np.ndarray]:
    """The matching maximising Σ (s − floor) over the candidate edges (i, j, s), rows free to stay unmatched.

    A full-matching solver needs a full matching to exist: left = A ∪ B', right = B ∪ A' (B', A' one dummy per
    row). Edges: a_i–b_j cost 2 − s; its mirror b'_j–a'_i cost 1; a_i–a'_i and b'_j–b_j cost (3 − floor)/2
    (unmatched). A matched pair costs 3 − s, two unmatched rows 3 − floor, so the minimum-cost full matching
    maximises Σ (s − floor) over the real pairs: a pair below the floor is worth less than leaving both rows to
    the completion (whose pairs are near-orthogonal, s ≈ 0: hence floor 0). Costs stay ≥ 1: no zero weight
    (an absent edge in a sparse matrix)."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import min_weight_full_bipartite_matching

    size = n_a + n_b
    unmatched = (3.0 - floor) / 2
    left = np.concatenate([ei, n_a + ej, np.arange(n_a), n_a + np.arange(n_b)])
    right = np.concatenate([ej, n_b + ei, n_b + np.arange(n_a), np.arange(n_b)])
    cost = np.concatenate([2.0 - es, np.ones(len(es)), np.full(n_a, unmatched), np.full(n_b, unmatched)])
    graph = coo_matrix((cost, (left, right)), shape=(size, size)).tocsr()
    rows, cols = min_weight_full_bipartite_matching(graph)
    real = (rows < n_a) & (cols < n_b)
    return rows[real], cols[real]


def candidate_edges(
    idx_ab: Tensor, cos_ab: Tensor, idx_ba: Tensor, cos_ba: Tensor
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The union of both directions' top-k candidates (``cross_top_k``) as edges (i, j, s), each once, sorted by
    the key i·N_B + j."""
    n_a, n_b = idx_ab.shape[0], idx_ba.shape[0]
    ei = torch.cat([torch.arange(n_a).repeat_interleave(idx_ab.shape[1]), idx_ba.flatten()])
    ej = torch.cat([idx_ab.flatten(), torch.arange(n_b).repeat_interleave(idx_ba.shape[1])])
    es = torch.cat([cos_ab.flatten(), cos_ba.flatten()])
    _, first = np.unique((ei * n_b + ej).numpy(), return_index=True)
    return ei.numpy()[first], ej.numpy()[first], es.numpy()[first]


def match_sparse(
    n_a: int, n_b: int, ei: np.ndarray, ej: np.ndarray, es: np.ndarray, floor: float = 0.0
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The matching maximising Σ (s_ij − floor) over the given edges only (i, j, s), exactly; rows without a
    partner above the floor stay unmatched. Returns the matched (i, j, s), sorted by i."""
    if len(ei) == 0:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, np.zeros(0)
    rows, cols = _candidate_matching(n_a, n_b, np.asarray(ei), np.asarray(ej), np.asarray(es, dtype=np.float64), floor)
    key = np.asarray(ei, dtype=np.int64) * n_b + np.asarray(ej, dtype=np.int64)
    order = np.argsort(key)
    found = order[np.searchsorted(key, rows * n_b + cols, sorter=order)]
    sim = np.asarray(es, dtype=np.float64)[found]
    by_row = np.argsort(rows)
    return rows[by_row], cols[by_row], sim[by_row]


def _swap_in_mutual_best(
    a: Tensor,
    b: Tensor,
    rows: np.ndarray,
    cols: np.ndarray,
    sim: np.ndarray,
    best_of_a: np.ndarray,
    best_of_b: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """2-swaps toward the dense objective: for each mutual best pair (i, j) (j is i's nearest, i is j's) that the
    matching splits, i–j' and i'–j, pair i–j and i'–j' instead when s_ij + s_i'j' > s_ij' + s_i'j. Each swap raises
    Σ s (the dense objective, which the candidate graph's floor and missing edges can miss), so the matching stays
    feasible and its MCC still a lower bound. Repeated until no mutual best pair gains (at most 10 rounds)."""
    inv_a, inv_b = _inverse_norms(a), _inverse_norms(b)
    partner_of_a = np.full(a.shape[0], -1)
    partner_of_a[rows] = cols
    partner_of_b = np.full(b.shape[0], -1)
    partner_of_b[cols] = rows
    value = dict(zip(rows.tolist(), sim.tolist()))  # s of the pair holding A row i

    def cos(i: np.ndarray, j: np.ndarray) -> np.ndarray:
        ti, tj = torch.from_numpy(i), torch.from_numpy(j)
        return ((a[ti].double() * b[tj].double()).sum(1) * inv_a[ti] * inv_b[tj]).numpy()

    mutual = np.nonzero(best_of_b[best_of_a] == np.arange(a.shape[0]))[0]
    swaps = 0
    for _ in range(10):
        i = mutual[partner_of_a[mutual] != best_of_a[mutual]]
        j = best_of_a[i]
        j2, i2 = partner_of_a[i], partner_of_b[j]  # i's and j's current partners (−1: unmatched)
        ok = (j2 >= 0) & (i2 >= 0)
        i, j, j2, i2 = i[ok], j[ok], j2[ok], i2[ok]
        if i.size == 0:
            break
        new = cos(i, j) + cos(i2, j2)
        old = np.array([value[x] for x in i.tolist()]) + np.array([value[x] for x in i2.tolist()])
        gain = new > old + 1e-12
        done = set()
        for p in np.nonzero(gain)[0]:  # one swap per row per round: pairs may share a partner
            x, y, x2, y2 = int(i[p]), int(j[p]), int(i2[p]), int(j2[p])
            if done & {("a", x), ("a", x2), ("b", y), ("b", y2)}:
                continue
            done |= {("a", x), ("a", x2), ("b", y), ("b", y2)}
            partner_of_a[x], partner_of_a[x2] = y, y2
            partner_of_b[y], partner_of_b[y2] = x, x2
            value[x], value[x2] = (
                float(cos(np.array([x]), np.array([y]))[0]),
                float(cos(np.array([x2]), np.array([y2]))[0]),
            )
            swaps += 1
        if not done:
            break
    rows = np.nonzero(partner_of_a >= 0)[0]
    cols = partner_of_a[rows]
    sim = np.array([value[x] for x in rows.tolist()], dtype=np.float64)
    return rows, cols, sim, swaps


def match_latents(
    a: Float[Tensor, "Na d"],
    b: Float[Tensor, "Nb d"],
    *,
    exact_max_entries: int = EXACT_MAX_ENTRIES,
    k: int = DEFAULT_CANDIDATES,
    block_rows: int = DEFAULT_BLOCK_ROWS,
) -> LatentMatching:
    """The one-to-one matching of A's rows to B's maximising Σ cos(a_i, b_π(i)) (see the module docstring):
    exact (dense Hungarian) when N_A·N_B ≤ exact_max_entries, else optimal on the k-nearest candidate graph,
    with the MCC's upper bound reported."""
    _check(a, "match_latents")
    _check(b, "match_latents")
    if a.shape[1] != b.shape[1]:
        raise BadInputError(f"the dictionaries differ in d: {a.shape[1]} and {b.shape[1]}")
    n_a, n_b = a.shape[0], b.shape[0]
    if n_a * n_b <= exact_max_entries:
        return match_similarity(cosine_matrix(a, b))
    ia, ca, ib, cb = cross_top_k(a, b, k, block_rows=block_rows)
    ei, ej, es = candidate_edges(ia, ca, ib, cb)
    rows, cols, sim = match_sparse(n_a, n_b, ei, ej, es)
    n_edges = len(ei)
    free_a = np.setdiff1d(np.arange(n_a), rows)
    free_b = np.setdiff1d(np.arange(n_b), cols)
    n_free = min(len(free_a), len(free_b))
    completion = "none"
    if n_free:
        # the rows the candidate graph could not pair: an exact assignment among themselves when it fits
        if len(free_a) * len(free_b) <= exact_max_entries:
            sub = match_similarity(cosine_matrix(a[torch.from_numpy(free_a)], b[torch.from_numpy(free_b)]))
            fa, fb, fs = free_a[sub.index_a.numpy()], free_b[sub.index_b.numpy()], sub.similarity.numpy()
            completion = "exact"
        else:
            fa, fb = free_a[:n_free], free_b[:n_free]
            fs = (
                (a[torch.from_numpy(fa)].double() * b[torch.from_numpy(fb)].double()).sum(1)
                * _inverse_norms(a)[torch.from_numpy(fa)]
                * _inverse_norms(b)[torch.from_numpy(fb)]
            ).numpy()
            completion = "index order"
        rows, cols, sim = np.concatenate([rows, fa]), np.concatenate([cols, fb]), np.concatenate([sim, fs])
    rows, cols, sim, n_swaps = _swap_in_mutual_best(a, b, rows, cols, sim, ia[:, 0].numpy(), ib[:, 0].numpy())
    order = np.argsort(rows)
    return LatentMatching(
        index_a=torch.from_numpy(rows[order]).long(),
        index_b=torch.from_numpy(cols[order]).long(),
        similarity=torch.from_numpy(np.asarray(sim[order], dtype=np.float64)),
        n_a=n_a,
        n_b=n_b,
        method="candidates",
        best_a=ca[:, 0],
        best_b=cb[:, 0],
        second_a=ca[:, 1] if ca.shape[1] > 1 else None,
        second_b=cb[:, 1] if cb.shape[1] > 1 else None,
        k=k,
        n_candidate_edges=n_edges,
        extra={"n_completed": int(n_free), "completion": completion, "n_swaps": n_swaps},
        edges=(ei, ej, es),
    )


def encoder_cosines(
    enc_a: Float[Tensor, "d Na"], enc_b: Float[Tensor, "d Nb"], index_a: Int[Tensor, " m"], index_b: Int[Tensor, " m"]
) -> Float[Tensor, " m"]:
    """cos(e_i, e'_j) of each matched pair's encoder columns (W_enc[:, i] of A, W_enc[:, j] of B), float64."""
    out = torch.empty(index_a.numel(), dtype=torch.float64)
    for s in range(0, index_a.numel(), 1024):
        x = enc_a[:, index_a[s : s + 1024]].to("cpu", torch.float64)
        y = enc_b[:, index_b[s : s + 1024]].to("cpu", torch.float64)
        denom = x.norm(dim=0) * y.norm(dim=0)
        out[s : s + 1024] = torch.where(denom > 0, (x * y).sum(0) / denom.clamp_min(1e-300), 0.0)
    return out


def set_geometry(
    rows: Float[Tensor, "N d"], members: Int[Tensor, " n"], best_cross: Float[Tensor, " N"]
) -> dict[str, Any]:
    """The geometry of a subset of a dictionary's rows (e.g. its unmatched latents): n; the mean of their best
    cosine to the other dictionary; A = (n‖ū‖² − 1)/(n − 1), the mean pairwise cosine of their unit rows (None
    for n < 2); ‖ū‖; the cosine of ū with the mean unit row of the whole dictionary; their decoder norms' mean."""
    n = int(members.numel())
    if n == 0:
        return {"n": 0}
    norms = row_norms(rows)
    inv = torch.where(norms > 0, 1.0 / norms.clamp_min(1e-300), 0.0)
    unit_sum_all = torch.zeros(rows.shape[1], dtype=torch.float64)
    for s in range(0, rows.shape[0], DEFAULT_BLOCK_ROWS):
        unit_sum_all += (
            rows[s : s + DEFAULT_BLOCK_ROWS].to("cpu", torch.float64) * inv[s : s + DEFAULT_BLOCK_ROWS, None]
        ).sum(0)
    unit_sum = torch.zeros(rows.shape[1], dtype=torch.float64)
    for s in range(0, n, DEFAULT_BLOCK_ROWS):
        idx = members[s : s + DEFAULT_BLOCK_ROWS]
        unit_sum += (rows[idx].to("cpu", torch.float64) * inv[idx, None]).sum(0)
    mean_sq = float(unit_sum.square().sum()) / n**2
    denom = float(unit_sum.norm() * unit_sum_all.norm())
    return {
        "n": n,
        "mean_best_cross_cosine": float(best_cross[members].mean()),
        "anisotropy": anisotropy_from_unit_mean(unit_sum / n, n) if n > 1 else None,
        "mean_unit_norm": math.sqrt(mean_sq),
        "cos_mean_with_dictionary_mean": float(unit_sum @ unit_sum_all) / denom if denom > 0 else None,
        "mean_decoder_norm": float(norms[members].mean()),
    }


class CodeCorrelationAccumulator:
    """Streaming sums for the Pearson correlation of two dictionaries' latent activations over the same rows.

    ρ_ij = (n Σ a_i b_j − Σ a_i Σ b_j) / √((n Σ a_i² − (Σ a_i)²)(n Σ b_j² − (Σ b_j)²)), float64; 0 where a
    latent never varies. ``pairs`` None: every pair (an N_A·N_B float64 buffer: keep it for dictionaries that
    ``match_latents`` solves exactly); else only those (i, j) pairs (e.g. the decoder candidate graph), memory
    O(pairs). Per batch the cross sum runs over the co-active pairs of each row only (Σ_r |P_r|·|Q_r| products
    for the active sets P_r, Q_r), so sparse codes cost what they hold. Mergeable (``merge``)."""

    def __init__(self, n_a: int, n_b: int, pairs: tuple[Tensor, Tensor] | None = None) -> None:
        self.n_a, self.n_b = n_a, n_b
        self.n = 0
        self.sum_a = torch.zeros(n_a, dtype=torch.float64)
        self.sq_a = torch.zeros(n_a, dtype=torch.float64)
        self.sum_b = torch.zeros(n_b, dtype=torch.float64)
        self.sq_b = torch.zeros(n_b, dtype=torch.float64)
        if pairs is None:
            self.keys = None
            self.cross = torch.zeros(n_a * n_b, dtype=torch.float64)
        else:
            keys = (pairs[0].long() * n_b + pairs[1].long()).unique()  # sorted
            self.keys = keys
            self.cross = torch.zeros(keys.numel(), dtype=torch.float64)

    def add(self, codes_a: Any, codes_b: Any) -> None:
        """Add a batch: codes of the same rows under A (m, N_A) and B (m, N_B), dense or sparse (coo_codes)."""
        from saegeo.geometry.amplification import coo_codes

        m_a, ra, ca, va = coo_codes(codes_a)
        m_b, rb, cb, vb = coo_codes(codes_b)
        if m_a != m_b:
            raise BadInputError(f"the two code batches differ in rows: {m_a} and {m_b}")
        va, vb = va.to(torch.float64), vb.to(torch.float64)
        self.n += m_a
        self.sum_a.index_add_(0, ca, va)
        self.sq_a.index_add_(0, ca, va.square())
        self.sum_b.index_add_(0, cb, vb)
        self.sq_b.index_add_(0, cb, vb.square())
        # all co-active (i, j) of each row: A's entries repeated over B's entries of the same row
        order_b = rb.argsort(stable=True)
        rb, cb, vb = rb[order_b], cb[order_b], vb[order_b]
        count_b = torch.bincount(rb, minlength=m_a)
        start_b = torch.cumsum(count_b, 0) - count_b
        reps = count_b[ra]
        total = int(reps.sum())
        if total == 0:
            return
        left = torch.repeat_interleave(torch.arange(ra.numel()), reps)
        offset = torch.arange(total) - torch.repeat_interleave(torch.cumsum(reps, 0) - reps, reps)
        right = start_b[ra[left]] + offset
        keys = ca[left] * self.n_b + cb[right]
        products = va[left] * vb[right]
        if self.keys is None:
            self.cross.index_add_(0, keys, products)
            return
        pos = torch.searchsorted(self.keys, keys).clamp_max(self.keys.numel() - 1)
        hit = self.keys[pos] == keys
        self.cross.index_add_(0, pos[hit], products[hit])

    def merge(self, other: CodeCorrelationAccumulator) -> None:
        self.n += other.n
        for name in ("sum_a", "sq_a", "sum_b", "sq_b", "cross"):
            getattr(self, name).add_(getattr(other, name))

    def _rho(self, i: Tensor, j: Tensor, cross: Tensor) -> Tensor:
        n = self.n
        cov = n * cross - self.sum_a[i] * self.sum_b[j]
        var = (n * self.sq_a[i] - self.sum_a[i].square()).clamp_min(0) * (
            n * self.sq_b[j] - self.sum_b[j].square()
        ).clamp_min(0)
        return torch.where(var > 0, cov / var.clamp_min(1e-300).sqrt(), 0.0)

    def matrix(self) -> Float[Tensor, "Na Nb"]:
        """ρ for every pair (``pairs`` None only)."""
        if self.keys is not None:
            raise BadInputError("this accumulator holds only the given pairs; use pair_correlations()")
        i = torch.arange(self.n_a).repeat_interleave(self.n_b)
        j = torch.arange(self.n_b).repeat(self.n_a)
        return self._rho(i, j, self.cross).reshape(self.n_a, self.n_b)

    def pair_correlations(self) -> tuple[Int[Tensor, " p"], Int[Tensor, " p"], Float[Tensor, " p"]]:
        """(i, j, ρ_ij) of the accumulated pairs (all of them when ``pairs`` was None)."""
        keys = self.keys if self.keys is not None else torch.arange(self.n_a * self.n_b)
        i, j = keys // self.n_b, keys % self.n_b
        return i, j, self._rho(i, j, self.cross)
