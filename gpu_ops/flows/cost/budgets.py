"""Budgets: recurring periods with a reset day, spend to date, forecast, thresholds.

Design: docs/concepts/budgets-and-alerts.md#budgets
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any, Sequence

import numpy as np
import pandas as pd

from gpu_ops.domain.config import Budget, parse_duration
from gpu_ops.flows.cost.attribution import label_values, utc
from gpu_ops.domain.cost.columns import DAILY_GROUPING, DAILY_KEYS, DAILY_SCHEMA, grouping_name
from gpu_ops.flows.cost.engine import values_table
from gpu_ops.domain.formatting import first_of

BUDGET_COLUMNS = (
    "budget", "period_start", "period_end", "amount_usd", "spend_usd", "percent_used", "forecast_usd",
    "status", "thresholds_crossed", "scope", "as_of", "period", "days_missing", "severity",
)
# Threshold severities, lowest first; "none": no threshold crossed.
SEVERITIES = ("none", "info", "warning", "critical")


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


# --------------------------------------------------------------------------- the daily table

DAILY_TABLE = "gpu_cost_daily"
# One row per day, kind and combination of DAILY_KEYS and the scoped labels (see scope_label_keys).
DAILY_COLUMNS = tuple(name for name, _ in DAILY_SCHEMA)
# A day that was computed and had no usage at all keeps one row of this kind (zero cost),
# so that it can be told apart from a day that was never computed.
NO_USAGE = "none"


def scope_label_keys(budgets: Sequence[Budget]) -> list[str]:
    """Label names some budget's scope filters on: the labels the daily table keeps."""
    return sorted({k for b in budgets for k in b.scope.labels})


def scope_keys(budgets: Sequence[Budget]) -> list[str]:
    """The grouping keys some budget's scope filters on: the only keys the daily table
    keeps, so that its size follows the budgets' scopes, not the product of every key
    (100k independent team × project × namespace × cost-center combinations a day)."""
    return [k for k in DAILY_KEYS if any(k in b.scope.as_filters() for b in budgets)]


def _scoped_labels(labels: pd.Series, keys: Sequence[str]) -> pd.Series:
    """The ``labels`` JSON of each row reduced to ``keys`` (sorted JSON, "{}" when none)."""
    if not keys or not len(labels):
        return pd.Series(np.full(len(labels), "{}", dtype=object), index=labels.index)
    values = pd.DataFrame({k: label_values(labels, k).astype(str).to_numpy() for k in keys})
    codes, uniques = pd.factorize(pd.MultiIndex.from_frame(values))
    text = [json.dumps({k: v for k, v in zip(keys, u) if v}, sort_keys=True) for u in uniques]
    return pd.Series(np.asarray(text, dtype=object)[codes], index=labels.index)


def daily_costs(rows: pd.DataFrame, days: Sequence[dt.date], label_keys: Sequence[str] = (), keys: Sequence[str] | None = None) -> pd.DataFrame:
    """Priced pieces (allocated and idle rows with a ``day`` column) -> one row per day,
    kind and scope-key combination (:data:`DAILY_COLUMNS`): the compact table that budget
    periods are summed from (:func:`daily_costs_sql` over the frame).

    Every day of ``days`` gets at least one row (kind :data:`NO_USAGE` when it had no
    usage). ``on_demand_usd`` is NaN for a group with any piece without an on-demand price.
    ``keys``: the grouping keys kept (:func:`scope_keys`; None: all of :data:`DAILY_KEYS`);
    the others are "" and recorded as not kept, so that a budget scoping on one later
    sees those days as lacking, never as zero.
    """
    import duckdb

    con = duckdb.connect()
    try:
        wanted = [c for c in ("day", "kind", *DAILY_KEYS, "labels", "gpu_hours", "cost_usd", "on_demand_usd") if c in rows.columns]
        con.register("daily_rows", rows[wanted] if len(rows.columns) else pd.DataFrame({"day": pd.Series([], dtype="datetime64[ns, UTC]")}))
        return daily_costs_sql(con, "SELECT * FROM daily_rows", days, label_keys, keys)
    finally:
        con.close()


def daily_costs_sql(con: Any, rows: str, days: Sequence[dt.date], label_keys: Sequence[str] = (), keys: Sequence[str] | None = None) -> pd.DataFrame:
    """:func:`daily_costs` of the rows of query ``rows`` on DuckDB connection ``con`` (the
    stored ``gpu_usage`` files, read where they lie): grouped in DuckDB, only the groups come back."""
    label_keys = sorted(label_keys)
    kept = list(DAILY_KEYS) if keys is None else [k for k in DAILY_KEYS if k in keys]
    marker = json.dumps(label_keys) if keys is None else json.dumps({"labels": label_keys, "keys": kept})
    present = {r[0] for r in con.execute(f"DESCRIBE {rows}").fetchall()}
    con.execute("SET TimeZone = 'UTC'")

    def text(c: str) -> str:
        return f"coalesce(CAST(r.{c} AS VARCHAR), '')" if c in present and c in (*kept, "kind") else "''"

    source = f"({rows}) r"
    labels = "'{}'"
    if label_keys and "labels" in present:
        texts = [t for (t,) in con.execute(f"SELECT DISTINCT CAST(labels AS VARCHAR) FROM ({rows})").fetchall()]
        scoped = _scoped_labels(pd.Series(texts, dtype=object), label_keys).tolist()
        values_table(con, "scoped_labels", {"labels": ("VARCHAR", texts), "scoped": ("VARCHAR", scoped)})
        source += " LEFT JOIN scoped_labels s ON s.labels IS NOT DISTINCT FROM CAST(r.labels AS VARCHAR)"
        labels = "coalesce(s.scoped, '{}')"
    od = "r.on_demand_usd" if "on_demand_usd" in present else "CAST(NULL AS DOUBLE)"
    names = ["kind", *DAILY_KEYS]
    sql = (
        f"SELECT CAST(r.day AS DATE) AS day, {', '.join(f'{text(c)} AS {c}' for c in names)}, {labels} AS labels, count(*) AS intervals, "
        f"sum(r.gpu_hours) AS gpu_hours, sum(r.cost_usd) AS cost_usd, CASE WHEN bool_or({od} IS NULL) THEN NULL ELSE sum({od}) END AS on_demand_usd "
        f"FROM {source} GROUP BY ALL"
    )
    table = con.execute(sql).df() if present >= {"day", "gpu_hours", "cost_usd"} else pd.DataFrame()
    return _daily_table(table, days, marker)


def _daily_table(table: pd.DataFrame, days: Sequence[dt.date], marker: str) -> pd.DataFrame:
    """The grouped days in :data:`DAILY_COLUMNS`' types and order, a :data:`NO_USAGE` row for
    each day of ``days`` without one."""
    if len(table):
        table = table.assign(day=[d.date() if hasattr(d, "date") else d for d in table["day"]], intervals=table["intervals"].astype("int64"))
    empty_days = sorted(set(days) - set(table["day"] if len(table) else ()))
    if empty_days:
        none = pd.DataFrame({"day": empty_days, "kind": NO_USAGE, **{k: "" for k in DAILY_KEYS}, "labels": "{}", "intervals": 0, "gpu_hours": 0.0, "cost_usd": 0.0, "on_demand_usd": 0.0})
        table = pd.concat([table, none], ignore_index=True) if len(table) else none
    table["label_keys"] = marker
    table["intervals"] = table["intervals"].astype("int64")
    for c in ("kind", *DAILY_KEYS, "labels", "label_keys"):
        table[c] = table[c].astype(object)
    for c in ("gpu_hours", "cost_usd", "on_demand_usd"):
        table[c] = table[c].astype(float)
    return table.sort_values(["day", "kind", *DAILY_KEYS, "labels"], kind="stable").reset_index(drop=True)[list(DAILY_COLUMNS)]


# --------------------------------------------------------------------------- spend per day


class SpendBook:
    """A period's daily table, indexed so that thousands of budgets are summed cheaply.

    Per day present: the whole bill, allocated and idle cost. Per set of scope keys (e.g.
    ``team``, or ``team`` + ``label:tier``): one matrix of allocated cost, key
    combination × day, built once and shared by every budget scoping on those keys.

    ``daily`` is gpu_cost_daily as stored, or as read per budget grain (a ``grouping``
    column, :func:`gpu_ops.domain.cost.columns.budget_groupings`): then the whole bill comes
    from the unscoped grain's rows and each scope's matrix from its own grain's rows, so
    a budget's cost follows the values of its own keys, not the table's other keys.
    """

    def __init__(self, daily: pd.DataFrame, idle: str = "row"):
        self.idle = idle
        # One row order whatever the table's read order (a day's sums then add up alike
        # whether it was read alone or in a range).
        order = [c for c in (DAILY_GROUPING, "day", "kind", *DAILY_KEYS, "labels") if c in daily]
        daily = daily.sort_values(order, kind="stable").reset_index(drop=True) if len(daily) and order else daily
        days = pd.to_datetime(daily["day"]).dt.date if len(daily) else pd.Series([], dtype=object)
        self.days: list[dt.date] = sorted(set(days))
        self._index = {d: i for i, d in enumerate(self.days)}
        kind = daily["kind"].astype(str).to_numpy() if len(daily) else np.array([], dtype=object)
        real = kind != NO_USAGE
        self._rows = daily[real].reset_index(drop=True)
        self._grouping = self._rows[DAILY_GROUPING].astype(str).to_numpy() if DAILY_GROUPING in daily else None
        self._day_idx = np.array([self._index[d] for d in days[real]], dtype=np.int64)
        self._alloc = (kind[real] != "idle")
        whole = np.ones(len(self._rows), bool) if self._grouping is None else self._grouping == ""
        cost = self._rows["cost_usd"].to_numpy(dtype=float) if len(self._rows) else np.array([])
        nd = len(self.days)
        self.total = np.bincount(self._day_idx, weights=np.where(whole, cost, 0.0), minlength=nd)
        alloc_d = np.bincount(self._day_idx, weights=np.where(self._alloc & whole, cost, 0.0), minlength=nd)
        idle_d = self.total - alloc_d
        self._share = np.zeros(nd)
        if idle == "share":
            np.divide(idle_d, alloc_d, out=self._share, where=alloc_d > 0)
        self.used = np.bincount(self._day_idx[whole], minlength=nd) > 0  # days with any usage (allocated or idle)
        self._groupings = set(daily[DAILY_GROUPING].astype(str)) if DAILY_GROUPING in daily else None
        self._label_keys = self._recorded_label_keys(daily, days)
        self._tables: dict[tuple[str, ...], tuple[dict[tuple[str, ...], int], np.ndarray]] = {}

    @staticmethod
    def _recorded_label_keys(daily: pd.DataFrame, days: pd.Series) -> dict[dt.date, set[str]]:
        """Per day, what its aggregate kept: label names, and ``key:<name>`` per grouping key."""
        if "label_keys" not in daily or not len(daily):
            return {d: {f"key:{k}" for k in DAILY_KEYS} for d in set(days)}
        out: dict[dt.date, set[str]] = {}
        for d, marker in zip(days, daily["label_keys"]):
            if d not in out:
                out[d] = _kept(marker)
        return out

    def lacking(self, filters: dict[str, str]) -> set[dt.date]:
        """Days present whose aggregate was built without a key or label this scope filters on."""
        need = {k[len("label:") :] if k.startswith("label:") else f"key:{k}" for k in filters}
        return {d for d, have in self._label_keys.items() if need - have} if need else set()

    def _table(self, keys: tuple[str, ...]) -> tuple[dict[tuple[str, ...], int], np.ndarray]:
        if keys not in self._tables:
            rows = self._alloc if self._grouping is None else self._alloc & (self._grouping == self._grain(keys))
            alloc = self._rows[rows]
            cols = [label_values(alloc["labels"], k[len("label:") :]).astype(str) if k.startswith("label:") else alloc[k].astype(str) for k in keys]
            combos = pd.MultiIndex.from_arrays([c.to_numpy() for c in cols]) if keys else None
            codes, uniques = pd.factorize(combos) if combos is not None and len(alloc) else (np.array([], np.int64), [])
            matrix = np.zeros((len(uniques), len(self.days)))
            np.add.at(matrix, (codes, self._day_idx[rows]), alloc["cost_usd"].to_numpy(dtype=float))
            self._tables[keys] = ({tuple(u): i for i, u in enumerate(uniques)}, matrix)
        return self._tables[keys]

    def _grain(self, keys: tuple[str, ...]) -> str:
        """The grouping that holds ``keys``' sums; a grain that was not read is an error, never a zero."""
        name = grouping_name(keys)
        if self._groupings is not None and self._rows.shape[0] and name not in self._groupings:
            raise ValueError(f"gpu_cost_daily was read without the budget grain {name!r} (read: {sorted(self._groupings)})")
        return name

    def spend(self, filters: dict[str, str]) -> np.ndarray:
        """Spend per day present (aligned with :attr:`days`) of the scope ``filters``.

        An unscoped budget covers the whole bill, idle fleet cost included. A scoped one
        covers its allocated cost, plus its share of the day's idle cost when idle is
        shared (the same weights as attribution: share of the day's allocated cost).
        """
        if not filters:
            return self.total
        keys = tuple(sorted(filters))
        index, matrix = self._table(keys)
        row = index.get(tuple(filters[k] for k in keys))
        if row is None:
            return np.zeros(len(self.days))
        scoped = matrix[row]
        return scoped + scoped * self._share if self.idle == "share" else scoped


def _kept(marker: Any) -> set[str]:
    """A day's ``label_keys`` marker: a JSON list of labels (every key kept) or
    ``{"labels": [...], "keys": [...]}``."""
    value = json.loads(marker) if isinstance(marker, str) and marker else []
    if isinstance(value, dict):
        return set(value.get("labels", [])) | {f"key:{k}" for k in value.get("keys", [])}
    return set(value) | {f"key:{k}" for k in DAILY_KEYS}


def _days(start: dt.date, end: dt.date) -> list[dt.date]:
    """``[start, end]``, inclusive."""
    return [start + dt.timedelta(days=i) for i in range((end - start).days + 1)]


def _overlap_s(days: Any, lo: pd.Timestamp, hi: pd.Timestamp) -> float:
    """Seconds of ``[lo, hi)`` that fall on ``days``."""
    total = 0.0
    for d in days:
        a = max(lo, utc(pd.Timestamp(d)))
        b = min(hi, utc(pd.Timestamp(d + dt.timedelta(days=1))))
        total += max((b - a).total_seconds(), 0.0)
    return total


def evaluate_budget(budget: Budget, book: SpendBook, day: dt.date, as_of: Any, expected_from: dt.date | None = None) -> dict[str, Any]:
    """Status of ``budget`` for the period containing ``day``, from the daily table.

    Days of the period up to ``day`` (from ``expected_from``, the first day data can
    exist, when later) that the table lacks are counted in ``days_missing``, never read
    as zero: spend is the sum of the days present, the forecast's history counts only
    days present, and its run-rate is carried over the missing days as over the rest of
    the period.
    """
    start, end = period_bounds(budget, day)
    as_of_ts = min(utc(as_of), utc(pd.Timestamp(end)))
    filters = budget.scope.as_filters()
    lacking = book.lacking(filters)
    present = np.array([start <= d <= day and d not in lacking for d in book.days], bool)
    expected = _days(max(start, expected_from or start), day) if day >= max(start, expected_from or start) else []
    have = {d for d, p in zip(book.days, present) if p}
    missing = [d for d in expected if d not in have]
    spend = float(book.spend(filters)[present].sum()) if present.any() else 0.0

    # History starts at the period start, or on the day of the first usage seen in it
    # when data begins later (a system installed mid-month must not forecast from empty days).
    forecast = None
    used = [d for d, p, u in zip(book.days, present, book.used) if p and u]
    if used:
        history_start = max(utc(pd.Timestamp(start)), utc(pd.Timestamp(min(used))))
        missing_s = _overlap_s([d for d in missing if d >= min(used)], history_start, as_of_ts)
        history_s = (as_of_ts - history_start).total_seconds() - missing_s
        if history_s > 0 and dt.timedelta(seconds=history_s) >= parse_duration(budget.forecast_min_history):
            remaining = max((utc(pd.Timestamp(end)) - as_of_ts).total_seconds(), 0.0)
            forecast = spend + spend / history_s * (remaining + missing_s)

    crossed, severity = _crossed(budget, spend, forecast)
    status = "exceeded" if spend >= budget.amount_usd else "warning" if severity in ("warning", "critical") else "ok"
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
        "days_missing": len(missing),
        "severity": "critical" if spend >= budget.amount_usd else severity,
        "_missing": missing,
    }


def _crossed(budget: Budget, spend: float, forecast: float | None) -> tuple[list[str], str]:
    """The keys of the thresholds ``spend`` (or the forecast) crossed, and the highest of their severities."""
    crossed: list[str] = []
    worst = 0
    for th in budget.thresholds:
        value = spend if th.basis == "actual" else forecast
        if value is not None and value >= th.amount_usd(budget.amount_usd):
            crossed.append(th.key())
            worst = max(worst, SEVERITIES.index(th.effective_severity(budget.amount_usd)))
    return crossed, SEVERITIES[worst]


def evaluate_budgets(budgets: Sequence[Budget], daily: pd.DataFrame, day: dt.date, as_of: Any, idle: str = "row", expected_from: dt.date | None = None) -> pd.DataFrame:
    """One row per budget (columns :data:`BUDGET_COLUMNS`); ``forecast_usd`` NaN when withheld.

    ``daily`` is the daily table (:func:`daily_costs`), or priced pieces covering every
    day from the earliest period start to ``day`` (they are aggregated first). The
    frame's ``attrs["missing_days"]`` maps each budget with missing days to them.
    """
    return evaluate_budget_days(budgets, daily, [(day, as_of)], idle, expected_from)[0]


def evaluate_budget_days(
    budgets: Sequence[Budget], daily: pd.DataFrame, days: Sequence[tuple[dt.date, Any]], idle: str = "row", expected_from: dt.date | None = None,
) -> list[pd.DataFrame]:
    """:func:`evaluate_budgets` for each ``(day, as_of)`` of a range, from one daily table
    covering all their periods (a range backfill's one read). Each day sees only the days
    of its period up to itself, so it equals that day evaluated alone."""
    first, last = min(d for d, _ in days), max(d for d, _ in days)
    if "label_keys" not in daily:
        if "day" not in daily:
            # An empty frame without columns could only be read as "no usage": every day present at zero.
            raise ValueError("budgets are evaluated from the daily table (gpu_cost_daily, columns DAILY_COLUMNS) or priced usage pieces (with a 'day' column)")
        daily = daily_costs(daily, _days(earliest_period_start(budgets, first), last), scope_label_keys(budgets))
    book = SpendBook(daily, idle)
    return [_status_table(budgets, book, day, as_of, expected_from) for day, as_of in days]


def _status_table(budgets: Sequence[Budget], book: SpendBook, day: dt.date, as_of: Any, expected_from: dt.date | None) -> pd.DataFrame:
    records = [evaluate_budget(b, book, day, as_of, expected_from) for b in budgets]
    missing = {r["budget"]: [d.isoformat() for d in r.pop("_missing")] for r in records}
    df = pd.DataFrame(records, columns=list(BUDGET_COLUMNS))
    df["forecast_usd"] = df["forecast_usd"].astype(float)
    df["days_missing"] = df["days_missing"].astype("int64")
    df.attrs["missing_days"] = {b: ds for b, ds in missing.items() if ds}
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



def missing_days_outcome(status: pd.DataFrame) -> tuple[bool, str, list[str]]:
    """(passed, description, missing days) of the period-days-present check."""
    per_budget: dict[str, list[str]] = status.attrs.get("missing_days", {})
    days = sorted({d for ds in per_budget.values() for d in ds})
    if not days:
        return True, "every day of every budget period so far has its daily costs", []
    shown, names = first_of(days, 10), first_of(sorted(per_budget), 10)
    return False, f"no gpu_cost_daily for {shown}: spend of {names} leaves those days out (unknown, not zero); materialize them", days
