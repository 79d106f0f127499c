"""Caching throughput: saegeo vs the bare forward pass vs a plain transformer-lens run_with_cache loop.

Same model (bundled MiniLM), same corpus windows (default corpus, context 128), same batches, one run,
methods interleaved over several rounds (median reported) so machine load hits all of them alike.

  saegeo L3 / L5   `cache_activations` end to end: tokenize, forward to block L, store float32
                   shards (sha256, atomic writes)
  (a) bare forward HookedEncoder.encoder_output on the pre-tokenized batches: all 6 blocks, nothing
                   stored, no vocabulary head (the strict limit); (a') HookedEncoder.forward with logits
  (b) run_with_cache  model.run_with_cache(tokens) + torch.save of the hook's non-padding rows per batch

Usage: python benchmarks/cache_bench.py [--tokens 8192] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from saegeo.activations.cache import CacheConfig, cache_activations
from saegeo.activations.corpus import CorpusSpec, iter_windows
from saegeo.activations.models import load_model
from saegeo.activations.runner import pad_windows, window_batches


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--tokens", type=int, default=8192, help="tokens per method per round (rounded up to whole batches)"
    )
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=32, help="windows of 128 tokens per forward")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    loaded = load_model("minilm")
    model = loaded.model
    spec = CorpusSpec(context=128)
    batches, n = [], 0
    for batch in window_batches(iter_windows(spec, loaded.tokenizer), args.batch_size):
        tokens, attend, store = pad_windows(batch, loaded.tokenizer.pad_token_id)
        batches.append((tokens, attend, store))
        n += int(store.sum())
        if n >= args.tokens:
            break
    n_tokens = n  # whole batches: every method processes exactly these windows
    print(
        f"MiniLM, default corpus, context 128, {len(batches)} batches x {args.batch_size} windows, "
        f"{n_tokens} tokens per method, {args.rounds} rounds, torch threads {torch.get_num_threads()}"
    )

    tmp = Path(tempfile.mkdtemp(prefix="saegeo-cache-bench-"))

    def saegeo_cache(layer: int):
        def run(r: int) -> float:
            cfg = CacheConfig(
                hooks=(f"blocks.{layer}.hook_resid_post",),
                out=str(tmp / f"s{layer}_{r}"),
                max_tokens=n_tokens,
                batch_windows=args.batch_size,
                progress=False,
            )
            t0 = time.perf_counter()
            result = cache_activations(cfg, loaded)
            assert result.new_tokens == n_tokens
            return time.perf_counter() - t0

        return run

    def bare(with_logits: bool):
        def run(r: int) -> float:
            t0 = time.perf_counter()
            with torch.inference_mode():
                for tokens, attend, _ in batches:
                    mask = None if bool(attend.all()) else attend.long()
                    if with_logits:
                        model(tokens, one_zero_attention_mask=mask)
                    else:
                        model.encoder_output(tokens, one_zero_attention_mask=mask)
            return time.perf_counter() - t0

        return run

    def run_with_cache(layer: int):
        def run(r: int) -> float:
            out = tmp / f"rwc{layer}_{r}"
            out.mkdir()
            t0 = time.perf_counter()
            with torch.inference_mode():
                for i, (tokens, attend, store) in enumerate(batches):
                    mask = None if bool(attend.all()) else attend.long()
                    _, cache = model.run_with_cache(tokens, one_zero_attention_mask=mask)
                    torch.save(cache[f"blocks.{layer}.hook_resid_post"][store].clone(), out / f"batch_{i}.pt")
            return time.perf_counter() - t0

        return run

    methods = {
        "saegeo cache L3": saegeo_cache(3),
        "saegeo cache L5": saegeo_cache(5),
        "(a) bare forward, 6 blocks": bare(False),
        "(a') HookedEncoder.forward": bare(True),
        "(b) run_with_cache+save L5": run_with_cache(5),
    }
    bare(False)(0)  # warm-up (allocator, kernels)
    times: dict[str, list[float]] = {k: [] for k in methods}
    cpu: dict[str, list[float]] = {k: [] for k in methods}
    for r in range(args.rounds):
        for name, fn in methods.items():
            c0 = time.process_time()
            times[name].append(fn(r))
            cpu[name].append(time.process_time() - c0)
    tps = {k: n_tokens / statistics.median(v) for k, v in times.items()}
    # CPU seconds of this process: less sensitive to other jobs on a shared machine than wall time
    cpu_tps = {k: n_tokens / statistics.median(v) for k, v in cpu.items()}
    print(f"\n{'method':<30} {'tokens/s':>10} {'tok/CPU-s':>10}   (medians of {args.rounds}; wall tokens/s per round)")
    for k, v in tps.items():
        print(f"{k:<30} {v:>10,.0f} {cpu_tps[k]:>10,.0f}   " + " ".join(f"{n_tokens / t:,.0f}" for t in times[k]))
    a, a_logits = tps["(a) bare forward, 6 blocks"], tps["(a') HookedEncoder.forward"]
    b = tps["(b) run_with_cache+save L5"]
    c_a, c_b = cpu_tps["(a) bare forward, 6 blocks"], cpu_tps["(b) run_with_cache+save L5"]
    print(
        "\nratios by CPU time: "
        f"L5/(a) {cpu_tps['saegeo cache L5'] / c_a:.2f}, L3/(a) {cpu_tps['saegeo cache L3'] / c_a:.2f}, "
        f"L5/(b) {cpu_tps['saegeo cache L5'] / c_b:.2f}, L3/(b) {cpu_tps['saegeo cache L3'] / c_b:.2f}"
    )
    print("ratios by wall time (higher is better for saegeo):")
    print(f"  saegeo L5 / (a) bare 6-block forward  = {tps['saegeo cache L5'] / a:.2f}   target >= 0.85")
    print(f"  saegeo L3 / (a) bare 6-block forward  = {tps['saegeo cache L3'] / a:.2f}   target > 1")
    print(f"  saegeo L5 / (a') forward with logits  = {tps['saegeo cache L5'] / a_logits:.2f}")
    print(f"  saegeo L5 / (b) run_with_cache+save   = {tps['saegeo cache L5'] / b:.2f}   target >= 2")
    print(f"  saegeo L3 / (b) run_with_cache+save   = {tps['saegeo cache L3'] / b:.2f}")


if __name__ == "__main__":
    main()
