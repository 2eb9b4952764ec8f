"""Stand-ins for the Kubernetes API server at the client boundary only.

`FakeCustomObjects` implements the CustomObjectsApi methods gpu_ops calls, with the API
server's semantics that matter here: 409 on create of an existing name, 404 on a missing
one, RFC 7386 merge patch, resourceVersion conflicts, equality label selectors, and (when
given the CRD schemas) schema validation of every stored object, raising 422 like the
server. It raises real `kubernetes.client.ApiException`s. `FakeCoreV1` returns real
`kubernetes.client` model objects.
"""

from __future__ import annotations

import copy
from typing import Any

import jsonschema
from kubernetes import client
from kubernetes.client.exceptions import ApiException


def merge_patch(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


def _matches(labels: dict[str, str], selector: str | None) -> bool:
    for term in filter(None, (selector or "").split(",")):
        key, _, value = term.partition("=")
        if labels.get(key) != value:
            return False
    return True


class FakeCustomObjects:
    def __init__(self, schemas: dict[str, dict] | None = None):
        self.objects: dict[tuple[str, str, str], dict] = {}  # (group, plural, name) -> object
        self.calls: list[tuple[str, str]] = []
        self.schemas = schemas or {}
        self._rv = 0

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
        name = body["metadata"]["name"]
        self.calls.append(("create", name))
        if (group, plural, name) in self.objects:
            raise ApiException(status=409, reason="AlreadyExists")
        return self._store((group, plural, name), copy.deepcopy(body))

    def get_cluster_custom_object(self, group: str, version: str, plural: str, name: str, **_: Any) -> dict:
        self.calls.append(("get", name))
        try:
            return copy.deepcopy(self.objects[(group, plural, name)])
        except KeyError:
            raise ApiException(status=404, reason="NotFound") from None

    def patch_cluster_custom_object(self, group: str, version: str, plural: str, name: str, body: dict, **_: Any) -> dict:
        self.calls.append(("patch", name))
        key = (group, plural, name)
        if key not in self.objects:
            raise ApiException(status=404, reason="NotFound")
        current = self.objects[key]
        wanted_rv = (body.get("metadata") or {}).get("resourceVersion")
        if wanted_rv is not None and wanted_rv != current["metadata"]["resourceVersion"]:
            raise ApiException(status=409, reason="Conflict")
        return self._store(key, merge_patch(current, body))

    def delete_cluster_custom_object(self, group: str, version: str, plural: str, name: str, **_: Any) -> dict:
        self.calls.append(("delete", name))
        if self.objects.pop((group, plural, name), None) is None:
            raise ApiException(status=404, reason="NotFound")
        return {"status": "Success"}

    def list_cluster_custom_object(self, group: str, version: str, plural: str, label_selector: str | None = None, **_: Any) -> dict:
        self.calls.append(("list", plural))
        items = [
            copy.deepcopy(o)
            for (g, p, _n), o in sorted(self.objects.items())
            if g == group and p == plural and _matches(o["metadata"].get("labels") or {}, label_selector)
        ]
        return {"apiVersion": f"{group}/{version}", "kind": "List", "items": items}

    # namespaced objects (Kubetorch services' workloads) share the same store
    def list_namespaced_custom_object(self, group: str, version: str, namespace: str, plural: str, label_selector: str | None = None, **_: Any) -> dict:
        return self.list_cluster_custom_object(group, version, plural, label_selector=label_selector)


class FakeCoreV1:
    """Pods, nodes and events as real kubernetes.client models."""

    def __init__(self, pods: list[client.V1Pod] = (), nodes: list[client.V1Node] = (), events: list[client.CoreV1Event] = ()):
        self.pods = list(pods)
        self.nodes = list(nodes)
        self.events = list(events)

    def read_namespaced_pod(self, name: str, namespace: str, **_: Any) -> client.V1Pod:
        for p in self.pods:
            if p.metadata.name == name and p.metadata.namespace == namespace:
                return p
        raise ApiException(status=404, reason="NotFound")

    def list_namespaced_pod(self, namespace: str, label_selector: str | None = None, **_: Any) -> client.V1PodList:
        items = [p for p in self.pods if p.metadata.namespace == namespace and _matches(p.metadata.labels or {}, label_selector)]
        return client.V1PodList(items=items)

    def read_node(self, name: str, **_: Any) -> client.V1Node:
        for n in self.nodes:
            if n.metadata.name == name:
                return n
        raise ApiException(status=404, reason="NotFound")

    def list_namespaced_event(self, namespace: str, field_selector: str | None = None, **_: Any) -> client.CoreV1EventList:
        wanted = dict(t.split("=", 1) for t in (field_selector or "").split(",") if t)
        items = []
        for e in self.events:
            if e.metadata.namespace != namespace:
                continue
            fields = {"involvedObject.name": e.involved_object.name, "involvedObject.kind": e.involved_object.kind}
            if all(fields.get(k) == v for k, v in wanted.items()):
                items.append(e)
        return client.CoreV1EventList(items=items)

    def list_event_for_all_namespaces(self, field_selector: str | None = None, **_: Any) -> client.CoreV1EventList:
        wanted = dict(t.split("=", 1) for t in (field_selector or "").split(",") if t)
        items = [e for e in self.events if all({"involvedObject.name": e.involved_object.name, "involvedObject.kind": e.involved_object.kind}.get(k) == v for k, v in wanted.items())]
        return client.CoreV1EventList(items=items)


class FakeAppsV1:
    """Deployments (Kubetorch services' workloads) as real V1Deployment models."""

    def __init__(self, deployments: list[client.V1Deployment] = ()):
        self.deployments = list(deployments)

    def list_namespaced_deployment(self, namespace: str, label_selector: str | None = None, **_: Any) -> client.V1DeploymentList:
        items = [d for d in self.deployments if d.metadata.namespace == namespace and _matches(d.metadata.labels or {}, label_selector)]
        return client.V1DeploymentList(items=items)

    def delete(self, name: str, namespace: str) -> None:
        """What the Kubetorch controller does on teardown, as far as the API is concerned."""
        before = len(self.deployments)
        self.deployments = [d for d in self.deployments if not (d.metadata.name == name and d.metadata.namespace == namespace)]
        if len(self.deployments) == before:
            raise ApiException(status=404, reason="NotFound")
