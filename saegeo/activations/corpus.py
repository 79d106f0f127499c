"""Text sources -> fixed-length token windows, streamed.

Sources (`CorpusSpec.source`; several may be joined with commas):
  "default"             Python's bundled pydoc_data.topics (79 help topics, ~465k characters): offline, always there
  a .txt/.md file       one document
  a .jsonl file         one document per line, text in `text_field`
  a .json file          an array of records (text in `text_field`) or of strings: one document each
  a .parquet file       one document per row of the string column `text_field` (pyarrow)
  a `datasets` folder   written by `Dataset.save_to_disk` / `DatasetDict.save_to_disk` (the "train" split, or
                        the only one; `FOLDER:SPLIT` picks another): one document per row of `text_field`
  a datasets name       "owner/name" or "owner/name:split", read from the offline HF datasets cache (as left by
                        `datasets.load_dataset`); never downloaded
  a directory           every .txt/.md/.jsonl/.parquet file below it, sorted by path
  a glob ("data/*.txt") its matches, sorted

Pre-tokenised token ids are used as given, with no tokenizer involved: a .npy array or a .safetensors tensor
(key `text_field` if present, else `input_ids`/`tokens`/the only key) of integer ids, 2-D (one row per
document) or 1-D (one stream); a parquet column or a `datasets` column of integer lists. Each row is cut into
windows of `context` ids; nothing is added (SAELens' pre-tokenised datasets already hold their BOS), and with
exclude_special the positions holding one of the tokenizer's special ids are not stored.

Text documents are tokenized without special tokens and cut into chunks of `context - n_special` tokens;
each chunk gets the tokenizer's own special tokens ([CLS] ... [SEP] for BERT, BOS for decoders) and becomes
one window. Windows never cross documents. The last window of a document is shorter: the caching loop pads
it, and padding is never stored. With exclude_special the special positions are run through the model (it
needs them) but not stored.

`open_corpus(spec)` opens and checks every source (files exist, fields and columns are there, token arrays
are integers) without a tokenizer or a model, so a bad `--text-field` is reported before a model loads.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import json
import os
import re
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from saegeo.errors import BadInputError
from saegeo.progress import quiet_tqdm_auto

TEXT_SUFFIXES = (".txt", ".md", ".text")
TOKEN_SUFFIXES = (".npy", ".safetensors")  # token-id arrays
DIR_SUFFIXES = (*TEXT_SUFFIXES, ".jsonl", ".parquet")  # what a directory source collects
TOKEN_KEYS = ("input_ids", "tokens", "token_ids")  # column / key names of pre-tokenised ids
BLOCK_CHARS = 1 << 20  # large text files are read and tokenized in ~1 MB blocks split at line ends
PIECE_CHARS = 1 << 16  # a longer line or document is read and tokenized in pieces of at most this many characters
ROW_BATCH = 1024  # rows read at a time from parquet and datasets sources
DATASET_NAME = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+(:[\w.-]+)?$")
DATA_INSTALL = "pip install pyarrow datasets  (or: pip install 'saegeo[data]')"


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


@dataclass(frozen=True)
class Source:
    """One opened corpus source: `kind` is text, jsonl, json, parquet, tokens (.npy/.safetensors), datasets
    (a save_to_disk folder) or hub (a name in the datasets cache); `column` the field or key read from it and
    `token_column` whether it holds token ids (pre-tokenised) rather than text."""

    kind: str
    path: str
    column: str | None = None
    token_column: bool = False
    split: str | None = None


@dataclass(frozen=True)
class TokenRow:
    """A pre-tokenised document: ids used as given."""

    ids: list[int]
    where: str  # "file: row N", for messages


def _default_documents() -> Iterator[str]:
    from pydoc_data.topics import topics

    for key in sorted(topics):
        yield topics[key]


def _optional(module: str, what: str) -> Any:
    """Import an optional data package, or say in one line how to install it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise BadInputError(f"{what} needs the package {module.split('.')[0]}: {DATA_INSTALL}") from None


def _is_datasets_folder(path: Path) -> bool:
    return (path / "dataset_dict.json").is_file() or (
        (path / "state.json").is_file() and (path / "dataset_info.json").is_file()
    )


def _split_suffix(part: str) -> tuple[str, str | None]:
    """`FOLDER:SPLIT` -> (FOLDER, SPLIT) when FOLDER is a datasets folder, else (part, None)."""
    head, sep, tail = part.rpartition(":")
    if sep and head and re.fullmatch(r"[\w.-]+", tail) and Path(head).is_dir() and _is_datasets_folder(Path(head)):
        return head, tail
    return part, None


def resolve_files(source: str) -> list[Path]:
    """Expand a comma-separated list of files, directories and globs into a sorted file list (datasets
    folders count as one entry; a datasets name is not a file and is left out)."""
    return [Path(path) for kind, path, _ in _resolve(source) if kind != "hub"]


def _resolve(source: str) -> list[tuple[str, str, str | None]]:
    """(kind, path or name, split) per source part, files in sorted order; kind is file, datasets or hub."""
    found: list[tuple[str, str, str | None]] = []
    for part in [p.strip() for p in source.split(",") if p.strip()]:
        name, split = _split_suffix(part)
        path = Path(name)
        if path.is_dir() and _is_datasets_folder(path):
            found.append(("datasets", str(path), split))
        elif path.is_dir():
            files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in DIR_SUFFIXES)
            if not files:
                raise BadInputError(f"corpus directory {path} holds no {'/'.join(DIR_SUFFIXES)} files")
            found += [("file", str(p), None) for p in files]
        elif path.is_file():
            found.append(("file", str(path), None))
        else:
            matches = sorted(Path(m) for m in glob.glob(part, recursive=True) if Path(m).is_file())
            if matches:
                found += [("file", str(m), None) for m in matches]
            elif DATASET_NAME.match(part) and not Path(part.split(":")[0]).suffix:
                hub, _, hub_split = part.partition(":")
                found.append(("hub", hub, hub_split or None))
            else:
                raise BadInputError(
                    f"corpus source {part!r} is not 'default', a file, a directory or a glob with matches "
                    "(nor a datasets name owner/name in the local cache)"
                )
    return found


def _cut(text: str) -> int:
    """Where to end a piece of `text`: before its last whitespace character (where a tokenizer starts a word: GPT-2's
    " word", SentencePiece's "▁word"; cut before a run's last space, the run splits as it would whole), else all
    of it (a run of PIECE_CHARS characters without whitespace is cut where it stands)."""
    cut = max(text.rfind(c) for c in " \n\t")
    return cut if cut > 0 else len(text)


def _pieces(text: str) -> Iterator[str]:
    """`text` in pieces of at most PIECE_CHARS characters (see `_cut`), so that a tokenizer never takes a whole
    long document at once and --max-tokens stops the work after the first pieces."""
    while len(text) > PIECE_CHARS:
        cut = _cut(text[:PIECE_CHARS])
        yield text[:cut]
        text = text[cut:]
    if text:
        yield text


def _text_blocks(path: Path) -> Iterator[str]:
    """A text file in blocks of about BLOCK_CHARS characters split at line ends, read as consumed (a big file is
    never held in memory whole); a line longer than PIECE_CHARS is read and given in pieces (`_pieces`), so one
    50 MB line is never held or tokenized whole."""
    try:
        with open(path, encoding="utf-8") as f:
            block, size, partial = [], 0, ""
            while piece := f.readline(PIECE_CHARS):
                if partial or (len(piece) == PIECE_CHARS and not piece.endswith("\n")):  # inside a long line
                    partial += piece
                    if len(piece) == PIECE_CHARS and not piece.endswith("\n"):  # the line goes on
                        if block:
                            yield "".join(block)
                            block, size = [], 0
                        cut = _cut(partial)
                        yield partial[:cut]
                        partial = partial[cut:]
                        continue
                    piece, partial = partial, ""  # its last piece
                block.append(piece)
                size += len(piece)
                if size >= BLOCK_CHARS:
                    yield "".join(block)
                    block, size = [], 0
            if partial:
                block.append(partial)
            if block:
                yield "".join(block)
    except UnicodeDecodeError as err:
        raise BadInputError(
            f"{path}: not UTF-8 text ({err.reason} at byte {err.start}); convert it or leave it out"
        ) from None


def _record_text(record: Any, field: str, where: str) -> str:
    """The text of one JSON record (a dict with a string `field`, or a bare string)."""
    text = record if isinstance(record, str) else (record.get(field) if isinstance(record, dict) else None)
    if not isinstance(text, str):
        keys = sorted(record) if isinstance(record, dict) else type(record).__name__
        raise BadInputError(f"{where}: no string field {field!r} (keys: {keys}); pass --text-field NAME")
    return text


def _jsonl_records(path: Path) -> Iterator[tuple[int, Any]]:
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                yield lineno, json.loads(line)
            except json.JSONDecodeError as err:
                raise BadInputError(f"{path}:{lineno}: not valid JSON ({err.msg}); fix or remove the line") from None


def _json_array(path: Path) -> list[Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise BadInputError(f"{path}: not valid JSON ({err}); a .json corpus is an array of records") from None
    if not isinstance(data, list):
        raise BadInputError(
            f"{path}: a .json corpus is an array of records or strings, found a "
            f"{type(data).__name__}; write one record per line as .jsonl, or an array"
        )
    return data


@contextlib.contextmanager
def _offline_datasets() -> Iterator[Any]:
    """The datasets package with the hub switched off for the duration (saegeo never downloads)."""
    quiet_tqdm_auto()  # datasets and huggingface_hub import tqdm.auto (a warning in a notebook without ipywidgets)
    datasets = _optional("datasets", "a datasets corpus")
    import huggingface_hub.constants as hub_constants

    saved = datasets.config.HF_HUB_OFFLINE, hub_constants.HF_HUB_OFFLINE
    datasets.config.HF_HUB_OFFLINE = hub_constants.HF_HUB_OFFLINE = True
    try:
        with _quiet_datasets(datasets):
            yield datasets
    finally:
        datasets.config.HF_HUB_OFFLINE, hub_constants.HF_HUB_OFFLINE = saved


@contextlib.contextmanager
def _quiet_datasets(datasets: Any) -> Iterator[None]:
    level = datasets.logging.get_verbosity()
    datasets.logging.set_verbosity_error()
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        datasets.logging.set_verbosity(level)


def _open_dataset(kind: str, path: str, split: str | None) -> Any:
    """A `datasets.Dataset` from a save_to_disk folder or the offline cache (by name)."""
    with _offline_datasets() as datasets:
        if kind == "datasets":
            try:
                ds = datasets.load_from_disk(path)
            except Exception as err:  # datasets raises many types here
                raise BadInputError(f"{path}: cannot read the datasets folder ({err})") from None
        else:
            try:
                ds = datasets.load_dataset(path, split=split or "train")
                split = split or "train"
            except Exception as err:
                raise BadInputError(
                    f"corpus {path!r}: not a file or folder here, and not in the local datasets cache "
                    f"({type(err).__name__}); saegeo never downloads: on a machine with network run "
                    f"`python -c \"import datasets; datasets.load_dataset('{path}').save_to_disk('DIR')\"`, copy "
                    "DIR here and pass --corpus DIR"
                ) from None
    if hasattr(ds, "keys"):  # a DatasetDict
        splits = list(ds.keys())
        pick = split or ("train" if "train" in splits else (splits[0] if len(splits) == 1 else None))
        if pick not in splits:
            raise BadInputError(f"{path}: splits {splits}; pick one with {path}:SPLIT")
        ds = ds[pick]
    elif split is not None and kind == "datasets":
        raise BadInputError(f"{path}: a single dataset (no splits); drop ':{split}'")
    return ds


def _column(names: list[str], field: str, where: str, types: dict[str, str]) -> tuple[str, bool]:
    """(column, holds token ids) for `field` among a table's columns (see the module docstring)."""

    def is_ids(name: str) -> bool:
        return "int" in types.get(name, "") and ("list" in types[name] or "Sequence" in types[name])

    if field in names:
        if is_ids(field):
            return field, True
        if types.get(field, "") not in ("string", "large_string", "Value('string')", "Value('large_string')"):
            raise BadInputError(
                f"{where}: column {field!r} holds {types.get(field)}, not text or token ids; pass --text-field NAME"
            )
        return field, False
    if field == "text":  # the default: a pre-tokenised table names its column input_ids / tokens
        for key in TOKEN_KEYS:
            if key in names and is_ids(key):
                return key, True
    raise BadInputError(f"{where}: no column {field!r} (columns: {', '.join(names)}); pass --text-field NAME")


def _array_key(keys: list[str], field: str, where: str) -> str:
    for key in (field, *TOKEN_KEYS):
        if key in keys:
            return key
    if len(keys) == 1:
        return keys[0]
    raise BadInputError(f"{where}: no tensor {field!r} among {keys}; pass --text-field KEY")


def _open_source(kind: str, path: str, split: str | None, field: str) -> Source:
    """Open and check one source without reading it through (see `open_corpus`)."""
    if kind in ("datasets", "hub"):
        ds = _open_dataset(kind, path, split)
        types = {k: str(v) for k, v in ds.features.items()}
        column, ids = _column(list(ds.column_names), field, path, types)
        if not ids and len(ds):
            _record_text(ds[0], column, f"{path}: row 0")
        return Source(kind, path, column, ids, split or ("train" if kind == "hub" else None))
    p = Path(path)
    if p.suffix == ".jsonl":
        for lineno, record in _jsonl_records(p):
            _record_text(record, field, f"{p}:{lineno}")
            break
        return Source("jsonl", path, field)
    if p.suffix == ".json":
        for i, record in enumerate(_json_array(p), 1):
            _record_text(record, field, f"{p}: record {i}")
        return Source("json", path, field)
    if p.suffix == ".parquet":
        pq = _optional("pyarrow.parquet", "a parquet corpus")
        try:
            schema = pq.read_schema(p)
        except Exception as err:
            raise BadInputError(f"{p}: not a readable parquet file ({err})") from None
        column, ids = _column(schema.names, field, str(p), {n: str(schema.field(n).type) for n in schema.names})
        return Source("parquet", path, column, ids)
    if p.suffix in TOKEN_SUFFIXES:
        key, array = _token_array(p, field)
        if array.dtype.kind not in "iu":
            raise BadInputError(f"{p}: {array.dtype} values; a {p.suffix} corpus holds integer token ids")
        if array.ndim not in (1, 2):
            raise BadInputError(f"{p}: shape {tuple(array.shape)}; token ids are (documents, positions) or one stream")
        return Source("tokens", path, key, True)
    return Source("text", path)


def _token_array(path: Path, field: str) -> tuple[str | None, Any]:
    """(key, array) of a .npy (memory-mapped) or .safetensors token-id file."""
    import numpy as np

    try:
        if path.suffix == ".npy":
            return None, np.load(path, mmap_mode="r", allow_pickle=False)
        from safetensors import safe_open

        with safe_open(str(path), framework="np") as f:
            key = _array_key(list(f.keys()), field, str(path))
            return key, f.get_tensor(key)
    except (OSError, ValueError) as err:
        raise BadInputError(f"{path}: not a readable {path.suffix} file ({err})") from None


def open_corpus(spec: CorpusSpec) -> list[Source]:
    """Every source of the corpus, opened and checked without a tokenizer or a model: files exist, JSON
    records (the first line of a .jsonl, every record of a .json) and table columns hold `text_field`, token
    arrays hold integers. A bad source raises BadInputError naming the file, row and field."""
    if spec.source == "default":
        return []
    return [_open_source(kind, path, split, spec.text_field) for kind, path, split in _resolve(spec.source)]


def _table_rows(src: Source) -> Iterator[Any]:
    """Values of a parquet or datasets column, row by row, read ROW_BATCH rows at a time."""
    if src.kind == "parquet":
        pq = _optional("pyarrow.parquet", "a parquet corpus")
        for batch in pq.ParquetFile(src.path).iter_batches(batch_size=ROW_BATCH, columns=[src.column]):
            yield from batch.column(0).to_pylist()
        return
    ds = _open_dataset(src.kind, src.path, src.split).select_columns([src.column])
    for lo in range(0, len(ds), ROW_BATCH):
        yield from ds[lo : lo + ROW_BATCH][src.column]


def _source_documents(src: Source) -> Iterator[Iterable[str] | TokenRow]:
    """Each document of a source: an iterable of text blocks (one block unless the file is big), or a TokenRow."""
    path = Path(src.path)
    if src.kind == "jsonl":
        for lineno, record in _jsonl_records(path):
            yield _pieces(_record_text(record, src.column or "text", f"{path}:{lineno}"))
    elif src.kind == "json":
        for i, record in enumerate(_json_array(path), 1):
            yield _pieces(_record_text(record, src.column or "text", f"{path}: record {i}"))
    elif src.kind in ("parquet", "datasets", "hub"):
        for i, value in enumerate(_table_rows(src)):
            if src.token_column:
                yield TokenRow(list(value or []), f"{src.path}: row {i}")
            elif isinstance(value, str):
                yield _pieces(value)
            else:
                raise BadInputError(
                    f"{src.path}: row {i}: column {src.column!r} holds {type(value).__name__}, "
                    "not text; pass --text-field NAME"
                )
    elif src.kind == "tokens":
        _, array = _token_array(path, src.column or "text")
        rows = array[None] if array.ndim == 1 else array
        for i in range(rows.shape[0]):
            yield TokenRow([int(t) for t in rows[i]], f"{path}: row {i}")
    else:
        yield _text_blocks(path)


def iter_documents(spec: CorpusSpec) -> Iterator[Iterable[str] | TokenRow]:
    """Documents in corpus order, each as a list of text blocks or, pre-tokenised, a TokenRow."""
    if spec.source == "default":
        for text in _default_documents():
            yield _pieces(text)
        return
    for src in open_corpus(spec):
        yield from _source_documents(src)


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
    template: list[tuple[list[int], list[int], int]] = []  # computed at the first text document

    def text_template() -> tuple[list[int], list[int], int]:
        if not template:
            prefix, suffix = special_template(tokenizer, kind)
            body = spec.context - len(prefix) - len(suffix)
            if body < 1:
                raise BadInputError(
                    f"context {spec.context} leaves no room for text after {len(prefix) + len(suffix)} special tokens"
                )
            template.append((prefix, suffix, body))
        return template[0]

    keep_special = not spec.exclude_special
    special_ids: set[int] | None = None
    for doc, blocks in enumerate(iter_documents(spec)):
        if isinstance(blocks, TokenRow):  # pre-tokenised: cut as given, nothing added
            if special_ids is None:
                special_ids = set(getattr(tokenizer, "all_special_ids", ()) or ())
            yield from _token_windows(blocks, spec.context, len(tokenizer), special_ids, keep_special, doc)
            continue
        prefix, suffix, body = text_template()
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


def _token_windows(
    row: TokenRow, context: int, vocab: int, special: set[int], keep_special: bool, doc: int
) -> Iterator[Window]:
    if row.ids and (max(row.ids) >= vocab or min(row.ids) < 0):
        bad = next(t for t in row.ids if t >= vocab or t < 0)
        raise BadInputError(
            f"{row.where}: token id {bad} is outside the tokenizer's vocabulary (0..{vocab - 1}); "
            "were these ids made with another tokenizer?"
        )
    for lo in range(0, len(row.ids), context):
        ids = row.ids[lo : lo + context]
        yield Window(ids, [keep_special or t not in special for t in ids], doc)


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
        ident["files"] = [_source_identity(src) for src in open_corpus(spec)]
    return ident


def _source_identity(src: Source) -> dict[str, Any]:
    """A file's path and size (as stores have always recorded them); a dataset's path or name, split and
    fingerprint; the column read from a table."""
    if src.kind in ("datasets", "hub"):
        ds = _open_dataset(src.kind, src.path, src.split)
        key = "path" if src.kind == "datasets" else "dataset"
        where = str(Path(src.path).resolve()) if src.kind == "datasets" else src.path
        return {key: where, "split": src.split, "column": src.column, "rows": len(ds), "fingerprint": ds._fingerprint}
    ident: dict[str, Any] = {"path": str(Path(src.path).resolve()), "bytes": os.path.getsize(src.path)}
    if src.token_column:
        ident["token_ids"] = src.column or True
    return ident
