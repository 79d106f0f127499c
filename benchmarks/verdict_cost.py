"""What the one verdict (`sae_verdict`: `check_dictionary` + the rows' match test + the recorded metrics) adds to
`report --sae` and `latents`: per SAE, its wall and CPU seconds beside the report's own pass on the same store.

    python benchmarks/verdict_cost.py STORE SAE [SAE ...] [--max-tokens N]

Each SAE is timed alone: geometry_report(store, {name: sae}) without the verdict, then sae_verdict(sae, store), and
the verdict's share of the two. Prints one Markdown table (benchmarks/README.md keeps a run)."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from saegeo.report.dictionary_check import CheckOptions, sae_verdict
from saegeo.report.geometry_report import ReportOptions, geometry_report
from saegeo.sae.model import SAE


def timed(fn):
    t0, c0 = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - t0, time.process_time() - c0


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("store")
    p.add_argument("saes", nargs="+")
    p.add_argument("--max-tokens", type=int, default=None)
    args = p.parse_args()
    ropts = ReportOptions(progress=False, max_tokens=args.max_tokens)
    print("| SAE | d_sae × d | report pass: wall / CPU s | verdict: wall / CPU s | verdict share of the total (CPU) |")
    print("|---|---|---|---|---|")
    for path in args.saes:
        sae = SAE.load(path)
        name = Path(path).name
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
