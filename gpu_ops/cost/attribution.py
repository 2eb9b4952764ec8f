"""Attribution of priced pieces (pandas): grouped by keys, idle fleet cost as a row or shared.

The pieces themselves (intervals split at UTC midnights, clipped at the as-of time,
GPU-hours = ``gpu_count × gpu_share × hours``, cost = GPU-hours × the price per GPU-hour,
idle = fleet − allocated per node and day) are made in DuckDB SQL
(:mod:`gpu_ops.cost.allocate`); this module groups stored or priced pieces for the
assets, budgets and ROI. `gpu-ops cost attribution` groups in SQL
(:func:`gpu_ops.cost.allocate.attribute`); the tests hold the two together.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
import pandas as pd

from gpu_ops.config import group_column
from gpu_ops.cost.rules import label_value
from gpu_ops.cost.usage import const_column

DAY_NS = 86_400 * 10**9
IDLE = "__idle__"
METRIC_COLUMNS = ("gpu_hours", "cost_usd", "on_demand_equivalent_usd", "savings_usd", "idle_cost_usd")
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


def _codes(s: pd.Series) -> tuple[np.ndarray, list[str]]:
    if isinstance(s.dtype, pd.CategoricalDtype):
        codes, cats = s.cat.codes.to_numpy(), [str(c) for c in s.cat.categories]
    else:
        codes, uniques = pd.factorize(s, use_na_sentinel=True)
        cats = [str(u) for u in uniques]
    return codes, [*cats, ""]  # code -1 (missing) indexes the trailing ""


def _combine(keys: pd.DataFrame) -> tuple[np.ndarray, list[tuple[str, list[str], int]], int]:
    """One int64 code per row for the key combination (mixed radix), its layout and size."""
    n = len(keys)
    combined = np.zeros(n, dtype=np.int64)
    stride = 1
    layout = []
    for name in reversed(list(keys.columns)):
        codes, cats = _codes(keys[name])
        if (codes < 0).any():
            codes = np.where(codes < 0, len(cats) - 1, codes)
        if stride == 1:
            combined[:] = codes
        else:
            combined += codes.astype(np.int64) * stride
        layout.append((name, cats, stride))
        stride *= len(cats)
    return combined, layout, stride


def _labels(layout: list[tuple[str, list[str], int]], present: np.ndarray, names: list[str]) -> dict[str, np.ndarray]:
    out = {}
    for name, cats, st in layout:
        labels = np.array(cats, dtype=object)
        out[name] = labels[(present // st) % len(cats)] if len(present) else np.array([], dtype=object)
    return {n: out[n] for n in names}


def _dedupe_groups(table: pd.DataFrame, names: list[str], values: list[str]) -> pd.DataFrame:
    if table.duplicated(names).any():  # a "" category next to missing values: merge them
        table = table.groupby(names, sort=False, as_index=False)[values].sum(min_count=1)
    return table


def _sum_by(keys: pd.DataFrame, values: dict[str, np.ndarray]) -> pd.DataFrame:
    """Group sums by integer codes and ``np.bincount``: several times faster than a
    pandas groupby on ten million rows, and no copy of the frame."""
    names = list(keys.columns)
    n = len(keys)
    combined, layout, stride = _combine(keys)
    if stride <= 1 << 22:
        present = np.flatnonzero(np.bincount(combined, minlength=stride)) if n else np.array([], np.int64)
        group_of = None
    else:  # too many key combinations for a dense table: compact them first
        group_of, present = pd.factorize(combined)
    out = _labels(layout, present, names)
    for vname, v in values.items():
        if group_of is None:
            out[vname] = np.bincount(combined, weights=v, minlength=stride)[present] if n else np.array([], float)
        else:
            out[vname] = np.bincount(group_of, weights=v, minlength=len(present))
    return _dedupe_groups(pd.DataFrame(out)[[*names, *values]], names, list(values))








def sum_dollars(keys: pd.DataFrame, rows: pd.DataFrame, extra: dict[str, np.ndarray] | None = None) -> pd.DataFrame:
    """GPU-hours, cost and on-demand equivalent (and ``extra`` values) per group of priced
    rows; the equivalent is NaN for a group with any row that has no on-demand price
    (never silently 0)."""
    od = rows["on_demand_usd"].to_numpy(dtype=float)
    od_missing = np.isnan(od)
    values = {
        **(extra or {}),
        "gpu_hours": rows["gpu_hours"].to_numpy(dtype=float),
        "cost_usd": rows["cost_usd"].to_numpy(dtype=float),
        "on_demand_equivalent_usd": np.nan_to_num(od) if od_missing.any() else od,
    }
    if od_missing.any():
        values["_od_missing"] = od_missing.astype(np.float32)
    table = _sum_by(keys, values)
    if "_od_missing" in table:
        table.loc[table["_od_missing"] > 0, "on_demand_equivalent_usd"] = np.nan
        table = table.drop(columns="_od_missing")
    return table


@dataclass
class Attribution:
    table: pd.DataFrame
    group_by: list[str]
    totals: dict[str, Any] = field(default_factory=dict)


def attribute(rows: pd.DataFrame, group_by: Sequence[str], idle: str = "row") -> Attribution:
    """Group priced pieces (allocated and idle rows) by ``group_by``.

    Columns: the key columns, ``gpu_hours``, ``cost_usd``, ``on_demand_equivalent_usd``,
    ``savings_usd`` and ``idle_cost_usd`` (the idle share in ``share`` mode; the whole
    idle cost on the ``__idle__`` row in ``row`` mode). ``on_demand_equivalent_usd`` is
    NaN for a group with any GPU type that has no on-demand price (never silently 0).
    """
    group_by = list(group_by)
    key_cols = [key_column(k) for k in group_by]
    alloc_mask = ~is_idle(rows)
    alloc = rows[alloc_mask] if not alloc_mask.all() else rows
    idle_part = rows[~alloc_mask]

    keys = key_frame(alloc, group_by)
    table = sum_dollars(keys, alloc)
    # Stored rows with zero hours must not make groups; pieces always have hours > 0 and
    # shares/counts are > 0, so this is the same test.
    table = table[table["gpu_hours"] > 0].reset_index(drop=True)
    for c in key_cols:
        table[c] = table[c].astype(str)
    table["idle_cost_usd"] = 0.0

    idle_cost = float(idle_part["cost_usd"].sum()) if len(idle_part) else 0.0
    idle_hours = float(idle_part["gpu_hours"].sum()) if len(idle_part) else 0.0
    idle_od = float(idle_part["on_demand_usd"].sum(min_count=1)) if len(idle_part) else 0.0
    alloc_cost = float(table["cost_usd"].sum())
    shared = False
    if len(idle_part):
        if idle == "share" and alloc_cost > 0:
            # Shared by each group's share of allocated cost (OpenCost's weighted sharing).
            w = table["cost_usd"].to_numpy() / alloc_cost
            table["gpu_hours"] += w * idle_hours
            table["cost_usd"] += w * idle_cost
            table["on_demand_equivalent_usd"] += w * idle_od
            table["idle_cost_usd"] = w * idle_cost
            shared = True
        else:
            idle_row = {c: IDLE for c in key_cols} | {
                "gpu_hours": idle_hours, "cost_usd": idle_cost, "on_demand_equivalent_usd": idle_od, "idle_cost_usd": idle_cost,
            }
            table = pd.concat([table, pd.DataFrame([idle_row])], ignore_index=True)
    table["savings_usd"] = table["on_demand_equivalent_usd"] - table["cost_usd"]
    table = table[[*key_cols, *METRIC_COLUMNS]]
    table = table.sort_values(["cost_usd", *key_cols], ascending=[False, *([True] * len(key_cols))], kind="stable").reset_index(drop=True)
    totals = fleet_totals(rows)
    totals.update(idle_shared=shared, attributed_cost_usd=float(table["cost_usd"].sum()), groups=int((table[key_cols[0]] != IDLE).sum()) if key_cols else len(table))
    return Attribution(table, group_by, totals)


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
