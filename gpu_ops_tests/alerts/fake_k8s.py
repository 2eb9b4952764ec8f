"""An in-memory ``CustomObjectsApi`` for cluster-scoped NodePools.

No API server can run here, so the client boundary is tested against this: the same
method names and arguments as ``kubernetes.client.CustomObjectsApi``, real
``kubernetes.client.exceptions.ApiException`` errors, label selectors, RFC 7386 merge
patches, and ``resourceVersion`` conflicts, as the API server applies them. Every patch
is recorded so tests can assert on the exact bodies sent.
"""

from __future__ import annotations

import copy
from typing import Any

from kubernetes.client.exceptions import ApiException

from gpu_ops.alerts.enforcement import merge_patch


class FakeCustomObjectsApi:
    def __init__(self, objects: list[dict[str, Any]] | None = None):
        self.objects: dict[str, dict[str, Any]] = {}
        self.patches: list[tuple[str, dict[str, Any]]] = []
        self.calls: list[str] = []
        self._version = 100
        for obj in objects or []:
            self._store(copy.deepcopy(obj))

    def _store(self, obj: dict[str, Any]) -> None:
        self._version += 1
        obj.setdefault("metadata", {})["resourceVersion"] = str(self._version)
        self.objects[obj["metadata"]["name"]] = obj

    @staticmethod
    def _check(group: str, version: str, plural: str) -> None:
        if (group, version, plural) != ("karpenter.sh", "v1", "nodepools"):
            raise ApiException(status=404, reason=f"no resource {group}/{version}/{plural}")

    def list_cluster_custom_object(self, group: str, version: str, plural: str, label_selector: str = "", **_: Any) -> dict[str, Any]:
        self._check(group, version, plural)
        self.calls.append(f"list {label_selector}")
        want = dict(p.split("=", 1) for p in label_selector.split(",") if p)
        items = [copy.deepcopy(o) for o in self.objects.values() if all((o["metadata"].get("labels") or {}).get(k) == v for k, v in want.items())]
        return {"apiVersion": "karpenter.sh/v1", "kind": "NodePoolList", "items": items}

    def get_cluster_custom_object(self, group: str, version: str, plural: str, name: str, **_: Any) -> dict[str, Any]:
        self._check(group, version, plural)
        if name not in self.objects:
            raise ApiException(status=404, reason="Not Found")
        return copy.deepcopy(self.objects[name])

    def patch_cluster_custom_object(self, group: str, version: str, plural: str, name: str, body: Any, **_: Any) -> dict[str, Any]:
        self._check(group, version, plural)
        if name not in self.objects:
            raise ApiException(status=404, reason="Not Found")
        if not isinstance(body, dict):
            raise ApiException(status=415, reason="only merge patches are expected")
        current = self.objects[name]
        rv = (body.get("metadata") or {}).get("resourceVersion")
        if rv is not None and rv != current["metadata"]["resourceVersion"]:
            raise ApiException(status=409, reason="Conflict")
        self.patches.append((name, copy.deepcopy(body)))
        updated = merge_patch(current, body)
        self._store(updated)
        return copy.deepcopy(updated)

    def create_cluster_custom_object(self, group: str, version: str, plural: str, body: dict[str, Any], **_: Any) -> dict[str, Any]:
        self._check(group, version, plural)
        if body["metadata"]["name"] in self.objects:
            raise ApiException(status=409, reason="AlreadyExists")
        self._store(copy.deepcopy(body))
        return copy.deepcopy(self.objects[body["metadata"]["name"]])

    def delete_cluster_custom_object(self, group: str, version: str, plural: str, name: str, **_: Any) -> dict[str, Any]:
        self._check(group, version, plural)
        if name not in self.objects:
            raise ApiException(status=404, reason="Not Found")
        return self.objects.pop(name)
