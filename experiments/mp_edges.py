"""Marchenko–Pastur edges and the effective rank of isotropic noise, over n/d.

Isotropic Gaussian rows (d = 256, and d = 768 at n = 5000) are accumulated by GeometryAccumulator; the
extreme sample eigenvalues and the effective rank are compared with saegeo's MP edges σ²(1 ± √(d/n))² and
noise_effective_rank(n, d). A true spike (one direction with 4× variance) is planted in a second series and
must be counted above the upper edge. Pure noise's λmax sits at the edge up to Tracy–Widom fluctuations
(~d^(-2/3)), so the bare edge counts a "spike" in pure noise now and then: the CSV shows how often.
Writes mp_edges.csv / .png.

    python experiments/mp_edges.py
"""

from __future__ import annotations

import time

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import torch
from _common import parser, save_figure, write_csv

from saegeo.geometry.accumulate import GeometryAccumulator
from saegeo.geometry.measures import centred_spectrum, effective_rank
from saegeo.geometry.nulls import marchenko_pastur_edges, noise_effective_rank


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--d", type=int, default=256)
    p.add_argument("--ratios", default="1.5,2,4,8,16,32,64")
    args = p.parse_args()
    started = time.time()
    gen = torch.Generator().manual_seed(args.seed)
    settings = [(args.d, int(float(r) * args.d)) for r in args.ratios.split(",")] + [(768, 5000)]
    rows = []
    for d, n in settings:
        for spike in (1.0, 4.0):
            x = torch.randn(n, d, generator=gen)
            x[:, 0] *= spike**0.5
            acc = GeometryAccumulator(d).add(x)
            eig = centred_spectrum(acc).eigenvalues
            sigma2 = float(eig.sum()) / d
            lower, upper = marchenko_pastur_edges(sigma2, n, d)
            rows.append(
                dict(
                    d=d,
                    n=n,
                    n_over_d=n / d,
                    spike=spike,
                    lambda_max=float(eig[0]),
                    lambda_min=float(eig[-1]),
                    mp_upper=upper,
                    mp_lower=lower,
                    spikes_above_edge=int((eig > upper).sum()),
                    erank=effective_rank(eig),
                    noise_erank=noise_effective_rank(n, d),
                )
            )
            r = rows[-1]
            print(
                f"d={d:4d} n={n:6d} spike×{spike:g}: λmax {r['lambda_max']:.3f} (edge {upper:.3f})  "
                f"λmin {r['lambda_min']:.3f} (edge {lower:.3f})  spikes {r['spikes_above_edge']}  "
                f"erank {r['erank']:.1f} (noise {r['noise_erank']:.1f})",
                flush=True,
            )
    csv_path = write_csv(args.out / "mp_edges.csv", rows)

    noise = [r for r in rows if r["spike"] == 1.0 and r["d"] == args.d]
    ratio = [r["n_over_d"] for r in noise]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    ax1.semilogx(ratio, [r["lambda_max"] for r in noise], "o", color="C0", label="λmax measured")
    ax1.semilogx(ratio, [r["mp_upper"] for r in noise], "-", color="C0", label="MP upper edge")
    ax1.semilogx(ratio, [r["lambda_min"] for r in noise], "s", color="C1", label="λmin measured")
    ax1.semilogx(ratio, [r["mp_lower"] for r in noise], "-", color="C1", label="MP lower edge")
    ax1.set_xlabel("n/d")
    ax1.set_ylabel("eigenvalue / σ²")
    ax1.set_title(f"isotropic noise, d={args.d}")
    ax1.legend()
    ax2.semilogx(ratio, [r["erank"] / r["d"] for r in noise], "o", label="erank/d measured")
    ax2.semilogx(ratio, [r["noise_erank"] / r["d"] for r in noise], "-", label="noise_effective_rank/d")
    ax2.set_xlabel("n/d")
    ax2.set_title("effective rank of pure noise")
    ax2.legend()
    png_path = save_figure(fig, args.out / "mp_edges.png")
    worst = max(abs(r["erank"] - r["noise_erank"]) / r["d"] for r in rows if r["spike"] == 1.0)
    print(
        f"max |erank − noise erank|/d = {worst:.4f}; noise spikes above the edge: "
        f"{sum(r['spikes_above_edge'] for r in rows if r['spike'] == 1.0)}; planted spikes found: "
        f"{sum(r['spikes_above_edge'] for r in rows if r['spike'] > 1.0)}/{len(settings)}"
    )
    print(f"wrote {csv_path} and {png_path} in {time.time() - started:.0f} s")


if __name__ == "__main__":
    main()
