"""Budgets worked out by hand: $1,000 a month; each day's spend is one on-demand A100
interval of 40 GPUs at $4/GPU-hour from 01:00, so $D of spend is D/160 hours that day."""

from __future__ import annotations

import datetime as dt
import json

import pandas as pd
import pytest

from gpu_ops.config import Budget
from gpu_ops.cost.budgets import check_outcome, evaluate_budget, evaluate_budgets, period_bounds
from gpu_ops.cost.pipeline import price_window

from .helpers import MATRIX, raw, row


def spend_on(day: str, dollars: float, **kw) -> dict:
    start = pd.Timestamp(day, tz="UTC") + pd.Timedelta(hours=1)
    end = start + pd.Timedelta(hours=dollars / 160)
    return row(start.isoformat(), end.isoformat(), gpu_count=40, **kw)


def priced(rows, first="2026-09-01", last="2026-11-30"):
    end = pd.Timestamp(last, tz="UTC") + pd.Timedelta(days=1)
    return price_window(raw(rows), None, MATRIX, pd.Timestamp(first, tz="UTC"), end, end).rows


BUDGET = Budget(
    name="nlp-monthly",
    scope={"team": "nlp"},
    amount_usd=1000,
    thresholds=[
        {"percent": 50, "severity": "info"},
        {"percent": 80},
        {"percent": 100},
        {"percent": 120},
        {"percent": 120, "basis": "forecast"},
        {"absolute_usd": 900},
    ],
)
ROWS = priced([spend_on("2026-10-01", 500), spend_on("2026-10-02", 300), spend_on("2026-10-03", 200), spend_on("2026-10-04", 200), spend_on("2026-10-02", 999, team="vision")])


def status(day: str, budget=BUDGET, rows=ROWS, as_of=None):
    d = dt.date.fromisoformat(day)
    return evaluate_budget(budget, rows, d, as_of or pd.Timestamp(d + dt.timedelta(days=1), tz="UTC"))


def test_crossing_50_80_100_and_120_percent():
    s1 = status("2026-10-01")
    assert s1["spend_usd"] == pytest.approx(500) and s1["percent_used"] == pytest.approx(50)
    assert s1["thresholds_crossed"] == ["actual-50pct"] and s1["status"] == "ok"  # 50% is info only

    s2 = status("2026-10-02")
    assert s2["spend_usd"] == pytest.approx(800)  # vision's $999 is out of scope
    assert s2["thresholds_crossed"] == ["actual-50pct", "actual-80pct"] and s2["status"] == "warning"

    s3 = status("2026-10-03")
    assert s3["spend_usd"] == pytest.approx(1000) and s3["status"] == "exceeded"
    assert {"actual-100pct", "actual-900usd"} <= set(s3["thresholds_crossed"]) and "actual-120pct" not in s3["thresholds_crossed"]

    s4 = status("2026-10-04")
    assert s4["percent_used"] == pytest.approx(120)
    assert "actual-120pct" in s4["thresholds_crossed"]


def test_forecast_is_withheld_until_enough_history_then_crosses():
    # Day 2: 2 days of history < 3d: no forecast, however steep the run-rate.
    s2 = status("2026-10-02")
    assert s2["forecast_usd"] is None and "forecast-120pct" not in s2["thresholds_crossed"]
    # Day 3: $1000 over 3 days; 28 days left -> 1000 + 1000/3 × 28.
    s3 = status("2026-10-03")
    assert s3["forecast_usd"] == pytest.approx(1000 + 1000 / 3 * 28)
    assert "forecast-120pct" in s3["thresholds_crossed"]


def test_forecast_waits_when_data_starts_after_the_period_does():
    rows = priced([spend_on("2026-10-10", 100), spend_on("2026-10-11", 100)])
    s = status("2026-10-11", rows=rows)
    assert s["spend_usd"] == pytest.approx(200)
    assert s["forecast_usd"] is None  # 2 days of history, although 11 days of the period passed
    later = priced([spend_on(f"2026-10-{d:02d}", 100) for d in range(10, 14)])
    s13 = status("2026-10-13", rows=later)
    # history from the day of the first usage (the 10th) to the end of the 13th: 4 days; 18 left
    assert s13["forecast_usd"] == pytest.approx(400 + 400 / 4 * 18)


def test_period_rolls_over_on_the_reset_day_and_thresholds_rearm():
    b = BUDGET.model_copy(update={"reset_day": 15})
    rows = priced([spend_on("2026-10-14", 900), spend_on("2026-10-15", 100)])
    before = status("2026-10-14", budget=b, rows=rows)
    assert (before["period_start"], before["period_end"]) == (dt.date(2026, 9, 15), dt.date(2026, 10, 14))
    assert before["spend_usd"] == pytest.approx(900) and "actual-80pct" in before["thresholds_crossed"]
    after = status("2026-10-15", budget=b, rows=rows)
    assert (after["period_start"], after["period_end"]) == (dt.date(2026, 10, 15), dt.date(2026, 11, 14))
    assert after["spend_usd"] == pytest.approx(100) and after["thresholds_crossed"] == [] and after["status"] == "ok"


@pytest.mark.parametrize(
    "period, reset, day, expected",
    [
        ("monthly", 1, "2026-12-31", ("2026-12-01", "2027-01-01")),
        ("monthly", 1, "2027-01-01", ("2027-01-01", "2027-02-01")),
        ("monthly", 15, "2027-01-03", ("2026-12-15", "2027-01-15")),
        ("weekly", 1, "2026-10-14", ("2026-10-12", "2026-10-19")),  # a Wednesday; weeks start Monday
        ("weekly", 3, "2026-10-14", ("2026-10-14", "2026-10-21")),
        ("weekly", 7, "2026-10-14", ("2026-10-11", "2026-10-18")),
        ("daily", 1, "2026-10-14", ("2026-10-14", "2026-10-15")),
    ],
)
def test_period_bounds(period, reset, day, expected):
    b = Budget(name="b", amount_usd=1, period=period, reset_day=reset)
    start, end = period_bounds(b, dt.date.fromisoformat(day))
    assert (start.isoformat(), end.isoformat()) == expected


def test_unscoped_budget_covers_everything_and_table_has_the_contract_columns():
    everything = Budget(name="all", amount_usd=5000, thresholds=[{"percent": 50}])
    table = evaluate_budgets([BUDGET, everything], ROWS, dt.date(2026, 10, 4), pd.Timestamp("2026-10-05", tz="UTC"))
    for col in ("budget", "period_start", "period_end", "amount_usd", "spend_usd", "percent_used", "forecast_usd", "status", "thresholds_crossed", "scope", "as_of"):
        assert col in table.columns
    t = table.set_index("budget")
    assert t.loc["all", "spend_usd"] == pytest.approx(1200 + 999)
    assert json.loads(t.loc["nlp-monthly", "scope"]) == {"team": "nlp"}
    assert t.loc["all", "thresholds_crossed"] == []


def test_scopes_by_project_and_label():
    rows = priced([spend_on("2026-10-01", 100, project="a", labels='{"tier": "gold"}'), spend_on("2026-10-01", 50, project="b")])
    by_project = Budget(name="pa", amount_usd=1000, scope={"project": "a"})
    by_label = Budget(name="gold", amount_usd=1000, scope={"labels": {"tier": "gold"}})
    assert status("2026-10-01", budget=by_project, rows=rows)["spend_usd"] == pytest.approx(100)
    assert status("2026-10-01", budget=by_label, rows=rows)["spend_usd"] == pytest.approx(100)


def test_budget_check_warns_at_warning_and_errs_when_exceeded():
    def table(*statuses):
        return pd.DataFrame({"budget": [f"b{i}" for i in range(len(statuses))], "status": list(statuses)})

    assert check_outcome(table("ok", "ok")) == (True, "warn", "all budgets ok")
    assert check_outcome(table("ok", "warning")) == (False, "warn", "warning: b1")
    assert check_outcome(table("exceeded", "warning")) == (False, "error", "exceeded: b0; warning: b1")
    assert check_outcome(table())[0]



def test_idle_share_mode_adds_the_scopes_share_of_idle_cost():
    from .helpers import inventory

    fleet = inventory([{"node": "n1", "instance_type": "p4de.24xlarge", "capacity_type": "on-demand", "region": "", "start": "2026-10-01T00:00:00Z", "end": ""}])
    use = raw([
        row("2026-10-02T00:00:00Z", "2026-10-02T12:00:00Z", team="nlp", gpu_count=2),  # $96
        row("2026-10-02T06:00:00Z", "2026-10-02T12:00:00Z", team="vision", gpu_count=1),  # $24
    ])
    day = pd.Timestamp("2026-10-02", tz="UTC")
    rows = price_window(use, fleet, MATRIX, day, day + pd.Timedelta(days=1), day + pd.Timedelta(days=1)).rows
    d = dt.date(2026, 10, 2)
    as_of = pd.Timestamp("2026-10-03", tz="UTC")
    # Fleet $768, idle $648: shared 96:24 in share mode; whole-bill budget sees it all either way.
    assert evaluate_budget(BUDGET, rows, d, as_of, idle="row")["spend_usd"] == pytest.approx(96)
    assert evaluate_budget(BUDGET, rows, d, as_of, idle="share")["spend_usd"] == pytest.approx(96 + 648 * 96 / 120)
    everything = Budget(name="all", amount_usd=10000)
    assert evaluate_budget(everything, rows, d, as_of, idle="row")["spend_usd"] == pytest.approx(768)
