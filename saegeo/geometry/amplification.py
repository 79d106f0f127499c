"""The K·A_dict amplification law: how a dictionary's tilt becomes the activations' cone.

Activations are modelled as sparse non-negative sums x = Σ_i a_i u_i over N unit directions u_i
(decoder rows normalised, their norms folded into the codes a_i). With K = qN expected active
features, A_dict the mean pairwise cosine of the u_i and ‖ū‖² = (1 + (N−1)·A_dict)/N, three
predictions of the activations' anisotropy A are given, from crudest to best:

- textbook:      k = K·A_dict/2,          A = k/(1 + k)        (Exp(1) magnitudes, no self term)
- exact-moment:  k = K·r·‖ū‖²,            A = k/(1 + k − q·r)  (= E[x·y]/E‖x‖² exactly, iid codes)
- mean-cosine:   A ≈ ‖ū‖²·(E[S/√(S²‖ū‖² + (1−‖ū‖²)Q)])²,  S = Σ a_i, Q = Σ a_i² per code

with r = E[a|a>0]²/E[a²|a>0] (1/2 Exp, 2/π half-normal, e^{−σ²} log-normal, 1 constant). These assume
every latent fires at one rate; with Zipf-like rates a few frequent latents make a cone of their own and
they read far low (measured, experiments/amplification_law.py). The per-latent law drops that assumption:

- A_het = ‖M‖² / (Σ_i E[a_i²] + Σ_{i≠j} E[a_i]E[a_j] u_i·u_j),  M = Σ_i E[a_i] u_i
  (``heterogeneous_moment_prediction``): E[x·y]/E‖x‖² exactly for codes independent across latents, each
  with its own rate and law. The denominator is Σ E[a_i²] + ‖M‖² − Σ E[a_i]² for unit rows: no pair loop.
- its mean-cosine form (``independent_codes_anisotropy``): the mean cosine of Σ a_i u_i over a sample of
  codes whose columns are permuted one latent at a time (independence with the sample's own marginals,
  norms fluctuating as they do). On iid synthetic codes it matches the measured A within sampling error
  where A_het reads up to 0.15 low at A ≈ 0.96 (tests/geometry/test_amplification.py).
- the co-firing term: cofiring_share = (E‖x‖² − Σ E[a_i²] − Σ_{i≠j} E[a_i]E[a_j] u_i·u_j)/E‖x‖²
  = Σ_{i≠j} Cov(a_i, a_j) u_i·u_j / E‖x‖² (``cofiring_share``), and the pairs that make it
  (``cofiring_pairs``: 2·Cov(a_i, a_j)·u_i·u_j/E‖x‖² among the top latents by E[a_i²], from a code sample).
- ``anisotropy_sampling_sd``: the U-statistic sd of a measured A from Σ x̂ and Σ x̂x̂ᵀ.

The per-feature cone shares c_i = E[a_i](u_i·M)/‖M‖² name the features that make the cone (Σ c_i = 1).
Pure math on tensors: no I/O, no models.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch
from jaxtyping import Float, Int
from torch import Tensor

from saegeo.config import ZERO_ROW_REL_NORM
from saegeo.errors import BadInputError
from saegeo.geometry.accumulate import UnitMean, anisotropy_from_unit_mean
from saegeo.geometry.dictionary import row_norms, zero_rows

__all__ = [
    "dictionary_anisotropy",
    "textbook_prediction",
    "exact_moment_prediction",
    "mean_cosine_prediction",
    "heterogeneous_moment_prediction",
    "mean_code_vector",
    "independent_second_moment",
    "cofiring_share",
    "anisotropy_sampling_sd",
    "independent_codes_anisotropy",
    "cofiring_pairs",
    "cone_shares",
    "CodeMomentAccumulator",
    "coo_codes",
]

# rows (or code entries) normalised at a time in float64: each block's copies stay small for any N (19 MB at
# d 2,304; benchmarks/README.md#numbers-behind-code-comments)
_BLOCK_ROWS = 1024


def _as_tensor(x) -> Tensor:
    return x if isinstance(x, Tensor) else torch.as_tensor(np.asarray(x))


def dictionary_anisotropy(
    rows: Float[Tensor, "N d"], *, zero_rel_norm: float = ZERO_ROW_REL_NORM, block_rows: int = _BLOCK_ROWS
) -> tuple[float, float]:
    """Anisotropy of a dictionary and the squared norm of its mean unit direction, without its spectrum.

    ū = (1/N) Σ_i u_i with u_i = rows_i/‖rows_i‖ over the N rows that have a direction, ‖ū‖² its squared norm,
    and A_dict = (N‖ū‖² − 1)/(N − 1), the exact mean of the N(N−1) pairwise cosines u_i·u_j, i ≠ j. Zero rows
    (``saegeo.geometry.dictionary.zero_rows``: ‖w_i‖ ≤ zero_rel_norm · median ‖w‖) are left out, the rule
    ``dictionary_geometry`` keeps, which adds the spectrum and norm statistics in its own pass. One pass over
    row blocks in float64 through ``UnitMean``; no N×N matrix.

    Returns ``(A_dict, mean_sq_norm)``. A non-finite row raises BadInputError naming it, as do fewer than two
    rows with a direction.
    """
    rows = _as_tensor(rows)
    if rows.ndim != 2 or rows.shape[0] < 2:
        raise BadInputError(
            f"dictionary_anisotropy needs a 2-D (N, d) dictionary with N >= 2, got shape {tuple(rows.shape)}"
        )
    norms = row_norms(rows, block_rows=block_rows)
    if not torch.isfinite(norms).all():
        bad = int((~torch.isfinite(norms)).nonzero()[0])
        raise BadInputError(f"dictionary row {bad} is not finite; fix or drop it")
    keep = ~zero_rows(norms, zero_rel_norm)
    if int(keep.sum()) < 2:
        raise BadInputError(f"A_dict needs two rows with a direction; {int(keep.sum())} of {rows.shape[0]} have one")
    unit = UnitMean(rows.shape[1])
    for start in range(0, rows.shape[0], block_rows):
        unit.add(rows[start : start + block_rows][keep[start : start + block_rows]].to(torch.float64))
    return unit.anisotropy(), float(unit.unit_mean.square().sum())


def textbook_prediction(K: float, a_dict: float) -> float:
    """Textbook amplification law: k = K·A_dict/2, A = k/(1 + k).

    Assumes Exp(1) magnitudes (r = 1/2) and drops the self term, so it reads ≈ 0 for an isotropic
    dictionary (the truth is ≈ q·r) and is off by 2× for constant magnitudes.
    """
    k = K * a_dict / 2.0
    return k / (1.0 + k)


def exact_moment_prediction(K: float, q: float, r: float, mean_sq_norm: float) -> float:
    """Exact-moment law: k = K·r·‖ū‖², A = k/(1 + k − q·r).

    For iid codes (each feature fires with rate q, magnitude moments with r = E[a]²/E[a²] over the
    nonzero values) this equals E[x·y]/E‖x‖² for independent x, y exactly. An isotropic
    dictionary (‖ū‖² = 1/N) gives q·r/(1 + q·r − q·r) = q·r, the sign-aware null.
    """
    k = K * r * mean_sq_norm
    return k / (1.0 + k - q * r)


def _unit_block(unit_rows: Tensor, start: int, normalize: bool = True) -> Float[Tensor, "b d"]:
    """Rows [start, start + _BLOCK_ROWS) in float64, normalised (zero rows stay zero)."""
    block = unit_rows[start : start + _BLOCK_ROWS].to(torch.float64)
    return block / block.norm(dim=1, keepdim=True).clamp_min(1e-300) if normalize else block


def mean_code_vector(
    mean_code: Float[Tensor, " N"], unit_rows: Float[Tensor, "N d"], *, normalize: bool = True
) -> Float[Tensor, " d"]:
    """M = Σ_i E[a_i]·u_i in float64, over row blocks (rows normalised unless ``normalize=False``)."""
    mean_code = _as_tensor(mean_code).to(torch.float64)
    unit_rows = _as_tensor(unit_rows)
    out = torch.zeros(unit_rows.shape[1], dtype=torch.float64)
    for start in range(0, unit_rows.shape[0], _BLOCK_ROWS):
        out += mean_code[start : start + _BLOCK_ROWS] @ _unit_block(unit_rows, start, normalize)
    return out


def independent_second_moment(
    mean_code: Float[Tensor, " N"], mean_sq_code: Float[Tensor, " N"], unit_rows: Float[Tensor, "N d"]
) -> float:
    """E‖x‖² of x = Σ_i a_i u_i for codes independent across latents, each with its own law:
    Σ_i E[a_i²] + Σ_{i≠j} E[a_i]E[a_j] u_i·u_j = Σ_i E[a_i²] + ‖M‖² − Σ_i E[a_i]²  (unit u_i; no pair loop)."""
    mean_code = _as_tensor(mean_code).to(torch.float64)
    m = mean_code_vector(mean_code, unit_rows)
    return float(_as_tensor(mean_sq_code).to(torch.float64).sum() + m.square().sum() - mean_code.square().sum())


def heterogeneous_moment_prediction(
    mean_code: Float[Tensor, " N"], mean_sq_code: Float[Tensor, " N"], unit_rows: Float[Tensor, "N d"]
) -> float:
    """The per-latent law A_het = ‖M‖² / (Σ_i E[a_i²] + Σ_{i≠j} E[a_i]E[a_j] u_i·u_j) = ‖M‖²/(‖M‖² + Σ_i Var(a_i)),
    M = Σ_i E[a_i]·u_i.

    Equals E[x·y]/E‖x‖² exactly when the a_i are independent across latents (each with its own rate and
    magnitude law); with one rate q and one law it reduces to ``exact_moment_prediction``. Rows are
    normalised here. Co-firing latents break the independence: see ``cofiring_share``.
    """
    signal = float(mean_code_vector(mean_code, unit_rows).square().sum())
    second = independent_second_moment(mean_code, mean_sq_code, unit_rows)
    if second <= 0.0:
        raise BadInputError("heterogeneous_moment_prediction: all codes are zero (E‖x‖² = 0)")
    return signal / second


def cofiring_share(
    second_moment: float,
    mean_code: Float[Tensor, " N"],
    mean_sq_code: Float[Tensor, " N"],
    unit_rows: Float[Tensor, "N d"],
) -> float:
    """Share of E‖x‖² made by latents that fire together (or avoid each other):
    (E‖x‖² − Σ_i E[a_i²] − Σ_{i≠j} E[a_i]E[a_j] u_i·u_j)/E‖x‖² = Σ_{i≠j} Cov(a_i, a_j) u_i·u_j / E‖x‖².

    ``second_moment`` is the measured E‖x‖² = E‖Σ_i a_i u_i‖² (for an SAE: E‖x̂ − b_dec‖²). 0 for
    independent codes; > 0 when aligned latents co-fire (the moment ratio ‖M‖²/E‖x‖² is then A_het·(1 − share)).
    """
    if second_moment <= 0.0:
        raise BadInputError("cofiring_share: E‖x‖² is 0; no code fired")
    return (second_moment - independent_second_moment(mean_code, mean_sq_code, unit_rows)) / second_moment


def anisotropy_sampling_sd(unit_sum: Float[Tensor, " d"], unit_scatter: Float[Tensor, "d d"], n: int) -> float | None:
    """Sampling sd of Â = mean_{a≠b} x̂_a·x̂_b over n iid unit vectors, from Σ x̂ and Σ x̂x̂ᵀ.

    Â is a U-statistic with kernel x̂_a·x̂_b; with m = E x̂, C = E x̂x̂ᵀ (plug-in estimates):
    Var(Â) = 4(n−2)/(n(n−1))·(mᵀCm − ‖m‖⁴) + 2/(n(n−1))·(tr C² − ‖m‖⁴). Rows that are not independent
    (tokens of one sequence) make the true sd larger. None for n < 3.
    """
    if n < 3:
        return None
    m = _as_tensor(unit_sum).to(torch.float64) / n
    c = _as_tensor(unit_scatter).to(torch.float64) / n
    m4 = float(m @ m) ** 2
    zeta1 = max(float(m @ c @ m) - m4, 0.0)
    zeta2 = max(float(c.square().sum()) - m4, 0.0)
    return math.sqrt(4 * (n - 2) / (n * (n - 1)) * zeta1 + 2 / (n * (n - 1)) * zeta2)


def _sample_coo(codes) -> tuple[int, Tensor, Tensor, Tensor]:
    n_rows, rows, cols, values = coo_codes(codes)
    rows, cols, values = rows.cpu().long(), cols.cpu().long(), values.detach().cpu().to(torch.float64)
    keep = values != 0
    return n_rows, rows[keep], cols[keep], values[keep]


def independent_codes_anisotropy(
    codes, unit_rows: Float[Tensor, "N d"], *, replicates: int = 2, seed: int = 0
) -> tuple[float, float | None]:
    """The per-latent law in its mean-cosine form: A of x = Σ_i a_i u_i when each latent keeps its own law
    but fires independently of the others, estimated from a sample of k code rows.

    Each latent's column of the sample is permuted over the k rows on its own (``replicates`` = R times,
    seeded): the rows then hold the product of the sample's per-latent marginals, co-firing removed,
    norms fluctuating as they do. Returns (mean pairwise cosine of the nonzero permuted rows, its sd).

    The sd is the delta method's over the k sampled rows plus the permutations' own noise
    (docs/statistics.md §8). With φ(x) = m·(x̂ − m)·[x ≠ 0], m the mean unit row, P the nonzero share,
    ψ_j(a) = E[φ(x) | a_j = a] − E[φ(x) | a_j = 0] and s_i = Σ_j ψ_j(a_ij) the sampled row i's influence:

        Var = 4/(P²k)·(Var(s) − V⊗/R) + 4ζ₁/(PkR) + 2ζ₂/(n(n − 1)),   V⊗ = Σ_j Var(ψ_j(a_j)),

    ζ₁, ζ₂ the U-statistic's of the n = PkR permuted unit rows. Var(s) carries the co-firing of the sampled
    rows (Σ_{j≠l} Cov(ψ_j, ψ_l)), which the permuted rows alone cannot show; ψ_j(a) is read off each permuted
    row p that holds the entry as D = φ(x_p) − φ(x_p − a u_j) (the rest of x_p is a draw from the other
    latents' law), its noise between replicates taken out of Var(s) and V⊗. Memory O(nnz·R + k·d + d²): the
    rows a block of entries reads are gathered and normalised in float64 then; one randperm(k) per active
    latent and replicate. None for the sd when k < 3.
    """
    k, rows, cols, values = _sample_coo(codes)
    unit_rows = _as_tensor(unit_rows)
    latent_norms = row_norms(unit_rows).clamp_min(1e-300)  # ‖w_i‖, float64, blockwise
    d = unit_rows.shape[1]
    if k < 3 or not values.numel():
        return float("nan"), None
    gen = torch.Generator().manual_seed(int(seed))
    order = cols.argsort(stable=True)  # entries grouped by latent: one slice per active latent
    rows, cols, values = rows[order], cols[order], values[order]
    _, counts = torch.unique_consecutive(cols, return_counts=True)
    bounds = [0, *counts.cumsum(0).tolist()]
    unit_sum = torch.zeros(d, dtype=torch.float64)
    scatter = torch.zeros(d, d, dtype=torch.float64)
    n_unit = 0
    x = torch.empty(k, d, dtype=torch.float64)
    # per replicate: where each entry went, x_p·u_j of its permuted row, and the rows' norms (for ψ below)
    landed, along, row_norm = [], [], []
    for _ in range(replicates):
        new_rows = torch.empty_like(rows)
        for lo, hi in zip(bounds[:-1], bounds[1:]):  # one uniform permutation of the k rows per latent
            new_rows[lo:hi] = torch.randperm(k, generator=gen)[rows[lo:hi]]
        x.zero_()
        for lo in range(0, len(values), _BLOCK_ROWS):  # Σ_i a_i u_i per permuted row, entries in blocks
            part = slice(lo, lo + _BLOCK_ROWS)
            unit = unit_rows[cols[part]].to(torch.float64) / latent_norms[cols[part], None]
            x.index_add_(0, new_rows[part], values[part, None] * unit)
        dots = torch.empty(len(values), dtype=torch.float64)
        for lo in range(0, len(values), _BLOCK_ROWS):
            part = slice(lo, lo + _BLOCK_ROWS)
            unit = unit_rows[cols[part]].to(torch.float64) / latent_norms[cols[part], None]
            dots[part] = (x[new_rows[part]] * unit).sum(1)
        # the rows made unit in place (a zero row stays zero and adds nothing): no k × d or d × d temporaries
        norms = x.norm(dim=1)
        x.div_(norms.clamp_min(1e-300)[:, None])
        unit_sum += x.sum(0)
        scatter.addmm_(x.T, x)
        n_unit += int((norms > 0).sum())
        landed.append(new_rows)
        along.append(dots)
        row_norm.append(norms)
    if n_unit < 2:
        return float("nan"), None
    a = anisotropy_from_unit_mean(unit_sum / n_unit, n_unit)
    return a, _independent_codes_sd(
        k, rows, cols, values, landed, along, row_norm, unit_sum, scatter, n_unit, unit_rows, latent_norms
    )


def _independent_codes_sd(
    k, rows, cols, values, landed, along, row_norm, unit_sum, scatter, n_unit, unit_rows, latent_norms
) -> float | None:
    """The sd of ``independent_codes_anisotropy`` (its docstring has the formula)."""
    reps = len(landed)
    m = unit_sum / n_unit
    mm = float(m @ m)
    w = torch.empty(unit_rows.shape[0], dtype=torch.float64)  # m·u_j for every latent, in row blocks
    for lo in range(0, unit_rows.shape[0], _BLOCK_ROWS):
        w[lo : lo + _BLOCK_ROWS] = unit_rows[lo : lo + _BLOCK_ROWS].to(torch.float64) @ m
    w /= latent_norms
    aw = values * w[cols]  # a·(m·u_j) per entry
    psi = torch.empty(reps, len(values), dtype=torch.float64)
    for r, (new_rows, dots, norms) in enumerate(zip(landed, along, row_norm)):
        m_dot_x = torch.zeros(k, dtype=torch.float64).index_add_(0, new_rows, aw)
        n_entries = torch.zeros(k, dtype=torch.float64).index_add_(0, new_rows, torch.ones_like(values))
        phi = torch.where(norms > 0, m_dot_x / norms.clamp_min(1e-300) - mm, 0.0)
        rest_sq = (norms[new_rows].square() - 2 * values * dots + values.square()).clamp_min(0.0)
        alone = n_entries[new_rows] == 1  # the entry is its row: without it the row is zero (φ = 0)
        rest_phi = torch.where(alone, 0.0, (m_dot_x[new_rows] - aw) / rest_sq.sqrt().clamp_min(1e-300) - mm)
        psi[r] = phi[new_rows] - rest_phi
    mean_psi = psi.mean(0)  # ψ_j(a_ij) per entry, averaged over the replicates
    s = torch.zeros(k, dtype=torch.float64).index_add_(0, rows, mean_psi)
    var_s = float(s.var())
    # V⊗ = Σ_j Var_i(ψ_j(a_ij)) over all k rows (zeros where j is silent): per latent Σψ and Σψ²
    n_lat = unit_rows.shape[0]
    sum_j = torch.zeros(n_lat, dtype=torch.float64).index_add_(0, cols, mean_psi)
    sq_j = torch.zeros(n_lat, dtype=torch.float64).index_add_(0, cols, mean_psi.square())
    sum_var_j = float((sq_j - sum_j.square() / k).sum()) / (k - 1)
    # the replicates' noise in each averaged ψ, Var_r(D)/R, is in both var_s and sum_var_j
    noise = float(psi.var(0).sum()) / reps / (k - 1) if reps > 1 else 0.0
    p = n_unit / (k * reps)
    c = scatter / n_unit
    m4 = mm**2
    zeta1 = max(float(m @ c @ m) - m4, 0.0)
    zeta2 = max(float(c.square().sum()) - m4, 0.0)
    var = (
        4 / (p * p * k) * (var_s - sum_var_j / reps - noise * (1 - 1 / reps))
        + 4 * zeta1 / (p * k * reps)
        + 2 * zeta2 / (n_unit * (n_unit - 1))
    )
    return math.sqrt(max(var, 0.0))


def cofiring_pairs(
    codes,
    mean_code: Float[Tensor, " N"],
    mean_sq_code: Float[Tensor, " N"],
    unit_rows: Float[Tensor, "N d"],
    second_moment: float,
    *,
    n_latents: int = 256,
    n_pairs: int = 20,
    sign: float = 1.0,
) -> tuple[list[dict], float]:
    """The latent pairs that make the co-firing term, from a sample of k code rows.

    Among the ``n_latents`` latents with the largest E[a_i²] (exact, streamed; by Cauchy–Schwarz
    |E[a_i a_j]| ≤ √(E[a_i²]E[a_j²]), so they bound the largest terms), pair {i, j} adds
    2·(E_s[a_i a_j] − E[a_i]E[a_j])·u_i·u_j / E‖x‖² to ``cofiring_share``, E_s over the sample (a k × L
    float64 matrix), E[a_i] exact. Returns (the ``n_pairs`` pairs with the largest sign·share, each
    {i, j, share, joint_rate (sample co-firing frequency), cos = u_i·u_j}; the summed share of all pairs
    among those latents, an estimate of how much of the co-firing term they carry).
    """
    k, rows, cols, values = _sample_coo(codes)
    mean_code = _as_tensor(mean_code).to(torch.float64)
    top = _as_tensor(mean_sq_code).to(torch.float64).argsort(descending=True)[: min(n_latents, len(mean_code))]
    top = top[_as_tensor(mean_sq_code).to(torch.float64)[top] > 0]
    if k < 1 or len(top) < 2 or second_moment <= 0:
        return [], 0.0
    position = torch.full((len(mean_code),), -1, dtype=torch.long)
    position[top] = torch.arange(len(top))
    keep = position[cols] >= 0
    dense = torch.zeros(k, len(top), dtype=torch.float64)
    dense.index_put_((rows[keep], position[cols[keep]]), values[keep], accumulate=True)
    unit = _as_tensor(unit_rows)[top].to(torch.float64)
    unit = unit / unit.norm(dim=1, keepdim=True).clamp_min(1e-300)
    gram = unit @ unit.T
    m = mean_code[top]
    share = 2.0 * (dense.T @ dense / k - torch.outer(m, m)) * gram / second_moment
    joint = ((dense != 0).double().T @ (dense != 0).double()) / k  # codes of both signs fire below 0 too
    iu = torch.triu_indices(len(top), len(top), offset=1)
    pair_share = share[iu[0], iu[1]]
    order = (sign * pair_share).argsort(descending=True)[:n_pairs]
    pairs = [
        {
            "i": int(top[iu[0, o]]),
            "j": int(top[iu[1, o]]),
            "share": float(pair_share[o]),
            "joint_rate": float(joint[iu[0, o], iu[1, o]]),
            "cos": float(gram[iu[0, o], iu[1, o]]),
        }
        for o in order.tolist()
    ]
    return pairs, float(pair_share.sum())


def mean_cosine_prediction(expected_ratio: float, mean_sq_norm: float) -> float:
    """Mean-cosine law: A ≈ ‖ū‖²·(E[S/√(S²‖ū‖² + (1−‖ū‖²)Q)])².

    Writing u_i = ū + v_i with the v_i nearly orthogonal (‖v_i‖² = 1 − ‖ū‖²), a code has
    x = S·ū + Σ a_i v_i, ‖x‖² ≈ S²‖ū‖² + (1−‖ū‖²)Q and E[x̂] ≈ E[S/‖x‖]·ū; A = ‖E[x̂]‖².
    ``expected_ratio`` is E[S/√(S²‖ū‖² + (1−‖ū‖²)Q)] over codes, e.g.
    ``CodeMomentAccumulator(N, mean_sq_norm).expected_ratio``. Unlike the moment forms it follows
    the fluctuating norms that the mean cosine actually averages over.
    """
    return mean_sq_norm * expected_ratio**2


def cone_shares(
    mean_code: Float[Tensor, " N"], unit_rows: Float[Tensor, "N d"], *, normalize: bool = True
) -> Float[Tensor, " N"]:
    """Per-feature share of the cone: c_i = E[a_i]·(u_i·M)/‖M‖², M = Σ_i E[a_i]·u_i.

    Σ_i c_i = 1 (M·M/‖M‖²). A feature with a large c_i is one the mean direction is made of; a
    negative c_i points against the cone. Rows are normalised unless ``normalize=False``.
    Returns float64 shares; an all-zero mean code (no cone at all) raises BadInputError.
    """
    mean_code = _as_tensor(mean_code).to(torch.float64)
    unit_rows = _as_tensor(unit_rows)
    if unit_rows.ndim != 2 or mean_code.shape != (unit_rows.shape[0],):
        raise BadInputError(
            f"cone_shares needs mean_code (N,) and rows (N, d); got {tuple(mean_code.shape)} and {tuple(unit_rows.shape)}"
        )
    # Two passes over row blocks: M first, then each row's projection on it.
    mean_vector = mean_code_vector(mean_code, unit_rows, normalize=normalize)
    norm_sq = float(mean_vector.square().sum())
    if norm_sq == 0.0:
        raise BadInputError("cone_shares: Σ E[a_i]·u_i is zero (no cone); shares are undefined")
    shares = torch.empty_like(mean_code)
    for start in range(0, unit_rows.shape[0], _BLOCK_ROWS):
        shares[start : start + _BLOCK_ROWS] = mean_code[start : start + _BLOCK_ROWS] * (
            _unit_block(unit_rows, start, normalize) @ mean_vector
        )
    return shares / norm_sq


def coo_codes(codes) -> tuple[int, Int[Tensor, " nnz"], Int[Tensor, " nnz"], Float[Tensor, " nnz"]]:
    """(batch rows, row index, feature index, value) of the nonzero codes.

    Accepts a dense (B, N) tensor/array, a torch sparse tensor, or any object with ``n_rows``,
    ``rows``, ``cols``, ``values`` (e.g. ``saegeo.synthetic.SparseCodes``).
    """
    if hasattr(codes, "values") and hasattr(codes, "cols") and hasattr(codes, "rows"):
        return int(codes.n_rows), codes.rows.long(), codes.cols.long(), codes.values
    codes = _as_tensor(codes)
    if codes.is_sparse or codes.layout in (torch.sparse_csr, torch.sparse_csc):
        coo = codes.to_sparse_coo().coalesce()
        idx = coo.indices()
        return int(codes.shape[0]), idx[0], idx[1], coo.values()
    if codes.ndim != 2:
        raise BadInputError(f"codes must be 2-D (batch, N); got shape {tuple(codes.shape)}")
    rows, cols = codes.nonzero(as_tuple=True)
    return int(codes.shape[0]), rows, cols, codes[rows, cols]


_PER_LATENT = ("fire_count", "latent_sum", "latent_sq_sum")


@dataclass
class CodeMomentAccumulator:
    """Streaming statistics of codes for the amplification law; mergeable, serialisable.

    Per code (row) a: L0 = #{a_i ≠ 0}, S = Σ a_i, Q = Σ a_i². Accumulated in float64:
    n codes, Σ L0, Σ a and Σ a² over nonzero entries, the count of negative entries, per-latent fire counts, Σ a_i
    and Σ a_i², and, when ``mean_sq_norm`` (‖ū‖² of the unit dictionary) is given, Σ S/√(S²‖ū‖² + (1−‖ū‖²)Q) for the
    mean-cosine form (codes with Q = 0 contribute 0: their direction is undefined, they add nothing).
    Codes of both signs (AbsTopK) are accumulated as they are (``signed``); the one-rate forms then need the codes
    oriented (``oriented_r``, docs/statistics.md §9). Codes must already carry the decoder norms (a_i·‖W_dec,i‖)
    when the rows are not unit.
    """

    n_latents: int
    mean_sq_norm: float | None = None
    n: int = 0
    l0_sum: float = 0.0
    value_sum: float = 0.0
    value_sq_sum: float = 0.0
    ratio_sum: float = 0.0
    negative_count: float = 0.0  # nonzero entries below 0: codes of both signs when > 0
    fire_count: Tensor = field(default=None)  # type: ignore[assignment]
    latent_sum: Tensor = field(default=None)  # type: ignore[assignment]
    latent_sq_sum: Tensor = field(default=None)  # type: ignore[assignment]

    def __post_init__(self) -> None:
        for name in _PER_LATENT:
            if getattr(self, name) is None:
                setattr(self, name, torch.zeros(self.n_latents, dtype=torch.float64))

    def add(self, codes) -> CodeMomentAccumulator:
        """Add a batch of codes: dense (B, N), torch sparse, or SparseCodes (see ``coo_codes``)."""
        n_rows, rows, cols, values = coo_codes(codes)
        rows, cols, values = rows.cpu(), cols.cpu(), values.detach().cpu().to(torch.float64)
        if values.numel() and not torch.isfinite(values).all():
            bad = int(rows[~torch.isfinite(values)][0])
            raise BadInputError(f"codes row {bad} of this batch is not finite")
        keep = values != 0
        rows, cols, values = rows[keep], cols[keep], values[keep]
        if cols.numel() and int(cols.max()) >= self.n_latents:
            raise BadInputError(
                f"codes have latent index {int(cols.max())} but the accumulator has N = {self.n_latents}"
            )
        self.n += n_rows
        self.l0_sum += float(values.numel())
        self.value_sum += float(values.sum())
        self.value_sq_sum += float(values.square().sum())
        self.negative_count += float((values < 0).sum())
        self.fire_count += torch.bincount(cols, minlength=self.n_latents).to(torch.float64)
        self.latent_sum += torch.bincount(cols, weights=values, minlength=self.n_latents)
        self.latent_sq_sum += torch.bincount(cols, weights=values.square(), minlength=self.n_latents)
        if self.mean_sq_norm is not None:
            s = torch.zeros(n_rows, dtype=torch.float64).index_add_(0, rows, values)
            q = torch.zeros(n_rows, dtype=torch.float64).index_add_(0, rows, values.square())
            denom = (s.square() * self.mean_sq_norm + (1.0 - self.mean_sq_norm) * q).sqrt()
            self.ratio_sum += float(torch.where(q > 0, s / denom.clamp_min(1e-300), 0.0).sum())
        return self

    # ---- measures
    @property
    def K(self) -> float:
        """Expected number of active latents per code, mean L0."""
        return self.l0_sum / max(self.n, 1)

    @property
    def q(self) -> float:
        """Activation rate q = K/N."""
        return self.K / self.n_latents

    @property
    def r(self) -> float:
        """r = E[a|a≠0]²/E[a²|a≠0] over all nonzero entries (1/2 Exp, 2/π half-normal, 1 constant; signed codes:
        the signed mean, 0 for symmetric signs)."""
        if self.l0_sum == 0:
            return float("nan")
        return (self.value_sum / self.l0_sum) ** 2 / (self.value_sq_sum / self.l0_sum)

    @property
    def signed(self) -> bool:
        """Whether any code was negative (AbsTopK and any dictionary whose codes take both signs)."""
        return self.negative_count > 0

    @property
    def negative_share(self) -> float:
        """The share of nonzero codes below 0."""
        return self.negative_count / self.l0_sum if self.l0_sum else 0.0

    @property
    def orientation(self) -> Float[Tensor, " N"]:
        """s_i = sign(Σ a_i) (+1 where it is 0): flipping latent i's code and decoder row by s_i changes no
        reconstruction and makes each latent's mean code ≥ 0 (the identity for non-negative codes)."""
        return torch.where(self.latent_sum < 0, -1.0, 1.0).to(torch.float64)

    @property
    def oriented_r(self) -> float:
        """r̃ = E[s_i a_i | a_i ≠ 0]²/E[a_i² | a_i ≠ 0] = (Σ_i |Σ a_i| / L0)² / (Σ a² / L0): r of the oriented codes
        (= r for non-negative codes)."""
        if self.l0_sum == 0:
            return float("nan")
        return (float(self.latent_sum.abs().sum()) / self.l0_sum) ** 2 / (self.value_sq_sum / self.l0_sum)

    @property
    def firing_frequency(self) -> Float[Tensor, " N"]:
        """Per-latent fraction of codes in which the latent is active."""
        return self.fire_count / max(self.n, 1)

    @property
    def mean_code(self) -> Float[Tensor, " N"]:
        """Per-latent E[a_i] over all codes (zeros included): the weights of M = Σ E[a_i] u_i."""
        return self.latent_sum / max(self.n, 1)

    @property
    def mean_sq_code(self) -> Float[Tensor, " N"]:
        """Per-latent E[a_i²] over all codes: with ``mean_code``, the input of ``heterogeneous_moment_prediction``."""
        return self.latent_sq_sum / max(self.n, 1)

    @property
    def expected_ratio(self) -> float:
        """E[S/√(S²‖ū‖² + (1−‖ū‖²)Q)], the input of ``mean_cosine_prediction``."""
        if self.mean_sq_norm is None:
            raise BadInputError(
                "expected_ratio needs the dictionary's ‖ū‖²: CodeMomentAccumulator(N, mean_sq_norm=...)"
            )
        return self.ratio_sum / max(self.n, 1)

    def predictions(self, a_dict: float, unit_rows: Float[Tensor, "N d"] | None = None) -> dict[str, float]:
        """The forms side by side (needs ``mean_sq_norm``); a_dict from ``dictionary_anisotropy``.

        With the dictionary's rows the per-latent ``heterogeneous_moment`` form is added.
        """
        out = {
            "textbook": textbook_prediction(self.K, a_dict),
            "exact_moment": exact_moment_prediction(self.K, self.q, self.r, self.mean_sq_norm),
            "mean_cosine": mean_cosine_prediction(self.expected_ratio, self.mean_sq_norm),
        }
        if unit_rows is not None:
            out["heterogeneous_moment"] = heterogeneous_moment_prediction(self.mean_code, self.mean_sq_code, unit_rows)
        return out

    # ---- combine and persist
    def merge(self, other: CodeMomentAccumulator) -> CodeMomentAccumulator:
        """Combine in place with another accumulator over other codes (same N and ‖ū‖²)."""
        if other.n_latents != self.n_latents or other.mean_sq_norm != self.mean_sq_norm:
            raise BadInputError(
                f"cannot merge code statistics of N={other.n_latents}, ‖ū‖²={other.mean_sq_norm} "
                f"into N={self.n_latents}, ‖ū‖²={self.mean_sq_norm}"
            )
        self.n += other.n
        self.l0_sum += other.l0_sum
        self.value_sum += other.value_sum
        self.value_sq_sum += other.value_sq_sum
        self.ratio_sum += other.ratio_sum
        self.negative_count += other.negative_count
        for name in _PER_LATENT:
            getattr(self, name).add_(getattr(other, name))
        return self

    def __add__(self, other: CodeMomentAccumulator) -> CodeMomentAccumulator:
        return CodeMomentAccumulator.from_state_dict(self.state_dict()).merge(other)

    def state_dict(self) -> dict:
        """Plain tensors and numbers; ``from_state_dict`` restores an identical accumulator."""
        return {
            "n_latents": self.n_latents,
            "mean_sq_norm": self.mean_sq_norm,
            "n": self.n,
            "l0_sum": self.l0_sum,
            "value_sum": self.value_sum,
            "value_sq_sum": self.value_sq_sum,
            "ratio_sum": self.ratio_sum,
            "negative_count": self.negative_count,
            **{name: getattr(self, name).clone() for name in _PER_LATENT},
        }

    @classmethod
    def from_state_dict(cls, state: dict) -> CodeMomentAccumulator:
        state = dict(state)
        for key in _PER_LATENT:
            state[key] = _as_tensor(state[key]).to(torch.float64).clone()
        return cls(**state)
