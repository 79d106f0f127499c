"""Calibration of the z against the sign-aware null on data drawn from the null (issues 25 and 36).

Rows whose d entries are iid from one law (the null: A is what sign structure alone makes) for twelve laws —
light and heavy tails (rectified Student-t(5) and t(3)), point masses at zero (sparse Exp, lognormal with 70 %
zeros, Lomax with half zeros), discrete laws (Poisson(1), Bernoulli(0.1)), mixtures (a scale mixture of ReLUs),
a sign-skewed law and a bounded one — at d = 64 … 2,048, with n on both sides of the row sample behind the sd
(``GeometryAccumulator(sample_rows=k)``: exact while n ≤ k, sampled beyond). z is computed by saegeo's own
``null_test_from_sums`` on each dataset: from a streaming accumulator where n > k (the sampled path the report
takes past SD_SAMPLE_ROWS), from the rows' own sums otherwise (the same sums, exactly: tests/geometry/test_null_calibration.py).
A calibrated z has mean ≈ 0 and sd ≈ 1 over datasets; each cell prints both with standard errors
(se of an sd ≈ sd·√((κ − 1)/(4N)), κ the kurtosis of z over the N datasets), and how many datasets had no z
(``null_z_withheld``: the sd could not be trusted). Each (law, cell) has its own generator, drawn from in sequence.
Writes null_z_calibration.csv; docs/statistics.md §3 holds the table.

    python experiments/null_z_calibration.py [--datasets 200] [--laws relu,t5_relu] [--cells 64x2000,64x16384:8192]
"""

from __future__ import annotations

import math
import time

import numpy as np
import torch
from _common import parser, write_csv
from scipy import special

from saegeo.geometry.accumulate import SD_SAMPLE_ROWS, GeometryAccumulator
from saegeo.geometry.measures import (
    anisotropy_from_unit_mean,
    null_test_from_sums,
    null_test_sums,
    null_test_sums_from_rows,
    sign_null,
)
from saegeo.geometry.nulls import sign_aware_null


def _rectified_t(rng: np.random.Generator, nu: float, shape: tuple[int, int]) -> np.ndarray:
    return np.maximum(rng.standard_t(nu, size=shape), 0.0)


LAWS = {
    "relu": lambda rng, s: np.maximum(rng.standard_normal(s), 0.0),
    "gelu": lambda rng, s: (lambda z: 0.5 * z * (1 + special.erf(z / math.sqrt(2))))(rng.standard_normal(s)),
    "exp_q0.05": lambda rng, s: rng.exponential(size=s) * (rng.random(s) < 0.05),
    "t5_relu": lambda rng, s: _rectified_t(rng, 5.0, s),
    "t3_relu": lambda rng, s: _rectified_t(rng, 3.0, s),
    "lognormal_70pc_zeros": lambda rng, s: np.exp(rng.standard_normal(s)) * (rng.random(s) >= 0.7),
    "lomax3_50pc_zeros": lambda rng, s: rng.pareto(3.0, size=s) * (rng.random(s) >= 0.5),
    "poisson1": lambda rng, s: rng.poisson(1.0, size=s).astype(np.float64),
    "bernoulli0.1": lambda rng, s: (rng.random(s) < 0.1).astype(np.float64),
    "relu_scale_mix": lambda rng, s: np.maximum(rng.standard_normal(s), 0.0) * np.where(rng.random(s) < 0.1, 3.0, 1.0),
    "normal_mean0.5": lambda rng, s: rng.standard_normal(s) + 0.5,
    "uniform01": lambda rng, s: rng.random(s),
}
# (d, n[, k]): n ≤ k exact, n > k the sampled path; k defaults to SD_SAMPLE_ROWS. A smaller k past which the same
# estimator samples is the cheaper stress (its error grows as 1/√k).
DEFAULT_CELLS = "64x2000,64x16384,256x250,256x2000,256x4096:1024,1024x500,1024x2048:512,2048x300"


def null_rows(law: str, n: int, d: int, rng: np.random.Generator) -> torch.Tensor:
    """n rows of d entries iid from the law (float32), drawn from ``rng``."""
    return torch.from_numpy(LAWS[law](rng, (n, d)).astype(np.float32))


def z_of(x: torch.Tensor, sample_rows: int) -> tuple[float | None, bool]:
    """(null z, withheld) of one dataset: the accumulator's sampled path past ``sample_rows``, else the rows' sums."""
    if x.shape[0] > sample_rows:
        acc = GeometryAccumulator(x.shape[1], sample_rows=sample_rows).add(x)
        a = anisotropy_from_unit_mean(acc.unit_mean, acc.n_unit)
        sums, null = null_test_sums(acc), sign_null(acc).null
    else:
        sums = null_test_sums_from_rows(x)
        a = anisotropy_from_unit_mean(sums.unit_sum / sums.n, sums.n)
        m1, m2 = (float(v) / (sums.n * sums.d) for v in sums.power_sum)
        null = sign_aware_null(m1, m2)
    test = null_test_from_sums(sums, a, null)
    return test.null_z, test.null_z_withheld is not None


def cell_summary(zs: np.ndarray) -> dict:
    """mean and sd of z with their standard errors (the sd's from the kurtosis of z)."""
    n = zs.size
    sd = float(zs.std(ddof=1))
    kurt = float(np.mean((zs - zs.mean()) ** 4) / np.mean((zs - zs.mean()) ** 2) ** 2) if n > 3 else 3.0
    return dict(
        z_mean=float(zs.mean()),
        z_mean_se=sd / math.sqrt(n),
        z_sd=sd,
        z_sd_se=sd * math.sqrt(max(kurt - 1, 0.0) / (4 * n)),
        max_abs_z=float(np.abs(zs).max()),
    )


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--datasets", type=int, default=200)
    p.add_argument("--laws", default=",".join(LAWS))
    p.add_argument("--cells", default=DEFAULT_CELLS)
    args = p.parse_args()
    torch.set_num_threads(1)
    rows = []
    for cell in args.cells.split(","):
        shape, _, k = cell.partition(":")
        d, n = (int(v) for v in shape.split("x"))
        k = int(k) if k else SD_SAMPLE_ROWS
        for law in args.laws.split(","):
            t0, cpu0 = time.perf_counter(), time.process_time()
            seed = [args.seed, list(LAWS).index(law), d, n, k]
            rng = np.random.default_rng(seed)  # one generator per (law, cell), drawn from in sequence
            got = [z_of(null_rows(law, n, d, rng), k) for _ in range(args.datasets)]
            zs = np.array([z for z, _ in got if z is not None])
            rows.append(
                dict(
                    law=law,
                    d=d,
                    n=n,
                    sample_rows=k,
                    path="sampled" if n > k else "exact",
                    datasets=args.datasets,
                    withheld=sum(w for _, w in got),
                    **(cell_summary(zs) if zs.size > 1 else {}),
                    cpu_s=time.process_time() - cpu0,
                    wall_s=time.perf_counter() - t0,
                )
            )
            print(rows[-1], flush=True)
    print("wrote", write_csv(args.out / "null_z_calibration.csv", rows))


if __name__ == "__main__":
    main()
