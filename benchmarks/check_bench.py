"""`saegeo check` on a Gemma-Scope-sized dictionary (65,536 × 2,304, synthetic weights, params.npz) against a
naive dense all-pairs cosine computation, in one run; prints time and peak-memory ratios.

Each side runs in its own child process so its peak RSS (ru_maxrss) is its own:
  * saegeo: `saegeo check DIR --out ...` end to end (load the npz, every dictionary check, write the renderings).
    Also the blockwise near-duplicate search alone, on the full dictionary.
  * naive: U = W/‖W‖ row-wise, G = U Uᵀ, pairs = nonzero(triu(G, 1) > 0.99). At full size G alone is
    65,536² float32 = 17.2 GB, more than this machine can spare; it is measured on the first n_sub rows
    (default 16,384: G = 1.07 GB) and extrapolated as (N/n_sub)² for time and N²·4 bytes for G's memory.
    The blockwise search is timed on the same n_sub rows too, so one ratio is measured, not extrapolated.

    python benchmarks/check_bench.py [--n 65536] [--d 2304] [--n-sub 16384] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

CHILD = r"""
import json, resource, sys, time
import torch
torch.set_num_threads(int(sys.argv[2]))
mode, args = sys.argv[1], json.loads(sys.argv[3])
t0 = time.perf_counter()
out = {}
if mode == "check":
    from saegeo.cli import main
    rc = main(["check", args["path"], "--out", args["out"], "--no-progress"])
    out["rc"] = rc
    out["flags"] = [f["name"] for f in json.load(open(args["out"] + "/check.json"))["flags"]]
    out["n_pairs"] = json.load(open(args["out"] + "/check.json"))["n_duplicate_pairs"]
elif mode in ("blockwise", "naive"):
    import numpy as np
    with np.load(args["path"]) as z:
        w = torch.from_numpy(np.ascontiguousarray(z["W_dec"][: args["rows"]]))
    t0 = time.perf_counter()  # time the search, not the file read
    if mode == "blockwise":
        from saegeo.geometry.dictionary import near_duplicate_pairs
        pairs, cos, total = near_duplicate_pairs(w, 0.99)
        out["n_pairs"] = total
    else:
        u = w / w.norm(dim=1, keepdim=True)
        g = u @ u.T
        pairs = (torch.triu(g, diagonal=1) > 0.99).nonzero()
        out["n_pairs"] = int(pairs.shape[0])
out["seconds"] = time.perf_counter() - t0
out["peak_rss_gb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2
print("RESULT " + json.dumps(out))
"""


def run_child(mode: str, threads: int, **kw) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, mode, str(threads), json.dumps(kw)], capture_output=True, text=True
    )
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode not in (0, 1) or not line:
        raise SystemExit(f"{mode} child failed (rc {proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    return json.loads(line[0][7:])


def make_dictionary(path: Path, n: int, d: int, n_dup: int, seed: int) -> None:
    """Gemma-Scope-like params.npz: random decoder rows of norm 0.5–1.5, a tied noisy encoder, JumpReLU
    thresholds, and n_dup planted near-duplicate pairs (cos ≈ 0.995)."""
    rng = np.random.default_rng(seed)
    w_dec = rng.standard_normal((n, d), dtype=np.float32)
    w_dec /= np.linalg.norm(w_dec, axis=1, keepdims=True)
    for k in range(n_dup):
        i, j = k * 997 % n, (k * 997 + n // 2) % n
        noise = rng.standard_normal(d).astype(np.float32)
        w_dec[j] = w_dec[i] + 0.1 * noise / np.linalg.norm(noise)
    w_dec *= rng.uniform(0.5, 1.5, size=(n, 1)).astype(np.float32)
    w_enc = np.ascontiguousarray(w_dec.T) + np.float32(0.01) * rng.standard_normal((d, n), dtype=np.float32)
    np.savez(
        path,
        W_enc=w_enc,
        W_dec=w_dec,
        b_enc=np.zeros(n, np.float32),
        b_dec=rng.standard_normal(d).astype(np.float32),
        threshold=np.full(n, 0.05, np.float32),
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=65536)
    ap.add_argument("--d", type=int, default=2304)
    ap.add_argument("--n-sub", type=int, default=16384)
    ap.add_argument("--n-dup", type=int, default=8)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--workdir", default=None)
    a = ap.parse_args()

    work = Path(a.workdir or tempfile.mkdtemp(prefix="saegeo_check_bench_"))
    folder = work / "layer_12" / f"width_{a.n // 1024}k" / "average_l0_82"
    folder.mkdir(parents=True, exist_ok=True)
    npz = folder / "params.npz"
    t = time.perf_counter()
    if not npz.exists():
        make_dictionary(npz, a.n, a.d, a.n_dup, seed=0)
    print(
        f"dictionary: {a.n:,} × {a.d:,} float32 (W_dec {a.n * a.d * 4 / 1e9:.2f} GB, W_enc the same), "
        f"{a.n_dup} planted duplicate pairs; written in {time.perf_counter() - t:.1f} s to {npz}"
    )
    print(f"threads: {a.threads}")

    check = run_child("check", a.threads, path=str(folder), out=str(work / "out"))
    block_full = run_child("blockwise", a.threads, path=str(npz), rows=a.n)
    block_sub = run_child("blockwise", a.threads, path=str(npz), rows=a.n_sub)
    naive_sub = run_child("naive", a.threads, path=str(npz), rows=a.n_sub)

    scale = (a.n / a.n_sub) ** 2
    naive_full_s = naive_sub["seconds"] * scale
    naive_gram_gb = a.n**2 * 4 / 1e9
    print()
    print(f"{'':38}{'time (s)':>12}{'peak RSS (GB)':>16}{'pairs':>8}")
    print(
        f"{'saegeo check (whole command)':38}{check['seconds']:12.1f}{check['peak_rss_gb']:16.2f}{check['n_pairs']:8d}"
    )
    print(
        f"{'blockwise duplicate search, N rows':38}{block_full['seconds']:12.1f}{block_full['peak_rss_gb']:16.2f}{block_full['n_pairs']:8d}"
    )
    print(
        f"{'blockwise, first n_sub rows':38}{block_sub['seconds']:12.1f}{block_sub['peak_rss_gb']:16.2f}{block_sub['n_pairs']:8d}"
    )
    print(
        f"{'naive dense U·Uᵀ, first n_sub rows':38}{naive_sub['seconds']:12.1f}{naive_sub['peak_rss_gb']:16.2f}{naive_sub['n_pairs']:8d}"
    )
    print(
        f"{'naive dense, N rows (extrapolated)':38}{naive_full_s:12.1f}{'≥ ' + format(naive_gram_gb, '.1f'):>16}{'':>8}"
    )
    print()
    print("ratios (naive / saegeo; > 1 means saegeo is better):")
    print(
        f"  measured, n_sub = {a.n_sub:,}: duplicate search time {naive_sub['seconds'] / block_sub['seconds']:.2f}×, "
        f"peak RSS {naive_sub['peak_rss_gb'] / block_sub['peak_rss_gb']:.2f}×"
    )
    print(
        f"  extrapolated, N = {a.n:,}: naive all-pairs {naive_full_s:.0f} s (×{scale:.0f} of the n_sub run) vs "
        f"the blockwise search {block_full['seconds']:.0f} s = {naive_full_s / block_full['seconds']:.2f}×, and vs the "
        f"whole `saegeo check` {check['seconds']:.0f} s = {naive_full_s / check['seconds']:.2f}×"
    )
    print(
        f"  memory at N: the naive gram alone needs {naive_gram_gb:.1f} GB (N² float32, not run); saegeo check peaked at "
        f"{check['peak_rss_gb']:.2f} GB for a dictionary whose two matrices take {2 * a.n * a.d * 4 / 1e9:.2f} GB"
    )
    print(f"flags raised by saegeo check: {check['flags']}")
    if check["n_pairs"] != a.n_dup:
        print(f"WARNING: expected {a.n_dup} duplicate pairs, check found {check['n_pairs']}")
    print(f"(outputs in {work / 'out'})")


if __name__ == "__main__":
    main()
