"""Where a training asset's cost is: the ``gpu_usage`` rows its attempts became.

The cost flow reads the usage ledger (``usage.sources: [{type: ledger}]``) and prices
each attempt that held GPUs as ``gpu_usage`` rows of the UTC days it ran, carrying the
attempt's ``run_id`` and ``asset_key``. A training asset's materialization names them:
a link to the ``gpu_usage`` asset, the partitions (days) and the row filter, or why
there are none (no attempt held a GPU, or the configuration's cost flow does not read
the ledger). pandas is only touched through the frame passed in.
"""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING, Any

import dagster as dg

from gpu_ops.domain.alerts.model import asset_ui_url
from gpu_ops.domain.config import GpuOpsConfig, LedgerSource

if TYPE_CHECKING:
    import pandas as pd

COST_ASSET = "gpu_usage"  # the cost flow's row-level table (gpu_ops.dagster.cost.assets)


def utc_days(start: dt.datetime, end: dt.datetime) -> list[dt.date]:
    """The UTC days an interval touches (the cost flow clips intervals at midnight); an
    interval ending exactly at midnight does not touch the next day."""
    first = start.astimezone(dt.timezone.utc).date()
    last = (max(end, start + dt.timedelta(microseconds=1)) - dt.timedelta(microseconds=1)).astimezone(dt.timezone.utc).date()
    return [first + dt.timedelta(days=i) for i in range((last - first).days + 1)]


def cost_rows_metadata(config: GpuOpsConfig, run_id: str, asset_key: str, rows: pd.DataFrame) -> dict[str, Any]:
    """``cost_asset`` (a link to ``gpu_usage``), ``cost_partitions``, ``cost_partition_url``
    (each partition's page in the UI, under ``alerts.dagster_url``) and ``cost_rows`` for
    this run's ledger ``rows`` of ``asset_key``."""
    md: dict[str, Any] = {"cost_asset": dg.MetadataValue.asset(dg.AssetKey(COST_ASSET))}
    if not any(isinstance(s, LedgerSource) for s in config.usage.sources):
        md["cost_rows"] = f"none in this configuration's cost flow: usage.sources has no {{type: ledger}}, so {COST_ASSET} does not price training attempts"
        return md
    on_gpus = rows[rows["gpu_count"] > 0] if not rows.empty else rows
    if on_gpus.empty:
        md["cost_rows"] = "none: no attempt held a GPU (CPU attempts are not GPU usage and are not priced by the cost flow)"
        if config.training.simulate_gpu_pricing:
            md["cost_rows"] += "; this materialization's cost_usd is simulated (training.simulate_gpu_pricing), not a cost row"
        return md
    days = sorted({d for r in on_gpus.itertuples(index=False) for d in utc_days(r.start.to_pydatetime(), r.end.to_pydatetime())})
    md["cost_partitions"] = ", ".join(d.isoformat() for d in days)
    for day in days:  # the partition's page in the UI (alerts.dagster_url is its base)
        key = "cost_partition_url" if len(days) == 1 else f"cost_partition_url/{day}"
        md[key] = dg.MetadataValue.url(asset_ui_url(config.alerts.dagster_url, COST_ASSET, day.isoformat()))
    md["cost_rows"] = (
        f"{COST_ASSET} rows with run_id = '{run_id}' and asset_key = '{asset_key}' in partition(s) {md['cost_partitions']} "
        f"({len(on_gpus)} attempt(s) on GPUs; an attempt across UTC midnight is a row per day), once {COST_ASSET} has run for those days"
    )
    usage = config.usage
    outside = [d for d in days if d < usage.partitions_start or (usage.partitions_end is not None and d > usage.partitions_end)]
    if outside:
        span = f"{usage.partitions_start} .. {usage.partitions_end or 'yesterday'}"
        md["cost_rows"] += f"; {', '.join(map(str, outside))} lie outside the cost partitions ({span}, usage.partitions_start/partitions_end) and are not priced"
    return md
