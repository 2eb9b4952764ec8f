"""The packages of gpu_ops are its layers, and the import-linter contract (`make lint`) names
them all, in order.

import-linter checks only what a contract names: a module outside every layer's package
would escape the rule that layers import only downward. This test reads the contract from
pyproject.toml and fails on a module no layer's package holds, and on layers out of order.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ORDER = ["gpu_ops.cli", "gpu_ops.components", "gpu_ops.definitions", "gpu_ops.dagster", "gpu_ops.flows", "gpu_ops.storage", "gpu_ops.domain", "gpu_ops.errors"]


def contracts() -> list[dict]:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]


def layer_packages() -> list[list[str]]:
    (layers,) = [c for c in contracts() if c["type"] == "layers"]
    return [[m.strip() for m in layer.replace("|", ":").split(":")] for layer in layers["layers"]]


def test_every_module_is_in_a_layer() -> None:
    named = [m for layer in layer_packages() for m in layer]
    assert len(named) == len(set(named)), "a package is named in two layers"
    modules = []
    for path in sorted((REPO / "gpu_ops").rglob("*.py")):
        parts = path.relative_to(REPO).with_suffix("").parts
        if parts == ("gpu_ops", "__init__"):
            continue  # the public names, imported lazily: above every layer
        modules.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    missing = [m for m in modules if not any(m == n or m.startswith(n + ".") for n in named)]
    assert not missing, f"modules in no layer of [tool.importlinter] (pyproject.toml): {missing}"


def test_the_layers_are_packages_ordered_from_entry_to_errors() -> None:
    layers = layer_packages()
    assert [layer[0] for layer in layers] == ORDER
    assert all(len(layer) == 1 for layer in layers[1:]), "one package per layer below the entry points"
    for name in (m for layer in layers for m in layer):
        path = REPO / name.replace(".", "/")
        assert path.is_dir() or path.with_suffix(".py").is_file(), f"{name} names no package or module"


def test_nothing_below_the_wiring_imports_dagster() -> None:
    (forbidden,) = [c for c in contracts() if c["type"] == "forbidden"]
    assert set(forbidden["source_modules"]) == set(ORDER[ORDER.index("gpu_ops.flows") :])
    assert "dagster" in forbidden["forbidden_modules"]
