"""The layer sweep, the pooling refusal of `saegeo geometry`, and the artifact test in the report."""

import json
import math

import pytest
import torch

from saegeo.activations.store import ActivationStore, StoreWriter
from saegeo.cli import main
from saegeo.render import write_sweep
from saegeo.report.layer_sweep import SweepOptions, sweep_stores


def _write(path, x, *, hook, model="toy", ids=None, positions=None, shard_rows=500):
    n = x.shape[0]
    ids = torch.arange(n) % 37 if ids is None else ids
    positions = torch.arange(n) % 50 if positions is None else positions
    with StoreWriter(path, d=x.shape[1], hook=hook, model=model, shard_rows=shard_rows) as w:
        for lo in range(0, n, 300):
            w.append(x[lo : lo + 300], token_ids=ids[lo : lo + 300], positions=positions[lo : lo + 300])
    return ActivationStore(path)


def test_residual_toy_anisotropy_is_L_over_L_plus_1(tmp_path):
    """h_L = L·c + √L·g, ‖c‖² = d, g standard normal: cos(h_i, h_j) → L²d/(L²d + Ld) = L/(L + 1) at large d."""
    d, n = 1024, 150
    g = torch.Generator().manual_seed(0)
    c = torch.randn(d, generator=g)
    c = c / c.norm() * math.sqrt(d)
    stores = []
    for L in (4, 1, 6, 2, 5, 3):  # out of order on purpose
        h = L * c + math.sqrt(L) * torch.randn(n, d, generator=g)
        stores.append(_write(tmp_path / f"L{L}", h, hook=f"blocks.{L - 1}.hook_resid_post"))
    sweep = sweep_stores(stores, SweepOptions(artifact_components=1, progress=False))
    assert [r["layer"] for r in sweep.layers] == [1, 2, 3, 4, 5, 6]
    for r in sweep.layers:
        L = r["layer"]
        assert r["A"] == pytest.approx(L / (L + 1), abs=0.01)


def _two_layer_stores(tmp_path, model_b="toy"):
    g = torch.Generator().manual_seed(1)
    x0 = torch.randn(1700, 12, generator=g) + 1.0
    x1 = torch.randn(1700, 12, generator=g) * torch.linspace(0.2, 3, 12) + 0.3
    a = _write(tmp_path / "a", x0, hook="blocks.0.hook_resid_pre")
    b = _write(tmp_path / "b", x1, hook="blocks.0.hook_resid_post", model=model_b)
    return a, b


def test_sweep_rows_equal_geometry_on_each_store_alone(tmp_path, capsys):
    a, b = _two_layer_stores(tmp_path)
    assert (
        main(
            [
                "sweep",
                str(b.path),
                str(a.path),
                "--json",
                str(tmp_path / "sweep.json"),
                "--batch-rows",
                "256",
                "--no-progress",
            ]
        )
        == 0
    )
    rows = json.loads((tmp_path / "sweep.json").read_text())["layers"]
    assert [r["hook"] for r in rows] == ["blocks.0.hook_resid_pre", "blocks.0.hook_resid_post"]
    for store, row in zip((a, b), rows):
        out = tmp_path / f"{store.path.name}.json"
        assert main(["geometry", str(store.path), "--json", str(out), "--batch-rows", "256", "--no-progress"]) == 0
        geo = json.loads(out.read_text())
        pairs = {
            "A": "anisotropy",
            "A_null": None,
            "offset": "offset",
            "total_variance": "total_variance",
            "mean_share": "mean_share_of_second_moment",
            "erank": "effective_rank",
            "top1": "top1_share",
            "top10": "top10_share",
            "isoscore": "isoscore",
            "mp_spikes": "n_spikes",
            "noise_erank": "noise_effective_rank",
        }
        for key, gkey in pairs.items():
            expected = geo["sign"]["null"] if key == "A_null" else geo[gkey]
            assert row[key] == expected, key
        assert row["rogue_50"] == geo["rogue"]["n_for_50"]
        assert row["mean_sq_norm"] == pytest.approx(geo["mean_vector_norm"] ** 2, rel=1e-15)
        assert row["pc1_abs_corr_norm"] == geo["artifact"]["abs"]["norm"][0]
    capsys.readouterr()


def test_geometry_refuses_to_pool_stores_of_different_hooks(tmp_path, capsys):
    a, b = _two_layer_stores(tmp_path)
    assert main(["geometry", str(a.path), str(b.path), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--pool" in err and "blocks.0.hook_resid_post" in err
    assert main(["geometry", str(a.path), str(b.path), "--pool", "--no-progress"]) == 0


def test_sweep_refuses_stores_of_different_models(tmp_path, capsys):
    a, b = _two_layer_stores(tmp_path, model_b="other")
    assert main(["sweep", str(a.path), str(b.path), "--no-progress"]) == 2
    assert "sweep each model separately" in capsys.readouterr().err
    assert main(["sweep", "--no-progress"]) == 2


def test_sweep_renderings(tmp_path):
    a, b = _two_layer_stores(tmp_path)
    sweep = sweep_stores([a, b])
    paths = write_sweep(sweep, tmp_path / "out")
    assert set(paths) == {"terminal", "md", "json", "html"}
    assert (tmp_path / "out" / "sweep.png").stat().st_size > 1000
    assert "data:image/png;base64," in paths["html"].read_text()
    assert "blocks.0.hook_resid_post" in paths["terminal"].read_text()


def _positional_store(tmp_path):
    """PC1 is the position in the window: x = (pos − 20)·v + small isotropic noise (‖x‖ ∝ |pos − 20|, not pos)."""
    g = torch.Generator().manual_seed(2)
    n, d = 2000, 16
    pos = torch.arange(n) % 40
    v = torch.randn(d, generator=g)
    x = (pos[:, None].float() - 20) * v / v.norm() + 0.3 * torch.randn(n, d, generator=g)
    return _write(tmp_path / "pos", x, hook="blocks.1.hook_resid_post", positions=pos)


def test_report_runs_the_artifact_test_on_a_store_and_flags_it(tmp_path):
    from saegeo.render import render_terminal
    from saegeo.report import FlagThresholds, ReportOptions, compute_flags, geometry_report

    store = _positional_store(tmp_path)
    report = geometry_report(store, options=ReportOptions(progress=False))
    assert report.artifact["abs"]["position"][0] > 0.99
    flags = [f for f in report.flags if f.name == "artifact_direction"]
    assert len(flags) == 1 and flags[0].evidence["component"] == 1
    assert flags[0].summary.startswith("PC1 tracks position in the window")
    assert "all-but-the-top" in flags[0].advice and "evidence" in flags[0].advice
    assert "artifact" in render_terminal(report)
    assert not [
        f for f in compute_flags(report, FlagThresholds(artifact_min_abs_corr=0.9999)) if f.name == "artifact_direction"
    ]
    tensor_report = geometry_report(store.read_rows(0, 2000), options=ReportOptions(progress=False))
    assert tensor_report.artifact is None
    assert any("artifact test not run" in n for n in tensor_report.notes)


def test_geometry_cli_prints_the_artifact_test_on_a_store(tmp_path, capsys):
    store = _positional_store(tmp_path)
    assert main(["geometry", str(store.path), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "artifact_direction" in out and "position in the window" in out


def test_sweep_on_minilm_from_one_cache_pass(tmp_path, capsys):
    assert (
        main(
            [
                "sweep",
                "--model",
                "minilm",
                "--max-tokens",
                "1500",
                "--context",
                "64",
                "--cache-dir",
                str(tmp_path / "acts"),
                "--json",
                str(tmp_path / "s.json"),
                "--no-progress",
            ]
        )
        == 0
    )
    doc = json.loads((tmp_path / "s.json").read_text())
    assert [r["layer"] for r in doc["layers"]] == list(range(7))
    assert doc["layers"][0]["hook"] == "blocks.0.hook_resid_pre"
    for r in doc["layers"]:
        assert r["n"] == 1500 and 0 < r["A"] < 1 and 0 < r["between_share"] < 1
        assert r["pc1_abs_corr_position"] is not None and r["self_similarity"] is not None
    assert "cached 7 hook(s) in one pass" in capsys.readouterr().out


def test_sweep_max_types_reports_the_pooled_other_type(tmp_path, capsys):
    a, _ = _two_layer_stores(tmp_path)  # 37 token ids
    assert main(["sweep", str(a.path), "--max-types", "5", "--json", str(tmp_path / "s.json"), "--no-progress"]) == 0
    tt = json.loads((tmp_path / "s.json").read_text())["layers"][0]["details"]["token_types"]
    assert tt["n_types"] == 37 and tt["n_types_kept"] == 5 and tt["other_n_types"] == 32
    assert tt["other_n_tokens"] == 1700 - sum(1 for i in range(1700) if i % 37 in set(range(5)))
    assert tt["kept_exact_top"]
    capsys.readouterr()


def test_sweep_saes_give_each_layer_its_planted_decoder_power_law(tmp_path, capsys):
    """Issue 41 item 5: three layers' SAEs whose decoder rows are Gaussian with covariance eigenvalues k^(−α) (α 0.5,
    1.5, 1.0 by depth: steepest in the middle layer) are read from DIR/<hook>; each row's decoder α is the planted
    one (the fit over the middle ranks: within 0.1 at 2,048 × 64, the unit rows flatten α 1.5 to 1.43), the column and panel appear, and a --saes that
    is no directory is one line, exit 2."""
    from saegeo.render.sweep_page import render_sweep_markdown
    from saegeo.sae.model import SAE, SAEConfig

    d, planted = 64, {0: 0.5, 1: 1.5, 2: 1.0}
    g = torch.Generator().manual_seed(3)
    stores = []
    for layer, alpha in planted.items():
        hook = f"blocks.{layer}.hook_resid_post"
        stores.append(_write(tmp_path / f"s{layer}", torch.randn(300, d, generator=g), hook=hook))
        sae = SAE(SAEConfig(d_in=d, d_sae=2048, activation="relu")).init_weights(torch.Generator().manual_seed(layer))
        with torch.no_grad():
            sae.W_dec.copy_(torch.randn(2048, d, generator=g) * torch.arange(1, d + 1).pow(-alpha / 2))
        sae.save(tmp_path / "saes" / hook)
    sweep = sweep_stores(stores, SweepOptions(artifact_components=1, progress=False, saes=str(tmp_path / "saes")))
    for row in sweep.layers:
        assert row["decoder_power_law_alpha"] == pytest.approx(planted[row["layer"] - 1], abs=0.1)
        assert row["decoder_power_law_r2"] > 0.99
    alphas = [r["decoder_power_law_alpha"] for r in sweep.layers]
    assert alphas[1] > alphas[2] > alphas[0]  # the planted shape: steepest in the middle layer
    assert "SAE decoder α" in render_sweep_markdown(sweep)
    plain = sweep_stores(stores[:1], SweepOptions(artifact_components=1, progress=False))
    assert "decoder_power_law_alpha" not in plain.layers[0] and "SAE decoder α" not in render_sweep_markdown(plain)
    assert main(["sweep", str(stores[0].path), "--saes", str(tmp_path / "nowhere"), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--saes" in err and "not a directory" in err


def test_sweep_with_artifact_components_0_skips_the_artifact_test(tmp_path, capsys):
    """`--artifact-components 0` says "0: skip it": the sweep runs, its rows carry no artifact correlations, and the
    positional store that flags at the default raises no artifact flag."""
    import json

    store = _positional_store(tmp_path)
    out = tmp_path / "s.json"
    assert main(["sweep", str(store.path), "--artifact-components", "0", "--json", str(out), "--no-progress"]) == 0
    doc = json.loads(out.read_text())
    assert not any(f["name"] == "artifact_direction" for f in doc["flags"])
    assert all(row["pc1_abs_corr_position"] is None for row in doc["layers"])
    assert main(["sweep", str(store.path), "--json", str(tmp_path / "d.json"), "--no-progress"]) == 0
    assert any(f["name"] == "artifact_direction" for f in json.loads((tmp_path / "d.json").read_text())["flags"])
