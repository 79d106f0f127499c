"""Latent cards: the nearest decoder neighbours, the streaming top contexts per latent and the per-latent
table, each against brute force (full cosine matrices, full sorts of the dense code matrix)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from saegeo.geometry.dictionary import nearest_decoder_neighbours


def _brute_neighbours(w: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Full N × N float64 cosine matrix, self and zero rows excluded, sorted by (−cos, index)."""
    norms = np.linalg.norm(w, axis=1)
    alive = norms > 0
    unit = np.where(alive[:, None], w / np.where(alive, norms, 1)[:, None], 0)
    cos = unit @ unit.T
    n = len(w)
    idx = np.full((n, k), -1)
    out = np.full((n, k), np.nan)
    for i in range(n):
        if not alive[i]:
            continue
        cand = [j for j in range(n) if j != i and alive[j]]
        cand.sort(key=lambda j: (-cos[i, j], j))
        for slot, j in enumerate(cand[:k]):
            idx[i, slot], out[i, slot] = j, cos[i, j]
    return idx, out


@pytest.mark.parametrize("block_rows", [7, 64, 4096])
def test_nearest_decoder_neighbours_equal_the_full_cosine_matrix(block_rows):
    g = torch.Generator().manual_seed(0)
    w = torch.randn(150, 9, generator=g)
    w[10] = 3.0 * w[20] + 1e-3 * torch.randn(9, generator=g)  # a near duplicate: each other's nearest
    w[33] = 0.0  # a zero row: nobody's neighbour, has none
    idx, cos = nearest_decoder_neighbours(w, 5, block_rows)
    ref_idx, ref_cos = _brute_neighbours(w.double().numpy(), 5)
    assert idx.shape == (150, 5) and cos.dtype == torch.float64
    np.testing.assert_array_equal(idx.numpy(), ref_idx)
    np.testing.assert_allclose(cos.numpy(), ref_cos, rtol=0, atol=1e-12)  # float64 recomputation
    assert idx[10, 0] == 20 and idx[20, 0] == 10 and (idx[33] == -1).all() and torch.isnan(cos[33]).all()
    assert not (idx == 33).any()


def test_nearest_decoder_neighbours_with_fewer_rows_than_k_pad_with_minus_one():
    w = torch.tensor([[1.0, 0.0], [1.0, 1.0], [0.0, 1.0]])
    idx, cos = nearest_decoder_neighbours(w, 4, 2)
    assert idx[1].tolist() == [0, 2, -1, -1]  # tie at cos = 1/√2: the smaller index first
    assert idx[0].tolist() == [1, 2, -1, -1]
    np.testing.assert_allclose(cos[0, :2].numpy(), [2**-0.5, 0.0], atol=1e-15)
