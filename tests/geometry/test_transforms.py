"""Transforms fitted from an accumulator: what they do to the data, what they report, their inverses."""

import math

import numpy as np
import pytest
import torch

from saegeo.errors import BadInputError
from saegeo.geometry.accumulate import GeometryAccumulator
from saegeo.geometry.transforms import AllButTheTop, Centering, Whitening


def _data(seed=0, n=2000, d=8):
    rng = np.random.default_rng(seed)
    scales = np.geomspace(10, 0.1, d)
    q, _ = np.linalg.qr(rng.normal(size=(d, d)))
    x = (rng.normal(size=(n, d)) * scales) @ q.T + 3 * rng.normal(size=d)
    acc = GeometryAccumulator(d)
    for part in np.array_split(x, 4):
        acc.add(part)
    return x, acc


def _cov(y):
    y = np.asarray(y, dtype=np.float64)
    return np.cov(y.T, bias=True)


def test_centering():
    x, acc = _data()
    c = Centering.fit(acc)
    y = c.apply(x).numpy()
    np.testing.assert_allclose(y.mean(0), 0, atol=1e-10)
    np.testing.assert_allclose(c.inverse(y).numpy(), x, atol=1e-10)
    mu = x.mean(0)
    assert c.report.removed_second_moment_share == pytest.approx(mu @ mu / (x * x).sum(1).mean(), rel=1e-10)
    assert c.report.removed_variance_share == 0 and c.report.invertible


def test_all_but_the_top():
    x, acc = _data(1)
    abt = AllButTheTop.fit(acc, n_components=2)
    y = abt.apply(x).numpy()
    xc = x - x.mean(0)
    _, s, vt = np.linalg.svd(xc, full_matrices=False)
    ref = xc - xc @ vt[:2].T @ vt[:2]  # brute force: subtract the projection on the top-2 right singular vectors
    np.testing.assert_allclose(y, ref, atol=1e-8)
    lam = s**2
    assert abt.report.removed_variance_share == pytest.approx(lam[:2].sum() / lam.sum(), rel=1e-10)
    assert np.linalg.matrix_rank(_cov(y), tol=1e-8 * lam[0]) == 6
    assert not abt.report.invertible
    with pytest.raises(BadInputError, match="projection"):
        abt.inverse(y)
    with pytest.raises(BadInputError, match=r"n_components must be in \[0, d = 8\], got 9"):
        AllButTheTop.fit(acc, n_components=9)


def test_whitening_full_is_white_and_invertible():
    x, acc = _data(2)
    w = Whitening.fit(acc)
    y = w.apply(x).numpy()
    np.testing.assert_allclose(_cov(y), np.eye(8), atol=1e-9)
    np.testing.assert_allclose(w.inverse(y).numpy(), x, atol=1e-8)
    lam = np.linalg.eigvalsh(_cov(x))
    assert w.report.noise_amplification == pytest.approx(math.sqrt(lam.max() / lam.min()), rel=1e-9)
    assert w.report.removed_variance_share == pytest.approx(0.0, abs=1e-12) and w.report.invertible
    # float32 input stays float32 and is white to float32 precision
    y32 = w.apply(x.astype(np.float32))
    assert y32.dtype == torch.float32
    np.testing.assert_allclose(_cov(y32.numpy()), np.eye(8), atol=2e-4)


def test_whitening_top_k_shrinkage_and_clamp():
    x, acc = _data(3)
    lam = np.sort(np.linalg.eigvalsh(_cov(x)))[::-1]
    w = Whitening.fit(acc, k=3)
    y = w.apply(x).numpy()
    assert y.shape == (2000, 3)
    np.testing.assert_allclose(_cov(y), np.eye(3), atol=1e-9)
    assert w.report.removed_variance_share == pytest.approx(1 - lam[:3].sum() / lam.sum(), rel=1e-9)
    assert w.report.noise_amplification == pytest.approx(math.sqrt(lam[0] / lam[2]), rel=1e-9)
    # inverse of a truncated whitening = projection onto the kept span
    xc = x - x.mean(0)
    _, _, vt = np.linalg.svd(xc, full_matrices=False)
    np.testing.assert_allclose(w.inverse(y).numpy() - x.mean(0), xc @ vt[:3].T @ vt[:3], atol=1e-8)
    # shrinkage toward the mean eigenvalue: λ' = (1 − α)λ + α·mean λ
    alpha = 0.5
    ws = Whitening.fit(acc, shrinkage=alpha)
    shrunk = (1 - alpha) * lam + alpha * lam.mean()
    assert ws.report.noise_amplification == pytest.approx(math.sqrt(shrunk[0] / shrunk[-1]), rel=1e-9)
    assert ws.report.noise_amplification < Whitening.fit(acc).report.noise_amplification
    # the clamp floors tiny eigenvalues and says how many
    wc = Whitening.fit(acc, clamp=1e-2)
    n_below = int((lam < 1e-2 * lam[0]).sum())
    assert n_below > 0 and wc.report.n_clamped == n_below
    assert wc.report.noise_amplification == pytest.approx(10.0, rel=1e-9)
    with pytest.raises(BadInputError, match=r"k must be in \[1, d = \d+\], got 0"):
        Whitening.fit(acc, k=0)
    with pytest.raises(BadInputError, match=r"shrinkage must be in \[0, 1\], got 2.0"):
        Whitening.fit(acc, shrinkage=2.0)


def test_whitening_with_n_le_d_says_so():
    rng = np.random.default_rng(4)
    acc = GeometryAccumulator(10)
    acc.add(rng.normal(size=(6, 10)))
    w = Whitening.fit(acc)
    assert any("singular" in note for note in w.report.notes)
    assert w.report.n_clamped >= 5  # the null directions hit the floor
    assert w.report.noise_amplification == pytest.approx(1e3, rel=1e-6)  # √(1/clamp)
