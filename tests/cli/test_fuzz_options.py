"""Fuzzing the command line's numeric options: whatever number or text a user types for a
numeric option of a main command, a value that cannot mean a count or a finite quantity is refused with exit 2
and exactly one line on stderr that names the option, no traceback, and nothing written.

The options are read from the parser itself (every option whose type is saegeo.config's int or float reader),
so an option added later is fuzzed too. The bad values are stated here, independently of the fields' declared
bounds: NaN, ±inf, overflowing floats, text, the empty string and integers beyond int64 for every numeric
option; zero and negative values only for the options listed below as counts, where no zero or negative value
can be meant."""

import argparse
import contextlib
import io
import tempfile
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from saegeo.activations.store import write_store
from saegeo.cli import build_parser, main
from saegeo.config import float_arg, int_arg

# options that count something: zero (and anything negative) cannot be meant
COUNTS = {
    "train": [
        "--batch-tokens",
        "--total-tokens",
        "--topk.k",
        "--expansion",
        "--d-sae",
        "--log-every",
        "--b-dec-init-tokens",
        "--dead-window-tokens",
        "--aux-k",
        "--num-threads",
    ],
    "report": ["--batch-rows", "--histogram-bins", "--max-tokens", "--eval-tokens"],
    "cache": ["--batch-windows", "--shard-rows", "--context", "--max-tokens"],
    "eval": ["--batch-windows", "--context", "--max-tokens"],
    "geometry": ["--batch-rows"],
    "sweep": ["--batch-rows", "--context", "--max-types", "--max-tokens"],
    "synth": ["--n", "--d", "--n-features", "--shard-rows", "--group-size"],
    "check": ["--block-rows", "--max-tokens"],
    "compare": ["--candidates", "--batch-rows", "--max-tokens"],
}
# options where a negative value cannot be meant (seeds, offsets into the text, how many to list)
NOT_NEGATIVE = {
    "train": [
        "--seed",
        "--warmup-steps",
        "--checkpoint-every",
        "--shuffle-buffer",
        "--lr",
        "--jumprelu.bandwidth",
        "--relu.l1-coefficient",
        "--jumprelu.threshold-lr-scale",
        "--grad-clip-norm",
    ],
    "report": ["--seed", "--cosine-sample-rows", "--artifact-components"],
    "eval": ["--skip-tokens", "--pass-norm-ratio"],
    "geometry": ["--artifact-components"],
    "sweep": ["--artifact-components"],
    "synth": ["--seed", "--noise", "--offset", "--n-groups"],
    "check": ["--max-pairs-listed"],
    "compare": ["--exact-max-entries"],
}
NOT_A_NUMBER = ["nan", "NaN", "inf", "-inf", "1e999", "-1e999", "abc", "", "1,5", "0x10", "--", "1e5e5"]
TOO_BIG_INT = [str(2**63), str(2**70), "-" + str(2**70), "1e30", "2.5"]


def _numeric_options(command: str) -> dict[str, str]:
    """flag -> "int" | "float" for every numeric option of ``command`` in the real parser."""
    sub = next(a for a in build_parser(command)._actions if isinstance(a, argparse._SubParsersAction))
    found = {}
    for action in sub.choices[command]._actions:
        if action.type in (int_arg, float_arg) and action.option_strings:
            found[action.option_strings[0]] = "int" if action.type is int_arg else "float"
    return found


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("fuzz")
    store = str(write_store(root / "store", torch.randn(300, 8), shard_rows=100).path)
    return {"store": store, "sae": str(root / "no-such-sae")}


def _argv(command: str, inputs: dict, out: Path) -> list[str]:
    """A command line that would run (and write under ``out``) but for the fuzzed option."""
    return {
        "train": ["train", "--acts", inputs["store"], "--out", str(out / "sae"), "--no-progress"],
        "report": ["report", "--acts", inputs["store"], "--out", str(out / "report"), "--no-progress"],
        "cache": ["cache", "--out", str(out / "acts"), "--no-progress"],
        "eval": ["eval", "--sae", inputs["sae"], "--no-progress"],
        "geometry": ["geometry", inputs["store"], "--json", str(out / "g.json"), "--no-progress"],
        "sweep": ["sweep", inputs["store"], "--out", str(out / "sweep"), "--no-progress"],
        "synth": ["synth", "--n", "64", "--d", "8", "--n-features", "16", "--out", str(out / "synth")],
        "check": ["check", inputs["sae"], "--out", str(out / "check"), "--no-progress"],
        "compare": ["compare", inputs["sae"], inputs["sae"], "--out", str(out / "compare"), "--no-progress"],
    }[command]


CASES = [(c, flag) for c in COUNTS for flag in _numeric_options(c)]


@st.composite
def bad_option(draw):
    command, flag = draw(st.sampled_from(CASES))
    kind = _numeric_options(command)[flag]
    values = list(NOT_A_NUMBER) + (TOO_BIG_INT if kind == "int" else [])
    if flag in COUNTS.get(command, []):
        values += ["0", "-1", "-7", "-0.5" if kind == "float" else "-1000"]
    if flag in NOT_NEGATIVE.get(command, []):
        values += ["-1", "-5", "-1e-9" if kind == "float" else "-3"]
    return command, flag, draw(st.sampled_from(values))


def test_every_command_has_numeric_options_to_fuzz():
    assert {c for c, _ in CASES} == set(COUNTS)
    for command, flags in {**COUNTS, **NOT_NEGATIVE}.items():
        assert set(flags) <= set(_numeric_options(command)), command  # the lists name real options


@settings(
    max_examples=200, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(case=bad_option())
def test_a_bad_numeric_option_is_one_line_exit_2_and_writes_nothing(inputs, case):
    command, flag, value = case
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        err, stdout = io.StringIO(), io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(stdout):
            try:
                code = main([*_argv(command, inputs, out), f"{flag}={value}"])
            except SystemExit as exit_:  # argparse's refusals
                code = exit_.code
        text = err.getvalue().strip()
        assert code == 2, (command, flag, value, text)
        assert text.count("\n") == 0 and "Traceback" not in text, text
        field = flag[2:].replace("-", "_")
        assert flag in text or field in text, f"{text!r} names neither {flag} nor {field}"
        assert list(out.iterdir()) == [], f"{command} {flag}={value} wrote {list(out.iterdir())}"
