"""Where an SAE argument points, decided without torch: a local path that is there, a local path that is missing, or
a string that may be a hub id. The commands call `refuse_missing_sae` before their work begins, so a mistyped path
gets its one line before the 2-4 s of torch's import; the readers (saegeo.sae.formats) share the same rules."""

from __future__ import annotations

import os
import re
from pathlib import Path

from saegeo.errors import FormatError

HUB_PART = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def hub_id_parts(text: str) -> list[str] | None:
    """The '/'-separated parts of a string that can be a hub id (org/repo[/subfolder] or RELEASE/sae_id); None for a
    path such as ./x, /x or ~/x, or a part holding characters a repo name cannot."""
    parts = text.strip("/").split("/")
    if text.startswith((".", "/", "~")) or not all(HUB_PART.fullmatch(part) for part in parts):
        return None
    return parts


def refuse_missing_local_path(path: Path) -> None:
    """A path whose folder exists here (out/nonexistent_typo with out/ present) is a local path that is missing, not a
    hub id: said before any hub lookup, with what that folder holds."""
    parent = path.parent
    if str(parent) in ("", ".") or not parent.is_dir():
        return
    near = sorted(p.name for p in parent.iterdir())[:8]
    raise FormatError(
        f"{path}: does not exist ({str(parent).rstrip('/')}/ does, holding {', '.join(near) if near else 'nothing'}"
        f"{' …' if len(near) == 8 else ''}); check the path (it is not read as a hub id: its folder is local)"
    )


def not_a_hub_id(path: str | os.PathLike) -> FormatError:
    """The error for a missing path that cannot be a hub id either."""
    return FormatError(
        f"{path}: does not exist, and is not a hub id (org/repo[/subfolder], or RELEASE/sae_id "
        "for a SAELens release such as gpt2-small-res-jb/blocks.8.hook_resid_pre)"
    )


def refuse_missing_sae(path: str | os.PathLike) -> None:
    """Raise the reader's own error for an SAE argument that is neither a local path nor shaped like a hub id (a
    hub id's lookup, which needs the readers' release tables, is left to `read_dictionary`)."""
    if Path(path).exists():
        return
    refuse_missing_local_path(Path(path))
    if hub_id_parts(str(path)) is None:
        raise not_a_hub_id(path)
