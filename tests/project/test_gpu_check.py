"""benchmarks/gpu_check.sh --cpu-dry-run: the GPU check's logic on the CPU at its small sizes, so that a device,
when one is lent, runs code that has run (every check passes and the one table is printed)."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_gpu_check_cpu_dry_run(tmp_path):
    env = {**os.environ, "PYTHON": sys.executable, "TMPDIR": str(tmp_path), "TQDM_DISABLE": "1"}
    run = subprocess.run(
        ["bash", str(ROOT / "benchmarks/gpu_check.sh"), "--cpu-dry-run"],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    out = run.stdout
    assert run.returncode == 0, (out[-3000:], run.stderr[-3000:])
    assert "ALL PASS" in out and "| check | result | figure |" in out
    table = [line for line in out.splitlines() if line.startswith("| ") and "PASS" in line]
    names = {line.split("|")[1].strip() for line in table}
    assert {"cache", "train", "archs", "gram share", "throughput", "smollm2", "report", "eval", "torchrun"} <= names
