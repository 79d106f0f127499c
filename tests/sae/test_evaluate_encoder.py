"""The splice on an encoder (bundled MiniLM, no LM head): the cosine of clean and spliced mean-pooled
final-layer sentence embeddings, against a brute-force computation that patches the Hugging Face BertModel
with a forward hook on encoder.layer[L] (no transformer-lens)."""

import pytest
import torch
import torch.nn.functional as F

from saegeo.activations.models import load_model, minilm_path
from saegeo.sae.evaluate import ENCODER_MEASURE, EvalConfig, splice_eval_many
from saegeo.sae.model import SAE, SAEConfig
from tests.splice_helpers import identity_sae

TEXT = (
    "Sparse autoencoders decompose activations into many latents. Each latent should mean one thing. "
    "The residual stream of a transformer carries a large mean, which the decoder bias must absorb."
)
LAYER, CONTEXT, CLS, SEP = 2, 20, 101, 102


@pytest.fixture(scope="module")
def minilm():
    return load_model("minilm")


def topk(d=384, seed=0):
    sae = SAE(SAEConfig(d_in=d, d_sae=4 * d, activation="topk", k=24))
    with torch.no_grad():
        sae.init_weights(
            torch.Generator().manual_seed(seed), b_dec=0.1 * torch.randn(d, generator=torch.Generator().manual_seed(9))
        )
    return sae.eval()


def test_encoder_cosine_equals_brute_force_hf_hook(minilm, tmp_path):
    from transformers import AutoModel

    corpus = tmp_path / "doc.txt"
    corpus.write_text(TEXT)
    sae = topk()
    cfg = EvalConfig(
        model="minilm",
        corpus=str(corpus),
        hook=f"blocks.{LAYER}.hook_normalized_resid_post",
        context=CONTEXT,
        max_tokens=10_000,
        batch_windows=16,
        progress=False,
    )
    got = splice_eval_many(cfg, {"topk": sae, "identity": identity_sae(384)}, minilm)
    hf = AutoModel.from_pretrained(minilm_path(), local_files_only=True).eval()
    ids = minilm.tokenizer(TEXT, add_special_tokens=False)["input_ids"]
    windows = [[CLS] + ids[i : i + CONTEXT - 2] + [SEP] for i in range(0, len(ids), CONTEXT - 2)]
    cos = {"spliced": [], "zero": []}
    with torch.inference_mode():
        for w in windows:
            x = torch.tensor([w])
            clean = hf(x).last_hidden_state[0].mean(0)
            for v, fn in {"spliced": lambda h: sae(h[0])[None], "zero": torch.zeros_like}.items():
                handle = hf.encoder.layer[LAYER].register_forward_hook(
                    lambda m, i, o, fn=fn: (fn(o[0]), *o[1:]) if isinstance(o, tuple) else fn(o)
                )
                patched = hf(x).last_hidden_state[0].mean(0)
                handle.remove()
                cos[v].append(float(F.cosine_similarity(clean, patched, dim=0)))
    r = got["topk"]
    assert r["measured"] == ENCODER_MEASURE and "ce_loss_clean" not in r
    assert r["tokens"] == sum(len(w) for w in windows) and r["passed_through"]["positions"] == 0
    assert r["embedding_cosine_spliced"] == pytest.approx(sum(cos["spliced"]) / len(windows), abs=1e-5)
    assert r["embedding_cosine_zero_ablation"] == pytest.approx(sum(cos["zero"]) / len(windows), abs=1e-5)
    assert r["embedding_cosine_spliced"] < 0.999
    assert got["identity"]["embedding_cosine_spliced"] == pytest.approx(1.0, abs=1e-6)
