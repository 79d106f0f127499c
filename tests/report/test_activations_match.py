"""`saegeo check SAE --acts STORE`: activations_mismatch when the store is not what the SAE was trained on (hook,
scale, BOS rows its metadata excludes), none on the matching store, and the metrics it withholds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from saegeo.activations.store import StoreWriter, write_store
from saegeo.report.dictionary_check import (
    ACTIVATIONS_MISMATCH,
    CheckOptions,
    activations_match_flags,
    check_with_activations,
)
from saegeo.report.geometry_report import ReportOptions
from saegeo.sae.model import SAE

FIXTURES = Path(__file__).parents[1] / "fixtures" / "published"
SAELENS = FIXTURES / "saelens_standard"  # metadata: gpt2, blocks.6.hook_resid_post, exclude_special_tokens true
LLAMA = FIXTURES / "llama_scope" / "Llama3_1-8B-Base-L15R-8x"  # dataset_average_activation_norm.in = 40
N, CONTEXT = 2048, 64


def _rows(sae, seed=0, spread=0.5):
    """Rows around the SAE's b_dec: μ ≈ b_dec, ‖μ‖ ≈ ‖b_dec‖."""
    g = torch.Generator().manual_seed(seed)
    return sae.b_dec.detach() + spread * torch.randn(N, sae.cfg.d_in, generator=g)


def _store(path, x, *, hook="blocks.6.hook_resid_post", model="gpt2", exclude_special=True, bos_scale=None):
    """A store with a positions column (0..CONTEXT-1 per context); bos_scale: position-0 rows kept and made massive."""
    positions = torch.arange(N) % CONTEXT
    if bos_scale is not None:
        x = x.clone()
        x[positions == 0] *= bos_scale
    with StoreWriter(
        path, d=x.shape[1], hook=hook, model=model, corpus={"source": "test", "exclude_special": exclude_special}
    ) as w:
        w.append(x, token_ids=torch.zeros(N, dtype=torch.int32), positions=positions.to(torch.int32))
    return path


def _mismatch(sae, store):
    flags = activations_match_flags(sae, store, subject="sae")
    assert [f.name for f in flags] in ([], [ACTIVATIONS_MISMATCH])
    return flags[0] if flags else None


def test_matching_store_raises_none(tmp_path):
    sae = SAE.load(SAELENS)
    assert _mismatch(sae, _store(tmp_path / "s", _rows(sae))) is None
    llama = SAE.load(LLAMA)  # no model name in its hyperparams: the fixture's random weights fit no rows
    x = torch.randn(N, 32, generator=torch.Generator().manual_seed(3)) * 40 / 32**0.5
    flag = _mismatch(llama, write_store(tmp_path / "l", x, hook="blocks.15.hook_resid_post", model="none"))
    assert flag.severity == "warning" and flag.evidence["causes"] == ["model"]  # a doubt, never a refusal


def test_different_hook_is_an_error(tmp_path):
    sae = SAE.load(SAELENS)
    flag = _mismatch(sae, _store(tmp_path / "s", _rows(sae), hook="blocks.4.hook_resid_post"))
    assert flag.severity == "error" and flag.evidence["causes"] == ["hook"]
    assert (
        flag.evidence["hook"]["store_hook"] == "blocks.4.hook_resid_post" and "blocks.6.hook_resid_post" in flag.summary
    )
    # same layer, other site; and an HF module name for the same activation is no mismatch
    assert _mismatch(sae, _store(tmp_path / "m", _rows(sae), hook="blocks.6.hook_mlp_out")).evidence["causes"] == [
        "hook"
    ]
    assert _mismatch(sae, _store(tmp_path / "hf", _rows(sae), hook="transformer.h.6")) is None


def test_different_model_is_an_error(tmp_path):
    sae = SAE.load(SAELENS)
    flag = _mismatch(sae, _store(tmp_path / "s", _rows(sae), model="EleutherAI/pythia-70m"))
    assert flag.severity == "error" and flag.evidence["causes"] == ["model"]


def test_scale_x10_against_the_recorded_norm_is_an_error(tmp_path):
    llama = SAE.load(LLAMA)
    x = torch.randn(N, 32, generator=torch.Generator().manual_seed(3)) * 40 / 32**0.5
    flag = _mismatch(llama, write_store(tmp_path / "l", 10 * x, hook="blocks.15.hook_resid_post"))
    assert flag.severity == "error" and "scale" in flag.evidence["causes"]
    assert flag.evidence["scale"]["ratio"] == pytest.approx(10, rel=0.05)
    assert flag.evidence["scale"]["expected_from"] == "dataset_average_activation_norm.in"


def test_scale_x10_without_a_recorded_norm_is_named(tmp_path):
    sae = SAE.load(SAELENS)
    flag = _mismatch(sae, _store(tmp_path / "s", 10 * _rows(sae)))
    assert flag.evidence["causes"] == ["scale"]  # an offset is a finding about b_dec (offset_not_absorbed)
    assert flag.evidence["scale"]["ratio"] == pytest.approx(10, rel=0.05)
    assert flag.evidence["b_dec_offset"] == pytest.approx(0.9, abs=0.02)


def test_bos_rows_the_sae_excludes(tmp_path):
    sae = SAE.load(SAELENS)
    flag = _mismatch(sae, _store(tmp_path / "s", _rows(sae), exclude_special=False, bos_scale=50.0))
    assert flag.severity == "error" and flag.evidence["causes"] == ["special_rows"]
    ev = flag.evidence["special_rows"]
    assert ev["position0_rows"] == N // CONTEXT and ev["massive_rows"] == N // CONTEXT
    # kept but ordinary rows: still named, as a warning
    flag = _mismatch(sae, _store(tmp_path / "w", _rows(sae), exclude_special=False))
    assert flag.severity == "warning" and flag.evidence["causes"] == ["special_rows"]


def test_centred_writing_weights(tmp_path):
    sae = SAE.load(SAELENS)
    sae.format_info.model_from_pretrained_kwargs = {"center_writing_weights": True}
    x = _rows(sae)
    flag = _mismatch(sae, _store(tmp_path / "u", x + 3.0))  # every row shifted along the all-ones direction
    assert "centred" in flag.evidence["causes"]
    centred = x - x.mean(1, keepdim=True)
    sae.b_dec.data -= sae.b_dec.data.mean()
    assert _mismatch(sae, _store(tmp_path / "c", centred)) is None


def test_check_withholds_fve_and_the_law_on_an_error(tmp_path):
    sae = SAE.load(SAELENS)
    opts, ropts = CheckOptions(progress=False), ReportOptions(progress=False)
    report, _ = check_with_activations(
        sae,
        _store(tmp_path / "bad", _rows(sae), hook="blocks.2.hook_resid_post"),
        options=opts,
        name="sae",
        report_options=ropts,
    )
    section = report.sae_named("sae")
    assert ACTIVATIONS_MISMATCH in report.flag_names()
    assert (
        section.fve is None and section.cone_shares is None and all(v is None for v in section.amplification.values())
    )
    assert any("withheld for sae: fve, amplification, cone_shares" in n for n in report.notes)
    report, _ = check_with_activations(
        sae, _store(tmp_path / "good", _rows(sae)), options=opts, name="sae", report_options=ropts
    )
    assert ACTIVATIONS_MISMATCH not in report.flag_names() and report.sae_named("sae").fve is not None


def test_cli_check_acts_reports_the_mismatch(tmp_path, capsys):
    from saegeo.cli import main

    sae = SAE.load(SAELENS)
    store = _store(tmp_path / "s", _rows(sae), exclude_special=False, bos_scale=50.0)
    assert (
        main(
            [
                "check",
                str(SAELENS),
                "--acts",
                str(store),
                "--no-progress",
                "--out",
                str(tmp_path / "out"),
                "--format",
                "json",
                "--fail-on",
                "error",
            ]
        )
        == 1
    )
    assert ACTIVATIONS_MISMATCH in capsys.readouterr().out
    saved = json.loads(next((tmp_path / "out").glob("*.json")).read_text())
    assert saved["saes"][0]["fve"] is None


def test_gemma_embedding_sqrt_d_scale_is_named(tmp_path):
    sae = SAE.load(SAELENS)
    sae.format_info.model_name, sae.format_info.hook_name = "google/gemma-2-2b", "hook_embed"
    x = _rows(sae) / 32**0.5  # transformer-lens hook_embed: Gemma's embeddings before the √d the model applies
    flag = _mismatch(sae, _store(tmp_path / "e", x, hook="hook_embed", model="google/gemma-2-2b"))
    assert flag.evidence["scale"]["gemma_sqrt_d"] is True and "√d embedding scale" in flag.summary
