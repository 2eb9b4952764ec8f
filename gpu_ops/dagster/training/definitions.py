"""Dagster objects of the training flow, merged into `gpu_ops.definitions:defs`.

``train_demo_model``: the demo training asset (a small deterministic torch model on
synthetic data; see :mod:`gpu_ops.flows.training.demo`). Its size, checkpoint interval and
retry backoff come from the ``training`` section of the configuration, so tests and
the UI end-to-end test can shrink it. torch is imported inside the worker only.

``training_executor``: Dagster's multiprocess executor, starting step processes with
``forkserver`` from a server that has already imported Dagster and the plugin's step-time
modules (never torch: that is the worker's, and the standby worker's, import). A retried
step whose process died (SIGKILL, OOM killer) then starts in a fork, in tens of
milliseconds, instead of a new interpreter importing Dagster, the code location, pandas and
SQLAlchemy (seconds on a loaded machine). The reference code location
(``gpu_ops.definitions``) makes it the default executor of its jobs.

``gpu_orphaned_attempts_sensor``: every 30 s, settles training attempts whose owner (the
step process) died without a next attempt to find them (a run worker SIGKILLed and not
retried, a cancelled run): their workers stopped, their time billed, their leases
released (:func:`gpu_ops.flows.training.settle.settle_orphans`).
"""

from __future__ import annotations

import multiprocessing.forkserver
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import dagster as dg

from gpu_ops.domain.compute.request import Attribution, GpuRequest
from gpu_ops.domain.config import GpuOpsConfig, TrainingConfig, load_config
from gpu_ops.dagster.io_manager import ROW_LEVEL_READER
from gpu_ops.dagster.training.asset import gpu_asset, gpu_run_tags
from gpu_ops.flows.training.demo import train_demo
from gpu_ops.domain.training.policy import PreemptionPolicy

DEMO_REQUEST = GpuRequest(
    gpu_type="t4",
    gpus=1,
    cpus=2,
    memory="4Gi",
    capacity="spot-then-on-demand",
    labels=Attribution(team="ml-platform", project="gpu-ops-demo", experiment_id="demo-mlp"),
)


def demo_asset(training: TrainingConfig) -> dg.AssetsDefinition:
    return gpu_asset(
        train_demo,
        name="train_demo_model",
        request=DEMO_REQUEST,
        policy=PreemptionPolicy(
            checkpoint_interval=training.demo_checkpoint_interval_s,
            backoff_s=training.retry_backoff_s,
            backoff_max_s=max(60.0, training.retry_backoff_s),
        ),
        params={"steps": training.demo_steps},
        settings_resource_key="gpu_ops",
        warm_imports=("torch",),  # a retry's standby worker has torch (and CUDA) ready
        group_name="training",
        description=(
            "Demo training run: a small deterministic MLP on synthetic data, checkpointed every "
            f"{training.demo_checkpoint_interval_s:g} s; survives preemption (SIGTERM/SIGKILL of the worker) by "
            "resuming from its newest valid checkpoint with identical final weights."
        ),
    )


# What a training step process imports before its attempt starts: imported once by the
# forkserver, inherited by every step process forked from it. No torch (the code location
# and the step process never import it; workers do).
STEP_PRELOAD = (
    "dagster",
    # What Dagster itself imports lazily in every step process to open the instance (its
    # run, event-log and schedule storages, SQLite's or PostgreSQL's, and their migrations):
    # hundreds of modules. Names of Dagster 1.13's own modules; the forkserver skips a name
    # that does not import (a later Dagster that moved it, dagster-postgres not installed).
    "dagster._core.instance.factory",
    "dagster._core.storage.runs.sqlite",
    "dagster._core.storage.event_log.sqlite",
    "dagster._core.storage.schedules.sqlite",
    "dagster._core.storage.local_compute_log_manager",
    "dagster._core.secrets.env_file",
    "dagster_postgres",
    "fsspec",  # checkpoints (gpu_ops.flows.training.checkpoint)
    "gpu_ops.dagster.training.asset",
    "gpu_ops.flows.training.settle",
    "gpu_ops.flows.training.recorder",
    "gpu_ops.storage.ledger",
    "gpu_ops.storage.tables",
    "gpu_ops.dagster.compute.resource",
    "gpu_ops.dagster.compute.admission",
    "gpu_ops.flows.compute.local",
    "gpu_ops.flows.compute.standby",
)


def _stop_forkserver() -> None:
    server = multiprocessing.forkserver._forkserver  # the stdlib keeps one per process and has no public stop
    server._stop()  # type: ignore[attr-defined]  # CPython 3.8+ (a no-op when none runs); absent from typeshed


class _ForkserverOfTheRun(dg.Executor):
    """The multiprocess executor, its forkserver stopped when the run's execution ends. A
    run worker runs one run and exits, taking its forkserver with it; a process that
    executes several runs (``execute_job`` in a script, a notebook, a test) would otherwise
    keep a forkserver with the first run's environment, forking every later run's steps
    from it. Each run starts its own (with its environment) at its first step."""

    def __init__(self, inner: dg.Executor):
        self.inner = inner

    @property
    def retries(self) -> Any:
        return self.inner.retries

    @property
    def step_dependency_config(self) -> Any:
        return self.inner.step_dependency_config

    def execute(self, plan_context: Any, execution_plan: Any) -> Iterator[Any]:
        _stop_forkserver()  # one left by a run this process executed with another executor
        try:
            yield from self.inner.execute(plan_context, execution_plan)
        finally:
            _stop_forkserver()


# Steps that read a row-level table whole run one at a time (gpu_cost_attribution and
# gpu_roi_report each group a day's pieces in DuckDB: side by side, two such peaks in one run).
ROW_LEVEL_READERS_AT_ONCE = [{"key": ROW_LEVEL_READER, "limit": 1}]


def _with_forkserver(config: Mapping[str, Any], preload: Sequence[str]) -> dict[str, Any]:
    """The run's executor config, its multiprocess mode with ``forkserver`` unless the run
    names a start method, and :data:`ROW_LEVEL_READERS_AT_ONCE` unless it names its own
    tag concurrency limits (``in_process`` stays as it is)."""
    config = dict(config)
    if "multiprocess" in config:
        multiprocess = dict(config["multiprocess"] or {})
        if not multiprocess.get("start_method"):
            multiprocess["start_method"] = {"forkserver": {"preload_modules": list(preload)}}
        if multiprocess.get("tag_concurrency_limits") is None:
            multiprocess["tag_concurrency_limits"] = list(ROW_LEVEL_READERS_AT_ONCE)
        config["multiprocess"] = multiprocess
    return config


def training_executor(preload: Sequence[str] = ()) -> dg.ExecutorDefinition:
    """Dagster's default executor (``multiprocess``, or ``in_process`` when the run's config
    says so; the same run config) whose multiprocess mode starts step processes with
    ``forkserver`` unless the run's config names another start method, preloading
    :data:`STEP_PRELOAD` and ``preload`` (modules of the code location's own that a step
    imports; they must import without error)."""
    modules = [*STEP_PRELOAD, *(m for m in preload if m not in STEP_PRELOAD)]
    default = dg.multi_or_in_process_executor

    @dg.executor(name=default.name, config_schema=default.config_schema.as_field(), requirements=dg.multiple_process_executor_requirements())
    def multi_or_in_process_forkserver(init_context: dg.InitExecutorContext) -> Any:
        """Dagster's default executor; in multiprocess mode, step processes fork from a
        forkserver that has Dagster and the training step's modules imported
        (``start_method: {spawn: {}}`` in the run's config: a new interpreter per step)."""
        config = _with_forkserver(init_context.executor_config, modules)
        executor = default.executor_creation_fn(init_context._replace(executor_config=config))  # type: ignore[misc]
        return _ForkserverOfTheRun(executor) if "forkserver" in config.get("multiprocess", {}).get("start_method", {}) else executor

    return multi_or_in_process_forkserver


ATTEMPT_SENSOR = "gpu_orphaned_attempts_sensor"


def build_attempt_sensor(config: GpuOpsConfig) -> dg.SensorDefinition:
    stale_s = config.compute.admission.lease_ttl_s
    source = str(config.source_path) if config.source_path else None

    @dg.sensor(
        name=ATTEMPT_SENSOR, minimum_interval_seconds=30, default_status=dg.DefaultSensorStatus.RUNNING,
        description=(
            "Settles training attempts whose step process died with no attempt after it: workers stopped, time billed, GPU leases released; "
            "sends the spans and MLflow records their owners could not."
        ),
    )
    def gpu_orphaned_attempts_sensor(context: dg.SensorEvaluationContext) -> dg.SkipReason:
        from gpu_ops.flows.observability.hooks import Pricing
        from gpu_ops.flows.observability.sender import drain
        from gpu_ops.storage.tables import TableStore
        from gpu_ops.flows.training.settle import settle_orphans

        current = load_config(source)
        store = TableStore.from_config(current)
        settled = settle_orphans(store, found_by="the orphaned-attempts sensor", stale_s=stale_s, pricing=Pricing.of(current))
        for s in settled:
            context.log.warning(s.message)
        sent = drain(store, deadline_s=current.training.telemetry_deadline_s)  # telemetry the owners could not send
        if sent.failed:
            context.log.warning(sent.describe())
        return dg.SkipReason(f"{len(settled)} orphaned attempt(s) settled" + (f"; {sent.describe()}" if sent.tried else ""))

    return gpu_orphaned_attempts_sensor


def build_defs(config: GpuOpsConfig) -> dg.Definitions:
    # Launched as this job, the run carries the GPU tags the production run queue limits.
    job = dg.define_asset_job("train_demo_model_job", selection=["train_demo_model"], tags=gpu_run_tags(DEMO_REQUEST))
    return dg.Definitions(assets=[demo_asset(config.training)], jobs=[job], sensors=[build_attempt_sensor(config)])
