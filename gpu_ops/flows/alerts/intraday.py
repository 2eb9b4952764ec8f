"""Budgets within the hour: what the daily partitions have not seen yet, priced.

Design: docs/concepts/budgets-and-alerts.md#budgets-within-the-hour
"""

from __future__ import annotations

import datetime as dt
import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from gpu_ops.domain.alerts.state import StatusTable, ThresholdPlan
from gpu_ops.flows.cost.budgets import period_bounds
from gpu_ops.domain.cost.columns import GROUPING_KEYS
from gpu_ops.flows.cost.pricing import PriceMatrix
from gpu_ops.storage.attempt_store import AttemptStore
from gpu_ops.domain.training.attempts import State
from gpu_ops.storage.ledger import LEDGER_TABLE

KEYS = GROUPING_KEYS  # what a budget scope filters on and an attempt is billed to
_FRAME = [*KEYS, "asset_key", "start", "end", "per_s", "settled"]


def _prices(config: Any) -> Any:
    return PriceMatrix.from_table(config.prices)  # the cost engine's prices: NaN where none


@dataclass(frozen=True)
class Accrual:
    """Attempts as priced intervals: ``KEYS`` and ``asset_key`` (text), ``start``, ``end``
    (UTC), ``per_s`` (USD per second), ``settled`` (a ledger row, else running)."""

    frame: pd.DataFrame
    unpriced: int = 0  # attempts with no price in the table: left to the daily partition, which quarantines them

    @property
    def empty(self) -> bool:
        return self.frame.empty

    def cost_since(self, since: pd.Timestamp) -> pd.Series:
        """Each interval's cost after ``since``."""
        if self.frame.empty:
            return pd.Series([], dtype=float)
        seconds = (self.frame["end"] - self.frame["start"].clip(lower=since)).dt.total_seconds().clip(lower=0.0)
        return seconds * self.frame["per_s"]

    def in_scope(self, filters: Mapping[str, str]) -> "Accrual":
        keep = pd.Series(True, index=self.frame.index)
        for key, value in filters.items():
            keep &= self.frame[key] == value if key in KEYS else False
        return Accrual(self.frame[keep])

    def spend(self, filters: Mapping[str, str], since: pd.Timestamp) -> tuple[float, float]:
        """(settled, running) USD after ``since`` in the scope ``filters``."""
        mine = self.in_scope(filters)
        cost = mine.cost_since(since)
        settled = mine.frame["settled"].astype(bool)
        return float(cost[settled].sum()), float(cost[~settled].sum())


def _ledger_frame(config: Any, rows: pd.DataFrame, now: pd.Timestamp) -> pd.DataFrame:
    """Ledger rows as priced intervals (CPU rows priced as declared under
    ``training.simulate_gpu_pricing``, as the asset's metadata prices them; a CPU attempt
    costs what the price table says of ``cpu``: nothing priced, it is left out)."""
    if rows.empty:
        return pd.DataFrame(columns=_FRAME)
    simulated = (rows["gpu_type"] == "cpu") & bool(config.training.simulate_gpu_pricing)
    gpu_type = rows["gpu_type"].where(~simulated, rows["declared_gpu_type"])
    count = rows["gpu_count"].astype(float).where(~simulated, rows["declared_gpu_count"].astype(float))
    prices = _prices(config)
    price = pd.Series([prices.price(str(g), str(c)) for g, c in zip(gpu_type, rows["capacity_type"])], index=rows.index)
    out = pd.DataFrame({k: rows[k].fillna("").astype(str) if k in rows else "" for k in (*KEYS, "asset_key")}, index=rows.index)
    out["start"] = pd.to_datetime(rows["start"], utc=True)
    out["end"] = pd.to_datetime(rows["end"], utc=True).clip(upper=now)
    out["per_s"] = count * rows["gpu_share"].astype(float) * price / 3600.0
    out["settled"] = True
    return out


def _running_frame(config: Any, store: Any, now: pd.Timestamp, deadline: float | None) -> pd.DataFrame:
    """Launched, unsettled attempts: their bill's attribution, priced from launch to ``now``."""
    rows, prices = [], _prices(config)
    for a, _quiet in AttemptStore(store).open_attempts(deadline):
        if a.state not in (State.LAUNCHED, State.RUNNING) or a.launched_at is None:
            continue
        bill = dict(a.bill)
        price = prices.price(str(bill.get("gpu_type")), str(bill.get("capacity_type")))
        rows.append({
            **{k: str(bill.get(k) or "") for k in KEYS}, "asset_key": a.asset_key, "start": pd.Timestamp(a.launched_at, unit="s", tz="UTC"), "end": now,
            "per_s": float(bill.get("gpu_count", 0)) * float(bill.get("gpu_share", 1.0)) * price / 3600.0, "settled": False,
        })
    return pd.DataFrame(rows, columns=_FRAME)


def read_accrual(config: Any, store: Any, since: pd.Timestamp, now: pd.Timestamp, *, deadline: float | None = None) -> Accrual:
    """The ledger rows touching ``[since, now]`` and the attempts running at ``now``.
    ``deadline`` (a ``time.monotonic()`` instant, the exporter's scrape deadline): every
    read is on a read-only connection whose statements are cancelled then, and nothing is
    written (:meth:`TableStore.reading <gpu_ops.storage.tables.TableStore.reading>`)."""
    rows = store.read_range(LEDGER_TABLE, since.to_pydatetime(), now.to_pydatetime(), missing_ok=True, deadline=deadline)
    parts = [f for f in (_ledger_frame(config, rows, now), _running_frame(config, store, now, deadline)) if not f.empty]
    frame = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=_FRAME)
    priced = frame["per_s"].notna()
    return Accrual(frame[priced].reset_index(drop=True), unpriced=int((~priced).sum()))


# --------------------------------------------------------------------------- the sensor's view


@dataclass(frozen=True)
class Mark:
    """Where one budget's intraday view starts: its current period, and the instant its
    status row counts to (the row's ``as_of``; the period's start when it has no row of
    this period yet)."""

    start: dt.date
    end: dt.date  # exclusive
    since: pd.Timestamp
    row: int | None  # its row in the status table (of any period)
    current: bool  # that row is of the current period


@functools.lru_cache(maxsize=1024)  # a partition's rows share one or two as_of values
def _instant(value: Any) -> pd.Timestamp | None:
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return None
    ts = pd.Timestamp(value)
    return ts.tz_localize("UTC") if ts.tzinfo is None else ts.tz_convert("UTC")


@dataclass(frozen=True)
class _Period:
    start: dt.date
    end: dt.date
    iso: str
    since: pd.Timestamp  # its start, UTC


def _mark(period: _Period, raw: tuple | None, i: int | None) -> Mark:
    if raw is None or str(raw[1])[:10] != period.iso:
        return Mark(period.start, period.end, period.since, i, False)
    as_of = _instant(raw[8])
    return Mark(period.start, period.end, period.since if as_of is None else max(as_of, period.since), i, True)


def marks(plan: ThresholdPlan, table: StatusTable, now: dt.datetime, names: Iterable[str]) -> dict[str, Mark]:
    """The :class:`Mark` of each budget of ``names`` at ``now`` (a fleet's budgets share a
    handful of periods and as_of values)."""
    row_of = {name: i for i, name in enumerate(table.names)}
    today = now.astimezone(dt.timezone.utc).date()
    periods: dict[tuple[str, int], _Period] = {}
    out = {}
    for name in names:
        budget = plan.budgets[name]
        key = (budget.period, budget.reset_day)
        period = periods.get(key)
        if period is None:
            start, end = period_bounds(budget, today)
            period = periods[key] = _Period(start, end, start.isoformat(), pd.Timestamp(start).tz_localize("UTC"))
        i = row_of.get(name)
        out[name] = _mark(period, table.rows[i] if i is not None else None, i)
    return out


def _scopes(accrual: Accrual, plan: ThresholdPlan) -> tuple[Any, dict[str, list[int]]]:
    """(each interval's attribution number, the attributions each budget's scope matches,
    for the budgets that match any): attributions are a handful, budgets may be 100,000."""
    frame = accrual.frame
    groups = frame.groupby(list(KEYS), sort=False).ngroup().to_numpy()
    first = ~frame.duplicated(list(KEYS)).to_numpy()
    matching: dict[tuple[str, str], set[int]] = {}
    for key in KEYS:
        for value, g in zip(frame[key].to_numpy()[first], groups[first]):
            matching.setdefault((key, value), set()).add(int(g))
    everything = sorted(int(g) for g in groups[first])
    out = {}
    for name in plan.budgets:
        sets = [matching.get(item) for item in plan.filters(name).items()]
        if not sets:
            out[name] = everything
        elif all(sets):
            ids = sorted(set.intersection(*sets))  # type: ignore[arg-type]
            if ids:
                out[name] = ids
    return groups, out


def added_spend(accrual: Accrual, plan: ThresholdPlan, table: StatusTable, now: dt.datetime) -> tuple[dict[str, float], dict[str, Mark]]:
    """USD each budget's scope accrued after its mark (budgets with none left out), and
    the marks. The intervals are summed per attribution, and only budgets whose scope
    matches one are looked at: a fleet of budgets costs a lookup or two each."""
    groups, scoped = _scopes(accrual, plan)
    at = marks(plan, table, now, scoped)
    width = int(groups.max()) + 1 if len(groups) else 0
    per_since = {s: np.bincount(groups, weights=accrual.cost_since(s).to_numpy(), minlength=width) for s in {m.since for m in at.values()}}
    out = {}
    for name, ids in scoped.items():
        usd = float(per_since[at[name].since][ids].sum())
        if usd > 0:
            out[name] = usd
    return out, at


def _row(plan: ThresholdPlan, table: StatusTable, name: str, mark: Mark, usd: float, now: str) -> tuple:
    """The status row of ``name`` with ``usd`` added, as of ``now`` (STATUS_COLUMNS order)."""
    amount = plan.budgets[name].amount_usd
    if not mark.current or mark.row is None:
        last = (mark.end - dt.timedelta(days=1)).isoformat()
        return (name, mark.start.isoformat(), last, amount, usd, usd / amount * 100.0, None, None, now)
    raw = table.rows[mark.row]
    spend = float(raw[4]) + usd
    return (name, raw[1], raw[2], amount, spend, spend / amount * 100.0, raw[6], raw[7], now)


def _earliest(plan: ThresholdPlan, table: StatusTable, today: dt.date) -> pd.Timestamp:
    """An instant no budget's mark precedes, from distinct values only: the rows' earliest
    ``as_of``, or a period's start where a budget has no row (or one without ``as_of``)."""
    instants = {_instant(v) for v in {r[8] for r in table.rows}}
    known = {t for t in instants if t is not None}
    if None in instants or not known or plan.budgets.keys() - set(table.names):
        periods = {(b.period, b.reset_day): b for b in plan.budgets.values()}
        known |= {pd.Timestamp(period_bounds(b, today)[0]).tz_localize("UTC") for b in periods.values()}
    return min(known)


def with_intraday(config: Any, store: Any, plan: ThresholdPlan, table: StatusTable, now: dt.datetime) -> tuple[StatusTable, str]:
    """``table`` (the newest status partition) with each budget's current period brought
    to ``now``: its row's spend plus what its scope accrued since the row's ``as_of`` (a
    row of the current period for budgets whose period has no row yet). Off under
    ``alerts.intraday: false``. Returns the table and a line for the tick's summary."""
    if not config.alerts.intraday or not plan.budgets:
        return table, ""
    now_ts = pd.Timestamp(now).tz_convert("UTC")
    accrual = read_accrual(config, store, _earliest(plan, table, now_ts.date()), now_ts)
    unpriced = f"; {accrual.unpriced} attempt(s) without a price left to the daily partition (it quarantines them)" if accrual.unpriced else ""
    if accrual.empty:
        return table, unpriced.lstrip("; ")
    added, at = added_spend(accrual, plan, table, now)
    if not added:
        return table, f"intraday: no budget's scope has spend since its status row ({len(accrual.frame)} attempt(s) read){unpriced}"
    rows = list(table.rows)
    stamp = now_ts.isoformat()
    for name, usd in added.items():
        mark = at[name]
        row = _row(plan, table, name, mark, usd, stamp)
        if mark.row is None:
            rows.append(row)
        else:
            rows[mark.row] = row  # a row of an earlier period is replaced by one of this period
    return StatusTable(rows), f"intraday: {len(added)} budget(s) with spend since their status row ({sum(added.values()):,.2f} USD, {len(accrual.frame)} attempt(s)){unpriced}"


__all__ = ["Accrual", "Mark", "added_spend", "marks", "read_accrual", "with_intraday"]
