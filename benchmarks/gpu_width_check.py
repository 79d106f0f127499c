"""The width-262k check on a GPU (run by benchmarks/gpu_check.sh), one line each: a 262,144 × 2,304 SAELens
dictionary (written as benchmarks/check_bench.py writes it, 4.8 GB) read through its memory map, then
  * dups     the exact duplicate search on the device finds exactly the planted pairs;
  * neigh    nearest neighbours of 1,024 rows on the device equal the CPU's (indices, float64 cosines);
  * exact    every latent's nearest-neighbour cosine on the device (N²·d = 1.6e14 multiply-adds), and the
             CPU's sampled summary (2,048 rows, what `saegeo check` reports on a CPU) holds the exact mean
             within its stated 95 % error and each exact quantile within its DKW interval (a 95 % statement:
             it fails about one run in twenty by design, the line says by how much);
  * check    `check_dictionary` with device cuda and the exact path (nearest_exact_rows = N): time, peak RSS.
--cpu-dry-run: the same logic on the CPU, small (8,192 × 256).
"""

from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from check_bench import planted_pairs, write_saelens  # noqa: E402

from saegeo.geometry.dictionary import (  # noqa: E402
    near_duplicate_pairs,
    nearest_decoder_neighbours,
    nearest_neighbour_summary,
    row_norms,
)
from saegeo.report.dictionary_check import CheckOptions, check_dictionary  # noqa: E402
from saegeo.sae.model import SAE  # noqa: E402


def line(name: str, ok: bool, detail: str) -> bool:
    print(f"{'PASS' if ok else 'FAIL'}  {name:<10} {detail}", flush=True)
    return ok


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cpu-dry-run", action="store_true")
    ap.add_argument("--work", default=None)
    args = ap.parse_args()
    dry = args.cpu_dry_run
    dev = "cpu" if dry else "cuda"
    n, d = (8192, 256) if dry else (262_144, 2304)
    block = 2048 if dry else 16_384  # tiles of block² float32: 1 GiB on the GPU
    work = Path(args.work or tempfile.mkdtemp(prefix="saegeo_gpu_width_"))
    t0 = time.perf_counter()
    write_saelens(work / "sae", n, d, n_dup=8)
    print(f"device {dev}; dictionary {n:,} × {d:,} written in {time.perf_counter() - t0:.1f} s", flush=True)
    sae = SAE.load(work / "sae")
    w = sae.W_dec.detach()
    norms = row_norms(w)
    ok = True

    t0 = time.perf_counter()
    pairs, _, total = near_duplicate_pairs(w, 0.99, norms=norms, block_rows=block, device=dev)
    found = sorted(map(tuple, pairs.tolist()))
    ok &= line(
        "dups",
        found == sorted(planted_pairs(n, 8)) and total == 8,
        f"{total} pairs above 0.99 on {dev} in {time.perf_counter() - t0:.1f} s (8 planted)",
    )

    q = torch.arange(0, n, n // 1024)[:1024]
    idx_dev, cos_dev = nearest_decoder_neighbours(w, 3, block, queries=q, norms=norms, device=dev)
    idx_cpu, cos_cpu = nearest_decoder_neighbours(w, 3, 4096, queries=q, norms=norms)
    diff = float((cos_dev - cos_cpu).abs().max())
    ok &= line(
        "neigh",
        torch.equal(idx_dev, idx_cpu) and diff < 1e-12,
        f"1,024 rows × k 3: indices equal, max |Δcos| {diff:.1e}",
    )

    t0 = time.perf_counter()
    exact = nearest_neighbour_summary(w, norms=norms, exact_max_rows=n, block_rows=block, device=dev)
    exact_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    sampled = nearest_neighbour_summary(w, norms=norms, exact_max_rows=1, sample=2048)
    sampled_s = time.perf_counter() - t0
    err = abs(sampled["mean"] - exact["mean"])
    inside = {
        qk: (lo is None or lo <= exact["quantiles"][qk]) and (hi is None or exact["quantiles"][qk] <= hi)
        for qk, (lo, hi) in sampled["quantile_intervals"].items()
    }
    ok &= line(
        "exact",
        err <= sampled["mean_error_bound"] and all(inside.values()),
        f"exact on {dev} {exact_s:.1f} s: mean {exact['mean']:.5f}, median {exact['quantiles']['0.5']:.5f}, "
        f"max {exact['max']:.5f}; CPU sample of 2,048 in {sampled_s:.1f} s: mean {sampled['mean']:.5f} "
        f"± {sampled['mean_error_bound']:.5f} (|Δ| {err:.5f}), quantiles inside their DKW intervals {inside}",
    )

    t0 = time.perf_counter()
    opts = CheckOptions(progress=False, device=dev, block_rows=block, nearest_exact_rows=n)
    check = check_dictionary(sae, options=opts, name="w262k")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2
    ok &= line(
        "check",
        check.n_duplicate_pairs == 8 and check.nearest_neighbour_cos["method"] == "exact",
        f"check_dictionary on {dev}, exact neighbours: {time.perf_counter() - t0:.1f} s; process peak RSS "
        f"{peak:.2f} GB (W_dec {n * d * 4 / 1e9:.2f} GB)",
    )
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
