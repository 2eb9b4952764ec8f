"""Every module of gpu_ops sits in one layer of the import-linter contract (`make lint`).

import-linter checks only the modules a contract names: a new module left out of the
layers would escape the rule that layers import only downward. This test reads the
contract from pyproject.toml and fails on a module no layer names.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def layer_modules() -> list[str]:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    (layers,) = [c for c in config["tool"]["importlinter"]["contracts"] if c["type"] == "layers"]
    return [m.strip() for layer in layers["layers"] for m in layer.replace("|", ":").split(":")]


def test_every_module_is_in_a_layer() -> None:
    named = layer_modules()
    assert len(named) == len(set(named)), "a module is named in two layers"
    modules = []
    for path in sorted((REPO / "gpu_ops").rglob("*.py")):
        parts = path.relative_to(REPO).with_suffix("").parts
        if parts[-1] == "__init__":
            continue  # packages: their modules are what is layered
        modules.append(".".join(parts))
    missing = [m for m in modules if not any(m == n or m.startswith(n + ".") for n in named)]
    assert not missing, f"modules in no layer of [tool.importlinter] (pyproject.toml): {missing}"


def test_the_layers_are_ordered_from_entry_to_domain() -> None:
    named = layer_modules()
    assert named.index("gpu_ops.cli") < named.index("gpu_ops.definitions") < named.index("gpu_ops.cost.assets")
    assert named.index("gpu_ops.cost.assets") < named.index("gpu_ops.cost.engine") < named.index("gpu_ops.storage.tables") < named.index("gpu_ops.cost.rules")
