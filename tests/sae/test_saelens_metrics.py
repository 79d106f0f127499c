"""Eval's SAELens-named numbers against SAELens' own formulas (sae_lens/evals.py: get_recons_loss,
get_downstream_reconstruction_metrics, get_sparsity_and_variance_metrics), computed here in numpy from
unpadded per-window runs of a tiny decoder (transformer-lens run_with_hooks, no saegeo splicing code).

SAELens' definitions, as read from its source:
  mask       positions whose token is not an ignored (special) token; all positions when none are ignored
  CE_v       mean over masked positions t < n−1 of −log p_v(token_{t+1}); the SAE replaces the masked positions
             only, the zero ablation zeroes every position (BOS / special ones included)
  KL_v       mean over masked positions t ≤ n−1 (the last one included) of Σ p_clean (log p_clean − log p_v)
  ce_loss_score = (CE_abl − CE_sae)/(CE_abl − CE_clean);  kl_div_score = (KL_abl − KL_sae)/KL_abl
  over the masked rows x, x̂ = SAE(x), codes a:
  mse = mean ‖x − x̂‖² (eval's `mse_per_row`: saegeo's `mse` is per entry, mse/d);
  explained_variance = 1 − mse/(mean ‖x‖² − ‖mean x‖²);  cossim = mean cos(x, x̂)
  l0 = mean #(a ≠ 0);  l1 = mean Σ|a|;  l2_ratio = mean ‖x̂‖/‖x‖;  relative_reconstruction_bias =
  mean ‖x̂‖² / mean x·x̂
"""

import numpy as np
import pytest
import torch

from saegeo.sae.evaluate import EvalConfig, splice_eval_many
from saegeo.sae.model import SAE, SAEConfig
from tests.splice_helpers import tiny_lm

HOOK = "blocks.0.hook_resid_post"
CONTEXT = 12
CLS, SEP = 101, 102
TEXT = (
    "The quick brown fox jumps over the lazy dog, and a list is a mutable sequence while a tuple is not; "
    "errors are raised when something goes wrong."
)


@pytest.fixture(scope="module")
def tiny():
    return tiny_lm(seed=3)


@pytest.fixture(scope="module")
def sae():
    s = SAE(SAEConfig(d_in=16, d_sae=40, activation="relu"))
    with torch.no_grad():
        s.init_weights(torch.Generator().manual_seed(1), b_dec=torch.linspace(-0.3, 0.3, 16))
        s.b_enc.fill_(-0.05)
    return s.eval()


def log_softmax(z):
    z = z - z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


def brute_force(tiny, sae, windows, ignore):
    """SAELens' metrics over the windows, each run alone (no padding)."""
    model = tiny.model
    ce = {"clean": [], "sae": [], "abl": []}
    kl = {"sae": [], "abl": []}
    xs, xhats, codes = [], [], []
    for ids in windows:
        tokens = torch.tensor([ids])
        keep = np.array([t not in ignore for t in ids])
        got = {}
        with torch.no_grad():
            clean = model(tokens).double().numpy()[0]
            model.run_with_hooks(tokens, fwd_hooks=[(HOOK, lambda a, hook: got.setdefault("x", a.clone()))])
            x = got["x"][0]
            a = sae.encode(x)
            x_hat = sae.decode(a)
            mask = torch.tensor(keep)[:, None]

            def splice(act, hook):
                return torch.where(mask, x_hat[None], act)

            spliced = model.run_with_hooks(tokens, fwd_hooks=[(HOOK, splice)]).double().numpy()[0]
            zero = model.run_with_hooks(tokens, fwd_hooks=[(HOOK, lambda act, hook: torch.zeros_like(act))])
            zero = zero.double().numpy()[0]
        lp = {"clean": log_softmax(clean), "sae": log_softmax(spliced), "abl": log_softmax(zero)}
        n = len(ids)
        for v in ce:
            per = -lp[v][np.arange(n - 1), np.array(ids[1:])]
            ce[v].append(per[keep[:-1]])
        p = np.exp(lp["clean"])
        for v in kl:
            per = (p * (lp["clean"] - lp[v])).sum(-1)
            kl[v].append(per[keep])
        xs.append(x.double().numpy()[keep])
        xhats.append(x_hat.double().numpy()[keep])
        codes.append(a.double().numpy()[keep])
    x, x_hat, a = np.concatenate(xs), np.concatenate(xhats), np.concatenate(codes)
    c = {v: np.concatenate(ce[v]).mean() for v in ce}
    k = {v: np.concatenate(kl[v]).mean() for v in kl}
    mse = ((x - x_hat) ** 2).sum(1).mean()
    norm_in, norm_out = np.linalg.norm(x, axis=1), np.linalg.norm(x_hat, axis=1)
    return {
        "ce_loss_without_sae": c["clean"],
        "ce_loss_with_sae": c["sae"],
        "ce_loss_with_ablation": c["abl"],
        "ce_loss_score": (c["abl"] - c["sae"]) / (c["abl"] - c["clean"]),
        "kl_div_with_sae": k["sae"],
        "kl_div_with_ablation": k["abl"],
        "kl_div_score": (k["abl"] - k["sae"]) / k["abl"],
        "mse_per_row": mse,  # SAELens' `mse`
        "mse": mse / x.shape[1],  # saegeo's: per entry
        "explained_variance": 1 - mse / ((x**2).sum(1).mean() - (x.mean(0) ** 2).sum()),
        "cossim": ((x * x_hat).sum(1) / (norm_in * norm_out)).mean(),
        "l0": (a != 0).sum(1).mean(),
        "l1": np.abs(a).sum(1).mean(),
        "l2_norm_in": norm_in.mean(),
        "l2_norm_out": norm_out.mean(),
        "l2_ratio": (norm_out / np.where(np.abs(norm_in) < 1e-4, 1, norm_in)).mean(),
        "relative_reconstruction_bias": (norm_out**2).mean() / (x * x_hat).sum(1).mean(),
    }


NAMES = (
    "ce_loss_score",
    "ce_loss_with_sae",
    "ce_loss_without_sae",
    "ce_loss_with_ablation",
    "kl_div_score",
    "kl_div_with_sae",
    "kl_div_with_ablation",
    "explained_variance",
    "mse_per_row",
    "cossim",
    "l0",
    "l1",
    "l2_ratio",
    "l2_norm_in",
    "l2_norm_out",
    "relative_reconstruction_bias",
)


@pytest.mark.parametrize("pass_special", [True, False], ids=["special-ignored", "all-positions"])
def test_saelens_named_metrics_equal_their_saelens_formulas(tmp_path, tiny, sae, pass_special):
    (tmp_path / "doc.txt").write_text(TEXT)
    ids = tiny.tokenizer(TEXT, add_special_tokens=False)["input_ids"]
    body = CONTEXT - 2
    windows = [[CLS] + ids[i : i + body] + [SEP] for i in range(0, len(ids), body)]
    assert len(windows[-1]) < CONTEXT  # a short last window: padding is exercised
    cfg = EvalConfig(
        model="tiny",
        hook=HOOK,
        corpus=str(tmp_path / "doc.txt"),
        context=CONTEXT,
        max_tokens=10_000,
        skip_tokens=0,
        batch_windows=2,
        pass_special=pass_special,
        progress=False,
    )
    got = splice_eval_many(cfg, {"s": sae}, tiny)["s"]
    want = brute_force(tiny, sae, windows, ignore={CLS, SEP} if pass_special else set())
    for name in NAMES:
        assert got[name] == pytest.approx(want[name], rel=2e-4, abs=1e-6), name
    # the definitions that differ from saegeo's own are both given, and said which is which
    assert got["explained_variance"] == pytest.approx(got["fve"], rel=1e-9)
    assert got["l0"] == pytest.approx(want["l0"])
    assert got["mse"] == pytest.approx(want["mse"], rel=2e-4)  # saegeo's mse is per entry, as in report.json
    defs = got["sae_lens_definitions"]
    assert set(NAMES) <= set(defs) and "BOS" in defs["ce_loss_with_ablation"]
    if pass_special:  # saegeo's zero ablation keeps the passed positions; SAELens' zeroes them too
        assert got["ce_loss_zero_ablation"] != pytest.approx(got["ce_loss_with_ablation"], rel=1e-3)


def test_saelens_metrics_shared_and_per_window_ablations_agree(tmp_path, tiny, sae, monkeypatch):
    import saegeo.sae.evaluate as splice

    (tmp_path / "doc.txt").write_text(TEXT)
    cfg = EvalConfig(
        model="tiny",
        hook=HOOK,
        corpus=str(tmp_path / "doc.txt"),
        context=CONTEXT,
        max_tokens=10_000,
        skip_tokens=0,
        batch_windows=2,
        pass_special=False,
        progress=False,
    )
    shared = splice_eval_many(cfg, {"s": sae}, tiny)["s"]
    monkeypatch.setattr(splice, "SHARE_ABLATIONS", False)
    per_window = splice_eval_many(cfg, {"s": sae}, tiny)["s"]
    for name in NAMES:
        assert shared[name] == pytest.approx(per_window[name], rel=1e-5, abs=1e-7), name
