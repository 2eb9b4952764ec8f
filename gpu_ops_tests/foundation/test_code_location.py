"""The code location, the CLI and `gpu-ops validate`, run as real processes."""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def run(args: list[str], env: dict[str, str] | None = None, timeout: int = 120) -> subprocess.CompletedProcess:
    return subprocess.run(args, cwd=REPO, env={**os.environ, **(env or {})}, capture_output=True, text=True, timeout=timeout)


def test_loading_the_code_location_imports_neither_torch_nor_kubetorch_nor_duckdb():
    code = "import sys, gpu_ops.definitions as d; assert d.defs; print(sorted(m for m in ('torch', 'kubetorch', 'duckdb') if m in sys.modules))"
    out = run([sys.executable, "-c", code])
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_the_code_location_loads_and_resolves_without_a_warning():
    """Every warning shown (``-W always``): none. Dagster's `owners` BetaWarning, printed when
    it re-created the alert sensor to bind its op jobs, is gone at its source (the jobs are
    bound before the sensor targets them)."""
    code = "import gpu_ops.definitions as d; d.defs.get_repository_def(); d.defs.resolve_sensor_def('budget_alert_sensor'); print('ok')"
    out = run([sys.executable, "-W", "always", "-c", code], env={"GPU_OPS_CONFIG": str(REPO / "gpu_ops" / "demo" / "gpu_ops.yaml")})
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
    assert out.stderr == "", out.stderr


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


def test_dg_launch_selects_gpu_usage_alone_on_the_local_instance(tmp_path):
    """`dg launch` in the repository root with no environment: the local dagster.yaml's
    instance (SQLite under .gpu_ops/dagster_home) records the materialization of gpu_usage
    alone; with no configuration named the cost tables are the plain defaults', in the
    user's data folder (no GPU_OPS_HOME, DAGSTER_HOME or XDG_DATA_HOME), not the working
    directory."""
    import dagster as dg

    env = _fresh_clone_root(tmp_path)
    del env["GPU_OPS_HOME"]
    env.pop("XDG_DATA_HOME", None)
    user = tmp_path.parent / f"{tmp_path.name}-user"
    env.update({"HOME": str(user), "DAGSTER_DG_UPDATE_CHECK_ENABLED": "0"})
    out = subprocess.run(
        [str(BIN / "dg"), "launch", "-m", "gpu_ops.definitions", "--assets", "gpu_usage", "--partition", "2026-10-14"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    home = tmp_path / ".gpu_ops" / "dagster_home"
    with dg.DagsterInstance.from_config(str(home)) as instance:
        usage = instance.get_latest_materialization_event(dg.AssetKey("gpu_usage"))
        assert usage is not None and usage.asset_materialization.partition == "2026-10-14"
        assert instance.get_latest_materialization_event(dg.AssetKey("gpu_usage_quarantine")) is None
    assert (user / ".local" / "share" / "gpu_ops" / "costs.db").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == [".gpu_ops", "dagster.yaml", "workspace.yaml"]
    assert sorted(p.name for p in (tmp_path / ".gpu_ops").iterdir()) == ["dagster_home"]  # the instance only
    assert "Warning" not in out.stdout + out.stderr, out.stderr[-3000:]  # `dagster asset materialize` is superseded


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

    from gpu_ops.dagster.io_manager import DATAFRAME_TYPE

    inferred = resolve_dagster_type(pd.DataFrame)
    for attr in ("key", "display_name", "description", "kind", "is_builtin", "has_unique_name", "typing_type"):
        assert getattr(DATAFRAME_TYPE, attr) == getattr(inferred, attr), attr
    ok = dg.check_dagster_type(DATAFRAME_TYPE, pd.DataFrame({"a": [1]}))
    bad, bad_inferred = dg.check_dagster_type(DATAFRAME_TYPE, [1]), dg.check_dagster_type(inferred, [1])
    assert ok.success and not bad.success
    assert bad.description == bad_inferred.description


PARTITIONS = '{ assetNodeOrError(assetKey: {path: ["gpu_budget_status"]}) { ... on AssetNode { partitionKeys } } }'


def _make_dev_command() -> list[str]:
    """What `make dev` runs (its recipe, from `make -n`), with this test's interpreter."""
    # Under `make test` this make is a sub-make: without --no-print-directory (and the
    # parent's MAKEFLAGS) it prints "make[1]: Leaving directory ..." after the recipe.
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}
    out = subprocess.run(["make", "--no-print-directory", "-n", "dev", f"VENV={BIN.parent}"], cwd=REPO, capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 0, out.stderr
    return shlex.split(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_make_dev_serves_the_demo_quietly(tmp_path):
    """`make dev`'s command in the repository root of a fresh clone: `dg dev` on the
    repository's workspace.yaml and dagster.yaml serves the code location on the demo's
    configuration (its partitions end with its October), with no Python warning
    (`dagster dev` printed a SupersessionWarning)."""
    import httpx

    from gpu_ops.flows.compute.local import free_port

    command = _make_dev_command()
    assert command[:2] == ["env", "-u"] and f"GPU_OPS_CONFIG={REPO}/gpu_ops/demo/gpu_ops.yaml" in command and "dev" in command, command
    env = _fresh_clone_root(tmp_path)
    env["DAGSTER_DG_UPDATE_CHECK_ENABLED"] = "0"
    port = free_port()
    log = open(tmp_path / "dev.log", "wb")
    proc = subprocess.Popen([*command, "-p", str(port)], cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    keys = None
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and keys is None and proc.poll() is None:
            try:
                r = httpx.post(f"http://127.0.0.1:{port}/graphql", json={"query": PARTITIONS}, timeout=10)
                keys = r.json()["data"]["assetNodeOrError"].get("partitionKeys") if r.status_code == 200 else None
            except (httpx.HTTPError, KeyError, TypeError, ValueError):
                pass
            time.sleep(0.5)
    finally:
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C, as a user stops it
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()
    output = (tmp_path / "dev.log").read_text(errors="replace")
    assert keys is not None, output[-3000:]
    assert keys[0] == "2026-10-01" and keys[-1] == "2026-10-31", keys  # the demo's partitions (usage.partitions_end)
    assert "Warning" not in output and "no configuration named" not in output, output[-3000:]
