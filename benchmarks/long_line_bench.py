"""Caching from a corpus of one long line: `saegeo cache --max-tokens N` on a file that is a single line of
plain words (no newline), end to end in a fresh process (model load included), with its wall and CPU seconds
and its peak resident memory. Before issue 37 the whole line was tokenized before --max-tokens applied (10 MB:
277 s and 2.1 GB for 4,000 tokens); now it is read and tokenized in pieces of PIECE_CHARS characters.

The same run on a file of the same words in ordinary 80-character lines is the reference: a long line should
cost what a normal file costs. Also the time to tokenize the first piece alone and the whole-line tokenization
of a smaller prefix (--whole-mb), which is what the old reader did, for scale.

Usage: python benchmarks/long_line_bench.py [--mb 50] [--max-tokens 4096] [--whole-mb 2]
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


def cache_run(corpus: Path, out: Path, max_tokens: int) -> dict:
    """One `saegeo cache` process: wall s, CPU s (user + system of the child), peak RSS (MB)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    cmd = [sys.executable, "-m", "saegeo.cli", "cache", "--corpus", str(corpus), "--out", str(out)]
    cmd += ["--max-tokens", str(max_tokens), "--no-progress"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode:
        raise SystemExit(done.stderr)
    return {
        "wall_s": wall,
        "cpu_s": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
        "peak_rss_mb": after.ru_maxrss / 1024,  # the largest child so far (Linux: kB)
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=50.0, help="size of the one-line corpus")
    ap.add_argument("--max-tokens", type=int, default=4096)
    ap.add_argument("--whole-mb", type=float, default=2.0, help="prefix tokenized whole (the old reader), for scale")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write_corpus(root / "lines.txt", args.mb, 80)
        write_corpus(root / "one_line.txt", args.mb, None)
        assert (root / "one_line.txt").read_bytes().count(b"\n") == 1
        # the reference first (its peak RSS is the running maximum over children)
        lines = cache_run(root / "lines.txt", root / "a", args.max_tokens)
        one = cache_run(root / "one_line.txt", root / "b", args.max_tokens)
        print(f"corpus: {args.mb:g} MB, --max-tokens {args.max_tokens}, `saegeo cache` (MiniLM) in a fresh process")
        print(f"{'file':<28}{'wall s':>8}{'CPU s':>8}{'peak RSS MB (max so far)':>26}")
        for name, r in (("80-character lines", lines), ("one line", one)):
            print(f"{name:<28}{r['wall_s']:>8.1f}{r['cpu_s']:>8.1f}{r['peak_rss_mb']:>26.0f}")

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
