"""A fast start: argument and path errors are found before torch or transformer-lens is imported.

One fresh interpreter (a subprocess: this test process has torch loaded already) runs every command's error case
in turn through ``saegeo.cli.main`` and reports, after each, which heavy modules are in ``sys.modules``; the first
case that loads one is named. benchmarks/startup_bench.py times the same paths against `python -c "import torch"`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

HEAVY = ("torch", "transformer_lens", "transformers", "safetensors", "numpy")

# (command line, what the one error line must say): a bad flag or value, or an input that is not there
ERROR_CASES = [
    (["geometry", "missing.npy"], "missing.npy"),
    (["geometry", "x.npy", "--batch-rows", "0"], "batch_rows"),
    (["sweep", "missing_store"], "missing_store"),
    (["cache", "--context", "1"], "context"),
    (["cache", "--no-such-flag"], "no-such-flag"),
    (["synth", "--n", "10", "--out", "OUT", "--d", "0"], "d must be"),
    (["synth", "--n", "10", "--out", "OUT", "--preset", "nope"], "preset"),
    (["check", "sae_dir", "--acts", "missing_store"], "missing_store"),
    (["check", "sae_dir", "--duplicate-cos", "2"], "duplicate_cos"),
    (["report", "--acts", "missing_store", "--out", "OUT"], "missing_store"),
    (["report", "--acts", "x", "--out", "OUT", "--format", "pdf"], "--format"),
    (["compare", "a_dir", "b_dir", "--acts", "missing_store"], "missing_store"),
    (["compare", "a_dir", "b_dir", "--threshold", "2"], "threshold"),
    (["latents", "sae_dir", "--acts", "missing_store", "--out", "OUT"], "missing_store"),
    (["latents", "sae_dir", "--acts", "x", "--out", "OUT", "--by", "nope"], "--by"),
    (["run", "missing.toml"], "missing.toml"),
    (["run", "typo.toml"], "unknown key(s) ['trian']"),
    (["run", "arch.toml"], "arch = 'nope'"),
    (["run", "into_store.toml"], "store"),  # its reports would be written inside its input store
    (["train", "--acts", "missing_store"], "missing_store"),
    (["store", "info", "missing_store"], "no such activation store"),
    (["store", "verify", "missing_store"], "no such activation store"),
    (["train", "--acts", "x.npy", "--lr", "5"], "lr"),
    (["train", "--acts", "x.npy", "--arch", "nope"], "arch = 'nope'"),
    (["eval"], "--sae"),
    (["eval", "--sae", "s", "--max-tokens", "0"], "max_tokens"),
    # an SAE path that is not there and cannot be a hub id, or whose folder is local
    (["check", "./missing_sae"], "missing_sae: does not exist"),
    (["check", "store/typo_sae"], "store/typo_sae: does not exist (store/ does"),
    (["compare", "./a_dir", "./b_dir"], "a_dir: does not exist"),
    (["latents", "./missing_sae", "--acts", "x.npy", "--out", "OUT"], "missing_sae: does not exist"),
    (["report", "--acts", "x.npy", "--out", "OUT", "--sae", "./missing_sae"], "missing_sae: does not exist"),
    (["eval", "--sae", "./missing_sae"], "missing_sae: does not exist"),
]

_PROBE = """
import contextlib, io, json, sys
from saegeo.cli import main
heavy, cases, out = json.loads(sys.argv[1]), json.loads(sys.argv[2]), []
for argv, _ in cases:
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:
            code = exc.code
    out.append({"argv": argv, "code": code, "stderr": err.getvalue(), "loaded": [m for m in heavy if m in sys.modules]})
print(json.dumps(out))
"""


def test_argument_and_path_errors_import_no_torch(tmp_path: Path) -> None:
    (tmp_path / "x.npy").touch()  # an input that is there, for the cases whose error is a value
    (tmp_path / "typo.toml").write_text("[trian]\nlr = 0.001\n")
    (tmp_path / "arch.toml").write_text('[train]\narch = "nope"\n')
    (tmp_path / "store").mkdir()
    (tmp_path / "into_store.toml").write_text('out = "store"\nacts = "store"\n')
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    run = subprocess.run(
        [sys.executable, "-c", _PROBE, json.dumps(HEAVY), json.dumps(ERROR_CASES)],
        cwd=tmp_path,  # every relative input above but x.npy is absent here
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    results = json.loads(run.stdout)
    assert len(results) == len(ERROR_CASES)
    for (argv, says), result in zip(ERROR_CASES, results):
        lines = result["stderr"].strip().splitlines()
        assert result["code"] == 2, (argv, result)
        assert len(lines) == 1 and "error" in lines[0] and says in lines[0], (argv, lines)
        assert result["loaded"] == [], f"saegeo {' '.join(argv)} imported {result['loaded']} before its error"
