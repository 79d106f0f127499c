"""Mean pooling multiplies anisotropy: pooled A = 1/(1 + (G/C)²/m) over the pool size m.

Token vectors h = c + g with a shared part ‖c‖ = C and independent zero-mean parts of norm G; the mean of
m of them keeps c and shrinks g to G/√m, so its cosine with another pooled vector is ≈ C²/(C² + G²/m).
(a) the textbook recipe on d = 768 Gaussians at G/C = 0.5, 1, 2, 2000 pooled vectors per point;
(b) saegeo's synthetic superposition (tilted dictionary, offset, noise), with C² = ‖E x‖² and
G² = tr Cov(x) taken from the generator's truth, pooling m consecutive rows. Writes mean_pooling.csv / .png.

    python experiments/mean_pooling.py
"""

from __future__ import annotations

import math
import time

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import torch
from _common import parser, save_figure, write_csv

from saegeo.geometry.measures import anisotropy_from_unit_mean
from saegeo.synthetic import SuperpositionGenerator, SyntheticConfig

POOL_SIZES = (1, 2, 4, 8, 16, 32, 64)


def pooled_anisotropy(tokens: torch.Tensor, m: int) -> float:
    """A of the means of the first m tokens of each sequence; tokens (sequences, length, d)."""
    pooled = tokens[:, :m].double().mean(1)
    unit_mean = (pooled / pooled.norm(dim=1, keepdim=True)).mean(0)
    return anisotropy_from_unit_mean(unit_mean, len(pooled))


def predicted(g_over_c: float, m: int) -> float:
    return 1.0 / (1.0 + g_over_c**2 / m)


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--sequences", type=int, default=2000)
    args = p.parse_args()
    started = time.time()
    gen = torch.Generator().manual_seed(args.seed)
    rows = []
    d, length = 768, max(POOL_SIZES)
    for g_over_c in (0.5, 1.0, 2.0):
        shared = torch.randn(d, generator=gen)
        shared /= shared.norm()  # C = 1
        tokens = shared + torch.randn(args.sequences, length, d, generator=gen) * (g_over_c / math.sqrt(d))
        for m in POOL_SIZES:
            rows.append(
                dict(
                    source="gaussian c+g",
                    G_over_C=g_over_c,
                    m=m,
                    measured_A=pooled_anisotropy(tokens, m),
                    predicted_A=predicted(g_over_c, m),
                )
            )
    cfg = SyntheticConfig(d=256, n_features=1024, rate=0.02, tilt=0.1, offset=0.3, noise=0.3, seed=args.seed)
    synth = SuperpositionGenerator(cfg)
    truth = synth.truth
    c_sq = float(truth.population_mean.double().square().sum())
    g_sq = float(torch.trace(truth.covariance()))
    x, _ = synth.sample(args.sequences * length)
    tokens = x.reshape(args.sequences, length, cfg.d)
    for m in POOL_SIZES:
        rows.append(
            dict(
                source="synthetic superposition",
                G_over_C=math.sqrt(g_sq / c_sq),
                m=m,
                measured_A=pooled_anisotropy(tokens, m),
                predicted_A=predicted(math.sqrt(g_sq / c_sq), m),
            )
        )
    for r in rows:
        print(
            f"{r['source']:24s} G/C {r['G_over_C']:.3f}  m {r['m']:3d}  measured {r['measured_A']:.4f}  "
            f"predicted {r['predicted_A']:.4f}  diff {r['measured_A'] - r['predicted_A']:+.4f}"
        )
    csv_path = write_csv(args.out / "mean_pooling.csv", rows)

    fig, ax = plt.subplots(figsize=(6, 4))
    groups = sorted({(r["source"], r["G_over_C"]) for r in rows})
    for i, (source, ratio) in enumerate(groups):
        sub = [r for r in rows if (r["source"], r["G_over_C"]) == (source, ratio)]
        ax.semilogx(
            [r["m"] for r in sub],
            [r["measured_A"] for r in sub],
            "o",
            color=f"C{i}",
            label=f"{source}, G/C={ratio:.2f}",
        )
        ax.semilogx([r["m"] for r in sub], [r["predicted_A"] for r in sub], "-", color=f"C{i}")
    ax.set_xlabel("pool size m (tokens averaged)")
    ax.set_ylabel("A of pooled vectors")
    ax.set_title("points: measured, lines: 1/(1 + (G/C)²/m)")
    ax.legend(fontsize=7)
    png_path = save_figure(fig, args.out / "mean_pooling.png")
    for source in ("gaussian c+g", "synthetic superposition"):
        worst = max(abs(r["measured_A"] - r["predicted_A"]) for r in rows if r["source"] == source)
        print(f"{source}: max |measured − predicted| = {worst:.4f}")
    print(f"wrote {csv_path} and {png_path} in {time.time() - started:.0f} s")


if __name__ == "__main__":
    main()
