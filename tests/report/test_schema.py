"""One name per quantity, read through one schema: the flags and the renderers read the activation geometry through
a FieldDict over the ActivationGeometry fields, so a key no result carries (a rename, a typo) raises instead of
reading None. The last test renders every page and computes every flag on a full report, so every read is checked."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from saegeo.activations.store import ActivationStore, StoreWriter
from saegeo.geometry.measures import ActivationGeometry, FieldDict, checked_geometry, fields_of
from saegeo.sae.model import SAE, SAEConfig


def test_a_field_dict_refuses_keys_outside_its_schema():
    d = FieldDict({"a": 1}, ["a", "b"], "Thing")
    assert d["a"] == 1 and d.get("a") == 1
    assert d.get("b") is None and d.get("b", 7) == 7  # a field this result lacks (an older result)
    with pytest.raises(KeyError, match="Thing has no field 'c'"):
        d.get("c")
    with pytest.raises(KeyError, match="Thing has no field 'c'"):
        d["c"]
    assert json.loads(json.dumps(d)) == {"a": 1}


def test_checked_geometry_checks_the_nested_results_too():
    geo = checked_geometry({"n": 3, "sign": {"null": 0.1}, "rogue": {"n_for_50": 1}, "mp_bulk": {"sigma2_bulk": 1.0}})
    assert geo["sign"]["null"] == 0.1 and geo["mp_bulk"].get("power_law_alpha") is None
    for bad in (
        lambda: geo.get("z_vs_null"),
        lambda: geo["sign"].get("nul"),
        lambda: geo["rogue"]["top"],
        lambda: geo["mp_bulk"].get("sigma2"),
    ):
        with pytest.raises(KeyError):
            bad()
    with pytest.raises(KeyError):
        checked_geometry({}, extra=("first_position",)).get("artifact")


def test_one_name_per_quantity_with_the_two_z_kept_apart():
    names = set(fields_of(ActivationGeometry))
    assert {"null_z", "null_sd", "isotropic_z", "isotropic_sd", "mp_sigma2_bulk", "mp_sigma2_trace"} <= names
    assert not names & {"z_vs_null", "anisotropy_z", "A_null_sd", "anisotropy_null_sd", "mp_sigma2", "A_z"}


def _store(path, x, hook="blocks.1.hook_resid_post"):
    n = x.shape[0]
    with StoreWriter(path, d=x.shape[1], hook=hook, model="toy", shard_rows=700) as w:
        for lo in range(0, n, 300):
            w.append(
                x[lo : lo + 300],
                token_ids=torch.arange(lo, min(lo + 300, n)) % 29,
                positions=torch.arange(lo, min(lo + 300, n)) % 40,
            )
    return ActivationStore(path)


def test_every_page_and_every_flag_of_a_full_report_reads_only_known_fields(tmp_path):
    from saegeo.render import (
        figures,
        render_check_html,
        render_check_markdown,
        render_check_terminal,
        render_geometry,
        render_html,
        render_markdown,
        render_sweep_html,
        render_sweep_markdown,
        render_sweep_terminal,
        render_terminal,
    )
    from saegeo.report import (
        GeometryReport,
        ReportOptions,
        check_dictionary,
        check_with_activations,
        compute_flags,
        geometry_report,
    )
    from saegeo.report.flags import activation_diagnosis, flag_inputs
    from saegeo.report.geometry import files_geometry
    from saegeo.report.layer_sweep import SweepOptions, sweep_stores

    g = torch.Generator().manual_seed(0)
    d, n_lat = 12, 40
    offset = 5 * torch.randn(d, generator=g)
    x = torch.randn(2100, d, generator=g) * torch.linspace(0.3, 2, d) + offset
    x[::50, 0] += 40.0  # massive rows: the massive-activation and artifact flags have something to say
    store = _store(tmp_path / "s", x)
    planted = SAE(SAEConfig(d_in=d, d_sae=n_lat, activation="relu")).init_weights(torch.Generator().manual_seed(1))
    clean = SAE(SAEConfig(d_in=d, d_sae=n_lat, activation="topk", k=4)).init_weights(
        torch.Generator().manual_seed(2), b_dec=x.mean(0)
    )
    with torch.no_grad():
        planted.W_dec[0] = offset / offset.norm()
        planted.W_enc[:, 0] = 0.0
        planted.b_enc[0] = 6.0
    splice = {
        "planted": {
            "ce_loss_clean": 2.0,
            "ce_loss_spliced": 2.5,
            "ce_loss_zero_ablation": 4.0,
            "ce_loss_mean_ablation": 3.0,
            "ce_loss_recovered": 0.75,
            "kl_div_spliced": 0.1,
            "kl_div_zero_ablation": 1.0,
            "fve": 0.5,
            "l0": 4.0,
            "tokens": 100,
            "passed_through": {"positions": 3, "special_positions": ["<bos>"]},
        }
    }
    opts = ReportOptions(progress=False, batch_rows=500)
    report = geometry_report(
        store,
        {"planted": planted, "clean": clean},
        options=opts,
        splice=splice,
        config={"normalize_activations": "covariance_whitening"},
    )
    assert report.artifact is not None and report.whitening_cost is not None and report.saes[0].splice
    assert isinstance(report.activations, ActivationGeometry)
    loaded = GeometryReport.from_dict(json.loads(report.to_json()))
    assert isinstance(loaded.activations, ActivationGeometry) and loaded.activations == report.activations
    assert [f.to_dict() for f in compute_flags(loaded)] == [f.to_dict() for f in report.flags]
    activation_diagnosis(flag_inputs(loaded.activations, loaded.artifact, loaded.sample_diagnostics))
    for page in (report, loaded):
        render_terminal(page), render_markdown(page, figure_dir="figures"), page.to_json()
    # the latent cards and table: exactly the keys of the contract (docs/design.md "Latent cards"), round-tripped
    card_keys = {
        "id",
        "why",
        "firing_rate",
        "mean_activation",
        "mean_sq_activation",
        "cos_mu",
        "cone_share",
        "decoder_norm",
        "dead",
        "dense",
        "histogram",
        "neighbours",
        "top_contexts",
    }
    context_keys = {"row", "activation", "token_id", "position", "text", "context", "after"}
    table_keys = {
        "id",
        "rate",
        "mean_activation",
        "mean_sq_activation",
        "cos_mu",
        "cone_share",
        "decoder_norm",
        "dead",
        "dense",
        "nn_id",
        "nn_cos",
        "norm_corr",
        "position_corr",
        "log_frequency_corr",
    }
    assert report.sae_named("planted").latents  # the planted SAE's flags name latents; the clean one's none
    for s in report.saes:
        assert all(set(c) == card_keys for c in s.latents)
        assert all(set(t) == context_keys for c in s.latents for t in c["top_contexts"])
        assert set(s.latent_table) == table_keys and all(len(v) == s.d_sae for v in s.latent_table.values())
    assert [s.latents for s in loaded.saes] == [s.latents for s in report.saes]
    assert [s.latent_table for s in loaded.saes] == [s.latent_table for s in report.saes]
    from saegeo.render import latents_csv, latents_document, render_latents_markdown, render_latents_terminal

    for page in (report, loaded):
        doc = latents_document(page)
        render_latents_terminal(doc), render_latents_markdown(doc), latents_csv(doc)
    render_html(report, figures(report))
    # `saegeo check` with and without activations (the mismatch path withholds metrics)
    planted.format_info = dataclasses.replace(planted.format_info, hook_name="blocks.5.hook_resid_post")
    with_acts, dcheck = check_with_activations(planted, store, report_options=opts)
    assert with_acts.saes[0].withheld
    render_terminal(with_acts), render_markdown(with_acts)
    check = check_dictionary(clean)
    render_check_terminal(check), render_check_markdown(check), render_check_html(check)
    render_check_terminal(dcheck)
    # `saegeo geometry` and `saegeo sweep`
    render_geometry(files_geometry([str(store.path)]))
    other = _store(tmp_path / "t", x[:, torch.randperm(d, generator=g)], hook="blocks.2.hook_resid_post")
    sweep = sweep_stores([store, other], SweepOptions(artifact_components=2, progress=False))
    render_sweep_terminal(sweep), render_sweep_markdown(sweep)
    render_sweep_html(sweep, png=b"")
