"""A dictionary format defined only here, through the public registry: detected, read by `SAE.load`, checked by
`saegeo check` and reported by `saegeo report --sae`, resolved as a hub release, with no change anywhere in saegeo.

The toy layout: a folder holding toy.json ({"width": d_sae, "dim": d_in, "note": ...}) and toy.safetensors
(enc (d_sae, d_in), bias (d_sae), dec (d_sae, d_in)); codes = relu(x @ encᵀ + bias), x̂ = codes @ dec, no decoder
bias. The references below are written out from that formula in numpy, not through saegeo's encode."""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from saegeo.cli import main
from saegeo.sae.architectures import SAEConfig
from saegeo.sae.formats import (
    FormatInfo,
    FormatReader,
    detect_format,
    expected_layouts,
    format_names,
    register_format,
    unregister_format,
)
from saegeo.sae.formats.hub import conversions, release_entry, saegeo_releases
from saegeo.sae.formats.reader_checks import check_config, make_dictionary, schema_types
from saegeo.sae.formats.weight_files import read_json, read_safetensors
from saegeo.sae.model import SAE

D_IN, D_SAE = 6, 10


@dataclass
class ToyFacts:
    toy_note: str | None = None


@functools.cache
def toy_schema() -> type:
    T = schema_types()

    class ToyConfig(T.Config):
        width: T.Count
        dim: T.Count
        note: T.Text = None

    return ToyConfig


def read_toy(path) -> object:
    d = Path(path)
    d = d.parent if d.is_file() else d
    raw = read_json(d / "toy.json")
    check_config(d / "toy.json", raw, toy_schema())
    w = read_safetensors(d / "toy.safetensors")
    cfg = SAEConfig(d_in=raw["dim"], d_sae=raw["width"], activation="relu", apply_b_dec_to_input=False)
    info = FormatInfo(format="toy", source=str(d), facts=ToyFacts(toy_note=raw.get("note")))
    tensors = {"W_enc": w["enc"].T, "b_enc": w["bias"], "W_dec": w["dec"], "b_dec": torch.zeros(raw["dim"])}
    return make_dictionary(cfg, tensors, d / "toy.safetensors", info)


@pytest.fixture
def toy_format():
    reader = register_format(
        FormatReader(
            name="toy",
            read=read_toy,
            layout="toy: toy.json + toy.safetensors",
            files=("toy.json", "toy.safetensors"),
            facts=ToyFacts,
            conversions=("toy_conversion",),
            releases=lambda: {"toy-release": release_entry("someone/toy-saes", "toy-model", "toy_conversion")},
        )
    )
    yield reader
    unregister_format("toy")


def _weights(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    dec = rng.standard_normal((D_SAE, D_IN))
    dec /= np.linalg.norm(dec, axis=1, keepdims=True)
    return {"enc": 0.8 * dec + 0.1 * rng.standard_normal((D_SAE, D_IN)), "bias": -0.05 * np.ones(D_SAE), "dec": dec}


def _write_toy(folder: Path, weights: dict[str, np.ndarray], cfg: dict | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    config = {"width": D_SAE, "dim": D_IN, "note": "made in a test"} if cfg is None else cfg
    (folder / "toy.json").write_text(json.dumps(config))
    save_file({k: torch.tensor(v, dtype=torch.float32) for k, v in weights.items()}, folder / "toy.safetensors")
    return folder


def test_the_registry_finds_the_toy_format_and_sae_load_reads_it(toy_format, tmp_path):
    assert "toy" in format_names() and "toy: toy.json + toy.safetensors" in expected_layouts()
    weights = _weights()
    folder = _write_toy(tmp_path / "toy_sae", weights)
    assert detect_format(folder) == "toy" and detect_format(folder / "toy.json") == "toy"
    sae = SAE.load(folder)
    assert sae.format_info.format == "toy" and sae.format_info.toy_note == "made in a test"
    assert sae.format_info.to_dict()["toy_note"] == "made in a test"
    x = np.random.default_rng(1).standard_normal((7, D_IN))
    w = {k: v.astype(np.float32).astype(np.float64) for k, v in weights.items()}
    codes = np.maximum(x @ w["enc"].T + w["bias"], 0.0)
    got = sae.encode(torch.tensor(x, dtype=torch.float32)).detach().double().numpy()
    np.testing.assert_allclose(got, codes, atol=1e-5)
    np.testing.assert_allclose(
        sae.decode(torch.tensor(codes, dtype=torch.float32)).detach().double().numpy(), codes @ w["dec"], atol=1e-5
    )


def test_saegeo_check_reads_the_toy_format(toy_format, tmp_path):
    weights = _weights()
    weights["dec"][3] = weights["dec"][7]  # a duplicate decoder row, which check flags
    folder = _write_toy(tmp_path / "toy_sae", weights)
    out = tmp_path / "check"
    assert main(["check", str(folder), "--out", str(out), "--no-progress"]) == 0
    result = json.loads((out / "check.json").read_text())
    assert result["source"]["format"] == "toy" and result["config"]["toy_note"] == "made in a test"
    flagged = {f["name"]: f for f in result["flags"]}
    assert sorted(flagged["duplicate_decoder_rows"]["latents"]) == [3, 7]


def test_saegeo_report_sae_reads_the_toy_format(toy_format, tmp_path):
    folder = _write_toy(tmp_path / "toy_sae", _weights())
    rows = np.random.default_rng(2).standard_normal((400, D_IN)).astype(np.float32)
    np.save(tmp_path / "acts.npy", rows)
    out = tmp_path / "report"
    rc = main(
        ["report", "--acts", str(tmp_path / "acts.npy"), "--sae", f"toy={folder}", "--out", str(out), "--no-progress"]
    )
    assert rc == 0
    report = json.loads((out / "report.json").read_text())
    (sae,) = report["saes"]
    w = {k: v.astype(np.float32).astype(np.float64) for k, v in _weights().items()}
    codes = np.maximum(rows.astype(np.float64) @ w["enc"].T + w["bias"], 0.0)
    assert sae["name"] == "toy" and sae["d_sae"] == D_SAE
    x = rows.astype(np.float64)
    fve = 1 - ((x - codes @ w["dec"]) ** 2).sum() / ((x - x.mean(0)) ** 2).sum()
    assert sae["mean_l0"] == pytest.approx(float((codes > 0).sum(1).mean()), rel=1e-6)
    assert sae["fve"] == pytest.approx(fve, rel=1e-4)


def test_a_malformed_toy_config_is_one_line_naming_the_file_and_field(toy_format, tmp_path, capsys):
    folder = _write_toy(tmp_path / "toy_sae", _weights(), {"width": "ten", "dim": D_IN})
    assert main(["check", str(folder), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"saegeo: error: {folder / 'toy.json'}: width must be an integer, found 'ten'"]


def test_the_toy_release_resolves_through_the_hub_cache(toy_format, tmp_path, monkeypatch):
    """The module's hub conversion and release: RELEASE/sae_id is its folder in the repo, read by the toy reader."""
    assert conversions()["toy_conversion"] == ("toy", ("toy.json", "toy.safetensors"))
    assert "toy-release" in saegeo_releases()
    cache = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    rev = "0123456789abcdef0123456789abcdef01234567"
    root = cache / "models--someone--toy-saes"
    _write_toy(root / "snapshots" / rev / "layer_2", _weights())
    (root / "refs").mkdir(parents=True)
    (root / "refs" / "main").write_text(rev)
    sae = SAE.load("toy-release/layer_2")
    assert sae.format_info.format == "toy" and sae.format_info.release["repo_id"] == "someone/toy-saes"
    assert sae.format_info.model_name == "toy-model"


def test_unregistered_the_toy_folder_is_no_dictionary(tmp_path):
    folder = _write_toy(tmp_path / "toy_sae", _weights())
    assert "toy" not in format_names()
    with pytest.raises(Exception, match="matches no dictionary layout"):
        detect_format(folder)
