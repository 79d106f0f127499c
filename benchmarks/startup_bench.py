"""Start-up: how long a `saegeo` command takes before it can say anything, beside `python -c "import torch"`.

Each case is a fresh interpreter (the way a user runs the command), repeated; the minimum over the repeats is
reported (the start-up cost itself; load from other processes only adds), with its CPU seconds (user + system
of the child) beside the wall seconds.

  python          `python -c pass`: the interpreter alone
  import torch    `python -c "import torch"`: the floor of any command that computes
  --help          `saegeo --help`
  argument error  `saegeo train --acts x.npy --lr 5` (a value out of its bounds)
  path error      `saegeo geometry missing.npy`
  geometry small  `saegeo geometry small.npy` on 2,000 × 64 float32 rows: the whole command, work included
  hub lookup      `saegeo check RELEASE/sae_id` of a SAELens release not in the Hugging Face cache (offline):
                  the lookup in the registry and the one-line advice to download; with sae_lens installed in
                  this interpreter its own pretrained_saes.yaml is the registry (read without importing sae_lens)

Goals: argument and path errors under 1 s; geometry on a small file under 2 s wall on a quiet machine.

Usage: python benchmarks/startup_bench.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def timed(argv: list[str], cwd: str, env: dict[str, str]) -> tuple[float, float, int, str]:
    """(wall s, CPU s of the child, exit status, last line of its output) of one run."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    run = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    lines = (run.stdout + run.stderr).strip().splitlines()
    return wall, cpu, run.returncode, lines[-1] if lines else ""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--hub-id", default="gpt2-small-res-jb/blocks.8.hook_resid_pre", help="a release not cached")
    args = ap.parse_args()

    py = sys.executable
    saegeo = [py, "-m", "saegeo.cli"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    with tempfile.TemporaryDirectory() as tmp:
        np.save(Path(tmp) / "small.npy", np.random.default_rng(0).standard_normal((2000, 64), dtype=np.float32))
        (Path(tmp) / "x.npy").touch()
        cases = [
            ("python", [py, "-c", "pass"]),
            ("import torch", [py, "-c", "import torch"]),
            ("--help", [*saegeo, "--help"]),
            ("argument error", [*saegeo, "train", "--acts", "x.npy", "--lr", "5"]),
            ("path error", [*saegeo, "geometry", "missing.npy"]),
            ("geometry small", [*saegeo, "geometry", "small.npy", "--no-progress"]),
            ("hub lookup", [*saegeo, "check", args.hub_id]),
        ]
        best: dict[str, tuple[float, float, int, str]] = {}
        for _ in range(args.repeats):  # rounds interleave the cases: load from other processes hits all alike
            for name, argv in cases:
                result = timed(argv, tmp, env)
                if name not in best or result[0] < best[name][0]:
                    best[name] = result

    torch_wall, torch_cpu = best["import torch"][:2]
    print(f"start-up, minimum of {args.repeats} fresh interpreters (wall and CPU seconds)")
    print(f"{'case':<16} {'wall s':>7} {'cpu s':>7} {'wall/torch':>10} {'cpu/torch':>9}  exit  says")
    for name, _ in cases:
        wall, cpu, code, line = best[name]
        print(
            f"{name:<16} {wall:7.2f} {cpu:7.2f} {wall / torch_wall:10.2f} {cpu / torch_cpu:9.2f}  {code:>4}  {line[:60]}"
        )
    print(
        f"argument error {best['argument error'][0]:.2f} s, path error {best['path error'][0]:.2f} s (goal < 1 s); "
        f"geometry small {best['geometry small'][0]:.2f} s (goal < 2 s); import torch {torch_wall:.2f} s "
        f"({torch_cpu:.2f} CPU s)"
    )


if __name__ == "__main__":
    main()
