"""Without GPU_OPS_CONFIG (and no path given) gpu_ops uses plain defaults, not the demo:
no simulated GPU pricing, no demo usage or budgets, storage under $GPU_OPS_HOME, else
$DAGSTER_HOME/gpu_ops, else the user's data folder, never the working directory; said once
per process, with where the tables are. The user's code location runs for real (`dg launch`
on a module in a folder of its own, a real worker, a real Dagster instance)."""

from __future__ import annotations

import logging
import os
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import dagster as dg
import pytest

from gpu_ops.domain.config import BUNDLED_PRICES, DEMO_CONFIG, gpu_ops_home, load_config

BIN = Path(sys.executable).parent
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def no_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No GPU_OPS_HOME, DAGSTER_HOME or XDG_DATA_HOME; HOME and the working directory in tmp_path."""
    for name in ("GPU_OPS_HOME", "DAGSTER_HOME", "XDG_DATA_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "user"))
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    return tmp_path


def test_the_plain_defaults_are_not_the_demo(no_home: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("DAGSTER_HOME", str(no_home / "instance"))
    cfg = load_config()
    home = no_home / "instance" / "gpu_ops"
    assert cfg.source_path is None and not cfg.training.simulate_gpu_pricing
    assert cfg.budgets == [] and [s.type for s in cfg.usage.sources] == ["ledger"] and cfg.usage.inventory is None
    assert cfg.storage.resolved_url() == f"sqlite:///{home / 'costs.db'}"
    assert cfg.checkpoint_root() == str(home / "checkpoints")
    # The bundled list prices are the default price table (reference data, not the demo's).
    assert cfg.prices == load_config(BUNDLED_PRICES.parent / "gpu_ops.yaml").prices == load_config(DEMO_CONFIG).prices
    assert list(Path.cwd().iterdir()) == []


def test_gpu_ops_home_is_never_the_working_directory(no_home: Path, monkeypatch: pytest.MonkeyPatch):
    assert gpu_ops_home() == no_home / "user" / ".local" / "share" / "gpu_ops"
    monkeypatch.setenv("XDG_DATA_HOME", str(no_home / "xdg"))
    assert gpu_ops_home() == no_home / "xdg" / "gpu_ops"
    monkeypatch.setenv("XDG_DATA_HOME", "relative/data")  # the XDG spec: a relative path is ignored
    assert gpu_ops_home() == no_home / "user" / ".local" / "share" / "gpu_ops"
    monkeypatch.setenv("DAGSTER_HOME", str(no_home / "instance"))
    assert gpu_ops_home() == no_home / "instance" / "gpu_ops"
    monkeypatch.setenv("GPU_OPS_HOME", str(no_home / "chosen"))
    assert gpu_ops_home() == no_home / "chosen"


def test_the_plain_defaults_say_once_where_their_tables_are(no_home: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture):
    monkeypatch.setenv("DAGSTER_HOME", str(no_home / "instance"))
    with caplog.at_level(logging.WARNING, logger="gpu_ops"):
        for _ in range(3):
            load_config()
    said = [r.getMessage() for r in caplog.records if r.name == "gpu_ops"]
    assert len(said) == 1, said
    assert f"sqlite:///{no_home / 'instance' / 'gpu_ops' / 'costs.db'}" in said[0] and "GPU_OPS_CONFIG" in said[0]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="gpu_ops"):
        load_config(DEMO_CONFIG)  # a named file says nothing
    assert [r for r in caplog.records if r.name == "gpu_ops"] == []


USER_LOCATION = '''\
import dagster as dg
from gpu_ops import GpuCompute, GpuRequest, TrainingContext, gpu_asset


@gpu_asset(request=GpuRequest(gpu_type="t4", gpus=1, cpus=1, memory="1Gi"))
def tiny(ctx: TrainingContext):
    ctx.progress(1, 1, loss=0.5)
    return {"loss": 0.5}


defs = dg.Definitions(assets=[tiny], resources={"gpu_compute": GpuCompute()})
'''


def test_a_user_code_location_without_gpu_ops_config_keeps_nothing_in_its_folder_and_prices_no_cpu_as_a_gpu(tmp_path: Path):
    """A user's own folder, cwd there, no GPU_OPS_CONFIG or GPU_OPS_HOME, DAGSTER_HOME set
    (as `dg dev`/`dg launch` users do): `dg launch` materializes the asset; the folder holds
    only the user's file; the ledger (under $DAGSTER_HOME/gpu_ops) records the CPU attempt
    as CPU and the asset's cost does not price it as the declared t4."""
    folder, instance = tmp_path / "my_location", tmp_path / "instance"
    folder.mkdir()
    instance.mkdir()
    (instance / "dagster.yaml").write_text("telemetry: {enabled: false}\n")
    (folder / "my_location.py").write_text(textwrap.dedent(USER_LOCATION))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DAGSTER_", "GPU_OPS_", "XDG_"))}
    path = os.pathsep.join(p for p in (str(folder), env.get("PYTHONPATH", "")) if p)
    env.update({"DAGSTER_HOME": str(instance), "HOME": str(tmp_path / "user"), "PYTHONPATH": path, "PYTHONDONTWRITEBYTECODE": "1",
                "PYTHONUNBUFFERED": "1", "DAGSTER_DG_UPDATE_CHECK_ENABLED": "0"})
    out = subprocess.run([str(BIN / "dg"), "launch", "-m", "my_location", "--assets", "tiny"], cwd=folder, env=env,
                         capture_output=True, text=True, timeout=300)
    log = out.stdout + out.stderr
    assert out.returncode == 0, log[-4000:]

    assert sorted(p.name for p in folder.iterdir()) == ["my_location.py"], "the code location's folder holds only the user's file"
    assert not (tmp_path / "user").exists()
    tables = instance / "gpu_ops" / "costs.db"
    said = [line for line in log.splitlines() if "no configuration named" in line]
    assert len(said) == 1 and f"sqlite:///{tables}" in said[0], said  # once (the step's process), with the place
    with sqlite3.connect(tables) as db:
        rows = db.execute("SELECT gpu_type, gpu_count, outcome FROM gpu_usage_ledger").fetchall()
    assert rows == [("cpu", 0, "completed")]
    with dg.DagsterInstance.from_config(str(instance)) as inst:
        event = inst.get_latest_materialization_event(dg.AssetKey("tiny"))
        assert event is not None and event.asset_materialization is not None
        md = {k: getattr(v, "value", v) for k, v in event.asset_materialization.metadata.items()}
    assert md["cost_usd"] == 0.0 and md["gpu_hours"] == 0.0
    assert md["pricing"].startswith("as run") and "simulat" not in log
    # The ledger line says in words that the attempt ran on CPU and is not priced.
    ledger = next(line for line in log.splitlines() if "ledger: attempt 1" in line)
    assert "ran on CPU" in ledger and "not priced" in ledger and "0x cpu" not in ledger and "GPU-h" not in ledger, ledger
