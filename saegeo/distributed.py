"""torch.distributed for saegeo: launch discovery, process group, data split, reductions, failures.

saegeo never starts processes itself: `torchrun` (or any launcher that sets RANK / WORLD_SIZE /
LOCAL_RANK / MASTER_ADDR / MASTER_PORT) does, and `geometry_report` / `train_sae` call
:func:`init_from_env`, so `saegeo report` and `saegeo train` need nothing but the launcher.

Public API
----------
``DistContext``                  rank, world_size, local_rank, backend, device; ``is_main``.
``env_rank_world() -> (rank, world_size, local_rank)``   what the launcher set (0, 1, 0 without one).
``init_from_env(backend=None, timeout_s=None) -> DistContext | None``   None for a single process.
``current() -> DistContext | None``   the running context (also for a group the caller initialised).
``local_only()``                 context manager: act as a single process inside a job (e.g. rank 0 alone).
``cleanup()``                    destroy the process group if saegeo created it.
``split_shards(shard_rows, rank, world_size) -> range``   contiguous, row-balanced, every row once.
``gather_objects(obj) -> list``  one picklable object per rank, in rank order (identical on every rank).
``merge_across_ranks(acc)``      accumulators with state_dict / from_state_dict / merge, merged in rank order.
``sum_across_ranks(value)``      float / int / tensor summed over ranks (float64 for floats).
``check_same_across_ranks(value, what, describe)``   every rank must hold the same value (e.g. a store fingerprint).
``store_fingerprint(store) -> str``   sha256 of a store's manifest identity (d, dtype, shards and their sha256).
``all_ranks_or_none(what)``      context manager: a failure on one rank is raised on every rank, named.
``rank_rows(n, rank, world_size) -> slice``   a rank's contiguous share of an n-row batch.
``mean_across_ranks(batches) -> Tensor``   streamed float64 mean, the arithmetic split over ranks.
``from_main(fn, what)``          run fn on rank 0, hand its result to every rank (checkpoint, evaluation).
``barrier()``, ``wrap_ddp(module, method) -> callable``   DistributedDataParallel around module.<method>.
``centred_sum_of_squares(x) -> Tensor``   Σ‖x − x̄‖² of the rows of all ranks' batches together (Chan).
``DistributedError``             a SaegeoError: another rank failed, or the ranks disagree.
``resolve_device(spec, what) -> torch.device``   a --device value checked against this torch build and machine.

Reductions are exact to float64 rounding: each rank's state dict is broadcast in turn and merged in
rank order with the accumulators' own (Chan) merge, so every rank holds the same numbers a single
process would, up to the order of float64 additions, in the memory of two states. Collectives time out after ``SAEGEO_DIST_TIMEOUT`` seconds
(default 600), so a rank that dies without a word ends the others with an error, not a hang.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from jaxtyping import Float
from torch import Tensor

from saegeo.errors import SaegeoError, StoreError

TIMEOUT_ENV = "SAEGEO_DIST_TIMEOUT"
DEFAULT_TIMEOUT_S = 600.0

T = TypeVar("T")


class DistributedError(SaegeoError):
    """Another rank failed, or the ranks were launched inconsistently."""


@dataclass(frozen=True)
class DistContext:
    """Where this process sits in the job."""

    rank: int
    world_size: int
    local_rank: int
    backend: str
    device: torch.device  # cuda:local_rank with NCCL, else cpu

    @property
    def is_main(self) -> bool:
        """Rank 0: the one that renders reports and writes checkpoints."""
        return self.rank == 0


_created_group = False  # did init_from_env create the default group (then cleanup destroys it)
_local_only = False  # inside local_only(): saegeo acts as a single process


@contextmanager
def local_only() -> Iterator[None]:
    """Run saegeo as a single process inside a multi-rank job, e.g. a report on rank 0 only of a DDP
    training job: ``with local_only(): geometry_report(x)`` (other ranks do not take part)."""
    global _local_only
    previous, _local_only = _local_only, True
    try:
        yield
    finally:
        _local_only = previous


def env_rank_world() -> tuple[int, int, int]:
    """(RANK, WORLD_SIZE, LOCAL_RANK) as set by torchrun; (0, 1, 0) when not launched by one."""

    def read(name: str, default: int) -> int:
        try:
            return int(os.environ.get(name, default))
        except ValueError:
            raise DistributedError(f"environment variable {name}={os.environ[name]!r} is not an integer") from None

    rank, world, local = read("RANK", 0), read("WORLD_SIZE", 1), read("LOCAL_RANK", 0)
    if world < 1 or not 0 <= rank < world:
        raise DistributedError(f"inconsistent launch: RANK={rank}, WORLD_SIZE={world}; use torchrun to launch")
    return rank, world, local


def resolve_device(spec: str | torch.device, what: str = "--device") -> torch.device:
    """torch.device(spec), or one clear BadInputError when it is not a device name or this machine lacks it
    (a CPU-only torch build asked for cuda, cuda:N beyond the visible GPUs, mps off a Mac)."""
    from saegeo.errors import BadInputError

    try:
        device = torch.device(spec)
    except (RuntimeError, TypeError):
        raise BadInputError(f"{what} {spec!r} is not a torch device; use cpu, cuda, cuda:N or mps") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            build = "a CPU-only torch build" if torch.version.cuda is None else "no visible GPU"
            raise BadInputError(
                f"{what} {spec!r}: this machine has {build} (torch {torch.__version__}); use --device cpu"
            )
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise BadInputError(
                f"{what} {spec!r}: only {torch.cuda.device_count()} GPU(s) are visible "
                f"(cuda:0 … cuda:{torch.cuda.device_count() - 1})"
            )
    elif device.type == "meta":  # shapes without data: a run would fail (or train nothing) after its set-up
        raise BadInputError(f"{what} {spec!r} holds no data, so nothing can be computed on it; use cpu, cuda or mps")
    elif device.type == "mps" and not torch.backends.mps.is_available():
        raise BadInputError(f"{what} {spec!r}: MPS is not available on this machine; use --device cpu")
    return device


def _timeout() -> timedelta:
    raw = os.environ.get(TIMEOUT_ENV)
    try:
        seconds = float(raw) if raw else DEFAULT_TIMEOUT_S
    except ValueError:
        raise DistributedError(f"{TIMEOUT_ENV}={raw!r} is not a number of seconds") from None
    return timedelta(seconds=seconds)


def current() -> DistContext | None:
    """The context of an initialised default group with more than one rank, else None (also inside
    :func:`local_only`)."""
    if _local_only or not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return None
    backend = str(dist.get_backend())
    _, _, local = env_rank_world()
    device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
    return DistContext(dist.get_rank(), dist.get_world_size(), local, backend, device)


def init_from_env(backend: str | None = None, timeout_s: float | None = None) -> DistContext | None:
    """Join the job the launcher started (once per process); None when WORLD_SIZE is 1 or unset.

    backend: "nccl" when CUDA is available, else "gloo" (CPU). A group the caller already
    initialised is used as it is. Collectives time out after ``timeout_s`` (default: the
    SAEGEO_DIST_TIMEOUT environment variable, else 600 s).
    """
    global _created_group
    if _local_only or (dist.is_available() and dist.is_initialized()):
        return current()
    rank, world, local = env_rank_world()
    if world == 1:
        return None
    if not dist.is_available():
        raise DistributedError("WORLD_SIZE > 1 but this torch build has no torch.distributed")
    missing = [k for k in ("MASTER_ADDR", "MASTER_PORT") if k not in os.environ]
    if missing:
        raise DistributedError(f"WORLD_SIZE={world} but {missing} are not set; launch with torchrun")
    backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
    if backend == "nccl":
        torch.cuda.set_device(local)  # "cuda" then means this rank's GPU everywhere in the process
    timeout = timedelta(seconds=timeout_s) if timeout_s is not None else _timeout()
    dist.init_process_group(backend=backend, rank=rank, world_size=world, timeout=timeout)
    _created_group = True
    atexit.register(cleanup)
    return current()


def cleanup() -> None:
    """Destroy the default process group if :func:`init_from_env` created it."""
    global _created_group
    if _created_group and dist.is_initialized():
        dist.destroy_process_group()
    _created_group = False


# =========================================================================== splitting the data
def split_shards(shard_rows: Sequence[int], rank: int, world_size: int) -> range:
    """The contiguous block of shards of ``rank``: boundaries at the shards nearest to the row
    quantiles r·N/W, so every shard (and row) goes to exactly one rank, in store order.

    Contiguous blocks keep global row numbers simple (a rank's rows start at its first shard's
    offset); a rank gets an empty range when there are fewer shards than ranks.
    """
    if not 0 <= rank < world_size:
        raise DistributedError(f"rank {rank} outside a world of {world_size}")
    cumulative = [0]
    for rows in shard_rows:
        cumulative.append(cumulative[-1] + int(rows))
    total = cumulative[-1]

    def boundary(r: int) -> int:
        if r == 0:
            return 0
        if r == world_size:
            return len(shard_rows)
        target = total * r / world_size
        # the shard boundary closest to the target row (ties to the earlier boundary)
        return min(range(len(cumulative)), key=lambda i: (abs(cumulative[i] - target), i))

    bounds = [boundary(r) for r in range(world_size + 1)]
    for r in range(1, world_size + 1):  # monotone even when shards are very uneven
        bounds[r] = max(bounds[r], bounds[r - 1])
    return range(bounds[rank], bounds[rank + 1])


def rank_rows(n: int, rank: int, world_size: int) -> slice:
    """Rows [r·n/W, (r+1)·n/W) of an n-row batch: the rank's contiguous, disjoint share."""
    return slice(n * rank // world_size, n * (rank + 1) // world_size)


# =========================================================================== collectives
def _cpu(value: Any) -> Any:
    if isinstance(value, Tensor):
        return value.detach().cpu()
    if isinstance(value, dict):
        return {k: _cpu(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_cpu(v) for v in value)
    return value


def gather_objects(obj: Any) -> list[Any]:
    """[obj of rank 0, obj of rank 1, ...] on every rank (tensors travel on the CPU); [obj] alone."""
    ctx = current()
    if ctx is None:
        return [obj]
    out: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(out, _cpu(obj))
    return out


def merge_across_ranks(acc: T | None) -> T | None:
    """Merge every rank's accumulator in rank order; every rank gets the same merged object.

    ``acc`` has ``state_dict()``, ``type(acc).from_state_dict(sd)`` and ``merge(other)`` (e.g.
    GeometryAccumulator, CodeMomentAccumulator). A rank that saw no data passes None. The result
    equals one accumulator fed rank 0's rows, then rank 1's, ... to float64 rounding (Chan's merge).
    Each rank's state is broadcast in turn and folded in at once, so memory stays at two states
    (2·d² float64 for a GeometryAccumulator) whatever the number of ranks; every rank receives
    (W − 1) states, the same bytes an all_gather would move.
    """
    ctx = current()
    if ctx is None:
        return acc
    mine = None if acc is None else (type(acc), _cpu(acc.state_dict()))
    merged = None
    for src in range(ctx.world_size):
        box = [mine if src == ctx.rank else None]
        dist.broadcast_object_list(box, src=src)
        if box[0] is None:
            continue
        cls, state = box[0]
        piece = cls.from_state_dict(state)
        merged = piece if merged is None else merged.merge(piece)
    return merged


def sum_across_ranks(value: T) -> T:
    """Σ over ranks of a number or tensor (floats summed in float64); identity for one process."""
    ctx = current()
    if ctx is None:
        return value
    if isinstance(value, Tensor):
        t = value.detach().to(ctx.device, torch.float64 if value.is_floating_point() else torch.int64).clone()
        dist.all_reduce(t)
        return t.to(value.device, value.dtype)  # type: ignore[return-value]
    is_int = isinstance(value, int) and not isinstance(value, bool)
    t = torch.tensor([value], dtype=torch.int64 if is_int else torch.float64, device=ctx.device)
    dist.all_reduce(t)
    return int(t.item()) if is_int else float(t.item())  # type: ignore[return-value]


def check_same_across_ranks(value: Any, what: str, describe: Callable[[int, Any], str] | None = None) -> None:
    """Raise DistributedError on every rank unless all ranks hold an equal ``value``.

    ``describe(rank, value)`` words each rank's value in the message (default: repr).
    """
    values = gather_objects(value)
    if all(v == values[0] for v in values):
        return
    describe = describe or (lambda r, v: repr(v))
    lines = "; ".join(f"rank {r}: {describe(r, v)}" for r, v in enumerate(values))
    raise DistributedError(f"the ranks disagree on {what} ({lines}). Every rank must be given the same {what}")


def store_fingerprint(store: Any) -> str:
    """sha256 over a store's identity: d, dtype, token count and every shard's file, rows and sha256."""
    ident = {
        "d": store.d,
        "dtype": store.dtype,
        "n_tokens": store.n_tokens,
        "shards": [(s.file, s.rows, s.sha256) for s in store.shards],
    }
    return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()


def check_same_store(store: Any) -> None:
    """Every rank must read the same store (same manifest identity); StoreError naming each rank's otherwise."""
    info = (store_fingerprint(store), str(store.path), store.n_tokens, len(store.shards))
    try:
        check_same_across_ranks(
            info, "activation store", lambda r, v: f"{v[1]} ({v[2]} tokens, {v[3]} shards, manifest hash {v[0][:12]})"
        )
    except DistributedError as err:
        raise StoreError(f"{err} (a path on a shared filesystem, or byte-identical copies)") from None


@contextmanager
def all_ranks_or_none(what: str) -> Iterator[None]:
    """Run the block on every rank; if it fails on any rank, raise on every rank, naming the rank.

    Each rank finishes (or fails) its block, then all exchange their outcome in one collective, so a
    failing rank cannot leave the others blocked in a later collective. The failing rank re-raises
    its own exception (its traceback stays intact); the others raise DistributedError quoting it.
    """
    ctx = current()
    if ctx is None:
        yield
        return
    failure = None
    try:
        yield
    except Exception as err:  # noqa: BLE001 - reported to every rank, then re-raised here
        failure = f"{type(err).__name__}: {err}"
        _exchange(failure, what, ctx)
        raise
    _exchange(failure, what, ctx)


def _exchange(failure: str | None, what: str, ctx: DistContext) -> None:
    outcomes = gather_objects(failure)
    failed = [(r, msg) for r, msg in enumerate(outcomes) if msg is not None]
    if not failed or failure is not None:
        return  # nothing wrong, or this rank re-raises its own error
    r, msg = failed[0]
    others = f" (and {len(failed) - 1} more rank(s))" if len(failed) > 1 else ""
    raise DistributedError(f"rank {r} of {ctx.world_size} failed while {what}{others}: {msg}")


# =========================================================================== training helpers
def centred_sum_of_squares(x: Float[Tensor, "n d"]) -> Tensor:
    """Σ_i ‖x_i − x̄‖² over the rows of every rank's batch together (x̄ = mean of all of them).

    Per rank (n_r, mean_r, css_r) are all-gathered in float64 and combined with Chan's update
    css = Σ_r css_r + Σ_r n_r‖mean_r − x̄‖², so a large mean does not cancel. Single process:
    the batch's own centred sum of squares. Returned as a 0-d tensor of x's dtype (no gradient).
    """
    ctx = current()
    x64 = x.detach().double()
    # a rank whose share is empty (batch smaller than the world) must send 0, not mean() = NaN
    mean = x64.mean(dim=0) if x.shape[0] else x64.new_zeros(x.shape[1])
    css = (x64 - mean).square().sum()
    if ctx is None:
        return css.to(x.dtype)
    n = torch.tensor([float(x.shape[0])], dtype=torch.float64, device=x.device)
    packed = torch.cat([n, css.reshape(1), mean]).to(ctx.device)
    parts = [torch.empty_like(packed) for _ in range(ctx.world_size)]
    dist.all_gather(parts, packed)
    total_n = sum(float(p[0]) for p in parts)
    grand_mean = sum(p[0] * p[2:] for p in parts) / total_n
    total = sum(p[1] + p[0] * (p[2:] - grand_mean).square().sum() for p in parts)
    return total.to(x.device, x.dtype)


def mean_across_ranks(batches: Iterator[Tensor]) -> Float[Tensor, " d"]:
    """μ = Σx / n in float64 over the rows of ``batches``, each rank summing only its contiguous share
    of every batch (:func:`rank_rows`) before one all_reduce: every rank reads the same batches, the
    arithmetic is split. Equals the single-process streamed mean to float64 rounding."""
    ctx = current()
    rank, world = (ctx.rank, ctx.world_size) if ctx is not None else (0, 1)
    total, n = None, 0
    for b in batches:
        b = b[rank_rows(b.shape[0], rank, world)]
        s = b.double().sum(dim=0)
        total = s if total is None else total + s
        n += b.shape[0]
    if total is None:
        raise DistributedError("no rows to estimate the activation mean from")
    total, n = sum_across_ranks(total), sum_across_ranks(n)
    if n == 0:
        raise DistributedError("no rows to estimate the activation mean from")
    return total / n


def from_main(fn: Callable[[], T], what: str) -> T:
    """Run ``fn`` on rank 0 only and hand its (picklable) result to every rank; fn() alone without a job.

    A failure on rank 0 is raised on every rank (see :func:`all_ranks_or_none`).
    """
    ctx = current()
    if ctx is None:
        return fn()
    box: list[Any] = [None]
    with all_ranks_or_none(what):
        if ctx.is_main:
            box[0] = _cpu(fn())
    dist.broadcast_object_list(box, src=0)
    return box[0]


def barrier() -> None:
    """Wait for every rank (no-op without a job)."""
    if current() is not None:
        dist.barrier()


class _MethodAsForward(torch.nn.Module):
    """DDP calls forward(); this routes it to another method of the wrapped module (e.g. forward_train)."""

    def __init__(self, module: torch.nn.Module, method: str):
        super().__init__()
        self.module, self.method = module, method

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.module, self.method)(*args, **kwargs)


def wrap_ddp(module: torch.nn.Module, method: str = "forward") -> Callable[..., Any]:
    """``module.<method>`` as a callable whose backward all-reduces (averages) the gradients over ranks
    with DistributedDataParallel; the bare method without a job. Rank 0's parameters are broadcast to
    every rank here, so all ranks start identical."""
    ctx = current()
    if ctx is None:
        return getattr(module, method)
    from torch.nn.parallel import DistributedDataParallel

    device_ids = [ctx.device.index] if ctx.device.type == "cuda" else None
    return DistributedDataParallel(_MethodAsForward(module, method), device_ids=device_ids)
