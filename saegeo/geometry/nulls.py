"""Null models: what a measure reads on data with no structure of the kind it is meant to detect.

Public API
----------
``isotropic_cosine_sd(d) -> float``                 sd of one cosine between isotropic vectors, 1/√d.
``anisotropy_null_sd(n, d) -> float``               sd of the estimate of A under isotropy, √(2/(n(n−1)d)).
``sign_aware_null(pooled_mean, pooled_mean_square) -> float``   A_null = m̄²/s̄.
``DENSE_RELU_NULL`` = 1/π,  ``sparse_exp_null(q) -> float`` = q/2   the canonical forms.
``sign_regime(negative_energy_fraction) -> str``    "non-negative" | "sign-skewed" | "sign-symmetric".
``SignNull`` / ``sign_null_from_moments(...)``      the null with its regime, q, r and canonical forms.
``marchenko_pastur_edges(sigma2, n, d) -> (lower, upper)``   σ²(1 ∓ √γ)², γ = d/n.
``marchenko_pastur_mean(fn, gamma, n_nodes=256) -> float``   E[fn(t)] for t ~ MP(γ, σ² = 1), quadrature.
``noise_effective_rank(n, d) -> float``             erank that isotropic noise of the same (n, d) shows (closed form).
``anisotropy_u_statistic_variance(ζ₁, ζ₂, n)``      exact Var(Â) = [4(n−2)ζ₁ + 2ζ₂]/(n(n−1)).
``iid_unit_mean_sq_norm(counts, values, d)`` / ``finite_d_null_bias(counts, values, d)``   E‖E x̂‖² for iid
    coordinates from a discrete marginal (exact integral) and the relative bias of A against m̄²/s̄;
    ``iid_unit_mean_sq_norm_influence(counts, values, d) -> (Q, IF)`` the same with its influence function.
``calibrated_mp_bulk(eigenvalues, n, d) -> MPBulk``  σ² of the bulk (fixed point), Tracy–Widom 99 % margin,
    spike count, or "no flat bulk" with the power-law slope α (``power_law_slope``), or "no MP bulk" with the
    edge-distribution count ``edge_distribution_spike_count(eigenvalues, r_max) -> EdgeSpikeCount`` (Onatski 2010).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np

from saegeo.errors import BadInputError

DENSE_RELU_NULL = 1.0 / math.pi  # ReLU(N(0,1)): (E a)²/E a² = (1/√(2π))²/(1/2)
# Thresholds on the negative-energy fraction Σx₋²/Σx² that name the sign regime.
NON_NEGATIVE_MAX = 1e-3
SIGN_SYMMETRIC_MIN = 0.35


def isotropic_cosine_sd(d: int) -> float:
    """sd of cos(x, y) for independent isotropic x, y ∈ R^d: 1/√d."""
    return 1.0 / math.sqrt(d)


def anisotropy_null_sd(n: int, d: int) -> float:
    """sd of Â = mean over the n(n−1) ordered pairs of cos(x_i, x_j) under isotropy.

    The pairwise cosines are uncorrelated with variance 1/d (degenerate U-statistic), so
    sd(Â) = √(2 / (n(n−1)d)). Infinite for n < 2.
    """
    if n < 2:
        return math.inf
    return math.sqrt(2.0 / (n * (n - 1) * d))


def sign_aware_null(pooled_mean: float, pooled_mean_square: float) -> float:
    """A_null = m̄²/s̄: the mean cosine that coordinates iid from the pooled marginal would give.

    m̄ = mean of all entries, s̄ = mean of all squared entries. 1/π for dense ReLU(N(0,1)),
    q/2 for q-sparse Exp(1), ≈0.187 for GELU(N(0,1)), 0 for sign-symmetric data; in general q·r for
    non-negative data. Finite-d bias of the measured A against it: ≈ +1.4/(q·d) relative.
    """
    if pooled_mean_square <= 0:
        return 0.0
    return pooled_mean**2 / pooled_mean_square


def sparse_exp_null(q: float) -> float:
    """The canonical null for q-sparse Exp(1) codes: q·r with r = 1/2."""
    return q / 2.0


def sign_regime(negative_energy_fraction: float) -> str:
    """Name the sign regime from Σx₋²/Σx²: non-negative (≤ 1e-3), sign-symmetric (≥ 0.35), else sign-skewed."""
    if negative_energy_fraction <= NON_NEGATIVE_MAX:
        return "non-negative"
    if negative_energy_fraction >= SIGN_SYMMETRIC_MIN:
        return "sign-symmetric"
    return "sign-skewed"


@dataclass
class SignNull:
    """The sign-aware null with what it was computed from; ``canonical`` names the textbook form it matches."""

    regime: str
    null: float  # the pooled m̄²/s̄ — the one to read A against
    pooled_mean: float
    pooled_mean_square: float
    fraction_nonzero: float  # q
    magnitude_ratio: float  # r over the nonzero magnitudes
    negative_energy_fraction: float
    dense_relu_null: float  # 1/π
    sparse_exp_null: float  # q/2
    canonical: str  # "1/pi" | "q/2" | "0" | "none": which canonical value agrees with the pooled one (10%)

    def to_dict(self) -> dict:
        return asdict(self)


def sign_null_from_moments(
    pooled_mean: float,
    pooled_mean_square: float,
    fraction_nonzero: float,
    magnitude_ratio: float,
    negative_energy_fraction: float,
    *,
    rel_tol: float = 0.1,
) -> SignNull:
    """Assemble the sign-aware null; the canonical forms are reported beside it, never substituted.

    A fixed switch "q/2 if q < 0.3 else 1/π" is wrong in general: the null is q·r and r depends on the
    magnitude law, so ``canonical`` only names the form that happens to agree within ``rel_tol``.
    """
    null = sign_aware_null(pooled_mean, pooled_mean_square)
    regime = sign_regime(negative_energy_fraction)
    relu, sparse = DENSE_RELU_NULL, sparse_exp_null(fraction_nonzero)
    canonical = "none"
    if regime == "sign-symmetric" and null < 0.01:
        canonical = "0"
    elif regime == "non-negative":
        if abs(null - relu) <= rel_tol * relu:
            canonical = "1/pi"
        elif sparse > 0 and abs(null - sparse) <= rel_tol * sparse:
            canonical = "q/2"
    return SignNull(
        regime=regime,
        null=null,
        pooled_mean=pooled_mean,
        pooled_mean_square=pooled_mean_square,
        fraction_nonzero=fraction_nonzero,
        magnitude_ratio=magnitude_ratio,
        negative_energy_fraction=negative_energy_fraction,
        dense_relu_null=relu,
        sparse_exp_null=sparse,
        canonical=canonical,
    )


# ---------------------------------------------------------------------- Marchenko–Pastur
def marchenko_pastur_edges(sigma2: float, n: int, d: int) -> tuple[float, float]:
    """Edges of the MP bulk for the sample covariance of n isotropic rows in R^d: σ²(1 ∓ √γ)², γ = d/n."""
    if n < 1 or d < 1:
        raise BadInputError(f"Marchenko–Pastur edges need n ≥ 1 and d ≥ 1, got n={n}, d={d}")
    root = math.sqrt(d / n)
    return sigma2 * (1 - root) ** 2, sigma2 * (1 + root) ** 2


def marchenko_pastur_mean(fn: Callable[[np.ndarray], np.ndarray], gamma: float, n_nodes: int = 256) -> float:
    """E[fn(t)] over the continuous part of MP(γ, σ² = 1), weighted by its mass min(1, 1/γ).

    Deterministic quadrature: with t = m + h·cos θ (m, h = centre and half-width of the bulk) the density
    √((b−t)(t−a))/(2πγt) dt becomes h² sin²θ/(2πγ t(θ)) dθ, smooth on [0, π]; Gauss–Legendre on θ then
    converges exponentially (256 nodes: ~1e-13 for smooth fn). The atom at 0 (γ > 1) contributes fn(0)·(1 − 1/γ)
    only if the caller adds it; for t·log t it is zero.
    """
    a, b = (1 - math.sqrt(gamma)) ** 2, (1 + math.sqrt(gamma)) ** 2
    centre, half = (a + b) / 2, (b - a) / 2
    nodes, weights = np.polynomial.legendre.leggauss(n_nodes)
    theta = (nodes + 1) * (math.pi / 2)
    t = centre + half * np.cos(theta)
    density = half**2 * np.sin(theta) ** 2 / (2 * math.pi * gamma * t)
    return float(np.sum(weights * (math.pi / 2) * density * fn(t)))


def noise_effective_rank(n: int, d: int) -> float:
    """Effective rank exp(−Σ p log p) that the covariance of n isotropic rows in R^d shows (large-d limit).

    With p_i = λ_i/Σλ and the eigenvalues distributed as MP(γ = d/n, σ² = 1) (mean 1),
    −Σ p log p = log d − E[t log t], so erank = d · exp(−E_MP[t log t]). Closed form of the MP integral:
    E[t log t] = γ/2 for γ ≤ 1 and log γ + 1/(2γ) for γ > 1 (the atom at 0 contributes nothing), hence
        erank = d·exp(−d/(2n))  (n ≥ d),      erank = n·exp(−n/(2d))  (n < d).
    (Checked against the quadrature of :func:`marchenko_pastur_mean` and by simulation in the tests.)
    d=768, n=5000 → 711.2.
    """
    if n < 1 or d < 1:
        raise BadInputError(f"noise effective rank needs n ≥ 1 and d ≥ 1, got n={n}, d={d}")
    if n >= d:
        return float(d * math.exp(-d / (2 * n)))
    return float(n * math.exp(-n / (2 * d)))


# ---------------------------------------------------------------------- sampling sd and finite-d bias of Â
def anisotropy_u_statistic_variance(zeta1: float, zeta2: float, n: int) -> float:
    """Exact variance of the degree-2 U-statistic Â = (1/(n(n−1))) Σ_{i≠j} x̂_i·x̂_j (Hoeffding):

        Var(Â) = [4(n − 2)·ζ₁ + 2·ζ₂] / (n(n − 1))
               = 4ζ₁/n + 2(ζ₂ − 2ζ₁)/(n(n − 1)),
        ζ₁ = Var(x̂·m) = mᵀCm − ‖m‖⁴,   ζ₂ = Var(x̂·ŷ) = tr(C²) − ‖m‖⁴,   m = E x̂,  C = E x̂x̂ᵀ.

    ζ₁ = 0 (m = 0, isotropy) leaves the degenerate 2ζ₂/(n(n−1)); with C = I/d that is 2/(n(n−1)d), the
    isotropic formula of :func:`anisotropy_null_sd`. Infinite for n < 2.
    """
    if n < 2:
        return math.inf
    return max(0.0, (4 * (n - 2) * zeta1 + 2 * zeta2) / (n * (n - 1)))


def iid_unit_mean_sq_norm(counts: np.ndarray, values: np.ndarray, d: int, *, n_nodes: int = 401) -> float:
    """E‖m‖², m = E[x/‖x‖], for rows of d coordinates iid from the discrete marginal {values, weights ∝ counts},
    conditioned on x ≠ 0 — the exact expectation of Â for data drawn from the pooled null.

    By symmetry ‖m‖² = d·(E[x₁/‖x‖])². With 1/√S = π^{−1/2}∫₀^∞ t^{−1/2}e^{−tS}dt and S = Σ_k x_k²,
        E[x₁/‖x‖] = π^{−1/2} ∫₀^∞ t^{−1/2} ψ(t) φ(t)^{d−1} dt,   φ(t) = E e^{−t x²},  ψ(t) = E[x e^{−t x²}],
    (an all-zero row contributes 0), and P(x = 0) = P(x₁ = 0)^d. The integral is taken in u = log(t·d·s̄)
    (s̄ = E x²) by the trapezoid rule on [−40, 40], 401 nodes (the integrand is smooth and decays at both ends: they
    agree with 8,001 nodes to 4e-12).
    """
    return iid_unit_mean_sq_norm_influence(counts, values, d, n_nodes=n_nodes, influence=False).expected


@dataclass
class PooledNullInfluence:
    """Q = E‖m‖² of the pooled iid law and how it moves with the marginal (see
    :func:`iid_unit_mean_sq_norm_influence`); arrays are per value of the discrete law."""

    expected: float  # Q = E‖m‖², m = E[x/‖x‖ | x ≠ 0]
    influence: np.ndarray | None  # IF(v) = dQ/dε towards δ_v (mean 0 under F)
    coordinate_mean: float  # m₁ = E[x₁/‖x‖ | x ≠ 0] (every coordinate's, by symmetry): Q = d·m₁²
    row_sum_kernel: np.ndarray | None  # k(v) with E[(Σ_k x_k/‖x‖)·f(x₁) | x ≠ 0] = E_F[f·k] for any f
    # IF at any points (not only the law's values): the same quadrature, see influence_at
    influence_at: Callable[[np.ndarray], np.ndarray] | None = None


def iid_unit_mean_sq_norm_influence(
    counts: np.ndarray, values: np.ndarray, d: int, *, n_nodes: int = 401, influence: bool = True
) -> PooledNullInfluence:
    """Q = E‖m‖² of :func:`iid_unit_mean_sq_norm` and its influence function IF(v) at each value.

    Q is a functional of the marginal F: Q = d·I²/D², I = π^{−1/2}∫ t^{−1/2} ψ φ^{d−1} dt, D = 1 − P(x = 0)^d.
    Moving F towards a point mass at y, F_ε = (1 − ε)F + εδ_y, changes φ by e^{−ty²} − φ, ψ by y e^{−ty²} − ψ
    and p₀ = P(x = 0) by [y = 0] − p₀, so with
        κ_I(y) = π^{−1/2}∫ t^{−1/2} [y e^{−ty²} φ^{d−1} + (d − 1) ψ φ^{d−2} e^{−ty²}] dt,
        κ(y) = 2d·I·κ_I(y)/D² + 2d·I²·d·p₀^{d−1}[y = 0]/D³,
    IF(y) = dQ/dε = κ(y) − E_F κ. Q of the empirical marginal of N entries moves by (1/N)Σ IF(x_e) to first
    order: this is how the estimated finite-d bias fluctuates with the sample (the β̂ term of the null's sd).
    The same integral gives, for any f, E[(Σ_k x_k/‖x‖)·f(x₁)] = E_F[f·κ_I] (split e^{−t‖x‖²} over the
    coordinates: k = 1 gives the y-term, k ≠ 1 the ψ-term), returned as ``row_sum_kernel`` = κ_I/D.
    """
    w = np.asarray(counts, dtype=np.float64)
    v = np.asarray(values, dtype=np.float64)
    w = w / w.sum()
    s = float(np.sum(w * v * v))
    if s <= 0:
        return PooledNullInfluence(0.0, np.zeros_like(v) if influence else None, 0.0, None)
    u = np.linspace(-40.0, 40.0, n_nodes)
    t = np.exp(u) / (d * s)
    nonzero = v != 0
    # e^{−tv²} at every (node, value), in blocks of values, computed once: φ, ψ here and κ_I below. φ − 1 as
    # Σw(e − 1): its rounding (~1e-16 absolute) moves (d − 1)·log φ by ~d·1e-16, nothing.
    total = np.zeros_like(t)
    psi = np.zeros_like(t)
    blocks = []
    keep = influence and t.size * v.size <= 4_000_000
    for lo in range(0, v.size, 1024):
        e = np.exp(-np.outer(t, v[lo : lo + 1024] ** 2))  # (nodes × values)
        total += (e - 1) @ w[lo : lo + 1024]  # φ − 1
        psi += e @ (w * v)[lo : lo + 1024]
        if keep:
            blocks.append(e)
    with np.errstate(divide="ignore"):  # φ → 0 at large t when no entry is exactly 0
        log_phi = np.log1p(np.clip(total, -1.0, None))
    phi_power = np.exp((d - 1) * log_phi) if d > 1 else np.ones_like(t)
    integrand = np.sqrt(t) * psi * phi_power  # t^{−1/2}·ψ·φ^{d−1}·dt/du, dt/du = t
    expected = float(np.trapezoid(integrand, u)) / math.sqrt(math.pi)
    p0 = float(w[~nonzero].sum())
    p_zero_row = p0**d
    if p_zero_row >= 1:
        return PooledNullInfluence(0.0, np.zeros_like(v) if influence else None, 0.0, None)
    denom = 1 - p_zero_row
    q_value = d * (expected / denom) ** 2
    if not influence:
        return PooledNullInfluence(q_value, None, expected / denom, None)
    # κ_I at every value: trapezoid weights × [t^{1/2}φ^{d−1}] for the y-term and × [t^{1/2}(d−1)ψφ^{d−2}] for φ's
    trap = np.full(t.size, u[1] - u[0])
    trap[0] = trap[-1] = trap[0] / 2
    phi_power_less = np.exp((d - 2) * log_phi) if d > 2 else np.ones_like(t)
    a = trap * np.sqrt(t) * phi_power / math.sqrt(math.pi)
    b = trap * np.sqrt(t) * (d - 1) * psi * phi_power_less / math.sqrt(math.pi)
    kappa_i = np.empty_like(v)
    for k, lo in enumerate(range(0, v.size, 1024)):
        e = blocks[k] if keep else np.exp(-np.outer(t, v[lo : lo + 1024] ** 2))
        kappa_i[lo : lo + 1024] = v[lo : lo + 1024] * (a @ e) + b @ e
    kappa = 2 * d * expected * kappa_i / denom**2
    zero_term = 2 * d * expected**2 * d * p0 ** (d - 1) / denom**3 if p0 > 0 else 0.0
    kappa = kappa + np.where(nonzero, 0.0, zero_term)
    kappa_mean = float(np.sum(w * kappa))

    def influence_at(y: np.ndarray) -> np.ndarray:
        """IF(y) at any points y (the formula above, ~401 exponentials per point: evaluate it on a grid)."""
        y = np.asarray(y, dtype=np.float64)
        out = np.empty(y.shape)
        for lo in range(0, y.size, 1024):
            part = y.ravel()[lo : lo + 1024]
            e = np.exp(-np.outer(t, part**2))
            k_i = part * (a @ e) + b @ e
            out.ravel()[lo : lo + 1024] = 2 * d * expected * k_i / denom**2 + np.where(part == 0, zero_term, 0.0)
        return out - kappa_mean

    return PooledNullInfluence(q_value, kappa - kappa_mean, expected / denom, kappa_i / denom, influence_at)


def finite_d_null_bias(counts: np.ndarray, values: np.ndarray, d: int) -> float:
    """Relative finite-d bias b of the pooled null: E[Â] = A_null·(1 + b) for coordinates iid from the marginal.

    b = E‖m‖²/(m̄²/s̄) − 1 with E‖m‖² from :func:`iid_unit_mean_sq_norm` and m̄, s̄ of the same (binned)
    marginal, so binning errors cancel to first order. Second-order expansion in ε = S/(d s̄) − 1 gives
        b ≈ [1 − E x³/(m̄ s̄) + (3/4)·Var(x²)/s̄²] / d
    (= (1.5/q + 0.25)/d for q-sparse Exp(1), 0.75/d for ReLU(N(0,1))), but at q·d ≈ 25 it is ~10 % high
    (simulation: 1.34/(q·d) at q = 0.1, d = 256), hence the exact integral. 0 when m̄ = 0.
    """
    w = np.asarray(counts, dtype=np.float64)
    v = np.asarray(values, dtype=np.float64)
    m1, m2 = float(np.sum(w * v) / w.sum()), float(np.sum(w * v * v) / w.sum())
    if m2 <= 0 or m1 == 0:
        return 0.0
    null = m1 * m1 / m2
    return iid_unit_mean_sq_norm(w, v, d) / null - 1.0


# ---------------------------------------------------------------------- the shape of the MP bulk
def marchenko_pastur_cdf(x: np.ndarray, gamma: float, sigma2: float = 1.0, n_nodes: int = 4097) -> np.ndarray:
    """CDF of the continuous part of MP(γ, σ²), normalised to 1 (for γ > 1 the atom at 0 is left out).

    With t = m + h·cos θ (m, h = centre and half-width of [σ²(1 − √γ)², σ²(1 + √γ)²]) the density
    √((b−t)(t−a))/(2πγσ²t) dt is h² sin²θ/(2πγσ² t(θ)) dθ; its cumulative trapezoid over θ from π (t = a) to 0
    (t = b) on ``n_nodes`` nodes, normalised, is interpolated at x (error ~1e-7 at 4,097 nodes).
    """
    a, b = sigma2 * (1 - math.sqrt(gamma)) ** 2, sigma2 * (1 + math.sqrt(gamma)) ** 2
    centre, half = (a + b) / 2, (b - a) / 2
    theta = np.linspace(math.pi, 0.0, n_nodes)
    t = centre + half * np.cos(theta)
    density = half**2 * np.sin(theta) ** 2 / np.maximum(t, 1e-300)
    cum = np.concatenate([[0.0], np.cumsum((density[1:] + density[:-1]) / 2 * np.abs(np.diff(theta)))])
    if not cum[-1] > 0:  # σ² = 0 (a bulk of zeros, low-rank data): the law is a point mass at a = 0
        return np.where(np.asarray(x, dtype=np.float64) >= a, 1.0, 0.0)
    return np.interp(np.asarray(x, dtype=np.float64), t, cum / cum[-1], left=0.0, right=1.0)


def mp_bulk_distance(bulk: np.ndarray, gamma: float, sigma2: float) -> float:
    """Kolmogorov–Smirnov distance sup|F_emp − F_MP| between the bulk eigenvalues and MP(γ, σ²) (continuous part)."""
    lam = np.sort(np.asarray(bulk, dtype=np.float64))
    m = lam.size
    if m == 0:
        return 1.0
    f = marchenko_pastur_cdf(lam, gamma, sigma2)
    k = np.arange(1, m + 1)
    return float(max(np.max(k / m - f), np.max(f - (k - 1) / m)))


def white_wishart_spectrum(n: int, d: int, rng: np.random.Generator) -> np.ndarray:
    """Eigenvalues (descending, d of them, zeros for rank < d) of XᵀX/n for X an n × d matrix of iid N(0, 1),
    from the Dumitriu–Edelman bidiagonal model: XᵀX has the spectrum of BBᵀ, B lower bidiagonal with
    B_ii = χ_{N−i+1}, B_{i+1,i} = χ_{p−i} (N = max(n, d) degrees of freedom, p = min(n, d)); O(p²), not O(n·d²)."""
    from scipy.linalg import eigvalsh_tridiagonal

    big, small = max(n, d), min(n, d)
    diag_b = np.sqrt(rng.chisquare(big - np.arange(small)))
    sub_b = np.sqrt(rng.chisquare(small - 1 - np.arange(small - 1))) if small > 1 else np.zeros(0)
    diag = diag_b**2 + np.concatenate([[0.0], sub_b**2])
    off = diag_b[:-1] * sub_b
    lam = np.sort(eigvalsh_tridiagonal(diag, off) if small > 1 else diag)[::-1] / n
    return np.concatenate([np.clip(lam, 0, None), np.zeros(d - small)])


# ---------------------------------------------------------------------- calibrated Marchenko–Pastur bulk
TRACY_WIDOM_QUANTILE = 0.99
TRACY_WIDOM_1_Q99 = 2.0234  # 99% quantile of the Tracy–Widom (β = 1) law (0.95: 0.9793)


# The KS distance of a white-noise bulk to MP is ≈ 0.45–0.6·log(m)/m over d = 32 … 2,048 and γ = 0.01 … 2 (eigenvalue
# rigidity: the empirical CDF of m eigenvalues sits O(log m / m) from its limit, not O(1/√m));
# experiments/mp_bulk_shape.py measures it (largest seen 0.90 at d = 32, γ = 2; ≤ 0.76 for d ≥ 64); threshold 1.0.
MP_SHAPE_THRESHOLD_C = 1.0
BULK_SPIKES = "spikes on a Marchenko–Pastur bulk"
BULK_NOT_MP = "no MP bulk: correlated noise (or heavy tails)"
BULK_NARROW = "no MP bulk: narrower than sampling noise (whitened on this sample?)"
BULK_POWER_LAW = "no flat bulk: power law"


def mp_shape_threshold(m: int) -> float:
    """The largest KS distance to MP a white-noise bulk of m eigenvalues is allowed: MP_SHAPE_THRESHOLD_C·log(m)/m
    (calibrated by simulation offline, experiments/mp_bulk_shape.py; 1 for m < 2)."""
    return MP_SHAPE_THRESHOLD_C * math.log(m) / m if m >= 2 else 1.0


@dataclass
class MPBulk:
    """Marchenko–Pastur bulk fitted to a spectrum (see :func:`calibrated_mp_bulk`)."""

    sigma2_trace: float  # tr Σ/d: the naive scale, moved by any large direction
    sigma2_bulk: float  # σ² of the bulk (fixed point of "drop above the edge, refit to the rest")
    lower_edge: float  # σ²_bulk(1 − √γ)²
    upper_edge: float  # σ²_bulk(1 + √γ)²
    tracy_widom_margin: float  # TW₁ quantile × σ²(1+√γ)^{4/3} n^{−2/3} γ^{−1/6}
    tracy_widom_quantile: float
    threshold: float  # upper_edge + margin: what a spike must exceed
    n_spikes: int | None  # eigenvalues above the threshold (None when there is no flat bulk)
    n_spikes_trace_edge: int  # eigenvalues above the naive edge (tr Σ/d)(1 + √γ)²
    n_iterations: int
    has_flat_bulk: bool
    fraction_below_lower_edge: float  # of the retained (non-spike, non-null) eigenvalues
    bulk_fraction: float  # retained eigenvalues / non-null eigenvalues (a MP bulk holds most of them)
    power_law_alpha: float | None  # −slope of log λ_k against log k over the middle ranks
    power_law_r2: float | None
    power_law_ranks: list[int] | None  # [first, last] ranks (1-based) of the fit
    # the shape test: the bulk must look like MP(γ, σ²) before its spikes are counted
    n_spikes_fitted: int = 0  # eigenvalues above the threshold whatever the bulk's shape (what n_spikes would be)
    mp_distance: float | None = None  # KS sup|F_bulk − F_MP(γ, σ²)| over the bulk eigenvalues
    mp_distance_threshold: float | None = None  # MP_SHAPE_THRESHOLD_C·log(m)/m, m = bulk eigenvalues
    has_mp_shape: bool = True  # mp_distance ≤ its threshold
    verdict: str = BULK_SPIKES  # BULK_SPIKES | BULK_NOT_MP | BULK_NARROW | BULK_POWER_LAW
    # no MP bulk: the count of a method made for correlated noise (edge_distribution_spike_count), None otherwise
    n_spikes_edge: int | None = None  # eigenvalues separated from the noise's own edge by a gap ≥ edge_spike_gap
    edge_spike_method: str | None = None  # EDGE_SPIKE_METHOD
    edge_spike_gap: float | None = None  # 2|β̂|
    edge_spike_r_max: int | None = None  # the largest count it can give (n_spikes_edge == r_max: at least that)
    # exactly-null eigenvalues (LayerNorm'd or rank-deficient hooks) left out of the fit, which then takes d − that
    n_null_eigenvalues: int = 0

    def to_dict(self) -> dict:
        return asdict(self)


def power_law_slope(
    eigenvalues: np.ndarray, lo_frac: float = 0.05, hi_frac: float = 0.5
) -> tuple[float, float, list[int]] | None:
    """Least-squares fit log λ_k = c − α log k over ranks k ∈ [lo_frac·r, hi_frac·r] (r = positive eigenvalues,
    descending); returns (α, R², [first, last]) or None with fewer than 5 ranks."""
    lam = np.sort(np.asarray(eigenvalues, dtype=np.float64))[::-1]
    lam = lam[lam > 0]
    r = lam.size
    first, last = max(1, int(math.ceil(lo_frac * r))), int(hi_frac * r)
    if last - first + 1 < 5:
        return None
    k = np.arange(first, last + 1, dtype=np.float64)
    y, x = np.log(lam[first - 1 : last]), np.log(k)
    slope, intercept = np.polyfit(x, y, 1)
    resid = y - (slope * x + intercept)
    r2 = 1 - float(resid @ resid) / float(((y - y.mean()) ** 2).sum()) if y.size > 1 and np.ptp(y) > 0 else 1.0
    return -float(slope), r2, [first, last]


def _fit_bulk(lam: np.ndarray, n: int, d: int, tw_quantile_value: float, max_iterations: int) -> dict:
    """The fixed point of calibrated_mp_bulk on a descending, clipped spectrum: σ², edges, margin, spikes, the
    bulk (non-spike, non-null eigenvalues) and its KS distance to MP(γ, σ²)."""
    n_eff = n - 1
    gamma = d / n_eff
    root = math.sqrt(gamma)
    n_nonnull = min(d, n_eff)  # n ≤ d: d − (n − 1) eigenvalues are zero by construction
    scale = (1 + root) ** (4 / 3) * n_eff ** (-2 / 3) * gamma ** (-1 / 6)
    sigma2 = float(lam.sum()) / d
    iterations = 0
    for iterations in range(1, max_iterations + 1):  # noqa: B007 (read after the loop)
        threshold = sigma2 * ((1 + root) ** 2 + tw_quantile_value * scale)
        rest = lam[lam <= threshold]
        if rest.size == 0:
            break
        new = float(rest.sum()) / rest.size  # the zeros of n ≤ d stay in the mean (MP has an atom at 0)
        if abs(new - sigma2) <= 1e-12 * sigma2:
            sigma2 = new
            break
        sigma2 = new
    margin = tw_quantile_value * sigma2 * scale
    upper = sigma2 * (1 + root) ** 2
    spikes = int((lam > upper + margin).sum())
    bulk = lam[spikes:n_nonnull]
    return dict(
        gamma=gamma,
        sigma2=sigma2,
        iterations=iterations,
        margin=margin,
        upper=upper,
        lower=sigma2 * (1 - root) ** 2,
        spikes=spikes,
        bulk=bulk,
        n_nonnull=n_nonnull,
        distance=mp_bulk_distance(bulk, gamma, sigma2) if bulk.size else 1.0,
    )


EDGE_SPIKE_METHOD = "edge distribution (Onatski 2010): gaps above the noise's own edge, for correlated noise"


@dataclass
class EdgeSpikeCount:
    """Spikes counted by the edge-distribution estimator (see :func:`edge_distribution_spike_count`)."""

    n_spikes: int  # eigenvalues separated from the noise's edge by a gap ≥ delta
    delta: float  # the gap a spike must clear: 2|β̂|, β̂ the edge slope of λ_j in (j − 1)^{2/3}
    r_max: int  # the largest count the estimator can return (gaps i ≤ r_max are looked at)
    saturated: bool  # n_spikes == r_max: read as "at least r_max"
    n_iterations: int
    method: str = EDGE_SPIKE_METHOD

    def to_dict(self) -> dict:
        return asdict(self)


def edge_spike_r_max(m: int) -> int:
    """The default largest count of :func:`edge_distribution_spike_count` for m non-null eigenvalues:
    ⌊m/10⌋ clamped to [1, 64] (the five eigenvalues after it must still be near the edge, j ≪ m)."""
    return max(1, min(64, m // 10))


def edge_distribution_spike_count(
    eigenvalues: np.ndarray, r_max: int | None = None, *, max_iterations: int = 32
) -> EdgeSpikeCount:
    """Onatski's (2010) edge-distribution (ED) estimator of the number of spikes, made for noise that is
    correlated across coordinates and across rows (noise = A·ε·B, any A, B of bounded norm), where MP's edge
    σ²(1 + √γ)² does not apply.

    Whatever the noise's population spectrum, the largest noise eigenvalues sit at a square-root edge b of the
    limiting spectrum and follow its Tracy–Widom (Airy) scaling: λ_j ≈ b − β·(j − 1)^{2/3} for the first noise
    eigenvalues, with β ∝ n^{−2/3} unknown. Spikes are the eigenvalues separated from that cluster. On λ₁ ≥ λ₂ ≥ …
    (the non-null ones; needs r_max + 5 of them):
        1. j = r_max + 1;
        2. β̂ = OLS slope of λ_j … λ_{j+4} on (j − 1)^{2/3} … (j + 3)^{2/3} (and a constant); δ = 2|β̂|;
        3. r̂ = max{i ≤ r_max : λ_i − λ_{i+1} ≥ δ}, 0 if there is none;
        4. j = r̂ + 1; repeat 2–3 until r̂ repeats (Onatski 2010, Rev. Econ. Stat. 92:1004, §III).
    The slope is measured on the spectrum itself, so the null is the noise at hand, correlated or not; the
    threshold 2|β̂| is Onatski's (his simulations: a 10–15 % false count at T = N = 50 that falls with n).
    r_max defaults to :func:`edge_spike_r_max`. docs/statistics.md §4.
    """
    lam = np.sort(np.asarray(eigenvalues, dtype=np.float64))[::-1]
    m = lam.size
    r_max = edge_spike_r_max(m) if r_max is None else int(r_max)
    if r_max < 1 or m < r_max + 5:
        raise BadInputError(f"the edge-distribution count needs r_max ≥ 1 and r_max + 5 eigenvalues (m = {m})")
    gaps = lam[:r_max] - lam[1 : r_max + 1]  # gaps[i − 1] = λ_i − λ_{i+1}, i = 1..r_max

    def count(j: int) -> tuple[int, float]:
        x = np.arange(j - 1, j + 4, dtype=np.float64) ** (2 / 3)
        y = lam[j - 1 : j + 4]
        slope = float(((x - x.mean()) @ (y - y.mean())) / ((x - x.mean()) @ (x - x.mean())))
        delta = 2 * abs(slope)
        above = np.nonzero(gaps >= delta)[0]
        return (int(above[-1]) + 1 if above.size else 0), delta

    r, delta = count(r_max + 1)
    seen, iterations = {r}, 1
    while iterations < max_iterations:
        iterations += 1
        new, delta = count(r + 1)
        if new == r or new in seen:  # converged, or a cycle: keep the latest
            r = new
            break
        seen.add(new)
        r = new
    return EdgeSpikeCount(n_spikes=r, delta=delta, r_max=r_max, saturated=r == r_max, n_iterations=iterations)


def white_noise_bulk_distances(n: int, d: int, n_samples: int = 32, seed: int = 0) -> np.ndarray:
    """KS distances of the MP bulk fit (:func:`calibrated_mp_bulk`'s own) on ``n_samples`` white-noise spectra of
    centred n × d Gaussian rows (Wishart with n − 1 degrees of freedom, /n), by :func:`white_wishart_spectrum`."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n_samples):
        lam = white_wishart_spectrum(n - 1, d, rng) * ((n - 1) / n)
        out.append(_fit_bulk(lam, n, d, TRACY_WIDOM_1_Q99, 100)["distance"])
    return np.array(out)


def calibrated_mp_bulk(
    eigenvalues: np.ndarray,
    n: int,
    d: int,
    *,
    tw_quantile_value: float = TRACY_WIDOM_1_Q99,
    tw_quantile: float = TRACY_WIDOM_QUANTILE,
    max_below_lower_edge: float = 0.1,
    min_bulk_fraction: float = 0.5,
    max_iterations: int = 100,
    null_rel_tol: float = 0.0,
) -> MPBulk:
    """σ² of the MP bulk by the fixed point σ²_{t+1} = mean{λ_i : λ_i ≤ σ²_t(1 + √γ)² + margin_t}, started from
    tr Σ/d, then spikes = #{λ > σ²(1 + √γ)² + margin}, margin = TW₁ quantile · σ²(1+√γ)^{4/3} n'^{−2/3} γ^{−1/6}
    (Johnstone's scale of the largest eigenvalue of white Wishart, n' = n − 1 for centred rows, γ = d/n').
    The 99 % quantile (2.02) leaves pure noise with no spike in ~99 % of samples.

    No flat bulk: if the fitted bulk holds less than ``min_bulk_fraction`` of the non-null eigenvalues (a
    power law's tail always fits some narrow band at large n), or more than ``max_below_lower_edge`` of it
    falls below the lower edge σ²(1 − √γ)² minus the same margin, the spectrum is not spikes on a MP bulk:
    ``n_spikes`` is None and α = −d log λ/d log k is fitted over the middle ranks (:func:`power_law_slope`).

    No MP bulk: a flat bulk must also have MP's shape. Correlated noise (a Toeplitz covariance, rows
    sharing a per-window component) spreads the bulk and the fixed point then "finds" tens of spikes in pure
    noise. The KS distance D = sup|F_bulk − F_MP(γ, σ²)| of the retained eigenvalues must stay below
    MP_SHAPE_THRESHOLD_C·log(m)/m (white noise: median 0.43–0.52·log(m)/m, :func:`mp_shape_threshold`); otherwise
    ``verdict`` = "no MP bulk: correlated noise (or heavy tails)", ``n_spikes`` is None, the power-law slope is
    given and ``n_spikes_fitted`` keeps the count that would have been reported. docs/statistics.md §4.

    A count made for correlated noise is then given beside it: ``n_spikes_edge``, Onatski's edge-distribution
    estimator (:func:`edge_distribution_spike_count`), whose null is the noise's own edge, not MP's (0 on
    Toeplitz ρ = 0.1 / 0.3 and on a per-window shared component; 9 of 9 spikes planted in Toeplitz noise).
    """
    lam = np.sort(np.clip(np.asarray(eigenvalues, dtype=np.float64), 0, None))[::-1]
    if n < 2 or lam.size == 0 or lam.sum() <= 0:
        raise BadInputError(f"a Marchenko–Pastur bulk needs n ≥ 2 and a nonzero spectrum (n = {n})")
    # Exactly-null eigenvalues (≤ null_rel_tol·λ_max: rounding, e.g. the direction LayerNorm removes) are not noise
    # of the data's span: they would pull the bulk's σ² to 0 (a LayerNorm's output, whose rows lose one direction,
    # would read MP σ² 0). They are counted and left out, and the bulk is fitted in the d − k dimensions the rows span (the
    # n ≤ d zeros of a short sample are MP's own atom and stay).
    structural = d - min(d, n - 1)
    n_null = max(0, int((lam <= null_rel_tol * lam[0]).sum()) - structural) if null_rel_tol > 0 else 0
    if n_null:
        lam, d = lam[: lam.size - n_null], d - n_null
    fit = _fit_bulk(lam, n, d, tw_quantile_value, max_iterations)
    sigma2, lower, margin, retained = fit["sigma2"], fit["lower"], fit["margin"], fit["bulk"]
    below = float((retained < lower - margin).mean()) if retained.size else 0.0
    flat = below <= max_below_lower_edge and retained.size >= min_bulk_fraction * fit["n_nonnull"]
    threshold_ks = mp_shape_threshold(retained.size)
    mp_shape = fit["distance"] <= threshold_ks
    # MP's bulk has sd σ²√γ; a bulk much narrower than that is not correlated noise but e.g. whitened rows
    narrow = retained.size > 1 and float(retained.std()) < 0.5 * sigma2 * math.sqrt(fit["gamma"])
    verdict = BULK_POWER_LAW if not flat else (BULK_SPIKES if mp_shape else (BULK_NARROW if narrow else BULK_NOT_MP))
    counted = verdict == BULK_SPIKES
    slope = None if counted else power_law_slope(lam[: fit["n_nonnull"]])
    edge = None
    # whenever the bulk is not MP (correlated noise spreads it; AR(1) at ρ = 0.5 reads as a power law) the count made
    # for correlated noise is given beside the fit, on the power-law path too
    if verdict in (BULK_NOT_MP, BULK_POWER_LAW) and fit["n_nonnull"] >= edge_spike_r_max(fit["n_nonnull"]) + 5:
        edge = edge_distribution_spike_count(lam[: fit["n_nonnull"]])
    sigma2_trace = float(lam.sum()) / d
    return MPBulk(
        sigma2_trace=sigma2_trace,
        sigma2_bulk=sigma2,
        lower_edge=lower,
        upper_edge=fit["upper"],
        tracy_widom_margin=margin,
        tracy_widom_quantile=tw_quantile,
        threshold=fit["upper"] + margin,
        n_spikes=fit["spikes"] if counted else None,
        n_spikes_trace_edge=int((lam > sigma2_trace * (1 + math.sqrt(fit["gamma"])) ** 2).sum()),
        n_iterations=fit["iterations"],
        has_flat_bulk=flat,
        fraction_below_lower_edge=below,
        bulk_fraction=retained.size / fit["n_nonnull"],
        power_law_alpha=slope[0] if slope else None,
        power_law_r2=slope[1] if slope else None,
        power_law_ranks=slope[2] if slope else None,
        n_spikes_fitted=fit["spikes"],
        mp_distance=fit["distance"],
        mp_distance_threshold=threshold_ks,
        has_mp_shape=mp_shape,
        verdict=verdict,
        n_spikes_edge=edge.n_spikes if edge else None,
        edge_spike_method=edge.method if edge else None,
        edge_spike_gap=edge.delta if edge else None,
        edge_spike_r_max=edge.r_max if edge else None,
        n_null_eigenvalues=n_null,
    )
