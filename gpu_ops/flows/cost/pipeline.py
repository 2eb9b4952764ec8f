"""The cost flow end to end, shared by the `gpu-ops cost` CLI and the Dagster assets.
No Dagster imports: the CLI must start fast.
"""

from __future__ import annotations

import datetime as dt
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import pandas as pd
import pyarrow as pa

from gpu_ops.flows.cost import kubernetes as k8s
from gpu_ops.flows.cost.allocate import IDLE, Span, fleet_days, idle_sql, pieces_sql, priced_sql
from gpu_ops.flows.cost.attribution import day_window, utc
from gpu_ops.domain.cost.columns import attribution_columns  # noqa: F401  (re-exported: part of the flow's API)
from gpu_ops.flows.cost.pricing import PriceMatrix
from gpu_ops.flows.cost.stored import TIME_COLUMNS, USAGE_TABLE_COLUMNS, StoredUsage, UsageTotals, store_usage
from gpu_ops.storage.files import ParquetParts
from gpu_ops.domain.cost.sources import SourceSet  # lives apart so that the code location needs no pandas to read it
from gpu_ops.flows.cost.window import ReadStats, Window
from gpu_ops.flows.cost.engine import UsageEngine, UsageInput, add_frame
from gpu_ops.flows.cost.inventory import load_inventory
from gpu_ops.flows.cost.read import INVENTORY, read_files
from gpu_ops.flows.cost.usage import (
    quarantine_in_window,
    read_intervals,
    read_ledger,
    const_column,
    running_starts,
)

PARTITION_KEY = "partition_key"  # the day a stored row belongs to (TableStore's partition column)
_TEXT_DEFAULTS = ("namespace", "pod", "node", "team", "project", "cost_center", "experiment_id", "labels", "region", "instance_type", "run_id", "asset_key", "outcome", "source", "location")
_FLOAT_DEFAULTS = {
    "attempt": np.nan, "lost_seconds": 0.0, "lost_gpu_hours": 0.0, "lost_cost_usd": 0.0, "fleet_gpu_hours": np.nan, "fleet_cost_usd": np.nan,
    **dict.fromkeys(("active_gpu_hours", "metered_gpu_hours", "efficiency", "unused_cost_usd", "activity_peak", "memory_peak_mib", "memory_total_mib"), np.nan),
}




@dataclass
class PricedUsage:
    rows: pd.DataFrame  # allocated pieces and idle rows, with a `day` column
    quarantine: pd.DataFrame
    window_start: pd.Timestamp
    window_end: pd.Timestamp
    as_of: pd.Timestamp
    fleet_known: bool = False  # an inventory was given (idle rows may still be absent)


def default_as_of(day: dt.date, now: dt.datetime | None = None) -> pd.Timestamp:
    """The end of ``day``, or now while the day is still running."""
    end = day_window(day)[1]
    now_ts = utc(now or dt.datetime.now(dt.timezone.utc))
    return min(end, now_ts)


def price_window(
    raw_usage: Any,
    raw_inventory: Any,
    prices: PriceMatrix,
    window_start: Any,
    window_end: Any,
    as_of: Any,
    keep_columns: Sequence[str] | None = None,
    drop_empty: bool = True,
) -> PricedUsage:
    """Validate, split by UTC day, price and add idle rows for ``[window_start, window_end)``:
    the engine and :mod:`gpu_ops.flows.cost.allocate` in DuckDB, the pieces handed over as a
    pandas frame (the consumers' boundary). ``keep_columns``: the text columns the
    consumer reads (fewer columns, less to hand over). ``raw_inventory``: the node
    inventory (:func:`~gpu_ops.flows.cost.inventory.load_inventory`, or raw frames) or None.
    ``drop_empty`` is kept for callers: pieces always have time. Every source is
    de-duplicated (the engine's identity rules)."""
    ws, we, asof = utc(window_start), utc(window_end), utc(as_of)
    span = Span(ws.value // 1000, we.value // 1000, asof.value // 1000)
    engine = UsageEngine(prices)
    try:
        _add(engine, raw_usage)
        rows = _pieces(engine, span, list(keep_columns) if keep_columns is not None else None)
        quarantine = quarantine_in_window(engine.result_quarantine(), ws, we)
    finally:
        engine.close()
    return with_idle(PricedUsage(rows, quarantine, ws, we, asof), raw_inventory, prices)


def _add(engine: UsageEngine, raw: Any) -> None:
    if isinstance(raw, UsageInput):
        raw.add_to(engine)
        return
    for frame in raw if isinstance(raw, (list, tuple)) else [raw]:
        add_frame(engine, frame)


# Engine times -> piece frame columns (the piece's own times, then the interval's).
_PIECE_TIMES = {"piece_start_us": "start", "piece_end_us": "end", "start_us": "interval_start", "end_us": "interval_end", "day_us": "day"}
_PIECE_NUMBERS = ("hours", "gpu_hours", "cost_usd", "on_demand_usd")
_LOST_NUMBERS = ("lost_hours", "lost_gpu_hours", "lost_cost_usd")


def _pieces(engine: UsageEngine, span: Span, keep: list[str] | None) -> pd.DataFrame:
    """Priced pieces of the engine's good rows (pandas, ``kind`` allocated)."""
    if not engine.parts:
        return pd.DataFrame(columns=list(USAGE_TABLE_COLUMNS))
    times, text, numbers, prov = engine.check(keep)
    lost = "lost_seconds" in numbers
    sql = priced_sql(pieces_sql(engine.good_sql(), span.start, span.priced_end), lost)
    all_times = {**_PIECE_TIMES, **{k: v for k, v in times.items() if k not in _PIECE_TIMES}}
    cols = [*numbers, *_PIECE_NUMBERS, *(_LOST_NUMBERS if lost else ())]
    rows = engine.frame(sql, all_times, text, cols, prov, order_by=("ord", "pos", "day_us"))
    rows["kind"] = const_column(len(rows), "allocated")
    return rows


def with_idle(priced: PricedUsage, inventory: Any, prices: PriceMatrix) -> PricedUsage:
    """Add one idle row per inventory node and day (fleet − allocated) to priced pieces,
    and the inventory's bad rows to the quarantine (the inventory checked by the same
    engine and rule book, ``kind`` inventory). ``inventory``: a :class:`UsageInput`
    (:func:`load_inventory`) or raw frames; None: unchanged."""
    if inventory is None:
        return priced
    ws, we = priced.window_start, priced.window_end
    span = Span(ws.value // 1000, we.value // 1000, priced.as_of.value // 1000)
    fleet, inv_quarantine = _fleet(inventory, prices, span, ws, we)
    idle = _idle_rows(fleet, priced.rows, prices)
    if len(idle):  # a number the pieces carry is its default on an idle row (no lost work); one they lack stays out of both
        idle = idle.assign(**{c: v for c, v in _FLOAT_DEFAULTS.items() if c in priced.rows and c not in idle})
    pieces = pd.concat([_plain(priced.rows), idle], ignore_index=True) if len(idle) else priced.rows
    quarantine = pd.concat([priced.quarantine, inv_quarantine], ignore_index=True)
    return PricedUsage(pieces, quarantine, ws, we, priced.as_of, fleet_known=True)


_IDLE_TEXT = {c: IDLE for c in ("namespace", "team", "project", "cost_center", "experiment_id")}


def _idle_rows(fleet: Any, allocated: pd.DataFrame, prices: PriceMatrix) -> pd.DataFrame:
    """The idle rows (fleet − allocated per node and day) as the stored table has them."""
    if fleet is None or not fleet.num_rows:
        return pd.DataFrame()
    engine = UsageEngine(prices)  # a connection to compute in; nothing is checked
    try:
        engine.con.register("fleet_days", fleet)
        alloc = allocated[["node", "day", "gpu_hours", "price_per_gpu_hour", "on_demand_price_per_gpu_hour"]].assign(
            node=allocated["node"].astype(str), day=allocated["day"].array.asi8 // 1000,
        ) if len(allocated) else pd.DataFrame({"node": [], "day": [], "gpu_hours": [], "price_per_gpu_hour": [], "on_demand_price_per_gpu_hour": []})
        engine.con.register("allocated", alloc)
        sql = idle_sql("SELECT node, day AS day_us, gpu_hours, price_per_gpu_hour, on_demand_price_per_gpu_hour FROM allocated")
        text = [c for c in ("gpu_type", "capacity_type", "region", "source", "location", "instance_type") if c in fleet.column_names]
        numbers = ["gpu_count", "hours", "price_per_gpu_hour", "on_demand_price_per_gpu_hour", "gpu_hours", "cost_usd", "on_demand_usd", "fleet_gpu_hours", "fleet_cost_usd"]
        out = engine.frame(sql, {"start_us": "start", "end_us": "end", "day_us": "day"}, ["node", *text], numbers, ["row"] if "row" in fleet.column_names else [])
    finally:
        engine.close()
    out = out.assign(**_IDLE_TEXT, pod="", sharing="none", gpu_share=1.0, kind="idle")
    return _plain(out.assign(interval_start=out["start"], interval_end=out["end"]))


def _plain(df: pd.DataFrame) -> pd.DataFrame:
    """Categoricals -> text so that concatenating with other rows keeps one dtype."""
    return df.assign(**{c: df[c].astype(str) for c in df.columns if isinstance(df[c].dtype, pd.CategoricalDtype)})


def usage_table(pieces: pd.DataFrame) -> pd.DataFrame:
    """Priced pieces (a pandas frame: :func:`price_window`) in the stored layout
    (:data:`USAGE_TABLE_COLUMNS`), one dtype per column; the stored table itself is
    written from DuckDB (:mod:`gpu_ops.flows.cost.stored`)."""
    n = len(pieces)
    return pd.DataFrame({c: _typed(c, pieces[c]) if c in pieces else _typed(c, _default(c, n)) for c in USAGE_TABLE_COLUMNS}, copy=False)


_TEXT_COLUMNS = (*_TEXT_DEFAULTS, "kind", "gpu_type", "capacity_type", "sharing")
_FLOAT_COLUMNS = (*_FLOAT_DEFAULTS, "gpu_count", "gpu_share", "hours", "gpu_hours", "price_per_gpu_hour", "on_demand_price_per_gpu_hour", "cost_usd", "on_demand_usd")


def _default(c: str, n: int) -> pd.Series:
    """A column the pieces do not have: "" for text, its default number, no time, no row."""
    if c in _TEXT_DEFAULTS:
        return pd.Series([""] * n, dtype=object)
    if c in _FLOAT_DEFAULTS:
        return pd.Series(np.full(n, _FLOAT_DEFAULTS[c]), dtype=float)
    if c == "last_checkpoint_at":
        return pd.Series(pd.NaT, index=range(n), dtype="datetime64[ns, UTC]")
    if c == "row":
        return pd.Series([None] * n, dtype="Int64")
    if n == 0:
        return pd.Series([], dtype=float)
    raise KeyError(f"priced usage has no column {c!r}")


def _typed(c: str, s: pd.Series) -> pd.Series:
    s = s.reset_index(drop=True)
    if c in TIME_COLUMNS:
        return pd.to_datetime(s, utc=True).astype("datetime64[ns, UTC]")
    if c in _TEXT_COLUMNS:
        return _text(s)
    if c in _FLOAT_COLUMNS:
        return s.astype(float)
    return s.astype("Int64") if c == "row" else s


def _text(s: pd.Series) -> pd.Series:
    """Text with "" for missing. A categorical stays one (text categories): its codes are
    written to Parquet as a dictionary column and converted per category, not per row."""
    if isinstance(s.dtype, pd.CategoricalDtype):
        cats = s.cat.categories
        if not pd.api.types.is_string_dtype(cats.dtype):
            cats = cats.astype(str)
            s = s.cat.rename_categories(cats) if cats.is_unique else s.astype(object).astype(str).astype("category")
        if s.isna().any():
            s = (s if "" in s.cat.categories else s.cat.add_categories("")).fillna("")
        return s
    return s.astype(object).where(s.notna(), "").astype(str).astype(object)


def load_raw(
    sources: SourceSet,
    store: Any = None,
    columns: Sequence[str] | None = None,
    core_api_factory: Callable[[], Any] | None = None,
    now: dt.datetime | None = None,
    window: Window | None = None,
    stats: ReadStats | None = None,
) -> tuple[UsageInput, UsageInput | None]:
    """(what every usage source holds, as the engine takes it; the inventory or None).

    Kubernetes sources are collected now and recorded in ``store`` (see
    :mod:`gpu_ops.flows.cost.kubernetes`); what was recorded before is read back with them.
    With a ``window``, each source yields only the rows that can touch it (see
    :mod:`gpu_ops.flows.cost.window`; pricing the result over that window gives what reading
    everything would) and ``stats`` records what was read; Parquet footer summaries are
    then cached in ``store`` (:mod:`gpu_ops.flows.cost.footers`).
    """
    usage = UsageInput()
    if sources.usage_files:
        _read_files(usage, sources, columns, window, stats, _footers(store, window))
    if sources.ledger:
        if store is None:
            raise ValueError("usage source 'ledger' needs the storage database (storage.url)")
        usage.frames.append(read_ledger(store, window, stats))
    collect(sources, store, core_api_factory, now)
    if sources.kubernetes:
        usage.frames.append(read_intervals(store, k8s.COLLECTED_PODS_TABLE, window, stats))
    usage.frames = [f for f in usage.frames if len(f.columns)]
    if window is not None and (sources.ledger or sources.kubernetes):
        usage.frames = _with_closed_twins(usage, sources, store, window)
    return usage, load_inventory(sources, store, window, stats)


def _read_files(usage: UsageInput, sources: SourceSet, columns: Sequence[str] | None, window: Window | None, stats: ReadStats | None, footers: Any) -> None:
    got = read_files(sources.usage_files, sources.base_dir, columns, window, stats, footers, sources.lookback_days)
    usage.files.extend(got.files)
    usage.problems.extend(got.problems)


def _footers(store: Any, window: Window | None) -> Any:
    """The footer summary cache of a bounded read with a database (SQLAlchemy imported only then)."""
    if store is None or window is None:
        return None
    from gpu_ops.flows.cost.footers import FooterCache

    return FooterCache(store)


def _with_closed_twins(usage: UsageInput, sources: SourceSet, store: Any, window: Window) -> list[pd.DataFrame]:
    """The table frames plus the table rows that ended before ``window`` but share
    (namespace, pod, start) with a running row read for it (from a file or a table): the
    closed record supersedes the open one, so a bounded read must see it too."""
    flat = sorted({t for f in usage.frames for t in running_starts(f, window.start)} | set(_file_running_starts(usage, window)))
    if not flat:
        return usage.frames
    twins = []
    if sources.ledger:
        twins.append(read_ledger(store, window, twins_of=flat))
    if sources.kubernetes:
        twins.append(read_intervals(store, k8s.COLLECTED_PODS_TABLE, window, twins_of=flat))
    return [*usage.frames, *(t for t in twins if len(t))]


def _file_running_starts(usage: UsageInput, window: Window) -> list[pd.Timestamp]:
    """Start times of the named, still-running rows of the files (their closed twin may be
    in a table, outside the window's range query)."""
    out = []
    for f in usage.files:
        if not {"start", "end", "pod"} <= set(f.table.column_names if f.scan is None else f.scan.schema.names):
            continue
        try:
            sub = f.load(["start", "end", "pod"])[0]
            cols = {c: (sub.column(c).cast(pa.string()) if pa.types.is_binary(sub.column(c).type) else sub.column(c)) for c in ("start", "end", "pod")}
            frame = pa.table(cols).to_pandas()
        except (pa.ArrowException, UnicodeDecodeError, ValueError):  # not text: the rule book quarantines it
            continue
        out.extend(running_starts(frame, window.start))
    return out


@dataclass
class DaysUsage:
    """``gpu_usage`` for a run of whole UTC days: one Parquet file per day, written from
    DuckDB (:func:`gpu_ops.flows.cost.stored.store_usage`), handed on by reference."""

    stored: StoredUsage
    quarantine: pd.DataFrame  # + ``partition_key``: a bad row in every day it can touch
    as_of: pd.Timestamp
    stats: ReadStats
    scratch: Any = None  # the temporary folder of the files, removed with this object

    @property
    def parts(self) -> ParquetParts:
        return self.stored.parts

    @property
    def totals(self) -> UsageTotals:
        return self.stored.totals

    @property
    def table(self) -> pd.DataFrame:
        """The rows as one pandas frame with ``partition_key`` (read back from the files)."""
        return self.parts.to_pandas()


def usage_for_days(
    sources: SourceSet, store: Any, prices: PriceMatrix, first: dt.date, last: dt.date | None = None,
    now: dt.datetime | None = None, core_api_factory: Callable[[], Any] | None = None, scratch_in: str | None = None,
) -> DaysUsage:
    """Read each source once for the days ``first..last`` (only what can touch them), price
    them and write each day's stored rows as Parquet (in a temporary folder under
    ``scratch_in``, default the system's); each day's rows equal what a run of that day
    alone gives."""
    last = last or first
    window, stats = Window.of_days(first, last), ReadStats()
    raw, inventory = load_raw(sources, store, core_api_factory=core_api_factory, now=now, window=window, stats=stats)
    as_of = default_as_of(last, now)
    ws, we = utc(window.start), utc(window.end)
    span = Span(ws.value // 1000, we.value // 1000, as_of.value // 1000)
    fleet, inv_quarantine = _fleet(inventory, prices, span, ws, we)
    if scratch_in:
        Path(scratch_in).mkdir(parents=True, exist_ok=True)
    scratch = tempfile.TemporaryDirectory(prefix=".gpu_usage-", dir=scratch_in)
    engine = UsageEngine(prices)
    try:
        _add(engine, raw)
        stored = store_usage(engine, fleet, span, [d.isoformat() for d in window.days()], Path(scratch.name))
        quarantine = quarantine_in_window(engine.result_quarantine(), ws, we)
    finally:
        engine.close()
    if inv_quarantine is not None:
        quarantine = pd.concat([quarantine, inv_quarantine], ignore_index=True)
    by_day = pd.concat(
        [quarantine_in_window(quarantine, *day_window(d)).assign(**{PARTITION_KEY: d.isoformat()}) for d in window.days()],
        ignore_index=True,
    )
    return DaysUsage(stored, by_day, as_of, stats, scratch)


def _fleet(inventory: Any, prices: PriceMatrix, span: Span, ws: pd.Timestamp, we: pd.Timestamp) -> tuple[Any, Any]:
    """(each inventory node's fleet per day with its detail, the inventory's quarantine of
    the window), or Nones without an inventory."""
    if inventory is None:
        return None, None
    engine = UsageEngine(prices, INVENTORY)
    try:
        _add(engine, inventory)
        fleet = None
        if engine.parts:
            engine.check()
            fleet = fleet_days(engine, span.start, span.priced_end, detail=True)
        return fleet, quarantine_in_window(engine.result_quarantine(), ws, we)
    finally:
        engine.close()


def collect(sources: SourceSet, store: Any, core_api_factory: Callable[[], Any] | None = None, now: dt.datetime | None = None) -> dict[str, int]:
    """One Kubernetes collection (pods of each kubernetes source, Karpenter GPU nodes),
    recorded in ``store``; returns how many pods and nodes were seen. No-op without such sources."""
    if not (sources.kubernetes or sources.inventory_karpenter):
        return {"pods": 0, "nodes": 0}

    if store is None:
        raise ValueError("the Kubernetes collector records what it sees in the storage database: give a store")
    observed = now or dt.datetime.now(dt.timezone.utc)
    api = (core_api_factory or k8s.core_v1_api)()
    pods = nodes = 0
    for src in sources.kubernetes:
        snapshot = k8s.collect_pods(api, src.namespaces, src.label_keys, observed)
        k8s.record_pods(store, snapshot, observed, sources.collected_retention_days)
        pods += len(snapshot)
    if sources.inventory_karpenter:
        snapshot = k8s.collect_nodes(api, observed)
        k8s.record_nodes(store, snapshot, observed, sources.collected_retention_days)
        nodes = len(snapshot)
    return {"pods": pods, "nodes": nodes}
