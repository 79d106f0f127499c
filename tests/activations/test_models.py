"""Models through saegeo equal the original `transformers` model: the bundled MiniLM (HookedEncoder,
stopped early, padded batches) at every layer, and a local GPT-2 directory (HookedTransformer)."""

import json

import pytest
import torch

from saegeo.activations.cache import CacheConfig, cache_activations
from saegeo.activations.models import load_model, minilm_path
from saegeo.activations.store import ActivationStore
from saegeo.errors import BadInputError

TEXTS = [
    "The geometry of a representation space is not isotropic: token vectors share a common direction.",
    "Short one.",
]


@pytest.fixture(scope="module")
def minilm():
    return load_model("minilm")


@pytest.fixture(scope="module")
def hf_minilm():
    from transformers import AutoModel

    return AutoModel.from_pretrained(minilm_path(), local_files_only=True).eval()


def hf_reference(hf, ids):
    """Per-layer HF tensors for one unpadded window: hidden states, pre-LayerNorm sums, GELU outputs."""
    pre_ln, gelu = {}, {}
    handles = []
    for L, layer in enumerate(hf.encoder.layer):
        handles.append(layer.output.LayerNorm.register_forward_pre_hook(lambda m, a, L=L: pre_ln.__setitem__(L, a[0])))
        handles.append(layer.intermediate.register_forward_hook(lambda m, a, o, L=L: gelu.__setitem__(L, o)))
    with torch.no_grad():
        out = hf(input_ids=torch.tensor([ids]), output_hidden_states=True)
    for h in handles:
        h.remove()
    return out.hidden_states, pre_ln, gelu


def test_minilm_equals_transformers_at_every_layer(minilm, hf_minilm, tmp_path):
    corpus = tmp_path / "texts.jsonl"
    corpus.write_text("\n".join(json.dumps({"text": t}) for t in TEXTS) + "\n")
    hooks = tuple(f"blocks.{L}.hook_normalized_resid_post" for L in range(6)) + (
        "blocks.3.hook_resid_post",
        "blocks.3.mlp.hook_post",
        "blocks.5.hook_resid_post",
    )
    # both texts in one batch: the short one is padded, so the attention mask path is exercised
    cfg = CacheConfig(
        hooks=hooks, corpus=str(corpus), context=128, out=str(tmp_path / "o"), batch_windows=2, progress=False
    )
    cache_activations(cfg, minilm)
    windows = [[101] + minilm.tokenizer(t, add_special_tokens=False)["input_ids"] + [102] for t in TEXTS]
    refs = [hf_reference(hf_minilm, ids) for ids in windows]
    expected = {f"blocks.{L}.hook_normalized_resid_post": [r[0][L + 1][0] for r in refs] for L in range(6)}
    expected["blocks.3.hook_resid_post"] = [r[1][3][0] for r in refs]
    expected["blocks.5.hook_resid_post"] = [r[1][5][0] for r in refs]
    expected["blocks.3.mlp.hook_post"] = [r[2][3][0] for r in refs]
    for hook in hooks:
        got = ActivationStore(tmp_path / "o" / hook).read_shard(0)
        want = torch.cat(expected[hook])
        assert got.shape == want.shape == (sum(map(len, windows)), want.shape[1])  # padding never stored
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5, msg=hook)
    # post-LN BERT: resid_post carries a large shared mean that the LayerNorm removes
    resid = ActivationStore(tmp_path / "o" / "blocks.3.hook_resid_post").read_shard(0)
    assert resid.mean(0).norm() > 0.3 * resid.norm(dim=1).mean()


def test_early_stop_equals_full_forward(minilm, tmp_path):
    """Stopping after block 3 gives exactly what the full HookedEncoder forward shows at that hook."""
    corpus = tmp_path / "t.txt"
    corpus.write_text(TEXTS[0] * 3)
    cfg = CacheConfig(
        hooks=("blocks.3.hook_resid_post",), corpus=str(corpus), context=64, out=str(tmp_path / "o"), progress=False
    )
    assert cache_activations(cfg, minilm).stop_layer == 3
    got = torch.cat(list(ActivationStore(tmp_path / "o" / "blocks.3.hook_resid_post").iter_batches(1000)))
    ids = minilm.tokenizer(TEXTS[0] * 3, add_special_tokens=False)["input_ids"]
    rows = []
    for lo in range(0, len(ids), 62):
        window = torch.tensor([[101] + ids[lo : lo + 62] + [102]])
        _, cache = minilm.model.run_with_cache(window, names_filter=["blocks.3.hook_resid_post"])
        rows.append(cache["blocks.3.hook_resid_post"][0])
    torch.testing.assert_close(got, torch.cat(rows), atol=1e-5, rtol=1e-5)


TINY_HF = {
    "gpt2": ("GPT2Config", "GPT2LMHeadModel", dict(n_embd=32, n_layer=2, n_head=4, n_positions=64)),
    "neox": (
        "GPTNeoXConfig",
        "GPTNeoXForCausalLM",
        dict(
            hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, max_position_embeddings=64
        ),
    ),
    "llama": (
        "LlamaConfig",
        "LlamaForCausalLM",
        dict(
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=4,
            intermediate_size=64,
            max_position_embeddings=64,
        ),
    ),
}


@pytest.mark.parametrize("arch", sorted(TINY_HF))
def test_local_decoder_dir_equals_transformers(arch, tmp_path):
    import transformers

    config_cls, model_cls, kwargs = TINY_HF[arch]
    torch.manual_seed(0)
    config = getattr(transformers, config_cls)(vocab_size=30522, **kwargs)
    hf = getattr(transformers, model_cls)(config).eval()
    hf.save_pretrained(tmp_path / arch)
    transformers.AutoTokenizer.from_pretrained(minilm_path()).save_pretrained(tmp_path / arch)
    loaded = load_model(tmp_path / arch)
    assert loaded.kind == "decoder" and loaded.n_layers == 2
    ids = torch.tensor([[101, 2023, 2003, 1037, 3231, 102]])
    with torch.no_grad():
        hidden = hf(ids, output_hidden_states=True).hidden_states
    _, cache = loaded.model.run_with_cache(ids)
    torch.testing.assert_close(cache["blocks.0.hook_resid_post"], hidden[1], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(cache["ln_final.hook_normalized"], hidden[2], atol=1e-5, rtol=1e-5)


def test_hub_name_gives_offline_error():
    with pytest.raises(BadInputError, match="never downloads.*--local-dir"):
        load_model("EleutherAI/surely-not-cached-model")


def test_bad_config_files_are_refused_clearly(tmp_path):
    from saegeo.errors import FormatError

    (tmp_path / "broken.json").write_text('{"d_model": 8,')
    with pytest.raises(FormatError, match=r"broken\.json: cannot read the model config"):
        load_model(tmp_path / "broken.json")
    bidir = {
        "d_model": 8,
        "d_head": 4,
        "n_layers": 1,
        "n_ctx": 8,
        "d_vocab": 40000,
        "act_fn": "gelu",
        "attention_dir": "bidirectional",
    }
    (tmp_path / "bidir.json").write_text(json.dumps(bidir))
    with pytest.raises(BadInputError, match="bidirectional config needs a HookedEncoder"):
        load_model(tmp_path / "bidir.json")


def test_weights_need_no_per_forward_copy(tmp_path):
    """transformer-lens rebuilds W.T / (h d_head) d_model layouts on every forward; saegeo stores each weight
    so that rebuild is a view of its own storage (no copy), and the logits stay bitwise those of the stock
    layout (every parameter contiguous, as transformer-lens loads it). A Llama with grouped-query attention."""
    import einops
    import transformers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=30522,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
    )
    transformers.LlamaForCausalLM(config).eval().save_pretrained(tmp_path / "llama")
    transformers.AutoTokenizer.from_pretrained(minilm_path()).save_pretrained(tmp_path / "llama")
    model = load_model(tmp_path / "llama").model
    ids = torch.tensor([[101, 2023, 2003, 1037, 3231, 102], [101, 7592, 2088, 102, 0, 0]])
    with torch.no_grad():
        fast = model(ids)
        block = model.blocks[1]
        # what transformer-lens 3.9 does per forward (gated_mlp.py, unembed.py, utilities/attention.py,
        # abstract_attention.py), each a view of the parameter's own storage
        rebuilt = {
            "W_gate": block.mlp.W_gate.T.contiguous(),
            "W_in": block.mlp.W_in.T.contiguous(),
            "W_out": block.mlp.W_out.T.contiguous(),
            "W_U": model.unembed.W_U.T.contiguous(),
            "W_Q": einops.rearrange(block.attn.W_Q, "h m d -> (h d) m"),
            "_W_K": einops.rearrange(block.attn._W_K, "h m d -> (h d) m"),
            "_W_V": einops.rearrange(block.attn._W_V, "h m d -> (h d) m"),
            "W_O": einops.rearrange(block.attn.W_O, "h d m -> m (h d)").contiguous(),
        }
        owners = {"W_U": model.unembed, "W_Q": block.attn, "_W_K": block.attn, "_W_V": block.attn, "W_O": block.attn}
        for name, tensor in rebuilt.items():
            assert tensor.data_ptr() == getattr(owners.get(name, block.mlp), name).data_ptr(), name
        for param in model.parameters():
            param.data = param.data.contiguous()
        assert not torch.equal(fast, torch.zeros_like(fast))
        assert torch.equal(model(ids), fast)
        assert model.unembed.W_U.T.contiguous().data_ptr() != model.unembed.W_U.data_ptr()  # the stock layout copies
