"""The layer sweep from one cache pass against caching and measuring every layer on its own.

Both sides run the command line a user would type, as subprocesses (process start and model load count):

  sweep      `saegeo sweep --model minilm --hooks all-resid --max-tokens N`: one forward pass caches all
             7 residual hooks (blocks.0.hook_resid_pre + blocks.L.hook_resid_post), then per store the
             geometry, token types, self-similarity, windows and the artifact test (two passes per store)
  per layer  for each of the 7 hooks: `saegeo cache --hooks H --max-tokens N` then `saegeo geometry STORE`
             (the geometry only: the per-layer side does less work per store)

Reports wall and CPU seconds (user + system of the children) side by side, the ratio, the children's peak
RSS, and the accumulator state per layer from the sweep JSON against its bound O(d² + V·d):
GeometryAccumulator ≈ 8·d² bytes, TokenTypeAccumulator ≈ 8·(2d + 3)·T bytes for T ≤ V types seen.

Usage: python benchmarks/sweep_bench.py [--tokens 8192] [--context 128]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

N_LAYERS, D, VOCAB = 6, 384, 30522  # MiniLM


def _run(cmd: list[str]) -> tuple[float, float]:
    """(wall, CPU) seconds of one child process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=8192, help="tokens per layer")
    ap.add_argument("--context", type=int, default=128)
    args = ap.parse_args()
    saegeo = [sys.executable, "-m", "saegeo.cli"]
    tmp = Path(tempfile.mkdtemp(prefix="saegeo-sweep-bench-"))
    env_note = f"torch threads default, {os.cpu_count()} CPUs visible"
    hooks = ["blocks.0.hook_resid_pre"] + [f"blocks.{layer}.hook_resid_post" for layer in range(N_LAYERS)]
    common = ["--max-tokens", str(args.tokens), "--context", str(args.context), "--no-progress"]

    sweep_json = tmp / "sweep.json"
    sweep_wall, sweep_cpu = _run(
        saegeo
        + [
            "sweep",
            "--model",
            "minilm",
            "--hooks",
            "all-resid",
            "--cache-dir",
            str(tmp / "sweep"),
            "--json",
            str(sweep_json),
            *common,
        ]
    )
    base_wall = base_cpu = 0.0
    for hook in hooks:
        w, c = _run(saegeo + ["cache", "--hooks", hook, "--out", str(tmp / "base"), *common])
        w2, c2 = _run(saegeo + ["geometry", str(tmp / "base" / hook), "--no-progress"])
        base_wall, base_cpu = base_wall + w + w2, base_cpu + c + c2
    peak_mib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024

    layers = json.loads(sweep_json.read_text())["layers"]
    print(f"MiniLM, {len(hooks)} residual hooks, {args.tokens:,} tokens per layer, context {args.context} ({env_note})")
    print(f"{'':<34}{'wall s':>9}{'CPU s':>9}")
    print(f"{'saegeo sweep (one cache pass)':<34}{sweep_wall:>9.1f}{sweep_cpu:>9.1f}")
    print(f"{'7 x (saegeo cache + geometry)':<34}{base_wall:>9.1f}{base_cpu:>9.1f}")
    print(
        f"ratio per-layer / sweep: wall {base_wall / sweep_wall:.2f}x, CPU {base_cpu / sweep_cpu:.2f}x (target >= 3x)"
    )
    print(f"peak RSS of any child process: {peak_mib:,.0f} MiB")
    print(
        f"accumulator state per layer (bytes): geometry [bound 8·d² = {8 * D * D:,}], token types [bound 8·(2d+3)·V = {8 * (2 * D + 3) * VOCAB:,}]"
    )
    for r in layers:
        mem = r["details"]["memory_bytes"]
        print(
            f"  {r['hook']:<26} geometry {mem['geometry_accumulator']:>11,}  token types {mem['token_types']:>11,}"
            f"  ({r['n_types']:,} types seen)"
        )


if __name__ == "__main__":
    main()
