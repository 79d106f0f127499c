"""The blocked-jackknife sd of A (rows that are not independent: tokens of one window). Its formula against a
brute-force delete-a-block jackknife from the pairwise cosines, and its value against the spread of A over repeated
simulation of a stream whose windows share a direction (where the iid A_sd is several times too small)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from saegeo.errors import BadInputError
from saegeo.geometry.accumulate import blocked_jackknife_anisotropy_sd


def _mean_pairwise_cosine(x: np.ndarray) -> float:
    u = x / np.linalg.norm(x, axis=1, keepdims=True)
    c = u @ u.T
    n = len(u)
    return float((c.sum() - np.trace(c)) / (n * (n - 1)))


def _block_sums(blocks: list[np.ndarray]) -> tuple[torch.Tensor, np.ndarray]:
    sums = torch.tensor(np.stack([(b / np.linalg.norm(b, axis=1, keepdims=True)).sum(0) for b in blocks]))
    return sums, np.array([len(b) for b in blocks])


def test_blocked_jackknife_equals_brute_force_delete_a_block():
    rng = np.random.default_rng(0)
    blocks = [rng.normal(size=(int(m), 5)) + 0.7 for m in rng.integers(3, 9, size=6)]  # unequal blocks
    leave_out = np.array([_mean_pairwise_cosine(np.concatenate(blocks[:g] + blocks[g + 1 :])) for g in range(6)])
    expected = math.sqrt(5 / 6 * ((leave_out - leave_out.mean()) ** 2).sum())
    assert blocked_jackknife_anisotropy_sd(*_block_sums(blocks)) == pytest.approx(expected, rel=1e-12)


def _stream(rng: np.random.Generator, windows: int, length: int, d: int) -> list[np.ndarray]:
    """Windows whose rows share the window's own direction (a topic) beside a common mean."""
    mean = np.zeros(d)
    mean[0] = 1.0
    return [mean + 0.8 * rng.normal(size=d) + rng.normal(size=(length, d)) for _ in range(windows)]


def test_blocked_jackknife_sd_matches_the_spread_of_a_over_dependent_streams():
    from saegeo.geometry.amplification import anisotropy_sampling_sd

    rng = np.random.default_rng(1)
    values, jack, iid = [], [], []
    for _ in range(150):
        wins = _stream(rng, windows=24, length=20, d=16)
        x = np.concatenate(wins)
        values.append(_mean_pairwise_cosine(x))
        jack.append(blocked_jackknife_anisotropy_sd(*_block_sums(wins)))
        u = torch.tensor(x / np.linalg.norm(x, axis=1, keepdims=True))
        iid.append(anisotropy_sampling_sd(u.sum(0), u.T @ u, len(u)))
    spread = np.std(values, ddof=1)
    bound = 3 / math.sqrt(2 * 149) + 0.12  # the spread's own se, and the jackknife's small-G bias (24 blocks)
    assert abs(np.mean(jack) / spread - 1) < bound, (np.mean(jack), spread)
    assert np.mean(iid) < 0.5 * spread  # the iid sd is the one that misleads here


def test_too_few_blocks_or_rows_is_a_clear_error():
    with pytest.raises(BadInputError, match="at least 2 blocks"):
        blocked_jackknife_anisotropy_sd(torch.ones(1, 3), np.array([5]))
    with pytest.raises(BadInputError, match="at least 2 rows outside"):
        blocked_jackknife_anisotropy_sd(torch.ones(2, 3), np.array([1, 5]))
