"""Budgets: recurring periods with a reset day, spend to date, forecast, thresholds.

- Periods recur (Kubecost): monthly from ``reset_day`` of the month, weekly from ISO
  weekday ``reset_day``, daily. Each period is evaluated on its own, so thresholds
  re-arm every period (the gpuautoscaler seed never re-armed after the first month).
- Thresholds are percent of the amount (above 100 allowed) or absolute dollars, on
  actual or forecast spend (AWS Budgets).
- The forecast is a linear run-rate over the history observed in the period and is
  withheld (``None``) until ``forecast_min_history`` of it exists: one hour says nothing.
- Status: ``exceeded`` once actual spend reaches the amount; ``warning`` when a crossed
  threshold is of warning or critical severity; otherwise ``ok``.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any, Sequence

import numpy as np
import pandas as pd

from gpu_ops.config import Budget, parse_duration
from gpu_ops.cost.attribution import label_values, utc

BUDGET_COLUMNS = (
    "budget", "period_start", "period_end", "amount_usd", "spend_usd", "percent_used", "forecast_usd",
    "status", "thresholds_crossed", "scope", "as_of", "period",
)


def period_bounds(budget: Budget, day: dt.date) -> tuple[dt.date, dt.date]:
    """``[start, end)`` of the period containing ``day`` (end exclusive)."""
    if budget.period == "daily":
        return day, day + dt.timedelta(days=1)
    if budget.period == "weekly":
        start = day - dt.timedelta(days=(day.isoweekday() - budget.reset_day) % 7)
        return start, start + dt.timedelta(days=7)
    r = budget.reset_day
    if day.day >= r:
        start = day.replace(day=r)
    else:
        y, m = (day.year, day.month - 1) if day.month > 1 else (day.year - 1, 12)
        start = dt.date(y, m, r)
    y, m = (start.year, start.month + 1) if start.month < 12 else (start.year + 1, 1)
    return start, dt.date(y, m, r)


def scope_mask(rows: pd.DataFrame, filters: dict[str, str]) -> np.ndarray:
    mask = np.ones(len(rows), bool)
    for key, value in filters.items():
        if key.startswith("label:"):
            col = label_values(rows["labels"], key[len("label:") :]) if "labels" in rows else pd.Series([""] * len(rows))
        else:
            col = rows[key]
        mask &= (col.astype(str) == value).to_numpy()
    return mask


def daily_spend(rows: pd.DataFrame, filters: dict[str, str], idle: str = "row") -> pd.Series:
    """Spend per UTC day (index: date) of the rows in scope.

    An unscoped budget covers the whole bill, idle fleet cost included. A scoped one
    covers its allocated cost, plus its share of the day's idle cost when idle is shared
    (the same weights as attribution: share of the day's allocated cost).
    """
    if rows.empty:
        return pd.Series(dtype=float)
    day = rows["day"].dt.date
    kind = rows["kind"].astype(str).to_numpy()
    cost = rows["cost_usd"].to_numpy(dtype=float)
    if not filters:
        return pd.Series(cost).groupby(day.to_numpy()).sum()
    alloc = kind != "idle"
    in_scope = alloc & scope_mask(rows, filters)
    spend = pd.Series(np.where(in_scope, cost, 0.0)).groupby(day.to_numpy()).sum()
    if idle == "share":
        by_day = pd.DataFrame({"day": day.to_numpy(), "alloc": np.where(alloc, cost, 0.0), "idle": np.where(~alloc, cost, 0.0), "scope": np.where(in_scope, cost, 0.0)})
        g = by_day.groupby("day")[["alloc", "idle", "scope"]].sum()
        share = np.where(g["alloc"] > 0, g["idle"] * g["scope"] / g["alloc"].where(g["alloc"] > 0, 1.0), 0.0)
        spend = spend.add(pd.Series(share, index=g.index), fill_value=0.0)
    return spend


def evaluate_budget(budget: Budget, rows: pd.DataFrame, day: dt.date, as_of: Any, idle: str = "row") -> dict[str, Any]:
    """Status of ``budget`` for the period containing ``day``, from priced pieces with a ``day`` column.

    ``rows`` must cover the period from its start up to ``day`` (earlier days are ignored).
    """
    start, end = period_bounds(budget, day)
    as_of_ts = min(utc(as_of), utc(pd.Timestamp(end)))
    in_period = rows
    if len(rows):
        d = rows["day"].dt.date
        in_period = rows[((d >= start) & (d <= day)).to_numpy()]
    filters = budget.scope.as_filters()
    spend = float(daily_spend(in_period, filters, idle).sum()) if len(in_period) else 0.0

    # History starts at the period start, or on the day of the first usage seen in it
    # when data begins later (a system installed mid-month must not forecast from empty days).
    forecast = None
    if len(in_period):
        first_seen = utc(in_period["start"].min()).floor("D")
        history_start = max(utc(pd.Timestamp(start)), first_seen)
        history = as_of_ts - history_start
        if history >= parse_duration(budget.forecast_min_history) and history.total_seconds() > 0:
            remaining = (utc(pd.Timestamp(end)) - as_of_ts).total_seconds()
            forecast = spend + spend / history.total_seconds() * max(remaining, 0.0)

    crossed: list[str] = []
    worst = "ok"
    for th in budget.thresholds:
        level = th.amount_usd(budget.amount_usd)
        value = spend if th.basis == "actual" else forecast
        if value is not None and value >= level:
            crossed.append(th.key())
            if th.effective_severity(budget.amount_usd) in ("warning", "critical"):
                worst = "warning"
    status = "exceeded" if spend >= budget.amount_usd else worst
    return {
        "budget": budget.name,
        "period_start": start,
        "period_end": end - dt.timedelta(days=1),  # the period's last day, inclusive
        "amount_usd": float(budget.amount_usd),
        "spend_usd": spend,
        "percent_used": spend / budget.amount_usd * 100.0,
        "forecast_usd": forecast,
        "status": status,
        "thresholds_crossed": crossed,
        "scope": json.dumps(filters, sort_keys=True),
        "as_of": as_of_ts.to_pydatetime(),
        "period": budget.period,
    }


def evaluate_budgets(budgets: Sequence[Budget], rows: pd.DataFrame, day: dt.date, as_of: Any, idle: str = "row") -> pd.DataFrame:
    """One row per budget (columns :data:`BUDGET_COLUMNS`); ``forecast_usd`` NaN when withheld."""
    records = [evaluate_budget(b, rows, day, as_of, idle) for b in budgets]
    df = pd.DataFrame(records, columns=list(BUDGET_COLUMNS))
    df["forecast_usd"] = df["forecast_usd"].astype(float)
    return df


def earliest_period_start(budgets: Sequence[Budget], day: dt.date) -> dt.date:
    return min((period_bounds(b, day)[0] for b in budgets), default=day)


def check_outcome(status: pd.DataFrame) -> tuple[bool, str, str]:
    """(passed, severity ``"warn"``/``"error"``, description) of the budgets-within-limit check.

    Any exceeded budget is an error; budgets at warning alone are a warning.
    """
    exceeded = status.loc[status["status"] == "exceeded", "budget"].tolist() if len(status) else []
    warning = status.loc[status["status"] == "warning", "budget"].tolist() if len(status) else []
    parts = ([f"exceeded: {', '.join(exceeded)}"] if exceeded else []) + ([f"warning: {', '.join(warning)}"] if warning else [])
    return not parts, "error" if exceeded else "warn", "; ".join(parts) or "all budgets ok"

