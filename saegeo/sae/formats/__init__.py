"""Dictionary files: saegeo's own SAE directories and the published formats, one reader module per library.

Each module of this package that reads a format registers a `FormatReader` (format_reader.py): its detection, its
layout, the facts its files record, the hub conversions whose files it reads and, where the library has one, the
reader of its SAE objects in memory. Nothing here names a format: `detect_format` asks each registered reader
whether a folder or a file is its own, `read_dictionary` reads it (or resolves a hub id, hub.py, first) and
`object_dictionary` hands a peer library's SAE object to the reader that recognises it.
`saegeo.sae.model.SAE.load` builds the SAE from either. A new format is one new module here (or a
`register_format` call anywhere, as tests/sae/test_toy_format.py does).

  format_reader.py   FormatReader, FormatInfo, Dictionary and the registry (discovery by pkgutil)
  reader_checks.py   the shape, key, count and config-schema checks every reader runs
  weight_files.py    safe readers of JSON, safetensors (memory-mapped), pickles (weights only) and npz
  hub.py             hub ids and SAELens release ids, through the Hugging Face cache
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from saegeo.errors import FormatError
from saegeo.sae.formats.format_reader import (
    PICKLE_SUFFIXES,
    Dictionary,
    FormatInfo,
    FormatReader,
    expected_layouts,
    format_names,
    format_readers,
    get_format,
    register_format,
    unregister_format,
)
from saegeo.sae.formats.hub import HubDictionary, download_hub_dictionary, resolve_hub_id
from saegeo.sae.formats.saelens import CFG_FILENAME, WEIGHTS_FILENAME
from saegeo.sae.formats.weight_files import read_pickle
from saegeo.sae.sae_source import not_a_hub_id, refuse_missing_local_path

__all__ = [
    "CFG_FILENAME",
    "WEIGHTS_FILENAME",
    "Dictionary",
    "FormatInfo",
    "FormatReader",
    "HubDictionary",
    "detect_format",
    "download_hub_dictionary",
    "expected_layouts",
    "format_names",
    "format_readers",
    "get_format",
    "object_dictionary",
    "object_kinds",
    "read_dictionary",
    "register_format",
    "resolve_hub_id",
    "unregister_format",
]


def _detect_file(p: Path) -> str:
    keys: list[set[str]] = []

    def state_keys() -> set[str]:  # a pickle is read once, and only when a reader asks
        if not keys:
            keys.append(set(read_pickle(p)))
        return keys[0]

    best, best_score = None, 0
    for reader in format_readers():
        score = reader.claims_file(p, state_keys) if reader.claims_file is not None else 0
        if score > best_score:
            best, best_score = reader, score
        if best_score >= 3:  # certain: the rest need not read the file
            break
    if best is not None:
        return best.name
    if p.name in {f for r in format_readers() for f in r.files if "/" not in f and not f.endswith(PICKLE_SUFFIXES)}:
        return _detect_dir(p.parent)  # a file of a layout stands for its folder
    if p.suffix in PICKLE_SUFFIXES:
        raise FormatError(
            f"{p}: a state dict with keys {sorted(state_keys())[:12]} matches no known dictionary; "
            f"expected {expected_layouts()}"
        )
    raise FormatError(f"{p}: unknown dictionary file type; expected {expected_layouts()}")


def _detect_dir(d: Path) -> str:
    names = {p.name for p in d.iterdir()}
    for reader in format_readers():
        if reader.claims(names):
            return reader.name
    pts = sorted(n for n in names if n.endswith((".pt", ".pth")))
    if len(pts) == 1:
        return _detect_file(d / pts[0])
    nested = []
    for sub in sorted(p for p in d.iterdir() if p.is_dir()):
        try:
            nested.append(f"{sub.name} ({_detect_dir(sub)})")
        except FormatError:
            continue
    if nested:
        raise FormatError(
            f"{d} holds {len(nested)} dictionaries: {', '.join(nested[:20])}{' ...' if len(nested) > 20 else ''}; pass one of them"
        )
    raise FormatError(
        f"{d}: found {sorted(names)[:30] or 'an empty directory'}, which matches no dictionary layout; expected {expected_layouts()}"
    )


def detect_format(path: str | os.PathLike) -> str:
    """The registered format of a dictionary file or directory (format_names()), from the file names and (for a
    lone .pt) its keys, as each reader claims them; FormatError says what was found and what was expected."""
    p = Path(path)
    if not p.exists():
        raise FormatError(f"{p}: does not exist")
    return _detect_file(p) if p.is_file() else _detect_dir(p)


def read_dictionary(path: str | os.PathLike) -> Dictionary:
    """The dictionary at `path`, in any registered format (auto-detected): a local file or directory, or a hub id
    (see `resolve_hub_id`: org/repo[/subfolder], or a SAELens RELEASE/sae_id) fetched through the Hugging Face
    cache. A release is read by the format that registers its conversion function, with its config_overrides
    applied as SAELens applies them. Its `info` records the format, the source and the config facts `saegeo check`
    reads."""
    if Path(path).exists():
        return get_format(detect_format(path)).read(path)
    refuse_missing_local_path(Path(path))
    hub = resolve_hub_id(str(path))
    if hub is None:
        raise not_a_hub_id(path)
    local = download_hub_dictionary(hub)
    reader = get_format(hub.reader or detect_format(local))
    overrides = hub.config_overrides
    found = reader.read_release(local, overrides) if reader.read_release is not None else reader.read(local)
    info = found.info
    info.hub_id = str(path)
    if hub.release:
        info.release = {"release": hub.release, "repo_id": hub.repo_id, "path": hub.subfolder, "registry": hub.registry}
        if reader.read_release is None:  # a reader that applied them did so to its config; here, to what it said
            _apply_overrides(info, overrides)
        info.config_overrides = overrides or None
    layer = next((m.group(1) for m in re.finditer(r"(?:^|/)layer_(\d+)", hub.subfolder)), None)
    if hub.model_name and not info.model_name:
        info.model_name = hub.model_name
    if hub.hook_template and layer is not None:
        info.hook_name = hub.hook_template.format(layer=int(layer))
    return found


def _apply_overrides(info: FormatInfo, overrides: dict) -> None:
    """A release's config_overrides set on the FormatInfo fields (or the format's own facts) of the same name."""
    import dataclasses

    kept = {"format", "source", "written_by", "hub_id", "facts"}
    shared = {f.name for f in dataclasses.fields(FormatInfo)} - kept
    own = {f.name for f in dataclasses.fields(info.facts)} if info.facts is not None else set()
    for key, value in overrides.items():
        if key in shared:
            setattr(info, key, value)
        elif key in own:
            setattr(info.facts, key, value)


def object_kinds() -> str:
    """What `SAE.load` accepts besides paths, for the message when nothing does."""
    kinds = [r.object_kinds for r in format_readers() if r.read_object is not None and r.object_kinds]
    return f"saegeo's SAE, a path or hub id, {', '.join(kinds[:-1])} or {kinds[-1]}" if kinds else "saegeo's SAE"


def object_dictionary(obj) -> Dictionary | None:
    """A peer library's SAE object in memory -> the Dictionary its saved files would give, read by the same reader
    as those files (each format's FormatReader.read_object, in detection order); None when no reader recognises it."""
    for reader in format_readers():
        found = reader.read_object(obj) if reader.read_object is not None else None
        if found is not None:
            return found
    return None
