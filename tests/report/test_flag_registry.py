"""The flag registry (saegeo.report.flags): every flag is one discovered module; each severity band of each flag has
a case inside it here (or in the named test); a threshold set on the command line changes a verdict; a toy flag added
as one file is found, takes its threshold from the command line and is raised by the report; docs/design.md's flags
table is the registry's; `check --acts` and `report --sae` raise the same flags on the same inputs."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import pkgutil
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import saegeo.report.flags as flags_pkg
from saegeo.cli import main
from saegeo.report.flags import registry, run_flags
from saegeo.report.options import CheckOptions, FlagThresholds, ReportOptions

ROOT = Path(__file__).resolve().parents[2]
T = FlagThresholds()


def _spec(name: str, stage: str):
    [spec] = [s for s in registry() if s.name == name and s.stage == stage]
    return spec


def _run(name: str, stage: str, t=T, **q):
    found = _spec(name, stage).run(q, t)
    return [found] if found is not None and not isinstance(found, list) else list(found or [])


def _geo(**kw):
    return {"n": 1000, "d": 10, "numerical_rank": 10, "mp_upper_edge": 1.2, "mp_lower_edge": 0.8, **kw}


def _sae(freq, cos=None, **kw):
    return {
        "name": "s",
        "d_sae": len(freq),
        "n_tokens": 1000,
        "firing_frequency": list(freq),
        "cos_decoder_mean": list(cos if cos is not None else [0.0] * len(freq)),
        "cone_shares": None,
        "amplification": {},
        **kw,
    }


def _check(**kw):
    base = dict(
        source={"d_sae": 100},
        n_zero_decoder_rows=0,
        zero_rows=[],
        decoder_norms={"median": 1.0},
        n_duplicate_pairs=0,
        duplicate_pairs=[],
        encoder_decoder_cos={"median": 0.9},
        b_dec={"norm": 1.0, "mean_direction_norm": 0.5},
    )
    return SimpleNamespace(**{**base, **kw})


def _dictionary_sae(input_normalization="none", **info):
    fields = dict(
        normalize_activations="none", folded_scaling_factor=None, transcoder=False, threshold_unset=False, threshold=0
    )
    return SimpleNamespace(
        format_info=SimpleNamespace(**{**fields, **info}),
        cfg=SimpleNamespace(input_normalization=input_normalization, layer_norm_eps=1e-5),
    )


def _duplicates(n_pairs: int):
    pairs = torch.tensor([[2 * i, 2 * i + 1] for i in range(n_pairs)])
    q = {
        "check": _check(n_duplicate_pairs=n_pairs, duplicate_pairs=[[2 * i, 2 * i + 1, 0.999] for i in range(n_pairs)]),
        "pairs": pairs,
        "pair_cos": torch.full((n_pairs,), 0.999),
        "duplicate_cos": 0.99,
        "subject": "s",
    }
    return q


def _misaligned(n_below: int):
    enc_dec = torch.ones(100)
    enc_dec[:n_below] = -0.5
    return {"check": _check(), "enc_dec": enc_dec, "zero": torch.zeros(100, dtype=torch.bool), "misaligned_cos": 0.0}


def _whitened(n=1000, d=10):
    upper, lower = (1 + math.sqrt(d / n)) ** 2, (1 - math.sqrt(d / n)) ** 2
    return _geo(
        n=n,
        d=d,
        eigenvalues=[1.0] * d,
        mp_upper_edge=upper,
        mp_lower_edge=lower,
        mean_share_of_second_moment=0.0,
        mp_sigma2_trace=1.0,
    )


def _recorded(l0, expected, thresholded, ev=None, fve=None, about_zero=0.5, recorded_dead=None, n_dead=0):
    dead = torch.zeros(100, dtype=torch.bool)
    dead[:n_dead] = True
    return {
        "l0": l0,
        "expected_l0": expected,
        "thresholded": thresholded,
        "recorded": {"l0": expected, "explained_variance": ev, "num_dead_features": recorded_dead},
        "k": None,
        "rows": 100,
        "dead": dead,
        "max_abs_threshold": 0.0,
        "fve": fve,
        "explained_variance_about_zero": about_zero,
        "subject": "s",
    }


def _pairs(mean, pc1):
    pair = {"i": 0, "j": 1, "decoder_cos": -0.99, "cofire_share": 0.0, "union_rate": 1.0, "encoder_cos": None}
    return {"pairs": [pair], "subspace": {"dim": 1, "chance": 0.1, "mean": mean, "pc1": pc1}}


def _folded(raw, white, normalize="none"):
    alignment = {"median_cos": raw, "median_cos_whitened": white, "latents": 64}
    return dict(whitening_alignment=alignment, sae=_dictionary_sae(normalize_activations=normalize), subject="s")


# (flag, stage, severity) -> the stage's inputs of a case inside that band (called through the spec directly)
BANDS = {
    ("bad_input_rows", "activations", "error"): dict(geo=_geo(n_zero=0, n_nonfinite_skipped=3)),
    ("bad_input_rows", "activations", "warning"): dict(geo=_geo(n_zero=3, n_nonfinite_skipped=0)),
    ("rank_deficiency", "activations", "warning"): dict(geo=_geo(n=8, d=10, numerical_rank=8)),
    ("rank_deficiency", "activations", "info"): dict(geo=_geo(numerical_rank=7)),
    ("whitening_misuse", "activations", "warning"): dict(geo=_whitened(), feeds_dictionary=True),
    ("whitening_misuse", "activations", "info"): dict(geo=_whitened(), feeds_dictionary=False),
    ("massive_activations", "activations", "warning"): dict(geo=_geo(coordinate_rms=[1000.0] + [1.0] * 99)),
    ("offset_dominated_cone", "activations", "warning"): dict(
        geo=_geo(
            anisotropy=0.5,
            sign={"null": 0.0},
            null_z=10.0,
            null_bias=0.0,
            mean_norm_ratio=0.9,
            mean_share_of_second_moment=0.5,
        )
    ),  # fmt: skip
    ("anisotropy_invisible_to_A", "activations", "warning"): dict(
        geo=_geo(anisotropy=0.0, sign={"null": 0.0}, null_z=0.0, effective_rank=1.0, noise_effective_rank=9.0)
    ),
    ("mixed_populations", "activations", "warning"): dict(
        geo=_geo(sample_diagnostics={"pc1_split": {"between_share": 0.9, "smaller_fraction": 0.3}})
    ),
    ("wrong_null", "activations", "warning"): dict(
        geo=_geo(anisotropy=0.3, sign={"null": 0.25}, isotropic_sd=0.01), assumed_null=0.0
    ),
    ("artifact_direction", "artifact", "warning"): dict(artifact={"k": 1, "abs": {"position": [0.9]}, "n": 10}),
    ("whitening_misuse", "config", "warning"): dict(config={"normalize_activations": "covariance_whitening"}),
    ("mean_direction_features", "sae", "error"): dict(sae=_sae([0.95, 0.0], [0.95, 0.0])),
    ("mean_direction_features", "sae", "warning"): dict(sae=_sae([0.6, 0.0], [0.6, 0.0])),
    ("offset_not_absorbed", "sae", "error"): dict(
        sae=_sae([0.1], b_dec_distance_to_mean=0.95), geo=_geo(outlier_severity=1.0)
    ),
    ("offset_not_absorbed", "sae", "warning"): dict(
        sae=_sae([0.1], b_dec_distance_to_mean=0.6), geo=_geo(outlier_severity=1.0)
    ),
    ("amplification_inconsistency", "sae", "warning"): dict(
        sae=_sae([0.1, 0.2], amplification={"measured_recon_minus_b_dec": 0.5, "A_het": 0.1})
    ),
    ("amplification_inconsistency", "sae", "info"): dict(
        sae=_sae([0.1, 0.2], amplification={"measured_recon_minus_b_dec": 0.05, "A_het": 0.01})
    ),
    ("dead_latents", "sae", "error"): dict(sae=_sae([0.0] * 50 + [0.1] * 50)),
    ("dead_latents", "sae", "warning"): dict(sae=_sae([0.0] * 5 + [0.1] * 95)),
    ("dense_latents", "sae", "warning"): dict(sae=_sae([0.9] + [0.1] * 9)),
    ("dense_latent_pairs", "sae", "warning"): dict(sae=_sae([0.6, 0.6], dense_structure=_pairs(mean=0.9, pc1=0.2))),
    ("dense_latent_pairs", "sae", "info"): dict(sae=_sae([0.6, 0.6], dense_structure=_pairs(mean=0.1, pc1=0.8))),
    ("norm_detectors", "latents", "warning"): dict(
        sae=_sae([0.1] * 100, latent_table={"norm_corr": [0.9] + [0.1] * 99})
    ),
    ("norm_detectors", "latents", "info"): dict(sae=_sae([0.1] * 200, latent_table={"norm_corr": [0.9] + [0.1] * 199})),
    ("zero_decoder_rows", "dictionary", "warning"): dict(
        check=_check(n_zero_decoder_rows=2, zero_rows=[3, 4]), subject="s"
    ),
    ("duplicate_decoder_rows", "dictionary", "error"): _duplicates(2),  # 4 of 100 latents > 1 %
    ("duplicate_decoder_rows", "dictionary", "warning"): {
        **_duplicates(1),
        "check": SimpleNamespace(**{**vars(_duplicates(1)["check"]), "source": {"d_sae": 1000}}),
    },  # 2 of 1,000 latents
    ("encoder_decoder_misalignment", "dictionary", "warning"): {**_misaligned(5), "subject": "s"},
    ("encoder_decoder_misalignment", "dictionary", "info"): {**_misaligned(1), "subject": "s"},
    ("b_dec_zero", "dictionary", "info"): dict(
        check=_check(b_dec={"norm": 0, "mean_direction_norm": 0.5}), subject="s"
    ),
    ("mean_direction_features", "dictionary", "warning"): dict(
        W_dec=torch.eye(4) + 0.01, b_dec=torch.tensor([3.0, 0.0, 0.0, 0.0]), subject="s"
    ),
    ("input_scaling_outside_files", "dictionary", "warning"): dict(
        sae=_dictionary_sae(normalize_activations="expected_average_only_in"), subject="s"
    ),
    ("input_normalization", "dictionary", "info"): dict(
        sae=_dictionary_sae(input_normalization="layer_norm"), subject="s"
    ),
    ("scaling_factor_folded", "dictionary", "info"): dict(
        sae=_dictionary_sae(folded_scaling_factor={"min": 0.5, "max": 2.0}), subject="s"
    ),
    ("transcoder", "dictionary", "info"): dict(sae=_dictionary_sae(transcoder=True), subject="s"),
    ("whitening_misuse", "dictionary", "warning"): _folded(raw=0.2, white=0.9),
    ("batchtopk_threshold_unset", "dictionary", "warning"): dict(
        sae=_dictionary_sae(threshold_unset=True, threshold=-1.0), subject="s"
    ),
    ("threshold_not_applied", "recorded", "error"): _recorded(l0=40.0, expected=8, thresholded=True),
    ("recorded_metrics_contradicted", "recorded", "warning"): _recorded(
        l0=8.0, expected=8, thresholded=False, ev=0.9, fve=0.7
    ),
}
# bands whose cases need a real SAE read on real rows: the tests that hold them
COVERED_ELSEWHERE = {
    (
        "activations_mismatch",
        "match",
        "error",
    ): "tests/report/test_activations_match.py::test_different_hook_is_an_error",
    (
        "activations_mismatch",
        "match",
        "warning",
    ): "tests/report/test_activations_match.py::test_centred_writing_weights",
}


@pytest.mark.parametrize("key", sorted(BANDS), ids=lambda k: "-".join(k))
def test_each_band_has_a_case_inside_it(key):
    name, stage, severity = key
    found = _run(name, stage, **BANDS[key])
    assert [f.severity for f in found if f.name == name] == [severity]


def test_every_band_of_every_registered_flag_has_a_case():
    bands = {(s.name, s.stage, severity) for s in registry() for severity, _ in s.bands}
    assert bands == set(BANDS) | set(COVERED_ELSEWHERE)
    for node in COVERED_ELSEWHERE.values():
        path, test = node.split("::")
        assert f"def {test}(" in (ROOT / path).read_text()


def test_discovery_finds_every_module_and_each_threshold_has_one_home():
    modules = {m.name for m in pkgutil.iter_modules(flags_pkg.__path__) if not m.name.startswith("_")}
    assert {s.module.rsplit(".", 1)[1] for s in registry()} == modules  # every module registers, none is missed
    names = [f.name for f in dataclasses.fields(FlagThresholds)]
    assert len(names) == len(set(names))
    for s in registry():
        assert s.when and s.bands and all(w for _, w in s.bands)
        for f in dataclasses.fields(s.options) if s.options else ():
            assert f.metadata["help"], f"{s.name}.{f.name} has no help text"
    # the one home of each: the dense frequency and the massive-row ratio (issue 38 item 4)
    assert "dense_frequency" not in {f.name for f in dataclasses.fields(ReportOptions)}
    assert not {"massive_row_factor", "dense_frequency"} & {f.name for f in dataclasses.fields(CheckOptions)}


def test_docs_flags_table_is_the_registrys():
    text = (ROOT / "docs" / "design.md").read_text()
    start = text.index("<!-- flags table: generated by saegeo.report.flags.flags_table() -->\n")
    end = text.index("\n<!-- end of flags table -->")
    in_docs = text[text.index("\n", start) + 1 : end]
    assert in_docs == flags_pkg.flags_table(), (
        "docs/design.md's flags table is not the registry's: paste saegeo.report.flags.flags_table() between its markers"
    )
    for name, default in FlagThresholds().to_dict().items():  # every threshold with its default
        assert name == "max_latents" or f"`{name}` {default:g}" in in_docs


def test_a_threshold_outside_its_bounds_is_refused_in_one_line(capsys):
    assert main(["check", "nowhere", "--dense-frequency", "1.5"]) == 2
    err = capsys.readouterr().err
    assert "dense_frequency" in err and "Traceback" not in err
    with pytest.raises(Exception, match="fit_refuse_fve 0.7 is above fit_accept_fve 0.65"):
        FlagThresholds(fit_refuse_fve=0.7)


# =========================================================================== end to end
D = 16


def _dictionary(tmp_path: Path) -> Path:
    """test_flag_thresholds_cli's dictionary (row 5 along b_dec, rows 10 and 11 a duplicate pair) with its first
    15 rows ×30 (massive rows)."""
    from tests.report.test_flag_thresholds_cli import _dictionary as plain

    path = plain(tmp_path)
    rows = np.load(tmp_path / "acts.npy")
    rows[:15] *= 30
    np.save(tmp_path / "acts.npy", rows)
    return path


def _flags(path: Path) -> list[tuple]:
    doc = json.loads(path.read_text())
    return [(f["name"], f["severity"], f["subject"], json.dumps(f["evidence"]), f["latents"]) for f in doc["flags"]]


def test_check_and_report_raise_the_same_flags_and_take_the_same_thresholds(tmp_path, capsys):
    """`check --acts` and `report --sae` on the same dictionary and rows: the same flags (names, severities,
    evidence, latents, in the same order); a threshold given to both (--duplicate-error-fraction) moves both alike."""
    sae = _dictionary(tmp_path)
    acts = str(tmp_path / "acts.npy")
    common = ["--no-progress", "--format", "json"]  # both make the latent table (norm_detectors reads it)
    for extra, tag in (([], "default"), (["--duplicate-error-fraction", "0.5"], "loose")):
        assert main(["check", str(sae), "--acts", acts, "--out", str(tmp_path / f"c-{tag}"), *common, *extra]) == 0
        assert (
            main(["report", "--acts", acts, "--sae", str(sae), "--out", str(tmp_path / f"r-{tag}"), *common, *extra])
            == 0
        )
    capsys.readouterr()
    for tag, severity in (("default", "error"), ("loose", "warning")):
        check, report = _flags(tmp_path / f"c-{tag}" / "report.json"), _flags(tmp_path / f"r-{tag}" / "report.json")
        assert check == report
        assert "massive_activations" in [f[0] for f in report]
        # the dictionary-only mean-direction guess is superseded by the one measured on the rows
        [mean] = [f for f in report if f[0] == "mean_direction_features"]
        assert "n_by_alignment" in json.loads(mean[3]) and 5 in mean[4]
        [dup] = [f for f in report if f[0] == "duplicate_decoder_rows"]
        assert dup[1] == severity and dup[4] == [10, 11]


def test_a_threshold_on_the_command_line_changes_a_verdict(tmp_path, capsys):
    """`check` (weights alone): row 5 (|cos| with b_dec ≈ 0.99999) is mean_direction_features at the default
    dictionary_min_cos 0.9 and not at --dictionary-min-cos 1.0; the duplicate pair (2 of 64 latents, 3 %) is an
    error at the default duplicate_error_fraction 0.01 and a warning at --duplicate-error-fraction 0.05."""
    sae = _dictionary(tmp_path)

    def flags(*extra: str) -> dict[str, str]:
        out = tmp_path / f"o{len(list(tmp_path.iterdir()))}"
        assert main(["check", str(sae), "--out", str(out), "--format", "json", "--no-progress", *extra]) == 0
        return {f[0]: f[1] for f in _flags(out / "check.json")}

    default = flags()
    assert default["mean_direction_features"] == "warning" and default["duplicate_decoder_rows"] == "error"
    strict = flags("--dictionary-min-cos", "1.0", "--duplicate-error-fraction", "0.05")
    assert "mean_direction_features" not in strict and strict["duplicate_decoder_rows"] == "warning"
    capsys.readouterr()


TOY = '''
"""toy_flag: a flag defined in one file (the registry test's)."""
from dataclasses import dataclass
from saegeo.config import option
from saegeo.report.flags import Flag, flag


@dataclass
class Options:
    toy_max_top1: float = option(0.99, "top-1 share above this raises toy_flag", low=0)


@flag("toy_flag", stage="activations", reads=("top1_share",), options=Options, bands={"info": "always"},
      when="top-1 share above 0.99", order=999)
def toy(q, t):
    top1 = q["geo"].get("top1_share") or 0.0
    if top1 > t.toy_max_top1:
        return Flag("toy_flag", "info", {"top1_share": top1}, "A toy.", summary=f"top-1 {top1:.3f}")
'''


def test_a_flag_is_one_file_found_by_discovery(tmp_path):
    """A toy flag module put on the flags package's path (no other file touched) is discovered, its threshold is a
    command-line option of `report`, and the report raises it or not as that option says."""
    plugin = tmp_path / "plugin"
    plugin.mkdir()
    (plugin / "toy_flag.py").write_text(textwrap.dedent(TOY))
    np.save(tmp_path / "acts.npy", np.random.default_rng(0).standard_normal((800, 8)).astype(np.float32))
    script = textwrap.dedent(
        f"""
        import json, sys
        import saegeo.report.flags as F
        F.__path__.append({str(plugin)!r})
        from saegeo.cli import main
        rc = main(["report", "--acts", {str(tmp_path / "acts.npy")!r}, "--out", sys.argv[1], "--format", "json",
                   "--no-progress", *sys.argv[2:]])
        doc = json.load(open(sys.argv[1] + "/report.json"))
        print(json.dumps([f["name"] for f in doc["flags"]]), "toy_max_top1" in doc["options"]["thresholds"])
        """
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    seen = {}
    for tag, extra in (("default", []), ("low", ["--toy-max-top1", "0.0"])):
        done = subprocess.run(
            [sys.executable, "-c", script, str(tmp_path / tag), *extra], capture_output=True, text=True, env=env
        )
        assert done.returncode == 0, done.stderr
        names, has_option = done.stdout.strip().splitlines()[-1].rsplit(" ", 1)
        seen[tag] = json.loads(names)
        assert has_option == "True"
    assert "toy_flag" not in seen["default"] and "toy_flag" in seen["low"]


def test_stages_run_in_registry_order():
    """run_flags keeps the registry's order within a stage (the report then sorts most severe first, stably)."""
    found = run_flags("sae", T, sae=_sae([0.0] * 50 + [0.9] * 50, [0.95] * 100), geo=_geo())
    assert [f.name for f in found] == ["mean_direction_features", "dead_latents", "dense_latents"]


def test_folded_whitening_fires_past_its_two_thresholds():
    """whitening_misuse (folded): median cos(e, G⁻¹w) − median cos(e, w) > folded_whitening_gain (0.2) and median
    cos(e, G⁻¹w) ≥ folded_whitening_min_cos (0.5); never when the SAE's config still whitens (the config flag's)."""
    cases = {  # (raw, whitened) -> fires, from the definition (values exact in binary)
        (0.25, 0.5): True,  # gain 0.25, at the min cos
        (0.25, 0.4375): False,  # gain 0.1875
        (0.0, 0.4375): False,  # gain 0.4375, below the min cos
        (0.5, 0.6875): False,  # gain 0.1875
        (-0.25, 0.75): True,
    }
    for (raw, white), fires in cases.items():
        found = _run("whitening_misuse", "dictionary", **_folded(raw, white))
        assert bool(found) == fires, (raw, white)
    [f] = _run("whitening_misuse", "dictionary", **_folded(0.25, 0.5))
    assert f.evidence == {"folded": True, "median_cos": 0.25, "median_cos_whitened": 0.5, "latents": 64}
    assert not _run("whitening_misuse", "dictionary", **_folded(0.0, 1.0, normalize="covariance_whitening"))
    assert not _run("whitening_misuse", "dictionary", **{**_folded(0.0, 1.0), "whitening_alignment": None})
    looser = dataclasses.replace(T, folded_whitening_gain=0.1, folded_whitening_min_cos=0.4)
    assert _run("whitening_misuse", "dictionary", t=looser, **_folded(0.25, 0.4375))


def test_recorded_metrics_contradictions_at_their_thresholds():
    """recorded_metrics_contradicted: |recorded EV − FVE| > 0.07; the recorded EV within 0.01 of the about-zero figure
    and not of FVE; ≥ 50 % of latents silent on the rows where training recorded ≤ 10 % dead."""

    def contradicted(**kw):
        return [f for f in _run("recorded_metrics_contradicted", "recorded", **_recorded(8.0, 8, False, **kw))]

    assert contradicted(ev=0.9, fve=0.82) and not contradicted(ev=0.9, fve=0.84)
    [f] = contradicted(ev=0.9, fve=0.88, about_zero=0.895)  # 0.02 from FVE: only the about-zero match tells
    assert f.evidence["measured_about_zero"] is True and "about zero" in f.summary
    assert not contradicted(ev=0.9, fve=0.898, about_zero=0.895)  # as close to FVE: no evidence
    [f] = contradicted(recorded_dead=10, n_dead=50)  # 50 of 100 silent, 10 % recorded: both bounds inclusive
    assert f.evidence == {"recorded_dead": 10, "dead_on_rows": 50, "d_sae": 100, "rows": 100}
    assert f.latents == list(range(20))  # max_latents of them
    assert not contradicted(recorded_dead=10, n_dead=49) and not contradicted(recorded_dead=11, n_dead=90)
    assert not contradicted(recorded_dead=None, n_dead=100)
    looser = dataclasses.replace(T, recorded_fve_tolerance=0.01, recorded_dead_share=0.3)
    assert [f.name for f in _run("recorded_metrics_contradicted", "recorded", t=looser, **_recorded(
        8.0, 8, False, ev=0.9, fve=0.88, about_zero=0.5, recorded_dead=10, n_dead=30
    ))] == ["recorded_metrics_contradicted"] * 2  # fmt: skip


def test_the_verdict_keeps_the_folded_whitening_and_not_a_configs():
    """sae_verdict keeps the flags of the dictionary stage (a folded whitening among them: test_folded_whitening.py)
    and not the config stage's whitening that check_dictionary also raises for an SAE whose config whitens: the
    report raises that one from the SAE's config itself. Kept by the stage that raised a flag, not by its name."""
    from saegeo.report.dictionary_check import check_dictionary, sae_verdict
    from saegeo.report.flags import raised_by
    from saegeo.sae.model import SAE, SAEConfig

    sae = SAE(SAEConfig(d_in=16, d_sae=64, activation="relu")).init_weights(torch.Generator().manual_seed(3))
    sae.format_info.normalize_activations = "covariance_whitening"  # as a config that whitens says
    rows = torch.randn(600, 16, generator=torch.Generator().manual_seed(4))
    opts = CheckOptions(progress=False)
    check = check_dictionary(sae, options=opts, name="w")
    [config_flag] = [f for f in check.flags if f.name == "whitening_misuse"]
    assert raised_by(config_flag).stage == "config"
    flags, _, _ = sae_verdict(sae, rows, options=opts, name="w")
    assert "whitening_misuse" not in [f.name for f in flags]
    assert {raised_by(f).stage for f in flags} <= {"dictionary", "match", "recorded"}
