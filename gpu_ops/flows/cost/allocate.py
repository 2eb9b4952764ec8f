"""Split, price, idle and group in DuckDB SQL over the engine's good rows.

After :meth:`gpu_ops.flows.cost.engine.UsageEngine.check` the good intervals are a query in the
engine's DuckDB connection (:meth:`~gpu_ops.flows.cost.engine.UsageEngine.good_sql`, read from
the sources, not stored); what a day costs is computed there and only small aggregates
come back to Python:

- **pieces** (:func:`pieces_sql`): each interval clipped to ``[window start, min(window
  end, as of))`` (an open interval runs to the as-of time) and split at every UTC
  midnight, with its ``hours``; GPU-hours = ``gpu_count × gpu_share × hours``, cost =
  GPU-hours × the price per GPU-hour the engine joined (price table × region multiplier);
- **idle** (:func:`fleet_days`, :class:`Idle`): the node inventory, checked by the same
  engine and rule book (``kind`` inventory), gives each node's fleet GPU-hours and
  dollars per day; idle = fleet − allocated per node and day, in dollars (so that
  allocated + idle equals the fleet exactly);
- **one day's GPU-hours in the screening pass** (:func:`gpu_hours_tally`): for a window
  inside one UTC day without an inventory, the engine sums each group's GPU-hours in
  the pass that applies the rule book (:class:`~gpu_ops.flows.cost.engine.Tally`, the copies
  and superseded records the identity rules find subtracted), and the groups read those
  sums instead of a second pass over the good rows;
- **groups** (:func:`attribute`): sums per grouping key, ``label:<key>`` read from the
  ``labels`` JSON (a key no row has is one empty group), the idle cost as an
  ``__idle__`` row or shared by each group's share of allocated cost.

The same figures as :func:`gpu_ops.flows.cost.attribution.attribute` over priced pieces (the
tests hold them together). No pandas: `gpu-ops cost attribution` runs on this module.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from gpu_ops.domain.cost.columns import NS_PER_HOUR, group_column
from gpu_ops.flows.cost.engine import QUARANTINE_ROWS, Tally, UsageEngine, UsageInput, values_table
from gpu_ops.flows.cost.pricing import PriceMatrix
from gpu_ops.flows.cost.read import INVENTORY
from gpu_ops.domain.cost.rules import label_value, quote

DAY_US = 86_400 * 10**6
IDLE = "__idle__"
METRIC_COLUMNS = ("gpu_hours", "cost_usd", "on_demand_equivalent_usd", "savings_usd", "idle_cost_usd")


def pieces_sql(good: str, lo: int, hi: int) -> str:
    """SQL: the pieces of the intervals of ``good`` inside ``[lo, hi)`` (UTC microseconds),
    one per UTC day: the rows' columns plus ``day_us``, ``piece_start_us``,
    ``piece_end_us``, ``hours`` and ``gpu_hours``. Pieces without time are dropped."""
    s_eff, e_eff = _clipped(lo, hi)
    clip = f"SELECT *, {s_eff} AS s_eff, {e_eff} AS e_eff FROM ({good})"
    if (hi - 1) // DAY_US == lo // DAY_US:  # one day: no fan-out
        split = f"SELECT *, {lo // DAY_US * DAY_US} AS day_us, s_eff AS piece_start_us, e_eff AS piece_end_us FROM ({clip}) WHERE e_eff > s_eff"
    else:
        day = f"CAST(floor(s_eff / {DAY_US}) AS BIGINT)"
        last = f"CAST(floor((e_eff - 1) / {DAY_US}) AS BIGINT)"
        split = (
            f"SELECT * EXCLUDE (d), d * {DAY_US} AS day_us, greatest(s_eff, d * {DAY_US}) AS piece_start_us, least(e_eff, (d + 1) * {DAY_US}) AS piece_end_us "
            f"FROM (SELECT *, unnest(range({day}, {last} + 1)) AS d FROM ({clip}) WHERE e_eff > s_eff)"
        )
    hours = _hours("piece_start_us", "piece_end_us")
    return f"SELECT *, {hours} AS hours, gpu_count * gpu_share * ({hours}) AS gpu_hours FROM ({split})"


def _clipped(lo: int, hi: int) -> tuple[str, str]:
    """SQL: an interval's start and end inside ``[lo, hi)`` (an open interval runs to ``hi``)."""
    return f"greatest(start_us, {lo})", f"least(coalesce(end_us, {hi}), {hi})"


def _hours(start: str, end: str) -> str:
    """SQL: the hours from ``start`` to ``end`` (UTC microseconds) from nanoseconds, as the
    stored table has always computed them."""
    return f"CAST(({end} - {start}) * 1000 AS DOUBLE) / {NS_PER_HOUR}.0"


def gpu_hours_tally(group_by: Sequence[str], lo: int, hi: int) -> Tally | None:
    """The GPU-hours of each interval inside ``[lo, hi)`` summed per grouping key by the
    engine's screening pass (the one piece of :func:`pieces_sql` of a window inside one
    UTC day, the same figure); None for a window across midnight (pieces per day) or a
    ``label:`` key (read from the labels JSON of the good rows)."""
    if hi <= lo or (hi - 1) // DAY_US != lo // DAY_US or any(k.startswith("label:") for k in group_by):
        return None
    start, end = _clipped(lo, hi)
    return Tally(tuple(group_by), f"CASE WHEN {end} > {start} THEN gpu_count * gpu_share * ({_hours(start, end)}) END")


def priced_sql(pieces: str, lost: bool) -> str:
    """SQL: dollars of ``pieces`` (the one place where cost = GPU-hours × price per
    GPU-hour), and with ``lost`` the part of each piece after the interval's last
    checkpoint (``[end - lost_seconds, end]``) in hours, GPU-hours and dollars."""
    cols = "*, gpu_hours * price_per_gpu_hour AS cost_usd, gpu_hours * on_demand_price_per_gpu_hour AS on_demand_usd"
    if not lost:
        return f"SELECT {cols} FROM ({pieces})"
    since = "end_us * 1000 - CAST(trunc(lost_seconds * 1e9) AS BIGINT)"
    lost_hours = (
        f"CASE WHEN end_us IS NOT NULL AND lost_seconds > 0 THEN CAST(greatest(piece_end_us * 1000 - greatest(piece_start_us * 1000, {since}), 0) AS DOUBLE) "
        f"/ {NS_PER_HOUR}.0 ELSE 0.0 END"
    )
    return (
        f"SELECT *, gpu_count * gpu_share * lost_hours AS lost_gpu_hours, gpu_count * gpu_share * lost_hours * price_per_gpu_hour AS lost_cost_usd "
        f"FROM (SELECT {cols}, {lost_hours} AS lost_hours FROM ({pieces}))"
    )


# --------------------------------------------------------------------------- idle


# What an idle row says of its node besides the figures: the first inventory record's.
_NODE_DETAIL = ("gpu_type", "capacity_type", "region", "gpu_count", "price_per_gpu_hour", "on_demand_price_per_gpu_hour", "source", "location", "row", "instance_type")


def fleet_days(inventory: Any, lo: int, hi: int, detail: bool = False) -> Any:
    """Each inventory node's fleet per UTC day (Arrow: node, day_us, fleet_gpu_hours,
    fleet_cost_usd, fleet_on_demand_usd; with ``detail`` its first record's type,
    capacity, prices and provenance, its time span and hours) from a checked inventory
    engine, ordered by node and day."""
    cap = "gpu_count * hours"
    good = inventory.good_sql()
    extra = ""
    if detail:
        present = {r[0] for r in inventory.con.execute(f"DESCRIBE {good}").fetchall()}
        firsts = ", ".join(f"first({quote(c)} ORDER BY ord, pos) AS {quote(c)}" for c in _NODE_DETAIL if c in present)
        extra = f", min(piece_start_us) AS start_us, max(piece_end_us) AS end_us, sum(hours) AS hours, {firsts}"
    sql = (
        f"SELECT node, day_us, sum({cap}) AS fleet_gpu_hours, sum({cap} * price_per_gpu_hour) AS fleet_cost_usd, "
        f"coalesce(sum({cap} * on_demand_price_per_gpu_hour), 0) AS fleet_on_demand_usd{extra} "
        f"FROM ({pieces_sql(good, lo, hi)}) GROUP BY node, day_us ORDER BY node, day_us"
    )
    return inventory.con.sql(sql).to_arrow_table()


def idle_sql(pieces: str) -> str:
    """SQL: one idle row per node and day of table ``fleet_days`` (:func:`fleet_days`):
    fleet − what ``pieces`` allocated there, in GPU-hours and dollars."""
    alloc = (
        f"SELECT node, day_us, sum(gpu_hours) AS gh, sum(gpu_hours * price_per_gpu_hour) AS cost, "
        f"coalesce(sum(gpu_hours * on_demand_price_per_gpu_hour), 0) AS od FROM ({pieces}) GROUP BY node, day_us"
    )
    return (
        "SELECT f.*, f.fleet_gpu_hours - coalesce(a.gh, 0) AS gpu_hours, f.fleet_cost_usd - coalesce(a.cost, 0) AS cost_usd, "
        "f.fleet_on_demand_usd - coalesce(a.od, 0) AS on_demand_usd "
        f"FROM fleet_days f LEFT JOIN ({alloc}) a ON a.node = f.node AND a.day_us = f.day_us ORDER BY f.node, f.day_us"
    )


@dataclass
class Idle:
    """Fleet, allocated and idle totals of a window (idle = fleet − allocated per node and day)."""

    gpu_hours: float = 0.0
    cost_usd: float = 0.0
    on_demand_usd: float = 0.0
    fleet_cost_usd: float | None = None  # None: no inventory node alive in the window

    @classmethod
    def of(cls, con: Any, pieces: str, fleet: Any) -> "Idle":
        if fleet is None or not fleet.num_rows:
            return cls()
        con.register("fleet_days", fleet)
        got = con.execute(f"SELECT sum(gpu_hours), sum(cost_usd), sum(on_demand_usd), sum(fleet_cost_usd) FROM ({idle_sql(pieces)})").fetchone()
        return cls(*(float(v) for v in got))


# --------------------------------------------------------------------------- groups


def label_values(labels: Sequence[str | None], name: str) -> list[str]:
    """The value of label ``name`` in each ``labels`` JSON text (:func:`~gpu_ops.domain.cost.rules.label_value`)."""
    return [label_value(text, name) for text in labels]


def _key_sql(con: Any, pieces: str, group_by: Sequence[str], columns: set[str]) -> tuple[list[str], str]:
    """(SQL of each key's value, the FROM clause): label keys from a small table of the
    distinct ``labels`` texts; a key column the rows do not have is ''."""

    labels = [k for k in group_by if k.startswith("label:")]
    exprs = []
    for key in group_by:
        if key.startswith("label:"):
            exprs.append(f"coalesce(lm.{quote(group_column(key))}, '')" if "labels" in columns else "''")
        else:
            exprs.append(f"p.{quote(key)}" if key in columns else "''")
    if not labels or "labels" not in columns:
        return exprs, f"({pieces}) p"
    texts = [r[0] for r in con.execute(f"SELECT DISTINCT labels FROM ({pieces})").fetchall()]
    values_table(con, "label_map", {"labels": ("VARCHAR", texts), **{group_column(k): ("VARCHAR", label_values(texts, k[len("label:"):])) for k in labels}})
    return exprs, f"({pieces}) p LEFT JOIN label_map lm ON lm.labels IS NOT DISTINCT FROM p.labels"


def group_sums(con: Any, pieces: str, group_by: Sequence[str], columns: set[str]) -> list[tuple[Any, ...]]:
    """(keys..., gpu_hours, cost_usd, on-demand equivalent or None) per group with hours:
    GPU-hours summed per price first, then dollars once per price; the equivalent is
    None for a group with any GPU that has no on-demand price (never silently 0)."""
    exprs, source = _key_sql(con, pieces, group_by, columns)
    keys = [f"k{i}" for i in range(len(exprs))]
    selected = ", ".join(f"{e} AS {k}" for e, k in zip(exprs, keys))
    by = ", ".join(keys)
    cells = (
        f"SELECT {selected + ', ' if keys else ''}p.price_per_gpu_hour AS price, p.on_demand_price_per_gpu_hour AS od, sum(p.gpu_hours) AS gh "
        f"FROM {source} GROUP BY {by + ', ' if keys else ''}price, od"
    )
    sql = (
        f"SELECT {by + ', ' if keys else ''}sum(gh), sum(gh * price), CASE WHEN bool_or(od IS NULL) THEN NULL ELSE sum(gh * od) END "
        f"FROM ({cells}) {'GROUP BY ' + by if keys else ''} HAVING sum(gh) > 0"
    )
    return con.execute(sql).fetchall()


@dataclass
class Groups:
    """An attribution as plain Python: ``columns`` (keys, then :data:`METRIC_COLUMNS`),
    ``rows`` (tuples, most expensive first) and ``totals``."""

    columns: list[str]
    rows: list[tuple[Any, ...]]
    totals: dict[str, Any] = field(default_factory=dict)

    def column(self, name: str) -> list[Any]:
        i = self.columns.index(name)
        return [r[i] for r in self.rows]


def _minus(a: float | None, b: float) -> float | None:
    return None if a is None else a - b


def attribute(con: Any, pieces: str, group_by: Sequence[str], columns: set[str], idle: Idle, idle_mode: str = "row") -> Groups:
    """Groups of the allocated ``pieces`` by ``group_by`` with the ``idle`` cost as an
    ``__idle__`` row (``row``) or shared by allocated cost (``share``)."""
    n = len(group_by)
    sums = group_sums(con, pieces, group_by, columns)
    rows: list[list[Any]] = [[*(str(v) for v in r[:n]), float(r[n]), float(r[n + 1]), None if r[n + 2] is None else float(r[n + 2]), 0.0] for r in sums]
    alloc_hours, alloc_cost = sum(r[n] for r in rows), sum(r[n + 1] for r in rows)
    shared = idle.fleet_cost_usd is not None and idle_mode == "share" and alloc_cost > 0
    if shared:
        for r in rows:
            w = r[n + 1] / alloc_cost
            r[n], r[n + 1] = r[n] + w * idle.gpu_hours, r[n + 1] + w * idle.cost_usd
            r[n + 2] = None if r[n + 2] is None else r[n + 2] + w * idle.on_demand_usd
            r[n + 3] = w * idle.cost_usd
    elif idle.fleet_cost_usd is not None:
        rows.append([*([IDLE] * n), idle.gpu_hours, idle.cost_usd, idle.on_demand_usd, idle.cost_usd])
    out = [(*r[:n], r[n], r[n + 1], r[n + 2], _minus(r[n + 2], r[n + 1]), r[n + 3]) for r in rows]
    out.sort(key=lambda r: tuple(r[:n]))
    out.sort(key=lambda r: -r[n + 1])  # stable: keys ascending among equal costs
    totals = {
        "gpu_hours": alloc_hours,
        "allocated_cost_usd": alloc_cost, "idle_cost_usd": idle.cost_usd, "fleet_cost_usd": idle.fleet_cost_usd,
        "idle_shared": shared, "attributed_cost_usd": sum(r[n + 1] for r in out), "groups": sum(1 for r in out if not n or r[0] != IDLE),
    }
    return Groups([*(group_column(k) for k in group_by), *METRIC_COLUMNS], out, totals)


# --------------------------------------------------------------------------- one window


@dataclass
class Span:
    """What an attribution covers, in UTC microseconds: pieces inside ``[start,
    min(end, as_of))``, bad rows that belong to ``[start, end)``."""

    start: int
    end: int
    as_of: int

    @property
    def priced_end(self) -> int:
        return min(self.end, self.as_of)


_NO_PIECES = "CREATE OR REPLACE TEMP TABLE pieces (node VARCHAR, day_us BIGINT, gpu_hours DOUBLE, price_per_gpu_hour DOUBLE, on_demand_price_per_gpu_hour DOUBLE)"


def attribution_of(
    usage: UsageInput, inventory: UsageInput | None, prices: PriceMatrix, window: Span, group_by: Sequence[str], idle_mode: str = "row", keep: Sequence[str] | None = None,
    first_quarantined: int | None = None,
) -> tuple[Groups, Any]:
    """(the groups of ``window``, its quarantine as Arrow): usage (and the inventory) through
    the engine, then pieces, idle and groups in SQL. ``first_quarantined``: the usage
    quarantine's reasons and records are built for that many rows only where the engine
    can (see :meth:`UsageEngine.quarantine_arrow`); the table's schema metadata
    :data:`~gpu_ops.flows.cost.engine.QUARANTINE_ROWS` then counts the rows of both whole quarantines."""
    fleet, inv_quarantine = _inventory(inventory, prices, window)
    engine = UsageEngine(prices)
    try:
        usage.add_to(engine)
        text: list[str] = []
        if engine.parts:
            # Without an inventory (no idle per node) the groups' GPU-hours can come from the
            # screening pass itself: one pass over the rows fewer.
            tally = gpu_hours_tally(group_by, window.start, window.priced_end) if fleet is None else None
            _, text, _, _ = engine.check(keep, tally)
            pieces = f"SELECT *, value AS gpu_hours FROM ({engine.tallied_sql()})" if engine.tallied else pieces_sql(engine.good_sql(), window.start, window.priced_end)
            engine.con.execute(f"CREATE OR REPLACE TEMP VIEW pieces AS {pieces}")  # a view: each query reads only its columns
        else:
            engine.con.execute(_NO_PIECES)
        pieces = "SELECT * FROM pieces"
        groups = attribute(engine.con, pieces, group_by, set(text), Idle.of(engine.con, pieces, fleet), idle_mode)
        quarantine = engine.quarantine_arrow(window.start, window.end, first_quarantined)
    finally:
        engine.close()
    if inv_quarantine is None:
        return groups, quarantine
    counted = (quarantine.schema.metadata or {}).get(QUARANTINE_ROWS.encode())
    both = _concat(quarantine, inv_quarantine)
    if counted is None:
        return groups, both
    return groups, both.replace_schema_metadata({QUARANTINE_ROWS: str(int(counted) + inv_quarantine.num_rows)})


def _inventory(inventory: UsageInput | None, prices: PriceMatrix, window: Span) -> tuple[Any, Any]:
    """(each node's fleet per day, the inventory's quarantine of the window), or Nones."""
    if inventory is None:
        return None, None
    engine = UsageEngine(prices, INVENTORY)
    try:
        inventory.add_to(engine)
        fleet = None
        if engine.parts:
            engine.check(["node"])
            fleet = fleet_days(engine, window.start, window.priced_end)
        return fleet, engine.quarantine_arrow(window.start, window.end)
    finally:
        engine.close()


def _concat(a: Any, b: Any) -> Any:
    import pyarrow as pa

    return pa.concat_tables([a, b.cast(a.schema)]) if b.num_rows else a
