"""What each column of gpu_ops's tables means: one home for the descriptions the Dagster UI
shows in every table's column schema (``dagster/column_schema``) and in the typed tables
of the materialization metadata. A column means the same in every table it appears in.
Pure constants: no Dagster, no pandas."""

from __future__ import annotations

COLUMN_DESCRIPTIONS: dict[str, str] = {
    # time and grain
    "day": "UTC day the row belongs to (intervals that cross midnight are split)",
    "start": "UTC start of the interval as the source recorded it",
    "end": "UTC end of the interval as recorded; empty while it was still running",
    "interval_start": "UTC start of the part of the interval inside this day",
    "interval_end": "UTC end of the part of the interval inside this day (open intervals clipped at the as-of time)",
    "kind": "usage rows: allocated (a workload's GPUs), idle (fleet GPUs nobody used) or none (a computed day without usage); recommendations: what to do (right-size, time-slice, idle-allocation, ...)",
    "as_of": "UTC time the figures were computed for (the end of the day, or now for today)",
    # attribution keys
    "namespace": "Kubernetes namespace of the pod",
    "pod": "pod (or training attempt) that held the GPUs",
    "node": "node the GPUs were on (joins the node inventory for idle cost)",
    "team": "team the cost is attributed to (__idle__: fleet cost nobody used; __total__: all teams)",
    "project": "project the cost is attributed to",
    "cost_center": "cost center the cost is attributed to",
    "experiment_id": "experiment the usage belongs to",
    "labels": "labels of the usage as a JSON object",
    "label_keys": "names of the labels some budget scopes on (JSON list)",
    # hardware
    "gpu_type": "GPU model by the catalog's canonical name (h100, a100-80gb, l40s, ...)",
    "gpu_count": "GPUs (or MIG slices, or time-slice replicas) held",
    "capacity_type": "spot, on-demand or reserved",
    "sharing": "none, mig, mps or timeslice",
    "gpu_share": "share of a physical GPU each unit is (1 whole, 1/7 an A100 1g.10gb slice, 1/R of R replicas)",
    "region": "cloud region (its price multiplier applies)",
    "instance_type": "cloud instance type of the node",
    # quantities and money
    "hours": "wall-clock hours of the interval inside this day",
    "gpu_hours": "physical GPU-hours: gpu_count x gpu_share x hours",
    "price_per_gpu_hour": "price paid per physical GPU-hour (price table x region multiplier)",
    "on_demand_price_per_gpu_hour": "on-demand price per GPU-hour of the same GPU (empty when the table has none)",
    "cost_usd": "cost in USD: GPU-hours x price per GPU-hour",
    "on_demand_usd": "what the same GPU-hours would have cost on demand, USD",
    "on_demand_equivalent_usd": "what the same GPU-hours would have cost on demand, USD (empty when a GPU type has no on-demand price)",
    "savings_usd": "on-demand equivalent minus cost, USD: what spot and reserved capacity saved",
    "idle_cost_usd": "fleet cost of GPUs nobody used, USD (the __idle__ row, or this group's share with usage.idle: share)",
    "fleet_gpu_hours": "GPU-hours of the node inventory's fleet that day",
    "fleet_cost_usd": "cost of the node inventory's fleet that day, USD",
    "intervals": "usage intervals summed into the row",
    # ledger (training attempts)
    "run_id": "Dagster run of the training attempt",
    "asset_key": "training asset of the attempt",
    "attempt": "attempt number within the run (1 = first)",
    "outcome": "how the attempt ended: completed, preempted, oom, infrastructure, user_error or interrupted",
    "last_checkpoint_at": "UTC time of the attempt's last checkpoint",
    "lost_seconds": "seconds of work after the last checkpoint that the attempt lost (0 when completed)",
    "lost_gpu_hours": "GPU-hours of work lost after the last checkpoint (preemption waste)",
    "lost_cost_usd": "cost of the lost GPU-hours, USD",
    "declared_gpu_type": "GPU type the asset asked for",
    "declared_gpu_count": "GPU count the asset asked for",
    "hardware_source": "where gpu_type/gpu_count come from: worker (what it saw), declared (killed before it reported) or none",
    # provenance and quarantine
    "source": "usage source: ledger, file, kubernetes or billing",
    "location": "file (or table) the row was read from",
    "row": "1-based row number in that file",
    "field": "column that made the row unusable",
    "reason": "why the row could not be priced",
    "record": "the rejected row as read (JSON)",
    # DCGM utilisation
    "active_gpu_hours": "GPU-hours the GPUs were measured busy (DCGM activity x metered GPU-hours)",
    "metered_gpu_hours": "allocated GPU-hours that had DCGM metrics",
    "efficiency": "active / metered GPU-hours (empty without metrics, never 0)",
    "unused_cost_usd": "cost of the metered GPU-hours that were not busy, USD",
    "activity_peak": "highest DCGM activity seen (0 to 1)",
    "memory_peak_mib": "highest GPU memory used, MiB",
    "memory_total_mib": "GPU memory of the device, MiB",
    # budgets
    "budget": "budget name (the budgets section)",
    "period": "monthly, weekly or daily",
    "period_start": "first day of the budget period",
    "period_end": "last day of the budget period (inclusive)",
    "amount_usd": "the budget's amount for the period, USD",
    "spend_usd": "spend in the period so far, USD (days without gpu_cost_daily left out, see days_missing)",
    "percent_used": "spend as a percentage of the amount",
    "forecast_usd": "spend at the period's end at the run-rate so far, USD (empty until forecast_min_history of data)",
    "status": "ok, warning (a warning/critical threshold crossed) or exceeded (spend reached the amount)",
    "thresholds_crossed": "thresholds crossed (basis-amount keys such as actual-80pct)",
    "severity": "highest severity of the thresholds crossed: none, info, warning or critical (critical once spend reaches the amount)",
    "scope": "budgets: what the budget covers (JSON: team, project, namespace, cost_center, labels); quotas: team or pool",
    "days_missing": "days of the period so far without gpu_cost_daily: their spend is unknown, not zero",
    # ROI
    "spot_savings_usd": "on-demand minus spot price for the spot GPU-hours used, USD",
    "reserved_savings_usd": "on-demand minus reserved price for the reserved GPU-hours used, USD",
    "sharing_savings_usd": "cost of the (1 - gpu_share) of GPUs not paid for thanks to MIG or time-slicing, USD",
    "preemption_lost_gpu_hours": "GPU-hours lost to preemptions after the last checkpoint",
    "preemption_waste_usd": "cost of the GPU-hours lost to preemptions, USD",
    "net_spot_savings_usd": "spot savings minus preemption waste, USD",
    "idle_gpu_hours": "fleet GPU-hours nobody used",
    "idle_waste_usd": "cost of the idle fleet GPU-hours, USD",
    "recommendations": "measured recommendations with their dollar impact",
    "impact_usd": "what following the recommendation would have saved that day, USD",
    "detail": "the recommendation, in words",
    "target": "what the recommendation is about (team, node or workload)",
    "evidence": "the measurements behind the recommendation",
    # GPU leases (gpu_leases) and quotas
    "pools": "NodePools the lease counts against",
    "gpus": "GPUs held by the lease",
    "holder": "process holding the lease",
    "since": "UTC time the lease was taken (database clock)",
    "last_heartbeat": "UTC time the holder last renewed the lease (database clock)",
    "expires": "UTC time the lease lapses unless renewed (database clock)",
    "expires_in_s": "seconds until the lease lapses (negative: expired, not yet reclaimed)",
    "state": "live, or expired (reclaimed by the next admission)",
    "name": "team or NodePool the quota is for",
    "held": "GPUs held against the quota now",
    "quota": "GPUs the quota allows at once",
    # estimate against actual (gpu_estimate_accuracy)
    "completed_at": "UTC end of the run's last attempt",
    "attempts": "attempts the run took (retries after preemptions included)",
    "estimate_basis": "what the launch estimate came from: history (the asset's successful runs), declared (expected_duration) or none",
    "estimate_usd": "cost the run was expected to have at launch (median duration, the first capacity's price)",
    "estimate_p90_usd": "p90 of the expected cost at launch (the dearest capacity leg)",
    "actual_usd": "what the run's attempts cost, priced as the training asset's cost_usd",
    "error_usd": "actual_usd minus estimate_usd",
    "abs_error_usd": "absolute error of the estimate in USD",
    "abs_pct_error": "absolute error of the estimate as a share of the actual cost",
    "within_p90": "whether the actual cost stayed at or under the p90 estimate",
    # spend anomalies (gpu_spend_anomalies)
    "dimension": "what is scored: team, project or asset (a training asset)",
    "key": "the team, project or asset key scored",
    "baseline_usd": "the usual spend of the day: median of the same weekday's days in the window, or of all its days",
    "band_usd": "spend per unit of score: 1.4826 x MAD (floored), widened while too few same-weekday days",
    "basis": "the baseline's days: weekday, all days (the first weeks, a wider band) or none (too little history)",
    "points": "days the baseline was taken from",
    "score": "(spend_usd - baseline_usd) / band_usd: a robust z-score, positive for a spike",
    "anomalous": "score at alerts.anomalies.check_score or more and spend min_excess_usd or more over the baseline",
}


def describe(column: str) -> str:
    """The column's description; ``label_<name>`` columns (grouping by a label) included.
    An unknown column gets an empty description (a test keeps the tables' columns known)."""
    if column in COLUMN_DESCRIPTIONS:
        return COLUMN_DESCRIPTIONS[column]
    if column.startswith("label_"):
        return f"value of the label {column[len('label_'):]!r} (usage.group_by: label:{column[len('label_'):]})"
    return ""
