"""Caching from a corpus of one long line: `saegeo cache --max-tokens N` on a file that is a single line of
plain words (no newline), end to end in a fresh process (model load included), with its wall and CPU seconds
and its peak resident memory. Before, the whole line was tokenized before --max-tokens applied (10 MB:
277 s and 2.1 GB for 4,000 tokens); now it is read and tokenized in pieces of PIECE_CHARS characters.

The same run on a file of the same words in ordinary 80-character lines is the reference: a long line should
cost what a normal file costs. Also the time to tokenize the first piece alone and the whole-line tokenization
of a smaller prefix (--whole-mb), which is what the old reader did, for scale.

Usage: python benchmarks/long_line_bench.py [--mb 50] [--max-tokens 4096] [--whole-mb 2] [--old-tree DIR --old-mb 2]
  (--old-tree: e.g. `git archive <rev> saegeo | tar -x -C DIR`, the reader before the change)
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WORDS = "the model reads plain words in one very long line of text and caches its first tokens quickly".split()


def write_corpus(path: Path, mb: float, line_chars: int | None) -> None:
    """`mb` megabytes of words; one line (line_chars None) or lines of about line_chars characters."""
    target, written = int(mb * 1e6), 0
    with open(path, "w") as f:
        line = 0
        while written < target:
            chunk = " ".join(WORDS[(written + i) % len(WORDS)] for i in range(1000)) + " "
            if line_chars:
                chunk = "\n".join(chunk[i : i + line_chars] for i in range(0, len(chunk), line_chars))
            f.write(chunk)
            written += len(chunk)
            line += 1
        f.write("\n")


# runs the CLI and writes its own peak resident set (kB) to the file named by the last argument
_MEASURED = (
    "import resource, runpy, sys\n"
    "peak_file = sys.argv.pop()\n"
    "sys.argv[0] = 'saegeo'\n"
    "try:\n    runpy.run_module('saegeo.cli', run_name='__main__')\n"
    "finally:\n    open(peak_file, 'w').write(str(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss))\n"
)


def cache_run(corpus: Path, out: Path, max_tokens: int, saegeo_path: str | None = None) -> dict:
    """One `saegeo cache` process (the saegeo under `saegeo_path` where given): wall s, CPU s (user + system of
    the child), its own peak RSS (MB)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    peak = out.parent / f"{out.name}.peak"
    cmd = [sys.executable, "-c", _MEASURED, "cache", "--corpus", str(corpus), "--out", str(out)]
    cmd += ["--max-tokens", str(max_tokens), "--no-progress", str(peak)]
    env = dict(os.environ, **({"PYTHONPATH": saegeo_path} if saegeo_path else {}))
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=out.parent)  # not this tree
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode:
        raise SystemExit(done.stderr)
    return {
        "wall_s": wall,
        "cpu_s": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
        "peak_rss_mb": int(peak.read_text()) / 1024,  # Linux: kB
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=50.0, help="size of the one-line corpus")
    ap.add_argument("--max-tokens", type=int, default=4096)
    ap.add_argument("--whole-mb", type=float, default=2.0, help="prefix tokenized whole (the old reader), for scale")
    ap.add_argument("--old-tree", help="a directory holding an earlier saegeo package, run on --old-mb of one line")
    ap.add_argument("--old-mb", type=float, default=2.0)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write_corpus(root / "lines.txt", args.mb, 80)
        write_corpus(root / "one_line.txt", args.mb, None)
        assert (root / "one_line.txt").read_bytes().count(b"\n") == 1
        lines = cache_run(root / "lines.txt", root / "a", args.max_tokens)
        one = cache_run(root / "one_line.txt", root / "b", args.max_tokens)
        print(f"corpus: {args.mb:g} MB, --max-tokens {args.max_tokens}, `saegeo cache` (MiniLM) in a fresh process")
        runs = [(f"{args.mb:g} MB, 80-character lines", lines), (f"{args.mb:g} MB, one line", one)]
        if args.old_tree:
            write_corpus(root / "old.txt", args.old_mb, None)
            runs.append(
                (
                    f"{args.old_mb:g} MB, one line, --old-tree",
                    cache_run(root / "old.txt", root / "c", args.max_tokens, args.old_tree),
                )
            )
        print(f"{'file':<36}{'wall s':>8}{'CPU s':>8}{'peak RSS MB':>13}")
        for name, r in runs:
            print(f"{name:<36}{r['wall_s']:>8.1f}{r['cpu_s']:>8.1f}{r['peak_rss_mb']:>13.0f}")

        from saegeo.activations.corpus import PIECE_CHARS
        from saegeo.activations.models import _load_tokenizer, _quiet_transformers, minilm_path

        _quiet_transformers()
        tok = _load_tokenizer(minilm_path())
        text = (root / "one_line.txt").read_text()[: int(args.whole_mb * 1e6)]
        start = time.perf_counter()
        tok(text[:PIECE_CHARS], add_special_tokens=False)
        piece = time.perf_counter() - start
        start, cpu = time.perf_counter(), time.process_time()
        n = len(tok(text, add_special_tokens=False)["input_ids"])
        print(f"tokenize one piece ({PIECE_CHARS:,} chars): {piece:.3f} s")
        print(
            f"tokenize {args.whole_mb:g} MB of the line whole (the old reader's first step): "
            f"{time.perf_counter() - start:.1f} s wall, {time.process_time() - cpu:.1f} s CPU, {n:,} tokens"
        )
        print(f"(machine: {os.cpu_count()} cores, shared)")


if __name__ == "__main__":
    main()
