"""The launch estimate end to end: real materializations of a `gpu_asset` on the local
backend (the estimate in the run log, the metadata and gpu_launch_estimates), the
gpu_estimate_accuracy asset materialized from them, and the forecast gate refusing a launch."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import dagster as dg
import pandas as pd
import pytest

from gpu_ops.dagster.compute.resource import GpuCompute, Lifecycle
from gpu_ops.domain.config import load_config
from gpu_ops.dagster.cost.assets import build_assets
from gpu_ops.dagster.resources import GpuOpsSettings
from gpu_ops.dagster.io_manager import TableIOManager
from gpu_ops.storage.tables import TableStore
from gpu_ops.storage import estimate_store, ledger
from gpu_ops.dagster.training.asset import gpu_asset
from gpu_ops_tests.training import workloads
from gpu_ops_tests.training.test_gpu_asset import PRICES, REQUEST, events, messages, metadata

T4_SPOT = 0.21  # gpu_ops/demo/prices.yaml


def write_config(folder: Path, budgets: str = "") -> Path:
    path = folder / "gpu_ops.yaml"
    path.write_text(
        f"""
storage: {{url: "sqlite:///ledger.db"}}
prices: {PRICES}
usage: {{sources: [{{type: ledger}}], partitions_start: "2020-01-01"}}
training: {{checkpoint_url: ckpts, retry_backoff_s: 0.1, simulate_gpu_pricing: true}}
{budgets}
"""
    )
    return path


def counting(config: Path, name: str, **kw: Any) -> dg.AssetsDefinition:
    return gpu_asset(workloads.counting, name=name, request=REQUEST, policy={"backoff_s": 0.05, "checkpoint_interval": 0.05}, params={"steps": 20}, config_path=str(config), **kw)


@pytest.fixture
def config_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("GPU_OPS_PIDFILE_DIR", str(tmp_path / "pids"))
    return write_config(tmp_path)


def materialize(asset: dg.AssetsDefinition, config: Path, instance: dg.DagsterInstance) -> dg.ExecuteInProcessResult:
    return dg.materialize([asset], instance=instance, resources={"gpu_compute": GpuCompute(config_path=str(config), lifecycle=Lifecycle(grace_period_s=5))}, raise_on_error=False)


def test_estimate_and_actual_in_the_run_log_the_metadata_and_the_accuracy_table(config_path: Path, tmp_path: Path) -> None:
    instance = dg.DagsterInstance.ephemeral()
    asset = counting(config_path, "estimated", expected_duration="1h")
    first = materialize(asset, config_path, instance)
    assert first.success
    md = metadata(first, "estimated")
    # No successful run yet: the declared hour, on spot (1 t4 at $0.21/h) and on-demand.
    assert md["estimate_basis"] == "declared" and md["estimate_usd"] == pytest.approx(T4_SPOT)
    assert md["estimate_p90_usd"] == pytest.approx(0.53)  # the dearest leg: the on-demand fallback
    assert md["estimate_error_usd"] == pytest.approx(md["cost_usd"] - T4_SPOT, abs=0.011)
    logged = messages(instance, first.run_id)
    assert any(m.startswith("estimate of attempt 1: spot: 0.21 USD") and "on-demand: 0.53 USD" in m for m in logged)
    assert any(m.startswith("estimate against actual: estimated 0.21") for m in logged)

    second = materialize(asset, config_path, instance)
    assert second.success
    md2 = metadata(second, "estimated")
    # Now the asset has a run: its own duration, seconds long, not the declared hour.
    assert md2["estimate_basis"] == "history" and md2["estimate_usd"] < 0.01
    assert "1 successful run(s)" in md2["estimate_detail"]

    store = TableStore(load_config(config_path).storage.resolved_url())
    recorded = estimate_store.read(store, asset_key="estimated").sort_values("estimated_at")
    assert list(recorded["run_id"]) == [first.run_id, second.run_id] and list(recorded["basis"]) == ["declared", "history"]

    # The accuracy table of the day the runs completed. Dagster has no partition for a day
    # that has not ended: the two runs' ledger and estimate rows are moved two days back,
    # into a second store, and that day (read from the rows, not the wall clock) materialized.
    past = tmp_path / "past"
    past.mkdir()
    past_config = write_config(past)
    store = TableStore(load_config(past_config).storage.resolved_url())
    back = pd.Timedelta(days=2)
    rows = ledger.read(TableStore(load_config(config_path).storage.resolved_url()))
    moved = [ledger.LedgerRow(**{**r, "start": r["start"] + back * -1, "end": r["end"] + back * -1, "last_checkpoint_at": None})  # type: ignore[arg-type]
             for r in rows[list(ledger.LEDGER_COLUMNS)].to_dict("records")]
    ledger.append(store, moved)
    store.append(estimate_store.ESTIMATE_TABLE, recorded.assign(estimated_at=recorded["estimated_at"] - back))
    day = max(r.end for r in moved).date().isoformat()
    config = load_config(past_config)
    assets, _ = build_assets(config)
    result = dg.materialize(
        assets, selection=["gpu_estimate_accuracy"], partition_key=day, instance=instance,
        resources={"gpu_ops": GpuOpsSettings(config_path=str(past_config)), "table_io_manager": TableIOManager(url=config.storage.resolved_url())},
    )
    assert result.success
    stored = store.read("gpu_estimate_accuracy").set_index("run_id")
    assert set(stored.index) == {first.run_id, second.run_id}
    assert stored.loc[first.run_id, "estimate_usd"] == pytest.approx(T4_SPOT)
    assert stored.loc[first.run_id, "actual_usd"] == pytest.approx(md["cost_usd"], abs=0.006)
    assert stored.loc[first.run_id, "error_usd"] == pytest.approx(stored.loc[first.run_id, "actual_usd"] - T4_SPOT)
    acc = {k: getattr(v, "value", v) for k, v in result.asset_materializations_for_node("gpu_estimate_accuracy")[-1].metadata.items()}
    assert acc["runs"] == 2 and acc["runs_with_estimate"] == 2


def test_the_forecast_gate_refuses_a_launch_with_the_figures(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPU_OPS_PIDFILE_DIR", str(tmp_path / "pids"))
    budgets = """
budgets:
  - name: nlp-monthly
    scope: {team: nlp}
    amount_usd: 100
    enforcement: {action: block}
"""
    config = write_config(tmp_path, budgets)
    instance = dg.DagsterInstance.ephemeral()
    # 1000 declared hours on a spot t4: $210 expected, past the $100 block line on its own.
    result = materialize(counting(config, "too_dear", expected_duration="1000h"), config, instance)
    assert not result.success
    assert events(instance, result.run_id, "STEP_UP_FOR_RETRY") == []
    message = events(instance, result.run_id, "STEP_FAILURE")[0].dagster_event.step_failure_data.error.message
    assert "launch refused by the forecast gate of budget 'nlp-monthly' (team=nlp)" in message
    assert "period spend $0.00 (no gpu_budget_status for this period yet) + settled since $0.00 + running attempts $0.00" in message
    assert "+ this launch's estimate $210.00 = $210.00, past the block line $100.00 (100% of $100.00)" in message
    store = TableStore(load_config(config).storage.resolved_url())
    assert ledger.read(store).empty  # refused before any worker started
    assert estimate_store.read(store, asset_key="too_dear")["estimate_usd"].tolist() == [pytest.approx(210.0)]

    # The same launch with a budget that only alerts goes ahead.
    config.write_text(config.read_text().replace("enforcement: {action: block}", "enforcement: {action: alert}"))
    assert materialize(counting(config, "too_dear_alert_only", expected_duration="1000h"), config, instance).success
