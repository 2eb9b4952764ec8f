"""Imports inside functions, per package, and the modules each cheap entry point loads.

    .venv/bin/python benchmarks/imports.py [--entries] [--against REV]

Issue 40 counts the import statements written inside functions (gpu_ops's own modules
apart). Most belong at the top of their module; those left are the ones a cheap entry
point must not pay for. ``--entries`` runs each of those entry points in a fresh
interpreter and prints how many modules it loaded (all, gpu_ops's) and which heavy
packages: loading the code location, ``import gpu_ops``, the components registry, the
light CLI starts and the workers. ``--against REV`` prints the same figures for gpu_ops
as it was at git revision REV (extracted to a temporary folder) beside this tree's.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
HEAVY = {"dagster", "pandas", "pydantic", "torch", "kubetorch", "kubernetes", "sqlalchemy", "numpy", "pyarrow", "duckdb", "httpx"}
FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
PRICES = "currency: USD\nsource: test\nas_of: 2026-10-01\ngpus:\n  a100-80gb: {on-demand: 4.0, spot: 1.0}\n"
USAGE = (
    "start,end,namespace,pod,node,team,project,cost_center,experiment_id,gpu_type,gpu_count,capacity_type,sharing,gpu_share\n"
    "2026-10-01T22:00:00Z,2026-10-02T03:00:00Z,ml,p1,n1,nlp,llm,,,a100-80gb,2,spot,none,\n"
)


def in_function_imports(path: Path) -> tuple[int, int]:
    """(import statements inside functions, those naming only gpu_ops's modules)."""
    total = own = 0

    def visit(node: ast.AST, inside: bool) -> None:
        nonlocal total, own
        for child in ast.iter_child_nodes(node):
            if inside and isinstance(child, ast.ImportFrom):
                total += 1
                own += bool(child.level) or (child.module or "").split(".")[0] == "gpu_ops"
            elif inside and isinstance(child, ast.Import):
                total += 1
                own += all(a.name.split(".")[0] == "gpu_ops" for a in child.names)
            visit(child, inside or isinstance(child, FUNCTIONS))

    visit(ast.parse(path.read_text()), False)
    return total, own


def entries(tmp: Path) -> dict[str, str]:
    (tmp / "prices.yaml").write_text(PRICES)
    (tmp / "usage.csv").write_text(USAGE)
    (tmp / "cfg.yaml").write_text(f"storage: {{url: 'sqlite:///{tmp}/c.db'}}\nprices: {tmp}/prices.yaml\nchannels: {{log: {{type: log}}}}\nbudgets: []\n")
    cli = "from gpu_ops.cli import main\ntry:\n    main({!r})\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
    return {
        "import gpu_ops.definitions": "import gpu_ops.definitions as d; assert d.defs",
        "import gpu_ops, gpu_ops.errors": "import gpu_ops, gpu_ops.errors",
        "import gpu_ops.components": "import gpu_ops.components",
        "gpu-ops --help": cli.format(["--help"]),
        **{f"gpu-ops {c} --help": cli.format([c, "--help"]) for c in ("cost", "alerts", "plan", "validate", "demo")},
        "gpu-ops cost attribution (files)": cli.format(["cost", "attribution", "--usage", str(tmp / "usage.csv"), "--prices", str(tmp / "prices.yaml"), "--date", "2026-10-02"]),
        "gpu-ops alerts test log": cli.format(["alerts", "test", "log", "--config", str(tmp / "cfg.yaml")]),
        "the workers": "import gpu_ops.flows.compute.worker, gpu_ops.flows.training.worker",
    }


def loaded(code: str, root: Path) -> list[str]:
    probe = code + "\nimport sys, json\nprint('@@' + json.dumps(sorted(sys.modules)))"
    env = {**os.environ, "PYTHONPATH": str(root)}
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=root, env=env, timeout=300)
    if out.returncode:
        raise SystemExit(f"{code!r} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.rpartition("@@")[2])


def counts(root: Path) -> tuple[Counter[str], Counter[str]]:
    totals: Counter[str] = Counter()
    owns: Counter[str] = Counter()
    for path in sorted((root / "gpu_ops").rglob("*.py")):
        parts = path.relative_to(root).parts
        package = "gpu_ops/" + parts[1] if len(parts) > 2 else "gpu_ops (top level)"
        total, own = in_function_imports(path)
        totals[package] += total
        owns[package] += own
    return totals, owns


def report(roots: dict[str, Path], with_entries: bool) -> None:
    figures = {name: counts(root) for name, root in roots.items()}
    head = "".join(f"{name:>22}" for name in roots)
    print(f"{'import statements in functions (own)':38}{head}")
    packages = sorted({p for totals, _ in figures.values() for p in totals})
    for package in ["all", *packages]:
        cells = ""
        for totals, owns in figures.values():
            t, o = (sum(totals.values()), sum(owns.values())) if package == "all" else (totals[package], owns[package])
            cells += f"{f'{t} ({o})':>22}"
        print(f"  {package:36}{cells}")
    if not with_entries:
        return
    title = "modules loaded: all / gpu_ops's"
    print(f"{title:38}{head}")
    with tempfile.TemporaryDirectory() as tmp:
        for name, code in entries(Path(tmp)).items():
            cells, heavy = "", {}
            for tree, root in roots.items():
                mods = loaded(code, root)
                heavy[tree] = ", ".join(sorted({m.split(".")[0] for m in mods} & HEAVY)) or "-"
                ours = sum(m.startswith("gpu_ops") for m in mods)
                cells += f"{f'{len(mods)} / {ours}':>22}"
            print(f"  {name:36}{cells}")
            print(f"  {'':4}heavy: " + "; ".join(f"{tree}: {h}" for tree, h in heavy.items()))


def main() -> None:
    with_entries = "--entries" in sys.argv
    if "--against" not in sys.argv:
        report({"this tree": REPO}, with_entries)
        return
    rev = sys.argv[sys.argv.index("--against") + 1]
    with tempfile.TemporaryDirectory() as base:
        archive = subprocess.run(["git", "-C", str(REPO), "archive", rev, "gpu_ops"], capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", base], input=archive, check=True)
        report({rev: Path(base), "this tree": REPO}, with_entries)


if __name__ == "__main__":
    main()
