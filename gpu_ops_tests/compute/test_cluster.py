"""Against a live cluster (KUBECONFIG set, Kubetorch controller installed); skipped otherwise.

    KUBECONFIG=~/.kube/config GPU_OPS_TEST_NAMESPACE=default .venv/bin/pytest -m cluster gpu_ops_tests/compute

Deploys a tiny CPU function (no GPU, no NodePool) through Kubetorch with the
``GpuCompute`` resource inside a real Dagster run, checks the result, and checks that
cleanup removed the workload. A stale GPU lease's pods (a plain Deployment labelled as a
Kubetorch service's) are deleted with grace 0 before the lease is handed on.
"""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

import dagster as dg
import pytest

from gpu_ops.flows.compute.kubetorch_backend import SERVICE_LABEL, KubetorchBackend
from gpu_ops.domain.compute.naming import launch_labels, launch_name
from gpu_ops.storage.quota import LeaseBook, Quotas
from gpu_ops.domain.compute.request import Attribution, GpuRequest
from gpu_ops.dagster.compute.resource import KarpenterPools, KubetorchGpuCompute, KubetorchLaunch, Lifecycle
from gpu_ops.storage.tables import TableStore
from gpu_ops_tests.compute import launch_assets
from gpu_ops_tests.waiting import wait_until

pytestmark = pytest.mark.cluster


def test_deploys_a_tiny_function_and_tears_it_down() -> None:
    from kubernetes import client, config

    namespace = os.environ.get("GPU_OPS_TEST_NAMESPACE", "default")
    compute = KubetorchGpuCompute(namespace=namespace, karpenter=KarpenterPools(manage_nodepools=False), lifecycle=Lifecycle(cleanup="always"), kubetorch=KubetorchLaunch(launch_timeout_s=600, inactivity_ttl="15m"))
    result = dg.materialize([launch_assets.summed], resources={"gpu_compute": compute})
    assert result.success
    assert result.output_for_node("summed")["sum"] == 5

    apps = client.AppsV1Api(config.new_client_from_config())
    selector = f"gpu-ops.io/run-id={result.run_id}"
    deadline = time.monotonic() + 180
    while apps.list_namespaced_deployment(namespace, label_selector=selector).items:
        assert time.monotonic() < deadline, f"the workload of run {result.run_id} was not torn down"
        time.sleep(5)


def test_a_stale_leases_pods_are_deleted_with_grace_0_before_it_is_handed_on(tmp_path: Path) -> None:
    """A frozen holder's Kubetorch service as the API server sees it: a Deployment of two
    pods labelled as the backend labels its pods (a pause image, no GPU). Its lease expired;
    the next admission deletes the Deployment and the pods with grace period 0 and is
    granted once the API server lists none."""
    from kubernetes import client, config

    from gpu_ops.flows.compute.kube import api_call

    namespace = os.environ.get("GPU_OPS_TEST_NAMESPACE", "default")
    api = config.new_client_from_config()
    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    request = GpuRequest(gpu_type="t4", gpus=0, labels=Attribution(team="nlp"))
    run_id = str(uuid.uuid4())
    name, labels = launch_name(run_id, ["frozen"], 0), launch_labels(run_id, ["frozen"], request, 0)
    frozen = KubetorchBackend(request, name=name, labels=labels, target=KubetorchGpuCompute(namespace=namespace))
    pod_labels = {**labels, SERVICE_LABEL: name}
    selector = ",".join(f"{k}={v}" for k, v in frozen.selector().items())
    template = client.V1PodTemplateSpec(
        metadata=client.V1ObjectMeta(labels=pod_labels),
        spec=client.V1PodSpec(containers=[client.V1Container(name="pause", image="registry.k8s.io/pause:3.9")], termination_grace_period_seconds=60),
    )
    spec = client.V1DeploymentSpec(replicas=2, selector=client.V1LabelSelector(match_labels={SERVICE_LABEL: name}), template=template)
    apps.create_namespaced_deployment(namespace, client.V1Deployment(metadata=client.V1ObjectMeta(name=name, labels=pod_labels), spec=spec))
    try:
        assert wait_until(lambda: len(core.list_namespaced_pod(namespace, label_selector=selector).items) == 2, timeout=180)
        reclaimer = KubetorchBackend(
            request, name="reclaimer-0", labels={}, target=KubetorchGpuCompute(namespace=namespace),
            clients=lambda: (core, client.CustomObjectsApi(api)), apps=lambda: apps, reap_wait_s=60,
        )
        book = LeaseBook(TableStore(f"sqlite:///{tmp_path / 'leases.db'}"), ttl_s=1.0, reclaimer=reclaimer)
        quotas = Quotas(team={"nlp": 1})
        held = book.try_acquire(quotas, team="nlp", pools=[], gpus=1, run_id=run_id, asset_key="frozen").lease
        assert held is not None and book.record_workers(held, frozen.holding())
        assert wait_until(lambda: book.snapshot()[0] > held.expires_at + 0.1, timeout=30)
        adm = book.try_acquire(quotas, team="nlp", pools=[], gpus=1, run_id="second", asset_key="frozen")
        assert adm.granted and [le.lease_id for le in adm.reclaimed] == [held.lease_id], adm.reason
        assert core.list_namespaced_pod(namespace, label_selector=selector).items == []
        assert apps.list_namespaced_deployment(namespace, label_selector=selector).items == []
    finally:
        api_call(apps.delete_namespaced_deployment, name, namespace, tolerate=404)
