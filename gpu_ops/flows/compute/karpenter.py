"""Karpenter v1 NodePools (and optionally the EC2NodeClass) for GPU launches: pure manifest
builders and `NodePoolClient`.

Design: docs/concepts/compute.md#karpenter-nodepools
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any, Literal, Protocol

from gpu_ops.domain.compute.catalog import CATALOG, gpu_spec
from gpu_ops.flows.compute.kube import TOLERATED, api_call
from gpu_ops.domain.compute.naming import (
    GPU_RESOURCE,
    CAPACITY,
    GPU_TYPE,
    MANAGED_BY,
    MANAGED_BY_VALUE,
    RUN_ID,
    TEAM,
    dns_label,
    label_value,
    managed_selector,
)
from gpu_ops.domain.compute.request import GpuRequest
from gpu_ops.domain.config import KarpenterConfig
from gpu_ops.errors import NotManagedError

KARPENTER_GROUP = "karpenter.sh"
KARPENTER_VERSION = "v1"
NODEPOOLS = "nodepools"
AWS_GROUP = "karpenter.k8s.aws"
AWS_VERSION = "v1"
EC2NODECLASSES = "ec2nodeclasses"

GPU_NAME_LABEL = "karpenter.k8s.aws/instance-gpu-name"
CAPACITY_TYPE_LABEL = "karpenter.sh/capacity-type"
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
NODEPOOL_LABEL = "karpenter.sh/nodepool"
GPU_TAINT = {"key": GPU_RESOURCE, "value": "true", "effect": "NoSchedule"}
DO_NOT_DISRUPT = "karpenter.sh/do-not-disrupt"
# Karpenter orders pools by weight (higher first): spot is tried before on-demand.
WEIGHTS = {"spot": 50, "on-demand": 10}


class PoolSettings(Protocol):
    """What the builders read of the pools' settings: the resource's nested
    ``KarpenterPools`` (``gpu_ops.dagster.compute.resource``) or the ``compute.karpenter`` section
    (:class:`~gpu_ops.domain.config.KarpenterConfig`), passed as they are."""

    @property
    def manage_nodepools(self) -> bool: ...
    @property
    def manage_ec2nodeclass(self) -> bool: ...
    @property
    def node_class(self) -> str: ...
    @property
    def consolidate_after(self) -> str: ...
    @property
    def gpu_limit(self) -> int: ...
    @property
    def pool_scope(self) -> str: ...
    @property
    def node_role(self) -> str | None: ...
    @property
    def cluster_name(self) -> str | None: ...


DEFAULT_POOLS: PoolSettings = KarpenterConfig()


def nodepool_name(team: str, gpu_type: str, capacity_type: str, run_id: str | None = None) -> str:
    """``gpu-ops-nlp-a100-80gb-spot`` (team scope) or ``...-spot-1a2b3c4d`` (run scope)."""
    base = f"gpu-ops-{dns_label(team or 'unassigned', 20)}-{gpu_type}-{capacity_type}"
    return f"{base}-{dns_label(run_id)[:8]}" if run_id else base


def instance_types(request: GpuRequest) -> list[str]:
    spec = gpu_spec(request.gpu_type)
    return spec.instance_types_for(max(request.gpus, 1))


def gpu_name_is_ambiguous(gpu_type: str) -> bool:
    """True when another catalog GPU shares this one's ``instance-gpu-name`` (a100)."""
    name = gpu_spec(gpu_type).karpenter_gpu_name
    return sum(1 for s in CATALOG.values() if s.karpenter_gpu_name == name) > 1


def pool_labels(request: GpuRequest, capacity_type: str, run_id: str | None) -> dict[str, str]:
    labels = {
        MANAGED_BY: MANAGED_BY_VALUE,
        GPU_TYPE: request.gpu_type,
        CAPACITY: capacity_type,
        **request.labels.as_labels(),
    }
    if run_id:
        labels[RUN_ID] = label_value(run_id)
    return labels


def nodepool_manifest(request: GpuRequest, capacity_type: str, settings: PoolSettings = DEFAULT_POOLS, run_id: str | None = None) -> dict[str, Any]:
    """One ``karpenter.sh/v1`` NodePool for ``request`` on ``capacity_type`` capacity."""
    if capacity_type not in WEIGHTS:
        raise ValueError(f"capacity_type: {capacity_type!r} is not one of {', '.join(WEIGHTS)}")
    spec = gpu_spec(request.gpu_type)
    scoped_run = run_id if settings.pool_scope == "run" else None
    labels = pool_labels(request, capacity_type, scoped_run)
    # Nodes carry the team and gpu labels: pods select their team's pool by them, and the
    # cost collector reads them from the node.
    node_labels = {k: v for k, v in labels.items() if k in (MANAGED_BY, GPU_TYPE, TEAM, RUN_ID)}
    return {
        "apiVersion": f"{KARPENTER_GROUP}/{KARPENTER_VERSION}",
        "kind": "NodePool",
        "metadata": {"name": nodepool_name(request.labels.team, request.gpu_type, capacity_type, scoped_run), "labels": labels},
        "spec": {
            "weight": WEIGHTS[capacity_type],
            "limits": {GPU_RESOURCE: str(settings.gpu_limit)},
            "disruption": {"consolidationPolicy": "WhenEmpty", "consolidateAfter": settings.consolidate_after},
            "template": {
                "metadata": {"labels": node_labels},
                "spec": {
                    "nodeClassRef": {"group": AWS_GROUP, "kind": "EC2NodeClass", "name": settings.node_class},
                    "expireAfter": "Never",
                    "taints": [dict(GPU_TAINT)],
                    "requirements": [
                        {"key": GPU_NAME_LABEL, "operator": "In", "values": [spec.karpenter_gpu_name]},
                        {"key": INSTANCE_TYPE_LABEL, "operator": "In", "values": sorted(spec.instance_types)},
                        {"key": CAPACITY_TYPE_LABEL, "operator": "In", "values": [capacity_type]},
                        {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]},
                        {"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]},
                    ],
                },
            },
        },
    }


def nodepool_manifests(request: GpuRequest, settings: PoolSettings = DEFAULT_POOLS, run_id: str | None = None) -> list[dict[str, Any]]:
    """The pools a launch of ``request`` needs: one per capacity type, preferred first."""
    return [nodepool_manifest(request, c, settings, run_id) for c in request.capacity_types]


def ec2nodeclass_manifest(settings: PoolSettings) -> dict[str, Any]:
    """A ``karpenter.k8s.aws/v1`` EC2NodeClass for GPU nodes (AL2023 NVIDIA AMIs)."""
    if not settings.node_role:
        raise ValueError("karpenter.node_role: required when manage_ec2nodeclass is true (the IAM role of the nodes)")
    if not settings.cluster_name:
        raise ValueError("karpenter.cluster_name: required when manage_ec2nodeclass is true (subnets and security groups are discovered by its tag)")
    discovery = [{"tags": {"karpenter.sh/discovery": settings.cluster_name}}]
    return {
        "apiVersion": f"{AWS_GROUP}/{AWS_VERSION}",
        "kind": "EC2NodeClass",
        "metadata": {"name": settings.node_class, "labels": {MANAGED_BY: MANAGED_BY_VALUE}},
        "spec": {
            "role": settings.node_role,
            "amiSelectorTerms": [{"alias": "al2023@latest"}],
            "subnetSelectorTerms": copy.deepcopy(discovery),
            "securityGroupSelectorTerms": copy.deepcopy(discovery),
            # Model weights, datasets and images are large: a root volume the default 20Gi is not.
            "blockDeviceMappings": [
                {"deviceName": "/dev/xvda", "ebs": {"volumeSize": "200Gi", "volumeType": "gp3", "encrypted": True, "deleteOnTermination": True}}
            ],
            "metadataOptions": {"httpTokens": "required", "httpPutResponseHopLimit": 1},
        },
    }


# ---------------------------------------------------------------------- pod placement


def _wants_gpu(request: GpuRequest) -> bool:
    return request.gpus > 0 or bool(request.mig_profile)


def pod_node_selector(request: GpuRequest, *, team_pools: bool = True) -> dict[str, str]:
    """nodeSelector for the training pods (never ``nvidia.com/gpu.product``).

    A request for no GPU (``gpus=0``, no MIG slice) has no GPU placement at all.
    """
    if not _wants_gpu(request):
        return {}
    spec = gpu_spec(request.gpu_type)
    selector = {GPU_NAME_LABEL: spec.karpenter_gpu_name}
    if len(request.capacity_types) == 1:
        selector[CAPACITY_TYPE_LABEL] = request.capacity_types[0]
    if team_pools:
        selector[TEAM] = request.labels.team
    return selector


def pod_affinity(request: GpuRequest) -> dict[str, Any] | None:
    """nodeAffinity for what a nodeSelector cannot say: several capacity types, or an
    instance-type restriction where the GPU name is ambiguous (a100 vs a100-80gb)."""
    if not _wants_gpu(request):
        return None
    required: list[dict[str, Any]] = []
    preferred: list[dict[str, Any]] = []
    if gpu_name_is_ambiguous(request.gpu_type):
        required.append({"key": INSTANCE_TYPE_LABEL, "operator": "In", "values": instance_types(request)})
    if len(request.capacity_types) > 1:
        required.append({"key": CAPACITY_TYPE_LABEL, "operator": "In", "values": list(request.capacity_types)})
        preferred.append({"weight": 100, "preference": {"matchExpressions": [{"key": CAPACITY_TYPE_LABEL, "operator": "In", "values": [request.capacity_types[0]]}]}})
    if not required and not preferred:
        return None
    node_affinity: dict[str, Any] = {}
    if required:
        node_affinity["requiredDuringSchedulingIgnoredDuringExecution"] = {"nodeSelectorTerms": [{"matchExpressions": required}]}
    if preferred:
        node_affinity["preferredDuringSchedulingIgnoredDuringExecution"] = preferred
    return {"nodeAffinity": node_affinity}


def gpu_tolerations() -> list[dict[str, str]]:
    return [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}]


# ---------------------------------------------------------------------- client


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch, as the API server applies it (the bodies sent by
    :class:`NodePoolClient` and budget enforcement). ``target`` is left as it was."""
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    out = copy.deepcopy(dict(target)) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


def is_managed(obj: Mapping[str, Any]) -> bool:
    """Carries ``gpu-ops.io/managed-by: gpu-ops``: created by gpu_ops, ours to change."""
    return ((obj.get("metadata") or {}).get("labels") or {}).get(MANAGED_BY) == MANAGED_BY_VALUE


class NodePoolClient:
    """Apply, patch, list and delete gpu_ops NodePools through ``CustomObjectsApi``.

    ``api`` is a ``kubernetes.client.CustomObjectsApi``. Used by launches (``apply``,
    ``delete``), the orphan sensor (``list_owned``, ``delete``) and budget enforcement
    (``patch_limits``, ``patch_capacity_types``).
    """

    def __init__(self, api: Any):
        self.api = api

    # -- reads
    def get(self, name: str) -> dict[str, Any] | None:
        found = api_call(self.api.get_cluster_custom_object, KARPENTER_GROUP, KARPENTER_VERSION, NODEPOOLS, name, tolerate=404)
        return None if found is TOLERATED else found

    def list_owned(self, *, team: str | None = None, run_id: str | None = None, gpu_type: str | None = None) -> list[dict[str, Any]]:
        """gpu_ops pools, optionally only a team's, a run's or a GPU type's."""
        labels = []
        if team:
            labels.append((TEAM, team))
        if run_id:
            labels.append((RUN_ID, label_value(run_id)))
        if gpu_type:
            labels.append((GPU_TYPE, gpu_type))
        selector = managed_selector(labels)
        out = self.api.list_cluster_custom_object(KARPENTER_GROUP, KARPENTER_VERSION, NODEPOOLS, label_selector=selector)
        return list(out.get("items", []))

    # -- writes
    def apply(self, manifest: dict[str, Any]) -> Literal["created", "patched"]:
        """Create; if it exists (409) and is ours, merge-patch it to the manifest.

        An existing pool keeps its current ``limits``: budget enforcement may have lowered
        them, and a launch must not quietly lift a throttle.
        """
        name = manifest["metadata"]["name"]
        if api_call(self.api.create_cluster_custom_object, KARPENTER_GROUP, KARPENTER_VERSION, NODEPOOLS, manifest, tolerate=409) is not TOLERATED:
            return "created"
        current = self.get(name)
        if current is not None and not is_managed(current):
            raise NotManagedError(f"NodePool {name} exists but is not labelled {MANAGED_BY}={MANAGED_BY_VALUE}: rename the team or remove that pool")
        patch = copy.deepcopy(manifest)
        if current is not None and "limits" in current.get("spec", {}):
            patch["spec"].pop("limits", None)
        self.api.patch_cluster_custom_object(KARPENTER_GROUP, KARPENTER_VERSION, NODEPOOLS, name, patch)
        return "patched"

    def patch_limits(self, name: str, gpus: int) -> dict[str, Any]:
        """Set the pool's ``nvidia.com/gpu`` limit: lower it to throttle, 0 to block new GPU nodes.

        Karpenter does not remove running nodes above a lowered limit; it stops adding them.
        """
        if gpus < 0:
            raise ValueError(f"gpus: must be >= 0, got {gpus}")
        self._require_managed(name)
        return self.api.patch_cluster_custom_object(KARPENTER_GROUP, KARPENTER_VERSION, NODEPOOLS, name, {"spec": {"limits": {GPU_RESOURCE: str(gpus)}}})

    def patch_capacity_types(self, name: str, capacity_types: list[str]) -> dict[str, Any]:
        """Restrict (or widen) the pool to these capacity types, e.g. ``["spot"]`` to throttle.

        A merge patch replaces the whole requirements list, so it is read, edited and
        written back with its resourceVersion (a concurrent change makes it retry).
        """
        bad = [c for c in capacity_types if c not in ("spot", "on-demand", "reserved")]
        if not capacity_types or bad:
            raise ValueError(f"capacity_types: must be a non-empty list of spot, on-demand, reserved (got {capacity_types})")
        for _ in range(5):
            current = self._require_managed(name)
            reqs = [r for r in current["spec"]["template"]["spec"].get("requirements", []) if r.get("key") != CAPACITY_TYPE_LABEL]
            reqs.append({"key": CAPACITY_TYPE_LABEL, "operator": "In", "values": list(capacity_types)})
            patch = {
                "metadata": {"resourceVersion": current["metadata"].get("resourceVersion")},
                "spec": {"template": {"spec": {"requirements": reqs}}},
            }
            patched = api_call(self.api.patch_cluster_custom_object, KARPENTER_GROUP, KARPENTER_VERSION, NODEPOOLS, name, patch, tolerate=409)
            if patched is not TOLERATED:
                return patched
        raise RuntimeError(f"NodePool {name}: requirements kept changing underneath; gave up after 5 attempts")

    def delete(self, name: str, *, run_id: str | None = None) -> bool:
        """Delete a gpu_ops pool; with ``run_id``, only if that run owns it. False if absent."""
        current = self.get(name)
        if current is None:
            return False
        if not is_managed(current):
            raise NotManagedError(f"NodePool {name} is not managed by gpu_ops; not deleting it")
        owner = (current["metadata"].get("labels") or {}).get(RUN_ID)
        if run_id is not None and owner != label_value(run_id):
            raise NotManagedError(f"NodePool {name} belongs to run {owner or '(none: a shared pool)'}, not {run_id}; not deleting it")
        return api_call(self.api.delete_cluster_custom_object, KARPENTER_GROUP, KARPENTER_VERSION, NODEPOOLS, name, tolerate=404) is not TOLERATED

    def apply_node_class(self, manifest: dict[str, Any]) -> Literal["created", "patched"]:
        if api_call(self.api.create_cluster_custom_object, AWS_GROUP, AWS_VERSION, EC2NODECLASSES, manifest, tolerate=409) is not TOLERATED:
            return "created"
        self.api.patch_cluster_custom_object(AWS_GROUP, AWS_VERSION, EC2NODECLASSES, manifest["metadata"]["name"], manifest)
        return "patched"

    def _require_managed(self, name: str) -> dict[str, Any]:
        current = self.get(name)
        if current is None:
            raise KeyError(f"NodePool {name} does not exist")
        if not is_managed(current):
            raise NotManagedError(f"NodePool {name} is not managed by gpu_ops; not modifying it")
        return current
