"""Throttle and block: exact NodePool changes (valid against the real CRD), exact reverts,
pools we did not create left alone, and launches refused with a clear message."""

from __future__ import annotations

import copy
import datetime as dt
import json

import dagster as dg
import jsonschema
import pytest

from gpu_ops.flows.alerts.enforcement import (
    ENFORCED_BY,
    ENFORCEMENT_TABLE,
    PRE_ENFORCEMENT,
    EnforcementOrder,
    NodePools,
    block_plan,
    carry_out,
    record_frame,
    revert_plan,
    throttle_plan,
)
from gpu_ops.dagster.compute.admission import assert_launch_allowed
from gpu_ops.flows.compute.karpenter import nodepool_manifest
from gpu_ops.domain.compute.request import GpuRequest
from gpu_ops.storage.tables import TableStore

from gpu_ops_tests.fake_k8s import FakeCustomObjects

UTC = dt.timezone.utc
NOW = dt.datetime(2026, 11, 20, 12, tzinfo=UTC)


def nlp_request(**kw) -> GpuRequest:
    base = dict(gpu_type="a100-80gb", gpus=8, labels={"team": "nlp", "project": "llm"})
    base.update(kw)
    return GpuRequest(**base)


def pools() -> list[dict]:
    req = nlp_request()
    spot, on_demand = nodepool_manifest(req, "spot"), nodepool_manifest(req, "on-demand")
    vision = nodepool_manifest(nlp_request(labels={"team": "vision"}), "spot")
    # Someone else's pool that even carries our team label: never touched.
    foreign = copy.deepcopy(spot)
    foreign["metadata"] = {"name": "platform-gpu", "labels": {"gpu-ops.io/team": "nlp"}}
    return [spot, on_demand, vision, foreign]


@pytest.fixture
def nodepool_schema(karpenter_crds):
    schema = karpenter_crds["NodePool"]

    def validate(obj: dict) -> None:
        # The CRD's openAPIV3Schema is JSON Schema plus x-kubernetes-* annotations,
        # which the validator ignores; the object's metadata is checked by Kubernetes.
        jsonschema.Draft7Validator(schema).validate(obj)

    return validate


def order(event="apply", action="throttle", **kw) -> EnforcementOrder:
    base = dict(
        event=event, budget="nlp-monthly", action=action, period_start="2026-11-01", period_end="2026-12-01",
        scope={"team": "nlp"}, amount_usd=15_000.0, spend_usd=15_200.0, reason="test",
        run_key=f"nlp-monthly/2026-11-01/enforce-{action}/{event}", config_path="/etc/gpu-ops/gpu_ops.yaml",
    )
    base.update(kw)
    return EnforcementOrder(**base)


def test_the_schema_check_has_teeth(nodepool_schema):
    bad = pools()[0]
    bad["spec"]["limits"]["nvidia.com/gpu"] = "eight"
    with pytest.raises(jsonschema.ValidationError):
        nodepool_schema(bad)


def test_throttle_sends_exact_patches_and_revert_restores_the_pool(nodepool_schema):
    api = FakeCustomObjects(pools())
    before = copy.deepcopy(api.nodepools)
    for obj in before.values():
        nodepool_schema(obj)
    outcome = carry_out(order(max_gpus=8, spot_only=True), NodePools(api))
    assert sorted(outcome.plans) == ["gpu-ops-nlp-a100-80gb-on-demand", "gpu-ops-nlp-a100-80gb-spot"]

    od = "gpu-ops-nlp-a100-80gb-on-demand"
    sent = [body for name, body in api.patches if name == od]
    assert sent[0] == {"metadata": {"annotations": {ENFORCED_BY: "nlp-monthly", PRE_ENFORCEMENT: '{"capacity": ["on-demand"], "limit": "64"}'}}}
    assert sent[1] == {"spec": {"limits": {"nvidia.com/gpu": "8"}}}
    reqs = sent[2]["spec"]["template"]["spec"]["requirements"]
    assert {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["spot"]} in reqs
    assert [r for r in reqs if r["key"] != "karpenter.sh/capacity-type"] == [
        r for r in before[od]["spec"]["template"]["spec"]["requirements"] if r["key"] != "karpenter.sh/capacity-type"
    ]
    assert len(sent) == 3
    for obj in api.nodepools.values():
        nodepool_schema(obj)
    assert api.nodepools[od]["spec"]["limits"] == {"nvidia.com/gpu": "8"}
    # Others untouched: vision's pool and the pool we did not create.
    assert api.nodepools["platform-gpu"]["spec"] == before["platform-gpu"]["spec"]
    assert api.nodepools["gpu-ops-vision-a100-80gb-spot"]["spec"] == before["gpu-ops-vision-a100-80gb-spot"]["spec"]
    assert {n for n, _ in api.patches} == set(outcome.plans)

    # Applying again (an op retry) changes nothing more.
    snapshot = copy.deepcopy(api.nodepools)
    carry_out(order(max_gpus=8, spot_only=True), NodePools(api))
    assert _specs(api.nodepools) == _specs(snapshot)

    carry_out(order("revert", max_gpus=8, spot_only=True), NodePools(api))
    for name in before:
        assert _normal(api.nodepools[name]) == _normal(before[name]), name
        nodepool_schema(api.nodepools[name])


def _specs(objects: dict) -> dict:
    return {n: (o["spec"], o["metadata"].get("annotations")) for n, o in objects.items()}


def _normal(obj: dict) -> dict:
    """The object without server-set fields, requirements in a stable order."""
    out = copy.deepcopy(obj)
    out["metadata"].pop("resourceVersion", None)
    if not out["metadata"].get("annotations"):
        out["metadata"].pop("annotations", None)
    out["spec"]["template"]["spec"]["requirements"].sort(key=lambda r: r["key"])
    return out


def test_block_sets_the_limit_to_zero_only_when_asked(nodepool_schema):
    api = FakeCustomObjects(pools())
    outcome = carry_out(order(action="block"), NodePools(api))
    assert outcome.plans == {} and api.patches == [] and "GpuCompute refuses" in outcome.note
    carry_out(order(action="block", zero_pool_limit=True), NodePools(api))
    spot = "gpu-ops-nlp-a100-80gb-spot"
    assert [b for n, b in api.patches if n == spot][1] == {"spec": {"limits": {"nvidia.com/gpu": "0"}}}
    nodepool_schema(api.nodepools[spot])
    carry_out(order("revert", action="block", zero_pool_limit=True), NodePools(api))
    assert api.nodepools[spot]["spec"]["limits"] == {"nvidia.com/gpu": "64"}
    assert "annotations" not in api.nodepools[spot]["metadata"] or not api.nodepools[spot]["metadata"]["annotations"]


def test_plans_never_raise_a_limit_and_refuse_unmanaged_pools():
    pool = pools()[0]
    pool["spec"]["limits"]["nvidia.com/gpu"] = "4"
    assert throttle_plan(pool, "b", max_gpus=8, spot_only=False).limit == 4
    with pytest.raises(PermissionError, match="never touches it"):
        block_plan(pools()[3], "b")
    assert revert_plan(pools()[0], "b") is None  # nothing of b's there


def test_two_budgets_on_one_pool_restore_the_original_after_the_last(nodepool_schema):
    api = FakeCustomObjects(pools()[:1])
    spot = "gpu-ops-nlp-a100-80gb-spot"
    carry_out(order(max_gpus=16), NodePools(api))
    carry_out(order(budget="llm-project", action="block", zero_pool_limit=True, scope={"project": "llm"}), NodePools(api))
    assert api.nodepools[spot]["metadata"]["annotations"][ENFORCED_BY] == "llm-project,nlp-monthly"
    assert json.loads(api.nodepools[spot]["metadata"]["annotations"][PRE_ENFORCEMENT])["limit"] == "64"
    carry_out(order("revert", max_gpus=16), NodePools(api))
    assert api.nodepools[spot]["spec"]["limits"] == {"nvidia.com/gpu": "0"}  # the block still holds
    carry_out(order("revert", budget="llm-project", action="block", zero_pool_limit=True), NodePools(api))
    assert api.nodepools[spot]["spec"]["limits"] == {"nvidia.com/gpu": "64"}
    nodepool_schema(api.nodepools[spot])


def test_no_cluster_means_only_the_gate():
    outcome = carry_out(order(max_gpus=8), None)
    assert outcome.plans == {} and "no Kubernetes cluster" in outcome.note


# --------------------------------------------------------------------------- the launch gate


def _record(store: TableStore, o: EnforcementOrder, at: dt.datetime) -> None:
    from gpu_ops.flows.alerts.enforcement import EnforcementOutcome

    store.append(ENFORCEMENT_TABLE, record_frame(EnforcementOutcome(o), at=at, run_id="r1"))


def test_a_blocked_scope_refuses_launches_with_a_clear_message(tmp_path):
    store = TableStore(f"sqlite:///{tmp_path / 'gate.db'}")
    assert_launch_allowed(store, nlp_request(), now=NOW)  # no table yet: allowed
    _record(store, order(action="block"), NOW - dt.timedelta(hours=1))
    with pytest.raises(dg.Failure) as info:
        assert_launch_allowed(store, nlp_request(), now=NOW)
    failure = info.value
    assert failure.allow_retries is False
    assert failure.description == (
        "GPU launches for team=nlp are blocked by budget 'nlp-monthly': it has spent $15,200.00 of $15,000.00 in the period "
        "2026-11-01 to 2026-11-30. To lift it: raise budgets[nlp-monthly].amount_usd in /etc/gpu-ops/gpu_ops.yaml "
        "(the alert sensor lifts it at its next evaluation), set that budget's enforcement.action to alert, "
        "or wait for the period to end on 2026-12-01."
    )
    assert_launch_allowed(store, nlp_request(labels={"team": "vision"}), now=NOW)  # other scopes run
    # The period is over: inactive even if no revert was recorded.
    assert_launch_allowed(store, nlp_request(), now=dt.datetime(2026, 12, 1, 0, 1, tzinfo=UTC))
    _record(store, order("revert", action="block"), NOW)
    assert_launch_allowed(store, nlp_request(), now=NOW + dt.timedelta(minutes=1))


def test_a_throttled_scope_refuses_what_cannot_fit(tmp_path):
    store = TableStore(f"sqlite:///{tmp_path / 'gate.db'}")
    _record(store, order(max_gpus=8, spot_only=True), NOW - dt.timedelta(hours=1))
    assert_launch_allowed(store, nlp_request(gpus=8), now=NOW)
    with pytest.raises(dg.Failure, match="throttled to 8 GPUs by budget 'nlp-monthly' \\(this launch asks for 16\\)"):
        assert_launch_allowed(store, nlp_request(gpus=8, workers=2), now=NOW)
    with pytest.raises(dg.Failure, match="restricted to spot capacity"):
        assert_launch_allowed(store, nlp_request(capacity="on-demand"), now=NOW)
    assert_launch_allowed(store, nlp_request(capacity="spot-then-on-demand"), now=NOW)
