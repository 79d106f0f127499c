"""Seed consistency (saegeo.geometry.consistency): the matching against brute force, planted shared latents,
the candidate-graph method against the dense optimum, the activation correlations against numpy."""

import itertools

import numpy as np
import pytest
import torch

from saegeo.geometry.consistency import (
    CodeCorrelationAccumulator,
    cosine_matrix,
    cross_top_k,
    match_latents,
    match_similarity,
    set_geometry,
)


def _brute_best(s: np.ndarray) -> float:
    """max over one-to-one assignments of min(N_A, N_B) pairs of Σ s, by enumerating every assignment."""
    n_a, n_b = s.shape
    if n_a <= n_b:
        return max(sum(s[i, p[i]] for i in range(n_a)) for p in itertools.permutations(range(n_b), n_a))
    return _brute_best(s.T)


def _brute_cos(a: torch.Tensor, b: torch.Tensor) -> np.ndarray:
    a, b = a.double().numpy(), b.double().numpy()
    return (a / np.linalg.norm(a, axis=1, keepdims=True)) @ (b / np.linalg.norm(b, axis=1, keepdims=True)).T


@pytest.mark.parametrize("shape", [(6, 6), (5, 7), (7, 4)])
def test_exact_matching_equals_brute_force(shape):
    g = torch.Generator().manual_seed(sum(shape))
    a, b = torch.randn(shape[0], 5, generator=g), torch.randn(shape[1], 5, generator=g)
    m = match_latents(a, b)
    best = _brute_best(_brute_cos(a, b))
    assert m.method == "exact"
    assert m.index_a.numel() == min(shape)
    assert m.mcc * min(shape) == pytest.approx(best, abs=1e-12)
    assert len(set(m.index_a.tolist())) == len(set(m.index_b.tolist())) == min(shape)  # one-to-one


def test_candidate_matching_on_small_graph_equals_brute_force():
    # k = the other side's size: the candidate graph is complete, so its optimum is the dense one
    g = torch.Generator().manual_seed(3)
    a, b = torch.randn(6, 4, generator=g), torch.randn(6, 4, generator=g)
    s = _brute_cos(a, b)
    m = match_latents(a, b, exact_max_entries=0, k=6)
    assert m.method == "candidates"
    # floor 0: pairs below 0 are left to the completion (index order here), so compare with the brute force of
    # the same objective, Σ max(s, 0)-style choice: the full matching value must be ≥ every positive-part bound
    assert m.mcc * 6 <= _brute_best(s) + 1e-12
    assert m.mcc <= m.mcc_upper_bound + 1e-12
    positive = np.where(s > 0, s, 0.0)
    kept = m.similarity.numpy()
    assert kept[kept > 0].sum() == pytest.approx(_brute_best(positive), abs=1e-12)


def test_permuted_copy_is_matched_exactly():
    g = torch.Generator().manual_seed(1)
    a = torch.randn(300, 32, generator=g)
    perm = torch.randperm(300, generator=g)
    b = a[perm] * torch.rand(300, 1, generator=g).add(0.5)  # row norms do not matter
    for kwargs in ({}, {"exact_max_entries": 0}):
        m = match_latents(a, b, **kwargs)
        assert torch.equal(perm[m.index_b], m.index_a)  # b[j] = a[perm[j]]
        assert m.mcc == pytest.approx(1.0, abs=1e-12)
        assert m.summary(0.7)["shared_fraction_a"] == 1.0


def _planted(n: int, d: int, share: float, noise: float, seed: int):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(n, d, generator=g)
    perm = torch.randperm(n, generator=g)
    b = a[perm].clone()
    new = torch.rand(n, generator=g) >= share
    b[new] = torch.randn(int(new.sum()), d, generator=g)
    b[~new] += noise * torch.randn(int((~new).sum()), d, generator=g)
    truth = {(int(perm[j]), j) for j in range(n) if not new[j]}
    return a, b, truth


@pytest.mark.parametrize("method", ["exact", "candidates"])
def test_planted_shared_fraction_recovered(method):
    a, b, truth = _planted(1500, 64, 0.7, 0.1, seed=2)
    m = match_latents(a, b, **({} if method == "exact" else {"exact_max_entries": 0}))
    assert m.method == method
    shared = m.shared(0.7)
    found = set(zip(m.index_a[shared].tolist(), m.index_b[shared].tolist()))
    assert found == truth  # every planted pair, nothing else
    assert m.summary(0.7)["shared_fraction_a"] == len(truth) / 1500


def test_candidate_method_against_dense_optimum():
    # scipy's dense Hungarian is an independent oracle of the candidate-graph solver (a different algorithm)
    from scipy.optimize import linear_sum_assignment

    a, b, _ = _planted(1200, 48, 0.5, 0.5, seed=4)
    s = _brute_cos(a, b)
    rows, cols = linear_sum_assignment(s, maximize=True)
    dense = s[rows, cols].mean()
    m = match_latents(a, b, exact_max_entries=0)
    assert m.mcc <= dense + 1e-12 <= m.mcc_upper_bound + 2e-12
    assert dense - m.mcc < 0.01  # the documented gap: the completion's pairs only
    assert m.mcc_upper_bound == pytest.approx(s.max(axis=1).mean(), abs=1e-12)
    dense_shared = {(int(i), int(j)) for i, j in zip(rows, cols) if s[i, j] >= 0.7}
    sel = m.shared(0.7)
    assert set(zip(m.index_a[sel].tolist(), m.index_b[sel].tolist())) == dense_shared
    assert m.ambiguous(0.7) == int(((s >= 0.7).sum(1) > 1).sum() + ((s >= 0.7).sum(0) > 1).sum())


def test_cross_top_k_equals_full_sort():
    g = torch.Generator().manual_seed(5)
    a, b = torch.randn(70, 16, generator=g), torch.randn(50, 16, generator=g)
    a[3] = 0  # a zero row: cosine 0 with everything
    s = _brute_cos(a, b)
    s[3] = 0
    ia, ca, ib, cb = cross_top_k(a, b, 5, block_rows=16)
    for i in range(70):
        assert ca[i].numpy() == pytest.approx(np.sort(s[i])[::-1][:5], abs=1e-12)
        if i != 3:
            assert ia[i].tolist() == list(np.argsort(-s[i], kind="stable")[:5])
    for j in range(50):
        assert cb[j].numpy() == pytest.approx(np.sort(s[:, j])[::-1][:5], abs=1e-12)
    assert cosine_matrix(a, b).numpy() == pytest.approx(s, abs=1e-12)


@pytest.mark.parametrize("pairs", [False, True])
def test_code_correlations_equal_numpy(pairs):
    g = torch.Generator().manual_seed(6)
    n, n_a, n_b = 400, 9, 7
    codes_a = torch.relu(torch.randn(n, n_a, generator=g) - 0.8)
    codes_b = torch.relu(codes_a[:, :n_b] + 0.3 * torch.randn(n, n_b, generator=g) - 0.2)
    codes_b[:, 6] = 0  # never fires: ρ = 0
    with np.errstate(invalid="ignore", divide="ignore"):  # the never-firing latent: NaN, read as 0
        want = np.corrcoef(codes_a.double().numpy().T, codes_b.double().numpy().T)[:n_a, n_a:]
    want = np.nan_to_num(want)
    chosen = (torch.tensor([0, 2, 4, 8, 8]), torch.tensor([0, 2, 1, 6, 3]))
    acc = CodeCorrelationAccumulator(n_a, n_b, chosen if pairs else None)
    for s in range(0, n, 97):  # uneven batches, one of them sparse
        batch_a = codes_a[s : s + 97]
        acc.add(batch_a.to_sparse() if s == 97 else batch_a, codes_b[s : s + 97])
    i, j, rho = acc.pair_correlations()
    assert rho.numpy() == pytest.approx(want[i.numpy(), j.numpy()], abs=1e-12)
    if pairs:
        assert sorted(zip(i.tolist(), j.tolist())) == sorted(zip(*[c.tolist() for c in chosen]))
    else:
        assert acc.matrix().numpy() == pytest.approx(want, abs=1e-12)
        m = match_similarity(acc.matrix())
        assert m.mcc * n_b == pytest.approx(_brute_best(want), abs=1e-12)


def test_set_geometry_against_brute_force(brute_mean_cosine):
    g = torch.Generator().manual_seed(7)
    rows = torch.randn(40, 8, generator=g) + 0.5
    members = torch.tensor([1, 4, 9, 22, 30])
    best = torch.rand(40, generator=g, dtype=torch.float64)
    got = set_geometry(rows, members, best)
    sub = rows[members].double().numpy()
    unit = rows.double().numpy() / np.linalg.norm(rows.double().numpy(), axis=1, keepdims=True)
    mean_sub, mean_all = unit[members.numpy()].mean(0), unit.mean(0)
    assert got["n"] == 5
    assert got["anisotropy"] == pytest.approx(brute_mean_cosine(sub), abs=1e-12)
    assert got["mean_best_cross_cosine"] == pytest.approx(float(best[members].mean()), abs=1e-12)
    assert got["cos_mean_with_dictionary_mean"] == pytest.approx(
        mean_sub @ mean_all / np.linalg.norm(mean_sub) / np.linalg.norm(mean_all), abs=1e-12
    )
    assert got["mean_decoder_norm"] == pytest.approx(np.linalg.norm(sub, axis=1).mean(), abs=1e-12)


# --------------------------------------------------------------------------- the command, end to end
def _pair_of_saes(tmp_path, n_lat=64, d=64, share=0.75, seed=0):
    """SAE A (ReLU, tied encoder) and B: A's latents permuted, a known set of them replaced by new random ones."""
    from saegeo.sae.model import SAE, SAEConfig

    g = torch.Generator().manual_seed(seed)
    a = SAE(SAEConfig(d_in=d, d_sae=n_lat, activation="relu")).init_weights(g, encoder_scale=1.0)
    b = SAE(SAEConfig(d_in=d, d_sae=n_lat, activation="relu")).init_weights(g, encoder_scale=1.0)
    perm = torch.randperm(n_lat, generator=g)
    keep = torch.arange(n_lat) < int(share * n_lat)  # B's latents j < share·n copy A's latent perm[j]
    with torch.no_grad():
        b.W_dec[keep] = a.W_dec[perm[keep]]
        b.W_enc[:, keep] = a.W_enc[:, perm[keep]]
    a.save(tmp_path / "a"), b.save(tmp_path / "b")
    return perm, keep


def _cli(*argv):
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "saegeo.cli", *map(str, argv)], capture_output=True, text=True)


def test_compare_command_end_to_end(tmp_path):
    import json

    perm, keep = _pair_of_saes(tmp_path)
    rows = torch.randn(3000, 64, generator=torch.Generator().manual_seed(9))
    np.save(tmp_path / "acts.npy", rows.numpy())
    run = _cli(
        "compare",
        tmp_path / "a",
        tmp_path / "b",
        "--acts",
        tmp_path / "acts.npy",
        "--out",
        tmp_path / "o",
        "--no-progress",
    )
    assert run.returncode == 0, run.stderr
    assert "pairwise MCC" in run.stdout and "activation correlations" in run.stdout
    doc = json.loads((tmp_path / "o" / "compare.json").read_text())
    pairs = dict(zip(doc["pairs"]["index_b"], doc["pairs"]["index_a"]))
    shared_b = {j for j, s in zip(doc["pairs"]["index_b"], doc["pairs"]["similarity"]) if s >= 0.7}
    assert shared_b == set(keep.nonzero().flatten().tolist())  # the planted copies, found by decoder
    assert all(pairs[j] == int(perm[j]) for j in shared_b)
    assert doc["decoder"]["n_shared_encoder_too"] == int(keep.sum())
    act = doc["activations"]
    act_pairs = {
        (i, j)
        for i, j, s in zip(act["pairs"]["index_a"], act["pairs"]["index_b"], act["pairs"]["similarity"])
        if s > 0.999
    }
    assert act_pairs == {(int(perm[j]), j) for j in shared_b}  # the same codes: correlation 1
    # the outputs are never replaced silently; --overwrite replaces them
    again = _cli("compare", tmp_path / "a", tmp_path / "b", "--out", tmp_path / "o", "--no-progress")
    assert again.returncode == 2 and "already exists" in again.stderr and len(again.stderr.strip().splitlines()) == 1
    assert (
        _cli(
            "compare", tmp_path / "a", tmp_path / "b", "--out", tmp_path / "o", "--overwrite", "--no-progress"
        ).returncode
        == 0
    )
    # bad input: one line, exit 2
    bad = _cli("compare", tmp_path / "a", tmp_path / "nowhere", "--no-progress")
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "Traceback" not in bad.stderr


def test_activation_matching_above_the_dense_limit(tmp_path):
    """Above exact_max_entries the activations are correlated on the decoder candidate pairs only: the planted
    copies still come out at correlation 1, matched to their originals."""
    from saegeo.config import CompareOptions
    from saegeo.report.dictionary_compare import compare_dictionaries

    perm, keep = _pair_of_saes(tmp_path)
    rows = torch.randn(2000, 64, generator=torch.Generator().manual_seed(3))
    opts = CompareOptions(exact_max_entries=0, candidates=4, progress=False, batch_rows=300)
    got = compare_dictionaries(str(tmp_path / "a"), str(tmp_path / "b"), opts, acts=rows)
    assert got.decoder["method"] == "candidates"
    act = got.activations
    assert act["method"] == "candidates" and act["n_rows"] == 2000
    ones = {
        (i, j)
        for i, j, s in zip(act["pairs"]["index_a"], act["pairs"]["index_b"], act["pairs"]["similarity"])
        if s > 0.999
    }
    assert ones == {(int(perm[j]), j) for j in keep.nonzero().flatten().tolist()}
    assert act["mcc"] <= act["mcc_upper_bound"] + 1e-12
    shown = repr(got)  # one line in a notebook, not every pair
    assert len(shown) < 2000 and "\n" not in shown and f"{got.decoder['n_shared']:,} shared" in shown
    block = got._repr_html_()  # a notebook cell ending in it: the summary's lines and geometry table, scoped
    assert block.startswith("<div class='saegeo-out'>") and "http" not in block
    assert f"pairwise MCC (mean matched similarity)   {got.decoder['mcc']:.3f}" in block
    assert "activation correlations" in block and "geometry of the shared and unshared latents" in block
    assert f"<td>{got.geometry['a_shared']['n']:,}</td>" in block
