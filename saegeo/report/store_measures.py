"""Measures of one activation store that need its token ids and positions: the token-type decomposition,
self-similarity, intra-window similarity and the artifact test. The layer sweep runs this per store.

``measure_store(store, *, batch_rows=BATCH_ROWS, max_types=None, artifact_components=3, ...) -> StoreMeasures``
    pass 1: GeometryAccumulator, TokenTypeAccumulator, WindowSimilarityAccumulator on the same batches
    (cut as ``saegeo geometry`` cuts them, so the geometry equals its numbers to the bit);
    pass 2: the artifact test against the top-k principal directions of pass 1.
``artifact_pass(stores, geometry, *, k=3, batch_rows=BATCH_ROWS, max_tokens=None) -> dict``
    the artifact test alone (second streamed pass), for `saegeo report` / `saegeo geometry` on stores.
Every pass reads through the one reader (``open_rows``): shards verified, NaN rows refused naming the row or, with
skip_nonfinite (``--skip-nonfinite``), skipped and counted, in the artifact pass as in the first pass.

Memory per store: O(d²) for the accumulator plus O(T·d) for the type table (T ≤ V types, or
≤ 2·max_types), O(context·d) for the open window and O(V·k) for the artifact pass.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from saegeo.activations.sources import Rows, open_rows
from saegeo.activations.store import ActivationStore
from saegeo.config import BATCH_ROWS
from saegeo.errors import BadInputError
from saegeo.geometry.accumulate import GeometryAccumulator
from saegeo.geometry.measures import ActivationGeometry, activation_geometry
from saegeo.geometry.tokens import (
    ArtifactAccumulator,
    TokenTypeAccumulator,
    TokenTypeGeometry,
    WindowSimilarityAccumulator,
    token_type_geometry,
)

ARTIFACT_SOURCE = "second streamed pass over the store (every row), frequencies counted in the same store"


@dataclass
class StoreMeasures:
    """Everything the sweep reads from one store."""

    path: str
    model: str
    hook: str
    geometry: ActivationGeometry
    token_types: TokenTypeGeometry | None  # None: the store has no token ids
    intra_window: float | None  # mean IntraSim over windows (None: no positions)
    n_windows: int
    artifact: dict[str, Any] | None  # None: the artifact test was skipped (artifact_components 0)
    seconds: float
    memory_bytes: dict[str, int] = field(default_factory=dict)  # accumulator state sizes
    notes: list[str] = field(default_factory=list)


def _state_bytes(sd: dict[str, Any]) -> int:
    return sum(v.numel() * v.element_size() for v in sd.values() if isinstance(v, torch.Tensor))


def artifact_pass(
    stores: Sequence[ActivationStore | Rows] | ActivationStore | Rows,
    geometry: ActivationGeometry,
    *,
    k: int = 3,
    batch_rows: int = BATCH_ROWS,
    max_tokens: int | None = None,
    skip_nonfinite: bool = False,
) -> dict[str, Any]:
    """|corr| of the top-k principal projections (x − μ)·v_j with log token frequency (counted in these
    same stores), position in the window and ‖x‖, streamed over the stores in order (one more pass)."""
    return artifact_result(
        artifact_accumulator(
            stores, geometry, k=k, batch_rows=batch_rows, max_tokens=max_tokens, skip_nonfinite=skip_nonfinite
        )
    )


def artifact_accumulator(
    stores: Sequence[ActivationStore | Rows] | ActivationStore | Rows,
    geometry: ActivationGeometry,
    *,
    k: int = 3,
    batch_rows: int = BATCH_ROWS,
    max_tokens: int | None = None,
    rank: int = 0,
    world_size: int = 1,
    skip_nonfinite: bool = False,
) -> ArtifactAccumulator:
    """The streamed part of :func:`artifact_pass`; ``rank``/``world_size`` restrict it to that rank's block of
    shards (merge the parts with ``distributed.merge_across_ranks``). Stores given as ``Rows`` keep their own NaN
    policy; stores given as such get skip_nonfinite's."""
    stores = [stores] if isinstance(stores, (ActivationStore, Rows)) else list(stores)
    k = min(k, len(geometry.top_eigenvectors))
    if k < 1:
        raise BadInputError("the artifact test needs at least one stored principal direction (top_k_eigvecs ≥ 1)")
    art = ArtifactAccumulator(geometry.mean_tensor, geometry.top_eigenvector_tensor[:, :k])
    left = max_tokens
    for store in stores:
        rows = store if isinstance(store, Rows) else open_rows(store, skip_nonfinite=skip_nonfinite)
        for x, ids, pos in rows.batches(batch_rows, rank, world_size, stop_row=left, metadata=True)[0]:
            art.add(x, ids, pos)
        if left is not None:
            left -= min(left, rows.n_rows)
            if left == 0:
                break
    return art


def artifact_result(art: ArtifactAccumulator) -> dict[str, Any]:
    """The correlations of an :class:`ArtifactAccumulator`, with where they came from."""
    out = art.correlations()
    out["source"] = ARTIFACT_SOURCE
    missing = [name for name, ok in art.has.items() if not ok]
    if missing:
        out["note"] = f"the store has no {' / '.join(missing)}: those correlations are undefined"
    return out


def measure_store(
    store: ActivationStore | str,
    *,
    batch_rows: int = BATCH_ROWS,
    max_types: int | None = None,
    artifact_components: int = 3,
    top_k_eigvecs: int = 10,
    max_tokens: int | None = None,
    n_list: int = 10,
    min_count: int = 5,
    verify: bool = True,
    skip_nonfinite: bool = False,
) -> StoreMeasures:
    """Two streamed passes over one store (see the module docstring); nothing grows with the tokens.
    verify=False reads a store path's shards without their sha256 (an opened store keeps its own setting)."""
    t0 = time.perf_counter()
    rows = open_rows(
        store if isinstance(store, ActivationStore) else ActivationStore(store, verify=verify),
        skip_nonfinite=skip_nonfinite,
    )
    store = rows.store
    acc = GeometryAccumulator(store.d)
    types = TokenTypeAccumulator(store.d, max_types=max_types)
    windows = WindowSimilarityAccumulator(store.d)
    has_ids = has_pos = True
    for x, ids, pos in rows.batches(batch_rows, stop_row=max_tokens, metadata=True)[0]:
        acc.add(x, source=str(store.path))
        if ids is None:
            has_ids = False
        elif has_ids:
            types.add(x, ids)
        if pos is None:
            has_pos = False
        elif has_pos:
            windows.add(x, pos)
    acc.n_nonfinite_skipped += rows.n_nonfinite_skipped  # dropped by the reader, before the accumulator saw them
    if acc.n == 0:
        raise BadInputError(f"{store.path}: the store holds no rows")
    geo = activation_geometry(acc, top_k_eigvecs=max(top_k_eigvecs, artifact_components))
    notes = []
    tt = token_type_geometry(types, baseline=geo.anisotropy, n_list=n_list, min_count=min_count) if has_ids else None
    if not has_ids:
        notes.append(f"{store.path}: no token_ids in the store: no token-type decomposition or self-similarity")
    intra = windows.finish().intra_similarity() if has_pos else None
    if not has_pos:
        notes.append(f"{store.path}: no positions in the store: no intra-window similarity")
    artifact = (  # 0 components: the test is skipped, as the option's help says
        artifact_pass(rows, geo, k=artifact_components, batch_rows=batch_rows, max_tokens=max_tokens)
        if artifact_components >= 1
        else None
    )
    memory = {"geometry_accumulator": _state_bytes(acc.state_dict()), "token_types": _state_bytes(types.state_dict())}
    return StoreMeasures(
        path=str(store.path),
        model=store.model,
        hook=store.hook,
        geometry=geo,
        token_types=tt,
        intra_window=intra,
        n_windows=windows.n_windows,
        artifact=artifact,
        seconds=time.perf_counter() - t0,
        memory_bytes=memory,
        notes=notes,
    )
