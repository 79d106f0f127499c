"""Geometry of a dictionary's rows without activations: norms, the unit rows' anisotropy and spectrum,
near-duplicate rows, encoder–decoder alignment -- blockwise, so a 65,536 × 2,304 dictionary never needs
its d_sae × d_sae cosine matrix nor a float64 copy of itself.

``dictionary_geometry`` is the one place A_dict, ‖ū‖², the dictionary spectrum, zero rows and decoder-norm
statistics are computed (``saegeo check`` and the report's SAE section both read it); ``zero_rows`` is the one rule
for which rows have no direction (``saegeo.geometry.amplification.dictionary_anisotropy``, A_dict alone, keeps it).
Pure math on tensors: no I/O, no models.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from saegeo.config import DEFAULT_BLOCK_ROWS, ZERO_ROW_REL_NORM
from saegeo.errors import BadInputError
from saegeo.geometry.accumulate import GeometryAccumulator
from saegeo.geometry.measures import activation_geometry
from saegeo.geometry.nulls import power_law_slope

__all__ = [
    "DictionaryGeometry",
    "dictionary_geometry",
    "summary_stats",
    "row_norms",
    "zero_rows",
    "row_cosines",
    "unit_row_blocks",
    "near_duplicate_pairs",
    "screen_projection",
    "encoder_decoder_cosines",
    "nearest_decoder_neighbours",
    "nearest_neighbour_summary",
]

DICTIONARY_SAMPLE_ROWS = 1024  # the accumulator's row sample in dictionary_geometry (unused by what it reports)


def _check_rows(rows: Tensor, what: str) -> None:
    if rows.ndim != 2 or rows.shape[0] < 1:
        raise BadInputError(f"{what} needs a 2-D (N, d) matrix of rows, got shape {tuple(rows.shape)}")


def row_norms(rows: Float[Tensor, "N d"], *, block_rows: int = DEFAULT_BLOCK_ROWS) -> Float[Tensor, " N"]:
    """‖w_i‖ for every row, in float64 (blocks of rows through one reused float64 buffer: never a float64 copy
    of the matrix, and no allocation per block for the allocator to scatter)."""
    _check_rows(rows, "row_norms")
    n_rows = rows.shape[0]
    out = torch.empty(n_rows, dtype=torch.float64, device=rows.device)
    buffer = torch.empty(min(block_rows, n_rows), rows.shape[1], dtype=torch.float64, device=rows.device)
    for s in range(0, n_rows, block_rows):
        block = buffer[: min(block_rows, n_rows - s)]
        block.copy_(rows[s : s + block_rows])
        torch.linalg.vector_norm(block, dim=1, out=out[s : s + block.shape[0]])
    return out


def summary_stats(values: Float[Tensor, " N"]) -> dict[str, float | None]:
    """min, median, mean, max, std (n − 1) and cv = std/mean (None unless mean > 0) of ``values``, float64."""
    v = values.to(torch.float64)
    mean = float(v.mean())
    std = float(v.std()) if v.numel() > 1 else 0.0
    return {
        "min": float(v.min()),
        "median": float(v.median()),
        "mean": mean,
        "max": float(v.max()),
        "std": std,
        "cv": std / mean if mean > 0 else None,
    }


def zero_rows(norms: Float[Tensor, " N"], zero_rel_norm: float = ZERO_ROW_REL_NORM) -> Bool[Tensor, " N"]:
    """The rows with no usable direction: ‖w_i‖ ≤ zero_rel_norm · median ‖w‖, or ‖w_i‖ = 0. They are left out of
    A_dict, ‖ū‖² and the spectrum (a dead latent's row of rounding noise would otherwise count as a direction)."""
    return (norms <= zero_rel_norm * float(norms.median())) | (norms == 0)


def row_cosines(
    rows: Float[Tensor, "N d"], direction: Float[Tensor, " d"], *, block_rows: int = DEFAULT_BLOCK_ROWS
) -> Float[Tensor, " N"]:
    """cos(w_i, v) = w_i·v/(‖w_i‖‖v‖) for every row, float64, blockwise; 0 for a zero row or v = 0."""
    _check_rows(rows, "row_cosines")
    v = direction.to("cpu", torch.float64)
    v_norm = float(v.norm())
    out = []
    for s in range(0, rows.shape[0], block_rows):
        block = rows[s : s + block_rows].to("cpu", torch.float64)
        denom = torch.linalg.vector_norm(block, dim=1) * v_norm
        out.append(torch.where(denom > 0, (block @ v) / denom.clamp_min(1e-300), 0.0))
    return torch.cat(out)


def unit_row_blocks(
    rows: Float[Tensor, "N d"],
    norms: Float[Tensor, " N"] | None = None,
    *,
    block_rows: int = DEFAULT_BLOCK_ROWS,
    dtype: torch.dtype = torch.float32,
) -> Iterator[Float[Tensor, "b d"]]:
    """u_i = w_i/‖w_i‖ block by block, zero rows left out (they have no direction)."""
    norms = row_norms(rows, block_rows=block_rows) if norms is None else norms
    for s in range(0, rows.shape[0], block_rows):
        n = norms[s : s + block_rows]
        alive = n > 0
        block = rows[s : s + block_rows][alive].to(dtype)
        if block.shape[0]:
            yield block / n[alive].to(dtype)[:, None]


@dataclass
class DictionaryGeometry:
    """What ``dictionary_geometry`` measured. u_i = w_i/‖w_i‖ over the non-zero rows (N of them)."""

    norms: Float[Tensor, " N_all"]  # ‖w_i‖ of every row, float64
    zero: Bool[Tensor, " N_all"]  # rows with no usable direction (left out of everything below)
    norm_stats: dict[str, float | None]  # summary_stats of all the norms (zero rows included)
    a_dict: float | None  # (N‖ū‖² − 1)/(N − 1), the mean pairwise cosine of the u_i (None if N < 2)
    mean_sq_norm: float  # ‖ū‖², ū = mean of the u_i
    mean_direction: Float[Tensor, " d"]  # ū
    spectrum: dict[str, Any]  # eigenvalues, shares, erank, IsoScore, MP edges, spikes, power law of the u_i

    @property
    def n_zero(self) -> int:
        return int(self.zero.sum())

    @property
    def direction_norms(self) -> Float[Tensor, " N_all"]:
        """The norms with the zero rows set to 0, so every direction statistic leaves them out."""
        return torch.where(self.zero, torch.zeros_like(self.norms), self.norms)


SPECTRUM_KEYS = (
    "eigenvalues",
    "top1_share",
    "top10_share",
    "effective_rank",
    "participation_ratio",
    "numerical_rank",
    "isoscore",
    "mp_upper_edge",
    "mp_lower_edge",
    "n_spikes",
    "noise_effective_rank",
)


def dictionary_geometry(
    W_dec: Float[Tensor, "N d"],
    *,
    zero_rel_norm: float = ZERO_ROW_REL_NORM,
    block_rows: int = DEFAULT_BLOCK_ROWS,
    gram_dtype: torch.dtype = torch.float64,
) -> DictionaryGeometry:
    """Norms, zero rows, A_dict, ‖ū‖² and the spectrum of a dictionary's unit rows, in one blockwise pass.

    Row i is zero when ‖w_i‖ ≤ zero_rel_norm · median ‖w‖ (or ‖w_i‖ = 0; ``zero_rows``). The remaining u_i = w_i/‖w_i‖
    go, ``block_rows`` at a time in ``gram_dtype``, through a GeometryAccumulator: its unit mean is ū, its
    A = (N‖ū‖² − 1)/(N − 1) is A_dict (the exact mean of the N(N−1) pairwise cosines u_i·u_j) and its
    covariance spectrum is the dictionary's own. Memory O(block_rows·d + d²): no N × N matrix and no
    float64 copy of W_dec. ``gram_dtype=torch.float32`` halves the gram's cost at float32 rounding.
    """
    _check_rows(W_dec, "dictionary_geometry")
    norms = row_norms(W_dec, block_rows=block_rows)
    zero = zero_rows(norms, zero_rel_norm)
    # A_dict and the spectrum come from the exact sums; the accumulator's row sample feeds only the null test's sd,
    # which a dictionary does not report: a small one (8,192 float64 rows would cost 2-3 × 8,192·d·8 bytes at
    # published widths while the sample sorts)
    acc = GeometryAccumulator(W_dec.shape[1], gram_dtype=gram_dtype, sample_rows=DICTIONARY_SAMPLE_ROWS)
    for block in unit_row_blocks(W_dec, torch.where(zero, 0.0, norms), block_rows=block_rows, dtype=gram_dtype):
        acc.add(block)
    if acc.n < 1:
        raise BadInputError(f"all {W_dec.shape[0]} dictionary rows are zero: no directions to measure")
    geo = activation_geometry(acc, top_k_eigvecs=0).to_dict()
    # the decoder point cloud's power law (Li, Michaud, Tegmark et al. 2025), fitted as the activations' is
    fit = power_law_slope(np.asarray(geo["eigenvalues"], dtype=np.float64))
    power_law = dict(zip(("power_law_alpha", "power_law_r2", "power_law_ranks"), fit or (None, None, None)))
    mean_direction = acc.unit_mean
    return DictionaryGeometry(
        norms=norms,
        zero=zero,
        norm_stats=summary_stats(norms),
        a_dict=geo["anisotropy"],
        mean_sq_norm=float(mean_direction.square().sum()),
        mean_direction=mean_direction,
        spectrum={**{k: geo.get(k) for k in SPECTRUM_KEYS}, **power_law},
    )


def screen_projection(d: int, screen_dim: int, seed: int = 0) -> Float[Tensor, "d k"]:
    """The seeded random orthonormal P (d × screen_dim, float32) of the projected duplicate screen."""
    gen = torch.Generator().manual_seed(seed)
    return torch.linalg.qr(torch.randn(d, screen_dim, generator=gen, dtype=torch.float64))[0].to(torch.float32)


def _screen_vectors(unit_block: Tensor, projection: Tensor | None) -> tuple[Tensor, Tensor]:
    """Left/right screening vectors whose dot product lower-bounds-by-construction the pair test.

    Without a projection: (u_i, u_j), dot = cos. With an orthonormal projection P (d × k), p = Pᵀu and
    ‖p_i − p_j‖² ≤ ‖u_i − u_j‖² = 2 − 2cos, so cos > t implies ‖p_i − p_j‖² < 2(1 − t), i.e.
    p_i·p_j − ‖p_i‖²/2 − ‖p_j‖²/2 > −(1 − t). Appending (−‖p_i‖²/2, 1) on the left and (1, −‖p_j‖²/2) on the
    right makes that a single dot product, so one matmul screens a tile.
    """
    if projection is None:
        return unit_block, unit_block
    p = unit_block @ projection
    half = 0.5 * p.square().sum(1, keepdim=True)
    ones = torch.ones_like(half)
    return torch.cat([p, -half, ones], 1), torch.cat([p, ones, -half], 1)


def near_duplicate_pairs(
    rows: Float[Tensor, "N d"],
    threshold: float = 0.99,
    *,
    norms: Float[Tensor, " N"] | None = None,
    block_rows: int = DEFAULT_BLOCK_ROWS,
    max_pairs: int | None = None,
    screen_dim: int | None = 128,
    seed: int = 0,
    progress: Callable[[int], None] | None = None,
    device: str | torch.device = "cpu",
) -> tuple[Int[Tensor, "p 2"], Float[Tensor, " p"], int]:
    """All pairs i < j with cos(w_i, w_j) = w_i·w_j/(‖w_i‖‖w_j‖) > threshold, exactly, without an N × N matrix.

    Tiles of B × B pairs are screened with float32 matmuls and only the survivors are confirmed in float64
    from the original rows, so rounding can neither add nor drop a pair. The screen is exact (it never
    drops a true pair): for d > 2·screen_dim it is the projected-distance bound of ``_screen_vectors``
    with a seeded random orthonormal P (d × screen_dim), which keeps ≈ screen_dim/d of every squared
    distance, so unrelated rows (distance² ≈ 2) fail it by many standard deviations while the work drops
    from N²d/2 to N²·screen_dim/2 multiply-adds; otherwise it is the cosine itself (N²d/2, half the
    dense gram). Extra memory: N·(screen_dim + 2) + B² floats, never N². Zero rows are never paired.

    Returns ``(pairs, cosines, n_pairs)``: pairs (p, 2) with i < j sorted by decreasing cosine, their
    float64 cosines, and the total count (pairs beyond ``max_pairs`` are counted but not returned).
    ``progress(rows_done)`` is called after each block of rows. ``device`` (e.g. "cuda"): the screening vectors
    and tiles live there (size block_rows for it: 16384 on a GPU); the float64 confirmation stays on the CPU.
    """
    _check_rows(rows, "near_duplicate_pairs")
    if not -1.0 <= threshold <= 1.0:
        raise BadInputError(f"threshold must be a cosine in [-1, 1], got {threshold}")
    n_rows, d = rows.shape
    norms = row_norms(rows, block_rows=block_rows) if norms is None else norms.to(torch.float64)
    inv = torch.where(norms > 0, 1.0 / norms.clamp_min(1e-300), 0.0)  # zero rows: cosine 0, never a pair
    projection = None
    if screen_dim is not None and d > 2 * screen_dim and threshold > 0:
        projection = screen_projection(d, screen_dim, seed)
        cut = -(1.0 - threshold) - 1e-4  # slack for float32 rounding of the screen
    else:
        cut = threshold - 1e-4
    dev = torch.device(device)
    width = d if projection is None else screen_dim + 2
    left = torch.empty(n_rows, width, dtype=torch.float32, device=dev)
    right = left if projection is None else torch.empty(n_rows, width, dtype=torch.float32, device=dev)
    projection = None if projection is None else projection.to(dev)
    for s in range(0, n_rows, block_rows):
        unit = rows[s : s + block_rows].to(torch.float32) * inv[s : s + block_rows, None].to(torch.float32)
        left[s : s + block_rows], right[s : s + block_rows] = _screen_vectors(unit.to(dev), projection)
    alive = norms > 0
    buffer = torch.empty(min(block_rows, n_rows), min(block_rows, n_rows), dtype=torch.float32, device=dev)
    found_i, found_j, found_c = [], [], []
    total = 0
    for i0 in range(0, n_rows, block_rows):
        li = left[i0 : i0 + block_rows]
        for j0 in range(i0, n_rows, block_rows):
            rj = right[j0 : j0 + block_rows]
            tile = buffer[: li.shape[0], : rj.shape[0]]
            if tile.is_contiguous():
                torch.mm(li, rj.T, out=tile)
            else:
                tile = li @ rj.T
            if j0 != i0 and float(tile.max()) <= cut:  # one read of the tile; most tiles hold no candidate
                continue
            cand = (tile > cut).nonzero().cpu()
            if j0 == i0:
                cand = cand[cand[:, 0] < cand[:, 1]]  # upper triangle only (drops i = j)
            if cand.numel() == 0:
                continue
            ii, jj = cand[:, 0] + i0, cand[:, 1] + j0
            keep_alive = alive[ii] & alive[jj]
            ii, jj = ii[keep_alive], jj[keep_alive]
            exact = (rows[ii].to(torch.float64) * rows[jj].to(torch.float64)).sum(1) * inv[ii] * inv[jj]
            keep = exact > threshold
            total += int(keep.sum())
            found_i.append(ii[keep]), found_j.append(jj[keep]), found_c.append(exact[keep])
        if progress is not None:
            progress(min(i0 + block_rows, n_rows))
    if not found_i:
        return torch.zeros(0, 2, dtype=torch.long), torch.zeros(0, dtype=torch.float64), 0
    cos = torch.cat(found_c)
    pairs = torch.stack([torch.cat(found_i), torch.cat(found_j)], dim=1)
    order = cos.argsort(descending=True)
    if max_pairs is not None:
        order = order[:max_pairs]
    return pairs[order], cos[order], total


def encoder_decoder_cosines(
    W_enc: Float[Tensor, "d N"],
    W_dec: Float[Tensor, "N d"],
    *,
    block_rows: int = DEFAULT_BLOCK_ROWS,
    after_block: Callable[[int, int], None] | None = None,
) -> Float[Tensor, " N"]:
    """cos(e_i, w_i) between latent i's encoder column e_i = W_enc[:, i] and its decoder row w_i (float64;
    0 where either is zero). Near 1 for tied or well-trained SAEs; ≤ 0 means the latent reads a
    direction it does not write.

    W_enc is read in its own order, rows r … r' − 1 of it at a time (contiguous, about block_rows·d elements),
    accumulating e_i·w_i = Σ_r W_enc[r, i]·W_dec[i, r] and ‖e_i‖² in float64 over the chunks (each chunk's
    partial sums in the weights' dtype); ``after_block(r, r')`` is called after each (a caller hands back the
    pages those rows of a memory-mapped W_enc used). No float64 copies of float32 weights."""
    if W_enc.ndim != 2 or W_dec.ndim != 2 or W_enc.shape != (W_dec.shape[1], W_dec.shape[0]):
        raise BadInputError(
            f"encoder_decoder_cosines needs W_enc (d, N) and W_dec (N, d), got {tuple(W_enc.shape)} and {tuple(W_dec.shape)}"
        )
    d, n_lat = W_enc.shape
    dtype = torch.float64 if torch.float64 in (W_enc.dtype, W_dec.dtype) else torch.float32
    dot = torch.zeros(n_lat, dtype=torch.float64, device=W_dec.device)
    enc_sq = torch.zeros(n_lat, dtype=torch.float64, device=W_dec.device)
    chunk = max(1, block_rows * d // n_lat)
    for r in range(0, d, chunk):
        e = W_enc[r : r + chunk].to(dtype)  # (c, N), contiguous in the file
        w = W_dec[:, r : r + chunk].to(dtype)  # (N, c)
        dot += torch.einsum("cn,nc->n", e, w).to(torch.float64)
        enc_sq += e.square().sum(0).to(torch.float64)
        if after_block is not None:
            after_block(r, min(r + chunk, d))
    denom = enc_sq.sqrt() * row_norms(W_dec, block_rows=block_rows)
    return torch.where(denom > 0, dot / denom.clamp_min(1e-300), 0.0)


def whitening_alignment(
    W_enc: Float[Tensor, "d N"],
    W_dec: Float[Tensor, "N d"],
    *,
    max_latents: int = 1024,
    block_rows: int = DEFAULT_BLOCK_ROWS,
    after_block: Callable[[int, int], None] | None = None,
) -> dict[str, float] | None:
    """Whether an SAE's weights carry a folded covariance whitening, from the weights alone: on m evenly spaced
    latents (m = min(N, max(max_latents, 2d))), {"median_cos": median cos(e_i, w_i), "median_cos_whitened": median
    cos(e_i, G⁻¹w_i), "latents": m}, with G = Σ_i w_i w_iᵀ/N' the second moment of all N' nonzero decoder rows (ridge
    1e-6·tr G/d; streamed a block at a time, N·d² work).
    Trained on whitened rows z = (x − μ)M an SAE has e'_i ≈ w'_i, and folded (SAELens' fold_activation_whitening:
    W_enc ← M W_enc, W_dec ← W_dec M⁻¹) e_i = M e'_i, w_i = M⁻ᵀ w'_i; with the w'_i spread evenly G ∝ M⁻ᵀM⁻¹ = Σ, so
    e_i ∝ M Mᵀ w_i = Σ⁻¹w_i ∝ G⁻¹w_i: the second median is the high one. Trained on raw rows, the first is. Latents
    whose encoder column or decoder row is zero are left out of the medians; None when fewer than d remain.
    W_enc is read in its own order, a chunk of its rows at a time (``after_block(r, r')`` after each, as in
    `encoder_decoder_cosines`); the m sampled columns and rows are kept in the weights' dtype, G in float64."""
    n_lat, d = W_dec.shape
    m = min(n_lat, max(max_latents, 2 * d))
    if m < d:
        return None
    idx = torch.linspace(0, n_lat - 1, m, dtype=torch.float64).round().long().unique()
    w = W_dec[idx]
    e = torch.empty((idx.numel(), d), dtype=W_enc.dtype)
    chunk = max(1, block_rows * d // max(n_lat, 1))
    for r in range(0, d, chunk):
        e[:, r : r + chunk] = W_enc[r : r + chunk, idx].T
        if after_block is not None:
            after_block(r, min(r + chunk, d))
    alive = (w.norm(dim=1) > 0) & (e.norm(dim=1) > 0)
    if not bool(alive.all()):  # copies only when some latent drops out
        w, e = w[alive], e[alive]
    if w.shape[0] < d:
        return None
    # G from every decoder row, a block at a time: estimated from the m sampled rows alone its noise pulled the
    # whitened median towards the floor on dictionaries much wider than the sample (benchmarks/README.md)
    gram = torch.zeros((d, d), dtype=torch.float64)
    n_rows = 0
    for lo in range(0, n_lat, block_rows):
        wb = W_dec[lo : lo + block_rows].to(torch.float64)
        wb = wb[wb.norm(dim=1) > 0]
        gram.addmm_(wb.T, wb)
        n_rows += wb.shape[0]
    gram /= n_rows
    gram.diagonal().add_(1e-6 * float(gram.trace()) / d)
    factor = torch.linalg.cholesky(gram)
    cos_raw, cos_white = [], []
    for lo in range(0, w.shape[0], block_rows):
        wb, eb = w[lo : lo + block_rows].to(torch.float64), e[lo : lo + block_rows].to(torch.float64)
        vb = torch.cholesky_solve(wb.T, factor).T  # G⁻¹w_i, a block of rows at a time
        cos_raw.append(torch.nn.functional.cosine_similarity(eb, wb, dim=1))
        cos_white.append(torch.nn.functional.cosine_similarity(eb, vb, dim=1))
    return {
        "median_cos": float(torch.cat(cos_raw).median()),
        "median_cos_whitened": float(torch.cat(cos_white).median()),
        "latents": int(w.shape[0]),
    }


def nearest_decoder_neighbours(
    rows: Float[Tensor, "N d"],
    k: int = 5,
    block_rows: int = DEFAULT_BLOCK_ROWS,
    *,
    queries: Int[Tensor, " m"] | None = None,
    norms: Float[Tensor, " N"] | None = None,
    device: str | torch.device = "cpu",
) -> tuple[Int[Tensor, "m k"], Float[Tensor, "m k"]]:
    """The k nearest other rows of each query row by cosine, cos(w_i, w_j) = w_i·w_j/(‖w_i‖‖w_j‖), j ≠ i, exactly.

    queries: the rows i to answer for (default all N, m = N); each is compared with all N rows. Tiles of
    B × B float32 products u_i·u_j of unit rows (B = block_rows, normalised a block at a time: no float32 copy
    of the matrix on the CPU) keep a running top-(k + 4) per query (memory B·d + B² + m·(k + 4), never N × N);
    the survivors' cosines are then recomputed in float64 from the rows and the best k kept, so float32
    rounding cannot reorder neighbours closer than 4 places to the k-th. Zero rows (or rows whose ``norms``
    entry is 0) are nobody's neighbour and have none. Work m·N·d multiply-adds. ``device`` (e.g. "cuda"): the
    tiles are computed there, with the unit rows held there once (N·d float32); the float64 recomputation
    stays on the CPU. Size block_rows for the device (4096 on a CPU, 16384 or more on a GPU).

    Returns ``(indices, cosines)``, each (m, k), nearest first (ties: smaller index first); slots beyond the
    N − 1 other rows, and every slot of a zero row, hold index −1 and cosine NaN.
    """
    _check_rows(rows, "nearest_decoder_neighbours")
    if k < 1:
        raise BadInputError(f"nearest_decoder_neighbours needs k ≥ 1, got {k}")
    if block_rows < 1:
        raise BadInputError(f"block_rows must be ≥ 1, got {block_rows}")
    n_rows = rows.shape[0]
    norms = row_norms(rows, block_rows=block_rows) if norms is None else norms.to("cpu", torch.float64)
    alive = norms > 0
    inv = torch.where(alive, 1.0 / norms.clamp_min(1e-300), 0.0)
    q_idx = torch.arange(n_rows) if queries is None else queries.to("cpu", torch.long)
    if q_idx.numel() and not (0 <= int(q_idx.min()) and int(q_idx.max()) < n_rows):
        raise BadInputError(f"nearest_decoder_neighbours: query indices must lie in [0, {n_rows})")
    dev = torch.device(device)

    def unit(index: slice | Tensor) -> Tensor:
        return (rows[index].to("cpu", torch.float64) * inv[index, None]).to(dev, torch.float32)

    resident = None
    if dev.type != "cpu":  # the unit rows once on the device, not every sweep over the host link
        resident = torch.empty(n_rows, rows.shape[1], dtype=torch.float32, device=dev)
        for s in range(0, n_rows, block_rows):
            resident[s : s + block_rows] = unit(slice(s, s + block_rows))
    n_q = q_idx.numel()
    screen = min(k + 4, n_rows - 1)
    best_cos = torch.full((n_q, max(screen, 0)), -torch.inf, dtype=torch.float32)
    best_idx = torch.full((n_q, max(screen, 0)), -1, dtype=torch.long)
    dead_cols = (~alive).to(dev)
    for a in range(0, n_q if screen > 0 else 0, block_rows):
        qb = q_idx[a : a + block_rows]
        ui = resident[qb.to(dev)] if resident is not None else unit(qb)
        b = ui.shape[0]
        run_cos = torch.full((b, screen), -torch.inf, dtype=torch.float32, device=dev)
        run_idx = torch.full((b, screen), -1, dtype=torch.long, device=dev)
        q_dev = qb.to(dev)
        for j0 in range(0, n_rows, block_rows):
            uj = resident[j0 : j0 + block_rows] if resident is not None else unit(slice(j0, j0 + block_rows))
            tile = ui @ uj.T
            tile[:, dead_cols[j0 : j0 + block_rows]] = -torch.inf
            rel = q_dev - j0  # a query meets itself in the tile holding its own row
            own = ((rel >= 0) & (rel < tile.shape[1])).nonzero().flatten()
            if own.numel():
                tile[own, rel[own]] = -torch.inf
            c, j = tile.topk(min(screen, tile.shape[1]), dim=1)
            merged_cos = torch.cat([run_cos, c], 1)
            merged_idx = torch.cat([run_idx, j + j0], 1)
            top = merged_cos.topk(screen, dim=1).indices
            run_cos, run_idx = merged_cos.gather(1, top), merged_idx.gather(1, top)
        best_cos[a : a + b], best_idx[a : a + b] = run_cos.cpu(), run_idx.cpu()
    del resident
    out_idx = torch.full((n_q, k), -1, dtype=torch.long)
    out_cos = torch.full((n_q, k), float("nan"), dtype=torch.float64)
    if screen <= 0:
        return out_idx, out_cos
    valid = torch.isfinite(best_cos) & alive[q_idx][:, None]
    safe = best_idx.clamp_min(0)
    exact = torch.full(best_idx.shape, -torch.inf, dtype=torch.float64)
    chunk = max(1, min(block_rows, 128))  # (chunk, k + 4, d) float64 gathered rows at a time (21 MB at d 2,304)
    for s in range(0, n_q, chunk):
        qi = q_idx[s : s + chunk]
        w_i = rows[qi].to("cpu", torch.float64)
        w_j = rows[safe[s : s + chunk]].to("cpu", torch.float64)
        dots = torch.einsum("bd,bsd->bs", w_i, w_j) * inv[qi, None] * inv[safe[s : s + chunk]]
        exact[s : s + chunk] = torch.where(valid[s : s + chunk], dots, -torch.inf)
    # nearest first, ties by the smaller index: sort by index, then stably by cosine
    by_index = torch.where(valid, best_idx, n_rows).argsort(dim=1)
    exact, best_idx = exact.gather(1, by_index), best_idx.gather(1, by_index)
    order = exact.argsort(dim=1, descending=True, stable=True)[:, :k]
    kept_cos, kept_idx = exact.gather(1, order), best_idx.gather(1, order)
    kept_ok = torch.isfinite(kept_cos)
    width = kept_cos.shape[1]
    out_idx[:, :width] = torch.where(kept_ok, kept_idx, -1)
    out_cos[:, :width] = torch.where(kept_ok, kept_cos, float("nan"))
    return out_idx, out_cos


NEAREST_QUANTILES = (0.5, 0.9, 0.99)


def nearest_neighbour_summary(
    rows: Float[Tensor, "N d"],
    *,
    norms: Float[Tensor, " N"] | None = None,
    exact_max_rows: int = 16384,
    sample: int = 2048,
    seed: int = 0,
    confidence: float = 0.95,
    block_rows: int = DEFAULT_BLOCK_ROWS,
    device: str | torch.device = "cpu",
) -> dict[str, Any]:
    """The distribution over latents of c_i = max_{j≠i} cos(w_i, w_j), each latent's nearest-neighbour cosine
    (zero rows, norms entry 0, left out; N' rows remain).

    exact (N' ≤ exact_max_rows): c_i of every row by ``nearest_decoder_neighbours`` (N'²·d multiply-adds).
    sampled (beyond it): m = ``sample`` query rows drawn uniformly *with replacement* (seeded) from the N'; each
    c_i is still exact (against all N rows, m·N·d multiply-adds), so c_1 … c_m are i.i.d. draws from the
    population of the N' values and the errors are those of an i.i.d. sample:
      * mean: c̄ ± z·s/√m (s the sample sd, z the two-sided normal quantile of ``confidence``; the CLT
        interval, ``mean_error_bound`` = z·s/√m);
      * quantiles: by Dvoretzky–Kiefer–Wolfowitz (Massart's constant), sup_x |F_m(x) − F(x)| ≤
        ε = √(ln(2/α)/(2m)) with probability ≥ 1 − α = confidence, so the population q-quantile lies in
        [F_m⁻¹(q − ε), F_m⁻¹(q + ε)] (``quantile_intervals``; None where q ± ε leaves (0, 1));
      * max: the sample's maximum is only a lower bound of the population's (the exact duplicate search,
        ``near_duplicate_pairs``, counts every pair above a threshold).
    Returns a dict: method, n_rows, n_queries, mean, sd, quantiles {q: value}, max, and (sampled) seed,
    confidence, mean_error_bound, dkw_epsilon, quantile_intervals.
    """
    _check_rows(rows, "nearest_neighbour_summary")
    norms = row_norms(rows, block_rows=block_rows) if norms is None else norms.to("cpu", torch.float64)
    alive = (norms > 0).nonzero().flatten()
    n_alive = alive.numel()
    if n_alive < 2:
        return {"method": "exact", "n_rows": n_alive, "n_queries": 0, "mean": None}
    exact = n_alive <= exact_max_rows
    if exact:
        queries = alive
    else:
        gen = torch.Generator().manual_seed(seed)
        queries = alive[torch.randint(n_alive, (sample,), generator=gen)]
    _, cos = nearest_decoder_neighbours(rows, 1, block_rows, queries=queries, norms=norms, device=device)
    c = cos[:, 0]
    m = c.numel()
    values = torch.sort(c).values
    out: dict[str, Any] = {
        "method": "exact" if exact else "sampled",
        "n_rows": n_alive,
        "n_queries": m,
        "mean": float(c.mean()),
        "sd": float(c.std()) if m > 1 else 0.0,
        "quantiles": {str(q): float(torch.quantile(values, q)) for q in NEAREST_QUANTILES},
        "max": float(values[-1]),
    }
    if not exact:
        from statistics import NormalDist

        z = NormalDist().inv_cdf(0.5 + confidence / 2)
        eps = math.sqrt(math.log(2 / (1 - confidence)) / (2 * m))

        def at(level: float) -> float | None:
            return float(torch.quantile(values, level)) if 0 < level < 1 else None

        out.update(
            seed=seed,
            confidence=confidence,
            mean_error_bound=z * out["sd"] / math.sqrt(m),
            dkw_epsilon=eps,
            quantile_intervals={str(q): [at(q - eps), at(q + eps)] for q in NEAREST_QUANTILES},
        )
    return out
