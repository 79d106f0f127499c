"""Shared test helpers: independent brute-force references (never the code under test)."""

import numpy as np
import pytest


def _brute_mean_cosine(x: np.ndarray) -> float:
    """Mean pairwise cosine over i ≠ j from the full n×n cosine matrix: (Σ_ij cos − tr) / (n(n−1))."""
    unit = x / np.linalg.norm(x, axis=1, keepdims=True)
    cos = unit @ unit.T
    n = len(x)
    return float((cos.sum() - np.trace(cos)) / (n * (n - 1)))


@pytest.fixture
def brute_mean_cosine():
    return _brute_mean_cosine
