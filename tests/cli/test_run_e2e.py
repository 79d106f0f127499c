"""End to end: `saegeo run CONFIG.toml` on the bundled MiniLM at a tiny size: cache -> two SAEs -> report;
a rerun reuses the store and the SAEs."""

from __future__ import annotations

import contextlib
import io
import json

import numpy as np
import pytest

from saegeo.cli import main

CONFIG = """
out = "{out}"

[cache]
model = "minilm"
hooks = ["blocks.3.hook_resid_post"]
corpus = "default"
context = 64
max_tokens = 3000
batch_windows = 16
out = "{acts}"

[train]
arch = "topk"
expansion = 2
batch_tokens = 256
total_tokens = 2560
lr = 1e-3
b_dec_init_tokens = 2048
heldout_fraction = 0.1
progress = false

[train.topk]
k = 8

[saes]
"b_dec=mean" = {{ b_dec_init = "mean" }}
"b_dec=0" = {{ b_dec_init = "zeros" }}

[report]
batch_rows = 1024
progress = false
"""


@pytest.fixture(scope="module")
def first_run(tmp_path_factory):
    """The job run once, from nothing, for the whole module: (root, config path, what it printed).
    Each test that needs it gets it, whichever runs first or alone."""
    root = tmp_path_factory.mktemp("run")
    cfg = root / "tiny.toml"
    cfg.write_text(CONFIG.format(out=root / "out", acts=root / "acts"))
    assert not (root / "acts").exists() and not (root / "out").exists()
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = main(["run", str(cfg)])
    assert code == 0, buf.getvalue()[-3000:]
    return root, cfg, buf.getvalue()


def test_saegeo_run_end_to_end(first_run):
    root, cfg, printed = first_run
    assert "reusing" not in printed  # a first run computes everything
    html = root / "out" / "report" / "report.html"
    assert f"HTML report: {html}" in printed
    # the five figures of every report and the SAEs' training curves (each SAE left a training_log.jsonl)
    assert html.is_file() and html.read_text().count("data:image/png;base64,") == 6
    report = json.loads((root / "out" / "report" / "report.json").read_text())
    assert report["source"]["n_tokens"] == 3000 and report["source"]["d"] == 384
    assert report["source"]["hook"] == "blocks.3.hook_resid_post"
    saes = {s["name"]: s for s in report["saes"]}
    assert set(saes) == {"b_dec=mean", "b_dec=0"}
    assert saes["b_dec=mean"]["b_dec_init"] == "mean" and saes["b_dec=0"]["b_dec_init"] == "zeros"
    # the pre-LayerNorm residual has a large mean; the store's rows show it (independent numpy check)
    from safetensors.numpy import load_file

    shard = next((root / "acts" / "blocks.3.hook_resid_post").glob("shard_*.safetensors"))
    rows = load_file(str(shard))["activations"].astype(np.float64)
    mu = rows.mean(0)
    assert np.linalg.norm(mu) / np.linalg.norm(rows, axis=1).mean() > 0.3
    assert report["activations"]["mean_norm_ratio"] == pytest.approx(
        np.linalg.norm(mu) / np.linalg.norm(rows, axis=1).mean(), rel=1e-5
    )
    # b_dec := 0 leaves the offset unabsorbed and the report says so; b_dec := mean does not
    flagged = {(f["name"], f["subject"]) for f in report["flags"]}
    assert ("offset_not_absorbed", "b_dec=0") in flagged
    assert ("offset_not_absorbed", "b_dec=mean") not in flagged
    assert saes["b_dec=mean"]["b_dec_distance_to_mean"] < 0.1 < 0.9 < saes["b_dec=0"]["b_dec_distance_to_mean"]
    # the verdict `check --acts` and `report --sae` give, one line per SAE (sae_verdicts), in the run's report
    for name in saes:
        assert any(n.startswith(f"{name} on these activations: accepted") for n in report["notes"]), report["notes"]
    # the terminal summary was printed, flags first
    assert printed.index("FLAGS") < printed.index("ACTIVATIONS") < printed.index("SAE (side by side)")


def test_saegeo_run_rerun_reuses_store_and_saes(first_run, capsys):
    root, cfg, _ = first_run
    weights = root / "out" / "saes" / "b_dec_mean" / "sae_weights.safetensors"
    shard = next((root / "acts" / "blocks.3.hook_resid_post").glob("shard_*.safetensors"))
    before = (weights.stat().st_mtime_ns, shard.stat().st_mtime_ns)
    assert main(["run", str(cfg)]) == 0
    printed = capsys.readouterr().out
    assert "cache: reusing" in printed and printed.count("reusing") == 3
    assert (weights.stat().st_mtime_ns, shard.stat().st_mtime_ns) == before


def test_saegeo_run_bad_config(tmp_path, capsys):
    bad = tmp_path / "bad.toml"
    bad.write_text('out = "x"\n[trian]\nk = 3\n')
    assert main(["run", str(bad)]) == 2
    assert "unknown key(s) ['trian'] of RunConfig" in capsys.readouterr().err
