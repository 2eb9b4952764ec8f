"""Dagster objects of the cost flow, merged into `gpu_ops.definitions:defs`."""

from __future__ import annotations

import dagster as dg

from gpu_ops.domain.memory import arrow_allocates_from_the_system
from gpu_ops.domain.config import GpuOpsConfig
from gpu_ops.dagster.cost.assets import build_assets, build_collector

DAILY_JOB = "daily_gpu_cost_job"
DAILY_SCHEDULE = "daily_gpu_cost_schedule"


def build_defs(config: GpuOpsConfig) -> dg.Definitions:
    # Every process that loads the code location (the run, its forkserver and step
    # processes) has pyarrow allocate from the system: set before any step imports it.
    arrow_allocates_from_the_system()
    assets, partitions = build_assets(config)
    # One process for the day: the cost steps hand each other stored tables, need no
    # isolation from each other, and under the multiprocess executor most of the job's wall
    # time was step processes starting (docs/benchmarks/cost.md). Every asset, check and
    # its metadata shows in the UI as before; a run launched from the asset graph still
    # takes the code location's executor.
    job = dg.define_asset_job(
        DAILY_JOB,
        selection=dg.AssetSelection.assets(*assets),
        description="Yesterday's GPU usage, attribution, budget status and ROI.",
        executor_def=dg.in_process_executor,
    )
    schedule = _daily_schedule(job, partitions)
    collect_jobs, collect_schedules = build_collector(config)
    return dg.Definitions(assets=assets, jobs=[job, *collect_jobs], schedules=[schedule, *collect_schedules])


def _daily_schedule(job: dg.UnresolvedAssetJobDefinition, partitions: dg.PartitionsDefinition) -> dg.ScheduleDefinition:
    """At 00:15 UTC, a run of the partition that ended last: yesterday's partition is
    complete (as-of = midnight) and late ledger rows of runs that ended at midnight have had
    a few minutes to land. The tick's time is an input (``scheduled_execution_time``), never
    the wall clock. (Dagster's ``build_schedule_from_partitioned_job`` does the same through
    a deprecated call, which warned on every tick.)"""

    @dg.schedule(name=DAILY_SCHEDULE, job=job, cron_schedule="15 0 * * *", execution_timezone="UTC", default_status=dg.DefaultScheduleStatus.RUNNING)
    def daily_gpu_cost_schedule(context: dg.ScheduleEvaluationContext) -> dg.RunRequest | dg.SkipReason:
        with dg.partition_loading_context(effective_dt=context.scheduled_execution_time):
            key = partitions.get_last_partition_key()
        if key is None:
            return dg.SkipReason("the cost partitions have none that has ended yet")
        return dg.RunRequest(run_key=key, partition_key=key)

    return daily_gpu_cost_schedule
