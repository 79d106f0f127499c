"""The one progress bar of a job (a pass, a cache, a training run): a widget in a notebook, a line on a terminal,
nothing elsewhere (a pipe, a log file, a test), where a redrawn bar would print as hundreds of lines.

``progress_bar(iterable=None, *, enabled=True, **tqdm_options)``   a tqdm bar (disabled where it cannot be seen).
``progress_surface() -> "notebook" | "terminal" | None``         where a bar can be seen.
"""

from __future__ import annotations

import importlib.util
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
    """A tqdm bar for one job: tqdm.auto's choice (the notebook widget when ipywidgets is installed, else the
    text bar, which a notebook's output redraws in place too), disabled when ``enabled`` is False or nothing
    would show it. The caller updates and closes it as any tqdm; only the outermost job of a command asks for
    one, so bars never nest."""
    surface = progress_surface() if enabled else None
    if surface == "notebook" and importlib.util.find_spec("ipywidgets") is not None:
        from tqdm.notebook import tqdm
    else:
        from tqdm.std import tqdm
    tqdm_options.setdefault("dynamic_ncols", True)
    return tqdm(iterable, disable=surface is None, **tqdm_options)
