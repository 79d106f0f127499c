"""The decoder spectrum's power law (dictionary_geometry): a planted α recovered, the fit equal to numpy's."""

import math

import numpy as np
import pytest
import torch

from saegeo.geometry.dictionary import dictionary_geometry


def _planted(alpha: float, n: int = 20_000, d: int = 128, seed: int = 0) -> torch.Tensor:
    """Rows with covariance eigenvalues k^−α in a random basis (unit-normalising them bends it only a little)."""
    g = torch.Generator().manual_seed(seed)
    scale = torch.arange(1, d + 1, dtype=torch.float64) ** (-alpha / 2)
    basis = torch.linalg.qr(torch.randn(d, d, generator=g, dtype=torch.float64))[0]
    return ((torch.randn(n, d, generator=g, dtype=torch.float64) * scale) @ basis.T).float()


@pytest.mark.parametrize("alpha", [0.5, 1.5])
def test_planted_power_law_recovered_and_fit_equals_numpy(alpha):
    rows = _planted(alpha)
    spectrum = dictionary_geometry(rows).spectrum
    assert spectrum["power_law_alpha"] == pytest.approx(alpha, abs=0.05)
    # brute force: the unit rows' covariance, its eigenvalues, a least-squares line over the same ranks
    w = rows.double().numpy()
    unit = w / np.linalg.norm(w, axis=1, keepdims=True)
    lam = np.sort(np.linalg.eigvalsh(np.cov(unit.T)))[::-1]
    r = int((lam > 0).sum())
    first, last = math.ceil(0.05 * r), int(0.5 * r)
    x, y = np.log(np.arange(first, last + 1)), np.log(lam[first - 1 : last])
    slope, intercept = np.polyfit(x, y, 1)
    resid = y - slope * x - intercept
    assert spectrum["power_law_ranks"] == [first, last]
    assert spectrum["power_law_alpha"] == pytest.approx(-slope, abs=1e-9)
    assert spectrum["power_law_r2"] == pytest.approx(1 - resid @ resid / ((y - y.mean()) ** 2).sum(), abs=1e-9)
