"""The command line is generated from the config dataclasses: every field is an option with the dataclass
default, a config key means the same from TOML, `saegeo run` and Python, and bad values are one-line errors."""

import argparse
import dataclasses
import sys
import typing

import pytest
import torch

from saegeo.activations.cache import CacheConfig
from saegeo.activations.store import write_store
from saegeo.cli import build_parser, main
from saegeo.config import CompareOptions, from_dict, passed, shown
from saegeo.errors import BadInputError, SaegeoError
from saegeo.report.dictionary_check import CheckOptions
from saegeo.report.flags import FlagThresholds
from saegeo.report.geometry_report import ReportOptions
from saegeo.sae.evaluate import EvalConfig
from saegeo.sae.train import TrainConfig

# command, its config dataclass, the arguments the command requires
COMMANDS = [
    ("cache", CacheConfig, []),
    ("train", TrainConfig, []),
    ("report", ReportOptions, ["--acts", "A", "--out", "O"]),
    ("check", CheckOptions, ["DICT"]),
    ("eval", EvalConfig, []),
    ("compare", CompareOptions, ["A", "B"]),
]


def _subparser(command: str) -> argparse.ArgumentParser:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[command]


@pytest.mark.parametrize("command,cls,required", COMMANDS, ids=[c[0] for c in COMMANDS])
def test_every_config_field_is_an_option_with_the_dataclass_default(command, cls, required):
    parser = _subparser(command)
    actions = {a.dest: a for a in parser._actions}
    hints = typing.get_type_hints(cls)
    # nothing given: exactly the dataclass defaults
    assert from_dict(cls, passed(parser.parse_args(required), cls)) == cls()
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            continue  # thresholds: a [report.thresholds] table, not flags
        if not f.metadata.get("flag", True):
            continue  # a config-file key only (TrainConfig.arch_options: flags --ARCH.OPTION, tested with them)
        default = getattr(cls(), f.name)
        assert f.name in actions, f"{cls.__name__}.{f.name} has no option in `saegeo {command}`"
        action = actions[f.name]
        assert not action.help.startswith(f"{cls.__name__}.")  # help is the field's comment, not the generic one
        assert action.default is argparse.SUPPRESS  # so a config file's value holds unless the flag is given
        flag = action.option_strings[0]
        if isinstance(default, bool):
            assert flag.startswith("--no-") == default
            assert getattr(parser.parse_args([*required, flag]), f.name) is (not default)
            continue
        if typing.get_origin(hints[f.name]) is typing.Literal:
            assert tuple(action.choices) == typing.get_args(hints[f.name])
        if default is not None:
            assert f"(default: {shown(default)})" in action.help
            # the default, written as a user would, parses back to the default
            assert getattr(parser.parse_args([*required, flag, shown(default)]), f.name) == default


def test_flag_names_are_the_field_names():
    parser = build_parser()
    a = parser.parse_args(
        [
            "train",
            "--acts",
            "S",
            "--config",
            "c.toml",
            "--out",
            "o",
            "--arch",
            "relu",
            "--topk.k",
            "4",
            "--expansion",
            "2",
            "--d-sae",
            "64",
            "--total-tokens",
            "2M",
            "--batch-tokens",
            "8",
            "--lr",
            "1e-3",
            "--l1-coefficient",
            "0.5",
            "--b-dec-init",
            "zeros",
            "--heldout-fraction",
            "0.2",
            "--checkpoint-every",
            "5",
            "--seed",
            "3",
            "--device",
            "cpu",
            "--no-resume",
            "--no-progress",
        ]
    )
    assert (a.total_tokens, a.l1_coefficient, a.out_dir, a.no_resume, a.progress) == (2_000_000, 0.5, "o", True, False)
    a = parser.parse_args(
        [
            "cache",
            "--model",
            "m",
            "--hooks",
            "blocks.0.hook_resid_post, blocks.1.hook_resid_post",
            "--corpus",
            "c",
            "--context",
            "32",
            "--out",
            "o",
            "--max-tokens",
            "300",
            "--dtype",
            "bfloat16",
            "--batch-windows",
            "4",
            "--shard-rows",
            "100",
            "--exclude-special",
            "--text-field",
            "t",
            "--overwrite",
            "--no-progress",
        ]
    )
    assert a.hooks == ("blocks.0.hook_resid_post", "blocks.1.hook_resid_post") and a.max_tokens == 300
    a = parser.parse_args(
        [
            "report",
            "--acts",
            "A",
            "--out",
            "O",
            "--sae",
            "x=D",
            "--sae",
            "E",
            "--format",
            "json",
            "--batch-rows",
            "64",
            "--max-tokens",
            "1k",
            "--skip-nonfinite",
            "--assumed-null",
            "0.3",
            "--preprocessing-config",
            "c.json",
            "--device",
            "cpu",
            "--no-progress",
        ]
    )
    assert (a.sae, a.max_tokens, a.assumed_null, a.skip_nonfinite) == (["x=D", "E"], 1000, 0.3, True)
    a = parser.parse_args(
        [
            "check",
            "D",
            "--acts",
            "A",
            "--out",
            "O",
            "--duplicate-cos",
            "0.9",
            "--block-rows",
            "128",
            "--max-tokens",
            "500",
            "--format",
            "md,json",
            "--fail-on",
            "warning",
            "--no-progress",
        ]
    )
    assert (a.duplicate_cos, a.block_rows, a.format, a.fail_on) == (0.9, 128, ["md", "json"], "warning")


class _Captured(SaegeoError):
    """Raised by the fake trainer once it has the config: the test needs the config, not an SAE."""


@pytest.fixture
def captured_train(monkeypatch):
    """Replace the trainer behind `saegeo train` and `saegeo run` by one that records its config."""
    seen: list[TrainConfig] = []

    def fake_train_sae(cfg, data, **kw):
        seen.append(cfg)
        raise _Captured("captured")

    monkeypatch.setattr("saegeo.sae.train.train_sae", fake_train_sae)  # the pipeline imports it where it trains
    return seen


@pytest.fixture
def store(tmp_path):
    return str(write_store(tmp_path / "acts", torch.randn(300, 8), shard_rows=100).path)


def test_token_counts_read_the_same_from_run_train_config_flag_and_python(tmp_path, store, captured_train, capsys):
    (tmp_path / "run.toml").write_text(
        f'out = "{tmp_path / "run"}"\nacts = "{store}"\n[train]\ntotal_tokens = "2M"\nbatch_tokens = 256\n[train.topk]\nk = 8\n'
    )
    assert main(["run", str(tmp_path / "run.toml")]) == 2  # the fake trainer stops the job
    (tmp_path / "train.toml").write_text('[train]\ntotal_tokens = "2M"\nbatch_tokens = 256\n[train.topk]\nk = 8\n')
    assert main(["train", "--acts", store, "--config", str(tmp_path / "train.toml")]) == 2
    assert main(["train", "--acts", store, "--total-tokens", "2M", "--batch-tokens", "256", "--topk.k", "8"]) == 2
    assert "Traceback" not in capsys.readouterr().err
    via_run, via_config, via_flag = captured_train
    python = from_dict(TrainConfig, {"total_tokens": "2M", "batch_tokens": 256, "topk": {"k": 8}})
    assert python.total_tokens == 2_000_000
    assert dataclasses.replace(via_run, out_dir=None) == via_config == via_flag == python


def test_flags_override_the_config_file_which_overrides_the_defaults(tmp_path, store, captured_train):
    (tmp_path / "t.toml").write_text(
        f'acts = "{store}"\n[train]\nbatch_tokens = 256\ntotal_tokens = "5k"\n[train.topk]\nk = 8\n'
    )
    assert main(["train", "--config", str(tmp_path / "t.toml"), "--topk.k", "4", "--no-progress"]) == 2
    (cfg,) = captured_train
    assert (cfg.options.k, cfg.batch_tokens, cfg.total_tokens, cfg.progress) == (4, 256, 5000, False)
    assert (cfg.lr, cfg.arch) == (TrainConfig.lr, TrainConfig.arch)


def test_an_architectures_own_flags_override_its_config_table_key_by_key(tmp_path, store, captured_train, capsys):
    """--topk.k over [train.topk] keeps the table's other keys; the deprecated flat --k (one release) says so."""
    (tmp_path / "t.toml").write_text(f'acts = "{store}"\n[train]\nbatch_tokens = 256\n[train.topk]\nk = 8\naux_k = 3\n')
    assert main(["train", "--config", str(tmp_path / "t.toml"), "--topk.k", "4", "--no-progress"]) == 2
    (cfg,) = captured_train
    assert (cfg.options.k, cfg.options.aux_k, cfg.options.aux_coefficient) == (4, 3, 1 / 32)
    assert cfg.record()["arch_options"] == {"topk": {"aux_k": 3, "aux_coefficient": 1 / 32, "k": 4}}
    captured_train.clear()
    with pytest.warns(FutureWarning, match=r"\['k'\] are deprecated.*\[train.jumprelu\]"):
        assert main(["train", "--acts", store, "--arch", "jumprelu", "--k", "5", "--no-progress"]) == 2
    (cfg,) = captured_train
    assert cfg.options.l0_target == 5 and cfg.k is None  # k was jumprelu's L0 target
    capsys.readouterr()
    assert main(["train", "--acts", store, "--topk.k", "0"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "[train.topk]" in err and "k must be >= 1, got 0" in err


def test_a_bad_choice_in_a_config_is_one_line_naming_file_key_value_and_choices(tmp_path, store, capsys):
    bad = tmp_path / "bad.toml"
    bad.write_text(f'acts = "{store}"\n[train]\nb_dec_init = "median"\n')
    assert main(["train", "--config", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err
    assert str(bad) in err and "b_dec_init = 'median'" in err and "geometric_median" in err
    (tmp_path / "run.toml").write_text(f'out = "{tmp_path / "run"}"\n[cache]\ndtype = "float8"\n')
    assert main(["run", str(tmp_path / "run.toml")]) == 2  # refused before any model is loaded
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "[cache]" in err and "dtype = 'float8'" in err and "bfloat16" in err


@pytest.mark.parametrize("tomli", ["installed", "missing"])
def test_train_config_reads_without_tomllib_as_on_python_310(
    tmp_path, store, captured_train, monkeypatch, capsys, tomli
):
    parser = pytest.importorskip("tomllib") if tomli == "installed" else None  # tomli has tomllib's API
    monkeypatch.setitem(sys.modules, "tomllib", None)  # `import tomllib` fails, as on Python 3.10
    monkeypatch.setitem(sys.modules, "tomli", parser)
    (tmp_path / "t.toml").write_text('[train]\nbatch_tokens = 256\ntotal_tokens = "5k"\n')
    assert main(["train", "--acts", store, "--config", str(tmp_path / "t.toml")]) == 2
    if tomli == "installed":
        (cfg,) = captured_train
        assert (cfg.batch_tokens, cfg.total_tokens) == (256, 5000)
    else:
        err = capsys.readouterr().err
        assert not captured_train and "pip install tomli" in err and "Traceback" not in err


def test_config_from_dict_coerces_by_annotation():
    cfg = from_dict(TrainConfig, {"total_tokens": "500k", "adam_betas": [0.8, 0.9], "lr": 1, "d_sae": None})
    assert (cfg.total_tokens, cfg.adam_betas, cfg.lr, cfg.d_sae) == (500_000, (0.8, 0.9), 1.0, None)
    assert isinstance(cfg.lr, float)
    assert from_dict(CacheConfig, {"hooks": ["a", "b"]}).hooks == ("a", "b")
    opts = from_dict(ReportOptions, {"thresholds": {"dead_max_fraction": 0.5}, "max_tokens": "1M"})
    assert opts.thresholds == FlagThresholds(dead_max_fraction=0.5) and opts.max_tokens == 10**6
    with pytest.raises(
        BadInputError,
        match=r"x\.toml: arch = 'nope': expected one of \['abstopk', 'batchtopk', 'gated', 'jumprelu', 'matryoshka', 'relu', 'topk'\]",
    ):
        from_dict(TrainConfig, {"arch": "nope"}, where="x.toml")
    with pytest.raises(BadInputError, match="progress = 'no': expected true or false"):
        from_dict(CheckOptions, {"progress": "no"})
    with pytest.raises(BadInputError, match="batch_rows = 'big': expected a whole number"):
        from_dict(ReportOptions, {"batch_rows": "big"})
    with pytest.raises(BadInputError, match=r"\[thresholds\]: unknown key\(s\) \['nope'\] of FlagThresholds"):
        from_dict(ReportOptions, {"thresholds": {"nope": 1}})
    with pytest.raises(BadInputError, match=r"unknown key\(s\) \['tokenz'\] of TrainConfig"):
        from_dict(TrainConfig, {"tokenz": 5})


_POLICY_PROBE = """
import os, sys
{before}
from saegeo import cli
try:
    cli.main(["{command}", "--help"])  # exits after parsing; the policy is set before anything heavy is imported
except SystemExit:
    pass
print(os.environ.get("OMP_WAIT_POLICY"))
"""


@pytest.mark.parametrize(
    "command, before, expected",
    [
        ("report", 'os.environ.pop("OMP_WAIT_POLICY", None)', "PASSIVE"),  # a geometry command's default
        ("check", 'os.environ.pop("OMP_WAIT_POLICY", None)', "PASSIVE"),
        ("train", 'os.environ.pop("OMP_WAIT_POLICY", None)', "None"),  # training keeps torch's default
        ("report", 'os.environ["OMP_WAIT_POLICY"] = "ACTIVE"', "ACTIVE"),  # a user's setting wins
        ("report", 'os.environ.pop("OMP_WAIT_POLICY", None); import torch', "None"),  # too late: left alone
    ],
)
def test_geometry_commands_let_idle_openmp_workers_sleep_unless_told_otherwise(command, before, expected):
    import subprocess

    probe = _POLICY_PROBE.replace("{command}", command).replace("{before}", before)
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.split("\n")[-2] == expected
