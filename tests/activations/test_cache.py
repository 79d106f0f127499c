"""The caching loop on a tiny HookedTransformer built from a config (decoder path, no hub):
values against run_with_cache on independently built windows, resume after kills, refusals, CLI."""

import hashlib
import json
from pathlib import Path

import pytest
import torch

import saegeo.io
from saegeo.activations.cache import CacheConfig, cache_activations
from saegeo.activations.models import from_config
from saegeo.activations.store import ActivationStore
from saegeo.errors import BadInputError, StoreError
from tests.splice_helpers import run_forked

CLS, SEP = 101, 102
TINY = dict(
    d_model=32,
    n_layers=3,
    n_heads=4,
    d_head=8,
    d_mlp=64,
    n_ctx=64,
    d_vocab=30522,
    act_fn="gelu",
    normalization_type="LN",
    seed=0,
)
HOOKS = ("blocks.0.hook_resid_post", "blocks.1.mlp.hook_post")


@pytest.fixture(scope="module")
def tiny():
    # tiny matmuls: one thread avoids OpenMP spin-waiting on a shared, busy machine
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield from_config(TINY)
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def text_file(tmp_path_factory):
    from pydoc_data.topics import topics

    path = tmp_path_factory.mktemp("corpus") / "docs.jsonl"
    path.write_text("\n".join(json.dumps({"text": topics[k][:1500]}) for k in sorted(topics)[:6]) + "\n")
    return path


def reference_rows(tiny, texts, context, hooks, exclude_special=False):
    """run_with_cache on each window separately (no batching, no padding), windows built by hand."""
    out = {h: [] for h in hooks}
    ids_out = []
    for text in texts:
        ids = tiny.tokenizer(text, add_special_tokens=False)["input_ids"]
        for lo in range(0, len(ids), context - 2):
            window = torch.tensor([[CLS] + ids[lo : lo + context - 2] + [SEP]])
            keep = slice(1, -1) if exclude_special else slice(None)
            _, cache = tiny.model.run_with_cache(window, names_filter=list(hooks), return_type=None)
            for h in hooks:
                out[h].append(cache[h][0].reshape(window.shape[1], -1)[keep])
            ids_out.append(window[0, keep])
    return {h: torch.cat(v) for h, v in out.items()}, torch.cat(ids_out)


def hashes(out: Path) -> dict[str, str]:
    return {
        str(p.relative_to(out)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(out.rglob("*"))
        if p.is_file()
    }


def test_values_match_run_with_cache(tiny, text_file, tmp_path):
    hooks = HOOKS + ("blocks.1.attn.hook_z",)  # (batch, pos, head, d_head): flattened to 32 columns
    cfg = CacheConfig(
        hooks=hooks,
        corpus=str(text_file),
        context=24,
        out=str(tmp_path / "o"),
        shard_rows=300,
        batch_windows=5,
        max_tokens=1000,
        progress=False,
    )
    result = cache_activations(cfg, tiny)
    assert result.stop_layer == 1 and result.new_tokens == 1000
    texts = [json.loads(line)["text"] for line in text_file.read_text().splitlines()]
    ref, ref_ids = reference_rows(tiny, texts, 24, hooks)
    for h in hooks:
        s = ActivationStore(tmp_path / "o" / h)
        assert s.n_tokens == 1000 and s.hook == h and s.d == ref[h].shape[1]
        got = torch.cat(list(s.iter_batches(4096)))
        torch.testing.assert_close(got, ref[h][:1000], atol=1e-5, rtol=1e-5)
        ids = torch.cat([s.read_token_ids(i) for i in range(len(s.shards))])
        assert torch.equal(ids, ref_ids[:1000])
    pos = torch.cat([s.read_positions(i) for i in range(len(s.shards))])
    assert pos.max() == 23 and (pos[ids == CLS] == 0).all()


def test_exclude_special_and_padding_never_stored(tiny, text_file, tmp_path):
    cfg = CacheConfig(
        hooks=("blocks.2.hook_resid_post",),
        corpus=str(text_file),
        context=40,
        batch_windows=7,
        out=str(tmp_path / "o"),
        exclude_special=True,
        progress=False,
    )
    cache_activations(cfg, tiny)
    s = ActivationStore(tmp_path / "o" / "blocks.2.hook_resid_post")
    texts = [json.loads(line)["text"] for line in text_file.read_text().splitlines()]
    ref, ref_ids = reference_rows(tiny, texts, 40, ("blocks.2.hook_resid_post",), exclude_special=True)
    n_text = sum(len(tiny.tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts)
    assert s.n_tokens == n_text == ref_ids.shape[0]  # no specials, no padding
    assert s.corpus["exclude_special"] is True
    torch.testing.assert_close(s.read_shard(0), ref["blocks.2.hook_resid_post"], atol=1e-5, rtol=1e-5)


def _child(out: str, corpus: str, crash_at: str | None) -> None:
    import os

    torch.set_num_threads(1)
    if crash_at:
        os.environ["SAEGEO_CRASH_AT"] = crash_at
    saegeo.io._CRASH_COUNTS.clear()
    cfg = CacheConfig(hooks=HOOKS, corpus=corpus, context=20, out=out, shard_rows=128, batch_windows=4, progress=False)
    cache_activations(cfg, _TINY_IN_PARENT[0])
    os._exit(0)


_TINY_IN_PARENT: list = []  # handed to forked children (fork copies the loaded model)


@pytest.mark.parametrize("crash_at", ["before_shard:2", "mid_shard:3", "after_shard:3", "after_manifest:3"])
def test_killed_cache_resumes_identically(tiny, text_file, tmp_path, crash_at):
    _TINY_IN_PARENT[:] = [tiny]

    def run(out, crash):
        return run_forked(_child, str(out), str(text_file), crash, timeout=120)

    assert run(tmp_path / "ref", None) == 0
    assert run(tmp_path / "victim", crash_at) == 137
    states = [json.loads((tmp_path / "victim" / h / "manifest.json").read_text()) for h in HOOKS]
    assert not all(m["complete"] for m in states)
    if crash_at.startswith("after_manifest"):  # killed between the two hooks' shards
        assert states[0]["n_tokens"] != states[1]["n_tokens"]
    assert run(tmp_path / "victim", None) == 0
    assert hashes(tmp_path / "victim") == hashes(tmp_path / "ref")
    assert ActivationStore(tmp_path / "ref" / HOOKS[0]).n_tokens > 5 * 128  # several shards were involved


def test_rerun_is_a_no_op_and_mismatch_refused(tiny, text_file, tmp_path, monkeypatch):
    from saegeo.activations import runner as runner_mod

    cfg = CacheConfig(
        hooks=HOOKS[:1],
        corpus=str(text_file),
        context=20,
        out=str(tmp_path / "o"),
        shard_rows=100,
        max_tokens=450,
        progress=False,
    )
    cache_activations(cfg, tiny)
    before = hashes(tmp_path / "o")
    calls = []
    forward = runner_mod.forward_to_layer
    monkeypatch.setattr(runner_mod, "forward_to_layer", lambda *a: calls.append(a[1].shape) or forward(*a))
    assert cache_activations(cfg, tiny).new_tokens == 0
    assert calls == [(1, 2)]  # only the hook-width probe: no batch is recomputed
    monkeypatch.undo()
    assert hashes(tmp_path / "o") == before
    # a larger --max-tokens continues the store, equal to caching 700 in one go
    more = cache_activations(CacheConfig(**{**cfg.__dict__, "max_tokens": 700}), tiny)
    assert more.new_tokens == 250
    cache_activations(CacheConfig(**{**cfg.__dict__, "max_tokens": 700, "out": str(tmp_path / "p")}), tiny)
    assert hashes(tmp_path / "o") == hashes(tmp_path / "p")
    cfg = CacheConfig(**{**cfg.__dict__, "max_tokens": 700})  # the store holds 700 rows now
    with pytest.raises(StoreError, match="refusing to append.*corpus"):
        cache_activations(CacheConfig(**{**cfg.__dict__, "context": 24}), tiny)
    with pytest.raises(StoreError, match="refusing to append.*dtype"):
        cache_activations(CacheConfig(**{**cfg.__dict__, "dtype": "float16"}), tiny)
    with pytest.raises(BadInputError, match="does not exist"):
        cache_activations(CacheConfig(**{**cfg.__dict__, "hooks": ("blocks.9.hook_resid_post",)}), tiny)


def test_a_smaller_max_tokens_onto_a_larger_store_is_refused_before_any_write(tiny, text_file, tmp_path):
    """It used to keep every row, say nothing and exit 0: --max-tokens 300 on a 450-row store."""
    cfg = CacheConfig(
        hooks=HOOKS[:1],
        corpus=str(text_file),
        context=20,
        out=str(tmp_path / "o"),
        shard_rows=100,
        max_tokens=450,
        progress=False,
    )
    cache_activations(cfg, tiny)
    before = hashes(tmp_path / "o")
    with pytest.raises(BadInputError, match=r"already holds 450 rows, more than this run's 300 .*--overwrite"):
        cache_activations(CacheConfig(**{**cfg.__dict__, "max_tokens": 300}), tiny)
    assert hashes(tmp_path / "o") == before  # still complete, nothing rewritten
    assert cache_activations(CacheConfig(**{**cfg.__dict__, "max_tokens": 300, "overwrite": True}), tiny).n_tokens == {
        HOOKS[0]: 300
    }


def test_cli_cache_with_config_model(text_file, tmp_path, capsys):
    from saegeo.cli import main

    cfg_file = tmp_path / "tiny.json"
    cfg_file.write_text(json.dumps({"hooked_transformer_config": TINY}))
    out = tmp_path / "acts"
    argv = [
        "cache",
        "--model",
        str(cfg_file),
        "--hooks",
        "blocks.0.hook_resid_post",
        "--corpus",
        str(text_file),
        "--context",
        "32",
        "--out",
        str(out),
        "--max-tokens",
        "300",
        "--dtype",
        "bfloat16",
        "--no-progress",
    ]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "cached 300 new tokens" in printed and "tokens/s" in printed
    s = ActivationStore(out / "blocks.0.hook_resid_post")
    assert (s.n_tokens, s.dtype, s.d) == (300, "bfloat16", 32)
    assert main(["store", "verify", str(s.path)]) == 0
    assert main(["cache", "--model", "no-such-model-anywhere", "--out", str(tmp_path / "x")]) == 2
    assert "never downloads" in capsys.readouterr().err
