"""The one reader of activation rows: a store, a file, a tensor or an iterator -> batches of (m, d) rows.

``open_rows(source, *, key=None, verify=True, skip_nonfinite=False) -> Rows``
    source: an ActivationStore or its directory; a ``.safetensors`` file (the tensor ``activations``, the
    only 2-D or 3-D tensor (floating ones first), or ``key``); a ``.npy`` file (memory-mapped); a ``.pt``/``.pth``
    file (read with ``torch.load(weights_only=True)``, memory-mapped); an (n, d) tensor or array; an iterable of
    (m, d) batches (or of (activations, codes) tuples, e.g. ``SuperpositionGenerator.batches``); a ``Rows``.
    A tensor, array or file tensor shaped (batch, pos, d), as transformer-lens' run_with_cache gives it, is read
    as batch·pos rows in order (row g is position g mod pos of batch row g div pos: ``Rows.window`` = pos, and
    ``batches(metadata=True)`` yields those positions, so the position-0 / BOS checks see them); any other shape
    is refused with SHAPE_RULE.
    A store's shards are checked against its manifest on open and hashed on every read (verify=False:
    ``--no-verify``, skips the hash).
``Rows.batches(batch_size, rank=0, world_size=1, *, stop_row=None, metadata=False) -> (iterator, first_row)``
    the rows in order, never all in memory; under torch.distributed a store or array yields only this
    rank's contiguous share (``first_row`` is its global index), an iterator is this rank's own data;
    stop_row: no row at or after that global index; metadata: (activations, token_ids, positions) from a store,
    (activations, None, positions) from a (batch, pos, d) source.
``Rows.read(index) -> (m, d)`` random access by global row index (store, file, tensor), verified like every read.
``Rows.screen(x, at, ...)`` the one NaN policy, applied to every batch ``batches`` yields and by the trainer to
    the rows it gathers: a row with NaN/inf is a BadInputError naming the source, the shard and the row, or,
    with skip_nonfinite, dropped and counted in ``Rows.n_nonfinite_skipped``.
``Rows.describe`` is the JSON-safe description a report records (kind, path, model, hook, d, n rows).
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from jaxtyping import Float
from torch import Tensor

from saegeo.activations.options import FILE_SUFFIXES, rows_path_kind
from saegeo.activations.store import ActivationStore
from saegeo.distributed import rank_rows, split_shards
from saegeo.errors import BadInputError, FormatError
from saegeo.geometry.accumulate import as_rows

SHAPE_RULE = "activations are (rows, d) or (batch, pos, d) (transformer-lens' layout, read as batch·pos rows)"


NONFINITE_ADVICE = (
    "Fix the producer, or pass --skip-nonfinite (Python: skip_nonfinite=True) to skip and count such rows."
)


@dataclass
class Rows:
    """An opened source of rows. ``n_rows`` and ``d`` are None for an iterator (known once read)."""

    kind: str  # "store" | "file" | "tensor" | "iterator"
    n_rows: int | None
    d: int | None
    describe: dict[str, Any] = field(default_factory=dict)
    store: ActivationStore | None = None
    skip_nonfinite: bool = False  # the NaN policy: skip and count (True) or refuse naming the row (False)
    n_nonfinite_skipped: int = 0  # rows dropped by screen() so far
    window: int | None = None  # pos of a (batch, pos, d) source: global row g sits at position g mod window
    _array: Any = None  # row-sliceable (n, d): tensor, numpy array / memmap, safetensors slice
    _iterable: Iterable[Any] | None = None

    def batches(
        self,
        batch_size: int,
        rank: int = 0,
        world_size: int = 1,
        *,
        stop_row: int | None = None,
        metadata: bool = False,
    ) -> tuple[Iterator[Any], int]:
        """(screened batches of at most ``batch_size`` rows, global index of the first row) for this rank."""
        if batch_size < 1:
            raise BadInputError(f"batch_size must be ≥ 1, got {batch_size}")
        if metadata and self.store is None and self.window is None:
            raise BadInputError(
                f"token ids and positions are read from an activation store (positions also from a (batch, pos, d) "
                f"source), not from a {self.kind} of rows"
            )
        if self.store is not None:
            block, first = None, 0
            if world_size > 1:
                block = split_shards([s.rows for s in self.store.shards], rank, world_size)
                first = int(self.store.offsets[block.start])
            raw = self.store.iter_batches(batch_size, shard_indices=block, stop_row=stop_row, metadata=metadata)
        elif self._array is not None:
            share = rank_rows(self.n_rows, rank, world_size)
            first, stop = share.start, share.stop if stop_row is None else max(share.start, min(share.stop, stop_row))
            array, window = self._array, self.window
            raw = (array[lo : min(lo + batch_size, stop)] for lo in range(first, stop, batch_size))
            if metadata:  # a (batch, pos, d) source: no token ids, the positions its layout gives
                raw = (
                    (a, None, torch.arange(lo, lo + len(a)) % window)
                    for lo, a in zip(range(first, stop, batch_size), raw)
                )
        else:
            first, raw = 0, self._unwrap(stop_row)
        return self._screened(raw, first, metadata), first

    def _unwrap(self, stop_row: int | None) -> Iterator[Any]:
        seen = 0
        for b in self._iterable:
            b = b[0] if isinstance(b, (tuple, list)) else b  # (activations, codes) from the generator
            if stop_row is not None:
                b = b[: max(0, stop_row - seen)]
                if len(b) == 0:
                    return
            seen += len(b)
            yield b

    def _screened(self, raw: Iterator[Any], first: int, metadata: bool) -> Iterator[Any]:
        at = first
        for index, batch in enumerate(raw):
            x = as_rows(batch[0] if metadata else batch)
            keep = self.finite_rows(x, at, batch=index)
            at += x.shape[0]
            if metadata:
                yield batch if keep is None else tuple(c if c is None else c[keep] for c in batch)
            else:
                yield x if keep is None else x[keep]

    def row_place(self, g: int) -> str:
        """Where global row g lives, in words: the store's path, its shard and the row in it; the file; the tensor."""
        if self.store is not None:
            st = self.store
            i = int(np.searchsorted(st.offsets, g, side="right") - 1)
            if 0 <= i < len(st.shards):
                return f"{st.path}, shard {i} ({st.shards[i].file}) row {g - int(st.offsets[i])}"
            return str(st.path)
        if self.kind == "file":
            return str(self.describe.get("path"))
        return "the tensor" if self.kind == "tensor" else "the stream of batches"

    def finite_rows(self, x: Tensor, at: int | Tensor, *, batch: int | None = None, context: str = "") -> Tensor | None:
        """The NaN policy for one batch ``x`` whose row j is global row ``at + j`` (or ``at[j]``, an index tensor):
        None when every row is finite; else BadInputError naming the first bad row, or (skip_nonfinite) the mask
        of the rows to keep, their number counted in n_nonfinite_skipped. ``context`` adds what the rows are for."""
        bad = _nonfinite_rows(x)
        if bad is None:
            self._within_range(x, at, batch)
            return None
        j = int(bad.nonzero()[0])
        if not self.skip_nonfinite:
            g = int(at[j]) if isinstance(at, Tensor) else at + j
            in_batch = f", batch {batch} row {j}" if batch is not None else ""
            raise BadInputError(
                f"non-finite value (NaN or inf) in {self.row_place(g)}{in_batch} (global row {g}){context}; "
                f"{int(bad.sum())} such row(s) in this batch. {NONFINITE_ADVICE}"
            )
        self.n_nonfinite_skipped += int(bad.sum())
        self._within_range(x[~bad], at[~bad] if isinstance(at, Tensor) else (at + torch.arange(len(x)))[~bad], batch)
        return ~bad

    def _within_range(self, x: Tensor, at: int | Tensor, batch: int | None, dtype: torch.dtype | None = None) -> None:
        """Refuse (BadInputError naming the row) finite values whose squares leave the range the geometry computes
        in (``dtype``, default float64 for float64 input, float32 otherwise; see `magnitude_range`): sums of
        squares would overflow to inf or underflow to 0 and every second moment would be wrong. Zeros are fine;
        non-finite values are the NaN policy's (finite_rows).

        Refused, not rescaled: float64 rows between 2¹³⁰ and float64's largest could be divided by a power of two
        (exact), but every printed norm, mean and b_dec would then be of the scaled rows, or each read-out would
        carry the scale through sixth powers; one multiplication by the user, which the message proposes, keeps
        every number what it says."""
        if x.numel() == 0:
            return
        lo, hi = torch.aminmax(x)
        top = max(-float(lo), float(hi))
        smallest, largest = magnitude_range(x.dtype if dtype is None else dtype)
        if top == 0 or not math.isfinite(top) or smallest <= top <= largest:
            return
        j = int((x.abs() == top).any(dim=1).nonzero()[0])
        g = int(at[j]) if isinstance(at, Tensor) else at + j
        in_batch = f", batch {batch} row {j}" if batch is not None else ""
        compute = "float64" if (x.dtype if dtype is None else dtype) == torch.float64 else "float32"
        if top > largest:
            why = f"above {largest:.3g}, where sums of their powers overflow {compute}"
        else:
            why = f"every value below {smallest:.3g}, where their powers underflow {compute} (lose digits or become 0)"
        raise BadInputError(
            f"{self.row_place(g)}{in_batch} (global row {g}): values of magnitude up to {top:.3g}, {why}; the "
            f"geometry would be wrong. Multiply the activations by one constant, e.g. 1e{min(300, max(-300, -round(math.log10(top))))} "
            f"(every measure but the norms is scale-free){'' if compute == 'float64' else ', or save them as float64'}"
        )

    def screen(self, x: Tensor, at: int | Tensor, *, context: str = "") -> Tensor:
        """``x`` under the NaN policy (see finite_rows): unchanged, refused, or without its non-finite rows."""
        keep = self.finite_rows(x, at, context=context)
        return x if keep is None else x[keep]

    def read(self, index: Tensor) -> Float[Tensor, "m d"]:
        """Rows at global indices ``index`` (in that order) as float32: a store's shards hashed and checked
        (ActivationStore.read_rows_at); a tensor, array or file indexed in memory (or its memory map). Finite
        values outside float32's computed range are refused naming the global row (as every batch read is);
        NaN/inf are left to the caller's NaN policy (``screen``)."""
        if self.store is not None:
            x = self.store.read_rows_at(index)
        elif self._array is None:
            raise BadInputError("a stream of batches cannot be read by row index; pass a tensor, a file or a store")
        else:
            x = as_rows(self.tensor()[index])
        self._within_range(x, index, None, dtype=torch.float32)  # before float32 could turn 1e39 into inf
        return x.float()

    def tensor(self) -> Float[Tensor, "n d"]:
        """All rows as one (n, d) tensor without a copy where the source allows it (a tensor, a .npy or .pt
        memory map); a .safetensors file is read whole. Not for stores (read them by shard or by index)."""
        if self._array is None:
            raise BadInputError(f"a {self.kind} is not held as one tensor")
        array = self._array
        if isinstance(array, _SafetensorsRows):
            self._array = array = array[:]
        return as_rows(array)


def _nonfinite_rows(x: Tensor) -> Tensor | None:
    """Rows holding a NaN/inf, None if there are none. The smallest and largest entry screen cheaply (one pass,
    no (n, d) mask; NaN propagates into both); only a non-finite one is looked at entry-wise."""
    if x.numel() == 0:
        return None
    lo, hi = torch.aminmax(x)
    if math.isfinite(float(lo)) and math.isfinite(float(hi)):
        return None
    bad = (~torch.isfinite(x)).any(dim=1)
    return bad if bool(bad.any()) else None


def magnitude_range(dtype: torch.dtype) -> tuple[float, float]:
    """(smallest, largest) value the largest |x| of a batch may take for the geometry to be computed exactly: in
    float32 (rows of 32 bits or fewer) a square must be a normal float32 with room for a sum of 2²⁴ of them:
    (2⁻⁶³ = √tiny, 2⁴⁰ = √max·2⁻²⁴) ≈ (1.1e-19, 1.1e12); in float64 the null test's variance takes sixth powers of
    the entries (m₂³), which must stay normal float64s over up to 2⁴⁰ entries: (2⁻¹³⁰, 2¹³⁰) ≈ (7.3e-40, 1.4e39)."""
    return (2.0**-63, 2.0**40) if dtype != torch.float64 else (2.0**-130, 2.0**130)


def shape_error(where: str, shape: tuple) -> BadInputError:
    """The one message for a tensor whose shape cannot be rows (every source: tensors, arrays, files, --key)."""
    return BadInputError(f"{where}: shape {tuple(shape)}; {SHAPE_RULE}. Reshape it to one of these")


def _pick_key(tensors: dict[str, tuple[tuple, bool]], key: str | None, path: Path) -> str:
    """The tensor to read: ``key``, else ``activations``, else the only tensor, else the only 2-D or 3-D one (among floating tensors
    first: token ids beside activations are not a second candidate). ``tensors``: name -> (shape, floating)."""
    if key is not None:
        if key not in tensors:
            raise BadInputError(f"{path}: no tensor named '{key}'; it holds {sorted(tensors)}")
        return key
    if "activations" in tensors:
        return "activations"
    if len(tensors) == 1:  # the only tensor: its shape is checked where it is read
        return next(iter(tensors))
    rows_like = [k for k, (shape, _) in tensors.items() if len(shape) in (2, 3)]
    floating = [k for k in rows_like if tensors[k][1]]
    candidates = floating if floating else rows_like
    if len(candidates) == 1:
        return candidates[0]
    shapes = {k: tuple(shape) for k, (shape, _) in tensors.items()}
    raise BadInputError(
        f"{path}: tensors that could be activations: {sorted(candidates) or 'none'} (it holds {shapes}); "
        f"pass --key NAME ({SHAPE_RULE})"
    )


def _row_layout(array: Any, shape: tuple, where: str) -> tuple[Any, int, int, int | None]:
    """(row-sliceable (n, d) view, n, d, window) of a (rows, d) or (batch, pos, d) tensor, array or file slice;
    a (batch, pos, d) tensor or array is reshaped without a copy where its layout allows (a memory map stays one)."""
    if len(shape) == 2:
        return array, int(shape[0]), int(shape[1]), None
    if len(shape) != 3:
        raise shape_error(where, shape)
    b, p, d = (int(s) for s in shape)
    if isinstance(array, _SafetensorsRows):
        array.window = p
    else:
        array = array.reshape(b * p, d)
    return array, b * p, d, p


class _SafetensorsRows:
    """Row slices of one safetensors tensor, read lazily; of a (batch, pos, d) tensor (``window`` = pos), the
    flattened rows lo..hi are cut from the batch rows that hold them."""

    def __init__(self, tensor_slice: Any):
        self.slice = tensor_slice
        self.window: int | None = None

    def __getitem__(self, index: slice) -> Tensor:
        if self.window is None:
            return self.slice[index]
        b, p, d = self.slice.get_shape()
        lo, hi, _ = index.indices(b * p)
        first = lo // p
        block = self.slice[first : -(-hi // p)]
        return block.reshape(-1, d)[lo - first * p : hi - first * p]


def _dense_values(path: Path, name: str, tensor: Tensor) -> Tensor:
    """A .pt tensor as a strided tensor of its values: sparse -> dense, quantized -> dequantized (q·scale + zero
    point); a meta tensor (a shape without values) is refused."""
    if tensor.is_meta:
        raise FormatError(
            f"{path}: tensor {name!r} is a meta tensor (shape {tuple(tensor.shape)}, no values: saved from a model "
            "on the meta device); save the activations themselves"
        )
    if tensor.layout != torch.strided:
        tensor = tensor.to_dense()
    return tensor.dequantize() if tensor.is_quantized else tensor


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
        if rows.dtype.kind not in "biuf":  # booleans are read as 0/1, as from .safetensors and .pt
            raise FormatError(f"{path}: a .npy array of dtype {rows.dtype}; activations must be real numbers")
        name, shape = "array", tuple(rows.shape)
    elif ext == ".safetensors":
        from safetensors import SafetensorError, safe_open

        try:
            handle = safe_open(str(path), framework="pt")
            tensors = {}
            for k in handle.keys():
                tensor_slice = handle.get_slice(k)
                tensors[k] = (tuple(tensor_slice.get_shape()), tensor_slice.get_dtype().startswith(("F", "BF")))
        except (SafetensorError, OSError) as err:
            raise FormatError(f"{path}: not a readable .safetensors file ({err})") from None
        name = _pick_key(tensors, key, path)
        rows, shape = _SafetensorsRows(handle.get_slice(name)), tensors[name][0]
    elif ext in (".pt", ".pth"):
        try:
            with (
                warnings.catch_warnings()
            ):  # torch warns that quantized tensors (and their storages) are deprecated: they are read here
                warnings.filterwarnings("ignore", message=".*(quantiz|TypedStorage)", category=UserWarning)
                obj = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except Exception as err:  # weights_only refuses pickled code; corrupt files raise various errors
            raise FormatError(f"{path}: cannot load with torch.load(weights_only=True): {err}") from None
        if isinstance(obj, Tensor):
            obj = {"tensor": obj}
        if not isinstance(obj, dict):
            raise FormatError(f"{path}: holds a {type(obj).__name__}; expected a tensor or a dict of tensors")
        tensors = {k: (tuple(v.shape), v.is_floating_point()) for k, v in obj.items() if isinstance(v, Tensor)}
        name = _pick_key(tensors, key, path)
        rows, shape = _dense_values(path, name, obj[name]), tensors[name][0]
    else:
        raise BadInputError(
            f"{path}: unknown file type '{ext}'; use {', '.join(FILE_SUFFIXES)} or an activation-store directory"
        )
    rows, n, d, window = _row_layout(rows, shape, str(path) if ext == ".npy" else f"{path} (tensor {name!r})")
    describe = {"kind": "file", "path": str(path), "d": d, "n_tokens_in_source": n, "shape": list(shape)}
    return Rows("file", n, d, describe, window=window, _array=rows)


def open_rows(source: Any, *, key: str | None = None, verify: bool = True, skip_nonfinite: bool = False) -> Rows:
    """Open any source of activation rows (see the module docstring) without reading it whole.

    verify=False reads a store's shards without checking their sha256 (see ActivationStore); skip_nonfinite
    skips and counts rows with NaN/inf instead of refusing them (Rows.finite_rows)."""
    if isinstance(source, Rows):
        return source
    rows = _open(source, key, verify)
    rows.skip_nonfinite = skip_nonfinite
    return rows


def _open(source: Any, key: str | None, verify: bool) -> Rows:
    if isinstance(source, (str, os.PathLike)):
        if rows_path_kind(source) == "file":
            return _open_file(Path(source), key)
        source = ActivationStore(source, verify=verify)
    if isinstance(source, ActivationStore):
        describe = {
            "kind": "store",
            "path": str(source.path),
            "model": source.model,
            "hook": source.hook,
            "d": source.d,
            "n_tokens_in_store": source.n_tokens,
            "dtype": source.dtype,
            "corpus": source.corpus,
        }
        return Rows("store", source.n_tokens, source.d, describe, store=source)
    if isinstance(source, (Tensor, np.ndarray)):
        shape = tuple(source.shape)
        flat, n, d, window = _row_layout(source, shape, f"the {type(source).__name__.lower()}")
        x = as_rows(flat)
        describe = {"kind": "tensor", "d": d, "n_tokens_in_source": n, "shape": list(shape)}
        return Rows("tensor", n, d, describe, window=window, _array=x)
    if isinstance(source, Iterable) or hasattr(source, "__next__"):
        return Rows("iterator", None, None, {"kind": "iterator"}, _iterable=source)
    raise BadInputError(
        f"cannot read activations from a {type(source).__name__}; pass a tensor, an ActivationStore (or its path), "
        f"a file ({', '.join(FILE_SUFFIXES)}) or an iterator of (batch, d) tensors"
    )
