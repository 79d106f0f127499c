"""Model identity by what the model is: a store cached from a model directory under one name and an SAE trained on
a store of the same model under another name belong together (the false `activations_mismatch: model` of a
converted SmolLM2 directory against `--model smollm2`), a model of the same width with other weights is refused
even under the same name, and `--assume-same-model` overrides and says so.

A tiny random Llama directory (2 layers, d 16, MiniLM's tokenizer) stands in for SmolLM2: loaded by path it goes
through the same loader as the converted SmolLM2 directory."""

import json
import shutil

import pytest
import torch

from saegeo.activations.cache import CacheConfig, cache_activations
from saegeo.activations.models import _load_tokenizer, _quiet_transformers, load_model, minilm_path
from saegeo.activations.store import ActivationStore
from saegeo.report.dictionary_check import ACTIVATIONS_MISMATCH, MatchOptions, activations_match_flags
from saegeo.sae.model import SAE
from saegeo.sae.train import TrainConfig, train_sae

try:
    from saegeo.activations.models import model_fingerprint
except ImportError:  # the tree before fingerprints: the refusal tests still run
    model_fingerprint = None

HOOK = "blocks.0.hook_resid_post"


def tiny_llama(path, seed):
    from transformers import LlamaConfig, LlamaForCausalLM

    _quiet_transformers()
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=30522,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=64,
    )
    LlamaForCausalLM(cfg).save_pretrained(path)
    _load_tokenizer(minilm_path()).save_pretrained(path)
    return path


def cache(model, out):
    cache_activations(
        CacheConfig(
            model=str(model),
            hooks=(HOOK,),
            context=32,
            max_tokens=3000,
            out=str(out),
            exclude_special=True,
            progress=False,
        )
    )
    return out / HOOK


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("identity")
    model = tiny_llama(root / "SmolLM2-135M-Instruct", seed=0)
    converted = root / "cache" / "smollm2-b179e5d0a1"  # the same files under the name the user cache gives them
    shutil.copytree(model, converted)
    other = tiny_llama(root / "other" / "SmolLM2-135M-Instruct", seed=1)  # same width and name, other weights
    stores = {
        "sae": cache(model, root / "acts_sae"),
        "converted": cache(converted, root / "acts_converted"),
        "other": cache(other, root / "acts_other"),
    }
    train_sae(
        TrainConfig(
            arch="topk",
            d_sae=32,
            arch_options={"topk": {"k": 4}},
            batch_tokens=256,
            total_tokens=2048,
            out_dir=str(root / "sae"),
            progress=False,
            dead_window_tokens=1024,
        ),
        ActivationStore(stores["sae"]),
    )
    return root, stores, SAE.load(root / "sae")


def test_fingerprint_is_what_the_model_is(setup):
    root, stores, sae = setup
    a = load_model(str(root / "SmolLM2-135M-Instruct"))
    b = load_model(str(root / "cache" / "smollm2-b179e5d0a1"))
    c = load_model(str(root / "other" / "SmolLM2-135M-Instruct"))
    assert a.name != b.name and model_fingerprint(a, 0) == model_fingerprint(b, 0)
    assert model_fingerprint(a, 0)["weights_sha256"] != model_fingerprint(c, 0)["weights_sha256"]
    assert model_fingerprint(a, 0)["architecture"] == model_fingerprint(c, 0)["architecture"]
    # the hook at block 0 depends on the embeddings and block 0 only: changing block 1 leaves it alone
    with torch.no_grad():
        a.model.blocks[1].mlp.W_in.add_(1.0)
    assert model_fingerprint(a, 0) == model_fingerprint(b, 0) and model_fingerprint(a, 1) != model_fingerprint(b, 1)
    for store in stores.values():  # recorded beside the display name
        extra = ActivationStore(store).manifest["extra"]
        assert extra["model_fingerprint"]["weights_scope"] == "embeddings and blocks 0..0"
    assert sae.format_info.model_fingerprint == ActivationStore(stores["sae"]).manifest["extra"]["model_fingerprint"]


def test_same_model_under_another_name_is_not_refused(setup):
    root, stores, sae = setup
    assert ActivationStore(stores["converted"]).model != sae.format_info.model_name
    notes: list[str] = []
    flags = activations_match_flags(sae, stores["converted"], subject="sae", notes=notes)
    assert not any("model" in f.evidence["causes"] for f in flags if f.name == ACTIVATIONS_MISMATCH)
    assert any("model by fingerprint: the same model" in n for n in notes)


def test_other_weights_are_refused_even_under_the_same_name(setup):
    root, stores, sae = setup
    assert ActivationStore(stores["other"]).model.split("/")[-1] == sae.format_info.model_name.split("/")[-1]
    notes: list[str] = []
    (flag,) = activations_match_flags(sae, stores["other"], subject="sae", notes=notes)
    assert flag.severity == "error" and "model" in flag.evidence["causes"]
    assert flag.evidence["model"]["compared_by"] == "fingerprint" and "weights" in flag.evidence["model"]["summary"]
    # --assume-same-model overrides, and the output says it did
    notes = []
    flags = activations_match_flags(
        sae, stores["other"], subject="sae", notes=notes, options=MatchOptions(assume_same_model=True)
    )
    assert not any("model" in f.evidence["causes"] for f in flags)
    assert any("assumed the same (--assume-same-model)" in n for n in notes)


def test_names_are_compared_only_without_a_fingerprint(setup, tmp_path):
    root, stores, sae = setup
    plain = tmp_path / "plain"
    shutil.copytree(stores["converted"], plain)
    manifest = json.loads((plain / "manifest.json").read_text())
    del manifest["extra"]["model_fingerprint"]  # a store cached before fingerprints existed
    (plain / "manifest.json").write_text(json.dumps(manifest))
    notes: list[str] = []
    (flag,) = activations_match_flags(sae, ActivationStore(plain, verify=False), subject="sae", notes=notes)
    # the names differ and the tiny SAE's fit on the rows is too poor to overrule them
    assert flag.evidence["model"]["compared_by"] == "name and rows"
    assert any("model by the rows (names do not settle it): model names differ" in n for n in notes)


def test_cli_check_acts_on_the_converted_store(setup, tmp_path, capsys):
    from saegeo.cli import main

    root, stores, sae = setup
    main(
        [
            "check",
            str(root / "sae"),
            "--acts",
            str(stores["converted"]),
            "--no-progress",
            "--out",
            str(tmp_path / "a"),
            "--format",
            "json",
        ]
    )
    saved = json.loads(next((tmp_path / "a").glob("*.json")).read_text())
    assert not any(f["name"] == ACTIVATIONS_MISMATCH and "model" in f["evidence"]["causes"] for f in saved["flags"])
    main(
        [
            "check",
            str(root / "sae"),
            "--acts",
            str(stores["other"]),
            "--no-progress",
            "--out",
            str(tmp_path / "b"),
            "--format",
            "json",
            "--assume-same-model",
        ]
    )
    saved = json.loads(next((tmp_path / "b").glob("*.json")).read_text())
    assert any("--assume-same-model" in n for n in saved["notes"])
    assert not any(f["name"] == ACTIVATIONS_MISMATCH and "model" in f["evidence"]["causes"] for f in saved["flags"])
    capsys.readouterr()
