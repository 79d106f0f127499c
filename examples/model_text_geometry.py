"""Quickstart (a): my model and my text -> an activation store -> the geometry of its rows.

    python examples/model_text_geometry.py --model minilm --text my.txt --out quickstart

--model  'minilm' or 'smollm2' (bundled, nothing downloaded), a local Hugging Face directory (BERT, GPT-2,
         GPT-NeoX, Llama) or a model already in the Hugging Face cache.
--text   a .txt / .md file, or .jsonl / .json records, .parquet, a datasets folder (--text-field names the field).
Writes OUT/acts/<hook>/ (a resumable store: rerunning reuses it) and OUT/geometry.json, and prints the summary
`saegeo geometry` prints. The same as `saegeo cache ...` then `saegeo geometry OUT/acts/<hook>`.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="minilm")
    parser.add_argument("--text", required=True, help="the text file (or records) to run the model over")
    parser.add_argument("--text-field", default="text")
    parser.add_argument("--hook", default="blocks.3.hook_resid_post")
    parser.add_argument("--context", type=int, default=128, help="tokens per window")
    parser.add_argument("--max-tokens", type=int, default=20_000)
    parser.add_argument("--model-dtype", default="float32", help="float32, bf16, fp16")
    parser.add_argument("--out", default="quickstart")
    args = parser.parse_args(argv)

    from saegeo.activations.cache import CacheConfig, cache_activations
    from saegeo.render.text import render_cache, render_geometry
    from saegeo.report.geometry import files_geometry
    from saegeo.report.options import GeometryOptions

    out = Path(args.out)
    cached = cache_activations(
        CacheConfig(
            model=args.model,
            hooks=(args.hook,),
            corpus=args.text,
            text_field=args.text_field,
            context=args.context,
            max_tokens=args.max_tokens,
            model_dtype=args.model_dtype,
            out=str(out / "acts"),
            progress=False,
        )
    )
    print(render_cache(cached))
    geometry = files_geometry([cached.stores[args.hook]], GeometryOptions(progress=False))
    print(render_geometry(geometry))
    geometry.to_json(out / "geometry.json")
    print(f"wrote {out / 'geometry.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
