"""Spend anomalies through the budgets' channels.

Design: docs/concepts/budgets-and-alerts.md#spend-anomalies
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

import pandas as pd

from gpu_ops.domain.alerts.model import Alert
from gpu_ops.domain.alerts.state import STATUS_TABLE, AlertCursor, StatusTable, ThresholdPlan
from gpu_ops.flows.cost.budgets import period_bounds
from gpu_ops.domain.formatting import first_of

ANOMALY_TABLE = "gpu_spend_anomalies"
RECENT_DAYS = 2  # today's partition (a run during the day) and yesterday's


def read_recent(store: Any, today: dt.date) -> pd.DataFrame:
    """The anomalous rows of the last :data:`RECENT_DAYS` partitions."""
    keys = [(today - dt.timedelta(days=i)).isoformat() for i in range(RECENT_DAYS)]
    rows = store.read(ANOMALY_TABLE, partition_keys=keys, missing_ok=True)
    return rows[rows["anomalous"].astype(bool)] if len(rows) else rows


def known(row: Mapping[str, Any]) -> dict[str, str]:
    """What an anomaly's key tells of the scope keys: a team, a project, or an asset's both."""
    if row["dimension"] != "asset":
        return {str(row["dimension"]): str(row["key"])}
    return {k: str(row[k]) for k in ("team", "project") if str(row[k] or "")}


def covers(filters: Mapping[str, str], attrs: Mapping[str, str]) -> bool:
    """Does a budget scoped by ``filters`` hold all of the spend of a key known by ``attrs``?"""
    return all(attrs.get(k) == v for k, v in filters.items())


def _alert(plan: ThresholdPlan, name: str, row: Mapping[str, Any], period: tuple[dt.date, dt.date], spend: float, dagster_url: str) -> Alert:
    budget = plan.budgets[name]
    day = dt.date.fromisoformat(str(row["day"])[:10])
    start, end = period
    return Alert(
        kind="trigger", budget=name, period_start=start.isoformat(), period_end=end.isoformat(),
        threshold=f"anomaly-{day.isoformat()}-{row['dimension']}-{row['key']}", basis="anomaly", threshold_usd=float(row["spend_usd"]),
        severity="warning", amount_usd=budget.amount_usd, spend_usd=spend, percent_used=spend / budget.amount_usd * 100.0, forecast_usd=None,
        scope=plan.filters(name), channels=tuple(budget.channels), partition_key=day.isoformat(), enforcement=budget.enforcement.action, dagster_url=dagster_url,
    )


Spend = Mapping[tuple[str, str], float]  # (budget, period_start ISO date) -> that period's spend


def anomaly_alerts(plan: ThresholdPlan, rows: pd.DataFrame, spend: Spend, alert_score: float, dagster_url: str) -> tuple[list[Alert], list[str]]:
    """One alert per anomalous row scoring ``alert_score`` or more and budget with channels
    covering it (pure). ``spend``: each budget's spend in the period holding the anomaly's
    day, as the alerts show it. A covering budget with no figure for that period (no
    gpu_budget_status row of it yet) is not sent a spend it does not have, nor another
    period's: it is returned among the unknown (second), and alerted by a later evaluation
    once its row lands."""
    out, unknown = [], []
    for _, row in rows[rows["score"].astype(float) >= alert_score].iterrows():
        attrs, day = known(row), dt.date.fromisoformat(str(row["day"])[:10])
        for name, b in plan.budgets.items():
            if not (b.channels and covers(plan.filters(name), attrs)):
                continue
            period = period_bounds(b, day)
            figure = spend.get((name, period[0].isoformat()))
            if figure is not None:
                out.append(_alert(plan, name, row, period, figure, dagster_url))
            elif name not in unknown:
                unknown.append(name)
    return out, unknown


def period_spend(store: Any, table: StatusTable, rows: pd.DataFrame) -> dict[tuple[str, str], float]:
    """Each budget's spend by period: the newest status partition's rows, then, for the
    anomalies' days older than it, their own partitions' rows (an anomaly on a period's
    last day is about that period, after the newest partition has moved to the next); an
    anomaly of the newest partition's day reads nothing more."""
    spend: dict[tuple[str, str], float] = {}
    newest = {str(r[7])[:10] for r in table.rows}  # STATUS_COLUMNS' partition_key
    days = sorted({str(d)[:10] for d in rows["day"]} - newest)
    columns = ["budget", "period_start", "spend_usd"]
    earlier = store.read(STATUS_TABLE, partition_keys=days, columns=columns, missing_ok=True) if days else pd.DataFrame()
    rest = earlier[columns].itertuples(index=False) if len(earlier) else ()
    for budget, start, value in [*((r[0], r[1], r[4]) for r in table.rows), *rest]:
        spend.setdefault((str(budget), str(start)[:10]), float(value))  # the newest partition's figure first
    return spend


def queue_anomalies(config: Any, store: Any, plan: ThresholdPlan, table: StatusTable, cursor: AlertCursor, now: dt.datetime) -> str:
    """Queue the alerts of anomalies not alerted yet (their run keys join
    ``cursor.anomalies``, kept ``window_days`` and a little); returns a line for the tick's
    summary: how many were queued, and the budgets held back because their spend is
    unknown ("" when neither)."""
    settings = config.alerts.anomalies
    today = now.astimezone(dt.timezone.utc).date()
    horizon = (today - dt.timedelta(days=settings.window_days + RECENT_DAYS)).isoformat()
    cursor.anomalies = {k: d for k, d in cursor.anomalies.items() if d >= horizon}
    if settings.alert_score is None:
        return ""
    rows = read_recent(store, today)
    if rows.empty:
        return ""
    alerts, unknown = anomaly_alerts(plan, rows, period_spend(store, table, rows), settings.alert_score, config.alerts.dagster_url)
    fresh = [a for a in alerts if a.run_key not in cursor.anomalies]
    for alert in fresh:
        cursor.queue.add(alert)
        cursor.anomalies[alert.run_key] = str(alert.partition_key)
    lines = [f"{len(fresh)} spend anomaly alert(s) queued"] if fresh else []
    if unknown:
        lines.append(f"spend anomaly alert(s) held back for budget(s) {first_of(unknown, 5)}: spend unknown (no gpu_budget_status row of the anomaly's period yet); "
                     "they are sent once the budget's row lands")
    return "; ".join(lines)


__all__ = ["ANOMALY_TABLE", "anomaly_alerts", "covers", "known", "period_spend", "queue_anomalies", "read_recent"]
