"""The examples run as a user runs them: `dg` on the components project (list, scaffold,
check, launch through a SIGKILLed worker), and the pipeline author's code location
through the `dagster` CLI. Real processes, real Dagster instances, the local backend."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest
import yaml

from gpu_ops_tests.conftest import REPO
from gpu_ops_tests.training.test_gpu_asset import DEMO_STEPS, PRICES, Killer

BIN = Path(sys.executable).parent
EXAMPLES = REPO / "examples"
DG_DEFS = Path("src") / "gpu_ops_dg_example" / "defs"


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DAGSTER_", "GPU_OPS_CONFIG"))}
    env.update({"DAGSTER_HOME": str(tmp_path / "home"), "GPU_OPS_PIDFILE_DIR": str(tmp_path / "pids"), "PYTHONUNBUFFERED": "1", **extra})
    (tmp_path / "home").mkdir(exist_ok=True)
    return env


def _run(args: list[str], cwd: Path, env: dict[str, str], timeout: int = 300) -> subprocess.CompletedProcess:
    out = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, f"{' '.join(args)} failed:\n{out.stdout[-2000:]}\n{out.stderr[-4000:]}"
    return out


def _dg_project(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A copy of examples/dg_project (so nothing is written into the repository)."""
    project = tmp_path / "dg_project"
    shutil.copytree(EXAMPLES / "dg_project", project, ignore=shutil.ignore_patterns(".gpu_ops", "__pycache__"))
    path = os.pathsep.join(p for p in (str(project / "src"), os.environ.get("PYTHONPATH", "")) if p)  # keeps a checkout's gpu_ops first
    return project, _env(tmp_path, PYTHONPATH=path)


def _metadata(home: Path, key: str) -> dict:
    with dg.DagsterInstance.from_config(str(home)) as instance:
        event = instance.get_latest_materialization_event(dg.AssetKey(key))
        assert event is not None, f"{key} was not materialized"
        return {k: getattr(v, "value", v) for k, v in event.asset_materialization.metadata.items()}


def test_dg_lists_the_gpu_ops_components(tmp_path):
    out = _run([str(BIN / "dg"), "list", "components", "--json"], cwd=tmp_path, env=_env(tmp_path))
    keys = {item["key"] for item in json.loads(out.stdout)["items"]}
    assert {"gpu_ops.components.GpuTrainingComponent", "gpu_ops.components.GpuCostComponent"} <= keys


def test_dg_scaffold_defs_writes_components_that_load(tmp_path):
    project, env = _dg_project(tmp_path)
    for folder in ("train_small", "gpu_costs"):
        shutil.rmtree(project / DG_DEFS / folder)
    defs = project / DG_DEFS
    _run([str(BIN / "dg"), "scaffold", "defs", "gpu_ops.components.GpuTrainingComponent", "my_training"], cwd=defs, env=env)
    _run([str(BIN / "dg"), "scaffold", "defs", "gpu_ops.components.GpuCostComponent", "my_costs"], cwd=defs, env=env)
    training = yaml.safe_load((defs / "my_training" / "defs.yaml").read_text())
    assert training["type"] == "gpu_ops.components.GpuTrainingComponent" and training["attributes"]["request"]["gpu_type"] == "t4"
    cost = yaml.safe_load((defs / "my_costs" / "defs.yaml").read_text())
    # Both name the project's one configuration (written at the project root) ...
    assert cost["attributes"]["config_file"] == training["attributes"]["config_file"] == "{{ context.project_root }}/gpu_ops.yaml"
    config = yaml.safe_load((project / "gpu_ops.yaml").read_text())
    assert {"storage", "prices", "usage", "budgets", "channels"} <= set(config)
    # ... and the project's defs/resources.py already provides gpu_compute: no second one.
    assert not (defs / "gpu_compute.py").exists()
    _run([str(BIN / "dg"), "check", "defs"], cwd=project, env=env)
    listed = _run([str(BIN / "dg"), "list", "defs", "--json"], cwd=project, env=env).stdout
    for name in ("my_training", "gpu_usage", "gpu_cost_attribution", "gpu_budget_status", "gpu_roi_report", "daily_gpu_cost_schedule", "budget_alert_sensor"):
        assert name in listed, name


def test_a_bad_component_yaml_names_the_file_and_the_field(tmp_path):
    project, env = _dg_project(tmp_path)
    path = project / DG_DEFS / "train_small" / "defs.yaml"
    doc = yaml.safe_load(path.read_text())
    doc["attributes"]["request"]["gpu_type"] = "a10"  # not a catalog name (a10g is)
    doc["attributes"]["function"] = "gpu_ops.flows.training.demo.no_such_function"
    path.write_text(yaml.safe_dump(doc))
    out = subprocess.run([str(BIN / "dg"), "check", "defs"], cwd=project, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode != 0
    text = out.stdout + out.stderr
    assert f"{path}: attributes.request.gpu_type" in text and "a10" in text
    assert f"{path}: attributes.function: module 'gpu_ops.flows.training.demo' has no attribute 'no_such_function'" in text


@pytest.mark.slow
def test_dg_project_trains_through_a_killed_worker_then_materializes_the_cost_day(tmp_path):
    """Component YAML to materialization: `dg launch` trains train_small on the local
    backend, its worker is SIGKILLed once mid-training, the step is retried and resumes
    from its checkpoint; then the cost component's assets materialize a day."""
    project, env = _dg_project(tmp_path)
    training_yaml = project / DG_DEFS / "train_small" / "defs.yaml"
    doc = yaml.safe_load(training_yaml.read_text())
    doc["attributes"]["params"] = {"steps": DEMO_STEPS}
    doc["attributes"]["policy"] = {"max_preemptions": 3, "checkpoint_interval": 0.4, "backoff_s": 0.1, "backoff_max_s": 1.0}
    training_yaml.write_text(yaml.safe_dump(doc))
    config_path = project / DG_DEFS / "gpu_costs" / "gpu_ops.yaml"
    config = yaml.safe_load(config_path.read_text())
    # Checkpoints where the Killer watches; CPU attempts priced as the declared T4 (in the metadata only).
    config["training"] = {**config.get("training", {}), "checkpoint_url": str(tmp_path / "ckpts"), "simulate_gpu_pricing": True}
    config_path.write_text(yaml.safe_dump(config))

    killer = Killer(tmp_path, signal.SIGKILL, delay=(0.2, 1.0), seed=3)
    killer.start()
    _run([str(BIN / "dg"), "launch", "--assets", "train_small"], cwd=project, env=env, timeout=540)
    killer.join(timeout=5)
    assert killer.killed_pid is not None, "the worker was never seen training"
    md = _metadata(tmp_path / "home", "train_small")
    assert md["attempts"] == 2 and md["preemptions"] == 1
    assert md["gpu_hours"] > 0 and md["cost_usd"] == round(md["cost_usd"], 2) and len(md["weights_sha256"]) == 64
    # cost to the cent (issue 22): the simulated T4 (demo prices $0.21 spot .. $0.53 on-demand) times the GPU-hours, rounded
    assert 0.21 * md["gpu_hours"] - 0.01 <= md["cost_usd"] <= 0.53 * md["gpu_hours"] + 0.01
    from gpu_ops_tests.training.test_gpu_asset import reference_weights

    assert md["weights_sha256"] == reference_weights()

    day = str(config["usage"]["partitions_start"])  # a day the partitions hold on any date after it, not the wall clock's yesterday
    _run([str(BIN / "dg"), "launch", "--assets", "gpu_usage,gpu_usage_quarantine,gpu_cost_attribution,gpu_cost_daily,gpu_budget_status,gpu_roi_report", "--partition", day],
         cwd=project, env=env, timeout=300)
    budget = _metadata(tmp_path / "home", "gpu_budget_status")
    assert budget["budgets"] == 1


@pytest.mark.slow
def test_author_code_location_loads_and_materializes_its_training_asset(tmp_path):
    """examples/author_location: the README's snippets, run through the `dagster` CLI with
    its own Definitions(resources={"gpu_compute": GpuCompute()})."""
    cfg = tmp_path / "gpu_ops.yaml"
    cfg.write_text(f'storage: {{url: "sqlite:///costs.db"}}\nprices: {PRICES}\ntraining: {{checkpoint_url: ckpts, simulate_gpu_pricing: true}}\n')
    env = _env(tmp_path, GPU_OPS_CONFIG=str(cfg))
    location = EXAMPLES / "author_location"
    out = _run([str(BIN / "dagster"), "definitions", "validate", "-w", "workspace.yaml"], cwd=location, env=env)
    assert "All code locations passed validation" in out.stdout + out.stderr
    params = json.dumps({"ops": {"finetuned_model": {"config": {"params": {"steps": 300}}}}})
    _run([str(BIN / "dagster"), "asset", "materialize", "-m", "my_training.definitions", "-d", str(location),
          "--select", "finetuned_model", "--config-json", params], cwd=tmp_path, env=env, timeout=300)
    md = _metadata(tmp_path / "home", "finetuned_model")
    assert md["attempts"] == 1 and md["steps"] == 300 and md["final_loss"] > 0 and md["gpu_hours"] > 0
