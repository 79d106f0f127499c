"""What the one verdict (`sae_verdict`: `check_dictionary` + the rows' match test + the recorded metrics) adds to
`report --sae` and `latents`: per SAE, its wall and CPU seconds beside the report's own pass on the same store.

    python benchmarks/verdict_cost.py STORE [SAE ...] [--widths 16384 65536] [--max-tokens N]

--widths adds SAEs of published widths made here, not trained: TopK (k 32) whose decoder rows are the store's own
rows, centred and normalised (one per latent, evenly spaced through the store's first shards), W_enc = W_decᵀ,
b_dec = their mean; a dictionary whose codes fire on these rows, so every part of the verdict runs (the duplicate
search grows as d_sae², the rows' match test as d_sae). Each SAE is timed alone: geometry_report(store, {name: sae}) without the verdict, then sae_verdict(sae, store), and
the verdict's share of the two. Prints one Markdown table (benchmarks/README.md keeps a run)."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from saegeo.activations.store import ActivationStore
from saegeo.report.dictionary_check import CheckOptions, sae_verdict
from saegeo.report.geometry_report import ReportOptions, geometry_report
from saegeo.sae.architectures.base import SAEConfig
from saegeo.sae.model import SAE


def timed(fn):
    t0, c0 = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - t0, time.process_time() - c0


def data_initialised(store_path: str, width: int) -> SAE:
    store = ActivationStore(store_path)
    parts, have = [], 0
    for i in range(len(store.shards)):
        parts.append(store.read_shard(i).float())
        have += parts[-1].shape[0]
        if have >= 2 * width:
            break
    x = torch.cat(parts)
    rows = x[torch.linspace(0, x.shape[0] - 1, width).round().long()]
    mean = x.mean(0)
    directions = torch.nn.functional.normalize(rows - mean, dim=1)
    sae = SAE(SAEConfig(d_in=x.shape[1], d_sae=width, activation="topk", k=32))
    with torch.no_grad():
        sae.W_dec.copy_(directions)
        sae.W_enc.copy_(directions.T)
        sae.b_dec.copy_(mean)
    return sae


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("store")
    p.add_argument("saes", nargs="*")
    p.add_argument("--widths", type=int, nargs="*", default=[])
    p.add_argument("--max-tokens", type=int, default=None)
    args = p.parse_args()
    ropts = ReportOptions(progress=False, max_tokens=args.max_tokens)
    print("| SAE | d_sae × d | report pass: wall / CPU s | verdict: wall / CPU s | verdict share of the total (CPU) |")
    print("|---|---|---|---|---|")
    made = [(f"data-initialised TopK k 32, {w:,}", lambda w=w: data_initialised(args.store, w)) for w in args.widths]
    for name, make in [(Path(path).name, lambda path=path: SAE.load(path)) for path in args.saes] + made:
        sae = make()
        report = timed(lambda: geometry_report(args.store, {name: sae}, options=ropts))
        verdict = timed(lambda: sae_verdict(sae, args.store, options=CheckOptions(progress=False), name=name))
        shape = f"{sae.W_dec.shape[0]:,} × {sae.W_dec.shape[1]}"
        share = verdict[1] / (report[1] + verdict[1])
        print(
            f"| {name} | {shape} | {report[0]:.1f} / {report[1]:.1f} | {verdict[0]:.1f} / {verdict[1]:.1f} | "
            f"{100 * share:.0f} % |"
        )


if __name__ == "__main__":
    main()
