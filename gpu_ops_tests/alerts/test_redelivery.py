"""Alerts at least once, through any outage (issue 10).

A real webhook receiver on 127.0.0.1 is down (refusing, or hanging past the client
timeout) for longer than every retry of the alert run; the run fails. Later ticks of the
real `budget_alert_sensor` (a real Dagster instance, `run_sensor_once`, the requested runs
executed for real) request the alert again with a fresh run key until the receiver is
back: each alert arrives exactly once, with the same idempotency key, and a channel that
already had it never gets it again. One that stays down past `alerts.max_pending_s` is
dead-lettered: sensor log, check evaluation, table, run tags, the final run's metadata.
Time is the sensor's clock (`SensorHarness.now`), never a sleep.
"""

from __future__ import annotations

import datetime as dt
import dagster as dg
import pytest

from gpu_ops.flows.alerts.records import DEAD_LETTERS_TABLE, DELIVERIES_TABLE
from gpu_ops.domain.alerts.redelivery import Pending, Policy, advance
from gpu_ops.dagster.alerts.sensor import DEAD_LETTER_CHECK, DEAD_LETTER_TAG, build_dead_letter_check
from gpu_ops.flows.compute.local import free_port

from .conftest import SensorHarness, status_row, write_config, write_status

T0 = dt.datetime(2026, 11, 20, 6, 0, tzinfo=dt.timezone.utc)
DELIVERY = {"delivery_attempts": 2, "delivery_backoff_s": 0.01, "delivery_timeout_s": 0.3, "run_retries": 1, "run_retry_delay_s": 0.01}
SENDS_PER_RUN = 2 * 2  # delivery_attempts x (run_retries + 1)
KEYS = ["nlp-monthly/2026-11-01/actual-50pct", "nlp-monthly/2026-11-01/actual-80pct"]


def make_harness(tmp_path, instance, audit_url: str, ledger_url: str, *, max_pending_s: int = 259_200, thresholds=(50, 80)) -> SensorHarness:
    path = write_config(
        tmp_path,
        budgets=[{"name": "nlp-monthly", "scope": {"team": "nlp"}, "amount_usd": 10_000, "thresholds": [{"percent": p} for p in thresholds], "channels": ["audit", "ledger"]}],
        channels={"audit": {"type": "webhook", "url": audit_url + "/hook"}, "ledger": {"type": "webhook", "url": ledger_url + "/hook"}},
        alerts={**DELIVERY, "redelivery_interval_s": 300, "max_pending_s": max_pending_s, "top_spenders": 0},
    )
    h = SensorHarness(instance, path)
    write_status(h.store, "2026-11-19", [status_row("nlp-monthly", day="2026-11-19", spend=8_500, amount=10_000)])
    return h


def tick_at(h: SensorHarness, seconds: float):
    h.now = T0 + dt.timedelta(seconds=seconds)
    return h.tick()


def keys(requests) -> list[str]:
    return [r.run_key for r in requests]


def test_a_refusing_receiver_gets_each_alert_once_when_it_comes_back(tmp_path, receiver, dagster_instance):
    port = free_port()  # nothing listens: connections are refused
    ledger = receiver()
    h = make_harness(tmp_path, dagster_instance, f"http://127.0.0.1:{port}", ledger.url)

    requests, results = tick_at(h, 0)
    assert keys(requests) == KEYS and [r.success for r in results] == [False, False]
    assert len(ledger.acknowledged) == 2  # the channel that is up is not held back

    requests, results = tick_at(h, 100)  # failed less than redelivery_interval_s ago
    assert requests == [] and results == []

    requests, results = tick_at(h, 300)
    assert keys(requests) == [f"{k}/redelivery-2" for k in KEYS] and not any(r.success for r in results)
    assert [r.tags["gpu-ops/redelivery"] for r in requests] == ["2", "2"]

    audit = receiver(port=port)  # the receiver comes back
    requests, results = tick_at(h, 400)
    assert requests == []  # the interval again, from the last request
    requests, results = tick_at(h, 610)
    assert keys(requests) == [f"{k}/redelivery-3" for k in KEYS] and all(r.success for r in results)
    for later in (900, 1200, 90_000):
        requests, results = tick_at(h, later)
        assert requests == [] and results == []

    # Each alert arrived exactly once at each receiver, with the same Idempotency-Key.
    assert len(audit.requests) == len(audit.acknowledged) == 2
    assert len(ledger.requests) == 2
    audit_keys = sorted(r.headers["Idempotency-Key"] for r in audit.acknowledged)
    assert audit_keys == sorted(r.headers["Idempotency-Key"] for r in ledger.acknowledged) == sorted(f"gpu-ops/{k}/trigger" for k in KEYS)
    delivered = h.store.read(DELIVERIES_TABLE, where={"status": "delivered"})
    assert sorted(zip(delivered["run_key"], delivered["channel"])) == sorted((k, c) for k in KEYS for c in ("audit", "ledger"))
    assert not h.store.has_table(DEAD_LETTERS_TABLE)

    # A redelivery run's metadata tells where it stands in the schedule.
    run = next(r for r in dagster_instance.get_runs() if r.tags.get("dagster/run_key") == f"{KEYS[0]}/redelivery-3")
    out = next(e for e in dagster_instance.all_logs(run.run_id) if e.dagster_event and e.dagster_event.event_type_value == "STEP_OUTPUT")
    delivery = out.dagster_event.event_specific_data.metadata["delivery"].value
    assert delivery["request"] == 3 and delivery["pending_since"] == T0.isoformat() and delivery["final"] is False


def test_a_hanging_receiver_is_sent_a_bounded_number_of_times_then_gets_it_once(tmp_path, receiver, dagster_instance):
    audit, ledger = receiver(["hang"] * 1_000, hang_s=0.6), receiver()  # hangs past the 0.3 s client timeout
    h = make_harness(tmp_path, dagster_instance, audit.url, ledger.url, thresholds=(50,))

    for at in (0, 300):
        requests, results = tick_at(h, at)
        assert len(requests) == 1 and not results[0].success
    # Bounded: each failed run sent delivery_attempts x (run_retries + 1) times, no more.
    assert len(audit.requests) == 2 * SENDS_PER_RUN and audit.acknowledged == []

    audit.script.clear()  # answers again
    requests, results = tick_at(h, 600)
    assert keys(requests) == [f"{KEYS[0]}/redelivery-3"] and results[0].success
    requests, _ = tick_at(h, 900)
    assert requests == []
    assert len(audit.acknowledged) == 1 and len(ledger.requests) == 1
    assert audit.acknowledged[0].headers["Idempotency-Key"] == ledger.requests[0].headers["Idempotency-Key"]


def test_an_alert_down_past_max_pending_is_dead_lettered_and_visible(tmp_path, receiver, dagster_instance, capfd):
    port = free_port()
    ledger = receiver()
    h = make_harness(tmp_path, dagster_instance, f"http://127.0.0.1:{port}", ledger.url, max_pending_s=900, thresholds=(50,))

    assert keys(tick_at(h, 0)[0]) == [KEYS[0]]
    assert keys(tick_at(h, 300)[0]) == [f"{KEYS[0]}/redelivery-2"]
    requests, results = tick_at(h, 600)  # 600 + 300 >= 900: the last request
    assert keys(requests) == [f"{KEYS[0]}/redelivery-3"] and not results[0].success
    assert requests[0].run_config["ops"]["deliver_budget_alert"]["config"]["delivery"]["final"] is True
    failure = next(e for e in results[0].all_events if e.event_type_value == "STEP_FAILURE")
    error = failure.event_specific_data.error
    assert "DEAD-LETTERED" in error.message + str(error.cause and error.cause.message)
    assert failure.event_specific_data.user_failure_data.metadata["dead_letter"].value is True

    capfd.readouterr()
    requests, results = tick_at(h, 610)
    assert requests == []
    sensor_log = capfd.readouterr().err  # the tick's log (the daemon keeps it with the tick)
    assert f"ERROR - alert {KEYS[0]} DEAD-LETTERED" in sensor_log and "Undelivered channels: audit" in sensor_log

    # The check: failed, ERROR, naming the alert and the channel it never reached.
    record = dagster_instance.get_latest_asset_check_evaluation_record(dg.AssetCheckKey(dg.AssetKey("gpu_budget_status"), DEAD_LETTER_CHECK))
    evaluation = record.event.dagster_event.event_specific_data
    assert evaluation.passed is False and evaluation.severity == dg.AssetCheckSeverity.ERROR
    assert KEYS[0] in evaluation.description and "undelivered: audit" in evaluation.description
    # The table, and every run of the alert tagged.
    row = h.store.read(DEAD_LETTERS_TABLE).iloc[0]
    assert (row["alert"], row["undelivered"], row["delivered"], int(row["requests"])) == (KEYS[0], "audit", "ledger", 3)
    runs = [r for r in dagster_instance.get_runs() if r.tags.get("gpu-ops/alert") == KEYS[0]]
    assert len(runs) == 3 and all(r.tags.get(DEAD_LETTER_TAG) == "true" for r in runs)

    # Never requested again, and the receiver that was up got it once.
    receiver(port=port)
    for later in (900, 1_800, 100_000):
        assert tick_at(h, later)[0] == []
    assert len(ledger.requests) == 1
    assert len(h.store.read(DEAD_LETTERS_TABLE)) == 1

    # The executable check (the UI's "Execute", or the daily job) reads the table: failed.
    result = dg.materialize([build_dead_letter_check(h.clock)], instance=dagster_instance, resources={"gpu_ops": h.settings}, selection=dg.AssetSelection.all_asset_checks())
    [evaluation] = result.get_asset_check_evaluations()
    assert not evaluation.passed and KEYS[0] in evaluation.description
    h.now = T0 + dt.timedelta(days=8)  # a week later the check is green again; the table keeps the row
    result = dg.materialize([build_dead_letter_check(h.clock)], instance=dagster_instance, resources={"gpu_ops": h.settings}, selection=dg.AssetSelection.all_asset_checks())
    assert result.get_asset_check_evaluations()[0].passed



def test_a_resolve_supersedes_its_undelivered_trigger(tmp_path, receiver, dagster_instance):
    """PagerDuty must never be paged after the incident's resolve: an undelivered trigger
    whose threshold resolved is not redelivered; the resolve is."""
    port = free_port()
    ledger = receiver()
    h = make_harness(tmp_path, dagster_instance, f"http://127.0.0.1:{port}", ledger.url, thresholds=(50,))
    assert keys(tick_at(h, 0)[0]) == [KEYS[0]]
    write_status(h.store, "2026-11-20", [status_row("nlp-monthly", day="2026-11-20", spend=1_000, amount=10_000)])
    audit = receiver(port=port)
    requests, results = tick_at(h, 300)
    assert keys(requests) == [f"{KEYS[0]}/resolve"] and results[0].success
    for later in (600, 900):
        assert tick_at(h, later)[0] == []
    assert [r.json()["type"] for r in audit.requests] == ["gpu_ops.budget.resolved"]


def test_redelivery_schedule_is_bounded():
    policy = Policy(interval_s=300, max_pending_s=3_600)
    assert policy.max_requests() == 13
    pending, requests, now = {"k": Pending(0.0, 0.0)}, 1, 0.0
    while pending:
        now += 30  # a tick every 30 s, every run failing at once
        step = advance(pending, {p.run_key(k): "failure" for k, p in pending.items()}, now, policy)
        requests += len(step.redeliver)
        assert all(p.last - prev.last >= 300 for (_, p), prev in zip(step.redeliver, pending.values()))
        pending = step.pending
    assert requests <= policy.max_requests() and step.dead[0].key == "k" and now <= 3_600 + 30
    # a run not launched yet is waited for; running runs are never dead-lettered
    assert advance({"k": Pending(0, 0)}, {}, 10, policy).pending["k"].n == 1
    assert advance({"k": Pending(0, 0, 1, "active")}, {}, 99_999, policy).dead == []
    assert advance({"k": Pending(0, 0)}, {}, 3_600, policy).dead[0].reason.startswith("no run of k was launched")


@pytest.mark.parametrize("text", ['{"v":1,"m":null,"at":null,"b":{}}'])
def test_an_old_cursor_without_pending_still_decodes(text):
    from gpu_ops.domain.alerts.state import AlertCursor

    c = AlertCursor.decode(text)
    assert c.pending == {} and c.runs_seen_at is None
    c.pending["x"] = Pending(1.0, 2.0, 3, "failure")
    assert AlertCursor.decode(c.encode()).pending["x"] == Pending(1.0, 2.0, 3, "failure")
