"""What the first position of each window carries (BOS / attention sinks): its share of ‖μ‖² and tr Σ from the
report's artifact pass, checked against numpy on the same rows, and massive_activations raised on it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from saegeo.activations.store import StoreWriter
from saegeo.report import ReportOptions, geometry_report
from saegeo.report.flags import MASSIVE


def _store(tmp_path, first_scale: float):
    """20 windows of 64 positions, d = 32; position 0 of each window scaled by first_scale."""
    g = torch.Generator().manual_seed(0)
    windows, context, d = 20, 64, 32
    x = torch.randn(windows * context, d, generator=g) + 0.5
    positions = torch.arange(context).repeat(windows)
    x[positions == 0] *= first_scale
    ids = torch.randint(0, 100, (windows * context,), generator=g)
    with StoreWriter(tmp_path / "s", d=d, hook="h", model="m", shard_rows=500) as w:
        w.append(x, token_ids=ids, positions=positions)
    return tmp_path / "s", x.double().numpy(), positions.numpy()


def _brute_shares(x: np.ndarray, first: np.ndarray) -> tuple[float, float]:
    mu = x.mean(0)
    mu_share = float(x[first].sum(0) @ mu) / (len(x) * float(mu @ mu))
    trace_share = float(((x[first] - mu) ** 2).sum()) / float(((x - mu) ** 2).sum())
    return mu_share, trace_share


def test_first_position_shares_equal_numpy_and_raise_massive_activations(tmp_path):
    path, x, pos = _store(tmp_path, first_scale=60.0)
    report = geometry_report(str(path), options=ReportOptions(progress=False, batch_rows=300))
    first = report.artifact["first_position"]
    mu_share, trace_share = _brute_shares(x, pos == 0)
    assert first["rows"] == 20 and first["row_share"] == pytest.approx(20 / len(x))
    assert first["mu_share"] == pytest.approx(mu_share, rel=1e-9)
    assert first["trace_share"] == pytest.approx(trace_share, rel=1e-9)
    [flag] = [f for f in report.flags if f.name == MASSIVE]
    assert flag.evidence["first_position_trace_share"] == pytest.approx(trace_share, abs=1e-4)
    assert "the first position (20 rows" in flag.summary


def test_an_ordinary_first_position_raises_nothing(tmp_path):
    path, x, pos = _store(tmp_path, first_scale=1.0)
    report = geometry_report(str(path), options=ReportOptions(progress=False, batch_rows=300))
    assert report.artifact["first_position"]["trace_share"] == pytest.approx(_brute_shares(x, pos == 0)[1], rel=1e-9)
    assert MASSIVE not in report.flag_names()


def test_a_first_position_below_the_row_rule_still_raises_massive_activations_by_its_share(tmp_path):
    """Position 0 at 8× the other rows: under massive_row_ratio (10× the median norm), but 1.6 % of the rows
    carry over half of tr Σ, so the flag is raised by the first-position rule alone."""
    path, x, pos = _store(tmp_path, first_scale=8.0)
    report = geometry_report(str(path), options=ReportOptions(progress=False, batch_rows=300))
    trace_share = _brute_shares(x, pos == 0)[1]
    assert trace_share > 0.5
    [flag] = [f for f in report.flags if f.name == MASSIVE]
    assert flag.evidence["by_first_position"] and not flag.evidence["by_rows"]
