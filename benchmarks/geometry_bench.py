"""Geometry core benchmark: saegeo's streaming report against the textbook approach and the gram's floor.

Same float32 rows (n × 768, in 8,192-row batches), one run, side by side:
  (a) textbook: numpy SVD of the full centred matrix + the unit-vector mean (holds all rows);
  (b) floor:    bare torch.matmul of each batch's gram (float32) accumulated in float64 — nothing else;
  saegeo:       GeometryAccumulator.add over the batches (each part of it timed: its share is printed), then
                activation_geometry (the read-out), and geometry_report on the same batches (activations only:
                the accumulator, the cosine reservoir, the sample diagnostics, flags).
The floor, saegeo and the textbook run interleaved in one process, --rounds times; medians of CPU seconds
(time.process_time, both threads) and of wall seconds are printed, the ratios in CPU seconds (the machine may be
shared). torch runs as the saegeo command runs it, OMP_WAIT_POLICY=PASSIVE (idle OpenMP workers sleep), unless
the caller set a policy or passed --spinning-workers (torch's default: they spin a while after each parallel
region, which shows in CPU seconds).
Then peak memory (VmHWM of a fresh child process) of saegeo streaming n rows from a generator at two n.

    python benchmarks/geometry_bench.py            # n = 50,000 and memory at 200k / 1M  (≈ 2–3 min on 2 cores)
    python benchmarks/geometry_bench.py --full     # n = 200,000 as in the issue (the textbook SVD dominates)
    python benchmarks/geometry_bench.py --eigen-widths 768,2304,4096   # the read-out's eigh at wider models
Targets: accumulation ≥ 60 % of (b)'s throughput, the full report ≥ 50 %, ≥ 5× faster than (a);
memory growth from 200k to 1M ≈ 0.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from collections import defaultdict

from saegeo.runtime import quiet_openmp_workers

# As the saegeo command runs torch: OpenMP's idle workers sleep instead of spinning, unless the caller set a policy
# or passed --spinning-workers (torch's own default: libgomp's workers spin a while after each parallel region).
# It must be decided before torch loads libgomp, so before the arguments are parsed.
if "--spinning-workers" not in sys.argv:
    quiet_openmp_workers()

import numpy as np  # noqa: E402
import torch  # noqa: E402

from saegeo.geometry.accumulate import GeometryAccumulator  # noqa: E402
from saegeo.geometry.measures import activation_geometry  # noqa: E402
from saegeo.report.geometry_report import ReportOptions, geometry_report  # noqa: E402

D = 768
BATCH = 8192
# the accumulator's parts, timed by wrapping its methods and the module's fused pass (what is left of _add_chunk:
# the non-finite screen, the norms)
PARTS = ("chunk_sums", "_add_centred_gram", "_add_row_sums", "_add_histograms", "_add_sample")


def make_batches(n: int, seed: int = 0):
    """Yield float32 batches with a realistic shape: a large mean, a decaying spectrum, non-negative-ish."""
    gen = torch.Generator().manual_seed(seed)
    scales = torch.logspace(0.5, -1, D)
    offset = torch.randn(D, generator=gen) * 0.5
    for start in range(0, n, BATCH):
        m = min(BATCH, n - start)
        z = torch.randn(m, D, generator=gen)
        yield (z * scales + offset).contiguous()


class Clock:
    """(CPU seconds, wall seconds) of a block."""

    def __enter__(self):
        self.cpu0, self.wall0 = time.process_time(), time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.cpu, self.wall = time.process_time() - self.cpu0, time.perf_counter() - self.wall0


def run_floor(batches) -> Clock:
    gram = torch.zeros(D, D, dtype=torch.float64)
    with Clock() as c:
        for b in batches:
            gram += torch.matmul(b.T, b).to(torch.float64)
    return c


def timed_parts(shares: dict[str, float]):
    """Wrap the accumulator's part methods so that their CPU seconds add up in ``shares``; returns an undo."""
    from saegeo.geometry import accumulate

    owner = {name: accumulate if hasattr(accumulate, name) else GeometryAccumulator for name in PARTS + ("_add_chunk",)}
    originals = {name: getattr(owner[name], name) for name in owner if hasattr(owner[name], name)}

    def wrap(name, fn):
        def timed(*args, **kwargs):
            t0 = time.process_time()
            try:
                return fn(*args, **kwargs)
            finally:
                shares[name] += time.process_time() - t0

        return timed

    for name, fn in originals.items():
        setattr(owner[name], name, wrap(name, fn))
    return lambda: [setattr(owner[k], k, v) for k, v in originals.items()]


def run_saegeo(batches, shares: dict[str, float] | None = None):
    undo = timed_parts(shares) if shares is not None else None
    try:
        with Clock() as c_acc:
            acc = GeometryAccumulator(D)
            for b in batches:
                acc.add(b)
    finally:
        if undo:
            undo()
    with Clock() as c_read:
        geo = activation_geometry(acc)
    return c_acc, c_read, geo


def run_report(batches) -> Clock:
    with Clock() as c:
        geometry_report(iter(batches), options=ReportOptions(progress=False, artifact_components=0))
    return c


def run_textbook(batches):
    x = np.concatenate([b.numpy() for b in batches])
    xc = x - x.mean(axis=0)
    s = np.linalg.svd(xc, full_matrices=False, compute_uv=False)
    eig = s.astype(np.float64) ** 2 / len(x)
    unit_mean = (x / np.linalg.norm(x, axis=1, keepdims=True)).mean(axis=0)
    n = len(x)
    a = (n * float(unit_mean @ unit_mean) - 1) / (n - 1)
    return eig, a


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
    bincount it gained with Σx² per bin (the same bit keys, float64 weights x², then the key → bin index_add)."""
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


def eigen_cost(widths: list[int], rounds: int) -> None:
    """The read-out's eigendecomposition at widths of published models: the whole eigh (every eigenvector, what the
    report took before) against every eigenvalue + the top 10 eigenvectors through the tridiagonal form (what
    ``activation_geometry`` takes now), CPU seconds on one thread, best of ``rounds``, with their agreement."""
    from saegeo.geometry.measures import symmetric_eigh

    for d in widths:
        rng = np.random.default_rng(d)
        a = rng.standard_normal((d + 64, d)) * np.logspace(0.5, -1, d)  # a decaying spectrum, as activations have
        matrix = torch.from_numpy(a.T @ a / (d + 64))
        full, top = [], []
        for _ in range(rounds):
            with Clock() as c:
                lam_full, vec_full = symmetric_eigh(matrix)
            full.append(c.cpu)
            with Clock() as c:
                lam_top, vec_top = symmetric_eigh(matrix, top_vectors=10)
            top.append(c.cpu)
        overlap = (vec_full[:, -10:] * vec_top).sum(0).abs()
        print(
            f"d = {d:>5,}: whole eigh {min(full):7.3f} CPU s, eigenvalues + top 10 vectors {min(top):7.3f} CPU s "
            f"-> {min(full) / min(top):.1f}× (max |Δλ|/λ_max {float((lam_full - lam_top).abs().max() / lam_full[-1]):.0e}, "
            f"min |cos| of the 10 vectors {float(overlap.min()):.12f})"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--full", action="store_true", help="n = 200,000 rows (the issue's size)")
    ap.add_argument(
        "--n", type=int, default=None, help="rows for the timing comparison (default 50,000; --full: 200,000)"
    )
    ap.add_argument("--memory-sizes", default="200000,1000000", help="n values for the memory check")
    ap.add_argument("--skip-textbook", action="store_true")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved timing rounds; medians are reported")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's, 2 on this machine)")
    ap.add_argument(
        "--spinning-workers",
        action="store_true",
        help="leave OMP_WAIT_POLICY unset (torch's default) instead of PASSIVE (the saegeo command's)",
    )
    ap.add_argument("--memory-child", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument(
        "--entry-histogram-cost", action="store_true", help="only the cost of the entry histogram's Σx² bincount"
    )
    ap.add_argument(
        "--eigen-widths",
        default=None,
        help="only the read-out's eigendecomposition at these d (comma-separated, e.g. 768,2304,4096)",
    )
    args = ap.parse_args()
    if args.eigen_widths:
        eigen_cost([int(w) for w in args.eigen_widths.split(",")], max(args.rounds, 1))
        return
    if args.memory_child is not None:
        memory_child(args.memory_child)
        return
    if args.entry_histogram_cost:
        entry_histogram_cost(max(args.rounds, 5))
        return
    if args.threads:
        torch.set_num_threads(args.threads)
        try:  # numpy's BLAS too (the textbook SVD), so both sides run on the same number of threads
            from threadpoolctl import threadpool_limits

            threadpool_limits(args.threads)
        except ImportError:
            pass
    n = args.n or (200_000 if args.full else 50_000)
    load = os.getloadavg()
    print(
        f"geometry benchmark: n = {n:,} × d = {D} float32 rows in {BATCH:,}-row batches, "
        f"torch threads = {torch.get_num_threads()}, OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', 'unset')}, "
        f"median of {args.rounds} interleaved rounds; "
        f"load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}"
    )
    batches = list(make_batches(n))

    # Interleaved rounds: the machine may be shared; CPU seconds and medians are the least disturbed measures.
    rows = defaultdict(list)
    shares: dict[str, float] = defaultdict(float)
    for i in range(args.rounds):
        rows["floor"].append(run_floor(batches))
        c_acc, c_read, geo = run_saegeo(batches, shares if i == args.rounds - 1 else None)
        rows["acc"].append(c_acc)
        rows["read"].append(c_read)
        rows["report"].append(run_report(batches))
        if not args.skip_textbook:
            with Clock() as c_text:
                eig_text, a_text = run_textbook(batches)
            rows["textbook"].append(c_text)
    med = {k: (statistics.median(c.cpu for c in v), statistics.median(c.wall for c in v)) for k, v in rows.items()}
    floor_cpu, floor_wall = med["floor"]
    gflops = 2 * n * D * D / 1e9
    print(f"{'':36s}  CPU s   wall s")
    print(
        f"(b) bare float32 gram, float64 sum : {floor_cpu:6.2f}  {floor_wall:6.2f}  ({gflops / floor_cpu:5.1f} GFLOP/CPU-s)"
    )
    acc_cpu, acc_wall = med["acc"]
    total_cpu, total_wall = acc_cpu + med["read"][0], acc_wall + med["read"][1]
    print(
        f"saegeo accumulate                  : {acc_cpu:6.2f}  {acc_wall:6.2f}  -> {floor_cpu / acc_cpu:.0%} of (b)'s "
        f"throughput in CPU s ({floor_wall / acc_wall:.0%} wall; target ≥ 60%)"
    )
    print(
        f"saegeo accumulate + read-out       : {total_cpu:6.2f}  {total_wall:6.2f}  -> {floor_cpu / total_cpu:.0%} "
        f"({floor_wall / total_wall:.0%} wall)"
    )
    rep_cpu, rep_wall = med["report"]
    print(
        f"geometry_report (activations only) : {rep_cpu:6.2f}  {rep_wall:6.2f}  -> {floor_cpu / rep_cpu:.0%} "
        f"({floor_wall / rep_wall:.0%} wall; target ≥ 50%)"
    )
    total_parts = shares.pop("_add_chunk")
    print(f"shares of the accumulation's CPU time (last round, {total_parts:.2f} CPU s in its chunks):")
    labels = {
        "chunk_sums": "fused pass: float64 sums, entry keys, x − c",
        "_add_centred_gram": "centred float32 gram + Chan update",
        "_add_row_sums": "row power sums, Σx̂ (from the fused sums)",
        "_add_histograms": "entry bins, row-norm histogram, sign sums",
        "_add_sample": "seeded row sample (bottom-k)",
    }
    for name in [p for p in PARTS if p in shares]:
        print(f"    {labels[name]:<42s} {shares[name] / total_parts:6.1%}  ({shares[name]:.2f} s)")
    rest = total_parts - sum(shares.values())
    print(f"    {'norms, screen (the rest)':<42s} {rest / total_parts:6.1%}  ({rest:.2f} s)")
    if not args.skip_textbook:
        text_cpu, text_wall = med["textbook"]
        lam = np.array(geo.eigenvalues)
        rel = np.abs(lam - eig_text).max() / eig_text.max()
        print(
            f"(a) textbook numpy SVD + unit mean : {text_cpu:6.2f}  {text_wall:6.2f}  -> the report is "
            f"{text_cpu / rep_cpu:.1f}× faster in CPU s ({text_wall / rep_wall:.1f}× wall; target ≥ 5×)"
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
