"""ROI from measurements only: every figure is a sum over priced usage rows.

Design: docs/concepts/cost-sources.md#roi-from-measurements-only
"""

from __future__ import annotations

from functools import lru_cache
from collections.abc import Iterator
from typing import Any

import numpy as np
import pandas as pd

from gpu_ops.domain.compute.catalog import CATALOG

ROI_COLUMNS = (
    "team", "gpu_hours", "cost_usd", "on_demand_equivalent_usd", "spot_savings_usd", "reserved_savings_usd",
    "sharing_savings_usd", "preemption_lost_gpu_hours", "preemption_waste_usd", "net_spot_savings_usd",
    "idle_gpu_hours", "idle_waste_usd", "recommendations",
)
TOTAL = "__total__"
TOP_IDLE_NODES = 5


@lru_cache(maxsize=256)
def _half_gpu_profile(gpu_type: str) -> tuple[str, float] | None:
    """The largest MIG profile of at most half a GPU, for "could share" estimates."""
    spec = CATALOG.get(gpu_type)
    if not spec or not spec.mig_profiles:
        return None
    fits = [p for p in spec.mig_profiles if p.share <= 0.5]
    best = max(fits, key=lambda p: p.share)
    return best.name, float(best.share)


def roi_report(rows: pd.DataFrame, prices: Any = None) -> pd.DataFrame:
    """One row per team plus ``__total__``; columns :data:`ROI_COLUMNS`.

    ``recommendations`` is a list of ``{kind, target, detail, impact_usd}`` (measured ones
    add ``evidence``), largest impact first; idle-node ones are on the total row. ``prices``
    (a PriceMatrix) lets a right-size recommendation name a cheaper GPU type.
    """
    if rows.empty:
        rows = pd.DataFrame({c: pd.Series([], dtype=float) for c in ("gpu_hours", "cost_usd", "on_demand_usd", "lost_gpu_hours", "lost_cost_usd", "gpu_count", "gpu_share", "hours", "price_per_gpu_hour", "fleet_gpu_hours")} | {c: pd.Series([], dtype=object) for c in ("team", "kind", "capacity_type", "outcome", "node", "gpu_type", "sharing", "project")})
    allocated = ~_equals(rows["kind"], "idle")
    alloc = _rows_where(rows, allocated)
    idle = rows[~allocated]
    by_team = _team_sums(alloc)
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
    measured = alloc["metered_gpu_hours"].to_numpy(dtype=float) > 0 if "metered_gpu_hours" in alloc else np.zeros(len(alloc), bool)
    # Workloads with DCGM measurements get measured recommendations, not the memory guess.
    for team, items in _sharing_candidates(alloc, ~measured).items():
        recs.setdefault(team, []).extend(items)
    for team, items in efficiency_recommendations(alloc, prices).items():
        recs.setdefault(team, []).extend(items)
    table["recommendations"] = [sorted(recs.get(t, []), key=lambda x: -x["impact_usd"]) for t in table["team"]]
    for c in ROI_COLUMNS[1:-1]:
        table[c] = table[c].astype(float)
    return table[list(ROI_COLUMNS)]


# What the report sums per team, in its column order.
_TEAM_SUMS = (
    "gpu_hours", "cost_usd", "on_demand_equivalent_usd", "spot_savings_usd", "reserved_savings_usd", "sharing_savings_usd",
    "preemption_lost_gpu_hours", "preemption_waste_usd", "_spot_waste",
)


def _team_figures(alloc: pd.DataFrame) -> Iterator[np.ndarray]:
    """Each row's figures of :data:`_TEAM_SUMS`, one array at a time."""
    spot, reserved = _equals(alloc["capacity_type"], "spot"), _equals(alloc["capacity_type"], "reserved")
    cost = alloc["cost_usd"].to_numpy(dtype=float)
    od = alloc["on_demand_usd"].to_numpy(dtype=float)
    share = alloc["gpu_share"].to_numpy(dtype=float)
    preempted = _equals(alloc["outcome"], "preempted") if "outcome" in alloc else np.zeros(len(alloc), bool)
    lost_usd = np.where(preempted, alloc["lost_cost_usd"].to_numpy(dtype=float), 0.0) if "lost_cost_usd" in alloc else np.zeros(len(alloc))
    yield alloc["gpu_hours"].to_numpy(dtype=float)
    yield cost
    yield od
    saved = np.nan_to_num(od - cost)
    yield np.where(spot, saved, 0.0)
    yield np.where(reserved, saved, 0.0)
    del saved
    whole_gpu_cost = alloc["gpu_count"].to_numpy(dtype=float) * alloc["hours"].to_numpy(dtype=float) * alloc["price_per_gpu_hour"].to_numpy(dtype=float)
    yield np.where(share < 1.0, whole_gpu_cost - cost, 0.0)
    del whole_gpu_cost
    yield np.where(preempted, alloc["lost_gpu_hours"].to_numpy(dtype=float), 0.0) if "lost_gpu_hours" in alloc else np.zeros(len(alloc))
    yield lost_usd
    yield np.where(spot, lost_usd, 0.0)


def _team_sums(alloc: pd.DataFrame) -> pd.DataFrame:
    """:data:`_TEAM_SUMS` per team (sorted; rows without a team left out, missing figures
    counted as 0, as a groupby sum gives), each figure computed, summed and let go in
    turn: a frame of all nine for a day's million pieces held ~80 MiB more at once."""
    codes, teams = _sorted_codes(alloc["team"])
    keep = codes >= 0
    every = bool(keep.all())
    codes = codes if every else codes[keep]
    sums = {}
    for name, values in zip(_TEAM_SUMS, _team_figures(alloc)):
        values = values if every else values[keep]
        sums[name] = np.bincount(codes, weights=np.where(np.isnan(values), 0.0, values), minlength=len(teams))
    return pd.DataFrame(sums, index=pd.Index(teams, name="team"))


def _rows_where(rows: pd.DataFrame, keep: np.ndarray) -> pd.DataFrame:
    """``rows[keep]``, as a view of the leading rows when those are the ones kept (the
    stored day has its idle rows after the pieces, or none): not a copy of a day's
    million pieces (~130 MiB of the columns the report reads)."""
    n = int(keep.sum())
    return rows.iloc[:n] if keep[:n].all() else rows[keep]


def _text_categories(s: pd.Series) -> np.ndarray | None:
    """The category names of a categorical of text (as ``str``), else None."""
    if isinstance(s.dtype, pd.CategoricalDtype) and pd.api.types.is_string_dtype(s.cat.categories.dtype):
        return np.asarray(s.cat.categories.astype(str), dtype=object)
    return None


def _equals(s: pd.Series, value: str) -> np.ndarray:
    """``_text(s) == value`` without a string object per row: a categorical of text by its
    codes, a text column by pandas' own comparison (a missing value matches nothing)."""
    names = _text_categories(s)
    if names is None and isinstance(s.dtype, pd.StringDtype):
        return (s == value).to_numpy(dtype=bool, na_value=False)
    if names is None:
        return _text(s) == value
    return np.isin(s.cat.codes.to_numpy(), np.flatnonzero(names == value))  # code -1 (missing) matches nothing


def _sorted_codes(s: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """``pd.factorize(_text(s), sort=True)``: each row's index among the sorted distinct
    values present (-1: missing); a categorical of text by its codes."""
    names = _text_categories(s)
    if names is None:
        codes, values = pd.factorize(_text(s), sort=True)
        return codes, np.asarray(values, dtype=object)
    codes = s.cat.codes.to_numpy()
    present = np.flatnonzero(np.bincount(codes[codes >= 0], minlength=len(names)))
    order = present[np.argsort(names[present], kind="stable")]
    lookup = np.full(len(names) + 1, -1, np.int64)  # the last slot: code -1
    lookup[order] = np.arange(len(order))
    return lookup[codes], names[order]


def _text(s: pd.Series) -> np.ndarray:
    """``s.astype(str).to_numpy()``; for a categorical of text, its few category names
    shared by the rows (the conversion would make a string object per row: a day's
    million pieces, ~60 MiB a column)."""
    if isinstance(s.dtype, pd.CategoricalDtype) and pd.api.types.is_string_dtype(s.cat.categories.dtype):
        names = np.append(np.asarray(s.cat.categories.astype(str), dtype=object), np.nan)  # code -1 (missing): NaN, as astype gives
        return names[s.cat.codes.to_numpy()]
    return s.astype(str).to_numpy()


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


def _sharing_candidates(alloc: pd.DataFrame, candidates: np.ndarray) -> dict[str, list[dict[str, Any]]]:
    """Single whole-GPU jobs on MIG-capable GPUs among the ``candidates`` rows of ``alloc``:
    the cost of the half-GPU slice they would fit if their memory allows."""
    if alloc.empty:
        return {}
    whole = candidates & (alloc["gpu_count"].to_numpy(dtype=float) == 1) & _equals(alloc["sharing"], "none")
    single = alloc[["team", "project", "gpu_type", "cost_usd", "gpu_hours"]][whole]  # only the columns grouped and summed
    out: dict[str, list[dict[str, Any]]] = {}
    if single.empty:
        return out
    g = single.groupby([single["team"].astype(str), single["project"].astype(str), single["gpu_type"].astype(str)], observed=True).agg(cost=("cost_usd", "sum"), hours=("gpu_hours", "sum"))
    for (team, project, gpu_type), cost, hours in zip(g.index, g["cost"].to_numpy(), g["hours"].to_numpy()):
        prof = _half_gpu_profile(gpu_type)
        if not prof or cost <= 0:
            continue
        name, frac = prof
        out.setdefault(team, []).append(_rec("share", f"{team}/{project}", f"{hours:.1f} single-GPU {gpu_type} hours (${cost:,.2f}) ran on whole GPUs; on {name} MIG slices ({frac:.3g} GPU) they would cost ${cost * frac:,.2f} if their memory fits", cost * (1 - frac)))
    return out


# --------------------------------------------------------------------------- from DCGM measurements

# A workload fits a smaller slot when its peak memory plus this headroom fits and its
# activity (95th percentile of its pieces' peak step) fits the slot's compute.
MEMORY_HEADROOM = 1.10
IDLE_ACTIVITY = 0.05  # "near-zero": the busiest step of the piece under 5 %
IDLE_MIN_HOURS = 1.0  # ... for at least this many measured hours
MAX_TIMESLICE_REPLICAS = 4


def _evidence(g: pd.DataFrame) -> dict[str, Any]:
    """Percentiles over the workload's measured pieces: mean activity (efficiency), busiest
    step (activity_peak) and peak memory."""
    eff, peak, mem = (g[c].to_numpy(dtype=float) for c in ("efficiency", "activity_peak", "memory_peak_mib"))
    pct = lambda v, q: round(float(np.nanpercentile(v, q)), 4) if np.isfinite(v).any() else None  # noqa: E731
    return {
        "pieces": len(g), "measured_gpu_hours": round(float(g["metered_gpu_hours"].sum()), 4),
        "efficiency": round(float(g["active_gpu_hours"].sum() / g["metered_gpu_hours"].sum()), 4),
        "activity_p50": pct(eff, 50), "activity_p95": pct(eff, 95), "activity_peak_p95": pct(peak, 95),
        "memory_peak_mib_p50": pct(mem, 50), "memory_peak_mib_p95": pct(mem, 95), "memory_peak_mib_max": pct(mem, 100),
    }


def _evidence_text(e: dict[str, Any]) -> str:
    return (
        f"{e['pieces']} piece(s), {e['measured_gpu_hours']:.2f} measured GPU-hours: activity p50 {e['activity_p50']:.0%} / p95 {e['activity_p95']:.0%}, "
        f"busiest step p95 {e['activity_peak_p95']:.0%}; peak memory p95 {e['memory_peak_mib_p95']:,.0f} MiB, max {e['memory_peak_mib_max']:,.0f} MiB"
    )


def _smallest_mig(gpu_type: str, mem_mib: float, activity: float) -> tuple[str, float] | None:
    spec = CATALOG.get(gpu_type)
    if not spec or not spec.mig_profiles:
        return None
    fits = []
    for p in spec.mig_profiles:
        mem_gb = float(p.name.split(".")[1].rstrip("gb"))
        if mem_mib * MEMORY_HEADROOM <= mem_gb * 1024 and activity <= p.compute_slices / 7 and p.share < 1:
            fits.append((float(p.share), p.name))
    return (min(fits)[1], min(fits)[0]) if fits else None


def _cheaper_gpu(gpu_type: str, capacity: str, mem_mib: float, prices: Any) -> tuple[str, float] | None:
    """The cheapest priced GPU type with enough memory (same capacity type), if cheaper."""
    if prices is None:
        return None
    here = prices.price(gpu_type, capacity)
    best = None
    for name in prices.gpu_types:
        spec = CATALOG.get(name)
        p = prices.price(name, capacity)
        if spec and name != gpu_type and np.isfinite(p) and p < here and mem_mib * MEMORY_HEADROOM <= spec.memory_gib * 1024:
            best = min(best or (name, p), (name, p), key=lambda x: x[1])
    return best


def efficiency_recommendations(alloc: pd.DataFrame, prices: Any = None) -> dict[str, list[dict[str, Any]]]:
    """Recommendations from measured activity and memory (rows with ``metered_gpu_hours``):

    - ``right-size``: single whole-GPU workloads (team/project/gpu type) whose peak memory
      and activity fit a MIG slice (the smallest that fits) or, failing that, a cheaper GPU type;
    - ``time-slice``: whole-GPU workloads that fit no slice but whose busiest steps leave
      room for R replicas on one GPU (R ≤ 4, memory permitting);
    - ``idle-allocation``: pods allocated for hours with near-zero activity.
    Each carries its dollar impact and the evidence (percentiles over the period).
    """
    if alloc.empty or "metered_gpu_hours" not in alloc:
        return {}
    m = alloc[alloc["metered_gpu_hours"].to_numpy(dtype=float) > 0]
    out: dict[str, list[dict[str, Any]]] = {}
    if m.empty:
        return out
    measured_cost = m["cost_usd"].to_numpy(dtype=float) * m["metered_gpu_hours"].to_numpy(dtype=float) / m["gpu_hours"].to_numpy(dtype=float)
    m = m.assign(_measured_cost=measured_cost)
    whole = m[(m["gpu_count"].to_numpy(dtype=float) == 1) & _equals(m["sharing"], "none")]
    keys = [whole["team"].astype(str), whole["project"].astype(str), whole["gpu_type"].astype(str), whole["capacity_type"].astype(str)]
    for (team, project, gpu_type, capacity), g in whole.groupby(keys, sort=True):
        rec = _workload_recommendation(f"{team}/{project}", gpu_type, capacity, g, prices)
        if rec is not None:
            out.setdefault(team, []).append(rec)
    for team, rec in _idle_allocations(m):
        out.setdefault(team, []).append(rec)
    return out


def _workload_recommendation(target: str, gpu_type: str, capacity: str, g: pd.DataFrame, prices: Any) -> dict[str, Any] | None:
    """One whole-GPU workload's measured recommendation: a MIG slice that fits, else a
    cheaper GPU type, else time-slicing; None when nothing fits or it cost nothing."""
    e = _evidence(g)
    cost = float(g["_measured_cost"].sum())
    mem, act = e["memory_peak_mib_max"], e["activity_peak_p95"]
    if mem is None or act is None or cost <= 0:
        return None
    mig = _smallest_mig(gpu_type, mem, act)
    if mig:
        name, share = mig
        return _rec("right-size", target, f"{gpu_type} jobs fit a {name} MIG slice ({share:.3g} GPU): {_evidence_text(e)}; ${cost:,.2f} measured would cost ${cost * share:,.2f}", cost * (1 - share)) | {"evidence": e}
    cheaper = _cheaper_gpu(gpu_type, capacity, mem, prices) if e["activity_p95"] is not None and e["activity_p95"] < 0.5 else None
    if cheaper:
        name, price = cheaper
        new = float(g["metered_gpu_hours"].sum()) * price
        return _rec("right-size", target, f"{gpu_type} jobs fit a {name} ({CATALOG[name].memory_gib} GiB) at ${price:.2f}/GPU-hour: {_evidence_text(e)}", cost - new) | {"evidence": e}
    totals = g["memory_total_mib"].to_numpy(dtype=float)
    total = float(np.nanmax(totals)) if np.isfinite(totals).any() else np.nan
    by_memory = int(total // (mem * MEMORY_HEADROOM)) if np.isfinite(total) and mem > 0 else 1
    replicas = min(MAX_TIMESLICE_REPLICAS, int(1 // max(act, 1e-3)), by_memory)
    if replicas < 2:
        return None
    return _rec("time-slice", target, f"{gpu_type} jobs could share a GPU {replicas} ways (time-slicing): {_evidence_text(e)}", cost * (1 - 1 / replicas)) | {"evidence": e}


def _idle_allocations(m: pd.DataFrame) -> list[tuple[str, dict[str, Any]]]:
    """(team, recommendation) for each measured pod that held its GPUs for hours with near-zero activity."""
    keys = [m["team"].astype(str).rename("team"), m["namespace"].astype(str).rename("ns"), m["pod"].astype(str).rename("pod")]
    per = pd.DataFrame({
        "wall": m["metered_gpu_hours"].to_numpy(dtype=float) / (m["gpu_count"].to_numpy(dtype=float) * m["gpu_share"].to_numpy(dtype=float)),
        "peak": m["activity_peak"].to_numpy(dtype=float),
    }, index=m.index).groupby(keys, sort=True).agg(wall=("wall", "sum"), peak=("peak", "max"))
    # Only the pods that qualify are looked at one by one (a day has a million pods).
    idle = per[(per["wall"] >= IDLE_MIN_HOURS) & (per["peak"] < IDLE_ACTIVITY)]
    out = []
    for (team, ns, pod), wall in zip(idle.index, idle["wall"].to_numpy()):
        g = m[(keys[0] == team).to_numpy() & (keys[1] == ns).to_numpy() & (keys[2] == pod).to_numpy()]
        e = _evidence(g)
        out.append((team, _rec("idle-allocation", f"{ns}/{pod}", f"{ns}/{pod} held its GPU(s) {wall:.1f} h with near-zero activity: {_evidence_text(e)}; release it or scale it to zero", float(g["_measured_cost"].sum())) | {"evidence": e}))
    return out
