"""Verify-on-read benchmark: what checking every shard's sha256 as it is read costs the report.

One run, side by side, on one store (default 131,072 rows × d = 384 float32, 2 shards of 65,536 rows, ~190 MiB):
  verify:     geometry_report(path) with ReportOptions(verify=True) (the default): each shard is read once,
              hashed, then parsed from the same bytes.
  no-verify:  the same report with verify=False (`--no-verify`).
  sha256:     hashing the shard files alone (hashlib), the floor of the extra work.
Each report runs `--repeats` times, alternating, best time kept; wall and CPU seconds are printed, and the
verify cost as a share of the report's time, (verify − no-verify) / verify.

    python benchmarks/verify_bench.py                        # ~1 min
    python benchmarks/verify_bench.py --n 262144 --sae       # with one SAE (d_sae = 4·d) in the pass
"""

from __future__ import annotations

import argparse
import hashlib
import tempfile
import time
from pathlib import Path


def timed(fn):
    w0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    return time.perf_counter() - w0, time.process_time() - c0, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=131_072)
    ap.add_argument("--d", type=int, default=384)
    ap.add_argument("--shard-rows", type=int, default=65_536)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--sae", action="store_true", help="measure one SAE (d_sae = 4·d) in the same pass")
    args = ap.parse_args()

    import torch

    from saegeo.activations.store import write_store
    from saegeo.report import ReportOptions, geometry_report
    from saegeo.sae.model import SAE, SAEConfig

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "store"
        g = torch.Generator().manual_seed(0)
        batches = (torch.randn(8192, args.d, generator=g) + 0.5 for _ in range(args.n // 8192))
        store = write_store(path, batches, shard_rows=args.shard_rows)
        size = sum(s.bytes for s in store.shards)
        sae = None
        if args.sae:
            sae = SAE(SAEConfig(d_in=args.d, d_sae=4 * args.d, activation="topk", k=32))
            sae.init_weights(torch.Generator().manual_seed(0))
        print(
            f"store: {store.n_tokens:,} rows × d={store.d} float32, {len(store.shards)} shards, {size / 2**20:.0f} MiB"
            + (f"; one SAE d_sae={4 * args.d}" if sae is not None else "")
        )

        def report(verify: bool):
            opts = ReportOptions(progress=False, verify=verify)
            return geometry_report(str(path), None if sae is None else {"sae": sae}, options=opts)

        def hash_all():
            for s in store.shards:
                hashlib.sha256((path / s.file).read_bytes()).hexdigest()

        best = {"verify": (float("inf"), 0.0), "no-verify": (float("inf"), 0.0), "sha256": (float("inf"), 0.0)}
        for _ in range(args.repeats):
            for name, fn in (
                ("verify", lambda: report(True)),
                ("no-verify", lambda: report(False)),
                ("sha256", hash_all),
            ):
                wall, cpu, _ = timed(fn)
                if wall < best[name][0]:
                    best[name] = (wall, cpu)
        print(f"{'':<12}{'wall s':>9}{'cpu s':>9}{'MiB/s':>9}")
        for name, (wall, cpu) in best.items():
            print(f"{name:<12}{wall:>9.2f}{cpu:>9.2f}{size / 2**20 / wall:>9.0f}")
        (v, vc), (nv, nvc) = best["verify"], best["no-verify"]
        print(
            f"verify / no-verify: {v / nv:.3f}× wall, {vc / nvc:.3f}× cpu; the check's share of the report's "
            f"time: {(v - nv) / v:.1%} wall, {(vc - nvc) / vc:.1%} cpu (hashing alone: {best['sha256'][0] / v:.1%} "
            "of the verified report's wall time)"
        )


if __name__ == "__main__":
    main()
