"""Every text, Markdown, HTML and figure output saegeo writes, for every command (above saegeo.report: it reads
the results, it computes nothing).

    from saegeo.report import geometry_report
    from saegeo.render import render_terminal, write_report
    report = geometry_report(store_or_tensor, sae=sae_or_dir)
    print(render_terminal(report)); write_report(report, "artifacts/report")

base.py     number formats, flag blocks, the HTML page skeleton, PNG bytes, the writer of rendering files
report.py   the report page (terminal, Markdown, JSON, HTML, figures); write_report writes either page
latents.py  latent cards and the per-latent table: latents.json / latents.csv, terminal, Markdown, HTML
check.py    the dictionary check page (`saegeo check` without activations)
sweep.py    the layer sweep's table, Markdown, HTML and figure; write_sweep
text.py     the terminal text of geometry, eval, train, cache, store, synth, run; cache exclusions, artifact test
notebook.py what a notebook shows for a result (its _repr_html_): the pages' parts as one scoped, self-contained block
"""

from saegeo.render.base import FORMATS, rendering_paths
from saegeo.render.check import render_check_html, render_check_markdown, render_check_terminal
from saegeo.render.latents import (
    latents_csv,
    latents_document,
    render_latents_html,
    render_latents_markdown,
    render_latents_terminal,
    write_latents,
)
from saegeo.render.report import (
    FIGURE_NAMES,
    figures,
    render_html,
    render_json,
    render_markdown,
    render_terminal,
    report_figures,
    write_report,
)
from saegeo.render.sweep import (
    SWEEP_FORMATS,
    render_sweep_html,
    render_sweep_markdown,
    render_sweep_terminal,
    sweep_plot,
    write_sweep,
)
from saegeo.render.text import (
    exclusion_lines,
    geometry_summary,
    render_cache,
    render_eval,
    render_geometry,
    render_run,
    render_store,
    render_sweep_cache,
    render_synth,
    render_train,
    render_written,
)

__all__ = [
    "FORMATS",
    "rendering_paths",
    "render_check_html",
    "render_check_markdown",
    "render_check_terminal",
    "latents_csv",
    "latents_document",
    "render_latents_html",
    "render_latents_markdown",
    "render_latents_terminal",
    "write_latents",
    "FIGURE_NAMES",
    "figures",
    "render_html",
    "render_json",
    "render_markdown",
    "render_terminal",
    "report_figures",
    "write_report",
    "SWEEP_FORMATS",
    "render_sweep_html",
    "render_sweep_markdown",
    "render_sweep_terminal",
    "sweep_plot",
    "write_sweep",
    "exclusion_lines",
    "geometry_summary",
    "render_cache",
    "render_eval",
    "render_geometry",
    "render_run",
    "render_store",
    "render_sweep_cache",
    "render_synth",
    "render_train",
    "render_written",
]
