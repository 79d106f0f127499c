"""The one path from a config dataclass to a TOML table and to command-line flags.

Every option of every command is a field of a config dataclass, declared once with ``option(default, help,
checks)``: the field's name is its TOML key and (in kebab case) its flag, its metadata holds the help and the
checks, and ``check(cfg)`` (each config's ``__post_init__``) refuses a bad value wherever it came from — a flag,
a config file, ``saegeo run`` or Python — with one line naming the field.

Public API
----------
``option(default, help, *, low, high, above, below, factory, flag, flag_name, old_flags)``   a dataclass field with
                                       its help and checks (and its flag's spelling, where it is not the field's).
``check(cfg)``                         every field checked: type, finite, range; int fields fit in int64.
``from_dict(cls, d, where=None)``      dict (TOML table, JSON object) -> ``cls``: unknown keys refused, values
                                       coerced by annotation ("2M" ints, lists as tuples, Literal choices).
``resolve(cls, passed, path, table)``  flags > the config file (its ``[table]`` or its top level) > defaults.
``add_options(parser, cls)`` / ``passed(args, cls)``   the flags of ``cls`` and the fields a user gave.
``renamed_flag(parser, old, new, **kw)``  an old spelling of a flag, kept one release: it works and warns.
``ProgressOption``, ``StreamOptions``, ``BatchedStreamOptions``, ``DeviceOption``   the options every pass over
                                       activations shares (progress, skip_nonfinite, verify, batch_rows, device),
                                       declared once and inherited by each command's options.
``require_memory(n_bytes, what)``      refuse an allocation the machine cannot hold, before it is tried.
``BATCH_ROWS``                         the default rows per batch of a pass over activations (8192).
``DEFAULT_BLOCK_ROWS``                 the default rows per block of the pairwise dictionary passes (4096).
``Dtype`` / ``parse_dtype(text, what)``  the one dtype option type and its parser: float32/fp32, float16/fp16,
                                       bfloat16/bf16 (case-insensitive) -> the canonical torch name.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import math
import os
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, Union

from saegeo.errors import BadInputError
from saegeo.io import parse_int, read_config

BATCH_ROWS = 8192  # rows per batch of a pass over activations (report, geometry, check, sweep, the artifact pass)
DEFAULT_BLOCK_ROWS = 4096  # rows per block of the pairwise dictionary passes (a 4096² float32 tile: 64 MiB)
# a dictionary row whose norm is at most this × the median row norm has no usable direction: the one zero-row rule
# of A_dict (saegeo.geometry.dictionary.zero_rows) and of check's zero rows (CheckOptions.zero_row_rel_norm)
ZERO_ROW_REL_NORM = 1e-6
INT64_MAX = 2**63 - 1  # every count and seed must fit the int64 that torch and numpy hold it in

# =========================================================================== dtypes
# Every option that takes a dtype (a store's storage dtype, a model's dtype, training's compute dtype) is a Dtype
# field: the canonical name is what is stored and compared; the short names people type are accepted wherever a
# dtype is read (a flag, a config file, Python), by this one parser. Its torch dtype is getattr(torch, name).
Dtype = Literal["float32", "float16", "bfloat16"]
DTYPES: tuple[str, ...] = typing.get_args(Dtype)
StorageDtype = Dtype  # a store's dtype: float32, float16, bfloat16 (fp32, fp16, bf16 accepted)
DTYPE_ALIASES = {
    **{name: name for name in DTYPES},
    "fp32": "float32",
    "f32": "float32",
    "fp16": "float16",
    "f16": "float16",
    "half": "float16",
    "bf16": "bfloat16",
}


def parse_dtype(value: Any, what: str = "dtype") -> str:
    """The canonical name (float32, float16, bfloat16) of a dtype written as float32/fp32, float16/fp16/half,
    bfloat16/bf16 (any case), or given as a torch.dtype; BadInputError naming ``what`` otherwise."""
    text = str(value).removeprefix("torch.").strip().lower()
    if text not in DTYPE_ALIASES:
        raise BadInputError(f"{what} = {value!r}: expected one of float32 (fp32), float16 (fp16), bfloat16 (bf16)")
    return DTYPE_ALIASES[text]


def dtype_arg(text: str) -> str:
    """argparse type of a Dtype flag: ``parse_dtype`` with argparse's one-line error."""
    try:
        return parse_dtype(text)
    except BadInputError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


# =========================================================================== declaring a field
def option(
    default: Any = dataclasses.MISSING,
    help: str = "",
    *,
    factory: Any = None,
    low: float | None = None,
    high: float | None = None,
    above: float | None = None,
    below: float | None = None,
    flag: bool = True,
    flag_name: str | None = None,
    old_flags: tuple[str, ...] = (),
    tables: bool = False,
    flatten: bool = False,
) -> Any:
    """A dataclass field with its help text and its checks: ``low <= value <= high``, ``above < value < below``
    (None: no bound). Every float must be finite and every int must fit int64 whatever the bounds; None passes
    (it means "unset"). ``flag=False`` keeps the field out of the command line (a config-file key only);
    ``flag_name`` spells its flag where the field's name would not (``out_dir`` -> ``--out``); ``old_flags`` are
    spellings it had, accepted for one release with a warning (``renamed_flag``). ``tables=True`` (a dict field):
    the tables of a config dict whose keys are no field of the class are gathered here by ``from_dict``
    (TrainConfig's [train.topk], flags --topk.k: each architecture's options). ``flatten=True`` (a nested config
    dataclass) puts its fields on the command line under their own names (the flags' thresholds:
    ``--dead-max-fraction``); in a config file they stay its table (``[report.thresholds]``)."""
    meta = {
        "help": help,
        "low": low,
        "high": high,
        "above": above,
        "below": below,
        "flag": flag,
        "flag_name": flag_name,
        "old_flags": old_flags,
        "tables": tables,
        "flatten": flatten,
    }
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    # get_type_hints resolves the string annotations that `from __future__ import annotations` leaves
    return typing.get_type_hints(cls)


def _bare(tp: Any) -> Any:
    """X | None -> X."""
    if typing.get_origin(tp) in (Union, types.UnionType):
        options = [a for a in typing.get_args(tp) if a is not type(None)]
        return options[0] if len(options) == 1 else tp
    return tp


def _num(x: float) -> str:
    return str(x) if isinstance(x, int) or x == int(x) and abs(x) < 1e6 else f"{x:g}"


def _bounds(meta: Mapping[str, Any]) -> str:
    """The bounds of an option as a reader writes them: ">= 1", "in (0, 1]"."""
    low, high, above, below = (meta.get(k) for k in ("low", "high", "above", "below"))
    lo = f"[{_num(low)}" if low is not None else f"({_num(above)}" if above is not None else None
    hi = f"{_num(high)}]" if high is not None else f"{_num(below)})" if below is not None else None
    if lo and hi:
        return f"in {lo}, {hi}"
    if lo:
        return (">= " if lo[0] == "[" else "> ") + lo[1:]
    if hi:
        return ("<= " if hi[-1] == "]" else "< ") + hi[:-1]
    return ""


def _check_value(name: str, value: Any, tp: Any, meta: Mapping[str, Any]) -> None:
    if value is None:
        return
    if typing.get_origin(tp) is tuple:
        args = [a for a in typing.get_args(tp) if a is not Ellipsis]
        for item, item_tp in zip(value, args * len(value) if len(args) == 1 else args):
            _check_value(name, item, item_tp, meta)
        return
    if tp not in (int, float):
        return
    number = "a whole number" if tp is int else "a finite number"
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (tp is int and not isinstance(value, int)):
        raise BadInputError(f"{name} must be {number}, got {value!r}")
    if tp is float and not math.isfinite(value):
        raise BadInputError(f"{name} must be a finite number, got {value!r}")
    if tp is int and not -INT64_MAX - 1 <= value <= INT64_MAX:
        raise BadInputError(f"{name} must fit in 64 bits (at most {INT64_MAX}), got {value!r}")
    low, high, above, below = (meta.get(k) for k in ("low", "high", "above", "below"))
    ok = (
        (low is None or value >= low)
        and (high is None or value <= high)
        and (above is None or value > above)
        and (below is None or value < below)
    )
    if not ok:
        raise BadInputError(f"{name} must be {_bounds(meta)}, got {value!r}")


def check(cfg: Any) -> None:
    """BadInputError naming the first field of config dataclass ``cfg`` whose value fails its checks: ints
    are whole numbers fitting int64, floats are finite, both within their ``option`` bounds (None passes)."""
    hints = _hints(type(cfg))
    for f in dataclasses.fields(cfg):
        tp = _bare(hints[f.name])
        if tp == Dtype and getattr(cfg, f.name) is not None:  # bf16 -> bfloat16: one spelling is stored
            setattr(cfg, f.name, parse_dtype(getattr(cfg, f.name), f.name))
        _check_value(f.name, getattr(cfg, f.name), tp, f.metadata)
    _check_device(cfg)


def require_memory(n_bytes: float, what: str) -> None:
    """Refuse, with one line, an allocation larger than the machine's memory (instead of a failed-allocation
    traceback, or the kernel killing the process half-way)."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # no sysconf (Windows): nothing to compare with
        return
    if n_bytes > total:
        raise BadInputError(
            f"{what} needs {n_bytes / 2**30:,.1f} GiB, more than this machine's "
            f"{total / 2**30:,.1f} GiB of memory; choose a smaller size"
        )


# =========================================================================== dict -> config
def from_dict(cls: type, d: Mapping[str, Any] | None, where: str | None = None) -> Any:
    """``cls(**d)`` for a config dataclass, with every value checked against its field's annotation.

    The one path from a TOML table, a JSON object or a Python dict to a config, so a key means the same
    wherever it comes from: an unknown key is refused; ints accept "2M"-style sizes (token counts), floats
    accept ints, tuples accept lists, ``Literal[...]`` fields accept only their choices, nested config
    dataclasses accept tables. Every failure is one BadInputError naming the key (and ``where``: the file or table).
    """
    d = dict(d or {})
    known = [f.name for f in dataclasses.fields(cls)]
    gather = next((f.name for f in dataclasses.fields(cls) if f.metadata.get("tables")), None)
    if gather is not None:  # the tables named by no field: the owner of the `tables` field checks their names
        tables = {key: d.pop(key) for key in list(d) if key not in known and isinstance(d[key], Mapping)}
        if tables:
            d[gather] = merge_tables(d.get(gather) or {}, tables)  # the tables by name over the field's own
    unknown = sorted(set(d) - set(known))
    if unknown:
        raise BadInputError(
            f"{where + ': ' if where else ''}unknown key(s) {unknown} of {cls.__name__}; known: {sorted(known)}"
        )
    hints = _hints(cls)
    values = {key: _coerce(value, hints[key], key, where) for key, value in d.items()}
    try:
        return cls(**values)
    except BadInputError as err:  # a check of __post_init__ (e.g. a registered name): say where it came from
        if where and not str(err).startswith(where):
            raise BadInputError(f"{where}: {err}") from None
        raise


def _coerce(value: Any, tp: Any, key: str, where: str | None) -> Any:
    origin, args = typing.get_origin(tp), typing.get_args(tp)

    def bad(expected: str) -> BadInputError:
        return BadInputError(f"{where + ': ' if where else ''}{key} = {value!r}: expected {expected}")

    if origin in (Union, types.UnionType):  # X | None
        if value is None and type(None) in args:
            return None
        options = [a for a in args if a is not type(None)]
        return _coerce(value, options[0], key, where) if len(options) == 1 else value
    if tp == Dtype:
        try:
            return parse_dtype(value, key)
        except BadInputError as err:
            raise BadInputError(f"{where + ': ' if where else ''}{err}") from None
    if origin is Literal:
        if value not in args:
            raise bad(f"one of {list(args)}")
        return value
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if not isinstance(value, Mapping):
            raise bad(f"a table of {tp.__name__} keys")
        return from_dict(tp, value, f"{where + ' ' if where else ''}[{key}]")
    if tp is bool:
        if not isinstance(value, bool):
            raise bad("true or false")
        return value
    if tp is int:
        if isinstance(value, bool):
            raise bad("a whole number")
        if isinstance(value, int):
            return value
        try:
            return parse_int(value, key)
        except BadInputError:
            raise bad("a whole number such as 0, 4096, 500k or 2M") from None
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise bad("a number")
        return float(value)
    if tp is str:
        if isinstance(value, os.PathLike):
            return os.fspath(value)
        if not isinstance(value, str):
            raise bad("a string")
        return value
    if origin is tuple:
        if isinstance(value, str):  # a single name where a list is expected: hooks = "blocks.3.hook_resid_post"
            value = [value]
        if not isinstance(value, (list, tuple)):
            raise bad("a list")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_coerce(v, args[0], key, where) for v in value)
        if args and len(value) != len(args):
            raise bad(f"a list of {len(args)}")
        return tuple(_coerce(v, a, key, where) for v, a in zip(value, args)) if args else tuple(value)
    if origin is dict and not isinstance(value, Mapping):
        raise bad("a table")
    return value  # Any, dict[str, Any], ...: taken as given


def resolve(
    cls: type,
    passed: Mapping[str, Any] | None = None,
    path: str | os.PathLike | None = None,
    *,
    table: str | None = None,
    extra: tuple[str, ...] = (),
) -> tuple[Any, dict[str, Any]]:
    """(config, extras): the fields given on the command line (``passed``) over the config file's over the
    defaults. The file holds ``cls``'s keys at its top level or, where it has one, in its ``[table]``; keys
    named in ``extra`` (e.g. ``acts``) may stand at the top level beside it and are returned, not applied.
    Every other key is refused, naming the key and the file: no key of a config file is ignored."""
    values: dict[str, Any] = {}
    extras: dict[str, Any] = {}
    where = None
    if path is not None:
        doc, where = read_config(path), str(path)
        outer = {k: doc.pop(k) for k in extra if k in doc}
        if table is not None and isinstance(doc.get(table), Mapping):
            inner = dict(doc.pop(table))
            if doc:
                raise BadInputError(
                    f"{path}: key(s) {sorted(doc)} beside the [{table}] table are not read; move "
                    f"{cls.__name__} keys into [{table}]"
                )
            doc, where = inner, f"{path} [{table}]"
            outer |= {k: doc.pop(k) for k in extra if k in doc}
        values, extras = doc, outer
    return from_dict(cls, merge_tables(values, passed or {}), where), extras


def merge_tables(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """``over``'s keys over ``base``'s, a table given in both merged key by key (a flag --topk.k over a config
    file's [train.topk] keeps the file's other keys of that table)."""
    merged = dict(base)
    for key, value in over.items():
        both = isinstance(value, Mapping) and isinstance(merged.get(key), Mapping)
        merged[key] = merge_tables(merged[key], value) if both else value
    return merged


# =========================================================================== config -> flags
def int_arg(text: str) -> int:
    """Whole numbers, size-aware: 4096, 0, -1, 500k, 2M."""
    try:
        return parse_int(text)
    except BadInputError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def float_arg(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"cannot read a number from {text!r}") from None


def _list_arg(item: Any) -> Any:
    """A comma-separated list ("a,b") as a tuple of ``item``."""

    def parse(text: str) -> tuple:
        try:
            return tuple(item(part.strip()) for part in text.split(",") if part.strip())
        except (ValueError, argparse.ArgumentTypeError) as err:
            raise argparse.ArgumentTypeError(f"cannot read a comma-separated list from {text!r} ({err})") from None

    return parse


_ARG_TYPES = {int: int_arg, float: float_arg}


def shown(value: Any) -> str:
    """A default as a user would write it on the command line."""
    return ",".join(map(str, value)) if isinstance(value, tuple) else str(value)


def flag_name(name: str) -> str:
    return "--" + name.replace("_", "-")


class _OldSpelling(argparse.Action):
    """An old spelling of a flag: stores as the new one does and says, on stderr, what it is called now."""

    def __init__(self, option_strings: list[str], dest: str, new: str = "", **kw: Any) -> None:
        super().__init__(option_strings, dest, **kw)
        self.new = new

    def __call__(self, parser: argparse.ArgumentParser, namespace: Any, values: Any, option_string: Any = None) -> None:
        old_spelling(namespace, f"{option_string} is now {self.new}")
        setattr(namespace, self.dest, self.const if self.nargs == 0 else values)


OLD_SPELLING_NOTE = "the old spelling is accepted until the next release"


def old_spelling(namespace: Any, what: str) -> None:
    """Note on the parsed ``namespace`` that an old spelling was used (``what``: what it is called now). `saegeo`'s
    main prints the notes once the command has run, or folds them into its one error line, so that bad input
    stays one line even when it is spelled the old way."""
    notes = getattr(namespace, "old_spellings", None) or []
    namespace.old_spellings = [*notes, f"{what}; {OLD_SPELLING_NOTE}"]


def renamed_flag(parser: Any, old: str, new: str, **kw: Any) -> None:
    """``old``, a flag renamed ``new``, kept for one release: hidden from --help, stored into the same ``dest``
    as ``new`` (``kw``: dest, type, nargs=0 with const for a switch), with a one-line warning when used."""
    parser.add_argument(old, action=_OldSpelling, new=new, help=argparse.SUPPRESS, **kw)


def add_options(
    parser: argparse.ArgumentParser | Any,
    cls: type,
    *,
    skip: tuple[str, ...] = (),
    show_defaults: bool = True,
    prefix: str = "",
    dest_prefix: str = "",
) -> None:
    """One ``--kebab-case`` option per field of config dataclass ``cls`` (nested dataclasses, ``flag=False``
    fields and ``skip`` excepted), its help from the field's ``option`` metadata. A nested dataclass declared with
    ``option(..., flatten=True)`` adds its own fields under their own names, in an argument group named by its
    help; their values land in the namespace as ``"field.sub"`` (``passed`` nests them back).

    Options the user does not pass stay out of the namespace (default=SUPPRESS), so ``passed`` returns only
    what was given: the dataclass default, or a config file's value, holds otherwise. Booleans are flags:
    ``--overwrite`` where the default is False, ``--no-progress`` where it is True. A field without a default
    is a required option; ``show_defaults=False`` leaves "(default: ...)" out where another source sets it.
    ``prefix`` names a table (``--topk.k`` for the field k of the table topk; `passed` with the same prefix).
    """
    hints = _hints(cls)
    for f in dataclasses.fields(cls):
        tp = _bare(hints[f.name])
        if dataclasses.is_dataclass(tp) and f.metadata.get("flatten") and f.name not in skip:
            group = parser.add_argument_group(f"{f.name} ({f.metadata.get('help') or tp.__name__})")
            add_options(group, tp, show_defaults=show_defaults, dest_prefix=f"{dest_prefix}{f.name}.")
            continue
        if dataclasses.is_dataclass(tp) or f.name in skip or not f.metadata.get("flag", True):
            continue
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        default = None if required else f.default if f.default is not dataclasses.MISSING else f.default_factory()
        flag = flag_name(f"{prefix}." * bool(prefix) + (f.metadata.get("flag_name") or f.name))
        old_flags = f.metadata.get("old_flags") or ()
        text = (f.metadata.get("help") or f"{cls.__name__}.{f.name}").replace("%", "%%")
        dest = dest_prefix + (f"{prefix}.{f.name}" if prefix else f.name)
        kw: dict[str, Any] = {"dest": dest, "default": argparse.SUPPRESS, **({"required": True} if required else {})}
        if tp is bool:
            if default:  # progress -> --no-progress: "no progress bar"
                no_flag = f"--{prefix}.no-{flag[3 + len(prefix) :]}" if prefix else "--no-" + flag[2:]
                parser.add_argument(no_flag, action="store_false", help=f"no {text}", **kw)
            else:
                parser.add_argument(flag, action="store_true", help=text, **kw)
            for old in old_flags:
                renamed_flag(parser, old, flag, dest=dest, default=argparse.SUPPRESS, nargs=0, const=not default)
            continue
        if tp == Dtype:  # the aliases too: bf16 is parsed to bfloat16, then checked against the choices
            kw["type"], kw["choices"] = dtype_arg, DTYPES
            text += "; also fp32, fp16, bf16"
        elif typing.get_origin(tp) is Literal:
            kw["choices"] = typing.get_args(tp)
        elif typing.get_origin(tp) is tuple:
            item = typing.get_args(tp)[0]
            kw["type"] = _list_arg(_ARG_TYPES.get(item, item))
            text += "; comma-separated"
        else:
            kw["type"] = _ARG_TYPES.get(tp, tp)
        if bounds := _bounds(f.metadata):
            text += f"; {bounds}"
        if default is not None and show_defaults:  # a None default is explained by the help ("None: all")
            text += f" (default: {shown(default)})"
        if "choices" not in kw:  # --total-tokens TOTAL_TOKENS
            kw["metavar"] = f.name.upper()
        parser.add_argument(flag, help=text, **kw)
        for old in old_flags:
            renamed_flag(parser, old, flag, **{k: v for k, v in kw.items() if k not in ("required", "metavar")})


def passed(args: argparse.Namespace, cls: type, prefix: str = "", dest_prefix: str = "") -> dict[str, Any]:
    """The fields of ``cls`` the user gave on the command line (those of the table ``prefix``: see add_options; a
    flattened nested dataclass as its own dict)."""
    out: dict[str, Any] = {}
    hints = _hints(cls)
    for f in dataclasses.fields(cls):
        tp = _bare(hints[f.name])
        dest = dest_prefix + (f"{prefix}.{f.name}" if prefix else f.name)
        if dataclasses.is_dataclass(tp) and f.metadata.get("flatten"):
            if inner := passed(args, tp, dest_prefix=f"{dest_prefix}{f.name}."):
                out[f.name] = inner
        elif hasattr(args, dest):
            out[f.name] = getattr(args, dest)
    return out


# =========================================================================== options every pass shares
# Declared once here and inherited, so that a flag has one name, one help and one check in every command; a
# command whose default differs (compare encodes two SAEs per batch: fewer rows) redeclares that field alone.
@dataclass
class ProgressOption:
    """Whether a command shows its progress bar."""

    progress: bool = option(True, "progress bar")


@dataclass
class StreamOptions(ProgressOption):
    """How a command reads a stream of activation rows: non-finite rows and the stores' checksums."""

    skip_nonfinite: bool = option(False, "skip and count rows with NaN/inf (default: an error naming the row)")
    verify: bool = option(True, "sha256 check of each store shard as it is read")

    def stream(self) -> dict[str, Any]:
        """These options' StreamOptions fields by name: what one command passes on to another it runs over the same
        rows (the report's verdict check), so that a stream option added here reaches both."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(StreamOptions)}


@dataclass
class BatchedStreamOptions(StreamOptions):
    """A stream read in batches of ``batch_rows`` rows."""

    batch_rows: int = option(BATCH_ROWS, "rows per batch of the pass", low=1)


@dataclass
class DeviceOption:
    """Where a command computes; checked to be a torch device name (torch is imported only for one not "cpu")."""

    device: str = option("cpu", "torch device to compute on: cpu, cuda, cuda:N, mps (the float64 sums stay exact)")


def _check_device(cfg: Any) -> None:
    if isinstance(cfg, DeviceOption) and cfg.device != "cpu":  # the default needs no torch: flags stay torch-free
        import torch

        try:
            torch.device(cfg.device)
        except (RuntimeError, TypeError):
            raise BadInputError(f"device {cfg.device!r} is not a torch device (cpu, cuda, cuda:1, mps)") from None


# =========================================================================== options of commands without a library config
@dataclass
class CompareOptions(BatchedStreamOptions):
    """`saegeo compare SAE_A SAE_B [--acts STORE]`: the matching of two dictionaries' latents and what it reports."""

    threshold: float = option(0.7, "a matched pair at or above this similarity is a shared latent", low=-1, high=1)
    exact_max_entries: int = option(
        4096 * 4096,
        "dense exact matching (Hungarian) when d_sae_A·d_sae_B is at most this; above it, the k-nearest candidate "
        "graph (see docs/design.md, Seed consistency)",
        low=0,
    )
    candidates: int = option(8, "candidate latents kept per latent, both ways, above exact_max_entries", low=1)
    max_tokens: int | None = option(None, "with --acts: stop after this many tokens (default: all)", low=1)
    batch_rows: int = option(
        1024, "with --acts: rows encoded per batch (two dense code blocks of this many rows)", low=1
    )
    overwrite: bool = option(False, "replace output files that exist already (refused otherwise)")

    def __post_init__(self) -> None:
        check(self)


# =========================================================================== light packages
def lazy_exports(package: str, exports: Mapping[str, str]) -> Any:
    """A package's module-level ``__getattr__`` (PEP 562) that imports ``exports[name]`` (a module) on the first
    use of ``name`` and keeps it. Why: importing one light submodule (``saegeo.report.options``) runs its
    package's ``__init__``; eager re-exports there would load torch before a command has checked its flags."""

    import sys
    import types

    class _ExportsWin(types.ModuleType):
        # Loading submodule X binds X on its package; where X is also an export taken from that submodule
        # (saegeo.synthetic.recovery, the function), the export wins, as an eager `from .X import X` made it.
        def __setattr__(self, name: str, value: Any) -> None:
            if isinstance(value, types.ModuleType) and exports.get(name) == value.__name__ == f"{package}.{name}":
                value = getattr(value, name)
            super().__setattr__(name, value)

    sys.modules[package].__class__ = _ExportsWin

    def __getattr__(name: str) -> Any:
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        import importlib

        value = getattr(importlib.import_module(exports[name]), name)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__
