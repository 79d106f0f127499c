"""The import order of the package (docs/design.md "Layout"), held by the import-linter contracts in pyproject.toml.

    {errors, io, config, distributed} <- geometry <- {activations, synthetic} <- sae <- report <- render
        <- pipeline <- cli

import-linter (`lint-imports`, also run by `make lint`) reads every import statement of every module, function
level and `if TYPE_CHECKING` included. The contracts: imports run upward only (siblings of a layer: activations
and synthetic independent, the base modules free among themselves); every top-level module has a layer; no import
cycle among the modules of a package; saegeo.geometry imports no file formats, models, progress bars or plots.
The tests below run the contracts on this tree, and on copies of it with one violation each, which they must catch.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def _lint_imports(root: Path) -> subprocess.CompletedProcess:
    """lint-imports with root's pyproject.toml on root's saegeo (first on the path, ahead of any installed one)."""
    if not LINT_IMPORTS.exists():
        pytest.fail(f"{LINT_IMPORTS} is missing: install the test extra (pip install -e '.[test]')")
    env = dict(os.environ, PYTHONPATH=str(root))
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", "--no-logo", str(root / "pyproject.toml")],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_import_contracts_hold():
    proc = _lint_imports(ROOT)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    assert "3 kept, 0 broken" in proc.stdout, proc.stdout[-2000:]


VIOLATIONS = {
    # an upward import inside a function: geometry -> report
    "upward": (
        {"saegeo/geometry/_violation.py": "def f():\n    from saegeo.report import flags\n"},
        "imports run upward",
    ),
    # two independent siblings: synthetic -> activations
    "sideways": ({"saegeo/synthetic/_violation.py": "import saegeo.activations.store\n"}, "imports run upward"),
    # a cycle between two modules of one package (each import is allowed by the layers)
    "cycle": (
        {
            "saegeo/report/_cycle_a.py": "from saegeo.report import _cycle_b\n",
            "saegeo/report/_cycle_b.py": "from saegeo.report import _cycle_a\n",
        },
        "no import cycle",
    ),
    # a progress bar in geometry, behind TYPE_CHECKING
    "geometry": (
        {"saegeo/geometry/_violation.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import tqdm\n"},
        "pure math",
    ),
    # a top-level module the layers do not name
    "unplaced": ({"saegeo/elsewhere.py": "X = 1\n"}, "imports run upward"),
}


@pytest.mark.parametrize("case", sorted(VIOLATIONS))
def test_the_contracts_catch_a_violation(case, tmp_path):
    files, contract = VIOLATIONS[case]
    shutil.copytree(ROOT / "saegeo", tmp_path / "saegeo", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    proc = _lint_imports(tmp_path)
    assert proc.returncode != 0, proc.stdout[-3000:]
    broken = [line for line in proc.stdout.splitlines() if " BROKEN" in line]  # "BROKEN (n ignored imports)"
    assert any(contract in line for line in broken), proc.stdout[-3000:]
