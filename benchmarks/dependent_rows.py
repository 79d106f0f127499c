"""How far the printed sds fall short when rows are not independent: tokens of one window are correlated, and every
sd saegeo prints treats rows as iid (docs/statistics.md, "Dependent rows").

On a cached store (default: MiniLM blocks.3.hook_resid_post on the bundled corpus), the anisotropy A and its printed
A_sd are computed on disjoint subsets of m rows drawn two ways:
  shuffled   m rows drawn at random across the store (the iid case the sd is derived for)
  windows    m/context whole windows, each window's rows in order (what a report on a short stream sees)
and the mean printed sd is set against the spread of A over the subsets. The ratio spread/sd is about 1 for shuffled
rows; for windows its square is the design effect: how many times the iid variance the real variance is.

  python benchmarks/dependent_rows.py [--store DIR] [--windows-per-subset 4 8 16]
"""

from __future__ import annotations

import argparse
import math
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from saegeo.activations.store import ActivationStore
from saegeo.geometry.accumulate import anisotropy_from_unit_mean, blocked_jackknife_anisotropy_sd
from saegeo.geometry.measures import null_test_from_sums, null_test_sums_from_rows
from saegeo.geometry.nulls import sign_aware_null


def a_and_sd(x: torch.Tensor) -> tuple[float, float]:
    """A of the rows and its printed sd (the report's null test on the rows' own sums)."""
    sums = null_test_sums_from_rows(x)
    a = anisotropy_from_unit_mean(sums.unit_sum / sums.n, sums.n)
    m1, m2 = (float(v) / (sums.n * sums.d) for v in sums.power_sum)
    return a, null_test_from_sums(sums, a, sign_aware_null(m1, m2)).A_sd


def windows_of(store: ActivationStore, context: int) -> list[torch.Tensor]:
    """The store's rows cut into its windows (a new window where the position does not follow), first token dropped
    (CLS: another law)."""
    out = []
    for shard in range(len(store.shards)):
        x, pos = store.read_shard(shard), store.read_positions(shard)
        starts = [0, *np.flatnonzero(np.diff(pos.numpy()) != 1) + 1, len(pos)]
        out += [x[a:b][pos[a:b] > 0] for a, b in zip(starts[:-1], starts[1:]) if b - a == context]
    return out


def spread_ratio(parts: list[torch.Tensor]) -> tuple[float, float, int]:
    values, sds = np.array([a_and_sd(p) for p in parts]).T
    return float(values.std(ddof=1) / sds.mean()), float(sds.mean()), len(parts)


def blocked_sd(windows: list[torch.Tensor]) -> float:
    """The blocked-jackknife sd of A over these windows in stream order, one block per window."""
    units = [w / w.norm(dim=1, keepdim=True) for w in windows]
    return blocked_jackknife_anisotropy_sd(torch.stack([u.sum(0) for u in units]), np.array([len(u) for u in units]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--store", help="an activation store (default: cache MiniLM blocks.3, 65,536 tokens)")
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--windows-per-subset", type=int, nargs="+", default=[2, 8, 32])
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.store is None:
        from saegeo.activations.cache import CacheConfig, cache_activations

        out = Path(tempfile.mkdtemp()) / "acts"
        hook = "blocks.3.hook_resid_post"
        cache_activations(
            CacheConfig(
                model="minilm", hooks=(hook,), context=args.context, max_tokens=65_536, out=str(out), progress=False
            )
        )
        args.store = str(out / hook)
    t0, c0 = time.perf_counter(), time.process_time()
    wins = windows_of(ActivationStore(args.store), args.context)
    rows = torch.cat(wins)
    shuffled = rows[torch.randperm(len(rows), generator=torch.Generator().manual_seed(0))]
    print(f"{len(wins):,} windows of {args.context - 1} rows (first token dropped) from {args.store}")
    print(
        "| rows per subset | windows | subsets | printed A_sd | spread/sd shuffled | spread/sd windows | design effect "
        "| spread/blocked-jackknife sd |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for w in args.windows_per_subset:
        m = w * (args.context - 1)
        starts = range(0, len(wins) - w + 1, w)
        groups = [torch.cat(wins[i : i + w]) for i in starts]
        iid = [shuffled[i : i + m] for i in range(0, len(shuffled) - m + 1, m)]
        r_iid, _, _ = spread_ratio(iid)
        r_win, sd, g = spread_ratio(groups)
        se = 1 / math.sqrt(2 * (g - 1))
        values = np.array([a_and_sd(p)[0] for p in groups])
        jack = np.mean([blocked_sd(wins[i : i + w]) for i in starts]) if w >= 3 else math.nan
        print(
            f"| {m:,} | {w} | {g} | {sd:.4f} | {r_iid:.2f} | {r_win:.2f} ± {r_win * se:.2f} | {r_win**2:.1f} "
            f"| {values.std(ddof=1) / jack:.2f} |"
        )
    print(f"({time.perf_counter() - t0:.1f} s wall, {time.process_time() - c0:.1f} CPU s)")


if __name__ == "__main__":
    main()
