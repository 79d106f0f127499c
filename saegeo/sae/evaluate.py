"""The SAE spliced into the model at its hook: CE loss and KL against the clean model and two ablations.

For a decoder LM, per batch of windows (right-padded; causal attention, so padding never reaches a real
position), the prefix up to the hook runs once and the suffix from the hook on once per variant, with the
hook's activation x at every *replaced* position set to

  clean     x                        spliced   x̂ = SAE(x)
  zero      0                        mean      μ_batch (the hook's mean over the batch's replaced positions)

Positions the SAE never saw in training (the special positions such as BOS, and rows above m × the
window's median norm when its store excluded them) are passed through unreplaced in every variant.
Over the N next-token predictions of the windows (targets t ≥ 1, padding excluded):

  CE_v               = −(1/N) Σ log p_v(token_{t+1} | ≤ t)
  ce_loss_recovered  = (CE_zero − CE_spliced) / (CE_zero − CE_clean)      (SAELens' ce_loss_score)
  KL_v               = (1/N) Σ_t Σ_vocab p_clean (log p_clean − log p_v)   (KL(clean ‖ v), nats per token)
  fve                = 1 − Σ‖x − x̂‖² / Σ‖x − x̄‖²  over the replaced rows (x̄ their mean; about the mean,
                       not about 0)
  l0                 = mean number of active latents per replaced row

Beside these, SAELens' names (sae_lens/evals.py: get_recons_loss, get_downstream_reconstruction_metrics,
get_sparsity_and_variance_metrics), by SAELens' definitions. Its mask M is the positions whose token is not
ignored (the passed special positions when pass_special, else every position):
  ce_loss_with_sae / _without_sae / _with_ablation   mean CE over predictions made at positions in M; its
                       ablation zeroes *every* position, BOS included (saegeo's zero ablation keeps the passed
                       positions: for a Llama an all-zero BOS gives near-uniform logits)
  ce_loss_score      = (CE_with_ablation − CE_with_sae) / (CE_with_ablation − CE_without_sae)
  kl_div_with_sae / _with_ablation   mean KL(clean ‖ v) over the positions in M, the last one included
  kl_div_score       = (KL_with_ablation − KL_with_sae) / KL_with_ablation
  over the replaced rows x, x̂, codes a: mse_per_row = mean ‖x − x̂‖² (summed over d; SAELens' `mse`, renamed
  because saegeo's `mse` is per entry, Σ‖x − x̂‖²/(n·d), everywhere); explained_variance =
  1 − mse_per_row / (mean ‖x‖² − ‖mean x‖²) (= fve); cossim = mean cos(x, x̂); l1 = mean Σ|a|; l2_norm_in/out =
  mean ‖x‖, ‖x̂‖; l2_ratio = mean ‖x̂‖/‖x‖; relative_reconstruction_bias = mean ‖x̂‖² / mean x·x̂ (SAELens
  takes this ratio per batch of prompts and averages the batches; here over all rows at once).

For an encoder (MiniLM: no trained LM head) the same splice is measured by the cosine between the clean
and the spliced mean-pooled final-layer sentence embeddings (sentence-transformers' pooling: the mean
over the window's tokens), averaged over windows, with the zero and mean ablations as baselines.

``hook`` efficiency: ``blocks.L.hook_resid_post`` runs blocks ≤ L once and blocks > L per variant
(HookedTransformer's stop_at_layer / start_at_layer); ``blocks.L.hook_resid_pre`` likewise from block
L; any other per-token hook of block L runs blocks < L once and blocks ≥ L per variant, with a hook that
replaces the activation.

The ablations of a decoder's residual stream need one window, not a batch: when every window passes
through the same leading positions (BOS: position 0 sees only itself, so its activation is the same in
every window) and replaces all the others, zero and mean ablation hand every window the same hook
activation [a_BOS, c, c, …], and by causality window i's output is the first n_i positions of that one
sequence's output. So the mean ablation's suffix runs for one window per batch and the zero ablation's
once per evaluation (`_common_passed_prefix`; anything else, e.g. a norm rule that passes rows mid-window
or an mlp_out hook, takes the per-window path). The SAE's own splice always runs per window.

What does not depend on the SAE (each batch's prefix output, the hook's replaced rows, the clean reference and
the clean / zero / mean scores) is kept after an evaluation (KEEP_BYTES) and reused by the next one on the same
live model with unchanged weights (each parameter's version counter), the same resolved hook, text and batching,
batch by batch where the token ids are equal: a second SAE then costs its spliced suffixes only.
"""

from __future__ import annotations

import json
import time
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from jaxtyping import Bool, Float, Int
from torch import Tensor

from saegeo.activations.cache import BLOCK_HOOK, NOT_PER_TOKEN
from saegeo.activations.corpus import CorpusSpec, iter_windows, open_corpus
from saegeo.activations.models import LoadedModel, bundled_alias, load_model, model_key
from saegeo.activations.runner import pad_windows, window_batches
from saegeo.distributed import resolve_device
from saegeo.errors import BadInputError
from saegeo.progress import progress_bar
from saegeo.sae.model import SAE
from saegeo.sae.options import EvalConfig

VARIANTS = ("clean", "spliced", "zero", "mean", "zero_all")  # zero_all: SAELens' ablation (every position, decoders)
SHARE_ABLATIONS = True  # False: every window runs its own zero/mean-ablated suffix (the tests compare both)
# The clean pass of an evaluation (each batch's prefix output, hook activations, clean reference and the scores of
# clean, zero and mean) is kept in memory, for the last (model, hook, tokens) evaluated, while it fits in this
# many bytes: a later evaluation of another SAE on the same model, hook and tokens runs only its spliced suffixes
# (benchmarks/eval_bench.py). 0 keeps nothing. SmolLM2 holds ~0.2 GB per 1,000 tokens (the clean probabilities).
KEEP_BYTES = 2 * 2**30
_KEPT: dict[str, Any] = {}  # {"key": ..., "batches": [_CleanBatch, ...]}: one evaluation's clean passes
ENCODER_MEASURE = (
    "cosine between the clean and the spliced mean-pooled final-layer sentence embeddings "
    "(the encoder has no trained LM head, so no CE loss or KL is measured)"
)


@dataclass
class _Sums:
    """float64 running sums over a whole evaluation."""

    n_pred: int = 0
    n_windows: int = 0
    n_tokens: int = 0
    n_replaced: int = 0
    n_passed: int = 0
    sse: float = 0.0
    sum_sq: float = 0.0
    l0: float = 0.0
    sum_x: Tensor | None = None
    # SAELens' names: prediction / KL position counts under its mask, and sums over the replaced rows
    n_sl_pred: int = 0
    n_sl_kl: int = 0
    l1: float = 0.0
    cossim: float = 0.0
    norm_in: float = 0.0
    norm_out: float = 0.0
    l2_ratio: float = 0.0
    recon_sq: float = 0.0
    x_dot_recon: float = 0.0

    def __post_init__(self) -> None:
        self.ce = {v: 0.0 for v in VARIANTS}
        self.kl = {v: 0.0 for v in VARIANTS}
        self.cos = {v: 0.0 for v in VARIANTS}
        self.sl_ce = {v: 0.0 for v in VARIANTS}  # under SAELens' mask
        self.sl_kl = {v: 0.0 for v in VARIANTS}


def _sae_training_data(sae: SAE) -> dict[str, Any]:
    """The saegeo provenance of the SAE's training data (store identity), {} for published SAEs."""
    src = sae.format_info.source
    if not src or not (Path(src) / "cfg.json").is_file():
        return {}
    try:
        raw = json.loads((Path(src) / "cfg.json").read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    meta = raw.get("metadata") or {}
    data = dict((raw.get("saegeo") or {}).get("data") or {})
    if "exclude_special_tokens" in meta and "corpus" not in data:  # a SAELens config
        data["corpus"] = {"exclude_special": bool(meta["exclude_special_tokens"]), "context": meta.get("context_size")}
    return data


def _resolve(cfg: EvalConfig, sae: SAE, loaded: LoadedModel) -> dict[str, Any]:
    """Hook, context, held-out offset and pass-through rules, from cfg or else the SAE's metadata."""
    data = _sae_training_data(sae)
    corpus = data.get("corpus") or {}
    hook = cfg.hook or sae.format_info.hook_name
    if not hook:
        raise BadInputError(f"SAE {sae.format_info.source or '(in memory)'}: its files name no hook; pass --hook NAME")
    if hook not in loaded.model.hook_dict:
        close = [n for n in loaded.model.hook_dict if n.split(".")[-1] == hook.split(".")[-1]][:4]
        raise BadInputError(
            f"hook {hook!r} (from {'--hook' if cfg.hook else 'the SAE metadata'}) does not exist in "
            f"{loaded.name}; e.g. {', '.join(close) or list(loaded.model.hook_dict)[:4]}; pass --hook NAME"
        )
    if hook.endswith(NOT_PER_TOKEN) or not BLOCK_HOOK.match(hook):
        raise BadInputError(f"hook {hook!r}: saegeo eval splices per-token hooks inside a block (blocks.L.…)")
    context = cfg.context or corpus.get("context") or 128
    pass_special = cfg.pass_special
    if pass_special is None:
        pass_special = bool(corpus["exclude_special"]) if "exclude_special" in corpus else loaded.kind == "decoder"
    ratio = cfg.pass_norm_ratio if cfg.pass_norm_ratio is not None else corpus.get("exclude_norm_ratio")
    skip = cfg.skip_tokens
    if skip is None:
        same = str(corpus.get("source", "")).split(" ")[0] == cfg.corpus
        skip = (
            int(data.get("n_positions_read") or data.get("n_tokens") or 0)
            if same and data.get("model") == loaded.name
            else 0
        )
    return {
        "hook": hook,
        "layer": int(BLOCK_HOOK.match(hook).group(1)),
        "context": int(context),
        "pass_special": pass_special,
        "pass_norm_ratio": ratio,
        "skip_tokens": skip,
    }


def _hook_width(loaded: LoadedModel, hook: str) -> int:
    from saegeo.activations.cache import hook_layer
    from saegeo.activations.runner import hook_widths

    return hook_widths(loaded, (hook,), hook_layer(hook), 0)[hook]


def _reconstruct(sae: SAE, x: Float[Tensor, "n d"]) -> tuple[Float[Tensor, "n d"], Tensor, Tensor]:
    """(x̂, Σ active latents, Σ|codes|) with the SAE's own encode/decode (sparse decode for TopK)."""
    _, state = sae.normalize_input(x)
    if sae.architecture.topk_codes:
        values, idx = sae.encode_topk(x)
        return sae.decode_sparse(values, idx, state), (values != 0).sum(), values.double().abs().sum()
    codes = sae.encode(x)
    return sae.decode(codes, state), (codes != 0).sum(), codes.double().abs().sum()


class _Splicer:
    """One model + SAE + hook: the prefix once, the suffix per variant (see the module docstring)."""

    def __init__(self, loaded: LoadedModel, sae: SAE, hook: str, layer: int):
        self.loaded, self.sae, self.hook, self.layer = loaded, sae, hook, layer
        model = loaded.model
        self.mode = {f"blocks.{layer}.hook_resid_post": "post", f"blocks.{layer}.hook_resid_pre": "pre"}.get(
            hook, "hook"
        )
        if loaded.kind == "encoder":  # post-LN BERT: resid_post is not the block output
            self.mode = "pre" if self.mode == "pre" else "hook"
        self.start = layer + 1 if self.mode == "post" else layer
        # a residual-stream hook set to one vector at the replaced positions fixes everything downstream of
        # it, so windows whose passed positions agree share their zero/mean-ablated output (decoders only:
        # an encoder's passed [CLS]/[SEP] see the whole window)
        self.shares_ablations = (
            SHARE_ABLATIONS
            and loaded.kind == "decoder"
            and hook.rsplit(".", 1)[-1] in ("hook_resid_pre", "hook_resid_mid", "hook_resid_post")
        )
        self.model = model

    # -- prefix / suffix
    def prefix(self, tokens: Int[Tensor, "b p"], additive: Tensor | None) -> Tensor:
        if self.loaded.kind == "decoder":
            return self.model(tokens, stop_at_layer=self.start)
        resid = self.model.hook_full_embed(self.model.embed(tokens, None))
        for block in self.model.blocks[: self.start]:
            resid = block(resid, additive)
        return resid

    def suffix(self, resid: Tensor, additive: Tensor | None, fn: Callable[[Tensor], Tensor] | None) -> Tensor:
        """Logits (decoder) or the final block's output (encoder), with the hook's activation set by fn."""
        hooks = []
        if fn is not None and self.mode == "hook":

            def patch(act: Tensor, hook: Any) -> Tensor:
                return fn(act.reshape(act.shape[0], act.shape[1], -1)).reshape(act.shape)

            hooks = [(self.hook, patch)]
        elif fn is not None:
            resid = fn(resid)
        with self.model.hooks(fwd_hooks=hooks):
            if self.loaded.kind == "decoder":
                return self.model(resid, start_at_layer=self.start)
            for block in self.model.blocks[self.start :]:
                resid = block(resid, additive)
            return resid

    def capture(self, resid: Tensor, additive: Tensor | None) -> tuple[Tensor, Tensor]:
        """Clean output and the hook's clean activation (b, p, d)."""
        got: list[Tensor] = []

        def keep(act: Tensor) -> Tensor:
            got.append(act)
            return act

        out = self.suffix(resid, additive, keep if self.mode == "hook" else None)
        return out, (got[0] if got else resid)


def _pass_mask(acts: Tensor, store: Bool[Tensor, "b p"], attend: Bool[Tensor, "b p"], ratio: float | None) -> Tensor:
    """Positions replaced by the SAE: stored-kind positions, minus rows above ratio × window median norm."""
    replace = store & attend
    if ratio is not None:
        norms = acts.float().norm(dim=-1)
        for i in range(acts.shape[0]):
            cand = norms[i][replace[i]]
            if cand.numel():
                replace[i] &= ~(norms[i] > ratio * cand.median())
    return replace


def splice_eval(cfg: EvalConfig, loaded: Any = None, sae: Any = None) -> dict[str, Any]:
    """Evaluate cfg.sae spliced into cfg.model at its hook; the JSON-ready result (see module docstring)."""
    sae = SAE.load(sae if sae is not None else cfg.sae)
    return splice_eval_many(cfg, {cfg.sae or "sae": sae}, loaded)[cfg.sae or "sae"]


def splice_eval_many(cfg: EvalConfig, saes: Mapping[str, Any], loaded: Any = None) -> dict[str, dict[str, Any]]:
    """Several SAEs on the same tokens: SAEs that share a hook and pass-through rules share the prefix and
    the clean, zero and mean suffixes of every batch; each adds only its spliced suffix. Each SAE is anything
    `SAE.load` takes; the model is `loaded`, else cfg.model (anything `load_model` takes: a name,
    a directory, a transformer-lens model or an HF model with its tokenizer as (model, tokenizer))."""
    if cfg.max_tokens < 2:
        raise BadInputError(f"max_tokens must be at least 2, got {cfg.max_tokens}")
    device = resolve_device(cfg.device)  # before loading anything: a bad device fails fast
    open_corpus(CorpusSpec(source=cfg.corpus, text_field=cfg.text_field))  # ... and so does a bad corpus
    saes = {name: SAE.load(s) for name, s in saes.items()}  # paths, ids and peer objects: the one conversion
    model = loaded if loaded is not None else cfg.model if cfg.model is not None else _model_of(saes)
    loaded = load_model(model, dtype=getattr(torch, cfg.model_dtype))
    groups: dict[str, list[str]] = {}
    resolved = {}
    for name, sae in saes.items():
        r = _resolve(cfg, sae, loaded)
        width = _hook_width(loaded, r["hook"])
        if width != sae.cfg.d_in:
            raise BadInputError(
                f"SAE {name} ({sae.format_info.source}) has d_in={sae.cfg.d_in} but hook {r['hook']!r} of {loaded.name} "
                f"has width {width}; pick the SAE's hook (--hook) or an SAE trained on this hook"
            )
        if r["context"] > loaded.n_ctx:
            raise BadInputError(
                f"context {r['context']} exceeds the model's n_ctx={loaded.n_ctx}; pass a smaller --context"
            )
        resolved[name] = r
        groups.setdefault(json.dumps(r, sort_keys=True), []).append(name)
    loaded.to(device)
    homes = {name: sae.W_dec.device for name, sae in saes.items()}  # the caller's objects go back where they were
    out = {}
    try:
        for key, names in groups.items():
            out.update(_evaluate(cfg, loaded, {n: saes[n].eval().to(device) for n in names}, json.loads(key)))
    finally:
        for name, sae in saes.items():
            sae.to(homes[name])
    return {name: out[name] for name in saes}


def _model_of(saes: Mapping[str, Any]) -> str:
    """The model the SAEs' metadata names (its bundled alias when it is one: minilm, smollm2), when no --model was
    given; refused in one line, before any model is loaded, when they name none or disagree."""
    names = {name: sae.format_info.model_name for name, sae in saes.items()}
    keys = {model_key(n) for n in names.values()}
    if None in keys or not keys:
        unnamed = ", ".join(n for n, m in names.items() if model_key(m) is None)
        raise BadInputError(
            f"saegeo eval: no --model given and the metadata of {unnamed} names no model; pass --model "
            "(minilm, smollm2, a local HF directory or a cached hub name)"
        )
    if len(keys) > 1:
        raise BadInputError(f"saegeo eval: no --model given and the SAEs name different models ({names}); pass --model")
    name = next(iter(names.values()))
    return bundled_alias(name) or name


def _evaluate(
    cfg: EvalConfig, loaded: LoadedModel, saes: dict[str, SAE], r: dict[str, Any]
) -> dict[str, dict[str, Any]]:
    t0 = time.perf_counter()
    hook, layer = r["hook"], r["layer"]
    width = next(iter(saes.values())).cfg.d_in
    splicers = {n: _Splicer(loaded, sae, hook, layer) for n, sae in saes.items()}
    spec = CorpusSpec(
        source=cfg.corpus, context=r["context"], exclude_special=r["pass_special"], text_field=cfg.text_field
    )
    tok = loaded.tokenizer
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else 0
    sums = {n: _Sums(sum_x=torch.zeros(width, dtype=torch.float64)) for n in saes}
    ablation_cache: dict[str, Any] = {}  # the zero-ablated logits of one window, shared by every batch

    def windows():
        skipped, used = 0, 0
        for w in iter_windows(spec, tok, loaded.kind):
            if skipped < r["skip_tokens"]:
                skipped += w.n_stored
                continue
            if used >= cfg.max_tokens:
                return
            used += len(w.input_ids)
            yield w

    bar = None
    if cfg.progress:
        bar = progress_bar(total=cfg.max_tokens, unit="tok", unit_scale=True, desc="eval", smoothing=0.1)
    sp = next(iter(splicers.values()))
    device = next(sp.model.parameters()).device
    key = _keep_key(cfg, loaded, r, sp.shares_ablations)
    same = _KEPT.get("key") == key and _KEPT["model"]() is loaded.model  # a live model, not a reused id
    kept = _KEPT["batches"] if same else []
    _KEPT.clear()  # one evaluation's clean passes at a time
    batches: list[_CleanBatch] | None = []
    kept_bytes = 0
    with torch.inference_mode():
        for i, batch in enumerate(window_batches(windows(), cfg.batch_windows)):
            tokens, attend, store = (t.to(device) for t in pad_windows(batch, pad_id))
            clean = kept[i] if i < len(kept) and kept[i].matches(tokens, attend) else None
            if clean is None:
                clean = _clean_batch(sp, tokens, attend, store, r["pass_norm_ratio"], ablation_cache)
            _score_saes(splicers, clean, sums)
            if batches is not None:
                kept_bytes += clean.nbytes()
                if kept_bytes <= KEEP_BYTES:
                    batches.append(clean)
                else:  # too large to keep: the next evaluation recomputes its clean passes
                    batches = None
            if bar is not None:
                bar.update(sum(len(w.input_ids) for w in batch))
    if batches:
        _KEPT.update(key=key, model=weakref.ref(loaded.model), batches=batches)
    if bar is not None:
        bar.close()
    seconds = time.perf_counter() - t0
    return {n: _result(cfg, loaded, saes[n], n, r, s, seconds) for n, s in sums.items()}


def _keep_key(cfg: EvalConfig, loaded: LoadedModel, r: dict[str, Any], shares_ablations: bool) -> str:
    """What the clean passes depend on: the model object and the version of each of its weights (an in-place
    change bumps it), the device and dtype, the text (corpus, field, the resolved hook, context, skip and pass
    rules) and how many tokens in which batches."""
    weights = sum(p._version for p in loaded.model.parameters())
    return json.dumps(
        [
            id(loaded.model),
            weights,
            str(next(loaded.model.parameters()).device),
            str(loaded.model.cfg.dtype),
            cfg.corpus,
            cfg.text_field,
            cfg.max_tokens,
            cfg.batch_windows,
            shares_ablations,
            r,
        ],
        sort_keys=True,
        default=str,
    )


def _result(
    cfg: EvalConfig, loaded: LoadedModel, sae: SAE, name: str, r: dict[str, Any], s: _Sums, seconds: float
) -> dict[str, Any]:
    if s.n_windows == 0:
        raise BadInputError(
            f"corpus {cfg.corpus!r} has no windows left after skipping {r['skip_tokens']} tokens; "
            "pass --skip-tokens 0 or a larger corpus"
        )
    mean = s.sum_x / max(s.n_replaced, 1)
    total_var = s.sum_sq - s.n_replaced * float(mean @ mean)
    out: dict[str, Any] = {}
    if loaded.kind == "decoder":
        ce = {v: s.ce[v] / s.n_pred for v in VARIANTS}
        out.update(
            {
                "ce_loss_clean": ce["clean"],
                "ce_loss_spliced": ce["spliced"],
                "ce_loss_zero_ablation": ce["zero"],
                "ce_loss_mean_ablation": ce["mean"],
                "ce_loss_recovered": (ce["zero"] - ce["spliced"]) / (ce["zero"] - ce["clean"]),
                "kl_div_spliced": s.kl["spliced"] / s.n_pred,
                "kl_div_zero_ablation": s.kl["zero"] / s.n_pred,
                "kl_div_mean_ablation": s.kl["mean"] / s.n_pred,
            }
        )
        out.update(_saelens_downstream(s))
    else:
        out.update(
            {
                "measured": ENCODER_MEASURE,
                "embedding_cosine_spliced": s.cos["spliced"] / s.n_windows,
                "embedding_cosine_zero_ablation": s.cos["zero"] / s.n_windows,
                "embedding_cosine_mean_ablation": s.cos["mean"] / s.n_windows,
            }
        )
    tok = loaded.tokenizer
    n = max(s.n_replaced, 1)
    out.update(
        {
            "fve": 1.0 - s.sse / total_var if total_var > 0 else float("nan"),
            "l0": s.l0 / n,
            # saegeo's mse (per entry, as in report.json and training), then SAELens' per row under its own name
            "mse": s.sse / (n * int(mean.shape[0])),
            # SAELens' reconstruction names (get_sparsity_and_variance_metrics); l0 is the same number as above;
            # SAELens' `mse` (summed over d, per row) is `mse_per_row` here: `mse` means one thing in saegeo
            "explained_variance": 1.0 - s.sse / total_var if total_var > 0 else float("nan"),
            "mse_per_row": s.sse / n,
            "cossim": s.cossim / n,
            "l1": s.l1 / n,
            "l2_norm_in": s.norm_in / n,
            "l2_norm_out": s.norm_out / n,
            "l2_ratio": s.l2_ratio / n,
            "relative_reconstruction_bias": s.recon_sq / s.x_dot_recon if s.x_dot_recon else float("nan"),
            "sae_lens_definitions": _saelens_definitions(loaded.kind),
            "tokens": s.n_pred if loaded.kind == "decoder" else s.n_tokens,
            "tokens_replaced": s.n_replaced,
            "passed_through": {
                "positions": s.n_passed,
                "special_positions": _special_names(tok, loaded.kind) if r["pass_special"] else [],
                "norm_rule": None
                if r["pass_norm_ratio"] is None
                else f"‖x‖ > {r['pass_norm_ratio']:g} × the window's median ‖x‖",
                "why": "positions excluded from the SAE's training keep the model's own activation in every variant",
            },
            "mean_ablation": "the hook's mean over each batch's replaced positions",
            "zero_ablation": "the replaced positions set to 0, passed-through positions kept (SAELens' get_recons_loss "
            "zeroes every position, BOS included: for a Llama that is uniform logits, CE = log vocab)",
            "model": loaded.name,
            "sae": name,
            "sae_source": sae.format_info.source,
            "hook": r["hook"],
            "sae_model_name": sae.format_info.model_name,
            "corpus": cfg.corpus,
            "context": r["context"],
            "windows": s.n_windows,
            "skipped_tokens": r["skip_tokens"],
            "seconds": seconds,
            "tokens_per_second": s.n_tokens / seconds if seconds > 0 else float("nan"),
        }
    )
    return out


def _saelens_downstream(s: _Sums) -> dict[str, float]:
    """SAELens' CE and KL names (get_recons_loss), from the sums under its mask."""
    ce = {v: s.sl_ce[v] / max(s.n_sl_pred, 1) for v in ("clean", "spliced", "zero_all")}
    kl = {v: s.sl_kl[v] / max(s.n_sl_kl, 1) for v in ("spliced", "zero_all")}
    ce_gap, kl_abl = ce["zero_all"] - ce["clean"], kl["zero_all"]
    return {
        "ce_loss_score": (ce["zero_all"] - ce["spliced"]) / ce_gap if ce_gap else float("nan"),
        "ce_loss_with_sae": ce["spliced"],
        "ce_loss_without_sae": ce["clean"],
        "ce_loss_with_ablation": ce["zero_all"],
        "kl_div_score": (kl_abl - kl["spliced"]) / kl_abl if kl_abl else float("nan"),
        "kl_div_with_sae": kl["spliced"],
        "kl_div_with_ablation": kl_abl,
    }


SAELENS_MASK = (
    "positions whose token is not a passed special token (SAELens' ignore_tokens; every position when "
    "nothing is passed)"
)


def _saelens_definitions(kind: str) -> dict[str, str]:
    """What each SAELens-named number is, and how it differs from saegeo's own (in the eval JSON)."""
    rows = "the replaced rows (what the SAE reconstructs; SAELens: the rows at " + SAELENS_MASK + ")"
    defs = {
        "explained_variance": f"1 − mse / (mean ‖x‖² − ‖mean x‖²) over {rows}; the same number as saegeo's fve",
        "mse_per_row": f"SAELens' `mse`: mean over {rows} of ‖x − x̂‖² summed over d (saegeo's mse = mse_per_row / d, "
        "per entry, as in report.json and the training log)",
        "cossim": f"mean cos(x, x̂) over {rows}",
        "l0": f"mean number of nonzero codes per row over {rows} (saegeo's l0 is the same number)",
        "l1": f"mean Σ|a| of the SAE's codes per row over {rows}",
        "l2_norm_in": f"mean ‖x‖ over {rows}",
        "l2_norm_out": f"mean ‖x̂‖ over {rows}",
        "l2_ratio": f"mean ‖x̂‖/‖x‖ over {rows} (‖x‖ < 1e-4 counted as 1)",
        "relative_reconstruction_bias": f"mean ‖x̂‖² / mean x·x̂ over {rows} (SAELens averages this ratio over "
        "its batches of prompts; here one ratio over all rows)",
    }
    if kind != "decoder":
        return defs
    return {
        "ce_loss_without_sae": f"mean CE of the clean model over next-token predictions made at {SAELENS_MASK}",
        "ce_loss_with_sae": "as ce_loss_without_sae, with the SAE's x̂ at the replaced positions (= SAELens' "
        "replacement; saegeo's ce_loss_spliced averages over every prediction instead)",
        "ce_loss_with_ablation": "as ce_loss_without_sae, with the hook set to 0 at every position, BOS and the "
        "other passed positions included (SAELens' zero ablation); saegeo's "
        "ce_loss_zero_ablation keeps the passed positions",
        "ce_loss_score": "(ce_loss_with_ablation − ce_loss_with_sae) / (ce_loss_with_ablation − ce_loss_without_sae); "
        "saegeo's ce_loss_recovered is the same ratio with its own zero ablation and positions",
        "kl_div_with_sae": f"mean KL(clean ‖ spliced) over {SAELENS_MASK}, the last position of each window "
        "included (saegeo's kl_div_spliced: over the positions that predict a next token)",
        "kl_div_with_ablation": "as kl_div_with_sae, against SAELens' zero ablation (every position zeroed)",
        "kl_div_score": "(kl_div_with_ablation − kl_div_with_sae) / kl_div_with_ablation",
        **defs,
    }


def _special_names(tok: Any, kind: str) -> list[str]:
    from saegeo.activations.corpus import special_template

    prefix, suffix = special_template(tok, kind)
    return [tok.convert_ids_to_tokens(i) for i in prefix + suffix]


def _setter(replace: Bool[Tensor, "b p"], value: Float[Tensor, "n d"]) -> Callable[[Tensor], Tensor]:
    """The hook function that sets the activation's replaced positions to value (rows in order)."""

    def fn(a: Tensor) -> Tensor:
        shape = a.shape
        a = a.reshape(shape[0], shape[1], -1).clone()
        a[replace] = value
        return a.reshape(shape)

    return fn


def _common_passed_prefix(
    acts: Float[Tensor, "b p d"], replace: Bool[Tensor, "b p"], attend: Bool[Tensor, "b p"]
) -> int | None:
    """k when every window replaces exactly its positions ≥ k and passes through the same activations at
    positions < k (a decoder's BOS: position 0 sees only itself); else None.

    Then a zero or mean ablation hands every window the same hook activation [a_0 … a_{k−1}, c, c, …], and, the
    attention being causal, window i's ablated output is the first n_i positions of one sequence's output.
    """
    k = int((~replace[0]).long().cumprod(0).sum())
    expected = (torch.arange(replace.shape[1], device=replace.device) >= k)[None] & attend
    if not torch.equal(replace, expected):
        return None
    if k and not _same_rows(acts[:, :k], acts[:1, :k]):
        return None
    return k


def _same_rows(a: Tensor, b: Tensor) -> bool:
    """a equals b (broadcast) to float32 rounding of b's scale."""
    if not b.numel():
        return a.shape == b.shape
    return bool(torch.allclose(a, b.expand_as(a), rtol=1e-5, atol=1e-5 * max(float(b.abs().max()), 1.0)))


@dataclass
class _CleanBatch:
    """What a batch's variants share: the prefix's output, the hook's replaced rows and their rule, the clean
    reference and the scores of the clean, zero and mean (and SAELens' zero) passes. Kept between evaluations
    (KEEP_BYTES) and reused only for the same token ids (``matches``)."""

    tokens: Tensor
    attend: Tensor
    additive: Tensor | None
    resid: Tensor
    flat_dtype: torch.dtype
    replace: Tensor
    x: Tensor
    ref: _Reference
    shared: dict[str, tuple[float, float, float, float, float]]

    def matches(self, tokens: Tensor, attend: Tensor) -> bool:
        return (
            self.tokens.shape == tokens.shape and torch.equal(self.tokens, tokens) and torch.equal(self.attend, attend)
        )

    def nbytes(self) -> int:
        tensors = [self.tokens, self.attend, self.resid, self.replace, self.x, *vars(self.ref).values()]
        return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, Tensor))


def _clean_batch(
    sp: _Splicer, tokens: Tensor, attend: Tensor, store: Tensor, ratio: float | None, ablation_cache: dict[str, Any]
) -> _CleanBatch:
    """One batch's prefix once, clean suffix once, zero and mean suffixes once (for one window when
    `_common_passed_prefix` allows), SAELens' zero ablation once per evaluation."""
    additive = None
    if sp.loaded.kind == "encoder" and not bool(attend.all()):
        additive = torch.where(attend[:, None, None, :], 0.0, -torch.inf).to(sp.model.cfg.dtype)
    resid = sp.prefix(tokens, additive)
    clean_out, act = sp.capture(resid, additive)
    flat = act.reshape(act.shape[0], act.shape[1], -1)
    replace = _pass_mask(flat, store, attend, ratio)
    x = flat[replace]
    mu = x.mean(0) if x.shape[0] else torch.zeros_like(flat[0, 0])

    ref = _Reference(sp.loaded.kind, clean_out, tokens, attend, store & attend)
    shared = {"clean": ref.score_clean()}
    if sp.loaded.kind == "decoder":  # SAELens' zero ablation: every position 0, so one sequence serves all windows
        shared["zero_all"] = ref.score(_zero_all_output(sp, resid, additive, attend, ablation_cache))
    k = _common_passed_prefix(flat, replace, attend) if sp.shares_ablations else None
    if k is None:  # the general path: each window's own ablated suffix
        shared["zero"] = ref.score(sp.suffix(resid, additive, _setter(replace, torch.zeros_like(x))))
        shared["mean"] = ref.score(sp.suffix(resid, additive, _setter(replace, mu.expand_as(x))))
    else:  # one representative window (the longest) stands for all; the zero one for the whole evaluation
        j = int(attend.sum(1).argmax())
        rep_resid, rep_replace = resid[j : j + 1], replace[j : j + 1]
        n_rep, width = int(rep_replace.sum()), tokens.shape[1]
        passed = flat[j, :k].clone()
        cached = ablation_cache.get("zero")  # (passed rows, logits): valid for any batch with the same passed rows
        if (
            cached is None
            or cached[0].shape != passed.shape
            or cached[1].shape[1] < width
            or not _same_rows(passed, cached[0])
        ):
            cached = (
                passed,
                sp.suffix(rep_resid, additive, _setter(rep_replace, flat.new_zeros(n_rep, flat.shape[-1]))),
            )
            ablation_cache["zero"] = cached
        mean_out = sp.suffix(rep_resid, additive, _setter(rep_replace, mu.expand(n_rep, -1)))
        shared["zero"] = ref.score(cached[1][:, :width].expand(tokens.shape[0], -1, -1))
        shared["mean"] = ref.score(mean_out.expand(tokens.shape[0], -1, -1))
    return _CleanBatch(tokens, attend, additive, resid, flat.dtype, replace, x, ref, shared)


def _score_saes(splicers: dict[str, _Splicer], c: _CleanBatch, sums: dict[str, _Sums]) -> None:
    """Each SAE's spliced suffix on a batch, scored against its clean pass, added to that SAE's sums."""
    sp = next(iter(splicers.values()))
    x, replace, attend, ref = c.x, c.replace, c.attend, c.ref
    x64 = x.double()
    for name, s in sums.items():
        x_hat, active, l1 = _reconstruct(splicers[name].sae, x.to(splicers[name].sae.W_dec.dtype))  # --model-dtype
        spliced = sp.suffix(c.resid, c.additive, _setter(replace, x_hat.to(c.flat_dtype)))
        scores = {**c.shared, "spliced": ref.score(spliced)}
        for v, (ce, kl, cos, sl_ce, sl_kl) in scores.items():
            s.ce[v] += ce
            s.kl[v] += kl
            s.cos[v] += cos
            s.sl_ce[v] += sl_ce
            s.sl_kl[v] += sl_kl
        s.sse += float(((x64 - x_hat.double()) ** 2).sum())
        _add_reconstruction_sums(s, x64, x_hat.double(), l1)
        s.n_sl_pred += ref.n_sl_pred
        s.n_sl_kl += ref.n_sl_kl
        s.sum_sq += float((x64 * x64).sum())
        s.sum_x += x64.sum(0).cpu()
        s.l0 += float(active)
        s.n_replaced += int(replace.sum())
        s.n_passed += int((attend & ~replace).sum())
        s.n_tokens += int(attend.sum())
        s.n_windows += attend.shape[0]
        s.n_pred += ref.n_pred


def _zero_all_output(
    sp: _Splicer, resid: Tensor, additive: Tensor | None, attend: Tensor, cache: dict[str, Any]
) -> Tensor:
    """The model's output with the hook 0 at every position (SAELens' zero ablation). At a decoder's residual
    hook that output depends on the positions only, not on the tokens: one window of the batch's width stands
    for all, computed once per evaluation (again only for a wider batch)."""

    def zero(a: Tensor) -> Tensor:
        return torch.zeros_like(a)

    if not sp.shares_ablations:
        return sp.suffix(resid, additive, zero)
    width = resid.shape[1]
    cached = cache.get("zero_all")
    if cached is None or cached.shape[1] < width:
        j = int(attend.sum(1).argmax())
        cached = cache["zero_all"] = sp.suffix(resid[j : j + 1], additive, zero)
    return cached[:, :width]


def _add_reconstruction_sums(s: _Sums, x: Float[Tensor, "n d"], x_hat: Float[Tensor, "n d"], l1: Tensor) -> None:
    """float64 row sums for SAELens' reconstruction names (see the module docstring)."""
    norm_in, norm_out = x.norm(dim=1), x_hat.norm(dim=1)
    dot = (x * x_hat).sum(1)
    s.l1 += float(l1)
    s.cossim += float((dot / (norm_in * norm_out)).sum())  # 0/0 = nan for a zero row, as SAELens' formula gives
    s.norm_in += float(norm_in.sum())
    s.norm_out += float(norm_out.sum())
    s.l2_ratio += float((norm_out / torch.where(norm_in.abs() < 1e-4, torch.ones_like(norm_in), norm_in)).sum())
    s.recon_sq += float(norm_out.square().sum())
    s.x_dot_recon += float(dot.sum())


class _Reference:
    """The clean pass of one batch, against which each variant's output is scored (batch sums).

    Decoder, over the n valid predictions (logits z at t, target token_{t+1}), with lse = logsumexp:
      CE_v  = Σ_t lse(z_v) − z_v[target]
      KL_v  = Σ_t Σ_V p_c (log p_c − log p_v) = Σ_t [ Σ_V p_c log p_c − Σ_V p_c z_v + lse(z_v) Σ_V p_c ]
    Σ p_c log p_c and Σ p_c are computed once per batch, so a variant costs one logsumexp and one product with
    p_c; everything stays in the padded (b, p − 1, V) layout, masked at the end, and a variant given as one
    window (1, p, V) (a shared ablation) broadcasts against every window's p_c. The sums over V are torch's
    pairwise sums (a float32 matmul there loses ~1e-5 relative, visible as KL ≈ 1e-3).
    Encoder: Σ over windows of cos(mean-pooled clean output, mean-pooled v output).
    SAELens' sums use its mask `keep` (the positions whose token is not a passed special one): CE over the
    predictions made at kept positions, KL over the kept positions including each window's last, whose
    distribution (column p − 1) is taken separately.
    """

    def __init__(
        self,
        kind: str,
        clean: Tensor,
        tokens: Int[Tensor, "b p"],
        attend: Bool[Tensor, "b p"],
        keep: Bool[Tensor, "b p"],
    ):
        self.kind = kind
        self.n_sl_pred = self.n_sl_kl = 0
        if kind == "decoder":
            self.valid = attend[:, 1:]
            self.target = tokens[:, 1:, None]  # padded targets are masked by valid
            self.n_pred = int(self.valid.sum())
            logp = F.log_softmax(clean[:, :-1].float(), dim=-1)
            self.p = logp.exp()
            self.p_sum = self.p.sum(-1)
            self.neg_entropy = (self.p * logp).sum(-1)
            self.clean_ce = -float(logp.gather(-1, self.target)[..., 0][self.valid].double().sum())
            per_token = -logp.gather(-1, self.target)[..., 0]
            self.sl_pred = self.valid & keep[:, :-1]
            self.sl_kl, self.sl_last = keep[:, :-1], keep[:, -1]
            self.n_sl_pred, self.n_sl_kl = int(self.sl_pred.sum()), int(keep.sum())
            self.sl_clean_ce = float(per_token[self.sl_pred].double().sum())
            logp_last = F.log_softmax(clean[:, -1].float(), dim=-1)
            self.p_last = logp_last.exp()
            self.p_last_sum = self.p_last.sum(-1)
            self.neg_entropy_last = (self.p_last * logp_last).sum(-1)
        else:
            self.mask = attend[..., None].to(clean.dtype)
            self.n_pred = 0
            self.pooled = self.pool(clean)

    def pool(self, out: Tensor) -> Tensor:
        return (out * self.mask).sum(1) / self.mask.sum(1)

    def score_clean(self) -> tuple[float, float, float, float, float]:
        """(Σ CE, 0, 1 per window, Σ CE and 0 under SAELens' mask) of the clean pass itself."""
        if self.kind != "decoder":
            return 0.0, 0.0, float(self.pooled.shape[0]), 0.0, 0.0
        return self.clean_ce, 0.0, 0.0, self.sl_clean_ce, 0.0

    def score(self, out: Float[Tensor, "b_or_1 p out"]) -> tuple[float, float, float, float, float]:
        """(Σ CE, Σ KL(clean ‖ this), Σ cos, and Σ CE, Σ KL under SAELens' mask) over the batch; out may be
        one window standing for all."""
        if self.kind != "decoder":
            return 0.0, 0.0, float(F.cosine_similarity(self.pooled, self.pool(out), dim=-1).double().sum()), 0.0, 0.0
        z = out[:, :-1].float()
        lse = torch.logsumexp(z, dim=-1)
        z_target = z.expand(self.p.shape).gather(-1, self.target)[..., 0]
        ce_t = lse - z_target
        kl_t = self.neg_entropy - (self.p * z).sum(-1) + lse * self.p_sum
        ce = float(ce_t[self.valid].double().sum())
        kl = float(kl_t[self.valid].double().sum())
        z_last = out[:, -1].float()
        lse_last = torch.logsumexp(z_last, dim=-1)
        kl_last = self.neg_entropy_last - (self.p_last * z_last).sum(-1) + lse_last * self.p_last_sum
        sl_ce = float(ce_t.expand(self.sl_pred.shape)[self.sl_pred].double().sum())
        sl_kl = float(
            kl_t.expand(self.sl_kl.shape)[self.sl_kl].double().sum()
            + kl_last.expand(self.sl_last.shape)[self.sl_last].double().sum()
        )
        return ce, kl, 0.0, sl_ce, sl_kl
