"""Geometry core benchmark: saegeo's streaming report against the textbook approach and the gram's floor.

Same float32 rows (n × 768, in 8,192-row batches), one run, side by side:
  (a) textbook: numpy SVD of the full centred matrix + the unit-vector mean (holds all rows);
  (b) floor:    bare torch.matmul of each batch's gram (float32) accumulated in float64 — nothing else;
  saegeo:       GeometryAccumulator.add over the batches + activation_geometry (the full report).
Then peak memory (VmHWM of a fresh child process) of saegeo streaming n rows from a generator at two n.

    python benchmarks/geometry_bench.py            # n = 50,000 and memory at 200k / 1M  (≈ 2–3 min on 2 cores)
    python benchmarks/geometry_bench.py --full     # n = 200,000 as in the issue (the textbook SVD dominates)
Targets (issue 2): ≥ 5× faster than (a); ≥ 60% of (b)'s throughput; memory growth from 200k to 1M ≈ 0.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

import numpy as np
import torch

from saegeo.geometry.accumulate import GeometryAccumulator
from saegeo.geometry.measures import activation_geometry

D = 768
BATCH = 8192


def make_batches(n: int, seed: int = 0):
    """Yield float32 batches with a realistic shape: a large mean, a decaying spectrum, non-negative-ish."""
    gen = torch.Generator().manual_seed(seed)
    scales = torch.logspace(0.5, -1, D)
    offset = torch.randn(D, generator=gen) * 0.5
    for start in range(0, n, BATCH):
        m = min(BATCH, n - start)
        z = torch.randn(m, D, generator=gen)
        yield (z * scales + offset).contiguous()


def run_floor(batches) -> float:
    gram = torch.zeros(D, D, dtype=torch.float64)
    t0 = time.perf_counter()
    for b in batches:
        gram += torch.matmul(b.T, b).to(torch.float64)
    return time.perf_counter() - t0


def run_saegeo(batches):
    t0 = time.perf_counter()
    acc = GeometryAccumulator(D)
    for b in batches:
        acc.add(b)
    t_acc = time.perf_counter() - t0
    geo = activation_geometry(acc)
    return t_acc, time.perf_counter() - t0, geo


def run_textbook(batches):
    t0 = time.perf_counter()
    x = np.concatenate([b.numpy() for b in batches])
    xc = x - x.mean(axis=0)
    s = np.linalg.svd(xc, full_matrices=False, compute_uv=False)
    eig = s.astype(np.float64) ** 2 / len(x)
    unit_mean = (x / np.linalg.norm(x, axis=1, keepdims=True)).mean(axis=0)
    n = len(x)
    a = (n * float(unit_mean @ unit_mean) - 1) / (n - 1)
    return time.perf_counter() - t0, eig, a


def _peak_rss_mib() -> float:
    """VmHWM: this process's resident high-water mark (unlike ru_maxrss it is not inherited across exec)."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def memory_child(n: int) -> None:
    """Stream n rows from a generator into one accumulator, then report; print peak RSS (MiB) as JSON."""
    base = _peak_rss_mib()
    t0 = time.perf_counter()
    acc = GeometryAccumulator(D)
    for b in make_batches(n, seed=1):
        acc.add(b)
    activation_geometry(acc)
    print(json.dumps({"n": n, "peak_mib": _peak_rss_mib(), "import_mib": base, "seconds": time.perf_counter() - t0}))


def measure_memory(n: int) -> dict:
    out = subprocess.run(
        [sys.executable, __file__, "--memory-child", str(n)], check=True, capture_output=True, text=True
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def entry_histogram_cost(rounds: int) -> None:
    """CPU seconds (one thread) on one BATCH × D float32 chunk, interleaved rounds, best of each: the whole
    ``GeometryAccumulator.add``, the entry histogram (``entry_bin_sums``: count, Σx, Σx² per bin), and the Σx²
    bincount it gained in issue 25 (the same bit keys, float64 weights x², then the key → bin index_add)."""
    from saegeo.geometry.accumulate import N_ENTRY_BINS, entry_bin_sums

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    chunk = next(make_batches(BATCH, seed=2))
    flat = chunk.reshape(-1)
    flat64 = flat.to(torch.float64)
    keys = (flat.view(torch.int32) >> 19) & (2**13 - 1)  # float32: sign | 8 exponent bits | top 4 mantissa bits
    table = torch.randint(N_ENTRY_BINS, (2**13,))  # any key → bin map: the index_add costs the same

    def cpu(fn) -> float:
        t0 = time.process_time()
        fn()
        return time.process_time() - t0

    def sq_bincount() -> None:
        out = torch.zeros(N_ENTRY_BINS, dtype=torch.float64)
        out.index_add_(0, table, torch.bincount(keys, weights=flat64 * flat64, minlength=2**13))

    add, hist, sq = [], [], []
    for _ in range(rounds):
        add.append(cpu(lambda: GeometryAccumulator(D).add(chunk)))
        hist.append(cpu(lambda: entry_bin_sums(flat, flat64)))
        sq.append(cpu(sq_bincount))
    torch.set_num_threads(threads)
    t_add, t_hist, t_sq = min(add), min(hist), min(sq)
    print(
        f"entry histogram, one {BATCH:,} × {D} chunk (CPU s, 1 thread, best of {rounds}): add {t_add:.4f}, "
        f"entry_bin_sums {t_hist:.4f} ({t_hist / t_add:.0%} of add), its Σx² bincount {t_sq:.4f} "
        f"({t_sq / t_add:.1%} of add)"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--full", action="store_true", help="n = 200,000 rows (the issue's size)")
    ap.add_argument(
        "--n", type=int, default=None, help="rows for the timing comparison (default 50,000; --full: 200,000)"
    )
    ap.add_argument("--memory-sizes", default="200000,1000000", help="n values for the memory check")
    ap.add_argument("--skip-textbook", action="store_true")
    ap.add_argument("--rounds", type=int, default=2, help="interleaved timing rounds; the best of each is reported")
    ap.add_argument("--memory-child", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument(
        "--entry-histogram-cost", action="store_true", help="only the cost of the entry histogram's Σx² bincount"
    )
    args = ap.parse_args()
    if args.memory_child is not None:
        memory_child(args.memory_child)
        return
    if args.entry_histogram_cost:
        entry_histogram_cost(max(args.rounds, 5))
        return
    n = args.n or (200_000 if args.full else 50_000)
    print(
        f"geometry benchmark: n = {n:,} × d = {D} float32 rows in {BATCH:,}-row batches, "
        f"torch threads = {torch.get_num_threads()}, best of {args.rounds} interleaved rounds"
    )
    batches = list(make_batches(n))

    # Interleaved rounds, best of each: the machine is shared, and the minimum is the least disturbed run.
    floors, accs, totals = [], [], []
    for _ in range(args.rounds):
        floors.append(run_floor(batches))
        t_acc, t_total, geo = run_saegeo(batches)
        accs.append(t_acc)
        totals.append(t_total)
    t_floor, t_acc, t_total = min(floors), min(accs), min(totals)
    gflops = 2 * n * D * D / 1e9
    print(f"(b) bare float32 gram, float64 sum : {t_floor:7.2f} s  ({gflops / t_floor:5.1f} GFLOP/s)")
    print(
        f"saegeo accumulate                  : {t_acc:7.2f} s  -> {t_floor / t_acc:.0%} of (b)'s throughput (target ≥ 60%)"
    )
    print(f"saegeo accumulate + full report    : {t_total:7.2f} s  -> {t_floor / t_total:.0%} of (b)'s throughput")
    if not args.skip_textbook:
        t_text, eig_text, a_text = run_textbook(batches)
        lam = np.array(geo.eigenvalues)
        rel = np.abs(lam - eig_text).max() / eig_text.max()
        print(
            f"(a) textbook numpy SVD + unit mean : {t_text:7.2f} s  -> saegeo is {t_text / t_total:.1f}× faster (target ≥ 5×)"
        )
        print(f"    agreement: max |Δλ|/λ_max = {rel:.1e}, |ΔA| = {abs(a_text - geo.anisotropy):.1e}")
    del batches
    sizes = [int(s) for s in args.memory_sizes.split(",") if s]
    mems = [measure_memory(s) for s in sizes]
    for m in mems:
        print(
            f"peak RSS streaming n = {m['n']:>9,} from a generator: {m['peak_mib']:7.1f} MiB "
            f"(after imports {m['import_mib']:.1f} MiB; {m['seconds']:.1f} s)"
        )
    if len(mems) >= 2:
        growth = mems[-1]["peak_mib"] - mems[0]["peak_mib"]
        print(
            f"memory growth {mems[0]['n']:,} -> {mems[-1]['n']:,} rows: {growth:+.1f} MiB "
            f"({growth / mems[0]['peak_mib']:+.1%}); one batch is {BATCH * D * 4 / 2**20:.0f} MiB"
        )


if __name__ == "__main__":
    main()
