"""Synthetic generator throughput against the naive dense recipe, side by side in one run.

Both make the same kind of rows (N = 4096 features in d = 512, q = 0.02, Exp(1) magnitudes, tilted
dictionary): saegeo draws only the firing positions (geometric gaps) and sums the active rows
(embedding_bag); the naive recipe draws a dense Bernoulli mask and multiplies the dense (B, N) code
matrix by the dictionary. Prints rows/s and the ratio.

    python benchmarks/synth_bench.py [--n 65536]
"""

from __future__ import annotations

import argparse
import time

import torch

from saegeo.synthetic import SuperpositionGenerator, SyntheticConfig


def naive(gen: SuperpositionGenerator, n: int, batch_size: int) -> None:
    g = torch.Generator().manual_seed(0)
    u = gen.truth.dictionary
    q = float(gen.truth.rates[0])
    for _ in range(0, n, batch_size):
        mask = torch.rand(batch_size, u.shape[0], generator=g) < q
        codes = mask * torch.empty(mask.shape).exponential_(1.0, generator=g)
        _ = codes @ u


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=65536)
    p.add_argument("--batch-size", type=int, default=4096)
    args = p.parse_args()
    gen = SuperpositionGenerator(SyntheticConfig(d=512, n_features=4096, rate=0.02, tilt=0.2, seed=0))
    next(gen.activations(args.batch_size, args.batch_size))  # warm-up
    timings = {}
    t = time.perf_counter()
    for _ in gen.activations(args.n, args.batch_size):
        pass
    timings["saegeo"] = time.perf_counter() - t
    t = time.perf_counter()
    naive(gen, args.n, args.batch_size)
    timings["naive dense"] = time.perf_counter() - t
    for name, seconds in timings.items():
        print(f"{name:12s} {args.n / seconds:10,.0f} rows/s")
    print(
        f"ratio saegeo/naive throughput: {timings['naive dense'] / timings['saegeo']:.2f}×  "
        f"(torch threads: {torch.get_num_threads()})"
    )


if __name__ == "__main__":
    main()
