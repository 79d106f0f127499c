"""saegeo: the geometry of transformer activations and of sparse-autoencoder dictionaries.

    import saegeo
    store = saegeo.ActivationStore("acts/blocks.3.hook_resid_post")
    sae = saegeo.SAE.load("sae")                 # a directory, any published format, a hub or release id, an object
    report = saegeo.geometry_report(store, {"mine": sae})
    report                                       # in a notebook: flags, tables, latents, figures
    report.latents("mine").sort_values("cone_share", ascending=False)

Every name below is imported on first use (module ``__getattr__``): ``import saegeo`` loads neither torch nor
matplotlib, so the command line starts fast and a notebook pays only for what it touches.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# public name -> (module, attribute): what the README's Python section uses, one way to do each thing
_EXPORTS: dict[str, tuple[str, str]] = {
    # SAEs: the one loader is SAE.load (path, hub id, release/sae_id, a peer library's object)
    "SAE": ("saegeo.sae.model", "SAE"),
    "SAEConfig": ("saegeo.sae.model", "SAEConfig"),
    # activations
    "ActivationStore": ("saegeo.activations.store", "ActivationStore"),
    "write_store": ("saegeo.activations.store", "write_store"),
    "cache": ("saegeo.activations.cache", "cache_activations"),
    "CacheConfig": ("saegeo.activations.cache", "CacheConfig"),
    # the activation geometry, streamed
    "GeometryAccumulator": ("saegeo.geometry", "GeometryAccumulator"),
    "activation_geometry": ("saegeo.geometry", "activation_geometry"),
    # reports and the checks, sweeps and latents beside them
    "geometry_report": ("saegeo.report.geometry_report", "geometry_report"),
    "ReportOptions": ("saegeo.report.geometry_report", "ReportOptions"),
    "load_report": ("saegeo.report.geometry_report", "load_report"),
    "check": ("saegeo.report.dictionary_check", "check_dictionary"),
    "sweep": ("saegeo.report.layer_sweep", "sweep_stores"),
    "latents": ("saegeo.report.geometry_report", "latents_report"),
    # training and evaluation
    "train": ("saegeo.sae.train", "train_sae"),
    "TrainConfig": ("saegeo.sae.options", "TrainConfig"),
    "eval": ("saegeo.sae.evaluate", "splice_eval"),
    "EvalConfig": ("saegeo.sae.options", "EvalConfig"),
    # files and figures
    "write_report": ("saegeo.render", "write_report"),
    "report_figures": ("saegeo.render", "report_figures"),
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'saegeo' has no attribute {name!r}")
    module, attribute = _EXPORTS[name]
    value = getattr(importlib.import_module(module), attribute)
    globals()[name] = value  # the next access is a plain lookup
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
