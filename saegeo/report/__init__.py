"""The report: one streaming pass -> GeometryReport, its flags, and its renderings.

    from saegeo.report import geometry_report, write_report, render_terminal
    report = geometry_report(store_or_tensor, sae=sae_or_dir)    # or {"name": sae, ...} side by side
    print(render_terminal(report)); write_report(report, "artifacts/report")
"""

from saegeo.report.flags import Flag, FlagThresholds, dictionary_flags
from saegeo.report.render import render_html, render_json, render_markdown, render_terminal, write_report
from saegeo.report.report import GeometryReport, ReportOptions, SAEGeometry, compute_flags, geometry_report

__all__ = [
    "Flag", "FlagThresholds", "dictionary_flags", "GeometryReport", "ReportOptions", "SAEGeometry",
    "compute_flags", "geometry_report", "render_html", "render_json", "render_markdown", "render_terminal",
    "write_report",
]
