"""The report: one streaming pass -> GeometryReport, its flags, and its renderings; `saegeo check` pages too.

    from saegeo.report import geometry_report, write_report, render_terminal
    report = geometry_report(store_or_tensor, sae=sae_or_dir)    # or {"name": sae, ...} side by side
    print(render_terminal(report)); write_report(report, "artifacts/report")

report.py   geometry_report -> GeometryReport (one pass)
check.py    check_dictionary / check_with_activations -> DictionaryCheck (a dictionary alone, or with activations);
            activations_match_flags: do the SAE and the activations belong together?
flags.py    each flag: name, severity, evidence, advice
render.py   terminal, Markdown, JSON, HTML of both pages; write_report writes either
layers.py   measure_store / artifact_pass: what a store's token ids and positions add (token types, artifact test)
sweep.py    sweep_stores -> LayerSweep: one row per layer, its table, JSON, Markdown and HTML (`saegeo sweep`)
"""

from saegeo.report.check import (
    CheckOptions, DictionaryCheck, MatchOptions, activations_match_flags, check_dictionary, check_with_activations,
)
from saegeo.report.flags import Flag, FlagThresholds, dictionary_flags
from saegeo.report.render import render_html, render_json, render_markdown, render_terminal, write_report
from saegeo.report.report import GeometryReport, ReportOptions, SAEGeometry, compute_flags, geometry_report

__all__ = [
    "CheckOptions", "DictionaryCheck", "MatchOptions", "activations_match_flags", "check_dictionary", "check_with_activations",
    "Flag", "FlagThresholds", "dictionary_flags", "GeometryReport", "ReportOptions", "SAEGeometry",
    "compute_flags", "geometry_report", "render_html", "render_json", "render_markdown", "render_terminal",
    "write_report",
]
