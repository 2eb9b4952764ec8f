"""The alert state machine: budget status rows in, notifications and enforcement out. Pure.

Design: docs/concepts/budgets-and-alerts.md#the-alert-state-machine
"""

from __future__ import annotations

import base64
import datetime as dt
import functools
import json
import math
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from gpu_ops.domain.alerts.model import money
from gpu_ops.domain.alerts.queue import AlertQueue
from gpu_ops.domain.alerts.redelivery import Pending
from gpu_ops.domain.config import Budget

RESOLVE_MARGIN = 0.95
CURSOR_VERSION = 2
_COMPRESS_OVER = 32_768  # bytes of JSON; larger cursors are stored zlib+base64


def _iso_date(v: Any) -> str:
    if isinstance(v, str):
        return v[:10]
    return v.isoformat()[:10] if hasattr(v, "isoformat") else str(v)[:10]


@functools.lru_cache(maxsize=1024)  # a partition's rows share a handful of period ends
def _day_after(v: Any) -> str:
    return (dt.date.fromisoformat(_iso_date(v)) + dt.timedelta(days=1)).isoformat()


def _opt_float(v: Any) -> float | None:
    if v is None:
        return None
    f = float(v)
    return None if math.isnan(f) else f


@dataclass(frozen=True)
class StatusRow:
    """One row of ``gpu_budget_status`` (the cost asset's contract)."""

    budget: str
    period_start: str  # ISO date
    period_end: str  # ISO date, exclusive: the first day of the next period
    amount_usd: float
    spend_usd: float
    percent_used: float
    forecast_usd: float | None
    partition_key: str | None = None
    as_of: str | None = None

    @classmethod
    def from_tuple(cls, r: tuple) -> "StatusRow":
        """From a table row, values in STATUS_COLUMNS order (dates or ISO strings, NaN or None).

        The table's ``period_end`` is the period's last day (inclusive, as the cost asset
        writes it); here it becomes the exclusive end, the day the next period starts.
        """
        budget, start, end, amount, spend, pct, forecast, partition, as_of = r
        return cls(
            str(budget), _iso_date(start), _day_after(end), float(amount), float(spend), float(pct), _opt_float(forecast),
            None if partition is None else str(partition),
            None if as_of is None or (isinstance(as_of, float) and math.isnan(as_of)) else str(as_of),
        )


STATUS_TABLE = "gpu_budget_status"  # the budget status asset's table, as the sensor and the gates read it
STATUS_COLUMNS = ("budget", "period_start", "period_end", "amount_usd", "spend_usd", "percent_used", "forecast_usd", "partition_key", "as_of")


@dataclass
class BudgetState:
    period_start: str
    period_end: str
    # threshold key -> [state ("alarm" | "resolved"), episode]
    thresholds: dict[str, list[Any]] = field(default_factory=dict)
    # [state ("pending" | "active" | "reverted"), episode, since (ISO), action] or None
    enforcement: list[Any] | None = None

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"p": self.period_start, "e": self.period_end}
        if self.thresholds:
            d["t"] = self.thresholds
        if self.enforcement:
            d["x"] = self.enforcement
        return d

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "BudgetState":
        return cls(d["p"], d["e"], {k: list(v) for k, v in (d.get("t") or {}).items()}, d.get("x"))

    @property
    def empty(self) -> bool:
        return not self.thresholds and not self.enforcement

    def signature(self) -> tuple[Any, ...]:
        return (self.period_start, self.period_end, tuple((k, *v) for k, v in self.thresholds.items()), tuple(self.enforcement or ()))

    def copy(self) -> "BudgetState":
        return BudgetState(
            self.period_start, self.period_end, {k: list(v) for k, v in self.thresholds.items()}, list(self.enforcement) if self.enforcement else None
        )


@dataclass
class AlertCursor:
    """Everything the sensor remembers between ticks."""

    last_storage_id: int | None = None  # newest gpu_budget_status materialization seen
    evaluated_at: float | None = None  # epoch seconds of the last full evaluation
    budgets: dict[str, BudgetState] = field(default_factory=dict)
    # alert run key -> its redelivery state, until a run of it succeeds (redelivery.py)
    pending: dict[str, Pending] = field(default_factory=dict)
    runs_seen_at: float | None = None  # wall-clock epoch s of the last look at alert runs
    # alerts evaluated but not requested yet (alerts.max_runs_per_tick), oldest first
    queue: AlertQueue = field(default_factory=AlertQueue)
    # the usage ledger's [rows, newest end] at the last full evaluation (ledger.watermark)
    ledger_mark: list[Any] | None = None
    # spend anomaly alerts queued (run key -> the anomaly's day), for alerts.anomalies.window_days (anomalies.py)
    anomalies: dict[str, str] = field(default_factory=dict)

    def encode(self) -> str:
        """JSON, zlib+base64 above 32 KB. Budgets in the same state (most of a fleet) share
        one entry of ``S``, alerts with the same redelivery state one of ``P``, so the
        cursor grows by a name and a number per budget."""
        states, budgets = _shared(((name, s) for name, s in self.budgets.items() if not s.empty), BudgetState.signature, BudgetState.to_json)
        body: dict[str, Any] = {"v": CURSOR_VERSION, "m": self.last_storage_id, "at": self.evaluated_at, "S": states, "b": budgets}
        if self.pending:
            body["P"], body["r"] = _shared(self.pending.items(), lambda p: p, Pending.to_json)
        if self.runs_seen_at is not None:
            body["w"] = self.runs_seen_at
        if self.queue:
            body["q"] = self.queue.to_json()
        if self.ledger_mark is not None:
            body["l"] = self.ledger_mark
        if self.anomalies:
            body["a"] = self.anomalies
        text = json.dumps(body, separators=(",", ":"))
        if len(text) > _COMPRESS_OVER:
            return "z:" + base64.b64encode(zlib.compress(text.encode(), 1)).decode()
        return text

    @classmethod
    def decode(cls, text: str | None) -> "AlertCursor":
        if not text:
            return cls()
        if text.startswith("z:"):
            text = zlib.decompress(base64.b64decode(text[2:])).decode()
        data = json.loads(text)
        version = data.get("v")
        if version == 1:  # one state per budget, no sharing
            budgets = {n: BudgetState.from_json(s) for n, s in (data.get("b") or {}).items()}
            pending = {k: Pending.from_json(v) for k, v in (data.get("r") or {}).items()}
        elif version == CURSOR_VERSION:
            # Shared objects: evaluate() copies a state before it changes it.
            states = [BudgetState.from_json(s) for s in data["S"]]
            budgets = {n: states[i] for n, i in data["b"].items()}
            entries = [Pending.from_json(p) for p in data.get("P") or []]
            pending = {k: entries[i] for k, i in (data.get("r") or {}).items()}
        else:
            raise ValueError(f"alert sensor cursor has version {version}, this code reads 1 and {CURSOR_VERSION}")
        return cls(data.get("m"), data.get("at"), budgets, pending, data.get("w"), AlertQueue.from_json(data.get("q")), data.get("l"), dict(data.get("a") or {}))


def _shared(items: Iterable[tuple[str, Any]], signature: Any, to_json: Any) -> tuple[list[Any], dict[str, Any]]:
    """(distinct values as JSON, name -> index): one entry per distinct signature; objects
    shared since decoding are signed once."""
    pairs = list(items)
    objects = {id(obj): obj for _, obj in pairs}
    distinct: list[Any] = []
    index: dict[Any, int] = {}
    by_object: dict[int, int] = {}
    for oid, obj in objects.items():
        sig = signature(obj)
        if sig not in index:
            index[sig] = len(distinct)
            distinct.append(to_json(obj))
        by_object[oid] = index[sig]
    return distinct, {name: by_object[id(obj)] for name, obj in pairs}


@dataclass(frozen=True)
class ThresholdEvent:
    kind: Literal["trigger", "resolve"]
    budget: str
    threshold: str
    episode: int
    row: StatusRow


@dataclass(frozen=True)
class EnforcementEvent:
    kind: Literal["apply", "revert"]
    budget: str
    action: str  # throttle | block
    episode: int
    period_start: str
    period_end: str
    reason: str
    row: StatusRow | None = None

    @property
    def run_key(self) -> str:
        base = f"{self.budget}/{self.period_start}/enforce-{self.action}"
        base = base if self.episode <= 1 else f"{base}#{self.episode}"
        return f"{base}/{self.kind}"


@dataclass
class Evaluation:
    state: dict[str, BudgetState]
    alerts: list[ThresholdEvent] = field(default_factory=list)
    enforcement: list[EnforcementEvent] = field(default_factory=list)


def _iso_now(now: dt.datetime) -> str:
    return now.astimezone(dt.timezone.utc).isoformat(timespec="seconds")


def period_end_passed(period_end: str, now: dt.datetime) -> bool:
    """Has the period ended at ``now``? ``period_end`` is its exclusive end, a date: the
    period ends at 00:00 UTC that day."""
    end = dt.datetime.combine(dt.date.fromisoformat(period_end), dt.time(), tzinfo=dt.timezone.utc)
    return now >= end


def evaluate(
    budgets: Mapping[str, Budget],
    rows: Iterable[StatusRow],
    previous: Mapping[str, BudgetState],
    now: dt.datetime,
    *,
    unchanged: Iterable[str] = (),
    plan: ThresholdPlan | None = None,
) -> Evaluation:
    """Advance every budget's state with its newest status row; collect what to send and do.

    ``budgets`` is the current configuration: a raised ``amount_usd`` takes effect at the
    next evaluation, without waiting for the cost asset to run again. ``unchanged`` names
    budgets that have a row this evaluation which :func:`quiet_rows` showed changes
    nothing: they are not passed as rows, but count as seen. ``plan``, the plan of
    ``budgets`` where the caller has one, saves working out threshold keys per row.
    """
    keys_of = plan.keys_of if plan is not None else (lambda name: tuple(th.key() for th in budgets[name].thresholds))
    if now.tzinfo is None:
        raise ValueError("now must be timezone-aware (UTC)")
    # Copy on write: a state is copied when it changes, so the caller's stays as it was.
    state = dict(previous)
    out = Evaluation(state)
    seen: set[str] = set(unchanged)

    for row in rows:
        budget = budgets.get(row.budget)
        if budget is None or row.budget in seen:
            continue  # a budget no longer configured (handled below), or a duplicate row
        seen.add(row.budget)
        st = _state_for_row(out, state, row)
        if st is None:
            continue  # an older period's row (a backfill): never re-arm backwards
        _advance_thresholds(out, budget, keys_of(budget.name), row, st)
        _advance_enforcement(out, budget, row, st, now)

    _settle_without_rows(out, state, budgets, seen, now)
    return out


def _state_for_row(out: Evaluation, state: dict[str, BudgetState], row: StatusRow) -> BudgetState | None:
    """The budget's state that ``row`` advances, copied into ``state`` (a fresh one when a
    new period starts, after reverting the old period's enforcement); None for a row of
    an older period."""
    st = state.get(row.budget)
    if st is not None and row.period_start < st.period_start:
        return None
    if st is None or row.period_start > st.period_start:
        if st is not None:
            st = state[row.budget] = st.copy()
            _revert_enforcement(out, row.budget, st, f"period {st.period_start} ended; a new period started {row.period_start}")
        st = state[row.budget] = BudgetState(row.period_start, row.period_end)
    else:
        st = state[row.budget] = st.copy()
    return st


def _settle_without_rows(out: Evaluation, state: dict[str, BudgetState], budgets: Mapping[str, Budget], seen: set[str], now: dt.datetime) -> None:
    """Budgets removed from the configuration are reverted and forgotten; a budget with no
    row this evaluation is reverted when its period has ended, and forgotten when empty."""
    for name in [n for n in state if n not in budgets]:
        _revert_enforcement(out, name, state[name].copy(), f"budget {name} was removed from the configuration")
        del state[name]
    for name in [n for n in state if n not in seen]:  # no row this evaluation
        st = state[name]
        if st.enforcement and st.enforcement[0] == "active" and period_end_passed(st.period_end, now):
            # The period ended before the first status row of the next one arrived.
            st = state[name] = st.copy()
            _revert_enforcement(out, name, st, f"period {st.period_start} ended at {st.period_end}")
        if st.empty:
            del state[name]


# --------------------------------------------------------------------------- at fleet scale


@dataclass
class ThresholdPlan:
    """A configuration's thresholds as arrays (one row per budget, NaN-padded), built
    once per loaded configuration, so that a tick compares every threshold of every
    budget in a few numpy operations."""

    budgets: dict[str, Budget]
    index: dict[str, int]
    keys: list[tuple[str, ...]]
    lines: Any  # float [budgets, thresholds]
    forecast: Any  # bool [budgets, thresholds]: basis forecast
    enforce_line: Any  # float [budgets]: spend that starts enforcement; inf for alert-only
    _filters: dict[str, dict[str, str]] = field(default_factory=dict)

    @classmethod
    def build(cls, budgets: Iterable[Budget]) -> "ThresholdPlan":
        """Budgets with the same threshold objects (a fleet's repeated thresholds are
        validated once and shared) are filled as one group: each threshold's key and
        kind are worked out once per group, not once per budget."""
        import numpy as np

        by_name = {b.name: b for b in budgets}
        width = max((len(b.thresholds) for b in by_name.values()), default=0)
        n = len(by_name)
        amount = np.array([b.amount_usd for b in by_name.values()], dtype=float)
        enforce = np.full(n, np.inf)
        groups: dict[tuple[int, ...], list[int]] = {}
        members: dict[tuple[int, ...], list[Any]] = {}
        for i, b in enumerate(by_name.values()):
            ids = tuple(map(id, b.thresholds))
            if ids not in groups:
                groups[ids], members[ids] = [], b.thresholds
            groups[ids].append(i)
            if b.enforcement.action != "alert":
                enforce[i] = b.amount_usd * b.enforcement.threshold_percent / 100.0
        lines = np.full((n, width), np.nan)
        forecast = np.zeros((n, width), dtype=bool)
        keys: list[tuple[str, ...]] = [()] * n
        interned: dict[tuple[str, ...], tuple[str, ...]] = {}
        for ids, rows in groups.items():
            thresholds = members[ids]
            at = np.array(rows, dtype=np.int64)
            k = tuple(th.key() for th in thresholds)
            k = interned.setdefault(k, k)
            for i in rows:
                keys[i] = k  # one tuple per group, so budgets group by identity
            for j, th in enumerate(thresholds):
                lines[at, j] = th.absolute_usd if th.absolute_usd is not None else amount[at] * th.percent / 100.0
                forecast[at, j] = th.basis == "forecast"
        return cls(by_name, {name: i for i, name in enumerate(by_name)}, keys, lines, forecast, enforce)

    def keys_of(self, budget: str) -> tuple[str, ...]:
        """The keys of the budget's thresholds, in order."""
        return self.keys[self.index[budget]]

    def threshold(self, budget: str, key: str) -> Any:
        """The budget's threshold with this key (no key formatting per alert)."""
        return self.budgets[budget].thresholds[self.keys[self.index[budget]].index(key)]

    def filters(self, budget: str) -> dict[str, str]:
        """``scope.as_filters()``, computed once per budget and plan (a copy each call)."""
        if budget not in self._filters:
            self._filters[budget] = self.budgets[budget].scope.as_filters()
        return dict(self._filters[budget])


def queue_alerts(queue: AlertQueue, events: Iterable[ThresholdEvent], plan: ThresholdPlan, dagster_url: str) -> None:
    """The alerts of one evaluation onto ``queue`` (events of budgets without channels are
    left out: their state advances, there is nothing to send). One context per budget row."""
    entries: list[tuple[Any, ...]] = []
    contexts: list[tuple[Any, ...]] = []
    first = queue.next_context
    context_of: dict[int, int] = {}
    lines: dict[tuple[int, float], tuple[Any, float, Any]] = {}  # (threshold, amount) -> basis, USD, severity
    for ev in events:
        budget = plan.budgets[ev.budget]
        if not budget.channels:
            continue
        row = ev.row
        ctx = context_of.get(id(row))
        if ctx is None:
            ctx = context_of[id(row)] = first + len(contexts)
            contexts.append((
                budget.name, row.period_start, row.period_end, budget.amount_usd, row.spend_usd, row.forecast_usd,
                row.partition_key, row.as_of, plan.filters(budget.name), list(budget.channels), budget.enforcement.action, dagster_url,
            ))
        amount = budget.amount_usd
        th = plan.threshold(budget.name, ev.threshold)
        line = lines.get((id(th), amount))  # thresholds are shared objects of the configuration
        if line is None:
            line = lines[(id(th), amount)] = (th.basis, th.amount_usd(amount), th.effective_severity(amount))
        entries.append((ev.kind, ev.threshold, ev.episode, *line, ctx))
    queue.extend(entries, contexts)


class StatusTable:
    """The newest ``gpu_budget_status`` partition as raw rows (STATUS_COLUMNS order);
    a :class:`StatusRow` is built only for the rows that need one."""

    def __init__(self, rows: list[tuple]):
        self.rows = rows
        self.names = [r[0] for r in rows]

    def __len__(self) -> int:
        return len(self.rows)

    def row(self, i: int) -> StatusRow:
        return StatusRow.from_tuple(self.rows[i])

    def fresh_rows(self, plan: ThresholdPlan, previous: Mapping[str, BudgetState], quiet: Any) -> Any:
        """Per row, True when :func:`evaluate` would start it afresh with nothing to
        enforce: not quiet, a configured budget with no state or a state of an earlier
        period holding no enforcement, and spend under the budget's enforcement line (or
        alert-only). Such a row's new state is only the thresholds it crosses."""
        import numpy as np

        n = len(self.rows)
        fresh = np.zeros(n, dtype=bool)
        if n == 0 or len(set(self.names)) != n:
            return fresh  # duplicate rows: the per-row path decides
        for i in np.flatnonzero(~quiet):
            name = self.names[i]
            pos = plan.index.get(name)
            if pos is None or not self.rows[i][4] < plan.enforce_line[pos]:
                continue
            st = previous.get(name)
            fresh[i] = st is None or (not st.enforcement and _iso_date(self.rows[i][1]) > st.period_start)
        return fresh

    def quiet_rows(self, plan: ThresholdPlan, previous: Mapping[str, BudgetState]) -> Any:
        """Per row, True when :func:`evaluate` would change nothing for it: no threshold
        crosses or falls back, the period and thresholds are those of the stored state,
        and no enforcement is pending or in force or about to be. Conservative: a row
        not shown quiet goes through the full per-row evaluation."""
        import numpy as np

        n = len(self.rows)
        if n == 0 or len(set(self.names)) != n:
            return np.zeros(n, dtype=bool)  # duplicate rows: the per-row path decides
        positions = [plan.index.get(name, -1) for name in self.names]
        idx = np.array(positions, dtype=np.int64)
        known = idx >= 0
        idx = np.where(known, idx, 0)
        spend = np.array([r[4] for r in self.rows], dtype=float)
        forecast = np.array([r[6] for r in self.rows], dtype=float)  # None -> NaN
        lines = plan.lines[idx]
        values = np.where(plan.forecast[idx], forecast[:, None], spend[:, None])
        with np.errstate(invalid="ignore"):
            crossed = values >= lines  # NaN (no forecast, padding) -> False: neither fires nor resolves
            under = values < lines * RESOLVE_MARGIN
        alarm = np.zeros_like(crossed)
        quiet = known & (spend < plan.enforce_line[idx])
        # Budgets sharing a state object (decoded from one cursor entry) and a threshold
        # list are checked once, as a group.
        row_of = {name: i for i, name in enumerate(self.names)}
        start_of: dict[Any, str] = {}
        groups: dict[tuple[int, int, str], list[int]] = {}
        members: dict[tuple[int, int, str], tuple[BudgetState, tuple[str, ...]]] = {}
        for name, st in previous.items():
            i = row_of.get(name)
            if i is None or positions[i] < 0:
                continue
            raw_start = self.rows[i][1]
            start = start_of.get(raw_start) or start_of.setdefault(raw_start, _iso_date(raw_start))
            keys = plan.keys[positions[i]]
            group = (id(st), id(keys), start)
            if group not in groups:
                groups[group], members[group] = [], (st, keys)
            groups[group].append(i)
        for group, rows in groups.items():
            st, keys = members[group]
            at = np.array(rows, dtype=np.int64)
            if st.enforcement or group[2] != st.period_start or not st.thresholds.keys() <= set(keys):
                quiet[at] = False
                continue
            for key, (state, _) in st.thresholds.items():
                if state == "alarm":
                    alarm[at, keys.index(key)] = True
        changes = (crossed & ~alarm) | (alarm & under)
        return quiet & ~changes.any(axis=1)


def evaluate_table(plan: ThresholdPlan, table: StatusTable, previous: Mapping[str, BudgetState], now: dt.datetime) -> tuple[Evaluation, int]:
    """:func:`evaluate` of every row of ``table``, at fleet scale: rows that change nothing
    (:meth:`StatusTable.quiet_rows`) are skipped, rows that start afresh (no state, or a
    new period, and nothing to enforce: a fleet's first evaluation, a month's first day)
    are advanced in numpy, with one shared state per outcome; the rest row by row. Same
    events, in the same order, and the same states. Returns the evaluation and how many
    rows went row by row."""
    import numpy as np

    quiet = table.quiet_rows(plan, previous)
    fresh = table.fresh_rows(plan, previous, quiet)
    detail = np.flatnonzero(~quiet & ~fresh).tolist()
    rows = [table.row(i) for i in detail]
    seen = [table.names[i] for i in np.flatnonzero(quiet | fresh)]
    out = evaluate(plan.budgets, rows, previous, now, unchanged=seen, plan=plan)
    if fresh.any():
        order = {id(r): i for r, i in zip(rows, detail)}
        _start_afresh(out, plan, table, np.flatnonzero(fresh).tolist(), order)
        out.alerts.sort(key=lambda ev: order[id(ev.row)])  # table order; stable within a row
    return out, len(rows)


def _start_afresh(out: Evaluation, plan: ThresholdPlan, table: StatusTable, at: list[int], order: dict[int, int]) -> None:
    """The rows ``at`` (see :meth:`StatusTable.fresh_rows`): a new state holding an alarm
    (episode 1) for every threshold crossed, and a trigger for each."""
    import numpy as np

    names = [table.names[i] for i in at]
    idx = np.array([plan.index[n] for n in names], dtype=np.int64)
    spend = np.array([table.rows[i][4] for i in at], dtype=float)
    forecast = np.array([table.rows[i][6] for i in at], dtype=float)  # None -> NaN
    with np.errstate(invalid="ignore"):
        crossed = np.where(plan.forecast[idx], forecast[:, None], spend[:, None]) >= plan.lines[idx]  # NaN: no
    shared: dict[tuple[Any, ...], BudgetState] = {}
    for r, i in enumerate(at):
        raw = table.rows[i]
        keys = plan.keys[idx[r]]
        hits = tuple(np.flatnonzero(crossed[r]).tolist())
        start, end = _iso_date(raw[1]), _day_after(raw[2])
        pattern = (start, end, id(keys), hits)
        st = shared.get(pattern)
        if st is None:
            st = shared[pattern] = BudgetState(start, end, {keys[j]: ["alarm", 1] for j in hits})
        out.state[names[r]] = st
        if hits:
            row = table.row(i)
            order[id(row)] = i
            out.alerts.extend(ThresholdEvent("trigger", names[r], keys[j], 1, row) for j in hits)


def _advance_thresholds(out: Evaluation, budget: Budget, keys: tuple[str, ...], row: StatusRow, st: BudgetState) -> None:
    amount = budget.amount_usd
    for th, key in zip(budget.thresholds, keys):
        value = row.spend_usd if th.basis == "actual" else row.forecast_usd
        if value is None:
            continue  # no forecast yet: neither fires nor resolves
        line = th.amount_usd(amount)
        current = st.thresholds.get(key)
        if value >= line:
            if current is None or current[0] == "resolved":
                episode = 1 if current is None else current[1] + 1
                st.thresholds[key] = ["alarm", episode]
                out.alerts.append(ThresholdEvent("trigger", budget.name, key, episode, row))
        elif current is not None and current[0] == "alarm" and value < line * RESOLVE_MARGIN:
            st.thresholds[key] = ["resolved", current[1]]
            if budget.notify_resolve:
                out.alerts.append(ThresholdEvent("resolve", budget.name, key, current[1], row))
    # Thresholds removed from the configuration are forgotten silently.
    for key in [k for k in st.thresholds if k not in keys]:
        del st.thresholds[key]


def _advance_enforcement(out: Evaluation, budget: Budget, row: StatusRow, st: BudgetState, now: dt.datetime) -> None:
    enf = budget.enforcement
    current = _follow_action_change(out, budget, st)
    if enf.action == "alert":
        return
    line = budget.amount_usd * enf.threshold_percent / 100.0
    over = row.spend_usd >= line and not period_end_passed(row.period_end, now)
    if over:
        _enforce_over_line(out, budget, row, st, current, now)
    elif current is not None:
        _relax_under_line(out, budget, row, st, current)


def _follow_action_change(out: Evaluation, budget: Budget, st: BudgetState) -> list[Any] | None:
    """When the action changed (or went back to plain alerts), undo what was done first;
    the budget's enforcement state afterwards."""
    enf = budget.enforcement
    current = st.enforcement
    if current and current[3] != enf.action:
        _revert_enforcement(out, budget.name, st, f"enforcement of {budget.name} changed from {current[3]} to {enf.action}")
        if st.enforcement:
            # Keep the episode count: a later apply needs a run key not used before.
            st.enforcement = ["reverted", st.enforcement[1], st.enforcement[2], enf.action]
        current = st.enforcement
    return current


def _enforce_over_line(out: Evaluation, budget: Budget, row: StatusRow, st: BudgetState, current: list[Any] | None, now: dt.datetime) -> None:
    """Spend is over the line: a new episode starts pending, and applies once the grace has passed."""
    enf = budget.enforcement
    if current is None or current[0] == "reverted":
        episode = 1 if current is None else current[1] + 1
        current = st.enforcement = ["pending", episode, _iso_now(now), enf.action]
    if current[0] == "pending":
        since = dt.datetime.fromisoformat(current[2])
        if now - since >= enf.grace:
            st.enforcement = ["active", current[1], current[2], enf.action]
            out.enforcement.append(
                EnforcementEvent(
                    "apply", budget.name, enf.action, current[1], row.period_start, row.period_end,
                    f"spend {money(row.spend_usd)} is over {enf.threshold_percent:g}% of {money(budget.amount_usd)}"
                    f" since {current[2]} (grace {enf.grace_period})",
                    row,
                )
            )


def _relax_under_line(out: Evaluation, budget: Budget, row: StatusRow, st: BudgetState, current: list[Any]) -> None:
    """Spend is back under the line: a pending episode is dropped, an active one reverted."""
    enf = budget.enforcement
    if current[0] == "pending":
        st.enforcement = None if current[1] <= 1 else ["reverted", current[1] - 1, current[2], current[3]]
    elif current[0] == "active":
        _revert_enforcement(
            out, budget.name, st,
            f"spend {money(row.spend_usd)} is back under {enf.threshold_percent:g}% of {money(budget.amount_usd)}",
            row,
        )


def _revert_enforcement(out: Evaluation, name: str, st: BudgetState, reason: str, row: StatusRow | None = None) -> None:
    current = st.enforcement
    if not current:
        return
    if current[0] == "active":
        out.enforcement.append(EnforcementEvent("revert", name, current[3], current[1], st.period_start, st.period_end, reason, row))
        st.enforcement = ["reverted", current[1], current[2], current[3]]
    elif current[0] == "pending":
        st.enforcement = None
