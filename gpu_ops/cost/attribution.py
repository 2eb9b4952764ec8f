"""Attribution: intervals clipped to UTC days, priced, idle fleet cost, grouped by keys.

- An interval is split at every UTC midnight it crosses; an open interval (no ``end``)
  is clipped at the as-of time. Each day gets exactly its own share.
- Physical GPU-hours = ``gpu_count × gpu_share × hours``: a 1g.10gb MIG slice is 1/7 of
  an A100-80GB, one of four time-slice replicas is 1/4 of a GPU.
- Cost = GPU-hours × per-GPU price for gpu type × capacity type (× region multiplier).
- With a node inventory the fleet's cost is known and idle = fleet − allocated per node
  (OpenCost's rule), kept as explicit ``kind == "idle"`` rows so that every dollar of
  the fleet lands somewhere and totals are conserved.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
import pandas as pd

from gpu_ops.config import group_column
from gpu_ops.cost.usage import NS_PER_HOUR, as_floats, const_column, utc_series

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


def split_by_day(rows: pd.DataFrame, window_start: Any, window_end: Any, as_of: Any, drop_empty: bool = True) -> pd.DataFrame:
    """Pieces of every interval inside ``[window_start, min(window_end, as_of))``, one per UTC day.

    Adds ``interval_start``/``interval_end`` (the original interval), ``day`` (the UTC
    date), ``hours`` and, when ``lost_seconds`` is present, ``lost_hours``: the part of
    the piece after the last checkpoint (``[end - lost_seconds, end]``).

    With ``drop_empty=False`` and a one-day window, intervals outside the window are kept
    with zero hours instead of being filtered out: no copy of the frame, which is what
    makes a ten-million-row attribution cheap. Sums are unchanged; :func:`attribute`
    drops groups that had no hours at all.
    """
    lo = utc(window_start).value
    hi = min(utc(window_end).value, utc(as_of).value)
    s = rows["start"].array.asi8 if len(rows) else np.array([], np.int64)
    e = rows["end"].array.asi8 if len(rows) else np.array([], np.int64)
    # In place where possible: every temporary is 80 MB at ten million rows.
    e_eff = e.copy()
    e_eff[e_eff == _NAT] = hi  # open intervals run to the as-of time
    np.minimum(e_eff, hi, out=e_eff)
    s_eff = np.maximum(s, lo)
    one_day = (hi - 1) // DAY_NS == lo // DAY_NS
    if not drop_empty and one_day:
        ps, pe = s_eff, np.maximum(e_eff, s_eff, out=e_eff)
        # One day for every row: a read-only broadcast view, not an 80 MB array.
        day = np.broadcast_to(np.int64(lo // DAY_NS * DAY_NS), (len(rows),))
        pieces = rows
    else:
        keep = np.flatnonzero(e_eff > s_eff)
        s_eff, e_eff = s_eff[keep], e_eff[keep]
        day0 = s_eff // DAY_NS
        n = (e_eff - 1) // DAY_NS - day0 + 1
        if len(n) and n.max() > 1:
            rep = np.repeat(np.arange(len(keep)), n)
            k = np.arange(len(rep)) - np.repeat(np.cumsum(n) - n, n)
            dayn = day0[rep] + k
            ps = np.maximum(s_eff[rep], dayn * DAY_NS)
            pe = np.minimum(e_eff[rep], (dayn + 1) * DAY_NS)
            take = keep[rep]
        else:
            dayn, ps, pe, take = day0, s_eff, e_eff, keep
        day = dayn * DAY_NS
        whole = len(take) == len(rows) and (len(take) == 0 or (take[0] == 0 and bool((np.diff(take) == 1).all())))
        pieces = rows if whole else rows.take(take)
    cols: dict[str, Any] = {c: pieces[c].reset_index(drop=True) for c in pieces.columns}
    cols["interval_start"], cols["interval_end"] = cols["start"], cols["end"]
    cols["start"], cols["end"], cols["day"] = utc_series(ps), utc_series(pe), utc_series(day)
    hours = np.empty(len(ps))
    np.subtract(pe, ps, out=hours, casting="unsafe")
    hours /= NS_PER_HOUR
    cols["hours"] = hours
    if "lost_seconds" in cols:
        lost = cols["lost_seconds"].to_numpy(dtype=float)
        ie = cols["interval_end"].array.asi8
        has = (ie != _NAT) & (lost > 0)
        l0 = np.where(has, ie - (np.nan_to_num(lost) * 1e9).astype(np.int64), np.iinfo(np.int64).max)
        cols["lost_hours"] = np.where(has, np.clip(pe - np.maximum(ps, l0), 0, None), 0) / NS_PER_HOUR
    return pd.DataFrame(cols, copy=False)


def price_pieces(pieces: pd.DataFrame, per_row: bool = True) -> pd.DataFrame:
    """GPU-hours and dollars of allocated pieces (rows from :func:`split_by_day`).

    ``per_row=False`` computes only ``gpu_hours``: :func:`attribute` then sums GPU-hours
    per price and multiplies once per group (the ten-million-row path); prices stay coded.
    """
    physical = np.multiply(pieces["gpu_count"].to_numpy(), pieces["gpu_share"].to_numpy(dtype=float))
    lost_gpu_hours = physical * pieces["lost_hours"].to_numpy() if per_row and "lost_hours" in pieces else None
    gpu_hours = physical
    gpu_hours *= pieces["hours"].to_numpy()  # in place: physical is not needed any more
    cols: dict[str, Any] = {c: pieces[c] for c in pieces.columns}
    cols.update(gpu_hours=gpu_hours, kind=const_column(len(pieces), "allocated"))
    if lost_gpu_hours is not None:
        cols["lost_gpu_hours"] = lost_gpu_hours
    out = pd.DataFrame(cols, copy=False)
    return price_dollars(out) if per_row else out


def price_dollars(rows: pd.DataFrame) -> pd.DataFrame:
    """Dollars of priced GPU-hours: the one place where cost = GPU-hours × per-GPU price
    (and the on-demand equivalent, and the cost of lost GPU-hours). NaN prices stay NaN."""
    gpu_hours = rows["gpu_hours"].to_numpy(dtype=float)
    price = as_floats(rows["price_per_gpu_hour"])
    od = as_floats(rows["on_demand_price_per_gpu_hour"])
    cols: dict[str, Any] = {c: rows[c] for c in rows.columns}
    cols.update(price_per_gpu_hour=price, on_demand_price_per_gpu_hour=od, cost_usd=gpu_hours * price, on_demand_usd=gpu_hours * od)
    if "lost_gpu_hours" in rows:
        cols["lost_cost_usd"] = rows["lost_gpu_hours"].to_numpy(dtype=float) * price
    return pd.DataFrame(cols, copy=False)


# --------------------------------------------------------------------------- idle


def idle_rows(inventory_pieces: pd.DataFrame, allocated: pd.DataFrame) -> pd.DataFrame:
    """One ``kind == "idle"`` row per node and day: fleet − allocated (GPU-hours and dollars).

    Dollars are subtracted, not GPU-hours re-priced, so allocated + idle equals the fleet
    exactly even when a pod's recorded capacity type differs from its node's.
    """
    if inventory_pieces.empty:
        return pd.DataFrame()
    inv = inventory_pieces.assign(
        _cap_gpu_hours=inventory_pieces["gpu_count"].to_numpy(dtype=float) * inventory_pieces["hours"].to_numpy(),
    )
    inv["price_per_gpu_hour"] = as_floats(inv["price_per_gpu_hour"])
    inv["on_demand_price_per_gpu_hour"] = as_floats(inv["on_demand_price_per_gpu_hour"])
    inv["_cap_cost"] = inv["_cap_gpu_hours"] * inv["price_per_gpu_hour"].to_numpy()
    inv["_cap_od"] = inv["_cap_gpu_hours"] * inv["on_demand_price_per_gpu_hour"].to_numpy()
    inv["node"] = inv["node"].astype(str)
    first = {c: "first" for c in ("gpu_type", "capacity_type", "region", "gpu_count", "price_per_gpu_hour", "on_demand_price_per_gpu_hour", "source", "location", "row") if c in inv}
    if "instance_type" in inv:
        first["instance_type"] = "first"
    fleet = inv.groupby(["node", "day"], sort=True, observed=True).agg(
        start=("start", "min"), end=("end", "max"), hours=("hours", "sum"), fleet_gpu_hours=("_cap_gpu_hours", "sum"),
        fleet_cost_usd=("_cap_cost", "sum"), fleet_on_demand_usd=("_cap_od", "sum"), **{c: (c, how) for c, how in first.items()},
    ).reset_index()
    if len(allocated):
        alloc = (
            allocated.assign(node=allocated["node"].astype(str))
            .groupby(["node", "day"], sort=False, observed=True)[["gpu_hours", "cost_usd", "on_demand_usd"]]
            .sum()
            .rename(columns=lambda c: f"_alloc_{c}")
            .reset_index()
        )
        fleet = fleet.merge(alloc, on=["node", "day"], how="left")
    for c in ("gpu_hours", "cost_usd", "on_demand_usd"):
        col = f"_alloc_{c}"
        fleet[col] = fleet[col].fillna(0.0) if col in fleet else 0.0
    n = len(fleet)
    out = pd.DataFrame(
        {
            "start": fleet["start"], "end": fleet["end"], "day": fleet["day"],
            **{c: IDLE for c in ("namespace", "team", "project", "cost_center", "experiment_id")},
            "pod": "", "node": fleet["node"],
            "gpu_type": fleet["gpu_type"].astype(str), "gpu_count": fleet["gpu_count"].astype(float),
            "capacity_type": fleet["capacity_type"].astype(str), "sharing": "none", "gpu_share": 1.0,
            "region": fleet["region"].astype(str) if "region" in fleet else "",
            "hours": fleet["hours"],
            "price_per_gpu_hour": fleet["price_per_gpu_hour"], "on_demand_price_per_gpu_hour": fleet["on_demand_price_per_gpu_hour"],
            "gpu_hours": fleet["fleet_gpu_hours"] - fleet["_alloc_gpu_hours"],
            "cost_usd": fleet["fleet_cost_usd"] - fleet["_alloc_cost_usd"],
            "on_demand_usd": fleet["fleet_on_demand_usd"] - fleet["_alloc_on_demand_usd"],
            "lost_gpu_hours": 0.0, "lost_cost_usd": 0.0,
            "fleet_gpu_hours": fleet["fleet_gpu_hours"], "fleet_cost_usd": fleet["fleet_cost_usd"],
            "kind": "idle",
            "source": fleet["source"].astype(str) if "source" in fleet else "inventory",
            "location": fleet["location"].astype(str) if "location" in fleet else "",
            "row": fleet["row"].astype("Int64") if "row" in fleet else pd.array([None] * n, dtype="Int64"),
        }
    )
    if "instance_type" in fleet:
        out["instance_type"] = fleet["instance_type"].astype(str)
    out["interval_start"] = out["start"]
    out["interval_end"] = out["end"]
    return out


# --------------------------------------------------------------------------- grouping


def label_values(labels: pd.Series, name: str) -> pd.Series:
    """Value of one label per row from the ``labels`` JSON column ("" when absent)."""
    codes, uniques = pd.factorize(labels, use_na_sentinel=True)
    vals = []
    for u in uniques:
        try:
            d = json.loads(u) if isinstance(u, str) and u.strip() else {}
        except json.JSONDecodeError:
            d = {}
        vals.append(str(d.get(name, "")) if isinstance(d, dict) else "")
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


def priced_cells(pieces: pd.DataFrame, keys: Sequence[str]) -> pd.DataFrame:
    """Coded-price pieces (``price_pieces(per_row=False)``) summed into cells.

    One row per (``keys``, price, on-demand price) with its ``gpu_hours``: GPU-hours are
    summed with one ``bincount`` over integer codes, no per-row dollar arrays. Key values
    come back as text ("" for missing), prices as floats (NaN when missing). Cells of
    several batches can be concatenated and summed again (:func:`combine_cells`).
    """
    keys = list(keys)
    combined, layout, G = _combine(pieces[keys]) if keys else (np.zeros(len(pieces), np.int64), [], 1)
    price, od = pieces["price_per_gpu_hour"], pieces["on_demand_price_per_gpu_hour"]
    pc, oc = price.cat.codes.to_numpy(), od.cat.codes.to_numpy()
    pvals = np.append(price.cat.categories.to_numpy(dtype=float), np.nan)  # code -1 -> NaN
    ovals = np.append(od.cat.categories.to_numpy(dtype=float), np.nan)
    P, O = len(pvals), len(ovals)
    if (pc < 0).any():
        pc = np.where(pc < 0, P - 1, pc)
    if (oc < 0).any():
        oc = np.where(oc < 0, O - 1, oc)
    # In place, no temporaries: ((group × P) + price) × O + on-demand price.
    combined *= P
    combined += pc
    combined *= O
    combined += oc
    gpu_hours = pieces["gpu_hours"].to_numpy(dtype=float)
    if not len(combined):
        cells, hours = np.array([], np.int64), np.array([])
    elif G * P * O <= 1 << 24:
        t = np.bincount(combined, weights=gpu_hours, minlength=G * P * O)
        cells = np.flatnonzero(t)
        hours = t[cells]
    else:
        codes, cells = pd.factorize(combined)
        hours = np.bincount(codes, weights=gpu_hours, minlength=len(cells))
    group, p, o = cells // (P * O), (cells // O) % P, cells % O
    return pd.DataFrame({**_labels(layout, group, keys), "price_per_gpu_hour": pvals[p], "on_demand_price_per_gpu_hour": ovals[o], "gpu_hours": hours})


def combine_cells(parts: Sequence[pd.DataFrame], keys: Sequence[str]) -> pd.DataFrame:
    """Cells of several batches summed per (keys, price, on-demand price)."""
    parts = [p for p in parts if len(p)]
    if not parts:
        return pd.DataFrame({**{k: pd.Series([], dtype=object) for k in keys}, "price_per_gpu_hour": [], "on_demand_price_per_gpu_hour": [], "gpu_hours": []})
    cells = pd.concat(parts, ignore_index=True) if len(parts) > 1 else parts[0]
    by = [*keys, "price_per_gpu_hour", "on_demand_price_per_gpu_hour"]
    return cells.groupby(by, sort=False, dropna=False, as_index=False)["gpu_hours"].sum()


def cell_pieces(cells: pd.DataFrame) -> pd.DataFrame:
    """Cells as allocated pieces with dollars: what :func:`attribute`, :func:`idle_rows`
    and :func:`fleet_totals` sum (sums over cells equal sums over the pieces)."""
    return price_dollars(cells.assign(kind=const_column(len(cells), "allocated")))


def _sum_dollars(keys: pd.DataFrame, rows: pd.DataFrame, extra: dict[str, np.ndarray] | None = None) -> pd.DataFrame:
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
    if "cost_usd" not in alloc:  # coded prices (price_pieces(per_row=False)): per price cell first
        alloc = cell_pieces(priced_cells(pd.concat([keys, alloc[["price_per_gpu_hour", "on_demand_price_per_gpu_hour", "gpu_hours"]]], axis=1), key_cols))
        keys = alloc[key_cols]
    table = _sum_dollars(keys, alloc)
    # Rows kept with zero hours (split_by_day(drop_empty=False)) must not make groups;
    # pieces always have hours > 0 and shares/counts are > 0, so this is the same test.
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
    if "cost_usd" in rows or rows.empty:
        totals = fleet_totals(rows)
    else:  # coded prices: no idle rows (no inventory), totals come from the table
        totals = {"gpu_hours": float(table["gpu_hours"].sum()), "allocated_cost_usd": alloc_cost, "idle_cost_usd": 0.0, "fleet_cost_usd": None, "off_fleet_cost_usd": 0.0, "over_allocated_nodes": []}
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
