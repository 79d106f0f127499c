"""Resume from a store: time to the first batch at 90 % of an epoch, re-reading (before) vs seeking (after).

Before: the trainer replayed ``store.iter_batches`` and dropped the batches before the saved
step, reading every shard up to it. After: ``_StoreSource.train_batches(step)`` replays the shard order and the
shuffle buffer's permutations on row indices (no I/O) and reads only the rows still in the buffer at that step
(whole shards where the buffer holds many of their rows, memory-mapped rows elsewhere). Both give the same batch
(asserted). A synthetic store of --shards × --rows × --d float32 is written to a temporary directory.

Usage: .venv/bin/python benchmarks/resume_bench.py [--shards 24] [--rows 16384] [--d 384] [--buffer 16384]
"""

from __future__ import annotations

import argparse
import itertools
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from saegeo.activations.store import ActivationStore, write_store  # noqa: E402
from saegeo.sae.train import TrainConfig, _StoreSource  # noqa: E402


def timed(f):
    t0, c0 = time.perf_counter(), time.process_time()
    out = f()
    return out, time.perf_counter() - t0, time.process_time() - c0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shards", type=int, default=24)
    ap.add_argument("--rows", type=int, default=16_384)
    ap.add_argument("--d", type=int, default=384)
    ap.add_argument("--buffer", type=int, default=16_384, help="shuffle buffer rows")
    ap.add_argument("--batch", type=int, default=4096)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        g = torch.Generator().manual_seed(0)
        batches = (torch.randn(args.rows, args.d, generator=g) for _ in range(args.shards))
        store = write_store(Path(tmp) / "s", batches, shard_rows=args.rows)
        cfg = TrainConfig(
            batch_tokens=args.batch, total_tokens=args.batch, shuffle_buffer=args.buffer, seed=0, heldout_fraction=0.0
        )
        src = _StoreSource(store, cfg)
        per_epoch = sum(1 for _ in src._epoch(0, skip=10**12))  # planned only: no I/O
        step = int(0.9 * per_epoch)
        reads = []
        orig = ActivationStore.read_shard
        ActivationStore.read_shard = lambda self, i, *a, **k: reads.append(i) or orig(self, i, *a, **k)

        def before():
            it = store.iter_batches(
                args.batch, shuffle=True, shuffle_buffer=args.buffer, seed=0, stop_row=src.n_train, drop_last=True
            )
            return next(itertools.islice(it, step, None))

        ref, wall_b, cpu_b = timed(before)
        n_before, reads[:] = len(reads), []
        got, wall_a, cpu_a = timed(lambda: next(iter(src.train_batches(step))))
        n_after = len(reads)
        assert torch.equal(ref, got)
    size = args.shards * args.rows * args.d * 4 / 2**20
    print(
        f"store: {args.shards} shards x {args.rows:,} rows x d {args.d} (float32, {size:,.0f} MiB), shuffle buffer "
        f"{args.buffer:,}, batch {args.batch}: resume at step {step} of {per_epoch} (90 % of the epoch)"
    )
    print(f"before (re-read): {wall_b:6.2f} s wall, {cpu_b:6.2f} s CPU, {n_before} shard reads")
    print(
        f"after  (seek)   : {wall_a:6.2f} s wall, {cpu_a:6.2f} s CPU, {n_after} whole-shard reads "
        f"(+ memory-mapped rows); same batch"
    )
    print(f"speed-up: {wall_b / wall_a:.1f}x wall, {cpu_b / max(cpu_a, 1e-9):.1f}x CPU")


if __name__ == "__main__":
    main()
