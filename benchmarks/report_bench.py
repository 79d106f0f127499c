"""Report benchmark: geometry_report streams a store in bounded memory; a naive in-memory report does not.

One run, side by side, each measurement in a fresh child process (so peak RSS is its own):
  saegeo:  geometry_report(store, sae) — one streaming pass: activation geometry, codes, law, cone shares.
  naive:   the textbook in-memory way — load every row, numpy SVD of the centred matrix + unit-vector mean,
           encode/decode all rows at once, the same code statistics from the dense code matrix.
Both at two store sizes (n1, n2 = 4·n1 by default). Printed: tokens/s and the saegeo/naive ratio, and the
peak RSS growth above each child's own baseline (after imports and SAE load) against the store's size on disk.
Bounded memory means saegeo's growth is ≈ the same at n1 and n2 and far below the store size.

    python benchmarks/report_bench.py                       # d = 256, n = 50k and 200k, d_sae = 1024 (~2–4 min)
    python benchmarks/report_bench.py --n 100000 --d 384    # bigger
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path


def _rss_mb() -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KB on Linux


def child(mode: str, store_path: str, sae_dir: str, batch_size: int) -> dict:
    import numpy as np
    import torch

    from saegeo.activations.store import ActivationStore
    from saegeo.sae.model import SAE

    torch.set_num_threads(max(1, os.cpu_count() or 1))
    store = ActivationStore(store_path)
    sae = SAE.load(sae_dir)
    base = _rss_mb()
    t0 = time.perf_counter()
    if mode == "saegeo":
        from saegeo.report import ReportOptions, geometry_report

        rep = geometry_report(store, {"sae": sae}, options=ReportOptions(batch_rows=batch_size, progress=False))
        check = {"A": rep.activations["anisotropy"], "fve": rep.sae.fve, "K": rep.sae.mean_l0}
    else:
        x = torch.cat([store.read_shard(i) for i in range(len(store.shards))])  # every row in memory
        xn = x.double().numpy()
        mu = xn.mean(0)
        s = np.linalg.svd(xn - mu, full_matrices=False, compute_uv=False)  # textbook spectrum
        unit = xn / np.linalg.norm(xn, axis=1, keepdims=True)
        m_hat = unit.mean(0)
        a = (len(xn) * float(m_hat @ m_hat) - 1) / (len(xn) - 1)
        with torch.no_grad():
            codes = sae.encode(x)  # (n, d_sae) dense, all at once
            recon = sae.decode(codes)
        sse = float((x - recon).double().square().sum())
        fve = 1 - sse / float(((xn - mu) ** 2).sum())
        active = codes > 0
        freq = active.double().mean(0)
        mean_code = codes.double().mean(0)
        y = (recon - sae.b_dec).double()
        yu = y / y.norm(dim=1, keepdim=True).clamp_min(1e-300)
        a_recon = float(yu.mean(0).square().sum())
        check = {
            "A": a,
            "fve": fve,
            "K": float(active.sum(1).double().mean()),
            "_": float(s[0] + freq.sum() + mean_code.sum() + a_recon),
        }
    seconds = time.perf_counter() - t0
    return {
        "mode": mode,
        "n": store.n_tokens,
        "seconds": seconds,
        "tokens_per_s": store.n_tokens / seconds,
        "baseline_mb": base,
        "peak_mb": _peak_mb(),
        "growth_mb": _peak_mb() - base,
        **check,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=50_000, help="smaller store; the larger one has 4× the rows")
    ap.add_argument("--d", type=int, default=256)
    ap.add_argument("--d-sae", type=int, default=1024)
    ap.add_argument("--k", type=int, default=16)
    ap.add_argument("--batch-size", type=int, default=8192)
    ap.add_argument("--workdir", default="artifacts/bench/report")
    ap.add_argument("--child", nargs=3, metavar=("MODE", "STORE", "SAE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(*args.child, args.batch_size)))
        return

    import torch

    from saegeo.pipeline import write_synthetic_store
    from saegeo.sae.model import SAE, SAEConfig
    from saegeo.synthetic import SuperpositionGenerator, preset

    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    sae_dir = work / "sae"
    sae = SAE(SAEConfig(d_in=args.d, d_sae=args.d_sae, activation="topk", k=args.k))
    sae.init_weights(torch.Generator().manual_seed(0))
    sae.save(sae_dir)
    sizes = [args.n, 4 * args.n]
    gen = SuperpositionGenerator(preset("tilted", d=args.d, n_features=4 * args.d, offset=1.0, noise=0.1, seed=0))
    stores = {}
    for n in sizes:
        path = work / f"store_{n}"
        if not (path / "manifest.json").is_file():
            print(f"writing a {n:,} × {args.d} store ...", flush=True)
            write_synthetic_store(gen, path, n, shard_rows=16384)
        stores[n] = path
    rows = []
    for n in sizes:
        store_mb = sum(f.stat().st_size for f in stores[n].glob("shard_*.safetensors")) / 2**20
        for mode in ("saegeo", "naive"):
            out = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--batch-size",
                    str(args.batch_size),
                    "--child",
                    mode,
                    str(stores[n]),
                    str(sae_dir),
                ],
                capture_output=True,
                text=True,
            )
            if out.returncode:
                raise SystemExit(f"{mode} child failed:\n{out.stderr[-3000:]}")
            r = json.loads(out.stdout.strip().splitlines()[-1])
            r["store_mb"] = store_mb
            rows.append(r)
            print(
                f"  {mode:>6}  n={n:>9,}  {r['seconds']:6.1f} s  {r['tokens_per_s']:>9,.0f} tok/s  "
                f"peak RSS growth {r['growth_mb']:7.1f} MB (store {store_mb:.0f} MB)  A={r['A']:.6f} FVE={r['fve']:.6f}",
                flush=True,
            )
    by = {(r["mode"], r["n"]): r for r in rows}
    print()
    print(f"d = {args.d}, d_sae = {args.d_sae} (TopK k = {args.k}), batch {args.batch_size}, {os.cpu_count()} CPU(s)")
    for n in sizes:
        s, nv = by[("saegeo", n)], by[("naive", n)]
        print(
            f"n = {n:>9,}: saegeo / naive throughput = {s['tokens_per_s'] / nv['tokens_per_s']:.2f}×; "
            f"memory growth saegeo {s['growth_mb']:.0f} MB vs naive {nv['growth_mb']:.0f} MB "
            f"(store {s['store_mb']:.0f} MB); |ΔA| = {abs(s['A'] - nv['A']):.1e}, |ΔFVE| = {abs(s['fve'] - nv['fve']):.1e}"
        )
    s1, s2 = by[("saegeo", sizes[0])], by[("saegeo", sizes[1])]
    n1, n2 = by[("naive", sizes[0])], by[("naive", sizes[1])]
    print(
        f"memory growth from n = {sizes[0]:,} to {sizes[1]:,} (4× the rows): saegeo {s2['growth_mb'] - s1['growth_mb']:+.0f} MB, "
        f"naive {n2['growth_mb'] - n1['growth_mb']:+.0f} MB; saegeo's peak growth at {sizes[1]:,} rows is "
        f"{s2['growth_mb'] / s2['store_mb']:.2f}× the store size"
    )


if __name__ == "__main__":
    main()
