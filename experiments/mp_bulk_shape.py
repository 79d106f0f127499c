"""The MP bulk shape test: its white-noise calibration and what it sees.

(1) Calibration: the KS distance sup|F_emp − F_MP| between the bulk eigenvalues and MP(γ, σ²) (σ² and the spikes
fitted as ``calibrated_mp_bulk`` does) on white-noise spectra drawn from the bidiagonal Wishart model, over a grid
of d and γ = d/(n − 1). Printed in units of log(m)/m (m = bulk eigenvalues), where it is nearly constant; the
threshold ``MP_SHAPE_THRESHOLD_C``·log(m)/m in saegeo.geometry.nulls is 1.5× the largest value seen here.
(2) Cases: white noise, 9 spikes at 1.5–4× the critical eigenvalue, 3 subcritical spikes, Toeplitz ρ = 0.1 and
0.3, a shared component of variance 0.5 per 64-row window, and the 9 spikes planted in each correlated noise —
the spike count before and after the shape test, and the edge-distribution count (Onatski 2010) where no MP bulk.
Writes mp_bulk_shape_calibration.csv and mp_bulk_shape_cases.csv.

    python experiments/mp_bulk_shape.py [--samples 100]      (≈ 5 min on 2 cores)
"""

from __future__ import annotations

import math

import numpy as np
import torch
from _common import parser, write_csv

from saegeo.geometry.nulls import calibrated_mp_bulk, white_noise_bulk_distances

DIMS = (32, 64, 128, 256, 512, 1024, 2048)
GAMMAS = (0.01, 0.05, 0.2, 0.5, 0.9, 2.0)


def spectrum(x: torch.Tensor) -> np.ndarray:
    x = x - x.mean(0)
    return np.clip(torch.linalg.eigvalsh(x.T @ x / x.shape[0]).flip(0).numpy(), 0, None)


def case_rows(kind: str, n: int, d: int, g: torch.Generator) -> torch.Tensor:
    """n × d float64 rows of one case (unit noise variance)."""
    z = torch.randn(n, d, generator=g, dtype=torch.float64)
    root = math.sqrt(d / (n - 1))
    if kind.startswith("toeplitz"):
        rho, idx = float(kind.split("_")[1]), torch.arange(d)
        return z @ torch.linalg.cholesky(rho ** (idx[:, None] - idx[None, :]).abs().double()).T
    if kind == "window":  # rows of each 64-row window share one N(0, 0.5·I) component
        shared = torch.randn(n // 64 + 1, d, generator=g, dtype=torch.float64) * math.sqrt(0.5)
        return z + shared.repeat_interleave(64, 0)[:n]
    if kind == "spikes_9":  # population eigenvalues f·(1 + √γ), f = 1.5 … 4 (multiples of the critical one)
        z[:, :9] *= torch.tensor(np.sqrt(np.linspace(1.5, 4, 9) * (1 + root)))
    if kind == "spikes_3_subcritical":  # 1 + 0.8·√γ: 0.8× the critical excess √γ
        z[:, :3] *= math.sqrt(1 + 0.8 * root)
    return z


def planted_rows(noise: str, n: int, d: int, g: torch.Generator) -> torch.Tensor:
    """Rows of a noise case plus 9 spikes of population variance f·(1 + √γ), f = 1.5 … 4, on random directions."""
    x = case_rows(noise, n, d, g)
    directions, _ = torch.linalg.qr(torch.randn(d, 9, generator=g, dtype=torch.float64))
    ell = torch.tensor(np.linspace(1.5, 4, 9) * (1 + math.sqrt(d / (n - 1))))
    return x + (torch.randn(n, 9, generator=g, dtype=torch.float64) * ell.sqrt()) @ directions.T


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--samples", type=int, default=100)
    args = p.parse_args()
    rows = []
    for d in DIMS:
        for gamma in GAMMAS:
            n = int(round(d / gamma)) + 1
            dist = white_noise_bulk_distances(n, d, max(10, args.samples * 256 // max(d, 256)), seed=args.seed)
            m = min(d, n - 1)
            unit = math.log(m) / m
            rows.append(
                dict(
                    d=d,
                    gamma=gamma,
                    n=n,
                    samples=len(dist),
                    median=float(np.median(dist) / unit),
                    q95=float(np.quantile(dist, 0.95) / unit),
                    max=float(dist.max() / unit),
                )
            )
            print(rows[-1], flush=True)
    print("wrote", write_csv(args.out / "mp_bulk_shape_calibration.csv", rows))
    cases = []
    for n, d in ((5000, 256), (20000, 256)):
        kinds = ("white", "spikes_9", "spikes_3_subcritical", "toeplitz_0.1", "toeplitz_0.3", "window")
        for kind in (*kinds, "toeplitz_0.1+9", "toeplitz_0.3+9", "window+9"):
            g = torch.Generator().manual_seed(args.seed + 1)
            for rep in range(5):
                x = planted_rows(kind[:-2], n, d, g) if kind.endswith("+9") else case_rows(kind, n, d, g)
                bulk = calibrated_mp_bulk(spectrum(x), n, d)
                cases.append(
                    dict(
                        case=kind,
                        n=n,
                        d=d,
                        rep=rep,
                        n_spikes=bulk.n_spikes,
                        spikes_without_shape_test=bulk.n_spikes_fitted,
                        n_spikes_edge=bulk.n_spikes_edge,
                        edge_gap=bulk.edge_spike_gap,
                        distance=bulk.mp_distance,
                        threshold=bulk.mp_distance_threshold,
                        sigma2=bulk.sigma2_bulk,
                        verdict=bulk.verdict,
                    )
                )
                print(cases[-1], flush=True)
    print("wrote", write_csv(args.out / "mp_bulk_shape_cases.csv", cases))


if __name__ == "__main__":
    main()
