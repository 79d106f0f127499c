"""The report: one streaming pass -> GeometryReport and its flags; `saegeo check`, `saegeo geometry` and the
sweep as library calls. Their renderings are ``saegeo.render``.

    from saegeo.report import geometry_report
    from saegeo.render import write_report, render_terminal
    report = geometry_report(store_or_tensor, sae=sae_or_dir)    # or {"name": sae, ...} side by side
    print(render_terminal(report)); write_report(report, "artifacts/report")

report.py   geometry_report -> GeometryReport (one pass)
check.py    check_dictionary / check_with_activations -> DictionaryCheck (a dictionary alone, or with activations);
            activations_match_flags: do the SAE and the activations belong together? sae_verdict: the one
            verdict (dictionary-only flags + the match) that check --acts, report --sae and latents take
flags/      the flag registry: one module per flag (name, quantities read, thresholds, severity bands)
geometry.py files_geometry -> FilesGeometry: `saegeo geometry` (one accumulator over files or stores, flags)
latents.py  latent cards: top contexts, histogram, neighbours of the latents flags name; the per-latent table;
            LatentsOptions of `saegeo latents` (report.latents_report runs its pass)
layers.py   measure_store / artifact_pass: what a store's token ids and positions add (token types, artifact test)
sweep.py    sweep_stores / sweep_model -> LayerSweep: one row per layer (`saegeo sweep`)
"""

from saegeo.config import lazy_exports

# name -> its module, imported on first use (saegeo.config.lazy_exports): `import saegeo.report.X` stays light
_EXPORTS = {
    "CheckOptions": "saegeo.report.options",
    "DictionaryCheck": "saegeo.report.dictionary_check",
    "MatchOptions": "saegeo.report.options",
    "activations_match_flags": "saegeo.report.dictionary_check",
    "check_dictionary": "saegeo.report.dictionary_check",
    "check_with_activations": "saegeo.report.dictionary_check",
    "sae_verdict": "saegeo.report.dictionary_check",
    "Flag": "saegeo.report.flags",
    "FlagThresholds": "saegeo.report.options",
    "dictionary_flags": "saegeo.report.flags",
    "GeometryReport": "saegeo.report.geometry_report",
    "ReportOptions": "saegeo.report.options",
    "SAEGeometry": "saegeo.report.geometry_report",
    "compute_flags": "saegeo.report.geometry_report",
    "geometry_report": "saegeo.report.geometry_report",
    "LatentsOptions": "saegeo.report.options",
    "latents_report": "saegeo.report.geometry_report",
}
__all__ = list(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
