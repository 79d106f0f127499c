"""What issue 41's additions cost the report pass: the norm-detector columns and the dark-matter ridge sums.

One process, side by side, rotating the order each repeat (drift under load falls on every mode), best of --repeats:
  base:     geometry_report(store, sae, dark_matter=False) with the latent collector's covariates switched off
            (the report before issue 41: latent cards on, as by default)
  columns:  + each latent's correlation with ‖x‖, position and log token frequency (LatentCovariates; the store's
            positions and token ids read, the ids counted before the pass)
  all:      + the dark-matter sums (per-fold XᵀX, XᵀE: float32 products summed in float64) and the dense-pair
            search (--dark-matter)
The store holds --n rows of d with token ids and positions; the ReLU SAE's biases are set so each latent fires on
--relu-rate of the rows, the TopK SAE keeps k. One torch thread (a shared machine). Printed: the whole call and the
pass alone (report.seconds), CPU s and wall s, and the ratios to base.

    python benchmarks/report_structure_bench.py                 # d 384, d_sae 3,072, n 32,768
    python benchmarks/report_structure_bench.py --d 768 --d-sae 24576
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

MODES = ("base", "columns", "all")


def timed(fn):
    c0, t0 = time.process_time(), time.perf_counter()
    out = fn()
    return out, time.process_time() - c0, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=32_768)
    ap.add_argument("--d", type=int, default=384)
    ap.add_argument("--d-sae", type=int, default=3072)
    ap.add_argument("--k", type=int, default=32, help="TopK's k")
    ap.add_argument("--relu-rate", type=float, default=0.02, help="each ReLU latent fires on this fraction of rows")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--archs", default="topk,relu")
    args = ap.parse_args()
    load0 = os.getloadavg()[0]

    import torch

    torch.set_num_threads(1)
    from saegeo.activations.store import ActivationStore, StoreWriter
    from saegeo.report import ReportOptions, geometry_report
    from saegeo.report.latent_cards import LatentCollector
    from saegeo.sae.model import SAE, SAEConfig

    g = torch.Generator().manual_seed(0)
    tmp = Path(tempfile.mkdtemp(prefix="structure_bench_"))
    offset = 3 * torch.randn(args.d, generator=g)
    with StoreWriter(tmp / "store", d=args.d, hook="blocks.0.hook_resid_post", model="bench", shard_rows=65536) as w:
        for lo in range(0, args.n, 8192):
            m = min(8192, args.n - lo)
            w.append(
                torch.randn(m, args.d, generator=g) + offset,
                token_ids=torch.randint(0, 50_000, (m,), generator=g),
                positions=torch.arange(lo, lo + m) % 128,
            )
    store = ActivationStore(tmp / "store")
    print(f"store: n = {args.n:,}, d = {args.d}; d_sae = {args.d_sae:,}; torch threads {torch.get_num_threads()}")
    # the structure's own CPU inside the "all" pass (its hooks timed): a figure far less noisy on a shared machine
    # than the difference of two whole passes
    from saegeo.geometry.dense import CovariateDirection
    from saegeo.report.structure import PassStructure

    own = {"s": 0.0}

    def timed_hook(fn):
        def wrapper(*a, **k):
            c0 = time.process_time()
            try:
                return fn(*a, **k)
            finally:
                own["s"] += time.process_time() - c0

        return wrapper

    PassStructure.add = timed_hook(PassStructure.add)
    PassStructure.finish = timed_hook(PassStructure.finish)
    CovariateDirection.add = timed_hook(CovariateDirection.add)
    begin_batch = LatentCollector.begin_batch
    rows = []
    for arch in args.archs.split(","):
        cfg = SAEConfig(d_in=args.d, d_sae=args.d_sae, activation=arch, **({"k": args.k} if arch == "topk" else {}))
        sae = SAE(cfg).init_weights(torch.Generator().manual_seed(1), b_dec=offset)
        if arch == "relu":  # a trained SAE's sparsity, not a random one's (half the latents on every token)
            with torch.no_grad():
                pre = sae.pre_activations(store.read_rows(0, 4096))
                sae.b_enc -= torch.quantile(pre, 1 - args.relu_rate, dim=0)
        best: dict[str, list[float]] = {}
        for rep in range(args.repeats):
            for mode in MODES[rep % 3 :] + MODES[: rep % 3]:
                LatentCollector.begin_batch = begin_batch if mode != "base" else (lambda self, covariates: None)
                opts = ReportOptions(progress=False, dark_matter=mode == "all")
                own["s"] = 0.0
                report, cpu, wall = timed(lambda: geometry_report(store, {"s": sae}, options=opts))
                if best.get(mode) is None or cpu < best[mode][0]:
                    best[mode] = [cpu, wall, report.seconds]
                if mode == "all":
                    best["own"] = min(best.get("own", [own["s"]]), [own["s"]])
                print(
                    f"  {arch} {mode}: {cpu:.2f} CPU s, {wall:.2f} s wall (pass {report.seconds:.2f} s)"
                    + (f", the structure's own {own['s']:.2f} CPU s" if mode == "all" else ""),
                    flush=True,
                )
        LatentCollector.begin_batch = begin_batch
        rows.append((arch, best))
    print(f"\nload average at the end: {os.getloadavg()[0]:.1f} (at the start {load0:.1f}) on {os.cpu_count()} cores")
    print(
        "| SAE | base CPU s (wall) | + covariate columns | ratio | + dark matter and dense pairs | ratio to base "
        "| ratio to columns | the structure's own CPU s / columns |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for arch, best in rows:
        b, c, a, o = best["base"], best["columns"], best["all"], best["own"][0]
        print(
            f"| {arch} | {b[0]:.2f} ({b[1]:.1f}) | {c[0]:.2f} ({c[1]:.1f}) | {c[0] / b[0]:.3f} | "
            f"{a[0]:.2f} ({a[1]:.1f}) | {a[0] / b[0]:.3f} | {a[0] / c[0]:.3f} | {o:.2f} / {o / c[0]:.3f} |"
        )


if __name__ == "__main__":
    main()
