"""Dagster objects of the compute flow, merged into `gpu_ops.definitions:defs`: resource
``gpu_compute``, sensor ``gpu_orphan_cleanup_sensor``, asset ``gpu_leases`` and its schedule
(every 5 minutes). No torch or kubetorch import.
"""

from __future__ import annotations

import datetime as dt
from typing import Any, Callable

import dagster as dg

from gpu_ops.dagster.compute.resource import GpuCompute
from gpu_ops.domain.config import ComputeConfig, GpuOpsConfig, parse_duration
from gpu_ops.dagster.cost.metadata import table_metadata, table_value

ORPHAN_SENSOR = "gpu_orphan_cleanup_sensor"


def _kube_clients(kubeconfig_path: str | None = None) -> tuple[Any, Any]:
    from kubernetes import client

    from gpu_ops.flows.compute.kube import load_cluster_config

    load_cluster_config(kubeconfig_path)
    return client.AppsV1Api(), client.CustomObjectsApi()


def build_orphan_sensor(
    compute: ComputeConfig,
    *,
    clients: Callable[[], tuple[Any, Any]] | None = None,
    delete_service: Callable[[str, str], None] | None = None,
    now: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.timezone.utc),
) -> dg.SensorDefinition:
    grace = parse_duration(compute.orphan_grace)
    enabled = compute.backend == "kubetorch"

    @dg.sensor(
        name=ORPHAN_SENSOR,
        minimum_interval_seconds=300,
        default_status=dg.DefaultSensorStatus.RUNNING if enabled else dg.DefaultSensorStatus.STOPPED,
        description=f"Deletes Kubetorch services and run-scoped NodePools of runs that ended more than {compute.orphan_grace} ago.",
    )
    def gpu_orphan_cleanup_sensor(context: dg.SensorEvaluationContext) -> dg.SkipReason:
        from gpu_ops.flows.compute.orphans import OrphanReaper, dagster_run_states

        if not enabled and clients is None:
            return dg.SkipReason("compute.backend is local: nothing is created in a cluster")
        apps, custom = (clients or _kube_clients)()
        kwargs = {"delete_service": delete_service} if delete_service else {}
        reaper = OrphanReaper(apps, custom, [compute.namespace], **kwargs)
        verdicts = reaper.sweep(dagster_run_states(context.instance), now(), grace, context.log.info)
        deleted = [v for v in verdicts if v.orphan]
        for v in verdicts:
            if not v.orphan:
                context.log.debug(f"kept {v.obj.kind} {v.obj.name}: {v.reason}")
        return dg.SkipReason(f"{len(deleted)} orphan(s) deleted, {len(verdicts) - len(deleted)} object(s) kept")

    return gpu_orphan_cleanup_sensor


LEASES_ASSET = "gpu_leases"


@dg.asset(
    name=LEASES_ASSET,
    group_name="compute",
    io_manager_key="table_io_manager",
    required_resource_keys={"gpu_ops"},
    kinds={"gpu"},
    description="Who holds which GPUs under compute.quotas: one row per lease (team, pools, run, asset, GPUs, since, "
    "last heartbeat, expiry, on the database's clock), also readable as the SQL table gpu_leases.",
)
def gpu_leases(context) -> Any:  # type: ignore[no-untyped-def]  # (an annotation is a string here, which dg.asset refuses)
    import pandas as pd

    from gpu_ops.storage.quota import LEASE_COLUMNS, LeaseBook, Quotas, lease_rows, scope_usage
    from gpu_ops.storage.tables import TableStore

    config: GpuOpsConfig = context.resources.gpu_ops.load()
    quotas = Quotas(team=dict(config.compute.quotas.team), pool=dict(config.compute.quotas.pool))
    now, leases = LeaseBook(TableStore.from_config(config), config.compute.admission.lease_ttl_s).snapshot()
    df = pd.DataFrame(lease_rows(leases, now), columns=list(LEASE_COLUMNS))
    for column in ("since", "last_heartbeat", "expires"):
        df[column] = pd.to_datetime(df[column], utc=True)
    usage = pd.DataFrame(scope_usage([le for le in leases if le.expires_at >= now], quotas), columns=["scope", "name", "held", "quota"])
    live = df[df["state"] == "live"]
    context.add_output_metadata(
        {
            **table_metadata(df),
            "leases": table_value(df),
            "quota_usage": table_value(usage),
            "gpus_held": dg.MetadataValue.int(int(live["gpus"].sum())),
            "runs_holding": dg.MetadataValue.int(int(live["run_id"].nunique())),
        }
    )
    return df


def build_leases_schedule(config: ComputeConfig) -> dg.ScheduleDefinition:
    quotas = bool(config.quotas.team or config.quotas.pool)
    return dg.ScheduleDefinition(
        name="gpu_leases_schedule",
        target=dg.AssetSelection.assets(LEASES_ASSET),
        cron_schedule="*/5 * * * *",
        default_status=dg.DefaultScheduleStatus.RUNNING if quotas else dg.DefaultScheduleStatus.STOPPED,
        description="Refreshes gpu_leases (who holds which GPUs) every 5 minutes.",
    )


def build_defs(config: GpuOpsConfig) -> dg.Definitions:
    return dg.Definitions(
        assets=[gpu_leases],
        resources={"gpu_compute": GpuCompute.from_config(config.compute, str(config.source_path) if config.source_path else None)},
        sensors=[build_orphan_sensor(config.compute)],
        schedules=[build_leases_schedule(config.compute)],
    )
