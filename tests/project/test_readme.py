"""The README cannot drift from the CLI: every `saegeo` command it shows parses, every flag it names exists.

Commands are read from fenced blocks (```bash lines that start with `saegeo` or `torchrun ... -m saegeo.cli`, and
`$ `-prefixed lines of output blocks) and from inline code spans; they are parsed by the CLI's own argparse parser
(parse only, nothing runs). Flags in prose are checked against the commands of their section's heading. The
```python blocks are checked statically: their saegeo imports, the attributes used on them and the fields of the
dataclasses they construct must exist.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import dataclasses
import importlib
import io
import re
import shlex
from pathlib import Path

import pytest

from saegeo.cli import build_parser

README = Path(__file__).resolve().parents[2] / "README.md"
MAX_LINES = 350
FENCE = re.compile(r"^```(\w*)\s*$")
INLINE = re.compile(r"`([^`\n]+)`")
FLAG = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*(?:\.[a-z][a-z0-9-]*)?)")  # --topk.k: an architecture's option


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _options(parser: argparse.ArgumentParser) -> set[str]:
    """Every option string of a parser and of its nested subcommands (`store verify`, `store info`)."""
    found = set(parser._option_string_actions)
    for sub in _subcommands(parser).values():
        found |= _options(sub)
    return found


def _argv(line: str) -> list[str] | None:
    """The saegeo argv of one shell line, or None when the line runs no saegeo command."""
    tokens = shlex.split(line, comments=True)
    if "saegeo.cli" in tokens:  # torchrun ... -m saegeo.cli CMD ..., python -m saegeo.cli CMD ...
        return tokens[tokens.index("saegeo.cli") + 1 :]
    if tokens and Path(tokens[0]).name == "saegeo":
        return tokens[1:]
    return None


def readme_commands(text: str) -> list[tuple[int, str, list[str]]]:
    """(line number, shell line, argv) of every saegeo command line in the README's fenced blocks."""
    out: list[tuple[int, str, list[str]]] = []
    lang, pending, start = None, "", 0
    for number, raw in enumerate(text.splitlines(), 1):
        fence = FENCE.match(raw.strip())
        if fence:
            lang = None if lang is not None else fence.group(1)
            continue
        if lang is None or lang == "python":
            continue
        line = raw.strip()
        if lang in ("bash", "sh", "shell"):
            command = line
        elif line.startswith("$ "):
            command = line[2:]
        elif pending:
            command = line
        else:
            continue
        if not pending:
            start = number
        if command.endswith("\\"):
            pending += command[:-1] + " "
            continue
        command, pending = pending + command, ""
        argv = _argv(command)
        if argv is not None:
            out.append((start, command, argv))
    return out


def prose_spans(text: str) -> list[tuple[int, tuple[str, ...], str]]:
    """(line number, commands of the section's heading, code span) of inline code outside fenced blocks."""
    out: list[tuple[int, tuple[str, ...], str]] = []
    in_block, section = False, ()
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line.strip()):
            in_block = not in_block
            continue
        if in_block:
            continue
        if line.startswith("#"):
            section = tuple(re.findall(r"`saegeo (\w+)", line))
        out += [(number, section, span) for span in INLINE.findall(line)]
    return out


def _no_abbreviations(parser: argparse.ArgumentParser) -> None:
    """A README flag must be spelled out: argparse would otherwise accept `--batch` for `--batch-rows`."""
    parser.allow_abbrev = False
    for sub in _subcommands(parser).values():
        _no_abbreviations(sub)


def _parse(parser: argparse.ArgumentParser, argv: list[str]) -> str | None:
    """argparse's error message for argv, or None when it parses."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            parser.parse_args(argv)
    except SystemExit as exc:
        return err.getvalue().strip().splitlines()[-1] if exc.code else None
    return None


def drift(text: str) -> list[str]:
    """Every way the README disagrees with the CLI, one line each (empty: none)."""
    parser = build_parser()
    _no_abbreviations(parser)
    commands = _subcommands(parser)
    problems: list[str] = []
    for number, line, argv in readme_commands(text):
        message = _parse(parser, argv)
        if message:
            problems.append(f"README line {number}: `{line}` does not parse: {message}")
    every_option = _options(parser)
    for number, section, span in prose_spans(text):
        words = span.split()
        if words[0] == "saegeo" and len(words) > 1 and re.fullmatch(r"[a-z]+", words[1]):
            if words[1] not in commands:
                problems.append(f"README line {number}: `{span}` names no saegeo command")
                continue
            allowed = _options(commands[words[1]]) | set(parser._option_string_actions)
        elif not words[0].startswith("-"):
            continue  # another program's line (pip, torchrun, make): its flags are not saegeo's
        elif section and all(name in commands for name in section):
            allowed = set().union(*(_options(commands[name]) for name in section)) | set(parser._option_string_actions)
        else:
            allowed = every_option
        for flag in FLAG.findall(span):
            if flag not in allowed:
                where = (
                    f"`saegeo {words[1]}`"
                    if words[0] == "saegeo"
                    else (" or ".join(f"`saegeo {s}`" for s in section) if section else "any saegeo command")
                )
                problems.append(f"README line {number}: {flag} (in `{span}`) is not an option of {where}")
    for number, section, _ in prose_spans(text):
        problems += [
            f"README line {number}: the heading names `saegeo {s}`, which is no command"
            for s in section
            if s not in commands
        ]
    return sorted(set(problems))


def python_blocks(text: str) -> list[tuple[int, str]]:
    """(first line number, source) of every ```python block."""
    blocks, lang, start, lines = [], None, 0, []
    for number, raw in enumerate(text.splitlines(), 1):
        fence = FENCE.match(raw.strip())
        if fence and lang is None:
            lang, start, lines = fence.group(1), number + 1, []
        elif fence:
            if lang == "python":
                blocks.append((start, "\n".join(lines)))
            lang = None
        elif lang is not None:
            lines.append(raw)
    return blocks


def python_drift(text: str) -> list[str]:
    """Names the README's Python imports from saegeo that do not exist, attributes of them that do not exist, and
    keyword arguments that a dataclass it constructs does not have (a static check: nothing runs)."""
    problems: list[str] = []
    for start, source in python_blocks(text):
        tree = ast.parse(source)
        names: dict[str, object] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):  # `import saegeo`: its names, checked as attributes below
                names.update(
                    {a.asname or a.name: importlib.import_module(a.name) for a in node.names if a.name == "saegeo"}
                )
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("saegeo"):
                try:
                    module = importlib.import_module(node.module)
                except ImportError as exc:
                    problems.append(f"README line {start + node.lineno - 1}: cannot import {node.module}: {exc}")
                    continue
                for alias in node.names:
                    if not hasattr(module, alias.name):
                        problems.append(f"README line {start + node.lineno - 1}: {node.module} has no {alias.name}")
                    else:
                        names[alias.asname or alias.name] = getattr(module, alias.name)
        for node in ast.walk(tree):
            line = f"README line {start + getattr(node, 'lineno', 1) - 1}"
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in names:
                if not hasattr(names[node.value.id], node.attr):
                    problems.append(f"{line}: {node.value.id} has no attribute {node.attr}")
            called = node.func if isinstance(node, ast.Call) else None
            if isinstance(called, ast.Attribute) and isinstance(called.value, ast.Name) and called.value.id in names:
                target, label = getattr(names[called.value.id], called.attr, None), f"{called.value.id}.{called.attr}"
            elif isinstance(called, ast.Name) and called.id in names:
                target, label = names[called.id], called.id
            else:
                target = label = None
            if target is not None:
                if dataclasses.is_dataclass(target):
                    fields = {f.name for f in dataclasses.fields(target)}
                    problems += [
                        f"{line}: {label} has no field {kw.arg}"
                        for kw in node.keywords
                        if kw.arg is not None and kw.arg not in fields
                    ]
    return problems


def test_readme_is_a_short_guide() -> None:
    n = len(README.read_text(encoding="utf-8").splitlines())
    assert n <= MAX_LINES, f"README.md has {n} lines; at most {MAX_LINES} (move detail to docs/ or benchmarks/)"


def test_readme_commands_and_flags_exist_in_the_cli() -> None:
    text = README.read_text(encoding="utf-8")
    assert len(readme_commands(text)) >= 10, "the README's commands were not found (fence or prompt format changed?)"
    problems = drift(text)
    assert not problems, "\n".join(problems)


def test_readme_python_names_exist() -> None:
    text = README.read_text(encoding="utf-8")
    assert python_blocks(text), "the README's Python API block was not found"
    problems = python_drift(text)
    assert not problems, "\n".join(problems)


def test_the_python_check_catches_a_renamed_name() -> None:
    broken = (
        "```python\nfrom saegeo.geometry import GeometryAccumulatr\nfrom saegeo.sae.train import TrainConfig\n"
        "TrainConfig(k=32, total_tokns=5)\nTrainConfig.no_such_method()\n```\n"
    )
    problems = python_drift(broken)
    assert any("has no GeometryAccumulatr" in p for p in problems), problems
    assert any("has no field total_tokns" in p for p in problems), problems
    assert any("has no attribute no_such_method" in p for p in problems), problems
    top = "```python\nimport saegeo\nsaegeo.TrainConfig(k=32, total_tokns=5)\nsaegeo.geometry_reprt(x)\n```\n"
    problems = python_drift(top)  # the same through `import saegeo`
    assert any("saegeo.TrainConfig has no field total_tokns" in p for p in problems), problems
    assert any("saegeo has no attribute geometry_reprt" in p for p in problems), problems


@pytest.mark.parametrize(
    "broken, expected",
    [
        ("```bash\nsaegeo report --acts a --out r --no-such-flag\n```\n", "does not parse"),
        ("```text\n$ saegeo trian --acts a\n```\n", "does not parse"),
        ("```bash\ntorchrun --standalone -m saegeo.cli train --acts a \\\n    --batch-typo 4\n```\n", "does not parse"),
        ("## Geometry: `saegeo geometry`\n\nUse `--exclude-special` here.\n", "is not an option of `saegeo geometry`"),
        ("Run `saegeo nosuch --x`.\n", "names no saegeo command"),
        ("```bash\nsaegeo train --acts a --no-prog\n```\n", "does not parse"),  # an abbreviation is not the flag
    ],
)
def test_the_drift_check_catches_a_wrong_command(broken: str, expected: str) -> None:
    problems = drift(broken)
    assert any(expected in p for p in problems), problems
