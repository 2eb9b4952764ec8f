"""Stand-ins for the Kubernetes API server at the client boundary only (no API server can
run here), shared by the compute and alerts tests.

`FakeCustomObjects` implements the ``kubernetes.client.CustomObjectsApi`` methods gpu_ops
calls, with the same method names and arguments and the API server's semantics that
matter here: 404 for a resource (group/version/plural) the cluster does not serve, 409 on
create of an existing name, 404 on a missing one, RFC 7386 merge patches (415 for any
other body), ``resourceVersion`` conflicts, equality label selectors, and (when given the
CRD schemas) schema validation of every stored object, raising 422 like the server.
Every accepted patch body is recorded, so tests can assert on the exact bodies sent. It
raises real ``kubernetes.client.ApiException``s. `FakeCoreV1` and `FakeAppsV1` return real
``kubernetes.client`` model objects; deleting a pod removes it at once with grace period 0
(a pod with finalizers stays listed, marked for deletion), and a pod deleted while a
Deployment of `FakeAppsV1` still selects it comes back under a new name, as its
ReplicaSet would bring it back.
"""

from __future__ import annotations

import copy
import datetime as dt
from collections.abc import Iterable
from typing import Any

import jsonschema
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpu_ops.flows.compute.karpenter import (
    AWS_GROUP,
    AWS_VERSION,
    EC2NODECLASSES,
    KARPENTER_GROUP,
    KARPENTER_VERSION,
    NODEPOOLS,
    merge_patch,
)

# The cluster-scoped custom resources the fake cluster serves: (group, version, plural) -> kind.
RESOURCES = {
    (KARPENTER_GROUP, KARPENTER_VERSION, NODEPOOLS): "NodePool",
    (AWS_GROUP, AWS_VERSION, EC2NODECLASSES): "EC2NodeClass",
}


def _matches(labels: dict[str, str], selector: str | None) -> bool:
    """Equality-based label selector: ``a=b,c=d``."""
    for term in filter(None, (selector or "").split(",")):
        key, _, value = term.partition("=")
        if labels.get(key) != value:
            return False
    return True


def _not_found(what: str = "Not Found") -> ApiException:
    return ApiException(status=404, reason=what)


class FakeCustomObjects:
    """Cluster-scoped custom objects, keyed ``(group, plural, name)`` in ``objects``.

    ``objects``: objects the cluster already has (stored by their apiVersion and kind);
    ``schemas``: ``kind -> openAPIV3Schema`` (the ``karpenter_crds`` fixture) to validate
    every stored object against.
    """

    def __init__(self, objects: Iterable[dict[str, Any]] = (), *, schemas: dict[str, dict] | None = None):
        self.objects: dict[tuple[str, str, str], dict] = {}
        self.calls: list[tuple[str, str]] = []
        self.patches: list[tuple[str, dict[str, Any]]] = []  # (name, body) of every accepted patch
        self.schemas = schemas or {}
        self._rv = 0
        for obj in objects:
            group, plural = self._resource_of(obj)
            self._store((group, plural, obj["metadata"]["name"]), copy.deepcopy(obj))

    @property
    def nodepools(self) -> dict[str, dict]:
        """The stored NodePools by name (the objects themselves, not copies)."""
        return {n: o for (g, p, n), o in sorted(self.objects.items()) if (g, p) == (KARPENTER_GROUP, NODEPOOLS)}

    @staticmethod
    def _resource_of(obj: dict[str, Any]) -> tuple[str, str]:
        for (group, version, plural), kind in RESOURCES.items():
            if obj.get("apiVersion") == f"{group}/{version}" and obj.get("kind") == kind:
                return group, plural
        raise ValueError(f"the fake cluster serves no {obj.get('apiVersion')} {obj.get('kind')}")

    @staticmethod
    def _check(group: str, version: str, plural: str) -> str:
        kind = RESOURCES.get((group, version, plural))
        if kind is None:
            raise _not_found(f"no resource {group}/{version}/{plural}")
        return kind

    def _validate(self, obj: dict) -> None:
        schema = self.schemas.get(obj.get("kind"))
        if schema is not None:
            try:
                jsonschema.validate(obj, schema)
            except jsonschema.ValidationError as exc:
                raise ApiException(status=422, reason=f"Unprocessable Entity: {exc.message}") from None

    def _store(self, key: tuple[str, str, str], obj: dict) -> dict:
        self._validate(obj)
        self._rv += 1
        obj.setdefault("metadata", {})["resourceVersion"] = str(self._rv)
        self.objects[key] = obj
        return copy.deepcopy(obj)

    def create_cluster_custom_object(self, group: str, version: str, plural: str, body: dict, **_: Any) -> dict:
        self._check(group, version, plural)
        name = body["metadata"]["name"]
        self.calls.append(("create", name))
        if (group, plural, name) in self.objects:
            raise ApiException(status=409, reason="AlreadyExists")
        return self._store((group, plural, name), copy.deepcopy(body))

    def get_cluster_custom_object(self, group: str, version: str, plural: str, name: str, **_: Any) -> dict:
        self._check(group, version, plural)
        self.calls.append(("get", name))
        try:
            return copy.deepcopy(self.objects[(group, plural, name)])
        except KeyError:
            raise _not_found() from None

    def patch_cluster_custom_object(self, group: str, version: str, plural: str, name: str, body: Any, **_: Any) -> dict:
        self._check(group, version, plural)
        self.calls.append(("patch", name))
        key = (group, plural, name)
        if key not in self.objects:
            raise _not_found()
        if not isinstance(body, dict):
            raise ApiException(status=415, reason="only merge patches are expected")
        current = self.objects[key]
        wanted_rv = (body.get("metadata") or {}).get("resourceVersion")
        if wanted_rv is not None and wanted_rv != current["metadata"]["resourceVersion"]:
            raise ApiException(status=409, reason="Conflict")
        self.patches.append((name, copy.deepcopy(body)))
        return self._store(key, merge_patch(current, body))

    def delete_cluster_custom_object(self, group: str, version: str, plural: str, name: str, **_: Any) -> dict:
        self._check(group, version, plural)
        self.calls.append(("delete", name))
        gone = self.objects.pop((group, plural, name), None)
        if gone is None:
            raise _not_found()
        return copy.deepcopy(gone)

    def list_cluster_custom_object(self, group: str, version: str, plural: str, label_selector: str | None = None, **_: Any) -> dict:
        kind = self._check(group, version, plural)
        self.calls.append(("list", label_selector or ""))
        items = [
            copy.deepcopy(o)
            for (g, p, _n), o in sorted(self.objects.items())
            if g == group and p == plural and _matches(o["metadata"].get("labels") or {}, label_selector)
        ]
        return {"apiVersion": f"{group}/{version}", "kind": f"{kind}List", "items": items}


def _event_matches(event: client.CoreV1Event, field_selector: str | None) -> bool:
    wanted = dict(t.split("=", 1) for t in (field_selector or "").split(",") if t)
    fields = {"involvedObject.name": event.involved_object.name, "involvedObject.kind": event.involved_object.kind}
    return all(fields.get(k) == v for k, v in wanted.items())


class FakeCoreV1:
    """Pods, nodes and events as real kubernetes.client models; ``apps``: the Deployments
    whose ReplicaSets recreate a deleted pod they select."""

    def __init__(
        self, pods: list[client.V1Pod] = (), nodes: list[client.V1Node] = (), events: list[client.CoreV1Event] = (), apps: FakeAppsV1 | None = None,
    ):
        self.pods = list(pods)
        self.nodes = list(nodes)
        self.events = list(events)
        self.apps = apps
        self.deletions: list[tuple[str, str, Any]] = []  # (name, namespace, body) of every pod delete
        self._made = 0

    def delete_namespaced_pod(self, name: str, namespace: str, body: client.V1DeleteOptions | None = None, **_: Any) -> client.V1Pod:
        pod = self.read_namespaced_pod(name, namespace)
        self.deletions.append((name, namespace, body))
        grace = body.grace_period_seconds if body is not None else None
        if pod.metadata.finalizers or grace not in (0, None):  # stays listed until the finalizers or its grace are done
            pod.metadata.deletion_timestamp = pod.metadata.deletion_timestamp or dt.datetime(2026, 11, 20, tzinfo=dt.timezone.utc)
            return pod
        self.pods.remove(pod)
        if self.apps is not None and self.apps.selecting(pod):
            self._made += 1
            again = copy.deepcopy(pod)
            again.metadata.name = f"{name.rsplit('-', 1)[0]}-r{self._made}"
            self.pods.append(again)
        return pod

    def read_namespaced_pod(self, name: str, namespace: str, **_: Any) -> client.V1Pod:
        for p in self.pods:
            if p.metadata.name == name and p.metadata.namespace == namespace:
                return p
        raise _not_found()

    def list_namespaced_pod(self, namespace: str, label_selector: str | None = None, **_: Any) -> client.V1PodList:
        items = [p for p in self.pods if p.metadata.namespace == namespace and _matches(p.metadata.labels or {}, label_selector)]
        return client.V1PodList(items=items)

    def read_node(self, name: str, **_: Any) -> client.V1Node:
        for n in self.nodes:
            if n.metadata.name == name:
                return n
        raise _not_found()

    def list_namespaced_event(self, namespace: str, field_selector: str | None = None, **_: Any) -> client.CoreV1EventList:
        items = [e for e in self.events if e.metadata.namespace == namespace and _event_matches(e, field_selector)]
        return client.CoreV1EventList(items=items)

    def list_event_for_all_namespaces(self, field_selector: str | None = None, **_: Any) -> client.CoreV1EventList:
        return client.CoreV1EventList(items=[e for e in self.events if _event_matches(e, field_selector)])


class FakeAppsV1:
    """Deployments (Kubetorch services' workloads) as real V1Deployment models."""

    def __init__(self, deployments: list[client.V1Deployment] = ()):
        self.deployments = list(deployments)

    def list_namespaced_deployment(self, namespace: str, label_selector: str | None = None, **_: Any) -> client.V1DeploymentList:
        items = [d for d in self.deployments if d.metadata.namespace == namespace and _matches(d.metadata.labels or {}, label_selector)]
        return client.V1DeploymentList(items=items)

    def selecting(self, pod: client.V1Pod) -> bool:
        """Whether a Deployment here selects ``pod`` (its ReplicaSet would recreate it)."""
        labels = pod.metadata.labels or {}
        return any(
            d.metadata.namespace == pod.metadata.namespace and d.spec is not None and d.spec.selector is not None
            and all(labels.get(k) == v for k, v in (d.spec.selector.match_labels or {}).items())
            for d in self.deployments
        )

    def delete_namespaced_deployment(self, name: str, namespace: str, body: client.V1DeleteOptions | None = None, **_: Any) -> client.V1Status:
        self.delete(name, namespace)
        return client.V1Status(status="Success")

    def delete(self, name: str, namespace: str) -> None:
        """What the Kubetorch controller does on teardown, as far as the API is concerned."""
        before = len(self.deployments)
        self.deployments = [d for d in self.deployments if not (d.metadata.name == name and d.metadata.namespace == namespace)]
        if len(self.deployments) == before:
            raise _not_found()
