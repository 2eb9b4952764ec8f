"""ROI from measurements only: every figure is a sum over priced usage rows.

Design: docs/concepts/cost-sources.md#roi-from-measurements-only
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import numpy as np
import pandas as pd

from gpu_ops.domain.compute.catalog import CATALOG
from gpu_ops.domain.cost.columns import roi_input_columns

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
    (a PriceMatrix) lets a right-size recommendation name a cheaper GPU type. The rows
    (categorical, pandas or plain text alike) are read by DuckDB where they lie:
    :func:`roi_report_sql`.
    """
    import duckdb

    if not len(rows.columns):
        rows = pd.DataFrame({"kind": pd.Series([], dtype=object)})
    con = duckdb.connect()
    try:
        con.register("roi_rows", rows)
        return roi_report_sql(con, "SELECT * FROM roi_rows", prices)
    finally:
        con.close()


def roi_report_sql(con: Any, rows: str, prices: Any = None) -> pd.DataFrame:
    """:func:`roi_report` of the usage rows that the SQL ``rows`` selects on the DuckDB
    connection ``con`` (a day's stored Parquet file where it lies, or a registered frame):
    the sums per team, per idle node and per sharing candidate are taken by DuckDB; only
    rows with a DCGM measurement come to pandas, for :func:`efficiency_recommendations`.
    A column the rows lack counts as missing in every row."""
    present = {r[0] for r in con.execute(f"DESCRIBE {rows}").fetchall()}
    cols = ", ".join(f"{c}" if c in present else f"NULL AS {c}" for c in _READ)
    con.execute(f"CREATE OR REPLACE TEMP VIEW roi_alloc AS SELECT {cols} FROM ({rows}) WHERE kind IS DISTINCT FROM 'idle'")
    # The idle rows (one per fleet node and day) are kept: the totals and the node recommendations read them without scanning the day again.
    con.execute(f"CREATE OR REPLACE TEMP TABLE roi_idle AS SELECT {cols} FROM ({rows}) WHERE kind = 'idle'")
    by_team = con.execute(_TEAM_SUMS_SQL).df().set_index("team").astype(float)
    by_team["net_spot_savings_usd"] = by_team["spot_savings_usd"] - by_team["_spot_waste"]
    by_team["idle_gpu_hours"] = 0.0
    by_team["idle_waste_usd"] = 0.0
    total = by_team.sum(numeric_only=True)
    total["idle_gpu_hours"], total["idle_waste_usd"] = (float(v) for v in con.execute(f"SELECT coalesce(sum({_n('gpu_hours')}), 0), coalesce(sum({_n('cost_usd')}), 0) FROM roi_idle").fetchall()[0])
    table = pd.concat([by_team, total.to_frame(TOTAL).T]).drop(columns="_spot_waste")
    table.index.name = "team"
    table = table.reset_index()

    recs: dict[str, list[dict[str, Any]]] = {t: [] for t in table["team"]}
    for team, r in by_team.iterrows():
        recs[str(team)].extend(_preemption_recommendations(str(team), r))
    recs[TOTAL].extend(_idle_recommendations(con))
    for team, items in _sharing_candidates(con).items():
        recs.setdefault(team, []).extend(items)
    # Workloads with DCGM measurements get measured recommendations, not the memory guess.
    measured = con.execute(f"SELECT * FROM roi_alloc WHERE {_MEASURED}").df() if "metered_gpu_hours" in present else pd.DataFrame()
    for team, items in efficiency_recommendations(measured, prices).items():
        recs.setdefault(team, []).extend(items)
    table["recommendations"] = [sorted(recs.get(t, []), key=lambda x: -x["impact_usd"]) for t in table["team"]]
    for c in ROI_COLUMNS[1:-1]:
        table[c] = table[c].astype(float)
    return table[list(ROI_COLUMNS)]


# The columns the report reads (those a frame or file lacks are read as missing).
_READ = roi_input_columns(measured=True)


def _n(expr: str) -> str:
    """``expr`` as a figure to sum: a missing or NaN value counts as 0."""
    return f"coalesce(CASE WHEN isnan(CAST({expr} AS DOUBLE)) THEN 0 ELSE CAST({expr} AS DOUBLE) END, 0)"


def _is(column: str, value: str) -> str:
    """``column`` holds the text ``value`` (a missing value matches nothing)."""
    return f"coalesce(CAST({column} AS VARCHAR) = '{value}', false)"


_MEASURED = f"{_n('metered_gpu_hours')} > 0"
_LOST_USD = f"CASE WHEN {_is('outcome', 'preempted')} THEN {_n('lost_cost_usd')} ELSE 0 END"
# What the report sums per team, in its column order (rows without a team left out).
_TEAM_SUMS_SQL = f"""
SELECT CAST(team AS VARCHAR) AS team,
    sum({_n('gpu_hours')}) AS gpu_hours,
    sum({_n('cost_usd')}) AS cost_usd,
    sum({_n('on_demand_usd')}) AS on_demand_equivalent_usd,
    sum(CASE WHEN {_is('capacity_type', 'spot')} THEN {_n('on_demand_usd - cost_usd')} ELSE 0 END) AS spot_savings_usd,
    sum(CASE WHEN {_is('capacity_type', 'reserved')} THEN {_n('on_demand_usd - cost_usd')} ELSE 0 END) AS reserved_savings_usd,
    sum(CASE WHEN gpu_share < 1 THEN {_n('gpu_count * hours * price_per_gpu_hour - cost_usd')} ELSE 0 END) AS sharing_savings_usd,
    sum(CASE WHEN {_is('outcome', 'preempted')} THEN {_n('lost_gpu_hours')} ELSE 0 END) AS preemption_lost_gpu_hours,
    sum({_LOST_USD}) AS preemption_waste_usd,
    sum(CASE WHEN {_is('capacity_type', 'spot')} THEN {_LOST_USD} ELSE 0 END) AS _spot_waste
FROM roi_alloc WHERE team IS NOT NULL GROUP BY 1 ORDER BY 1
"""


def _preemption_recommendations(team: str, r: pd.Series) -> list[dict[str, Any]]:
    """Checkpoint more often, or leave spot, when preemptions lost work: by the team's spot waste."""
    waste = float(r["_spot_waste"])
    if waste <= 0:
        return []
    if r["spot_savings_usd"] <= waste:
        return [_rec("preemption", team, f"spot preemptions lost {r['preemption_lost_gpu_hours']:.1f} GPU-hours after the last checkpoint, ${waste:,.2f}, more than the ${r['spot_savings_usd']:,.2f} spot saved: run on on-demand or checkpoint more often", waste - r["spot_savings_usd"])]
    return [_rec("checkpointing", team, f"spot preemptions lost {r['preemption_lost_gpu_hours']:.1f} GPU-hours after the last checkpoint (${waste:,.2f}): checkpoint more often", waste)]


def _equals(s: pd.Series, value: str) -> np.ndarray:
    """``s == value`` as booleans, for text of any dtype (a missing value matches nothing)."""
    return np.asarray(s.astype(object) == value, dtype=bool)


def _rec(kind: str, target: str, detail: str, impact: float) -> dict[str, Any]:
    return {"kind": kind, "target": target, "detail": detail, "impact_usd": round(float(impact), 2)}


def _idle_recommendations(con: Any) -> list[dict[str, Any]]:
    """The idle nodes that cost most (at most :data:`TOP_IDLE_NODES`, over half a cent each)."""
    by_node = con.execute(f"""
        SELECT CAST(node AS VARCHAR) AS node, sum({_n('gpu_hours')}) AS idle_h, sum({_n('fleet_gpu_hours')}) AS fleet_h, sum({_n('cost_usd')}) AS cost,
            min(CAST(gpu_type AS VARCHAR)) AS gpu_type, min(CAST(capacity_type AS VARCHAR)) AS capacity, min(gpu_count) AS count
        FROM roi_idle GROUP BY 1 HAVING sum({_n('cost_usd')}) > 0.005 ORDER BY cost DESC, node LIMIT {TOP_IDLE_NODES}
    """).fetchall()
    out = []
    for node, idle_h, fleet_h, cost, gpu_type, capacity, count in by_node:
        pct = idle_h / fleet_h * 100 if fleet_h else 0.0
        out.append(_rec("idle-node", str(node), f"{node} ({int(count)}× {gpu_type} {capacity}) idle {idle_h:.1f} of {fleet_h:.1f} GPU-hours ({pct:.0f}%): consolidate its work or shrink the pool", cost))
    return out


def _sharing_candidates(con: Any) -> dict[str, list[dict[str, Any]]]:
    """Single whole-GPU jobs on MIG-capable GPUs, among the rows without a DCGM measurement:
    the cost of the half-GPU slice they would fit if their memory allows."""
    groups = con.execute(f"""
        SELECT CAST(team AS VARCHAR), CAST(project AS VARCHAR), CAST(gpu_type AS VARCHAR), sum({_n('cost_usd')}), sum({_n('gpu_hours')})
        FROM roi_alloc WHERE NOT ({_MEASURED}) AND gpu_count = 1 AND {_is('sharing', 'none')}
        GROUP BY 1, 2, 3 ORDER BY 1, 2, 3
    """).fetchall()
    out: dict[str, list[dict[str, Any]]] = {}
    for team, project, gpu_type, cost, hours in groups:
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
