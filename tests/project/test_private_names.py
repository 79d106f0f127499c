"""No private name (``_name``) is imported across modules (docs/design.md "Layout"): what two modules
share is public, in the module whose job it is. The walk is static (``ast``), every import wherever it sits."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parents[2] / "saegeo"


def private_imports(package_dir: Path) -> list[str]:
    """'path:line: from M import _x' for every private name imported from another saegeo module."""
    found = []
    for path in sorted(package_dir.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("saegeo")):
                names = [a.name for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]
                if names:
                    found.append(
                        f"{path.relative_to(package_dir.parent)}:{node.lineno}: from {'.' * node.level}"
                        f"{node.module or ''} import {', '.join(names)}"
                    )
            elif isinstance(node, ast.Import):
                found += [
                    f"{path.relative_to(package_dir.parent)}:{node.lineno}: import {a.name}"
                    for a in node.names
                    if a.name.startswith("saegeo")
                    and any(p.startswith("_") and not p.startswith("__") for p in a.name.split("."))
                ]
    return found


def test_no_private_name_is_imported_across_modules():
    assert private_imports(PACKAGE_DIR) == []


def test_the_check_sees_a_private_import(tmp_path):
    pkg = tmp_path / "saegeo"
    (pkg / "a").mkdir(parents=True)
    (pkg / "a" / "x.py").write_text("def f():\n    from saegeo.b.y import _hidden, shown\n")
    (pkg / "a" / "z.py").write_text("from .x import _g\nfrom saegeo.b import public\n")
    assert private_imports(pkg) == [
        "saegeo/a/x.py:2: from saegeo.b.y import _hidden",
        "saegeo/a/z.py:1: from .x import _g",
    ]
