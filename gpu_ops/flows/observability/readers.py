"""The bounded reads behind each metric family, from the gpu_ops database and the row-level
Parquet files of ``gpu_usage``.

Design: docs/concepts/observability.md#the-reads-behind-each-family
"""

from __future__ import annotations

import datetime as dt
import json
import re
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import duckdb
import pandas as pd
import sqlalchemy as sa

from gpu_ops.flows.alerts.intraday import read_accrual
from gpu_ops.storage.quota import DB_NOW_SQL
from gpu_ops.domain.metrics import Snapshot, month_start
from gpu_ops.storage.files import PartitionFiles
from gpu_ops.storage.tables import PARTITION_COLUMN, TableStore

LEDGER = "gpu_usage_ledger"
LEASES = "gpu_ops_gpu_leases"
ATTEMPTS = "gpu_ops_training_attempts"  # gpu_ops.storage.attempt_store.ATTEMPT_TABLE
# An attempt whose owner beat within this many seconds is live (owners beat every 2 s).
LIVE_OWNER_S = 30.0
DELIVERIES = "gpu_alert_deliveries"
DEAD_LETTERS = "gpu_alert_dead_letters"
USAGE = "gpu_usage"
ATTRIBUTION = "gpu_cost_attribution"
ESTIMATES = "gpu_launch_estimates"  # gpu_ops.storage.estimate_store.ESTIMATE_TABLE
ANOMALIES = "gpu_spend_anomalies"
INTRADAY = "intraday"  # gpu_usage_ledger and gpu_ops_training_attempts after the newest gpu_budget_status day
# Below Prometheus' default scrape_timeout (10 s), which the chart's ServiceMonitor keeps:
# what is left of it renders the families and sends them.
DEFAULT_DEADLINE_S = 8.0

# A timestamp column as Unix seconds, per dialect. SQLite keeps them as ISO text; its
# julianday doubles are good to ~40 µs, so the seconds are rounded to the millisecond
# (exact for the ledger's times; a third of strftime's cost per row).
_EPOCH = {
    "sqlite": "ROUND((julianday({c}) - 2440587.5) * 86400.0, 3)",
    "postgresql": "EXTRACT(EPOCH FROM {c})",
}
HARDWARE_KEYS = ("kind", "team", "gpu_type", "capacity_type")
POD_KEYS = ("namespace", "pod", "gpu_type", "capacity_type")
HISTORY_SOURCES = (LEDGER, DELIVERIES, DEAD_LETTERS)
_LABEL_NAME = re.compile(r"(?!__)[A-Za-z_][A-Za-z0-9_]*")  # what Prometheus takes as a label name

Step = Callable[[float | None], dict[str, Any]]  # statements' deadline (time.monotonic(), None: none) -> Snapshot fields


def _q(name: str) -> str:
    return f'"{name}"'


class _Job:
    """One source's read in its own thread: ``done`` is set once ``result`` or ``error`` is."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.result: dict[str, Any] = {}
        self.error: str | None = None


class Reader:
    """Reads one :class:`Snapshot` from a store; ``quotas`` is ``compute.quotas`` as
    ``{"team": {...}, "pool": {...}}``; ``per_pod`` adds the per-pod rows; ``files``: the
    row-level Parquet store (``storage.row_level_path``) that holds ``gpu_usage``.

    The append-only tables (ledger, alert deliveries, dead letters) are summed over their
    whole history, which grows; their sums are re-read at most every ``history_s``
    seconds (the newest-partition sources on every read). A restart or another replica
    reads the same sums from the same rows. Every read ends within ``deadline_s``; sums
    that take longer are read on in the background (bounded by the statement timeout) and
    served once they are in, the last sums meanwhile (counters never vanish for a slow read).
    """

    def __init__(
        self, store: TableStore, *, quotas: Mapping[str, Mapping[str, int]] | None = None, per_pod: bool = False, history_s: float = 0.0,
        files: PartitionFiles | None = None, deadline_s: float = DEFAULT_DEADLINE_S, config: Any = None, clock: Callable[[], dt.datetime] | None = None,
    ):
        self.store, self.per_pod, self.history_s, self.files, self.deadline_s = store, per_pod, history_s, files, deadline_s
        # The configuration (prices) that intraday spend is priced with; without one, no intraday source.
        self.config, self.clock = config, clock or (lambda: dt.datetime.now(dt.timezone.utc))
        self._history: dict[str, tuple[float, dict[str, Any]]] = {}  # append-only source -> (when read, its fields)
        self.quotas = {k: dict(v) for k, v in (quotas or {}).items()}
        self.epoch = _EPOCH[store.dialect]
        self.db_now = DB_NOW_SQL[store.dialect]  # the clock the leases and attempt records keep
        self._in_flight: set[str] = set()
        self._lock = threading.Lock()

    # ---- one read, under one deadline

    def steps(self) -> dict[str, Step]:
        """Each source (as ``gpu_ops_exporter_read_ok`` names it) and its read."""
        sql = self._sql
        return {
            "gpu_cost_daily": sql(self._daily),
            USAGE: self._usage_files if self.files is not None else sql(self._hardware),
            "gpu_roi_report": sql(self._roi),
            ATTRIBUTION: sql(self._efficiency),
            "gpu_budget_status": sql(self._budgets),
            DELIVERIES: sql(self._deliveries),
            DEAD_LETTERS: sql(self._dead_letters),
            LEDGER: sql(self._ledger),
            LEASES: sql(self._leases),
            ATTEMPTS: sql(self._waiting),
            "gpu_usage_quarantine": sql(self._quarantine),
            ESTIMATES: sql(self._estimates),
            ANOMALIES: sql(self._anomalies),
            **({INTRADAY: self._intraday} if self.config is not None else {}),
        }

    def read(self, deadline: float | None = None) -> Snapshot:
        """Every source, each read ending by ``deadline`` (a ``time.monotonic()`` instant;
        default: ``deadline_s`` from now)."""
        s = Snapshot(quotas=self.quotas)
        started = time.monotonic()
        deadline = started + self.deadline_s if deadline is None else deadline
        jobs: dict[str, _Job] = {}
        for source, step in self.steps().items():
            s.sources.append(source)
            kept = self._history.get(source)
            if kept is not None and started - kept[0] < self.history_s:
                _merge(s, kept[1])  # summed less than history_s ago (by this scrape or a late read)
                continue
            job = self._start(source, step, deadline)
            if job is None:
                s.errors[source] = (
                    "still waiting on the database since an earlier scrape (it is slow or silent): "
                    "read again once that read ends (storage.connect_timeout_s and storage.statement_timeout_s bound it)"
                )
            else:
                jobs[source] = job
        for source, job in jobs.items():
            self._collect(s, source, job, deadline)
        for source in HISTORY_SOURCES:
            kept = self._history.get(source)
            if source in s.errors and kept is not None:
                _merge(s, kept[1])  # counters keep the last sums read rather than vanish
        s.read_seconds = time.monotonic() - started
        return s

    def in_flight(self) -> frozenset[str]:
        """The sources whose read is still under way (past an earlier scrape's deadline)."""
        with self._lock:
            return frozenset(self._in_flight)

    def _start(self, source: str, step: Step, deadline: float) -> _Job | None:
        """Start ``step`` in a thread of its own (None: the source's last read is still going).
        The sums of the append-only tables are not cut at the deadline: a read that ends
        after it is kept for the next scrapes (``history_s``); the others' statements are."""
        with self._lock:
            if source in self._in_flight:
                return None
            self._in_flight.add(source)
        job = _Job()
        history = source in HISTORY_SOURCES

        def run() -> None:
            try:
                job.result = step(None if history else deadline)
                if history:
                    with self._lock:
                        self._history[source] = (time.monotonic(), job.result)
            except Exception as exc:  # noqa: BLE001 - one failing source must not hide the others
                err = self.store.unavailable(exc) or exc
                job.error = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
            finally:
                with self._lock:
                    self._in_flight.discard(source)
                job.done.set()

        threading.Thread(target=run, name=f"gpu-ops-read-{source}", daemon=True).start()
        return job

    def _collect(self, s: Snapshot, source: str, job: _Job, deadline: float) -> None:
        if not job.done.wait(max(0.0, deadline - time.monotonic())):
            s.errors[source] = (
                f"no answer within the scrape deadline ({self.deadline_s:g} s, gpu-ops exporter --deadline-seconds): "
                "the database is slow or silent; the read goes on in the background"
            )
        elif job.error is not None:
            s.errors[source] = job.error
        else:
            _merge(s, job.result)

    def _sql(self, step: Callable[[sa.Connection], dict[str, Any]]) -> Step:
        def run(deadline: float | None) -> dict[str, Any]:
            with self.store.reading(deadline) as conn:
                return step(conn)

        return run

    # ---- helpers

    def _rows(self, conn: sa.Connection, sql: str, **params: Any) -> list[dict[str, Any]]:
        return [dict(r._mapping) for r in conn.execute(sa.text(sql), params)]

    def _column_types(self, conn: sa.Connection, table: str) -> dict[str, Any] | None:
        insp = sa.inspect(conn)
        return {c["name"]: c["type"] for c in insp.get_columns(table)} if insp.has_table(table) else None

    def _columns(self, conn: sa.Connection, table: str) -> set[str] | None:
        types = self._column_types(conn, table)
        return None if types is None else set(types)

    def _newest(self, conn: sa.Connection, table: str) -> str | None:
        if self._columns(conn, table) is None:
            return None
        value = conn.execute(sa.text(f"SELECT MAX({_q(PARTITION_COLUMN)}) FROM {_q(table)}")).scalar()
        return None if value is None else str(value)

    def _newest_usage(self, conn: sa.Connection) -> str | None:
        """The newest ``gpu_usage`` day, from its files when it is row-level."""
        if self.files is not None:
            keys = self.files.partitions(USAGE)
            return keys[-1] if keys else None
        return self._newest(conn, USAGE)

    def _month(self, conn: sa.Connection, table: str, newest: str | None, keys: list[str], values: list[str]) -> list[dict[str, Any]]:
        """``values`` summed per partition and ``keys`` over the newest partition's month."""
        cols = self._columns(conn, table)
        if newest is None or cols is None:
            return []
        keys = [k for k in keys if k in cols]
        sums = ", ".join(f"SUM({_q(v)}) AS {_q(v)}" for v in values if v in cols)
        group = ", ".join(_q(c) for c in [PARTITION_COLUMN, *keys])
        sql = f"SELECT {group}, {sums} FROM {_q(table)} WHERE {_q(PARTITION_COLUMN)} >= :lo AND {_q(PARTITION_COLUMN)} <= :hi GROUP BY {group}"
        return self._rows(conn, sql, lo=month_start(newest), hi=newest)

    def _grouped(self, conn: sa.Connection, table: str, keys: list[str] | tuple[str, ...], values: Mapping[str, str], where: str = "", **params: Any) -> list[dict[str, Any]]:
        cols = self._columns(conn, table)
        if cols is None:
            return []
        present = [k for k in keys if k in cols]
        group = ", ".join(_q(k) for k in present)
        sums = ", ".join(f"{expr} AS {_q(alias)}" for alias, expr in values.items())
        sql = f"SELECT {group + ', ' if group else ''}{sums} FROM {_q(table)} {where}" + (f" GROUP BY {group}" if group else "")
        return self._rows(conn, sql, **params)

    # ---- sources

    def _daily(self, conn: sa.Connection) -> dict[str, Any]:
        newest = self._newest(conn, "gpu_cost_daily")
        rows = self._month(conn, "gpu_cost_daily", newest, ["kind", "team", "project", "namespace", "cost_center"], ["gpu_hours", "cost_usd", "on_demand_usd"])
        return {"newest": {"gpu_cost_daily": newest}, "daily": rows}

    def _roi(self, conn: sa.Connection) -> dict[str, Any]:
        newest = self._newest(conn, "gpu_roi_report")
        values = ["spot_savings_usd", "reserved_savings_usd", "sharing_savings_usd", "preemption_waste_usd", "preemption_lost_gpu_hours"]
        # The __total__ row repeats the teams' figures (plus fleet-wide idle waste, which
        # gpu_ops_cost_usd{kind="idle"} carries): teams only, so sums do not double.
        rows = [r for r in self._month(conn, "gpu_roi_report", newest, ["team"], values) if r.get("team") != "__total__"]
        return {"newest": {"gpu_roi_report": newest}, "roi": rows}

    def _hardware(self, conn: sa.Connection) -> dict[str, Any]:
        newest = self._newest(conn, USAGE)
        out: dict[str, Any] = {"newest": {USAGE: newest}}
        if newest is None:
            return out
        where = f"WHERE {_q(PARTITION_COLUMN)} = :p"
        sums = {"gpu_hours": 'SUM("gpu_hours")', "cost_usd": 'SUM("cost_usd")'}
        out["hardware"] = self._grouped(conn, USAGE, HARDWARE_KEYS, sums, where, p=newest)
        if self.per_pod:
            out["pods"] = self._grouped(conn, USAGE, POD_KEYS, sums, where + " AND \"kind\" = 'allocated'", p=newest)
        return out

    def _usage_files(self, _deadline: float | None) -> dict[str, Any]:
        """:meth:`_hardware` over the newest day's Parquet file (row-level storage), summed by DuckDB."""
        assert self.files is not None
        keys = self.files.partitions(USAGE)
        newest = keys[-1] if keys else None
        out: dict[str, Any] = {"newest": {USAGE: newest}}
        if newest is None:
            return out

        path = str(self.files.path(USAGE, newest))
        con = duckdb.connect()
        try:
            present = {r[0] for r in con.execute("DESCRIBE SELECT * FROM read_parquet(?)", [path]).fetchall()}
            out["hardware"] = _parquet_grouped(con, path, present, HARDWARE_KEYS, "")
            if self.per_pod:
                out["pods"] = _parquet_grouped(con, path, present, POD_KEYS, "WHERE CAST(\"kind\" AS VARCHAR) = 'allocated'" if "kind" in present else "")
        finally:
            con.close()
        return out

    def _efficiency(self, conn: sa.Connection) -> dict[str, Any]:
        newest = self._newest(conn, ATTRIBUTION)
        types = self._column_types(conn, ATTRIBUTION) or {}
        out: dict[str, Any] = {"newest": {ATTRIBUTION: newest}}
        if newest is None or "efficiency" not in types:
            return out
        # The table's grain: its text columns (the usage.group_by keys it was written with).
        keys = [c for c, t in types.items() if isinstance(t, sa.String) and c != PARTITION_COLUMN and _LABEL_NAME.fullmatch(c)]
        select = ", ".join(_q(c) for c in [*keys, "efficiency", "active_gpu_hours", "unused_cost_usd"])
        sql = f'SELECT {select} FROM {_q(ATTRIBUTION)} WHERE {_q(PARTITION_COLUMN)} = :p AND "efficiency" IS NOT NULL'
        out.update(efficiency=self._rows(conn, sql, p=newest), efficiency_keys=tuple(keys))
        return out

    def _budgets(self, conn: sa.Connection) -> dict[str, Any]:
        newest = self._newest(conn, "gpu_budget_status")
        cols = self._columns(conn, "gpu_budget_status") or set()
        out: dict[str, Any] = {"newest": {"gpu_budget_status": newest}}
        if newest is None:
            return out
        wanted = ["budget", "period", "amount_usd", "spend_usd", "percent_used", "forecast_usd", "status", "thresholds_crossed", "days_missing", "severity"]
        select = ", ".join(_q(c) if c in cols else f"NULL AS {_q(c)}" for c in wanted)
        rows = self._rows(conn, f'SELECT {select} FROM "gpu_budget_status" WHERE {_q(PARTITION_COLUMN)} = :p', p=newest)
        for r in rows:
            crossed = r.get("thresholds_crossed")
            r["thresholds_crossed"] = len(json.loads(crossed)) if isinstance(crossed, str) and crossed else (len(crossed) if isinstance(crossed, list) else None)
        out["budgets"] = rows
        return out

    def _deliveries(self, conn: sa.Connection) -> dict[str, Any]:
        return {"deliveries": self._grouped(conn, DELIVERIES, ["budget", "channel", "channel_type", "status"], {"n": "COUNT(*)"})}

    def _dead_letters(self, conn: sa.Connection) -> dict[str, Any]:
        return {"dead_letters": self._grouped(conn, DEAD_LETTERS, ["budget"], {"n": "COUNT(*)"})}

    def _ledger(self, conn: sa.Connection) -> dict[str, Any]:
        cols = self._columns(conn, LEDGER)
        if cols is None:
            return {"attempts": [], "recoveries": []}
        start, end = self.epoch.format(c='"start"'), self.epoch.format(c='"end"')
        gpus = '("gpu_count" * COALESCE("gpu_share", 1.0))'
        attempts = self._grouped(
            conn, LEDGER, ["asset_key", "team", "gpu_type", "capacity_type", "outcome"],
            {"n": "COUNT(*)", "gpu_seconds": f"SUM({gpus} * ({end} - {start}))", "lost_gpu_seconds": f'SUM({gpus} * COALESCE("lost_seconds", 0))'},
        )
        # Recovery: from a preempted attempt's end to the next attempt of the same run and asset.
        window = 'OVER (PARTITION BY "run_id", "asset_key" ORDER BY "attempt", "start")'
        sql = (
            f'SELECT "asset_key", "team", COUNT(*) AS "n", SUM("next_start" - "end_s") AS "seconds" FROM ('
            f'SELECT "asset_key", "team", "outcome", {end} AS "end_s", LEAD({start}) {window} AS "next_start" FROM {_q(LEDGER)}'
            ') AS attempts WHERE "outcome" = \'preempted\' AND "next_start" IS NOT NULL GROUP BY "asset_key", "team"'
        )
        return {"attempts": attempts, "recoveries": self._rows(conn, sql)}

    def _leases(self, conn: sa.Connection) -> dict[str, Any]:
        if self._columns(conn, LEASES) is None:
            return {}
        rows = self._rows(conn, f'SELECT "team", "pools", "gpus", "expires_at", {self.db_now} AS "now" FROM {_q(LEASES)}')
        return {"leases": [
            {"team": r["team"], "pools": tuple(json.loads(r["pools"] or "[]")), "gpus": int(r["gpus"]), "live": float(r["expires_at"]) >= float(r["now"])}
            for r in rows
        ]}

    def _waiting(self, conn: sa.Connection) -> dict[str, Any]:
        """Attempts still ``planned`` (waiting for GPU quota admission) whose owner is live."""
        if self._columns(conn, ATTEMPTS) is None:
            return {}
        sql = f'SELECT "bill" FROM {_q(ATTEMPTS)} WHERE "state" = \'planned\' AND {self.db_now} - "beat_at" < :live'
        return {"waiting": [_bill_team_gpus(r["bill"]) for r in self._rows(conn, sql, live=LIVE_OWNER_S)]}

    def _quarantine(self, conn: sa.Connection) -> dict[str, Any]:
        newest = self._newest_usage(conn)  # the day the usage figures are of
        if newest is None:
            return {}
        return {"quarantine": self._grouped(conn, "gpu_usage_quarantine", ["source", "field"], {"n": "COUNT(*)"}, f"WHERE {_q(PARTITION_COLUMN)} = :p", p=newest)}


    def _estimates(self, conn: sa.Connection) -> dict[str, Any]:
        """The newest launch estimate of each training asset."""
        if self._columns(conn, ESTIMATES) is None:
            return {}
        t = _q(ESTIMATES)
        newest = f'SELECT "asset_key", MAX("estimated_at") AS "at" FROM {t} GROUP BY "asset_key"'
        sql = (f'SELECT e."asset_key", e."capacity", e."basis", e."estimate_usd", e."estimate_p90_usd" FROM {t} AS e '
               f'JOIN ({newest}) AS n ON e."asset_key" = n."asset_key" AND e."estimated_at" = n."at"')
        rows = self._rows(conn, sql)
        return {"estimates": list({r["asset_key"]: r for r in rows}.values())}  # one per asset (two attempts estimated at one instant)

    def _anomalies(self, conn: sa.Connection) -> dict[str, Any]:
        newest = self._newest(conn, ANOMALIES)
        if newest is None:
            return {}
        sql = f'SELECT "dimension", "key", "score", "baseline_usd" FROM {_q(ANOMALIES)} WHERE {_q(PARTITION_COLUMN)} = :p'
        return {"newest": {ANOMALIES: newest}, "anomalies": self._rows(conn, sql, p=newest)}

    def _intraday(self, deadline: float | None) -> dict[str, Any]:
        """Training cost after the newest gpu_budget_status partition's day, priced as
        budget_alert_sensor prices it (:func:`gpu_ops.flows.alerts.intraday.read_accrual`), per
        team, project, asset and state; every read of it on the read-only connections of
        the other sources, under the same deadline."""
        with self.store.reading(deadline) as conn:
            newest = self._newest(conn, "gpu_budget_status")
        if newest is None:
            return {}
        since = pd.Timestamp(dt.date.fromisoformat(newest[:10]) + dt.timedelta(days=1)).tz_localize("UTC")
        accrual = read_accrual(self.config, self.store, since, pd.Timestamp(self.clock()).tz_convert("UTC"), deadline=deadline)
        if accrual.empty:
            return {"intraday": []}
        frame = accrual.frame.assign(cost_usd=accrual.cost_since(since), state=accrual.frame["settled"].map({True: "settled", False: "running"}))
        sums = frame.groupby(["team", "project", "asset_key", "state"], as_index=False)["cost_usd"].sum()
        return {"intraday": sums.to_dict("records")}


def _merge(s: Snapshot, result: Mapping[str, Any]) -> None:
    for name, value in result.items():
        if name == "newest":
            s.newest.update(value)
        else:
            setattr(s, name, value)


def _parquet_grouped(con: Any, path: str, present: set[str], keys: tuple[str, ...], where: str) -> list[dict[str, Any]]:
    """GPU-hours and cost of one Parquet file summed by DuckDB per ``keys`` (a key the file lacks reads as null)."""
    select = ", ".join(f"CAST({_q(k)} AS VARCHAR) AS {_q(k)}" if k in present else f"NULL AS {_q(k)}" for k in keys)
    sums = ", ".join(f"SUM({_q(v)}) AS {_q(v)}" if v in present else f"NULL AS {_q(v)}" for v in ("gpu_hours", "cost_usd"))
    result = con.execute(f"SELECT {select}, {sums} FROM read_parquet(?) {where} GROUP BY ALL", [path])
    names = [d[0] for d in result.description]
    return [dict(zip(names, row)) for row in result.fetchall()]


def _bill_team_gpus(bill: str | None) -> dict[str, Any]:
    """The team and GPU count of an attempt record's bill (JSON)."""
    data = json.loads(bill or "{}")
    return {"team": str(data.get("team") or ""), "gpus": int(data.get("gpu_count") or 0)}
