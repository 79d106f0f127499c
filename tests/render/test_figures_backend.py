"""Figures are matplotlib Figures made without pyplot: every figure call leaves the caller's backend and rcParams
as they were (a notebook's inline backend is not switched to Agg), and each Figure shows itself as PNG."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

# Run in a fresh interpreter: the backend state of this test process is whatever earlier tests left.
SCRIPT = textwrap.dedent(
    """
    import sys
    import matplotlib
    import torch

    def state():
        # dict.__getitem__: reading rcParams["backend"] through RcParams would itself resolve (switch) the backend
        return {k: dict.__getitem__(matplotlib.rcParams, k) for k in matplotlib.rcParams.keys()}

    before = state()
    from saegeo.render.report_page import FIGURES, figures, report_figures
    from saegeo.render.sweep_page import sweep_figure, sweep_plot
    from saegeo.report import ReportOptions, geometry_report
    from saegeo.report.layer_sweep import LayerSweep
    from saegeo.sae.model import SAE, SAEConfig

    g = torch.Generator().manual_seed(0)
    x = torch.randn(600, 8, generator=g) + 2.0
    sae = SAE(SAEConfig(d_in=8, d_sae=16, activation="topk", k=2)).init_weights(torch.Generator().manual_seed(1))
    report = geometry_report(x, {"s": sae}, options=ReportOptions(progress=False, latent_cards=False))
    report.saes[0].training_curve = {"tokens": [10, 20], "loss": [2.0, 1.0], "fve": [0.1, 0.3], "l0": [2, 2]}
    rows = [{"layer": L, "hook": f"b{L}", "n": 10, "A": 0.1 * L, "A_null": 0.01, "offset": 0.5} for L in (1, 2)]
    sweep = LayerSweep(1, "m", rows, [], 0.0, {})
    calls = [(name, lambda make=make: make(report)) for name, make in FIGURES.items()]
    calls += [("report_figures", lambda: report_figures(report)), ("figures", lambda: figures(report))]
    calls += [("sweep_plot", lambda: sweep_plot(sweep)), ("sweep_figure", lambda: sweep_figure(sweep))]
    for name, call in calls:
        made = call()
        after = state()
        changed = sorted(k for k in before if before[k] != after[k])
        assert not changed, (name, changed, [after[k] for k in changed])
        assert "matplotlib.pyplot" not in sys.modules, name
        if name in FIGURES or name == "sweep_plot":
            from matplotlib.figure import Figure

            assert isinstance(made, Figure), name
            assert made._repr_png_().startswith(bytes.fromhex("89504e470d0a1a0a")), name
            assert state() == before, name
    print("ok", len(calls), repr(before["backend"]))
    """
)


def test_every_figure_call_leaves_backend_and_rcparams_alone():
    """matplotlib's own default state (no backend chosen yet, as in a fresh kernel before pyplot): any
    matplotlib.use, pyplot import or rcParams write by a figure function shows as a change."""
    env = {k: v for k, v in os.environ.items() if k != "MPLBACKEND"}
    done = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("ok 10"), done.stdout
