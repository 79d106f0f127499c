"""The options of `saegeo cache` (CacheConfig) and the check of an activation source's path, torch-free on
purpose: the command line builds its flags from them and checks what a user gave before torch or a model library
is imported (benchmarks/startup_bench.py). cache.py and sources.py use them (and re-export them).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from saegeo.config import DeviceOption, Dtype, ProgressOption, StorageDtype, check, option
from saegeo.errors import BadInputError, StoreError

MANIFEST = "manifest.json"  # an activation store's manifest (store.py)
FILE_SUFFIXES = (".safetensors", ".npy", ".pt", ".pth")  # the files sources.open_rows reads


def store_dir(out: str | Path, hook: str) -> Path:
    """Each hook gets its own store under the output directory, named after the hook."""
    return Path(out) / hook


def require_store_dir(path: str | os.PathLike) -> None:
    """StoreError naming ``path`` when no directory is there: the one message of a missing store, said before torch
    is imported (`saegeo store`) and by the store's reader."""
    if not Path(path).exists():
        raise StoreError(f"{path}: no such activation store (directory missing); create it with `saegeo cache`")


def rows_path_kind(path: str | os.PathLike) -> Literal["store", "file"]:
    """What ``sources.open_rows`` reads at ``path``: an activation store (a directory with a manifest) or a
    file with a known suffix; BadInputError naming the path and what to pass otherwise."""
    path = Path(path)
    if path.is_dir():
        if not (path / MANIFEST).is_file():
            raise BadInputError(
                f"{path}: not an activation store (no {MANIFEST}). Cache one with `saegeo cache`, or pass a "
                f"file ({', '.join(FILE_SUFFIXES)}), a tensor or an iterator of batches"
            )
        return "store"
    if not path.is_file():
        raise BadInputError(
            f"{path}: not an activation store or a file (nothing is there). Cache a store with `saegeo cache`, "
            f"or pass a file ({', '.join(FILE_SUFFIXES)})"
        )
    if path.suffix.lower() not in FILE_SUFFIXES:
        raise BadInputError(
            f"{path}: unknown file type '{path.suffix.lower()}'; use {', '.join(FILE_SUFFIXES)} or an "
            "activation-store directory"
        )
    return "file"


@dataclass
class CacheConfig(ProgressOption, DeviceOption):
    """One caching run: which model, which hooks, which text, where the stores go."""

    model: str = option(
        "minilm",
        "'minilm' (bundled), a local HF dir, a cached hub name, or a .json HookedTransformerConfig (Python: also a "
        "model object, see load_model)",
    )
    hooks: tuple[str, ...] = option(("blocks.3.hook_resid_post",), "hook names, one store each")
    corpus: str = option(
        "default",
        "'default' (pydoc topics), files (.txt .jsonl .json .parquet; token ids .npy "
        ".safetensors), dirs, globs, datasets folders or cached names; comma-separated",
    )
    context: int = option(128, "tokens per window, special tokens included", low=2)
    out: str = option("artifacts/acts/minilm", "output directory; each hook gets OUT/<hook>/")
    max_tokens: int | None = option(None, "stop after this many stored tokens", low=1)
    dtype: StorageDtype = option("float32", "storage dtype")
    model_dtype: Dtype = option("float32", "dtype the model's weights are loaded in and its forward runs in")
    batch_windows: int = option(32, "windows per forward pass", low=1)
    shard_rows: int = option(65536, "rows per shard", low=1)
    exclude_special: bool = option(False, "do not store [CLS]/[SEP]/BOS positions (the model still sees them)")
    exclude_norm_ratio: float | None = option(None, "drop rows with norm > m × their window's median norm", above=1)
    text_field: str = option("text", "the field (JSON) or column (parquet, datasets) holding the text or the token ids")
    overwrite: bool = option(False, "replace existing stores instead of resuming them")

    def __post_init__(self) -> None:
        self.hooks = (self.hooks,) if isinstance(self.hooks, str) else tuple(self.hooks)
        check(self)
