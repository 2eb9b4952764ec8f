"""No import cycle among gpu_ops's modules, counting every import the source writes.

import-linter's layers contract (`make lint`) catches an import that climbs a layer, but
two modules of one layer may still import each other, and a cycle closed through a
``TYPE_CHECKING`` block or an import inside a function runs at no import time, so Python
never complains. This test parses each module with :mod:`ast`, takes every ``import`` and
``from ... import`` anywhere in it (module level, ``if TYPE_CHECKING:``, functions,
methods), resolves relative imports, and finds the strongly connected components of the
module graph: any component of more than one module is a cycle.

An edge goes to the module an import names (``from gpu_ops.flows.cost import window`` names
``gpu_ops.flows.cost.window``; ``from gpu_ops.flows.cost.read import expand_pattern`` names
``gpu_ops.flows.cost.read``), not to the parent packages Python also runs on the way: those
hold docstrings and ``gpu_ops``'s lazy public names, not code a module depends on.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# Cycles tolerated for now (none are left): the test fails on any cycle not listed here,
# and on a listed one that is gone, so this list only shrinks.
KNOWN_CYCLES: set[frozenset[str]] = set()


def module_files(root: Path, package: str) -> dict[str, Path]:
    """Dotted module name -> file, for every ``.py`` under ``root/package``."""
    found = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def imported_modules(module: str, path: Path, node: ast.Import | ast.ImportFrom, modules: Mapping[str, Path]) -> set[str]:
    """The modules of ``modules`` one import statement names, relative imports resolved:
    ``from pkg import sub`` names ``pkg.sub`` when that is a module, else ``pkg``."""
    if isinstance(node, ast.Import):
        return {_nearest(alias.name, modules) for alias in node.names}
    if node.level:
        here = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
        here = here[: len(here) - (node.level - 1)]
        prefix = ".".join(here + ([node.module] if node.module else []))
    else:
        prefix = node.module or ""
    return {f"{prefix}.{alias.name}" if f"{prefix}.{alias.name}" in modules else _nearest(prefix, modules) for alias in node.names}


def _nearest(name: str, modules: Mapping[str, Path]) -> str:
    """``name`` if it is a module, else the closest enclosing module ('' outside)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name


def import_graph(modules: Mapping[str, Path]) -> dict[str, set[str]]:
    """Module -> the modules of ``modules`` it imports anywhere in its source."""
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                targets |= imported_modules(module, path, node, modules)
        graph[module] = targets - {"", module}
    return graph


def reachable(graph: Mapping[str, set[str]], start: str) -> set[str]:
    """Every module ``start`` reaches through one or more imports."""
    seen: set[str] = set()
    todo = list(graph.get(start, ()))
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo.extend(graph.get(module, ()))
    return seen


def cycles(graph: Mapping[str, set[str]]) -> set[frozenset[str]]:
    """The strongly connected components of more than one module: a module's component is
    every module it reaches that reaches it back (a few hundred modules: quadratic is fine)."""
    reach = {module: reachable(graph, module) for module in graph}
    return {frozenset({m} | {o for o in reach[m] if m in reach[o]}) for m in graph if any(m in reach[o] for o in reach[m] if o != m)}


def _show(found: set[frozenset[str]], graph: Mapping[str, set[str]]) -> str:
    return "\n".join(
        "  " + "; ".join(f"{m} -> {', '.join(sorted(graph[m] & c))}" for m in sorted(c)) for c in sorted(found, key=sorted)
    )


def test_gpu_ops_has_no_import_cycle() -> None:
    graph = import_graph(module_files(REPO, "gpu_ops"))
    assert len(graph) > 100 and graph["gpu_ops.flows.cost.read"], "the walk found gpu_ops's modules and their imports"
    found = cycles(graph)
    new = {c for c in found if c not in KNOWN_CYCLES}
    assert not new, "import cycles (TYPE_CHECKING and function-level imports count); move the shared piece down a layer:\n" + _show(new, graph)
    gone = KNOWN_CYCLES - found
    assert not gone, f"known cycles that are no longer cycles: delete them from KNOWN_CYCLES: {[sorted(c) for c in gone]}"


def test_the_walk_finds_cycles_through_type_checking_functions_and_relative_imports(tmp_path: Path) -> None:
    files = {
        "pkg/__init__.py": "",
        # a <-> b: b's side only under TYPE_CHECKING
        "pkg/a.py": "from pkg.b import B\n",
        "pkg/b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.a import A\nclass B: ...\n",
        # c -> d at module level, d -> c inside a method, through a relative import
        "pkg/sub/__init__.py": "",
        "pkg/sub/c.py": "from . import d\n",
        "pkg/sub/d.py": "class D:\n    def f(self):\n        from ..sub.c import x\n        return x\n",
        # e -> f -> a: downward only, no cycle
        "pkg/e.py": "import pkg.f\n",
        "pkg/f.py": "from .a import thing\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    graph = import_graph(module_files(tmp_path, "pkg"))
    assert graph["pkg.sub.c"] == {"pkg.sub.d"} and graph["pkg.e"] == {"pkg.f"} and graph["pkg.f"] == {"pkg.a"}
    assert cycles(graph) == {frozenset({"pkg.a", "pkg.b"}), frozenset({"pkg.sub.c", "pkg.sub.d"})}
