"""`saegeo geometry` as a library call: the activation geometry of files or stores, streamed through one
accumulator, with the artifact test (stores only), what cached exclusions left out, and the activation flags.

``files_geometry(paths, options=GeometryOptions()) -> FilesGeometry``
    one pass over the rows of every path in order (memory does not grow with rows); then, when every path is
    an activation store, the artifact test (a second pass, ``saegeo.report.store_measures.artifact_pass``); then the
    flags a report would raise from these numbers and the report's row sample (same size and seed: the mean's
    share of the cone is 1 − A_centred/A on it, as in the report).
``FilesGeometry.to_dict()`` is what `saegeo geometry --json` writes: ``{"files": [...], **geometry, "artifact"}``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from saegeo.activations.sources import open_rows
from saegeo.activations.store import store_exclusions
from saegeo.errors import BadInputError
from saegeo.geometry.accumulate import GeometryAccumulator
from saegeo.geometry.diagnosis import sample_diagnostics
from saegeo.geometry.measures import ActivationGeometry, activation_geometry
from saegeo.geometry.sample import RowReservoir
from saegeo.io import dump_json, json_safe
from saegeo.progress import progress_bar
from saegeo.report.flags import Flag, flag_inputs, run_flags, sort_flags
from saegeo.report.options import GeometryOptions, ReportOptions


@dataclass
class FilesGeometry:
    """What `files_geometry` measured."""

    files: list[str]
    geometry: ActivationGeometry
    artifact: (
        dict[str, Any] | None
    )  # None: not every path is a store (no token ids / positions), or artifact_components = 0
    flags: list[Flag]  # most severe first
    exclusions: dict[str, dict[str, Any]] = field(default_factory=dict)  # path -> store_exclusions (stores cached so)

    def to_dict(self) -> dict[str, Any]:
        flags = [f.to_dict() for f in self.flags]  # the JSON says what the terminal says
        return {"files": list(self.files), **self.geometry.to_dict(), "artifact": self.artifact, "flags": flags}

    def to_json(self, path: str | os.PathLike | None = None) -> str:
        return dump_json(self.to_dict(), path)


def refuse_mixed_stores(sources: Sequence[tuple[str, Any]]) -> None:
    """Stores of different models or hooks pooled into one accumulator give a number of neither: refuse."""
    stores = [(path, rows.store) for path, rows in sources if rows.store is not None]
    differ = [what for what in ("model", "hook") if len({getattr(s, what) for _, s in stores}) > 1]
    if differ:
        what = differ[-1]  # name the hook when both differ
        listing = "; ".join(f"{p}: {getattr(s, what)}" for p, s in stores)
        raise BadInputError(
            f"refusing to pool stores of different {' and '.join(d + 's' for d in differ)} into one "
            f"geometry ({listing}): the pooled numbers describe none of them; use `saegeo sweep` for "
            "one row per layer, or pass --pool to pool them anyway"
        )


def refuse_repeated_sources(paths: Sequence[str]) -> None:
    """One source given twice would count its rows twice: refused, naming both spellings."""
    from pathlib import Path

    seen: dict[Path, str] = {}
    for path in paths:
        key = Path(path).resolve()
        if key in seen:
            raise BadInputError(
                f"{seen[key]} and {path} are the same source, given twice: its rows would be counted "
                "twice; pass each file or store once"
            )
        seen[key] = path


def files_geometry(paths: Sequence[str | os.PathLike], options: GeometryOptions | None = None) -> FilesGeometry:
    """Stream the rows of ``paths`` (.safetensors/.npy/.pt files or store directories) through one
    GeometryAccumulator and read every measure of ``activation_geometry`` from it (the top max(10, ``artifact_components``) eigenvectors kept, as the report keeps them).

    Stores of different models or hooks are refused unless ``pool``; the grams are float64 with ``float64``
    (default float32 on shifted rows). Flags: ``activation_flags`` and ``artifact_flags`` of these numbers.
    ``options.json`` / ``overwrite`` are the caller's (``FilesGeometry.to_json`` writes).
    """
    opts = options or GeometryOptions(progress=False)
    files = [str(p) for p in paths]
    refuse_repeated_sources(files)
    sources = [
        (path, open_rows(path, key=opts.key, verify=opts.verify, skip_nonfinite=opts.skip_nonfinite)) for path in files
    ]
    shards: dict[tuple[str, ...], str] = {}
    for path, rows in sources:  # a copy of a store counts its rows twice as surely as the store given twice
        key = tuple(s.sha256 for s in rows.store.shards) if rows.store is not None else ()
        if key and key in shards:
            raise BadInputError(
                f"{shards[key]} and {path} hold the same shards (one store, copied): its rows would be "
                "counted twice; pass it once"
            )
        shards[key] = path
    dims = {rows.d for _, rows in sources}
    if len(dims) > 1:
        raise BadInputError("files disagree on d: " + ", ".join(f"{p}: d={rows.d}" for p, rows in sources))
    if not opts.pool:
        refuse_mixed_stores(sources)
    d = dims.pop()
    # the reader screens every batch (its NaN policy, skip_nonfinite); the accumulator sees finite rows only
    acc = GeometryAccumulator(d, gram_dtype=torch.float64 if opts.float64 else None)
    defaults = ReportOptions()  # the report's row sample: what sums cannot see (the cone of the centred rows)
    reservoir = RowReservoir(defaults.cosine_sample_rows, d, defaults.seed)
    total = sum(rows.n_rows for _, rows in sources)
    with progress_bar(total=total, unit="row", unit_scale=True, enabled=opts.progress, desc="geometry") as bar:
        for path, rows in sources:
            for batch in rows.batches(opts.batch_rows)[0]:
                acc.add(batch, source=path)
                reservoir.add(torch.as_tensor(batch))  # finite rows, as the report's
                bar.update(len(batch))
    acc.n_nonfinite_skipped += sum(rows.n_nonfinite_skipped for _, rows in sources)
    geo = activation_geometry(acc, top_k_eigvecs=max(10, opts.artifact_components))
    artifact = None
    if all(rows.store is not None for _, rows in sources) and opts.artifact_components > 0:  # needs ids, positions
        from saegeo.report.store_measures import artifact_pass

        artifact = artifact_pass(
            [rows for _, rows in sources], geo, k=opts.artifact_components, batch_rows=opts.batch_rows
        )  # the same Rows: skip_nonfinite holds here too
    exclusions = {path: ex for path, rows in sources if (ex := store_exclusions(rows.store)) is not None}
    top = torch.tensor(geo.top_eigenvectors[0], dtype=torch.float64) if geo.top_eigenvectors else None
    sampled = json_safe(sample_diagnostics(reservoir.sample(), acc.mean, top))
    flags = run_flags(
        "activations",
        opts.thresholds,
        geo=flag_inputs(geo.to_dict(), artifact, sampled),
        assumed_null=0.0,
        feeds_dictionary=False,
    )
    flags += run_flags("artifact", opts.thresholds, artifact=artifact, subject="activations")
    return FilesGeometry(files=files, geometry=geo, artifact=artifact, flags=sort_flags(flags), exclusions=exclusions)
