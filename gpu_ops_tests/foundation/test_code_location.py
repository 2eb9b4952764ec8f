"""The code location, the CLI and `gpu-ops validate`, run as real processes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def run(args: list[str], env: dict[str, str] | None = None, timeout: int = 120) -> subprocess.CompletedProcess:
    return subprocess.run(args, cwd=REPO, env={**os.environ, **(env or {})}, capture_output=True, text=True, timeout=timeout)


def test_loading_the_code_location_imports_neither_torch_nor_kubetorch():
    code = "import sys, gpu_ops.definitions as d; assert d.defs; print(sorted(m for m in ('torch', 'kubetorch') if m in sys.modules))"
    out = run([sys.executable, "-c", code])
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_dagster_validates_the_workspace(tmp_path):
    # The repository's dagster.yaml is the production instance (PostgreSQL from env
    # vars); local commands use an instance of their own, as `make dev` does.
    out = run([str(BIN / "dagster"), "definitions", "validate", "-w", "workspace.yaml"], env={"DAGSTER_HOME": str(tmp_path)})
    assert out.returncode == 0, out.stderr + out.stdout
    assert "All code locations passed validation" in out.stderr + out.stdout


def test_validate_passes_on_the_default_and_fails_with_a_fix_on_bad_storage(tmp_path):
    ok = run([str(BIN / "gpu-ops"), "validate", "--only", "storage"])
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "ok   storage: sqlite:///" in ok.stdout

    prices = REPO / "gpu_ops" / "demo" / "prices.yaml"
    cfg = tmp_path / "gpu_ops.yaml"
    cfg.write_text(f"storage: {{url: 'postgresql://nobody:hunter2@127.0.0.1:1/none'}}\nprices: {prices}\n")
    bad = run([str(BIN / "gpu-ops"), "validate", "--config", str(cfg), "--only", "storage"])
    assert bad.returncode == 1
    assert "FAIL storage: cannot open postgresql://nobody:***@127.0.0.1:1/none" in bad.stdout
    assert "fix: check storage.url" in bad.stdout
    assert "hunter2" not in bad.stdout + bad.stderr


def test_validate_reports_every_config_problem_and_exits_non_zero(tmp_path):
    cfg = tmp_path / "broken.yaml"
    cfg.write_text("prices: {source: s, as_of: 2026-11-01, gpus: {a10: {spot: 1}}}\nbudgets: [{name: b, amount_usd: -1}]\n")
    out = run([str(BIN / "gpu-ops"), "validate", "--config", str(cfg)])
    assert out.returncode == 1
    assert f"{cfg}: prices.gpus.a10: unknown GPU type 'a10'" in out.stdout
    assert f"{cfg}: budgets[0].amount_usd: must be > 0" in out.stdout


def test_a_broken_config_is_a_load_error_of_the_code_location(tmp_path):
    cfg = tmp_path / "broken.yaml"
    cfg.write_text("prices: {source: s, as_of: 2026-11-01, gpus: {t4: {spot: 0}}}\n")
    out = run([sys.executable, "-c", "import gpu_ops.definitions"], env={"GPU_OPS_CONFIG": str(cfg)})
    assert out.returncode != 0
    assert f"{cfg}: prices.gpus.t4.spot: must be > 0" in out.stderr
