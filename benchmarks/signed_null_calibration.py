"""Calibration of the signed null (docs/statistics.md §9): z = Â/√(2 tr Ĉ²/(n(n − 1))) on rows y = Σ a_i u_i whose
codes take both signs with no preferred sign (the null), and its power against a skewed sign.

Families (N = 4d latents unless said; one torch generator per (family, cell), drawn in sequence):
  laplace_identity   the identity dictionary (the codes are the rows), rate 0.1, ±Exp(1)
  abstopk_tilted     8 latents a row, N(0, 1) values, unit rows tilted to A_dict ≈ 0.25
  t3_tilted          rate 8/N, Student-t(3) values (E|a|³ = ∞), the same tilted rows
  cofiring_pairs     latents 2j, 2j + 1 fire together with one shared sign (only y → −y is a symmetry)
  abstopk_sae        the codes an AbsTopK SAE (k 8, W_enc = W_decᵀ, zero biases: an odd encode) gives on
                     x = Σ ±(0.5 + Exp(1)) u_i, rows = codes·W_dec: what the report's x̂ − b_dec holds
  three_directions   N = 3 tilted latents, rate 0.5 (tr C² large: the degenerate U-statistic is far from normal)
  skew_p             abstopk_tilted with P(a > 0) = p (the alternative; mean z is the power)
Each cell prints mean z ± se / sd z ± se and the skewness of z over the datasets; benchmarks/README.md holds the table.

    python benchmarks/signed_null_calibration.py [--datasets 300] [--cells 64x100,64x1000,256x1000]
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np
import torch

from saegeo.geometry.measures import signed_null_test
from saegeo.sae.model import SAE, SAEConfig


def tilted_rows(n_latents: int, d: int, tilt: float, gen: torch.Generator) -> torch.Tensor:
    """Unit rows tilt·e₀ + √(1 − tilt²)·v_i, v_i random unit vectors ⟂ e₀ (A_dict ≈ tilt²)."""
    v = torch.randn(n_latents, d, generator=gen)
    v[:, 0] = 0
    return tilt * torch.eye(d)[0] + math.sqrt(1 - tilt**2) * v / v.norm(dim=1, keepdim=True)


def fair_sign(shape: tuple[int, ...], gen: torch.Generator, p: float = 0.5) -> torch.Tensor:
    return torch.where(torch.rand(shape, generator=gen) < p, 1.0, -1.0)


def k_of_n(n: int, n_latents: int, k: int, values: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """(n, n_latents) codes with k latents a row chosen uniformly, holding ``values`` (n, k)."""
    idx = torch.rand(n, n_latents, generator=gen).argsort(1)[:, :k]
    return torch.zeros(n, n_latents).scatter_(1, idx, values)


def rows_of(family: str, n: int, d: int, u: torch.Tensor, sae: SAE | None, gen: torch.Generator) -> torch.Tensor:
    big = u.shape[0]
    if family == "laplace_identity":
        return (
            torch.empty(n, d).exponential_(generator=gen)
            * fair_sign((n, d), gen)
            * (torch.rand(n, d, generator=gen) < 0.1)
        )
    if family == "abstopk_tilted":
        return k_of_n(n, big, 8, torch.randn(n, 8, generator=gen), gen) @ u
    if family.startswith("skew_"):
        p = float(family.split("_")[1])
        return k_of_n(n, big, 8, torch.randn(n, 8, generator=gen).abs() * fair_sign((n, 8), gen, p), gen) @ u
    if family == "t3_tilted":
        t = torch.randn(n, big, generator=gen) / (torch.randn(n, big, 3, generator=gen).square().sum(2) / 3).sqrt()
        return (t * (torch.rand(n, big, generator=gen) < 8 / big)) @ u
    if family == "cofiring_pairs":
        fire = (torch.rand(n, big // 2, generator=gen) < 8 / big).float() * fair_sign((n, big // 2), gen)
        return (torch.empty(n, big).exponential_(generator=gen) * fire.repeat_interleave(2, dim=1)) @ u
    if family == "abstopk_sae":
        x = k_of_n(n, big, 8, (torch.empty(n, 8).exponential_(generator=gen) + 0.5) * fair_sign((n, 8), gen), gen) @ u
        with torch.no_grad():
            return sae.encode(x) @ sae.W_dec
    if family == "three_directions":
        return (torch.randn(n, 3, generator=gen) * (torch.rand(n, 3, generator=gen) < 0.5)) @ u
    raise ValueError(family)


def z_of(rows: torch.Tensor) -> float | None:
    rows = rows.double()
    rows = rows[rows.norm(dim=1) > 0]
    unit = rows / rows.norm(dim=1, keepdim=True)
    return signed_null_test(unit.sum(0), unit.T @ unit, unit.shape[0]).z


def summary(z: np.ndarray) -> str:
    n = len(z)
    sd = z.std(ddof=1)
    kurt = float(np.mean((z - z.mean()) ** 4) / sd**4)
    skew = float(np.mean((z - z.mean()) ** 3) / sd**3)
    se_sd = sd * math.sqrt(max(kurt - 1, 0.0) / (4 * n))
    return f"{z.mean():+.2f}±{sd / math.sqrt(n):.2f} / {sd:.2f}±{se_sd:.2f} (skew {skew:+.1f})"


FAMILIES = (
    "laplace_identity",
    "abstopk_tilted",
    "t3_tilted",
    "cofiring_pairs",
    "abstopk_sae",
    "three_directions",
    "skew_0.52",
    "skew_0.55",
    "skew_0.6",
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--datasets", type=int, default=300)
    ap.add_argument("--cells", default="64x100,64x1000,256x1000", help="d x n, comma-separated")
    ap.add_argument("--families", default=",".join(FAMILIES))
    args = ap.parse_args()
    torch.set_num_threads(1)
    cells = [tuple(int(v) for v in c.split("x")) for c in args.cells.split(",")]
    print("| family | " + " | ".join(f"d {d}, n {n:,}" for d, n in cells) + " |")
    print("|---|" + "---|" * len(cells))
    wall, cpu = time.time(), time.process_time()
    for f_i, family in enumerate(args.families.split(",")):
        out = []
        for c_i, (d, n) in enumerate(cells):
            gen = torch.Generator().manual_seed(1000 * f_i + c_i)
            u = (
                torch.eye(d)
                if family == "laplace_identity"
                else tilted_rows(3 if family == "three_directions" else 4 * d, d, 0.5, gen)
            )
            sae = None
            if family == "abstopk_sae":
                sae = SAE(SAEConfig(d_in=d, d_sae=u.shape[0], activation="abstopk", k=8))
                with torch.no_grad():
                    sae.W_dec.copy_(u)
                    sae.W_enc.copy_(u.T)
                    sae.b_enc.zero_()
                    sae.b_dec.zero_()
            z = [z_of(rows_of(family, n, d, u, sae, gen)) for _ in range(args.datasets)]
            out.append(summary(np.array([v for v in z if v is not None])))
        print(f"| {family} | " + " | ".join(out) + " |", flush=True)
    print(f"({args.datasets} datasets a cell; CPU {time.process_time() - cpu:.0f} s, wall {time.time() - wall:.0f} s)")


if __name__ == "__main__":
    main()
