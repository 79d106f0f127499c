"""examples/quickstart.ipynb run as a person runs it: a real JupyterLab server, the notebook opened in headless
Chromium, Run All, and what JupyterLab then displays read from the page (not from a saved file): every cell ran in
order without an error or a red stderr line, each job's progress one bar left at 100 %, the report's flags and
numbers as the report.json the notebook wrote says, the DataFrame, the latent card with its marked token, the figure
decoded, nothing wider than the notebook, no console error. Screenshots of the displayed results go to
$SAEGEO_SCREENSHOTS when set (for a person to look at), else to the test's tmp folder.

Skipped when Chromium/chromedriver or jupyterlab is not installed; tests/project/test_notebook.py runs the same
notebook through nbclient and opens nbconvert's rendering."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
from pathlib import Path

import pytest

from tests.browser_helpers import Browser, JupyterLab, browser_missing

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "examples" / "quickstart.ipynb"
MISSING = browser_missing() or (None if importlib.util.find_spec("jupyterlab") else "jupyterlab not installed")
PANEL = "Array.from(jupyterapp.shell.widgets('main')).find(w => w.sessionContext)"
KERNEL_IDLE = (
    f"(() => {{ const p = {PANEL}; const k = p && p.sessionContext.session && p.sessionContext.session.kernel;"
)
KERNEL_IDLE += " return !!k && k.status === 'idle'; })()"
ALL_RAN = f"(() => {{ const p = {PANEL}; const cells = p.content.widgets.filter(c => c.model.type === 'code');"
ALL_RAN += " return p.sessionContext.session.kernel.status === 'idle'"
ALL_RAN += " && cells.every(c => c.model.executionCount !== null && !c.promptNode.textContent.includes('*')); })()"
# per code cell: its source, execution count, outputs as the model holds them (streams' text, output types), and
# what its output area shows: text, progress bars (value, max), DataFrame headers, marks, decoded images, overflow
CELLS = f"""const p = {PANEL};
return p.content.widgets.filter(c => c.model.type === 'code').map(c => {{
  const area = c.node.querySelector('.jp-OutputArea');
  const outs = c.model.outputs.toJSON();
  return {{
    source: c.model.sharedModel.getSource(), count: c.model.executionCount,
    types: outs.map(o => o.output_type),
    stderr: outs.filter(o => o.output_type === 'stream' && o.name === 'stderr').map(o => String(o.text)),
    text: area ? area.innerText : '',
    bars: area ? [...area.querySelectorAll('.saegeo-progress')].map(d => {{
      const b = d.querySelector('progress'); return {{text: d.innerText, value: b && b.value, max: b && b.max}}; }}) : [],
    frame_headers: area ? [...area.querySelectorAll('table.dataframe th')].map(t => t.innerText) : [],
    marks: area ? area.querySelectorAll('mark').length : 0,
    images: area ? [...area.querySelectorAll('img')].map(i => i.complete && i.naturalWidth > 0) : [],
  }};
}});"""


def _cell(cells: list[dict], needle: str) -> dict:
    [cell] = [c for c in cells if needle in c["source"]]
    return cell


def _shoot(b: Browser, needle: str, path: Path) -> None:
    """A screenshot of the window with the code cell whose source holds ``needle`` scrolled to its top."""
    b.js(
        f"const p = {PANEL}; const c = p.content.widgets.find(c => c.model.sharedModel.getSource().includes(arguments[0]));"
        " c.node.scrollIntoView({block: 'start'});",
        needle,
    )
    b.screenshot(path, full_page=False)


@pytest.mark.skipif(MISSING is not None, reason=str(MISSING))
def test_the_quickstart_runs_in_jupyterlab_and_displays_its_results(tmp_path):
    work = tmp_path / "root"
    work.mkdir()
    shutil.copy(NOTEBOOK, work / NOTEBOOK.name)
    shots = Path(os.environ.get("SAEGEO_SCREENSHOTS") or tmp_path)
    env = {"PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]), "OMP_NUM_THREADS": "1"}
    with JupyterLab(work, env) as lab, Browser(timeout=120) as b:
        b.open(lab.url(NOTEBOOK.name))
        assert b.wait_for(KERNEL_IDLE, timeout=300), "the notebook did not open with an idle kernel"
        b.js(
            f"const p = {PANEL}; jupyterapp.shell.activateById(p.id); jupyterapp.commands.execute('notebook:run-all-cells');"
        )
        assert b.wait_for(ALL_RAN, timeout=1200), "Run All did not finish"
        cells = b.js(CELLS)
        overflow = b.js(f"const n = {PANEL}.content.node; return [n.scrollWidth, n.clientWidth];")
        errors = b.errors()
        for needle in ("\nreport", "saegeo.check(", "sort_values", "report.saes[0].cards", "report_figures"):
            _shoot(b, needle, shots / f"quickstart-jupyterlab-{needle.strip().split('(')[0].split('.')[-1]}.png")

    assert [c["count"] for c in cells] == list(range(1, len(cells) + 1))  # every cell ran, in order
    for c in cells:
        assert "error" not in c["types"], (c["source"], c["text"][-2000:])
        assert c["stderr"] == [], (c["source"], c["stderr"])  # no red line: no warning, no text bar
    for needle, job in (
        ("saegeo.cache(", "cache"),
        ("saegeo.train(", "train"),
        ("geometry_report(", "report"),
        ("saegeo.check(", "dup"),
    ):
        bars = [bar for bar in _cell(cells, needle)["bars"] if job in bar["text"]]
        assert len(bars) == 1 and bars[0]["value"] == bars[0]["max"] > 0, (needle, bars)
    saved = json.loads((work / "quickstart" / "report" / "report.json").read_text())
    shown = _cell(cells, "write_report(")["text"]
    assert saved["flags"]
    for flag in saved["flags"]:
        assert flag["name"] in shown and flag["advice"].split(".")[0] in shown, flag["name"]
    assert f"A = {saved['activations']['anisotropy']:.3f}" in shown
    assert f"{saved['saes'][0]['fve']:.3f}" in shown
    assert "cone_share" in _cell(cells, "sort_values")["frame_headers"]
    assert _cell(cells, "report.saes[0].cards")["marks"] >= 1  # the activating token marked in its context
    assert _cell(cells, "report_figures")["images"] == [True]
    assert overflow[0] <= overflow[1], overflow  # the notebook never scrolls sideways
    assert errors == [], errors
