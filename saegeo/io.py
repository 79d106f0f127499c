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
``refuse_outputs_over_inputs(outputs, inputs)``  no output is, contains or lies inside an input or a store.
``require_writable(files, dirs)`` / ``require_disk(path, n_bytes, what)``   checked before the work, not after it.
``output_set(out_dir)``                a command's output files staged beside the target, moved in as one set.
``recover_output_set(out_dir)``        finish or discard a set an interruption left half moved; says which.
``writer_lock(directory, what)``       one writer at a time: an exclusive flock holding the writer's pid.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import math
import os
import shutil
import sys
import tempfile
from collections.abc import Iterable, Iterator, Mapping
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
    On any error the temp file is removed and the OSError names ``path`` (a full disk says which file).
    """
    path = Path(path)
    if isinstance(data, str):
        data = data.encode("utf-8")
    tmp = path.with_name(path.name + ".tmp")
    try:
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
    except BaseException as err:
        with contextlib.suppress(OSError):
            tmp.unlink()  # no .tmp holds the disk's space after a failed write
        if isinstance(err, OSError) and err.filename is None:  # write()/fsync() name no file: name the target
            raise OSError(err.errno, err.strerror, str(path)) from err
        raise
    _fsync_dir(path.parent)
    return path


def _fsync_dir(directory: Path) -> None:
    """Make the renames into ``directory`` durable (where the platform allows opening a directory)."""
    try:
        dir_fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except OSError:
        pass


# =========================================================================== outputs and inputs
def _resolved(path: str | os.PathLike) -> Path:
    """The absolute path with ``~``, ``..`` and every symlink of its existing part resolved."""
    return _absolute(path).resolve()


def _absolute(path: str | os.PathLike) -> Path:
    """The absolute path as written (``~`` expanded, ``..`` not resolved through links)."""
    return Path(os.path.abspath(os.path.expanduser(os.fspath(path))))


def _given(path: Any) -> bool:
    """A path to check: a non-empty str or PathLike (None is "not given"; a config's wrong type is refused
    by the config's own check, with its name)."""
    return isinstance(path, (str, os.PathLike)) and os.fspath(path) != ""


def _inode(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _store_above(path: Path) -> Path | None:
    """The nearest directory strictly above ``path`` that holds an activation store's manifest, if any."""
    for parent in path.parents:
        manifest = parent / "manifest.json"
        if manifest.is_file():
            try:
                doc = json.loads(manifest.read_bytes())
            except (OSError, ValueError):
                continue
            if isinstance(doc, dict) and "shards" in doc:
                return parent
    return None


def refuse_outputs_over_inputs(outputs: Iterable[Any], inputs: Iterable[Any]) -> None:
    """BadInputError, in one line naming both, when an output path is, contains or lies inside an input path,
    or lies inside an activation store (a shard, a file among them), ``--overwrite`` or not.

    Paths are compared resolved: ``..``, ``~`` and symlinks followed, and an existing output that is a hard
    link of an input (same device and inode) counts as that input. Called before any work, so a refusal
    costs nothing and destroys nothing. None entries are skipped.
    """
    ins = [(p, _resolved(p), _inode(_resolved(p))) for p in inputs if _given(p)]
    for out in outputs:
        if not _given(out):
            continue
        o = _resolved(out)
        o_inode = _inode(o)
        for given, i, i_inode in ins:
            if o == i or (o_inode is not None and o_inode == i_inode):
                relation = "is"
            elif i in o.parents:
                relation = "lies inside"
            elif o in i.parents:
                relation = "contains"
            else:
                continue
            if o != i and relation == "is":
                same = f" (one file under two names: hard links {o} and {i})"
            elif (_absolute(out), _absolute(given)) != (o, i):
                same = f" (through links: {o} and {i})"
            else:
                same = ""
            raise BadInputError(
                f"output {out} {relation} the input {given}{same}; an output may never replace an input, "
                "with --overwrite or not: choose another output path"
            )
        store = _store_above(o)
        if store is not None:
            raise BadInputError(
                f"output {out} lies inside the activation store {store}; writing there would damage the store, "
                "with --overwrite or not: choose a path outside it"
            )


def require_writable(files: Iterable[Any] = (), directories: Iterable[Any] = ()) -> None:
    """BadInputError naming the path when an output cannot be written, found before the work rather than after
    it: an output file must not be a directory, an output directory not a file, and the nearest existing
    directory on the way must accept a new file (probed by creating one: permission bits say nothing to root,
    nor to a read-only or immutable file system)."""
    probed: set[Path] = set()
    outputs = [(f, False) for f in files] + [(d, True) for d in directories]
    for out, is_dir in outputs:
        if not _given(out):
            continue
        p = _absolute(out)
        if not is_dir and p.is_dir():
            raise BadInputError(f"{out} is a directory; give a file path, not a directory")
        if is_dir and p.exists() and not p.is_dir():
            raise BadInputError(f"{out} is a file, not a directory; remove it or choose another output path")
        existing = p.parent
        while not existing.exists() and existing != existing.parent:
            existing = existing.parent
        if not existing.is_dir():
            raise BadInputError(f"{out}: {existing} is a file, not a directory; choose another output path")
        if existing in probed:
            continue
        probed.add(existing)
        try:
            fd, probe = tempfile.mkstemp(prefix=".saegeo-write-probe-", dir=existing)
            os.close(fd)
            os.unlink(probe)
        except OSError as err:
            raise BadInputError(
                f"{out}: cannot write in {existing} ({err.strerror or err}); fix its permissions or choose "
                "another output path"
            ) from None


def require_disk(path: str | os.PathLike, n_bytes: float, what: str) -> None:
    """Refuse, with one line, an output of ``n_bytes`` that the free space of ``path``'s file system cannot hold
    (before the work, instead of "No space left on device" after it)."""
    existing = Path(os.path.abspath(os.fspath(path)))
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    try:
        free = shutil.disk_usage(existing).free
    except OSError:
        return
    if n_bytes > free:
        raise BadInputError(
            f"{what} needs {n_bytes / 2**30:,.2f} GiB on disk at {path}, more than the {free / 2**30:,.2f} GiB "
            "free there; free some space or write elsewhere"
        )


# =========================================================================== whole output sets
STAGING = ".saegeo-staging"  # a set's new files, written beside their targets (same file system: renames)
JOURNAL = ".saegeo-commit.json"  # written once the staged set is whole: the commit point of the set


def _staged_files(stage: Path) -> list[str]:
    return sorted(str(p.relative_to(stage)) for p in stage.rglob("*") if p.is_file() and p.suffix != ".tmp")


def _move_in(out: Path, stage: Path, names: Iterable[str]) -> None:
    """Rename each staged file still in the stage over its target (a rerun of a half-done move finishes it)."""
    for name in names:
        src = stage / name
        if not src.exists():  # moved before the interruption
            continue
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        os.replace(src, out / name)
        crash_point("output_set_rename")


def _finish(out: Path, stage: Path) -> None:
    _fsync_dir(out)
    (out / JOURNAL).unlink(missing_ok=True)
    shutil.rmtree(stage, ignore_errors=True)


def recover_output_set(out_dir: str | os.PathLike) -> str | None:
    """Finish or discard an output set that an interruption (kill -9, Ctrl-C, a power cut) left in ``out_dir``,
    and return what was done (None when nothing was pending); it is also printed on stderr.

    A journal (.saegeo-commit.json) is written only once the new set is whole in .saegeo-staging, so with it the
    set is moved in (the new set), without it the staging directory is removed (the old set, untouched)."""
    out = Path(out_dir)
    stage, journal = out / STAGING, out / JOURNAL
    if journal.is_file():
        try:
            names = json.loads(journal.read_bytes())["files"]
        except (OSError, ValueError, KeyError, TypeError):
            names = _staged_files(stage) if stage.is_dir() else []
        _move_in(out, stage, names)
        _finish(out, stage)
        said = f"{out}: an interrupted write was completed; its files are the new set ({len(names)} files)"
    elif stage.exists():
        shutil.rmtree(stage, ignore_errors=True)
        said = f"{out}: an unfinished write was discarded; its files are the old set, as they were"
    else:
        return None
    print(f"saegeo: {said}", file=sys.stderr)
    return said


@contextlib.contextmanager
def output_set(out_dir: str | os.PathLike) -> Iterator[Path]:
    """A staging directory for a command's whole output set: the files written under it are moved into
    ``out_dir`` (same relative names) as one set when the block ends, and thrown away if it raises.

    Whole: the journal naming every staged file is written (atomically) only once all of them are; an
    interruption before it leaves the old set, after it the next run or recover_output_set moves the rest in;
    an exception (Ctrl-C included) during the renames finishes them before it propagates. No temp file remains.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    recover_output_set(out)
    stage = out / STAGING
    stage.mkdir()
    try:
        yield stage
        names = _staged_files(stage)
        crash_point("output_set_staged")  # the fault tests: killed with the new set whole in the stage, uncommitted
        atomic_write(out / JOURNAL, json.dumps({"files": names}))  # the commit point
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    try:
        _move_in(out, stage, names)
    except BaseException:  # Ctrl-C or an error between two renames: the set is whole in the stage, finish it
        with contextlib.suppress(Exception):
            _move_in(out, stage, names)
            _finish(out, stage)
        raise
    _finish(out, stage)


def writer_lock(
    directory: str | os.PathLike, what: str, name: str = ".writer.lock", error: type[Exception] = BadInputError
) -> Any:
    """An exclusive flock on DIRECTORY/<name> holding this process's pid, released when the returned file is
    closed (also when the process dies); ``error`` naming the holder's pid if another process has it."""
    import fcntl

    path = Path(directory)
    f = open(path / name, "a+")
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        pid = f.read().strip() or "unknown"
        f.close()
        raise error(
            f"{path}: another process (pid {pid}) is writing this {what}; wait for it to finish (or stop it), "
            "then rerun, or write to another directory"
        ) from None
    f.seek(0)
    f.truncate()
    f.write(str(os.getpid()))
    f.flush()
    return f


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
