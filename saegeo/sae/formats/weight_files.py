"""The files a dictionary is read from, read safely: JSON configs, safetensors (memory-mapped, copy-on-write),
pickles (torch.load with weights_only=True: tensors and plain containers, never code) and npz archives; and the
page handling of mapped weights (`read_sparsely`, `release_pages`, `is_mapped`). Every failure is one FormatError
naming the file.
"""

from __future__ import annotations

import json
import mmap
import pickle
import struct
import sys
import warnings
import weakref
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file

from saegeo.errors import FormatError


def read_json(file: Path) -> dict:
    try:
        raw = json.loads(file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise FormatError(f"{file}: cannot read JSON ({err}); the file is truncated or not a config") from None
    except RecursionError:  # json's C parser recurses once per nesting level
        raise FormatError(
            f"{file}: cannot read JSON (nested deeper than Python's parser allows); no SAE config is nested like this"
        ) from None
    if not isinstance(raw, dict):
        raise FormatError(f"{file}: expected a JSON object, found {type(raw).__name__}")
    return raw


_SAFETENSORS_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}


class _FileMap(mmap.mmap):
    """A private (copy-on-write) map of a weights file; a subclass only so that `release_pages` can hold it weakly."""


_LINUX_MADV_PAGEOUT = 21  # <linux/mman.h> (Linux >= 5.4); Python's mmap module names it only from 3.13
_MAPS: list[tuple[int, int, weakref.ref]] = []  # (first address, length, the _FileMap) of each live map


def read_safetensors(file: Path, *, mapped: bool = True) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors file. mapped (the default): each tensor is a view of one private,
    copy-on-write memory map of the file (safetensors' layout: an 8-byte little-endian header length n, n bytes
    of JSON {name: {dtype, shape, data_offsets}}, then the data): nothing is copied, a page is read when first
    touched, and an in-place write changes this process's copy only, never the file. Unknown dtypes, misaligned
    data or a big-endian host fall back to safetensors' own reader (a copy), as does mapped=False."""
    try:
        if mapped and sys.byteorder == "little":
            found = _mapped_safetensors(file)
            if found is not None:
                return found
        return _upcast_float8(load_file(str(file)))
    except FormatError:
        raise
    except Exception as err:  # SafetensorError, OSError, ... : all mean "not a readable safetensors file"
        raise FormatError(
            f"{file}: cannot read safetensors ({err}); the file is truncated or not safetensors, download it again"
        ) from None


def _mapped_safetensors(file: Path) -> dict[str, torch.Tensor] | None:
    """`read_safetensors`'s mapped path; None where it must fall back to the copying reader."""
    with open(file, "rb") as f:
        size = f.seek(0, 2)
        f.seek(0)
        if size < 8:
            raise FormatError(
                f"{file}: cannot read safetensors ({size} bytes); the file is truncated, download it again"
            )
        (n_header,) = struct.unpack("<Q", f.read(8))
        if n_header > size - 8:
            raise FormatError(f"{file}: cannot read safetensors (header of {n_header} bytes in a {size}-byte file)")
        header = json.loads(f.read(n_header))
        start = 8 + n_header
        entries = {k: v for k, v in header.items() if k != "__metadata__"}
        for name, entry in entries.items():
            dtype = _SAFETENSORS_DTYPES.get(entry.get("dtype"))
            begin, end = entry["data_offsets"]
            numel = 1
            for n in entry["shape"]:
                numel *= int(n)
            if dtype is None or (start + begin) % dtype.itemsize:
                return None  # a dtype torch.frombuffer cannot view here, or misaligned data
            if end - begin != numel * dtype.itemsize or start + end > size:
                raise FormatError(
                    f"{file}: cannot read safetensors ({name}: {end - begin} bytes at {begin} for shape "
                    f"{entry['shape']} {entry['dtype']} in a {size}-byte file); the file is truncated, download it again"
                )
        if size == start or not any(e["data_offsets"][1] > e["data_offsets"][0] for e in entries.values()):
            return load_file(str(file))  # nothing to map (an empty map is refused)
        mapped = _FileMap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    tensors = {}
    for name, entry in entries.items():
        dtype, (begin, end) = _SAFETENSORS_DTYPES[entry["dtype"]], entry["data_offsets"]
        shape = [int(n) for n in entry["shape"]]
        if end == begin:
            tensors[name] = torch.empty(shape, dtype=dtype)
            continue
        tensors[name] = torch.frombuffer(
            mapped, dtype=dtype, count=(end - begin) // dtype.itemsize, offset=start + begin
        ).reshape(shape)
    first = next(t for t in tensors.values() if t.numel())
    base = first.data_ptr() - (start + entries[next(k for k, t in tensors.items() if t is first)]["data_offsets"][0])
    _MAPS[:] = [m for m in _MAPS if m[2]() is not None]
    _MAPS.append((base, len(mapped), weakref.ref(mapped)))
    return tensors


def is_mapped(tensor: torch.Tensor) -> bool:
    """Whether `tensor` is a view of a file mapped by `read_safetensors` (its storage is the file's pages)."""
    return _map_of(tensor) is not None


def _map_of(tensor: torch.Tensor) -> tuple[int, _FileMap] | None:
    if tensor.device.type != "cpu" or not tensor.numel():
        return None
    ptr = tensor.data_ptr()
    for base, length, ref in _MAPS:
        mapped = ref()
        if mapped is not None and base <= ptr < base + length:
            return base, mapped
    return None


def read_sparsely(tensor: torch.Tensor) -> None:
    """Ask the kernel to map only the pages of a mapped tensor (`read_safetensors`) that are read (madvise
    MADV_RANDOM over its bytes): no fault-around of the neighbouring 64 KB, no read-ahead. Why: a block of W_enc's
    columns reads a few KB of each of its rows, and fault-around made every row's 64 KB resident -- all of W_enc at
    16,384 latents. A no-op for any other tensor and where the platform lacks it."""
    _advise(tensor, getattr(mmap, "MADV_RANDOM", None))


def _advise(tensor: torch.Tensor, advice: int | None) -> None:
    """madvise(advice) over the pages a mapped tensor spans; a no-op for any other tensor, for advice None, and
    where the kernel refuses it (an older kernel without MADV_PAGEOUT: the pages stay resident)."""
    found = _map_of(tensor)
    if found is None or advice is None:
        return
    base, mapped = found
    lo, hi = _page_span(tensor, base, len(mapped))
    try:
        mapped.madvise(advice, lo, hi - lo)
    except OSError:
        pass


def _page_span(tensor: torch.Tensor, base: int, length: int) -> tuple[int, int]:
    """The page-aligned byte range of the mapping (at `base`, `length` bytes) that a view of it spans."""
    page = mmap.PAGESIZE
    first = tensor.data_ptr() - base
    last = first + _span_elements(tensor) * tensor.element_size()
    return first // page * page, min(length, -(-last // page) * page)


def release_pages(tensor: torch.Tensor) -> None:
    """Hand the resident pages of a mapped tensor (`read_safetensors`) back to the kernel: madvise MADV_PAGEOUT
    over the bytes it spans, so they stop counting in this process's memory; the next read pages them in again
    from the file. Pages this process wrote are kept (pageout never drops data). A no-op for any other tensor
    and where the platform lacks MADV_PAGEOUT."""
    _advise(tensor, getattr(mmap, "MADV_PAGEOUT", _LINUX_MADV_PAGEOUT if sys.platform.startswith("linux") else None))


def _span_elements(tensor: torch.Tensor) -> int:
    """Elements from a strided tensor's first to its last one (inclusive)."""
    return 1 + sum((n - 1) * s for n, s in zip(tensor.shape, tensor.stride()) if n > 0)


def read_pickle(file: Path) -> dict:
    """torch.load with weights_only=True: tensors and plain containers only, never code."""
    try:
        with warnings.catch_warnings():  # torch warns that quantized tensors (and their storages) are deprecated
            warnings.filterwarnings("ignore", message=".*(quantiz|TypedStorage)", category=UserWarning)
            obj = torch.load(file, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()] or [type(err).__name__]
        first = next(
            (ln for ln in lines if "Unsupported" in ln or "GLOBAL" in ln), lines[-1]
        )  # names the offending object
        raise FormatError(
            f"{file}: refused: the pickle holds objects other than tensors and plain containers, which could run code "
            f"on load (torch.load weights_only=True rejected it: {first[:200]}). If you trust its author, re-save it "
            "as a plain state dict or as safetensors."
        ) from None
    except Exception as err:  # truncated zip, EOF, not a torch file
        raise FormatError(
            f"{file}: cannot read ({type(err).__name__}: {str(err)[:200]}); the file is truncated or not a torch checkpoint, download it again"
        ) from None
    if not isinstance(obj, dict):
        raise FormatError(f"{file}: expected a state dict (a dict of tensors), found {type(obj).__name__}")
    # torch.compile'd modules save keys as "_orig_mod.<name>"
    return {k.removeprefix("_orig_mod."): _plain_tensor(file, k, v) for k, v in obj.items()}


_FLOAT8 = tuple(
    getattr(torch, n)
    for n in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz")
    if hasattr(torch, n)
)


def _upcast_float8(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """float8 tensors (F8_E4M3 / F8_E5M2) as float32: every float8 value is a float32 value, so nothing changes;
    torch has no isfinite, matmul or norm for float8."""
    return {k: v.float() if isinstance(v, torch.Tensor) and v.dtype in _FLOAT8 else v for k, v in tensors.items()}


def _plain_tensor(file: object, name: str, value: object) -> object:
    """A tensor of a pickle as a plain dense CPU tensor of its values: sparse -> dense, quantized -> dequantized
    (q·scale + zero point, what the model computes with), float8 -> float32 (exact); a meta tensor, which holds
    no values, is refused. Anything else is returned as it is."""
    if not isinstance(value, torch.Tensor):
        return value
    if value.is_meta:
        raise FormatError(
            f"{file}: {name} is a meta tensor (shape {tuple(value.shape)}, no values: saved from a model built on the "
            "meta device); save the model's real weights"
        )
    if value.layout != torch.strided:  # sparse COO / CSR / CSC / BSR
        value = value.to_dense()
    if value.is_quantized:
        value = value.dequantize()
    return value.float() if value.dtype in _FLOAT8 else value


def read_npz(file: Path) -> dict[str, torch.Tensor]:
    try:
        with np.load(file, allow_pickle=False) as data:
            arrays = {key: data[key] for key in data.files}  # each read is a fresh array
    except Exception as err:  # BadZipFile, ValueError (pickled arrays), EOFError, OSError
        raise FormatError(
            f"{file}: cannot read npz ({type(err).__name__}: {err}); the file is truncated or not an npz archive, download it again"
        ) from None
    odd = {key: str(a.dtype) for key, a in arrays.items() if a.dtype.kind not in "biufc"}
    if odd:  # object, string, datetime or void arrays
        raise FormatError(f"{file}: arrays {odd} are not numbers; save the weights as float32")
    # a big-endian array is read in native order (the same values); torch views native order only
    native = {key: a if a.dtype.isnative else a.astype(a.dtype.newbyteorder("=")) for key, a in arrays.items()}
    return {key: torch.from_numpy(np.ascontiguousarray(a)) for key, a in native.items()}
