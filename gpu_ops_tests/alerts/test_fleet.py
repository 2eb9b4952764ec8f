"""`budget_alert_sensor` with more alerts due than `alerts.max_runs_per_tick`: the rest
wait in the cursor's queue and go out on the next ticks, oldest first, each under its own
run key, never lost (a new process reading the stored cursor, a daemon that dies
mid-tick) and never requested twice. Real sensor, real instance, real runs."""

from __future__ import annotations

import math

import pytest

from gpu_ops.domain.alerts.model import Alert
from gpu_ops.domain.alerts.queue import AlertQueue
from gpu_ops.domain.alerts.redelivery import Pending, Policy, advance

from .conftest import SensorHarness, evaluate_in_new_process, status_row, write_config, write_status

DAY1, DAY2 = "2026-11-19", "2026-11-20"
CAP = 3
NAMES = [f"team-{i}-monthly" for i in range(4)]


def harness(tmp_path, instance) -> SensorHarness:
    path = write_config(
        tmp_path,
        budgets=[{"name": n, "scope": {"team": n[:6]}, "amount_usd": 1_000, "thresholds": [{"percent": 50}, {"percent": 80}, {"percent": 100}], "channels": ["log"]} for n in NAMES],
        channels={"log": {"type": "log"}},
        alerts={"max_runs_per_tick": CAP, "top_spenders": 0},
    )
    return SensorHarness(instance, path)


def crossing(h: SensorHarness, day: str, spend: float) -> None:
    write_status(h.store, day, [status_row(n, day=day, spend=spend, amount=1_000) for n in NAMES])


def keys(requests) -> list[str]:
    return [r.run_key for r in requests]


def test_more_alerts_than_the_cap_go_out_over_later_ticks_exactly_once(tmp_path, dagster_instance, capfd):
    h = harness(tmp_path, dagster_instance)
    crossing(h, DAY1, 850)  # each budget crosses 50 % and 80 %: M = 8 alerts, N = 3 per tick
    expected = [f"{n}/2026-11-01/actual-{p}pct" for n in NAMES for p in (50, 80)]

    capfd.readouterr()
    first, results = h.tick()
    assert keys(first) == expected[:3] and all(r.success for r in results)
    log = capfd.readouterr().err
    assert "8 triggered" in log and "3 alert run(s) requested, 5 waiting for the next ticks (alerts.max_runs_per_tick 3)" in log

    # A restarted sensor (a new process, the stored cursor) carries on with the queue.
    assert evaluate_in_new_process(h, tmp_path) == expected[3:6]

    # The daemon dies after launching the second tick's runs, before storing the cursor:
    # the tick is evaluated again from the old cursor, yields the same keys, all skipped.
    before = h.cursor
    second, results = h.tick(force=False)
    assert keys(second) == expected[3:6] and len(results) == 3
    h.cursor = before
    again, results = h.tick(force=False)
    assert keys(again) == expected[3:6] and results == [] and h.skipped == expected[3:6]

    third, results = h.tick(force=False)
    assert keys(third) == expected[6:] and len(results) == 2
    assert "2 alert run(s) requested, 0 waiting" in capfd.readouterr().err
    assert h.tick()[0] == []  # a full evaluation of the same data: nothing new

    requested = keys(first) + keys(second) + keys(third)
    assert requested == expected and len(set(requested)) == 8
    assert math.ceil(8 / CAP) == 3
    runs = [r for r in dagster_instance.get_runs() if r.job_name == "budget_alert_job"]
    assert sorted(r.tags["dagster/run_key"] for r in runs) == sorted(expected)
    assert all(r.is_success for r in runs)


def test_new_alerts_queue_behind_the_waiting_ones(tmp_path, dagster_instance):
    h = harness(tmp_path, dagster_instance)
    crossing(h, DAY1, 850)
    requested = keys(h.tick()[0])
    crossing(h, DAY2, 1_050)  # every budget now crosses 100 % too: 4 more
    while True:
        requests, results = h.tick()
        if not requests:
            break
        assert all(r.success for r in results)
        requested += keys(requests)
    old = [f"{n}/2026-11-01/actual-{p}pct" for n in NAMES for p in (50, 80)]
    new = [f"{n}/2026-11-01/actual-100pct" for n in NAMES]
    assert requested == old + new  # oldest first, each once
    alerts = {r.tags["dagster/run_key"]: r.run_config["ops"]["deliver_budget_alert"]["config"]["alert"] for r in dagster_instance.get_runs()}
    assert alerts[old[-1]]["spend_usd"] == 850 and alerts[old[-1]]["partition_key"] == DAY1  # as evaluated, not as of its request
    assert alerts[new[0]]["spend_usd"] == 1_050 and alerts[new[0]]["severity"] == "critical"


def alert(i: int, **kw) -> Alert:
    base = dict(
        kind="trigger", budget=f"b{i % 3}", period_start="2026-11-01", period_end="2026-12-01", threshold=f"actual-{50 + i}pct",
        basis="actual", threshold_usd=500.0 + i, severity="warning", amount_usd=1_000.0, spend_usd=900.5, percent_used=90.05,
        forecast_usd=None if i % 2 else 1_200.0, scope={"team": "nlp", "label:env": "prod"}, channels=("log", "hook"), episode=1 + i % 2,
        partition_key="2026-11-19", as_of="2026-11-20 00:00:00+00:00", enforcement="throttle", dagster_url="http://d:3000",
    )
    return Alert(**{**base, **kw})


def test_the_queue_keeps_every_alert_exactly_in_order_through_its_json():
    q = AlertQueue()
    alerts = [alert(i) for i in range(7)] + [alert(7, kind="resolve", scope={}, channels=())]
    for a in alerts:
        q.add(a)
    q = AlertQueue.from_json(q.to_json())
    assert len(q) == 8
    assert q.pop(3) == alerts[:3]
    q = AlertQueue.from_json(q.to_json())
    assert q.pop(10) == alerts[3:] and len(q) == 0 and q.pop(1) == []


def test_redeliveries_beyond_the_limit_wait_for_a_later_step():
    policy = Policy(interval_s=300, max_pending_s=3_600)
    pending = {f"k{i}": Pending(0.0, 0.0) for i in range(5)}
    failed = {k: "failure" for k in pending}
    step = advance(pending, failed, 400, policy, limit=2)
    assert [k for k, _ in step.redeliver] == ["k0", "k1"]
    assert [step.pending[k].n for k in sorted(step.pending)] == [2, 2, 1, 1, 1]
    step = advance(step.pending, {}, 430, policy, limit=2)  # nothing new seen: the waiting ones go now
    assert [k for k, _ in step.redeliver] == ["k2", "k3"] and [p.n for _, p in step.redeliver] == [2, 2]
    step = advance(step.pending, {}, 460, policy, limit=0)
    assert step.redeliver == [] and step.pending["k4"] == Pending(0.0, 0.0, 1, "failure")
    assert [k for k, _ in advance(step.pending, {}, 490, policy).redeliver] == ["k4"]


def test_the_cap_is_a_setting(tmp_path):
    from gpu_ops.domain.config import AlertsConfig, ConfigError, load_config

    assert AlertsConfig().max_runs_per_tick == 500
    path = write_config(tmp_path, budgets=[], channels={}, alerts={"max_runs_per_tick": 0})
    with pytest.raises(ConfigError, match=r"alerts.max_runs_per_tick: must be > 0"):
        load_config(path)
