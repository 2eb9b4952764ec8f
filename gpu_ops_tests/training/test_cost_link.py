"""A training asset's materialization says where its cost is, and the rows it names exist.

Real materializations on the local backend (one on a worker that reports a GPU, one on
CPU), then the real ``gpu_usage`` asset for the days named, on SQLite: the rows with the
named ``run_id`` and ``asset_key`` are there, priced as the ledger's seconds.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import dagster as dg
import pandas as pd
import pytest

from gpu_ops.domain.compute.request import Attribution, GpuRequest
from gpu_ops.dagster.compute.resource import GpuCompute, Lifecycle
from gpu_ops.domain.config import load_config
from gpu_ops.dagster.cost.assets import build_assets
from gpu_ops.dagster.resources import GpuOpsSettings
from gpu_ops.dagster.io_manager import TableIOManager
from gpu_ops.storage.tables import TableStore
from gpu_ops.storage import ledger
from gpu_ops.dagster.training.asset import gpu_asset
from gpu_ops.dagster.training.cost_link import cost_rows_metadata, utc_days
from gpu_ops_tests.training import workloads
from gpu_ops_tests.training.test_gpu_asset import PRICES

REQUEST = GpuRequest(gpu_type="a100-80gb", gpus=1, memory="4Gi", capacity="on-demand", labels=Attribution(team="nlp", project="cost-link"))
UTC = dt.timezone.utc


def write_config(folder: Path, sources: str = "[{type: ledger}]") -> Path:
    path = folder / "gpu_ops.yaml"
    start = (dt.datetime.now(UTC).date() - dt.timedelta(days=3)).isoformat()
    path.write_text(
        f"storage: {{url: 'sqlite:///{folder / 'costs.db'}'}}\nprices: {PRICES}\n"
        f"usage: {{sources: {sources}, partitions_start: '{start}'}}\n"
        "training: {checkpoint_url: ckpts}\n"
    )
    return path


def metadata_of(result: dg.ExecuteInJobResult, node: str) -> dict[str, Any]:
    mat = result.asset_materializations_for_node(node)[-1]
    return {k: getattr(v, "value", v) for k, v in mat.metadata.items()}


@pytest.fixture(scope="session")  # once per worker (see conftest.py)
def trained(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Two training assets materialized once (on a reported GPU, on CPU) and the
    ``gpu_usage`` partitions the first names, materialized afterwards."""
    folder = tmp_path_factory.mktemp("cost_link")
    mp = pytest.MonkeyPatch()
    mp.setenv("GPU_OPS_PIDFILE_DIR", str(folder / "pids"))
    config = write_config(folder)
    on_gpu = gpu_asset(workloads.on_a_reported_gpu, name="on_gpu", request=REQUEST, config_path=str(config))
    on_cpu = gpu_asset(workloads.counting, name="on_cpu", request=REQUEST, params={"steps": 5}, env={"CUDA_VISIBLE_DEVICES": ""}, config_path=str(config))
    try:
        result = dg.materialize([on_gpu, on_cpu], instance=dg.DagsterInstance.ephemeral(), resources={"gpu_compute": GpuCompute(lifecycle=Lifecycle(grace_period_s=5))})
        assert result.success
        md = {name: metadata_of(result, name) for name in ("on_gpu", "on_cpu")}
        cost_assets, _ = build_assets(load_config(config))
        usage = [a for a in cost_assets if "gpu_usage" in {k.to_user_string() for k in a.keys}]
        resources = {"gpu_ops": GpuOpsSettings(config_path=str(config)), "table_io_manager": TableIOManager(url=f"sqlite:///{folder / 'costs.db'}")}
        days = md["on_gpu"]["cost_partitions"].split(", ")
        job = dg.Definitions(assets=usage, resources=resources).resolve_implicit_global_asset_job_def()
        # A day's partition exists once the day is over: gpu_usage runs as on the next day.
        with dg.instance_for_test() as instance, dg.partition_loading_context(effective_dt=dt.datetime.now(UTC) + dt.timedelta(days=1)):
            for day in days:
                assert job.execute_in_process(instance=instance, partition_key=day).success
    finally:
        mp.undo()
    store = TableStore(f"sqlite:///{folder / 'costs.db'}")
    return {"md": md, "run_id": result.run_id, "days": days, "store": store}


def test_the_metadata_links_the_cost_asset_and_names_the_rows(trained: dict[str, Any]) -> None:
    md = trained["md"]["on_gpu"]
    assert md["cost_asset"] == dg.AssetKey("gpu_usage")
    assert f"run_id = '{trained['run_id']}'" in md["cost_rows"] and "asset_key = 'on_gpu'" in md["cost_rows"]
    # The days the ledger's attempts touched (real training stamps real time): the ledger is the fact.
    attempts = ledger.read(trained["store"], run_id=trained["run_id"], asset_key="on_gpu")
    touched = {(r.start + dt.timedelta(days=n)).date().isoformat() for r in attempts.itertuples(index=False) for n in range((r.end.date() - r.start.date()).days + 1)}
    assert trained["days"] == sorted(touched)
    urls = [md["cost_partition_url"]] if len(trained["days"]) == 1 else [md[f"cost_partition_url/{d}"] for d in trained["days"]]
    assert urls == [f"http://localhost:3000/assets/gpu_usage?view=partitions&partition={d}" for d in trained["days"]]


def test_the_named_rows_exist_and_carry_the_ledgers_gpu_hours(trained: dict[str, Any]) -> None:
    store: TableStore = trained["store"]
    usage = store.read("gpu_usage", partition_keys=trained["days"])
    rows = usage[(usage["run_id"] == trained["run_id"]) & (usage["asset_key"] == "on_gpu")]
    assert len(rows) >= 1 and set(rows["gpu_type"]) == {"a100-80gb"}
    attempts = ledger.read(store, run_id=trained["run_id"], asset_key="on_gpu")
    seconds = sum((r.end - r.start).total_seconds() for r in attempts.itertuples(index=False))
    assert rows["gpu_hours"].sum() == pytest.approx(seconds / 3600.0, rel=1e-6)
    assert rows["cost_usd"].sum() > 0


def test_a_cpu_attempt_says_it_has_no_cost_rows_and_has_none(trained: dict[str, Any]) -> None:
    md = trained["md"]["on_cpu"]
    assert md["cost_rows"].startswith("none: no attempt held a GPU") and "cost_partitions" not in md
    usage = trained["store"].read("gpu_usage", partition_keys=trained["days"])
    assert usage[usage["run_id"] == trained["run_id"]]["asset_key"].eq("on_gpu").all()


def test_a_cost_flow_without_the_ledger_says_so(tmp_path: Path) -> None:
    usage = Path(__file__).resolve().parents[2] / "examples" / "data" / "usage.csv"
    config = load_config(write_config(tmp_path, sources=f"[{{type: file, path: '{usage}'}}]"))
    start = dt.datetime(2026, 11, 24, 23, 0, tzinfo=UTC)
    rows = pd.DataFrame({"gpu_count": [1], "start": [pd.Timestamp(start)], "end": [pd.Timestamp(start + dt.timedelta(hours=2))]})
    md = cost_rows_metadata(config, "r1", "train", rows)
    assert "usage.sources has no {type: ledger}" in md["cost_rows"] and "cost_partitions" not in md


def test_a_simulated_cpu_cost_is_said_to_be_no_cost_row(tmp_path: Path) -> None:
    config = load_config(write_config(tmp_path))
    config = config.model_copy(update={"training": config.training.model_copy(update={"simulate_gpu_pricing": True})})
    start = pd.Timestamp(dt.datetime(2026, 11, 24, 23, 0, tzinfo=UTC))
    md = cost_rows_metadata(config, "r1", "train", pd.DataFrame({"gpu_count": [0], "start": [start], "end": [start + pd.Timedelta(hours=1)]}))
    assert md["cost_rows"].startswith("none: no attempt held a GPU") and "simulated (training.simulate_gpu_pricing)" in md["cost_rows"]


def test_an_attempt_across_midnight_names_both_days() -> None:
    start = dt.datetime(2026, 11, 24, 23, 0, tzinfo=UTC)
    assert utc_days(start, start + dt.timedelta(hours=2)) == [dt.date(2026, 11, 24), dt.date(2026, 11, 25)]
    assert utc_days(start, dt.datetime(2026, 11, 25, tzinfo=UTC)) == [dt.date(2026, 11, 24)]  # ends at midnight
    assert utc_days(start, start) == [dt.date(2026, 11, 24)]


def test_days_outside_the_cost_partitions_are_named(tmp_path: Path) -> None:
    config = load_config(write_config(tmp_path))
    usage = config.usage.model_copy(update={"partitions_start": dt.date(2026, 10, 1), "partitions_end": dt.date(2026, 10, 31)})
    config = config.model_copy(update={"usage": usage})
    start = pd.Timestamp(dt.datetime(2026, 10, 31, 23, 0, tzinfo=UTC))
    md = cost_rows_metadata(config, "r1", "train", pd.DataFrame({"gpu_count": [1], "start": [start], "end": [start + pd.Timedelta(hours=2)]}))
    assert md["cost_partitions"] == "2026-10-31, 2026-11-01"
    assert md["cost_partition_url/2026-11-01"].url.endswith("/assets/gpu_usage?view=partitions&partition=2026-11-01")
    assert "2026-11-01 lie outside the cost partitions (2026-10-01 .. 2026-10-31" in md["cost_rows"]
