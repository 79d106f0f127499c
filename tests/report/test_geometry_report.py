"""geometry_report: its numbers equal the geometry core's and brute-force numpy on the same rows;
every source (tensor, iterator, store, SAE directory) gives the same report; JSON round-trips."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from saegeo.activations.store import write_store
from saegeo.errors import BadInputError, FormatError
from saegeo.geometry import GeometryAccumulator, activation_geometry
from saegeo.report import GeometryReport, ReportOptions, geometry_report
from saegeo.sae.model import SAE, SAEConfig
from saegeo.sae.train import TrainConfig, train_sae
from saegeo.synthetic import SuperpositionGenerator, preset

QUIET = ReportOptions(progress=False, batch_rows=1000)


@pytest.fixture(scope="module")
def data_and_sae():
    """Tilted synthetic superposition with an offset, and a TopK SAE trained on it (b_dec := mean)."""
    torch.set_num_threads(1)
    gen = SuperpositionGenerator(preset("tilted", d=24, n_features=96, rate=0.04, offset=0.5, noise=0.05, seed=3))
    x = torch.cat(list(gen.activations(6000, 4096)))
    cfg = TrainConfig(
        arch="topk",
        arch_options={"topk": {"k": 4}},
        d_sae=96,
        total_tokens=20_480,
        batch_tokens=512,
        lr=3e-3,
        progress=False,
        heldout_fraction=0.0,
        dead_window_tokens=4096,
        seed=1,
    )
    sae = train_sae(cfg, x).sae
    return x, sae


def _pairwise_mean_cos(y: np.ndarray) -> float:
    u = y / np.linalg.norm(y, axis=1, keepdims=True)
    g = u @ u.T
    n = len(u)
    return float((g.sum() - np.trace(g)) / (n * (n - 1)))


def test_activation_section_equals_the_geometry_core(data_and_sae):
    x, _ = data_and_sae
    report = geometry_report(x, options=QUIET)
    acc = GeometryAccumulator(x.shape[1])
    for lo in range(0, len(x), 1000):
        acc.add(x[lo : lo + 1000])
    assert report.activations.to_dict() == activation_geometry(acc).to_dict()


def test_sae_numbers_equal_brute_force(data_and_sae):
    """Every SAE number of the report against numpy on the same 500 rows (all pairs where a cosine mean is
    the number): reconstruction, sparsity, firing, the decoder against the mean, the dictionary geometry
    and the amplification law's forms."""
    x, sae = data_and_sae
    rows = x[:500]  # small enough for all-pairs brute force
    report = geometry_report(rows, {"s": sae}, options=QUIET)
    s = report.sae
    mu = rows.double().mean(0)
    with torch.no_grad():
        codes = sae.encode(rows).double().numpy()
        recon = sae(rows).double().numpy()
    w = sae.W_dec.detach().double().numpy()
    b = sae.b_dec.detach().double().numpy()
    norms = np.linalg.norm(w, axis=1)
    unit = w / norms[:, None]
    a = codes * norms
    active = a > 0
    K = active.sum(1).mean()
    assert s.mean_l0 == pytest.approx(K)
    # reconstruction: FVE = 1 − Σ‖x − x̂‖² / Σ‖x − x̄‖², MSE = Σ‖x − x̂‖² / (n·d)
    xs = rows.double().numpy()
    sse = ((xs - recon) ** 2).sum()
    assert s.fve == pytest.approx(1 - sse / ((xs - xs.mean(0)) ** 2).sum(), abs=1e-6)
    assert s.mse == pytest.approx(sse / xs.size, rel=1e-6)
    assert 0.3 < s.fve < 1  # a trained SAE: the check above is not comparing two trivial numbers
    # firing: dead = never fires on these rows, dense = fires on more than half of them
    fires = (codes > 0).sum(0)
    assert s.n_dead / s.d_sae == pytest.approx((fires == 0).mean())
    assert s.n_dense / s.d_sae == pytest.approx((fires > 0.5 * len(xs)).mean())
    # each decoder row against the mean, and b_dec against the mean
    mu_np = mu.numpy()
    cos_mu = unit @ mu_np / np.linalg.norm(mu_np)
    assert s.cos_decoder_mean == pytest.approx(cos_mu.tolist(), abs=1e-6)
    assert max(abs(c) for c in s.cos_decoder_mean) == pytest.approx(np.abs(cos_mu).max(), abs=1e-6)
    assert s.b_dec_distance_to_mean == pytest.approx(np.linalg.norm(b - mu_np) / np.linalg.norm(mu_np), rel=1e-6)
    assert s.q == pytest.approx(K / w.shape[0])
    r = (a[active].mean() ** 2) / (a[active] ** 2).mean()
    assert s.r == pytest.approx(r, rel=1e-6)
    assert s.firing_frequency == pytest.approx(active.mean(0).tolist(), abs=1e-12)
    assert s.mean_activation == pytest.approx(a.mean(0).tolist(), rel=1e-5, abs=1e-9)
    mean_code = a.mean(0)
    m = mean_code @ unit
    assert s.cone_shares == pytest.approx((mean_code * (unit @ m) / (m @ m)).tolist(), rel=1e-4, abs=1e-8)
    assert sum(s.cone_shares) == pytest.approx(1.0, abs=1e-9)
    # dictionary geometry: A_dict as the mean of all pairwise cosines of the decoder rows
    assert s.a_dict == pytest.approx(_pairwise_mean_cos(w), abs=1e-10)
    assert s.dict_mean_sq_norm == pytest.approx(np.linalg.norm(unit.mean(0)) ** 2, rel=1e-9)
    assert s.decoder_norms["mean"] == pytest.approx(norms.mean(), rel=1e-6)
    dict_eig = np.sort(np.linalg.eigvalsh(np.cov(unit.T, bias=True)))[::-1]
    assert s.dictionary_spectrum["eigenvalues"] == pytest.approx(dict_eig.tolist(), abs=1e-9)
    # the three measured A's, all pairs
    amp = s.amplification
    assert amp["measured_recon_minus_b_dec"] == pytest.approx(_pairwise_mean_cos(recon - b), abs=1e-6)
    assert amp["measured_x_minus_b_dec"] == pytest.approx(_pairwise_mean_cos(rows.double().numpy() - b), abs=1e-6)
    assert amp["measured_x"] == pytest.approx(_pairwise_mean_cos(rows.double().numpy()), abs=1e-6)  # float32 rows
    # the law's forms from the closed-form expressions on the brute-force moments
    A_dict, u2, q = s.a_dict, s.dict_mean_sq_norm, K / w.shape[0]
    k_tb = K * A_dict / 2
    assert amp["textbook"] == pytest.approx(k_tb / (1 + k_tb), rel=1e-6)
    k_em = K * r * u2
    assert amp["exact_moment"] == pytest.approx(k_em / (1 + k_em - q * r), rel=1e-6)
    S, Q = a.sum(1), (a**2).sum(1)
    ratio = np.where(S > 0, S / np.sqrt(np.maximum(S**2 * u2 + (1 - u2) * Q, 1e-300)), 0.0).mean()
    assert amp["mean_cosine"] == pytest.approx(u2 * ratio**2, rel=1e-5)
    # the per-latent law and the co-firing term by the explicit double sum over i ≠ j on the dense codes
    gram = unit @ unit.T
    m1, m2 = a.mean(0), (a**2).mean(0)
    n_lat = len(m1)
    cross = sum(m1[i] * m1[j] * gram[i, j] for i in range(n_lat) for j in range(n_lat) if i != j)
    signal = sum(m1[i] * m1[j] * gram[i, j] for i in range(n_lat) for j in range(n_lat))
    y = recon - b
    second = (y**2).sum(1).mean()  # E‖x̂ − b_dec‖²
    assert amp["A_het"] == pytest.approx(signal / (m2.sum() + cross), rel=1e-5)
    assert amp["second_moment"] == pytest.approx(second, rel=1e-5)
    assert amp["cofiring_share"] == pytest.approx((second - m2.sum() - cross) / second, abs=1e-5)
    # its sampling sd: the U-statistic variance from the unit vectors' mean and second moment
    yu = y / np.linalg.norm(y, axis=1, keepdims=True)
    mm, cc, n = yu.mean(0), yu.T @ yu / len(yu), len(yu)
    var = 4 * (n - 2) / (n * (n - 1)) * (mm @ cc @ mm - (mm @ mm) ** 2) + 2 / (n * (n - 1)) * (
        (cc**2).sum() - (mm @ mm) ** 2
    )
    assert amp["measured_recon_minus_b_dec_sd"] == pytest.approx(np.sqrt(var), rel=1e-4)
    # the sample holds all 500 rows here, so each pair's share is exact: 2·Cov(a_i, a_j)·u_i·u_j / E‖x̂ − b_dec‖²
    cov = a.T @ a / len(a) - np.outer(m1, m1)
    assert amp["n_sample_rows"] == 500 and len(s.cofiring_pairs) == 20
    for p in s.cofiring_pairs:
        assert p["share"] == pytest.approx(2 * cov[p["i"], p["j"]] * gram[p["i"], p["j"]] / second, rel=1e-4, abs=1e-9)
    shares = sorted(
        (2 * cov[i, j] * gram[i, j] / second for i in range(n_lat) for j in range(i + 1, n_lat)),
        reverse=amp["cofiring_share"] >= 0,
    )
    assert [p["share"] for p in s.cofiring_pairs] == pytest.approx(shares[:20], rel=1e-4, abs=1e-9)
    # b_dec against the mean
    assert s.b_dec_cos_mean == pytest.approx(float(b @ mu.numpy() / np.linalg.norm(b) / np.linalg.norm(mu)), abs=1e-6)


def test_every_source_gives_the_same_report(data_and_sae, tmp_path):
    x, sae = data_and_sae
    by_tensor = geometry_report(x, {"s": sae}, options=QUIET)
    by_iter = geometry_report((x[lo : lo + 1000] for lo in range(0, len(x), 1000)), {"s": sae}, options=QUIET)
    store = write_store(tmp_path / "store", x, shard_rows=2500)
    sae.save(tmp_path / "sae", {"b_dec_init": "mean"})
    by_store = geometry_report(str(store.path), {"s": str(tmp_path / "sae")}, options=QUIET)
    for other in (by_iter, by_store):
        assert other.activations == by_tensor.activations
        a, b = other.sae.to_dict(), by_tensor.sae.to_dict()
        for key in ("fve", "mean_l0", "r", "firing_frequency", "cone_shares", "a_dict", "b_dec_norm"):
            assert a[key] == pytest.approx(b[key], rel=1e-9, abs=1e-12), key
        assert a["amplification"] == pytest.approx(b["amplification"], rel=1e-9)
    assert by_store.sae.b_dec_init == "mean"  # provenance read from the SAE directory
    assert by_store.source["kind"] == "store" and by_store.source["n_tokens"] == len(x)
    # batch size changes nothing beyond float32 rounding of the SAE matmuls
    other = geometry_report(x, {"s": sae}, options=ReportOptions(progress=False, batch_rows=777))
    assert other.sae.fve == pytest.approx(by_tensor.sae.fve, rel=1e-6)
    assert other.activations["anisotropy"] == pytest.approx(by_tensor.activations["anisotropy"], rel=1e-6)


def test_json_round_trip_and_schema_version(data_and_sae, tmp_path):
    x, sae = data_and_sae
    report = geometry_report(x, {"a": sae, "b": sae}, options=QUIET)
    path = tmp_path / "r.json"
    report.to_json(path)
    back = GeometryReport.load(path)
    assert back.to_dict() == report.to_dict()
    assert back.sae_named("b").fve == report.saes[1].fve
    assert [f.name for f in back.flags] == [f.name for f in report.flags]
    raw = json.loads(path.read_text())
    raw["schema_version"] = 999
    path.write_text(json.dumps(raw))
    with pytest.raises(FormatError, match="schema_version 999"):
        GeometryReport.load(path)


def test_cosine_histogram_is_the_all_pairs_histogram_when_the_sample_holds_every_row():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((300, 10)) + 0.5
    report = geometry_report(
        torch.from_numpy(x),
        options=ReportOptions(progress=False, batch_rows=64, cosine_sample_rows=1000, histogram_bins=40),
    )
    h = report.cosine_histogram
    u = x / np.linalg.norm(x, axis=1, keepdims=True)
    cos = (u @ u.T)[np.triu_indices(300, 1)]
    counts, _ = np.histogram(cos, bins=40, range=(-1, 1))
    assert h["counts"] == counts.tolist()
    assert h["sample_mean"] == pytest.approx(report.activations["anisotropy"], abs=1e-9)


def test_reservoir_sample_is_uniform():
    # rows carry their index; over many seeds every region of the stream is sampled equally often
    n, k = 2000, 50
    x = torch.zeros(n, 2, dtype=torch.float64)
    x[:, 0] = torch.arange(n, dtype=torch.float64) + 1
    x[:, 1] = 1.0
    from saegeo.report.geometry_report import _Reservoir

    hits = np.zeros(4)
    for seed in range(60):
        res = _Reservoir(k, 2, seed)
        for lo in range(0, n, 300):
            res.add(x[lo : lo + 300])
        idx = res.sample()[:, 0].numpy().astype(int) - 1
        assert len(set(idx.tolist())) == k  # no row twice
        hits += np.bincount(idx // 500, minlength=4)
    expected = 60 * k / 4
    assert np.all(np.abs(hits - expected) < 5 * math.sqrt(expected))  # chi-like bound, each quarter


def test_max_tokens_and_bad_inputs(data_and_sae):
    x, sae = data_and_sae
    report = geometry_report(x, options=ReportOptions(progress=False, batch_rows=700, max_tokens=1500))
    assert report.activations["n"] == 1500
    with pytest.raises(BadInputError, match="d_in = 24 but the activations have d = 5"):
        geometry_report(torch.randn(100, 5), {"s": sae}, options=QUIET)
    with pytest.raises(BadInputError, match="no rows"):
        geometry_report(iter([]), options=QUIET)
    with pytest.raises(BadInputError, match="not an activation store"):
        geometry_report("/nonexistent/store", options=QUIET)


def test_cli_report_writes_every_format(data_and_sae, tmp_path, capsys):
    from saegeo.cli import main

    x, sae = data_and_sae
    write_store(tmp_path / "store", x[:3000], shard_rows=1000)
    sae.save(tmp_path / "sae", {"b_dec_init": "mean"})
    rc = main(
        [
            "report",
            "--acts",
            str(tmp_path / "store"),
            "--sae",
            f"mine={tmp_path / 'sae'}",
            "--out",
            str(tmp_path / "out"),
            "--no-progress",
            "--batch-rows",
            "1000",
        ]
    )
    assert rc == 0
    printed = capsys.readouterr().out
    assert printed.startswith("saegeo report") and "mine" in printed
    rep = GeometryReport.load(tmp_path / "out" / "report.json")
    assert rep.sae.name == "mine" and rep.activations["n"] == 3000
    direct = geometry_report(x[:3000], {"mine": sae}, options=QUIET)
    assert rep.sae.fve == pytest.approx(direct.sae.fve, rel=1e-9)
    for f in ("summary.txt", "report.md", "report.html"):
        assert (tmp_path / "out" / f).is_file()
    # a bad store path is a clean error (exit 2), not a traceback
    assert main(["report", "--acts", str(tmp_path / "nope"), "--out", str(tmp_path / "o2"), "--no-progress"]) == 2
    assert "not an activation store" in capsys.readouterr().err


def test_cosine_sample_does_not_depend_on_batching():
    x = torch.from_numpy(np.random.default_rng(2).standard_normal((3000, 6)) + 0.3)
    hists = [
        geometry_report(
            x, options=ReportOptions(progress=False, batch_rows=bs, cosine_sample_rows=200)
        ).cosine_histogram
        for bs in (64, 1000, 3000)
    ]
    assert hists[0] == hists[1] == hists[2]
    assert hists[0]["n_rows"] == 200


def test_demo_config_is_valid():
    from pathlib import Path

    from saegeo.activations.cache import CacheConfig
    from saegeo.pipeline import load_run_config

    cfg = load_run_config(Path(__file__).parents[2] / "configs" / "demo.toml")
    assert isinstance(cfg.cache, CacheConfig) and isinstance(cfg.report, ReportOptions)
    # the comparison the demo exists for
    assert {cfg.sae_config(name).b_dec_init for name in cfg.saes} == {"mean", "zeros"}
    assert all(isinstance(cfg.sae_config(name), TrainConfig) for name in cfg.saes)


@pytest.mark.parametrize("normalization,activation", [("layer_norm", "topk"), ("constant_norm_rescale", "relu")])
def test_fve_of_input_normalised_saes_uses_the_denormalised_reconstruction(normalization, activation):
    """OpenAI-style SAEs encode LayerNorm(x) and undo it after decoding: FVE = 1 − Σ‖x − x̂‖²/Σ‖x − μ‖² with x̂ in
    the input space, computed here directly from numpy (LN by hand), not from the report's code path."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3000, 16, generator=g) * 2 + 3
    cfg = SAEConfig(
        d_in=16,
        d_sae=48,
        activation=activation,
        k=6 if activation == "topk" else None,
        input_normalization=normalization,
    )
    sae = SAE(cfg)
    with torch.no_grad():
        sae.W_enc.copy_(torch.randn(16, 48, generator=g) * 0.3)
        sae.W_dec.copy_(torch.randn(48, 16, generator=g) * 0.3)
        sae.b_dec.copy_(torch.randn(16, generator=g) * 0.1)
    xn = x.double().numpy()
    if normalization == "layer_norm":
        mu = xn.mean(1, keepdims=True)
        sd = (xn - mu).std(1, ddof=1, keepdims=True)
        z = (xn - mu) / (sd + cfg.layer_norm_eps)
    else:
        coeff = np.sqrt(16) / np.linalg.norm(xn, axis=1, keepdims=True)
        z = xn * coeff
    W_enc, W_dec = sae.W_enc.detach().double().numpy(), sae.W_dec.detach().double().numpy()
    b_enc, b_dec = sae.b_enc.detach().double().numpy(), sae.b_dec.detach().double().numpy()
    pre = (z - b_dec) @ W_enc + b_enc
    if activation == "topk":
        codes = np.zeros_like(pre)
        top = np.argsort(-pre, axis=1)[:, :6]
        np.put_along_axis(codes, top, np.maximum(np.take_along_axis(pre, top, 1), 0), 1)
    else:
        codes = np.maximum(pre, 0)
    recon_z = codes @ W_dec + b_dec
    recon = recon_z * sd + mu if normalization == "layer_norm" else recon_z / coeff
    fve = 1 - ((xn - recon) ** 2).sum() / ((xn - xn.mean(0)) ** 2).sum()
    report = geometry_report(x, sae, options=QUIET)
    assert report.sae.fve == pytest.approx(fve, abs=1e-4)


def test_the_report_is_assembled_once_from_all_its_inputs(data_and_sae):
    """Splice results, flags raised elsewhere and an activations_mismatch error are inputs of geometry_report:
    the flags and the diagnosis come out of the one call, and re-flagging the saved report reproduces its own."""
    from saegeo.report import Flag, FlagThresholds, compute_flags
    from saegeo.report.flags import (
        ACTIVATIONS_MISMATCH,
        MEAN_DIRECTION,
        WITHHELD_FLAGS,
        WITHHELD_METRICS,
        activation_diagnosis,
    )

    x, sae = data_and_sae
    # every latent counts as mean-aligned: the mean-direction flag is raised from numbers that are not withheld
    opts = ReportOptions(
        progress=False,
        batch_rows=1000,
        thresholds=FlagThresholds(mean_direction_min_frequency=0.0, mean_direction_min_cos=0.0),
    )
    splice = {"s": {"ce_loss_recovered": 0.75, "tokens": 10}}
    mismatch = Flag(
        ACTIVATIONS_MISMATCH, "error", {"causes": ["hook"]}, "cache the SAE's hook", summary="hook differs", subject="s"
    )
    given = Flag("zero_decoder_rows", "warning", {"n_zero_rows": 1}, "drop them", summary="1 zero row", subject="s")
    plain = geometry_report(x, {"s": sae}, options=opts)
    assert (MEAN_DIRECTION, "s") in {(f.name, f.subject) for f in plain.flags}
    report = geometry_report(
        x, {"s": sae}, options=opts, splice=splice, flags=[given, mismatch], notes=["first"], closing_notes=["last"]
    )
    s = report.sae
    assert s.splice == splice["s"] and plain.sae.splice is None
    assert s.withheld == list(WITHHELD_METRICS) and s.fve is None and s.cone_shares is None
    assert s.amplification and all(v is None for v in s.amplification.values())
    assert plain.sae.fve is not None and plain.sae.withheld == []
    assert report.notes[-3:] == ["first", s.notes[-1], "last"] and s.notes[-1].startswith("withheld for s")
    assert {(f.name, f.subject) for f in report.flags} >= {(ACTIVATIONS_MISMATCH, "s"), ("zero_decoder_rows", "s")}
    assert not [f for f in report.flags if f.subject == "s" and f.name in WITHHELD_FLAGS]
    assert [f.severity for f in report.flags] == sorted(
        (f.severity for f in report.flags), key=("error", "warning", "info").index
    )
    # the report's own flags, re-computed from its saved numbers, are the flags it holds less the given ones
    again = compute_flags(GeometryReport.from_dict(json.loads(report.to_json())))
    assert [f.to_dict() for f in again] == [f.to_dict() for f in report.flags if f not in (given, mismatch)]
    assert report.diagnosis == activation_diagnosis(
        {**report.activations, "sample_diagnostics": report.sample_diagnostics}, report.flags, opts.thresholds
    )
    # a given flag the report raises itself is superseded by the report's own
    own = next(f for f in plain.flags)
    dup = Flag(own.name, own.severity, {}, "elsewhere", summary="elsewhere", subject=own.subject)
    merged = geometry_report(x, {"s": sae}, options=opts, flags=[dup])
    assert [f.to_dict() for f in merged.flags] == [f.to_dict() for f in plain.flags]


def test_held_out_figures_over_the_rows_training_held_out(data_and_sae, tmp_path):
    """An SAE saegeo trained on a store records the rows it held out (the store's last N): the report gives FVE,
    mse and L0 over those rows beside the all-rows figures, equal to numpy on those rows and to what training
    measured on them; the table says which rows each figure is over. A store its provenance does not name (the
    same rows in other shards) gets no held-out figures and no held-out row."""
    from saegeo.render import render_terminal
    from saegeo.render.common import fmt_num

    x, _ = data_and_sae
    store = write_store(tmp_path / "store", x, shard_rows=2500)
    cfg = TrainConfig(
        arch="topk",
        arch_options={"topk": {"k": 4}},
        d_sae=96,
        total_tokens=10_240,
        batch_tokens=512,
        lr=3e-3,
        progress=False,
        heldout_fraction=0.2,
        dead_window_tokens=4096,
        seed=1,
        out_dir=str(tmp_path / "sae"),
    )
    trained = train_sae(cfg, store)
    report = geometry_report(store, {"s": tmp_path / "sae"}, options=ReportOptions(progress=False, batch_rows=700))
    s, h = report.sae, report.sae.heldout
    assert h["first_row"] == 4800 and h["n_tokens"] == 1200  # the last 20 % of 6,000 rows in store order
    sae = SAE.load(tmp_path / "sae")
    held = x[4800:]
    with torch.no_grad():
        recon, codes = sae(held).double().numpy(), sae.encode(held).numpy()
    xs = held.double().numpy()
    sse = ((xs - recon) ** 2).sum()
    assert h["fve"] == pytest.approx(1 - sse / ((xs - xs.mean(0)) ** 2).sum(), abs=1e-6)
    assert h["mse"] == pytest.approx(sse / xs.size, rel=1e-6)
    assert h["mean_l0"] == pytest.approx((codes != 0).sum(1).mean())
    assert h["fve"] == pytest.approx(trained.heldout["fve"], abs=1e-6)  # training's own evaluation of those rows
    assert abs(s.fve - h["fve"]) > 1e-4  # the all-rows figure is another number
    text = render_terminal(report)
    assert (
        f"FVE (all rows)  {fmt_num(s.fve)}".split()
        == next(line for line in text.splitlines() if "FVE (all rows)" in line).split()
    )
    held_line = next(line for line in text.splitlines() if "FVE / L0 (held out)" in line)
    assert f"{fmt_num(h['fve'])} / {fmt_num(h['mean_l0'], 1)} (1,200 rows)" in held_line
    assert json.loads(report.to_json())["saes"][0]["heldout"] == pytest.approx(h)
    other = geometry_report(write_store(tmp_path / "other", x, shard_rows=3000), {"s": tmp_path / "sae"}, options=QUIET)
    assert other.sae.heldout is None and "held out" not in render_terminal(other)
