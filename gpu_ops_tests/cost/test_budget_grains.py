"""Budgets read gpu_cost_daily summed per budget grain by the database (SQLite and a real
PostgreSQL): the same spend, forecast and missing days as from the whole table and as
the row-level sum, and a read that grows with the values of the budgets' own keys, not
with the product of the table's keys."""

from __future__ import annotations

import datetime as dt
import json

import numpy as np
import pandas as pd
import pytest

from gpu_ops.domain.config import Budget
from gpu_ops.flows.cost.budgets import daily_costs, evaluate_budget_days, scope_keys, scope_label_keys
from gpu_ops.domain.cost.columns import BUDGET_READ_KEEP, BUDGET_READ_SUMS, budget_groupings
from gpu_ops.storage.tables import TableStore

DAYS = [dt.date(2026, 10, 1) + dt.timedelta(days=i) for i in range(4)]
BUDGETS = [
    Budget(name="everything", amount_usd=1e6),
    Budget(name="team-1", amount_usd=1e4, scope={"team": "team-1"}),
    Budget(name="proj-3", amount_usd=1e4, scope={"project": "proj-3"}),
    Budget(name="ns-2", amount_usd=1e4, scope={"namespace": "ns-2"}),
    Budget(name="team-0-gold", amount_usd=1e4, scope={"team": "team-0", "labels": {"tier": "gold"}}),
    Budget(name="app-x", amount_usd=1e4, scope={"labels": {"app": "x"}}),
    Budget(name="nobody", amount_usd=1e4, scope={"team": "no-such-team"}),
]


def pieces(n: int, seed: int = 0, projects: int = 40) -> pd.DataFrame:
    """Priced pieces whose team, project, namespace, cost center and labels vary
    independently, with idle rows, over DAYS (one day without any usage)."""
    rng = np.random.default_rng(seed)
    used = DAYS[:2] + DAYS[3:]  # DAYS[2] had no usage at all
    day = rng.choice(len(used), n)
    tier = rng.choice(["gold", "silver", ""], n)
    app = rng.choice(["x", "y"], n)
    labels = [json.dumps({k: v for k, v in (("tier", t), ("app", a)) if v}) for t, a in zip(tier, app, strict=True)]
    alloc = pd.DataFrame({
        "day": pd.to_datetime([used[i] for i in day], utc=True),
        "kind": "allocated",
        "team": [f"team-{i}" for i in rng.integers(0, 5, n)],
        "project": [f"proj-{i}" for i in rng.integers(0, projects, n)],
        "namespace": [f"ns-{i}" for i in rng.integers(0, 7, n)],
        "cost_center": [f"cc-{i}" for i in rng.integers(0, 3, n)],
        "labels": labels,
        "gpu_hours": rng.random(n) * 3,
        "cost_usd": np.round(rng.random(n) * 40, 6),
        "on_demand_usd": rng.random(n) * 50,
    })
    idle = pd.DataFrame({
        "day": pd.to_datetime(used, utc=True), "kind": "idle", "team": "", "project": "", "namespace": "", "cost_center": "", "labels": "{}",
        "gpu_hours": 5.0, "cost_usd": [123.25, 77.5, 10.0], "on_demand_usd": 0.0,
    })
    return pd.concat([alloc, idle], ignore_index=True)


def row_level_spend(budget: Budget, rows: pd.DataFrame, day: dt.date, idle: str) -> float:
    """The reference: the budget's spend summed from the pieces themselves."""
    rows = rows[rows["day"].dt.date <= day]
    filters = budget.scope.as_filters()
    if not filters:
        return float(rows["cost_usd"].sum())
    alloc = rows[rows["kind"] != "idle"]
    mine = np.ones(len(alloc), bool)
    for k, v in filters.items():
        values = alloc["labels"].map(lambda s, k=k: json.loads(s).get(k[len("label:"):], "")) if k.startswith("label:") else alloc[k]
        mine &= (values == v).to_numpy()
    spend = float(alloc.loc[mine, "cost_usd"].sum())
    if idle == "share":
        for d, part in rows.groupby(rows["day"].dt.date):
            a = part["kind"] != "idle"
            total = part.loc[a, "cost_usd"].sum()
            here = alloc.loc[mine & (alloc["day"].dt.date == d).to_numpy(), "cost_usd"].sum()
            spend += part.loc[~a, "cost_usd"].sum() * here / total if total > 0 else 0.0
    return spend


def write_daily(store: TableStore, rows: pd.DataFrame) -> pd.DataFrame:
    daily = daily_costs(rows, DAYS, scope_label_keys(BUDGETS), scope_keys(BUDGETS))
    for d in DAYS:
        store.write("gpu_cost_daily", daily[daily["day"] == d], partition_keys=[d.isoformat()])
    return daily


def grouped(store: TableStore) -> pd.DataFrame:
    groupings = budget_groupings(b.scope.as_filters() for b in BUDGETS)
    keys = [d.isoformat() for d in DAYS]
    return store.read_grouped("gpu_cost_daily", groupings, list(BUDGET_READ_SUMS), keep=list(BUDGET_READ_KEEP), partition_keys=keys)


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def store(request, tmp_path):
    if request.param == "sqlite":
        yield TableStore(f"sqlite:///{tmp_path / 'costs.db'}")
        return
    yield TableStore(request.getfixturevalue("pg_url"))


@pytest.mark.parametrize("idle", ["row", "share"])
def test_budgets_from_the_grain_read_equal_the_whole_table_and_the_row_level_sum(store, idle):
    rows = pieces(3_000)
    write_daily(store, rows)
    whole = store.read("gpu_cost_daily", partition_keys=[d.isoformat() for d in DAYS]).drop(columns=["partition_key"])
    by_grain = grouped(store)
    assert set(by_grain["grouping"]) == {"", "label:app", "label:tier,team", "namespace", "project", "team"}
    days = [(d, pd.Timestamp(d + dt.timedelta(days=1), tz="UTC")) for d in DAYS]
    from_whole = evaluate_budget_days(BUDGETS, whole, days, idle)
    from_grain = evaluate_budget_days(BUDGETS, by_grain.drop(columns=["partition_key"]), days, idle)
    for d, a, b in zip(DAYS, from_whole, from_grain, strict=True):
        a, b = a.set_index("budget"), b.set_index("budget")
        for budget in BUDGETS:
            ref = row_level_spend(budget, rows, d, idle)
            assert b.loc[budget.name, "spend_usd"] == pytest.approx(ref, abs=1e-6), (d, budget.name)
            assert a.loc[budget.name, "spend_usd"] == pytest.approx(ref, abs=1e-6), (d, budget.name)
            assert b.loc[budget.name, "forecast_usd"] == pytest.approx(a.loc[budget.name, "forecast_usd"], abs=1e-6, nan_ok=True)
            assert b.loc[budget.name, "days_missing"] == a.loc[budget.name, "days_missing"] == 0
            assert b.loc[budget.name, "status"] == a.loc[budget.name, "status"]
    last = from_grain[-1].set_index("budget")
    assert last.loc["team-1", "spend_usd"] > 0 and last.loc["app-x", "spend_usd"] > 0 and last.loc["nobody", "spend_usd"] == 0


def test_the_grain_read_grows_with_the_budgets_keys_not_with_unrelated_keys(store):
    few = write_daily(store, pieces(3_000, projects=40))
    few_read = grouped(store)
    many = write_daily(store, pieces(3_000, projects=400))  # ten times the projects, no project budget scopes more
    many_read = grouped(store)
    assert len(many) > len(few)  # the stored table is at the union of the scope keys
    for g in ("", "team", "namespace", "label:app", "label:tier,team"):
        assert len(many_read[many_read["grouping"] == g]) == len(few_read[few_read["grouping"] == g]), g
    # The whole bill per day is the same sum either way.
    by_day = many_read[many_read["grouping"] == ""].groupby("day")["cost_usd"].sum()
    assert by_day.sum() == pytest.approx(many["cost_usd"].sum())


def test_a_grain_that_was_not_read_is_an_error_not_a_zero(store):
    write_daily(store, pieces(500))
    only_total = store.read_grouped("gpu_cost_daily", {"": []}, ["cost_usd"], keep=list(BUDGET_READ_KEEP), partition_keys=[d.isoformat() for d in DAYS])
    with pytest.raises(ValueError, match="without the budget grain 'team'"):
        evaluate_budget_days(BUDGETS[:2], only_total.drop(columns=["partition_key"]), [(DAYS[-1], pd.Timestamp(DAYS[-1], tz="UTC"))])
