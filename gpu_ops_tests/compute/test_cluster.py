"""Against a live cluster (KUBECONFIG set, Kubetorch controller installed); skipped otherwise.

    KUBECONFIG=~/.kube/config GPU_OPS_TEST_NAMESPACE=default .venv/bin/pytest -m cluster gpu_ops_tests/compute

Deploys a tiny CPU function (no GPU, no NodePool) through Kubetorch with the
``GpuCompute`` resource inside a real Dagster run, checks the result, and checks that
cleanup removed the workload.
"""

from __future__ import annotations

import os
import time

import dagster as dg
import pytest

from gpu_ops.compute.resource import GpuCompute
from gpu_ops_tests.compute import launch_assets

pytestmark = pytest.mark.cluster


def test_deploys_a_tiny_function_and_tears_it_down() -> None:
    from kubernetes import client, config

    namespace = os.environ.get("GPU_OPS_TEST_NAMESPACE", "default")
    compute = GpuCompute(backend="kubetorch", namespace=namespace, manage_nodepools=False, cleanup="always", launch_timeout_s=600, inactivity_ttl="15m")
    result = dg.materialize([launch_assets.summed], resources={"gpu_compute": compute})
    assert result.success
    assert result.output_for_node("summed")["sum"] == 5

    apps = client.AppsV1Api(config.new_client_from_config())
    selector = f"gpu-ops.io/run-id={result.run_id}"
    deadline = time.monotonic() + 180
    while apps.list_namespaced_deployment(namespace, label_selector=selector).items:
        assert time.monotonic() < deadline, f"the workload of run {result.run_id} was not torn down"
        time.sleep(5)
