"""Budgets worked out by hand: $1,000 a month; each day's spend is one on-demand A100
interval of 40 GPUs at $4/GPU-hour from 01:00, so $D of spend is D/160 hours that day."""

from __future__ import annotations

import datetime as dt
import json

import pandas as pd
import pytest

from gpu_ops.domain.config import DEMO_CONFIG, Budget
from gpu_ops.flows.cost.budgets import DAILY_COLUMNS, SpendBook, check_outcome, daily_costs, evaluate_budget, evaluate_budgets, period_bounds
from gpu_ops.flows.cost.pipeline import price_window

from .helpers import MATRIX, raw, row


def spend_on(day: str, dollars: float, **kw) -> dict:
    start = pd.Timestamp(day, tz="UTC") + pd.Timedelta(hours=1)
    end = start + pd.Timedelta(hours=dollars / 160)
    return row(start.isoformat(), end.isoformat(), gpu_count=40, **kw)


def priced(rows, first="2026-09-01", last="2026-11-30"):
    end = pd.Timestamp(last, tz="UTC") + pd.Timedelta(days=1)
    return price_window(raw(rows), None, MATRIX, pd.Timestamp(first, tz="UTC"), end, end).rows


def days(first="2026-09-01", last="2026-11-30"):
    a, b = dt.date.fromisoformat(first), dt.date.fromisoformat(last)
    return [a + dt.timedelta(days=i) for i in range((b - a).days + 1)]


def book(rows, idle="row", label_keys=(), **window):
    """The daily table of every day of the window, as the budget asset reads it."""
    return SpendBook(daily_costs(rows, days(**window), label_keys), idle)


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
    labels = sorted(budget.scope.labels)
    return evaluate_budget(budget, book(rows, label_keys=labels), d, as_of or pd.Timestamp(d + dt.timedelta(days=1), tz="UTC"))


def test_crossing_50_80_100_and_120_percent():
    s1 = status("2026-10-01")
    assert s1["spend_usd"] == pytest.approx(500) and s1["percent_used"] == pytest.approx(50)
    assert s1["thresholds_crossed"] == ["actual-50pct"] and s1["status"] == "ok"  # 50% is info only
    assert s1["severity"] == "info"

    s2 = status("2026-10-02")
    assert s2["spend_usd"] == pytest.approx(800)  # vision's $999 is out of scope
    assert s2["thresholds_crossed"] == ["actual-50pct", "actual-80pct"] and s2["status"] == "warning" and s2["severity"] == "warning"

    s3 = status("2026-10-03")
    assert s3["spend_usd"] == pytest.approx(1000) and s3["status"] == "exceeded" and s3["severity"] == "critical"
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
    assert evaluate_budget(BUDGET, book(rows, idle="row"), d, as_of)["spend_usd"] == pytest.approx(96)
    assert evaluate_budget(BUDGET, book(rows, idle="share"), d, as_of)["spend_usd"] == pytest.approx(96 + 648 * 96 / 120)
    everything = Budget(name="all", amount_usd=10000)
    assert evaluate_budget(everything, book(rows, idle="row"), d, as_of)["spend_usd"] == pytest.approx(768)


# --------------------------------------------------------------------------- the daily table


def test_daily_table_has_one_row_per_scope_combination_and_day_and_marks_empty_days():
    rows = priced([
        spend_on("2026-10-01", 100, project="a", labels='{"tier": "gold", "pod-hash": "x1"}'),
        spend_on("2026-10-01", 50, project="a", labels='{"tier": "gold", "pod-hash": "x2"}'),  # same scope combination
        spend_on("2026-10-01", 30, project="b"),
        spend_on("2026-10-03", 20, project="b"),
    ])
    daily = daily_costs(rows, days("2026-10-01", "2026-10-03"), ["tier"])
    assert list(daily.columns) == ["day", "kind", "team", "project", "namespace", "cost_center", "labels", "label_keys", "intervals", "gpu_hours", "cost_usd", "on_demand_usd"]
    day1 = daily[daily["day"] == dt.date(2026, 10, 1)].set_index("project")
    assert len(day1) == 2  # two intervals of project a fold into one row: labels keep only scoped keys
    assert day1.loc["a", "labels"] == '{"tier": "gold"}' and day1.loc["a", "intervals"] == 2
    assert day1.loc["a", "cost_usd"] == pytest.approx(150) and day1.loc["b", "cost_usd"] == pytest.approx(30)
    empty = daily[daily["day"] == dt.date(2026, 10, 2)]
    assert empty["kind"].tolist() == ["none"] and empty["cost_usd"].tolist() == [0.0]  # computed, no usage: not missing
    assert daily["cost_usd"].sum() == pytest.approx(rows["cost_usd"].sum())


def test_a_budget_period_with_a_missing_day_reports_it_and_never_reads_it_as_zero():
    rows = priced([spend_on(f"2026-10-{d:02d}", 100) for d in (1, 2, 3, 4, 5)])
    kept = [dt.date(2026, 10, d) for d in (1, 2, 4, 5)]  # the 3rd was never materialized
    daily = daily_costs(rows, days("2026-10-01", "2026-10-05"), [])
    daily = daily[daily["day"].isin(kept)]
    b = BUDGET.model_copy(update={"forecast_min_history": "4d"})
    s = evaluate_budget(b, SpendBook(daily), dt.date(2026, 10, 5), pd.Timestamp("2026-10-06", tz="UTC"))
    assert s["days_missing"] == 1 and s["_missing"] == [dt.date(2026, 10, 3)]
    assert s["spend_usd"] == pytest.approx(400)  # the days present, not a zero for the 3rd
    # 4 days of history present (not 5): $100/day carried over the missing day and the 26 left.
    assert s["forecast_usd"] == pytest.approx(400 + 100 * (26 + 1))
    early = evaluate_budget(b, SpendBook(daily), dt.date(2026, 10, 4), pd.Timestamp("2026-10-05", tz="UTC"))
    assert early["days_missing"] == 1 and early["forecast_usd"] is None  # 3 days present < 4d: withheld
    # The whole table: the column, and the days named for the check.
    table = evaluate_budgets([b, Budget(name="all", amount_usd=1e6)], daily, dt.date(2026, 10, 5), pd.Timestamp("2026-10-06", tz="UTC"))
    assert table["days_missing"].tolist() == [1, 1]
    from gpu_ops.flows.cost.budgets import missing_days_outcome

    passed, description, missing = missing_days_outcome(table)
    assert not passed and missing == ["2026-10-03"] and "2026-10-03" in description and "nlp-monthly" in description
    # Days before the first day data can exist (the first partition) are not expected.
    late = evaluate_budget(b, SpendBook(daily), dt.date(2026, 10, 5), pd.Timestamp("2026-10-06", tz="UTC"), expected_from=dt.date(2026, 10, 4))
    assert late["days_missing"] == 0


def test_a_label_scope_the_daily_table_was_not_built_for_counts_its_days_as_missing():
    rows = priced([spend_on("2026-10-01", 100, labels='{"tier": "gold"}'), spend_on("2026-10-02", 100, labels='{"tier": "gold"}')])
    gold = Budget(name="gold", amount_usd=1000, scope={"labels": {"tier": "gold"}})
    old = daily_costs(rows[rows["day"].dt.date == dt.date(2026, 10, 1)], [dt.date(2026, 10, 1)], [])  # before the gold budget existed
    new = daily_costs(rows[rows["day"].dt.date == dt.date(2026, 10, 2)], [dt.date(2026, 10, 2)], ["tier"])
    s = evaluate_budget(gold, SpendBook(pd.concat([old, new])), dt.date(2026, 10, 2), pd.Timestamp("2026-10-03", tz="UTC"))
    assert s["spend_usd"] == pytest.approx(100) and s["_missing"] == [dt.date(2026, 10, 1)]


def _row_level_spend(budget, rows, day, idle):
    """The former computation, straight from row-level pieces: the reference."""
    start, _ = period_bounds(budget, day)
    d = rows["day"].dt.date
    rows = rows[(d >= start) & (d <= day)]
    if not budget.scope.as_filters():
        return rows["cost_usd"].sum()
    alloc = rows[rows["kind"] != "idle"]
    scope = alloc[alloc["team"] == budget.scope.team]
    spend = scope["cost_usd"].sum()
    if idle == "share":
        for _day, part in rows.groupby(rows["day"].dt.date):
            a = part[part["kind"] != "idle"]
            if a["cost_usd"].sum() > 0:
                spend += part.loc[part["kind"] == "idle", "cost_usd"].sum() * a.loc[a["team"] == budget.scope.team, "cost_usd"].sum() / a["cost_usd"].sum()
    return spend


@pytest.mark.parametrize("idle", ["row", "share"])
def test_demo_month_from_the_daily_table_equals_the_row_level_sum_to_the_cent(idle):
    from gpu_ops.domain.config import load_config
    from gpu_ops.flows.cost.pricing import PriceMatrix
    from gpu_ops.flows.cost.inventory import load_inventory
    from gpu_ops.domain.cost.sources import SourceSet
    from gpu_ops.flows.cost.pipeline import load_raw

    cfg = load_config(DEMO_CONFIG)  # the demo's budgets, over the demo's October
    demo = DEMO_CONFIG.parent
    start, end = pd.Timestamp("2026-10-01", tz="UTC"), pd.Timestamp("2026-11-01", tz="UTC")
    rows = price_window(load_raw(SourceSet(usage_files=[str(demo / "usage" / "*.csv")]))[0], load_inventory(SourceSet(inventory_files=[str(demo / "inventory.csv")])), PriceMatrix.from_table(cfg.prices), start, end, end).rows
    budgets = [*cfg.budgets, Budget(name="everything", amount_usd=50000)]
    daily = pd.concat([daily_costs(rows[rows["day"].dt.date == d], [d], []) for d in days("2026-10-01", "2026-10-31")])
    for day in (1, 10, 30):
        d = dt.date(2026, 10, day)
        table = evaluate_budgets(budgets, daily, d, pd.Timestamp(d + dt.timedelta(days=1), tz="UTC"), idle).set_index("budget")
        for b in budgets:
            ref = _row_level_spend(b, rows, d, idle)
            assert round(table.loc[b.name, "spend_usd"], 2) == round(ref, 2) and ref > 0
            assert table.loc[b.name, "days_missing"] == 0


def test_no_daily_partition_at_all_is_every_day_missing_not_zero_spend():
    # What the IO manager hands over when gpu_cost_daily was never materialized: its empty typed table.
    empty = pd.DataFrame({c: pd.Series([], dtype=object) for c in DAILY_COLUMNS})
    table = evaluate_budgets([BUDGET], empty, dt.date(2026, 10, 5), pd.Timestamp("2026-10-06", tz="UTC"))
    assert table["days_missing"].tolist() == [5]
    assert table["spend_usd"].tolist() == [0.0] and table["forecast_usd"].isna().all()


def test_a_frame_that_is_neither_the_daily_table_nor_priced_usage_is_refused():
    # Guessing would read "no usage" into it: every day present at zero cost.
    with pytest.raises(ValueError, match="gpu_cost_daily"):
        evaluate_budgets([BUDGET], pd.DataFrame(), dt.date(2026, 10, 5), pd.Timestamp("2026-10-06", tz="UTC"))


def test_the_daily_table_keeps_only_the_keys_budgets_scope_on_whatever_the_days_keys():
    """Issue 19: with independent team, project, namespace and cost center, the product of
    every key is as big as the day; kept at the budgets' grain it is one row per team."""
    from gpu_ops.flows.cost.budgets import scope_keys

    rows = priced([
        spend_on("2026-10-01", 10 + i, project=f"p{i}", namespace=f"ns{i % 7}", cost_center=f"cc{i % 5}", team=("nlp" if i % 2 else "vision"), pod=f"pod{i}")
        for i in range(40)
    ])
    budgets = [BUDGET, Budget(name="all", amount_usd=1e6)]
    assert scope_keys(budgets) == ["team"]
    full = daily_costs(rows, days("2026-10-01", "2026-10-01"))
    lean = daily_costs(rows, days("2026-10-01", "2026-10-01"), [], scope_keys(budgets))
    assert len(full) == 40 and len(lean) == 2  # one row per team, not per key combination
    assert set(lean["project"]) == {""} and lean["cost_usd"].sum() == pytest.approx(full["cost_usd"].sum())
    day = dt.date(2026, 10, 1)
    at = pd.Timestamp("2026-10-02", tz="UTC")
    assert evaluate_budget(BUDGET, SpendBook(lean), day, at)["spend_usd"] == pytest.approx(evaluate_budget(BUDGET, SpendBook(full), day, at)["spend_usd"])
    # A budget on a key the day was not kept at sees the day as missing, never as $0.
    by_project = Budget(name="p1", amount_usd=100, scope={"project": "p1"})
    s = evaluate_budget(by_project, SpendBook(lean), day, at)
    assert s["_missing"] == [day] and s["spend_usd"] == 0
