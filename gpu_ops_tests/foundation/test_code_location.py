"""The code location, the CLI and `gpu-ops validate`, run as real processes."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def run(args: list[str], env: dict[str, str] | None = None, timeout: int = 120) -> subprocess.CompletedProcess:
    return subprocess.run(args, cwd=REPO, env={**os.environ, **(env or {})}, capture_output=True, text=True, timeout=timeout)


def test_loading_the_code_location_imports_neither_torch_nor_kubetorch_nor_duckdb():
    code = "import sys, gpu_ops.definitions as d; assert d.defs; print(sorted(m for m in ('torch', 'kubetorch', 'duckdb') if m in sys.modules))"
    out = run([sys.executable, "-c", code])
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def _fresh_clone_root(tmp_path: Path) -> dict[str, str]:
    """A working directory holding the repository's dagster.yaml and workspace.yaml, and an
    environment without DAGSTER_HOME or GPU_OPS_CONFIG: the repository root of a fresh
    clone, without writing into this checkout."""
    for name in ("dagster.yaml", "workspace.yaml"):
        shutil.copy(REPO / name, tmp_path / name)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DAGSTER_", "GPU_OPS_CONFIG"))}
    env["GPU_OPS_HOME"] = str(tmp_path / ".gpu_ops")
    return env


def test_dagster_validates_the_workspace_with_no_environment(tmp_path):
    env = _fresh_clone_root(tmp_path)
    out = subprocess.run([str(BIN / "dagster"), "definitions", "validate", "-w", "workspace.yaml"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr + out.stdout
    assert "All code locations passed validation" in out.stderr + out.stdout
    assert "DAGSTER_PG" not in out.stderr + out.stdout


def test_dagster_asset_materialize_selects_gpu_usage_alone_on_the_local_instance(tmp_path):
    """`dagster asset materialize` in the repository root: the local dagster.yaml's instance
    (SQLite under .gpu_ops/dagster_home) records the materialization of gpu_usage alone."""
    import dagster as dg

    env = _fresh_clone_root(tmp_path)
    out = subprocess.run(
        [str(BIN / "dagster"), "asset", "materialize", "-m", "gpu_ops.definitions", "--select", "gpu_usage", "--partition", "2026-10-14"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    home = tmp_path / ".gpu_ops" / "dagster_home"
    with dg.DagsterInstance.from_config(str(home)) as instance:
        usage = instance.get_latest_materialization_event(dg.AssetKey("gpu_usage"))
        assert usage is not None and usage.asset_materialization.partition == "2026-10-14"
        assert instance.get_latest_materialization_event(dg.AssetKey("gpu_usage_quarantine")) is None


def test_validate_passes_on_the_default_and_fails_with_a_fix_on_bad_storage(tmp_path):
    ok = run([str(BIN / "gpu-ops"), "validate", "--only", "storage"])
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "ok   storage: sqlite:///" in ok.stdout

    prices = REPO / "gpu_ops" / "demo" / "prices.yaml"
    cfg = tmp_path / "gpu_ops.yaml"
    # A literal password is refused: it would be stored wherever the URL goes.
    cfg.write_text(f"storage: {{url: 'postgresql://nobody:hunter2@127.0.0.1:1/none'}}\nprices: {prices}\n")
    literal = run([str(BIN / "gpu-ops"), "validate", "--config", str(cfg), "--only", "storage"])
    assert literal.returncode == 1
    assert "storage.url: holds a literal password" in literal.stdout
    assert "hunter2" not in literal.stdout + literal.stderr

    cfg.write_text(f"storage: {{url: 'postgresql://nobody:{{env: DB_PW}}@127.0.0.1:1/none'}}\nprices: {prices}\n")
    bad = run([str(BIN / "gpu-ops"), "validate", "--config", str(cfg), "--only", "storage"], env={"DB_PW": "hunter2"})
    assert bad.returncode == 1
    assert "FAIL storage: cannot reach the gpu_ops database postgresql://127.0.0.1:1/none" in bad.stdout
    assert "nobody" not in bad.stdout  # no userinfo in any message
    assert "fix: check storage.url" in bad.stdout
    assert "hunter2" not in bad.stdout + bad.stderr


def test_validate_reports_every_config_problem_and_exits_non_zero(tmp_path):
    cfg = tmp_path / "broken.yaml"
    cfg.write_text(
        "prices: {source: s, as_of: 2026-11-01, gpus: {a10: {spot: 1}}}\nbudgets: [{name: b, amount_usd: -1}]\n"
        "training: {retry_backoff_s: .inf}\nusage: {billing: {type: aws_cur, path: cur.parquet, tolerance_percent: .nan}}\n"
    )
    out = run([str(BIN / "gpu-ops"), "validate", "--config", str(cfg)])
    assert out.returncode == 1
    assert f"{cfg}: prices.gpus.a10: unknown GPU type 'a10'" in out.stdout
    assert f"{cfg}: budgets[0].amount_usd: must be > 0" in out.stdout
    assert f"{cfg}: training.retry_backoff_s: must be a finite number" in out.stdout  # a retry that waits for ever
    assert f"{cfg}: usage.billing.tolerance_percent: must be a finite number" in out.stdout


def test_validate_names_a_config_that_is_not_utf8(tmp_path):
    cfg = tmp_path / "latin1.yaml"
    cfg.write_bytes(b"# Ren\xe9\nprices: p.yaml\n")
    out = run([str(BIN / "gpu-ops"), "validate", "--config", str(cfg)])
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
    assert f"{cfg}: not UTF-8 text (byte b'\\xe9' at offset 5)" in out.stdout


def test_a_broken_config_is_a_load_error_of_the_code_location(tmp_path):
    cfg = tmp_path / "broken.yaml"
    cfg.write_text("prices: {source: s, as_of: 2026-11-01, gpus: {t4: {spot: 0}}}\n")
    out = run([sys.executable, "-c", "import gpu_ops.definitions"], env={"GPU_OPS_CONFIG": str(cfg)})
    assert out.returncode != 0
    assert f"{cfg}: prices.gpus.t4.spot: must be > 0" in out.stderr


# Imported at run time by the ops, assets and sensor, never while the code location loads.
HEAVY_MODULES = ("torch", "kubetorch", "pandas", "numpy", "pyarrow", "sqlalchemy", "httpx", "kubernetes", "fsspec")


def _heavy_modules_after(statement: str) -> set[str]:
    code = f"import sys; {statement}; print(','.join(m for m in {HEAVY_MODULES!r} if m in sys.modules))"
    out = run([sys.executable, "-c", code])
    assert out.returncode == 0, out.stderr
    return set(filter(None, out.stdout.strip().split(",")))


def test_loading_the_code_location_imports_no_heavy_module_beyond_dagster_itself():
    """The load-time budget (issue 2: at most 1.5x `import dagster`): pandas, SQLAlchemy,
    httpx, ... load inside the ops, assets and sensor that use them. Whatever `import
    dagster` loads by itself is not ours to avoid, so it is subtracted."""
    baseline = _heavy_modules_after("import dagster")
    location = _heavy_modules_after("import gpu_ops.definitions as d; assert d.defs")
    assert location - baseline == set(), f"loading gpu_ops.definitions imports {sorted(location - baseline)}; import them where they are used"


def test_the_lazy_dataframe_type_is_what_dagster_infers_from_a_dataframe_annotation():
    """The cost assets declare their DataFrame inputs and output with DATAFRAME_TYPE instead
    of a `pd.DataFrame` annotation (which needs pandas at load); the UI and the type
    check see the same type."""
    import dagster as dg
    import pandas as pd
    from dagster._core.types.dagster_type import resolve_dagster_type

    from gpu_ops.storage.io_manager import DATAFRAME_TYPE

    inferred = resolve_dagster_type(pd.DataFrame)
    for attr in ("key", "display_name", "description", "kind", "is_builtin", "has_unique_name", "typing_type"):
        assert getattr(DATAFRAME_TYPE, attr) == getattr(inferred, attr), attr
    ok = dg.check_dagster_type(DATAFRAME_TYPE, pd.DataFrame({"a": [1]}))
    bad, bad_inferred = dg.check_dagster_type(DATAFRAME_TYPE, [1]), dg.check_dagster_type(inferred, [1])
    assert ok.success and not bad.success
    assert bad.description == bad_inferred.description
