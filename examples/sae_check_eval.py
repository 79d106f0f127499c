"""Quickstart (b): my SAE -> checked against activations of its model -> spliced into the model (eval).

    python examples/sae_check_eval.py --sae MY_SAE --acts quickstart/acts/blocks.3.hook_resid_post \
        --model minilm --text my.txt --out quickstart

--sae    a directory or file in any format saegeo reads (SAELens, sparsify, dictionary_learning, Gemma Scope,
         Llama Scope, saegeo's own), or a hub id already in the Hugging Face cache.
--acts   an activation store of the SAE's model and hook (example (a), or `saegeo cache`).
--model  the model the SAE reads; eval splices the SAE in at its hook and measures the loss (a decoder such as
         smollm2 gives CE loss and KL; an encoder such as minilm gives the reconstruction numbers only).
Writes OUT/check/ (report.md, report.json, ...) and OUT/eval.json. The same as `saegeo check MY_SAE --acts ...
--out OUT/check` then `saegeo eval --sae MY_SAE --model ... --json OUT/eval.json`.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sae", required=True)
    parser.add_argument("--acts", required=True, help="activation store of the SAE's model and hook")
    parser.add_argument("--model", default="minilm")
    parser.add_argument("--text", default="default", help="text eval runs the model over (default: bundled)")
    parser.add_argument("--max-tokens", type=int, default=20_000, help="activation rows the check reads")
    parser.add_argument("--eval-tokens", type=int, default=2048, help="tokens the spliced eval runs")
    parser.add_argument("--model-dtype", default="float32", help="float32, bf16, fp16")
    parser.add_argument("--out", default="quickstart")
    args = parser.parse_args(argv)

    from saegeo.io import dump_json
    from saegeo.render import render_terminal, render_written, write_report
    from saegeo.render.text import render_eval
    from saegeo.report.dictionary_check import CheckOptions, check_with_activations
    from saegeo.report.geometry_report import ReportOptions
    from saegeo.sae.evaluate import EvalConfig, splice_eval
    from saegeo.sae.model import SAE

    out = Path(args.out)
    sae = SAE.load(args.sae)
    report, _ = check_with_activations(
        sae,
        args.acts,
        options=CheckOptions(progress=False),
        name=Path(args.sae).name,
        report_options=ReportOptions(max_tokens=args.max_tokens, progress=False),
    )
    print(render_terminal(report), end="")
    print(render_written(write_report(report, out / "check")))

    cfg = EvalConfig(
        model=args.model,
        sae=args.sae,
        corpus=args.text,
        max_tokens=args.eval_tokens,
        model_dtype=args.model_dtype,
        progress=False,
    )
    result = splice_eval(cfg, sae=sae)
    print(render_eval(result))
    dump_json(result, out / "eval.json")
    print(f"wrote {out / 'eval.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
