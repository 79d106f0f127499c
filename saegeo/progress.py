"""The one progress bar of a job (a pass, a cache, a training run): one output redrawn in place in a notebook, a
line on a terminal, nothing elsewhere (a pipe, a log file, a test), where a redrawn bar would print as hundreds of lines.

``progress_bar(iterable=None, *, enabled=True, **tqdm_options)``   a tqdm bar (disabled where it cannot be seen).
``progress_surface() -> "notebook" | "terminal" | None``         where a bar can be seen.
``quiet_tqdm_auto()``                                             tqdm.auto imported without its ipywidgets warning.
"""

from __future__ import annotations

import sys
from typing import Any


def progress_surface() -> str | None:
    """ "notebook" inside a Jupyter kernel, "terminal" when stderr is a terminal, else None."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None and hasattr(ipython, "get_ipython") else None
    if shell is not None and getattr(shell, "kernel", None) is not None:
        return "notebook"
    try:
        return "terminal" if sys.stderr.isatty() else None
    except (AttributeError, ValueError):  # a replaced or closed stderr
        return None


def progress_bar(iterable: Any = None, *, enabled: bool = True, **tqdm_options: Any) -> Any:
    """A tqdm bar for one job: in a notebook one HTML output redrawn in place (`notebook_bar`; no ipywidgets, no
    stderr lines), on a terminal tqdm's text bar, disabled when ``enabled`` is False or nothing would show it. The
    caller updates and closes it as any tqdm; only the outermost job of a command asks for one, so bars never
    nest."""
    surface = progress_surface() if enabled else None
    tqdm_options.setdefault("dynamic_ncols", True)
    if surface == "notebook":
        return notebook_bar()(iterable, **tqdm_options)
    from tqdm.std import tqdm

    return tqdm(iterable, disable=surface is None, **tqdm_options)


def quiet_tqdm_auto() -> None:
    """Import tqdm.auto once with its "IProgress not found" TqdmWarning silenced; call before importing a library
    that imports it at its own import (transformers, transformer_lens, huggingface_hub). In a Jupyter kernel without
    ipywidgets (saegeo's bars need none) tqdm.auto prints that warning into the user's cell, then falls back to
    tqdm.std anyway; once imported it never warns again, and other warnings pass as before."""
    if "tqdm.auto" in sys.modules:
        return
    import warnings

    from tqdm.std import TqdmWarning

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="IProgress not found", category=TqdmWarning)
        import tqdm.auto  # noqa: F401


def notebook_bar() -> type:
    """tqdm drawn as one notebook output, an IPython display handle updated in place: a <progress> element and
    tqdm's own meter text (rate, elapsed, remaining). Saved notebooks keep its last state (100 % when the job
    finished), where a text bar on stderr leaves a red line per redraw. Built on first use: IPython is imported
    only in a kernel."""
    global _NotebookBar
    if _NotebookBar is None:
        import html

        import IPython.display as shown  # looked up at each call: a test (or a front end) may replace display
        from tqdm.std import tqdm

        class NotebookBar(tqdm):
            def __init__(self, *args: Any, **kwargs: Any):
                # gui=True: tqdm keeps time and counts but prints nothing; display() below draws
                super().__init__(*args, **{**kwargs, "gui": True, "file": sys.stdout})
                self._handle = None if self.disable else shown.display(self._html(), display_id=True)

            def display(self, msg: Any = None, pos: Any = None) -> bool:  # what tqdm's refresh() calls
                if getattr(self, "_handle", None) is not None:
                    self._handle.update(self._html())
                return True

            def close(self) -> None:
                if self.disable:
                    return
                super().close()
                self.display()  # the last state stays in the saved notebook

            def _html(self) -> Any:
                d = self.format_dict
                meter = tqdm.format_meter(**{**d, "ncols": 0})  # ncols 0: the numbers, no text bar
                total = d.get("total")
                bar = f"<progress value='{d['n']}' max='{total}'></progress> " if total else ""
                return shown.HTML(
                    f"<div class='saegeo-progress' style='font-family: monospace; font-size: 12px'>{bar}"
                    f"{html.escape(meter)}</div>"
                )

        _NotebookBar = NotebookBar
    return _NotebookBar


_NotebookBar: type | None = None
