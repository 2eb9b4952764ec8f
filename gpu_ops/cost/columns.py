"""Which columns of the stored tables each cost step reads. Plain constants, no pandas:
the asset definitions name them when the code location loads."""

from __future__ import annotations

from collections.abc import Sequence

# The grain budgets scope on (plus the labels some budget's scope names).
DAILY_KEYS = ("team", "project", "namespace", "cost_center")
# gpu_usage columns the daily table (gpu_cost_daily) is built from.
DAILY_INPUT_COLUMNS = ("day", "kind", *DAILY_KEYS, "labels", "gpu_hours", "cost_usd", "on_demand_usd")
# gpu_usage columns the ROI report reads.
ROI_INPUT_COLUMNS = (
    "kind", "team", "project", "node", "gpu_type", "gpu_count", "gpu_share", "sharing", "capacity_type", "hours", "gpu_hours",
    "price_per_gpu_hour", "cost_usd", "on_demand_usd", "outcome", "lost_gpu_hours", "lost_cost_usd", "fleet_gpu_hours",
)


def attribution_input_columns(group_by: Sequence[str]) -> list[str]:
    """gpu_usage columns the attribution step reads: its grouping keys, the fleet figures
    of the conservation check, and what the daily table is built from."""
    keys = [k for k in group_by if not k.startswith("label:")]
    return list(dict.fromkeys([*DAILY_INPUT_COLUMNS, *keys, "node", "fleet_gpu_hours", "fleet_cost_usd"]))
