"""The forecast gate: a launch whose estimate would carry an enforced budget past its line is
refused. The decision (:func:`forecast_refusal`) is pure; ``now`` is an input.

Design: docs/concepts/budgets-and-alerts.md#the-forecast-gate
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from gpu_ops.flows.alerts.enforcement import scope_matches
from gpu_ops.flows.alerts.intraday import read_accrual
from gpu_ops.domain.alerts.model import Refusal, money, scope_label
from gpu_ops.domain.alerts.state import STATUS_TABLE
from gpu_ops.flows.cost.budgets import period_bounds
from gpu_ops.storage.tables import TableStore

ENFORCING = ("block", "throttle")


@dataclass(frozen=True)
class Spend:
    """A budget's spend to ``now``, in parts."""

    period_usd: float  # the newest gpu_budget_status row of the period
    through: str  # what that row covers: "2026-03-01" (its as_of day), or "no gpu_budget_status yet"
    settled_usd: float  # ledger rows after it
    running_usd: float  # running attempts

    @property
    def total(self) -> float:
        return self.period_usd + self.settled_usd + self.running_usd


def request_attrs(request: Any) -> dict[str, str]:
    """What a launch shows of a budget scope's keys (team, project, cost_center, namespace)."""
    labels = request.labels
    attrs = {k: str(getattr(labels, k)) for k in ("team", "project", "cost_center") if getattr(labels, k)}
    attrs["namespace"] = str(request.namespace)
    return attrs


def _line(budget: Any) -> float:
    return float(budget.amount_usd) * float(budget.enforcement.threshold_percent) / 100.0


def _throttled_out(budget: Any, request: Any) -> str | None:
    """Why a throttle of ``budget`` would refuse ``request``, or None when it lets it run."""
    e = budget.enforcement
    if e.max_gpus is not None and request.total_gpus > e.max_gpus:
        return f"it would throttle launches to {e.max_gpus} GPUs and this launch asks for {request.total_gpus}"
    if e.spot_only and request.capacity == "on-demand":
        return "it would restrict launches to spot capacity and this launch asks for on-demand"
    return None


def _refusal(budget: Any, request: Any, spend: Spend, figure: float, basis: str) -> str | None:
    line = _line(budget)
    projected = spend.total + figure
    if projected <= line:
        return None
    action = budget.enforcement.action
    why = "" if action == "block" else _throttled_out(budget, request)
    if why is None:
        return None
    what = "estimate" if basis == "estimate" else "p90 estimate"
    figures = (
        f"period spend {money(spend.period_usd)} ({spend.through}) + settled since {money(spend.settled_usd)} + running attempts {money(spend.running_usd)} "
        f"+ this launch's {what} {money(figure)} = {money(projected)}, past the {action} line {money(line)} "
        f"({budget.enforcement.threshold_percent:g}% of {money(budget.amount_usd)})"
    )
    scope = scope_label(budget.scope.as_filters(), "all GPU launches")
    tail = f"; {why}" if why else ""
    lift = f"raise budgets[{budget.name}].amount_usd, set alerts.launch_forecast: off, or wait for the period to end"
    return f"launch refused by the forecast gate of budget {budget.name!r} ({scope}): {figures}{tail}. To launch anyway: {lift}."


def forecast_refusal(budgets: Sequence[Any], request: Any, figure: float | None, basis: str, spend: Mapping[str, Spend]) -> str | None:
    """Why the launch must not start, or None (pure). ``figure``: the launch's estimate or
    p90 (``basis``); None: no estimate, nothing refused."""
    if figure is None:
        return None
    attrs = request_attrs(request)
    for budget in budgets:
        if budget.enforcement.action not in ENFORCING or not scope_matches(budget.scope.as_filters(), attrs):
            continue
        reason = _refusal(budget, request, spend.get(budget.name, Spend(0.0, "no gpu_budget_status yet", 0.0, 0.0)), figure, basis)
        if reason is not None:
            return reason
    return None


# --------------------------------------------------------------------------- reading the spend


def _period_status(status: pd.DataFrame, budget: Any, start: dt.date, end: dt.date) -> tuple[float, pd.Timestamp | None]:
    """(spend, as_of) of the newest gpu_budget_status row of ``budget``'s current period."""
    if status.empty:
        return 0.0, None
    mine = status[(status["budget"] == budget.name) & (status["period_start"].astype(str).str[:10] == start.isoformat())]
    if mine.empty:
        return 0.0, None
    newest = mine.assign(_as_of=pd.to_datetime(mine["as_of"], utc=True)).sort_values("_as_of").iloc[-1]
    return float(newest["spend_usd"]), min(newest["_as_of"], pd.Timestamp(end).tz_localize("UTC"))


def spend_to_date(config: Any, store: Any, budgets: Sequence[Any], now: dt.datetime) -> dict[str, Spend]:
    """Each budget's :class:`Spend` at ``now`` from the stored tables."""
    now_ts = pd.Timestamp(now).tz_convert("UTC")
    status = store.read(STATUS_TABLE, missing_ok=True)
    marks = {}
    for budget in budgets:
        start, end = period_bounds(budget, now_ts.date())
        period_usd, as_of = _period_status(status, budget, start, end)
        marks[budget.name] = (period_usd, as_of, as_of if as_of is not None else pd.Timestamp(start).tz_localize("UTC"))
    if not marks:
        return {}
    accrual = read_accrual(config, store, min(since for _, _, since in marks.values()), now_ts)
    out = {}
    for budget in budgets:
        period_usd, as_of, since = marks[budget.name]
        settled, running = accrual.spend(budget.scope.as_filters(), since)
        through = f"through {as_of.isoformat()}" if as_of is not None else "no gpu_budget_status for this period yet"
        out[budget.name] = Spend(period_usd, through, settled, running)
    return out


def check_forecast(config: Any, request: Any, estimate: Any, *, now: dt.datetime | None = None, store: Any = None) -> Refusal | None:
    """The :class:`Refusal` of this launch when ``estimate`` (an
    :class:`~gpu_ops.domain.training.estimate.Estimate`) would carry an enforced budget past its
    line; None when ``alerts.launch_forecast`` is ``off`` or no budget enforces."""
    basis = config.alerts.launch_forecast
    budgets = [b for b in config.budgets if b.enforcement.action in ENFORCING]
    if basis == "off" or not budgets:
        return None
    figure = estimate.figure(basis)
    if figure is None:
        return None

    store = store or TableStore.from_config(config)
    try:
        spend = spend_to_date(config, store, budgets, now or dt.datetime.now(dt.timezone.utc))
    except Exception as exc:  # the database is down: do not stop training over it (as enforcement)
        logging.getLogger("gpu_ops.alerts").warning(f"the launch forecast could not be checked ({type(exc).__name__}: {exc}); the launch goes ahead")
        return None
    reason = forecast_refusal(budgets, request, figure, basis, spend)
    if reason is None:
        return None
    return Refusal(reason, {"refused_by": "forecast gate", "estimate_usd": float(figure), "estimate_basis": basis})


__all__ = ["Spend", "check_forecast", "forecast_refusal", "request_attrs", "spend_to_date"]
