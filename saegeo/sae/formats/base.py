"""What every dictionary reader shares: the record a reader returns (`Dictionary`: SAEConfig, tensors in the
SAELens layout, `FormatInfo`), the safe file readers (JSON, safetensors, pickles with weights_only, npz) and the
checks whose messages name the file and the field.

Each reader module (saelens, sparsify, dictionary_learning, gemma_scope, llama_scope, goodfire, openai)
returns a Dictionary with the format's own encode/decode, transcribed from the library's code (not guessed):

  format               files                               x − b_dec first?      activation
  saelens              cfg.json + sae_weights.safetensors  apply_b_dec_to_input  standard: ReLU; topk: TopK then ReLU;
                                                                                 jumprelu: ReLU(pre)·[pre > θ]
  sparsify             cfg.json + sae.safetensors          yes (not transcoders) ReLU then TopK
  dictionary_learning  ae.pt [+ config.json]               per class             per class
  gemma_scope_npz      params.npz                          no                    ReLU(pre)·[pre > θ]
  gemma_scope_2        params.safetensors + config.json    no                    ReLU(pre)·[pre > θ]
  llama_scope          hyperparams.json +                  no (inputs ·√d/norm)  ReLU(pre)·[pre·‖W_dec,i‖ > θ]
                       checkpoints/final.safetensors
  goodfire             one .pth                            no                    ReLU
  openai               <name>.pt state dict                yes (pre_bias)        TopK then ReLU after a per-row
                                                                                 LayerNorm (undone after decode) | ReLU

Pickles are only read with torch.load(weights_only=True); anything else in them is refused.
Variants whose encode is outside the contract (gated, groupmax, skip connections, matching pursuit)
are refused by name rather than loaded with the wrong semantics.
"""

from __future__ import annotations

import functools
import json
import math
import mmap
import pickle
import struct
import sys
import warnings
import weakref
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file

from saegeo.errors import FormatError
from saegeo.sae.architectures import SAEConfig, get_architecture


@dataclass
class FormatInfo:
    """What a loader read from a dictionary's files beyond its encode/decode: provenance, and the facts
    `saegeo check` needs about how its inputs must be prepared. None: the format does not say."""

    format: str = "saegeo"  # a key of saegeo.sae.formats.LOADERS ("saelens", "sparsify", ...) or "saegeo"
    source: str | None = None  # the file or directory it was loaded from
    written_by: str | None = None  # "saegeo" for directories saegeo wrote
    model_name: str | None = None
    model_fingerprint: dict | None = None  # what the training store's model is (models.model_fingerprint)
    hook_name: str | None = None
    source_dtype: str | None = None  # dtype(s) of the stored weights (they are loaded as float32)
    hub_id: str | None = None  # the hub id it was resolved from (SAE.load("org/repo[/sub]" or a release id))
    release: dict | None = None  # a SAELens release id's {release, repo_id, path, registry: "saegeo" or the yaml}
    config_overrides: dict | None = None  # the release's config_overrides, applied as SAELens applies them
    # what the activations must be (SAELens metadata; `saegeo check --acts` compares them with the store)
    hook_head_index: int | None = None  # one attention head of a hook_z activation
    model_from_pretrained_kwargs: dict | None = None  # e.g. {"center_writing_weights": false}
    exclude_special_tokens: bool | list | None = None  # BOS / special-token rows left out of training
    prepend_bos: bool | None = None
    context_size: int | None = None
    expected_input_norm: float | None = (
        None  # E‖x‖ of the training inputs (Llama Scope dataset_average_activation_norm.in)
    )
    input_scale_folded: float | None = None  # Llama Scope: √d / norm_in folded into W_enc (and 1/it into W_dec, b_dec)
    # SAELens
    sae_lens_version: str | None = None
    architecture: str | None = None
    normalize_activations: str | None = None  # inputs must be scaled by a factor the files may not hold
    folded_scaling_factor: dict[str, float] | None = None  # {min, max} of a finetuning factor folded into W_dec
    # what training recorded about itself (SAELens metadata l0, num_dead_features, explained_variance; k of a
    # BatchTopK saved as JumpReLU): `saegeo check --acts` holds them against the rows
    recorded_metrics: dict | None = None
    # sparsify
    transcoder: bool = False  # reconstructs another activation than it reads (no b_dec subtraction)
    normalize_decoder: bool | None = None
    signed: bool = False  # top k of |pre|, negative codes kept (sparsify signed: true)
    # dictionary_learning
    dict_class: str | None = None
    trainer_class: str | None = None
    threshold: float | None = None  # BatchTopK / Matryoshka global threshold
    threshold_unset: bool = False  # BatchTopK threshold -1: never set in training, codes are dense
    stored_threshold_ignored: float | None = None  # AutoEncoderTopK keeps a threshold it does not use
    group_sizes: list[int] | None = None  # Matryoshka
    training_k: int | None = None  # BatchTopK k used in training (inference uses the threshold)
    # OpenAI
    openai_activation: str | None = None

    def to_dict(self) -> dict:
        """The fields that are set (not None / False), for reports."""
        return {k: v for k, v in asdict(self).items() if v is not None and v is not False}


@dataclass
class Dictionary:
    """What a reader returns: the SAEConfig, its tensors by SAE attribute name (W_enc (d_in, d_sae), W_dec
    (d_sae, d_in), b_enc, b_dec[, threshold]; any float dtype, checked finite) and what the files said.
    `saegeo.sae.model.SAE.load` builds the SAE from it."""

    cfg: SAEConfig
    tensors: dict[str, torch.Tensor]
    info: FormatInfo


EXPECTED_LAYOUTS = (
    "saelens: cfg.json + sae_weights.safetensors; sparsify: cfg.json + sae.safetensors; "
    "dictionary_learning: ae.pt [+ config.json]; Gemma Scope: params.npz; Gemma Scope 2: params.safetensors + config.json; "
    "Llama Scope: hyperparams.json + checkpoints/final.safetensors; Goodfire: one .pth (encoder_linear.*, decoder_linear.*); "
    "OpenAI sparse_autoencoder: one .pt state dict"
)


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


def require_floating(where: object, tensors: dict[str, torch.Tensor], names: tuple[str, ...] | None = None) -> None:
    """Refuse, in one line naming the tensor, weights that are not real floating point: integers, booleans or
    complex numbers in W_enc, W_dec, b_enc, b_dec or a threshold are never a trained SAE's (any float dtype,
    float8 included, is read)."""
    for name in names or tuple(tensors):
        value = tensors.get(name)
        if isinstance(value, torch.Tensor) and not value.is_floating_point():
            raise FormatError(
                f"{where}: {name} is {str(value.dtype).removeprefix('torch.')}; an SAE's weights are real floating "
                "point numbers (float32, bfloat16, float16, float64 or float8): this is not a trained SAE's tensor"
            )


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


def matrix_shape(where: object, name: str, tensor: object, layout: str) -> tuple[int, int]:
    """The two dimensions of a weight matrix, refused in one line unless it is a 2-D tensor (`layout` names them,
    e.g. "(d_sae, d_in)")."""
    if not isinstance(tensor, torch.Tensor) or tensor.ndim != 2:
        found = f"shape {tuple(tensor.shape)}" if isinstance(tensor, torch.Tensor) else f"a {type(tensor).__name__}"
        raise FormatError(f"{where}: {name} must be a 2-D tensor {layout}, found {found}")
    return int(tensor.shape[0]), int(tensor.shape[1])


def expect_shape(where: object, name: str, tensor: torch.Tensor, shape: tuple, implied_by: str) -> None:
    got = tuple(tensor.shape)
    if got != tuple(shape):
        hint = " (it looks transposed)" if len(shape) == 2 and got == tuple(reversed(shape)) else ""
        raise FormatError(f"{where}: {name} has shape {got}, expected {tuple(shape)} from {implied_by}{hint}")


def require_keys(where: object, tensors: dict, names: tuple[str, ...], what: str) -> None:
    missing = [n for n in names if n not in tensors]
    if missing:
        raise FormatError(f"{where}: missing {missing} for {what}; found keys {sorted(tensors)}")


def make_dictionary(cfg: SAEConfig, tensors: dict[str, torch.Tensor], where: object, info: FormatInfo) -> Dictionary:
    """The tensors (already in the SAELens orientation) as a Dictionary, refusing non-finite weights. The check
    reads a matrix in blocks of rows (no whole-matrix temporary) and hands a mapped one's pages back after it
    (`release_pages`), so checking W_enc and W_dec never holds both in memory."""
    require_floating(where, tensors)
    expected = {
        "W_enc": (cfg.d_in, cfg.d_sae),
        "W_dec": (cfg.d_sae, cfg.d_in),
        "b_enc": (cfg.d_sae,),
        "b_dec": (cfg.d_in,),
    }
    threshold = get_architecture(cfg.activation).threshold_shape(cfg)
    if threshold is not None:
        expected["threshold"] = threshold
    for name, shape in expected.items():  # a reader's own checks name the file's keys; this one backs them all
        value = tensors.get(name)
        if value is None:
            raise FormatError(
                f"{where}: missing {name} for a {cfg.activation} SAE with d_in={cfg.d_in}, d_sae={cfg.d_sae}"
            )
        if tuple(value.shape) != shape and (value.ndim > 1 or value.numel() != math.prod(shape)):
            raise FormatError(
                f"{where}: {name} has shape {tuple(value.shape)}, expected {shape} (d_in={cfg.d_in}, d_sae={cfg.d_sae})"
            )
    for name, value in tensors.items():
        value = value.detach()
        if value.is_floating_point() and not _all_finite(value):
            bad = (~torch.isfinite(value)).reshape(value.shape[0], -1).any(1).nonzero()[:, 0] if value.ndim else [0]
            raise FormatError(
                f"{where}: {name} has non-finite values (first at index {int(bad[0])}, {len(bad)} in all)"
            )
        release_pages(value)
    return Dictionary(cfg, {name: value.detach() for name, value in tensors.items()}, info)


def _all_finite(value: torch.Tensor, block_elements: int = 1 << 20) -> bool:
    if value.ndim < 2:
        return bool(torch.isfinite(value).all())
    rows = max(1, block_elements // max(1, value[0].numel()))
    return all(bool(torch.isfinite(value[s : s + rows]).all()) for s in range(0, value.shape[0], rows))


def count_field(
    where: object, raw: dict, key: str, default: object = None, *, minimum: int = 1, label: str | None = None
) -> int:
    """raw[key] (or `default` when absent) as an integer >= minimum: a count read from a config file. A string,
    a float with a fraction, a bool or a smaller number is refused in one line naming the file and the key
    (`label`, e.g. "trainer.dict_size", when the key sits inside the file's JSON)."""
    value = raw.get(key, default)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise FormatError(f"{where}: {label or key} must be an integer >= {minimum}, found {value!r}")
    return value


def dtype_name(tensors: dict) -> str:
    dtypes = sorted(
        {
            str(t.dtype).removeprefix("torch.")
            for t in tensors.values()
            if isinstance(t, torch.Tensor) and t.is_floating_point()
        }
    )
    return ",".join(dtypes)


# --------------------------------------------------------------------------- typed configs
# Each format's module declares the schema of its config file (`schema_types` gives the field types), built on
# first use: pydantic is imported only when a foreign config is read, never at CLI start-up. Strict mode: no
# string is read as a number or a boolean, no number as a boolean (benchmarks/README.md "Config schemas").


@functools.cache
def schema_types():
    """The field types every format schema is written in (pydantic, strict), as attributes:
    Config (the base model: unknown keys kept, values never coerced), Count (an integer >= 1; a whole float such
    as 12.0 is read as 12), Size (an integer >= 0), Flag (true/false), OptFlag (true/false/null: null is false,
    as the libraries' `if cfg.x:` reads it), Text (a string or null), Number (a finite number, not a boolean),
    Positive (a finite number > 0), NonNegative (a finite number >= 0), Object (a JSON object or null), and
    either(expected, accepts): a field of several JSON types, `accepts(value)` deciding and `expected` naming them."""
    from typing import Annotated, Any

    from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field

    def whole(value: Any) -> Any:
        return int(value) if isinstance(value, float) and value.is_integer() else value

    def either(expected: str, accepts: Callable[[Any], bool]) -> Any:
        """A field of several JSON types (a union), checked by `accepts` and named by `expected` in the message."""

        def check(value: Any) -> Any:
            if not accepts(value):
                raise ValueError(expected)
            return value

        return Annotated[Any, AfterValidator(check)]

    class Config(BaseModel):
        model_config = ConfigDict(strict=True, extra="allow", frozen=True)

    finite = dict(allow_inf_nan=False)
    return type(
        "SchemaTypes",
        (),
        dict(
            Config=Config,
            Count=Annotated[int, BeforeValidator(whole), Field(ge=1)],
            Size=Annotated[int, BeforeValidator(whole), Field(ge=0)],
            Flag=bool,
            OptFlag=bool | None,
            Text=str | None,
            Number=Annotated[float, Field(**finite)],
            Positive=Annotated[float, Field(gt=0, **finite)],
            NonNegative=Annotated[float, Field(ge=0, **finite)],
            Object=dict[str, Any] | None,
            either=staticmethod(either),
        ),
    )


_EXPECTED = {  # pydantic error type -> what the field must be, in the words of a JSON file
    "int_type": "an integer",
    "int_from_float": "an integer",
    "float_type": "a number",
    "finite_number": "a finite number",
    "bool_type": "true or false",
    "string_type": "a string",
    "dict_type": "a JSON object",
    "model_type": "a JSON object",
    "model_attributes_type": "a JSON object",
    "list_type": "a list",
    "missing": "present",
}


def check_config(file: object, raw: dict, schema: type, *, within: str = "") -> None:
    """Check a config read from `file` against a format's schema (a `schema_types().Config` subclass); the first
    mismatch is one FormatError line: the file, the field (dotted, `within` first: e.g. "trainer.dict_class"),
    what it must be and the value found. A string where a boolean belongs is refused, never read as true."""
    from pydantic import ValidationError

    try:
        schema.model_validate(raw)
    except ValidationError as err:
        first = err.errors(include_url=False)[0]
        loc = [str(part) for part in first["loc"]]
        field = ".".join(filter(None, [within, *loc])) or "the top level"
        kind, ctx = first["type"], first.get("ctx") or {}
        expected = _EXPECTED.get(kind)
        if kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
            sign = {"greater_than": ">", "greater_than_equal": ">=", "less_than": "<", "less_than_equal": "<="}[kind]
            bound = next(iter(ctx.values()))
            is_int = isinstance(first["input"], int)
            bound = int(bound) if float(bound).is_integer() else bound
            expected = f"{'an integer' if is_int else 'a number'} {sign} {bound}"
        elif kind == "value_error":
            expected = str(ctx.get("error", first["msg"]))
        elif expected is None:
            expected = first["msg"].removeprefix("Input should be ").removeprefix("Value error, ")
        value = first.get("input")
        note = ""
        if kind == "bool_type" and isinstance(value, str):
            note = " (a string is not a boolean: the libraries would read any non-empty string, even 'false', as true)"
        shown = repr(value)
        shown = shown if len(shown) <= 80 else shown[:77] + "..."
        found = "nothing" if kind == "missing" else shown
        raise FormatError(f"{file}: {field} must be {expected}, found {found}{note}") from None
