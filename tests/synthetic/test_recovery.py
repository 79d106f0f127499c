"""Recovery metrics: perfect on the truth itself, what chance gives on random dictionaries."""

import itertools
import math

import numpy as np
import pytest
import torch

from saegeo.errors import BadInputError
from saegeo.synthetic import max_cosines, recovery


def _random_unit(n, d, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g)
    return x / x.norm(dim=1, keepdim=True)


def test_truth_scores_one_against_itself_and_a_permutation():
    truth = _random_unit(300, 32, 0)
    perm = torch.randperm(300, generator=torch.Generator().manual_seed(1))

    class FakeSAE:
        W_dec = truth[perm] * 3.0  # scale does not matter; an object with W_dec stands for its rows

    for learned in (truth, truth[perm] * 3.0, FakeSAE()):
        rep = recovery(truth, learned)
        assert rep.mean_max_cos_true == pytest.approx(1.0, abs=1e-6)
        assert rep.mean_max_cos_learned == pytest.approx(1.0, abs=1e-6)
        assert rep.frac_recovered == 1.0 and rep.frac_matched_recovered == 1.0
    # the matching finds the permutation: learned[j] = truth[perm[j]]
    inverse = torch.argsort(perm)
    assert torch.equal(rep.matched_learned[torch.argsort(rep.matched_true)], inverse)


def test_known_cosines():
    # u_i = e_i, w_i = cos θ·e_i + sin θ·e_{N+i}: every best cosine is exactly cos θ.
    n = 20
    eye = torch.eye(2 * n)
    for theta, recovered in ((0.3, 1.0), (0.6, 0.0)):  # cos 0.3 = 0.955 ≥ 0.9 > cos 0.6 = 0.825
        learned = math.cos(theta) * eye[:n] + math.sin(theta) * eye[n:]
        rep = recovery(eye[:n], learned)
        assert rep.mean_max_cos_true == pytest.approx(math.cos(theta), abs=1e-6)
        assert rep.frac_recovered == recovered
    # more latents than features: extra latents at cos 0 lower only the learned-side score
    rep = recovery(eye[:n], eye[: 2 * n])
    assert rep.mean_max_cos_true == pytest.approx(1.0) and rep.mean_max_cos_learned == pytest.approx(0.5)
    assert rep.matched_cos.numel() == n


def test_random_dictionaries_score_what_chance_gives():
    # A random unit vector's cosine with a fixed one in R^d: (c + 1)/2 ~ Beta((d−1)/2, (d−1)/2).
    n, m, d = 400, 500, 48
    rep = recovery(_random_unit(n, d, 2), _random_unit(m, d, 3), match=False)
    rng = np.random.default_rng(0)
    sim = 2 * rng.beta((d - 1) / 2, (d - 1) / 2, size=(4000, m)) - 1
    expected_max = sim.max(axis=1).mean()
    assert rep.mean_max_cos_true == pytest.approx(expected_max, abs=0.01)
    sim_other = 2 * rng.beta((d - 1) / 2, (d - 1) / 2, size=(4000, n)) - 1
    assert rep.mean_max_cos_learned == pytest.approx(sim_other.max(axis=1).mean(), abs=0.01)
    assert rep.frac_recovered == 0.0


def test_matching_is_one_to_one_and_optimal():
    # Brute force over all permutations on a small case where greedy best-match double counts.
    truth = _random_unit(6, 5, 4)
    learned = _random_unit(6, 5, 5)
    learned[1] = truth[0] + 0.1 * truth[1]  # latent 1 is the best match of two features
    cos = (truth @ (learned / learned.norm(dim=1, keepdim=True)).T).numpy()
    best = max(sum(cos[i, p[i]] for i in range(6)) for p in itertools.permutations(range(6)))
    rep = recovery(truth, learned)
    assert float(rep.matched_cos.sum()) == pytest.approx(best, abs=1e-5)
    assert len(set(rep.matched_learned.tolist())) == 6
    a, arg, b = max_cosines(truth, learned)
    assert torch.allclose(a, torch.from_numpy(cos.max(1)), atol=1e-6) and torch.equal(
        arg, torch.from_numpy(cos.argmax(1))
    )


def test_sign_and_dead_rows():
    truth = _random_unit(10, 8, 6)
    assert recovery(truth, -truth).mean_max_cos_true < 0.9
    assert recovery(truth, -truth, absolute=True).mean_max_cos_true == pytest.approx(1.0, abs=1e-6)
    learned = truth.clone()
    learned[3] = 0.0  # a dead latent with a zero decoder row: cosine 0, no NaN
    rep = recovery(truth, learned)
    assert np.isfinite(rep.mean_max_cos_true) and rep.frac_recovered == pytest.approx(0.9)
    with pytest.raises(BadInputError, match="different spaces"):
        recovery(truth, _random_unit(10, 9, 0))
    learned[5, 2] = float("nan")
    with pytest.raises(BadInputError, match="row 5"):
        recovery(truth, learned)
