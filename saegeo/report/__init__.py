"""The report: one streaming pass -> GeometryReport and its flags; `saegeo check`, `saegeo geometry` and the
sweep as library calls. Their renderings are ``saegeo.render``.

    from saegeo.report import geometry_report
    from saegeo.render import write_report, render_terminal
    report = geometry_report(store_or_tensor, sae=sae_or_dir)    # or {"name": sae, ...} side by side
    print(render_terminal(report)); write_report(report, "artifacts/report")

report.py   geometry_report -> GeometryReport (one pass)
check.py    check_dictionary / check_with_activations -> DictionaryCheck (a dictionary alone, or with activations);
            activations_match_flags: do the SAE and the activations belong together?
flags.py    each flag: name, severity, evidence, advice
geometry.py files_geometry -> FilesGeometry: `saegeo geometry` (one accumulator over files or stores, flags)
latents.py  latent cards: top contexts, histogram, neighbours of the latents flags name; the per-latent table;
            LatentsOptions of `saegeo latents` (report.latents_report runs its pass)
layers.py   measure_store / artifact_pass: what a store's token ids and positions add (token types, artifact test)
sweep.py    sweep_stores / sweep_model -> LayerSweep: one row per layer (`saegeo sweep`)
"""

from saegeo.report.check import (
    CheckOptions,
    DictionaryCheck,
    MatchOptions,
    activations_match_flags,
    check_dictionary,
    check_with_activations,
)
from saegeo.report.flags import Flag, FlagThresholds, dictionary_flags
from saegeo.report.latents import LatentsOptions
from saegeo.report.report import (
    GeometryReport,
    ReportOptions,
    SAEGeometry,
    compute_flags,
    geometry_report,
    latents_report,
)

__all__ = [
    "CheckOptions",
    "DictionaryCheck",
    "MatchOptions",
    "activations_match_flags",
    "check_dictionary",
    "check_with_activations",
    "Flag",
    "FlagThresholds",
    "dictionary_flags",
    "GeometryReport",
    "ReportOptions",
    "SAEGeometry",
    "compute_flags",
    "geometry_report",
    "LatentsOptions",
    "latents_report",
]
