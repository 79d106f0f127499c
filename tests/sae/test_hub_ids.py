"""The ids people have: SAELens release / sae_id pairs and transformer-lens model names, resolved through an offline
Hugging Face cache built in the test (HF_HUB_CACHE layout; HF_HUB_OFFLINE=1, nothing touches the network)."""

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from saegeo.errors import BadInputError, FormatError
from saegeo.sae.formats import resolve_hub_id
from saegeo.sae.model import SAE

FIXTURES = Path(__file__).parents[1] / "fixtures" / "published"
REV = "0123456789abcdef0123456789abcdef01234567"
GPT2_REPO = "jbloom/GPT2-Small-SAEs-Reformatted"


def _cache_files(cache: Path, repo_id: str, files: dict[str, bytes]) -> Path:
    root = cache / f"models--{repo_id.replace('/', '--')}"
    for rel, data in files.items():
        dst = root / "snapshots" / REV / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        dst.write_bytes(data)
    (root / "refs").mkdir(parents=True, exist_ok=True)
    (root / "refs" / "main").write_text(REV)
    return root / "snapshots" / REV


@pytest.fixture
def offline_cache(tmp_path, monkeypatch):
    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return cache


def _jb_files(tmp_path: Path, sub: str, d_in=16, d_sae=32) -> dict[str, bytes]:
    """A SAELens directory in the layout of jbloom's GPT-2 release (a pre-6.0 cfg.json: hook_point, no metadata,
    no model_from_pretrained_kwargs)."""
    g = torch.Generator().manual_seed(4)
    weights = {
        "W_enc": torch.randn(d_in, d_sae, generator=g),
        "W_dec": torch.randn(d_sae, d_in, generator=g),
        "b_enc": torch.randn(d_sae, generator=g),
        "b_dec": torch.randn(d_in, generator=g),
    }
    save_file(weights, tmp_path / "w.safetensors")
    cfg = {"model_name": "gpt2-small", "hook_point": sub, "d_in": d_in, "d_sae": d_sae, "context_size": 128}
    return {
        f"{sub}/cfg.json": json.dumps(cfg).encode(),
        f"{sub}/sae_weights.safetensors": (tmp_path / "w.safetensors").read_bytes(),
    }


def test_gpt2_small_res_jb_id_loads_with_the_release_overrides(offline_cache, tmp_path):
    sub = "blocks.8.hook_resid_pre"
    snapshot = _cache_files(offline_cache, GPT2_REPO, _jb_files(tmp_path, sub))
    sae = SAE.load(f"gpt2-small-res-jb/{sub}")
    direct = SAE.load(snapshot / sub)
    for name in ("W_enc", "W_dec", "b_enc", "b_dec"):
        torch.testing.assert_close(getattr(sae, name), getattr(direct, name), rtol=0, atol=0)
    info = sae.format_info
    assert info.release == {"release": "gpt2-small-res-jb", "repo_id": GPT2_REPO, "path": sub, "registry": "saegeo"}
    # the registry's config_overrides, as SAELens applies them: the file says nothing of centring
    assert direct.format_info.model_from_pretrained_kwargs is None
    assert info.model_from_pretrained_kwargs == {"center_writing_weights": True}
    assert info.hook_name == sub and info.model_name == "gpt2-small"


def test_release_ids_resolve_to_their_repo_and_path():
    cases = {
        "gpt2-small-res-jb/blocks.11.hook_resid_post": (GPT2_REPO, "blocks.11.hook_resid_post"),
        "pythia-70m-deduped-res-sm/blocks.0.hook_resid_pre": (
            "ctigges/pythia-70m-deduped__res-sm_processed",
            "e-res-sm",
        ),
        "pythia-70m-deduped-mlp-sm/blocks.3.hook_mlp_out": ("ctigges/pythia-70m-deduped__mlp-sm_processed", "3-mlp-sm"),
        "llama_scope_lxr_8x/l15r_8x": ("fnlp/Llama3_1-8B-Base-LXR-8x", "Llama3_1-8B-Base-L15R-8x"),
        "gemma-scope-9b-pt-res/layer_20/width_16k/average_l0_68": (
            "google/gemma-scope-9b-pt-res",
            "layer_20/width_16k/average_l0_68",
        ),
        "gemma-scope-2-270m-pt-res/layer_12_width_16k_l0_small": (
            "google/gemma-scope-2-270m-pt",
            "resid_post/layer_12_width_16k_l0_small",
        ),
    }
    for hub_id, (repo, path) in cases.items():
        hub = resolve_hub_id(hub_id)
        assert (hub.repo_id, hub.subfolder) == (repo, path), hub_id
    with pytest.raises(FormatError, match=r"release gpt2-small-res-jb .* has no sae_id 'blocks.99.hook_resid_pre'"):
        resolve_hub_id("gpt2-small-res-jb/blocks.99.hook_resid_pre")
    assert resolve_hub_id("someorg/somerepo/sub").repo_id == "someorg/somerepo"  # not a release: org/repo


def test_gemma_scope_2_release_reads_its_layout(offline_cache):
    sub = "resid_post/layer_12_width_16k_l0_small"
    src = FIXTURES / "gemma_scope_2" / sub
    _cache_files(
        offline_cache,
        "google/gemma-scope-2-270m-pt",
        {f"{sub}/{f}": (src / f).read_bytes() for f in ("params.safetensors", "config.json")},
    )
    sae = SAE.load("gemma-scope-2-270m-pt-res/layer_12_width_16k_l0_small")
    torch.testing.assert_close(sae.W_dec, SAE.load(src).W_dec, rtol=0, atol=0)
    assert sae.format_info.format == "gemma_scope_2" and sae.format_info.hook_name == "blocks.12.hook_resid_post"


def test_missing_file_names_the_hf_download_command(offline_cache, tmp_path):
    sub = "blocks.8.hook_resid_pre"
    files = _jb_files(tmp_path, sub)
    del files[f"{sub}/sae_weights.safetensors"]
    _cache_files(offline_cache, GPT2_REPO, files)
    command = f"hf download {GPT2_REPO} {sub}/cfg.json {sub}/sae_weights.safetensors"
    with pytest.raises(FormatError) as err:
        SAE.load(f"gpt2-small-res-jb/{sub}")
    assert command in str(err.value) and "huggingface-cli" not in str(err.value)
    with pytest.raises(FormatError) as err:  # a release not cached at all: the same command
        SAE.load("gpt2-small-res-jb/blocks.3.hook_resid_pre")
    assert "hf download jbloom/GPT2-Small-SAEs-Reformatted blocks.3.hook_resid_pre/cfg.json" in str(err.value)


def test_an_installed_sae_lens_registry_is_read_first(offline_cache, tmp_path, monkeypatch):
    """sae_lens' own pretrained_saes.yaml (a stand-in package here: sae_lens is not installed in the test venv) names
    the repo and path and its config_overrides win over cfg.json, as SAELens' cfg_dict.update does: here
    apply_b_dec_to_input false changes the encode."""
    site = tmp_path / "site"
    (site / "sae_lens").mkdir(parents=True)
    (site / "sae_lens" / "__init__.py").write_text("raise ImportError('saegeo must not import sae_lens')\n")
    (site / "sae_lens" / "pretrained_saes.yaml").write_text(
        "gpt2-small-res-jb:\n"
        "  conversion_func: null\n"
        "  model: gpt2-small\n"
        "  repo_id: someone/elsewhere\n"
        "  config_overrides:\n"
        "    apply_b_dec_to_input: false\n"
        "  saes:\n"
        "  - id: blocks.8.hook_resid_pre\n"
        "    path: folder/l8\n"
    )
    monkeypatch.syspath_prepend(str(site))
    snapshot = _cache_files(offline_cache, "someone/elsewhere", _jb_files(tmp_path, "folder/l8"))
    hub = resolve_hub_id("gpt2-small-res-jb/blocks.8.hook_resid_pre")
    assert (hub.repo_id, hub.subfolder) == ("someone/elsewhere", "folder/l8")
    assert hub.registry.endswith("sae_lens/pretrained_saes.yaml")
    sae = SAE.load("gpt2-small-res-jb/blocks.8.hook_resid_pre")
    assert sae.cfg.apply_b_dec_to_input is False and SAE.load(snapshot / "folder/l8").cfg.apply_b_dec_to_input is True
    x = torch.randn(5, 16, generator=torch.Generator().manual_seed(0))
    reference = torch.relu(x @ sae.W_enc + sae.b_enc)  # SAELens standard encode without the b_dec subtraction
    torch.testing.assert_close(sae.encode(x), reference, atol=1e-5, rtol=1e-5)
    # releases only saegeo's table has still resolve
    assert resolve_hub_id("llama_scope_lxr_8x/l15r_8x").registry == "saegeo"


def test_transformer_lens_names_load_from_the_offline_cache(offline_cache, tmp_path):
    import transformers

    from saegeo.activations.models import load_model, minilm_path

    torch.manual_seed(0)
    hf = transformers.GPT2LMHeadModel(
        transformers.GPT2Config(vocab_size=30522, n_embd=32, n_layer=2, n_head=4, n_positions=64)
    ).eval()
    hf.save_pretrained(tmp_path / "gpt2")
    transformers.AutoTokenizer.from_pretrained(minilm_path()).save_pretrained(tmp_path / "gpt2")
    files = {p.name: p.read_bytes() for p in (tmp_path / "gpt2").iterdir() if p.is_file()}
    _cache_files(offline_cache, "gpt2", files)
    loaded = load_model("gpt2-small")  # transformer-lens' alias of the repo gpt2
    assert loaded.name == "gpt2" and loaded.kind == "decoder" and loaded.n_layers == 2
    ids = torch.tensor([[101, 2023, 2003, 102]])
    with torch.no_grad():
        hidden = hf(ids, output_hidden_states=True).hidden_states
    _, cache = loaded.model.run_with_cache(ids)
    torch.testing.assert_close(cache["blocks.0.hook_resid_post"], hidden[1], atol=1e-5, rtol=1e-5)
    with pytest.raises(BadInputError) as err:
        load_model("pythia-70m")
    assert "hf download EleutherAI/pythia-70m" in str(err.value) and "huggingface-cli" not in str(err.value)


def test_an_unknown_release_says_so_and_how_to_get_the_registry(offline_cache):
    """A SAELens release saegeo's table does not list, sae_lens not installed (as in the test venv): the message
    says the release is unknown and how to get sae_lens' registry first, then the hf download fix for a repo with
    the cache it looked in."""
    from saegeo.sae.formats.hub import installed_saelens_registry

    assert installed_saelens_registry() is None
    with pytest.raises(FormatError) as err:
        SAE.load("gemma-scope-2b-pt-res-canonical/layer_12/width_16k/canonical")
    text = str(err.value)
    assert text.startswith(
        "gemma-scope-2b-pt-res-canonical/layer_12/width_16k/canonical: if 'gemma-scope-2b-pt-res-canonical' is a "
        "SAELens release, saegeo's table does not list it"
    )
    assert "pip install sae-lens" in text and f"(into {offline_cache})" in text
    assert text.index("pip install sae-lens") < text.index("hf download") < text.index("is not in that cache")


def test_a_missing_local_path_is_said_before_any_hub_lookup(tmp_path, monkeypatch):
    """out/nonexistent_typo with out/ here: a typo in a local path, not a hub id (no hub lookup is made)."""

    (tmp_path / "out" / "sae_a").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(
        "saegeo.sae.formats.download_hub_dictionary", lambda h: pytest.fail("looked on the hub"), raising=True
    )
    with pytest.raises(FormatError) as err:
        SAE.load("out/nonexistent_typo")
    assert str(err.value).startswith("out/nonexistent_typo: does not exist (out/ does, holding sae_a)")


def _stand_in_sae_lens(tmp_path, monkeypatch, yaml_text: str) -> Path:
    """A stand-in sae_lens package holding only pretrained_saes.yaml (importing it fails: saegeo must not)."""
    site = tmp_path / "site"
    (site / "sae_lens").mkdir(parents=True)
    (site / "sae_lens" / "__init__.py").write_text("raise ImportError('saegeo must not import sae_lens')\n")
    (site / "sae_lens" / "pretrained_saes.yaml").write_text(yaml_text)
    monkeypatch.syspath_prepend(str(site))
    return site / "sae_lens" / "pretrained_saes.yaml"


_GOOD_RELEASE = (
    "good-release:\n"
    "  conversion_func: null\n"
    "  model: gpt2-small\n"
    "  repo_id: someone/elsewhere\n"
    "  saes:\n"
    "  - id: blocks.8.hook_resid_pre\n"
    "    path: 0\n"  # YAML reads a bare 0 as a number; sae_lens' own file has such paths (the folder "0")
)


@pytest.mark.parametrize(
    ("release", "field", "says"),
    [
        ("  repo_id: [a, b]\n  saes: []\n", "bad-release.repo_id", "must be a string, found ['a', 'b']"),
        ("  saes: []\n", "bad-release.repo_id", "must be present, found nothing"),
        ("  repo_id: x/y\n  saes:\n  - id: s\n    path: null\n", "bad-release.saes.0.path", "must be a string"),
        ("  repo_id: x/y\n  saes:\n  - path: p\n", "bad-release.saes.0.id", "must be present"),
        ("  repo_id: x/y\n  saes: {id: s}\n", "bad-release.saes", "must be a list"),
        ("  repo_id: x/y\n  conversion_func: 3\n  saes: []\n", "bad-release.conversion_func", "must be a string"),
        (
            "  repo_id: x/y\n  config_overrides: [1]\n  saes: []\n",
            "bad-release.config_overrides",
            "must be a JSON object",
        ),
    ],
)
def test_a_malformed_release_in_sae_lens_registry_is_refused_naming_the_file_and_field(
    offline_cache, tmp_path, monkeypatch, capsys, release, field, says
):
    """sae_lens' pretrained_saes.yaml is a foreign config like any other: a release that does not fit its schema
    (hub.release_list_schema) is one line naming the file and the field, exit 2 through the CLI; the other releases
    of the file still resolve (a bare-number path read as that folder's name)."""
    from saegeo.cli import main

    yaml_file = _stand_in_sae_lens(tmp_path, monkeypatch, _GOOD_RELEASE + "bad-release:\n" + release)
    with pytest.raises(FormatError) as err:
        resolve_hub_id("bad-release/s")
    assert str(err.value).startswith(f"{yaml_file}: {field} {says}"), str(err.value)
    assert main(["check", "bad-release/s", "--no-progress"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and f"{yaml_file}: {field} {says}" in lines[0]
    hub = resolve_hub_id("good-release/blocks.8.hook_resid_pre")
    assert (hub.repo_id, hub.subfolder) == ("someone/elsewhere", "0")
