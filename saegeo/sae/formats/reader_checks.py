"""The checks every reader runs, each refusing in one line that names the file and the field: tensors (floating
point, 2-D, the shapes a config implies, the keys a layout needs, finite values: `make_dictionary`), counts read
from configs, and each format's config schema (pydantic, strict: `schema_types`, `check_config`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import torch

from saegeo.errors import FormatError
from saegeo.sae.architectures import SAEConfig, get_architecture
from saegeo.sae.formats.format_reader import Dictionary, FormatInfo
from saegeo.sae.formats.weight_files import release_pages


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


def contract_shapes(cfg: SAEConfig) -> dict[str, tuple[int, ...]]:
    """The shape of each tensor an SAE of `cfg` holds, in the SAELens layout: W_enc (d_in, d_sae), W_dec (d_sae,
    d_in), b_enc (d_sae), b_dec (d_in), and the tensors its architecture keeps in the file (a threshold)."""
    shapes = {
        "W_enc": (cfg.d_in, cfg.d_sae),
        "W_dec": (cfg.d_sae, cfg.d_in),
        "b_enc": (cfg.d_sae,),
        "b_dec": (cfg.d_in,),
    }
    return shapes | get_architecture(cfg.activation).file_tensor_shapes(cfg)  # jumprelu, batchtopk: the threshold


def make_dictionary(cfg: SAEConfig, tensors: dict[str, torch.Tensor], where: object, info: FormatInfo) -> Dictionary:
    """The tensors (already in the SAELens orientation) as a Dictionary, refusing non-finite weights. The check
    reads a matrix in blocks of rows (no whole-matrix temporary) and hands a mapped one's pages back after it
    (`release_pages`), so checking W_enc and W_dec never holds both in memory."""
    require_floating(where, tensors)
    for name, shape in contract_shapes(
        cfg
    ).items():  # a reader's own checks name the file's keys; this one backs them all
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
