"""ROI from measurements only: every figure is a sum over priced usage rows.

- spot (and reserved) savings: on-demand price minus the price paid, per GPU-hour used;
- sharing savings: the ``1 - gpu_share`` of each shared GPU that was not paid for;
- preemption waste: GPU-hours of preempted attempts after their last checkpoint (the
  ledger's ``lost_seconds``), priced at what was paid; net spot savings subtract it;
- idle waste: the fleet's idle rows.

No fixed discount percentages (the gpuautoscaler seed's "60-90% spot savings"); the
recommendations carry the dollar figure they are computed from.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from gpu_ops.compute.catalog import CATALOG

ROI_COLUMNS = (
    "team", "gpu_hours", "cost_usd", "on_demand_equivalent_usd", "spot_savings_usd", "reserved_savings_usd",
    "sharing_savings_usd", "preemption_lost_gpu_hours", "preemption_waste_usd", "net_spot_savings_usd",
    "idle_gpu_hours", "idle_waste_usd", "recommendations",
)
TOTAL = "__total__"
TOP_IDLE_NODES = 5


def _half_gpu_profile(gpu_type: str) -> tuple[str, float] | None:
    """The largest MIG profile of at most half a GPU, for "could share" estimates."""
    spec = CATALOG.get(gpu_type)
    if not spec or not spec.mig_profiles:
        return None
    fits = [p for p in spec.mig_profiles if p.share <= 0.5]
    best = max(fits, key=lambda p: p.share)
    return best.name, float(best.share)


def roi_report(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per team plus ``__total__``; columns :data:`ROI_COLUMNS`.

    ``recommendations`` is a list of ``{kind, target, detail, impact_usd}``, largest
    impact first; idle-node ones are on the total row.
    """
    if rows.empty:
        rows = pd.DataFrame({c: pd.Series([], dtype=float) for c in ("gpu_hours", "cost_usd", "on_demand_usd", "lost_gpu_hours", "lost_cost_usd", "gpu_count", "gpu_share", "hours", "price_per_gpu_hour", "fleet_gpu_hours")} | {c: pd.Series([], dtype=object) for c in ("team", "kind", "capacity_type", "outcome", "node", "gpu_type", "sharing", "project")})
    kind = rows["kind"].astype(str).to_numpy()
    alloc = rows[kind != "idle"]
    idle = rows[kind == "idle"]
    cap = alloc["capacity_type"].astype(str).to_numpy()
    cost = alloc["cost_usd"].to_numpy(dtype=float)
    od = alloc["on_demand_usd"].to_numpy(dtype=float)
    saved = np.nan_to_num(od - cost)
    share = alloc["gpu_share"].to_numpy(dtype=float)
    whole_gpu_cost = alloc["gpu_count"].to_numpy(dtype=float) * alloc["hours"].to_numpy(dtype=float) * alloc["price_per_gpu_hour"].to_numpy(dtype=float)
    preempted = (alloc["outcome"].astype(str).to_numpy() == "preempted") if "outcome" in alloc else np.zeros(len(alloc), bool)
    lost_h = np.where(preempted, alloc["lost_gpu_hours"].to_numpy(dtype=float), 0.0) if "lost_gpu_hours" in alloc else np.zeros(len(alloc))
    lost_usd = np.where(preempted, alloc["lost_cost_usd"].to_numpy(dtype=float), 0.0) if "lost_cost_usd" in alloc else np.zeros(len(alloc))
    metrics = pd.DataFrame(
        {
            "team": alloc["team"].astype(str).to_numpy(),
            "gpu_hours": alloc["gpu_hours"].to_numpy(dtype=float),
            "cost_usd": cost,
            "on_demand_equivalent_usd": od,
            "spot_savings_usd": np.where(cap == "spot", saved, 0.0),
            "reserved_savings_usd": np.where(cap == "reserved", saved, 0.0),
            "sharing_savings_usd": np.where(share < 1.0, whole_gpu_cost - cost, 0.0),
            "preemption_lost_gpu_hours": lost_h,
            "preemption_waste_usd": lost_usd,
            "_spot_waste": np.where(cap == "spot", lost_usd, 0.0),
        }
    )
    by_team = metrics.groupby("team", sort=True).sum(min_count=0)
    by_team["net_spot_savings_usd"] = by_team["spot_savings_usd"] - by_team["_spot_waste"]
    by_team["idle_gpu_hours"] = 0.0
    by_team["idle_waste_usd"] = 0.0
    total = by_team.sum(numeric_only=True)
    total["idle_gpu_hours"] = float(idle["gpu_hours"].sum()) if len(idle) else 0.0
    total["idle_waste_usd"] = float(idle["cost_usd"].sum()) if len(idle) else 0.0
    table = pd.concat([by_team, total.to_frame(TOTAL).T]).drop(columns="_spot_waste")
    table.index.name = "team"
    table = table.reset_index()

    recs: dict[str, list[dict[str, Any]]] = {t: [] for t in table["team"]}
    for _, r in by_team.iterrows():
        team = r.name
        waste = float(r["_spot_waste"])
        if waste > 0:
            if r["spot_savings_usd"] <= waste:
                recs[team].append(_rec("preemption", team, f"spot preemptions lost {r['preemption_lost_gpu_hours']:.1f} GPU-hours after the last checkpoint, ${waste:,.2f}, more than the ${r['spot_savings_usd']:,.2f} spot saved: run on on-demand or checkpoint more often", waste - r["spot_savings_usd"]))
            else:
                recs[team].append(_rec("checkpointing", team, f"spot preemptions lost {r['preemption_lost_gpu_hours']:.1f} GPU-hours after the last checkpoint (${waste:,.2f}): checkpoint more often", waste))
    recs[TOTAL].extend(_idle_recommendations(idle))
    for team, items in _sharing_candidates(alloc).items():
        recs.setdefault(team, []).extend(items)
    table["recommendations"] = [sorted(recs.get(t, []), key=lambda x: -x["impact_usd"]) for t in table["team"]]
    for c in ROI_COLUMNS[1:-1]:
        table[c] = table[c].astype(float)
    return table[list(ROI_COLUMNS)]


def _rec(kind: str, target: str, detail: str, impact: float) -> dict[str, Any]:
    return {"kind": kind, "target": target, "detail": detail, "impact_usd": round(float(impact), 2)}


def _idle_recommendations(idle: pd.DataFrame) -> list[dict[str, Any]]:
    if idle.empty:
        return []
    by_node = idle.groupby(idle["node"].astype(str)).agg(
        idle_h=("gpu_hours", "sum"), fleet_h=("fleet_gpu_hours", "sum"), cost=("cost_usd", "sum"),
        gpu_type=("gpu_type", "first"), capacity=("capacity_type", "first"), count=("gpu_count", "first"),
    )
    by_node = by_node[by_node["cost"] > 0.005].sort_values("cost", ascending=False).head(TOP_IDLE_NODES)
    out = []
    for node, r in by_node.iterrows():
        pct = r["idle_h"] / r["fleet_h"] * 100 if r["fleet_h"] else 0.0
        out.append(_rec("idle-node", str(node), f"{node} ({int(r['count'])}× {r['gpu_type']} {r['capacity']}) idle {r['idle_h']:.1f} of {r['fleet_h']:.1f} GPU-hours ({pct:.0f}%): consolidate its work or shrink the pool", r["cost"]))
    return out


def _sharing_candidates(alloc: pd.DataFrame) -> dict[str, list[dict[str, Any]]]:
    """Single whole-GPU jobs on MIG-capable GPUs: the cost of the half-GPU slice they would fit if their memory allows."""
    if alloc.empty:
        return {}
    single = alloc[(alloc["gpu_count"].to_numpy(dtype=float) == 1) & (alloc["sharing"].astype(str).to_numpy() == "none")]
    out: dict[str, list[dict[str, Any]]] = {}
    if single.empty:
        return out
    g = single.groupby([single["team"].astype(str), single["project"].astype(str), single["gpu_type"].astype(str)]).agg(cost=("cost_usd", "sum"), hours=("gpu_hours", "sum"))
    for (team, project, gpu_type), r in g.iterrows():
        prof = _half_gpu_profile(gpu_type)
        if not prof or r["cost"] <= 0:
            continue
        name, frac = prof
        saving = r["cost"] * (1 - frac)
        out.setdefault(team, []).append(_rec("share", f"{team}/{project}", f"{r['hours']:.1f} single-GPU {gpu_type} hours (${r['cost']:,.2f}) ran on whole GPUs; on {name} MIG slices ({frac:.3g} GPU) they would cost ${r['cost'] * frac:,.2f} if their memory fits", saving))
    return out
