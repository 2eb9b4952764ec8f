"""The two calls training and cost make into observability, at one call site each:

- :func:`attempt_settled`, when a training attempt's ledger row is built, just before it
  is written (``gpu_ops.training.asset._record``): its MLflow run (whose experiment id
  the row takes) and its span;
- :func:`partition_materialized`, after the attribution of a cost partition is computed
  (``gpu_ops.cost.assets``, ``gpu_cost_attribution``): its span.

Both return at once, importing nothing, when no OTLP endpoint and no MLflow run is set
up, and never raise: observability must not fail a run.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Mapping
from typing import Any

from gpu_ops.observability import mlflow_runs, tracing


def _history(store: Any, row: Any) -> Any:
    """The run's earlier attempts (this asset), from the ledger: one run's rows."""
    from gpu_ops.training import ledger

    earlier = ledger.read(store, run_id=row.run_id, asset_key=row.asset_key)
    return earlier[earlier["attempt"] < row.attempt] if not earlier.empty else earlier


def _recovery_s(earlier: Any, row: Any) -> float | None:
    """Seconds since the previous attempt ended, when that one was preempted."""
    prev = earlier[earlier["attempt"] == row.attempt - 1] if not earlier.empty else earlier
    if prev.empty or prev["outcome"].iloc[-1] != "preempted":
        return None
    return max(0.0, (row.start - prev["end"].iloc[-1].to_pydatetime()).total_seconds())


class _Pricer:
    """Per-GPU-hour prices of the deployment's GPU_OPS_CONFIG (what the cost flow prices with)."""

    def __init__(self) -> None:
        from gpu_ops.config import load_config

        self.config = load_config()
        self.prices = self.config.prices

    def cost(self, gpu_type: str, capacity_type: str, gpu_hours: float) -> float | None:
        if not gpu_hours:
            return 0.0
        price = self.prices.gpus.get(gpu_type, {}).get(capacity_type)  # type: ignore[call-overload]
        return None if price is None else float(gpu_hours) * float(price)


def _so_far(earlier: Any, row: Any, pricer: _Pricer, cost: float | None) -> dict[str, float]:
    gpu_hours = float(row.gpu_hours)
    total = cost
    for r in earlier.itertuples(index=False):
        hours = float(r.gpu_count) * float(r.gpu_share) * (r.end - r.start).total_seconds() / 3600.0
        gpu_hours += hours
        c = pricer.cost(str(r.gpu_type), str(r.capacity_type), hours)
        total = None if total is None or c is None else total + c
    out = {"gpu_hours": gpu_hours, "attempts": float(len(earlier) + 1),
           "preemptions": float((earlier["outcome"] == "preempted").sum() if not earlier.empty else 0) + (row.outcome == "preempted")}
    return {**out, "cost_usd": total} if total is not None else out


def attempt_settled(row: Any, *, store: Any, log: Any = None) -> Any:
    """The ledger row ``row`` (a :class:`~gpu_ops.training.ledger.LedgerRow`), with the
    MLflow run's experiment id as its ``experiment_id`` when an MLflow run applies (the
    asset's own label is kept on the MLflow run as a tag); logs the attempt to that run
    and sends its span."""
    trace, mlflow = tracing.enabled(), mlflow_runs.wanted()
    if not (trace or mlflow):
        return row
    try:
        pricer = _Pricer()
        earlier = _history(store, row)
        cost = pricer.cost(row.gpu_type, row.capacity_type, float(row.gpu_hours))
        if mlflow:
            with mlflow_runs.bounded():
                ref = mlflow_runs.resolve(row.run_id, row.asset_key)
                if ref is not None:
                    labelled = row.experiment_id
                    row = dataclasses.replace(row, experiment_id=str(ref.experiment_id))
                    mlflow_runs.log_attempt(ref, row, cost_usd=cost, so_far=_so_far(earlier, row, pricer, cost), labelled_experiment=labelled)
        if trace:
            tracing.attempt_span(row, provider=pricer.config.compute.backend, cost_usd=cost, currency=pricer.prices.currency, recovery_s=_recovery_s(earlier, row))
    except Exception as exc:  # noqa: BLE001 - never fail or lose the attempt for observability
        if log is not None:
            log.warning(f"attempt {row.attempt}: no MLflow/trace record: {type(exc).__name__}: {exc}")
    return row


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
