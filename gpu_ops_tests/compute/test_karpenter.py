"""NodePool / EC2NodeClass manifests against the real Karpenter v1 CRDs, and the client."""

from __future__ import annotations

import jsonschema
import pytest

from gpu_ops.flows.compute.karpenter import (
    CAPACITY_TYPE_LABEL,
    GPU_NAME_LABEL,
    INSTANCE_TYPE_LABEL,
    NodePoolClient,
    NotManagedError,
    ec2nodeclass_manifest,
    nodepool_manifests,
    pod_affinity,
    pod_node_selector,
)
from gpu_ops.domain.compute.request import Attribution, GpuRequest
from gpu_ops.dagster.compute.resource import KarpenterPools
from gpu_ops_tests.fake_k8s import FakeCustomObjects

NLP = Attribution(team="nlp", project="llm", cost_center="cc-42")
SETTINGS = KarpenterPools(node_class="gpu-ops", consolidate_after="15m", gpu_limit=32, node_role="KarpenterNodeRole-demo", cluster_name="demo")


def _requirements(pool: dict) -> dict[str, list[str]]:
    return {r["key"]: r["values"] for r in pool["spec"]["template"]["spec"]["requirements"]}


# Rules the CRDs state as CEL (x-kubernetes-validations), which jsonschema does not run.
_RESTRICTED = {"karpenter.sh/nodepool", "kubernetes.io/hostname"}


def _check_cel_rules(pool: dict) -> None:
    for r in pool["spec"]["template"]["spec"]["requirements"]:
        assert r["key"] not in _RESTRICTED
        domain = r["key"].split("/")[0]
        assert r["key"] == CAPACITY_TYPE_LABEL or not domain.endswith("karpenter.sh")
        if r["operator"] == "In":
            assert r["values"]
    assert "replicas" not in pool["spec"]  # weight is not allowed with replicas


@pytest.mark.parametrize("gpu_type", ["a100-80gb", "a100", "h100", "l4", "t4", "h200"])
@pytest.mark.parametrize("capacity", ["spot", "on-demand", "spot-then-on-demand"])
def test_nodepools_validate_against_the_real_crd(karpenter_crds: dict, gpu_type: str, capacity: str) -> None:
    request = GpuRequest(gpu_type=gpu_type, gpus=1, capacity=capacity, labels=NLP)
    pools = nodepool_manifests(request, SETTINGS, run_id="0f3a9c2e-aaaa")
    assert [p["metadata"]["labels"]["gpu-ops.io/capacity"] for p in pools] == request.capacity_types
    for pool in pools:
        jsonschema.validate(pool, karpenter_crds["NodePool"])
        _check_cel_rules(pool)


def test_nodepool_has_what_gpu_training_needs() -> None:
    spot, on_demand = nodepool_manifests(GpuRequest(gpu_type="a100-80gb", gpus=8, capacity="spot-then-on-demand", labels=NLP), SETTINGS)
    assert spot["metadata"]["name"] == "gpu-ops-nlp-a100-80gb-spot"
    assert on_demand["metadata"]["name"] == "gpu-ops-nlp-a100-80gb-on-demand"
    assert spot["spec"]["weight"] > on_demand["spec"]["weight"]  # spot first
    tmpl = spot["spec"]["template"]["spec"]
    assert tmpl["expireAfter"] == "Never"
    assert spot["spec"]["disruption"] == {"consolidationPolicy": "WhenEmpty", "consolidateAfter": "15m"}
    assert {"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"} in tmpl["taints"]
    assert spot["spec"]["limits"] == {"nvidia.com/gpu": "32"}
    reqs = _requirements(spot)
    assert reqs[GPU_NAME_LABEL] == ["a100"] and reqs[CAPACITY_TYPE_LABEL] == ["spot"]
    assert reqs[INSTANCE_TYPE_LABEL] == ["p4de.24xlarge"]  # 80 GB A100s only
    labels = spot["metadata"]["labels"]
    assert labels["gpu-ops.io/managed-by"] == "gpu-ops" and labels["gpu-ops.io/team"] == "nlp"
    assert labels["gpu-ops.io/cost-center"] == "cc-42" and "gpu-ops.io/run-id" not in labels  # team scope
    assert spot["spec"]["template"]["metadata"]["labels"]["gpu-ops.io/team"] == "nlp"


def test_a100_40gb_and_80gb_are_told_apart_by_instance_type() -> None:
    (p40,) = nodepool_manifests(GpuRequest(gpu_type="a100", capacity="spot", labels=NLP), SETTINGS)
    (p80,) = nodepool_manifests(GpuRequest(gpu_type="NVIDIA-A100-SXM4-80GB", capacity="spot", labels=NLP), SETTINGS)
    assert _requirements(p40)[GPU_NAME_LABEL] == _requirements(p80)[GPU_NAME_LABEL] == ["a100"]
    assert _requirements(p40)[INSTANCE_TYPE_LABEL] == ["p4d.24xlarge"]
    assert _requirements(p80)[INSTANCE_TYPE_LABEL] == ["p4de.24xlarge"]
    aff = pod_affinity(GpuRequest(gpu_type="a100", capacity="spot"))
    terms = aff["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]["matchExpressions"]
    assert {"key": INSTANCE_TYPE_LABEL, "operator": "In", "values": ["p4d.24xlarge"]} in terms


def test_run_scoped_pools_carry_the_run_id() -> None:
    settings = KarpenterPools(pool_scope="run")
    (pool,) = nodepool_manifests(GpuRequest(gpu_type="l4", capacity="spot", labels=NLP), settings, run_id="0f3a9c2e-1111")
    assert pool["metadata"]["name"] == "gpu-ops-nlp-l4-spot-0f3a9c2e"
    assert pool["metadata"]["labels"]["gpu-ops.io/run-id"] == "0f3a9c2e-1111"


def test_pod_selector_never_uses_gpu_product() -> None:
    sel = pod_node_selector(GpuRequest(gpu_type="h100", capacity="spot", labels=NLP))
    assert sel == {GPU_NAME_LABEL: "h100", CAPACITY_TYPE_LABEL: "spot", "gpu-ops.io/team": "nlp"}
    both = GpuRequest(gpu_type="h100", capacity="spot-then-on-demand")
    assert CAPACITY_TYPE_LABEL not in pod_node_selector(both)
    pref = pod_affinity(both)["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]
    assert pref["preference"]["matchExpressions"][0]["values"] == ["spot"]


def test_ec2nodeclass_validates_and_names_missing_fields(karpenter_crds: dict) -> None:
    nc = ec2nodeclass_manifest(SETTINGS)
    jsonschema.validate(nc, karpenter_crds["EC2NodeClass"])
    assert nc["spec"]["role"] == "KarpenterNodeRole-demo"
    with pytest.raises(ValueError, match="karpenter.node_role"):
        ec2nodeclass_manifest(KarpenterPools())
    with pytest.raises(ValueError, match="consolidate_after"):  # refused where the setting lives, not at launch
        KarpenterPools(consolidate_after="ten minutes")


# ---------------------------------------------------------------------- client


@pytest.fixture
def api(karpenter_crds: dict) -> FakeCustomObjects:
    return FakeCustomObjects(schemas=karpenter_crds)


def test_apply_creates_then_merge_patches_keeping_a_lowered_limit(api: FakeCustomObjects) -> None:
    client = NodePoolClient(api)
    (pool,) = nodepool_manifests(GpuRequest(gpu_type="l4", capacity="spot", labels=NLP), SETTINGS)
    assert client.apply(pool) == "created"
    client.patch_limits(pool["metadata"]["name"], 4)  # a budget throttle
    pool["spec"]["disruption"]["consolidateAfter"] = "30m"
    assert client.apply(pool) == "patched"
    stored = client.get(pool["metadata"]["name"])
    assert stored["spec"]["disruption"]["consolidateAfter"] == "30m"
    assert stored["spec"]["limits"] == {"nvidia.com/gpu": "4"}  # the throttle survives a launch


def test_foreign_pools_are_never_touched(api: FakeCustomObjects) -> None:
    client = NodePoolClient(api)
    (pool,) = nodepool_manifests(GpuRequest(gpu_type="l4", capacity="spot", labels=NLP), SETTINGS)
    foreign = {**pool, "metadata": {"name": pool["metadata"]["name"], "labels": {"team": "platform"}}}
    api.create_cluster_custom_object("karpenter.sh", "v1", "nodepools", foreign)
    with pytest.raises(NotManagedError, match="not labelled gpu-ops.io/managed-by=gpu-ops"):
        client.apply(pool)
    with pytest.raises(NotManagedError):
        client.patch_limits(pool["metadata"]["name"], 0)
    with pytest.raises(NotManagedError):
        client.delete(pool["metadata"]["name"])
    assert client.get(pool["metadata"]["name"])["metadata"]["labels"] == {"team": "platform"}


def test_patch_capacity_types_restricts_to_spot(api: FakeCustomObjects) -> None:
    client = NodePoolClient(api)
    (pool,) = nodepool_manifests(GpuRequest(gpu_type="l4", capacity="on-demand", labels=NLP), SETTINGS)
    client.apply(pool)
    out = client.patch_capacity_types(pool["metadata"]["name"], ["spot"])
    reqs = _requirements(out)
    assert reqs[CAPACITY_TYPE_LABEL] == ["spot"] and reqs[GPU_NAME_LABEL] == ["l4"]
    assert len(out["spec"]["template"]["spec"]["requirements"]) == len(pool["spec"]["template"]["spec"]["requirements"])
    with pytest.raises(ValueError, match="capacity_types"):
        client.patch_capacity_types(pool["metadata"]["name"], ["cheap"])


def test_patch_limits_to_zero_blocks(api: FakeCustomObjects) -> None:
    client = NodePoolClient(api)
    (pool,) = nodepool_manifests(GpuRequest(gpu_type="t4", capacity="spot", labels=NLP), SETTINGS)
    client.apply(pool)
    assert client.patch_limits(pool["metadata"]["name"], 0)["spec"]["limits"] == {"nvidia.com/gpu": "0"}
    with pytest.raises(KeyError, match="does not exist"):
        client.patch_limits("gpu-ops-nobody-t4-spot", 1)


def test_delete_only_what_the_run_owns_and_list_owned(api: FakeCustomObjects) -> None:
    client = NodePoolClient(api)
    run_settings = KarpenterPools(pool_scope="run")
    (mine,) = nodepool_manifests(GpuRequest(gpu_type="l4", capacity="spot", labels=NLP), run_settings, run_id="run-aaaa1111")
    (theirs,) = nodepool_manifests(GpuRequest(gpu_type="l4", capacity="spot", labels=NLP), run_settings, run_id="run-bbbb2222")
    (shared,) = nodepool_manifests(GpuRequest(gpu_type="l4", capacity="spot", labels=Attribution(team="vision")), SETTINGS)
    for p in (mine, theirs, shared):
        client.apply(p)
    assert [p["metadata"]["name"] for p in client.list_owned(team="nlp")] == sorted([mine["metadata"]["name"], theirs["metadata"]["name"]])
    assert [p["metadata"]["name"] for p in client.list_owned(run_id="run-aaaa1111")] == [mine["metadata"]["name"]]
    with pytest.raises(NotManagedError, match="belongs to run run-bbbb2222"):
        client.delete(theirs["metadata"]["name"], run_id="run-aaaa1111")
    with pytest.raises(NotManagedError, match="a shared pool"):
        client.delete(shared["metadata"]["name"], run_id="run-aaaa1111")
    assert client.delete(mine["metadata"]["name"], run_id="run-aaaa1111") is True
    assert client.delete(mine["metadata"]["name"]) is False  # already gone
    assert len(client.list_owned()) == 2


def test_the_fake_server_rejects_what_the_crd_rejects(api: FakeCustomObjects) -> None:
    # Guards the test double itself: a bad manifest must not pass silently.
    from kubernetes.client.exceptions import ApiException

    (pool,) = nodepool_manifests(GpuRequest(gpu_type="l4", capacity="spot", labels=NLP), SETTINGS)
    pool["spec"]["template"]["spec"]["expireAfter"] = "30 days"
    with pytest.raises(ApiException) as err:
        NodePoolClient(api).apply(pool)
    assert err.value.status == 422
