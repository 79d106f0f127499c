"""No function of saegeo over 80 lines without a written reason: each longer one is listed, with its reason, in
pyproject.toml's [tool.saegeo.long-functions], and a listed one that has shrunk below the limit (or is gone) must
leave the list, so the list only shrinks. (Ruff's complexity rules, C901/PLR0912/PLR0915, bound the branches and
statements; this bounds the length a reader has to hold.)"""

from __future__ import annotations

import ast
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
LIMIT = 80


def long_functions(root: Path, limit: int = LIMIT) -> dict[str, int]:
    """{"saegeo/x.py::Class.function": lines} of every function (methods and nested ones too) over `limit` lines,
    counted from its `def` (decorators aside) to its last line."""
    found = {}
    for path in sorted((root / "saegeo").rglob("*.py")):
        rel = path.relative_to(root).as_posix()

        def walk(node: ast.AST, prefix: str) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    lines = child.end_lineno - child.lineno + 1
                    if lines > limit:
                        found[f"{rel}::{prefix}{child.name}"] = lines
                    walk(child, f"{prefix}{child.name}.")
                elif isinstance(child, ast.ClassDef):
                    walk(child, f"{prefix}{child.name}.")

        walk(ast.parse(path.read_text(encoding="utf-8")), "")
    return found


def test_long_functions_counts_lines_from_def_to_the_end(tmp_path):
    (tmp_path / "saegeo").mkdir()
    body = "\n".join(f"        x{i} = {i}" for i in range(5))
    (tmp_path / "saegeo" / "m.py").write_text(f"def short():\n    pass\n\nclass C:\n    def long(self):\n{body}\n")
    assert long_functions(tmp_path, limit=5) == {"saegeo/m.py::C.long": 6}


def test_every_function_over_80_lines_is_listed_with_a_reason_and_the_list_only_shrinks():
    listed = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["saegeo"]["long-functions"]
    found = long_functions(ROOT)
    unlisted = {name: n for name, n in found.items() if name not in listed}
    assert not unlisted, (
        f"functions over {LIMIT} lines: split them, or list each with its reason in pyproject.toml: {unlisted}"
    )
    stale = sorted(set(listed) - set(found))
    assert not stale, f"no longer over {LIMIT} lines (or gone): remove from [tool.saegeo.long-functions]: {stale}"
    assert all(isinstance(reason, str) and len(reason.split()) >= 3 for reason in listed.values())
