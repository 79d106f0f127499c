"""Per-token-type sums: the within/between decomposition, self-similarity, intra-window similarity and the
artifact test's covariates. Pure math on (rows, token ids, positions) batches; no I/O, no models.

Notation: rows x_i ∈ R^d with token id t(i); type t has c_t occurrences, mean μ_t, global mean μ, n rows.

Public API
----------
``TokenTypeAccumulator(d, *, max_types=None, keep_ids=None)``   per type: c_t, Σx, Σx̂ (and its nonzero
    count), Σ‖x‖²; exact dense counts of every id. ``add(x, ids)``, ``merge``, ``state_dict``/``from_state_dict``.
``token_type_geometry(acc, *, baseline=None, n_list=10, min_count=5) -> TokenTypeGeometry``
    tr Σ = within + between (exact, plug-in), the c/(c − 1)-corrected within term and the shares, the number
    of types, the share of tokens in repeated types, the count-weighted corr(‖μ_t‖², var_t), SelfSim_t
    against the layer baseline A, the most / least context-specific types, the pooled "other" type.
``WindowSimilarityAccumulator(d)``   Ethayarajh's intra-sentence similarity over context windows
    (a window starts where the position does not increase). ``add(x, positions)``, ``finish()``, ``merge``.
``ArtifactAccumulator(mean, components)``   second pass: the top-k principal projections P = (x − μ)V_k
    against log token frequency, position and ‖x‖; ``correlations() -> dict``.

Bounding memory (``max_types``). The d-sized sums live in a table with one slot per type. Unbounded
(``max_types=None``) it holds every type seen: memory O(T·d) with T ≤ the vocabulary V, i.e. O(V·d).
With ``keep_ids`` (the exact most frequent ids, e.g. from a first pass over the token ids only) exactly
those types get slots and every other row is pooled into one "other" type. With ``max_types = K`` and no
``keep_ids`` the table grows to 2K slots, then keeps the K with the largest running counts and pools the
rest into "other"; an id once pooled stays pooled, so every type lies wholly in its slot or wholly in
"other" and the decomposition stays exact (with "other" one cluster). The kept set is then the running top
K, not necessarily the final top K: ``TokenTypeGeometry.kept_exact_top`` says whether they agree
(exact counts of every id are always kept, O(V) integers).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from jaxtyping import Float, Int
from torch import Tensor

from saegeo.errors import BadInputError
from saegeo.geometry.accumulate import GeometryAccumulator, as_rows
from saegeo.io import json_safe

STATE_VERSION = 1
OTHER = -1  # the id reported for the pooled "other" type


def _as_ids(ids: Any, n: int, what: str = "token ids") -> Int[Tensor, " n"]:
    t = torch.as_tensor(ids).reshape(-1).to(torch.int64)
    if t.numel() != n:
        raise BadInputError(f"{what}: {t.numel()} values for {n} rows; give one per row")
    if n and int(t.min()) < 0:
        raise BadInputError(f"{what}: negative id {int(t.min())}; ids must be ≥ 0")
    return t


def _unit_rows(x: Tensor) -> tuple[Tensor, Tensor]:
    """(x/‖x‖ with zero rows left at 0, mask of nonzero rows)."""
    norms = torch.linalg.vector_norm(x, dim=1)
    nonzero = norms > 0
    return x / torch.where(nonzero, norms, 1.0)[:, None], nonzero


# =========================================================================== token types
class TokenTypeAccumulator:
    """Mergeable float64 per-type sums: c_t, Σ_{i∈t} x_i, Σ_{i∈t} x̂_i (over nonzero rows), Σ_{i∈t} ‖x_i‖².

    See the module docstring for how ``max_types`` / ``keep_ids`` bound the memory.
    """

    def __init__(self, d: int, *, max_types: int | None = None, keep_ids: Any = None, capacity: int = 1024):
        if int(d) < 1:
            raise BadInputError(f"d must be ≥ 1, got {d}")
        if max_types is not None and int(max_types) < 1:
            raise BadInputError(f"max_types must be ≥ 1 (or None for every type), got {max_types}")
        self.d = int(d)
        self.max_types = None if max_types is None else int(max_types)
        self.keep_ids = (
            None if keep_ids is None else sorted({int(i) for i in torch.as_tensor(keep_ids).reshape(-1).tolist()})
        )
        self._keep = None if self.keep_ids is None else set(self.keep_ids)
        self.n = 0
        self.id_counts = torch.zeros(0, dtype=torch.int64)  # exact count of every id (dense, O(V))
        self._pooled = torch.zeros(0, dtype=torch.bool)  # ids whose rows go to "other"
        self._slot_of: dict[int, int] = {}
        self._ids: list[int] = []
        self._alloc(capacity)
        self.other_count = 0
        self.other_unit_count = 0
        self.other_sum = torch.zeros(self.d, dtype=torch.float64)
        self.other_unit_sum = torch.zeros(self.d, dtype=torch.float64)
        self.other_sq_sum = 0.0

    def _alloc(self, capacity: int) -> None:
        f64 = dict(dtype=torch.float64)
        self.count = torch.zeros(capacity, dtype=torch.int64)
        self.unit_count = torch.zeros(capacity, dtype=torch.int64)
        self.sum = torch.zeros(capacity, self.d, **f64)
        self.unit_sum = torch.zeros(capacity, self.d, **f64)
        self.sq_sum = torch.zeros(capacity, **f64)

    @property
    def n_slots(self) -> int:
        return len(self._ids)

    def _grow(self, need: int) -> None:
        cap = self.count.shape[0]
        if need <= cap:
            return
        new_cap = max(need, 2 * cap)
        old = (self.count, self.unit_count, self.sum, self.unit_sum, self.sq_sum)
        self._alloc(new_cap)
        for new, o in zip((self.count, self.unit_count, self.sum, self.unit_sum, self.sq_sum), old):
            new[:cap] = o

    def _grow_ids(self, max_id: int) -> None:
        if max_id >= self.id_counts.numel():
            size = max(max_id + 1, 2 * self.id_counts.numel())
            self.id_counts = torch.cat([self.id_counts, torch.zeros(size - self.id_counts.numel(), dtype=torch.int64)])
            self._pooled = torch.cat([self._pooled, torch.zeros(size - self._pooled.numel(), dtype=torch.bool)])

    def _slots(self, unique_ids: list[int]) -> list[int]:
        """Slot of each id (−1: pooled into "other"), opening slots for new ids that may have one."""
        slots = []
        for i in unique_ids:
            s = self._slot_of.get(i)
            if s is None:
                if bool(self._pooled[i]) or (self._keep is not None and i not in self._keep):
                    self._pooled[i] = True
                    s = -1
                else:
                    s = self.n_slots
                    self._slot_of[i] = s
                    self._ids.append(i)
            slots.append(s)
        self._grow(self.n_slots)
        return slots

    def add(self, x: Any, ids: Any) -> TokenTypeAccumulator:
        """Add rows ``x`` (m, d) with their token ids (m,)."""
        x = as_rows(x, self.d).to("cpu", torch.float64)
        m = x.shape[0]
        ids = _as_ids(ids, m)
        if m == 0:
            return self
        self._grow_ids(int(ids.max()))
        self.id_counts += torch.bincount(ids, minlength=self.id_counts.numel())
        self.n += m
        unique, inverse = torch.unique(ids, return_inverse=True)
        slot = torch.tensor(self._slots(unique.tolist()), dtype=torch.int64)[inverse]
        unit, nonzero = _unit_rows(x)
        sq = x.square().sum(dim=1)
        kept = slot >= 0
        if kept.any():
            s = slot[kept]
            self.count.index_add_(0, s, torch.ones_like(s))
            self.unit_count.index_add_(0, s, nonzero[kept].to(torch.int64))
            self.sum.index_add_(0, s, x[kept])
            self.unit_sum.index_add_(0, s, unit[kept])
            self.sq_sum.index_add_(0, s, sq[kept])
        if not kept.all():
            pooled = ~kept
            self._add_other(
                int(pooled.sum()),
                int(nonzero[pooled].sum()),
                x[pooled].sum(0),
                unit[pooled].sum(0),
                float(sq[pooled].sum()),
            )
        if self.max_types is not None and self._keep is None and self.n_slots > 2 * self.max_types:
            self._compact(self.max_types)
        return self

    def _add_other(self, count: int, unit_count: int, xsum: Tensor, unit_sum: Tensor, sq_sum: float) -> None:
        self.other_count += count
        self.other_unit_count += unit_count
        self.other_sum += xsum
        self.other_unit_sum += unit_sum
        self.other_sq_sum += sq_sum

    def _compact(self, k: int) -> None:
        """Keep the k slots with the largest counts (ties: earliest slot); pool the rest into "other" for good."""
        n = self.n_slots
        if n <= k:
            return
        order = sorted(range(n), key=lambda s: (-int(self.count[s]), s))
        keep, drop = sorted(order[:k]), torch.tensor(order[k:], dtype=torch.int64)
        self._add_other(
            int(self.count[drop].sum()),
            int(self.unit_count[drop].sum()),
            self.sum[drop].sum(0),
            self.unit_sum[drop].sum(0),
            float(self.sq_sum[drop].sum()),
        )
        for s in drop.tolist():
            self._pooled[self._ids[s]] = True
        keep_t = torch.tensor(keep, dtype=torch.int64)
        parts = [t[keep_t].clone() for t in (self.count, self.unit_count, self.sum, self.unit_sum, self.sq_sum)]
        ids = [self._ids[s] for s in keep]
        self._alloc(max(2 * k, 16))
        for new, p in zip((self.count, self.unit_count, self.sum, self.unit_sum, self.sq_sum), parts):
            new[:k] = p
        self._ids = ids
        self._slot_of = {i: s for s, i in enumerate(ids)}

    # ------------------------------------------------------------------ combining
    def merge(self, other: TokenTypeAccumulator) -> TokenTypeAccumulator:
        """Fold ``other`` into ``self``: sums of the same id add; ids pooled in either side stay pooled."""
        if other.d != self.d:
            raise BadInputError(f"cannot merge token-type accumulators with d = {self.d} and d = {other.d}")
        if other.id_counts.numel():
            self._grow_ids(other.id_counts.numel() - 1)
            self.id_counts[: other.id_counts.numel()] += other.id_counts
            self._pooled[: other._pooled.numel()] |= other._pooled
        self.n += other.n
        self._add_other(
            other.other_count, other.other_unit_count, other.other_sum, other.other_unit_sum, other.other_sq_sum
        )
        # ids pooled by the other side must leave our slots too, so no type is split between a slot and "other"
        for i, s in list(self._slot_of.items()):
            if bool(self._pooled[i]):
                self._pool_slot(s)
        if other.n_slots:
            k = other.n_slots
            slot = torch.tensor(self._slots(other._ids[:k]), dtype=torch.int64)
            kept = slot >= 0
            src = torch.arange(k)
            for mine, theirs in zip(
                (self.count, self.unit_count, self.sum, self.unit_sum, self.sq_sum),
                (other.count, other.unit_count, other.sum, other.unit_sum, other.sq_sum),
            ):
                mine.index_add_(0, slot[kept], theirs[:k][src[kept]])
            if not kept.all():
                p = src[~kept]
                self._add_other(
                    int(other.count[p].sum()),
                    int(other.unit_count[p].sum()),
                    other.sum[p].sum(0),
                    other.unit_sum[p].sum(0),
                    float(other.sq_sum[p].sum()),
                )
        if self.max_types is not None and self._keep is None and self.n_slots > 2 * self.max_types:
            self._compact(self.max_types)
        return self

    def _pool_slot(self, s: int) -> None:
        """Move slot s to "other" for good (its numbers zeroed; the slot stays, empty, and its id is pooled)."""
        self._slot_of.pop(self._ids[s], None)
        self._add_other(
            int(self.count[s]),
            int(self.unit_count[s]),
            self.sum[s].clone(),
            self.unit_sum[s].clone(),
            float(self.sq_sum[s]),
        )
        for t in (self.count, self.unit_count, self.sum, self.unit_sum, self.sq_sum):
            t[s] = 0

    def state_dict(self) -> dict[str, Any]:
        k = self.n_slots
        return {
            "version": STATE_VERSION,
            "d": self.d,
            "n": self.n,
            "max_types": self.max_types,
            "keep_ids": self.keep_ids,
            "ids": torch.tensor(self._ids, dtype=torch.int64),
            "count": self.count[:k].clone(),
            "unit_count": self.unit_count[:k].clone(),
            "sum": self.sum[:k].clone(),
            "unit_sum": self.unit_sum[:k].clone(),
            "sq_sum": self.sq_sum[:k].clone(),
            "id_counts": self.id_counts.clone(),
            "pooled": self._pooled.clone(),
            "other_count": self.other_count,
            "other_unit_count": self.other_unit_count,
            "other_sum": self.other_sum.clone(),
            "other_unit_sum": self.other_unit_sum.clone(),
            "other_sq_sum": self.other_sq_sum,
        }

    @classmethod
    def from_state_dict(cls, sd: dict[str, Any]) -> TokenTypeAccumulator:
        if int(sd.get("version", -1)) != STATE_VERSION:
            raise BadInputError(
                f"token-type state version {sd.get('version')!r} is not supported (expected {STATE_VERSION})"
            )
        acc = cls(int(sd["d"]), max_types=sd["max_types"], keep_ids=sd["keep_ids"], capacity=max(len(sd["ids"]), 1))
        acc.n = int(sd["n"])
        acc._ids = [int(i) for i in torch.as_tensor(sd["ids"]).tolist()]
        acc._slot_of = {i: s for s, i in enumerate(acc._ids)}
        k = len(acc._ids)
        for name in ("count", "unit_count", "sum", "unit_sum", "sq_sum"):
            getattr(acc, name)[:k] = torch.as_tensor(sd[name])
        acc.id_counts = torch.as_tensor(sd["id_counts"]).to(torch.int64).clone()
        acc._pooled = torch.as_tensor(sd["pooled"]).to(torch.bool).clone()
        acc.other_count, acc.other_unit_count = int(sd["other_count"]), int(sd["other_unit_count"])
        acc.other_sum = torch.as_tensor(sd["other_sum"], dtype=torch.float64).clone()
        acc.other_unit_sum = torch.as_tensor(sd["other_unit_sum"], dtype=torch.float64).clone()
        acc.other_sq_sum = float(sd["other_sq_sum"])
        return acc

    def copy(self) -> TokenTypeAccumulator:
        return TokenTypeAccumulator.from_state_dict(self.state_dict())

    def clusters(self) -> tuple[Int[Tensor, " k"], Int[Tensor, " k"], Float[Tensor, "k d"], Float[Tensor, " k"]]:
        """(ids, counts, Σx, Σ‖x‖²) of the nonempty clusters: the kept types, then "other" (id −1) if nonempty."""
        k = self.n_slots
        live = self.count[:k] > 0
        ids = torch.tensor(self._ids, dtype=torch.int64)[live]
        counts, sums, sq = self.count[:k][live], self.sum[:k][live], self.sq_sum[:k][live]
        if self.other_count:
            ids = torch.cat([ids, torch.tensor([OTHER])])
            counts = torch.cat([counts, torch.tensor([self.other_count])])
            sums = torch.cat([sums, self.other_sum[None]])
            sq = torch.cat([sq, torch.tensor([self.other_sq_sum], dtype=torch.float64)])
        return ids, counts, sums, sq


# =========================================================================== read-out
@dataclass
class TypeEntry:
    """One type in a list: id, occurrences, SelfSim_t and SelfSim_t − baseline."""

    id: int
    count: int
    self_similarity: float
    adjusted: float | None


@dataclass
class TokenTypeGeometry:
    """The norm-of-mean decomposition and Ethayarajh's self-similarity of one set of rows."""

    n: int
    n_types: int  # distinct ids seen
    n_types_kept: int  # types with their own slot (the rest are the pooled "other" type)
    kept_exact_top: bool  # the kept types are exactly the most frequent ones
    n_repeated_types: int  # ids seen ≥ 2 times
    share_tokens_repeated: float  # share of tokens whose id is seen ≥ 2 times
    other_n_types: int
    other_n_tokens: int
    other_share: float
    total_variance: float  # tr Σ
    within_plugin: float  # (1/n) Σ_t Σ_{i∈t} ‖x_i − μ_t‖²
    between_plugin: float  # (1/n) Σ_t c_t ‖μ_t − μ‖²  (within_plugin + between_plugin = tr Σ exactly)
    within: float | None  # token-weighted c/(c − 1)-corrected per-type variance, over repeated types
    between: float | None  # tr Σ − within
    within_share: float | None
    between_share: float | None
    norm_variance_corr: float | None  # count-weighted corr(‖μ_t‖², var_t) over repeated kept types
    mean_type_sq_norm: float | None  # count-weighted mean of ‖μ_t‖² over the same types
    mean_type_variance: float | None  # count-weighted mean of var_t (unbiased)
    self_similarity: float | None  # token-weighted mean of SelfSim_t over repeated kept types
    baseline: float | None  # the layer's A
    self_similarity_adjusted: float | None  # self_similarity − baseline
    most_context_specific: list[TypeEntry] = field(default_factory=list)  # lowest SelfSim_t (count ≥ min_count)
    least_context_specific: list[TypeEntry] = field(default_factory=list)  # highest SelfSim_t
    min_count: int = 5
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return json_safe(asdict(self))


def weighted_correlation(a: Float[Tensor, " k"], b: Float[Tensor, " k"], w: Float[Tensor, " k"]) -> float | None:
    """Pearson correlation of a and b with weights w: Σw(a−ā)(b−b̄)/√(Σw(a−ā)²·Σw(b−b̄)²), ā = Σwa/Σw."""
    a, b, w = (torch.as_tensor(v, dtype=torch.float64) for v in (a, b, w))
    if a.numel() < 2 or float(w.sum()) <= 0:
        return None
    wa, wb = (w * a).sum() / w.sum(), (w * b).sum() / w.sum()
    cov = (w * (a - wa) * (b - wb)).sum()
    den = float((w * (a - wa).square()).sum() * (w * (b - wb).square()).sum())
    return float(cov) / math.sqrt(den) if den > 0 else None


def self_similarity(unit_sum: Float[Tensor, "... d"], count: Int[Tensor, ...]) -> Float[Tensor, ...]:
    """SelfSim = (c‖m̂‖² − 1)/(c − 1), m̂ = Σx̂/c: the mean cosine over the c(c − 1) ordered pairs of
    distinct occurrences (Σ_{i≠j} x̂_i·x̂_j = ‖Σx̂‖² − c). NaN where c < 2."""
    c = torch.as_tensor(count, dtype=torch.float64)
    sq = torch.as_tensor(unit_sum, dtype=torch.float64).square().sum(dim=-1)
    return torch.where(c >= 2, (sq - c) / (c * (c - 1)).clamp(min=1.0), torch.nan)


def token_type_geometry(
    acc: TokenTypeAccumulator,
    *,
    baseline: float | None = None,
    n_list: int = 10,
    min_count: int = 5,
) -> TokenTypeGeometry:
    """Read the per-type sums out (formulas in docs/design.md "Token types, self-similarity" and on TokenTypeGeometry's fields).

    within (corrected) = Σ_{t: c_t ≥ 2} c_t·v_t / Σ_{t: c_t ≥ 2} c_t with v_t = Σ_{i∈t}‖x_i − μ_t‖²/(c_t − 1):
    unbiased for the token-weighted within-type variance when singleton types spread like repeated ones
    (singletons carry no estimate). The plug-in (1/n)Σ‖x_i − μ_t‖² is low by Σ_t E‖x − μ_t‖²/n, one
    degree of freedom per type. ``baseline`` (the layer's A) is subtracted from every SelfSim_t.
    """
    if acc.n < 1:
        raise BadInputError("no rows were accumulated: nothing to decompose")
    n = acc.n
    ids, counts, sums, sq = acc.clusters()
    c = counts.to(torch.float64)
    mu = sums.sum(0) / n
    mean_sq = float(sq.sum()) / n
    total = mean_sq - float(mu.square().sum())
    mean_t = sums / c[:, None]
    ssq = (sq - sums.square().sum(1) / c).clamp(min=0)  # Σ_{i∈t}‖x_i − μ_t‖² per cluster
    within_plugin = float(ssq.sum()) / n
    between_plugin = float((c * (mean_t - mu).square().sum(1)).sum()) / n
    notes: list[str] = []

    is_type = ids >= 0
    rep = is_type & (counts >= 2)
    within = between = within_share = between_share = None
    var_t = torch.where(counts >= 2, ssq / (c - 1).clamp(min=1.0), torch.nan)
    if rep.any():
        within = float((c[rep] * var_t[rep]).sum() / c[rep].sum())
        between = total - within
        if total > 0:
            within_share, between_share = within / total, between / total
    else:
        notes.append("no type is seen twice: the within-type spread cannot be estimated")
    corr = weighted_correlation(mean_t[rep].square().sum(1), var_t[rep], c[rep]) if int(rep.sum()) >= 2 else None
    mean_type_sq = float((c[rep] * mean_t[rep].square().sum(1)).sum() / c[rep].sum()) if rep.any() else None
    mean_type_var = float((c[rep] * var_t[rep]).sum() / c[rep].sum()) if rep.any() else None

    # self-similarity over the kept types' nonzero rows
    k = acc.n_slots
    uc = acc.unit_count[:k]
    sims = self_similarity(acc.unit_sum[:k], uc)
    ok = uc >= 2
    mean_sim = adjusted = None
    most: list[TypeEntry] = []
    least: list[TypeEntry] = []
    if ok.any():
        w = uc[ok].to(torch.float64)
        mean_sim = float((w * sims[ok]).sum() / w.sum())
        adjusted = mean_sim - baseline if baseline is not None else None
        listed = (uc >= max(min_count, 2)).nonzero().flatten()
        if listed.numel():
            order = listed[sims[listed].argsort()]  # ascending SelfSim: most context-specific first
            entry = lambda s: TypeEntry(  # noqa: E731
                acc._ids[s],
                int(acc.count[s]),
                float(sims[s]),
                float(sims[s]) - baseline if baseline is not None else None,
            )
            most = [entry(s) for s in order[:n_list].tolist()]
            least = [entry(s) for s in order.flip(0)[:n_list].tolist()]
    counts_all = acc.id_counts
    seen = counts_all > 0
    n_types = int(seen.sum())
    repeated_ids = counts_all >= 2
    kept_ids = set(acc._ids[s] for s in range(k) if int(acc.count[s]) > 0)
    n_kept = len(kept_ids)
    top = set(torch.argsort(counts_all, descending=True, stable=True)[:n_kept].tolist()) if n_kept else set()
    kept_counts = sorted((int(counts_all[i]) for i in kept_ids), reverse=True)
    top_counts = sorted((int(counts_all[i]) for i in top), reverse=True)
    if acc.other_count:
        notes.append(
            f"{n_types - n_kept} type(s) ({acc.other_count:,} tokens, {acc.other_count / n:.1%}) are pooled "
            f"into one 'other' type (max_types = {acc.max_types}); it counts as one cluster in within/between"
        )
    return TokenTypeGeometry(
        n=n,
        n_types=n_types,
        n_types_kept=n_kept,
        kept_exact_top=kept_counts == top_counts,
        n_repeated_types=int(repeated_ids.sum()),
        share_tokens_repeated=float(counts_all[repeated_ids].sum()) / n,
        other_n_types=n_types - n_kept,
        other_n_tokens=acc.other_count,
        other_share=acc.other_count / n,
        total_variance=total,
        within_plugin=within_plugin,
        between_plugin=between_plugin,
        within=within,
        between=between,
        within_share=within_share,
        between_share=between_share,
        norm_variance_corr=corr,
        mean_type_sq_norm=mean_type_sq,
        mean_type_variance=mean_type_var,
        self_similarity=mean_sim,
        baseline=baseline,
        self_similarity_adjusted=adjusted,
        most_context_specific=most,
        least_context_specific=least,
        min_count=min_count,
        notes=notes,
    )


# =========================================================================== windows
def window_starts(positions: Int[Tensor, " n"], previous: int | None = None) -> Tensor:
    """True where a new context window begins: the position does not increase (e.g. it resets to 0).
    ``previous`` is the position of the row before the first (None: the first row starts a window)."""
    pos = torch.as_tensor(positions, dtype=torch.int64).reshape(-1)
    starts = torch.ones_like(pos, dtype=torch.bool)
    if pos.numel() > 1:
        starts[1:] = pos[1:] <= pos[:-1]
    if previous is not None and pos.numel():
        starts[0] = bool(pos[0] <= previous)
    return starts


class WindowSimilarityAccumulator:
    """Ethayarajh's intra-sentence similarity per context window w: IntraSim_w = mean_{i∈w} cos(x_i, s_w),
    s_w = mean_{i∈w} x_i; averaged over windows with ≥ 2 nonzero rows. Rows of the open window (at most
    one context) are carried to the next batch; call :meth:`finish` after the last one."""

    def __init__(self, d: int):
        self.d = int(d)
        self.sim_sum = 0.0
        self.n_windows = 0
        self.n_short = 0  # windows with < 2 nonzero rows (no similarity defined)
        self._carry_x = torch.zeros(0, self.d, dtype=torch.float64)
        self._carry_last: int | None = None

    def add(self, x: Any, positions: Any) -> WindowSimilarityAccumulator:
        x = as_rows(x, self.d).to("cpu", torch.float64)
        pos = _as_ids(positions, x.shape[0], "positions")
        if x.shape[0] == 0:
            return self
        starts = window_starts(pos, self._carry_last)
        rows = torch.cat([self._carry_x, x])
        starts = torch.cat(
            [
                torch.tensor([True] * min(1, self._carry_x.shape[0]) + [False] * max(0, self._carry_x.shape[0] - 1)),
                starts,
            ]
        )
        seg = torch.cumsum(starts.to(torch.int64), 0) - 1
        last = int(seg[-1])
        closed = seg < last
        self._windows(rows[closed], seg[closed])
        self._carry_x, self._carry_last = rows[~closed].clone(), int(pos[-1])
        return self

    def _windows(self, rows: Tensor, seg: Tensor) -> None:
        if rows.shape[0] == 0:
            return
        unit, nonzero = _unit_rows(rows)
        rows, unit, seg = rows[nonzero], unit[nonzero], seg[nonzero]
        n_seg = int(seg.max()) + 1 if seg.numel() else 0
        size = torch.bincount(seg, minlength=n_seg)
        means = torch.zeros(n_seg, self.d, dtype=torch.float64).index_add_(0, seg, rows)
        mnorm = torch.linalg.vector_norm(means, dim=1)
        cos = (unit * means[seg]).sum(1) / torch.where(mnorm > 0, mnorm, 1.0)[seg]
        sims = torch.zeros(n_seg, dtype=torch.float64).index_add_(0, seg, cos) / size.clamp(min=1)
        present = torch.unique(seg)
        good = present[size[present] >= 2]
        self.sim_sum += float(sims[good].sum())
        self.n_windows += int(good.numel())
        self.n_short += int(present.numel() - good.numel())

    def finish(self) -> WindowSimilarityAccumulator:
        """Close the open window (the stream has ended)."""
        if self._carry_x.shape[0]:
            self._windows(self._carry_x, torch.zeros(self._carry_x.shape[0], dtype=torch.int64))
        self._carry_x, self._carry_last = torch.zeros(0, self.d, dtype=torch.float64), None
        return self

    def merge(self, other: WindowSimilarityAccumulator) -> WindowSimilarityAccumulator:
        """Add another stream's finished windows (both sides are finished first: no window spans the two)."""
        self.finish()
        other = other.copy().finish()
        self.sim_sum += other.sim_sum
        self.n_windows += other.n_windows
        self.n_short += other.n_short
        return self

    def copy(self) -> WindowSimilarityAccumulator:
        return WindowSimilarityAccumulator.from_state_dict(self.state_dict())

    def state_dict(self) -> dict[str, Any]:
        return {
            "d": self.d,
            "sim_sum": self.sim_sum,
            "n_windows": self.n_windows,
            "n_short": self.n_short,
            "carry_x": self._carry_x.clone(),
            "carry_last": self._carry_last,
        }

    @classmethod
    def from_state_dict(cls, sd: dict[str, Any]) -> WindowSimilarityAccumulator:
        acc = cls(int(sd["d"]))
        acc.sim_sum, acc.n_windows, acc.n_short = float(sd["sim_sum"]), int(sd["n_windows"]), int(sd["n_short"])
        acc._carry_x = torch.as_tensor(sd["carry_x"], dtype=torch.float64).clone()
        acc._carry_last = None if sd["carry_last"] is None else int(sd["carry_last"])
        return acc

    def intra_similarity(self) -> float | None:
        """Mean over finished windows of IntraSim_w (None before any window with ≥ 2 rows closed)."""
        return self.sim_sum / self.n_windows if self.n_windows else None


# =========================================================================== the artifact test
COVARIATES = ("log_frequency", "position", "norm")


def group_shares(n: int, total_sum: Tensor, total_sq: float, n_g: int, sum_g: Tensor, sq_g: float) -> dict[str, float]:
    """What a group G of rows carries among all N rows (mean μ), from float64 sums:
      mu_share    = (Σ_G x)·μ / (N‖μ‖²)                          (the groups of a partition sum to 1)
      trace_share = Σ_G ‖x − μ‖² / Σ_all ‖x − μ‖²,  Σ_G‖x − μ‖² = Σ_G‖x‖² − 2μ·Σ_G x + n_G‖μ‖²
      norm_ratio  = sqrt(mean_G ‖x‖² / mean_all ‖x‖²),   row_share = n_G / N.
    Undefined shares (‖μ‖ = 0, no spread) are NaN."""
    total_sum, sum_g = torch.as_tensor(total_sum, dtype=torch.float64), torch.as_tensor(sum_g, dtype=torch.float64)
    mu = total_sum / n
    mu2 = float(mu @ mu)
    spread_all = total_sq - 2 * float(mu @ total_sum) + n * mu2
    spread = sq_g - 2 * float(mu @ sum_g) + n_g * mu2
    return {
        "rows": n_g,
        "row_share": n_g / n,
        "mu_share": float(sum_g @ mu) / (n * mu2) if mu2 > 0 else float("nan"),
        "trace_share": spread / spread_all if spread_all > 0 else float("nan"),
        "norm_ratio": (sq_g / n_g / (total_sq / n)) ** 0.5 if total_sq > 0 and n_g else float("nan"),
    }


ARTIFACT_CHUNK_ROWS = 1024


class ArtifactAccumulator:
    """Second pass of the artifact test: P = (x − μ)V_k against log token frequency, position and ‖x‖.

    Per id it sums the count and ΣP (k floats), and a float64 GeometryAccumulator takes the rows
    [P, position, ‖x‖]. corr(P_j, log f) then needs no frequency known in advance:
    Σ_i P_ij log f_{t(i)} = Σ_t log f_t Σ_{i∈t} P_ij, with f_t = c_t/n counted in this same pass.
    """

    def __init__(self, mean: Float[Tensor, " d"], components: Float[Tensor, "d k"]):
        self.mean = torch.as_tensor(mean, dtype=torch.float64).reshape(-1)
        self.components = torch.as_tensor(components, dtype=torch.float64)
        if self.components.ndim != 2 or self.components.shape[0] != self.mean.numel():
            raise BadInputError(
                f"components must be (d, k) with d = {self.mean.numel()}, got {tuple(self.components.shape)}"
            )
        self.k = self.components.shape[1]
        self.id_count = torch.zeros(0, dtype=torch.int64)
        self.id_projection = torch.zeros(0, self.k, dtype=torch.float64)
        self.rows = GeometryAccumulator(self.k + 2, gram_dtype=torch.float64)
        self.has = {"log_frequency": True, "position": True}
        # what the first position of each window (BOS / attention sinks) carries: float64 sums, all rows and position 0
        d = self.mean.numel()
        self.all_sum, self.all_sq = torch.zeros(d, dtype=torch.float64), 0.0
        self.first_n, self.first_sum, self.first_sq = 0, torch.zeros(d, dtype=torch.float64), 0.0

    def add(self, x: Any, ids: Any = None, positions: Any = None) -> ArtifactAccumulator:
        x = as_rows(x, self.mean.numel())
        m = x.shape[0]
        # P and ‖x‖ in float64 ARTIFACT_CHUNK_ROWS rows at a time, never a whole batch's float64 copies (x, x − μ):
        # those set the peak of a check at published widths (benchmarks/README.md#numbers-behind-code-comments)
        proj = torch.empty(m, self.k, dtype=torch.float64)
        norm = torch.empty(m, dtype=torch.float64)
        row_sum = torch.zeros_like(self.mean)
        for lo in range(0, m, ARTIFACT_CHUNK_ROWS):
            chunk = x[lo : lo + ARTIFACT_CHUNK_ROWS].to("cpu", torch.float64)
            norm[lo : lo + chunk.shape[0]] = torch.linalg.vector_norm(chunk, dim=1)
            row_sum += chunk.sum(0)
            proj[lo : lo + chunk.shape[0]] = (chunk - self.mean) @ self.components
        if ids is None:
            self.has["log_frequency"] = False
        else:
            ids = _as_ids(ids, m)
            if m:
                self._grow_ids(int(ids.max()) + 1)
                self.id_count.index_add_(0, ids, torch.ones_like(ids))
                self.id_projection.index_add_(0, ids, proj)
        if positions is None:
            self.has["position"] = False
            pos = torch.zeros(m, dtype=torch.float64)
        else:
            pos = _as_ids(positions, m, "positions").to(torch.float64)
            first = pos == 0
            self.first_n += int(first.sum())
            self.first_sum += x[first.to(x.device)].to("cpu", torch.float64).sum(0)
            self.first_sq += float(norm[first].square().sum())
        self.all_sum += row_sum
        self.all_sq += float(norm.square().sum())
        self.rows.add(torch.cat([proj, pos[:, None], norm[:, None]], dim=1))
        return self

    def correlations(self) -> dict[str, Any]:
        """{"r": {covariate: [r_j for each component]}, "abs": same as |r|}; None where undefined
        (a constant covariate or component, or a covariate not given)."""
        n = self.rows.n
        if n < 2:
            raise BadInputError("the artifact test needs at least 2 rows")
        cov = self.rows.covariance()
        var = cov.diagonal()
        k = self.k
        r: dict[str, list[float | None]] = {}

        def corr(c: Tensor, var_z: float) -> list[float | None]:
            return [
                float(c[j]) / math.sqrt(float(var[j]) * var_z) if float(var[j]) > 0 and var_z > 0 else None
                for j in range(k)
            ]

        if self.has["log_frequency"] and self.id_count.numel():
            seen = self.id_count > 0
            c = self.id_count[seen].to(torch.float64)
            logf = (c / n).log()
            mean_logf = float((c * logf).sum()) / n
            var_logf = float((c * (logf - mean_logf).square()).sum()) / n
            # cov(P_j, log f) = Σ_t (log f_t − mean) Σ_{i∈t} P_ij / n  (exact: Σ_t Σ_{i∈t} P_ij = n·mean P_j)
            cov_pf = ((logf - mean_logf)[:, None] * self.id_projection[seen]).sum(0) / n
            r["log_frequency"] = corr(cov_pf, var_logf)
        else:
            r["log_frequency"] = [None] * k
        r["position"] = corr(cov[:k, k], float(var[k])) if self.has["position"] else [None] * k
        r["norm"] = corr(cov[:k, k + 1], float(var[k + 1]))
        first = (
            group_shares(n, self.all_sum, self.all_sq, self.first_n, self.first_sum, self.first_sq)
            if self.has["position"] and self.first_n
            else None
        )
        return {
            "n": n,
            "k": k,
            "covariates": list(COVARIATES),
            "r": r,
            "abs": {name: [None if v is None else abs(v) for v in vals] for name, vals in r.items()},
            "first_position": first,
        }

    def _grow_ids(self, size: int) -> None:
        if size > self.id_count.numel():
            grow = size - self.id_count.numel()
            self.id_count = torch.cat([self.id_count, torch.zeros(grow, dtype=torch.int64)])
            self.id_projection = torch.cat([self.id_projection, torch.zeros(grow, self.k, dtype=torch.float64)])

    def merge(self, other: ArtifactAccumulator) -> ArtifactAccumulator:
        """Fold in another part of the stream (same μ and V_k): per-id sums add, the row moments merge (Chan)."""
        if not (torch.equal(self.mean, other.mean) and torch.equal(self.components, other.components)):
            raise BadInputError("cannot merge artifact accumulators built on different means or principal directions")
        self._grow_ids(other.id_count.numel())
        self.id_count[: other.id_count.numel()] += other.id_count
        self.id_projection[: other.id_projection.shape[0]] += other.id_projection
        self.rows.merge(other.rows)
        self.has = {name: self.has[name] and other.has[name] for name in self.has}
        self.all_sum += other.all_sum
        self.all_sq += other.all_sq
        self.first_n += other.first_n
        self.first_sum += other.first_sum
        self.first_sq += other.first_sq
        return self

    def state_dict(self) -> dict[str, Any]:
        return {
            "mean": self.mean.clone(),
            "components": self.components.clone(),
            "id_count": self.id_count.clone(),
            "id_projection": self.id_projection.clone(),
            "rows": self.rows.state_dict(),
            "has": dict(self.has),
            "all_sum": self.all_sum.clone(),
            "all_sq": self.all_sq,
            "first_n": self.first_n,
            "first_sum": self.first_sum.clone(),
            "first_sq": self.first_sq,
        }

    @classmethod
    def from_state_dict(cls, sd: dict[str, Any]) -> ArtifactAccumulator:
        acc = cls(sd["mean"], sd["components"])
        acc.id_count, acc.id_projection = sd["id_count"].clone(), sd["id_projection"].clone()
        acc.rows = GeometryAccumulator.from_state_dict(sd["rows"], gram_dtype=torch.float64)
        acc.has = dict(sd["has"])
        acc.all_sum, acc.all_sq = sd["all_sum"].clone(), float(sd["all_sq"])
        acc.first_n, acc.first_sum, acc.first_sq = int(sd["first_n"]), sd["first_sum"].clone(), float(sd["first_sq"])
        return acc
