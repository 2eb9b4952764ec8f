"""The calls training and cost make into observability, at one call site each:

- :func:`attempt_records`, when a training attempt settles
  (:func:`gpu_ops.flows.training.settle.settle_attempt`): its span and its MLflow record as
  telemetry outbox rows, built without a network call and written in the transaction that
  writes its bill; :mod:`gpu_ops.flows.observability.sender` sends them afterwards;
- :func:`partition_materialized`, after the attribution of a cost partition is computed
  (``gpu_ops.dagster.cost.assets``, ``gpu_cost_attribution``): its span.

Both return at once, importing nothing, when no OTLP endpoint and no MLflow run is set
up, and never raise: observability must not fail a run.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpu_ops.domain.formatting import redact_urls
from gpu_ops.flows.observability import mlflow_runs, tracing
from gpu_ops.storage.outbox import Record


def wanted() -> bool:
    """Would a settled attempt have telemetry to queue? Cheap: imports nothing."""
    return tracing.enabled() or mlflow_runs.wanted()


@dataclass(frozen=True)
class Pricing:
    """Per-GPU-hour prices and the compute backend of a deployment's config (what the cost
    flow prices with), injected by whoever settles."""

    provider: str
    currency: str
    gpus: Mapping[str, Mapping[str, float]]

    @classmethod
    def of(cls, config: Any) -> "Pricing":
        return cls(config.compute.backend, config.prices.currency, {g: dict(p) for g, p in config.prices.gpus.items()})

    def cost(self, gpu_type: str, capacity_type: str, gpu_hours: float) -> float | None:
        if not gpu_hours:
            return 0.0
        price = self.gpus.get(gpu_type, {}).get(capacity_type)
        return None if price is None else float(gpu_hours) * float(price)


NO_PRICES = Pricing("", "USD", {})


def _recovery_s(earlier: Any, row: Any) -> float | None:
    """Seconds since the previous attempt ended, when that one was preempted."""
    prev = earlier[earlier["attempt"] == row.attempt - 1] if not earlier.empty else earlier
    if prev.empty or prev["outcome"].iloc[-1] != "preempted":
        return None
    return max(0.0, (row.start - prev["end"].iloc[-1].to_pydatetime()).total_seconds())


def _so_far(earlier: Any, row: Any, pricing: Pricing, cost: float | None) -> dict[str, float]:
    gpu_hours = float(row.gpu_hours)
    total = cost
    for r in earlier.itertuples(index=False):
        hours = float(r.gpu_count) * float(r.gpu_share) * (r.end - r.start).total_seconds() / 3600.0
        gpu_hours += hours
        c = pricing.cost(str(r.gpu_type), str(r.capacity_type), hours)
        total = None if total is None or c is None else total + c
    out = {"gpu_hours": gpu_hours, "attempts": float(len(earlier) + 1),
           "preemptions": float((earlier["outcome"] == "preempted").sum() if not earlier.empty else 0) + (row.outcome == "preempted")}
    return {**out, "cost_usd": total} if total is not None else out


def attempt_records(row: Any, *, ledger: Any, pricing: Pricing | None = None) -> tuple[Any, list[Record]]:
    """The ledger row ``row`` (a :class:`~gpu_ops.storage.ledger.LedgerRow`) of a settling
    attempt and its telemetry outbox records: its MLflow record (when an MLflow run
    applies; the row takes the run's experiment id when that is known without asking) and
    its span. ``ledger``: the run's rows of this asset so far (earlier attempts count in
    the totals and the recovery time)."""
    trace, mlflow = tracing.enabled(), mlflow_runs.wanted()
    if not (trace or mlflow):
        return row, []
    pricing = pricing or NO_PRICES
    earlier = ledger[ledger["attempt"] < row.attempt] if not ledger.empty else ledger
    cost = pricing.cost(row.gpu_type, row.capacity_type, float(row.gpu_hours))
    records = []
    target = mlflow_runs.target(row.run_id, row.asset_key) if mlflow else None
    if target is not None:
        labelled = row.experiment_id
        if target.get("experiment_id"):
            row = dataclasses.replace(row, experiment_id=str(target["experiment_id"]))
        figures = mlflow_runs.record(row, cost_usd=cost, so_far=_so_far(earlier, row, pricing, cost), labelled_experiment=labelled)
        records.append(Record("mlflow", row.run_id, row.asset_key, row.attempt, {**target, **figures}))
    if trace:
        span = tracing.attempt_payload(row, provider=pricing.provider, cost_usd=cost, currency=pricing.currency, recovery_s=_recovery_s(earlier, row))
        records.append(Record("span", row.run_id, row.asset_key, row.attempt, span))
    return row, records


def partition_materialized(context: Any, asset: str, figures: Mapping[str, Any]) -> None:
    """A span for the cost asset ``asset`` materializing the partitions of a Dagster
    ``context``, from the run's start to now; ``figures``: cost, GPU-hours, ..."""
    if not tracing.enabled():
        return
    try:
        now = dt.datetime.now(dt.timezone.utc)
        record = context.instance.get_run_record_by_id(context.run.run_id)
        started = dt.datetime.fromtimestamp(record.start_time, dt.timezone.utc) if record is not None and record.start_time else now
        if not tracing.partition_span(asset, list(context.partition_keys), started, now, figures, run_id=context.run.run_id):
            context.log.warning(f"no trace span for {asset}: not sent within {tracing.PARTITION_DEADLINE_S:g} s (see the gpu_ops.tracing log)")
    except Exception as exc:  # noqa: BLE001
        context.log.warning(f"no trace span for {asset}: {type(exc).__name__}: {redact_urls(str(exc))}")
