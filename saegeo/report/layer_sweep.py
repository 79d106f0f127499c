"""The layer sweep (measuring only): one accumulator per store, one row per layer in the model's layer order;
JSON ``layers: [{hook, layer, A, ...}]``. Its renderings are ``saegeo.render.sweep_page``.

``sweep_stores(stores, options=SweepOptions(), *, thresholds=None, cache=None) -> LayerSweep``
``sweep_model(options, *, thresholds=None) -> LayerSweep``   cache options.hooks of options.model in one forward
                                          pass first, then sweep those stores (token types named by the tokenizer).
``layer_row(measures) -> dict``           the row of one store (keys in ROW_DOC).

"layer" is the number of blocks applied before the hook (saegeo.activations.cache.hook_depth): 0 for
blocks.0.hook_resid_pre (the embeddings), L + 1 for blocks.L.hook_resid_post.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from saegeo.activations.cache import hook_depth
from saegeo.activations.store import ActivationStore
from saegeo.errors import BadInputError
from saegeo.io import dump_json, json_safe
from saegeo.progress import progress_bar
from saegeo.report.display import flag_counts, flags_frame, notebook_html, pandas, short
from saegeo.report.flags import Flag, run_flags, sort_flags
from saegeo.report.options import FlagThresholds, SweepOptions
from saegeo.report.store_measures import StoreMeasures, measure_store

SWEEP_SCHEMA_VERSION = 2

ROW_DOC = {
    "hook": "hook name",
    "layer": "blocks applied before the hook",
    "n": "tokens",
    "d": "width",
    "A": "mean pairwise cosine",
    "A_null": "sign-aware null",
    "isotropic_z": "(A − A_null)/√(2/(n(n−1)d))",
    "offset": "‖m̂‖",
    "mean_sq_norm": "‖μ‖²",
    "total_variance": "tr Σ",
    "mean_share": "‖μ‖²/tr S",
    "erank": "effective rank",
    "noise_erank": "erank of isotropic noise of this n, d",
    "top1": "top-1 eigenvalue share",
    "top10": "top-10 share",
    "isoscore": "IsoScore",
    "mp_spikes": "eigenvalues above the calibrated MP edge (None: no flat bulk)",
    "mp_power_law_alpha": "log-log slope of the spectrum when it has no flat MP bulk",
    "null_z": "(A − A_null − finite-d bias) / sd of Â − Â_null",
    "rogue_50": "coordinates carrying 50% of ‖m̂‖²",
    "rogue_90": "… 90%",
    "n_types": "distinct token ids",
    "share_tokens_repeated": "share of tokens whose id is seen ≥ 2 times",
    "between_share": "tr(between)/tr Σ (c/(c−1)-corrected within, averaged over repeated types: singletons take their spread)",
    "within_share": "1 − between_share",
    "between_share_plugin": "plug-in between/tr Σ",
    "norm_variance_corr": "count-weighted corr(‖μ_t‖², var_t)",
    "self_similarity": "token-weighted mean SelfSim_t",
    "self_similarity_adjusted": "… minus A",
    "intra_window": "mean IntraSim over windows (Ethayarajh: mean cos of each token to its window's mean)",
    "intra_window_adjusted": "… minus A",
    "pc1_abs_corr_log_frequency": "|corr(PC1, log token frequency)|",
    "decoder_power_law_alpha": "the layer's SAE (--saes): power-law slope α of its decoder rows' spectrum",
    "decoder_power_law_r2": "R² of that log-log fit",
    "pc1_abs_corr_position": "|corr(PC1, position)|",
    "pc1_abs_corr_norm": "|corr(PC1, ‖x‖)|",
}


@dataclass
class LayerSweep:
    """The sweep: rows in layer order, flags (artifact directions per layer), timings."""

    schema_version: int
    model: str
    layers: list[dict[str, Any]]
    flags: list[Flag]
    seconds: float
    options: dict[str, Any]
    cache: dict[str, Any] | None = None  # how the stores were cached, when the sweep cached them
    notes: list[str] = field(default_factory=list)
    saegeo_version: str = ""

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["flags"] = [f.to_dict() for f in self.flags]
        out["columns"] = ROW_DOC
        return json_safe(out)

    def to_json(self, path: str | os.PathLike | None = None) -> str:
        return dump_json(self.to_dict(), path)

    def __repr__(self) -> str:
        a = [r.get("A") for r in self.layers]
        depth = [str(r["layer"]) for r in self.layers if r.get("layer") is not None]
        span = f"layers {depth[0]}–{depth[-1]}" if depth else f"{len(self.layers)} store(s)"
        return (
            f"<LayerSweep {self.model}: {len(self.layers)} layer(s), {span} · A {short(a[0] if a else None)} → "
            f"{short(a[-1] if a else None)} · flags: {flag_counts(self.flags)}>"
        )

    def _repr_html_(self) -> str:
        return notebook_html(self)

    def to_pandas(self) -> Any:
        """The rows as a DataFrame, one per layer in depth order, the columns of ROW_DOC (the per-layer details
        left out: they are nested)."""
        rows = [{k: v for k, v in r.items() if k != "details"} for r in self.layers]
        return pandas().DataFrame(rows)

    def flags_frame(self) -> Any:
        """The flags as a DataFrame (one row per flag, its evidence as columns)."""
        return flags_frame(self.flags)


def layer_row(m: StoreMeasures) -> dict[str, Any]:
    """One row of the sweep from one store's measures (keys and meanings in ROW_DOC)."""
    g, tt, art = m.geometry, m.token_types, m.artifact
    depth = hook_depth(m.hook)
    a = g.anisotropy
    pc1 = {name: (art["abs"][name][0] if art and art["k"] else None) for name in ("log_frequency", "position", "norm")}
    sub = lambda v: None if v is None or a is None else v - a  # noqa: E731
    row = {
        "hook": m.hook,
        "layer": (int(depth) if depth is not None and depth == int(depth) else depth),
        "path": m.path,
        "model": m.model,
        "n": g.n,
        "d": g.d,
        "A": a,
        "A_null": g.sign.null,
        "isotropic_z": g.isotropic_z,
        "offset": g.offset,
        "mean_sq_norm": g.mean_vector_norm**2,
        "total_variance": g.total_variance,
        "mean_share": g.mean_share_of_second_moment,
        "erank": g.effective_rank,
        "noise_erank": g.noise_effective_rank,
        "top1": g.top1_share,
        "top10": g.top10_share,
        "isoscore": g.isoscore,
        "mp_spikes": g.n_spikes,
        "mp_power_law_alpha": (g.mp_bulk or {}).get("power_law_alpha") if g.n_spikes is None else None,
        "null_z": g.null_z,
        "rogue_50": g.rogue.n_for_50,
        "rogue_90": g.rogue.n_for_90,
        "n_types": tt.n_types if tt else None,
        "share_tokens_repeated": tt.share_tokens_repeated if tt else None,
        "between_share": tt.between_share if tt else None,
        "within_share": tt.within_share if tt else None,
        "between_share_plugin": (tt.between_plugin / tt.total_variance if tt and tt.total_variance > 0 else None),
        "norm_variance_corr": tt.norm_variance_corr if tt else None,
        "self_similarity": tt.self_similarity if tt else None,
        "self_similarity_adjusted": tt.self_similarity_adjusted if tt else None,
        "intra_window": m.intra_window,
        "intra_window_adjusted": sub(m.intra_window),
        **{f"pc1_abs_corr_{k}": v for k, v in pc1.items()},
        "details": {
            "token_types": tt.to_dict() if tt else None,
            "artifact": art,
            "n_windows": m.n_windows,
            "memory_bytes": m.memory_bytes,
            "seconds": m.seconds,
            "notes": m.notes + list(g.notes),
        },
    }
    return row


def _layer_saes(saes: str | None, stores: list[ActivationStore]) -> dict[str, Any] | None:
    """hook -> DIR/<hook> for the stores whose hook has an SAE under ``saes`` (None without --saes); refused when
    the directory is missing or holds an SAE for none of the hooks."""
    if saes is None:
        return None
    from pathlib import Path

    root = Path(saes)
    if not root.is_dir():
        raise BadInputError(f"--saes {saes}: not a directory (expected one SAE per hook, DIR/<hook>)")
    found = {s.hook: root / s.hook for s in stores if (root / s.hook).exists()}
    if not found:
        raise BadInputError(
            f"--saes {saes}: no SAE for any swept hook (looked for {', '.join(s.hook for s in stores)}); name each "
            "layer's SAE directory by its hook"
        )
    return found


def decoder_power_law(sae: Any) -> dict[str, Any]:
    """{decoder_power_law_alpha, decoder_power_law_r2} of an SAE (a path or object): the log-log slope of its decoder
    rows' spectrum, λ_k ∝ k^(−α) (saegeo.geometry.dictionary.dictionary_geometry; Li, Michaud, Tegmark et al. 2025);
    None for both without an SAE."""
    if sae is None:
        return {"decoder_power_law_alpha": None, "decoder_power_law_r2": None}
    from saegeo.geometry.dictionary import dictionary_geometry
    from saegeo.sae.model import SAE

    module = SAE.load(sae) if not hasattr(sae, "W_dec") else sae
    spectrum = dictionary_geometry(module.W_dec.detach().cpu()).spectrum
    return {"decoder_power_law_alpha": spectrum["power_law_alpha"], "decoder_power_law_r2": spectrum["power_law_r2"]}


def _order(stores: list[ActivationStore]) -> list[ActivationStore]:
    models = sorted({s.model for s in stores})
    if len(models) > 1:
        raise BadInputError(
            "the sweep is one model's layers, but these stores come from "
            + ", ".join(f"{s.path} ({s.model})" for s in stores)
            + "; sweep each model separately"
        )
    hooks = [s.hook for s in stores]
    twice = sorted({h for h in hooks if hooks.count(h) > 1})
    if twice:
        raise BadInputError(
            f"hook(s) {twice} given twice: "
            + ", ".join(str(s.path) for s in stores if s.hook in twice)
            + "; pass each layer's store once"
        )
    return sorted(stores, key=lambda s: (hook_depth(s.hook) is None, hook_depth(s.hook) or 0.0, s.hook))


def sweep_stores(
    stores: Sequence[ActivationStore | str | os.PathLike],
    options: SweepOptions | None = None,
    *,
    thresholds: FlagThresholds | None = None,
    cache: dict[str, Any] | None = None,
) -> LayerSweep:
    """Measure every store (see saegeo.report.store_measures.measure_store) and lay the rows out in layer order.
    opts.verify=False reads store paths without their sha256; opts.skip_nonfinite skips and counts NaN/inf rows."""
    from saegeo import __version__

    opts = options or SweepOptions(progress=False)
    batch_rows, max_types, artifact_components, max_tokens = (
        opts.batch_rows,
        opts.max_types,
        opts.artifact_components,
        opts.max_tokens,
    )
    if not stores:
        raise BadInputError("the sweep needs at least one activation store")
    opened = _order([s if isinstance(s, ActivationStore) else ActivationStore(s, verify=opts.verify) for s in stores])
    sae_dirs = _layer_saes(opts.saes, opened)
    t0 = time.perf_counter()
    rows, flags = [], []
    it = opened
    if opts.progress:
        it = progress_bar(opened, desc="sweep", unit="layer")
    for store in it:
        m = measure_store(
            store,
            batch_rows=batch_rows,
            max_types=max_types,
            artifact_components=artifact_components,
            max_tokens=max_tokens,
            skip_nonfinite=opts.skip_nonfinite,
        )
        row = layer_row(m)
        if sae_dirs is not None:
            row.update(decoder_power_law(sae_dirs.get(store.hook)))
        rows.append(row)
        flags += run_flags("artifact", thresholds or opts.thresholds, artifact=m.artifact, subject=store.hook)
    artifact = rows[0]["details"]["artifact"]
    notes = [f"artifact test: {artifact['source']}" if artifact else "artifact test skipped (--artifact-components 0)"]
    options = {
        "batch_rows": batch_rows,
        "max_types": max_types,
        "artifact_components": artifact_components,
        "max_tokens": max_tokens,
        **({"skip_nonfinite": True} if opts.skip_nonfinite else {}),
        **({"saes": opts.saes} if opts.saes is not None else {}),
    }
    return LayerSweep(
        SWEEP_SCHEMA_VERSION,
        opened[0].model,
        rows,
        sort_flags(flags),
        time.perf_counter() - t0,
        options,
        cache=cache,
        notes=notes,
        saegeo_version=__version__,
    )


def sweep_model(options: SweepOptions, *, thresholds: FlagThresholds | None = None) -> LayerSweep:
    """Cache ``options.hooks`` of ``options.model`` in one forward pass (``max_tokens`` tokens; "all-resid":
    blocks.0.hook_resid_pre and every blocks.L.hook_resid_post, or a comma list) under ``cache_dir``, sweep those
    stores, and name the listed token types with the model's tokenizer. ``sweep.cache`` records the caching."""
    from saegeo.activations.cache import CacheConfig, cache_activations, residual_hooks
    from saegeo.activations.models import load_model

    opts = options
    if not opts.model:
        raise BadInputError("sweep_model needs options.model (the model whose hooks are cached first)")
    loaded = load_model(opts.model)
    hooks = (
        residual_hooks(loaded.n_layers)
        if opts.hooks == "all-resid"
        else tuple(h.strip() for h in opts.hooks.split(",") if h.strip())
    )
    cfg = CacheConfig(
        model=opts.model,
        hooks=hooks,
        corpus=opts.corpus,
        context=opts.context,
        out=opts.cache_dir,
        max_tokens=opts.max_tokens,
        progress=opts.progress,
    )
    result = cache_activations(cfg, loaded)
    cache = {
        "model": loaded.name,
        "hooks": list(hooks),
        "corpus": opts.corpus,
        "context": opts.context,
        "out": opts.cache_dir,
        "new_tokens": result.new_tokens,
        "seconds": result.seconds,
    }
    # the cache already stopped at max_tokens
    sweep = sweep_stores(
        [str(result.stores[h]) for h in hooks],
        dataclasses.replace(opts, max_tokens=None),
        thresholds=thresholds,
        cache=cache,
    )
    for row in sweep.layers:  # name the listed token types
        tt = row["details"]["token_types"] or {}
        for entry in tt.get("most_context_specific", []) + tt.get("least_context_specific", []):
            entry["token"] = loaded.tokenizer.convert_ids_to_tokens(int(entry["id"]))
    return sweep
