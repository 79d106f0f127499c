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

from saegeo.config import lazy_exports

# name -> its module, imported on first use (saegeo.config.lazy_exports): `import saegeo.render.X` stays light
_EXPORTS = {
    "FORMATS": "saegeo.render.common",
    "rendering_paths": "saegeo.render.common",
    "render_check_html": "saegeo.render.check_page",
    "render_check_markdown": "saegeo.render.check_page",
    "render_check_terminal": "saegeo.render.check_page",
    "latents_csv": "saegeo.render.latents_page",
    "latents_document": "saegeo.render.latents_page",
    "render_latents_html": "saegeo.render.latents_page",
    "render_latents_markdown": "saegeo.render.latents_page",
    "render_latents_terminal": "saegeo.render.latents_page",
    "write_latents": "saegeo.render.latents_page",
    "FIGURE_NAMES": "saegeo.render.report_page",
    "figures": "saegeo.render.report_page",
    "render_html": "saegeo.render.report_page",
    "render_json": "saegeo.render.report_page",
    "render_markdown": "saegeo.render.report_page",
    "render_terminal": "saegeo.render.report_page",
    "report_figures": "saegeo.render.report_page",
    "write_report": "saegeo.render.report_page",
    "SWEEP_FORMATS": "saegeo.render.sweep_page",
    "render_sweep_html": "saegeo.render.sweep_page",
    "render_sweep_markdown": "saegeo.render.sweep_page",
    "render_sweep_terminal": "saegeo.render.sweep_page",
    "sweep_plot": "saegeo.render.sweep_page",
    "write_sweep": "saegeo.render.sweep_page",
    "exclusion_lines": "saegeo.render.text",
    "geometry_summary": "saegeo.render.text",
    "render_cache": "saegeo.render.text",
    "render_eval": "saegeo.render.text",
    "render_geometry": "saegeo.render.text",
    "render_run": "saegeo.render.text",
    "render_store": "saegeo.render.text",
    "render_sweep_cache": "saegeo.render.text",
    "render_synth": "saegeo.render.text",
    "render_train": "saegeo.render.text",
    "render_written": "saegeo.render.text",
}
__all__ = list(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
