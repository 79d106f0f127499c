"""Streaming, mergeable float64 statistics of rows x ∈ R^d — everything the geometry needs in one pass.

Public API
----------
``GeometryAccumulator(d, *, skip_nonfinite=False, chunk_rows=8192, gram_dtype=None, sample_rows=SD_SAMPLE_ROWS,
sample_seed=0, row_start=0)``
    ``add(batch, *, source=None)``  (n, d) torch or numpy, any float dtype; rows are never kept.
    ``merge(other) -> self``, ``acc + other -> new``, ``copy()``.
    ``state_dict() -> dict[str, Tensor | int]``, ``GeometryAccumulator.from_state_dict(sd)``.
    Counts: ``n`` (finite rows, zero rows included), ``n_zero``, ``n_unit`` (= n − n_zero),
    ``n_nonfinite_skipped``, ``n_batches``.
    Moments: ``mean`` μ, ``covariance()`` Σ (population, /n), ``second_moment()`` S = Σ + μμᵀ,
    ``unit_mean`` m̂ = mean of x/‖x‖ over nonzero rows, ``mean_norm`` E‖x‖, ``mean_sq_norm`` E‖x‖² = tr S.
    Sign statistics (pooled over all n·d entries): ``pooled_mean`` m̄, ``pooled_mean_square`` s̄,
    ``fraction_nonzero`` q, ``negative_energy_fraction`` Σx₋²/Σx², ``magnitude_ratio`` r = E|a|²/E[a²]
    over the nonzero entries.
    Second moment of the unit vectors (the non-degenerate sd of Â, the "uniformity of directions"), from
    ``sample``, a seeded uniform sample of ``sample_rows`` nonzero rows (bottom-k by global row index
    row_start + i; exact while n_unit ≤ sample_rows, ``sample_exact``): ``unit_pair_sums()``
    (‖S‖², tr G², SᵀGS) of S = Σx̂, G = Σx̂x̂ᵀ and ``unit_second_moment()`` C = mean of x̂x̂ᵀ;
    ``row_power_sums()``: with the row power sums p_k = Σ_j x_j^k (k = 1, 2), Σ p_k, Σ p_k p_l and Σ x̂ p_k —
    what the sd of Â − A_null − bias needs. Parts of one stream merged later (ranks) pass their ``row_start``.
    Histograms (fixed, scale-free log₂ bins, mergeable): ``entry_histogram()`` of all entries (count and
    Σx per bin: the pooled marginal, for the finite-d bias of the sign-aware null) and
    ``row_norm_histogram()`` of ‖x‖ (count and Σ‖x‖² per bin: massive rows, median norm).
``as_rows(batch, d=None) -> Tensor``  the one place a batch (torch / numpy / list) becomes an (n, d) tensor.
``unit_vector_sum(x, norms=None) -> (Σ x/‖x‖, n_nonzero)``  the one unit-vector sum (this accumulator, ``UnitMean``,
    the SAE metrics, the dictionary geometry all use it).
``UnitMean(d)``  mergeable Σ x/‖x‖ and count alone: ``anisotropy()`` A = (n‖m̂‖² − 1)/(n − 1) without a d × d gram.
``anisotropy_from_unit_mean(unit_mean, n) -> float``  that formula (re-exported by ``saegeo.geometry.measures``).

How the covariance stays exact for a large mean: every chunk is shifted by its own float32-rounded
mean c, the gram of the shifted rows is formed (float32 matmul for ≤ 32-bit input, float64 for float64
input) and converted to the centred scatter M₂ = Σ(x−c)(x−c)ᵀ − n(x̄−c)(x̄−c)ᵀ in float64; chunks and
accumulators are combined with Chan's parallel update
    M₂ = M₂ᵃ + M₂ᵇ + δδᵀ·nₐn_b/n,   μ = μₐ + δ·n_b/n,   δ = μ_b − μₐ,
so the mean never cancels against the spread. Every other sum over rows (Σx, the norms, Σx̂, the row power sums,
Σx̂p_k) is taken in float64 from a float64 copy of the chunk; the sums of G are read off the row sample at the end
(v = x̂ − m̂ in float64, centred on the exact m̂): the null test's sd, a small difference of these sums when A is
near 1, does not depend on the chunking or the split across ranks (the sample is the same rows in the same order).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from jaxtyping import Float, Int
from torch import Tensor

from saegeo.errors import BadInputError
from saegeo.geometry import fused
from saegeo.geometry.sample import RowReservoir

STATE_VERSION = 4  # a saved accumulator's layout: one of another version is refused, not misread (CHANGELOG.md)
_SAMPLE_BLOCK_ROWS = 256  # rows per block of the sample read-out without numba (float64 temporaries stay in cache)
SD_SAMPLE_ROWS = 8192  # rows of the seeded sample behind the unit-vector second moment (docs/statistics.md)
_INT_KEYS = ("version", "d", "n", "n_zero", "n_nonfinite_skipped", "n_batches", "n_rows_seen", "n_nonzero_entries")
_SAMPLE_KEYS = ("sample_k", "sample_seed", "sample_seen", "sample_rows", "sample_priority")
_TENSOR_KEYS = ("mean", "scatter", "unit_sum", "norm_sum", "sq_sum", "abs_sum", "neg_sq_sum", "gram_eps")
# sums added in version 2 (all plain sums: merged by addition)
_SUM_KEYS = (
    "row_power_sum",
    "row_power_outer",
    "unit_by_row_power",
    "entry_hist_count",
    "entry_hist_sum",
    "entry_hist_sq_sum",
    "norm_hist_count",
    "norm_hist_sq_sum",
)

# Scale-free log₂ bins: |x| = f·2^e with f ∈ [0.5, 1) (frexp); bin = (e, ⌊(2f − 1)·HIST_SUB⌋), e clamped to
# [HIST_MIN_EXP, HIST_MAX_EXP]. Relative bin width ≤ 1/HIST_SUB; exact zeros have their own bin.
HIST_SUB = 16
HIST_MIN_EXP, HIST_MAX_EXP = -160, 160
_N_MAG_BINS = (HIST_MAX_EXP - HIST_MIN_EXP + 1) * HIST_SUB
N_ENTRY_BINS = 2 * _N_MAG_BINS + 1  # [negative magnitudes | zero | positive magnitudes]
N_NORM_BINS = _N_MAG_BINS + 1  # [zero | magnitudes]
N_ROW_POWERS = 2  # row power sums p_k = Σ_j x_j^k, k = 1, 2


def log2_bin(values: Tensor) -> Tensor:
    """Magnitude bin of |v| > 0 in 0.._N_MAG_BINS−1 (see HIST_SUB); values must be nonzero and finite."""
    mantissa, exponent = torch.frexp(values.abs())
    sub = ((2 * mantissa - 1) * HIST_SUB).long().clamp(0, HIST_SUB - 1)
    return (exponent.long().clamp(HIST_MIN_EXP, HIST_MAX_EXP) - HIST_MIN_EXP) * HIST_SUB + sub


# The entry histogram is read off the IEEE bits: key = sign | biased exponent E | top 4 mantissa bits, which
# is the frexp bin above (|x| = (1 + M/2^p)·2^(E−bias) = f·2^e with e = E − bias + 1, ⌊(2f − 1)·16⌋ = top 4
# bits of M) for every normal number; a bincount over the 2^13 (float32) or 2^16 (float64) keys and a fixed
# key → bin table replace frexp and a scatter over all n·d entries, which were slower on CPU
# (benchmarks/README.md#numbers-behind-code-comments). E = 0 keys (zero and the subnormals, |x| < 2^−126 in
# float32) go to the zero bin when their top mantissa bits are 0, else to the lowest normal octave.
_INT_VIEW = {torch.float32: (torch.int32, 8, 23), torch.float64: (torch.int64, 11, 52)}  # int dtype, E bits, M bits
_KEY_TABLES: dict[tuple[torch.dtype, str], Tensor] = {}


def _key_table(dtype: torch.dtype, device: torch.device) -> Tensor:
    """Signed histogram bin (zero → _N_MAG_BINS, x > 0 → _N_MAG_BINS + 1 + mag, x < 0 → _N_MAG_BINS − 1 − mag)
    of every bit key of ``dtype`` (see above)."""
    cached = _KEY_TABLES.get((dtype, str(device)))
    if cached is None:
        _, exp_bits, _ = _INT_VIEW[dtype]
        bias = 2 ** (exp_bits - 1) - 1
        key = torch.arange(2 ** (exp_bits + 5), dtype=torch.int64)
        negative, biased, sub = key >> (exp_bits + 4), (key >> 4) & (2**exp_bits - 1), key & (HIST_SUB - 1)
        exponent = torch.where(biased == 0, 2 - bias, biased - bias + 1).clamp(HIST_MIN_EXP, HIST_MAX_EXP)
        mag = (exponent - HIST_MIN_EXP) * HIST_SUB + sub
        signed = torch.where(negative == 1, _N_MAG_BINS - 1 - mag, _N_MAG_BINS + 1 + mag)
        cached = torch.where((biased == 0) & (sub == 0), _N_MAG_BINS, signed).to(device)
        _KEY_TABLES[(dtype, str(device))] = cached
    return cached


def entry_bin_sums(
    flat: Float[Tensor, " m"], flat64: Float[Tensor, " m"] | None = None, sq64: Float[Tensor, " m"] | None = None
) -> tuple[Tensor, Tensor, Tensor]:
    """(count, Σx, Σx²) per signed log₂ bin (N_ENTRY_BINS, float64) of a float32 / float64 vector of finite
    entries. Σx² lets the finite-d bias see each bin's spread, not only its centroid (``entry_marginal``).
    ``flat64``, ``sq64``: the same entries and their squares already in float64, so they are not formed again.
    One bincount of the bit keys for the counts, two scatter-adds of the float64 values and squares over the
    keys, then the key → bin table (:func:`bins_from_key_sums`)."""
    int_dtype, exp_bits, mantissa_bits = _INT_VIEW[flat.dtype]
    n_keys = 2 ** (exp_bits + 5)
    keys = ((flat.contiguous().view(int_dtype) >> (mantissa_bits - 4)) & (n_keys - 1)).to(torch.int64)
    flat64 = flat.to(torch.float64) if flat64 is None else flat64
    sq64 = flat64 * flat64 if sq64 is None else sq64
    by_key = torch.zeros(2, n_keys, dtype=torch.float64, device=flat.device)
    by_key[0].scatter_add_(0, keys, flat64)
    by_key[1].scatter_add_(0, keys, sq64)
    return bins_from_key_sums(torch.bincount(keys, minlength=n_keys), by_key[0], by_key[1], flat.dtype)


def bins_from_key_sums(
    key_count: Tensor, key_sum: Tensor, key_sq: Tensor, dtype: torch.dtype
) -> tuple[Tensor, Tensor, Tensor]:
    """(count, Σx, Σx²) per signed log₂ bin (N_ENTRY_BINS, float64) from the same sums per IEEE bit key of
    ``dtype`` (sign | exponent | top 4 mantissa bits; see ``_key_table``)."""
    table = _key_table(dtype, key_sum.device)
    out = torch.zeros(3, N_ENTRY_BINS, dtype=torch.float64, device=key_sum.device)
    out[0].index_add_(0, table, key_count.to(torch.float64))
    out[1].index_add_(0, table, key_sum)
    out[2].index_add_(0, table, key_sq)
    return out[0], out[1], out[2]


@dataclass
class ChunkSums:
    """Every O(m·d) sum of one chunk of rows x (m, d), in float64 unless said:
    ``row_sq`` ‖x_i‖², ``row_p1`` p₁(i) = Σ_j x_ij (m,); ``unit_cols`` (4, d) = [Σx_i, Σx̂_i, Σx̂_i p₁(i),
    Σx̂_i p₂(i)] (x̂ = x/‖x‖, zero rows add 0); ``entry_bins`` (count, Σx, Σx²) per signed log₂ entry bin;
    ``n_nonzero`` #{x_ij ≠ 0}; ``centred`` x − shift in x's dtype when a shift was given, else None."""

    row_sq: Tensor
    row_p1: Tensor
    unit_cols: Tensor
    entry_bins: tuple[Tensor, Tensor, Tensor]
    n_nonzero: int
    centred: Tensor | None


def chunk_sums(
    x: Float[Tensor, "m d"], shift: Float[Tensor, " d"] | None = None, *, stream_entries: int | None = None
) -> ChunkSums:
    """The :class:`ChunkSums` of a float32 / float64 chunk: on the CPU one fused compiled pass
    (``saegeo.geometry.fused``) once the stream is large enough to pay for numba's start (``stream_entries``: its
    entries up to and with this chunk, default the chunk's), else (small streams, a GPU) the same sums as torch
    operations on a float64 copy. Rows with a NaN or inf give a non-finite ``row_sq`` (their other sums are not
    to be used)."""
    _, exp_bits, mantissa_bits = _INT_VIEW[x.dtype]
    if x.device.type == "cpu" and fused.worth_it(x.numel() if stream_entries is None else stream_entries):
        row_sq, row_p1, cols, k_count, k_sum, k_sq, n_nonzero, centred = fused.fused_chunk_sums(
            x.detach().numpy(), None if shift is None else shift.numpy(), exp_bits, mantissa_bits
        )
        as_t = torch.from_numpy
        bins = bins_from_key_sums(as_t(k_count), as_t(k_sum), as_t(k_sq), x.dtype)
        return ChunkSums(
            as_t(row_sq), as_t(row_p1), as_t(cols), bins, n_nonzero, None if centred is None else as_t(centred)
        )
    return torch_chunk_sums(x, shift)


def torch_chunk_sums(x: Float[Tensor, "m d"], shift: Float[Tensor, " d"] | None = None) -> ChunkSums:
    """:func:`chunk_sums` as torch operations on a float64 copy of the chunk (any device; the CPU's fused pass
    equals it to float64 rounding)."""
    x64 = x.to(torch.float64)
    x64sq = x64 * x64
    row_sq = x64sq.sum(dim=1)
    row_p1 = x64.sum(dim=1)
    nonzero = row_sq > 0
    inv_norm = torch.where(nonzero, 1.0 / torch.where(nonzero, row_sq, 1.0).sqrt(), 0.0)  # zero rows: no direction
    weights = torch.stack([torch.ones_like(row_p1), inv_norm, inv_norm * row_p1, inv_norm * row_sq])
    finite = torch.isfinite(row_sq)
    bins = entry_bin_sums(
        x[finite].reshape(-1), x64[finite].reshape(-1), x64sq[finite].reshape(-1)
    )  # rows with a NaN would break the bit keys' table; their sums are not used
    centred = None if shift is None else x - shift
    return ChunkSums(row_sq, row_p1, weights @ x64, bins, int(torch.count_nonzero(x)), centred)


def entry_marginal_from_bins(
    count: Float[Tensor, " bins"], total: Float[Tensor, " bins"], sq_total: Float[Tensor, " bins"]
) -> tuple[Tensor, Tensor]:
    """(weights, values) of the two-point law of ``GeometryAccumulator.entry_marginal`` from the per-bin
    (count, Σx, Σx²) of :func:`entry_bin_sums` (N_ENTRY_BINS long, the zero bin in the middle): each occupied
    bin becomes c ± s with half its count each (c = Σx/count, s² = Σx²/count − c²), one point c where s = 0;
    the zero bin is the point 0."""
    occupied = count > 0
    n_bins = count[occupied]
    centroid = total[occupied] / n_bins
    spread = (sq_total[occupied] / n_bins - centroid.square()).clamp(min=0).sqrt()
    zero = torch.nonzero(occupied).squeeze(1) == _N_MAG_BINS
    centroid[zero], spread[zero] = 0.0, 0.0
    spread = torch.where(torch.isfinite(spread) & (spread < centroid.abs()), spread, 0.0)  # rounding, overflow
    single = spread == 0
    weights = torch.cat([torch.where(single, n_bins, n_bins / 2), (n_bins / 2)[~single]])
    values = torch.cat([centroid - spread, (centroid + spread)[~single]])
    return weights, values


GRAM_STRIP_COLS = 256  # column strips of the gram's upper triangle (d ≤ 383: one product)


def symmetric_gram(x: Float[Tensor, "m d"]) -> Float[Tensor, "d d"]:
    """G = xᵀx in x's dtype, from the blocks on and above the diagonal only: for column strips s of ~256 columns,
    G[s, s:] = x[:, s]ᵀ x[:, s:], the upper triangle kept and mirrored — about (1 + 1/n_strips)/2 of the
    multiply-adds of the full product (0.61× its CPU time at d = 768 on 1 thread), each entry the same dot product."""
    d = x.shape[1]
    n_strips = max(1, round(d / GRAM_STRIP_COLS))
    edges = [round(i * d / n_strips) for i in range(n_strips + 1)]
    upper = torch.empty(d, d, dtype=x.dtype, device=x.device)
    for lo, hi in zip(edges[:-1], edges[1:]):
        upper[lo:hi, lo:] = x[:, lo:hi].T @ x[:, lo:]
    upper.triu_()  # the strips' parts below the diagonal: left out, so G is exactly symmetric
    return upper.add_(upper.triu(1).T)  # in place: one d × d temporary, not three (42 MB each at d 2,304 in float64)


_FLOAT8 = tuple(
    getattr(torch, n)
    for n in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz")
    if hasattr(torch, n)
)


def as_rows(batch: Any, d: int | None = None) -> Float[Tensor, "n d"]:
    """Return ``batch`` as a floating (n, d) CPU-or-device tensor without copying when possible.

    Accepts torch tensors, numpy arrays (including read-only memory maps) and nested lists; a 1-D
    input of length d is read as one row. Integer and boolean input is converted to float64, float8 to float32
    (both exact).
    """
    if isinstance(batch, np.ndarray):
        if not batch.flags.writeable:
            with warnings.catch_warnings():  # we never write into it; torch only warns about the possibility
                warnings.simplefilter("ignore", UserWarning)
                t = torch.from_numpy(batch)
        else:
            t = torch.from_numpy(batch)
    elif isinstance(batch, Tensor):
        t = batch.detach()
    else:
        t = torch.as_tensor(np.asarray(batch))
    if t.dtype in _FLOAT8:  # every float8 value is a float32 one; torch has no sums or matmuls in float8
        t = t.float()
    if not (t.is_floating_point()):
        if t.dtype.is_complex:
            raise BadInputError(f"complex input ({t.dtype}) is not supported; pass real activations")
        t = t.to(torch.float64)
    if t.ndim == 1 and d is not None and t.shape[0] == d:
        t = t.unsqueeze(0)
    if t.ndim != 2:
        raise BadInputError(f"expected a 2-D (rows, d) batch, got shape {tuple(t.shape)}; reshape to (-1, d) first")
    if d is not None and t.shape[1] != d:
        raise BadInputError(f"batch has {t.shape[1]} columns but the accumulator has d = {d}")
    return t


def unit_vector_sum(
    x: Float[Tensor, "m d"], norms: Float[Tensor, " m"] | None = None
) -> tuple[Float[Tensor, " d"], int]:
    """(Σ_i x_i/‖x_i‖ over the rows with ‖x_i‖ > 0, in float64; how many such rows).

    One matvec (1/‖x‖)ᵀX in x's dtype, so no normalised copy of the batch is made; zero rows have
    no direction and are left out. ``norms`` (any float dtype) saves recomputing them.
    """
    norms = torch.linalg.vector_norm(x, dim=1) if norms is None else norms
    nonzero = norms > 0
    inv_norm = torch.where(nonzero, 1.0 / torch.where(nonzero, norms, 1.0), 0.0)
    return (inv_norm.to(x.dtype) @ x).to(torch.float64), int(nonzero.sum())


def anisotropy_from_unit_mean(unit_mean: Float[Tensor, " d"], n: int) -> float:
    """A = mean over i ≠ j of cos(x_i, x_j) = (n‖m̂‖² − 1)/(n − 1), m̂ = mean of the n unit vectors.

    Exact: Σ_{i≠j} x̂_i·x̂_j = ‖Σ x̂_i‖² − n. Needs n ≥ 2 (nonzero rows).
    """
    if n < 2:
        raise BadInputError(f"the mean pairwise cosine needs at least 2 nonzero rows, got {n}")
    sq = float(torch.as_tensor(unit_mean, dtype=torch.float64).square().sum())
    return (n * sq - 1.0) / (n - 1)


def blocked_jackknife_anisotropy_sd(
    block_unit_sums: Float[Tensor, "G d"], block_counts: Int[Tensor, " G"] | np.ndarray
) -> float:
    """The sd of A over a stream whose rows are not independent (tokens of one window), by the delete-a-block
    jackknife over G contiguous blocks of the stream (their unit sums s_g = Σ_{i∈g} x̂_i and counts n_g):
    A_(g) = (‖U − s_g‖² − (n − n_g)) / ((n − n_g)(n − n_g − 1)), U = Σ_g s_g, n = Σ_g n_g, and
    sd² = (G − 1)/G · Σ_g (A_(g) − mean_g A_(g))². Blocks longer than the correlation (a window) make it valid where
    the iid A_sd is not (docs/statistics.md, "Dependent rows"); needs G ≥ 2 and every n − n_g ≥ 2."""
    sums = torch.as_tensor(block_unit_sums, dtype=torch.float64)
    counts = torch.as_tensor(np.asarray(block_counts), dtype=torch.float64)
    if sums.shape[0] < 2:
        raise BadInputError(f"the blocked jackknife needs at least 2 blocks, got {sums.shape[0]}")
    total, n = sums.sum(0), float(counts.sum())
    rest = n - counts
    if bool((rest < 2).any()):
        raise BadInputError("the blocked jackknife needs at least 2 rows outside every block")
    leave_out = ((total - sums).square().sum(1) - rest) / (rest * (rest - 1))
    g = sums.shape[0]
    return math.sqrt((g - 1) / g * float((leave_out - leave_out.mean()).square().sum()))


class UnitMean:
    """Mergeable Σ x/‖x‖ over nonzero rows and their count n: A = (n‖m̂‖² − 1)/(n − 1) of a stream.

    What a GeometryAccumulator keeps for A, without its d × d scatter (e.g. the SAE metrics' x̂ − b_dec).
    """

    def __init__(self, d: int):
        self.unit_sum = torch.zeros(int(d), dtype=torch.float64)
        self.n = 0

    def add(self, x: Float[Tensor, "m d"]) -> UnitMean:
        unit_sum, n = unit_vector_sum(x)
        self.unit_sum += unit_sum.to(self.unit_sum.device)
        self.n += n
        return self

    def merge(self, other: UnitMean) -> UnitMean:
        self.unit_sum += other.unit_sum.to(self.unit_sum.device)
        self.n += other.n
        return self

    def state_dict(self) -> dict[str, Any]:
        return {"unit_sum": self.unit_sum.clone(), "n": self.n}

    @classmethod
    def from_state_dict(cls, sd: dict[str, Any]) -> UnitMean:
        out = cls(len(sd["unit_sum"]))
        out.unit_sum, out.n = torch.as_tensor(sd["unit_sum"]).to(torch.float64).clone(), int(sd["n"])
        return out

    @property
    def unit_mean(self) -> Float[Tensor, " d"]:
        """m̂ = mean of x/‖x‖ over the nonzero rows."""
        if self.n < 1:
            raise BadInputError("the unit-vector mean needs a nonzero row; none was added")
        return self.unit_sum / self.n

    def anisotropy(self) -> float | None:
        """A = (n‖m̂‖² − 1)/(n − 1); None with fewer than 2 nonzero rows."""
        return anisotropy_from_unit_mean(self.unit_mean, self.n) if self.n >= 2 else None


class GeometryAccumulator:
    """Mergeable float64 sums of rows: n, μ, centred scatter, Σx̂, Σ‖x‖ and pooled sign statistics.

    Zero-norm rows count in n, μ and Σ but not in the unit-vector statistics (``n_zero``).
    Rows with a NaN/inf raise :class:`BadInputError` naming the batch and row, or are skipped and
    counted in ``n_nonfinite_skipped`` with ``skip_nonfinite=True``.
    """

    def __init__(
        self,
        d: int,
        *,
        skip_nonfinite: bool = False,
        chunk_rows: int = 8192,
        gram_dtype: torch.dtype | None = None,
        sample_rows: int = SD_SAMPLE_ROWS,
        sample_seed: int = 0,
        row_start: int = 0,
    ):
        if int(d) < 1:
            raise BadInputError(f"d must be ≥ 1, got {d}")
        self.d = int(d)
        self.skip_nonfinite = skip_nonfinite
        self.chunk_rows = int(chunk_rows)
        # None: float32 gram for ≤32-bit input, float64 for float64 input. torch.float64 forces exactness.
        self.gram_dtype = gram_dtype
        self.n = 0
        self.n_zero = 0
        self.n_nonfinite_skipped = 0
        self.n_batches = 0
        self.n_rows_seen = 0  # rows offered to add(), including skipped ones: for global row numbers
        self.n_nonzero_entries = 0
        f64 = dict(dtype=torch.float64)
        self._mean = torch.zeros(self.d, **f64)
        self._scatter = torch.zeros(self.d, self.d, **f64)  # Σ (x − μ)(x − μ)ᵀ
        self._unit_sum = torch.zeros(self.d, **f64)  # Σ x/‖x‖ over nonzero rows
        self._norm_sum = torch.zeros((), **f64)  # Σ ‖x‖
        self._sq_sum = torch.zeros((), **f64)  # Σ ‖x‖² = Σ over all entries of x²
        self._abs_sum = torch.zeros((), **f64)  # Σ |x_ij|
        self._neg_sq_sum = torch.zeros((), **f64)  # Σ min(x_ij, 0)²
        self._gram_eps = torch.zeros(
            (), **f64
        )  # largest unit roundoff used in a gram (sets the numerical-rank tolerance)
        # the row sums of the null's influence function
        self._row_power_sum = torch.zeros(N_ROW_POWERS, **f64)  # Σ_i p_k(i), p_k(i) = Σ_j x_ij^k, k = 1, 2
        self._row_power_outer = torch.zeros(N_ROW_POWERS, N_ROW_POWERS, **f64)  # Σ_i p_k(i) p_l(i)
        self._unit_by_row_power = torch.zeros(self.d, N_ROW_POWERS, **f64)  # Σ_i x̂_i p_k(i)
        self._entry_hist_count = torch.zeros(N_ENTRY_BINS, **f64)  # entries per signed log₂ bin
        self._entry_hist_sum = torch.zeros(N_ENTRY_BINS, **f64)  # Σ x per bin (bin centroids)
        self._entry_hist_sq_sum = torch.zeros(N_ENTRY_BINS, **f64)  # Σ x² per bin (spread within each bin)
        self._norm_hist_count = torch.zeros(N_NORM_BINS, **f64)  # rows per log₂ bin of ‖x‖
        self._norm_hist_sq_sum = torch.zeros(N_NORM_BINS, **f64)  # Σ ‖x‖² per bin
        # a seeded uniform sample of the nonzero rows (bottom-k by global row index row_start + i) in place of the
        # full Σx̂x̂ᵀ: what only the sd of Â needs (see unit_sample_sums)
        self.sample = RowReservoir(sample_rows, self.d, sample_seed, start=row_start, dtype=torch.float32)
        self._sample_cache: tuple | None = None  # (v·S, Σ‖v‖⁴, VᵀV) of the sample, until rows are added

    # ------------------------------------------------------------------ adding rows
    def add(self, batch: Any, *, source: str | None = None) -> GeometryAccumulator:
        """Add the rows of ``batch`` (n, d). ``source`` (e.g. a file name) is quoted in error messages."""
        x = as_rows(batch, self.d)
        if x.device != self._mean.device:
            if self.n == 0:
                self.to(x.device)  # accumulate where the batches live (e.g. on the GPU that produced them)
            else:
                x = x.to(self._mean.device)
        batch_index = self.n_batches
        row_offset = self.n_rows_seen
        for start in range(0, x.shape[0], self.chunk_rows):
            self._add_chunk(x[start : start + self.chunk_rows], batch_index, row_offset, start, source)
        self.n_batches += 1
        self.n_rows_seen += x.shape[0]
        self._sample_cache = None
        return self

    def _add_chunk(self, x: Tensor, batch_index: int, row_offset: int, start: int, source: str | None) -> None:
        if x.dtype not in (torch.float32, torch.float64):
            x = x.to(torch.float32)  # half / bfloat16: compute in float32
        if self.gram_dtype is not None and x.dtype != self.gram_dtype:
            x = x.to(self.gram_dtype)
        # Shift for the gram: the running mean rounded to the compute dtype (the first chunk: its own mean, known
        # only after the row sums, so its shifted copy is made afterwards).
        shift = self._mean.to(x.dtype, copy=True) if self.n > 0 else None
        # the stream's entries so far decide the path (the ragged last chunk of a long stream stays fused)
        stream_entries = (row_offset + start + x.shape[0]) * self.d
        sums = chunk_sums(x, shift, stream_entries=stream_entries)
        keep, n_offered = None, x.shape[0]
        bad = ~torch.isfinite(sums.row_sq)
        if bad.any():
            nonfinite = ~torch.isfinite(x[bad]).all(dim=1)
            if nonfinite.any():
                bad_rows = bad.nonzero().squeeze(1)[nonfinite]
                if not self.skip_nonfinite:
                    r = int(bad_rows[0])
                    where = f" of {source}" if source else ""
                    raise BadInputError(
                        f"non-finite value (NaN or inf) in batch {batch_index}{where}, row {start + r} "
                        f"(global row {row_offset + start + r}); {len(bad_rows)} such row(s) in this chunk. "
                        "Fix the producer, or pass skip_nonfinite=True (CLI: --skip-nonfinite) to skip and count them."
                    )
                keep = torch.ones(x.shape[0], dtype=torch.bool, device=x.device)
                keep[bad_rows] = False
                self.n_nonfinite_skipped += len(bad_rows)
                x = x[keep]
                sums = chunk_sums(x, shift, stream_entries=stream_entries)  # again, without the rows skipped
        m = x.shape[0]
        if m == 0:
            self.sample.seen += n_offered  # every row skipped: they still take their global indices
            return
        sq_norms = sums.row_sq
        norms = sq_norms.sqrt()
        nonzero = norms > 0
        self._add_sample(x, nonzero, keep, n_offered)
        row_sum = self._add_row_sums(sums)
        self._add_histograms(sums, sq_norms, norms, nonzero, row_sum)
        centred = sums.centred
        if x.dtype != torch.float64 and float(sq_norms.max()) > torch.finfo(x.dtype).max:
            x, centred = x.to(torch.float64), None  # finite rows whose norm overflows the compute dtype: a float64 gram
        self._add_centred_gram(x, row_sum, centred)
        self.n_zero += m - int(nonzero.sum())
        self._norm_sum += norms.sum()
        self._sq_sum += sq_norms.sum()

    def _add_sample(self, x: Tensor, nonzero: Tensor, keep: Tensor | None, n_offered: int) -> None:
        """Offer the chunk's nonzero rows to the seeded sample (global row indices: skipped rows take theirs)."""
        if x.dtype == torch.float64 and self.sample.dtype != torch.float64:
            self.sample.rows = self.sample.rows.to(torch.float64)  # float64 rows: the sample keeps their precision
        if keep is None:
            self.sample.add(x, nonzero)
            return
        eligible = torch.zeros(n_offered, dtype=torch.bool, device=x.device)
        eligible[keep] = nonzero
        full = torch.zeros(n_offered, x.shape[1], dtype=x.dtype, device=x.device)
        full[keep] = x
        self.sample.add(full, eligible)

    def _add_centred_gram(self, x: Tensor, row_sum: Tensor, centred: Tensor | None = None) -> None:
        """(n, μ, M₂) with the chunk: the gram of its rows shifted by c, then Chan's update. ``centred``: x − c
        already formed by the fused pass (c the running mean), else it is formed here."""
        m = x.shape[0]
        # Shift by the running mean (the chunk's own mean for the first chunk), rounded to the compute dtype:
        # the gram then sees only the spread, whatever the size of the mean. Σ(x − c) is exact (c is a
        # compute-dtype number, Σx is float64): the gram is the one sum over rows left in the compute dtype.
        shift = (self._mean if self.n > 0 else row_sum / m).to(x.dtype, copy=True)
        shift64 = shift.to(torch.float64)
        xc = x - shift if centred is None else centred
        gram = symmetric_gram(xc)
        del xc, centred
        centred_sum = row_sum - m * shift64
        self._gram_eps = torch.maximum(self._gram_eps, torch.tensor(torch.finfo(x.dtype).eps, dtype=torch.float64))
        # Chan's update with a block of m rows: mean_b = c + s/m, M₂ᵇ = G − s sᵀ/m, δ = mean_b − mean_a.
        n_a, n = self.n, self.n + m
        delta = (shift64 - self._mean) + centred_sum / m
        self._scatter.add_(gram)
        # both rank-one terms in one pass: [s δ] diag(−1/m, nₐm/n) [s δ]ᵀ
        left = torch.stack([centred_sum, delta], dim=1)
        right = left * torch.tensor([-1.0 / m, n_a * m / n], dtype=torch.float64, device=left.device)
        self._scatter.addmm_(left, right.T)
        self._mean.add_(delta, alpha=m / n)
        self.n = n

    def _add_row_sums(self, sums: ChunkSums) -> Tensor:
        """Add Σx̂, the row power sums Σp_k, Σp_kp_l and Σx̂p_k, and return Σx: the O(m·d) sums, all in float64.

        Why float64: the null test's sd is a small difference of these sums (ζ₁ = mᵀCm − ‖m‖⁴ ≈ 3e-4 where
        ‖m‖⁴ ≈ 0.88 when A is near 1), and float32 sums over a chunk (relative error ~1e-7) moved it with the chunk
        size (benchmarks/README.md#numbers-behind-code-comments).
        """
        powers = torch.stack([sums.row_p1, sums.row_sq], dim=1)
        self._row_power_sum += powers.sum(dim=0)
        self._row_power_outer += powers.T @ powers
        self._unit_sum += sums.unit_cols[1]
        self._unit_by_row_power += sums.unit_cols[2:4].T
        return sums.unit_cols[0]

    def _add_histograms(
        self, sums: ChunkSums, sq_norms: Tensor, norms: Tensor, nonzero: Tensor, row_sum: Tensor
    ) -> None:
        """The entry and row-norm histograms (fixed log₂ bins) and the sign sums. Σx₋ and Σx₋² are the negative
        bins' Σx and Σx² (the same float64 sums, grouped; float32 subnormals below 2^−130 sit in the zero bin and
        are left out: |Σ| < 2^−130 per entry), Σ|x| = Σx − 2Σx₋."""
        count, total, sq_total = sums.entry_bins
        self._entry_hist_count += count
        self._entry_hist_sum += total
        self._entry_hist_sq_sum += sq_total
        self._abs_sum += float(row_sum.sum()) - 2 * float(total[:_N_MAG_BINS].sum())
        self._neg_sq_sum += sq_total[:_N_MAG_BINS].sum()
        self.n_nonzero_entries += sums.n_nonzero
        norm_bins = torch.where(nonzero, 1 + log2_bin(torch.where(nonzero, norms, 1.0)), 0)
        self._norm_hist_count += torch.bincount(norm_bins, minlength=N_NORM_BINS).to(torch.float64)
        self._norm_hist_sq_sum.index_add_(0, norm_bins, sq_norms)

    def _combine(self, m: int, mean_b: Tensor, scatter_b: Tensor) -> None:
        """Chan et al.'s parallel update of (n, μ, M₂) with a block of m rows."""
        n_a = self.n
        n = n_a + m
        delta = mean_b - self._mean
        self._mean += delta * (m / n)
        self._scatter += scatter_b + torch.outer(delta, delta) * (n_a * m / n)
        self.n = n

    # ------------------------------------------------------------------ combining accumulators
    def merge(self, other: GeometryAccumulator) -> GeometryAccumulator:
        """Fold ``other`` into ``self`` (exact to float64 rounding) and return ``self``."""
        if other.d != self.d:
            raise BadInputError(f"cannot merge accumulators with d = {self.d} and d = {other.d}")
        if other.n > 0:
            self._combine(other.n, other._mean.to(self._mean.device), other._scatter.to(self._mean.device))
        self.n_zero += other.n_zero
        self.n_nonfinite_skipped += other.n_nonfinite_skipped
        self.n_batches += other.n_batches
        self.n_rows_seen += other.n_rows_seen
        self.n_nonzero_entries += other.n_nonzero_entries
        for name in ("_unit_sum", "_norm_sum", "_sq_sum", "_abs_sum", "_neg_sq_sum") + tuple(
            "_" + k for k in _SUM_KEYS
        ):
            getattr(self, name).add_(getattr(other, name).to(self._mean.device))
        self._gram_eps = torch.maximum(self._gram_eps, other._gram_eps.to(self._mean.device))
        if (other.sample.k, other.sample.seed) != (self.sample.k, self.sample.seed):
            raise BadInputError(
                f"cannot merge accumulators with different row samples (k = {self.sample.k}, seed = "
                f"{self.sample.seed} and k = {other.sample.k}, seed = {other.sample.seed})"
            )
        self.sample.merge(other.sample)
        self._sample_cache = None
        return self

    def __add__(self, other: GeometryAccumulator) -> GeometryAccumulator:
        return self.copy().merge(other)

    def copy(self) -> GeometryAccumulator:
        return GeometryAccumulator.from_state_dict(self.state_dict())

    def state_dict(self) -> dict[str, Tensor | int]:
        """Everything needed to resume or merge: int counts and float64 tensors (cloned)."""
        sd: dict[str, Tensor | int] = {k: int(getattr(self, k)) for k in _INT_KEYS if k != "version"}
        sd["version"] = STATE_VERSION
        for k in _TENSOR_KEYS + _SUM_KEYS:
            sd[k] = getattr(self, "_" + k).detach().clone()
        sd.update(
            sample_k=self.sample.k,
            sample_seed=self.sample.seed,
            sample_seen=self.sample.seen,
            sample_rows=self.sample.rows.clone(),
            sample_priority=torch.from_numpy(self.sample.priority.view(np.int64).copy()),  # uint64 bits
        )
        return sd

    @classmethod
    def from_state_dict(cls, sd: dict[str, Any], **kwargs: Any) -> GeometryAccumulator:
        """Rebuild from :meth:`state_dict` output (ints may also be 0-d tensors, as after safetensors)."""
        version = int(sd.get("version", STATE_VERSION))
        if version != STATE_VERSION:
            raise BadInputError(
                f"accumulator state version {version} is not supported (expected {STATE_VERSION}; version 1 lacks "
                "the unit-vector second moment and the histograms): re-accumulate the rows"
            )
        missing = [k for k in _INT_KEYS + _TENSOR_KEYS + _SUM_KEYS + _SAMPLE_KEYS if k not in sd and k != "version"]
        if missing:
            raise BadInputError(f"accumulator state dict lacks {missing}")
        acc = cls(int(sd["d"]), **kwargs)
        for k in _INT_KEYS:
            if k != "version":
                setattr(acc, k, int(sd[k]))
        for k in _TENSOR_KEYS + _SUM_KEYS:
            t = torch.as_tensor(sd[k]).to(torch.float64).clone()
            expected = getattr(acc, "_" + k).shape
            if t.shape != expected:
                raise BadInputError(f"accumulator state '{k}' has shape {tuple(t.shape)}, expected {tuple(expected)}")
            setattr(acc, "_" + k, t)
        rows = torch.as_tensor(sd["sample_rows"])
        acc.sample = RowReservoir.from_state_dict(
            {
                "k": int(sd["sample_k"]),
                "d": acc.d,
                "seed": int(sd["sample_seed"]),
                "seen": int(sd["sample_seen"]),
                "rows": rows if rows.dtype == torch.float64 else rows.to(torch.float32),
                "priority": torch.as_tensor(sd["sample_priority"]).to(torch.int64).numpy().view(np.uint64),
            }
        )
        return acc

    def to(self, device: torch.device | str) -> GeometryAccumulator:
        """Move the float64 state to ``device`` (e.g. to accumulate on a GPU); returns self."""
        for k in _TENSOR_KEYS + _SUM_KEYS:
            setattr(self, "_" + k, getattr(self, "_" + k).to(device))
        return self

    # ------------------------------------------------------------------ read-outs
    def _require_rows(self, what: str, need: int = 1) -> None:
        if self.n < need:
            raise BadInputError(f"{what} needs at least {need} row(s); the accumulator has {self.n}")

    @property
    def n_unit(self) -> int:
        """Rows with nonzero norm (those that enter the unit-vector statistics)."""
        return self.n - self.n_zero

    @property
    def mean(self) -> Float[Tensor, " d"]:
        """μ = (1/n) Σ x."""
        self._require_rows("the mean")
        return self._mean.clone()

    def covariance(self) -> Float[Tensor, "d d"]:
        """Σ = (1/n) Σ (x − μ)(x − μ)ᵀ (population covariance, symmetrised)."""
        self._require_rows("the covariance")
        cov = self._scatter / self.n
        return (cov + cov.T) / 2

    def second_moment(self) -> Float[Tensor, "d d"]:
        """S = (1/n) Σ x xᵀ = Σ + μμᵀ."""
        return self.covariance() + torch.outer(self._mean, self._mean)

    @property
    def unit_mean(self) -> Float[Tensor, " d"]:
        """m̂ = mean of x/‖x‖ over the nonzero rows."""
        if self.n_unit < 1:
            raise BadInputError(f"the unit-vector mean needs a nonzero row; all {self.n} row(s) have zero norm")
        return self._unit_sum / self.n_unit

    @property
    def mean_norm(self) -> float:
        """E‖x‖ over all n rows (zero rows included)."""
        self._require_rows("the mean norm")
        return float(self._norm_sum / self.n)

    @property
    def mean_sq_norm(self) -> float:
        """E‖x‖² = tr S."""
        self._require_rows("the mean squared norm")
        return float(self._sq_sum / self.n)

    @property
    def gram_eps(self) -> float:
        """Unit roundoff of the least precise gram accumulated (float32: 1.2e-7, float64: 2.2e-16)."""
        return float(self._gram_eps)

    # sign statistics, pooled over all n·d entries
    @property
    def pooled_mean(self) -> float:
        """m̄ = mean of all entries x_ij = mean over coordinates of μ."""
        return float(self.mean.mean())

    @property
    def pooled_mean_square(self) -> float:
        """s̄ = mean of all x_ij² = tr S / d."""
        self._require_rows("the pooled mean square")
        return float(self._sq_sum / (self.n * self.d))

    @property
    def fraction_nonzero(self) -> float:
        """q = fraction of entries x_ij ≠ 0."""
        self._require_rows("the nonzero fraction")
        return self.n_nonzero_entries / (self.n * self.d)

    @property
    def negative_energy_fraction(self) -> float:
        """Σ min(x,0)² / Σ x² (0 for non-negative data, 1/2 for sign-symmetric data); 0 if all entries are 0."""
        self._require_rows("the negative-energy fraction")
        total = float(self._sq_sum)
        return float(self._neg_sq_sum) / total if total > 0 else 0.0

    @property
    def magnitude_ratio(self) -> float:
        """r = (E|a|)² / E[a²] over the nonzero entries (1/2 for Exp, 2/π for half-normal, 1 for constant)."""
        if self.n_nonzero_entries == 0:
            return 0.0
        mean_abs = float(self._abs_sum) / self.n_nonzero_entries
        return mean_abs**2 / (float(self._sq_sum) / self.n_nonzero_entries)

    # unit-vector second moment and the null's influence sums (version 2)
    @property
    def sample_exact(self) -> bool:
        """True when the row sample holds every nonzero row (n_unit ≤ its k): the unit-vector sums are exact."""
        return self.sample.rows.shape[0] >= self.n_unit

    def _unit_sample(self) -> tuple[Tensor, float, Tensor]:
        """(v_i·S per sampled row, Σ‖v_i‖⁴, VᵀV), v_i = x̂_i − m̂ over the sampled rows, m̂ = S/n the exact
        unit mean.

        float64 throughout when the sample is every row (exact); VᵀV from a float32 gram of the centred v
        otherwise (its rounding, ≲ √k·2⁻²⁴ relative, is far below the sampling error it sits beside)."""
        if self._sample_cache is None:
            rows = self.sample.rows
            k = rows.shape[0]
            unit_sum = self._unit_sum.cpu()
            unit_mean = unit_sum / self.n_unit
            v_dtype = torch.float64 if self.sample_exact else torch.float32  # the gram's dtype
            if fused.worth_it(rows.numel()):
                v_all, v_dot_s, _, fourth = (  # (the kernel's row power sums are not needed here)
                    torch.from_numpy(a)
                    for a in fused.unit_sample_rows(
                        rows.numpy(),
                        unit_mean.numpy(),
                        unit_sum.numpy(),
                        np.float64 if self.sample_exact else np.float32,
                    )
                )
            else:  # the same numbers in blocks of rows (float64 temporaries that stay in cache)
                v_dot_s = torch.empty(k, dtype=torch.float64)
                fourth = torch.empty(k, dtype=torch.float64)
                v_all = torch.empty(k, self.d, dtype=v_dtype)
                for lo in range(0, k, _SAMPLE_BLOCK_ROWS):
                    block = rows[lo : lo + _SAMPLE_BLOCK_ROWS].to(torch.float64)
                    v = block / torch.linalg.vector_norm(block, dim=1, keepdim=True) - unit_mean
                    hi = lo + block.shape[0]
                    v_dot_s[lo:hi] = v @ unit_sum
                    fourth[lo:hi] = torch.linalg.vector_norm(v, dim=1).pow(4)
                    v_all[lo:hi] = v
            gram = symmetric_gram(v_all).to(torch.float64)
            self._sample_cache = (v_dot_s, float(fourth.sum()), gram)  # symmetric_gram: exactly symmetric
        return self._sample_cache

    def unit_pair_sums(self) -> tuple[float, float, float]:
        """(‖S‖², tr G², SᵀGS) of S = Σx̂_i, G = Σx̂_ix̂_iᵀ over the n nonzero rows: ‖S‖² exact, the two sums
        of G exact when the sample holds every row, else design-unbiased from the k sampled rows (a simple random
        sample without replacement) with S, m̂ = S/n and the row power sums exact. With v_i = x̂_i − m̂
        (Σ_all v_i = 0) and h̃_i = v_i·S,

            SᵀGS  = ‖S‖⁴/n + Σ_all h̃_i²,
            tr G² = ‖S‖⁴/n² + (2/n)·Σ_all h̃_i² + Σ_all ‖v_i‖⁴ + Σ_{i≠j} (v_i·v_j)²;

        Σ_all f_i is estimated by (n/k)·Σ_sample f_i and Σ_{i≠j} by n(n−1)/(k(k−1))·Σ_{i≠j in sample}
        (docs/statistics.md bounds the error)."""
        if self.n_unit < 1:
            raise BadInputError(f"the unit-vector sums need a nonzero row; all {self.n} row(s) have zero norm")
        n, k = self.n_unit, self.sample.rows.shape[0]
        unit_sum = self._unit_sum.cpu()
        s_sq = float(unit_sum @ unit_sum)
        v_dot_s, fourth, gram = self._unit_sample()
        scale = n / k
        along = scale * float(v_dot_s @ v_dot_s)  # Σ_all h̃²
        pairs = float((gram * gram).sum()) - fourth  # Σ_{i≠j in sample} (v_i·v_j)²
        pair_scale = n * (n - 1) / (k * (k - 1)) if k > 1 else 0.0
        sgs = s_sq**2 / n + along
        tr_g2 = s_sq**2 / n**2 + 2 * along / n + scale * fourth + pair_scale * pairs
        return s_sq, tr_g2, sgs

    def unit_second_moment(self) -> Float[Tensor, "d d"]:
        """C = (1/n_unit) Σ x̂x̂ᵀ over the nonzero rows (tr C = 1); its spectrum is the uniformity of directions.
        Exact when the sample holds every nonzero row, else m̂m̂ᵀ + (1/k)Σ_sample v_iv_iᵀ (design-unbiased, m̂ exact)."""
        if self.n_unit < 1:
            raise BadInputError(
                f"the unit-vector second moment needs a nonzero row; all {self.n} row(s) have zero norm"
            )
        m = self._unit_sum.cpu() / self.n_unit
        return torch.outer(m, m) + self._unit_sample()[2] / self.sample.rows.shape[0]

    def row_power_sums(self) -> tuple[Tensor, Tensor, Tensor]:
        """(Σ_i p_k, Σ_i p_k p_l, Σ_i x̂_i p_k) with p_k(i) = Σ_j x_ij^k, k = 1, 2 (columns/entries in k order);
        zero rows add nothing. They give the per-row influence of the pooled moments m_k = Σ p_k/(n·d) that
        A_null and its finite-d bias are functions of."""
        return self._row_power_sum.clone(), self._row_power_outer.clone(), self._unit_by_row_power.clone()

    def entry_histogram(self) -> tuple[Tensor, Tensor]:
        """(count, centroid) of the occupied signed log₂ bins of all n·d entries (zero rows' entries included);
        centroid = Σx/count in the bin (exactly 0 for the zero bin, which also holds the subnormals below
        2^−130 in float32)."""
        centroid = self._entry_hist_sum / self._entry_hist_count.clamp(min=1)
        centroid[_N_MAG_BINS] = 0.0
        occupied = self._entry_hist_count > 0
        return self._entry_hist_count[occupied].clone(), centroid[occupied]

    def entry_marginal(self) -> tuple[Tensor, Tensor]:
        """(weights, values) of a discrete law with each occupied entry bin's count, Σx and Σx² exactly: two
        points c ± s of half its count (c = Σx/count, s² = Σx²/count − c²), one point where s = 0; the zero
        bin is the point 0. The pooled m̄ and s̄ of this law are those of the entries, and the finite-d bias read
        off it is exact to third order in the bin width (one point per bin, the centroid, loses the within-bin
        variance: ~0.2 % of the bias for ReLU at 1/16 octave). Zero rows' entries included, as in
        ``entry_histogram``."""
        return entry_marginal_from_bins(self._entry_hist_count, self._entry_hist_sum, self._entry_hist_sq_sum)

    def row_norm_histogram(self) -> tuple[Tensor, Tensor, Tensor]:
        """(lower bin edge of ‖x‖, count, Σ‖x‖²) for each occupied row-norm bin, ascending (zero rows: edge 0)."""
        k = torch.arange(N_NORM_BINS, dtype=torch.float64)
        mag = (k - 1).clamp(min=0)
        exponent = torch.div(mag, HIST_SUB, rounding_mode="floor") + HIST_MIN_EXP
        lower = (0.5 + (mag % HIST_SUB) / (2 * HIST_SUB)) * torch.pow(2.0, exponent)
        lower[0] = 0.0
        occupied = self._norm_hist_count > 0
        return lower[occupied], self._norm_hist_count[occupied].clone(), self._norm_hist_sq_sum[occupied].clone()

    def __repr__(self) -> str:
        return (
            f"GeometryAccumulator(d={self.d}, n={self.n}, n_zero={self.n_zero}, "
            f"n_nonfinite_skipped={self.n_nonfinite_skipped}, n_batches={self.n_batches})"
        )
