"""Dagster objects of the training flow, merged into `gpu_ops.definitions:defs`.

``train_demo_model``: the demo training asset (a small deterministic torch model on
synthetic data; see :mod:`gpu_ops.training.demo`). Its size, checkpoint interval and
retry backoff come from the ``training`` section of the configuration, so tests and
the UI end-to-end test can shrink it. torch is imported inside the worker only.

``gpu_orphaned_attempts_sensor``: every 30 s, settles training attempts whose owner (the
step process) died without a next attempt to find them (a run worker SIGKILLed and not
retried, a cancelled run): their workers stopped, their time billed, their leases
released (:func:`gpu_ops.training.settle.settle_orphans`).
"""

from __future__ import annotations

import dagster as dg

from gpu_ops.compute.request import Attribution, GpuRequest
from gpu_ops.config import GpuOpsConfig
from gpu_ops.training.asset import gpu_asset, gpu_run_tags
from gpu_ops.training.demo import train_demo
from gpu_ops.training.policy import PreemptionPolicy

DEMO_REQUEST = GpuRequest(
    gpu_type="t4",
    gpus=1,
    cpus=2,
    memory="4Gi",
    capacity="spot-then-on-demand",
    labels=Attribution(team="ml-platform", project="gpu-ops-demo", experiment_id="demo-mlp"),
)


def demo_asset(config: GpuOpsConfig) -> dg.AssetsDefinition:
    training = config.training
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


ATTEMPT_SENSOR = "gpu_orphaned_attempts_sensor"


def build_attempt_sensor(config: GpuOpsConfig) -> dg.SensorDefinition:
    stale_s = config.compute.admission.lease_ttl_s
    source = str(config.source_path) if config.source_path else None

    @dg.sensor(
        name=ATTEMPT_SENSOR, minimum_interval_seconds=30, default_status=dg.DefaultSensorStatus.RUNNING,
        description="Settles training attempts whose step process died with no attempt after it: workers stopped, time billed, GPU leases released.",
    )
    def gpu_orphaned_attempts_sensor(context: dg.SensorEvaluationContext) -> dg.SkipReason:
        from gpu_ops.config import load_config
        from gpu_ops.storage.tables import TableStore
        from gpu_ops.training.settle import settle_orphans

        settled = settle_orphans(TableStore.from_config(load_config(source)), found_by="the orphaned-attempts sensor", stale_s=stale_s)
        for s in settled:
            context.log.warning(s.message)
        return dg.SkipReason(f"{len(settled)} orphaned attempt(s) settled")

    return gpu_orphaned_attempts_sensor


def build_defs(config: GpuOpsConfig) -> dg.Definitions:
    # Launched as this job, the run carries the GPU tags the production run queue limits.
    job = dg.define_asset_job("train_demo_model_job", selection=["train_demo_model"], tags=gpu_run_tags(DEMO_REQUEST))
    return dg.Definitions(assets=[demo_asset(config)], jobs=[job], sensors=[build_attempt_sensor(config)])
