"""The stored ``gpu_usage`` table written from DuckDB: one path from the engine's good rows
to the day's Parquet files, no pandas on the way.

Design: docs/concepts/cost-sources.md#the-cost-flow-end-to-end
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from gpu_ops.flows.cost.allocate import IDLE, Groups, Idle, Span, attribute, idle_sql, pieces_sql, priced_sql
from gpu_ops.flows.cost.engine import UsageEngine
from gpu_ops.storage.files import ParquetParts, PartitionWriter

# The stored `gpu_usage` table: one row per interval piece of the day (and per idle node).
USAGE_TABLE_COLUMNS = (
    "day", "start", "end", "interval_start", "interval_end", "kind", "namespace", "pod", "node", "team", "project",
    "cost_center", "experiment_id", "labels", "gpu_type", "gpu_count", "capacity_type", "sharing", "gpu_share", "region",
    "instance_type", "hours", "gpu_hours", "price_per_gpu_hour", "on_demand_price_per_gpu_hour", "cost_usd", "on_demand_usd",
    "run_id", "asset_key", "attempt", "outcome", "last_checkpoint_at", "lost_seconds", "lost_gpu_hours", "lost_cost_usd",
    "fleet_gpu_hours", "fleet_cost_usd", "source", "location", "row",
    # From usage.utilization (DCGM through Prometheus); NaN without metrics (gpu_ops.flows.cost.utilization).
    "active_gpu_hours", "metered_gpu_hours", "efficiency", "unused_cost_usd", "activity_peak", "memory_peak_mib", "memory_total_mib",
)
TIME_COLUMNS = ("day", "start", "end", "interval_start", "interval_end", "last_checkpoint_at")
TEXT_COLUMNS = (
    "kind", "namespace", "pod", "node", "team", "project", "cost_center", "experiment_id", "labels", "gpu_type", "capacity_type",
    "sharing", "region", "instance_type", "run_id", "asset_key", "outcome", "source", "location",
)
# About one value per row (times, measures, the pod, the source row): a dictionary page
# would overflow and fall back to plain anyway, after building a hash table of the column.
PER_ROW_COLUMNS = ("start", "end", "interval_start", "interval_end", "pod", "hours", "gpu_hours", "cost_usd", "on_demand_usd", "row")
EFFICIENCY_COLUMNS = ("active_gpu_hours", "metered_gpu_hours", "efficiency", "unused_cost_usd", "activity_peak", "memory_peak_mib", "memory_total_mib")
_LOST = ("lost_seconds", "lost_gpu_hours", "lost_cost_usd")
_BATCH = 1 << 18  # rows streamed out of DuckDB at a time: one row group each
_US_PER_DAY = 86_400 * 10**6


def usage_schema() -> Any:
    """The Arrow schema of the stored table (with the pandas metadata of the frame it
    was written from before: ``row`` reads back as nullable integers, times as UTC)."""
    template = {}
    for c in USAGE_TABLE_COLUMNS:
        if c in TIME_COLUMNS:
            template[c] = pd.Series(pd.to_datetime([0], utc=True)).astype("datetime64[ns, UTC]")
        elif c in TEXT_COLUMNS:
            template[c] = pd.Series([""], dtype=object)
        elif c == "row":
            template[c] = pd.Series([None], dtype="Int64")
        else:
            template[c] = pd.Series(np.zeros(1), dtype=float)
    return pa.Schema.from_pandas(pd.DataFrame(template), preserve_index=False)


def _text(c: str, present: set[str]) -> str:
    return f"coalesce(CAST({c} AS VARCHAR), '')" if c in present else "''"


def _allocated_columns(present: set[str], lost: bool) -> dict[str, str]:
    """SQL of each stored column over the priced pieces (times as UTC nanoseconds)."""
    cols = {
        "day": "day_us * 1000", "start": "piece_start_us * 1000", "end": "piece_end_us * 1000",
        "interval_start": "start_us * 1000", "interval_end": "end_us * 1000",
        "last_checkpoint_at": "last_checkpoint_us * 1000" if "last_checkpoint_us" in present else "CAST(NULL AS BIGINT)",
        "kind": "'allocated'",
        "attempt": "CAST(attempt AS DOUBLE)" if "attempt" in present else "CAST(NULL AS DOUBLE)",
        **{c: (f"CAST({c} AS DOUBLE)" if lost else "CAST(0.0 AS DOUBLE)") for c in _LOST},
        "fleet_gpu_hours": "CAST(NULL AS DOUBLE)", "fleet_cost_usd": "CAST(NULL AS DOUBLE)",
        "row": "CAST(row AS BIGINT)",
    }
    return {c: cols.get(c) or _plain(c, present) for c in USAGE_TABLE_COLUMNS}


def _plain(c: str, present: set[str]) -> str:
    if c in TEXT_COLUMNS:
        return _text(c, present)
    if c in EFFICIENCY_COLUMNS:
        return "CAST(NULL AS DOUBLE)"
    return f"CAST({c} AS DOUBLE)"


_IDLE_TEXT = {"kind": "'idle'", "pod": "''", "sharing": "'none'", **{c: f"'{IDLE}'" for c in ("namespace", "team", "project", "cost_center", "experiment_id")}}


def _idle_columns(present: set[str]) -> dict[str, str]:
    """SQL of each stored column over :func:`~gpu_ops.flows.cost.allocate.idle_sql`'s rows."""
    cols = {
        "day": "day_us * 1000", "start": "start_us * 1000", "end": "end_us * 1000",
        "interval_start": "start_us * 1000", "interval_end": "end_us * 1000", "last_checkpoint_at": "CAST(NULL AS BIGINT)",
        **_IDLE_TEXT, "gpu_share": "CAST(1.0 AS DOUBLE)", "attempt": "CAST(NULL AS DOUBLE)", **dict.fromkeys(_LOST, "CAST(0.0 AS DOUBLE)"),
        "row": "CAST(row AS BIGINT)" if "row" in present else "CAST(NULL AS BIGINT)",
    }
    return {c: cols.get(c) or _plain(c, present) for c in USAGE_TABLE_COLUMNS}


def _select(columns: dict[str, str], source: str, order_by: str | None = None) -> str:
    """SQL: ``columns`` of ``source``; without ``order_by`` in the order DuckDB reads them
    (insertion order is kept: the sources' order, as a sort would give, without holding a
    sorted copy of every column)."""
    return "SELECT " + ", ".join(f'{sql} AS "{c}"' for c, sql in columns.items()) + f" FROM ({source})" + (f" ORDER BY {order_by}" if order_by else "")


_NO_PIECES = (
    "SELECT CAST(NULL AS VARCHAR) AS node, CAST(NULL AS BIGINT) AS day_us, CAST(NULL AS DOUBLE) AS gpu_hours, "
    "CAST(NULL AS DOUBLE) AS price_per_gpu_hour, CAST(NULL AS DOUBLE) AS on_demand_price_per_gpu_hour WHERE false"
)


@dataclass
class UsageTotals:
    """What the stored rows sum to (the step's metadata): allocated and idle figures, and the
    efficiency columns' sums over allocated rows."""

    intervals: int = 0
    gpu_hours: float = 0.0
    allocated_cost_usd: float = 0.0
    idle_cost_usd: float = 0.0
    idle_rows: int = 0
    fleet_cost: float = 0.0
    measured: dict[str, float] = field(default_factory=lambda: dict.fromkeys(("active_gpu_hours", "metered_gpu_hours", "unused_cost_usd"), 0.0))

    @property
    def fleet_cost_usd(self) -> float | None:
        return self.fleet_cost if self.idle_rows else None

    def add(self, batch: Any, idle: bool) -> None:
        def total(c: str) -> float:
            return float(pc.sum(batch.column(c)).as_py() or 0.0)

        if idle:
            self.idle_rows += batch.num_rows
            self.idle_cost_usd += total("cost_usd")
            self.fleet_cost += total("fleet_cost_usd")
            return
        self.intervals += batch.num_rows
        self.gpu_hours += total("gpu_hours")
        self.allocated_cost_usd += total("cost_usd")
        for c in self.measured:
            self.measured[c] += total(c)


@dataclass
class StoredUsage:
    """The day files of a run (:class:`ParquetParts`) and what their rows sum to."""

    parts: ParquetParts
    totals: UsageTotals


def _typed(batch: Any, schema: Any) -> Any:
    """A batch of the stored columns (times as integer nanoseconds) in ``schema``'s types."""
    def typed(f: Any) -> Any:
        values = batch.column(f.name)
        if pa.types.is_timestamp(f.type):
            return values.view(f.type)
        return values if values.type == f.type else values.cast(f.type)

    return pa.record_batch([typed(f) for f in schema], schema=schema)


def _day_key(day_ns: int) -> str:
    return (dt.date(1970, 1, 1) + dt.timedelta(days=day_ns // (_US_PER_DAY * 1000))).isoformat()


def _write(con: Any, sql: str, writer: PartitionWriter, totals: UsageTotals, idle: bool) -> None:
    """Stream ``sql``'s rows into the day files, one row group per batch and day."""
    reader = con.sql(sql).to_arrow_reader(_BATCH)
    for raw in reader:
        batch = _typed(raw, writer.schema)
        totals.add(batch, idle)
        days = pc.unique(raw.column("day")).to_pylist()
        if len(days) == 1:
            writer.write(_day_key(days[0]), batch)
            continue
        for d in days:
            writer.write(_day_key(d), batch.filter(pc.equal(raw.column("day"), d)))


def store_usage(engine: UsageEngine, fleet: Any, span: Span, keys: Sequence[str], folder: Path) -> StoredUsage:
    """Write the priced pieces of the engine's good rows inside ``span`` and the idle rows of
    ``fleet`` (:func:`~gpu_ops.flows.cost.allocate.fleet_days` with detail, or None) as one
    Parquet file per day of ``keys`` under ``folder``; the engine's connection computes them."""
    schema = usage_schema()
    writer = PartitionWriter(folder, schema, list(keys), plain=PER_ROW_COLUMNS)
    totals = UsageTotals()
    pieces = _NO_PIECES
    try:
        if engine.parts:
            times, text, numbers, prov = engine.check()
            lost = "lost_seconds" in numbers
            pieces = priced_sql(pieces_sql(engine.good_sql(), span.start, span.priced_end), lost)
            present = {*times, *text, *numbers, *prov}
            _write(engine.con, _select(_allocated_columns(present, lost), pieces), writer, totals, idle=False)
        if fleet is not None and fleet.num_rows:
            engine.con.register("fleet_days", fleet)
            _write(engine.con, _select(_idle_columns(set(fleet.column_names)), idle_sql(pieces), "node, day_us"), writer, totals, idle=True)
    finally:
        parts = writer.close()
    return StoredUsage(parts, totals)


# --------------------------------------------------------------------------- the stored rows read where they lie


def day_relations(con: Any, usage: Any, keys: Sequence[str]) -> list[tuple[str, str]]:
    """(key, SQL of that day's stored rows) for each partition key: ``usage`` is the day
    files by reference (:class:`ParquetParts`, read by DuckDB where they lie) or a loaded
    frame (a SQL store; with ``partition_key`` when it holds several days). A day without
    a file has no rows, in the stored columns."""
    if isinstance(usage, ParquetParts):
        con.register("no_usage_rows", usage_schema().empty_table())
        return [(k, f"SELECT * FROM read_parquet('{_quoted(usage.paths[k])}')" if k in usage.paths else "SELECT * FROM no_usage_rows") for k in keys]
    con.register("usage_rows", usage)
    if "partition_key" not in usage.columns:
        return [(keys[0], "SELECT * FROM usage_rows")]
    return [(k, f"SELECT * EXCLUDE (partition_key) FROM usage_rows WHERE partition_key = '{k}'") for k in keys]


def _quoted(path: Path) -> str:
    return str(path).replace("'", "''")


def stored_idle(con: Any, idle_rows: str, columns: set[str]) -> Idle:
    """The idle totals of stored idle rows (no row: no fleet); ``columns``: those the rows have."""
    def total(c: str) -> str:
        return f"sum({c})" if c in columns else "CAST(NULL AS DOUBLE)"

    n, gh, cost, od, fleet = con.execute(
        f"SELECT count(*), {total('gpu_hours')}, {total('cost_usd')}, coalesce({total('on_demand_usd')}, 0), {total('fleet_cost_usd')} FROM ({idle_rows})"
    ).fetchall()[0]
    if not n:
        return Idle()
    return Idle(float(gh or 0.0), float(cost or 0.0), float(od), float(fleet or 0.0))


def fleet_checks(con: Any, alloc: str, idle_rows: str, idle: Idle) -> dict[str, Any]:
    """The conservation figures of a day's stored rows: usage on nodes outside the
    inventory, and the nodes with more GPU-hours allocated than they have."""
    if idle.fleet_cost_usd is None:
        return {"off_fleet_cost_usd": 0.0, "over_allocated_nodes": []}
    off = con.execute(f"SELECT coalesce(sum(cost_usd), 0) FROM ({alloc}) WHERE CAST(node AS VARCHAR) NOT IN (SELECT CAST(node AS VARCHAR) FROM ({idle_rows}))").fetchall()[0][0]
    # Tolerance: a millionth of a GPU-hour of rounding is not over-allocation.
    over = con.execute(f"SELECT DISTINCT CAST(node AS VARCHAR) AS n FROM ({idle_rows}) WHERE gpu_hours < -1e-6 ORDER BY n").fetchall()
    return {"off_fleet_cost_usd": float(off), "over_allocated_nodes": [r[0] for r in over]}


def stored_attribution(con: Any, rows: str, group_by: Sequence[str], idle_mode: str) -> Groups:
    """The attribution of one day's stored rows (SQL ``rows``), grouped in DuckDB
    (:func:`gpu_ops.flows.cost.allocate.attribute`), with the conservation figures in its totals."""
    columns = {r[0] for r in con.execute(f"DESCRIBE {rows}").fetchall()}
    alloc, idle_rows = f"SELECT * FROM ({rows}) WHERE kind <> 'idle'", f"SELECT * FROM ({rows}) WHERE kind = 'idle'"
    idle = stored_idle(con, idle_rows, columns)
    groups = attribute(con, alloc, group_by, columns, idle, idle_mode)
    groups.totals.update(fleet_checks(con, alloc, idle_rows, idle))
    return groups


def has_metrics(con: Any, rows: str) -> bool:
    """Whether some allocated row of ``rows`` carries a utilisation measurement."""
    got = con.execute(f"SELECT count(active_gpu_hours) + count(metered_gpu_hours) + count(unused_cost_usd) FROM ({rows}) WHERE kind <> 'idle'").fetchall()[0][0]
    return bool(got)


def measured_sums(con: Any, rows: str) -> tuple[float, dict[str, float]]:
    """(allocated GPU-hours, sums of the efficiency columns) of ``rows``: what
    :func:`gpu_ops.flows.cost.utilization.coverage_of_sums` takes."""
    names = ("active_gpu_hours", "metered_gpu_hours", "unused_cost_usd")
    got = con.execute(f"SELECT coalesce(sum(gpu_hours), 0), {', '.join(f'coalesce(sum({c}), 0)' for c in names)} FROM ({rows}) WHERE kind <> 'idle'").fetchall()[0]
    return float(got[0]), {c: float(v) for c, v in zip(names, got[1:])}
