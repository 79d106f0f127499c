"""The one reader of activation rows: a store, a file, a tensor or an iterator -> batches of (m, d) rows.

``open_rows(source, *, key=None, verify=True) -> Rows``
    source: an ActivationStore or its directory; a ``.safetensors`` file (the tensor ``activations``, the
    only 2-D tensor, or ``key``); a ``.npy`` file (memory-mapped); a ``.pt``/``.pth`` file (read with
    ``torch.load(weights_only=True)``, memory-mapped); an (n, d) tensor or array; an iterable of (m, d)
    batches (or of (activations, codes) tuples, e.g. ``SuperpositionGenerator.batches``); a ``Rows``.
``Rows.batches(batch_size, rank=0, world_size=1) -> (iterator, first_row)``
    the rows in order, never all in memory; under torch.distributed a store or array yields only this
    rank's contiguous share (``first_row`` is its global index), an iterator is this rank's own data.
``Rows.describe`` is the JSON-safe description a report records (kind, path, model, hook, d, n rows).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator

import numpy as np
import torch
from torch import Tensor

from saegeo.activations.store import MANIFEST, ActivationStore
from saegeo.distributed import rank_rows, split_shards
from saegeo.errors import BadInputError, FormatError
from saegeo.geometry.accumulate import as_rows

FILE_SUFFIXES = (".safetensors", ".npy", ".pt", ".pth")


@dataclass
class Rows:
    """An opened source of rows. ``n_rows`` and ``d`` are None for an iterator (known once read)."""

    kind: str  # "store" | "file" | "tensor" | "iterator"
    n_rows: int | None
    d: int | None
    describe: dict[str, Any] = field(default_factory=dict)
    store: ActivationStore | None = None
    _array: Any = None  # row-sliceable (n, d): tensor, numpy array / memmap, safetensors slice
    _iterable: Iterable[Any] | None = None

    def batches(self, batch_size: int, rank: int = 0, world_size: int = 1) -> tuple[Iterator[Any], int]:
        """(batches of at most ``batch_size`` rows, global index of the first row) for this rank."""
        if batch_size < 1:
            raise BadInputError(f"batch_size must be ≥ 1, got {batch_size}")
        if self.store is not None:
            if world_size == 1:
                return self.store.iter_batches(batch_size), 0
            block = split_shards([s.rows for s in self.store.shards], rank, world_size)
            return self.store.iter_batches(batch_size, shard_indices=block), int(self.store.offsets[block.start])
        if self._array is not None:
            share = rank_rows(self.n_rows, rank, world_size)
            array = self._array
            return (array[lo : min(lo + batch_size, share.stop)] for lo in range(share.start, share.stop, batch_size)), share.start

        def unwrap() -> Iterator[Any]:
            for b in self._iterable:
                yield b[0] if isinstance(b, (tuple, list)) else b  # (activations, codes) from the generator

        return unwrap(), 0


def _pick_key(names_shapes: dict[str, tuple], key: str | None, path: Path) -> str:
    if key is not None:
        if key not in names_shapes:
            raise BadInputError(f"{path}: no tensor named '{key}'; it holds {sorted(names_shapes)}")
        return key
    if "activations" in names_shapes:
        return "activations"
    two_d = [k for k, shape in names_shapes.items() if len(shape) == 2]
    if len(two_d) == 1:
        return two_d[0]
    raise BadInputError(f"{path}: cannot tell which tensor to read (2-D tensors: {sorted(two_d) or 'none'}); pass --key NAME")


class _SafetensorsRows:
    """Row slices of one safetensors tensor, read lazily."""

    def __init__(self, tensor_slice: Any):
        self.slice = tensor_slice

    def __getitem__(self, index: slice) -> Tensor:
        return self.slice[index]


def _open_file(path: Path, key: str | None) -> Rows:
    ext = path.suffix.lower()
    if ext == ".npy":
        try:
            rows: Any = np.load(path, mmap_mode="r", allow_pickle=False)
        except (ValueError, EOFError, OSError) as err:  # a 0-byte or truncated file, pickled objects
            raise FormatError(f"{path}: not a readable numeric .npy array ({err}); save it with numpy.save") from None
        if not rows.dtype.isnative:  # torch reads native byte order only
            raise FormatError(
                f"{path}: a {'big' if rows.dtype.byteorder == '>' else 'little'}-endian .npy array; rewrite it in "
                "native order, e.g. numpy.save(path, x.astype(x.dtype.newbyteorder('=')))"
            )
        if rows.dtype.kind not in "fiu":
            raise FormatError(f"{path}: a .npy array of dtype {rows.dtype}; activations must be numbers")
        tensors, shape = {"array": rows.shape}, tuple(rows.shape)
    elif ext == ".safetensors":
        from safetensors import SafetensorError, safe_open

        try:
            handle = safe_open(str(path), framework="pt")
            tensors = {k: tuple(handle.get_slice(k).get_shape()) for k in handle.keys()}
        except (SafetensorError, OSError) as err:
            raise FormatError(f"{path}: not a readable .safetensors file ({err})") from None
        name = _pick_key(tensors, key, path)
        rows, shape = _SafetensorsRows(handle.get_slice(name)), tensors[name]
    elif ext in (".pt", ".pth"):
        try:
            obj = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except Exception as err:  # weights_only refuses pickled code; corrupt files raise various errors
            raise FormatError(f"{path}: cannot load with torch.load(weights_only=True): {err}") from None
        if isinstance(obj, Tensor):
            obj = {"tensor": obj}
        if not isinstance(obj, dict):
            raise FormatError(f"{path}: holds a {type(obj).__name__}; expected a tensor or a dict of tensors")
        tensors = {k: tuple(v.shape) for k, v in obj.items() if isinstance(v, Tensor)}
        name = _pick_key(tensors, key, path)
        rows, shape = obj[name], tensors[name]
    else:
        raise BadInputError(
            f"{path}: unknown file type '{ext}'; use {', '.join(FILE_SUFFIXES)} or an activation-store directory"
        )
    if len(shape) != 2:
        raise BadInputError(f"{path}: tensor has shape {shape}; expected (rows, d). Tensors here: {tensors}")
    n, d = int(shape[0]), int(shape[1])
    return Rows("file", n, d, {"kind": "file", "path": str(path), "d": d, "n_tokens_in_source": n}, _array=rows)


def open_rows(source: Any, *, key: str | None = None, verify: bool = True) -> Rows:
    """Open any source of activation rows (see the module docstring) without reading it whole.

    verify=False reads a store's shards without checking their sha256 (see ActivationStore)."""
    if isinstance(source, Rows):
        return source
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        if path.is_dir():
            if not (path / MANIFEST).is_file():
                raise BadInputError(
                    f"{path}: not an activation store (no {MANIFEST}). Cache one with `saegeo cache`, or pass a "
                    f"file ({', '.join(FILE_SUFFIXES)}), a tensor or an iterator of batches"
                )
            source = ActivationStore(path, verify=verify)
        elif path.is_file():
            return _open_file(path, key)
        else:
            raise BadInputError(
                f"{path}: not an activation store or a file (nothing is there). Cache a store with `saegeo cache`, "
                f"or pass a file ({', '.join(FILE_SUFFIXES)})"
            )
    if isinstance(source, ActivationStore):
        describe = {"kind": "store", "path": str(source.path), "model": source.model, "hook": source.hook,
                    "d": source.d, "n_tokens_in_store": source.n_tokens, "dtype": source.dtype, "corpus": source.corpus}
        return Rows("store", source.n_tokens, source.d, describe, store=source)
    if isinstance(source, (Tensor, np.ndarray)):
        x = as_rows(source)
        n, d = int(x.shape[0]), int(x.shape[1])
        return Rows("tensor", n, d, {"kind": "tensor", "d": d, "n_tokens_in_source": n}, _array=x)
    if isinstance(source, Iterable) or hasattr(source, "__next__"):
        return Rows("iterator", None, None, {"kind": "iterator"}, _iterable=source)
    raise BadInputError(
        f"cannot read activations from a {type(source).__name__}; pass a tensor, an ActivationStore (or its path), "
        f"a file ({', '.join(FILE_SUFFIXES)}) or an iterator of (batch, d) tensors"
    )
