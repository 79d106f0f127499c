"""The quickstart runs: each script in examples/ is executed as a user would, in a fresh
directory, as a subprocess: (a) my model and my text -> a store -> its geometry; (b) my SAE -> check -> eval."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


def _run(script: str, *args: str, cwd: Path) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / script), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.fixture(scope="module")
def quickstart(tmp_path_factory):
    """Example (a) on a text file of a user's (here: CPython's pydoc topics), MiniLM, 1,024 tokens."""
    from pydoc_data.topics import topics

    cwd = tmp_path_factory.mktemp("quickstart")
    (cwd / "my.txt").write_text("\n\n".join(topics[k] for k in sorted(topics)[:12]))
    printed = _run("model_text_geometry.py", "--text", "my.txt", "--max-tokens", "1024", "--out", "q", cwd=cwd)
    return cwd, printed


def test_example_a_caches_my_text_and_prints_its_geometry(quickstart):
    cwd, printed = quickstart
    from saegeo.activations.store import ActivationStore

    store = ActivationStore(cwd / "q" / "acts" / "blocks.3.hook_resid_post")
    assert (store.n_tokens, store.d) == (1024, 384)
    geometry = json.loads((cwd / "q" / "geometry.json").read_text())
    assert "cached 1,024 new tokens" in printed and "1,024 rows × 384 dims" in printed
    assert f"A = {geometry['anisotropy']:.4f}" in printed  # the printed summary is the written numbers


def test_example_b_checks_and_evaluates_my_sae(quickstart):
    cwd, _ = quickstart
    from saegeo.sae.train import TrainConfig, train_sae

    acts = cwd / "q" / "acts" / "blocks.3.hook_resid_post"
    cfg = TrainConfig(
        expansion=2, arch_options={"topk": {"k": 8}}, batch_tokens=256, total_tokens=2048, b_dec_init_tokens=512, progress=False,
        out_dir=str(cwd / "my_sae"),
    )  # fmt: skip
    train_sae(cfg, acts)  # "my SAE": any directory saegeo reads (SAELens, sparsify, ...) would do
    printed = _run(
        "sae_check_eval.py", "--sae", "my_sae", "--acts", str(acts), "--text", "my.txt",
        "--max-tokens", "1024", "--eval-tokens", "256", "--out", "q", cwd=cwd,
    )  # fmt: skip
    report = json.loads((cwd / "q" / "check" / "report.json").read_text())
    result = json.loads((cwd / "q" / "eval.json").read_text())
    assert report["saes"][0]["name"] == "my_sae" and report["saes"][0]["fve"] is not None
    assert "the same model" in printed  # the store's model is recognised as the SAE's
    assert "saegeo eval: my_sae spliced into" in printed
    assert result["tokens"] == 256 and 0 < result["fve"] <= 1
    assert (cwd / "q" / "check" / "figures" / "training.png").exists()  # the SAE's training log, drawn


def test_the_readme_quickstart_names_both_examples():
    readme = (ROOT / "README.md").read_text()
    quickstart = readme.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    for script in sorted(p.name for p in EXAMPLES.glob("*.py")):
        assert f"examples/{script}" in quickstart
