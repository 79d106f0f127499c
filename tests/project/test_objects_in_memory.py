"""Objects in memory, everywhere: every entry point that takes a model takes a transformer-lens HookedTransformer /
HookedEncoder or an HF PreTrainedModel with its tokenizer, and every entry point that takes an SAE takes saegeo's
SAE, SAELens' SAE classes, sparsify's SparseCoder, dictionary_learning's dictionaries, a path or an id, all through
one conversion (`SAE.load`). sae_lens, sparsify and dictionary_learning are not installed in the
test venv: tests/peer_mirrors.py mirrors their classes' layout and carries each library's own encode."""

import json

import pytest
import torch
from safetensors.torch import save_file

from saegeo.activations.models import load_model, minilm_path
from saegeo.errors import BadInputError
from saegeo.sae.model import SAE, SAEConfig
from tests import peer_mirrors as pm

D_IN, D_SAE = 16, 48
HOOK = "blocks.0.hook_resid_post"


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(minilm_path()))


def _tiny_hooked_transformer():
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    cfg = HookedTransformerConfig(
        d_model=D_IN, d_head=4, n_heads=4, n_layers=2, n_ctx=64, d_vocab=30522, act_fn="gelu", device="cpu", seed=3
    )
    return HookedTransformer(cfg, tokenizer=None, move_to_device=False).eval()


def _saelens_topk(seed=0):
    meta = pm.SAEMetadata(model_name="tiny", hook_name=HOOK, context_size=32, prepend_bos=True)
    return pm.TopKSAE(pm.TopKSAEConfig(d_in=D_IN, d_sae=D_SAE, k=5, metadata=meta)).randomize(seed)


def _x(n=64):
    return torch.randn(n, D_IN, generator=torch.Generator().manual_seed(11))


# =========================================================================== SAEs
def _saelens_objects():
    meta = pm.SAEMetadata(hook_name=HOOK)
    std = pm.StandardSAE(pm.StandardSAEConfig(d_in=D_IN, d_sae=D_SAE, metadata=meta)).randomize(1)
    jump = pm.JumpReLUSAE(pm.JumpReLUSAEConfig(d_in=D_IN, d_sae=D_SAE, apply_b_dec_to_input=False)).randomize(2)
    with torch.no_grad():
        jump.threshold.abs_()
    return {"standard": std, "topk": _saelens_topk(), "jumprelu": jump}


@pytest.mark.parametrize("arch", ["standard", "topk", "jumprelu"])
def test_saelens_objects_encode_as_saelens_does(arch):
    obj = _saelens_objects()[arch]
    sae = SAE.load(obj)
    assert isinstance(sae, SAE) and sae.format_info.format == "saelens"
    x = _x()
    with torch.no_grad():
        torch.testing.assert_close(sae.encode(x), obj.encode(x), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(sae.decode(sae.encode(x)), obj.decode(obj.encode(x)), atol=1e-5, rtol=1e-5)
    assert sae.format_info.source.startswith("in memory: ")


def test_saelens_training_batchtopk_is_read_in_its_inference_form():
    obj = pm.BatchTopKTrainingSAE(pm.BatchTopKTrainingSAEConfig(d_in=D_IN, d_sae=D_SAE, k=4)).randomize(5)
    obj.topk_threshold.fill_(0.7)
    sae = SAE.load(obj)
    assert sae.cfg.activation == "jumprelu"
    x = _x()
    with torch.no_grad():
        torch.testing.assert_close(sae.encode(x), obj.encode_inference(x), atol=1e-5, rtol=1e-5)


def test_sparsify_and_dictionary_learning_objects():
    x = _x()
    coder = pm.randomize(pm.SparseCoder(D_IN, pm.SparseCoderConfig(k=6, expansion_factor=3)), 7)
    sae = SAE.load(coder)
    assert sae.format_info.format == "sparsify" and sae.cfg.d_sae == 3 * D_IN
    with torch.no_grad():
        torch.testing.assert_close(sae.encode(x), coder.reference_codes(x), atol=1e-5, rtol=1e-5)
    for dl in (pm.randomize(pm.AutoEncoder(D_IN, D_SAE), 8), pm.randomize(pm.AutoEncoderTopK(D_IN, D_SAE, 5), 9)):
        if hasattr(dl, "k"):
            dl.k.fill_(5)
        sae = SAE.load(dl)
        assert sae.format_info.format == "dictionary_learning" and sae.format_info.dict_class == type(dl).__name__
        with torch.no_grad():
            torch.testing.assert_close(sae.encode(x), dl.encode(x), atol=1e-5, rtol=1e-5)
    skip = pm.SparseCoder(D_IN, pm.SparseCoderConfig(k=6, expansion_factor=3, skip_connection=True))
    with pytest.raises(Exception, match="skip_connection"):
        SAE.load(skip)


def test_unknown_objects_and_paths(tmp_path):
    with pytest.raises(BadInputError, match="SAELens.*sparsify.*dictionary_learning"):
        SAE.load(object())
    native = SAE(SAEConfig(d_in=D_IN, d_sae=D_SAE, activation="relu"))
    assert SAE.load(native) is native
    native.save(tmp_path / "s")
    assert isinstance(SAE.load(tmp_path / "s"), SAE) and isinstance(SAE.load(str(tmp_path / "s")), SAE)


def test_every_sae_entry_point_takes_a_saelens_object(tmp_path):
    from saegeo.report import geometry_report
    from saegeo.report.dictionary_check import CheckOptions, check_dictionary, check_with_activations
    from saegeo.report.geometry_report import ReportOptions

    obj = _saelens_topk()
    x = _x(400) + 2.0
    rep = geometry_report(x, {"sl": obj}, options=ReportOptions(progress=False))
    # the same numbers as the directory SAELens' save_model writes for it (cfg.to_dict() + its state dict)
    (tmp_path / "sl").mkdir()
    (tmp_path / "sl" / "cfg.json").write_text(json.dumps(obj.cfg.to_dict()))
    save_file({k: v.contiguous() for k, v in obj.state_dict().items()}, tmp_path / "sl" / "sae_weights.safetensors")
    ref = geometry_report(x, {"sl": str(tmp_path / "sl")}, options=ReportOptions(progress=False))
    assert rep.saes[0].fve == pytest.approx(ref.saes[0].fve, rel=1e-9)
    assert rep.saes[0].architecture == "topk"
    opts = CheckOptions(progress=False)
    assert check_dictionary(obj, options=opts).a_dict == pytest.approx(
        check_dictionary(SAE.load(obj), options=opts).a_dict
    )
    report, _ = check_with_activations(obj, x, options=opts, report_options=ReportOptions(progress=False))
    assert report.saes[0].fve == pytest.approx(ref.saes[0].fve, rel=1e-9)


# =========================================================================== models
def test_hooked_transformer_caches_what_it_computes(tmp_path, tokenizer):
    from saegeo.activations.cache import CacheConfig, cache_activations
    from saegeo.activations.store import ActivationStore

    ht = _tiny_hooked_transformer()
    with pytest.raises(BadInputError, match=r"tokenizer.*\(model, tokenizer\)"):
        load_model(ht)  # built without one
    loaded = load_model((ht, tokenizer))
    assert loaded.kind == "decoder" and loaded.model is ht and loaded.d_model == D_IN
    cfg = CacheConfig(
        model=(ht, tokenizer), hooks=(HOOK,), context=16, max_tokens=60, out=str(tmp_path), progress=False
    )
    result = cache_activations(cfg)
    store = ActivationStore(result.stores[HOOK])
    acts, ids, pos = next(store.iter_batches(10_000, metadata=True))
    first = int((pos[1:] == 0).nonzero()[0]) + 1  # the first window's rows
    _, cache = ht.run_with_cache(ids[:first][None].long(), names_filter=[HOOK])
    torch.testing.assert_close(acts[:first], cache[HOOK][0], atol=1e-5, rtol=1e-5)
    ht.set_tokenizer(tokenizer)  # a transformer-lens model that carries its tokenizer needs nothing else
    assert load_model(ht).tokenizer is tokenizer


def test_hf_models_with_their_tokenizer(tokenizer):
    import transformers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=30522,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        intermediate_size=64,
        max_position_embeddings=64,
    )
    hf = transformers.LlamaForCausalLM(config).eval()
    loaded = load_model((hf, tokenizer))
    assert loaded.kind == "decoder"
    ids = torch.tensor([[101, 2023, 2003, 1037, 3231, 102]])
    with torch.no_grad():
        hidden = hf(ids, output_hidden_states=True).hidden_states
    _, cache = loaded.model.run_with_cache(ids)
    torch.testing.assert_close(cache["blocks.0.hook_resid_post"], hidden[1], atol=1e-5, rtol=1e-5)
    with pytest.raises(BadInputError, match=r"\(model, tokenizer\)"):
        load_model(hf)
    with pytest.raises(BadInputError, match="cannot use a list as a model"):
        load_model([hf])  # not an AttributeError
    bert_cfg = transformers.BertConfig(
        vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64
    )
    bert = transformers.BertModel(bert_cfg).eval()
    enc = load_model((bert, tokenizer))
    assert enc.kind == "encoder"
    with torch.no_grad():
        hidden = bert(ids, output_hidden_states=True).hidden_states
    _, cache = enc.model.run_with_cache(ids)
    torch.testing.assert_close(cache["blocks.0.hook_normalized_resid_post"], hidden[1], atol=1e-5, rtol=1e-5)


def test_eval_takes_a_model_object_and_a_saelens_object(tmp_path, tokenizer):
    from saegeo.sae.evaluate import EvalConfig, splice_eval_many

    ht = _tiny_hooked_transformer()
    obj = _saelens_topk()
    cfg = EvalConfig(model=(ht, tokenizer), context=16, max_tokens=64, progress=False)
    got = splice_eval_many(cfg, {"sl": obj})["sl"]
    (tmp_path / "sl").mkdir()
    (tmp_path / "sl" / "cfg.json").write_text(json.dumps(obj.cfg.to_dict()))
    save_file({k: v.contiguous() for k, v in obj.state_dict().items()}, tmp_path / "sl" / "sae_weights.safetensors")
    ref = splice_eval_many(cfg, {"sl": str(tmp_path / "sl")})["sl"]
    assert got["ce_loss_spliced"] == pytest.approx(ref["ce_loss_spliced"], rel=1e-9)
    assert got["hook"] == HOOK and got["sae_model_name"] == "tiny"


def test_sweep_takes_a_model_object(tmp_path, tokenizer):
    from saegeo.report.layer_sweep import SweepOptions, sweep_model

    ht = _tiny_hooked_transformer()
    ht.set_tokenizer(tokenizer)
    sweep = sweep_model(
        SweepOptions(model=ht, hooks="all-resid", max_tokens=200, context=16, cache_dir=str(tmp_path), progress=False)
    )
    assert [row["hook"] for row in sweep.layers] == ["blocks.0.hook_resid_pre", HOOK, "blocks.1.hook_resid_post"]
