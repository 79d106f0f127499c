"""SAE trainer: TopK, BatchTopK, JumpReLU and ReLU+L1; b_dec := mean of the activations, unit-norm decoder,
AuxK / L1 / L0 target, checkpoints, resume.

Read top to bottom: config -> data sources -> b_dec init -> metrics -> checkpoints -> train_sae.

Data sources and their held-out split (the split is always decided before anything is trained):
  * in-memory tensor (n, d): the LAST `heldout_fraction` of rows (in the given order) is held out;
    training walks the rest in a fresh seeded permutation each epoch.
  * ActivationStore: the LAST `heldout_fraction` of rows in store order (i.e. the last context
    windows cached) is held out; training streams the other rows shard by shard in a seeded shard
    order, mixed through a shuffle buffer of `shuffle_buffer` rows.
  * iterator / generator of batches (tensors or (activations, codes) tuples, e.g. the synthetic
    generator) or a zero-argument callable returning one: the FIRST
    max(heldout_fraction · total_tokens, batch_size) rows are held out, the rest streamed in order.
    Pass a callable: b_dec init and resume replay the stream from its start. A bare iterator is
    refused (with that advice) when b_dec is estimated.
Every source is deterministic given `seed`, so a resumed run sees exactly the batches it would have.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Literal, Mapping, get_args

import torch
from jaxtyping import Float
from safetensors.torch import load_file
from safetensors.torch import save as safetensors_bytes
from torch import Tensor

from saegeo.io import atomic_write, config_from_dict, dump_json
from saegeo.errors import BadInputError, SaegeoError
from saegeo.sae.metrics import SAEMetrics
from saegeo.sae.model import SAE, SAEConfig

Arch = Literal["topk", "relu", "batchtopk", "jumprelu"]
BDecInit = Literal["mean", "zeros", "geometric_median"]
DecoderNorm = Literal["unit", "free"]
ARCHS: tuple[str, ...] = get_args(Arch)
B_DEC_INITS: tuple[str, ...] = get_args(BDecInit)
_RESUME_MUST_MATCH = ("seed", "batch_size", "arch", "d_sae")  # + k for _K_ARCHS: they fix the batches and the model
CHECKPOINT_VERSION = 1
# ReLU+L1 with unit-norm decoder rows: Adam moves a row's direction by about lr·√d_in per step, where SAELens'
# rows of norm 0.1 turn 10× faster at the same lr; 1e-3 measured on MiniLM layer 3 (README "ReLU+L1 recipe";
# benchmarks/train_bench.py trains ReLU with it).
RELU_LR = 1e-3
_K_ARCHS = ("topk", "batchtopk", "jumprelu")  # archs whose k shapes the model (jumprelu: its L0 target)


class NonFiniteLossError(SaegeoError):
    """Training produced a NaN/inf loss; the last good checkpoint is left untouched."""


# =========================================================================== config
@dataclass
class TrainConfig:
    """One SAE training run. Token counts are rows (tokens) of activations."""

    arch: Arch = "topk"  # SAE architecture
    d_sae: int | None = None  # number of latents (overrides expansion); default expansion · d_in
    expansion: int = 8  # d_sae = expansion · d_in
    k: int = 32  # active latents per token (topk; batchtopk: on average over the batch; jumprelu: the L0 target)
    l1_coefficient: float = 1.0  # L1 coefficient (relu only); same objective scale as SAELens Standard
    l1_warmup_fraction: float = 0.0  # relu: the L1 coefficient rises linearly from 0 over this fraction of the steps
    decoder_norm: DecoderNorm = "unit"  # relu: unit-norm decoder rows, or free norms (penalty Σ a_i‖w_i‖, folded to unit at the end)
    grad_clip_norm: float | None = None  # clip the gradient to this global norm (SAELens: 1)
    lr: float = 3e-4  # Adam learning rate (relu: 1e-3 recommended, see RELU_LR)
    adam_betas: tuple[float, float] = (0.9, 0.999)  # Adam (beta1, beta2)
    warmup_steps: int = 10  # linear warm-up from lr/warmup_steps to lr
    decay_fraction: float = 0.2  # linear decay to 0 over the last fraction of steps (0 = constant)
    batch_size: int = 4096  # tokens per step
    total_tokens: int = 2_000_000  # training tokens, e.g. 2M or 500k
    b_dec_init: BDecInit = "mean"  # b_dec at init: activation mean, zeros (SAELens' default) or geometric median
    b_dec_init_tokens: int = 100_000  # rows used to estimate the mean / geometric median
    dead_window_tokens: int = 200_000  # a latent that has not fired in this many tokens counts as dead
    aux_k: int | None = None  # AuxK latents (topk); default d_in // 2
    aux_coefficient: float = 1 / 32  # weight of the AuxK loss (topk, batchtopk)
    threshold_ema: float = 0.05  # batchtopk: inference threshold = running mean, then EMA at this rate, of the smallest code kept
    l0_coefficient: float = 1.0  # jumprelu: weight of the sparsity loss (L0/k − 1)²
    bandwidth: float = 0.05  # jumprelu: width ε of the rectangle kernel of the threshold's straight-through estimator
    threshold_lr_scale: float = 10.0  # jumprelu: the thresholds' learning rate is lr times this
    heldout_fraction: float = 0.1  # fraction of the data held out for the final metrics
    shuffle_buffer: int = 65_536  # store source: rows mixed across shards
    seed: int = 0  # seeds the init and the data order
    log_every: int = 10  # metrics are read back from the device only every log_every steps
    checkpoint_every: int = 0  # steps between checkpoints; 0 = no intermediate checkpoints
    out_dir: str | None = None  # checkpoints and the final SAE (SAELens layout) go here
    device: str = "cpu"  # torch device to train on
    num_threads: int | None = None  # torch.set_num_threads; None leaves torch's default
    progress: bool = True  # progress bar

    def __post_init__(self) -> None:
        if self.arch not in ARCHS:
            raise BadInputError(f"arch={self.arch!r}: the trainer supports {', '.join(map(repr, ARCHS))}")
        if self.b_dec_init not in B_DEC_INITS:
            raise BadInputError(f"b_dec_init={self.b_dec_init!r}; expected one of {B_DEC_INITS}")
        if not 0 <= self.heldout_fraction < 1:
            raise BadInputError(f"heldout_fraction must be in [0, 1), got {self.heldout_fraction}")
        if self.batch_size < 1 or self.total_tokens < self.batch_size:
            raise BadInputError(
                f"total_tokens ({self.total_tokens}) must be at least one batch ({self.batch_size})"
            )
        self.adam_betas = tuple(self.adam_betas)

    @property
    def total_steps(self) -> int:
        return self.total_tokens // self.batch_size

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str | None = None) -> "TrainConfig":
        return config_from_dict(cls, d, "training option", where)


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
def _rows(batch: Any) -> Tensor:
    """A batch from any source as a float32 (n, d) tensor; (activations, codes) tuples keep activations."""
    if isinstance(batch, (tuple, list)):
        batch = batch[0]
    return torch.as_tensor(batch).float()


class _TensorSource:
    def __init__(self, x: Tensor, cfg: TrainConfig):
        if x.ndim != 2:
            raise BadInputError(f"training tensor must be (n, d), got shape {tuple(x.shape)}")
        n_held = int(round(x.shape[0] * cfg.heldout_fraction))
        self.train_x, self.heldout_x = x[: x.shape[0] - n_held], x[x.shape[0] - n_held :]
        if self.train_x.shape[0] < cfg.batch_size:
            raise BadInputError(
                f"{self.train_x.shape[0]} training rows after holding out {n_held}; need at least one batch "
                f"of {cfg.batch_size}"
            )
        self.d, self.cfg = x.shape[1], cfg
        self.identity = {"source": "tensor", "rows": int(x.shape[0]), "heldout": "last fraction of rows"}

    def train_batches(self, start_step: int) -> Iterator[Tensor]:
        n, bs = self.train_x.shape[0], self.cfg.batch_size
        per_epoch = n // bs  # the ragged tail of each permutation is dropped
        epoch, i = divmod(start_step, per_epoch)
        while True:
            g = torch.Generator().manual_seed(self.cfg.seed * 1_000_003 + epoch)
            perm = torch.randperm(n, generator=g)
            for j in range(i, per_epoch):
                yield self.train_x[perm[j * bs : (j + 1) * bs]].float()
            epoch, i = epoch + 1, 0

    def init_rows(self, n: int) -> Iterator[Tensor]:
        yield self.train_x[:n].float()

    def heldout_batches(self) -> Iterator[Tensor]:
        for lo in range(0, self.heldout_x.shape[0], self.cfg.batch_size):
            yield self.heldout_x[lo : lo + self.cfg.batch_size].float()


class _StoreSource:
    def __init__(self, store, cfg: TrainConfig):
        self.store, self.cfg, self.d = store, cfg, store.d
        self.n_train = store.n_tokens - int(round(store.n_tokens * cfg.heldout_fraction))
        if self.n_train < cfg.batch_size:
            raise BadInputError(f"{store.path}: {self.n_train} training rows, need at least one batch of {cfg.batch_size}")
        self.identity = {
            "source": "store", "path": str(store.path), "model": store.model, "hook": store.hook,
            "n_tokens": store.n_tokens, "corpus": store.corpus,
            "shard_sha256": [s.sha256 for s in store.shards],
            "heldout": f"last {store.n_tokens - self.n_train} rows in store order",
        }

    rank, world = 0, 1  # torch.distributed (set by train_sae): this rank streams shards rank::world

    def _epoch(self, epoch: int, skip: int = 0) -> Iterator[Tensor | None]:
        """One epoch of the training rows, batch for batch what ``store.iter_batches(shuffle=True,
        drop_last=True)`` gives: a seeded shard order (this rank's every world-th shard), rows mixed through a
        shuffle buffer, whole batches of batch_size/world rows only.

        The first `skip` batches come out as None without reading anything: the shard order and every
        permutation of the buffer depend only on row counts and the seed, so they are replayed on global row
        indices. Rows are read from the first batch on that is yielded, and then only the rows still in the
        buffer (resume seeks instead of re-reading the shards before the saved position).
        """
        st, bs = self.store, self.cfg.batch_size // self.world
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
                        rows = self._read_global_rows(idx)
                    yield rows[lo : lo + bs]
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

    def _read_global_rows(self, idx: Tensor) -> Tensor:
        """Rows at global store indices `idx` (in that order). A shard that holds many of them is read whole;
        from one that holds a few (a resumed buffer keeps a geometrically shrinking tail of every earlier
        shard) only those rows are read, through a memory map of the safetensors file (pages touched only)."""
        out = torch.empty(idx.shape[0], self.d, dtype=torch.float32)
        offsets = self.store.offsets
        shard = torch.searchsorted(torch.from_numpy(offsets), idx, right=True) - 1
        for i in shard.unique().tolist():
            sel = (shard == i).nonzero().squeeze(1)
            local = idx[sel] - int(offsets[i])
            if 8 * sel.numel() >= self.store.shards[i].rows:
                out[sel] = self.store.read_shard(i)[local]
            else:
                out[sel] = self._mapped_rows(i, local)
        return out

    def _mapped_rows(self, i: int, local: Tensor) -> Tensor:
        import mmap

        info = self.store.shards[i]
        with open(self.store.path / info.file, "rb") as f:
            n_header = int.from_bytes(f.read(8), "little")
            entry = json.loads(f.read(n_header))["activations"]
            dtype = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}[entry["dtype"]]
            if tuple(entry["shape"]) != (info.rows, self.d):
                raise BadInputError(f"{self.store.path / info.file}: activations {entry['shape']}, manifest ({info.rows}, {self.d})")
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY) as mm:
                acts = torch.frombuffer(mm, dtype=dtype, count=info.rows * self.d, offset=8 + n_header + entry["data_offsets"][0])
                rows = acts.view(info.rows, self.d)[local].to(torch.float32)
                del acts
        return rows

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
        yield self.store.read_rows(0, min(n, self.n_train))

    def heldout_batches(self) -> Iterator[Tensor]:
        for lo in range(self.n_train, self.store.n_tokens, self.cfg.batch_size):
            yield self.store.read_rows(lo, min(lo + self.cfg.batch_size, self.store.n_tokens))


class _IteratorSource:
    def __init__(self, data: Iterable | Callable[[], Iterable], cfg: TrainConfig):
        self.factory = data if callable(data) and not hasattr(data, "__next__") else None
        self._once = None if self.factory else iter(data)
        self.cfg = cfg
        n_held = max(int(cfg.heldout_fraction * cfg.total_tokens), cfg.batch_size) if cfg.heldout_fraction else 0
        stream = self._stream()
        self.heldout_x = self._take(stream, n_held) if n_held else torch.empty(0)
        self._stream_after_heldout = stream
        probe = self.heldout_x if n_held else None
        if probe is None:
            first = next(stream)
            self._stream_after_heldout = _chain([first], stream)
            probe = first
        self.d = probe.shape[1]
        self.n_held = n_held
        self.identity = {"source": "iterator", "heldout": f"first {n_held} rows of the stream"}

    def _stream(self) -> Iterator[Tensor]:
        src = iter(self.factory()) if self.factory else self._once
        for b in src:
            yield _rows(b)

    def _stream_after_fresh_heldout(self) -> Iterator[Tensor]:
        """A fresh stream (needs the callable) past the held-out rows. No held-out rows: nothing skipped
        (`_take(stream, 0)` would still swallow one batch)."""
        stream = self._stream()
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
        bs, pending, step = self.cfg.batch_size, torch.empty(0, self.d), 0
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
        stream = self._stream_after_fresh_heldout()
        yield self._take(stream, n, allow_short=True)[:n]  # a short stream: its whole training part

    def heldout_batches(self) -> Iterator[Tensor]:
        for lo in range(0, self.heldout_x.shape[0], self.cfg.batch_size):
            yield self.heldout_x[lo : lo + self.cfg.batch_size]


def _chain(first: list, rest: Iterator) -> Iterator:
    yield from first
    yield from rest


def make_source(data: Any, cfg: TrainConfig):
    """Wrap a tensor, an ActivationStore (or a path to one), or an iterator/callable as a data source."""
    from saegeo.activations.store import ActivationStore

    if isinstance(data, (str, os.PathLike)):
        data = ActivationStore(data)
    if isinstance(data, ActivationStore):
        return _StoreSource(data, cfg)
    if isinstance(data, Tensor):
        return _TensorSource(data, cfg)
    if hasattr(data, "__array__") and not hasattr(data, "__next__"):
        return _TensorSource(torch.as_tensor(data), cfg)
    return _IteratorSource(data, cfg)


# =========================================================================== b_dec init
def _finite_init_rows(batches: Iterable[Tensor]) -> Iterator[Tensor]:
    """The batches unchanged, refusing the first inf/NaN row by its position (the mean would be NaN)."""
    n = 0
    for b in batches:
        finite = torch.isfinite(b).all(dim=1)
        if not bool(finite.all()):
            row = n + int((~finite).nonzero()[0])
            raise BadInputError(
                f"row {row} of the activations used to initialise b_dec is not finite (inf/NaN); "
                "clean or re-cache the data (`saegeo store verify`), or skip those rows"
            )
        n += b.shape[0]
        yield b


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
def evaluate(sae: SAE, batches: Iterable[Tensor], activation_mean: Tensor | None = None) -> dict:
    """Held-out metrics in one pass (``saegeo.sae.metrics.SAEMetrics``, the report's accumulator too).

    mse = SSE/(n·d); FVE = 1 − SSE / Σ‖x − x̄‖² (x̄ = held-out mean; centred SS by Chan's update in float64);
    L0 = mean active latents per row; dead = fraction of latents that never fire on these rows;
    dense = fraction firing on > 50% of rows; max|cos(W_dec, μ)| over decoder rows (μ = activation_mean,
    else the held-out mean); b_dec_dist = ‖b_dec − μ‖/‖μ‖.
    """
    metrics = SAEMetrics(sae)
    for x in batches:
        metrics.add(x)
    return metrics.summary(activation_mean)


# =========================================================================== checkpoints
def _ckpt_dir(cfg: TrainConfig) -> Path | None:
    return Path(cfg.out_dir) / "checkpoint" if cfg.out_dir else None


def save_checkpoint(cfg: TrainConfig, sae: SAE, opt: torch.optim.Adam, step: int, extra: dict, tensors: dict) -> None:
    """Write tensors_<step>.safetensors, then state.json pointing at it (atomic rename), then drop old files.

    A crash at any point leaves state.json naming a complete tensors file.
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
    atomic_write(d / fname, safetensors_bytes({k: v.cpu() for k, v in out.items()}))
    state = {"version": CHECKPOINT_VERSION, "step": step, "tensors": fname, "config": asdict(cfg), **extra}
    dump_json(state, d / "state.json")
    for old in d.glob("tensors_*.safetensors"):
        if old.name != fname:
            old.unlink()


def load_checkpoint(cfg: TrainConfig) -> tuple[dict, dict] | None:
    d = _ckpt_dir(cfg)
    if d is None or not (d / "state.json").exists():
        return None
    state = json.loads((d / "state.json").read_text())
    tensors = load_file(str(d / state["tensors"]))
    return state, tensors


def _restore(sae: SAE, opt: torch.optim.Adam, tensors: dict) -> None:
    sae.load_state_dict({k[4:]: v for k, v in tensors.items() if k.startswith("sae.")})
    for name, p in sae.named_parameters():
        if f"adam.{name}.exp_avg" in tensors:
            opt.state[p] = {
                "step": tensors[f"adam.{name}.step"].reshape(()).clone(),
                "exp_avg": tensors[f"adam.{name}.exp_avg"].reshape(p.shape).to(p.device).clone(),
                "exp_avg_sq": tensors[f"adam.{name}.exp_avg_sq"].reshape(p.shape).to(p.device).clone(),
            }


# =========================================================================== training
def lr_at(step: int, cfg: TrainConfig) -> float:
    """Linear warm-up over warmup_steps, constant, then linear decay to 0 over the last decay_fraction."""
    total = cfg.total_steps
    warm = min(1.0, (step + 1) / max(cfg.warmup_steps, 1))
    decay_steps = int(cfg.decay_fraction * total)
    decay = 1.0 if decay_steps == 0 else min(1.0, (total - step) / decay_steps)
    return cfg.lr * warm * decay


def l1_ramp(step: int, cfg: TrainConfig) -> float:
    """The L1 warm-up factor min(1, (step + 1)/(l1_warmup_fraction · total_steps)) (1 without warm-up)."""
    ramp_steps = cfg.l1_warmup_fraction * cfg.total_steps
    return 1.0 if ramp_steps <= 0 else min(1.0, (step + 1) / ramp_steps)


def _sae_config(cfg: TrainConfig, d_in: int) -> SAEConfig:
    d_sae = cfg.d_sae or cfg.expansion * d_in
    return SAEConfig(d_in=d_in, d_sae=d_sae, activation=cfg.arch, k=cfg.k if cfg.arch in _K_ARCHS else None)


@torch.no_grad()
def init_jumprelu_threshold(sae: SAE, x: Float[Tensor, "n d"], l0: float) -> None:
    """θ_i := the m-th largest pre-activation of latent i on the rows x, m = max(1, round(n·l0/d_sae)): every
    latent starts firing on an l0/d_sae share of the rows, so L0 starts at its target (the STE moves θ only
    by about lr per step, too slowly to come down from a dense start in a short run)."""
    pre = sae.pre_activations(x.to(sae.W_enc.device))
    m = max(1, min(pre.shape[0], round(pre.shape[0] * l0 / sae.cfg.d_sae)))
    sae.threshold.copy_(pre.topk(m, dim=0).values[-1].clamp_min(0.0))


@torch.no_grad()
def update_batchtopk_threshold(sae: SAE, min_kept: Tensor, step: int, rate: float) -> None:
    """θ ← θ + max(rate, 1/(step + 1))·(m − θ), m = the smallest positive code BatchTopK kept in this batch: the
    running mean of m for the first 1/rate steps, then an EMA (dictionary_learning and SAELens track the same m).
    At inference codes = relu(pre)·[relu(pre) > θ], which keeps about k per row."""
    sae.threshold.add_((min_kept.to(sae.threshold.dtype) - sae.threshold) * max(rate, 1.0 / (step + 1)))


def _rank_batches(source: Any, start_step: int, ctx: Any) -> Iterator[Tensor]:
    """torch.distributed: this rank's part (batch_size/world rows) of every global batch.

    Store: the rank streams its own shards (rank::world of each epoch's seeded shard order), so ranks
    read disjoint data and the order depends on the world size. Tensor / iterator: the rank's
    contiguous rows of the single-process batch, so every world size trains on the same batches.
    """
    from saegeo.distributed import rank_rows

    if isinstance(source, _StoreSource):
        train_rows = sorted(s.rows for s, off in zip(source.store.shards, source.store.offsets) if off < source.n_train)
        if sum(train_rows[: len(train_rows) // ctx.world_size]) < source.cfg.batch_size // ctx.world_size:
            raise BadInputError(
                f"{source.store.path}: {len(train_rows)} training shard(s) cannot give each of {ctx.world_size} "
                f"ranks a batch of {source.cfg.batch_size // ctx.world_size} rows every epoch; use fewer ranks or "
                "re-cache with more, smaller shards"
            )
        source.rank, source.world = ctx.rank, ctx.world_size
        yield from source.train_batches(start_step)
    else:
        for b in source.train_batches(start_step):
            yield b[rank_rows(b.shape[0], ctx.rank, ctx.world_size)]


def keep_freed_memory() -> bool:
    """glibc hands every freed block above its mmap threshold (≤ 32 MiB) back to the OS, so each step's
    (batch × d_sae) buffers (50 MB at 4096 × 3072) are page-faulted in again: ~15 % of a CPU training step,
    measured. Raise the mmap threshold to 1 GiB and the trim threshold to 2 GiB so the heap keeps and reuses
    them (mallopt M_MMAP_THRESHOLD = −3, M_TRIM_THRESHOLD = −1; process-wide; the same effect as the
    environment variables MALLOC_MMAP_THRESHOLD_ / MALLOC_TRIM_THRESHOLD_). False where libc is not glibc."""
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        return bool(libc.mallopt(-3, 1 << 30)) and bool(libc.mallopt(-1, 1 << 31))
    except (OSError, AttributeError):
        return False


def train_sae(
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

    Under torchrun (WORLD_SIZE > 1) the same call trains with DistributedDataParallel: cfg.batch_size
    stays the global batch (each rank computes batch_size/world rows), b_dec's mean and the dead-latent
    counts are reduced over ranks, rank 0 writes checkpoints and the SAE, and a checkpoint resumes on
    any world size (see saegeo.distributed).
    """
    from saegeo import distributed

    if cfg.num_threads:
        torch.set_num_threads(cfg.num_threads)
    device = torch.device(cfg.device)
    if device.type == "cpu":
        keep_freed_memory()
    ctx = distributed.init_from_env()
    if ctx is not None:
        device = ctx.device if device.type == "cuda" else device
        if cfg.batch_size % ctx.world_size:
            raise BadInputError(f"batch_size {cfg.batch_size} is not divisible by the {ctx.world_size} ranks")
    source = make_source(data, cfg)
    unit_decoder = cfg.decoder_norm == "unit" or cfg.arch != "relu"
    sae = SAE(_sae_config(cfg, source.d), device=device)
    groups: list[dict] = [{"params": [p for n, p in sae.named_parameters() if n != "threshold"], "lr_scale": 1.0}]
    if cfg.arch == "jumprelu":
        sae.threshold.requires_grad_(True)
        groups.append({"params": [sae.threshold], "lr_scale": cfg.threshold_lr_scale})
    opt = torch.optim.Adam(groups, lr=cfg.lr, betas=cfg.adam_betas)
    aux_k = cfg.aux_k if cfg.aux_k is not None else source.d // 2

    ckpt = distributed.from_main(lambda: load_checkpoint(cfg) if resume else None, "reading the checkpoint")
    if ckpt is not None:
        state, tensors = ckpt
        saved = {**state["config"], "d_sae": int(tensors["sae.W_enc"].shape[1])}  # as built: d_sae or expansion·d_in
        now = {**asdict(cfg), "d_sae": sae.cfg.d_sae}
        keys = _RESUME_MUST_MATCH + (("k",) if cfg.arch in _K_ARCHS else ())
        changed = {key: (saved.get(key), now[key]) for key in keys if saved.get(key) != now[key]}
        if changed:
            raise BadInputError(
                f"{_ckpt_dir(cfg)} holds a run with "
                + ", ".join(f"{key}={old!r}" for key, (old, _) in changed.items())
                + "; it cannot be resumed with "
                + ", ".join(f"{key}={new!r}" for key, (_, new) in changed.items())
                + ". Use another out_dir or delete the checkpoint."
            )
        _restore(sae, opt, tensors)
        start_step, history = state["step"], state["history"]
        activation_mean = tensors["activation_mean"]
        since_fired = tensors["tokens_since_fired"].to(device)
        torch.set_rng_state(tensors["torch_rng"])
    else:
        start_step, history = 0, []
        torch.manual_seed(cfg.seed)
        # b_dec init: the streamed float64 mean is computed for every choice, as the metrics need it
        # (mean_across_ranks is the plain streamed mean without torchrun)
        activation_mean = distributed.mean_across_ranks(_finite_init_rows(source.init_rows(cfg.b_dec_init_tokens)))
        if cfg.b_dec_init == "mean":
            b_dec = activation_mean
        elif cfg.b_dec_init == "geometric_median":
            b_dec = geometric_median(torch.cat(list(source.init_rows(min(cfg.b_dec_init_tokens, 32_768)))))
        else:
            b_dec = torch.zeros(source.d)
        sae.init_weights(torch.Generator().manual_seed(cfg.seed), b_dec=b_dec.float())
        if not unit_decoder:  # SAELens' start: decoder rows of norm 0.1, encoder W_decᵀ (same x̂ as encoder_scale 0.01)
            sae.W_dec.data.mul_(0.1)
            sae.W_enc.data.copy_(sae.W_dec.data.T)
        if cfg.arch == "jumprelu":
            init_jumprelu_threshold(sae, next(iter(source.init_rows(min(cfg.b_dec_init_tokens, 16_384)))), cfg.k)
        since_fired = torch.zeros(sae.cfg.d_sae, dtype=torch.long, device=device)

    provenance = {
        "b_dec_init": cfg.b_dec_init, "b_dec_init_tokens": cfg.b_dec_init_tokens, "preprocessing": "none",
        "data": source.identity, "train_config": asdict(cfg),
    }
    ckpt_extra = {"history": history, "provenance": provenance}  # live references: saved as they stand

    # live metrics accumulate on the device; read back only every log_every steps (no per-step sync)
    acc = {k: torch.zeros((), device=device, dtype=torch.float64) for k in ("sse", "css", "l0", "aux", "n")}
    if ckpt is not None:
        for k in acc:
            acc[k] += tensors[f"acc.{k}"].to(device).reshape(())

    def checkpoint_tensors() -> dict:
        return {"activation_mean": activation_mean, "tokens_since_fired": since_fired.cpu(),
                "torch_rng": torch.get_rng_state(), **{f"acc.{k}": v.reshape(1).cpu() for k, v in acc.items()}}

    nonfinite = torch.zeros((), dtype=torch.bool, device=device)
    last_good = start_step
    bar = None
    if cfg.progress and (ctx is None or ctx.is_main):
        from tqdm.auto import tqdm

        bar = tqdm(total=cfg.total_steps * cfg.batch_size, initial=start_step * cfg.batch_size, unit="tok",
                   unit_scale=True, desc=f"train {cfg.arch}", dynamic_ncols=True)
    batches = source.train_batches(start_step) if ctx is None else _rank_batches(source, start_step, ctx)
    forward_train = distributed.wrap_ddp(sae, "forward_train")  # DDP: gradients averaged over ranks
    world = ctx.world_size if ctx is not None else 1
    # the global batch's centred sums of squares (÷ world: DDP averages the ranks' losses)
    centred_ss_fn = None if ctx is None else (lambda t: distributed.centred_sum_of_squares(t) / world)
    if ctx is not None:
        provenance["world_size"] = world
    t0, tokens_timed = time.perf_counter(), 0
    sae.train()
    for step in range(start_step, cfg.total_steps):
        x = next(batches).to(device, non_blocking=True)
        for g in opt.param_groups:
            g["lr"] = lr_at(step, cfg) * g["lr_scale"]
        out = forward_train(
            x, dead_mask=since_fired > cfg.dead_window_tokens, aux_k=aux_k,
            l1_coefficient=cfg.l1_coefficient * l1_ramp(step, cfg), aux_coefficient=cfg.aux_coefficient, centred_ss_fn=centred_ss_fn,
            l0_target=cfg.k, l0_coefficient=cfg.l0_coefficient, bandwidth=cfg.bandwidth,
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
        if cfg.arch == "batchtopk":
            update_batchtopk_threshold(sae, out.min_kept if ctx is None else
                                       distributed.sum_across_ranks(out.min_kept) / world, step, cfg.threshold_ema)
        elif cfg.arch == "jumprelu":
            sae.threshold.data.clamp_(min=0.0)  # codes pre·H(pre − θ) stay ≥ 0

        since_fired += x.shape[0] * world
        since_fired.masked_fill_(out.fired if ctx is None else distributed.sum_across_ranks(out.fire_count) > 0, 0)
        nonfinite |= ~torch.isfinite(out.loss.detach())
        acc["sse"] += out.sse
        acc["css"] += out.centred_ss.detach()
        acc["l0"] += out.l0_sum
        acc["aux"] += out.aux_loss
        acc["n"] += x.shape[0]
        tokens_timed += x.shape[0] * world

        done = step + 1
        is_log = done % cfg.log_every == 0 or done == cfg.total_steps
        is_ckpt = cfg.out_dir and cfg.checkpoint_every and done % cfg.checkpoint_every == 0
        if is_log or is_ckpt:
            if bool(nonfinite) if ctx is None else distributed.sum_across_ranks(int(nonfinite)) > 0:
                ckpt_note = (f"the last good checkpoint (step {last_good}) is kept in {_ckpt_dir(cfg)}"
                             if cfg.out_dir and cfg.checkpoint_every and last_good else "no checkpoint was written")
                raise NonFiniteLossError(
                    f"non-finite loss between steps {done - cfg.log_every + 1} and {done} "
                    f"(lr {lr_at(step, cfg):.3g}); {ckpt_note}. Check the activations for inf/NaN rows "
                    "or lower the learning rate, then resume."
                )
        if is_log:
            vals = dict(zip(acc, distributed.sum_across_ranks(torch.stack(list(acc.values()))).tolist()))
            vals["aux"] /= world  # each rank's aux is already a mean over the global batch
            live = {
                "step": done, "tokens": done * cfg.batch_size,
                "mse": vals["sse"] / (vals["n"] * source.d), "fve": 1 - vals["sse"] / vals["css"],
                "l0": vals["l0"] / vals["n"], "aux": vals["aux"] / cfg.log_every,
                "dead": float((since_fired > cfg.dead_window_tokens).float().mean()),
                "tok_s": tokens_timed / (time.perf_counter() - t0),
            }
            history.append(live)
            for v in acc.values():
                v.zero_()
            if bar is not None:
                bar.update(done * cfg.batch_size - bar.n)
                bar.set_postfix(fve=f"{live['fve']:.3f}", l0=f"{live['l0']:.1f}", dead=f"{live['dead']:.2f}")
        if is_ckpt:
            if ctx is None or ctx.is_main:
                save_checkpoint(cfg, sae, opt, done, ckpt_extra, checkpoint_tensors())
            last_good = done
        if on_step is not None:
            on_step(done, {})
    if bar is not None:
        bar.close()
    sae.eval()
    if not unit_decoder:
        sae.fold_decoder_norms()  # same codes·rows, unit rows: what saegeo's readers and the report expect

    heldout = distributed.from_main(lambda: evaluate(sae, source.heldout_batches(), activation_mean),
                                    "evaluating the held-out rows")
    provenance["metrics"] = {"heldout": heldout, "final_live": history[-1] if history else {}}
    if cfg.out_dir and (ctx is None or ctx.is_main):
        from saegeo.sae.formats import save_sae

        save_sae(sae, cfg.out_dir, provenance)
        if cfg.checkpoint_every:
            save_checkpoint(cfg, sae, opt, cfg.total_steps, ckpt_extra, checkpoint_tensors())
    distributed.barrier()  # under torchrun: the SAE is on disk when any rank returns
    return TrainResult(sae=sae, history=history, heldout=heldout, activation_mean=activation_mean,
                       config=cfg, out_dir=cfg.out_dir, provenance=provenance)
