"""The caching loop: corpus windows -> one forward pass -> several hooks -> one resumable store each.

Only what is asked is computed: the forward pass stops after the last block any requested hook lives
in (HookedTransformer's `stop_at_layer`; for HookedEncoder, embed + blocks[:L+1], skipping the
30,522-way vocabulary head), only the requested hooks are attached (no run_with_cache), and it runs
under torch.inference_mode.

Resuming: every store records how many tokens it holds in whole shards. A rerun of the same command
re-tokenizes the corpus (cheap), skips windows that every store already holds without running the
model, and drops rows a store already has, so a store killed at any moment ends byte-identical to an
uninterrupted one.

Exclusions (decoders: BOS; attention sinks). ``exclude_special`` keeps the tokenizer's special positions
([CLS]/[SEP], the BOS every decoder window starts with) out of the store; ``exclude_norm_ratio = m``
also drops every row whose norm exceeds m × the median row norm of its window, at any cached hook
(one mask for all hooks, so every store holds the same tokens), as dictionary_learning and sparsify do
for the massive activations of attention sinks. With either on, the manifest's ``extra.excluded``
says what was excluded and holds float64 sums (n, Σx, Σ‖x‖²) of all rows, of the excluded rows and of
the first position, so a report can state what share of ‖μ‖² and tr Σ they carried
(``exclusion_shares``). The norm rule makes a window's row count known only after its forward pass,
so with exclusions a resumed run recomputes the windows already stored (and drops their rows) instead
of skipping them: the sums then cover exactly the stored windows, and the store is byte-identical.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

import saegeo
from saegeo.activations import runner
from saegeo.activations.corpus import (
    CorpusSpec,
    Window,
    corpus_identity,
    count_tokens,
    iter_windows,
    open_corpus,
    special_template,
)
from saegeo.activations.models import LoadedModel, load_model, model_fingerprint
from saegeo.activations.options import CacheConfig, store_dir  # noqa: F401  (store_dir re-exported: its old home)
from saegeo.activations.store import MANIFEST, ActivationStore, StoreWriter
from saegeo.distributed import resolve_device
from saegeo.errors import BadInputError
from saegeo.geometry.tokens import group_shares
from saegeo.io import require_disk
from saegeo.progress import progress_bar

EMBED_HOOK = re.compile(r"^(hook_embed|hook_pos_embed|hook_full_embed|hook_tokens|embed\..*|pos_embed\..*)$")
BLOCK_HOOK = re.compile(r"^blocks\.(\d+)\.")
NOT_PER_TOKEN = ("hook_pattern", "hook_attn_scores")  # (batch, head, q, k): not one row per token


@dataclass
class CacheResult:
    stores: dict[str, Path]  # hook -> store directory
    n_tokens: dict[str, int]
    new_tokens: int  # tokens computed in this run (0 if everything was already cached)
    seconds: float
    stop_layer: int | None  # last block run (None: the whole model)
    bytes: dict[str, int] = field(default_factory=dict)

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.seconds if self.seconds > 0 else 0.0


def hook_layer(hook: str) -> int | None:
    """Block index a hook lives in: -1 for embeddings, None if it needs the whole model."""
    if EMBED_HOOK.match(hook):
        return -1
    m = BLOCK_HOOK.match(hook)
    return int(m.group(1)) if m else None


RESIDUAL_HOOK = re.compile(r"^blocks\.(\d+)\.hook_(resid_pre|resid_mid|resid_post|normalized_resid_post)$")


def residual_hooks(n_layers: int) -> tuple[str, ...]:
    """Every point of the residual stream between blocks: blocks.0.hook_resid_pre (the embeddings) and
    blocks.L.hook_resid_post for L < n_layers (n_layers + 1 hooks: MiniLM's 6 blocks give 7)."""
    return ("blocks.0.hook_resid_pre",) + tuple(f"blocks.{layer}.hook_resid_post" for layer in range(n_layers))


def hook_depth(hook: str) -> float | None:
    """Blocks applied before a hook: 0 for embeddings and blocks.0.hook_resid_pre, L + 0.5 for block L's
    resid_mid, L + 1 for its resid_post (and normalized_resid_post); L + 0.5 for other hooks inside block L;
    None for a hook outside the blocks (e.g. the unembedding)."""
    if EMBED_HOOK.match(hook):
        return 0.0
    m = RESIDUAL_HOOK.match(hook)
    if m:
        return int(m.group(1)) + {"resid_pre": 0.0, "resid_mid": 0.5}.get(m.group(2), 1.0)
    m = BLOCK_HOOK.match(hook)
    return int(m.group(1)) + 0.5 if m else None


def _validate_hooks(loaded: LoadedModel, hooks: tuple[str, ...]) -> int | None:
    if not hooks:
        raise BadInputError("no hooks given; e.g. --hooks blocks.3.hook_resid_post")
    names = loaded.model.hook_dict
    for hook in hooks:
        if hook not in names:
            close = [n for n in names if n.split(".")[-1] == hook.split(".")[-1]][:4] or list(names)[:4]
            raise BadInputError(f"hook {hook!r} does not exist in {loaded.name}; e.g. {', '.join(close)}")
        if hook.endswith(NOT_PER_TOKEN):
            raise BadInputError(f"hook {hook!r} holds attention patterns (batch, head, q, k), not one row per token")
    if len(set(hooks)) != len(hooks):
        raise BadInputError(f"hooks listed twice: {hooks}")
    layers = [hook_layer(h) for h in hooks]
    return None if any(layer is None for layer in layers) else max(layers)


def _refuse_shrinking(cfg: CacheConfig, hooks: tuple[str, ...], total: int) -> None:
    """A store that already holds more rows than this run would cache is refused before any writer opens it (a
    resume only appends: it would keep every row and say nothing)."""
    for h in hooks:
        path = store_dir(cfg.out, h)
        if not (path / MANIFEST).exists():
            continue
        have = ActivationStore(path, allow_incomplete=True, check_headers=False).n_tokens
        if have > total:
            raise BadInputError(
                f"{path} already holds {have:,} rows, more than this run's {total:,} (--max-tokens "
                f"{cfg.max_tokens}); a cache run only appends. Pass --overwrite to re-cache {total:,} tokens, or keep "
                "the store and read fewer rows where it is used (report and check --max-tokens, train --total-tokens)"
            )


def cache_activations(cfg: CacheConfig, loaded: Any = None) -> CacheResult:
    """Cache cfg.hooks over cfg.corpus into one store per hook under cfg.out (resumes if present). The model is
    `loaded`, else cfg.model: anything `load_model` takes (a name, a directory, a transformer-lens model, an HF
    model with its tokenizer as (model, tokenizer), a LoadedModel)."""
    if cfg.max_tokens is not None and cfg.max_tokens < 1:
        raise BadInputError(f"max_tokens must be positive, got {cfg.max_tokens}")
    device = resolve_device(cfg.device)  # before loading the model: a bad device fails fast
    spec = CorpusSpec(
        source=cfg.corpus, context=cfg.context, exclude_special=cfg.exclude_special, text_field=cfg.text_field
    )
    open_corpus(spec)  # ... and so does a bad corpus or --text-field
    loaded = load_model(  # a name, a directory, a model object
        loaded if loaded is not None else cfg.model, dtype=getattr(torch, cfg.model_dtype)
    )
    loaded.to(device)
    hooks = tuple(cfg.hooks)
    stop_layer = _validate_hooks(loaded, hooks)
    if cfg.context > loaded.n_ctx:
        raise BadInputError(f"context {cfg.context} exceeds the model's n_ctx={loaded.n_ctx}")
    tok = loaded.tokenizer
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else 0
    ident = corpus_identity(spec, tok)
    if cfg.exclude_norm_ratio is not None:  # part of what the store holds: resuming with another m is refused
        ident["exclude_norm_ratio"] = cfg.exclude_norm_ratio
    model_dtype = str(next(loaded.model.parameters()).dtype).removeprefix("torch.")
    if model_dtype != "float32":  # so is the dtype the forward ran in (float32 stores keep their identity)
        ident["model_dtype"] = model_dtype
    total = count_tokens(spec, tok, loaded.kind, limit=cfg.max_tokens)  # for the bar's ETA
    if total == 0:
        raise BadInputError(f"corpus {cfg.corpus!r} yields no tokens")
    d_of = runner.hook_widths(loaded, hooks, stop_layer, pad_id)
    excluding = cfg.exclude_special or cfg.exclude_norm_ratio is not None
    prefix, suffix = special_template(tok, loaded.kind)
    meta: dict[str, Any] = {
        "saegeo_version": saegeo.__version__,  # the special ids each text window starts/ends with
        "special_positions": {"prefix_ids": prefix, "suffix_ids": suffix},
    }
    if excluding:
        meta["exclusion_rule"] = _exclusion_rule(cfg, tok, loaded.kind)

    if not cfg.overwrite:
        _refuse_shrinking(cfg, hooks, total)
    # the rows still to write of every hook, in the storage dtype, against the free disk space: before the pass
    have = {h: 0 for h in hooks}
    if not cfg.overwrite:
        for h in hooks:
            if (store_dir(cfg.out, h) / MANIFEST).exists():
                have[h] = ActivationStore(store_dir(cfg.out, h), allow_incomplete=True, check_headers=False).n_tokens
    width = 4 if cfg.dtype == "float32" else 2
    need = sum(max(total - have[h], 0) * d_of[h] * width for h in hooks)
    require_disk(cfg.out, need, f"caching {total:,} tokens of {len(hooks)} hook(s)")
    # what the model is, beside its name (`saegeo check` compares these first): per hook, over the weights it reads
    by_layer = {layer: model_fingerprint(loaded, layer) for layer in {hook_layer(h) for h in hooks}}

    t0 = time.perf_counter()
    new_tokens = 0
    with contextlib.ExitStack() as stack:
        writers = {
            h: stack.enter_context(
                StoreWriter(
                    store_dir(cfg.out, h),
                    d=d_of[h],
                    hook=h,
                    model=loaded.name,
                    dtype=cfg.dtype,
                    corpus=ident,
                    shard_rows=cfg.shard_rows,
                    extra_meta={**meta, "model_fingerprint": by_layer[hook_layer(h)]},
                    mode="overwrite" if cfg.overwrite else "resume",
                )
            )
            for h in hooks
        }
        start = min(min(w.n_tokens for w in writers.values()), total)
        already_done = excluding and all(  # a complete store with its sums in the manifest: nothing to do
            (ex := w.manifest.get("extra", {}).get("excluded", {})).get("finished")
            and (w.n_tokens >= total or ex.get("corpus_exhausted"))
            for w in writers.values()
        )
        captured: dict[str, Tensor] = {}
        store_mask: list[Tensor] = []
        sums = {h: _ExclusionSums(d_of[h]) for h in hooks} if excluding else {}

        def grab(act: Tensor, hook: Any) -> None:
            if excluding:  # the whole (batch, pos, d) block: the mask is known only after the forward
                captured[hook.name] = act.reshape(act.shape[0], act.shape[1], -1)
                return
            rows = act[store_mask[0]]
            captured[hook.name] = rows.reshape(rows.shape[0], -1).cpu()

        bar = None
        if cfg.progress:
            bar = progress_bar(total=total, initial=start, unit="tok", unit_scale=True, desc="cache", smoothing=0.1)
        seen = 0  # stored-token index of the next window's first row
        with torch.inference_mode(), loaded.model.hooks(fwd_hooks=[(h, grab) for h in hooks]):
            for batch in runner.window_batches(iter_windows(spec, tok, loaded.kind), cfg.batch_windows):
                if already_done:
                    break
                if excluding:
                    done, seen = _excluding_step(
                        loaded, batch, pad_id, stop_layer, cfg, captured, store_mask, writers, sums, seen, start, total
                    )
                    new_tokens += done
                    if bar is not None:
                        bar.update(done)
                    if seen >= total:
                        break
                    continue
                counts = [w.n_stored for w in batch]
                # drop whole windows that every store already holds (no forward needed)
                while batch and seen + counts[0] <= start:
                    seen += counts.pop(0)
                    batch.pop(0)
                if not batch:
                    continue
                if seen >= total:
                    break
                # ... and windows past the token budget
                keep, upto = 0, seen
                while keep < len(batch) and upto < total:
                    upto += counts[keep]
                    keep += 1
                batch, counts = batch[:keep], counts[:keep]
                if all(w.n_tokens >= min(upto, total) for w in writers.values()):  # e.g. a straddling window
                    seen = upto
                    continue
                tokens, attend, store = runner.pad_windows(batch, pad_id)
                store_mask[:] = [store.to(device)]
                runner.forward_to_layer(loaded, tokens.to(device), attend.to(device), stop_layer)
                n = int(store.sum())
                ids, pos = tokens[store], torch.nonzero(store)[:, 1]
                for h, w in writers.items():
                    lo = max(0, w.n_tokens - seen)  # rows this store already has
                    hi = min(n, total - seen)
                    if hi > lo:
                        w.append(captured[h][lo:hi], token_ids=ids[lo:hi], positions=pos[lo:hi])
                done = min(seen + n, total) - max(seen, start)
                new_tokens += max(done, 0)
                seen += n
                if bar is not None:
                    bar.update(max(done, 0))
                if seen >= total:
                    break
        if bar is not None:
            bar.close()
        if excluding and not already_done:
            for h, w in writers.items():
                w.manifest["extra"]["excluded"] = {**sums[h].to_json(), "corpus_exhausted": seen < total}
    seconds = time.perf_counter() - t0
    stores = {h: store_dir(cfg.out, h) for h in hooks}
    opened = {h: ActivationStore(p) for h, p in stores.items()}
    return CacheResult(
        stores=stores,
        n_tokens={h: s.n_tokens for h, s in opened.items()},
        new_tokens=new_tokens,
        seconds=seconds,
        stop_layer=stop_layer,
        bytes={h: sum(sh.bytes for sh in s.shards) for h, s in opened.items()},
    )


def _exclusion_rule(cfg: CacheConfig, tok: Any, kind: str) -> dict[str, Any]:
    """What the manifest says was left out of the store (and why)."""
    from saegeo.activations.corpus import special_template

    prefix, suffix = special_template(tok, kind) if cfg.exclude_special else ([], [])
    return {
        "special_positions": {
            "prefix": [tok.convert_ids_to_tokens(i) for i in prefix],
            "prefix_ids": prefix,
            "suffix": [tok.convert_ids_to_tokens(i) for i in suffix],
            "suffix_ids": suffix,
        },
        "first_position_excluded": bool(prefix),
        "norm_ratio": cfg.exclude_norm_ratio,
        "norm_rule": None
        if cfg.exclude_norm_ratio is None
        else f"rows with ‖x‖ > {cfg.exclude_norm_ratio:g} × the median ‖x‖ of their window (non-special rows), at any cached hook",
    }


class _ExclusionSums:
    """float64 sums (n, Σx, Σ‖x‖²) of all rows, the excluded rows and the first position, per store."""

    GROUPS = ("all", "excluded", "excluded_special", "excluded_norm", "first_position")

    def __init__(self, d: int):
        self.n = {g: 0 for g in self.GROUPS}
        self.sx = {g: torch.zeros(d, dtype=torch.float64) for g in self.GROUPS}
        self.sq = {g: 0.0 for g in self.GROUPS}

    def add(self, group: str, rows: Tensor) -> None:
        r = rows.to(torch.float64)
        self.n[group] += r.shape[0]
        self.sx[group] += r.sum(0)
        self.sq[group] += float((r * r).sum())

    def to_json(self) -> dict[str, Any]:
        return {
            "finished": True,
            **{g: {"n": self.n[g], "sum_sq": self.sq[g], "sum": self.sx[g].tolist()} for g in self.GROUPS},
        }


def exclusion_shares(excluded: Mapping[str, Any]) -> dict[str, dict[str, float]]:
    """Share of ‖μ‖² and of tr Σ that the excluded rows / the first position carry among all N rows
    (stored + excluded): ``saegeo.geometry.tokens.group_shares`` of each group's float64 sums."""
    a = excluded["all"]
    if not a["n"]:
        return {}
    return {
        g: group_shares(a["n"], a["sum"], a["sum_sq"], e["n"], e["sum"], e["sum_sq"])
        for g in ("excluded", "excluded_special", "excluded_norm", "first_position")
        if (e := excluded.get(g)) and e["n"]
    }


def _excluding_step(
    loaded: LoadedModel,
    batch: list[Window],
    pad_id: int,
    stop_layer: int | None,
    cfg: CacheConfig,
    captured: dict[str, Tensor],
    store_mask: list[Tensor],
    writers: Mapping[str, StoreWriter],
    sums: Mapping[str, _ExclusionSums],
    seen: int,
    start: int,
    total: int,
) -> tuple[int, int]:
    """One batch with exclusions: forward, the final mask, rows each store lacks, the sums.

    Returns (new rows stored, the stored-token index after this batch). Windows at or past the token
    budget are not counted; rows every store already has are dropped (a resumed run).
    """
    tokens, attend, store = runner.pad_windows(batch, pad_id)
    store_mask[:] = [store]
    runner.forward_to_layer(loaded, tokens, attend, stop_layer)
    keep = store.clone()
    if cfg.exclude_norm_ratio is not None:
        for act in captured.values():
            norms = act.float().norm(dim=-1)
            for i in range(len(batch)):
                cand = norms[i][store[i]]
                if cand.numel():
                    keep[i] &= ~(norms[i] > cfg.exclude_norm_ratio * cand.median())
    done = 0
    for i in range(len(batch)):
        if seen >= total:
            break
        n_i = int(keep[i].sum())
        real = attend[i]
        for h, w in writers.items():
            act = captured[h][i]
            s = sums[h]
            s.add("all", act[real])
            s.add("first_position", act[:1])
            s.add("excluded", act[real & ~keep[i]])
            s.add("excluded_special", act[real & ~store[i]])
            s.add("excluded_norm", act[store[i] & ~keep[i]])
            lo, hi = max(0, w.n_tokens - seen), min(n_i, total - seen)
            if hi > lo:
                pos = torch.nonzero(keep[i])[:, 0]
                w.append(act[keep[i]][lo:hi], token_ids=tokens[i][keep[i]][lo:hi], positions=pos[lo:hi])
        done += max(min(seen + n_i, total) - max(seen, start), 0)
        seen += n_i
    return done, seen
