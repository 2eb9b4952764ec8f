"""Budgets within the hour (gpu_ops.flows.alerts.intraday): the real `budget_alert_sensor` on a real
Dagster instance alerts a real webhook receiver on 127.0.0.1 on the tick after an attempt
settles past a threshold, once, and stays silent when the day's partition lands; running
attempts count at their price; a partition whose figure differs loses no threshold."""

from __future__ import annotations

import dataclasses
import datetime as dt
from pathlib import Path
from typing import Any

import dagster as dg
import pandas as pd
import pytest

from gpu_ops.dagster.cost.assets import build_assets
from gpu_ops.dagster.io_manager import TableIOManager
from gpu_ops.domain.training import attempts
from gpu_ops.storage import ledger
from gpu_ops.storage.attempt_store import AttemptStore

from .conftest import SensorHarness, status_row, write_config, write_status

UTC = dt.timezone.utc
H = dt.timedelta(hours=1)
SPOT = 1.79  # conftest.PRICES: a100-80gb spot, USD per GPU-hour
COST_ASSETS = ["gpu_usage", "gpu_usage_quarantine", "gpu_cost_attribution", "gpu_cost_daily", "gpu_budget_status"]


def attempt(run: str, start: dt.datetime, end: dt.datetime, team: str = "nlp") -> ledger.LedgerRow:
    return ledger.LedgerRow(
        start=start, end=end, namespace="ml", pod=run, node="n1", team=team, project="llm", cost_center="", experiment_id="", gpu_type="a100-80gb",
        gpu_count=8, capacity_type="spot", sharing="none", gpu_share=1.0, run_id=run, asset_key="train", attempt=1, outcome="completed",
        last_checkpoint_at=None, lost_seconds=0.0, declared_gpu_type="a100-80gb", declared_gpu_count=8, hardware_source="worker",
    )


def harness(tmp_path: Path, instance: Any, hook_url: str) -> SensorHarness:
    budgets = [
        {"name": "nlp", "scope": {"team": "nlp"}, "amount_usd": 100, "thresholds": [{"percent": 50}, {"percent": 100}], "channels": ["audit"]},
        {"name": "vision", "scope": {"team": "vision"}, "amount_usd": 10, "thresholds": [{"percent": 50}], "channels": ["audit"]},
    ]
    # A day between full evaluations: only a settled attempt (or a new partition) makes a tick evaluate.
    path = write_config(tmp_path, budgets=budgets, channels={"audit": {"type": "webhook", "url": hook_url + "/hook"}}, alerts={"evaluation_interval_s": 86_400})
    return SensorHarness(instance, path)


def materialize(h: SensorHarness, day: str) -> None:
    assets, _ = build_assets(h.config)
    resources = {"gpu_ops": h.settings, "table_io_manager": TableIOManager(url=h.config.storage.resolved_url())}
    assert dg.materialize(assets, partition_key=day, resources=resources, instance=h.instance, selection=COST_ASSETS).success


def test_a_settled_attempt_alerts_on_the_next_tick_and_the_days_partition_does_not_again(tmp_path: Path, dagster_instance: Any, receiver: Any) -> None:
    hook = receiver()
    h = harness(tmp_path, dagster_instance, hook.url)
    day = dt.datetime(2026, 11, 19, tzinfo=UTC)
    ledger.append(h.store, [attempt("yesterday", day + 10 * H, day + 12 * H)])  # 8 GPUs x 2 h
    materialize(h, "2026-11-19")  # the ledger is the default usage source
    h.now = day + 25 * H  # 2026-11-20 01:00
    requests, _ = h.tick(force=False)  # due: the new partition
    assert requests == []  # 28.64 of 100

    today = day + 24 * H
    ledger.append(h.store, [attempt("today", today + 1 * H, today + 4 * H)])  # settles at 04:00: 42.96 more
    h.now = today + 4 * H + dt.timedelta(seconds=30)  # the next tick
    requests, results = h.tick(force=False)
    assert [r.run_key for r in requests] == ["nlp/2026-11-01/actual-50pct"] and all(r.success for r in results)
    [alert] = [r.json() for r in hook.acknowledged]
    assert alert["spend_usd"] == pytest.approx(8 * SPOT * (2 + 3))
    assert alert["as_of"].startswith("2026-11-20T04:00:30")

    h.now += dt.timedelta(seconds=30)  # nothing settled, no partition: the tick does not evaluate
    requests, _ = h.tick(force=False)
    assert requests == []

    materialize(h, "2026-11-20")  # the day's partition lands, holding the same attempt
    status = h.store.read("gpu_budget_status", partition_keys=["2026-11-20"])
    assert status.set_index("budget").loc["nlp", "spend_usd"] == pytest.approx(8 * SPOT * 5)
    h.now += dt.timedelta(minutes=10)
    requests, _ = h.tick(force=False)  # due: the new partition; the threshold is alarmed already
    assert requests == [] and len(hook.requests) == 1


def test_running_attempts_count_and_a_partition_that_differs_loses_no_threshold(tmp_path: Path, dagster_instance: Any, receiver: Any) -> None:
    hook = receiver()
    h = harness(tmp_path, dagster_instance, hook.url)
    write_status(h.store, "2026-11-19", [status_row("nlp", day="2026-11-19", spend=40.0, amount=100), status_row("vision", day="2026-11-19", spend=1.0, amount=10)])
    today = dt.datetime(2026, 11, 20, tzinfo=UTC)
    # An attempt of 8 spot GPUs running since 01:00 (its record: the holder of the lease).
    owner = attempts.Owner("host", 1, None, "run", "step")
    bill = {"team": "nlp", "project": "llm", "gpu_type": "a100-80gb", "gpu_count": 8, "gpu_share": 1.0, "capacity_type": "spot", "namespace": "ml"}
    a = attempts.plan("a1", "run", "train", 1, owner, launch_name="x", bill=bill, at=(today + H).timestamp())
    book = AttemptStore(h.store)
    book.create(a)
    book.move(a, attempts.launch(a, host="host", pids=(1,), started=(None,), at=(today + H).timestamp(), workdir=None))

    h.now = today + 1.5 * H  # 40 + 5.37: under 50
    requests, _ = h.tick()
    assert requests == []
    h.now = today + 2 * H  # 40 + 14.32
    requests, _ = h.tick()  # the interval's evaluation counts running attempts
    assert [r.run_key for r in requests] == ["nlp/2026-11-01/actual-50pct"]
    assert hook.acknowledged[0].json()["spend_usd"] == pytest.approx(40 + 8 * SPOT)

    # The day's partition lands lower than the intraday figure (above the resolve margin):
    # no second alert and no resolve.
    write_status(h.store, "2026-11-20", [status_row("nlp", day="2026-11-20", spend=49.0, amount=100), status_row("vision", day="2026-11-20", spend=1.0, amount=10)])
    h.now = today + 3 * H
    requests, _ = h.tick()
    assert requests == []
    # A partition that counts what the ledger does not (another usage source) crosses the
    # next threshold: alerted, under the same key it would have had intraday.
    write_status(h.store, "2026-11-21", [status_row("nlp", day="2026-11-21", spend=101.0, amount=100), status_row("vision", day="2026-11-21", spend=1.0, amount=10)])
    h.now = today + 26 * H
    requests, _ = h.tick()
    assert [r.run_key for r in requests] == ["nlp/2026-11-01/actual-100pct"]
    assert [r.json()["threshold"] for r in hook.acknowledged] == ["actual-50pct", "actual-100pct"]


def test_what_intraday_leaves_to_the_partitions(tmp_path: Path, dagster_instance: Any, receiver: Any) -> None:
    """Everything, under ``alerts.intraday: false``; an attempt without a price, always
    (counted apart, for the tick's line, never priced as zero)."""
    hook = receiver()
    path = write_config(
        tmp_path, budgets=[{"name": "nlp", "scope": {"team": "nlp"}, "amount_usd": 100, "thresholds": [{"percent": 50}], "channels": ["audit"]}],
        channels={"audit": {"type": "webhook", "url": hook.url + "/hook"}}, alerts={"intraday": False},
    )
    h = SensorHarness(dagster_instance, path)
    write_status(h.store, "2026-11-19", [status_row("nlp", day="2026-11-19", spend=40.0, amount=100)])
    today = dt.datetime(2026, 11, 20, tzinfo=UTC)
    ledger.append(h.store, [attempt("today", today + 1 * H, today + 4 * H)])
    h.now = today + 5 * H
    requests, _ = h.tick()
    assert requests == [] and hook.requests == []

    from gpu_ops.flows.alerts.intraday import read_accrual

    config, store, day = h.config, h.store, today
    priced = attempt("priced", day + 1 * H, day + 2 * H)
    unknown = dataclasses.replace(priced, run_id="unknown", pod="unknown", gpu_type="tpu-v9", declared_gpu_type="tpu-v9")
    ledger.append(store, [priced, unknown])

    accrual = read_accrual(config, store, pd.Timestamp(day), pd.Timestamp(day + 3 * H))
    assert accrual.unpriced == 1
    assert len(accrual.frame) == 2 and accrual.frame["per_s"].notna().all()
    settled, running = accrual.spend({"team": "nlp"}, pd.Timestamp(day))
    assert settled == pytest.approx(8 * SPOT * (2 + 1)) and running == 0.0  # "today" to 03:00 and "priced"; not the tpu-v9 one
