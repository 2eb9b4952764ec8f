"""The two calls training and cost make into observability, one line at one call site each:

- :func:`attempt_recorded`, after a training attempt's ledger row is written
  (``gpu_ops.training.asset.run_attempt``): its span;
- :func:`partition_materialized`, after the attribution of a cost partition is computed
  (``gpu_ops.cost.assets``, ``gpu_cost_attribution``): its span.

Both return at once, importing nothing, when no OTLP endpoint is configured, and never
raise: observability must not fail a run.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

from gpu_ops.observability import tracing


def _recovery_s(store: Any, row: Any) -> float | None:
    """Seconds since the previous attempt of this run ended, when that one was preempted."""
    if row.attempt <= 1:
        return None
    from gpu_ops.training import ledger

    earlier = ledger.read(store, run_id=row.run_id, asset_key=row.asset_key)
    earlier = earlier[earlier["attempt"] == row.attempt - 1]
    if earlier.empty or earlier["outcome"].iloc[-1] != "preempted":
        return None
    return max(0.0, (row.start - earlier["end"].iloc[-1].to_pydatetime()).total_seconds())


def attempt_recorded(row: Any, *, config: Any, store: Any, log: Any = None) -> None:
    """A span for the attempt ``row`` (a :class:`~gpu_ops.training.ledger.LedgerRow`), priced with ``config.prices``."""
    if not tracing.enabled():
        return
    try:
        price = config.prices.gpus.get(row.gpu_type, {}).get(row.capacity_type)
        cost = None if price is None and row.gpu_count else float(row.gpu_hours) * float(price or 0.0)
        tracing.attempt_span(row, provider=config.compute.backend, cost_usd=cost, currency=config.prices.currency, recovery_s=_recovery_s(store, row))
    except Exception as exc:  # noqa: BLE001 - never fail the attempt for a span
        if log is not None:
            log.warning(f"no trace span for attempt {row.attempt}: {type(exc).__name__}: {exc}")


def partition_materialized(context: Any, asset: str, figures: Mapping[str, Any]) -> None:
    """A span for the cost asset ``asset`` materializing the partitions of a Dagster
    ``context``, from the run's start to now; ``figures``: cost, GPU-hours, ..."""
    if not tracing.enabled():
        return
    try:
        now = dt.datetime.now(dt.timezone.utc)
        record = context.instance.get_run_record_by_id(context.run.run_id)
        started = dt.datetime.fromtimestamp(record.start_time, dt.timezone.utc) if record is not None and record.start_time else now
        tracing.partition_span(asset, list(context.partition_keys), started, now, figures, run_id=context.run.run_id)
    except Exception as exc:  # noqa: BLE001
        context.log.warning(f"no trace span for {asset}: {type(exc).__name__}: {exc}")
