"""Dense-latent structure (saegeo.geometry.dense): a planted antipodal dense pair spanning a planted direction,
found and measured against numpy brute force."""

import numpy as np
import pytest
import torch

from saegeo.geometry.dense import (
    CovariateDirection,
    DenseCofiring,
    antipodal_pairs,
    dense_latents,
    pair_subspace,
    subspace_alignment,
)


def _planted(seed: int = 0, n: int = 4000, d: int = 24, n_lat: int = 40):
    """Latents 5 and 17 decode ±v (plus a little noise) and fire by the sign of x·v; latent 30 decodes −v even
    more closely but fires with 5 (not complementary); the rest are sparse."""
    rng = np.random.default_rng(seed)
    v = rng.normal(size=d)
    v /= np.linalg.norm(v)
    W = rng.normal(size=(n_lat, d))
    W /= np.linalg.norm(W, axis=1, keepdims=True)
    W[5] = v + 0.05 * rng.normal(size=d)
    W[17] = -v + 0.1 * rng.normal(size=d)
    W[30] = -v + 0.02 * rng.normal(size=d)  # closer to −v than 17 is: only its co-firing rules it out
    s = rng.normal(size=n)
    codes = np.where(rng.random((n, n_lat)) < 0.02, rng.random((n, n_lat)), 0.0)
    codes[:, 5] = np.maximum(s, 0)
    codes[:, 17] = np.maximum(-s, 0)
    codes[:, 30] = np.where(s > -0.5, 1.0, 0.0)  # dense, anti-aligned, but co-fires with 5
    return v, W, codes


def test_planted_antipodal_pair_and_its_subspace():
    v, W, codes = _planted()
    n = len(codes)
    dense = dense_latents(torch.from_numpy((codes > 0).sum(0)), n, min_rate=0.1)
    assert set(dense.tolist()) == {5, 17, 30}
    acc = DenseCofiring(dense)
    for s in range(0, n, 700):
        acc.add(torch.from_numpy(codes[s : s + 700]))
    on = codes[:, dense.numpy()] > 0
    assert acc.fire.numpy().tolist() == on.sum(0).tolist()
    assert acc.cofire.numpy().tolist() == (on.T.astype(int) @ on.astype(int)).tolist()
    pairs = antipodal_pairs(torch.from_numpy(W), acc, W_enc=torch.from_numpy(W.T.copy()))
    assert [(min(p.i, p.j), max(p.i, p.j)) for p in pairs] == [(5, 17)]  # 30 co-fires with 5: not a pair
    p = pairs[0]
    unit = W / np.linalg.norm(W, axis=1, keepdims=True)
    assert p.decoder_cos == pytest.approx(unit[5] @ unit[17], abs=1e-12)
    assert p.encoder_cos == pytest.approx(unit[5] @ unit[17], abs=1e-12)  # tied encoder here
    assert p.cofire_share == 0.0  # never together: s > 0 or s < 0
    assert p.union_rate == pytest.approx(((codes[:, 5] > 0) | (codes[:, 17] > 0)).mean(), abs=1e-12)
    basis = pair_subspace(torch.from_numpy(W), pairs)
    assert basis.shape == (24, 1)
    axis = unit[p.i] - unit[p.j]
    axis /= np.linalg.norm(axis)
    assert abs(float(basis[:, 0] @ torch.from_numpy(axis))) == pytest.approx(1.0, abs=1e-12)
    rng = np.random.default_rng(9)
    other = rng.normal(size=24)
    mu = 3 * v + 0.1 * other  # a mean mostly along the planted direction
    got = subspace_alignment(basis, {"mu": torch.from_numpy(mu), "other": torch.from_numpy(other)})
    proj = lambda r: (r @ axis) ** 2 / (r @ r)  # noqa: E731 (brute force: one axis)
    assert got["mu"] == pytest.approx(proj(mu), abs=1e-12) and got["mu"] > 0.9
    assert got["other"] == pytest.approx(proj(other), abs=1e-12)
    assert got["dim"] == 1 and got["chance"] == 1 / 24


def test_two_pairs_span_two_dimensions():
    rng = np.random.default_rng(1)
    d = 10
    q = np.linalg.qr(rng.normal(size=(d, 2)))[0]
    W = rng.normal(size=(8, d))
    W[0], W[1], W[2], W[3] = q[:, 0], -q[:, 0], q[:, 1], -q[:, 1]
    s = rng.normal(size=(2000, 2))
    codes = np.zeros((2000, 8))
    codes[:, 0], codes[:, 1] = np.maximum(s[:, 0], 0), np.maximum(-s[:, 0], 0)
    codes[:, 2], codes[:, 3] = np.maximum(s[:, 1], 0), np.maximum(-s[:, 1], 0)
    acc = DenseCofiring(dense_latents(torch.from_numpy((codes > 0).sum(0)), 2000))
    acc.add(torch.from_numpy(codes))
    pairs = antipodal_pairs(torch.from_numpy(W), acc)
    assert sorted((min(p.i, p.j), max(p.i, p.j)) for p in pairs) == [(0, 1), (2, 3)]
    basis = pair_subspace(torch.from_numpy(W), pairs)
    assert basis.shape == (d, 2)
    # the projector onto the span of q equals the basis' projector (brute force)
    assert (basis @ basis.T).numpy() == pytest.approx(q @ q.T, abs=1e-12)
    inside = torch.from_numpy(q @ np.array([1.0, 2.0]))
    assert subspace_alignment(basis, {"r": inside})["r"] == pytest.approx(1.0, abs=1e-12)


def test_sae_structure_on_a_planted_sae():
    """A ReLU SAE with latents ±e_i (i < 3, dense antipodal pairs) reading the first 3 coordinates at 0.8 of their
    size, and sparse latents on the others: the error e = x − x̂ is 0.2·x on the first 3 coordinates (linear)."""
    from saegeo.report.structure import StructureOptions, sae_structure
    from saegeo.sae.model import SAE, SAEConfig

    d = 6
    sae = SAE(SAEConfig(d_in=d, d_sae=2 * d, activation="relu"))
    with torch.no_grad():
        eye = torch.eye(d)
        sae.W_enc.copy_(torch.cat([eye, -eye], 1))
        sae.W_dec.copy_(0.8 * torch.cat([eye, -eye], 0))
        sae.b_enc.copy_(torch.tensor([0.0] * 3 + [-3.0] * 3 + [0.0] * 3 + [-3.0] * 3))  # coords 3..5 rarely fire
    rng = np.random.default_rng(0)
    x = torch.from_numpy(rng.normal(size=(6000, d))).float()
    x[:, 3:] = torch.from_numpy(rng.normal(size=(6000, 3)) ** 3).float()  # heavy tails: mostly unread
    got = sae_structure(sae, x, StructureOptions(top_components=1))
    # brute force: the numpy error, its held-out linear fit is 1 on the linear part; compare with the streamed
    x_hat = sae(x).detach().double().numpy()
    err = x.double().numpy() - x_hat
    assert np.abs(err[:, :3] - 0.2 * x[:, :3].double().numpy()).max() < 1e-6
    from tests.geometry.test_dark_matter import _brute  # the fold-by-fold numpy ridge

    want = _brute(x.double().numpy(), err, 5, 1024, 1e-6)
    assert got["dark_matter"]["n_rows"] == 6000
    assert got["dark_matter"]["r2_vector"] == pytest.approx(want["r2_vector"], rel=1e-6)
    assert got["dark_matter"]["r2_norm"] == pytest.approx(want["r2_norm"], rel=1e-6)
    dense = got["dense"]
    assert set(dense["latents"]) == {0, 1, 2, 6, 7, 8}
    assert sorted((min(p["i"], p["j"]), max(p["i"], p["j"])) for p in dense["pairs"]) == [(0, 6), (1, 7), (2, 8)]
    assert all(p["decoder_cos"] == pytest.approx(-1.0) and p["cofire_share"] == 0.0 for p in dense["pairs"])
    sub = dense["subspace"]
    assert sub["dim"] == 3 and sub["chance"] == 0.5
    mu = x.double().numpy().mean(0)
    assert sub["mean"] == pytest.approx((mu[:3] ** 2).sum() / (mu**2).sum(), abs=1e-9)


def test_cofiring_counts_from_coo_equal_the_dense_counts():
    """add_coo (the report's sampled codes) counts as add of the dense matrix: the chosen latents in any order, one
    of them above every column the batch holds."""
    from saegeo.geometry.dense import DenseCofiring

    g = torch.Generator().manual_seed(3)
    codes = torch.rand(300, 20, generator=g) * (torch.rand(300, 20, generator=g) < 0.4)
    codes[:, 19] = 0  # the largest column never fires: the COO's max latent is below it
    chosen = torch.tensor([7, 2, 19, 11, 0])
    dense, coo = DenseCofiring(chosen), DenseCofiring(chosen)
    for lo in range(0, 300, 128):
        block = codes[lo : lo + 128]
        dense.add(block)
        rows, cols = block.nonzero(as_tuple=True)
        coo.add_coo(block.shape[0], rows, cols, block[rows, cols])
    assert coo.n_rows == dense.n_rows == 300
    assert torch.equal(coo.fire, dense.fire) and torch.equal(coo.cofire, dense.cofire)


@pytest.mark.parametrize("batch", [37, 1000])
def test_position_direction_streamed_equals_least_squares_far_from_zero(batch):
    rng = np.random.default_rng(5)
    n, d = 1000, 5
    p = rng.integers(0, 64, size=n).astype(float) + 1e4  # a covariate far from zero
    slope = rng.normal(size=d)
    x = 1e3 + np.outer(p, slope) * 0.01 + rng.normal(size=(n, d))
    acc = CovariateDirection(d)
    for lo in range(0, n, batch):
        acc.add(torch.from_numpy(x[lo : lo + batch]), torch.from_numpy(p[lo : lo + batch]))
    beta, info = acc.result()
    want = np.linalg.lstsq(np.stack([np.ones(n), p], 1), x, rcond=None)[0][1]
    assert beta.numpy() == pytest.approx(want, rel=1e-9)
    assert info["explained_share"] == pytest.approx((want**2).sum() * p.var() / x.var(0).sum(), rel=1e-9)
    assert CovariateDirection(d).add(torch.from_numpy(x), torch.zeros(n)).result()[0] is None  # p does not vary
