"""The cloud bill: AWS Cost and Usage Report (CUR 2.0) lines of GPU instances, per day.

Pure logic, no Dagster.

- Which lines: EC2 instance-hours (usage type ``BoxUsage``/``SpotUsage``/``DedicatedUsage``/
  ``HeavyUsage``/``HostUsage``) of a resource ``i-…``, kept when the instance is in the node
  inventory or its ``product_instance_type`` is a GPU type of the catalog. The rest of
  the bill is not GPU compute and is ignored.
- Effective cost by ``line_item_line_item_type``: ``SavingsPlanCoveredUsage`` ->
  ``savings_plan_savings_plan_effective_cost``; ``DiscountedUsage`` ->
  ``reservation_effective_cost``; ``Usage``, ``Refund``, ``Credit`` -> the net unblended
  cost where the export has it, else the unblended cost (refunds and credits are
  negative). Discount lines (``EdpDiscount``, ``PrivateRateDiscount``,
  ``BundledDiscount``, ``DistributorDiscount``) count only without a net column (the net
  cost already has them). ``SavingsPlanNegation`` and fees are not instance cost (the
  effective cost replaces them).
- A line that cannot be read (bad date, a cost that is not a number, the effective cost
  its type needs missing) is quarantined with file, row, field and reason: never a zero.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from gpu_ops.compute.catalog import CATALOG
from gpu_ops.errors import GpuOpsError
from gpu_ops.cost.usage import Problems as _Problems, concat_raw, empty_quarantine, expand_pattern as _expand, parse_times, read_table_file

START = "line_item_usage_start_date"
RESOURCE = "line_item_resource_id"
USAGE_TYPE = "line_item_usage_type"
LINE_TYPE = "line_item_line_item_type"
UNBLENDED = "line_item_unblended_cost"
NET = "line_item_net_unblended_cost"
SP_EFFECTIVE = "savings_plan_savings_plan_effective_cost"
RI_EFFECTIVE = "reservation_effective_cost"
INSTANCE_TYPE = "product_instance_type"
PRICING_TERM = "pricing_term"
CUR_COLUMNS = (START, RESOURCE, USAGE_TYPE, LINE_TYPE, UNBLENDED, NET, SP_EFFECTIVE, RI_EFFECTIVE, INSTANCE_TYPE, PRICING_TERM)
REQUIRED = (START, RESOURCE, USAGE_TYPE, UNBLENDED)
BILLED_COLUMNS = ("day", "instance_id", "instance_type", "pricing_term", "billed_usd", "lines")
_INSTANCE_HOURS = re.compile(r"(?:^|:|-)(?:BoxUsage|SpotUsage|DedicatedUsage|HeavyUsage|HostUsage)(?::|$)")
_INSTANCE_ID = re.compile(r"^i-[0-9a-f]{8,17}$")
_DISCOUNTS = ("EdpDiscount", "PrivateRateDiscount", "BundledDiscount", "DistributorDiscount")
_NOT_INSTANCE_COST = ("SavingsPlanNegation", "SavingsPlanRecurringFee", "SavingsPlanUpfrontFee", "RIFee", "Fee", "Tax")
GPU_INSTANCE_TYPES = {t: (g, n) for g, spec in CATALOG.items() for t, n in spec.instance_types.items()}


class BillingSourceError(GpuOpsError, ValueError):
    """A CUR file cannot be read at all (missing file, missing columns)."""


@dataclass
class Bill:
    lines: pd.DataFrame  # BILLED_COLUMNS, one row per day × instance
    quarantine: pd.DataFrame  # QUARANTINE_COLUMNS of gpu_ops.cost.usage


def read_cur(patterns: Iterable[str], base_dir: Path | None = None) -> pd.DataFrame:
    """The CUR files (CSV or Parquet) as text-ish columns, with file and row of each line."""
    frames = []
    for pattern in patterns:
        for path in _expand(pattern, base_dir):
            df = read_table_file(path, columns=CUR_COLUMNS)
            missing = [c for c in REQUIRED if c not in df.columns]
            if missing:
                raise BillingSourceError(f"{path}: missing CUR column(s) {', '.join(missing)}")
            df["source"] = "aws_cur"
            df["location"] = str(path)
            df["row"] = np.arange(1, len(df) + 1, dtype=np.int64)
            frames.append(df)
    return concat_raw(frames) if frames else pd.DataFrame(columns=[*REQUIRED, "source", "location", "row"])


def _text(raw: pd.DataFrame, col: str) -> pd.Series:
    if col not in raw:
        return pd.Series([""] * len(raw), index=raw.index, dtype=object)
    s = raw[col].astype(object)
    return s.where(s.notna(), "").astype(str).str.strip()


def _money(raw: pd.DataFrame, col: str) -> tuple[np.ndarray, np.ndarray]:
    """(values, unparseable mask); blank is NaN and not unparseable."""
    if col not in raw:
        return np.full(len(raw), np.nan), np.zeros(len(raw), bool)
    text = _text(raw, col)
    values = pd.to_numeric(text.where(text != "", None), errors="coerce").to_numpy(dtype=float)
    return values, np.isnan(values) & (text != "").to_numpy() | np.isinf(values)


def gpu_bill(raw: pd.DataFrame, inventory_ids: Iterable[str] = ()) -> Bill:
    """Billed effective cost of GPU instances per UTC day (see the module docstring)."""
    if not len(raw):
        return Bill(pd.DataFrame({c: pd.Series([], dtype=float if c in ("billed_usd", "lines") else object) for c in BILLED_COLUMNS}), empty_quarantine())
    resource, usage_type, itype = _text(raw, RESOURCE), _text(raw, USAGE_TYPE), _text(raw, INSTANCE_TYPE)
    line_type = _text(raw, LINE_TYPE).where(_text(raw, LINE_TYPE) != "", "Usage")
    known = set(inventory_ids)
    relevant = (
        resource.str.match(_INSTANCE_ID.pattern).to_numpy()
        & usage_type.str.contains(_INSTANCE_HOURS).to_numpy()
        & (resource.isin(known) | itype.isin(GPU_INSTANCE_TYPES)).to_numpy()
        & ~line_type.isin(_NOT_INSTANCE_COST).to_numpy()
    )
    has_net = NET in raw and bool(_text(raw, NET).ne("").any())
    if has_net:
        relevant &= ~line_type.isin(_DISCOUNTS).to_numpy()
    raw, resource, itype, line_type = raw[relevant], resource[relevant], itype[relevant], line_type[relevant]
    n = len(raw)
    problems = _Problems(n)
    start, bad_start = parse_times(raw[START])
    problems.add(bad_start, START, lambda idx: [f"unparseable time {raw[START].iloc[i]!r}" for i in idx])
    problems.add(start.isna().to_numpy() & ~bad_start, START, "missing")
    cost = np.full(n, np.nan)
    lt = line_type.to_numpy(dtype=object)
    for col, types in ((SP_EFFECTIVE, ("SavingsPlanCoveredUsage",)), (RI_EFFECTIVE, ("DiscountedUsage",)), (UNBLENDED, None)):
        values, bad = _money(raw, col)
        rows = np.isin(lt, types) if types else ~np.isin(lt, ("SavingsPlanCoveredUsage", "DiscountedUsage"))
        if col == UNBLENDED and has_net:
            net, bad_net = _money(raw, NET)
            problems.add(rows & bad_net, NET, _not_a_number(raw, NET))
            values = np.where(np.isnan(net), values, net)
        problems.add(rows & bad, col, _not_a_number(raw, col))
        problems.add(rows & np.isnan(values) & ~bad, col, _missing_cost(lt, col))
        cost = np.where(rows, values, cost)
    unknown = ~np.isin(lt, ("Usage", "SavingsPlanCoveredUsage", "DiscountedUsage", "Refund", "Credit", *_DISCOUNTS))
    problems.add(unknown, LINE_TYPE, lambda idx: [f"unknown line item type {lt[i]!r}" for i in idx])
    quarantine = problems.render(raw, start, start)
    ok = ~problems.bad
    frame = pd.DataFrame(
        {
            "day": start[ok].dt.floor("D").to_numpy(),
            "instance_id": resource[ok].to_numpy(),
            "instance_type": itype[ok].to_numpy(),
            "pricing_term": _text(raw, PRICING_TERM)[ok].to_numpy(),
            "billed_usd": cost[ok],
            "lines": 1.0,
        }
    )
    lines = frame.groupby(["day", "instance_id"], as_index=False, sort=True).agg(
        instance_type=("instance_type", "first"), pricing_term=("pricing_term", _terms), billed_usd=("billed_usd", "sum"), lines=("lines", "sum"),
    )
    lines["day"] = pd.to_datetime(lines["day"], utc=True)
    return Bill(lines[list(BILLED_COLUMNS)], quarantine)


def _not_a_number(raw: pd.DataFrame, col: str) -> Any:
    return lambda idx: [f"not a number: {raw[col].iloc[i]!r}" for i in idx]


def _missing_cost(line_types: np.ndarray, col: str) -> Any:
    return lambda idx: [f"missing (a {line_types[i]} line is billed at its {col})" for i in idx]


def _terms(s: pd.Series) -> str:
    return ",".join(sorted({t for t in s if t}))


def node_instance_ids(raw_inventory: pd.DataFrame | None) -> dict[str, str]:
    """node -> EC2 instance id: the inventory's ``instance_id`` column, else the node name
    when it is one (``i-…``), else the id in a Karpenter ``provider_id`` (``aws:///zone/i-…``)."""
    if raw_inventory is None or not len(raw_inventory):
        return {}
    nodes = _text(raw_inventory, "node")
    ids = _text(raw_inventory, "instance_id")
    provider = _text(raw_inventory, "provider_id").str.extract(r"(i-[0-9a-f]+)$", expand=False).fillna("")
    chosen = ids.where(ids != "", nodes.where(nodes.str.match(_INSTANCE_ID.pattern), provider))
    return {n: i for n, i in zip(nodes, chosen) if n and i}


# --------------------------------------------------------------------------- reconciliation


def reconcile(usage: pd.DataFrame, bill: pd.DataFrame, node_ids: dict[str, str], day: Any, tolerance_percent: float = 2.0) -> dict[str, Any]:
    """Fleet cost of the day (inventory × prices: the idle rows' ``fleet_cost_usd``) against
    the bill, per node. ``passed`` when the totals differ by at most ``tolerance_percent``
    of the bill; ``nodes`` lists each node's difference, largest first."""
    d = pd.Timestamp(day).tz_localize("UTC") if pd.Timestamp(day).tzinfo is None else pd.Timestamp(day)
    idle = usage[usage["kind"].astype(str) == "idle"]
    fleet = idle.groupby(idle["node"].astype(str))["fleet_cost_usd"].sum()
    billed_day = bill[bill["day"] == d]
    billed = billed_day.groupby("instance_id")["billed_usd"].sum()
    by_id = {node_ids.get(n, n): n for n in fleet.index}
    rows = []
    for node, cost in fleet.items():
        iid = node_ids.get(node, node)
        rows.append({"node": node, "instance_id": iid, "fleet_usd": float(cost), "billed_usd": float(billed.get(iid, 0.0)), "in_bill": iid in billed.index})
    for iid, cost in billed.items():
        if iid not in by_id:
            rows.append({"node": "", "instance_id": iid, "fleet_usd": 0.0, "billed_usd": float(cost), "in_bill": True})
    nodes = pd.DataFrame(rows, columns=["node", "instance_id", "fleet_usd", "billed_usd", "in_bill"])
    nodes["difference_usd"] = nodes["fleet_usd"] - nodes["billed_usd"]
    nodes = nodes.reindex(nodes["difference_usd"].abs().sort_values(ascending=False, kind="stable").index).reset_index(drop=True)
    fleet_total, billed_total = float(nodes["fleet_usd"].sum()), float(nodes["billed_usd"].sum())
    diff = fleet_total - billed_total
    limit = tolerance_percent / 100.0 * abs(billed_total)
    passed = abs(diff) <= max(limit, 0.005)
    return {"passed": passed, "fleet_usd": fleet_total, "billed_usd": billed_total, "difference_usd": diff, "tolerance_usd": limit, "nodes": nodes, "description": _explain(passed, fleet_total, billed_total, diff, nodes, tolerance_percent)}


def _explain(passed: bool, fleet: float, billed: float, diff: float, nodes: pd.DataFrame, tol: float) -> str:
    pct = f" ({diff / billed * 100:+.2f}%)" if billed else ""
    head = f"fleet ${fleet:,.2f} (inventory × prices) vs billed ${billed:,.2f}: {diff:+,.2f}{pct}, tolerance {tol:g}%"
    if passed:
        return head
    worst = nodes[nodes["difference_usd"].abs() >= 0.005].head(5)
    parts = []
    for r in worst.itertuples(index=False):
        who = r.node or f"instance {r.instance_id} (billed, not in the inventory)"
        note = "" if r.in_bill or not r.node else " (no bill line for its instance)"
        parts.append(f"{who} [{r.instance_id}]: fleet ${r.fleet_usd:,.2f} vs billed ${r.billed_usd:,.2f} ({r.difference_usd:+,.2f}){note}")
    return head + ". Explained by: " + "; ".join(parts)


# --------------------------------------------------------------------------- from_bill


def apply_bill(rows: pd.DataFrame, bill: pd.DataFrame, node_ids: dict[str, str]) -> tuple[pd.DataFrame, dict[str, Any]]:
    """Priced rows (allocated and idle) re-priced at the billed effective cost per GPU-hour
    of each node and day: rate = billed ÷ the node's GPU-hours that day. Afterwards, per
    billed node, allocated + idle = billed. Nodes without a bill line keep list prices
    (reported in the returned summary); rows off the inventory are unchanged.
    """
    rows = rows.copy()
    idle = rows["kind"].astype(str).to_numpy() == "idle"
    node = rows["node"].astype(str).to_numpy()
    day = pd.to_datetime(rows["day"], utc=True)
    fleet = pd.DataFrame({"node": node[idle], "day": day[idle].to_numpy(), "fleet_gpu_hours": rows.loc[idle, "fleet_gpu_hours"].to_numpy(dtype=float)})
    fleet["instance_id"] = [node_ids.get(n, n) for n in fleet["node"]]
    fleet["day"] = pd.to_datetime(fleet["day"], utc=True)
    fleet = fleet.merge(bill[["day", "instance_id", "billed_usd"]], on=["day", "instance_id"], how="left")
    fleet["rate"] = fleet["billed_usd"] / fleet["fleet_gpu_hours"]
    rate_of = pd.Series(fleet["rate"].to_numpy(), index=pd.MultiIndex.from_arrays([fleet["node"], fleet["day"]]))
    rate = rate_of.reindex(pd.MultiIndex.from_arrays([node, day])).to_numpy(dtype=float)
    repriced = ~np.isnan(rate) & ~idle
    gh = rows["gpu_hours"].to_numpy(dtype=float)
    cost = rows["cost_usd"].to_numpy(dtype=float).copy()
    price = pd.to_numeric(rows["price_per_gpu_hour"], errors="coerce").to_numpy(dtype=float).copy()
    cost[repriced] = gh[repriced] * rate[repriced]
    price[repriced] = rate[repriced]
    for col, per_hour in (("lost_cost_usd", "lost_gpu_hours"),):
        if col in rows and per_hour in rows:
            v = rows[col].to_numpy(dtype=float).copy()
            v[repriced] = rows[per_hour].to_numpy(dtype=float)[repriced] * rate[repriced]
            rows[col] = v
    if "unused_cost_usd" in rows:
        unused = rows["unused_cost_usd"].to_numpy(dtype=float).copy()
        m = repriced & ~np.isnan(unused)
        unused[m] = (rows["metered_gpu_hours"].to_numpy(dtype=float)[m] - rows["active_gpu_hours"].to_numpy(dtype=float)[m]) * rate[m]
        rows["unused_cost_usd"] = unused
    # Idle = billed − allocated, per node and day: the bill is conserved exactly.
    alloc = pd.DataFrame({"node": node[repriced], "day": day[repriced].to_numpy(), "cost": cost[repriced]}).groupby(["node", "day"])["cost"].sum()
    idle_billed = idle & ~np.isnan(rate)
    keys = pd.MultiIndex.from_arrays([node[idle_billed], day[idle_billed]])
    billed_of = pd.Series(fleet["billed_usd"].to_numpy(), index=pd.MultiIndex.from_arrays([fleet["node"], fleet["day"]]))
    billed_rows = billed_of.reindex(keys).to_numpy(dtype=float)
    cost[idle_billed] = billed_rows - alloc.reindex(keys).fillna(0.0).to_numpy(dtype=float)
    price[idle_billed] = rate[idle_billed]
    rows["cost_usd"], rows["price_per_gpu_hour"] = cost, price
    if "fleet_cost_usd" in rows:
        fc = rows["fleet_cost_usd"].to_numpy(dtype=float).copy()
        fc[idle_billed] = billed_rows
        rows["fleet_cost_usd"] = fc
    unbilled = sorted(set(fleet.loc[fleet["billed_usd"].isna(), "node"]))
    return rows, {"billed_usd": float(fleet["billed_usd"].sum()), "billed_nodes": int(fleet["billed_usd"].notna().sum()), "unbilled_nodes": unbilled}


# --------------------------------------------------------------------------- the day's settlement


@dataclass
class Settlement:
    """What the bill does to the usage rows of some days: the check per day, the rows
    (re-priced when ``prices.from_bill``), the CUR lines set aside."""

    table: pd.DataFrame
    quarantine: pd.DataFrame  # with partition_key per day
    days: list[dict[str, Any]]  # reconcile() per day, with "day"
    from_bill: dict[str, Any] | None

    @property
    def passed(self) -> bool:
        return all(d["passed"] for d in self.days)

    def description(self) -> str:
        if len(self.days) == 1:
            return str(self.days[0]["description"])
        bad = [d for d in self.days if not d["passed"]]
        return "; ".join(f"{d['day']:%Y-%m-%d}: {d['description']}" for d in bad) if bad else f"all {len(self.days)} days within tolerance"

    def metadata(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "billed_usd": round(sum(d["billed_usd"] for d in self.days), 2),
            "fleet_usd": round(sum(d["fleet_usd"] for d in self.days), 2),
            "difference_usd": round(sum(d["difference_usd"] for d in self.days), 2),
            "quarantined_bill_lines": len(self.quarantine),
        }
        worst = pd.concat([d["nodes"].assign(day=f"{d['day']:%Y-%m-%d}") for d in self.days], ignore_index=True) if self.days else pd.DataFrame()
        if len(worst):
            worst = worst.reindex(worst["difference_usd"].abs().sort_values(ascending=False, kind="stable").index).head(10)
            out["nodes"] = worst[["day", "node", "instance_id", "fleet_usd", "billed_usd", "difference_usd"]].round(2)
        return out


def settle(config: Any, table: pd.DataFrame, first: Any, last: Any, store: Any = None) -> Settlement:
    """Read the bill (``usage.billing``), reconcile each day of ``first..last`` against the
    fleet in ``table`` and, with ``prices.from_bill``, re-price ``table`` at the bill."""
    from gpu_ops.cost.attribution import day_window
    from gpu_ops.cost.pipeline import load_inventory
    from gpu_ops.cost.sources import SourceSet
    from gpu_ops.cost.usage import quarantine_in_window

    billing = config.usage.billing
    node_ids = node_instance_ids(load_inventory(SourceSet.from_config(config), store))
    bill = gpu_bill(read_cur([billing.path], config.base_dir), node_ids.values())
    days = list(pd.date_range(pd.Timestamp(first), pd.Timestamp(last), freq="D", tz="UTC"))
    table_day = pd.to_datetime(table["day"], utc=True) if len(table) else pd.Series([], dtype="datetime64[ns, UTC]")
    checks = [{"day": d, **reconcile(table[(table_day == d).to_numpy()], bill.lines, node_ids, d, billing.tolerance_percent)} for d in days]
    quarantine = pd.concat(
        [quarantine_in_window(bill.quarantine, *day_window(d)).assign(partition_key=f"{d:%Y-%m-%d}") for d in days], ignore_index=True,
    )
    summary = None
    if config.prices.from_bill and len(table):
        table, summary = apply_bill(table, bill.lines, node_ids)
    return Settlement(table, quarantine, checks, summary)
