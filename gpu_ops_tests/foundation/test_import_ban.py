"""The heavy-import ban (ruff TID253, pyproject.toml) exempts only modules nothing cheap loads.

``[tool.ruff.lint.flake8-tidy-imports]`` bans torch, pandas, SQLAlchemy, ... at module
level; ``per-file-ignores`` lifts the ban by package, for whole packages only
(``gpu_ops/flows/{cost,alerts,observability,compute}/**``, ``gpu_ops/{storage,cli,demo}/**``).
That is only right while none of their modules is loaded by what must stay cheap: the code
location, ``import gpu_ops``, the ``dg`` components registry, ``import gpu_ops.errors``.
This test reads the exemptions from pyproject.toml, fails on one that names a file rather
than a package, loads each of those in a fresh interpreter and fails on an exempt module it
loaded.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CHEAP = ("import gpu_ops.definitions as d; assert d.defs", "import gpu_ops, gpu_ops.errors", "import gpu_ops.components")


def _braces(pattern: str) -> list[str]:
    """``a/{b,c}.py`` -> ``a/b.py``, ``a/c.py`` (ruff's globs; pathlib's lack braces)."""
    m = re.search(r"\{([^{}]*)\}", pattern)
    if m is None:
        return [pattern]
    return [out for alt in m.group(1).split(",") for out in _braces(pattern[: m.start()] + alt + pattern[m.end() :])]


def exemptions() -> list[str]:
    """The per-file-ignores patterns of pyproject.toml that lift TID253 in the package."""
    ruff = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["ruff"]["lint"]
    return [p for p, codes in ruff["per-file-ignores"].items() if "TID253" in codes and p.startswith("gpu_ops/")]


def exempt_modules(patterns: list[str]) -> set[str]:
    """The modules of the packages ``patterns`` name (each ``<package>/**``)."""
    found = set()
    for pattern in patterns:
        for expanded in _braces(pattern):
            for path in REPO.glob(expanded + "/*.py"):
                parts = list(path.relative_to(REPO).with_suffix("").parts)
                found.add(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return found


def _loaded_by(statement: str) -> set[str]:
    code = f"import sys; {statement}; print(' '.join(m for m in sys.modules if m.startswith('gpu_ops')))"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return set(out.stdout.split())


def test_the_ban_is_lifted_by_package_for_no_module_the_code_location_or_import_gpu_ops_loads() -> None:
    patterns = exemptions()
    assert patterns and all(p.endswith("/**") for p in patterns), f"an exemption names files, not a whole package: {patterns}"
    exempt = exempt_modules(patterns)
    assert {"gpu_ops.flows.cost.engine", "gpu_ops.cli.exporter", "gpu_ops.demo.run"} <= exempt, "the exemptions were read"
    for statement in CHEAP:
        loaded = _loaded_by(statement)
        assert "gpu_ops.domain.config" in loaded or statement.startswith("import gpu_ops,"), statement
        wrong = sorted(loaded & exempt)
        assert not wrong, f"`{statement}` loads {wrong}, which per-file-ignores lets import torch/pandas/... at module level: take them off the list"
