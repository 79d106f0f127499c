"""SAE trainer: TopK, BatchTopK, JumpReLU and ReLU+L1; b_dec := mean of the activations, unit-norm decoder,
AuxK / L1 / L0 target, checkpoints, resume.

Read top to bottom: config -> data sources -> b_dec init -> metrics -> checkpoints -> train_sae (the loop, then
the named steps it calls: _Ranks for torchrun, _start_or_resume, _Meter for the log, _NonFiniteGuard, _finish).

Data sources and their held-out split (the split is always decided before anything is trained):
  * in-memory tensor (n, d): the LAST `heldout_fraction` of rows (in the given order) is held out;
    training walks the rest in a fresh seeded permutation each epoch.
  * ActivationStore: the LAST `heldout_fraction` of rows in store order (i.e. the last context
    windows cached) is held out; training streams the other rows shard by shard in a seeded shard
    order, mixed through a shuffle buffer of `shuffle_buffer` rows.
  * iterator / generator of batches (tensors or (activations, codes) tuples, e.g. the synthetic
    generator) or a zero-argument callable returning one: the FIRST
    max(heldout_fraction · total_tokens, batch_tokens) rows are held out, the rest streamed in order.
    Pass a callable: b_dec init and resume replay the stream from its start. A bare iterator is
    refused (with that advice) when b_dec is estimated.
Every source is deterministic given `seed`, so a resumed run sees exactly the batches it would have.

History: every log_every steps (and at the last step) one record of the interval's live metrics (step, tokens,
passes over the training rows, loss and each of the architecture's loss terms by name, MSE, FVE, L0, dead share, lr,
throughput) is appended to out_dir/training_log.jsonl as it is measured; the same records are
TrainResult.history and the checkpoint's history, so a resumed run rewrites the log up to its checkpoint and
continues it: no step is missing or repeated (`read_training_log`). With `wandb` the records go to W&B too.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from jaxtyping import Float
from safetensors import SafetensorError
from safetensors.torch import load as safetensors_load_bytes
from safetensors.torch import save as safetensors_bytes
from torch import Tensor

from saegeo.activations.sources import Rows, open_rows
from saegeo.config import require_memory
from saegeo.errors import BadInputError, FormatError, SaegeoError
from saegeo.io import atomic_write, dump_json, json_safe, require_disk, writer_lock
from saegeo.progress import progress_bar
from saegeo.runtime import keep_freed_memory
from saegeo.sae.architectures import get_architecture
from saegeo.sae.metrics import SAEMetrics
from saegeo.sae.model import SAE, SAEConfig, TrainOutput
from saegeo.sae.options import TrainConfig, recorded_options

# Options that do not say which SAE is trained: `saegeo run` ignores them when it decides whether an SAE is already
# trained. Every other option must match the checkpoint's on resume. The thread count and the device do change the
# weights bitwise (another summation order), so a checkpoint records the ones it ran with and a resume with others
# is refused (bitwise_settings).
NOT_IN_WEIGHTS = (
    "progress",
    "log_every",
    "num_threads",
    "device",
    "checkpoint_every",
    "out_dir",
    "overwrite",
    "verify",
    "skip_nonfinite",
    "wandb",
    "wandb_project",
)
CHECKPOINT_VERSION = 5  # a checkpoint's layout; what each version added: CHANGELOG.md
TRAINING_LOG = "training_log.jsonl"  # one JSON record per logged step, beside the SAE (see the module docstring)
# `saegeo train` takes --overwrite, `saegeo run` and Python take the option: the advice names both
OVERWRITE = "pass --overwrite (overwrite = true in a config's [train])"


class NonFiniteLossError(SaegeoError):
    """Training produced a NaN/inf loss; the last good checkpoint is left untouched."""


@dataclass
class TrainResult:
    sae: SAE
    history: list[dict]  # one dict of live metrics every log_every steps
    heldout: dict  # final held-out metrics
    activation_mean: Tensor  # streamed mean of the training activations (float64)
    config: TrainConfig
    out_dir: str | None = None
    provenance: dict = field(default_factory=dict)


# =========================================================================== data sources
# Every byte comes from the one reader (saegeo.activations.sources.open_rows: a store's shards hashed on every
# read, the resume's row gather included); every row the trainer uses (b_dec's rows, each training batch, the
# held-out rows) passes its NaN policy, Rows.screen: an error naming the row, or skipped and counted
# (skip_nonfinite). What stays here is the training's own order: the held-out split, the epochs, the shuffle buffer.
SKIP_PURPOSES = ("b_dec_init", "training", "heldout")


class _Source:
    """What the three sources share: the reader's Rows (the NaN policy) and the skipped rows per purpose."""

    rows: Rows

    def _screen(self, x: Tensor, at: int | Tensor, purpose: str, context: str = "") -> Tensor:
        before = self.rows.n_nonfinite_skipped
        x = self.rows.screen(x, at, context=context)
        self.skipped[purpose] += self.rows.n_nonfinite_skipped - before
        return x


class _TensorSource(_Source):
    def __init__(self, rows: Rows, cfg: TrainConfig):
        x = rows.tensor()
        self.rows, self.skipped = rows, dict.fromkeys(SKIP_PURPOSES, 0)
        n_held = int(round(x.shape[0] * cfg.heldout_fraction))
        self.train_x, self.heldout_x = x[: x.shape[0] - n_held], x[x.shape[0] - n_held :]
        if self.train_x.shape[0] < cfg.batch_tokens:
            raise BadInputError(
                f"{self.train_x.shape[0]} training rows after holding out {n_held}; need at least one batch "
                f"of {cfg.batch_tokens}"
            )
        self.d, self.cfg = x.shape[1], cfg
        self.identity = {"source": "tensor", "rows": int(x.shape[0]), "heldout": "last fraction of rows"}
        if rows.kind == "file":
            self.identity["path"] = rows.describe.get("path")
        self.fingerprint = "tensor:" + tensor_sha256(x)
        self.heldout_first_row = int(self.train_x.shape[0])
        self.n_train_rows = int(self.train_x.shape[0])  # the rows one pass (epoch) walks

    def train_batches(self, start_step: int) -> Iterator[Tensor]:
        n, bs = self.train_x.shape[0], self.cfg.batch_tokens
        per_epoch = n // bs  # the ragged tail of each permutation is dropped
        epoch, i = divmod(start_step, per_epoch)
        while True:
            g = torch.Generator().manual_seed(self.cfg.seed * 1_000_003 + epoch)
            perm = torch.randperm(n, generator=g)
            for j in range(i, per_epoch):
                idx = perm[j * bs : (j + 1) * bs]
                yield self._screen(self.train_x[idx].float(), idx, "training")
            epoch, i = epoch + 1, 0

    def init_rows(self, n: int) -> Iterator[Tensor]:
        """b_dec's rows: all training rows when n covers them, else a seeded uniform sample of n (not a prefix)."""
        n_train = self.train_x.shape[0]
        if n >= n_train:
            yield self._screen(self.train_x.float(), 0, "b_dec_init", INIT_CONTEXT)
        else:
            idx = torch.from_numpy(_uniform_row_sample(n_train, n, self.cfg.seed))
            yield self._screen(self.train_x[idx].float(), idx, "b_dec_init", INIT_CONTEXT)

    def init_description(self, n: int) -> dict:
        return _init_description(self.train_x.shape[0], n, "rows of the training tensor")

    def heldout_batches(self) -> Iterator[Tensor]:
        for lo in range(0, self.heldout_x.shape[0], self.cfg.batch_tokens):
            yield self._screen(
                self.heldout_x[lo : lo + self.cfg.batch_tokens].float(),
                self.heldout_first_row + lo,
                "heldout",
                ", a held-out row",
            )


INIT_CONTEXT = ", a row used to initialise b_dec"


class _StoreSource(_Source):
    def __init__(self, rows: Rows | Any, cfg: TrainConfig):
        rows = rows if isinstance(rows, Rows) else open_rows(rows, verify=cfg.verify, skip_nonfinite=cfg.skip_nonfinite)
        store = rows.store
        self.rows, self.skipped = rows, dict.fromkeys(SKIP_PURPOSES, 0)
        self.store, self.cfg, self.d = store, cfg, store.d
        self.n_train = store.n_tokens - int(round(store.n_tokens * cfg.heldout_fraction))
        if self.n_train < cfg.batch_tokens:
            raise BadInputError(
                f"{store.path}: {self.n_train} training rows, need at least one batch of {cfg.batch_tokens}"
            )
        self.identity = {
            "source": "store",
            "path": str(store.path),
            "model": store.model,
            "hook": store.hook,
            "n_tokens": store.n_tokens,
            "corpus": store.corpus,
            # the stored kind of positions the cache read: its rows plus those the norm rule dropped
            # (`saegeo eval` skips this many to reach held-out text)
            "n_positions_read": store.n_tokens
            + int(((store.manifest.get("extra") or {}).get("excluded") or {}).get("excluded_norm", {}).get("n", 0)),
            "shard_sha256": [s.sha256 for s in store.shards],
            "heldout": f"last {store.n_tokens - self.n_train} rows in store order",
        }
        extra = store.manifest.get("extra") or {}
        for key in ("model_fingerprint", "special_positions", "exclusion_rule"):  # what the model is (saegeo check
            if extra.get(key):  # compares it), and what the windows held and left out (cfg.json metadata)
                self.identity[key] = extra[key]
        from saegeo.distributed import store_fingerprint

        self.fingerprint = "store:" + store_fingerprint(store)
        self.heldout_first_row = self.n_train
        self.n_train_rows = self.n_train

    rank, world = 0, 1  # torch.distributed (set by train_sae): this rank streams shards rank::world

    def _epoch(self, epoch: int, skip: int = 0) -> Iterator[Tensor | None]:
        """One epoch of the training rows, batch for batch what ``store.iter_batches(shuffle=True,
        drop_last=True)`` gives: a seeded shard order (this rank's every world-th shard), rows mixed through a
        shuffle buffer, whole batches of batch_tokens/world rows only.

        The first `skip` batches come out as None without reading anything: the shard order and every
        permutation of the buffer depend only on row counts and the seed, so they are replayed on global row
        indices. Rows are read from the first batch on that is yielded, and then only the rows still in the
        buffer (resume gathers them by index, each shard hashed as it is read, instead of re-reading the stream).
        """
        st, bs = self.store, self.cfg.batch_tokens // self.world
        buffer, stop = self.cfg.shuffle_buffer // self.world, self.n_train
        gen = torch.Generator().manual_seed(self.cfg.seed * 1_000_003 + epoch)
        order = [i for i in range(len(st.shards)) if st.offsets[i] < stop]
        order = [order[j] for j in torch.randperm(len(order), generator=gen).tolist()][self.rank :: self.world]
        idx = torch.empty(0, dtype=torch.long)  # global row index of each buffered row
        rows: Tensor | None = None  # their values, once a batch has been yielded
        n_batches = 0

        def emit(n_emit: int) -> Iterator[Tensor | None]:
            nonlocal rows, n_batches
            for lo in range(0, n_emit, bs):
                if n_batches < skip:
                    yield None
                else:
                    if rows is None:
                        rows = self.rows.read(idx)  # verified like every read
                    yield self._screen(rows[lo : lo + bs], idx[lo : lo + bs], "training")
                n_batches += 1

        for i in order:
            lo_row = int(st.offsets[i])
            hi_row = min(lo_row + st.shards[i].rows, stop)
            idx = torch.cat([idx, torch.arange(lo_row, hi_row)])
            if rows is not None:
                rows = torch.cat([rows, st.read_shard(i)[: hi_row - lo_row]])
            if idx.shape[0] < buffer + bs:
                continue
            perm = torch.randperm(idx.shape[0], generator=gen)
            idx, rows = idx[perm], (rows[perm] if rows is not None else None)
            n_emit = (idx.shape[0] - buffer // 2) // bs * bs  # all but half a buffer: later shards mix in
            yield from emit(n_emit)
            idx, rows = idx[n_emit:], (rows[n_emit:] if rows is not None else None)
        if idx.shape[0] > 1:
            perm = torch.randperm(idx.shape[0], generator=gen)
            idx, rows = idx[perm], (rows[perm] if rows is not None else None)
        yield from emit(idx.shape[0] // bs * bs)

    def train_batches(self, start_step: int) -> Iterator[Tensor]:
        skip, epoch = start_step, 0  # resume: the first start_step batches are planned, not read
        while True:
            for batch in self._epoch(epoch, skip):
                if batch is None:
                    skip -= 1
                else:
                    yield batch
            epoch += 1

    def init_rows(self, n: int) -> Iterator[Tensor]:
        """b_dec's rows: every training row when n covers them (the exact mean, shard by shard), else a seeded
        uniform sample of n rows drawn across all shards — never the first rows in store order, whose mean
        follows the first documents (a prefix mean is 3–4× further from the global mean than a sample)."""
        if n >= self.n_train:
            for i in range(len(self.store.shards)):
                lo = int(self.store.offsets[i])
                if lo >= self.n_train:
                    break
                yield self._screen(self.store.read_shard(i)[: self.n_train - lo], lo, "b_dec_init", INIT_CONTEXT)
            return
        rows = _uniform_row_sample(self.n_train, n, self.cfg.seed)
        shard_of = np.searchsorted(self.store.offsets, rows, side="right") - 1
        for i in np.unique(shard_of):
            local = torch.from_numpy(rows[shard_of == i] - self.store.offsets[i])
            yield self._screen(
                self.store.read_shard(int(i))[local], local + int(self.store.offsets[i]), "b_dec_init", INIT_CONTEXT
            )

    def init_description(self, n: int) -> dict:
        return _init_description(self.n_train, n, f"training rows across all {len(self.store.shards)} shard(s)")

    def heldout_batches(self) -> Iterator[Tensor]:
        for lo in range(self.n_train, self.store.n_tokens, self.cfg.batch_tokens):
            yield self._screen(
                self.store.read_rows(lo, min(lo + self.cfg.batch_tokens, self.store.n_tokens)),
                lo,
                "heldout",
                ", a held-out row",
            )


class _IteratorSource(_Source):
    def __init__(self, data: Rows | Callable[[], Iterable], cfg: TrainConfig):
        self.factory = data if not isinstance(data, Rows) else None
        self._once = data if isinstance(data, Rows) else None
        self.cfg = cfg
        self.skipped = dict.fromkeys(SKIP_PURPOSES, 0)  # each stream is one open_rows of the data, screened
        n_held = max(int(cfg.heldout_fraction * cfg.total_tokens), cfg.batch_tokens) if cfg.heldout_fraction else 0
        self.n_held = n_held
        stream = self._stream()
        self.heldout_x = self._take(stream, n_held) if n_held else torch.empty(0)
        self._stream_after_heldout = stream
        probe = self.heldout_x if n_held else None
        if probe is None:
            first = next(stream)
            self._stream_after_heldout = _chain([first], stream)
            probe = first
        self.d = probe.shape[1]
        self.identity = {"source": "iterator", "heldout": f"first {n_held} rows of the stream"}
        # all a stream offers without consuming it: its first rows (the held-out ones, or the first batch)
        self.fingerprint = f"iterator:{n_held}:" + tensor_sha256(probe)
        self.heldout_first_row = 0
        self.n_train_rows = None  # a stream's length is not known before it ends

    def _stream(self, purpose: str = "training") -> Iterator[Tensor]:
        """The stream's batches as float32, screened by the reader (rows named by their position in the stream);
        rows skipped in batches that start within the held-out rows count as held out, the others as `purpose`."""
        rows = open_rows(self.factory(), skip_nonfinite=self.cfg.skip_nonfinite) if self.factory else self._once
        if rows.kind != "iterator":
            raise BadInputError(f"the data callable returned a {rows.kind}, not an iterable of batches")
        at, n_held = 0, self.n_held
        for b in rows.batches(1)[0]:  # an iterator's batches come as they are (the size is not used)
            before = rows.n_nonfinite_skipped  # counted when the batch was screened, just before it came here
            yield b.float()
            self.skipped["heldout" if at < n_held else purpose] += rows.n_nonfinite_skipped - before
            at += b.shape[0]

    def _stream_after_fresh_heldout(self, purpose: str = "training") -> Iterator[Tensor]:
        """A fresh stream (needs the callable) past the held-out rows. No held-out rows: nothing skipped
        (`_take(stream, 0)` would still swallow one batch)."""
        stream = self._stream(purpose)
        if self.n_held:
            self._take(stream, self.n_held)
        return stream

    @staticmethod
    def _take(stream: Iterator[Tensor], n: int, allow_short: bool = False) -> Tensor:
        parts, have = [], 0
        for b in stream:
            parts.append(b)
            have += b.shape[0]
            if have >= n:
                break
        if have < n and not (allow_short and have):
            raise BadInputError(f"data iterator ended after {have} rows; {n} needed")
        x = torch.cat(parts)
        return x  # rows beyond n are kept in the held-out set (it only ever grows by < one source batch)

    def train_batches(self, start_step: int) -> Iterator[Tensor]:
        if start_step and self.factory is None:
            raise BadInputError("resuming from an iterator needs a callable that restarts the stream")
        stream = self._stream_after_heldout
        if start_step:  # replay: a fresh stream, skip held-out and consumed rows
            stream = self._stream_after_fresh_heldout()
        bs, pending, step = self.cfg.batch_tokens, torch.empty(0, self.d), 0
        for b in stream:
            pending = torch.cat([pending, b])
            while pending.shape[0] >= bs:
                if step >= start_step:
                    yield pending[:bs]
                pending, step = pending[bs:], step + 1
        raise BadInputError(f"data iterator ran out after {step} batches of {bs}; give more data or fewer tokens")

    def init_rows(self, n: int) -> Iterator[Tensor]:
        # b_dec init may only look at rows the run trains on: re-read from a fresh stream when possible
        if self.factory is None:
            raise BadInputError("pass a callable returning the iterator, so b_dec can be estimated before training")
        stream = self._stream_after_fresh_heldout("b_dec_init")
        yield self._take(stream, n, allow_short=True)[:n]  # a short stream: its whole training part

    def init_description(self, n: int) -> dict:
        return {"method": "first rows of the stream (an iterator cannot be sampled without a pass)", "n_rows": n}

    def heldout_batches(self) -> Iterator[Tensor]:
        for lo in range(0, self.heldout_x.shape[0], self.cfg.batch_tokens):
            yield self.heldout_x[lo : lo + self.cfg.batch_tokens]


def tensor_sha256(x: Tensor) -> str:
    """sha256 over a tensor's dtype, shape and bytes (the identity of in-memory training data)."""
    x = x.detach().cpu().contiguous()
    digest = hashlib.sha256(f"{x.dtype}{tuple(x.shape)}".encode())
    digest.update(memoryview(x.reshape(-1).view(torch.uint8).numpy()))
    return digest.hexdigest()


def _uniform_row_sample(n_rows: int, k: int, seed: int) -> np.ndarray:
    """k distinct row indices in [0, n_rows), uniform, sorted (seeded: every rank draws the same rows)."""
    rng = np.random.default_rng([seed, 0xB0EC])
    return np.sort(rng.choice(n_rows, size=k, replace=False)).astype(np.int64)


def _init_description(n_train: int, n: int, what: str) -> dict:
    """What b_dec's mean is computed from: the exact mean when n covers the training rows, else a uniform sample."""
    if n >= n_train:
        return {"method": f"exact mean over all {what}", "n_rows": n_train}
    return {
        "method": f"uniform random sample of the {what} (seeded, without replacement)",
        "n_rows": n,
        "of_rows": n_train,
    }


def _chain(first: list, rest: Iterator) -> Iterator:
    yield from first
    yield from rest


def make_source(data: Any, cfg: TrainConfig) -> _Source:
    """A tensor or array, a file, an ActivationStore (or its path), an iterator, or a zero-argument callable
    returning one, as a training source; every one read through ``open_rows`` (verify and skip_nonfinite from cfg)."""
    if callable(data) and not hasattr(data, "__next__") and not isinstance(data, (Tensor, np.ndarray)):
        return _IteratorSource(data, cfg)  # a factory: each stream is opened when it is read
    if hasattr(data, "__array__") and not isinstance(data, (Tensor, np.ndarray)) and not hasattr(data, "__next__"):
        data = torch.as_tensor(data)
    if isinstance(data, Tensor) and data.ndim != 2:
        raise BadInputError(f"training tensor must be (n, d), got shape {tuple(data.shape)}")
    rows = open_rows(data, verify=cfg.verify, skip_nonfinite=cfg.skip_nonfinite)
    if rows.store is not None:
        return _StoreSource(rows, cfg)
    if rows.kind in ("tensor", "file"):
        return _TensorSource(rows, cfg)
    return _IteratorSource(rows, cfg)


# =========================================================================== b_dec init
def geometric_median(x: Float[Tensor, "n d"], iters: int = 200, tol: float = 1e-7) -> Float[Tensor, " d"]:
    """argmin_m Σ_i ‖x_i − m‖ by Weiszfeld's iteration m ← Σ w_i x_i / Σ w_i, w_i = 1/‖x_i − m‖ (float64)."""
    x = x.double()
    m = x.mean(dim=0)
    for _ in range(iters):
        w = 1.0 / (x - m).norm(dim=1).clamp_min(1e-12)
        m_new = (w[:, None] * x).sum(dim=0) / w.sum()
        if (m_new - m).norm() <= tol * (m.norm() + 1e-12):
            return m_new
        m = m_new
    return m


# =========================================================================== metrics
@torch.no_grad()
def evaluate(
    sae: SAE,
    batches: Iterable[Tensor],
    activation_mean: Tensor | None = None,
    *,
    first_row: int = 0,
    skip_nonfinite: bool = False,
) -> dict:
    """Held-out metrics in one pass (``saegeo.sae.metrics.SAEMetrics``, the report's accumulator too).

    mse = SSE/(n·d); FVE = 1 − SSE / Σ‖x − x̄‖² (x̄ = held-out mean; centred SS by Chan's update in float64);
    L0 = mean active latents per row; dead = fraction of latents that never fire on these rows;
    dense = fraction firing on > 50% of rows; max|cos(W_dec, μ)| over decoder rows (μ = activation_mean,
    else the held-out mean); b_dec_dist = ‖b_dec − μ‖/‖μ‖.
    The reader's NaN policy applies (Rows.screen): a row with inf/NaN is an error naming it (its index in the data
    is first_row + its position here), or, with skip_nonfinite, left out and counted in ``nonfinite_rows_skipped``.
    """
    metrics = SAEMetrics(sae)
    policy = open_rows([], skip_nonfinite=skip_nonfinite)  # holds the policy and the count
    at = first_row
    for x in batches:
        n = x.shape[0]
        metrics.add(policy.screen(x, at, context=", a held-out row"))
        at += n
    summary = metrics.summary(activation_mean)
    if skip_nonfinite:
        summary["nonfinite_rows_skipped"] = policy.n_nonfinite_skipped
    return summary


# =========================================================================== checkpoints
def _ckpt_dir(cfg: TrainConfig) -> Path | None:
    return Path(cfg.out_dir) / "checkpoint" if cfg.out_dir else None


def save_checkpoint(cfg: TrainConfig, sae: SAE, opt: torch.optim.Adam, step: int, extra: dict, tensors: dict) -> None:
    """Write tensors_<step>.safetensors, then state.json pointing at it (atomic rename), then drop old files.

    A crash at any point leaves state.json naming a complete tensors file, whose sha256 it records.
    """
    d = _ckpt_dir(cfg)
    d.mkdir(parents=True, exist_ok=True)
    out = {f"sae.{k}": v.detach().contiguous() for k, v in sae.state_dict().items()}
    names = {id(p): n for n, p in sae.named_parameters()}
    for p, st in opt.state.items():
        for key in ("exp_avg", "exp_avg_sq", "step"):
            out[f"adam.{names[id(p)]}.{key}"] = torch.as_tensor(st[key]).detach().clone().reshape(-1)
    out.update({k: v.contiguous() for k, v in tensors.items()})
    fname = f"tensors_{step:08d}.safetensors"
    data = safetensors_bytes({k: v.cpu() for k, v in out.items()})
    atomic_write(d / fname, data)
    state = {
        "version": CHECKPOINT_VERSION,
        "step": step,
        "tensors": fname,
        "tensors_sha256": hashlib.sha256(data).hexdigest(),
        "config": cfg.record(),
        "bitwise": bitwise_settings(cfg),
        **extra,
    }
    state["state_sha256"] = _state_digest(json_safe(state))
    dump_json(state, d / "state.json")
    for old in d.glob("tensors_*.safetensors"):
        if old.name != fname:
            old.unlink()


def _state_digest(state: Mapping[str, Any]) -> str:
    """sha256 of state.json's content (all but this digest, keys sorted): a hand edit of any field breaks it."""
    body = {k: v for k, v in state.items() if k != "state_sha256"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, allow_nan=False).encode()).hexdigest()


BITWISE_NAMES = {"device": "device type", "torch_threads": "torch threads (--num-threads)"}


def bitwise_settings(cfg: TrainConfig) -> dict[str, Any]:
    """What changes the weights bitwise without being a training option's value: the torch threads a CPU run
    computes with (cfg.num_threads, or torch's default on this machine) and the device type."""
    from saegeo import distributed

    device = distributed.resolve_device(cfg.device)
    ctx = distributed.current()
    return {
        "device": device.type,
        "torch_threads": torch.get_num_threads() if device.type == "cpu" else None,
        "world_size": ctx.world_size if ctx is not None else 1,
    }


def load_checkpoint(cfg: TrainConfig) -> tuple[dict, dict] | None:
    """(state, tensors) of the checkpoint in cfg.out_dir, None if there is none; FormatError naming the file
    if state.json or its tensors file is unreadable, truncated or does not match its recorded sha256."""
    d = _ckpt_dir(cfg)
    if d is None or not (d / "state.json").exists():
        return None
    fix = f"delete {d} (or {OVERWRITE}) to start a new run"
    try:
        state = json.loads((d / "state.json").read_bytes())
        if not isinstance(state, dict):
            raise ValueError(f"a JSON {type(state).__name__}, not an object")
        for key in ("step", "tensors", "config", "history"):
            if key not in state:
                raise ValueError(f"no {key!r}")
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise FormatError(f"{d / 'state.json'}: corrupt checkpoint state ({err}); {fix}") from None
    if "state_sha256" not in state:
        raise FormatError(
            f"{d / 'state.json'}: a checkpoint without a digest of its state (written by an older "
            f"saegeo, or edited): it cannot be trusted; {fix}"
        )
    if _state_digest(state) != state["state_sha256"]:
        raise FormatError(
            f"{d / 'state.json'}: the checkpoint's state was changed after it was written (its digest "
            f"does not match); {fix}"
        )
    tensors_name = str(state["tensors"])
    if "/" in tensors_name or tensors_name in ("", ".", ".."):
        raise FormatError(f"{d / 'state.json'}: tensors file {tensors_name!r} is not inside {d}; {fix}")
    path = d / tensors_name
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise FormatError(f"{path}: the checkpoint's tensors file is missing; {fix}") from None
    except OSError as err:
        raise FormatError(f"{path}: cannot read the checkpoint ({err.strerror or err}); {fix}") from None
    expected = state.get("tensors_sha256")
    if expected and hashlib.sha256(data).hexdigest() != expected:
        raise FormatError(f"{path}: truncated or corrupt (sha256 differs from state.json's); {fix}")
    try:
        tensors = safetensors_load_bytes(data)
    except (SafetensorError, RuntimeError, ValueError) as err:
        raise FormatError(f"{path}: truncated or corrupt checkpoint ({err}); {fix}") from None
    needed = ("sae.W_enc", "activation_mean", "tokens_since_fired", "torch_rng")
    if any(k not in tensors for k in needed):
        raise FormatError(f"{path}: lacks {[k for k in needed if k not in tensors]}; {fix}")
    return state, tensors


def _weight_options(config: Mapping[str, Any], d_sae: int) -> dict[str, Any]:
    """The options that fix the weights: all but NOT_IN_WEIGHTS, expansion folded into the built d_sae.
    A key an older checkpoint lacks counts as the option's default."""
    defaults = {f.name: f.default for f in dataclasses.fields(TrainConfig) if f.default is not dataclasses.MISSING}
    config = {("batch_tokens" if k == "batch_size" else k): v for k, v in config.items()}  # saved before the rename
    merged = json_safe({**defaults, **config})
    # grad_clip_norm None was "never" before the architectures gave it a default (0 since): the same training
    merged["grad_clip_norm"] = merged["grad_clip_norm"] or 0.0
    # decoder_norm None: a checkpoint from before the option had per-architecture defaults, when "unit" was the
    # default (a recorded "unit" stays "unit": a unit-norm TopK run is refused a resume with the free default)
    merged["decoder_norm"] = merged["decoder_norm"] or "unit"
    merged = recorded_options(merged)  # before the architectures' own options: k, l1_coefficient, ... were flat
    # the architecture's options by their flag names (a refusal names "topk.k=4")
    merged |= {f"{arch}.{k}": v for arch, table in merged.pop("arch_options").items() for k, v in table.items()}
    return {k: v for k, v in merged.items() if k not in NOT_IN_WEIGHTS and k != "expansion"} | {"d_sae": d_sae}


def _open_checkpoint(cfg: TrainConfig, source: Any, d_sae: int, resume: bool) -> tuple[dict, dict] | None:
    """The checkpoint to resume (None: a new run), after refusing whatever would overwrite a result or mix
    two runs: a checkpoint of other data or other options, a finished SAE, a checkpoint --no-resume would
    replace. --overwrite (cfg.overwrite) discards the checkpoint and starts a new run; a finished SAE there
    stays until the new one is saved over it (SAE.save replaces both files as one), so a run killed before
    then leaves the old SAE whole."""
    if not cfg.out_dir:
        return None
    from saegeo.sae.formats import CFG_FILENAME

    out, ckpt_dir = Path(cfg.out_dir), _ckpt_dir(cfg)
    if cfg.overwrite:
        shutil.rmtree(ckpt_dir, ignore_errors=True)
        (out / TRAINING_LOG).unlink(missing_ok=True)
        return None
    ckpt = load_checkpoint(cfg)
    again = f"Rerun with the checkpoint's options, {OVERWRITE} to start a new run, or use another out_dir."
    if ckpt is not None and resume:
        state, tensors = ckpt
        saved = _weight_options(state["config"], int(tensors["sae.W_enc"].shape[1]))  # as built
        now = _weight_options(cfg.record(), d_sae)
        old_bits, new_bits = state.get("bitwise") or {}, bitwise_settings(cfg)
        # on another world size a resume is close, not bitwise (a documented choice); on the same one it is bitwise
        if old_bits.get("world_size") == new_bits["world_size"]:
            saved |= {BITWISE_NAMES[k]: v for k, v in old_bits.items() if k in BITWISE_NAMES}
            now |= {BITWISE_NAMES[k]: v for k, v in new_bits.items() if k in BITWISE_NAMES}
        changed = {
            key: (saved.get(key), now.get(key))
            for key in sorted(saved.keys() | now.keys())
            if saved.get(key) != now.get(key)
        }
        data = state.get("data_fingerprint")
        if data is None:  # a version-1 checkpoint: its provenance's data identity
            old = (state.get("provenance") or {}).get("data") or {}
            same_data = all(json_safe(source.identity.get(k)) == v for k, v in old.items())
        else:
            same_data = data == source.fingerprint
        if not same_data:  # named by path (when known) and the first digits of the manifest / tensor hash
            old_path = ((state.get("provenance") or {}).get("data") or {}).get("path")
            describe = lambda path, fp: f"{fp[:22]}" + (f" at {path}" if path else "")  # noqa: E731
            changed = {
                "data": (
                    describe(old_path, data or "other data"),
                    describe(source.identity.get("path"), source.fingerprint),
                ),
                **changed,
            }
        if changed:
            raise BadInputError(
                f"{ckpt_dir} holds a run with "
                + ", ".join(f"{key}={old!r}" for key, (old, _) in changed.items())
                + "; it cannot be resumed with "
                + ", ".join(f"{key}={new!r}" for key, (_, new) in changed.items())
                + f". {again}"
            )
    if (out / CFG_FILENAME).exists():
        raise BadInputError(
            f"{out} already holds a trained SAE ({CFG_FILENAME}); {OVERWRITE} to replace it, or choose another out_dir"
        )
    if ckpt is not None and not resume:
        raise BadInputError(
            f"{ckpt_dir} holds a checkpoint at step {ckpt[0]['step']} that a run without resume would replace; "
            f"{OVERWRITE} to discard it, or resume it"
        )
    # a training_log.jsonl without a checkpoint or an SAE is the history of a run killed before anything it could
    # resume from: the new run starts again and so does its log (a finished SAE's log is kept by the refusal above)
    return ckpt


def _restore(sae: SAE, opt: torch.optim.Adam, tensors: dict) -> None:
    sae.load_state_dict({k[4:]: v for k, v in tensors.items() if k.startswith("sae.")})
    for name, p in sae.named_parameters():
        if f"adam.{name}.exp_avg" in tensors:
            opt.state[p] = {
                "step": tensors[f"adam.{name}.step"].reshape(()).clone(),
                "exp_avg": tensors[f"adam.{name}.exp_avg"].reshape(p.shape).to(p.device).clone(),
                "exp_avg_sq": tensors[f"adam.{name}.exp_avg_sq"].reshape(p.shape).to(p.device).clone(),
            }


# =========================================================================== the training log
def read_training_log(path: str | os.PathLike) -> list[dict]:
    """The records of a training_log.jsonl (the file, or the SAE directory holding it) in order; [] when there is
    none. FormatError naming the line when one is not a JSON object."""
    path = Path(path)
    path = path / TRAINING_LOG if path.is_dir() else path
    if not path.is_file():
        return []
    records = []
    for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise FormatError(f"{path}, line {i}: not JSON ({err.msg})") from None
        if not isinstance(record, dict):
            raise FormatError(f"{path}, line {i}: a JSON {type(record).__name__}, not an object")
        records.append(record)
    return records


class _TrainingLog:
    """out_dir/training_log.jsonl (rank 0 only) and, with cfg.wandb, a W&B run: one record per logged step.

    A resumed run first rewrites the file from the checkpoint's history (the records up to its step; lines a
    killed run wrote after its last checkpoint are measured again), then appends, so the file always holds each
    logged step once, in order. A new run starts it empty; a finished SAE's directory is refused before that
    without overwrite (its log stays)."""

    def __init__(self, cfg: TrainConfig, history: list[dict], write: bool):
        self.path = Path(cfg.out_dir) / TRAINING_LOG if cfg.out_dir and write else None
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(self.path, "".join(_log_line(r) for r in history))
        self.wandb_run = None
        if cfg.wandb and write:
            try:
                import wandb
            except ImportError:
                raise BadInputError(
                    "--wandb needs the wandb package: pip install wandb (or pip install 'saegeo[wandb]')"
                ) from None
            self.wandb_run = wandb.init(
                project=cfg.wandb_project,
                config=json_safe(cfg.record()),
                dir=cfg.out_dir or None,
                name=Path(cfg.out_dir).name if cfg.out_dir else None,
            )

    def add(self, record: dict) -> None:
        if self.path is not None:
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(_log_line(record))
        if self.wandb_run is not None:
            self.wandb_run.log({k: v for k, v in record.items() if k != "step"}, step=record["step"])

    def close(self, summary: dict) -> dict | None:
        """Finish the W&B run (its summary: the held-out metrics); what provenance records of it."""
        if self.wandb_run is None:
            return None
        run = self.wandb_run
        run.summary.update({f"heldout/{k}": v for k, v in json_safe(summary).items() if isinstance(v, (int, float))})
        info = {"project": run.project, "id": run.id, "url": getattr(run, "url", None)}
        run.finish()
        return info


def _log_line(record: dict) -> str:
    return json.dumps(json_safe(record), allow_nan=False) + "\n"


def passes_over_data(cfg: TrainConfig, n_train_rows: int | None) -> float | None:
    """How many times the run walks its training rows: total_steps·batch_tokens / n_train (None: a stream)."""
    return None if not n_train_rows else cfg.total_steps * cfg.batch_tokens / n_train_rows


# =========================================================================== training
def lr_at(step: int, cfg: TrainConfig) -> float:
    """Linear warm-up over warmup_steps, constant, then linear decay to 0 over the last decay_fraction."""
    total = cfg.total_steps
    warm = min(1.0, (step + 1) / max(cfg.warmup_steps, 1))
    decay_steps = int(cfg.decay_fraction * total)
    decay = 1.0 if decay_steps == 0 else min(1.0, (total - step) / decay_steps)
    return cfg.lr * warm * decay


def _sae_config(cfg: TrainConfig, d_in: int) -> SAEConfig:
    d_sae = cfg.d_sae or cfg.expansion * d_in
    return SAEConfig(
        d_in=d_in, d_sae=d_sae, activation=cfg.arch, **get_architecture(cfg.arch).sae_config_fields(cfg, d_sae)
    )


def _rank_batches(source: Any, start_step: int, ctx: Any) -> Iterator[Tensor]:
    """torch.distributed: this rank's part (batch_tokens/world rows) of every global batch.

    Store: the rank streams its own shards (rank::world of each epoch's seeded shard order), so ranks
    read disjoint data and the order depends on the world size. Tensor / iterator: the rank's
    contiguous rows of the single-process batch, so every world size trains on the same batches.
    """
    from saegeo.distributed import rank_rows

    if isinstance(source, _StoreSource):
        train_rows = sorted(s.rows for s, off in zip(source.store.shards, source.store.offsets) if off < source.n_train)
        if sum(train_rows[: len(train_rows) // ctx.world_size]) < source.cfg.batch_tokens // ctx.world_size:
            raise BadInputError(
                f"{source.store.path}: {len(train_rows)} training shard(s) cannot give each of {ctx.world_size} "
                f"ranks a batch of {source.cfg.batch_tokens // ctx.world_size} rows every epoch; use fewer ranks or "
                "re-cache with more, smaller shards"
            )
        source.rank, source.world = ctx.rank, ctx.world_size
        yield from source.train_batches(start_step)
    else:
        for b in source.train_batches(start_step):
            yield b[rank_rows(b.shape[0], ctx.rank, ctx.world_size)]


def refuse_untrainable(x: Float[Tensor, "n d"], where: str) -> None:
    """BadInputError, before any training step, for rows no float32 training can learn from, with the reason:
    every row the same vector (total variance Σ_j Var(x_j) = 0: all zeros, or one constant row repeated);
    values whose squared norm max|x|²·d exceeds float32's maximum (3.4e38: the loss overflows); a spread
    sqrt(Σ_j Var(x_j)/d) below sqrt(float32's smallest normal) ≈ 1.1e-19 (the residuals square to zero)."""
    import math

    x64 = x.double()
    n, d = x64.shape
    f32 = torch.finfo(torch.float32)
    finite = x64[torch.isfinite(x64).all(dim=1)]
    if finite.shape[0] == 0:
        return  # non-finite rows are named (or skipped) by the source's own screen
    big = finite.abs().max().item()
    if big * big * d > f32.max:
        raise BadInputError(
            f"{where}: values reach {big:.3g}, so squared norms reach {big * big * d:.3g} and overflow float32 "
            f"(max {f32.max:.3g}), the type training computes its loss in; rescale the activations (e.g. divide "
            "by their RMS norm) and rerun"
        )
    spread = math.sqrt(finite.var(dim=0, unbiased=False).sum().item() / d)
    if spread == 0:
        what = "all zeros" if big == 0 else "one and the same vector"
        raise BadInputError(
            f"{where}: the {finite.shape[0]:,} rows read to initialise b_dec are {what} (zero variance): there "
            "is nothing for an SAE to learn; check the hook or the layer the activations came from"
        )
    if spread < math.sqrt(f32.tiny):
        raise BadInputError(
            f"{where}: the rows vary by only {spread:.3g} per coordinate; their squares underflow float32 (below "
            f"its smallest normal, {f32.tiny:.3g}), so training would see zeros; rescale the activations and rerun"
        )


def train_sae(
    cfg: TrainConfig,
    data: Any,
    *,
    resume: bool = True,
    on_step: Callable[[int, dict], None] | None = None,
) -> TrainResult:
    """Train an SAE on `data` as configured (see _train_sae), holding out_dir's writer lock while it runs:
    two trainings into one out_dir would race on its checkpoint files, so the second is refused naming the
    first one's pid."""
    from saegeo import distributed

    distributed.resolve_device(cfg.device)  # a bad device is refused before out_dir is created
    lock, out = None, Path(cfg.out_dir) if cfg.out_dir else None
    created = out is not None and not out.exists()
    if out is not None and distributed.env_rank_world()[0] == 0:
        out.mkdir(parents=True, exist_ok=True)
        lock = writer_lock(out, "SAE directory (a training run)")
    try:
        return _train_sae(cfg, data, resume=resume, on_step=on_step)
    finally:
        if lock is not None:
            lock.truncate(0)  # no stale pid once done
            lock.close()
            if created and os.listdir(out) == [Path(lock.name).name]:  # refused before any work: nothing left
                shutil.rmtree(out, ignore_errors=True)


def _train_sae(
    cfg: TrainConfig,
    data: Any,
    *,
    resume: bool = True,
    on_step: Callable[[int, dict], None] | None = None,
) -> TrainResult:
    """Train an SAE on `data` (tensor, ActivationStore/path, iterator or callable) as configured.

    Resumes from cfg.out_dir/checkpoint when one exists (and resume=True). Writes the final SAE to
    cfg.out_dir in the SAELens layout (see saegeo.sae.formats). `on_step(step, live)` is called after
    every optimiser step (the tests use it to kill a run).

    Under torchrun (WORLD_SIZE > 1) the same call trains with DistributedDataParallel: cfg.batch_tokens
    stays the global batch (each rank computes batch_tokens/world rows), b_dec's mean and the dead-latent
    counts are reduced over ranks, rank 0 writes checkpoints and the SAE, and a checkpoint resumes on
    any world size (`_Ranks`, saegeo.distributed).
    """
    cfg = cfg.resolved()  # the architecture's lr where none was given: recorded and checked on resume
    ranks = _Ranks.start(cfg)  # the device, and the torchrun job if there is one
    source = make_source(data, cfg)
    arch = get_architecture(cfg.arch)  # its objective, init, threshold updates: the loop below is the same for all
    sae = _new_sae(cfg, source.d, ranks.device)
    opt = torch.optim.Adam(arch.param_groups(sae, cfg), lr=cfg.lr, betas=cfg.adam_betas)
    run = _start_or_resume(cfg, source, sae, opt, resume, ranks)  # b_dec, init; or the checkpoint's state
    meter = _Meter(cfg, source, ranks, run)  # the live metrics, read back and logged every log_every steps
    guard = _NonFiniteGuard(cfg, run.start_step)
    batches = ranks.batches(source, run.start_step)
    forward_train = ranks.wrap(sae)  # DDP: gradients averaged over ranks
    unit_decoder = arch.unit_decoder(cfg)
    # --dtype bfloat16: the forward (and the hand-written backwards, which read the autocast state) in bfloat16;
    # the parameters, their gradients, Adam's moments and the sums of the metrics stay float32 / float64
    autocast = dict(device_type=ranks.device.type, dtype=getattr(torch, cfg.dtype), enabled=cfg.dtype != "float32")
    sae.train()
    for step in range(run.start_step, cfg.total_steps):
        x = next(batches).to(ranks.device, non_blocking=True)
        for group in opt.param_groups:
            group["lr"] = lr_at(step, cfg) * group["lr_scale"]
        with torch.autocast(**autocast):
            out = forward_train(
                x,
                dead_mask=run.since_fired > cfg.dead_window_tokens,
                centred_ss_fn=ranks.centred_ss_fn,
                **arch.step_options(cfg, step, source.d),
            )
        opt.zero_grad(set_to_none=True)
        out.loss.backward()
        if unit_decoder:
            sae.remove_parallel_decoder_grad()
        if cfg.grad_clip_norm:
            torch.nn.utils.clip_grad_norm_(sae.parameters(), cfg.grad_clip_norm)
        opt.step()
        if unit_decoder:
            sae.normalize_decoder()
        arch.after_step(sae, out, step, cfg, ranks.mean)  # thresholds

        run.since_fired += x.shape[0] * ranks.world
        run.since_fired.masked_fill_(ranks.fired(out), 0)
        meter.add(x, out)
        guard.see(out.loss)
        done = step + 1
        is_log = done % cfg.log_every == 0 or done == cfg.total_steps
        is_ckpt = cfg.out_dir and cfg.checkpoint_every and done % cfg.checkpoint_every == 0
        if is_log or is_ckpt:
            guard.check(done, lr_at(step, cfg), ranks)  # read only here: no host sync a step
        if is_log:
            meter.log(done, lr_at(step, cfg), run.since_fired)
        if is_ckpt:
            if ranks.is_main:
                save_checkpoint(cfg, sae, opt, done, run.checkpoint_extra, run.checkpoint_tensors(meter))
            guard.last_good = done
        if on_step is not None:
            on_step(done, {})
    return _finish(cfg, sae, opt, source, run, meter, ranks)


class _Ranks:
    """What a torchrun job changes in the loop, and the identities it reduces to in one process: the device, the
    rank's share of each batch, the gradient averaging (DDP), the sums over ranks of the losses' normalisers, the
    fired latents and the metrics."""

    def __init__(self, cfg: TrainConfig, device: torch.device, ctx: Any) -> None:
        from saegeo import distributed

        self.cfg, self.device, self.ctx = cfg, device, ctx
        self.world = ctx.world_size if ctx is not None else 1
        self.is_main = ctx is None or ctx.is_main
        # the global batch's centred sums of squares (÷ world: DDP averages the ranks' losses)
        self.centred_ss_fn = None if ctx is None else (lambda t: distributed.centred_sum_of_squares(t) / self.world)

    @classmethod
    def start(cls, cfg: TrainConfig) -> _Ranks:
        """Threads, the allocator, the device, and the job torchrun started (None without one)."""
        from saegeo import distributed

        if cfg.num_threads:
            torch.set_num_threads(cfg.num_threads)
        device = distributed.resolve_device(cfg.device)
        if device.type == "cpu":
            keep_freed_memory()
        ctx = distributed.init_from_env()
        if ctx is not None:
            device = ctx.device if device.type == "cuda" else device
            if cfg.batch_tokens % ctx.world_size:
                raise BadInputError(f"batch_tokens {cfg.batch_tokens} is not divisible by the {ctx.world_size} ranks")
        return cls(cfg, device, ctx)

    def batches(self, source: Any, start_step: int) -> Iterator[Tensor]:
        return source.train_batches(start_step) if self.ctx is None else _rank_batches(source, start_step, self.ctx)

    def wrap(self, sae: SAE) -> Callable[..., TrainOutput]:
        from saegeo import distributed

        return distributed.wrap_ddp(sae, "forward_train")

    def mean(self, t: Tensor) -> Tensor:
        """A tensor's mean over the ranks (itself in one process)."""
        from saegeo import distributed

        return t if self.ctx is None else distributed.sum_across_ranks(t) / self.world

    def sum(self, t: Any) -> Any:
        from saegeo import distributed

        return distributed.sum_across_ranks(t)

    def fired(self, out: TrainOutput) -> Tensor:
        """The latents that fired on some row of the global batch."""
        return out.fired if self.ctx is None else self.sum(out.fire_count) > 0

    def any(self, flag: Tensor) -> bool:
        return bool(flag) if self.ctx is None else self.sum(int(flag)) > 0


def _new_sae(cfg: TrainConfig, d_in: int, device: torch.device) -> SAE:
    sae_cfg = _sae_config(cfg, d_in)
    # W_enc and W_dec in float32, each with its gradient and two Adam moments
    require_memory(2 * sae_cfg.d_in * sae_cfg.d_sae * 4 * 4, f"an SAE of d_sae={sae_cfg.d_sae} on d_in={sae_cfg.d_in}")
    if cfg.out_dir:  # the saved SAE's float32 W_enc and W_dec, and a checkpoint's weights and Adam moments (3×)
        weights = 2 * sae_cfg.d_in * sae_cfg.d_sae * 4
        require_disk(
            cfg.out_dir,
            weights * (4 if cfg.checkpoint_every else 1),
            f"the SAE of d_sae={sae_cfg.d_sae} on d_in={sae_cfg.d_in}{' and its checkpoints' if cfg.checkpoint_every else ''}",
        )
    return SAE(sae_cfg, device=device)


@dataclass
class _RunState:
    """What a run carries from its start (or its checkpoint) through the loop to its result."""

    start_step: int
    history: list[dict]  # the logged records (live reference: the checkpoint saves it as it stands)
    activation_mean: Tensor
    since_fired: Tensor  # tokens since each latent last fired
    provenance: dict
    checkpoint_extra: dict
    tensors: dict | None  # the checkpoint's tensors on resume

    def checkpoint_tensors(self, meter: _Meter) -> dict:
        return {
            "activation_mean": self.activation_mean,
            "tokens_since_fired": self.since_fired.cpu(),
            "torch_rng": torch.get_rng_state(),
            **meter.state(),
        }


def _start_or_resume(
    cfg: TrainConfig, source: Any, sae: SAE, opt: torch.optim.Adam, resume: bool, ranks: _Ranks
) -> _RunState:
    """A new run: b_dec and the weights initialised (seeded); a resumed one: the checkpoint's weights, Adam state,
    history, mean, dead counts and RNG state. Either way the provenance the SAE will be saved with."""
    from saegeo import distributed

    ckpt = distributed.from_main(lambda: _open_checkpoint(cfg, source, sae.cfg.d_sae, resume), "reading the checkpoint")
    if ckpt is not None:
        state, tensors = ckpt
        _restore(sae, opt, tensors)
        start_step, history = state["step"], state["history"]
        activation_mean = tensors["activation_mean"]
        since_fired = tensors["tokens_since_fired"].to(ranks.device)
        torch.set_rng_state(tensors["torch_rng"])
    else:
        start_step, history, tensors = 0, [], None
        activation_mean = _initialise(cfg, source, sae)
        since_fired = torch.zeros(sae.cfg.d_sae, dtype=torch.long, device=ranks.device)
    provenance = _provenance(cfg, source, announce=ckpt is None and ranks.is_main)
    if ranks.ctx is not None:
        provenance["world_size"] = ranks.world
    extra = {"history": history, "provenance": provenance, "data_fingerprint": source.fingerprint}
    return _RunState(start_step, history, activation_mean, since_fired, provenance, extra, tensors)


def _initialise(cfg: TrainConfig, source: Any, sae: SAE) -> Tensor:
    """A new run's start: the data checked to be trainable, b_dec (mean, geometric median or zeros), the weights
    and the architecture's own init (seeded). Returns the streamed float64 mean of the training rows (the metrics
    need it whatever b_dec is)."""
    from saegeo import distributed

    torch.manual_seed(cfg.seed)
    where = source.identity.get("path") or f"the training {source.identity['source']}"
    refuse_untrainable(next(iter(source.init_rows(min(cfg.b_dec_init_tokens, 65_536)))), where)
    # mean_across_ranks is the plain streamed mean without torchrun
    activation_mean = distributed.mean_across_ranks(source.init_rows(cfg.b_dec_init_tokens))
    if cfg.b_dec_init == "mean":
        b_dec = activation_mean
    elif cfg.b_dec_init == "geometric_median":
        b_dec = geometric_median(torch.cat(list(source.init_rows(min(cfg.b_dec_init_tokens, 32_768)))))
    else:
        b_dec = torch.zeros(source.d)
    sae.init_weights(torch.Generator().manual_seed(cfg.seed), b_dec=b_dec.float())
    sae.architecture.init_training(sae, cfg, lambda n: next(iter(source.init_rows(n))))
    return activation_mean


def _provenance(cfg: TrainConfig, source: Any, announce: bool) -> dict:
    """What the saved SAE records of its training (cfg.json's saegeo block); `announce` prints how b_dec is
    initialised and how many passes over the data the run makes."""
    b_dec_rows = source.init_description(
        min(cfg.b_dec_init_tokens, 32_768) if cfg.b_dec_init == "geometric_median" else cfg.b_dec_init_tokens
    )
    passes = passes_over_data(cfg, source.n_train_rows)
    if announce and cfg.progress:
        from tqdm.std import tqdm  # only write(): tqdm.auto warns in a kernel without ipywidgets

        tqdm.write(f"b_dec init = {cfg.b_dec_init}: {b_dec_rows['method']}, {b_dec_rows['n_rows']:,} rows")
        if passes is not None and passes > 1:
            tqdm.write(
                f"{cfg.total_steps * cfg.batch_tokens:,} training tokens = {passes:.1f} passes over the "
                f"{source.n_train_rows:,} training rows of the {source.identity['source']} (each pass reshuffled)"
            )
    return {
        "b_dec_init": cfg.b_dec_init,
        "b_dec_init_tokens": cfg.b_dec_init_tokens,
        "b_dec_init_rows": b_dec_rows,
        "preprocessing": "none",
        "data": source.identity,
        "train_config": cfg.record(),
        "training_rows": source.n_train_rows,
        "passes_over_data": passes,
    }


class _Meter:
    """The live metrics: summed on the device every step (no host sync), read back every log_every steps into one
    record of the interval (step, tokens, passes, loss, each of the architecture's loss terms by name, MSE, FVE,
    L0, dead share, lr, throughput), appended to the history, training_log.jsonl and the progress bar."""

    BASE = ("sse", "css", "l0", "loss", "n", "steps")

    def __init__(self, cfg: TrainConfig, source: Any, ranks: _Ranks, run: _RunState) -> None:
        self.cfg, self.source, self.ranks, self.history = cfg, source, ranks, run.history
        zero = lambda: torch.zeros((), device=ranks.device, dtype=torch.float64)  # noqa: E731
        self.sums = {key: zero() for key in self.BASE}
        self.terms: dict[str, Tensor] = {}  # each loss term's sum, in the order the forward returns them
        self.loss_known = True  # False for the first interval after resuming a version-3 checkpoint (no loss kept)
        self.legacy_aux = None  # a version-4 checkpoint's one term, summed as "aux"
        tensors = run.tensors or {}
        if run.tensors is not None:
            for key, total in self.sums.items():
                if f"acc.{key}" in tensors:
                    total += tensors[f"acc.{key}"].to(ranks.device).reshape(())
                elif key == "steps":  # the steps since the last log (the sums are zeroed at each log)
                    total += run.start_step % cfg.log_every
                else:
                    self.loss_known = False
            for key, value in tensors.items():
                if key.startswith("acc.term."):
                    self.terms[key.removeprefix("acc.term.")] = value.to(ranks.device).reshape(()).double()
            if "acc.aux" in tensors:  # a checkpoint of version 4 or before: the one term, folded in at its first add
                self.legacy_aux = tensors["acc.aux"].to(ranks.device).reshape(())
        self.log_file = _TrainingLog(cfg, run.history, write=True) if ranks.is_main else None  # rank 0 writes it
        self.bar = None
        if cfg.progress and ranks.is_main:
            self.bar = progress_bar(
                total=cfg.total_steps * cfg.batch_tokens,
                initial=run.start_step * cfg.batch_tokens,
                unit="tok",
                unit_scale=True,
                desc=f"train {cfg.arch}",
                dynamic_ncols=True,
            )
        self.t0, self.tokens_timed = time.perf_counter(), 0

    def add(self, x: Tensor, out: TrainOutput) -> None:
        self.sums["sse"] += out.sse
        self.sums["css"] += out.centred_ss.detach()
        self.sums["l0"] += out.l0_sum
        for name, value in out.terms.items():
            if name not in self.terms:
                self.terms[name] = torch.zeros((), device=self.ranks.device, dtype=torch.float64)
                if self.legacy_aux is not None and len(out.terms) == 1:
                    self.terms[name] += self.legacy_aux
            self.terms[name] += value
        self.legacy_aux = None
        self.sums["loss"] += out.loss.detach()
        self.sums["n"] += x.shape[0]
        self.sums["steps"] += 1
        self.tokens_timed += x.shape[0] * self.ranks.world

    def log(self, done: int, lr: float, since_fired: Tensor) -> dict:
        """One record of the interval since the last log; the sums start again."""
        cfg, world = self.cfg, self.ranks.world
        keys = [*self.sums, *(f"term.{name}" for name in self.terms)]
        totals = self.ranks.sum(torch.stack([*self.sums.values(), *self.terms.values()])).tolist()
        vals = dict(zip(keys, totals))
        # each rank's terms and loss are already means over the global batch; steps are counted on every rank
        steps = vals["steps"] / world
        n_train = self.source.n_train_rows
        live = {
            "step": done,
            "tokens": done * cfg.batch_tokens,
            "passes": done * cfg.batch_tokens / n_train if n_train else None,
            "loss": vals["loss"] / world / steps if self.loss_known else None,
            **{name: vals[f"term.{name}"] / world / steps for name in self.terms},
            "mse": vals["sse"] / (vals["n"] * self.source.d),
            "fve": 1 - vals["sse"] / vals["css"],
            "l0": vals["l0"] / vals["n"],
            "dead": float((since_fired > cfg.dead_window_tokens).float().mean()),
            "lr": lr,
            "tok_s": self.tokens_timed / (time.perf_counter() - self.t0),
        }
        self.history.append(live)
        if self.log_file is not None:
            self.log_file.add(live)
        self.loss_known = True
        for total in [*self.sums.values(), *self.terms.values()]:
            total.zero_()
        if self.bar is not None:
            self.bar.update(done * cfg.batch_tokens - self.bar.n)
            self.bar.set_postfix(fve=f"{live['fve']:.3f}", l0=f"{live['l0']:.1f}", dead=f"{live['dead']:.2f}")
        return live

    def state(self) -> dict:
        """The sums since the last log, as a checkpoint keeps them."""
        sums = {f"acc.{k}": v.reshape(1).cpu() for k, v in self.sums.items()}
        return sums | {f"acc.term.{k}": v.reshape(1).cpu() for k, v in self.terms.items()}

    def close(self, heldout: dict) -> dict | None:
        if self.bar is not None:
            self.bar.close()
        return self.log_file.close(heldout) if self.log_file is not None else None


class _NonFiniteGuard:
    """A NaN/inf loss stops the run at the next log or checkpoint (the flag is summed on the device every step, read
    only then), naming the steps between and the last good checkpoint, which is kept."""

    def __init__(self, cfg: TrainConfig, start_step: int) -> None:
        self.cfg = cfg
        self.flag: Tensor | None = None
        self.last_good = self.last_checked = start_step  # the last checkpoint written; the last step checked

    def see(self, loss: Tensor) -> None:
        bad = ~torch.isfinite(loss.detach())
        self.flag = bad if self.flag is None else self.flag | bad

    def check(self, done: int, lr: float, ranks: _Ranks) -> None:
        """NonFiniteLossError when a loss since the start was NaN/inf (on any rank)."""
        if self.flag is not None and ranks.any(self.flag):
            cfg = self.cfg
            kept = (
                f"the last good checkpoint (step {self.last_good}) is kept in {_ckpt_dir(cfg)}"
                if cfg.out_dir and cfg.checkpoint_every and self.last_good
                else "no checkpoint was written"
            )
            raise NonFiniteLossError(
                f"non-finite loss between steps {self.last_checked + 1} and {done} (lr {lr:.3g}); {kept}. Every "
                "training row was finite (each batch is checked as it is read): the optimisation diverged. Lower "
                "the learning rate (or check the loss options), then resume."
            )
        self.last_checked = done


def _finish(
    cfg: TrainConfig, sae: SAE, opt: torch.optim.Adam, source: Any, run: _RunState, meter: _Meter, ranks: _Ranks
) -> TrainResult:
    """After the last step: unit decoder rows, the held-out metrics, the SAE (and a last checkpoint) saved."""
    from saegeo import distributed

    sae.eval()
    if not sae.architecture.unit_decoder(cfg):
        sae.fold_decoder_norms()  # same codes·rows, unit rows: what saegeo's readers and the report expect
    heldout = distributed.from_main(
        lambda: evaluate(
            sae,
            source.heldout_batches(),
            run.activation_mean,
            first_row=source.heldout_first_row,
            skip_nonfinite=cfg.skip_nonfinite,
        ),
        "evaluating the held-out rows",
    )
    provenance = run.provenance
    if cfg.skip_nonfinite:  # the source screened the rows (and named them by shard); evaluate saw clean ones
        heldout["nonfinite_rows_skipped"] = distributed.from_main(lambda: source.skipped["heldout"], "counting")
        provenance["nonfinite_rows_skipped"] = dict(source.skipped)
    provenance["metrics"] = {"heldout": heldout, "final_live": run.history[-1] if run.history else {}}
    if (wandb_info := meter.close(heldout)) is not None:
        provenance["wandb"] = wandb_info
    if cfg.out_dir and ranks.is_main:
        sae.save(cfg.out_dir, provenance)
        if cfg.checkpoint_every:
            save_checkpoint(cfg, sae, opt, cfg.total_steps, run.checkpoint_extra, run.checkpoint_tensors(meter))
    distributed.barrier()  # under torchrun: the SAE is on disk when any rank returns
    return TrainResult(
        sae=sae,
        history=run.history,
        heldout=heldout,
        activation_mean=run.activation_mean,
        config=cfg,
        out_dir=cfg.out_dir,
        provenance=provenance,
    )
