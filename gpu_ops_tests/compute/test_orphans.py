"""The orphan cleanup sensor against a real Dagster instance with real finished runs."""

from __future__ import annotations

import datetime as dt

import dagster as dg
from kubernetes import client

from gpu_ops.dagster.compute.definitions import ORPHAN_SENSOR, build_orphan_sensor
from gpu_ops.flows.compute.karpenter import NodePoolClient, nodepool_manifests
from gpu_ops.dagster.compute.resource import KarpenterPools
from gpu_ops.domain.compute.naming import launch_labels
from gpu_ops.flows.compute.orphans import Owned, RunState, select_orphans
from gpu_ops.domain.compute.request import Attribution, GpuRequest
from gpu_ops.domain.config import ComputeConfig
from gpu_ops_tests.fake_k8s import FakeAppsV1, FakeCustomObjects

REQUEST = GpuRequest(gpu_type="l4", capacity="spot", labels=Attribution(team="nlp"))


@dg.asset
def ok_asset() -> int:
    return 1


@dg.asset
def failing_asset() -> int:
    raise ValueError("boom")


def _deployment(name: str, run_id: str | None, namespace: str = "ml") -> client.V1Deployment:
    labels = launch_labels(run_id, ["train"], REQUEST) if run_id else {"gpu-ops.io/managed-by": "gpu-ops"}
    return client.V1Deployment(metadata=client.V1ObjectMeta(name=name, namespace=namespace, labels=labels))


def test_select_orphans_rules() -> None:
    now = dt.datetime(2026, 11, 21, 12, tzinfo=dt.timezone.utc)
    states = {
        "done-long-ago": RunState("SUCCESS", now - dt.timedelta(hours=3)),
        "failed-long-ago": RunState("FAILURE", now - dt.timedelta(hours=2)),
        "done-just-now": RunState("SUCCESS", now - dt.timedelta(minutes=5)),
        "running": RunState("STARTED", None),
    }
    objs = [Owned("NodePool", f"p-{r}", None, r) for r in [*states, "unknown"]]
    verdicts = {v.obj.run_id: v for v in select_orphans(objs, states.get, now, dt.timedelta(hours=1))}
    assert {r for r, v in verdicts.items() if v.orphan} == {"done-long-ago", "failed-long-ago"}
    assert "unknown to this Dagster instance" in verdicts["unknown"].reason
    assert verdicts["running"].reason == "run running is STARTED"
    assert verdicts["done-long-ago"].reason == "run done-long-ago ended SUCCESS 180 min ago"


def test_sensor_deletes_only_objects_of_runs_long_finished(karpenter_crds: dict) -> None:
    instance = dg.DagsterInstance.ephemeral()
    ok = dg.materialize([ok_asset], instance=instance)
    failed = dg.materialize([failing_asset], instance=instance, raise_on_error=False)
    assert ok.success and not failed.success
    live_run = "11111111-2222-3333-4444-555555555555"  # not in this instance: left alone

    apps = FakeAppsV1([
        _deployment("train-ok", ok.run_id),
        _deployment("train-failed", failed.run_id),
        _deployment("train-foreign", live_run),
        _deployment("shared-thing", None),
        _deployment("other-namespace", ok.run_id, namespace="prod"),
    ])
    custom = FakeCustomObjects(schemas=karpenter_crds)
    pools = NodePoolClient(custom)
    run_scope = KarpenterPools(pool_scope="run")
    for m in nodepool_manifests(REQUEST, run_scope, run_id=failed.run_id) + nodepool_manifests(REQUEST, KarpenterPools()):
        pools.apply(m)

    deleted: list[tuple[str, str]] = []

    def delete_service(name: str, namespace: str) -> None:
        deleted.append((name, namespace))
        apps.delete(name, namespace)

    later = dt.datetime.now(dt.timezone.utc) + dt.timedelta(hours=2)
    sensor = build_orphan_sensor(
        ComputeConfig(backend="kubetorch", namespace="ml", orphan_grace="1h"),
        clients=lambda: (apps, custom),
        delete_service=delete_service,
        now=lambda: later,
    )
    assert sensor.name == ORPHAN_SENSOR
    with dg.build_sensor_context(instance=instance) as context:
        result = sensor(context)
    assert result.skip_message == "3 orphan(s) deleted, 1 object(s) kept"
    assert sorted(deleted) == [("train-failed", "ml"), ("train-ok", "ml")]
    assert sorted(d.metadata.name for d in apps.deployments) == ["other-namespace", "shared-thing", "train-foreign"]
    assert [p["metadata"]["name"] for p in pools.list_owned()] == ["gpu-ops-nlp-l4-spot"]  # the shared pool stays

    # Within the grace period nothing goes.
    for m in nodepool_manifests(REQUEST, run_scope, run_id=ok.run_id):
        pools.apply(m)
    soon = build_orphan_sensor(ComputeConfig(backend="kubetorch", namespace="ml", orphan_grace="1h"), clients=lambda: (apps, custom), delete_service=delete_service)
    with dg.build_sensor_context(instance=instance) as context:
        assert soon(context).skip_message == "0 orphan(s) deleted, 2 object(s) kept"


def test_sensor_skips_with_the_local_backend() -> None:
    sensor = build_orphan_sensor(ComputeConfig(backend="local"))
    assert sensor.default_status == dg.DefaultSensorStatus.STOPPED
    with dg.build_sensor_context(instance=dg.DagsterInstance.ephemeral()) as context:
        assert "backend is local" in sensor(context).skip_message
