"""One fused pass over a CPU chunk of rows: every O(m·d) sum the GeometryAccumulator takes, read once from memory.

``fused_chunk_sums(x, shift, exp_bits, mantissa_bits) -> (row_sq, row_p1, unit_cols, key_count, key_sum, key_sq,
n_nonzero, centred)`` for a C-contiguous float32 or float64 (m, d) array x:

    row_sq[i] = Σ_j x_ij²,  row_p1[i] = Σ_j x_ij                                     (float64, per row)
    unit_cols = [Σ_i x_i, Σ_i x_i/‖x_i‖, Σ_i x_i p₁(i)/‖x_i‖, Σ_i x_i p₂(i)/‖x_i‖]    (4, d) float64; zero rows: 0
    key_count, key_sum, key_sq: count, Σx, Σx² per IEEE bit key (sign | exponent | top 4 mantissa bits) of every
        entry, 2^(exp_bits + 5) keys (the accumulator maps keys to its signed log₂ bins)
    n_nonzero = #{x_ij ≠ 0};  centred = x − shift in x's dtype (None when no shift is given)

Why a compiled loop: each of these is a memory-bound pass in torch (a fresh float64 copy of the chunk, its squares,
the bit keys, a bincount, two scatter-adds, a count), about twenty passes over the chunk; fused, the row is read
once while it sits in L1, and the entry sums cost less than the chunk's gram. Every sum is float64, added row by
row in a fixed order (rows in order, entries in order), so the result does not depend on the thread count or the
BLAS; it equals the torch path (``GeometryAccumulator`` on another device) to float64 rounding.

Numba is imported on first use; ``worth_it(n_entries)`` says whether a chunk is large enough to pay for that: the
import and the first call cost ~1–2 s once per process (the compiled loop is cached on disk after the first run),
the loop saves ~50 ns an entry over the torch path, so chunks below MIN_ENTRIES (small inputs, most tests, a quick
CLI call) take the torch path and never import numba. Without numba the torch path serves every chunk.
"""

from __future__ import annotations

from typing import Any

import numpy as np

_KERNEL: Any = None
# The key sums live in one (tables, keys, 3) array, (count, Σx, Σx²) side by side: one cache line per key touched,
# where three separate arrays touch three (benchmarks/README.md#numbers-behind-code-comments). Entries j mod 2 add into their own table, so runs of one key (the zeros
# of ReLU codes) do not wait on each other's adds.
N_KEY_TABLES = 2


MIN_ENTRIES = 1 << 21  # 2.1M entries: e.g. 2,731 rows of d = 768, 8,192 of d = 256


def available() -> bool:
    """True when the compiled kernel can be used (numba imports)."""
    return _kernel() is not None


def worth_it(n_entries: int) -> bool:
    """True when a chunk of ``n_entries`` entries should take the fused loop (large enough, and numba imports)."""
    return n_entries >= MIN_ENTRIES and available()


def _kernel() -> Any:
    global _KERNEL
    if _KERNEL is None:
        try:
            import numba
        except ImportError:  # pragma: no cover - numba is a dependency; the torch path stands in
            _KERNEL = False
            return None
        _KERNEL = numba.njit(cache=True, nogil=True, error_model="numpy")(_chunk_sums_loop)
    return _KERNEL or None


def _chunk_sums_loop(x, bits, shift, centred, write_centred, key_shift, key_mask, key_sums, unit_cols, row_sq,
                     row_p1):  # fmt: skip
    m, d = x.shape
    n_tables = key_sums.shape[0]
    n_nonzero = 0
    for i in range(m):
        p1 = 0.0
        p2 = 0.0
        for j in range(d):
            v = np.float64(x[i, j])
            p1 += v
            p2 += v * v
            key = (bits[i, j] >> key_shift) & key_mask
            t = j % n_tables
            key_sums[t, key, 0] += 1.0  # exact below 2^53 entries
            key_sums[t, key, 1] += v
            key_sums[t, key, 2] += v * v
            if v != 0.0:
                n_nonzero += 1
        if write_centred:
            for j in range(d):
                centred[i, j] = x[i, j] - shift[j]
        row_sq[i] = p2
        row_p1[i] = p1
        inv_norm = 1.0 / np.sqrt(p2) if p2 > 0.0 else 0.0  # zero rows have no direction
        by_p1 = inv_norm * p1
        by_p2 = inv_norm * p2
        for j in range(d):
            v = np.float64(x[i, j])
            unit_cols[0, j] += v
            unit_cols[1, j] += inv_norm * v
            unit_cols[2, j] += by_p1 * v
            unit_cols[3, j] += by_p2 * v
    return n_nonzero


def fused_chunk_sums(
    x: np.ndarray, shift: np.ndarray | None, exp_bits: int, mantissa_bits: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, int, np.ndarray | None]:
    """The sums of the module docstring for one chunk (float32 or float64, (m, d)); ``exp_bits``/``mantissa_bits``
    of its dtype (8/23 or 11/52) define the bit keys."""
    kernel = _kernel()
    if kernel is None:
        raise RuntimeError("the fused kernel needs numba")
    x = np.ascontiguousarray(x)
    m, d = x.shape
    n_keys = 2 ** (exp_bits + 5)
    key_sums = np.zeros((N_KEY_TABLES, n_keys, 3), dtype=np.float64)
    unit_cols = np.zeros((4, d), dtype=np.float64)
    row_sq = np.empty(m, dtype=np.float64)
    row_p1 = np.empty(m, dtype=np.float64)
    write_centred = shift is not None
    centred = np.empty_like(x) if write_centred else np.empty((1, 1), dtype=x.dtype)
    shift_arr = np.ascontiguousarray(shift, dtype=x.dtype) if write_centred else np.zeros(d, dtype=x.dtype)
    bits = x.view(np.int32 if x.dtype == np.float32 else np.int64)
    n_nonzero = kernel(x, bits, shift_arr, centred, write_centred, mantissa_bits - 4, n_keys - 1, key_sums, unit_cols,
                       row_sq, row_p1)  # fmt: skip
    by_key = key_sums.sum(axis=0)
    return (
        row_sq,
        row_p1,
        unit_cols,
        by_key[:, 0],
        by_key[:, 1],
        by_key[:, 2],
        int(n_nonzero),
        centred if write_centred else None,
    )


def _unit_rows_loop(rows, unit_mean, unit_sum, centred, v_dot_s, powers, fourth):  # fmt: skip
    k, d = rows.shape
    for i in range(k):
        p1 = 0.0
        p2 = 0.0
        for j in range(d):
            v = np.float64(rows[i, j])
            p1 += v
            p2 += v * v
        powers[i, 0] = p1
        powers[i, 1] = p2
        inv_norm = 1.0 / np.sqrt(p2)
        dot = 0.0
        sq = 0.0
        for j in range(d):
            v = np.float64(rows[i, j]) * inv_norm - unit_mean[j]
            centred[i, j] = v
            dot += v * unit_sum[j]
            sq += v * v
        v_dot_s[i] = dot
        fourth[i] = sq * sq


_UNIT_KERNEL: Any = None


def unit_sample_rows(
    rows: np.ndarray, unit_mean: np.ndarray, unit_sum: np.ndarray, centred_dtype: type
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """For sampled nonzero rows x_i (k, d): (v, v_i·S, [p₁(i), p₂(i)], ‖v_i‖⁴) with v_i = x_i/‖x_i‖ − m̂ (in
    ``centred_dtype``), S = Σx̂ and m̂ its mean (float64 arrays), p_k(i) = Σ_j x_ij^k; every row's numbers in float64,
    one pass over the row (the GeometryAccumulator's sample read-out)."""
    global _UNIT_KERNEL
    if _kernel() is None:
        raise RuntimeError("the fused kernel needs numba")
    if _UNIT_KERNEL is None:
        import numba

        _UNIT_KERNEL = numba.njit(cache=True, nogil=True, error_model="numpy")(_unit_rows_loop)
    rows = np.ascontiguousarray(rows)
    k, d = rows.shape
    centred = np.empty((k, d), dtype=centred_dtype)
    v_dot_s, fourth = np.empty(k), np.empty(k)
    powers = np.empty((k, 2))
    _UNIT_KERNEL(rows, np.ascontiguousarray(unit_mean, dtype=np.float64), np.ascontiguousarray(unit_sum,
                 dtype=np.float64), centred, v_dot_s, powers, fourth)  # fmt: skip
    return centred, v_dot_s, powers, fourth
