"""One spelling per flag across the commands: `--out` everywhere, one `--format` form, `--config`
an options file only, one name for the top principal directions; each old spelling still works for one release and
says, on stderr, what it is called now. And `check --acts` takes every report option by the report's own path."""

import json

import pytest
import torch

from saegeo.activations.store import write_store
from saegeo.cli import build_parser, main
from saegeo.config import from_dict, passed
from saegeo.report.options import ReportOptions
from saegeo.sae.model import SAE, SAEConfig

WARNING = "the old spelling is accepted until the next release"


def _parse(argv):
    return build_parser(argv[0]).parse_args(argv)


# (argv with the old spelling, argv with the new one, the attribute both set, its value)
RENAMED = {
    "train --out-dir": (
        ["train", "--out-dir", "S"],
        ["train", "--out", "S"],
        "out_dir",
        "S",
    ),
    "geometry --top-k": (
        ["geometry", "F", "--top-k", "5"],
        ["geometry", "F", "--artifact-components", "5"],
        "artifact_components",
        5,
    ),
    "sweep --artifact-k": (
        ["sweep", "S", "--artifact-k", "2"],
        ["sweep", "S", "--artifact-components", "2"],
        "artifact_components",
        2,
    ),
    "report --config": (
        ["report", "--acts", "A", "--out", "O", "--config", "c.json"],
        ["report", "--acts", "A", "--out", "O", "--preprocessing-config", "c.json"],
        "preprocessing_config",
        "c.json",
    ),
}


@pytest.mark.parametrize("old,new,attribute,value", RENAMED.values(), ids=list(RENAMED))
def test_an_old_spelling_sets_what_the_new_one_sets_and_warns(old, new, attribute, value, capsys):
    old_args = _parse(old)
    assert getattr(old_args, attribute) == value
    (note,) = old_args.old_spellings
    assert WARNING in note and old[-2] in note and new[-2] in note, note
    new_args = _parse(new)
    assert getattr(new_args, attribute) == value
    assert not getattr(new_args, "old_spellings", None)  # the new spelling says nothing
    assert capsys.readouterr().err == ""  # main prints the note, once the command has run (below)


def test_an_old_spelling_warns_after_the_work_and_stays_inside_the_one_error_line(tmp_path, capsys):
    """The note comes once the command has run; with bad input it is folded into the one error line."""
    store = write_store(tmp_path / "store", torch.randn(64, 4, generator=torch.Generator().manual_seed(0)))
    assert main(["geometry", str(store.path), "--top-k", "2", "--no-progress"]) == 0
    out, err = capsys.readouterr()
    assert err.count("\n") == 1 and err.startswith("saegeo geometry: warning: --top-k is now --artifact-components")
    assert WARNING in err and out  # the geometry was printed first
    assert main(["geometry", str(tmp_path / "missing"), "--top-k", "2", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("saegeo: error: ") and "missing" in err, err
    assert "(note: --top-k is now --artifact-components)" in err, err


def test_the_old_spellings_are_hidden_from_help():
    for command, old in (("train", "--out-dir"), ("geometry", "--top-k"), ("sweep", "--artifact-k")):
        text = build_parser(command)._subparsers._group_actions[0].choices[command].format_help()
        assert old not in text, (command, old)
    report = build_parser("report")._subparsers._group_actions[0].choices["report"].format_help()
    assert "--preprocessing-config" in report and "--config " not in report


@pytest.mark.parametrize("command", ["check", "report"])
def test_format_is_one_comma_separated_list_in_every_command_and_the_spaced_form_warns(command, capsys):
    head = ["check", "D"] if command == "check" else ["report", "--acts", "A", "--out", "O"]
    assert _parse([*head, "--format", "md,json"]).format == ["md", "json"]
    assert capsys.readouterr().err == ""
    spaced = _parse([*head, "--format", "md", "json"])
    assert spaced.format == ["md", "json"]
    (note,) = spaced.old_spellings
    assert "--format md,json" in note and "until the next release" in note, note
    assert _parse(head).format == ["terminal", "md", "json", "html"]
    with pytest.raises(SystemExit) as exit_:
        _parse([*head, "--format", "md,pdf"])
    assert exit_.value.code == 2
    assert "comma-separated subset of terminal,md,json,html" in capsys.readouterr().err


def test_check_acts_takes_every_report_option_by_the_generic_path():
    args = _parse(["check", "D", "--acts", "A", "--histogram-bins", "7", "--cosine-sample-rows", "64", "--seed", "3"])
    opts = from_dict(ReportOptions, passed(args, ReportOptions))
    assert (opts.histogram_bins, opts.cosine_sample_rows, opts.seed) == (7, 64, 3)
    # the options both commands have are given once and reach both
    args = _parse(["check", "D", "--acts", "A", "--no-progress", "--skip-nonfinite"])
    opts = from_dict(ReportOptions, passed(args, ReportOptions))
    assert (opts.progress, opts.skip_nonfinite) == (False, True)


def test_check_acts_report_option_reaches_the_written_report(tmp_path):
    g = torch.Generator().manual_seed(0)
    store = write_store(tmp_path / "store", torch.randn(512, 8, generator=g), shard_rows=256)
    sae = SAE(SAEConfig(d_in=8, d_sae=16, activation="topk", k=2))
    sae.init_weights(torch.Generator().manual_seed(0))
    sae.save(tmp_path / "sae")
    argv = ["check", str(tmp_path / "sae"), "--acts", str(store.path), "--out", str(tmp_path / "out")]
    assert main([*argv, "--format", "json", "--no-progress", "--histogram-bins", "7", "--max-tokens", "300"]) == 0
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert len(report["cosine_histogram"]["counts"]) == 7
    assert report["activations"]["n"] == 300


def test_a_stream_option_reaches_the_verdict_check_the_report_runs():
    from saegeo.report.options import CheckOptions

    opts = ReportOptions(verify=False, skip_nonfinite=True, progress=True)
    verdict = CheckOptions(**{**opts.stream(), "progress": False})
    assert (verdict.verify, verdict.skip_nonfinite, verdict.progress) == (False, True, False)
