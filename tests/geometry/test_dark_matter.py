"""Dark matter (saegeo.geometry.dark_matter): the streamed ridge against a brute-force numpy ridge per fold, a
planted linearly predictable error recovered, the fold sd checked by resampling."""

import numpy as np
import pytest
import torch

from saegeo.geometry.dark_matter import DarkMatterAccumulator, dark_matter


def _brute(x: np.ndarray, e: np.ndarray, k: int, fold_rows: int, ridge: float):
    """Fold by fold from the rows: centred ridge fit on the other folds, residuals on the held-out fold."""
    y = np.concatenate([e, np.linalg.norm(e, axis=1, keepdims=True)], 1)
    fold = (np.arange(len(x)) // fold_rows) % k
    d = x.shape[1]
    sse, sst = np.zeros((k, d + 1)), np.zeros((k, d + 1))
    for f in range(k):
        tr, te = fold != f, fold == f
        mx, my = x[tr].mean(0), y[tr].mean(0)
        xc = x[tr] - mx
        cxx = xc.T @ xc
        lam = ridge * np.trace(cxx) / d
        B = np.linalg.solve(cxx + lam * np.eye(d), xc.T @ (y[tr] - my))
        r = y[te] - my - (x[te] - mx) @ B
        sse[f] = (r**2).sum(0)
        sst[f] = ((y[te] - y[te].mean(0)) ** 2).sum(0)
    fold_vec = 1 - sse[:, :d].sum(1) / sst[:, :d].sum(1)
    fold_norm = 1 - sse[:, d] / sst[:, d]
    return {
        "r2_vector": 1 - sse[:, :d].sum() / sst[:, :d].sum(),
        "r2_norm": 1 - sse[:, d].sum() / sst[:, d].sum(),
        "fold_r2_vector": fold_vec,
        "fold_r2_norm": fold_norm,
        "r2_vector_sd": fold_vec.std(ddof=1) / np.sqrt(k),
        "r2_norm_sd": fold_norm.std(ddof=1) / np.sqrt(k),
    }


def _data(n: int, d: int, seed: int, offset: float = 0.0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d)) + offset
    a = rng.normal(size=(d, d)) / np.sqrt(d)
    e = np.tanh(x) @ a + 0.5 * rng.normal(size=(n, d))  # partly linear, partly not
    return x, e


@pytest.mark.parametrize("ridge", [1e-6, 0.3])
def test_streamed_ridge_equals_brute_force(ridge):
    x, e = _data(700, 6, seed=1, offset=30.0)  # a large offset: the sums must not cancel
    acc = DarkMatterAccumulator(6, n_folds=3, fold_rows=50)
    for s in range(0, 700, 130):  # batches that cut the fold blocks
        acc.add(torch.from_numpy(x[s : s + 130]), torch.from_numpy(e[s : s + 130]))
    got = dark_matter(acc, ridge=ridge).to_dict()
    want = _brute(x, e, 3, 50, ridge)
    for key, value in want.items():
        assert np.asarray(got[key]) == pytest.approx(value, rel=1e-9, abs=1e-11), key
    assert got["nonlinear_share"] == pytest.approx(1 - want["r2_vector"], abs=1e-11)


def test_merged_accumulators_equal_one_pass():
    x, e = _data(600, 5, seed=2, offset=5.0)
    one = DarkMatterAccumulator(5, n_folds=4, fold_rows=40)
    one.add(torch.from_numpy(x), torch.from_numpy(e))
    first, second = DarkMatterAccumulator(5, n_folds=4, fold_rows=40), DarkMatterAccumulator(5, n_folds=4, fold_rows=40)
    first.add(torch.from_numpy(x[:250]), torch.from_numpy(e[:250]))
    second.add(torch.from_numpy(x[250:]), torch.from_numpy(e[250:]), first_row=250)  # another shift
    first.merge(second)
    a, b = dark_matter(one).to_dict(), dark_matter(first).to_dict()
    for key in ("r2_vector", "r2_norm", "fold_r2_vector", "fold_r2_norm"):
        assert np.asarray(b[key]) == pytest.approx(np.asarray(a[key]), rel=1e-9)


def test_planted_linear_error_share_recovered():
    # e = A x + ε, x ~ N(0, I_d), ε ~ N(0, σ² I_d) independent of x: R²_vector = ‖A‖_F² / (‖A‖_F² + d σ²)
    rng = np.random.default_rng(3)
    n, d, sigma = 40_000, 8, 0.7
    a = rng.normal(size=(d, d)) / np.sqrt(d)
    x = rng.normal(size=(n, d))
    e = x @ a + sigma * rng.normal(size=(n, d))
    acc = DarkMatterAccumulator(d)
    for s in range(0, n, 4096):
        acc.add(torch.from_numpy(x[s : s + 4096]), torch.from_numpy(e[s : s + 4096]))
    got = dark_matter(acc)
    truth = (a**2).sum() / ((a**2).sum() + d * sigma**2)
    assert abs(got.r2_vector - truth) < 4 * got.r2_vector_sd + 1e-3
    assert 0.3 < truth < 0.8  # a real mix, not a corner
    # a norm that is a linear function of x: ‖e‖ = 3 + wᵀx along a fixed direction (3 + wᵀx > 0 here)
    w = np.array([0.2, -0.1] + [0.0] * (d - 2))
    u = np.eye(d)[0]
    e2 = (3 + np.clip(x @ w, -2.5, 2.5))[:, None] * u
    acc2 = DarkMatterAccumulator(d)
    acc2.add(torch.from_numpy(x), torch.from_numpy(e2))
    assert dark_matter(acc2).r2_norm > 0.99
    # an error independent of x: nothing is predictable
    acc3 = DarkMatterAccumulator(d)
    acc3.add(torch.from_numpy(x), torch.from_numpy(rng.normal(size=(n, d))))
    none = dark_matter(acc3)
    assert abs(none.r2_vector) < 4 * none.r2_vector_sd + 1e-3


def test_fold_sd_matches_resampling():
    # the reported sd against the spread of the estimate over independent data sets of the same law
    rng = np.random.default_rng(4)
    d, n, reps = 4, 1000, 80
    a = rng.normal(size=(d, d)) / 2
    estimates, sds = [], []
    for _ in range(reps):
        x = rng.normal(size=(n, d))
        e = np.tanh(2 * x) @ a + rng.normal(size=(n, d)) * (0.5 + 0.5 * np.abs(x))  # heteroscedastic
        acc = DarkMatterAccumulator(d, fold_rows=30)
        acc.add(torch.from_numpy(x), torch.from_numpy(e))
        got = dark_matter(acc)
        estimates.append(got.r2_vector)
        sds.append(got.r2_vector_sd)
    ratio = np.mean(sds) / np.std(estimates, ddof=1)
    assert 0.7 < ratio < 1.4, ratio


def test_bad_inputs_are_one_line_errors():
    from saegeo.errors import BadInputError

    with pytest.raises(BadInputError, match="at least 2 folds"):
        DarkMatterAccumulator(3, n_folds=1)
    acc = DarkMatterAccumulator(3, n_folds=5, fold_rows=100)
    acc.add(torch.zeros(50, 3), torch.zeros(50, 3))
    with pytest.raises(BadInputError, match="each of the 5 folds"):
        dark_matter(acc)
    with pytest.raises(BadInputError, match="shape"):
        acc.add(torch.zeros(5, 3), torch.zeros(5, 4))
