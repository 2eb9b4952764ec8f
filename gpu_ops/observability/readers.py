"""The bounded reads behind each metric family, from the gpu_ops database (SQLite or
PostgreSQL, through :class:`~gpu_ops.storage.tables.TableStore`).

Every read is an aggregate the database computes, over the newest partition or the
newest month of partitions of a cost table, or over an append-only table (ledger, alert
deliveries, dead letters) grouped into a few rows: a scrape never loads history into
Python. A table that does not exist yet gives no rows; a read that fails is recorded in
``Snapshot.errors`` (the exporter logs it and serves ``gpu_ops_exporter_read_ok 0``)
while the other sources are still served.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from typing import Any

import sqlalchemy as sa

from gpu_ops.compute.quota import DB_NOW_SQL
from gpu_ops.observability.metrics import FRESHNESS_TABLES, Snapshot, month_start
from gpu_ops.storage.tables import PARTITION_COLUMN, TableStore

LEDGER = "gpu_usage_ledger"
LEASES = "gpu_ops_gpu_leases"
ATTEMPTS = "gpu_ops_training_attempts"  # gpu_ops.training.attempt_store.ATTEMPT_TABLE
# An attempt whose owner beat within this many seconds is live (owners beat every 2 s).
LIVE_OWNER_S = 30.0
DELIVERIES = "gpu_alert_deliveries"
DEAD_LETTERS = "gpu_alert_dead_letters"

# A timestamp column as Unix seconds, per dialect. SQLite keeps them as ISO text; its
# julianday doubles are good to ~40 µs, so the seconds are rounded to the millisecond
# (exact for the ledger's times; a third of strftime's cost per row).
_EPOCH = {
    "sqlite": "ROUND((julianday({c}) - 2440587.5) * 86400.0, 3)",
    "postgresql": "EXTRACT(EPOCH FROM {c})",
}

def _q(name: str) -> str:
    return f'"{name}"'


HISTORY_SOURCES = (LEDGER, DELIVERIES, DEAD_LETTERS)


class Reader:
    """Reads one :class:`Snapshot` from a store; ``quotas`` is ``compute.quotas`` as
    ``{"team": {...}, "pool": {...}}``; ``per_pod`` adds the per-pod rows.

    The append-only tables (ledger, alert deliveries, dead letters) are summed over their
    whole history, which grows; their sums are re-read at most every ``history_s``
    seconds (the newest-partition sources on every read). A restart or another replica
    reads the same sums from the same rows.
    """

    def __init__(self, store: TableStore, *, quotas: Mapping[str, Mapping[str, int]] | None = None, per_pod: bool = False, history_s: float = 0.0):
        self.store, self.per_pod, self.history_s = store, per_pod, history_s
        self._history: tuple[float, dict[str, Any]] | None = None
        self.quotas = {k: dict(v) for k, v in (quotas or {}).items()}
        self.epoch = _EPOCH[store.dialect]
        self.db_now = DB_NOW_SQL[store.dialect]  # the clock the leases and attempt records keep

    # ---- helpers

    def _rows(self, conn: sa.Connection, sql: str, **params: Any) -> list[dict[str, Any]]:
        return [dict(r._mapping) for r in conn.execute(sa.text(sql), params)]

    def _columns(self, conn: sa.Connection, table: str) -> set[str] | None:
        insp = sa.inspect(conn)
        return {c["name"] for c in insp.get_columns(table)} if insp.has_table(table) else None

    def _newest(self, conn: sa.Connection, table: str) -> str | None:
        if self._columns(conn, table) is None:
            return None
        value = conn.execute(sa.text(f"SELECT MAX({_q(PARTITION_COLUMN)}) FROM {_q(table)}")).scalar()
        return None if value is None else str(value)

    # ---- sources

    def read(self) -> Snapshot:
        s = Snapshot(quotas=self.quotas)
        started = time.perf_counter()
        steps: dict[str, Callable[[sa.Connection, Snapshot], None]] = {
            "partitions": self._partitions,
            "gpu_cost_daily": self._daily,
            "gpu_usage": self._hardware,
            "gpu_roi_report": self._roi,
            "gpu_cost_attribution": self._efficiency,
            "gpu_budget_status": self._budgets,
            DELIVERIES: self._deliveries,
            DEAD_LETTERS: self._dead_letters,
            LEDGER: self._ledger,
            LEASES: self._leases,
            ATTEMPTS: self._waiting,
            "gpu_usage_quarantine": self._quarantine,
        }
        reuse = self._history is not None and time.monotonic() - self._history[0] < self.history_s
        for source, step in steps.items():
            s.sources.append(source)
            if reuse and source in HISTORY_SOURCES:
                continue
            try:
                with self.store.engine.connect() as conn:
                    step(conn, s)
            except Exception as exc:  # noqa: BLE001 - one failing source must not hide the others
                err = self.store.unavailable(exc) or exc
                s.errors[source] = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
        fields = ("attempts", "recoveries", "deliveries", "dead_letters")
        if reuse and self._history is not None:
            for name in fields:
                setattr(s, name, self._history[1][name])
        elif not set(HISTORY_SOURCES) & set(s.errors):
            self._history = (time.monotonic(), {name: getattr(s, name) for name in fields})
        s.read_seconds = time.perf_counter() - started
        return s

    def _partitions(self, conn: sa.Connection, s: Snapshot) -> None:
        for table in FRESHNESS_TABLES:
            s.newest[table] = self._newest(conn, table)

    def _month(self, conn: sa.Connection, table: str, keys: list[str], values: list[str], s: Snapshot) -> list[dict[str, Any]]:
        """``values`` summed per partition and ``keys`` over the newest partition's month."""
        newest = s.newest.get(table)
        cols = self._columns(conn, table)
        if newest is None or cols is None:
            return []
        keys = [k for k in keys if k in cols]
        sums = ", ".join(f"SUM({_q(v)}) AS {_q(v)}" for v in values if v in cols)
        group = ", ".join(_q(c) for c in [PARTITION_COLUMN, *keys])
        sql = f"SELECT {group}, {sums} FROM {_q(table)} WHERE {_q(PARTITION_COLUMN)} >= :lo AND {_q(PARTITION_COLUMN)} <= :hi GROUP BY {group}"
        return self._rows(conn, sql, lo=month_start(newest), hi=newest)

    def _daily(self, conn: sa.Connection, s: Snapshot) -> None:
        s.daily = self._month(conn, "gpu_cost_daily", ["kind", "team", "project", "namespace", "cost_center"], ["gpu_hours", "cost_usd", "on_demand_usd"], s)

    def _roi(self, conn: sa.Connection, s: Snapshot) -> None:
        values = ["spot_savings_usd", "reserved_savings_usd", "sharing_savings_usd", "preemption_waste_usd", "preemption_lost_gpu_hours"]
        # The __total__ row repeats the teams' figures (plus fleet-wide idle waste, which
        # gpu_ops_cost_usd{kind="idle"} carries): teams only, so sums do not double.
        s.roi = [r for r in self._month(conn, "gpu_roi_report", ["team"], values, s) if r.get("team") != "__total__"]

    def _grouped(self, conn: sa.Connection, table: str, keys: list[str], values: Mapping[str, str], where: str = "", **params: Any) -> list[dict[str, Any]]:
        cols = self._columns(conn, table)
        if cols is None:
            return []
        present = [k for k in keys if k in cols]
        group = ", ".join(_q(k) for k in present)
        sums = ", ".join(f"{expr} AS {_q(alias)}" for alias, expr in values.items())
        sql = f"SELECT {group + ', ' if group else ''}{sums} FROM {_q(table)} {where}" + (f" GROUP BY {group}" if group else "")
        return self._rows(conn, sql, **params)

    def _hardware(self, conn: sa.Connection, s: Snapshot) -> None:
        newest = s.newest.get("gpu_usage")
        if newest is None:
            return
        where = f"WHERE {_q(PARTITION_COLUMN)} = :p"
        sums = {"gpu_hours": 'SUM("gpu_hours")', "cost_usd": 'SUM("cost_usd")'}
        s.hardware = self._grouped(conn, "gpu_usage", ["kind", "team", "gpu_type", "capacity_type"], sums, where, p=newest)
        if self.per_pod:
            s.pods = self._grouped(conn, "gpu_usage", ["namespace", "pod", "gpu_type", "capacity_type"], sums, where + " AND \"kind\" = 'allocated'", p=newest)

    def _efficiency(self, conn: sa.Connection, s: Snapshot) -> None:
        newest = s.newest.get("gpu_cost_attribution")
        cols = self._columns(conn, "gpu_cost_attribution") or set()
        if newest is None or "efficiency" not in cols:
            return
        keys = [k for k in ("team", "project") if k in cols]
        sql = f'SELECT {", ".join(_q(k) for k in keys)}, "efficiency", "active_gpu_hours", "unused_cost_usd" FROM "gpu_cost_attribution" WHERE {_q(PARTITION_COLUMN)} = :p AND "efficiency" IS NOT NULL'
        s.efficiency = self._rows(conn, sql, p=newest)

    def _budgets(self, conn: sa.Connection, s: Snapshot) -> None:
        newest = s.newest.get("gpu_budget_status")
        cols = self._columns(conn, "gpu_budget_status") or set()
        if newest is None:
            return
        wanted = ["budget", "period", "amount_usd", "spend_usd", "percent_used", "forecast_usd", "status", "thresholds_crossed", "days_missing"]
        select = ", ".join(_q(c) if c in cols else f"NULL AS {_q(c)}" for c in wanted)
        rows = self._rows(conn, f'SELECT {select} FROM "gpu_budget_status" WHERE {_q(PARTITION_COLUMN)} = :p', p=newest)
        for r in rows:
            crossed = r.get("thresholds_crossed")
            r["thresholds_crossed"] = len(json.loads(crossed)) if isinstance(crossed, str) and crossed else (len(crossed) if isinstance(crossed, list) else None)
        s.budgets = rows

    def _deliveries(self, conn: sa.Connection, s: Snapshot) -> None:
        s.deliveries = self._grouped(conn, DELIVERIES, ["budget", "channel", "channel_type", "status"], {"n": "COUNT(*)"})

    def _dead_letters(self, conn: sa.Connection, s: Snapshot) -> None:
        s.dead_letters = self._grouped(conn, DEAD_LETTERS, ["budget"], {"n": "COUNT(*)"})

    def _ledger(self, conn: sa.Connection, s: Snapshot) -> None:
        cols = self._columns(conn, LEDGER)
        if cols is None:
            return
        start, end = self.epoch.format(c='"start"'), self.epoch.format(c='"end"')
        gpus = '("gpu_count" * COALESCE("gpu_share", 1.0))'
        s.attempts = self._grouped(
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
        s.recoveries = self._rows(conn, sql)

    def _leases(self, conn: sa.Connection, s: Snapshot) -> None:
        if self._columns(conn, LEASES) is None:
            return
        rows = self._rows(conn, f'SELECT "team", "pools", "gpus", "expires_at", {self.db_now} AS "now" FROM {_q(LEASES)}')
        s.leases = [
            {"team": r["team"], "pools": tuple(json.loads(r["pools"] or "[]")), "gpus": int(r["gpus"]), "live": float(r["expires_at"]) >= float(r["now"])}
            for r in rows
        ]

    def _waiting(self, conn: sa.Connection, s: Snapshot) -> None:
        """Attempts still ``planned`` (waiting for GPU quota admission) whose owner is live."""
        if self._columns(conn, ATTEMPTS) is None:
            return
        sql = f'SELECT "bill" FROM {_q(ATTEMPTS)} WHERE "state" = \'planned\' AND {self.db_now} - "beat_at" < :live'
        s.waiting = [_bill_team_gpus(r["bill"]) for r in self._rows(conn, sql, live=LIVE_OWNER_S)]

    def _quarantine(self, conn: sa.Connection, s: Snapshot) -> None:
        newest = s.newest.get("gpu_usage")  # the day the usage figures are of
        if newest is None:
            return
        s.quarantine = self._grouped(conn, "gpu_usage_quarantine", ["source", "field"], {"n": "COUNT(*)"}, f"WHERE {_q(PARTITION_COLUMN)} = :p", p=newest)


def _bill_team_gpus(bill: str | None) -> dict[str, Any]:
    """The team and GPU count of an attempt record's bill (JSON)."""
    data = json.loads(bill or "{}")
    return {"team": str(data.get("team") or ""), "gpus": int(data.get("gpu_count") or 0)}
