"""The exporter against a real Prometheus (Debian's package) after a month of cost data.

The month is materialized the way `gpu-ops demo` does it: the daily cost job of the
reference definitions over October 2026 (the demo's usage, inventory, prices and budgets,
plus one hostile usage row), with the budget sensor's evaluation and the alert runs it
requests after each day. Beside it: a preempted-and-resumed training run in the ledger,
a GPU lease filling a team quota, and a dead-lettered alert, each written through the
module that writes it in production.

Expected values are worked out here from the tables with pandas (a different path from
the exporter's SQL aggregates) and compared with what Prometheus scraped, to the cent.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import re
import threading
import time
from pathlib import Path
from collections.abc import Callable
from typing import Any

import pandas as pd
import pytest
import yaml

from gpu_ops.domain.config import DEMO_CONFIG, load_config
from gpu_ops.cli.dashboards import DASHBOARDS, PROMETHEUS_METRICS, panel_queries
from gpu_ops.cli.dashboards import RULES_FILE
from gpu_ops.domain.metrics import CATALOG
from gpu_ops.storage.tables import TableStore
from gpu_ops_tests.conftest import REPO
from gpu_ops_tests.observability.servers import Exporter, free_port, prometheus, query, series, up, wait_for_scrape_after
from gpu_ops_tests.waiting import wait_until

DEMO = DEMO_CONFIG.parent
DAYS = [f"2026-10-{d:02d}" for d in range(1, 32)]
CHART_DASHBOARDS = REPO / "helm" / "gpu-ops" / "dashboards"
HOSTILE = "start,end,namespace,pod,node,team,project,cost_center,experiment_id,gpu_type,gpu_count,capacity_type,sharing,gpu_share\n" \
    "2026-10-31T02:00:00Z,2026-10-31T03:00:00Z,ml-nlp,odd-0,n9,nlp,llm-eval,cc-1001,,quantum-9000,1,on-demand,none,1\n"

pytestmark = pytest.mark.slow
# The demo's price per GPU-hour by (gpu_type, capacity_type), read here from its file.
PRICES = {(g, c): float(p) for g, caps in yaml.safe_load((DEMO / "prices.yaml").read_text())["gpus"].items() for c, p in caps.items()}


def write_config(folder: Path) -> Path:
    demo = yaml.safe_load(DEMO_CONFIG.read_text())
    (folder / "extra").mkdir()
    (folder / "extra" / "hostile.csv").write_text(HOSTILE)
    cfg = {
        "storage": {"url": f"sqlite:///{folder / 'costs.db'}"},
        "prices": str(DEMO / "prices.yaml"),
        "usage": {
            "sources": [{"type": "file", "path": str(DEMO / "usage" / "*.csv")}, {"type": "file", "path": str(folder / "extra" / "*.csv")}],
            "inventory": {"type": "file", "path": str(DEMO / "inventory.csv")},
            "idle": "row", "group_by": ["team", "project"], "partitions_start": DAYS[0],
        },
        # The demo's budgets (both end October exceeded) and one that stays well under.
        "budgets": demo["budgets"] + [{"name": "research-monthly", "scope": {"team": "research"}, "period": "monthly", "amount_usd": 100000,
                                       "thresholds": [{"percent": 80}, {"percent": 100}], "channels": ["log"]}],
        "channels": demo["channels"],
        "compute": {"backend": "local", "quotas": {"team": {"nlp": 8}}},
    }
    path = folder / "gpu_ops.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def materialize_month(config_path: Path) -> None:
    """The demo's data path (gpu_ops.demo.run) without its training step: the reference
    definitions' daily cost job (the first 30 days as one backfill range run, as the
    schedule's backfill would, then the last day), and the budget sensor's evaluation
    with the alert runs it requests after each of the last two days."""
    import dagster as dg
    from dagster._core.storage.tags import ASSET_PARTITION_RANGE_END_TAG, ASSET_PARTITION_RANGE_START_TAG

    from gpu_ops.dagster.alerts.sensor import launch_requests, tick
    from gpu_ops.domain.alerts.state import AlertCursor
    from gpu_ops.dagster.cost.definitions import DAILY_JOB
    from gpu_ops.dagster.location import build_defs

    config = load_config(config_path)
    store = TableStore.from_config(config)
    quiet = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}
    with dg.DagsterInstance.ephemeral() as instance:
        defs = build_defs(str(config_path))
        job = defs.resolve_job_def(DAILY_JOB)
        cursor = AlertCursor.decode(None)
        days_run = [(DAYS[:-1], {ASSET_PARTITION_RANGE_START_TAG: DAYS[0], ASSET_PARTITION_RANGE_END_TAG: DAYS[-2]}), ([DAYS[-1]], None)]
        for days, tags in days_run:
            if tags:
                assert job.execute_in_process(instance=instance, run_config=quiet, tags=tags).success
            else:
                assert job.execute_in_process(partition_key=days[0], instance=instance, run_config=quiet).success
            now = dt.datetime.fromisoformat(days[-1]).replace(tzinfo=dt.timezone.utc) + dt.timedelta(days=1, minutes=15)
            cursor, requests, _ = tick(config, store, cursor, now=now)
            launch_requests(defs, instance, requests, run_config=quiet)
    assert sorted(store.partitions("gpu_budget_status")) == DAYS


def write_training_quota_and_dead_letter(config_path: Path) -> None:
    from gpu_ops.flows.alerts.records import record_dead_letters
    from gpu_ops.storage.quota import LeaseBook, Quotas
    from gpu_ops.storage import estimate_store, ledger
    from gpu_ops.domain.training.estimate import Estimate, Leg

    store = TableStore.from_config(load_config(config_path))
    t0 = dt.datetime(2026, 10, 30, 10, tzinfo=dt.timezone.utc)
    common = dict(namespace="ml-nlp", pod="", node="n1", team="nlp", project="llm-pretrain", cost_center="cc-1001", experiment_id="", gpu_type="a100-80gb",
                  gpu_count=2, capacity_type="spot", sharing="none", gpu_share=1.0, run_id="run-1", asset_key="train_llm")
    ledger.append(store, [
        ledger.LedgerRow(start=t0, end=t0 + dt.timedelta(minutes=40), attempt=1, outcome="preempted", last_checkpoint_at=t0 + dt.timedelta(minutes=35),
                         lost_seconds=300.0, **common),  # type: ignore[arg-type]
        ledger.LedgerRow(start=t0 + dt.timedelta(minutes=43), end=t0 + dt.timedelta(minutes=103), attempt=2, outcome="completed", last_checkpoint_at=None,
                         lost_seconds=0.0, **common),  # type: ignore[arg-type]
    ])
    # After the month's last partition: what budget_alert_sensor adds intraday (settled, so its figure stays put).
    t1 = dt.datetime(2026, 11, 2, 10, tzinfo=dt.timezone.utc)
    ledger.append(store, [ledger.LedgerRow(start=t1, end=t1 + dt.timedelta(hours=1), attempt=1, outcome="completed", last_checkpoint_at=None, lost_seconds=0.0,
                                           **{**common, "run_id": "run-4"})])  # type: ignore[arg-type]
    estimate_store.record(store, "run-1", "train_llm", 1, t0, "spot", Estimate("history", 3, 3600.0, 5400.0, 3600.0, 5400.0, 2.0, (Leg("spot", 2.0, 0.0, 20.0, 30.0),)))
    admission = LeaseBook(store, ttl_s=3600).try_acquire(Quotas(team={"nlp": 8}), team="nlp", pools=["gpu-ops-nlp-a100-spot"], gpus=8, run_id="run-2", asset_key="train_llm")
    assert admission.granted
    record_dead_letters(store, [{
        "alert": "vision-monthly/2026-10-01/100", "budget": "vision-monthly", "kind": "threshold", "threshold": "100", "period_start": "2026-10-01",
        "idempotency_key": "k1", "delivered": "", "undelivered": "log", "requests": 5, "pending_since": "2026-10-28T00:00:00+00:00",
        "dead_lettered_at": "2026-10-31T00:00:00+00:00", "reason": "no channel accepted it within alerts.max_pending_s", "last_run_id": "",
    }])


def waiting_attempt(config_path: Path) -> Callable[[], None]:
    """A training attempt of team nlp waiting for quota admission (state planned) whose owner,
    this process, beats as a live owner does; returns the function that stops the beats."""
    from gpu_ops.domain.training import attempts as tr
    from gpu_ops.storage.attempt_store import AttemptStore

    records = AttemptStore(TableStore.from_config(load_config(config_path)))
    a = tr.plan("waiting-1", "run-3", "train_llm", 1, tr.Owner.this_process("run-3", "train_llm"), launch_name="l",
                bill={"team": "nlp", "gpu_count": 4, "gpu_type": "a100-80gb"}, at=time.time())
    records.create(a)
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(1.0):
            records.beat(a.attempt_id)

    thread = threading.Thread(target=beat, daemon=True)
    thread.start()
    return lambda: (stop.set(), thread.join())


# --------------------------------------------------------------------------- the oracle


Expected = dict[tuple[str, frozenset[tuple[str, str]]], float]


def _put(out: Expected, name: str, labels: dict[str, Any], value: Any) -> None:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return
    # Prometheus treats an empty label value as no label (a daily table kept at the budgets'
    # grain has team but no project): the oracle's keys leave empty labels out the same way.
    out[(name, frozenset((k, str(v)) for k, v in labels.items() if v is not None and str(v) != ""))] = float(value)


def _windows(df: pd.DataFrame, newest: str) -> list[tuple[str, pd.DataFrame]]:
    return [("day", df[df["partition_key"] == newest]), ("month", df[df["partition_key"] >= newest[:8] + "01"])]


def expected_cost(store: TableStore, out: Expected) -> None:
    daily = store.read("gpu_cost_daily")
    keys = ["kind", "team", "project", "namespace", "cost_center"]
    for window, rows in _windows(daily, daily["partition_key"].max()):
        for key, g in rows.groupby(keys):
            labels = {"window": window, **dict(zip(keys, key))}
            _put(out, "gpu_ops_cost_usd", labels, g["cost_usd"].sum())
            _put(out, "gpu_ops_gpu_seconds", labels, g["gpu_hours"].sum() * 3600)
            _put(out, "gpu_ops_on_demand_equivalent_usd", labels, g["on_demand_usd"].sum())
    usage = store.read("gpu_usage")
    newest = usage["partition_key"].max()
    hw = ["kind", "team", "gpu_type", "capacity_type"]
    for key, g in usage[usage["partition_key"] == newest].groupby(hw):
        _put(out, "gpu_ops_hardware_cost_usd", dict(zip(hw, key)), g["cost_usd"].sum())
        _put(out, "gpu_ops_hardware_gpu_seconds", dict(zip(hw, key)), g["gpu_hours"].sum() * 3600)
    q = store.read("gpu_usage_quarantine")
    for key, g in q[q["partition_key"] == newest].groupby(["source", "field"]):
        _put(out, "gpu_ops_usage_quarantined_rows", dict(zip(["source", "field"], key)), len(g))
    for table in ("gpu_usage", "gpu_cost_attribution", "gpu_cost_daily", "gpu_budget_status", "gpu_roi_report"):
        day = dt.date.fromisoformat(store.read(table, columns=["partition_key"])["partition_key"].max())
        _put(out, "gpu_ops_cost_partition_timestamp_seconds", {"table": table}, dt.datetime(day.year, day.month, day.day, tzinfo=dt.timezone.utc).timestamp())


def expected_roi(store: TableStore, out: Expected) -> None:
    roi = store.read("gpu_roi_report")
    newest = roi["partition_key"].max()
    for window, rows in _windows(roi[roi["team"] != "__total__"], newest):
        for team, g in rows.groupby("team"):
            for source in ("spot", "reserved", "sharing"):
                _put(out, "gpu_ops_savings_usd", {"window": window, "team": team, "source": source}, g[f"{source}_savings_usd"].sum())
            _put(out, "gpu_ops_preemption_waste_usd", {"window": window, "team": team}, g["preemption_waste_usd"].sum())
            _put(out, "gpu_ops_preemption_lost_gpu_seconds", {"window": window, "team": team}, g["preemption_lost_gpu_hours"].sum() * 3600)


def expected_budgets_and_alerts(store: TableStore, out: Expected) -> None:
    status = store.read("gpu_budget_status")
    for r in status[status["partition_key"] == status["partition_key"].max()].itertuples():
        b = {"budget": r.budget, "period": r.period}
        _put(out, "gpu_ops_budget_amount_usd", b, r.amount_usd)
        _put(out, "gpu_ops_budget_spend_usd", b, r.spend_usd)
        _put(out, "gpu_ops_budget_used_ratio", b, r.percent_used / 100)
        _put(out, "gpu_ops_budget_forecast_usd", b, r.forecast_usd)
        _put(out, "gpu_ops_budget_thresholds_crossed", b, len(r.thresholds_crossed))
        _put(out, "gpu_ops_budget_days_missing", b, r.days_missing)
        for state in ("ok", "warning", "exceeded"):
            _put(out, "gpu_ops_budget_status", {**b, "status": state}, 1.0 if r.status == state else 0.0)
        for level in ("none", "info", "warning", "critical"):
            _put(out, "gpu_ops_budget_severity", {**b, "severity": level}, 1.0 if r.severity == level else 0.0)
    keys = ["budget", "channel", "channel_type", "status"]
    for key, g in store.read("gpu_alert_deliveries").groupby(keys):
        _put(out, "gpu_ops_alert_deliveries_total", dict(zip(keys, key)), len(g))
    for budget, g in store.read("gpu_alert_dead_letters").groupby("budget"):
        _put(out, "gpu_ops_alert_dead_letters_total", {"budget": budget}, len(g))


def expected_training_and_quota(store: TableStore, out: Expected) -> None:
    ledger = store.read("gpu_usage_ledger").sort_values(["run_id", "attempt"])
    attempt = ["asset_key", "team", "gpu_type", "capacity_type"]
    for key, g in ledger.groupby(attempt):
        labels = dict(zip(attempt, key))
        seconds = (g["end"] - g["start"]).dt.total_seconds()
        _put(out, "gpu_ops_training_preemptions_total", labels, (g["outcome"] == "preempted").sum())
        _put(out, "gpu_ops_training_gpu_seconds_total", labels, (g["gpu_count"] * g["gpu_share"] * seconds).sum())
        _put(out, "gpu_ops_training_lost_gpu_seconds_total", labels, (g["gpu_count"] * g["gpu_share"] * g["lost_seconds"]).sum())
        for outcome, h in g.groupby("outcome"):
            _put(out, "gpu_ops_training_attempts_total", {**labels, "outcome": outcome}, len(h))
    nxt = ledger.groupby(["run_id", "asset_key"])["start"].shift(-1)
    rec = ledger.assign(gap=(nxt - ledger["end"]).dt.total_seconds())[(ledger["outcome"] == "preempted") & nxt.notna()]
    for (asset, team), g in rec.groupby(["asset_key", "team"]):
        _put(out, "gpu_ops_training_recoveries_total", {"asset_key": asset, "team": team}, len(g))
        _put(out, "gpu_ops_training_recovery_seconds_total", {"asset_key": asset, "team": team}, g["gap"].sum())
    _put(out, "gpu_ops_quota_gpus_held", {"scope": "team", "name": "nlp"}, 8)
    _put(out, "gpu_ops_quota_gpus_held", {"scope": "pool", "name": "gpu-ops-nlp-a100-spot"}, 8)
    _put(out, "gpu_ops_quota_gpus_limit", {"scope": "team", "name": "nlp"}, 8)
    _put(out, "gpu_ops_quota_leases", {"team": "nlp", "state": "live"}, 1)
    _put(out, "gpu_ops_quota_waiting_attempts", {"team": "nlp"}, 1)
    _put(out, "gpu_ops_quota_waiting_gpus", {"team": "nlp"}, 4)


def expected_foresight(store: TableStore, out: Expected) -> None:
    """The launch estimate, the ledger's cost after the newest status day, the newest anomaly scores."""
    for r in store.read("gpu_launch_estimates").sort_values("estimated_at").groupby("asset_key").tail(1).itertuples():
        labels = {"asset_key": r.asset_key, "capacity": r.capacity, "basis": r.basis}
        _put(out, "gpu_ops_launch_estimate_usd", labels, r.estimate_usd)
        _put(out, "gpu_ops_launch_estimate_p90_usd", labels, r.estimate_p90_usd)
    since = pd.Timestamp(store.read("gpu_budget_status", columns=["partition_key"])["partition_key"].max(), tz="UTC") + pd.Timedelta(days=1)
    ledger = store.read("gpu_usage_ledger")
    after = ledger[ledger["end"] > since]
    for (team, project, asset), g in after.groupby(["team", "project", "asset_key"]):
        price = [PRICES[(t, c)] for t, c in zip(g["gpu_type"], g["capacity_type"])]
        seconds = (g["end"] - g["start"].clip(lower=since)).dt.total_seconds()
        _put(out, "gpu_ops_intraday_cost_usd", {"team": team, "project": project, "asset_key": asset, "state": "settled"}, (g["gpu_count"] * g["gpu_share"] * seconds * price / 3600).sum())
    scores = store.read("gpu_spend_anomalies")
    for r in scores[scores["partition_key"] == scores["partition_key"].max()].itertuples():
        _put(out, "gpu_ops_spend_anomaly_score", {"dimension": r.dimension, "key": r.key}, r.score)
        _put(out, "gpu_ops_spend_anomaly_baseline_usd", {"dimension": r.dimension, "key": r.key}, r.baseline_usd)


def expected_from_tables(store: TableStore) -> Expected:
    out: Expected = {}
    for part in (expected_cost, expected_roi, expected_budgets_and_alerts, expected_training_and_quota, expected_foresight):
        part(store, out)
    return out


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="session")  # once per worker (see conftest.py)
def month(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    folder = tmp_path_factory.mktemp("obs_month")
    config = write_config(folder)
    materialize_month(config)
    write_training_quota_and_dead_letter(config)
    stop_beats = waiting_attempt(config)
    store = TableStore.from_config(load_config(config))
    # Two replicas of the exporter on the same database, as the chart's Deployment may run.
    exporters = [Exporter(config, free_port(), folder / f"exporter-{i}.log") for i in range(2)]
    for exporter in exporters:
        exporter.start()
    targets = [f"127.0.0.1:{e.port}" for e in exporters]
    try:
        with prometheus(folder, targets, [RULES_FILE]) as url:
            wait_for_scrape_after(url, time.time(), targets)
            yield {"url": url, "store": store, "exporter": exporters[0], "targets": targets, "config": config}
    finally:
        stop_beats()
        for exporter in exporters:
            exporter.stop()


def _close(expected: Expected, got: Expected) -> list[str]:
    problems = []
    for key, want in expected.items():
        have = got.get(key)
        tol = 0.005 if key[0].endswith("_usd") else max(1e-6, abs(want) * 1e-9)
        if have is None or abs(have - want) > tol:
            problems.append(f"{key[0]}{dict(key[1])}: table {want!r}, Prometheus {have!r}")
    return problems


# --------------------------------------------------------------------------- tests


def test_every_series_equals_its_table_value_to_the_cent(month: dict[str, Any]) -> None:
    expected = expected_from_tables(month["store"])
    got = series(month["url"])
    # The month is all there: every table family has series, and a budget crossed its thresholds.
    families = {name for name, _ in expected}
    assert families >= {n for n, m in CATALOG.items() if m.source not in ("exporter", "gpu_cost_attribution")} - {"gpu_ops_pod_cost_usd", "gpu_ops_pod_gpu_seconds"}
    assert expected[("gpu_ops_budget_status", frozenset({"budget": "nlp-monthly", "period": "monthly", "status": "exceeded"}.items()))] == 1.0
    assert _close(expected, got) == []
    # ... and Prometheus holds no series of those families that the tables do not explain.
    extra = sorted(f"{n}{dict(l)}" for n, l in got if n in families and (n, l) not in expected)
    assert extra == []
    assert {dict(l)["source"] for n, l in got if n == "gpu_ops_exporter_read_ok" and got[(n, l)] == 1.0} >= {"gpu_cost_daily", "gpu_usage_ledger", "gpu_budget_status"}


def _values(url: str, instance: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {k: v for k, v in series(url, instance=instance).items() if k[0] != "gpu_ops_exporter_read_seconds"}


def test_two_replicas_serve_the_same_values(month: dict[str, Any]) -> None:
    first, second = (_values(month["url"], target) for target in month["targets"])
    assert first == second and len(first) > 100


def test_restarting_the_exporter_changes_no_value(month: dict[str, Any]) -> None:
    target = month["targets"][0]
    before = _values(month["url"], target)
    month["exporter"].stop()
    stopped = time.time()
    assert wait_until(lambda: (up(month["url"], target) or ("",))[0] == "0", timeout=30, every=0.25)
    month["exporter"].start()
    wait_for_scrape_after(month["url"], stopped + 1, [target])
    assert _values(month["url"], target) == before
    assert len(before) > 100


def test_a_budget_over_its_threshold_fires_the_shipped_rule(month: dict[str, Any]) -> None:
    def firing() -> list[dict[str, Any]]:
        return query(month["url"], 'ALERTS{alertname="GpuOpsBudgetExceeded",alertstate="firing"}')

    status = month["store"].read("gpu_budget_status")
    status = status[status["partition_key"] == status["partition_key"].max()].set_index("budget")["status"]
    assert status["nlp-monthly"] == "exceeded" and status["research-monthly"] == "ok"
    assert wait_until(firing, timeout=30, every=0.5)
    assert {a["metric"]["budget"] for a in firing()} == set(status[status == "exceeded"].index)
    assert {a["metric"]["severity"] for a in firing()} == {"critical"}
    # The budget that stayed under has no alert; the full quota is pending (for: 30m).
    assert not query(month["url"], 'ALERTS{budget="research-monthly"}')
    assert wait_until(lambda: query(month["url"], 'ALERTS{alertname="GpuOpsQuotaStarved",name="nlp",alertstate="pending"}'), timeout=30, every=0.5), \
        query(month["url"], "ALERTS")


def _dashboards() -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted(CHART_DASHBOARDS.glob("*.json"))]


def test_every_panel_query_of_every_shipped_dashboard_returns_data(month: dict[str, Any]) -> None:
    dcgm = {p.title for d in DASHBOARDS for p in d.panels if p.needs_dcgm}
    attribution = month["store"].read("gpu_cost_attribution")
    assert attribution["efficiency"].isna().all()  # no usage.utilization here: no DCGM figures in the tables
    asked = 0
    for dashboard in _dashboards():
        for title, expr in panel_queries(dashboard):
            result = query(month["url"], expr.replace("$team", ".*"))
            if title in dcgm:
                assert result == [], (dashboard["title"], title, expr)  # absent without measurements, never a zero
            else:
                assert result, f"{dashboard['title']} / {title}: {expr} returns no data"
            asked += 1
    assert asked >= 40


IDENT = re.compile(r"\b(gpu_ops_[a-z0-9_]+|ALERTS)\b")
BY = re.compile(r"\bby \(([^)]*)\)")
MATCHER = re.compile(r"([a-z_]+)\s*(?:=~|!=|!~|=)\s*\"")


def test_every_panel_names_only_metrics_and_labels_the_exporter_defines() -> None:
    known = {m.name: set(m.labels) for m in CATALOG.values()}
    for dashboard in _dashboards():
        for title, expr in panel_queries(dashboard):
            names = set(IDENT.findall(expr))
            assert names, (title, expr)
            unknown = names - set(known) - PROMETHEUS_METRICS
            assert not unknown, f"{title}: {expr} names {unknown}"
            labels = set().union(*(known.get(n, {"alertname", "alertstate", "budget", "severity"}) for n in names))
            used = {lab.strip() for group in BY.findall(expr) for lab in group.split(",")} | set(MATCHER.findall(expr))
            assert used <= labels, f"{title}: {expr} uses labels {used - labels}"
