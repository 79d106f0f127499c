"""`saegeo compare` as a library call: two dictionaries' latents matched one to one, by decoder cosines and (given
activations) by the correlation of their activations over the same tokens.

``compare_dictionaries(sae_a, sae_b, options, acts=None, names=None) -> Comparison``
    the decoder matching (``saegeo.geometry.consistency.match_latents``): PW-MCC, the shared fraction at
    ``options.threshold``, the encoder cosines of the matched pairs, the geometry of the shared and unshared
    latents of each side; with ``acts``, one pass of both SAEs over the rows and the same matching on the
    Pearson correlations of their codes (every pair when the dense matching applies, else the decoder
    candidate graph's pairs).
``Comparison.to_dict()`` is what ``compare.json`` holds (the matched pairs included).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import torch

from saegeo.config import CompareOptions
from saegeo.errors import BadInputError
from saegeo.geometry.consistency import (
    CodeCorrelationAccumulator,
    LatentMatching,
    encoder_cosines,
    match_latents,
    match_similarity,
    match_sparse,
    set_geometry,
)
from saegeo.io import dump_json
from saegeo.report.display import notebook_html, short


@dataclass
class Comparison:
    """What ``compare_dictionaries`` measured."""

    names: tuple[str, str]
    d: int
    threshold: float
    decoder: dict[str, Any]  # LatentMatching.summary + encoder agreement of the matched pairs
    geometry: dict[str, dict[str, Any]]  # "a_shared", "a_unshared", "b_shared", "b_unshared" -> set_geometry
    pairs: dict[str, list]  # the decoder matching: index_a, index_b, similarity, encoder_cosine
    activations: dict[str, Any] | None = None  # the activation matching's summary (and its pairs), with --acts
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "names": list(self.names),
            "d": self.d,
            "threshold": self.threshold,
            "decoder": self.decoder,
            "geometry": self.geometry,
            "activations": self.activations,
            "notes": self.notes,
            "pairs": self.pairs,
        }

    def to_json(self, path: str | os.PathLike | None = None) -> str:
        return dump_json(self.to_dict(), path)

    def _repr_html_(self) -> str:
        return notebook_html(self)

    def __repr__(self) -> str:
        dec = self.decoder
        return (
            f"<Comparison {self.names[0]!r} vs {self.names[1]!r}: {dec.get('n_a', 0):,} × {dec.get('n_b', 0):,} "
            f"latents, d={self.d} · decoder MCC {short(dec.get('mcc'))} · {dec.get('n_shared', 0):,} shared at "
            f"cos ≥ {self.threshold:g} ({short(dec.get('shared_fraction_a'))} of A)>"
        )


def _geometry(rows: torch.Tensor, matching: LatentMatching, side: str, threshold: float) -> dict[str, dict]:
    n = rows.shape[0]
    index = matching.index_a if side == "a" else matching.index_b
    best = matching.best_a if side == "a" else matching.best_b
    shared = torch.zeros(n, dtype=torch.bool)
    shared[index[matching.shared(threshold)]] = True
    return {
        f"{side}_shared": set_geometry(rows, shared.nonzero().flatten(), best),
        f"{side}_unshared": set_geometry(rows, (~shared).nonzero().flatten(), best),
    }


def _activation_matching(
    sae_a: Any, sae_b: Any, acts: str, decoder: LatentMatching, opts: CompareOptions
) -> dict[str, Any]:
    from saegeo.activations.sources import open_rows
    from saegeo.progress import progress_bar

    rows = open_rows(acts, verify=opts.verify, skip_nonfinite=opts.skip_nonfinite)
    if rows.d is not None and rows.d != sae_a.cfg.d_in:
        raise BadInputError(f"{acts}: activations have d={rows.d} but the SAEs read d={sae_a.cfg.d_in}")
    n_a, n_b = sae_a.cfg.d_sae, sae_b.cfg.d_sae
    dense = decoder.edges is None
    pairs = None if dense else (torch.from_numpy(decoder.edges[0]), torch.from_numpy(decoder.edges[1]))
    acc = CodeCorrelationAccumulator(n_a, n_b, pairs)
    total = rows.n_rows if opts.max_tokens is None or rows.n_rows is None else min(rows.n_rows, opts.max_tokens)
    batches, _ = rows.batches(opts.batch_rows, stop_row=opts.max_tokens)
    with (
        torch.no_grad(),
        progress_bar(total=total, unit="row", unit_scale=True, enabled=opts.progress, desc="compare") as bar,
    ):
        for x in batches:
            x = torch.as_tensor(x, dtype=torch.float32)
            acc.add(sae_a.encode(x.to(sae_a.W_enc.dtype)), sae_b.encode(x.to(sae_b.W_enc.dtype)))
            bar.update(len(x))
    if acc.n < 2:
        raise BadInputError(f"{acts}: needs at least 2 rows to correlate activations, got {acc.n}")
    if dense:
        matching = match_similarity(acc.matrix())
        note = "every pair correlated; exact Hungarian matching"
    else:
        i, j, rho = acc.pair_correlations()
        ri, rj, rs = match_sparse(n_a, n_b, i.numpy(), j.numpy(), rho.numpy())
        best_a = torch.zeros(n_a, dtype=torch.float64).scatter_reduce(0, i, rho, "amax", include_self=False)
        best_b = torch.zeros(n_b, dtype=torch.float64).scatter_reduce(0, j, rho, "amax", include_self=False)
        matching = LatentMatching(
            index_a=torch.from_numpy(ri).long(),
            index_b=torch.from_numpy(rj).long(),
            similarity=torch.from_numpy(rs),
            n_a=n_a,
            n_b=n_b,
            method="candidates",
            best_a=best_a,  # 0 for a latent in no candidate pair
            best_b=best_b,
            k=decoder.k,
            n_candidate_edges=len(decoder.edges[0]),
        )
        note = (
            "correlations of the decoder candidate pairs only; latents left unmatched count 0 in the MCC and the "
            "upper bound is over those pairs"
        )
    summary = matching.summary(opts.threshold)
    summary.update(n_rows=acc.n, note=note)
    agree = decoder_agreement(decoder, matching)
    summary["same_pair_as_decoder"] = agree
    summary["pairs"] = {
        "index_a": matching.index_a.tolist(),
        "index_b": matching.index_b.tolist(),
        "similarity": matching.similarity.tolist(),
    }
    return summary


def decoder_agreement(decoder: LatentMatching, activations: LatentMatching) -> float:
    """The fraction of the activation matching's pairs that the decoder matching also made."""
    by_decoder = dict(zip(decoder.index_a.tolist(), decoder.index_b.tolist()))
    pairs = list(zip(activations.index_a.tolist(), activations.index_b.tolist()))
    return sum(by_decoder.get(i) == j for i, j in pairs) / max(len(pairs), 1)


def compare_dictionaries(
    sae_a: Any,
    sae_b: Any,
    options: CompareOptions | None = None,
    acts: str | None = None,
    names: tuple[str, str] | None = None,
) -> Comparison:
    """Match the latents of ``sae_a`` and ``sae_b`` (SAE objects, or anything ``SAE.load`` reads:
    a directory, file or hub id) and report the consistency measures of saegeo.geometry.consistency."""
    from saegeo.sae.model import SAE

    opts = options or CompareOptions(progress=False)
    names = names or (
        str(sae_a) if isinstance(sae_a, (str, os.PathLike)) else "A",
        str(sae_b) if isinstance(sae_b, (str, os.PathLike)) else "B",
    )
    sae_a, sae_b = SAE.load(sae_a), SAE.load(sae_b)
    if sae_a.cfg.d_in != sae_b.cfg.d_in:
        raise BadInputError(
            f"{names[0]} reads d={sae_a.cfg.d_in} but {names[1]} reads d={sae_b.cfg.d_in}: only dictionaries of "
            "the same activation space can be matched"
        )
    with torch.no_grad():
        decoder = match_latents(
            sae_a.W_dec.detach(), sae_b.W_dec.detach(), exact_max_entries=opts.exact_max_entries, k=opts.candidates
        )
        enc = encoder_cosines(sae_a.W_enc.detach(), sae_b.W_enc.detach(), decoder.index_a, decoder.index_b)
        geometry = {
            **_geometry(sae_a.W_dec.detach(), decoder, "a", opts.threshold),
            **_geometry(sae_b.W_dec.detach(), decoder, "b", opts.threshold),
        }
    summary = decoder.summary(opts.threshold)
    both = (decoder.similarity >= opts.threshold) & (enc >= opts.threshold)
    summary.update(
        mean_encoder_cosine=float(enc.mean()),
        n_shared_encoder_too=int(both.sum()),
        shared_encoder_too_fraction_a=int(both.sum()) / decoder.n_a,
    )
    notes = []
    if decoder.method == "candidates":
        notes.append(
            f"{decoder.n_a:,} × {decoder.n_b:,} latents is above the dense limit ({opts.exact_max_entries:,} "
            f"pairs): matched on each latent's {opts.candidates} nearest of the other dictionary; the MCC is a "
            "lower bound of the dense optimum, mcc_upper_bound an upper one"
        )
    result = Comparison(
        names=names,
        d=sae_a.cfg.d_in,
        threshold=opts.threshold,
        decoder=summary,
        geometry=geometry,
        pairs={
            "index_a": decoder.index_a.tolist(),
            "index_b": decoder.index_b.tolist(),
            "similarity": decoder.similarity.tolist(),
            "encoder_cosine": enc.tolist(),
        },
        notes=notes,
    )
    if acts is not None:
        result.activations = _activation_matching(sae_a, sae_b, acts, decoder, opts)
    return result
