"""A covariance whitening folded into an SAE's weights (SAELens' fold_activation_whitening: W_enc ← M W_enc,
W_dec ← W_dec M⁻¹, b_dec ← b_dec M⁻¹ + μ, applied here by that formula to an SAE trained on whitened rows) is read as
such: `saegeo check` raises whitening_misuse (folded) from the weights alone, where SAEs trained on raw rows (saegeo's
and SAELens' own) raise nothing; with activations the input whitening flag stays silent on raw rows and fires on
whitened ones (a second whitening)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from saegeo.report.dictionary_check import CheckOptions, check_dictionary, sae_verdict
from saegeo.report.flags import WHITENING
from saegeo.report.geometry_report import ReportOptions, geometry_report
from saegeo.sae.train import TrainConfig, train_sae

FIXTURES = Path(__file__).parents[1] / "fixtures" / "published"
D, N_ROWS = 64, 20_000


@pytest.fixture(scope="module")
def rows_and_saes():
    """Anisotropic rows (eigenvalues 1 to 100, an offset) made of sparse features; a TopK SAE trained on them raw,
    and one trained on the rows PCA-whitened, z = (x − μ)M, M = UΛ^{−1/2}, its whitening then folded."""
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(1)
    rotation, _ = torch.linalg.qr(torch.randn(D, D, generator=g))
    features = torch.nn.functional.normalize(torch.randn(256, D, generator=g), dim=1)
    codes = (torch.rand(N_ROWS, 256, generator=g) < 0.03).float() * torch.rand(N_ROWS, 256, generator=g) * 3
    scales = torch.logspace(0, 2, D).sqrt()
    x = codes @ features @ torch.diag(scales) @ rotation.T / 3 + 2.0 + 0.05 * torch.randn(N_ROWS, D, generator=g)
    mu = x.double().mean(0)
    eigenvalues, vectors = torch.linalg.eigh(torch.cov((x.double() - mu).T))
    whiten = vectors @ torch.diag(eigenvalues**-0.5)
    z = ((x.double() - mu) @ whiten).float()
    cfg = dict(
        arch="topk",
        arch_options={"topk": {"k": 8}},
        d_sae=256,
        total_tokens=30_000,
        batch_tokens=512,
        lr=3e-3,
        progress=False,
    )
    cfg.update(heldout_fraction=0.0, dead_window_tokens=4096, seed=1)
    raw = train_sae(TrainConfig(**cfg), x).sae
    folded = train_sae(TrainConfig(**cfg), z).sae
    with torch.no_grad():
        z_hat = folded(z[:500]).double()
        unwhiten = torch.linalg.inv(whiten)
        folded.W_enc.copy_((whiten @ folded.W_enc.double()).float())
        folded.W_dec.copy_((folded.W_dec.double() @ unwhiten).float())
        folded.b_dec.copy_((folded.b_dec.double() @ unwhiten + mu).float())
        # the fold is exact: the folded SAE on raw rows is the whitened one mapped back
        torch.testing.assert_close(folded(x[:500]).double(), z_hat @ unwhiten + mu, rtol=1e-4, atol=1e-3)
    return x, z, raw, folded


def _whitening(flags, subject=None):
    return [f for f in flags if f.name == WHITENING and (subject is None or f.subject == subject)]


def test_a_folded_whitening_is_read_from_the_weights(rows_and_saes):
    _, _, raw, folded = rows_and_saes
    opts = CheckOptions(progress=False)
    [flag] = _whitening(check_dictionary(folded, options=opts, name="folded").flags)
    assert flag.severity == "warning" and flag.evidence["folded"] is True
    assert flag.evidence["median_cos_whitened"] > 0.5
    assert flag.evidence["median_cos_whitened"] - flag.evidence["median_cos"] > 0.2
    assert "folded" in flag.summary and "raw activations" in flag.advice
    assert not _whitening(check_dictionary(raw, options=opts, name="raw").flags)
    for name in ("saelens_trained_topk", "saelens_trained_batchtopk", "saelens_trained_standard_norm"):
        assert not _whitening(check_dictionary(FIXTURES / name, options=opts, name=name).flags), name


def test_the_input_flag_neither_misfires_nor_misses(rows_and_saes):
    """Raw rows into the folded SAE are what it expects: the report raises the SAE's folded-whitening finding and
    no input whitening flag. Rows whitened again are a second whitening: the input flag fires (an SAE reads them)."""
    x, z, _, folded = rows_and_saes
    opts, ropts = CheckOptions(progress=False), ReportOptions(progress=False, latent_cards=False)
    for rows, whitened in ((x, False), (z, True)):
        flags, notes, _ = sae_verdict(folded, rows, options=opts, name="folded")
        report = geometry_report(rows, {"folded": folded}, options=ropts, flags=flags, notes=notes)
        assert [f.evidence.get("folded") for f in _whitening(report.flags, "folded")] == [True]
        inputs = _whitening(report.flags, "activations")
        assert [f.severity for f in inputs] == (["warning"] if whitened else []), [f.summary for f in inputs]


def _medians_by_numpy(path: Path) -> tuple[float, float]:
    """median cos(e_i, w_i) and median cos(e_i, G⁻¹w_i) over every latent, G = WᵀW/N, in float64 numpy from the
    file SAELens wrote (no saegeo reader, no sampling)."""
    import numpy as np
    from safetensors.numpy import load_file

    weights = load_file(path / "sae_weights.safetensors")
    e, w = weights["W_enc"].T.astype(np.float64), weights["W_dec"].astype(np.float64)
    v = np.linalg.solve(w.T @ w / w.shape[0], w.T).T

    def cos(a, b):
        return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)

    return float(np.median(cos(e, w))), float(np.median(cos(e, v)))


def test_saelens_own_covariance_whitening_is_read_from_the_weights():
    """SAELens 6.54.12's own SAETrainer with normalize_activations = "covariance_whitening" on MiniLM blocks.3 rows
    (make_saelens_trained.py: it trains on z = (x − μ)M and folds M into the weights at the end, leaving
    normalize_activations "none"): check raises whitening_misuse (folded); the same TopK (same initial weights,
    same batches) trained on the raw rows raises none."""
    import json

    opts = CheckOptions(progress=False)
    whitened, raw = FIXTURES / "saelens_trained_topk_wide_whitened", FIXTURES / "saelens_trained_topk_wide"
    for path in (whitened, raw):  # nothing in the config says so: only the weights carry the whitening
        assert json.loads((path / "cfg.json").read_text())["normalize_activations"] == "none"
    [flag] = _whitening(check_dictionary(whitened, options=opts, name="whitened").flags)
    assert flag.severity == "warning" and flag.evidence["folded"] is True
    assert flag.evidence["latents"] == 768  # every latent (2d) sampled
    raw_cos, white_cos = _medians_by_numpy(whitened)
    assert flag.evidence["median_cos"] == pytest.approx(raw_cos, abs=1e-3)
    assert flag.evidence["median_cos_whitened"] == pytest.approx(white_cos, abs=1e-3)
    assert not _whitening(check_dictionary(raw, options=opts, name="raw").flags)
    raw_cos, white_cos = _medians_by_numpy(raw)
    assert raw_cos > 0.5 and raw_cos > white_cos  # the raw twin's encoder follows its decoder rows themselves


def test_the_whitened_median_reads_g_from_every_decoder_row_and_the_cosines_on_the_sample():
    """N = 3,000 latents, a sample of max(64, 2d) = 64: G is the second moment of all 3,000 decoder rows (from the
    sample alone it was noisy enough to pull a wide dictionary's whitened median to the floor), the two medians are
    over the sampled latents. Golden values from numpy in float64."""
    import numpy as np

    from saegeo.geometry.dictionary import whitening_alignment

    rng = np.random.default_rng(4)
    n, d = 3000, 16
    mix = rng.standard_normal((d, d)) * 0.4 + np.eye(d)
    w = rng.standard_normal((n, d)) @ np.linalg.inv(mix).T  # folded rows w = w'M⁻ᵀ
    e = rng.standard_normal((n, d)) @ mix.T * 0.3 + w @ np.linalg.inv(w.T @ w / n) * 0.2
    got = whitening_alignment(torch.tensor(e.T.copy()), torch.tensor(w), max_latents=64, block_rows=256)
    idx = np.unique(np.round(np.linspace(0, n - 1, 64)).astype(int))
    g = w.T @ w / n
    g += 1e-6 * np.trace(g) / d * np.eye(d)
    v = np.linalg.solve(g, w[idx].T).T

    def cos(a, b):
        return np.sum(a * b, 1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))

    assert got["latents"] == 64
    assert got["median_cos"] == pytest.approx(float(torch.tensor(cos(e[idx], w[idx])).median()), abs=1e-12)
    assert got["median_cos_whitened"] == pytest.approx(float(torch.tensor(cos(e[idx], v)).median()), abs=1e-9)
