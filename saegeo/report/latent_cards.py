"""Latent cards: what the latents a flag names (or a user asks for) are — their top activating contexts beside
the geometry that singled them out — and the per-latent table of every latent.

In the report's one pass every SAE's folded codes a_i·‖W_dec,i‖ also feed a ``LatentTopK`` (the k highest
activations of every latent and their store rows: k·d_sae floats, whatever the number of tokens) and a
``LatentHistogram`` (fixed log bins per latent). Once the flags are known, a card is built for each latent they
name: its top rows looked up in the store (token id, position, the preceding tokens of the same window —
rows with consecutive positions — decoded by the model's tokenizer when one is found offline), its histogram,
firing rate, E[a], E[a²], cos(W_dec,i, μ), cone share, decoder norm and its nearest latents by decoder cosine.
The data contract is in docs/design.md ("Latent cards").

``named_latents(flags, subject, asked)``       {latent: [why]} in card order.
``latent_table(section, mean_sq, norms, nn)``  columns of every latent (``TABLE_COLUMNS``).
``latent_cards(...)``                          the cards of the named latents.
``latents_report(acts, sae, options)``         `saegeo latents`: the SAE's pass alone, cards of chosen latents.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from saegeo.errors import BadInputError
from saegeo.geometry.dictionary import nearest_decoder_neighbours, row_norms
from saegeo.geometry.latent_stats import BINS_PER_OCTAVE, LatentCovariates, LatentHistogram, LatentTopK
from saegeo.io import json_safe
from saegeo.report.display import notebook_html, short
from saegeo.report.options import (  # noqa: F401  (ByColumn re-exported)
    LATENT_RELATION_COLUMNS,
    LATENT_SUMMARY_COLUMNS,
    NEIGHBOUR_TABLE_MAX,
    ByColumn,
    LatentsOptions,
)

TABLE_COLUMNS = ("id", *LATENT_SUMMARY_COLUMNS, "dead", "dense", "nn_id", *LATENT_RELATION_COLUMNS)
# the covariates each latent's activation is correlated with in the pass (LatentCovariates), and their columns
COVARIATE_COLUMNS = {"norm": "norm_corr", "position": "position_corr", "log_frequency": "log_frequency_corr"}
ASKED = "asked"
N_AFTER = 4  # following tokens shown after the firing one
N_NEIGHBOURS = 5
# rows per tile side of the neighbour search: its float64 and float32 unit blocks and the tile stay ~0.1 GB at d
# 2,304, below the rest of `check --acts`'s peak (benchmarks/README.md#numbers-behind-code-comments)
NEIGHBOUR_BLOCK_ROWS = 2048
LATENTS_SCHEMA_VERSION = 1


# =========================================================================== which latents
def parse_latent_ids(ids: Sequence[int], d_sae: int, name: str) -> list[int]:
    """The asked ids, each once in the order given; BadInputError naming the first outside [0, d_sae)."""
    for i in ids:
        if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < d_sae:
            raise BadInputError(f"latent {i!r} is not a latent of SAE {name!r}: its ids are 0 … {d_sae - 1}")
    return list(dict.fromkeys(ids))


def named_latents(flags: Sequence[Any], subject: str, asked: Sequence[int] = ()) -> dict[int, list[str]]:
    """{latent: the flag names naming it (flags in order, each flag's latents in order), then "asked"}."""
    why: dict[int, list[str]] = {}
    for f in flags:
        if f.subject != subject or not f.latents:
            continue
        for i in f.latents:
            names = why.setdefault(int(i), [])
            if f.name not in names:
                names.append(f.name)
    for i in asked:
        why.setdefault(int(i), []).append(ASKED)
    return why


# =========================================================================== a card
@dataclass(frozen=True, repr=False)
class LatentCard:
    """One latent's card as the report keeps it (``data``: {id, why, firing_rate, cos_mu, cone_share, histogram,
    neighbours, top_contexts, ...}) with the name of its SAE; shows itself in a notebook, contexts marked."""

    sae: str
    data: Mapping[str, Any]

    @property
    def id(self) -> int:
        return int(self.data["id"])

    def __getitem__(self, key: str) -> Any:
        return self.data[key]

    def __repr__(self) -> str:
        d = self.data
        why = d.get("why")
        why = ", ".join(map(str, why)) if isinstance(why, list) else why
        rate = d.get("firing_rate")
        return (
            f"<LatentCard {self.sae!r} latent {self.id}: firing {'—' if rate is None else f'{100 * rate:.2f}%'} · "
            f"cos(u_i, μ) {short(d.get('cos_mu'))} · cone share {short(d.get('cone_share'))} · "
            f"{len(d.get('top_contexts') or [])} contexts" + (f" · {why}" if why else "") + ">"
        )

    def _repr_html_(self) -> str:
        return notebook_html(self)


# =========================================================================== the table
def latent_table(
    section: Any,
    mean_sq_activation: Tensor,
    decoder_norms: Tensor,
    neighbours: tuple[Tensor, Tensor] | None,
    dense_frequency: float,
    correlations: Mapping[str, list] | None = None,
) -> dict[str, list]:
    """Columns (``TABLE_COLUMNS``) of every latent of an SAE section (SAEGeometry): firing rate, E[a], E[a²],
    cos(W_dec,i, μ), cone share, ‖W_dec,i‖, dead (rate 0), dense (rate > dense_frequency), the nearest latent
    by decoder cosine and that cosine (−1 / None without one), and the Pearson correlation of the latent's
    activation with the row norm ‖x‖, with the token's position and with its log frequency log(c_t / n) (c_t: the
    token id's count among the pass's n rows) (``LatentCovariates``: norm detectors, position and frequency
    latents; None where not measured, e.g. no positions or token ids in the source). A withheld list is a column of None."""
    n = section.d_sae
    rate = list(section.firing_frequency)
    none = [None] * n

    def column(values: Any) -> list:
        return none if values is None else [float(v) for v in values]

    nn_id, nn_cos = (none, none) if neighbours is None else (neighbours[0][:, 0].tolist(), neighbours[1][:, 0])
    return json_safe(
        {
            "id": list(range(n)),
            "rate": column(rate),
            "mean_activation": column(section.mean_activation),
            "mean_sq_activation": column(mean_sq_activation.tolist()),
            "cos_mu": column(section.cos_decoder_mean),
            "cone_share": column(section.cone_shares),
            "decoder_norm": column(decoder_norms.tolist()),
            "dead": [r == 0 for r in rate],
            "dense": [r > dense_frequency for r in rate],
            "nn_id": nn_id,
            "nn_cos": nn_cos if nn_cos is none else column(nn_cos.tolist()),
            **{col: list((correlations or {}).get(key) or none) for key, col in COVARIATE_COLUMNS.items()},
        }
    )


def top_by(table: Mapping[str, list], column: str, n: int) -> list[int]:
    """The n latents with the largest value of a table column (None last; ties: the smaller id first)."""
    values = table[column]
    order = sorted(range(len(values)), key=lambda i: (values[i] is None, -(values[i] or 0.0), i))
    return order[:n]


def carded_neighbours(w_dec: Tensor, latents: Sequence[int], norms: Tensor) -> tuple[Tensor, Tensor]:
    """The N_NEIGHBOURS nearest latents (exact, by decoder cosine) of ``latents`` only, as (N, k) tensors indexed
    by latent id like the whole search's, every other row −1 / NaN: m·N·d work for m latents."""
    n = int(w_dec.shape[0])
    idx = torch.full((n, N_NEIGHBOURS), -1, dtype=torch.long)
    cos = torch.full((n, N_NEIGHBOURS), float("nan"), dtype=torch.float64)
    if latents:
        queries = torch.tensor(latents, dtype=torch.long)
        got_idx, got_cos = nearest_decoder_neighbours(
            w_dec, N_NEIGHBOURS, NEIGHBOUR_BLOCK_ROWS, queries=queries, norms=norms
        )
        idx[queries], cos[queries] = got_idx, got_cos.to(torch.float64)
    return idx, cos


# =========================================================================== contexts
class TokenText:
    """Token ids as text with ``tokenizer`` (a transformers tokenizer), or as "#<id>" without one."""

    def __init__(self, tokenizer: Any | None):
        self.tokenizer = tokenizer

    def _decode(self, ids: list[int]) -> str | None:
        try:
            return self.tokenizer.decode(ids)
        except Exception:  # an id outside the vocabulary
            return None

    def pieces(self, ids: Sequence[int]) -> list[str]:
        """One string per token of a window such that their concatenation is the window decoded, so a piece
        carries the spacing its tokenizer gives it there (WordPiece's "##" joins, BPE's leading spaces): piece j
        is decode(ids[:j+1]) with decode(ids[:j]) taken off its front (the token decoded alone where the
        tokenizer rewrote the earlier text)."""
        ids = [int(i) for i in ids]
        if self.tokenizer is None:
            return [f"#{i}" for i in ids]
        out, before = [], ""
        for j, token in enumerate(ids):
            now = self._decode(ids[: j + 1])
            if now is not None and now.startswith(before):
                out.append(now[len(before) :])
                before = now
            else:
                alone = self._decode([token])
                out.append(alone if alone is not None else f"#{token}")
                before = now if now is not None else before + out[-1]
        return out


def window_around(
    ids: Tensor, positions: Tensor | None, at: int, before: int, after: int
) -> tuple[list[int], list[int]]:
    """The ids of the rows before and after row ``at`` of ``ids`` that belong to its window: rows whose positions
    run on by exactly one from it (a gap or a new window, position 0, ends the context). Without positions,
    the rows next to it."""
    pos = None if positions is None else positions.tolist()
    lo = at
    while lo > 0 and at - lo < before and (pos is None or pos[lo - 1] == pos[lo] - 1):
        lo -= 1
    hi = at
    while hi + 1 < len(ids) and hi - at < after and (pos is None or pos[hi + 1] == pos[hi] + 1):
        hi += 1
    values = ids.tolist()
    return values[lo:at], values[at + 1 : hi + 1]


def read_windows(
    store: Any, rows: Sequence[int], before: int, after: int
) -> dict[int, tuple[Tensor, Tensor | None, int]]:
    """{row: (token ids, positions or None, index of the row in them)} of rows [row − before, row + after], read
    with one call per column for each shard the rows fall in (not one per row: a few hundred contexts would
    otherwise open their shard files a few hundred times)."""
    out: dict[int, tuple[Tensor, Tensor | None, int]] = {}
    if not rows:
        return out
    ordered = sorted(set(int(r) for r in rows))
    shard_of = np.searchsorted(store.offsets, ordered, side="right") - 1
    for shard in np.unique(shard_of):
        group = [r for r, s in zip(ordered, shard_of) if s == shard]
        lo = max(0, group[0] - before)
        hi = group[-1] + after + 1
        ids = store.read_column_range("token_ids", lo, hi)
        positions = store.read_column_range("positions", lo, hi)
        for r in group:
            a, b = max(0, r - before) - lo, r + after + 1 - lo
            out[r] = (ids[a:b], None if positions is None else positions[a:b], r - lo - a)
    return out


def top_contexts(
    values: Tensor,
    rows: Tensor,
    windows: Mapping[int, tuple[Tensor, Tensor | None, int]] | None,
    text: TokenText,
    context_tokens: int,
) -> list[dict[str, Any]]:
    """One context per (activation, row) — highest first as given — with the row's token, position and the
    preceding / following tokens of its window (``read_windows``; None / [] when the source has no token ids)."""
    out = []
    for value, row in zip(values.tolist(), rows.tolist()):
        entry: dict[str, Any] = {
            "row": int(row),
            "activation": float(value),
            "token_id": None,
            "position": None,
            "text": None,
            "context": [],
            "after": [],
        }
        if windows is not None:
            ids, positions, at = windows[int(row)]
            before, following = window_around(ids, positions, at, context_tokens, N_AFTER)
            token = int(ids[at])
            pieces = text.pieces([*before, token, *following])
            entry.update(
                token_id=token,
                position=None if positions is None else int(positions[at]),
                text=pieces[len(before)],
                context=pieces[: len(before)],
                after=pieces[len(before) + 1 :],
            )
        out.append(entry)
    return out


def latent_cards(
    why: Mapping[int, list[str]],
    table: Mapping[str, list],
    topk: LatentTopK,
    histogram: LatentHistogram,
    neighbours: tuple[Tensor, Tensor] | None,
    store: Any | None,
    text: TokenText,
    context_tokens: int,
) -> list[dict[str, Any]]:
    """The card of each latent of ``why`` (in its order): the table's numbers, histogram, neighbours and top
    contexts (see the module docstring and docs/design.md for every key)."""
    windows = None
    if store is not None and "token_ids" in store.columns:
        wanted = [r for i in why for r in topk.top(i)[1].tolist()]
        windows = read_windows(store, wanted, context_tokens, N_AFTER)
    cards = []
    for i, reasons in why.items():
        values, rows = topk.top(i)
        nn = []
        if neighbours is not None:
            nn = [
                {"id": int(j), "cos": float(c)}
                for j, c in zip(neighbours[0][i].tolist(), neighbours[1][i].tolist())
                if j >= 0
            ]
        cards.append(
            json_safe(
                {
                    "id": int(i),
                    "why": list(reasons),
                    "firing_rate": table["rate"][i],
                    "mean_activation": table["mean_activation"][i],
                    "mean_sq_activation": table["mean_sq_activation"][i],
                    "cos_mu": table["cos_mu"][i],
                    "cone_share": table["cone_share"][i],
                    "decoder_norm": table["decoder_norm"][i],
                    "dead": table["dead"][i],
                    "dense": table["dense"][i],
                    "histogram": histogram.histogram(i, float(values[0]) if len(values) else None),
                    "neighbours": nn,
                    "top_contexts": top_contexts(values, rows, windows, text, context_tokens),
                }
            )
        )
    return cards


# =========================================================================== the pass's part
class LatentCollector:
    """The latent-card part of one SAE's pass: its LatentTopK and LatentHistogram, fed the folded codes of
    every batch (as ``SAEMetrics.code_observers``); ``cards`` builds the table and cards once flags are known."""

    def __init__(self, d_sae: int, n_contexts: int, start: int = 0):
        self.topk = LatentTopK(d_sae, n_contexts, start)
        self.histogram = LatentHistogram(d_sae)
        self.covariates: LatentCovariates | None = None  # made by the first batch's covariates (which it has)
        self._batch_covariates: Tensor | None = None  # (m, s) of the open batch; its code groups follow in order
        self._at = 0

    def begin_batch(self, covariates: Mapping[str, Tensor]) -> None:
        """The per-row covariates (name -> (m,) values, names of ``COVARIATE_COLUMNS``) of the batch whose codes
        ``add`` receives next, group after group in row order."""
        if self.covariates is None:
            self.covariates = LatentCovariates(self.topk.n_latents, tuple(covariates))
        stacked = torch.stack([covariates[k].double() for k in self.covariates.names], dim=1)
        self._batch_covariates = self.covariates.centre(stacked)  # centred once; each code group takes its slice
        self.covariates.add_rows(self._batch_covariates, centred=True)  # the whole batch's sums, however grouped
        self._at = 0

    def add(self, codes: Any) -> None:
        """One batch: ``codes`` as COO (or anything ``coo_codes`` reads). The pass hands over the COO it builds
        anyway, even where the SAE gave a dense matrix: a gather over the nonzeros screens the top-k, where the
        dense matrix would cost a compare over every (row, latent) cell."""
        self.topk.add(codes)
        self.histogram.add(codes)
        if self._batch_covariates is not None:
            n_rows = int(codes.n_rows) if hasattr(codes, "n_rows") else int(codes.shape[0])
            self.covariates.add_codes(codes, self._batch_covariates[self._at : self._at + n_rows], centred=True)
            self._at += n_rows

    def merge_ranks(self) -> None:
        """torch.distributed: every rank's top-k and histogram merged (ranks' rows are global store rows)."""
        from saegeo import distributed

        self.topk = distributed.merge_across_ranks(self.topk)
        self.histogram = distributed.merge_across_ranks(self.histogram)
        self.covariates = distributed.merge_across_ranks(self.covariates)

    def fill(
        self,
        section: Any,
        metrics: Any,
        w_dec: Tensor,
        why: Mapping[int, list[str]] | Callable[[Mapping[str, list]], Mapping[int, list[str]]],
        *,
        store: Any | None,
        text: TokenText,
        context_tokens: int,
        dense_frequency: float,
        neighbours: bool = True,
        neighbour_table_max: int = NEIGHBOUR_TABLE_MAX,
        note: str | None = None,
    ) -> str | None:
        """Set ``section.latent_table``, ``.latents`` and ``.latent_info`` (SAEGeometry); ``why`` may be a
        function of the table (e.g. the top latents by a column).

        Neighbours (exact, ``nearest_decoder_neighbours``): of every latent, for the table's nn_id / nn_cos,
        while d_sae ≤ ``neighbour_table_max`` (N²·d multiply-adds); above it, of the carded latents only (m·N·d)
        and the table's two columns are None. ``latent_info["neighbours"]`` says which ran: "every latent",
        "carded latents" or "none"; returned: the note saying so when the table's columns were withheld."""
        n_latents = int(w_dec.shape[0])
        every = neighbours and n_latents <= neighbour_table_max
        nn = nearest_decoder_neighbours(w_dec, N_NEIGHBOURS, NEIGHBOUR_BLOCK_ROWS) if every else None
        norms = row_norms(w_dec)  # float64 a block at a time: no float64 copy of W_dec
        correlations = self.covariates.correlations() if self.covariates is not None else None
        table = latent_table(section, metrics.codes.mean_sq_code, norms, nn, dense_frequency, correlations)
        chosen = why(table) if callable(why) else why
        withheld = None
        if neighbours and not every:
            nn = carded_neighbours(w_dec, list(chosen), norms)
            withheld = (
                f"neighbours: of the {len(chosen):,} carded latents only; the table's nn_id and nn_cos are "
                f"withheld above {neighbour_table_max:,} latents ({n_latents:,} here: every latent's neighbour "
                f"is N²·d work); raise --neighbour-table-max (report, check --acts, latents) to compute them"
            )
            note = f"{note}; {withheld}" if note else withheld
        section.latent_table = table
        section.latents = latent_cards(chosen, table, self.topk, self.histogram, nn, store, text, context_tokens)
        section.latent_info = {
            "n_contexts": self.topk.k,
            "context_tokens": context_tokens,
            "tokenizer": store.model if store is not None and text.tokenizer is not None else None,
            "decoded": text.tokenizer is not None,
            "histogram_bins_per_octave": BINS_PER_OCTAVE,
            "n_tokens": section.n_tokens,
            "neighbours": "every latent" if every else "carded latents" if neighbours else "none",
            "note": note,
        }
        return withheld


def context_source(rows: Any, n_skipped: int, distributed_iterator: bool) -> tuple[Any | None, TokenText, str | None]:
    """(the store the contexts are read from or None, the token text, a note on what is missing)."""
    from saegeo.activations.models import tokenizer_for

    store = rows.store
    if distributed_iterator:
        return (
            None,
            TokenText(None),
            "contexts: rows of a stream of batches under torch.distributed have no global index",
        )
    if store is None:
        return None, TokenText(None), f"contexts: the source is a {rows.kind}, which has no token ids (pass a store)"
    if n_skipped:
        return (
            None,
            TokenText(None),
            (
                f"contexts: {n_skipped} non-finite row(s) were skipped, so rows after them are numbered in the "
                "screened stream: token ids not looked up"
            ),
        )
    if "token_ids" not in store.columns:
        return store, TokenText(None), "contexts: the store has no token ids"
    tokenizer = tokenizer_for(store.model)
    note = (
        None if tokenizer is not None else f"contexts: no tokenizer found offline for {store.model!r}: token ids shown"
    )
    return store, TokenText(tokenizer), note
