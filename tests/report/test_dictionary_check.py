"""`saegeo check`: planted pathologies are flagged (exactly those), and every number the check reports
equals an independent brute-force computation (all pairwise cosines, numpy eigenvalues)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from safetensors.numpy import save_file as save_numpy_safetensors

from saegeo.cli import main
from saegeo.geometry.dictionary import encoder_decoder_cosines, near_duplicate_pairs, screen_projection
from saegeo.report.dictionary_check import (
    DUPLICATES,
    INPUT_NORMALIZATION,
    INPUT_SCALING,
    MISALIGNED,
    UNSET_THRESHOLD,
    ZERO_ROWS,
    CheckOptions,
    DictionaryCheck,
    check_dictionary,
)
from saegeo.report.flags import MEAN_DIRECTION
from saegeo.sae.model import SAE

N_LAT, D_IN = 384, 48


def _unit(v: np.ndarray) -> np.ndarray:
    return v / np.linalg.norm(v, axis=-1, keepdims=True)


def _planted_dictionary(seed: int = 0):
    """Random unit decoder rows (max |cos| between them ≈ 0.6 in d = 48), then: row 17 along b_dec's
    direction (the offset a latent absorbed), and near-duplicates 100~200 (cos ≈ 0.995) and 300~301
    (cos ≈ 0.9995, different norms). Tied encoder, b_dec = 4·m."""
    rng = np.random.default_rng(seed)
    w = _unit(rng.standard_normal((N_LAT, D_IN)))
    m = _unit(rng.standard_normal(D_IN))
    w[17] = _unit(m + 0.05 * _unit(rng.standard_normal(D_IN)))
    w[200] = _unit(w[100] + 0.1 * _unit(rng.standard_normal(D_IN)))
    w[301] = 1.7 * _unit(w[300] + 0.03 * _unit(rng.standard_normal(D_IN)))
    w *= rng.uniform(0.8, 1.2, size=(N_LAT, 1))  # published decoders need not be unit norm
    weights = {"W_dec": w, "W_enc": w.T.copy(), "b_enc": -0.1 * np.ones(N_LAT), "b_dec": 4.0 * m}
    return {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in weights.items()}


def _write_saelens(path, weights, **cfg):
    path.mkdir(parents=True, exist_ok=True)
    save_numpy_safetensors(weights, str(path / "sae_weights.safetensors"))
    base = {
        "architecture": "standard",
        "d_in": D_IN,
        "d_sae": N_LAT,
        "apply_b_dec_to_input": True,
        "normalize_activations": "none",
        "dtype": "float32",
        "metadata": {"sae_lens_version": "6.5.1"},
    }
    (path / "cfg.json").write_text(json.dumps({**base, **cfg}))
    return path


def _brute_force_cosines(w: np.ndarray) -> np.ndarray:
    u = _unit(w.astype(np.float64))
    return u @ u.T


def test_planted_mean_direction_row_and_duplicates_flag_exactly_those(tmp_path, capsys):
    weights = _planted_dictionary()
    path = _write_saelens(tmp_path / "planted", weights)
    rc = main(["check", str(path), "--out", str(tmp_path / "out"), "--no-progress", "--block-rows", "100"])
    assert rc == 0
    printed = capsys.readouterr().out
    result = json.loads((tmp_path / "out" / "check.json").read_text())
    flags = {f["name"]: f for f in result["flags"]}
    assert set(flags) == {MEAN_DIRECTION, DUPLICATES}
    assert flags[MEAN_DIRECTION]["latents"] == [17]
    assert {(i, j) for i, j, _ in result["duplicate_pairs"]} == {(100, 200), (300, 301)}
    assert sorted(flags[DUPLICATES]["latents"]) == [100, 200, 300, 301]
    # the reported cosines are the exact ones
    cos = _brute_force_cosines(weights["W_dec"])
    for i, j, c in result["duplicate_pairs"]:
        assert c == pytest.approx(cos[i, j], abs=1e-9)
    assert "duplicate_decoder_rows" in printed and "mean_direction_features" in printed
    for name in ("summary.txt", "check.md", "check.html"):
        assert "duplicate_decoder_rows" in (tmp_path / "out" / name).read_text()
    # the same dictionary without the planted rows raises nothing
    clean = _planted_dictionary()
    rng = np.random.default_rng(101)
    for row in (17, 200, 301):
        clean["W_dec"][row] = _unit(rng.standard_normal(D_IN))
    clean["W_enc"] = clean["W_dec"].T.copy()
    check = check_dictionary(SAE.load(_write_saelens(tmp_path / "clean", clean)), options=CheckOptions(progress=False))
    assert check.flags == []


def test_dictionary_numbers_equal_brute_force(tmp_path):
    weights = _planted_dictionary(3)
    w = weights["W_dec"].astype(np.float64)
    w[5] = 0.0  # a zero row and a numerically-zero copy of row 7: excluded from every direction statistic
    w[6] = 1e-9 * w[7]
    weights["W_dec"] = w.astype(np.float32)
    weights["W_enc"][:, 9] *= -1  # latent 9 reads against what it writes
    check = check_dictionary(
        SAE.load(_write_saelens(tmp_path / "d", weights)), options=CheckOptions(progress=False, block_rows=50)
    )
    alive = np.linalg.norm(w, axis=1) > 1e-6
    cos = _brute_force_cosines(w[alive])
    n = cos.shape[0]
    assert check.a_dict == pytest.approx((cos.sum() - n) / (n * (n - 1)), abs=1e-9)  # mean over i ≠ j
    u = _unit(w[alive])
    lam = np.sort(np.linalg.eigvalsh(np.cov(u.T, bias=True)))[::-1]
    np.testing.assert_allclose(check.dictionary_spectrum["eigenvalues"], lam, atol=1e-6)
    p = lam / lam.sum()
    assert check.dictionary_spectrum["effective_rank"] == pytest.approx(math.exp(-(p * np.log(p)).sum()), rel=1e-5)
    norms = np.linalg.norm(w, axis=1)
    assert check.decoder_norms["median"] == pytest.approx(
        np.sort(norms)[(len(norms) - 1) // 2], rel=1e-6
    )  # lower median
    assert check.decoder_norms["max"] == pytest.approx(norms.max(), rel=1e-6)
    assert check.n_zero_decoder_rows == 2 and check.zero_rows == [5, 6]
    flags = {f.name: f for f in check.flags}
    assert flags[ZERO_ROWS].latents == [5, 6]
    assert flags[MISALIGNED].latents == [9]
    assert all(5 not in pair[:2] and 6 not in pair[:2] for pair in check.duplicate_pairs)
    ub = _unit(weights["b_dec"].astype(np.float64))
    assert check.b_dec["cos_mean_direction"] == pytest.approx(float(ub @ _unit(u.mean(0))), abs=1e-6)


@pytest.mark.parametrize(
    "d, screen_dim, block_rows, cone",
    [(16, 128, 37, 0.0), (16, 128, 1000, 0.0), (300, 16, 64, 0.0), (600, 128, 37, 0.0), (300, 8, 50, 0.8)],
)
def test_blockwise_duplicate_search_equals_all_pairs(d, screen_dim, block_rows, cone):
    """Many planted pairs straddling the threshold (cos 0.98–0.9999, two within 1e-4 of it), zero rows, odd
    block sizes, with and without the projected screen (d > 2·screen_dim), isotropic rows or rows in a cone
    (a shared direction of weight `cone`): exactly the pairs a dense float64 all-pairs computation finds."""
    rng = np.random.default_rng(7)
    shared = _unit(rng.standard_normal(d))
    w = _unit(rng.standard_normal((300, d)) * (1 - cone) + 3 * cone * shared)
    targets = np.r_[np.linspace(0.98, 0.9999, 38), 0.98995, 0.99005]  # two within 1e-4 of the threshold
    basis = screen_projection(d, screen_dim).double().numpy() if d > 2 * screen_dim else np.eye(d)
    for k, target in enumerate(targets):
        i, j = 2 * k, 2 * k + 150
        # odd pairs: the difference lies in the screen's own subspace, where its bound is tight (worst case)
        perp = basis @ rng.standard_normal(basis.shape[1]) if k % 2 else rng.standard_normal(d)
        perp = _unit(perp - (perp @ w[i]) * w[i])
        w[j] = rng.uniform(0.5, 2) * (target * w[i] + math.sqrt(1 - target**2) * perp)
    w[[3, 151]] = 0.0
    w32 = torch.tensor(w, dtype=torch.float32)
    # exact cosines of the rows as stored (float32), in float64
    w64 = w32.double().numpy()
    cos = _brute_force_cosines(np.where(np.linalg.norm(w64, axis=1, keepdims=True) > 0, w64, 1.0))
    cos[[3, 151], :] = cos[:, [3, 151]] = 0.0
    iu = np.triu_indices(300, k=1)
    expected = {(int(a), int(b)) for a, b in zip(*iu) if cos[a, b] > 0.99}
    assert 10 < len(expected) < 60
    pairs, pair_cos, total = near_duplicate_pairs(w32, 0.99, block_rows=block_rows, screen_dim=screen_dim)
    assert {tuple(p) for p in pairs.tolist()} == expected and total == len(expected)
    np.testing.assert_allclose(pair_cos.numpy(), [cos[i, j] for i, j in pairs.tolist()], atol=1e-12)
    assert (np.diff(pair_cos.numpy()) <= 0).all()  # most similar first


def test_encoder_decoder_cosines_equal_direct():
    rng = np.random.default_rng(2)
    enc, dec = rng.standard_normal((16, 90)), rng.standard_normal((90, 16))
    dec[4] = 0.0
    got = encoder_decoder_cosines(torch.tensor(enc), torch.tensor(dec), block_rows=32).numpy()
    with np.errstate(invalid="ignore"):
        expected = (enc.T * dec).sum(1) / (np.linalg.norm(enc.T, axis=1) * np.linalg.norm(dec, axis=1))
    expected[4] = 0.0
    np.testing.assert_allclose(got, expected, atol=1e-12)
    got32 = encoder_decoder_cosines(
        torch.tensor(enc, dtype=torch.float32), torch.tensor(dec, dtype=torch.float32), block_rows=7
    )
    np.testing.assert_allclose(got32.numpy(), expected, atol=1e-6)


def test_config_flags_from_each_format(tmp_path):
    weights = _planted_dictionary(5)
    rng = np.random.default_rng(99)  # not the fixture's seed: fresh rows, not copies of rows 0–2
    weights["W_dec"][[17, 200, 301]] = _unit(rng.standard_normal((3, D_IN)))  # no planted geometry here
    weights["W_enc"] = weights["W_dec"].T.copy()
    opts = CheckOptions(progress=False)
    # SAELens expecting a rescaling factor the files do not hold
    ea = check_dictionary(
        SAE.load(_write_saelens(tmp_path / "ea", weights, normalize_activations="expected_average_only_in")),
        options=opts,
    )
    assert ea.flag_names() == [INPUT_SCALING]
    # SAELens layer_norm: the input normalisation is reported (info)
    ln = check_dictionary(
        SAE.load(_write_saelens(tmp_path / "ln", weights, normalize_activations="layer_norm")), options=opts
    )
    assert ln.flag_names() == [INPUT_NORMALIZATION]
    # dictionary_learning BatchTopK whose threshold was never set
    t = {k: torch.from_numpy(v) for k, v in weights.items()}
    sd = {
        "encoder.weight": t["W_enc"].T.contiguous(),
        "encoder.bias": t["b_enc"],
        "decoder.weight": t["W_dec"].T.contiguous(),
        "b_dec": t["b_dec"],
        "k": torch.tensor(8, dtype=torch.int),
        "threshold": torch.tensor(-1.0),
    }
    (tmp_path / "bt").mkdir()
    torch.save(sd, tmp_path / "bt" / "ae.pt")
    (tmp_path / "bt" / "config.json").write_text(json.dumps({"trainer": {"dict_class": "BatchTopKSAE", "k": 8}}))
    bt = check_dictionary(SAE.load(tmp_path / "bt"), options=opts)
    assert bt.flag_names() == [UNSET_THRESHOLD]
    # JSON round trip
    again = DictionaryCheck.from_dict(json.loads(bt.to_json()))
    assert again.flag_names() == bt.flag_names() and again.a_dict == bt.a_dict


def test_check_with_activations_merges_dictionary_flags(tmp_path, capsys):
    """--acts: the full geometry report on the activations, plus the duplicate rows the dictionary check found;
    --fail-on warning turns them into exit status 1."""
    weights = _planted_dictionary(8)
    path = _write_saelens(tmp_path / "p", weights)
    rng = np.random.default_rng(8)
    acts = (rng.standard_normal((2000, D_IN)) + weights["b_dec"]).astype(np.float32)
    np.save(tmp_path / "acts.npy", acts)
    rc = main(
        [
            "check",
            str(path),
            "--acts",
            str(tmp_path / "acts.npy"),
            "--out",
            str(tmp_path / "o"),
            "--no-progress",
            "--fail-on",
            "warning",
        ]
    )
    assert rc == 1
    report = json.loads((tmp_path / "o" / "report.json").read_text())
    assert report["source"]["n_tokens"] == 2000 and report["saes"][0]["d_sae"] == N_LAT
    dup = [f for f in report["flags"] if f["name"] == DUPLICATES]
    assert len(dup) == 1 and sorted(dup[0]["latents"]) == [100, 200, 300, 301]
    # the report measured the SAE on these activations: FVE equals a direct computation
    sae = SAE.load(path)
    with torch.no_grad():
        recon = sae(torch.from_numpy(acts)).double().numpy()
    fve = 1 - ((acts - recon) ** 2).sum() / ((acts - acts.mean(0)) ** 2).sum()
    assert report["saes"][0]["fve"] == pytest.approx(fve, abs=1e-4)
    assert "saegeo report" in capsys.readouterr().out


def test_report_raises_the_duplicate_rows_check_raises(tmp_path, capsys):
    """`report --sae` takes the verdict `check --acts` takes (sae_verdict): an exact duplicate decoder row (cos 1.0)
    is `duplicate_decoder_rows` in both, with the same latents."""
    weights = _planted_dictionary(9)
    weights["W_dec"][250] = weights["W_dec"][40]  # an exact copy, as a careless merge leaves
    path = _write_saelens(tmp_path / "p", weights)
    rng = np.random.default_rng(9)
    np.save(tmp_path / "acts.npy", (rng.standard_normal((1500, D_IN)) + weights["b_dec"]).astype(np.float32))
    common = ["--no-progress", "--format", "json"]
    assert main(["check", str(path), "--acts", str(tmp_path / "acts.npy"), "--out", str(tmp_path / "c"), *common]) == 0
    assert (
        main(
            ["report", "--acts", str(tmp_path / "acts.npy"), "--sae", str(path), "--out", str(tmp_path / "r"), *common]
        )
        == 0
    )
    found = {}
    for run in ("c", "r"):
        report = json.loads((tmp_path / run / "report.json").read_text())
        [dup] = [f for f in report["flags"] if f["name"] == DUPLICATES]
        found[run] = sorted(dup["latents"])
        assert dup["evidence"]["max_cos"] == pytest.approx(1.0, abs=1e-6)
    assert found["c"] == found["r"] and {40, 250} <= set(found["r"])
    capsys.readouterr()
