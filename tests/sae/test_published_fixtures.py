"""Files written by the real libraries (tests/fixtures/published, built by make_fixtures.py in a side venv) load
through SAE.load and reproduce the library's own codes and reconstructions to 1e-5."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from saegeo.errors import FormatError
from saegeo.sae.formats import detect_format
from saegeo.sae.model import SAE

FIXTURES = Path(__file__).parents[1] / "fixtures" / "published"
INDEX = json.loads((FIXTURES / "index.json").read_text())["fixtures"]
LOADABLE = sorted(name for name, entry in INDEX.items() if "refused" not in entry)
EXPECTED_FORMAT = {
    "saelens": "saelens",
    "sparsify": "sparsify",
    "dl": "dictionary_learning",
    "gemma": "gemma_scope_npz",
    "goodfire": "goodfire",
    "llama": "llama_scope",
    "saegeo": "saelens",  # saegeo's own save (in SAELens' layout), with SAELens' outputs as the reference
}


def _expected_format(name: str) -> str:
    return "gemma_scope_2" if name == "gemma_scope_2" else EXPECTED_FORMAT[name.split("_")[0]]


def _load(name: str):
    return SAE.load(FIXTURES / name / INDEX[name]["load"])


@pytest.mark.parametrize("name", LOADABLE)
def test_fixture_matches_library_outputs(name):
    ref = load_file(str(FIXTURES / name / "reference.safetensors"))
    sae = _load(name)
    assert sae.format_info.format == _expected_format(name)
    with torch.no_grad():
        codes = sae.encode(ref["x"])
        recon = sae.decode(codes)
        forward = sae(ref["x"])
    scale = max(1.0, float(ref["codes"].abs().max()))
    torch.testing.assert_close(codes, ref["codes"], atol=1e-5 * scale, rtol=1e-5)
    torch.testing.assert_close(recon, ref["recon"], atol=1e-5 * max(1.0, float(ref["recon"].abs().max())), rtol=1e-5)
    torch.testing.assert_close(forward, recon, atol=1e-5 * max(1.0, float(ref["recon"].abs().max())), rtol=1e-5)


def test_fixture_set_covers_the_issue():
    required = {
        "saelens_standard",
        "saelens_topk",
        "saelens_jumprelu",
        "saelens_batchtopk",
        "sparsify_topk",
        "dl_autoencoder",
        "dl_topk",
        "dl_batchtopk",
        "dl_jumprelu",
        "dl_matryoshka",
        "gemma_scope_npz",
        "gemma_scope_2",
        "llama_scope",
        "goodfire",
        "sparsify_signed_handbuilt",
        "saelens_gated",
        "saelens_gated_training",
        "dl_gated",
        "saelens_abstopk",
    }
    assert required <= set(INDEX)


def test_dictionary_learning_jumprelu_decoder_norms_are_spread():
    """The fixture that catches decoder-norm folding: with norms spread over [0.5, 1.5) folding changes every code."""
    sae = _load("dl_jumprelu")
    norms = sae.W_dec.detach().norm(dim=1)
    assert float(norms.min()) < 0.7 and float(norms.max()) > 1.3
    ref = load_file(str(FIXTURES / "dl_jumprelu" / "reference.safetensors"))
    sae.fold_decoder_norms()  # the convention dictionary_learning dropped: codes become f·‖W_dec,i‖
    with torch.no_grad():
        folded = sae.encode(ref["x"])
    assert (folded - ref["codes"]).abs().max() > 0.05


def test_saelens_metadata_is_read():
    info = _load("saelens_standard").format_info
    assert info.model_name == "gpt2" and info.hook_name == "blocks.6.hook_resid_post"
    assert info.model_from_pretrained_kwargs == {"center_writing_weights": False}
    assert info.exclude_special_tokens is True and info.prepend_bos is True and info.context_size == 128


def test_llama_scope_facts():
    info = _load("llama_scope").format_info
    assert info.expected_input_norm == 40.0 and info.source_dtype == "bfloat16"
    assert info.input_scale_folded == pytest.approx(32**0.5 / 40.0)


def test_dictionary_learning_training_backup_refused_by_name(tmp_path):
    ae = torch.load(FIXTURES / "dl_jumprelu" / "ae.pt", weights_only=True)
    backup = {
        "step": 1200,
        "ae": ae,
        "optimizer": {"state": {}, "param_groups": [{"lr": 1e-3}]},
        "config": {"dict_class": "JumpReluAutoEncoder"},
        "norm_factor": 12.5,
    }
    torch.save(backup, tmp_path / "ae.pt")
    assert detect_format(tmp_path) == "dictionary_learning"
    with pytest.raises(FormatError, match=r"training backup.*'optimizer'.*norm_factor.*scale_biases"):
        SAE.load(tmp_path)


def test_gemma_scope_2_skip_transcoder_refused(tmp_path):
    from safetensors.torch import save_file

    src = FIXTURES / "gemma_scope_2" / INDEX["gemma_scope_2"]["load"]
    params = load_file(str(src / "params.safetensors"))
    params["affine_skip_connection"] = torch.zeros(32, 32)
    save_file(params, str(tmp_path / "params.safetensors"))
    (tmp_path / "config.json").write_text((src / "config.json").read_text())
    with pytest.raises(FormatError, match="params.safetensors: Gemma Scope 2 skip transcoder.*affine_skip_connection"):
        SAE.load(tmp_path)


# ============================================================================ hub ids, from an offline cache built here
def _cache_repo(
    cache: Path, repo_id: str, files: dict[str, Path], revision: str = "0123456789abcdef0123456789abcdef01234567"
) -> None:
    """The huggingface_hub cache layout: models--{org}--{name}/snapshots/{rev}/... and refs/main."""
    root = cache / f"models--{repo_id.replace('/', '--')}"
    for rel, src in files.items():
        dst = root / "snapshots" / revision / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        dst.write_bytes(src.read_bytes())
    (root / "refs").mkdir(parents=True, exist_ok=True)
    (root / "refs" / "main").write_text(revision)


@pytest.fixture
def offline_cache(tmp_path, monkeypatch):
    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return cache


def _same_sae(a, b):
    for name in ("W_enc", "W_dec", "b_enc", "b_dec", "threshold"):
        torch.testing.assert_close(getattr(a, name), getattr(b, name), rtol=0, atol=0)
    assert a.cfg == b.cfg


def test_gemma_scope_release_id_loads_from_offline_cache(offline_cache):
    sub = "layer_20/width_16k/average_l0_71"
    src = FIXTURES / "gemma_scope_npz" / sub / "params.npz"
    _cache_repo(offline_cache, "google/gemma-scope-2b-pt-res", {f"{sub}/params.npz": src})
    by_id = SAE.load(f"gemma-scope-2b-pt-res/{sub}")
    _same_sae(by_id, SAE.load(src))
    info = by_id.format_info
    assert info.hub_id == f"gemma-scope-2b-pt-res/{sub}" and info.format == "gemma_scope_npz"
    assert info.model_name == "google/gemma-2-2b" and info.hook_name == "blocks.20.hook_resid_post"


@pytest.mark.parametrize("name", ["saelens_jumprelu", "sparsify_topk", "llama_scope", "dl_jumprelu", "goodfire"])
def test_org_repo_subfolder_id_equals_path_load(offline_cache, name):
    path = FIXTURES / name / INDEX[name]["load"]
    sub = f"{name}/{INDEX[name]['load']}".removesuffix("/.")
    root = path if path.is_dir() else path.parent
    files = {
        f"{sub}/{f.relative_to(root)}" if path.is_dir() else sub: f
        for f in ([q for q in root.rglob("*") if q.is_file()] if path.is_dir() else [path])
    }
    _cache_repo(offline_cache, "someorg/published-saes", files)
    _same_sae(SAE.load(f"someorg/published-saes/{sub}"), SAE.load(path))


def test_hub_id_offline_not_cached_names_what_it_looked_for(offline_cache):
    with pytest.raises(
        FormatError,
        match=r"gemma-scope-2b-pt-res/layer_3/width_16k/average_l0_9: on a machine with network run `hf download "
        r"google/gemma-scope-2b-pt-res .*` \(into .*\) or pass a local path; google/gemma-scope-2b-pt-res"
        r"/layer_3/width_16k/average_l0_9 is not in that cache and HF_HUB_OFFLINE is set \(looked for "
        r".*models--google--gemma-scope-2b-pt-res/snapshots/\*/layer_3/width_16k/average_l0_9",
    ):
        SAE.load("gemma-scope-2b-pt-res/layer_3/width_16k/average_l0_9")


def test_hub_id_cached_repo_without_that_subfolder(offline_cache):
    sub = "layer_20/width_16k/average_l0_71"
    _cache_repo(
        offline_cache,
        "google/gemma-scope-2b-pt-res",
        {f"{sub}/params.npz": FIXTURES / "gemma_scope_npz" / sub / "params.npz"},
    )
    with pytest.raises(FormatError, match=r"has no layer_21/width_16k/average_l0_71 \(looked for .*snapshots"):
        SAE.load("gemma-scope-2b-pt-res/layer_21/width_16k/average_l0_71")


def test_not_a_path_nor_a_hub_id():
    with pytest.raises(FormatError, match=r"\./missing-sae: does not exist, and is not a hub id"):
        SAE.load("./missing-sae")


def test_saegeo_check_accepts_a_hub_id(offline_cache, capsys):
    from saegeo.cli import main

    sub = "layer_20/width_16k/average_l0_71"
    _cache_repo(
        offline_cache,
        "google/gemma-scope-2b-pt-res",
        {f"{sub}/params.npz": FIXTURES / "gemma_scope_npz" / sub / "params.npz"},
    )
    assert main(["check", f"gemma-scope-2b-pt-res/{sub}", "--no-progress"]) == 0
    assert "average_l0_71" in capsys.readouterr().out
