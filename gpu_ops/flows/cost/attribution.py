"""Attribution of priced pieces held as pandas frames: the pandas entry points of the cost
flow (``gpu_ops.attribute``, fleet totals, conservation, day windows); the grouping itself
runs in DuckDB SQL (:mod:`gpu_ops.flows.cost.allocate`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
import pandas as pd

from gpu_ops.domain.cost.columns import group_column
from gpu_ops.flows.cost.allocate import METRIC_COLUMNS
from gpu_ops.domain.cost.rules import label_value
from gpu_ops.flows.cost.stored import stored_attribution
from gpu_ops.flows.cost.usage import const_column

DAY_NS = 86_400 * 10**9
_NAT = np.iinfo(np.int64).min


def key_column(key: str) -> str:
    """Grouping key -> output column: ``label:team-tier`` -> ``label_team_tier``."""
    return group_column(key)


def utc(ts: Any) -> pd.Timestamp:
    t = pd.Timestamp(ts)
    return t.tz_localize("UTC") if t.tzinfo is None else t.tz_convert("UTC")


def day_window(day: Any) -> tuple[pd.Timestamp, pd.Timestamp]:
    start = utc(pd.Timestamp(day).normalize() if not isinstance(day, str) else pd.Timestamp(day))
    return start, start + pd.Timedelta(days=1)


# --------------------------------------------------------------------------- splitting


def is_idle(rows: pd.DataFrame) -> np.ndarray:
    """Mask of idle rows; cheap on the categorical ``kind`` of fresh pieces."""
    if "kind" not in rows or not len(rows):
        return np.zeros(len(rows), bool)
    kind = rows["kind"]
    if isinstance(kind.dtype, pd.CategoricalDtype):
        cats = np.array([c == "idle" for c in kind.cat.categories] + [False])
        return cats[kind.cat.codes.to_numpy()]
    return (kind.to_numpy(dtype=object) == "idle")








# --------------------------------------------------------------------------- idle




# --------------------------------------------------------------------------- grouping


def label_values(labels: pd.Series, name: str) -> pd.Series:
    """Value of one label per row from the ``labels`` JSON column ("" when absent)."""
    codes, uniques = pd.factorize(labels, use_na_sentinel=True)
    vals = [label_value(u, name) for u in uniques]
    cats = sorted(set(vals) | {""})
    lut = np.array([cats.index(v) for v in vals] + [cats.index("")], dtype=np.int32)
    return pd.Series(pd.Categorical.from_codes(lut[np.where(codes < 0, len(vals), codes)], categories=cats), index=labels.index)


def key_frame(rows: pd.DataFrame, group_by: Sequence[str]) -> pd.DataFrame:
    cols = {}
    for key in group_by:
        if key.startswith("label:"):
            cols[key_column(key)] = label_values(rows["labels"], key[len("label:") :]) if "labels" in rows else pd.Series(const_column(len(rows), ""), index=rows.index)
        else:
            cols[key] = rows[key]
    return pd.DataFrame(cols, index=rows.index)


@dataclass
class AttributedCosts:
    table: pd.DataFrame
    group_by: list[str]
    totals: dict[str, Any] = field(default_factory=dict)


def attribute(rows: pd.DataFrame, group_by: Sequence[str], idle: str = "row") -> AttributedCosts:
    """Group priced pieces (allocated and idle rows) by ``group_by``, in DuckDB
    (:func:`gpu_ops.flows.cost.stored.stored_attribution`: the one grouping of the package).

    Columns: the key columns, ``gpu_hours``, ``cost_usd``, ``on_demand_equivalent_usd``,
    ``savings_usd`` and ``idle_cost_usd`` (the idle share in ``share`` mode; the whole
    idle cost on the ``__idle__`` row in ``row`` mode). ``on_demand_equivalent_usd`` is
    NaN for a group with any GPU type that has no on-demand price (never silently 0).
    """
    import duckdb

    con = duckdb.connect()
    try:
        con.register("attributed_rows", rows if "kind" in rows else rows.assign(kind="allocated"))
        groups = stored_attribution(con, "SELECT * FROM attributed_rows", group_by, idle)
    finally:
        con.close()
    table = pd.DataFrame(groups.rows, columns=groups.columns).astype({c: float for c in METRIC_COLUMNS})
    return AttributedCosts(table, list(group_by), {**fleet_totals(rows), **groups.totals})


def fleet_totals(rows: pd.DataFrame) -> dict[str, Any]:
    """Allocated, idle and fleet cost of priced pieces, and the conservation figures."""
    if rows.empty:
        return {"gpu_hours": 0.0, "allocated_cost_usd": 0.0, "idle_cost_usd": 0.0, "fleet_cost_usd": None, "off_fleet_cost_usd": 0.0, "over_allocated_nodes": []}
    idle_mask = is_idle(rows)
    alloc = rows[~idle_mask] if idle_mask.any() else rows
    idle = rows[idle_mask]
    out: dict[str, Any] = {
        "gpu_hours": float(alloc["gpu_hours"].sum()),
        "allocated_cost_usd": float(alloc["cost_usd"].sum()),
        "idle_cost_usd": float(idle["cost_usd"].sum()),
        "idle_gpu_hours": float(idle["gpu_hours"].sum()),
        "fleet_cost_usd": None,
        "off_fleet_cost_usd": 0.0,
        "over_allocated_nodes": [],
    }
    if len(idle):
        fleet_nodes = set(idle["node"].astype(str))
        on_fleet = alloc["node"].astype(str).isin(fleet_nodes).to_numpy()
        out["fleet_cost_usd"] = float(idle["fleet_cost_usd"].sum())
        out["fleet_gpu_hours"] = float(idle["fleet_gpu_hours"].sum())
        out["off_fleet_cost_usd"] = float(alloc.loc[~on_fleet, "cost_usd"].sum())
        out["off_fleet_rows"] = int((~on_fleet).sum())
        # Tolerance: a millionth of a GPU-hour of rounding is not over-allocation.
        over = idle[idle["gpu_hours"] < -1e-6]
        out["over_allocated_nodes"] = sorted(set(over["node"].astype(str)))
    return out


def conservation(table: pd.DataFrame, totals: dict[str, Any]) -> tuple[bool, str]:
    """attributed = fleet + usage on nodes outside the inventory, and no node over-allocated."""
    fleet = totals.get("fleet_cost_usd")
    if fleet is None:
        return True, "no fleet rows for the day (no node inventory, or no inventory node alive): nothing to conserve"
    attributed = float(table["cost_usd"].sum())
    expected = fleet + totals.get("off_fleet_cost_usd", 0.0)
    ok = abs(attributed - expected) <= 1e-6 * max(1.0, abs(expected))
    over = totals.get("over_allocated_nodes") or []
    msg = f"attributed ${attributed:,.2f} vs fleet ${fleet:,.2f} + off-fleet ${totals.get('off_fleet_cost_usd', 0.0):,.2f}"
    if over:
        msg += f"; nodes with more GPU-hours allocated than they have: {', '.join(over[:10])}"
    return ok and not over, msg
