"""Progress bars show where someone can see them: a notebook kernel or a terminal; in a pipe, a log or a test
they print nothing (a redrawn bar in a log file is hundreds of lines)."""

from __future__ import annotations

import io
import sys
import types

import torch

from saegeo.progress import progress_bar, progress_surface
from saegeo.report import geometry_report


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _run_bar() -> None:
    bar = progress_bar(total=10, desc="job")
    bar.update(10)
    bar.close()


def test_a_bar_shows_on_a_terminal_and_in_a_kernel_only(monkeypatch):
    monkeypatch.delitem(sys.modules, "IPython", raising=False)
    piped = io.StringIO()
    monkeypatch.setattr(sys, "stderr", piped)
    assert progress_surface() is None
    _run_bar()
    assert piped.getvalue() == ""

    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    assert progress_surface() == "terminal"
    _run_bar()
    assert "job" in terminal.getvalue() and "10/10" in terminal.getvalue()
    assert progress_bar(total=1, enabled=False).disable  # a caller that turned progress off

    kernel_out = io.StringIO()  # a kernel's stderr is no terminal, yet the notebook shows the bar
    monkeypatch.setattr(sys, "stderr", kernel_out)
    shell = types.SimpleNamespace(kernel=object())
    monkeypatch.setitem(sys.modules, "IPython", types.SimpleNamespace(get_ipython=lambda: shell))
    assert progress_surface() == "notebook"


def test_a_report_with_progress_on_prints_nothing_into_a_pipe(capfd):
    x = torch.randn(500, 8, generator=torch.Generator().manual_seed(0))
    geometry_report(x)  # progress is on by default
    assert capfd.readouterr().err == ""


def test_in_a_notebook_a_bar_is_one_output_redrawn_in_place(monkeypatch, capfd):
    """In a kernel the bar is one HTML output (an IPython display handle) updated in place and left at its last
    state, not text on stderr; a disabled bar shows nothing. (The real kernel: tests/project/test_notebook.py.)"""
    import IPython.display

    shown, updates = [], []

    class Handle:
        def update(self, obj):
            updates.append(obj.data)

    def display(obj, display_id=False):
        shown.append((obj.data, display_id))
        return Handle()

    monkeypatch.setattr(IPython.display, "display", display)
    shell = types.SimpleNamespace(kernel=object())
    monkeypatch.setattr(IPython, "get_ipython", lambda: shell)
    assert progress_surface() == "notebook"
    bar = progress_bar(total=10, desc="job", unit="tok")
    bar.update(4)
    bar.update(6)
    bar.close()
    [(first, display_id)] = shown
    assert display_id is True and "<progress value='0' max='10'>" in first
    assert "saegeo-progress" in updates[-1] and "<progress value='10' max='10'>" in updates[-1]
    assert "job" in updates[-1] and "10/10" in updates[-1]
    captured = capfd.readouterr()
    assert captured.err == "" and captured.out == ""
    progress_bar(total=3, enabled=False).close()
    assert len(shown) == 1


# a kernel as tqdm.autonotebook recognises one (ipykernel.zmqshell and IPython imported), with ipywidgets absent
_FAKE_KERNEL = """import sys, types, IPython
sys.modules["ipywidgets"] = None
sys.modules["ipykernel.zmqshell"] = types.ModuleType("ipykernel.zmqshell")
"""


def _stderr_of(code: str) -> str:
    import os
    import subprocess
    from pathlib import Path

    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", _FAKE_KERNEL + code], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    return done.stderr


def test_loading_a_model_in_a_notebook_prints_no_tqdm_warning():
    """The quickstart's cache cell loads the model: transformers imports tqdm.auto, which in a kernel without
    ipywidgets printed "TqdmWarning: IProgress not found" into the cell. saegeo imports it quietly first."""
    assert "IProgress not found" in _stderr_of("import tqdm.auto")  # the fake kernel is one tqdm warns in
    stderr = _stderr_of("import saegeo.activations.models as m; m._quiet_transformers(); import tqdm.auto")
    assert "TqdmWarning" not in stderr and "IProgress" not in stderr, stderr
