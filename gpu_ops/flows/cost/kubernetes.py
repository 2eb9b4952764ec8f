"""Kubernetes collector: GPU pods and GPU nodes as usage intervals and node inventory,
recorded collection by collection.

Design: docs/concepts/cost-sources.md#the-kubernetes-collector
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import pandas as pd

from gpu_ops.domain.compute.catalog import CATALOG, UnknownGpuType, canonical_gpu_type, gpu_spec
from gpu_ops.flows.compute.kube import load_cluster_config
from gpu_ops.domain.cost.columns import DEFAULT_LABEL_KEYS
from gpu_ops.domain.compute.naming import GPU_RESOURCE

COLLECTED_PODS_TABLE = "gpu_usage_collected"
COLLECTED_NODES_TABLE = "gpu_nodes_collected"
CAPACITY_LABELS = ("karpenter.sh/capacity-type", "eks.amazonaws.com/capacityType")
_CAPACITY_VALUES = {"spot": "spot", "on-demand": "on-demand", "on_demand": "on-demand", "reserved": "reserved"}
MIG_PREFIX = "nvidia.com/mig-"


def gpu_type_from_node_labels(labels: Mapping[str, str]) -> str:
    """Canonical GPU type of a node, or "" when its labels do not say.

    Order: the instance type (exact, from the catalog), NVIDIA GFD's
    ``nvidia.com/gpu.product`` (``-SHARED`` suffix of time-sliced nodes removed), then
    Karpenter's ``instance-gpu-name`` with ``instance-gpu-memory`` to tell a100 from a100-80gb.
    """
    itype = labels.get("node.kubernetes.io/instance-type") or labels.get("beta.kubernetes.io/instance-type") or ""
    for spec in CATALOG.values():
        if itype in spec.instance_types:
            return spec.name
    product = labels.get("nvidia.com/gpu.product", "")
    if product:
        try:
            return canonical_gpu_type(product.removesuffix("-SHARED"))
        except UnknownGpuType:
            pass
    name = labels.get("karpenter.k8s.aws/instance-gpu-name", "")
    if name:
        mem_mib = labels.get("karpenter.k8s.aws/instance-gpu-memory", "")
        matches = [s for s in CATALOG.values() if s.karpenter_gpu_name == name]
        if mem_mib.isdigit():
            matches = [s for s in matches if abs(s.memory_gib * 1024 - int(mem_mib)) <= 0.1 * s.memory_gib * 1024] or matches
        if len(matches) == 1:
            return matches[0].name
    return product or name  # unknown to the catalog: validation quarantines it with the name


def node_capacity_type(labels: Mapping[str, str]) -> str:
    for key in CAPACITY_LABELS:
        if key in labels:
            v = labels[key].strip().lower()
            return _CAPACITY_VALUES.get(v, v)
    return ""


def _quantity(v: Any) -> float:
    try:
        return float(str(v))
    except ValueError:
        return 0.0


def pod_gpus(pod: Any) -> tuple[float, str | None]:
    """(count, MIG profile or None) from the containers' limits (requests when no limits)."""
    count = 0.0
    profile = None
    for c in pod.spec.containers or []:
        res = c.resources
        amounts = (res.limits or res.requests or {}) if res else {}
        for name, qty in amounts.items():
            if name == GPU_RESOURCE:
                count += _quantity(qty)
            elif name.startswith(MIG_PREFIX):
                profile = name[len(MIG_PREFIX) :]
                count += _quantity(qty)
    return count, profile


def _iso(ts: dt.datetime | None) -> str | None:
    if ts is None:
        return None
    if ts.tzinfo is None:
        ts = ts.replace(tzinfo=dt.timezone.utc)
    return ts.astimezone(dt.timezone.utc).isoformat()


def _pod_end(pod: Any) -> dt.datetime | None:
    if pod.status.phase not in ("Succeeded", "Failed"):
        return None
    ends = [s.state.terminated.finished_at for s in (pod.status.container_statuses or []) if s.state and s.state.terminated and s.state.terminated.finished_at]
    return max(ends) if ends else None


def _list_all(fn: Any, **kwargs: Any) -> list[Any]:
    items: list[Any] = []
    token = None
    while True:
        resp = fn(**kwargs, _continue=token) if token else fn(**kwargs)
        items.extend(resp.items or [])
        token = getattr(resp.metadata, "_continue", None) if resp.metadata else None
        if not token:
            return items


def collect_pods(core_api: Any, namespaces: Iterable[str] = (), label_keys: Mapping[str, str] | None = None, observed_at: dt.datetime | None = None) -> pd.DataFrame:
    """GPU pods that have started, as raw usage rows (validated later like any source)."""
    keys = {**DEFAULT_LABEL_KEYS, **(label_keys or {})}
    observed = observed_at or dt.datetime.now(dt.timezone.utc)
    nodes = {n.metadata.name: n.metadata.labels or {} for n in _list_all(core_api.list_node)}
    namespaces = list(namespaces)
    pods = [p for ns in namespaces for p in _list_all(core_api.list_namespaced_pod, namespace=ns)] if namespaces else _list_all(core_api.list_pod_for_all_namespaces)
    rows = []
    for pod in pods:
        count, profile = pod_gpus(pod)
        if count <= 0 or pod.status is None or pod.status.start_time is None:
            continue
        labels = pod.metadata.labels or {}
        node = pod.spec.node_name or ""
        nlabels = nodes.get(node, {})
        gpu_type = gpu_type_from_node_labels(nlabels)
        sharing, share = "none", 1.0
        if profile:
            sharing = "mig"
            try:
                share = float(gpu_spec(gpu_type).mig_profile(profile).share)
            except (UnknownGpuType, ValueError, KeyError):
                share = float("nan")  # unknown type or profile: quarantined, never priced as a whole GPU
        else:
            replicas = _quantity(nlabels.get("nvidia.com/gpu.replicas", "1")) or 1.0
            if replicas > 1:
                strategy = nlabels.get("nvidia.com/gpu.sharing-strategy", "time-slicing")
                sharing = "mps" if strategy == "mps" else "timeslice"
                share = 1.0 / replicas
        rows.append(
            {
                "start": _iso(pod.status.start_time),
                "end": _iso(_pod_end(pod)),
                "namespace": pod.metadata.namespace,
                "pod": pod.metadata.name,
                "node": node,
                **{k: labels.get(v, "") for k, v in keys.items()},
                "gpu_type": gpu_type,
                "gpu_count": count,
                "capacity_type": node_capacity_type(nlabels),
                "sharing": sharing,
                "gpu_share": share,
                "region": nlabels.get("topology.kubernetes.io/region", ""),
                "instance_type": nlabels.get("node.kubernetes.io/instance-type", ""),
                "labels": json.dumps(labels, sort_keys=True),
                "source": "kubernetes",
                "location": f"pod {pod.metadata.namespace}/{pod.metadata.name} on node {node or '(unscheduled)'}",
                "row": None,
                "observed_at": _iso(observed),
            }
        )
    return pd.DataFrame(rows, columns=_POD_COLUMNS)


_POD_COLUMNS = [
    "start", "end", "namespace", "pod", "node", *DEFAULT_LABEL_KEYS, "gpu_type", "gpu_count", "capacity_type", "sharing",
    "gpu_share", "region", "instance_type", "labels", "source", "location", "row", "observed_at",
]
_NODE_COLUMNS = ["node", "instance_type", "gpu_type", "gpu_count", "capacity_type", "region", "start", "end", "source", "location", "row", "observed_at"]


def collect_nodes(core_api: Any, observed_at: dt.datetime | None = None, karpenter_only: bool = True) -> pd.DataFrame:
    """GPU nodes as raw inventory rows (Karpenter-managed ones unless ``karpenter_only`` is false)."""
    observed = observed_at or dt.datetime.now(dt.timezone.utc)
    rows = []
    for n in _list_all(core_api.list_node):
        labels = n.metadata.labels or {}
        if karpenter_only and "karpenter.sh/nodepool" not in labels:
            continue
        capacity = (n.status.capacity or {}) if n.status else {}
        gpu_type = gpu_type_from_node_labels(labels)
        # Physical GPUs: GFD's count label (time-sliced nodes advertise replicas × GPUs),
        # else the catalog's count for the instance type, else the advertised resource.
        count = _quantity(labels.get("nvidia.com/gpu.count", "0"))
        itype = labels.get("node.kubernetes.io/instance-type", "")
        if not count and gpu_type in CATALOG:
            count = float(CATALOG[gpu_type].instance_types.get(itype, 0))
        if not count:
            count = _quantity(capacity.get(GPU_RESOURCE, 0)) / (_quantity(labels.get("nvidia.com/gpu.replicas", "1")) or 1.0)
        if not count:
            continue
        rows.append(
            {
                "node": n.metadata.name,
                "instance_type": itype,
                "gpu_type": gpu_type,
                "gpu_count": count,
                "capacity_type": node_capacity_type(labels),
                "region": labels.get("topology.kubernetes.io/region", ""),
                "start": _iso(n.metadata.creation_timestamp),
                "end": _iso(n.metadata.deletion_timestamp),
                "source": "karpenter",
                "location": f"node {n.metadata.name}",
                "row": None,
                "observed_at": _iso(observed),
            }
        )
    return pd.DataFrame(rows, columns=_NODE_COLUMNS)


def merge_snapshot(previous: pd.DataFrame, snapshot: pd.DataFrame, key: list[str], observed_at: dt.datetime) -> pd.DataFrame:
    """Fold a collection into the recorded intervals.

    The newest sighting of an object wins; a recorded object still open (no ``end``) that
    this collection no longer sees ended at most at its last sighting, so it is closed there.
    """
    observed = _iso(observed_at)
    prev = previous.drop(columns=[c for c in ("partition_key",) if c in previous.columns]) if len(previous) else previous
    if len(prev):
        prev = prev.astype({c: object for c in prev.columns})
        for c in ("start", "end", "observed_at"):
            if c in prev:
                prev[c] = prev[c].map(lambda v: None if v is None or v is pd.NaT or (isinstance(v, float) and np.isnan(v)) else (v.isoformat() if hasattr(v, "isoformat") else str(v)))
        seen = set(map(tuple, snapshot[key].astype(str).to_numpy())) if len(snapshot) else set()
        gone = np.array([tuple(k) not in seen for k in prev[key].astype(str).to_numpy()], dtype=bool)
        open_gone = gone & prev["end"].isna().to_numpy()
        prev.loc[open_gone, "end"] = prev.loc[open_gone, "observed_at"]
    merged = pd.concat([prev, snapshot.astype(object)], ignore_index=True) if len(prev) else snapshot.astype(object)
    merged = merged.drop_duplicates(key, keep="last").reset_index(drop=True)
    merged["row"] = pd.array([None] * len(merged), dtype="Int64")
    for c in ("gpu_count", "gpu_share"):
        if c in merged:
            merged[c] = merged[c].astype(float)
    merged["observed_at"] = merged["observed_at"].fillna(observed)
    return merged


def record_pods(store: Any, snapshot: pd.DataFrame, observed_at: dt.datetime, retention_days: int | None = None) -> pd.DataFrame:
    merged = merge_snapshot(store.read(COLLECTED_PODS_TABLE, missing_ok=True), snapshot, ["namespace", "pod", "start"], observed_at)
    merged = drop_expired(merged, observed_at, retention_days)
    store.write(COLLECTED_PODS_TABLE, merged)
    return merged


def record_nodes(store: Any, snapshot: pd.DataFrame, observed_at: dt.datetime, retention_days: int | None = None) -> pd.DataFrame:
    merged = merge_snapshot(store.read(COLLECTED_NODES_TABLE, missing_ok=True), snapshot, ["node", "start"], observed_at)
    merged = drop_expired(merged, observed_at, retention_days)
    store.write(COLLECTED_NODES_TABLE, merged)
    return merged


def retention_horizon(observed_at: dt.datetime, retention_days: int | None) -> dt.datetime | None:
    """Recorded rows that ended before this time are deleted (None: kept forever)."""
    return None if retention_days is None else observed_at - dt.timedelta(days=retention_days)


def drop_expired(recorded: pd.DataFrame, observed_at: dt.datetime, retention_days: int | None) -> pd.DataFrame:
    """``recorded`` without the intervals that ended before the retention horizon.

    Rows still running are always kept. The daily ``gpu_usage`` partitions are the durable
    record: a day older than the horizon must not be re-materialized from the collector.
    """
    horizon = retention_horizon(observed_at, retention_days)
    if horizon is None or recorded.empty:
        return recorded
    end = pd.to_datetime(recorded["end"], utc=True, errors="coerce", format="ISO8601")
    expired = (end < pd.Timestamp(horizon)).to_numpy()
    return recorded[~expired].reset_index(drop=True) if expired.any() else recorded


def core_v1_api() -> Any:
    """A CoreV1Api from in-cluster config, else the kubeconfig (``KUBECONFIG``)."""
    from kubernetes import client

    def explain(exc: Exception) -> Exception:
        return RuntimeError(
            f"usage source 'kubernetes' needs cluster access: no in-cluster service account and no usable kubeconfig ({exc}); "
            "set KUBECONFIG or remove the kubernetes source from usage.sources"
        )

    load_cluster_config(explain=explain)
    return client.CoreV1Api()
