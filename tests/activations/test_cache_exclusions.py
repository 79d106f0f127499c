"""Caching with exclusions on a tiny HookedTransformer: the norm rule (rows above m × the window's median
norm, at any cached hook) and the manifest's sums against a brute-force pass over independently built
windows; a killed run with exclusions resumes to the identical store."""

import json

import pytest
import torch

import saegeo.io
from saegeo.activations.cache import CacheConfig, cache_activations, exclusion_shares
from saegeo.activations.store import ActivationStore
from saegeo.errors import BadInputError, StoreError
from saegeo.render.text import exclusion_lines
from tests.activations.test_cache import CLS, HOOKS, SEP, hashes, text_file, tiny  # noqa: F401  (fixtures)
from tests.splice_helpers import run_forked

M = 1.15


def brute(tiny, texts, context):
    """Every window by hand; per window and hook the norms, the union rule, and all/excluded/first rows."""
    kept = {h: [] for h in HOOKS}
    groups = {h: {"all": [], "excluded": [], "first_position": []} for h in HOOKS}
    for text in texts:
        ids = tiny.tokenizer(text, add_special_tokens=False)["input_ids"]
        for lo in range(0, len(ids), context - 2):
            window = torch.tensor([[CLS] + ids[lo : lo + context - 2] + [SEP]])
            _, cache = tiny.model.run_with_cache(window, names_filter=list(HOOKS), return_type=None)
            acts = {h: cache[h][0].reshape(window.shape[1], -1) for h in HOOKS}
            special = torch.zeros(window.shape[1], dtype=torch.bool)
            special[0] = special[-1] = True
            out = special.clone()
            for a in acts.values():
                norms = a.norm(dim=-1)
                out |= ~special & (norms > M * norms[~special].median())
            for h, a in acts.items():
                kept[h].append(a[~out])
                groups[h]["all"].append(a)
                groups[h]["excluded"].append(a[out])
                groups[h]["first_position"].append(a[:1])
    return {h: torch.cat(v) for h, v in kept.items()}, {
        h: {g: torch.cat(v).double() for g, v in gs.items()} for h, gs in groups.items()
    }


def test_norm_exclusion_and_shares_equal_brute_force(tiny, text_file, tmp_path):
    cfg = CacheConfig(
        hooks=HOOKS,
        corpus=str(text_file),
        context=24,
        batch_windows=5,
        out=str(tmp_path / "o"),
        exclude_special=True,
        exclude_norm_ratio=M,
        progress=False,
    )
    cache_activations(cfg, tiny)
    texts = [json.loads(line)["text"] for line in text_file.read_text().splitlines()]
    kept, groups = brute(tiny, texts, 24)
    for h in HOOKS:
        s = ActivationStore(tmp_path / "o" / h)
        torch.testing.assert_close(torch.cat(list(s.iter_batches(4096))), kept[h], atol=1e-5, rtol=1e-5)
        ex = s.manifest["extra"]["excluded"]
        assert s.corpus["exclude_norm_ratio"] == M
        g = groups[h]
        assert (
            ex["all"]["n"] == len(g["all"])
            and ex["excluded"]["n"] == len(g["excluded"]) > 2 * ex["first_position"]["n"]
        )
        assert ex["excluded_norm"]["n"] == ex["excluded"]["n"] - ex["excluded_special"]["n"] > 0
        # shares from the sums against the rows themselves
        mu = g["all"].mean(0)
        spread = ((g["all"] - mu) ** 2).sum()
        shares = exclusion_shares(ex)
        for name in ("excluded", "first_position"):
            rows = g[name]
            assert shares[name]["mu_share"] == pytest.approx(
                float(rows.sum(0) @ mu / (len(g["all"]) * mu @ mu)), rel=1e-6
            )
            assert shares[name]["trace_share"] == pytest.approx(float(((rows - mu) ** 2).sum() / spread), rel=1e-6)
        assert "norm outliers" in "\n".join(exclusion_lines(s.manifest["extra"]))
    with pytest.raises(StoreError, match="exclude_norm_ratio"):  # another m: not the same store
        cache_activations(CacheConfig(**{**cfg.__dict__, "exclude_norm_ratio": 2.0}), tiny)
    with pytest.raises(BadInputError, match="must be > 1"):
        cache_activations(CacheConfig(**{**cfg.__dict__, "exclude_norm_ratio": 0.5}), tiny)


def _child(out: str, corpus: str, crash_at: str | None) -> None:
    import os

    torch.set_num_threads(1)
    if crash_at:
        os.environ["SAEGEO_CRASH_AT"] = crash_at
    saegeo.io._CRASH_COUNTS.clear()
    cfg = CacheConfig(
        hooks=HOOKS,
        corpus=corpus,
        context=20,
        out=out,
        shard_rows=128,
        batch_windows=4,
        exclude_special=True,
        exclude_norm_ratio=M,
        progress=False,
    )
    cache_activations(cfg, _PARENT[0])
    os._exit(0)


_PARENT: list = []


@pytest.mark.parametrize("crash_at", ["mid_shard:3", "after_manifest:3"])
def test_killed_cache_with_exclusions_resumes_identically(tiny, text_file, tmp_path, crash_at):
    _PARENT[:] = [tiny]
    run = lambda out, crash: run_forked(_child, str(out), str(text_file), crash)  # noqa: E731
    assert run(tmp_path / "ref", None) == 0
    assert run(tmp_path / "victim", crash_at) == 137
    assert run(tmp_path / "victim", None) == 0
    assert hashes(tmp_path / "victim") == hashes(tmp_path / "ref")
    # a rerun of the complete store is a no-op, byte-identical
    assert run(tmp_path / "victim", None) == 0
    assert hashes(tmp_path / "victim") == hashes(tmp_path / "ref")


def test_eval_default_skip_counts_the_rows_the_norm_rule_dropped(tiny, text_file, tmp_path):
    """With the norm rule on, a store holds fewer rows than the positions it read. `saegeo eval` skips the
    positions read (every non-special position of the corpus here, counted by hand), not the rows kept, so
    no training window is evaluated as held-out text."""
    from saegeo.sae.evaluate import EvalConfig, _resolve
    from saegeo.sae.model import SAE, SAEConfig
    from saegeo.sae.train import TrainConfig, _StoreSource

    cfg = CacheConfig(
        hooks=HOOKS[:1],
        corpus=str(text_file),
        context=24,
        out=str(tmp_path / "o"),
        exclude_special=True,
        exclude_norm_ratio=M,
        progress=False,
    )
    cache_activations(cfg, tiny)
    store = ActivationStore(tmp_path / "o" / HOOKS[0])
    texts = [json.loads(line)["text"] for line in text_file.read_text().splitlines()]
    positions = sum(len(tiny.tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts)
    assert store.n_tokens < positions  # the norm rule dropped rows
    identity = _StoreSource(store, TrainConfig(batch_tokens=16)).identity
    sae_dir = SAE(SAEConfig(d_in=store.d, d_sae=2 * store.d, activation="topk", k=4)).save(
        tmp_path / "sae", provenance={"data": identity}
    )
    resolved = _resolve(EvalConfig(corpus=str(text_file)), SAE.load(sae_dir), tiny)
    assert resolved["skip_tokens"] == positions
