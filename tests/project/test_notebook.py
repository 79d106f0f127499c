"""examples/quickstart.ipynb runs in a real Jupyter kernel (nbclient, ipykernel) as a user runs it: every cell
without an error, each cell showing what its tag says (``shows-html``: an HTML display; ``shows-png``: an inline
image; ``shows-text``: a one-line repr), the report's display carrying the flags and numbers of the report.json
the notebook wrote; then the notebook as nbconvert renders it (JupyterLab's template) is opened in headless
Chromium: no sideways scrolling at 1400 px, no console error, every image decoded, the latent table's script run."""

from __future__ import annotations

import base64
import html
import json
import os
from pathlib import Path

import pytest

from tests.browser_helpers import Browser, browser_missing

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")
pytest.importorskip("nbconvert")

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "examples" / "quickstart.ipynb"
MAX_REPR = 2000


@pytest.fixture(scope="module")
def executed(tmp_path_factory) -> tuple[object, Path]:
    """The notebook executed in a fresh kernel whose working directory is a new folder (where it writes)."""
    cwd = tmp_path_factory.mktemp("notebook")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    env["OMP_NUM_THREADS"] = "1"
    client = nbclient.NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(cwd)}})
    client.execute(env=env)  # raises CellExecutionError naming the cell on any error
    return nb, cwd


def _is_progress(output) -> bool:
    return "class='saegeo-progress'" in output.get("data", {}).get("text/html", "")


def _data(cell) -> dict:
    """The cell's display data merged over its outputs (execute_result and display_data), progress bars aside."""
    out: dict = {}
    for o in cell.get("outputs", []):
        if o["output_type"] in ("execute_result", "display_data") and not _is_progress(o):
            out.update(o["data"])
    return out


def test_progress_is_one_output_per_job_redrawn_in_place(executed):
    """Each job's progress (cache, train, report, the check's duplicate search) is one HTML output the kernel
    updated in place (a display handle), left at its last state, 100 %; no bar is written to stderr, where a text
    bar leaves a red line per redraw (a library's own warning there is not saegeo's)."""
    nb, _ = executed
    import re

    cells = [c for c in nb.cells if c.cell_type == "code"]
    for c in cells:
        stderr = [o["text"] for o in c.get("outputs", []) if o["output_type"] == "stream" and o["name"] == "stderr"]
        assert not [t for t in stderr if "%|" in t or "it/s]" in t or "tok/s]" in t], (c.source, stderr)
    jobs = {"saegeo.cache(": "cache", "saegeo.train(": "train", "geometry_report(": "report", "saegeo.check(": "dup"}
    for call, desc in jobs.items():
        [cell] = [c for c in cells if call in c.source]
        bars = [o["data"]["text/html"] for o in cell.outputs if _is_progress(o)]
        mine = [b for b in bars if desc in b]
        assert len(mine) == 1, (call, bars)
        value, top = re.search(r"<progress value='(\d+)' max='(\d+)'>", mine[0]).groups()
        assert value == top, (call, mine[0])  # finished: the saved notebook shows the last state


def test_every_cell_runs_and_shows_what_it_should(executed):
    nb, cwd = executed
    cells = [c for c in nb.cells if c.cell_type == "code"]
    assert len(cells) >= 8
    for c in cells:
        errors = [o for o in c.get("outputs", []) if o["output_type"] == "error"]
        assert not errors, (c.source, errors)
        data = _data(c)
        [tag] = [t for t in c.metadata.get("tags", []) if t.startswith("shows-")]
        assert "text/plain" in data, c.source
        assert len(data["text/plain"]) < MAX_REPR and "object at 0x" not in data["text/plain"], c.source
        if tag == "shows-html":
            assert "<" in data.get("text/html", ""), c.source
            assert "http://" not in data["text/html"] and "https://" not in data["text/html"], c.source
        elif tag == "shows-png":
            assert base64.b64decode(data["image/png"]).startswith(b"\x89PNG"), c.source
        else:
            assert tag == "shows-text" and "text/html" not in data, c.source


def test_the_report_shown_is_the_report_written(executed):
    nb, cwd = executed
    saved = json.loads((cwd / "quickstart" / "report" / "report.json").read_text())
    [shown] = [_data(c) for c in nb.cells if c.cell_type == "code" and c.source.rstrip().endswith("\nreport")]
    block = shown["text/html"]
    assert saved["flags"], "the quickstart's SAE raises flags"
    for f in saved["flags"]:
        assert f"<code>{html.escape(f['name'])}</code>" in block and html.escape(f["advice"]) in block
    a = saved["activations"]["anisotropy"]
    assert f"A = {a:.3f}" in block and f"A = {a:.3f}" in shown["text/plain"]
    assert f"<td class='l'>FVE (all rows)</td><td>{saved['saes'][0]['fve']:.3f}</td>" in block
    [frame] = [_data(c) for c in nb.cells if "sort_values" in c.source]
    assert "cone_share" in frame["text/html"]
    [card] = [_data(c) for c in nb.cells if "report.saes[0].cards" in c.source]
    assert "<mark title=" in card["text/html"]  # its top contexts, the activating token marked


def notebook_page(nb) -> str:
    """The executed notebook as nbconvert renders it (JupyterLab's template and style sheet around the outputs).
    The template's CDN scripts (require.js, MathJax, mermaid) are replaced by empty inline ones: nothing is
    fetched, and the page shows only what saegeo's outputs bring."""
    from nbconvert import HTMLExporter

    empty = "data:text/javascript,"
    urls = ("require_js_url", "mathjax_url", "mermaid_js_url", "mermaid_layout_elk_js_url")
    page, _ = HTMLExporter(template_name="lab", **dict.fromkeys(urls, empty)).from_notebook_node(nb)
    return page


@pytest.mark.skipif(browser_missing() is not None, reason=str(browser_missing()))
def test_the_notebook_opens_in_a_browser_without_overflow_or_error(executed, tmp_path):
    nb, _ = executed
    page = tmp_path / "quickstart.html"
    page.write_text(notebook_page(nb))
    with Browser() as b:
        b.open(page)
        width = b.overflow()
        assert width["scrollWidth"] <= width["innerWidth"], width
        assert b.errors() == []
        assert b.js("return [...document.images].filter(i => !i.complete || i.naturalWidth === 0).length") == 0
        assert b.wait_for("document.querySelectorAll('.latents tbody tr').length > 0")  # the table's script ran
        if os.environ.get("SAEGEO_SCREENSHOTS"):  # for a person to look at
            b.screenshot(Path(os.environ["SAEGEO_SCREENSHOTS"]) / "quickstart-notebook.png")
