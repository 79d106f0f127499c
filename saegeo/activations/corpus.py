"""Text sources -> fixed-length token windows, streamed.

Sources (`CorpusSpec.source`):
  "default"            Python's bundled pydoc_data.topics (79 help topics, ~465k characters): offline, always there
  a .txt/.md file      one document
  a .jsonl file        one document per line, text in `text_field`
  a directory          every .txt/.md/.jsonl file below it, sorted by path
  a glob ("data/*.txt") its matches, sorted; several sources may be joined with commas

Each document is tokenized without special tokens and cut into chunks of `context - n_special`
tokens; each chunk gets the tokenizer's own special tokens ([CLS] ... [SEP] for BERT, BOS for
decoders) and becomes one window. Windows never cross documents. The last window of a document is
shorter: the caching loop pads it, and padding is never stored. With exclude_special the special
positions are run through the model (it needs them) but not stored.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator

from saegeo.errors import BadInputError

TEXT_SUFFIXES = (".txt", ".md", ".text")
BLOCK_CHARS = 1 << 20  # large text files are read and tokenized in ~1 MB blocks split at line ends


@dataclass(frozen=True)
class CorpusSpec:
    source: str = "default"
    context: int = 128
    exclude_special: bool = False
    text_field: str = "text"


@dataclass(frozen=True)
class Window:
    """One model input: token ids with a flag per position saying whether its activation is stored."""

    input_ids: list[int]
    store: list[bool]  # False at special positions when exclude_special
    doc: int  # document index in the corpus

    @property
    def n_stored(self) -> int:
        return sum(self.store)


def _default_documents() -> Iterator[str]:
    from pydoc_data.topics import topics

    for key in sorted(topics):
        yield topics[key]


def resolve_files(source: str) -> list[Path]:
    """Expand a comma-separated list of files, directories and globs into a sorted file list."""
    files: list[Path] = []
    for part in [p.strip() for p in source.split(",") if p.strip()]:
        path = Path(part)
        if path.is_dir():
            found = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in (*TEXT_SUFFIXES, ".jsonl"))
            if not found:
                raise BadInputError(f"corpus directory {path} holds no .txt/.md/.jsonl files")
            files += found
        elif path.is_file():
            files.append(path)
        else:
            matches = sorted(Path(m) for m in glob.glob(part, recursive=True) if Path(m).is_file())
            if not matches:
                raise BadInputError(
                    f"corpus source {part!r} is not 'default', a file, a directory or a glob with matches"
                )
            files += matches
    return files


def _text_blocks(path: Path) -> Iterator[str]:
    """A text file in blocks of about BLOCK_CHARS characters split at line ends, read as consumed
    (a big file is never held in memory whole)."""
    try:
        with open(path, encoding="utf-8") as f:
            block, size = [], 0
            for line in f:
                block.append(line)
                size += len(line)
                if size >= BLOCK_CHARS:
                    yield "".join(block)
                    block, size = [], 0
            if block:
                yield "".join(block)
    except UnicodeDecodeError as err:
        raise BadInputError(f"{path}: not UTF-8 text ({err.reason} at byte {err.start}); convert it or leave it out") from None


def _file_documents(path: Path, text_field: str) -> Iterator[Iterable[str]]:
    """Yield each document of a file as an iterable of text blocks (one block unless the file is big)."""
    if path.suffix == ".jsonl":
        with open(path, encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as err:
                    raise BadInputError(f"{path}:{lineno}: not valid JSON ({err.msg}); fix or remove the line") from None
                text = record.get(text_field) if isinstance(record, dict) else None
                if not isinstance(text, str):
                    raise BadInputError(
                        f"{path}:{lineno}: no string field {text_field!r} "
                        f"(keys: {sorted(record) if isinstance(record, dict) else type(record).__name__}); "
                        "pass --text-field NAME"
                    )
                yield [text]
        return
    yield _text_blocks(path)


def iter_documents(spec: CorpusSpec) -> Iterator[Iterable[str]]:
    """Documents in corpus order, each as a list of text blocks."""
    if spec.source == "default":
        for text in _default_documents():
            yield [text]
        return
    for path in resolve_files(spec.source):
        yield from _file_documents(path, spec.text_field)


def special_template(tokenizer: Any, kind: str) -> tuple[list[int], list[int]]:
    """(prefix, suffix) special ids the tokenizer wraps around content ([CLS] / [SEP], BOS, ...).

    Found by encoding a probe with and without special tokens. Decoders whose tokenizer adds nothing
    (GPT-2) get BOS prepended, as transformer-lens does by default.
    """
    probe = tokenizer("hello", add_special_tokens=False)["input_ids"]
    full = tokenizer("hello", add_special_tokens=True)["input_ids"]
    for i in range(len(full) - len(probe) + 1):
        if full[i : i + len(probe)] == probe:
            prefix, suffix = full[:i], full[i + len(probe) :]
            break
    else:
        prefix, suffix = [], []
    if kind == "decoder" and not prefix and getattr(tokenizer, "bos_token_id", None) is not None:
        prefix = [tokenizer.bos_token_id]
    return prefix, suffix


def iter_windows(spec: CorpusSpec, tokenizer: Any, kind: str = "encoder") -> Iterator[Window]:
    """Fixed-length token windows of the corpus, deterministic for a given spec and tokenizer."""
    prefix, suffix = special_template(tokenizer, kind)
    body = spec.context - len(prefix) - len(suffix)
    if body < 1:
        raise BadInputError(
            f"context {spec.context} leaves no room for text after {len(prefix) + len(suffix)} special tokens"
        )
    keep_special = not spec.exclude_special
    for doc, blocks in enumerate(iter_documents(spec)):
        ids: list[int] = []
        for block in blocks:
            ids += tokenizer(block, add_special_tokens=False)["input_ids"]
            # emit full chunks as they become available; keep the remainder for the next block
            n_full = len(ids) // body * body
            for lo in range(0, n_full, body):
                yield _window(prefix, ids[lo : lo + body], suffix, keep_special, doc)
            ids = ids[n_full:]
        if ids:
            yield _window(prefix, ids, suffix, keep_special, doc)


def _window(prefix: list[int], body: list[int], suffix: list[int], keep_special: bool, doc: int) -> Window:
    ids = prefix + body + suffix
    store = [keep_special] * len(prefix) + [True] * len(body) + [keep_special] * len(suffix)
    return Window(ids, store, doc)


def count_tokens(spec: CorpusSpec, tokenizer: Any, kind: str = "encoder", limit: int | None = None) -> int:
    """Number of stored tokens the corpus yields, capped at `limit` (a tokenization pass, no model)."""
    total = 0
    for window in iter_windows(spec, tokenizer, kind):
        total += window.n_stored
        if limit is not None and total >= limit:
            return limit
    return total


def corpus_identity(spec: CorpusSpec, tokenizer: Any) -> dict[str, Any]:
    """What a store records about its corpus: enough to refuse resuming on different data."""
    ident: dict[str, Any] = asdict(spec)
    ident["tokenizer"] = type(tokenizer).__name__ + f"(vocab={len(tokenizer)})"
    if spec.source == "default":
        import sys

        digest = hashlib.sha256()
        for text in _default_documents():
            digest.update(text.encode())
        ident["source"] = f"default (pydoc_data.topics, Python {sys.version_info.major}.{sys.version_info.minor})"
        ident["sha256"] = digest.hexdigest()
    else:
        ident["files"] = [{"path": str(p.resolve()), "bytes": os.path.getsize(p)} for p in resolve_files(spec.source)]
    return ident
