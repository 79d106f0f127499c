"""The import order of the package (issue 11, DESIGN.md "Layout").

Imports run strictly upward, top-level and inside functions alike:

    {saegeo, saegeo.errors, saegeo.io, saegeo.config, saegeo.distributed} <- saegeo.geometry
        <- {saegeo.activations, saegeo.synthetic} <- saegeo.sae <- saegeo.report
        <- saegeo.pipeline <- saegeo.cli

A module may import a module of a strictly lower level, or a module of its own top-level package
(saegeo.report.check -> saegeo.report.flags). Two packages of the same level (saegeo.activations and
saegeo.synthetic) may not import each other; the base level (the package root, errors, io,
distributed) may import itself, but no import, at any level, may close a cycle.

The walk is static (``ast``): every ``import x``, ``from x import y`` and relative import in every
module, wherever it sits (module level, function, method, ``if TYPE_CHECKING``), plus
``importlib.import_module("saegeo....")`` with a literal name. Nothing is imported, so the test sees
imports that a run would never reach. An import of saegeo.a.b is an edge to saegeo.a.b (the most
specific module it names); the package __init__s Python runs on the way are not counted as edges,
since they are loaded before the importer whatever the order (and reach upward only through an
edge this test already reports).
"""

from __future__ import annotations

import ast
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE = "saegeo"
PACKAGE_DIR = Path(__file__).resolve().parents[1] / PACKAGE

# Top-level unit (the package root, a top-level module or a top-level package) -> level.
LEVELS: dict[str, int] = {
    "saegeo": 0,
    "saegeo.errors": 0,
    "saegeo.io": 0,
    "saegeo.config": 0,
    "saegeo.distributed": 0,
    "saegeo.geometry": 1,
    "saegeo.activations": 2,
    "saegeo.synthetic": 2,
    "saegeo.sae": 3,
    "saegeo.report": 4,
    "saegeo.pipeline": 5,
    "saegeo.cli": 6,
}
BASE_LEVEL = 0

# saegeo.geometry is pure math: no file formats, models, progress bars or plots.
GEOMETRY_FORBIDDEN = (
    "safetensors",
    "transformers",
    "transformer_lens",
    "huggingface_hub",
    "datasets",
    "tqdm",
    "rich",
    "matplotlib",
)
# ... and the only thing it takes from saegeo.io is the one JSON-safe conversion.
GEOMETRY_IO_NAMES = {"json_safe"}


@dataclass(frozen=True)
class Edge:
    src: str  # importing module
    dst: str  # imported module (saegeo.*) or top-level name of an external library
    names: tuple[str, ...]  # the names of a ``from dst import ...`` (empty for ``import dst``)
    path: Path
    line: int


def find_modules(package_dir: Path) -> dict[str, tuple[Path, bool]]:
    """Every module of the package: dotted name -> (file, is_package)."""
    modules = {}
    for path in sorted(package_dir.rglob("*.py")):
        parts = list(path.relative_to(package_dir.parent).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        if is_pkg:
            parts = parts[:-1]
        modules[".".join(parts)] = (path, is_pkg)
    return modules


def _known(name: str, modules) -> str:
    """The longest prefix of ``name`` that is a module of the package (``saegeo.x.y.attr`` -> ``saegeo.x.y``)."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        cand = ".".join(parts[:i])
        if cand in modules:
            return cand
    return name  # an unknown saegeo module: reported as such by the layer check


def imports_of(module: str, path: Path, is_pkg: bool, modules, package: str = PACKAGE) -> list[Edge]:
    """All import edges of one module, wherever they sit in the file."""
    tree = ast.parse(path.read_text(), filename=str(path))
    here = module if is_pkg else module.rpartition(".")[0]  # the package relative imports start from
    edges: list[Edge] = []

    def add(target: str, names: tuple[str, ...], line: int):
        if target == package or target.startswith(package + "."):
            edges.append(Edge(module, _known(target, modules), names, path, line))
        else:
            edges.append(Edge(module, target.split(".")[0], names, path, line))

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name, (), node.lineno)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = here.split(".")
                if node.level - 1 >= len(base_parts):
                    raise AssertionError(f"{path}:{node.lineno}: relative import beyond the top-level package")
                base_parts = base_parts[: len(base_parts) - (node.level - 1)]
                base = ".".join(base_parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            if base == package or base.startswith(package + "."):
                # ``from saegeo.report import flags`` imports the submodule saegeo.report.flags.
                sub = [a.name for a in node.names if f"{base}.{a.name}" in modules]
                for name in sub:
                    add(f"{base}.{name}", (), node.lineno)
                rest = tuple(a.name for a in node.names if a.name not in sub)
                if rest:
                    add(base, rest, node.lineno)
            else:
                add(base, tuple(a.name for a in node.names), node.lineno)
        elif isinstance(node, ast.Call):
            fn = node.func
            fname = fn.attr if isinstance(fn, ast.Attribute) else fn.id if isinstance(fn, ast.Name) else None
            if (
                fname in ("import_module", "__import__")
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)
            ):
                add(node.args[0].value, (), node.lineno)
    return edges


def all_edges(package_dir: Path = PACKAGE_DIR, package: str = PACKAGE) -> tuple[dict, list[Edge]]:
    modules = find_modules(package_dir)
    edges = []
    for name, (path, is_pkg) in modules.items():
        edges.extend(imports_of(name, path, is_pkg, modules, package))
    return modules, edges


def unit(module: str, package: str = PACKAGE) -> str:
    """The top-level unit a module belongs to: saegeo.report.check -> saegeo.report."""
    return ".".join(module.split(".")[:2]) if module != package else package


def layer_violations(edges: list[Edge], levels: dict[str, int], package: str = PACKAGE) -> list[str]:
    """Every saegeo -> saegeo edge against the order, as 'file:line: message'."""
    out = []
    for e in edges:
        if not (e.dst == package or e.dst.startswith(package + ".")):
            continue
        su, du = unit(e.src, package), unit(e.dst, package)
        where = _where(e)
        if su not in levels:
            out.append(f"{where}: {e.src} belongs to {su}, which has no place in the import order")
            continue
        if du not in levels:
            out.append(f"{where}: {e.src} imports {e.dst}, which has no place in the import order")
            continue
        ls, ld = levels[su], levels[du]
        if su == du or ld < ls or (ls == ld == BASE_LEVEL):
            continue
        kind = "upward" if ld > ls else "sideways (same level, other package)"
        out.append(f"{where}: {e.src} (level {ls}) imports {e.dst} (level {ld}): {kind}")
    return out


def cycle_edges(edges: list[Edge], package: str = PACKAGE) -> list[list[Edge]]:
    """The import edges that lie on a cycle, grouped by strongly connected component.

    In a strongly connected component every edge between two of its members lies on a cycle
    (its target reaches its source), so listing those edges lists every edge that closes a cycle.
    """
    internal = [e for e in edges if e.dst == package or e.dst.startswith(package + ".")]
    graph: dict[str, set[str]] = {}
    for e in internal:
        graph.setdefault(e.src, set()).add(e.dst)
        graph.setdefault(e.dst, set())

    # Tarjan's algorithm, iterative (no recursion limit to think about).
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    comps: list[set[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            v, it = work[-1]
            nxt = next(it, None)
            if nxt is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = set()
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        comp.add(w)
                        if w == v:
                            break
                    comps.append(comp)
            elif nxt not in index:
                index[nxt] = low[nxt] = counter
                counter += 1
                stack.append(nxt)
                on_stack.add(nxt)
                work.append((nxt, iter(sorted(graph[nxt]))))
            elif nxt in on_stack:
                low[v] = min(low[v], index[nxt])

    out = []
    for comp in comps:
        inside = [e for e in internal if e.src in comp and e.dst in comp]
        if len(comp) > 1 or inside:  # a self-import is a cycle of one
            out.append(sorted(inside, key=lambda e: (str(e.path), e.line)))
    return out


def _where(e: Edge) -> str:
    depth = len(e.src.split(".")) - (0 if e.path.name == "__init__.py" else 1)
    return f"{e.path.relative_to(e.path.parents[depth])}:{e.line}"


def format_cycles(cycles: list[list[Edge]]) -> list[str]:
    lines = []
    for comp in sorted(cycles, key=lambda c: sorted({e.src for e in c})):
        members = sorted({e.src for e in comp})
        lines.append(f"cycle among {', '.join(members)}:")
        lines.extend(f"  {_where(e)}: {e.src} imports {e.dst}" for e in comp)
    return lines


def geometry_violations(edges: list[Edge], package: str = PACKAGE) -> list[str]:
    out = []
    for e in edges:
        if unit(e.src, package) != f"{package}.geometry":
            continue
        if e.dst in GEOMETRY_FORBIDDEN:
            out.append(f"{_where(e)}: {e.src} imports {e.dst} (geometry is pure math: no I/O libraries)")
        elif e.dst == f"{package}.io" and not set(e.names) <= GEOMETRY_IO_NAMES:
            extra = sorted(set(e.names) - GEOMETRY_IO_NAMES) or ["the module itself"]
            out.append(f"{_where(e)}: {e.src} takes {', '.join(extra)} from {e.dst} (only json_safe is allowed)")
    return out


# ---------------------------------------------------------------------------------------------------
# The package itself


@pytest.fixture(scope="module")
def package_edges():
    modules, edges = all_edges()
    assert "saegeo.geometry.measures" in modules and "saegeo.cli" in modules, sorted(modules)
    return modules, edges


def test_every_module_has_a_place_in_the_order(package_edges):
    """Each module belongs to one of the units of the order (a new top-level module must be placed)."""
    modules, _ = package_edges
    unplaced = sorted(m for m in modules if unit(m) not in LEVELS)
    if unplaced:
        pytest.fail(f"modules outside the import order: {unplaced}", pytrace=False)


def test_imports_run_strictly_upward(package_edges):
    """No module imports a module of a higher level or of another package of its own level."""
    _, edges = package_edges
    bad = layer_violations(edges, LEVELS)
    if bad:
        pytest.fail(f"{len(bad)} import(s) against the order:\n" + "\n".join(bad), pytrace=False)


def test_no_import_cycle(package_edges):
    """No cycle among saegeo modules, counting imports inside functions and within a package."""
    _, edges = package_edges
    cycles = cycle_edges(edges)
    if cycles:
        pytest.fail(f"{len(cycles)} import cycle(s):\n" + "\n".join(format_cycles(cycles)), pytrace=False)


def test_geometry_is_pure_math(package_edges):
    """saegeo.geometry imports no file-format, model, progress-bar or plotting library, and takes only
    json_safe from saegeo.io."""
    _, edges = package_edges
    bad = geometry_violations(edges)
    if bad:
        pytest.fail("\n".join(bad), pytrace=False)


# ---------------------------------------------------------------------------------------------------
# The checker on a small made-up package: it sees what it claims to see


def _write(root: Path, files: dict[str, str]) -> Path:
    pkg = root / PACKAGE
    for rel, text in files.items():
        p = pkg / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(text))
    return pkg


def test_checker_finds_upward_sideways_relative_and_function_level_imports(tmp_path):
    """Upward and sideways edges are found wherever the import sits, relative ones resolved, each with
    its file:line; allowed edges (downward, within a package, within the base level) are not."""
    pkg = _write(
        tmp_path,
        {
            "__init__.py": "__version__ = '0'\n",
            "errors.py": "class SaegeoError(Exception):\n    pass\n",
            "io.py": "from saegeo.errors import SaegeoError\nfrom saegeo import __version__\n",
            "distributed.py": "def f():\n    from . import io\n",
            "geometry/__init__.py": "from .measures import m\n",
            "geometry/measures.py": (
                "from saegeo.io import json_safe\n"
                "def m():\n"
                "    from saegeo.activations import store\n"  # line 3: upward, in a function
                "    from safetensors.torch import load_file\n"  # line 4: I/O library in geometry
                "    from saegeo.io import atomic_write\n"  # line 5: more than json_safe
            ),
            "activations/__init__.py": "",
            "activations/store.py": "from ..geometry import measures\nfrom .. import errors\n",
            "synthetic/__init__.py": "",
            "synthetic/superposition.py": (
                "class G:\n"
                "    def save(self):\n"
                "        from ..activations.store import write\n"  # line 3: sideways, relative, in a method
            ),
            "sae/__init__.py": "",
            "sae/check.py": "import importlib\nR = importlib.import_module('saegeo.report.flags')\n",
            "report/__init__.py": "",
            "report/flags.py": "from saegeo.sae import check\n",
            "pipeline.py": "import saegeo.cli\n",
            "cli.py": "from saegeo import pipeline\n",
        },
    )
    modules, edges = all_edges(pkg)
    bad = layer_violations(edges, LEVELS)
    assert sorted(bad) == sorted(
        [
            "saegeo/geometry/measures.py:3: saegeo.geometry.measures (level 1) imports saegeo.activations.store (level 2): upward",
            "saegeo/synthetic/superposition.py:3: saegeo.synthetic.superposition (level 2) imports saegeo.activations.store (level 2): sideways (same level, other package)",
            "saegeo/sae/check.py:2: saegeo.sae.check (level 3) imports saegeo.report.flags (level 4): upward",
            "saegeo/pipeline.py:1: saegeo.pipeline (level 5) imports saegeo.cli (level 6): upward",
        ]
    ), "\n".join(bad)
    assert geometry_violations(edges) == [
        "saegeo/geometry/measures.py:4: saegeo.geometry.measures imports safetensors (geometry is pure math: no I/O libraries)",
        "saegeo/geometry/measures.py:5: saegeo.geometry.measures takes atomic_write from saegeo.io (only json_safe is allowed)",
    ]
    # A cycle through a function-level import is still a cycle; the two report cycles are listed edge by edge.
    listed = format_cycles(cycle_edges(edges))
    assert "cycle among saegeo.cli, saegeo.pipeline:" in listed
    assert "  saegeo/pipeline.py:1: saegeo.pipeline imports saegeo.cli" in listed
    assert "  saegeo/cli.py:1: saegeo.cli imports saegeo.pipeline" in listed
    assert "cycle among saegeo.report.flags, saegeo.sae.check:" in listed
    assert "cycle among saegeo.activations.store, saegeo.geometry.measures:" in listed
    assert len(cycle_edges(edges)) == 3


def test_checker_finds_a_cycle_within_a_package_and_within_the_base_level(tmp_path):
    """Same-package and base-level imports are allowed by the order but not when they close a cycle."""
    pkg = _write(
        tmp_path,
        {
            "__init__.py": "",
            "errors.py": "def f():\n    import saegeo.io\n",
            "io.py": "from saegeo.errors import f\n",
            "report/__init__.py": "from saegeo.report.render import r\n",
            "report/render.py": "def r():\n    from saegeo.report import report\n",
            "report/report.py": "from . import render\n",
        },
    )
    _, edges = all_edges(pkg)
    assert layer_violations(edges, LEVELS) == []
    listed = format_cycles(cycle_edges(edges))
    assert listed == [
        "cycle among saegeo.errors, saegeo.io:",
        "  saegeo/errors.py:2: saegeo.errors imports saegeo.io",
        "  saegeo/io.py:1: saegeo.io imports saegeo.errors",
        "cycle among saegeo.report.render, saegeo.report.report:",
        "  saegeo/report/render.py:2: saegeo.report.render imports saegeo.report.report",
        "  saegeo/report/report.py:1: saegeo.report.report imports saegeo.report.render",
    ], listed


def test_checker_refuses_a_module_outside_the_order(tmp_path):
    """A new top-level module must be given a level before anything may import it."""
    pkg = _write(tmp_path, {"__init__.py": "", "cli.py": "from saegeo import extra\n", "extra.py": ""})
    _, edges = all_edges(pkg)
    assert layer_violations(edges, LEVELS) == [
        "saegeo/cli.py:1: saegeo.cli imports saegeo.extra, which has no place in the import order"
    ]
