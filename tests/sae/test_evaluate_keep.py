"""eval at its floor: an evaluation keeps its clean passes (prefix output, clean reference, clean/zero/mean
scores), so a later evaluation of another SAE on the same model, hook and tokens runs only its spliced suffixes;
the kept passes are reused only for the same live model with unchanged weights and the same token ids."""

import pytest
import torch

from saegeo.sae import evaluate
from saegeo.sae.evaluate import EvalConfig, splice_eval
from saegeo.sae.model import SAE, SAEConfig
from tests.splice_helpers import tiny_lm

TEXT = (
    "The residual stream carries a large mean. Sparse autoencoders read it and write it back. "
    "Each latent should mean one thing, and the decoder bias should absorb the offset. " * 3
)
HOOK, CONTEXT = "blocks.0.hook_resid_post", 12


@pytest.fixture(scope="module")
def tiny():
    return tiny_lm(seed=5)


def topk(seed: int) -> SAE:
    sae = SAE(SAEConfig(d_in=16, d_sae=48, activation="topk", k=4))
    with torch.no_grad():
        sae.init_weights(torch.Generator().manual_seed(seed))
    return sae.eval()


def numbers(result: dict) -> dict:
    return {k: v for k, v in result.items() if isinstance(v, float) and k not in ("seconds", "tokens_per_second")}


def count_passes(monkeypatch) -> dict[str, int]:
    calls = {"prefix": 0, "suffix": 0}
    prefix, suffix = evaluate._Splicer.prefix, evaluate._Splicer.suffix

    def counted_prefix(self, *a):
        calls["prefix"] += 1
        return prefix(self, *a)

    def counted_suffix(self, *a):
        calls["suffix"] += 1
        return suffix(self, *a)

    monkeypatch.setattr(evaluate._Splicer, "prefix", counted_prefix)
    monkeypatch.setattr(evaluate._Splicer, "suffix", counted_suffix)
    return calls


def test_second_sae_runs_only_its_spliced_suffix(tmp_path, tiny, monkeypatch):
    (tmp_path / "doc.txt").write_text(TEXT)
    cfg = EvalConfig(
        model="tiny", hook=HOOK, corpus=str(tmp_path / "doc.txt"), context=CONTEXT, max_tokens=10_000,
        skip_tokens=0, batch_windows=2, progress=False,
    )  # fmt: skip
    monkeypatch.setattr(evaluate, "KEEP_BYTES", 0)  # the reference: every evaluation from scratch
    fresh = splice_eval(cfg, tiny, topk(2))
    monkeypatch.setattr(evaluate, "KEEP_BYTES", 2**30)
    splice_eval(cfg, tiny, topk(1))  # keeps its clean passes
    calls = count_passes(monkeypatch)
    kept = splice_eval(cfg, tiny, topk(2))
    n_batches = (kept["windows"] + 1) // 2
    assert n_batches >= 2
    assert calls == {"prefix": 0, "suffix": n_batches}  # one spliced suffix per batch, nothing else
    assert numbers(kept) == numbers(fresh)  # the same numbers, bit for bit

    with torch.no_grad():  # weights changed in place: the kept passes are stale
        tiny.model.blocks[1].mlp.W_out.mul_(1.0)
    calls.update(prefix=0, suffix=0)
    splice_eval(cfg, tiny, topk(2))
    assert calls["prefix"] == n_batches

    (tmp_path / "doc.txt").write_text(TEXT.replace("mean", "offset"))  # the same file name, other tokens
    calls.update(prefix=0, suffix=0)
    other = splice_eval(cfg, tiny, topk(2))
    assert calls["prefix"] == n_batches and other["ce_loss_clean"] != kept["ce_loss_clean"]
