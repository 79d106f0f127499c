"""ActivationStore: a directory of safetensors shards plus a checksummed manifest.

Layout::

    STORE/manifest.json            format version, model, hook, d, dtype, corpus identity,
                                   per-shard {file, rows, bytes, sha256}, n_tokens, complete
    STORE/shard_00000.safetensors  key "activations" (rows, d) in the storage dtype,
                                   optional "token_ids" (rows,) int32, "positions" (rows,) int32

Crash safety: a shard is written to a temporary file, fsynced and renamed into place, then the
manifest is rewritten the same way. A shard exists in the manifest only once its bytes are on disk,
so a process killed at any moment leaves a valid (incomplete) store. All shards but the last hold
exactly `shard_rows` rows; the last one is written only when the writer closes without error, so a
resumed run produces byte-identical shards to an uninterrupted one.

One writer at a time: a StoreWriter holds an exclusive flock on STORE/.writer.lock (with its pid in it);
a second one is refused naming that pid. Every read of a shard checks its sha256 against the manifest
(ActivationStore(verify=False), `--no-verify`, skips it); `verify()` re-hashes every shard and recounts
its rows from the safetensors header.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import re
import struct
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, get_args

import numpy as np
import torch
from jaxtyping import Float, Int
from safetensors import SafetensorError
from safetensors.torch import load_file as st_load_file
from safetensors.torch import save as st_save_bytes
from torch import Tensor

from saegeo.activations.options import MANIFEST, require_store_dir
from saegeo.config import StorageDtype, parse_dtype
from saegeo.errors import BadInputError, StoreError
from saegeo.io import atomic_write, crash_point, json_safe, sha256_file, writer_lock
from saegeo.progress import progress_bar

FORMAT_VERSION = 1
LOCK_FILE = ".writer.lock"  # flock'd by the one StoreWriter of a store; holds its pid
STORAGE_DTYPES = {name: getattr(torch, name) for name in get_args(StorageDtype)}
# Fields that define what a store contains: resuming with any of them different is refused.
IDENTITY_FIELDS = ("d", "hook", "model", "dtype", "shard_rows", "corpus")


def shard_name(index: int) -> str:
    return f"shard_{index:05d}.safetensors"


def _read_manifest(path: Path) -> dict[str, Any]:
    mpath = path / MANIFEST
    require_store_dir(path)
    if not mpath.exists():
        raise StoreError(
            f"{path}: not an activation store ({MANIFEST} missing); "
            "point at the directory that holds manifest.json, or re-run `saegeo cache`"
        )
    try:
        manifest = json.loads(mpath.read_text(), parse_constant=_refuse_constant)
    except (json.JSONDecodeError, UnicodeDecodeError, ValueError, RecursionError) as err:
        raise StoreError(f"{mpath}: corrupt manifest ({err}); re-run the cache command into a fresh directory") from err
    check_manifest(manifest, mpath)
    return manifest


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")  # NaN / Infinity: the writer never writes them


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


# a shard's file: a plain name inside the store directory (no separators, no "..", no absolute path)
_SHARD_FILE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
_SHA256 = re.compile(r"[0-9a-f]{64}")


def check_manifest(manifest: Any, mpath: Path) -> None:
    """StoreError naming ``mpath`` and the field unless the manifest is one the writer could have written:
    every field of the right type and range, shard files inside the store, the rows adding up to n_tokens."""

    def bad(field: str, why: str) -> StoreError:
        return StoreError(f"{mpath}: manifest field {field} {why}; this store cannot be trusted, re-cache it")

    if not isinstance(manifest, dict):
        raise StoreError(f"{mpath}: manifest is a JSON {type(manifest).__name__}, not an object; re-cache the store")
    missing = [k for k in ("format_version", "d", "dtype", "shards", "n_tokens") if k not in manifest]
    if missing:
        raise StoreError(f"{mpath}: manifest lacks {missing}; this is not a saegeo activation store")
    version = manifest["format_version"]
    if not _is_int(version) or version < 1:
        raise bad("format_version", f"is {version!r}, not a positive integer")
    if version > FORMAT_VERSION:
        raise StoreError(
            f"{mpath}: store format version {version} is newer than this saegeo "
            f"understands ({FORMAT_VERSION}); upgrade saegeo"
        )
    if not _is_int(manifest["d"]) or manifest["d"] < 1:
        raise bad("d", f"is {manifest['d']!r}, not a positive integer")
    if not isinstance(manifest["dtype"], str) or manifest["dtype"] not in STORAGE_DTYPES:
        raise StoreError(
            f"{mpath}: unknown storage dtype {manifest['dtype']!r}; expected one of {list(STORAGE_DTYPES)}"
        )
    for key, kind, what in (
        ("shard_rows", int, "a positive integer"),
        ("complete", bool, "true or false"),
        ("hook", str, "a string"),
        ("model", str, "a string"),
        ("corpus", dict, "an object"),
        ("extra", dict, "an object"),
        ("columns", list, "a list"),
    ):
        value = manifest.get(key)
        if key in manifest and not (_is_int(value) and value >= 1 if kind is int else isinstance(value, kind)):
            raise bad(key, f"is {value!r}, not {what}")
    if "columns" in manifest and not set(manifest["columns"]) <= {"token_ids", "positions"}:
        raise bad("columns", f"is {manifest['columns']!r}; expected a subset of ['positions', 'token_ids']")
    shards = manifest["shards"]
    if not isinstance(shards, list):
        raise bad("shards", f"is a JSON {type(shards).__name__}, not a list")
    files = set()
    for i, entry in enumerate(shards):
        field = f"shards[{i}]"
        if not isinstance(entry, dict):
            raise bad(field, f"is {entry!r}, not an object")
        for key in ShardInfo.__dataclass_fields__:
            if key not in entry:
                raise bad(field, f"has no {key!r}")
        name = entry["file"]
        if not isinstance(name, str) or not _SHARD_FILE.fullmatch(name) or name in files:
            raise bad(
                f"{field}.file",
                f"is {name!r}: a shard must be a file directly inside the store "
                "(a plain, unique name: no '/', no '..', no absolute path)",
            )
        files.add(name)
        if not _is_int(entry["rows"]) or entry["rows"] < 1:
            raise bad(f"{field}.rows", f"is {entry['rows']!r}, not a positive integer")
        if not _is_int(entry["bytes"]) or entry["bytes"] < 8:
            raise bad(f"{field}.bytes", f"is {entry['bytes']!r}, not a file size")
        if not isinstance(entry["sha256"], str) or not _SHA256.fullmatch(entry["sha256"]):
            raise bad(f"{field}.sha256", f"is {entry['sha256']!r}, not a sha256 hex digest")
    n_tokens = manifest["n_tokens"]
    total = sum(entry["rows"] for entry in shards)
    if not _is_int(n_tokens) or n_tokens != total:
        raise bad("n_tokens", f"is {n_tokens!r} but the shards list {total} rows")


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _sha256_mapped(path: Path) -> str:
    """sha256 of a file read through mmap (no copy into Python); StoreError naming it if it cannot be read."""
    try:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
            return hashlib.sha256(mapped).hexdigest()
    except (OSError, ValueError) as err:  # ValueError: an empty file cannot be mapped
        raise StoreError(f"{path}: cannot be read ({err}); check the file, or re-cache the store") from None


def _read_header(head: bytes | mmap.mmap | Any) -> tuple[dict[str, dict[str, Any]], int]:
    """(tensor name -> {dtype, shape, data_offsets}, byte offset of the data) from a safetensors file's header
    (8-byte little-endian length + JSON); ``head`` is an open binary file or a buffer. ValueError if malformed."""
    if hasattr(head, "read"):
        prefix = head.read(8)
    else:
        prefix = bytes(head[:8])
    if len(prefix) < 8:
        raise ValueError("shorter than a safetensors header")
    (n,) = struct.unpack("<Q", prefix)
    if n > 100_000_000:
        raise ValueError(f"header length {n} is not plausible")
    text = head.read(n) if hasattr(head, "read") else bytes(head[8 : 8 + n])
    if len(text) < n:
        raise ValueError("header cut short")
    header = json.loads(text)
    if not isinstance(header, dict):
        raise ValueError("header is not a JSON object")
    tensors = {k: v for k, v in header.items() if k != "__metadata__"}
    for k, v in tensors.items():
        if not (
            isinstance(v, dict)
            and isinstance(v.get("shape"), list)
            and isinstance(v.get("dtype"), str)
            and isinstance(v.get("data_offsets"), list)
            and len(v["data_offsets"]) == 2
        ):
            raise ValueError(f"tensor {k!r} has a malformed entry")
    return tensors, 8 + n


# the safetensors dtype code of each storage dtype (and torch's dtype for it)
SAFETENSORS_DTYPES = {"float32": "F32", "float16": "F16", "bfloat16": "BF16"}


# --------------------------------------------------------------------------- writer
class StoreWriter:
    """Append rows to a sharded store; full shards are written atomically as they fill.

    mode: "create" (the directory must not hold a store), "overwrite" (delete an existing store's
    files first), "resume" (continue an existing store; its identity — d, hook, model, dtype,
    shard_rows, corpus — must match, else StoreError; a missing store is created).
    On a clean exit of the `with` block the buffered tail becomes the last shard and the manifest
    gets complete = True. On an exception only full shards stay; resume later with mode="resume".
    `n_tokens` (rows accepted so far, including the unwritten buffer) tells a resuming producer how
    many rows to skip.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        d: int,
        hook: str = "",
        model: str = "",
        dtype: str = "float32",
        corpus: dict[str, Any] | None = None,
        shard_rows: int = 65536,
        extra_meta: dict[str, Any] | None = None,
        mode: str = "create",
    ):
        dtype = parse_dtype(dtype, "storage dtype")
        if int(d) < 1 or int(shard_rows) < 1:
            raise BadInputError(f"d and shard_rows must be positive (got d={d}, shard_rows={shard_rows})")
        if mode not in ("create", "overwrite", "resume"):
            raise BadInputError(f"mode must be 'create', 'overwrite' or 'resume', got {mode!r}")
        self.path = Path(path)
        self.torch_dtype = STORAGE_DTYPES[dtype]
        identity = dict(
            d=int(d),
            hook=str(hook),
            model=str(model),
            dtype=dtype,
            shard_rows=int(shard_rows),
            corpus=json.loads(json.dumps(corpus or {})),  # normalise (tuples -> lists) for comparison
        )
        self._buffers: dict[str, list[Tensor]] = {"activations": [], "token_ids": [], "positions": []}
        self._buffered = 0
        self._closed = False
        self.path.mkdir(parents=True, exist_ok=True)
        self._lock = writer_lock(
            self.path, "store", LOCK_FILE, StoreError
        )  # one writer per store: two would interleave shards
        try:
            self._open(mode, identity, extra_meta)
        except BaseException:
            self._release()
            raise

    def _release(self) -> None:
        if self._lock is not None:
            self._lock.truncate(0)  # no stale pid once done (and a finished store's files are deterministic)
            self._lock.close()  # closing the file drops the flock
            self._lock = None

    def _open(self, mode: str, identity: dict[str, Any], extra_meta: dict[str, Any] | None) -> None:
        exists = (self.path / MANIFEST).exists()
        if exists and mode == "create":
            raise StoreError(
                f"{self.path}: a store already exists here; pass resume (continue it) or overwrite "
                "(replace it), or choose another directory"
            )
        if exists and mode == "overwrite":
            for f in self.path.glob("shard_*.safetensors*"):
                f.unlink()
            (self.path / MANIFEST).unlink()
            exists = False
        if exists:  # resume
            self.manifest = _read_manifest(self.path)
            for key in IDENTITY_FIELDS:
                have, want = self.manifest.get(key), identity[key]
                if have != want:
                    if isinstance(have, dict) and isinstance(want, dict):  # name only the differing entries
                        diff = sorted(k for k in have.keys() | want.keys() if have.get(k) != want.get(k))
                        have = {k: have.get(k) for k in diff}
                        want = {k: want.get(k) for k in diff}
                    raise StoreError(
                        f"{self.path}: refusing to append: the store has {key}={have!r} but this run has "
                        f"{key}={want!r}; use a new directory, or overwrite the store (--overwrite)"
                    )
            self._check_shards_for_resume()
            self.manifest["extra"] = {**self.manifest.get("extra", {}), **(extra_meta or {})}
            self.manifest["complete"] = False
        else:
            self.manifest = {
                "format_version": FORMAT_VERSION,
                **identity,
                "n_tokens": 0,
                "complete": False,
                "extra": json.loads(json.dumps(extra_meta or {})),
                "shards": [],
            }
        for tmp in self.path.glob("*.tmp"):  # debris of a write that was killed
            tmp.unlink()
        self._write_manifest()

    def _check_shards_for_resume(self) -> None:
        """Shards must be intact before we build on them; a short last shard (from an earlier
        completed run) is pulled back into the buffer so later shards stay full-sized."""
        store = ActivationStore(self.path, allow_incomplete=True, check_headers=False)
        # sizes of all shards (cheap); content of the last one, the only one a crash could have touched
        bad = store.verify(full=False)
        if store.shards and not bad:
            bad = store.verify(full=True, shard_indices=[len(store.shards) - 1])
        if bad:
            raise StoreError(f"{self.path}: cannot resume a damaged store: " + "; ".join(bad))
        shards = self.manifest["shards"]
        if shards and shards[-1]["rows"] < self.manifest["shard_rows"]:
            last = store._load_shard_tensors(len(shards) - 1)
            for key in self._buffers:
                if key in last:
                    self._buffers[key].append(last[key])
            self._buffered = shards[-1]["rows"]
            self.manifest["n_tokens"] -= shards[-1]["rows"]
            shards.pop()  # its file is replaced by the next shard with the same index

    # rows accepted so far, including the buffer
    @property
    def n_tokens(self) -> int:
        return self.manifest["n_tokens"] + self._buffered

    @property
    def d(self) -> int:
        return self.manifest["d"]

    def append(
        self,
        batch: Float[Tensor, "n d"] | np.ndarray,
        token_ids: Int[Tensor, " n"] | None = None,
        positions: Int[Tensor, " n"] | None = None,
    ) -> None:
        """Add rows (cast to the storage dtype); writes every shard that fills."""
        if self._closed:
            raise StoreError(f"{self.path}: writer is closed")
        batch = torch.as_tensor(batch)
        if batch.ndim != 2 or batch.shape[1] != self.d:
            raise BadInputError(f"{self.path}: append got shape {tuple(batch.shape)}, expected (n, {self.d})")
        if not batch.is_floating_point():
            raise BadInputError(f"{self.path}: append got dtype {batch.dtype}; activations must be floating point")
        n = batch.shape[0]
        if n == 0:
            return
        given = {"token_ids": token_ids, "positions": positions}
        if "columns" not in self.manifest:  # the first batch decides which optional columns the store has
            self.manifest["columns"] = sorted(k for k, v in given.items() if v is not None)
        for name, col in given.items():
            if (col is not None) != (name in self.manifest["columns"]):
                raise BadInputError(
                    f"{self.path}: this store's rows {'have' if name in self.manifest['columns'] else 'lack'} "
                    f"{name}; pass it with every batch or with none"
                )
            if col is not None:
                col = torch.as_tensor(col).reshape(-1)
                if col.shape[0] != n:
                    raise BadInputError(f"{self.path}: {name} has {col.shape[0]} entries for {n} rows")
                self._buffers[name].append(col.to(torch.int32).cpu())
        stored = batch.detach().to("cpu", self.torch_dtype)
        if batch.dtype != self.torch_dtype:  # a finite value the storage dtype cannot hold would become inf
            overflow = torch.isinf(stored).any(dim=1) & torch.isfinite(batch.detach().cpu()).all(dim=1)
            if bool(overflow.any()):
                r = int(overflow.nonzero()[0])
                raise BadInputError(
                    f"{self.path}: row {self.n_tokens + r} (row {r} of this batch) holds a value of magnitude "
                    f"{float(batch[r].abs().max()):.4g}, beyond {self.manifest['dtype']}'s range "
                    f"(max {torch.finfo(self.torch_dtype).max:.4g}); {int(overflow.sum())} such row(s) in this batch. "
                    "Store as float32 (--dtype float32), or scale the activations"
                )
        self._buffers["activations"].append(stored)
        self._buffered += n
        while self._buffered >= self.manifest["shard_rows"]:
            self._flush(self.manifest["shard_rows"])

    def _flush(self, rows: int) -> None:
        """Write the first `rows` buffered rows as the next shard, then record it in the manifest."""
        tensors, rest = {}, {}
        for key, parts in self._buffers.items():
            if not parts:
                continue
            full = torch.cat(parts) if len(parts) > 1 else parts[0]
            tensors[key] = full[:rows].contiguous()
            rest[key] = [full[rows:]] if full.shape[0] > rows else []
        for key in self._buffers:
            self._buffers[key] = rest.get(key, [])
        self._buffered -= rows
        index = len(self.manifest["shards"])
        data = st_save_bytes(tensors)
        crash_point("before_shard")
        atomic_write(self.path / shard_name(index), data, crash_tag="mid_shard")
        crash_point("after_shard")  # shard on disk, manifest not yet updated: resume rewrites it
        self.manifest["shards"].append(
            {"file": shard_name(index), "rows": rows, "bytes": len(data), "sha256": _sha256(data)}
        )
        self.manifest["n_tokens"] += rows
        self._write_manifest()
        crash_point("after_manifest")

    def _write_manifest(self) -> None:
        # strict JSON (no NaN), keys sorted so a resumed store's manifest is byte-identical
        data = json.dumps(json_safe(self.manifest), indent=1, sort_keys=True, allow_nan=False) + "\n"
        atomic_write(self.path / MANIFEST, data)

    def close(self, complete: bool = True) -> None:
        """Write the buffered tail as the last shard and mark the store complete."""
        if self._closed:
            return
        try:
            if complete:
                if self._buffered:
                    self._flush(self._buffered)
                self.manifest["complete"] = True
                self._write_manifest()
        finally:
            self._closed = True
            self._release()

    def __enter__(self) -> StoreWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        # On error keep only whole shards (the buffer is dropped; a resume regenerates it).
        self.close(complete=exc_type is None)


# --------------------------------------------------------------------------- reader
@dataclass(frozen=True)
class ShardInfo:
    file: str
    rows: int
    bytes: int
    sha256: str


class ActivationStore:
    """Read-only view of a store written by StoreWriter.

    Raises StoreError if the directory or manifest is missing/corrupt, or if the store is
    incomplete (an interrupted cache) unless allow_incomplete=True. With verify=True (the default)
    every shard read is hashed as it is read and refused unless its sha256 matches the manifest:
    one flipped bit would otherwise flow silently into every mean, spectrum and SAE.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        allow_incomplete: bool = False,
        verify: bool = True,
        check_headers: bool = True,
    ):
        self.path = Path(path)
        self.verify_reads = verify
        self.manifest = _read_manifest(self.path)  # fields typed and consistent (check_manifest)
        if not self.manifest.get("complete", False) and not allow_incomplete:
            raise StoreError(
                f"{self.path}: store is incomplete ({self.manifest.get('n_tokens', 0)} tokens in "
                f"{len(self.manifest['shards'])} shards; the cache run was interrupted). Re-run the same "
                "`saegeo cache` command to resume it, or open with allow_incomplete=True"
            )
        self.shards = [ShardInfo(**{k: s[k] for k in ShardInfo.__dataclass_fields__}) for s in self.manifest["shards"]]
        self.storage_dtype = STORAGE_DTYPES[self.manifest["dtype"]]
        # row offset of each shard, for random access by global row index
        self.offsets = np.concatenate([[0], np.cumsum([s.rows for s in self.shards])]).astype(np.int64)
        self._last_read: tuple[int, torch.dtype, Tensor] | None = None
        if check_headers:  # the manifest's rows, d and dtype against what each shard says it holds (headers only)
            for i in range(len(self.shards)):
                self._check_header(i)

    def _where(self, i: int) -> str:
        return f"{self.path}: shard {i} ({self.shards[i].file})"

    def _check_header(self, i: int) -> None:
        """StoreError unless shard i's safetensors header declares activations of the manifest's (rows, d) and
        dtype (and per-row columns of its rows). A missing or resized file is refused when it is read (and named
        by verify()), so that `store verify` can still list every problem."""
        info, where = self.shards[i], self._where(i)
        try:
            with open(self.path / info.file, "rb") as f:
                if os.fstat(f.fileno()).st_size != info.bytes:
                    return
                header, _ = _read_header(f)
        except FileNotFoundError:
            return
        except (OSError, ValueError, UnicodeDecodeError) as err:
            raise StoreError(f"{where}: unreadable safetensors header ({err}); re-cache this store") from None
        acts = header.get("activations") or {}
        want = SAFETENSORS_DTYPES[self.dtype]
        if acts.get("shape") != [info.rows, self.d] or acts.get("dtype") != want:
            raise StoreError(
                f"{where} holds activations {acts.get('dtype')} of shape {acts.get('shape')}, but the manifest says "
                f"{want} ({info.rows}, {self.d}); the manifest or the shard was changed: re-cache this store"
            )
        for column in ("token_ids", "positions"):
            if column in header and header[column].get("shape") != [info.rows]:
                raise StoreError(
                    f"{where}: {column} of shape {header[column].get('shape')} for {info.rows} rows; "
                    "re-cache this store"
                )

    d = property(lambda self: int(self.manifest["d"]))
    n_tokens = property(lambda self: int(self.manifest["n_tokens"]))
    hook = property(lambda self: self.manifest.get("hook", ""))
    model = property(lambda self: self.manifest.get("model", ""))
    dtype = property(lambda self: self.manifest["dtype"])
    corpus = property(lambda self: self.manifest.get("corpus", {}))
    complete = property(lambda self: bool(self.manifest.get("complete", False)))

    @property
    def columns(self) -> tuple[str, ...]:
        """The optional per-row columns the shards hold (token_ids, positions); stores whose manifest predates
        the "columns" key are read from their first shard."""
        if "columns" in self.manifest:
            return tuple(self.manifest["columns"])
        if not self.shards:
            return ()
        return tuple(k for k in ("positions", "token_ids") if k in self._load_shard_tensors(0))

    def __len__(self) -> int:
        return self.n_tokens

    def __repr__(self) -> str:
        return (
            f"ActivationStore({str(self.path)!r}, model={self.model!r}, hook={self.hook!r}, d={self.d}, "
            f"n_tokens={self.n_tokens}, shards={len(self.shards)}, dtype={self.dtype})"
        )

    def _repr_html_(self) -> str:
        # drawn by the renderers, imported on first display (importing the store never loads them)
        from saegeo.render.notebook import html_of

        return html_of(self)

    def _load_shard_tensors(self, i: int) -> dict[str, Tensor]:
        if not -len(self.shards) <= i < len(self.shards):
            raise StoreError(f"{self.path}: shard index {i} out of range (store has {len(self.shards)} shards)")
        info = self.shards[i]
        fpath = self.path / info.file
        where = f"{self.path}: shard {i} ({info.file})"
        try:
            size = os.path.getsize(fpath)
        except FileNotFoundError:
            raise StoreError(f"{where} is missing; run `saegeo store verify {self.path}` and re-cache") from None
        if size != info.bytes:  # cheap check on every read; verify() re-hashes the content
            raise StoreError(
                f"{where} is truncated or damaged: {size} bytes, manifest says {info.bytes}; re-cache this store"
            )
        # hashed through a memory map (no copy), then parsed from the same pages: the check costs one sha256
        # pass over bytes the reader loads anyway (benchmarks/verify_bench.py measures its share)
        if self.verify_reads and _sha256_mapped(fpath) != info.sha256:
            raise StoreError(self._checksum_message(i))
        try:
            tensors = st_load_file(str(fpath))
        except (SafetensorError, OSError, RuntimeError) as err:
            raise StoreError(f"{where} cannot be parsed ({err}); re-cache this store") from None
        acts = tensors.get("activations")
        if acts is None or acts.ndim != 2 or acts.shape != (info.rows, self.d) or acts.dtype != self.storage_dtype:
            shape = None if acts is None else tuple(acts.shape)
            found = None if acts is None else acts.dtype
            raise StoreError(
                f"{where}: activations {found} of shape {shape}, manifest says {self.dtype} "
                f"({info.rows}, {self.d}); re-cache this store"
            )
        return tensors

    def read_rows_at(self, index: Int[Tensor, " m"], dtype: torch.dtype = torch.float32) -> Float[Tensor, "m d"]:
        """Rows at global store indices ``index`` (in that order), out[j] = row index[j]. Each shard they touch is
        hashed and checked against the manifest like every read (unless verify=False), then only the rows asked
        for are copied out of its memory map (a resumed shuffle buffer holds a few rows of many shards)."""
        out = torch.empty(index.shape[0], self.d, dtype=dtype)
        if index.numel() == 0:
            return out
        if int(index.min()) < 0 or int(index.max()) >= self.n_tokens:
            raise StoreError(f"{self.path}: row index out of range [0, {self.n_tokens})")
        shard = torch.searchsorted(torch.from_numpy(self.offsets), index, right=True) - 1
        for i in shard.unique().tolist():
            sel = (shard == i).nonzero().squeeze(1)
            out[sel] = self._mapped_rows(i, index[sel] - int(self.offsets[i]), dtype)
        return out

    def _mapped_rows(self, i: int, local: Tensor, dtype: torch.dtype) -> Tensor:
        """Rows ``local`` of shard i from a private memory map of its file: the sha256 is taken over the same
        mapped pages (no copy into Python) and the header checked, before any row is used."""
        info, where = self.shards[i], self._where(i)
        fpath = self.path / info.file
        try:
            with open(fpath, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY) as mm:
                if len(mm) != info.bytes:
                    raise StoreError(
                        f"{where} is truncated or damaged: {len(mm)} bytes, manifest says {info.bytes}; "
                        "re-cache this store"
                    )
                if self.verify_reads and hashlib.sha256(mm).hexdigest() != info.sha256:
                    raise StoreError(self._checksum_message(i))
                header, start = _read_header(mm)
                entry = header.get("activations") or {}
                if entry.get("shape") != [info.rows, self.d] or entry.get("dtype") != SAFETENSORS_DTYPES[self.dtype]:
                    raise StoreError(
                        f"{where}: activations {entry.get('dtype')} {entry.get('shape')}, manifest says "
                        f"{SAFETENSORS_DTYPES[self.dtype]} ({info.rows}, {self.d}); re-cache this store"
                    )
                acts = torch.frombuffer(
                    mm, dtype=self.storage_dtype, count=info.rows * self.d, offset=start + int(entry["data_offsets"][0])
                )
                rows = acts.view(info.rows, self.d)[local].to(dtype)
                del acts  # the map closes only once no tensor views it
        except FileNotFoundError:
            raise StoreError(f"{where} is missing; run `saegeo store verify {self.path}` and re-cache") from None
        except (OSError, ValueError) as err:  # ValueError: an empty file cannot be mapped; a malformed header
            raise StoreError(f"{where} cannot be read ({err}); re-cache this store") from None
        return rows

    def _checksum_message(self, i: int) -> str:
        return (
            f"{self._where(i)} fails its sha256 check (the file is corrupt or was changed after caching); run "
            f"`saegeo store verify {self.path}` to list the damaged shards and re-cache the store, or pass "
            "--no-verify to read it anyway"
        )

    def read_shard(self, i: int, dtype: torch.dtype = torch.float32) -> Float[Tensor, "rows d"]:
        """Shard i's activations, upcast to `dtype` (float32 by default)."""
        return self._load_shard_tensors(i)["activations"].to(dtype)

    def read_token_ids(self, i: int) -> Int[Tensor, " rows"] | None:
        """Shard i's token ids (int64), or None if the store has none."""
        ids = self._load_shard_tensors(i).get("token_ids")
        return None if ids is None else ids.long()

    def read_positions(self, i: int) -> Int[Tensor, " rows"] | None:
        """Shard i's positions in their context window (int64), or None if the store has none."""
        pos = self._load_shard_tensors(i).get("positions")
        return None if pos is None else pos.long()

    def read_column_range(self, name: str, start: int, stop: int) -> Int[Tensor, " rows"] | None:
        """Rows [start, stop) of a per-row column ("token_ids" or "positions") as int64, read alone from each
        shard's safetensors file (a few bytes, not the shard); None when the store has no such column. Not
        hashed: for lookups after a pass that read, and so verified, the same shards (latent contexts)."""
        from safetensors import safe_open

        if name not in self.columns:
            return None
        start, stop = max(0, int(start)), min(int(stop), self.n_tokens)
        if stop <= start:
            return torch.zeros(0, dtype=torch.long)
        first = int(np.searchsorted(self.offsets, start, side="right") - 1)
        last = int(np.searchsorted(self.offsets, stop, side="left") - 1)
        parts = []
        for i in range(first, last + 1):
            lo, hi = max(start - int(self.offsets[i]), 0), min(stop - int(self.offsets[i]), self.shards[i].rows)
            try:
                with safe_open(str(self.path / self.shards[i].file), framework="pt") as f:
                    parts.append(f.get_slice(name)[lo:hi].long())
            except (SafetensorError, OSError) as err:
                raise StoreError(f"{self._where(i)}: cannot read its {name} ({err}); re-cache this store") from None
        return torch.cat(parts)

    def token_counts(self, stop_row: int | None = None) -> Int[Tensor, " vocab"] | None:
        """c_t = #{rows g < stop_row (default: every row) whose token id is t}, int64 of length max id + 1, from the
        token_ids column read alone shard by shard (``read_column_range``: unhashed, so call it before a pass that
        verifies these shards); None when the store has no token ids."""
        if "token_ids" not in self.columns:
            return None
        stop = self.n_tokens if stop_row is None else min(int(stop_row), self.n_tokens)
        counts = torch.zeros(0, dtype=torch.long)
        for i in range(len(self.shards)):
            lo = int(self.offsets[i])
            if lo >= stop:
                break
            ids = self.read_column_range("token_ids", lo, min(lo + self.shards[i].rows, stop))
            if ids.numel():
                part = torch.bincount(ids, minlength=counts.numel())  # never shorter than the counts so far
                part[: counts.numel()] += counts
                counts = part
        return counts

    def read_rows(self, start: int, stop: int, dtype: torch.dtype = torch.float32) -> Float[Tensor, "rows d"]:
        """Rows [start, stop) in store order, reading only the shards they touch."""
        start, stop = max(0, start), min(stop, self.n_tokens)
        if stop <= start:
            return torch.empty(0, self.d, dtype=dtype)
        first = int(np.searchsorted(self.offsets, start, side="right") - 1)
        last = int(np.searchsorted(self.offsets, stop, side="left") - 1)
        parts = []
        for i in range(first, last + 1):
            lo, hi = max(start - self.offsets[i], 0), min(stop - self.offsets[i], self.shards[i].rows)
            # consecutive small reads (e.g. held-out batches) hit the same shard: keep the last one
            if self._last_read is None or self._last_read[:2] != (i, dtype):
                self._last_read = (i, dtype, self.read_shard(i, dtype))
            parts.append(self._last_read[2][lo:hi])
        return torch.cat(parts)

    def verify(self, full: bool = True, shard_indices: Sequence[int] | None = None) -> list[str]:
        """Check shards against the manifest; one message per problem (missing, truncated, checksum, rows in
        the shard's header ≠ the manifest's), [] if OK. full=False skips the re-hashing."""
        problems = []
        indices = range(len(self.shards)) if shard_indices is None else shard_indices
        for i in indices:
            info = self.shards[i]
            where = f"shard {i} ({info.file})"
            fpath = self.path / info.file
            if not fpath.exists():
                problems.append(f"{where}: missing")
                continue
            size = os.path.getsize(fpath)
            if size < info.bytes:
                problems.append(f"{where}: truncated ({size} of {info.bytes} bytes)")
            elif size > info.bytes:
                problems.append(f"{where}: {size - info.bytes} extra bytes ({size}, expected {info.bytes})")
            elif full and sha256_file(fpath) != info.sha256:
                problems.append(f"{where}: checksum mismatch (content changed or corrupt)")
            else:  # the rows the shard itself holds, from its header: a consistently edited manifest is caught
                try:
                    with open(fpath, "rb") as f:
                        entry = _read_header(f)[0].get("activations") or {}
                except (OSError, ValueError, UnicodeDecodeError) as err:
                    problems.append(f"{where}: unreadable safetensors header ({err})")
                    continue
                shape, dtype = entry.get("shape"), entry.get("dtype")
                if shape != [info.rows, self.d]:
                    problems.append(
                        f"{where}: holds activations of shape {shape}, manifest says ({info.rows}, {self.d})"
                    )
                elif dtype != SAFETENSORS_DTYPES[self.dtype]:
                    problems.append(f"{where}: holds {dtype} activations, manifest says {self.dtype}")
        total = sum(info.rows for info in self.shards)
        if shard_indices is None and total != self.n_tokens:
            problems.append(f"manifest: shards hold {total} rows but n_tokens says {self.n_tokens}")
        return problems

    def iter_batches(
        self,
        batch_size: int,
        *,
        shuffle_buffer: int = 0,
        seed: int = 0,
        shuffle: bool | None = None,
        shard_indices: Sequence[int] | None = None,
        shard_stride: tuple[int, int] = (0, 1),
        stop_row: int | None = None,
        dtype: torch.dtype = torch.float32,
        progress: bool = False,
        drop_last: bool = False,
        metadata: bool = False,
    ) -> Iterator[Float[Tensor, "b d"]] | Iterator[tuple[Tensor, Tensor | None, Tensor | None]]:
        """Batches of `batch_size` rows (the last may be short unless drop_last), each row exactly once.

        shuffle (default: shuffle_buffer > 0): shards in a seeded random order, rows mixed through a buffer of
        about `shuffle_buffer` rows (deterministic for a given seed); otherwise store order.
        shard_indices restricts to those shards (e.g. a rank's contiguous block); shard_stride = (r, w) then
        keeps every w-th shard of the (shuffled) order from the r-th (a DDP rank's share of an epoch);
        stop_row drops every row at or after that global index (e.g. the held-out tail).
        metadata: yield (activations, token_ids, positions) instead, the ids and positions (int64) cut and
        shuffled with their rows; None for a column the store does not have.
        """
        if batch_size < 1:
            raise BadInputError(f"batch_size must be >= 1, got {batch_size}")
        shuffle = shuffle_buffer > 0 if shuffle is None else shuffle
        stop_row = self.n_tokens if stop_row is None else min(int(stop_row), self.n_tokens)
        order = list(range(len(self.shards))) if shard_indices is None else [int(i) for i in shard_indices]
        order = [i for i in order if self.offsets[i] < stop_row]
        gen = torch.Generator().manual_seed(seed)
        if shuffle:
            order = [order[j] for j in torch.randperm(len(order), generator=gen).tolist()]
        rank, world = shard_stride
        order = order[rank::world]
        bar = None
        if progress:
            total = sum(min(self.shards[i].rows, stop_row - int(self.offsets[i])) for i in order)
            bar = progress_bar(total=total, unit="tok", unit_scale=True, desc=self.hook)
        columns = ("activations", *(k for k in ("token_ids", "positions") if metadata and k in self.columns))
        # the columns travel together: one row permutation, one cut, for all of them
        pending = [torch.empty(0, self.d, dtype=dtype)] + [torch.empty(0, dtype=torch.long) for _ in columns[1:]]

        def emit(cols: list[Tensor]) -> Any:
            if not metadata:
                return cols[0]
            named = dict(zip(columns, cols))
            return named["activations"], named.get("token_ids"), named.get("positions")

        for i in order:
            keep = stop_row - int(self.offsets[i])
            if metadata:
                tensors = self._load_shard_tensors(i)
                rows = [tensors["activations"].to(dtype)[:keep]] + [tensors[k].long()[:keep] for k in columns[1:]]
            else:
                rows = [self.read_shard(i, dtype)[:keep]]
            # nothing pending: the shard's own (mapped, copy-on-write) rows, not a copy of them (75 MB a shard at
            # 8,192 × 2,304 float32, benchmarks/README.md "check widths")
            pending = [r if p_.shape[0] == 0 else torch.cat([p_, r]) for p_, r in zip(pending, rows)]
            if shuffle:
                if pending[0].shape[0] < shuffle_buffer + batch_size:
                    continue
                perm = torch.randperm(pending[0].shape[0], generator=gen)
                pending = [c[perm] for c in pending]
                # emit all but half a buffer, so rows from later shards mix with these
                n_emit = (pending[0].shape[0] - shuffle_buffer // 2) // batch_size * batch_size
            else:
                n_emit = pending[0].shape[0] // batch_size * batch_size
            for lo in range(0, n_emit, batch_size):
                yield emit([c[lo : lo + batch_size] for c in pending])
                if bar is not None:
                    bar.update(batch_size)
            # an emptied column lets go of the shard it viewed (its mapped pages), before the next shard is read
            pending = [c[n_emit:] if c.shape[0] > n_emit else c.new_empty((0, *c.shape[1:])) for c in pending]
        if shuffle and pending[0].shape[0] > 1:
            perm = torch.randperm(pending[0].shape[0], generator=gen)
            pending = [c[perm] for c in pending]
        stop = pending[0].shape[0] // batch_size * batch_size if drop_last else pending[0].shape[0]
        for lo in range(0, stop, batch_size):
            batch = [c[lo : lo + batch_size] for c in pending]
            yield emit(batch)
            if bar is not None:
                bar.update(batch[0].shape[0])
        if bar is not None:
            bar.close()


# --------------------------------------------------------------------------- convenience
def write_store(
    path: str | os.PathLike,
    data: Tensor | np.ndarray | Iterable[Tensor | np.ndarray],
    *,
    hook: str = "synthetic",
    model: str = "none",
    **writer_options: Any,
) -> ActivationStore:
    """Write a 2-D tensor (or an iterable of (n, d) batches) as a complete store and open it.

    writer_options (dtype, corpus, shard_rows, extra_meta, mode) go to StoreWriter unchanged; d is
    taken from the first batch."""
    if isinstance(data, (Tensor, np.ndarray)):
        batches: Iterable = [data]
    else:
        batches = data
    it = iter(batches)
    first = next(it, None)
    if first is None:
        raise BadInputError(f"{path}: write_store got no batches")
    first = torch.as_tensor(first)
    if first.ndim != 2:
        raise BadInputError(f"{path}: write_store needs (n, d) batches, got shape {tuple(first.shape)}")
    with StoreWriter(path, d=first.shape[1], hook=hook, model=model, **writer_options) as writer:
        writer.append(first)
        for batch in it:
            writer.append(batch)
    return ActivationStore(path)


def store_exclusions(store: ActivationStore | None) -> dict[str, Any] | None:
    """A store cached with exclusions: its manifest's rule and sums (None for any other source)."""
    extra = getattr(store, "manifest", {}).get("extra", {}) if store is not None else {}
    if not extra.get("exclusion_rule") or not extra.get("excluded"):
        return None
    return json_safe({"exclusion_rule": extra["exclusion_rule"], "excluded": extra["excluded"]})
