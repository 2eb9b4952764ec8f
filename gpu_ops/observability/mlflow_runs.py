"""A training attempt's GPU-hours, cost, preemptions and hardware on its MLflow run.

Which run (nothing happens, and nothing is imported, when none applies):

1. the active MLflow run of the process that records the attempt (the Dagster step:
   ``with mlflow.start_run(): dg.materialize(...)``, or a training function run
   in-process), when ``mlflow`` is already imported;
2. ``MLFLOW_RUN_ID`` (MLflow's own variable, with ``MLFLOW_TRACKING_URI``);
3. with ``GPU_OPS_MLFLOW_TRACKING_URI`` set, one run per Dagster run and training asset,
   found again by its tags ``dagster.run_id`` and ``dagster.asset_key`` on the next
   attempt, in the experiment ``MLFLOW_EXPERIMENT_NAME`` (default ``gpu_ops/<asset>``).

The run's experiment id becomes the ledger row's ``experiment_id`` (an experiment id the
asset's labels name is kept on the MLflow run as the tag ``gpu_ops.label.experiment_id``), so ``gpu-ops cost attribution --by experiment_id`` answers what an
experiment cost. Metrics are logged with the attempt as the step: per attempt
(``gpu_ops.attempt.*``) and for the run so far (``gpu_ops.gpu_hours``,
``gpu_ops.cost_usd``, ``gpu_ops.preemptions``, ``gpu_ops.attempts``); the hardware is in
tags (``gpu_ops.gpu_type`` ...), which, unlike params, may change between attempts.

The client's HTTP calls are bounded (``MLFLOW_HTTP_REQUEST_TIMEOUT`` 10 s and 2 retries
unless set): a tracking server that is down costs a logged warning, never the attempt.
``mlflow`` (or ``mlflow-skinny``) is the optional extra ``gpu_ops[mlflow]``.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

URI_VAR = "GPU_OPS_MLFLOW_TRACKING_URI"
BOUNDS = {"MLFLOW_HTTP_REQUEST_TIMEOUT": "10", "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2"}


@dataclass(frozen=True)
class RunRef:
    client: Any
    run_id: str
    experiment_id: str


def wanted() -> bool:
    """Could an MLflow run apply? Cheap: imports nothing."""
    if os.environ.get("MLFLOW_RUN_ID") or os.environ.get(URI_VAR):
        return True
    mlflow = sys.modules.get("mlflow")
    return mlflow is not None and getattr(mlflow, "active_run", lambda: None)() is not None


@contextlib.contextmanager
def bounded() -> Iterator[None]:
    """MLflow's HTTP timeout and retries bounded for the calls inside (unless the user set them)."""
    added = {k: v for k, v in BOUNDS.items() if k not in os.environ}
    os.environ.update(added)
    try:
        yield
    finally:
        for k in added:
            os.environ.pop(k, None)


def resolve(run_id: str, asset_key: str) -> RunRef | None:
    """The MLflow run an attempt of Dagster run ``run_id`` and ``asset_key`` belongs to."""
    if not wanted():
        return None
    import mlflow
    from mlflow.tracking import MlflowClient

    active = mlflow.active_run()
    if active is not None:
        return RunRef(MlflowClient(), active.info.run_id, active.info.experiment_id)
    explicit = os.environ.get("MLFLOW_RUN_ID")
    if explicit:
        client = MlflowClient()
        return RunRef(client, explicit, client.get_run(explicit).info.experiment_id)
    client = MlflowClient(tracking_uri=os.environ[URI_VAR])
    name = os.environ.get("MLFLOW_EXPERIMENT_NAME") or f"gpu_ops/{asset_key}"
    experiment = client.get_experiment_by_name(name)
    experiment_id = experiment.experiment_id if experiment is not None else client.create_experiment(name)
    tags = {"dagster.run_id": run_id, "dagster.asset_key": asset_key}
    query = " and ".join(f"tags.`{k}` = '{v}'" for k, v in tags.items())
    found = client.search_runs([experiment_id], filter_string=query, max_results=1)
    if found:
        return RunRef(client, found[0].info.run_id, experiment_id)
    run = client.create_run(experiment_id, tags=tags, run_name=f"{asset_key} {run_id[:8]}")
    return RunRef(client, run.info.run_id, experiment_id)


def log_attempt(ref: RunRef, row: Any, *, cost_usd: float | None, so_far: Mapping[str, float], labelled_experiment: str = "") -> None:
    """Log the attempt ``row`` (a ledger row) and the run's totals ``so_far`` to ``ref``."""
    from mlflow.entities import Metric, RunTag

    at = int(row.end.timestamp() * 1000)
    step = int(row.attempt)
    metrics = {
        "gpu_ops.attempt.gpu_hours": float(row.gpu_hours),
        "gpu_ops.attempt.seconds": float(row.duration_s),
        "gpu_ops.attempt.lost_seconds": float(row.lost_seconds),
        "gpu_ops.attempt.preempted": 1.0 if row.outcome == "preempted" else 0.0,
        **({"gpu_ops.attempt.cost_usd": float(cost_usd)} if cost_usd is not None else {}),
        **{f"gpu_ops.{k}": float(v) for k, v in so_far.items()},
    }
    tags = {
        "gpu_ops.gpu_type": row.gpu_type, "gpu_ops.gpu_count": str(row.gpu_count), "gpu_ops.capacity_type": row.capacity_type,
        "gpu_ops.sharing": row.sharing, "gpu_ops.hardware_source": row.hardware_source,
        "gpu_ops.declared_gpu": f"{row.declared_gpu_count}x {row.declared_gpu_type}",
        "gpu_ops.team": row.team, "gpu_ops.project": row.project, "gpu_ops.last_outcome": row.outcome,
        "dagster.run_id": row.run_id, "dagster.asset_key": row.asset_key, "gpu_ops.label.experiment_id": labelled_experiment,
    }
    ref.client.log_batch(
        ref.run_id,
        metrics=[Metric(k, v, at, step) for k, v in metrics.items()],
        tags=[RunTag(k, str(v)) for k, v in tags.items() if v not in (None, "")],
    )
