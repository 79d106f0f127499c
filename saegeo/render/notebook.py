"""What a notebook shows for a result: the HTML block IPython displays (the ``_repr_html_`` of a GeometryReport,
one SAE's section, a DictionaryCheck, a LayerSweep, a LatentCard, an SAE, an ActivationStore and a Comparison all call
`html_of`). Each block is made of the same parts as the pages `write_report` writes (one look, one
implementation), with the page's style sheet scoped to the block; self-contained: figures as data: URIs,
nothing fetched.

``html_of(obj) -> str``   the block of any of those results.
"""

from __future__ import annotations

from typing import Any

from saegeo.activations.store import ActivationStore
from saegeo.render.check_page import check_block
from saegeo.render.common import fmt_num, html_block, html_table
from saegeo.render.compare_text import compare_block
from saegeo.render.latents_page import LATENTS_CSS, latent_card_html
from saegeo.render.report_page import report_block, section_block
from saegeo.render.sweep_page import sweep_block
from saegeo.report.dictionary_check import DictionaryCheck
from saegeo.report.dictionary_compare import Comparison
from saegeo.report.geometry_report import GeometryReport, SAEGeometry
from saegeo.report.latent_cards import LatentCard
from saegeo.report.layer_sweep import LayerSweep
from saegeo.sae.model import SAE


def card_block(card: LatentCard) -> str:
    """One latent's card, its top contexts with the activating token marked."""
    return html_block(f"latent {card.id} of {card.sae}", [latent_card_html(card.data, card.sae)], css=LATENTS_CSS)


def sae_lines(sae: SAE) -> list[tuple[str, str]]:
    """(label, text) rows of an SAE: its architecture and shapes, how its inputs are prepared, where it came
    from, and its decoder rows' norms."""
    cfg, info = sae.cfg, sae.format_info
    norms = sae.W_dec.detach().double().norm(dim=1)
    rows = [
        ("architecture", cfg.activation + (f", k = {cfg.k}" if cfg.k else "")),
        ("shape", f"d_in {cfg.d_in:,} → d_sae {cfg.d_sae:,} latents ({cfg.d_sae / cfg.d_in:g}×)"),
        (
            "input",
            f"b_dec subtracted: {cfg.apply_b_dec_to_input}; normalization: {cfg.input_normalization}; "
            f"rescaled by decoder norm: {cfg.rescale_acts_by_decoder_norm}",
        ),
        ("tensors", f"{cfg.dtype} on {sae.W_dec.device}; {sum(p.numel() for p in sae.parameters()):,} parameters"),
        (
            "decoder rows",
            f"‖w_i‖ min {fmt_num(float(norms.min()))}, median {fmt_num(float(norms.median()))}, "
            f"max {fmt_num(float(norms.max()))}; ‖b_dec‖ {fmt_num(float(sae.b_dec.detach().double().norm()))}",
        ),
        ("format", info.format + (f" ({info.written_by})" if info.written_by else "")),
    ]
    where = [("source", info.source), ("hub id", info.hub_id), ("model", info.model_name), ("hook", info.hook_name)]
    return rows + [(label, str(value)) for label, value in where if value]


def sae_block(sae: SAE) -> str:
    cfg = sae.cfg
    return html_block(f"SAE · {cfg.activation} · {cfg.d_in:,} → {cfg.d_sae:,}", html_table(sae_lines(sae)))


def store_block(store: ActivationStore) -> str:
    """A store's manifest: size, model and hook, how the corpus was read, its shards."""
    state = "complete" if store.complete else "INCOMPLETE (interrupted; rerun the cache command to resume)"
    rows = [
        ("rows", f"{store.n_tokens:,} tokens × d = {store.d} ({store.dtype}), {state}"),
        ("model", str(store.model)),
        ("hook", str(store.hook)),
        *[(f"corpus.{k}", str(v)) for k, v in store.corpus.items() if k != "files"],
        ("shards", f"{len(store.shards)} files, {sum(s.bytes for s in store.shards):,} bytes"),
    ]
    return html_block(f"activation store {store.path}", html_table(rows))


BLOCKS: dict[type, Any] = {
    GeometryReport: report_block,
    SAEGeometry: section_block,
    DictionaryCheck: check_block,
    LayerSweep: sweep_block,
    LatentCard: card_block,
    SAE: sae_block,
    ActivationStore: store_block,
    Comparison: compare_block,
}


def html_of(obj: Any) -> str:
    """The notebook block of a result (TypeError for anything else)."""
    for cls, block in BLOCKS.items():
        if isinstance(obj, cls):
            return block(obj)
    raise TypeError(f"saegeo has no notebook display for {type(obj).__name__}")
