"""The alert state machine, by hand: what fires, when, and how often."""

from __future__ import annotations

import datetime as dt

import pytest

from gpu_ops.domain.alerts.state import AlertCursor, StatusRow, evaluate
from gpu_ops.domain.config import Budget

UTC = dt.timezone.utc
NOW = dt.datetime(2026, 11, 20, 12, 0, tzinfo=UTC)


def budget(**kw) -> Budget:
    base = dict(
        name="nlp-monthly",
        scope={"team": "nlp"},
        amount_usd=10_000,
        thresholds=[{"percent": 50}, {"percent": 80}, {"percent": 100}, {"percent": 120, "basis": "forecast"}, {"absolute_usd": 15_000}],
        channels=["log"],
    )
    base.update(kw)
    return Budget.model_validate(base)


def row(spend: float, *, forecast: float | None = None, start: str = "2026-11-01", end: str = "2026-12-01", amount: float = 10_000, day: str = "2026-11-19") -> StatusRow:
    return StatusRow("nlp-monthly", start, end, amount, spend, spend / amount * 100, forecast, day, None)


def fired(ev) -> list[tuple[str, str, int]]:
    return [(e.kind, e.threshold, e.episode) for e in ev.alerts]


def test_each_threshold_fires_once_per_period():
    b = {"nlp-monthly": budget()}
    ev = evaluate(b, [row(5_000)], {}, NOW)
    assert fired(ev) == [("trigger", "actual-50pct", 1)]
    ev = evaluate(b, [row(8_500)], ev.state, NOW)
    assert fired(ev) == [("trigger", "actual-80pct", 1)]
    # Same data again, and more spend under the next line: silent.
    ev = evaluate(b, [row(8_500)], ev.state, NOW)
    assert fired(ev) == []
    ev = evaluate(b, [row(9_900)], ev.state, NOW)
    assert fired(ev) == []
    ev = evaluate(b, [row(16_000)], ev.state, NOW)
    assert fired(ev) == [("trigger", "actual-100pct", 1), ("trigger", "actual-15000usd", 1)]
    assert ev.state["nlp-monthly"].thresholds == {
        "actual-50pct": ["alarm", 1], "actual-80pct": ["alarm", 1], "actual-100pct": ["alarm", 1], "actual-15000usd": ["alarm", 1],
    }


def test_forecast_fires_on_forecast_and_never_on_a_null_forecast():
    b = {"nlp-monthly": budget()}
    # Too little history: the cost asset's guard leaves the forecast null. Never fires.
    ev = evaluate(b, [row(1_000, forecast=None)], {}, NOW)
    assert fired(ev) == []
    ev = evaluate(b, [row(1_000, forecast=11_999)], ev.state, NOW)
    assert fired(ev) == []
    ev = evaluate(b, [row(1_000, forecast=12_000)], ev.state, NOW)
    assert fired(ev) == [("trigger", "forecast-120pct", 1)]
    # A null forecast later neither fires again nor resolves the alarm.
    ev = evaluate(b, [row(1_000, forecast=None)], ev.state, NOW)
    assert fired(ev) == [] and ev.state["nlp-monthly"].thresholds["forecast-120pct"] == ["alarm", 1]


def test_resolve_needs_hysteresis_and_a_new_crossing_is_a_new_episode():
    b = {"nlp-monthly": budget()}
    ev = evaluate(b, [row(1_000, forecast=12_500)], {}, NOW)
    ev = evaluate(b, [row(1_000, forecast=11_800)], ev.state, NOW)  # 98% of the line: no flapping
    assert fired(ev) == []
    ev = evaluate(b, [row(1_000, forecast=11_000)], ev.state, NOW)
    assert fired(ev) == [("resolve", "forecast-120pct", 1)]
    ev = evaluate(b, [row(1_000, forecast=12_100)], ev.state, NOW)
    assert fired(ev) == [("trigger", "forecast-120pct", 2)]


def test_month_rollover_rearms_every_threshold():
    b = {"nlp-monthly": budget()}
    ev = evaluate(b, [row(9_000)], {}, NOW)
    assert [k for _, k, _ in fired(ev)] == ["actual-50pct", "actual-80pct"]
    december = dt.datetime(2026, 12, 10, tzinfo=UTC)
    ev = evaluate(b, [row(9_000, start="2026-12-01", end="2027-01-01", day="2026-12-09")], ev.state, december)
    assert [k for _, k, _ in fired(ev)] == ["actual-50pct", "actual-80pct"]
    assert ev.state["nlp-monthly"].period_start == "2026-12-01"
    # A backfilled November row after that never re-arms backwards.
    ev2 = evaluate(b, [row(9_500)], ev.state, december)
    assert fired(ev2) == [] and ev2.state["nlp-monthly"].period_start == "2026-12-01"


def test_budget_raised_mid_period_resolves_from_the_configuration():
    ev = evaluate({"nlp-monthly": budget()}, [row(9_000)], {}, NOW)
    raised = {"nlp-monthly": budget(amount_usd=20_000)}
    # The status row still carries the old amount; the configuration wins.
    ev = evaluate(raised, [row(9_000)], ev.state, NOW)
    # 9,000 is under 95% of both new lines: 50% = $10,000 and 80% = $16,000.
    assert fired(ev) == [("resolve", "actual-50pct", 1), ("resolve", "actual-80pct", 1)]
    assert ev.state["nlp-monthly"].thresholds == {"actual-50pct": ["resolved", 1], "actual-80pct": ["resolved", 1]}


def test_resolve_notifications_are_optional():
    b = {"nlp-monthly": budget(notify_resolve=False)}
    ev = evaluate(b, [row(9_000)], {}, NOW)
    ev = evaluate({"nlp-monthly": budget(notify_resolve=False, amount_usd=50_000)}, [row(9_000)], ev.state, NOW)
    assert fired(ev) == []
    assert ev.state["nlp-monthly"].thresholds["actual-80pct"] == ["resolved", 1]


def test_enforcement_waits_for_the_grace_period_then_reverts_on_raise():
    b = {"nlp-monthly": budget(enforcement={"action": "throttle", "grace_period": "60m", "max_gpus": 8})}
    ev = evaluate(b, [row(10_500)], {}, NOW)
    assert ev.enforcement == [] and ev.state["nlp-monthly"].enforcement[0] == "pending"
    ev = evaluate(b, [row(10_600)], ev.state, NOW + dt.timedelta(minutes=59))
    assert ev.enforcement == []
    ev = evaluate(b, [row(10_700)], ev.state, NOW + dt.timedelta(minutes=60))
    assert [(e.kind, e.action, e.run_key) for e in ev.enforcement] == [("apply", "throttle", "nlp-monthly/2026-11-01/enforce-throttle/apply")]
    ev = evaluate(b, [row(10_900)], ev.state, NOW + dt.timedelta(hours=2))
    assert ev.enforcement == []
    raised = {"nlp-monthly": budget(amount_usd=30_000, enforcement={"action": "throttle", "grace_period": "60m", "max_gpus": 8})}
    ev = evaluate(raised, [row(10_900)], ev.state, NOW + dt.timedelta(hours=3))
    assert [(e.kind, e.run_key) for e in ev.enforcement] == [("revert", "nlp-monthly/2026-11-01/enforce-throttle/revert")]
    # Crossing the raised budget later is a second episode with keys of its own.
    ev = evaluate(raised, [row(31_000)], ev.state, NOW + dt.timedelta(hours=3))
    ev = evaluate(raised, [row(31_000)], ev.state, NOW + dt.timedelta(hours=5))
    assert [e.run_key for e in ev.enforcement] == ["nlp-monthly/2026-11-01/enforce-throttle#2/apply"]


def test_spend_back_under_during_grace_cancels_without_enforcing():
    b = {"nlp-monthly": budget(enforcement={"action": "block", "grace_period": "2h"})}
    ev = evaluate(b, [row(10_500)], {}, NOW)
    ev = evaluate({"nlp-monthly": budget(amount_usd=20_000, enforcement={"action": "block", "grace_period": "2h"})}, [row(10_500)], ev.state, NOW + dt.timedelta(hours=3))
    assert ev.enforcement == [] and ev.state["nlp-monthly"].enforcement is None


def test_enforcement_is_reverted_when_the_period_ends_by_the_clock():
    b = {"nlp-monthly": budget(enforcement={"action": "block"})}
    ev = evaluate(b, [row(10_500)], {}, NOW)
    assert [e.kind for e in ev.enforcement] == ["apply"]
    # December 1st, 00:10: yesterday's partition is still November's; the period is over.
    dec1 = dt.datetime(2026, 12, 1, 0, 10, tzinfo=UTC)
    ev = evaluate(b, [row(10_800, day="2026-11-30")], ev.state, dec1)
    assert [(e.kind, e.period_start) for e in ev.enforcement] == [("revert", "2026-11-01")]
    # ...and with no row at all.
    ev = evaluate(b, [row(10_500)], {}, NOW)
    ev = evaluate(b, [], ev.state, dec1)
    assert [(e.kind, e.period_start) for e in ev.enforcement] == [("revert", "2026-11-01")]


def test_rollover_reverts_and_action_change_reverts():
    b = {"nlp-monthly": budget(enforcement={"action": "block"})}
    ev = evaluate(b, [row(10_500)], {}, NOW)
    ev = evaluate(b, [row(100, start="2026-12-01", end="2027-01-01", day="2026-12-01")], ev.state, dt.datetime(2026, 12, 2, tzinfo=UTC))
    assert [(e.kind, e.period_start) for e in ev.enforcement] == [("revert", "2026-11-01")]
    ev = evaluate(b, [row(10_500)], {}, NOW)
    ev = evaluate({"nlp-monthly": budget()}, [row(10_500)], ev.state, NOW)  # enforcement back to alert
    assert [(e.kind, e.action) for e in ev.enforcement] == [("revert", "block")]
    again = evaluate({"nlp-monthly": budget()}, [row(10_500)], ev.state, NOW)
    assert again.enforcement == []
    # Back to block later: a new episode, so a run key not used before.
    back = evaluate(b, [row(10_500)], again.state, NOW)
    assert [e.run_key for e in back.enforcement] == ["nlp-monthly/2026-11-01/enforce-block#2/apply"]


def test_removed_budget_forgets_state_and_reverts():
    b = {"nlp-monthly": budget(enforcement={"action": "block"})}
    ev = evaluate(b, [row(10_500)], {}, NOW)
    ev = evaluate({}, [row(10_500)], ev.state, NOW)
    assert [e.kind for e in ev.enforcement] == ["revert"] and ev.state == {}


def test_cursor_round_trips_and_compresses_when_large():
    b = {f"b{i}": budget(name=f"b{i}") for i in range(3000)}
    rows = [StatusRow(f"b{i}", "2026-11-01", "2026-12-01", 10_000, 9_000, 90, None) for i in range(3000)]
    ev = evaluate(b, rows, {}, NOW)
    cursor = AlertCursor(42, NOW.timestamp(), ev.state)
    text = cursor.encode()
    assert len(text) < 40_000  # 3,000 budgets in one state share one entry
    assert AlertCursor.decode(text).encode() == text
    many = AlertCursor(42, NOW.timestamp(), {f"b{i}": ev.state["b7"] for i in range(20_000)}).encode()
    assert many.startswith("z:") and len(many) < 80_000  # about 9 bytes a budget before compression
    back = AlertCursor.decode(text)
    assert back.last_storage_id == 42 and back.budgets["b7"].thresholds == ev.state["b7"].thresholds
    assert evaluate(b, rows, back.budgets, NOW).alerts == []
    with pytest.raises(ValueError, match="version"):
        AlertCursor.decode('{"v": 99}')


def test_naive_now_is_refused():
    with pytest.raises(ValueError, match="timezone"):
        evaluate({}, [], {}, dt.datetime(2026, 11, 1))


def test_evaluation_leaves_the_previous_state_untouched():
    b = {"nlp-monthly": budget(enforcement={"action": "block"})}
    first = evaluate(b, [row(5_000)], {}, NOW)
    before = AlertCursor(budgets=first.state).encode()
    evaluate(b, [row(11_000)], first.state, NOW)
    assert AlertCursor(budgets=first.state).encode() == before


def test_the_vectorised_pass_changes_nothing_that_the_per_row_evaluation_would():
    """At fleet scale a tick evaluates in detail only the rows `quiet_rows` cannot rule
    out. Over random days (crossings, resolves, missing forecasts, a new period, a
    changed threshold, enforcement, unknown and removed budgets) both give the same
    events and the same state."""
    import random

    from gpu_ops.domain.alerts.state import StatusTable, ThresholdPlan

    rng = random.Random(11)
    n = 300

    def config(version: int) -> dict[str, Budget]:
        out = {}
        for i in range(n - version * 5):  # later versions drop a few budgets
            ths = [{"percent": 50}, {"percent": 80 + version * 5}, {"percent": 120, "basis": "forecast"}]
            kw = {"enforcement": {"action": "block", "grace_period": "1h"}} if i % 7 == 0 else {}
            out[f"b{i}"] = budget(name=f"b{i}", thresholds=ths, amount_usd=1_000 + 10 * (i % 3), **kw)
        return out

    full, fast, quiet_counts = {}, {}, []
    for day in range(40):
        budgets = config(day // 15)
        start, end = ("2026-11-01", "2026-11-30") if day < 25 else ("2026-12-01", "2026-12-31")
        now = NOW + dt.timedelta(hours=6 * day)
        raw = [
            (f"b{i}", start, end, 1_000.0, spend, spend / 10, None if rng.random() < 0.2 else spend * rng.uniform(0.8, 1.6), f"d{day}", None)
            for i in range(n + 3)  # three rows of budgets that do not exist
            for spend in [rng.choice([100.0, 490.0, 500.0, 760.0, 800.0, 850.0, 1_200.0]) if rng.random() < 0.3 else 300.0 + (i % 5) * 150]
        ]
        table = StatusTable(raw)
        want = evaluate(budgets, [table.row(i) for i in range(len(table))], full, now)
        quiet = table.quiet_rows(ThresholdPlan.build(budgets.values()), fast)
        got = evaluate(budgets, [table.row(i) for i in range(len(table)) if not quiet[i]], fast, now, unchanged=[table.names[i] for i in range(len(table)) if quiet[i]])
        assert (got.alerts, got.enforcement) == (want.alerts, want.enforcement), day
        assert _states(got.state) == _states(want.state), day
        quiet_counts.append(int(quiet.sum()))
        full, fast = want.state, AlertCursor.decode(AlertCursor(budgets=got.state).encode()).budgets
    assert sorted(quiet_counts)[20] > n // 3  # the point: on most days most rows need no detail


def test_the_fleet_evaluation_gives_the_per_row_events_in_order_and_states():
    """`evaluate_table` (quiet rows skipped, fresh starts in numpy, the rest row by row)
    against `evaluate` of every row, over random days: a first evaluation, crossings and
    resolves, missing forecasts, new periods (with and without enforcement in force),
    changed thresholds, unknown and removed budgets, shared threshold objects."""
    import random

    from gpu_ops.domain.alerts.state import StatusTable, ThresholdPlan, evaluate_table
    from gpu_ops.domain.config import Threshold

    rng = random.Random(5)
    n = 300
    shared = [Threshold(percent=50), Threshold(percent=80), Threshold(percent=120, basis="forecast"), Threshold(absolute_usd=900, severity="info")]

    def config(version: int) -> dict[str, Budget]:
        out = {}
        for i in range(n - version * 5):
            ths = shared if i % 2 else [{"percent": 50}, {"percent": 80 + version * 5}, {"percent": 120, "basis": "forecast"}]
            kw = {"enforcement": {"action": "throttle", "max_gpus": 2, "grace_period": "0s" if i % 3 else "1h"}} if i % 7 == 0 else {}
            out[f"b{i}"] = budget(name=f"b{i}", thresholds=ths, amount_usd=1_000 + 10 * (i % 3), **kw)
        return out

    full, fast = {}, {}
    starts = [("2026-11-01", "2026-11-30")] * 12 + [("2026-12-01", "2026-12-31")] * 12 + [("2027-01-01", "2027-01-31")] * 12
    for day, (start, end) in enumerate(starts):
        budgets = config(day // 15)
        now = NOW + dt.timedelta(hours=6 * day)
        raw = [
            (f"b{i}", start, end, 1_000.0, spend, spend / 10, None if rng.random() < 0.2 else spend * rng.uniform(0.8, 1.6), f"d{day}", None)
            for i in range(n + 3)
            for spend in [rng.choice([100.0, 490.0, 500.0, 760.0, 800.0, 850.0, 950.0, 1_200.0]) if rng.random() < 0.4 else 300.0 + (i % 5) * 150]
        ]
        table = StatusTable(raw)
        want = evaluate(budgets, [table.row(i) for i in range(len(table))], full, now)
        got, _ = evaluate_table(ThresholdPlan.build(budgets.values()), table, fast, now)
        assert got.alerts == want.alerts, day
        assert got.enforcement == want.enforcement, day
        assert _states(got.state) == _states(want.state), day
        full, fast = want.state, AlertCursor.decode(AlertCursor(budgets=got.state).encode()).budgets


def _states(state) -> dict:
    return {name: s.to_json() for name, s in state.items() if not s.empty}
