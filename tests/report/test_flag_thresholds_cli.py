"""Flag thresholds on the command line (issue 38 item 1): every FlagThresholds field is an option of `check` and
`report` under its own name, and setting one changes a flag's verdict; `report --sae` hands its thresholds to the
verdict `check --acts` gives, so both raise the same flags."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from saegeo.cli import main

D = 16


def _dictionary(tmp_path: Path) -> Path:
    """64 random unit decoder rows; row 5 along b_dec (|cos| ≈ 0.99999: mean-direction from the weights); rows 10
    and 11 equal (a duplicate pair: 2 of 64 latents, above the default duplicate_error_fraction 0.01)."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((64, D))
    w /= np.linalg.norm(w, axis=1, keepdims=True)
    b = 3 * w[5] + 0.01 * rng.standard_normal(D)
    w[11] = w[10]
    weights = {"W_dec": w, "W_enc": w.T.copy(), "b_enc": -0.1 * np.ones(64), "b_dec": b}
    path = tmp_path / "sae"
    path.mkdir()
    save_file(
        {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in weights.items()},
        str(path / "sae_weights.safetensors"),
    )
    cfg = {"architecture": "standard", "d_in": D, "d_sae": 64, "apply_b_dec_to_input": True, "dtype": "float32"}
    (path / "cfg.json").write_text(json.dumps({**cfg, "normalize_activations": "none"}))
    np.save(tmp_path / "acts.npy", (rng.standard_normal((1500, D)) + b).astype(np.float32))
    return path


def _flags(path: Path) -> dict[str, str]:
    return {f["name"]: f["severity"] for f in json.loads(path.read_text())["flags"]}


def test_a_threshold_on_the_command_line_changes_a_verdict(tmp_path, capsys):
    sae = _dictionary(tmp_path)

    def check(tag: str, *extra: str) -> dict[str, str]:
        assert main(["check", str(sae), "--out", str(tmp_path / tag), "--format", "json", "--no-progress", *extra]) == 0
        return _flags(tmp_path / tag / "check.json")

    default = check("default")
    assert default["mean_direction_features"] == "warning" and default["duplicate_decoder_rows"] == "error"
    strict = check("strict", "--dictionary-min-cos", "1.0", "--duplicate-error-fraction", "0.05")
    assert "mean_direction_features" not in strict and strict["duplicate_decoder_rows"] == "warning"
    capsys.readouterr()


def test_report_and_check_take_the_same_thresholds(tmp_path, capsys):
    """--max-latents 1 reaches the dictionary's flags (the duplicate pair lists one latent) and the report's, in
    `check --acts` and in `report --sae` alike."""
    sae, acts = _dictionary(tmp_path), str(tmp_path / "acts.npy")
    common = ["--max-latents", "1", "--no-progress", "--format", "json"]
    assert main(["check", str(sae), "--acts", acts, "--out", str(tmp_path / "c"), *common]) == 0
    assert main(["report", "--acts", acts, "--sae", str(sae), "--out", str(tmp_path / "r"), *common]) == 0
    capsys.readouterr()
    check, report = (json.loads((tmp_path / t / "report.json").read_text())["flags"] for t in ("c", "r"))
    assert [(f["name"], f["severity"], f["latents"]) for f in check] == [
        (f["name"], f["severity"], f["latents"]) for f in report
    ]
    [dup] = [f for f in report if f["name"] == "duplicate_decoder_rows"]
    assert dup["latents"] == [10]
    assert all(len(f["latents"] or []) <= 1 for f in report)


def test_geometry_takes_the_thresholds_of_the_flags_it_raises(tmp_path):
    """`saegeo geometry` raises the activation flags: its thresholds are options too, and one moves a verdict (rows
    shifted by b: the offset-dominated cone at the defaults, z 77; gone once z must be ≥ 1,000)."""
    _dictionary(tmp_path)
    acts = str(tmp_path / "acts.npy")
    assert main(["geometry", acts, "--json", str(tmp_path / "d.json"), "--no-progress"]) == 0
    assert "offset_dominated_cone" in _flags(tmp_path / "d.json")
    argv = ["geometry", acts, "--json", str(tmp_path / "t.json"), "--offset-cone-min-z", "1000", "--no-progress"]
    assert main(argv) == 0
    assert "offset_dominated_cone" not in _flags(tmp_path / "t.json")
