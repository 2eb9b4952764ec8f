"""Spend anomalies through the budgets' channels: the real gpu_spend_anomalies asset
materialized from stored daily tables (a generated month, a seeded spike), then the real
`budget_alert_sensor` on a real Dagster instance alerting a real webhook receiver once,
for the budgets whose scope covers the key."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import dagster as dg

from gpu_ops.flows.alerts.anomalies import anomaly_alerts, read_recent
from gpu_ops.dagster.alerts.sensor import threshold_plan
from gpu_ops.dagster.cost.assets import build_assets
from gpu_ops.dagster.io_manager import TableIOManager
from gpu_ops_tests.cost.anomaly_data import month, write_daily_tables

from .conftest import SensorHarness, status_row, write_config, write_status

UTC = dt.timezone.utc


def test_a_spike_is_alerted_once_through_the_budgets_that_cover_it(tmp_path: Path, dagster_instance: Any, receiver: Any) -> None:
    hook = receiver()
    budgets = [
        {"name": "nlp", "scope": {"team": "nlp"}, "amount_usd": 50_000, "channels": ["audit"]},
        {"name": "cv", "scope": {"team": "cv"}, "amount_usd": 50_000, "channels": ["audit"]},
        {"name": "nlp-llm", "scope": {"team": "nlp", "project": "llm"}, "amount_usd": 50_000, "channels": ["audit"]},  # covers part of team nlp only
        {"name": "fleet", "scope": {"team": "nlp"}, "amount_usd": 200_000, "channels": ["audit"]},  # no status row yet: its spend is unknown
    ]
    path = write_config(tmp_path, budgets=budgets, channels={"audit": {"type": "webhook", "url": hook.url + "/hook"}}, alerts={"anomalies": {"alert_score": 8}})
    h = SensorHarness(dagster_instance, path)
    daily, dates = month(days=35, start=dt.date(2026, 10, 16))
    spike = dates[-1]  # 2026-11-19, a Thursday
    daily.loc[(daily["day"] == spike) & (daily["key"] == "nlp"), "spend_usd"] = 6000.0
    write_daily_tables(h.store, daily, dates)
    write_status(h.store, spike.isoformat(), [status_row(b["name"], day=spike.isoformat(), spend=9000.0, amount=50_000) for b in budgets[:3]])
    assets, _ = build_assets(h.config)
    resources = {"gpu_ops": h.settings, "table_io_manager": TableIOManager(url=h.config.storage.resolved_url())}
    assert dg.materialize(assets, partition_key=spike.isoformat(), resources=resources, instance=dagster_instance, selection=["gpu_spend_anomalies"]).success

    requests, results = h.tick()
    assert [r.run_key for r in requests] == ["nlp/2026-11-01/anomaly-2026-11-19-team-nlp"] and all(r.success for r in results)
    [body] = [r.json() for r in hook.acknowledged]
    assert body["type"] == "gpu_ops.budget.spend_anomaly" and body["basis"] == "anomaly" and body["threshold_usd"] == 6000.0
    assert body["spend_usd"] == 9000.0 and body["budget"] == "nlp"

    # The day re-materialized, and the next evaluations: alerted already.
    assert dg.materialize(assets, partition_key=spike.isoformat(), resources=resources, instance=dagster_instance, selection=["gpu_spend_anomalies"]).success
    h.now += dt.timedelta(minutes=10)
    requests, _ = h.tick()
    assert requests == [] and len(hook.requests) == 1

    # The budget without a status row was not alerted with a made-up $0 spend, and it is
    # said why; once its row lands, its alert goes out with its figure.
    rows = read_recent(h.store, spike)
    alerts, unknown = anomaly_alerts(threshold_plan(h.config), rows, {("nlp", "2026-11-01"): 9000.0}, 8, "http://dagster")
    assert [a.budget for a in alerts] == ["nlp"] and unknown == ["fleet"]
    write_status(h.store, spike.isoformat(), [status_row(b["name"], day=spike.isoformat(), spend=9000.0 if b["name"] != "fleet" else 20_000.0,
                                                         amount=b["amount_usd"]) for b in budgets])
    h.now += dt.timedelta(minutes=10)
    requests, results = h.tick()
    assert [r.run_key for r in requests] == ["fleet/2026-11-01/anomaly-2026-11-19-team-nlp"] and all(r.success for r in results)
    assert [r.json()["spend_usd"] for r in hook.acknowledged][1:] == [20_000.0]


def test_scores_under_alert_score_stay_in_the_check(tmp_path: Path, dagster_instance: Any, receiver: Any) -> None:
    hook = receiver()
    budgets = [{"name": "nlp", "scope": {"team": "nlp"}, "amount_usd": 50_000, "channels": ["audit"]}]
    path = write_config(tmp_path, budgets=budgets, channels={"audit": {"type": "webhook", "url": hook.url + "/hook"}}, alerts={"anomalies": {"alert_score": None}})
    h = SensorHarness(dagster_instance, path)
    daily, dates = month(days=35, start=dt.date(2026, 10, 16))
    daily.loc[(daily["day"] == dates[-1]) & (daily["key"] == "nlp"), "spend_usd"] = 6000.0
    write_daily_tables(h.store, daily, dates)
    assets, _ = build_assets(h.config)
    resources = {"gpu_ops": h.settings, "table_io_manager": TableIOManager(url=h.config.storage.resolved_url())}
    result = dg.materialize(assets, partition_key=dates[-1].isoformat(), resources=resources, instance=dagster_instance, selection=["gpu_spend_anomalies"])
    assert not result.get_asset_check_evaluations()[0].passed
    requests, _ = h.tick()
    assert requests == [] and hook.requests == []


def test_an_anomaly_on_a_periods_last_day_carries_that_periods_spend_after_the_month_turns(tmp_path: Path, dagster_instance: Any, receiver: Any) -> None:
    """The spike is on 30 November; the newest status partition is 1 December's, a new
    monthly period with little spent. The alert is about November's period and says
    November's spend (from the 30 November partition), not December's first day."""
    hook = receiver()
    budgets = [{"name": "nlp", "scope": {"team": "nlp"}, "amount_usd": 50_000, "channels": ["audit"]}]
    path = write_config(tmp_path, budgets=budgets, channels={"audit": {"type": "webhook", "url": hook.url + "/hook"}}, alerts={"anomalies": {"alert_score": 8}})
    h = SensorHarness(dagster_instance, path)
    daily, dates = month(days=35, start=dt.date(2026, 10, 27))
    spike = dates[-1]
    assert spike == dt.date(2026, 11, 30)
    daily.loc[(daily["day"] == spike) & (daily["key"] == "nlp"), "spend_usd"] = 6000.0
    write_daily_tables(h.store, daily, dates)
    write_status(h.store, spike.isoformat(), [status_row("nlp", day=spike.isoformat(), spend=31_000.0, amount=50_000)])
    write_status(h.store, "2026-12-01", [status_row("nlp", day="2026-12-01", spend=120.0, amount=50_000)])
    assets, _ = build_assets(h.config)
    resources = {"gpu_ops": h.settings, "table_io_manager": TableIOManager(url=h.config.storage.resolved_url())}
    assert dg.materialize(assets, partition_key=spike.isoformat(), resources=resources, instance=dagster_instance, selection=["gpu_spend_anomalies"]).success

    h.now = dt.datetime(2026, 12, 1, 9, 0, tzinfo=UTC)
    requests, results = h.tick()
    assert [r.run_key for r in requests] == ["nlp/2026-11-01/anomaly-2026-11-30-team-nlp"] and all(r.success for r in results)
    [body] = [r.json() for r in hook.acknowledged]
    assert body["period_start"] == "2026-11-01" and body["spend_usd"] == 31_000.0 and body["percent_used"] == 62.0
