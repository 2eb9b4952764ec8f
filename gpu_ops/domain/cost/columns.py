"""Which columns of the stored tables each cost step reads. Plain constants, no pandas:
the asset definitions name them when the code location loads."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

PARTITION_COLUMN = "partition_key"  # the partition of a row in every stored table
NS_PER_HOUR = 3_600 * 10**9
GROUPING_KEYS = ("team", "project", "namespace", "cost_center", "experiment_id")
# The values of a usage interval's capacity_type and sharing (DESIGN.md), for the rule
# book, the price matrix and the ledger alike.
CAPACITY_TYPES = ("spot", "on-demand", "reserved")
SHARING_MODES = ("none", "mig", "mps", "timeslice")


def group_column(key: str) -> str:
    """Grouping key -> output column: ``label:team-tier`` -> ``label_team_tier``."""
    if key.startswith("label:"):
        return "label_" + re.sub(r"[^A-Za-z0-9_]", "_", key[len("label:") :])
    return key


def check_group_by(keys: list[str]) -> list[str]:
    """Known keys whose output columns are distinct; a clear error otherwise."""
    seen: dict[str, str] = {}
    for key in keys:
        if key not in GROUPING_KEYS and not key.startswith("label:"):
            raise ValueError(f"unknown grouping key {key!r}: use one of {', '.join(GROUPING_KEYS)} or label:<name>")
        if key.startswith("label:") and not key[len("label:") :].strip():
            raise ValueError(f"grouping key {key!r} names no label: write label:<name>, e.g. label:tier")
        col = group_column(key)
        if col in seen and seen[col] != key:
            raise ValueError(f"grouping keys {seen[col]} and {key} both become the column {col!r}: group by one of them")
        seen[col] = key
    return list(dict.fromkeys(keys))


# The attribution keys a pod's labels give (the Kubernetes source), and the labels read by
# default; usage.sources[].label_keys names others.
DEFAULT_LABEL_KEYS = {
    "team": "gpu-ops.io/team",
    "project": "gpu-ops.io/project",
    "cost_center": "gpu-ops.io/cost-center",
    "experiment_id": "gpu-ops.io/experiment-id",
}

# The grain budgets scope on (plus the labels some budget's scope names).
DAILY_KEYS = ("team", "project", "namespace", "cost_center")
# gpu_cost_daily's columns and their types (dagster/column_schema names): declared on the
# asset, so the UI shows them before the first run and the IO manager hands a reader the
# empty typed table while no partition exists.
DAILY_SCHEMA = (
    ("day", "date"), ("kind", "string"), *((k, "string") for k in DAILY_KEYS), ("labels", "string"), ("label_keys", "string"),
    ("intervals", "int"), ("gpu_hours", "float"), ("cost_usd", "float"), ("on_demand_usd", "float"),
)
# What budgets read of gpu_cost_daily: per day, kind and what the table kept, the cost
# summed by the database per budget grain (gpu_ops.storage.tables.TableStore.read_grouped).
DAILY_GROUPING = "grouping"
BUDGET_READ_KEEP = ("day", "kind", "label_keys")
BUDGET_READ_SUMS = ("cost_usd",)


def grouping_name(filter_keys: Iterable[str]) -> str:
    """The name of a budget grain: its scope's filter keys (``team``, ``label:tier``), sorted; "" for unscoped."""
    return ",".join(sorted(filter_keys))


def budget_groupings(scopes: Iterable[Iterable[str]]) -> dict[str, list[str]]:
    """gpu_cost_daily columns to group by per budget grain (``scopes``: each budget's
    filter keys), the unscoped grain "" always: a label filter groups by the ``labels``
    column (the scoped labels' JSON), a key by its column."""
    out: dict[str, list[str]] = {"": []}
    for keys in scopes:
        cols = sorted({"labels" if k.startswith("label:") else k for k in keys})
        out.setdefault(grouping_name(keys), cols)
    return dict(sorted(out.items()))


# gpu_usage columns the daily table (gpu_cost_daily) is built from.
DAILY_INPUT_COLUMNS = ("day", "kind", *DAILY_KEYS, "labels", "gpu_hours", "cost_usd", "on_demand_usd")
# gpu_usage columns the ROI report reads.
ROI_INPUT_COLUMNS = (
    "kind", "team", "project", "node", "gpu_type", "gpu_count", "gpu_share", "sharing", "capacity_type", "hours", "gpu_hours",
    "price_per_gpu_hour", "cost_usd", "on_demand_usd", "outcome", "lost_gpu_hours", "lost_cost_usd", "fleet_gpu_hours",
)
# ... and, when DCGM measurements are configured (usage.utilization), what the measured
# recommendations read (gpu_ops.flows.cost.utilization): without them no row is measured, and
# a day's million distinct pods are not read for nothing.
ROI_MEASURED_COLUMNS = (
    "namespace", "pod", "metered_gpu_hours", "active_gpu_hours", "efficiency", "unused_cost_usd", "activity_peak", "memory_peak_mib", "memory_total_mib",
)


def roi_input_columns(measured: bool) -> list[str]:
    """gpu_usage columns the ROI report reads (``measured``: utilisation metrics configured)."""
    return [*ROI_INPUT_COLUMNS, *(ROI_MEASURED_COLUMNS if measured else ())]


def attribution_input_columns(group_by: Sequence[str]) -> list[str]:
    """gpu_usage columns the attribution step reads: its grouping keys, the fleet figures
    of the conservation check, and what the daily table is built from."""
    keys = [k for k in group_by if not k.startswith("label:")]
    efficiency = ("active_gpu_hours", "metered_gpu_hours", "unused_cost_usd")  # gpu_ops.flows.cost.utilization
    prices = ("price_per_gpu_hour", "on_demand_price_per_gpu_hour")  # the groups sum GPU-hours per price (gpu_ops.flows.cost.allocate.group_sums)
    return list(dict.fromkeys([*DAILY_INPUT_COLUMNS, *keys, "node", *prices, "fleet_gpu_hours", "fleet_cost_usd", *efficiency]))


def attribution_columns(group_by: Sequence[str], with_inventory: bool) -> list[str]:
    """Columns of usage rows an attribution needs after validation (what cells are keyed by)."""
    cols = [k for k in group_by if not k.startswith("label:")]
    if any(k.startswith("label:") for k in group_by):
        cols.append("labels")
    if with_inventory:
        cols.append("node")
    return cols


def parquet_columns(schema_names: Iterable[str], columns: Sequence[str] | None) -> list[str]:
    """The columns of a Parquet file that a read with ``columns`` loads (labels always)."""
    return [c for c in schema_names if columns is None or c in columns or c.startswith("label:")]
