"""A `dg` project from nothing, as the manual's "Components (dg)" page tells a new user:
`create-dagster project` (dagster-dg-cli 1.13.27 has no `dg scaffold project`; this is
Dagster's documented generator, at the same version), then `dg scaffold defs` for each
gpu_ops component, then `dg check defs` and `dg launch` with no edit to any file and no
DAGSTER_HOME set; the run is in the instance `dg dev` opens (the project's .env names it).
Real processes, a real Dagster instance, the local backend."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest
import yaml

from gpu_ops.components.scaffolding import CONFIG_REF

BIN = Path(sys.executable).parent
CREATE_DAGSTER = BIN / "create-dagster"


def _env(tmp_path: Path, project: Path) -> dict[str, str]:
    """A new user's shell: no DAGSTER_HOME, no GPU_OPS_CONFIG (HOME in tmp_path, for what
    Dagster keeps there without a DAGSTER_HOME)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DAGSTER_", "GPU_OPS_CONFIG"))}
    path = os.pathsep.join(p for p in (str(project / "src"), env.get("PYTHONPATH", "")) if p)  # as `pip install -e .` would
    env.update({"HOME": str(tmp_path / "user"), "PYTHONPATH": path, "PYTHONUNBUFFERED": "1", "DAGSTER_DG_UPDATE_CHECK_ENABLED": "0"})
    return env


# How `dg dev` finds its instance: in the project root (it changes there), the .env read, then
# DAGSTER_HOME's instance, else a temporary one (Dagster's get_possibly_temporary_instance_for_cli).
DG_DEV_INSTANCE = """
import dagster as dg
from dagster._cli.utils import get_possibly_temporary_instance_for_cli
with get_possibly_temporary_instance_for_cli("dagster dev") as instance:
    event = instance.get_latest_materialization_event(dg.AssetKey("train_small"))
    print(instance.root_directory, event.run_id if event else None)
"""


def _run(args: list[str], cwd: Path, env: dict[str, str], timeout: int = 300) -> str:
    out = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, f"{' '.join(args)} failed:\n{out.stdout[-3000:]}\n{out.stderr[-4000:]}"
    return out.stdout + out.stderr


@pytest.mark.slow
def test_a_fresh_dg_project_with_both_components_checks_and_launches_unmodified(tmp_path: Path):
    assert CREATE_DAGSTER.exists(), "create-dagster is a test dependency (pyproject: test extra)"
    project = tmp_path / "gpu-project"
    env = _env(tmp_path, project)
    _run([str(CREATE_DAGSTER), "project", str(project), "--no-uv-sync"], cwd=tmp_path, env=env)
    defs = project / "src" / "gpu_project" / "defs"
    assert (project / "pyproject.toml").is_file() and defs.is_dir()

    dg_bin = str(BIN / "dg")
    _run([dg_bin, "scaffold", "defs", "gpu_ops.components.GpuCostComponent", "gpu_costs"], cwd=project, env=env)
    _run([dg_bin, "scaffold", "defs", "gpu_ops.components.GpuTrainingComponent", "train_small"], cwd=project, env=env)
    _run([dg_bin, "scaffold", "defs", "gpu_ops.components.GpuTrainingComponent", "train_large"], cwd=project, env=env)

    # One configuration for the project, named by every component; one gpu_compute resource.
    for name in ("gpu_costs", "train_small", "train_large"):
        attributes = yaml.safe_load((defs / name / "defs.yaml").read_text())["attributes"]
        assert attributes["config_file"] == CONFIG_REF, name
    config = yaml.safe_load((project / "gpu_ops.yaml").read_text())
    assert {"storage", "prices", "usage", "budgets", "channels"} <= set(config)
    assert sorted(p.name for p in defs.glob("*.py")) == ["__init__.py", "gpu_compute.py"]
    assert "GpuCompute(config_path=" in (defs / "gpu_compute.py").read_text()

    checked = _run([dg_bin, "check", "defs"], cwd=project, env=env)
    assert "All definitions loaded successfully" in checked
    listed = _run([dg_bin, "list", "defs", "--json"], cwd=project, env=env)
    for name in ("train_small", "train_large", "gpu_usage", "gpu_cost_attribution", "gpu_budget_status", "gpu_roi_report",
                 "daily_gpu_cost_schedule", "budget_alert_sensor"):
        assert name in listed, name

    # One Dagster instance for the project: the scaffold named it in .env (dg launch and dg
    # dev read it), with telemetry off.
    home = project / ".gpu_ops" / "dagster_home"
    assert f"DAGSTER_HOME={home}\n" in (project / ".env").read_text()
    assert yaml.safe_load((home / "dagster.yaml").read_text()) == {"telemetry": {"enabled": False}}

    launched = _run([dg_bin, "launch", "--assets", "train_small"], cwd=project, env=env, timeout=540)
    assert "Using temporary directory" not in launched, launched[-2000:]
    # No warning once per definition: Dagster's `owners` BetaWarning for the alert sensor,
    # printed about a dozen times before the cost component bound its op jobs, is gone.
    warned = [line.split("Warning: ", 1)[1] for line in (checked + launched).splitlines() if "Warning: " in line]
    assert not any("`owners`" in w for w in warned), warned
    assert all(launched.count(w) == 1 for w in set(warned) if w in launched), warned
    with dg.DagsterInstance.from_config(str(home)) as instance:
        event = instance.get_latest_materialization_event(dg.AssetKey("train_small"))
        assert event is not None and event.asset_materialization is not None
        md = {k: getattr(v, "value", v) for k, v in event.asset_materialization.metadata.items()}
    assert md["attempts"] == 1 and md["preemptions"] == 0 and len(md["weights_sha256"]) == 64
    # ... and `dg dev` opens that instance: the launched run is in it (not "Never materialized").
    seen = subprocess.run([sys.executable, "-c", DG_DEV_INSTANCE], cwd=project, env=env, capture_output=True, text=True, timeout=120)
    assert seen.returncode == 0, seen.stderr[-3000:]
    assert seen.stdout.split() == [str(home), event.run_id], seen.stdout + seen.stderr[-2000:]

    # The training ledger went to the project's one storage, where the cost component reads usage.
    with sqlite3.connect(project / ".gpu_ops" / "costs.db") as db:
        rows = db.execute("SELECT asset_key, outcome FROM gpu_usage_ledger").fetchall()
    assert [tuple(r) for r in rows] == [("train_small", "completed")]


def test_a_second_training_scaffold_or_an_existing_resource_writes_no_second_gpu_compute(tmp_path: Path):
    from dagster.components import ScaffoldRequest

    from gpu_ops.components.scaffolding import ensure_gpu_compute_resource

    project = tmp_path / "p"
    defs = project / "src" / "p" / "defs"
    (defs / "train_a").mkdir(parents=True)

    def request(name: str) -> ScaffoldRequest:
        return ScaffoldRequest(type_name="gpu_ops.components.GpuTrainingComponent", target_path=defs / name, scaffold_format="yaml", project_root=project, params=None)

    written = ensure_gpu_compute_resource(request("train_a"))
    assert written == defs / "gpu_compute.py" and (project / "gpu_ops.yaml").is_file()
    assert 'parents[3] / "gpu_ops.yaml"' in written.read_text()  # defs -> p -> src -> project root
    assert ensure_gpu_compute_resource(request("train_b")) is None

    other = tmp_path / "q"
    (other / "src" / "q" / "defs" / "train_a").mkdir(parents=True)
    (other / "src" / "q" / "defs" / "resources.py").write_text('resources = {"gpu_compute": GpuCompute()}\n')
    req = ScaffoldRequest(type_name="x", target_path=other / "src" / "q" / "defs" / "train_a", scaffold_format="yaml", project_root=other, params=None)
    assert ensure_gpu_compute_resource(req) is None and not (other / "src" / "q" / "defs" / "gpu_compute.py").exists()


def test_the_project_instance_is_named_once_and_a_dagster_home_of_the_project_is_kept(tmp_path: Path):
    from dagster.components import ScaffoldRequest

    from gpu_ops.components.scaffolding import ensure_project_instance

    def request(root: Path) -> ScaffoldRequest:
        return ScaffoldRequest(type_name="gpu_ops.components.GpuCostComponent", target_path=root / "src" / "p" / "defs" / "c", scaffold_format="yaml", project_root=root, params=None)

    fresh = tmp_path / "fresh"
    (fresh / ".env").parent.mkdir(parents=True)
    (fresh / ".env").write_text("API_TOKEN=abc")  # the user's own line, without a newline at its end
    home = fresh / ".gpu_ops" / "dagster_home"
    assert ensure_project_instance(request(fresh)) == home and (home / "dagster.yaml").is_file()
    assert ensure_project_instance(request(fresh)) == home  # a second scaffold adds nothing
    from dotenv import dotenv_values

    assert dotenv_values(fresh / ".env") == {"API_TOKEN": "abc", "DAGSTER_HOME": str(home)}

    own = tmp_path / "own"
    own.mkdir()
    (own / ".env").write_text(f"DAGSTER_HOME={tmp_path / 'elsewhere'}\n")
    assert ensure_project_instance(request(own)) == tmp_path / "elsewhere"
    assert (own / ".env").read_text() == f"DAGSTER_HOME={tmp_path / 'elsewhere'}\n"
    assert (tmp_path / "elsewhere").is_dir() and not (tmp_path / "elsewhere" / "dagster.yaml").exists()
    outside = ScaffoldRequest(type_name="x", target_path=tmp_path / "loose" / "c", scaffold_format="yaml", project_root=None, params=None)
    assert ensure_project_instance(outside) is None and not (tmp_path / "loose").exists()
