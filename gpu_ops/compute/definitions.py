"""Dagster objects of the compute flow, merged into `gpu_ops.definitions:defs`.

- resource ``gpu_compute``: :class:`GpuCompute` configured from the ``compute`` section;
- sensor ``gpu_orphan_cleanup_sensor``: deletes Kubetorch services and run-scoped
  NodePools whose run ended more than ``compute.orphan_grace`` ago. It runs by default
  with the kubetorch backend and is stopped (and skips) with the local one.

Nothing here imports torch or kubetorch; the sensor imports the Kubernetes client when
it ticks.
"""

from __future__ import annotations

import datetime as dt
from typing import Any, Callable

import dagster as dg

from gpu_ops.compute.resource import GpuCompute
from gpu_ops.config import ComputeConfig, GpuOpsConfig, parse_duration

ORPHAN_SENSOR = "gpu_orphan_cleanup_sensor"


def _kube_clients(kubeconfig_path: str | None = None) -> tuple[Any, Any]:
    from kubernetes import client

    from gpu_ops.compute.kube import load_cluster_config

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
        from gpu_ops.compute.orphans import OrphanReaper, dagster_run_states

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


def build_defs(config: GpuOpsConfig) -> dg.Definitions:
    return dg.Definitions(
        resources={"gpu_compute": GpuCompute.from_config(config.compute, str(config.source_path) if config.source_path else None)},
        sensors=[build_orphan_sensor(config.compute)],
    )
