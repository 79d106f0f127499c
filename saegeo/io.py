"""The few file helpers every layer uses: one atomic writer, one JSON cleaner and dumper, one config reader.

Public API
----------
``atomic_write(path, data, crash_tag=None) -> Path``   temp file + fsync + rename: a reader never sees half a file.
``crash_point(where)``                 fault injection for the resume tests (SAEGEO_CRASH_AT="<where>:<k>").
``json_safe(value) -> Any``            tensors, numpy scalars, dataclasses, paths -> plain JSON values; NaN/inf -> None.
``dump_json(data, path=None) -> str``  strict JSON (no NaN/Infinity) of json_safe(data), written atomically if a path is given.
``same_json(a, b) -> bool``            equality after a JSON round trip (tuples = lists, keys as strings).
``read_config(path) -> dict``          a TOML or JSON config file; one clear error naming the file otherwise.
``parse_size("2M") -> int``            "2M" / "500k" / "1.5e6" / 737280 -> a positive integer count.
``parse_int("-1") -> int``             whole numbers, including sizes ("2M"); saegeo.config turns configs into flags.
``refuse_overwrite(paths, overwrite)``  a command's output files that exist already are refused unless --overwrite.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from saegeo.errors import BadInputError

CRASH_ENV = "SAEGEO_CRASH_AT"
_CRASH_COUNTS: dict[str, int] = {}


# =========================================================================== atomic writes
def refuse_overwrite(paths: Any, overwrite: bool) -> None:
    """Raise BadInputError naming the first of ``paths`` that exists, unless ``overwrite``: results are never
    replaced silently. Checked before the work, so a refused command loses nothing."""
    existing = [Path(p) for p in paths if p is not None and Path(p).exists()]
    if existing and not overwrite:
        more = f" (and {len(existing) - 1} more output file(s))" if len(existing) > 1 else ""
        raise BadInputError(f"{existing[0]} already exists{more}; pass --overwrite to replace it, or write elsewhere")


def crash_point(where: str) -> None:
    """Fault injection for the resume tests: SAEGEO_CRASH_AT="<where>:<k>" kills the process
    (os._exit, like SIGKILL: no cleanup runs) the k-th time (1-based) `where` is reached."""
    spec = os.environ.get(CRASH_ENV)
    if not spec:
        return
    point, _, count = spec.partition(":")
    if point != where:
        return
    _CRASH_COUNTS[where] = _CRASH_COUNTS.get(where, 0) + 1
    if _CRASH_COUNTS[where] == int(count or 1):
        os._exit(137)


def atomic_write(path: str | os.PathLike, data: bytes | str, crash_tag: str | None = None) -> Path:
    """Write bytes (or UTF-8 text) to `path` via a temp file + fsync + rename: a reader never sees half a file.

    The one atomic writer of saegeo: shards, manifests, checkpoints, SAE files and reports all go through it.
    ``crash_tag`` names a crash point in the middle of the write (the resume tests kill the process there).
    """
    path = Path(path)
    if isinstance(data, str):
        data = data.encode("utf-8")
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        if crash_tag:  # a kill in the middle of the write leaves a truncated temp file only
            half = len(data) // 2
            f.write(data[:half])
            f.flush()
            crash_point(crash_tag)
            f.write(data[half:])
        else:
            f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    try:  # make the rename itself durable
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except OSError:
        pass
    return path


# =========================================================================== JSON
def sha256_file(path: str | os.PathLike, chunk: int = 1 << 24) -> str:
    """sha256 hex digest of a file read in chunks of `chunk` bytes (memory O(chunk) at any file size)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def json_safe(value: Any) -> Any:
    """``value`` as plain JSON data: mappings (keys as strings), lists, str, int, float, bool, None.

    Tensors and numpy arrays become nested lists, numpy scalars Python numbers, dataclasses their fields,
    objects with ``to_dict()`` that dict, paths strings; NaN and ±inf become None (strict JSON has neither).
    Anything else is written as ``str(value)``.
    """
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, (list, tuple)):
        if all(type(v) is float for v in value) and math.isfinite(sum(value)):  # a spectrum, say: as it is
            return list(value)
        return [json_safe(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (str, int, bool)) or value is None:
        return value
    if hasattr(value, "tolist"):  # torch tensors, numpy arrays and numpy scalars
        return json_safe(value.tolist())
    if hasattr(value, "to_dict"):
        return json_safe(value.to_dict())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return json_safe({f.name: getattr(value, f.name) for f in dataclasses.fields(value)})
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    return str(value)


def dump_json(data: Any, path: str | os.PathLike | None = None, *, indent: int | None = 1) -> str:
    """Strict JSON text of ``json_safe(data)`` (no NaN/inf), written atomically to ``path`` if given."""
    text = json.dumps(json_safe(data), indent=indent, allow_nan=False)
    if path is not None:
        atomic_write(path, text)
    return text


def same_json(a: Any, b: Any) -> bool:
    """a == b as JSON data would compare them (tuples and lists alike, keys as strings, NaN as None)."""
    return json_safe(a) == json_safe(b)


# =========================================================================== configs
def read_config(path: str | os.PathLike) -> dict[str, Any]:
    """The top-level table of a TOML (``.toml``) or JSON (any other suffix) config file.

    Every failure is a BadInputError naming the file and what to do: missing, unreadable, invalid TOML or
    JSON (with the line), or not a table/object at the top.
    """
    p = Path(path)
    try:
        raw = p.read_bytes()
    except FileNotFoundError:
        raise BadInputError(f"{p}: no such config file") from None
    except OSError as err:
        raise BadInputError(f"{p}: cannot read the config ({err.strerror or err})") from None
    if p.suffix.lower() == ".toml":
        try:
            import tomllib
        except ModuleNotFoundError:  # Python 3.10: the same parser, as the tomli package
            try:
                import tomli as tomllib
            except ModuleNotFoundError:
                raise BadInputError(
                    f"{p}: reading TOML on Python < 3.11 needs the tomli package; pip install tomli "
                    "(or give the config as JSON)"
                ) from None
        try:
            doc: Any = tomllib.loads(raw.decode("utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as err:
            raise BadInputError(f"{p}: invalid TOML ({err}); fix the file") from None
    else:
        try:
            doc = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise BadInputError(f"{p}: invalid JSON ({err}); fix the file (or name it .toml if it is TOML)") from None
    if not isinstance(doc, dict):
        raise BadInputError(f"{p}: expected a table of keys at the top, found {type(doc).__name__}")
    return doc


_SIZE_SUFFIXES = {"k": 10**3, "m": 10**6, "g": 10**9, "b": 10**9}


def parse_size(text: str | int | float, what: str = "count") -> int:
    """'2M' / '500k' / '1.5e6' / '737_280' / 737280 -> a positive integer (k = 10³, M = 10⁶, G = B = 10⁹)."""
    if isinstance(text, bool):
        raise BadInputError(f"{what} must be a number, got {text!r}")
    if isinstance(text, (int, float)):
        value = float(text)
    else:
        t = str(text).strip().lower().replace("_", "")
        mult = _SIZE_SUFFIXES.get(t[-1:], 1)
        try:
            value = float(t[:-1] if mult > 1 else t) * mult
        except ValueError:
            raise BadInputError(f"cannot read a {what} from {text!r}; write e.g. 2M, 500k or 737280") from None
    if not math.isfinite(value) or value < 1 or value != int(value):
        raise BadInputError(f"{what} must be a positive whole number, got {text!r}")
    return int(value)


def parse_int(text: str | int | float, what: str = "count") -> int:
    """A whole number from an int, "7", "-1", or a size such as "2M" / "500k" / "1.5e6" (see parse_size)."""
    if isinstance(text, int) and not isinstance(text, bool):
        return text
    try:
        return int(str(text).strip())  # plain integers, including 0 and negatives (seeds, "0 = off" options)
    except ValueError:
        return parse_size(text, what)


def hf_download_command(repo_id: str, files: Any = (), include: str | None = None) -> str:
    """The one command saegeo's messages name for something missing from the Hugging Face cache (huggingface_hub's
    own CLI, `hf`): `hf download REPO [FILE ...]`, or with `include` a glob of files (`--include 'SUB/*'`)."""
    parts = ["hf", "download", repo_id, *files]
    if include:
        parts += ["--include", f"'{include}'"]
    return " ".join(parts)
