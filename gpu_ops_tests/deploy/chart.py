"""Rendering helpers for the deploy tests: the chart rendered offline with helm-python
(Helm v4's own template engine and schema validation), parsed into objects."""

from __future__ import annotations

import copy
import json
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from gpu_ops_tests.conftest import REPO

CHART = REPO / "helm" / "gpu-ops"
EXAMPLES = CHART / "examples"
RELEASE = "gpu-ops"
NAMESPACE = "dagster"
# The Kubernetes version core objects are validated against (kubernetes-validate, offline).
K8S_VERSION = "1.33.0"

NODEPOOLS_OFF: dict[str, Any] = {"karpenter": {"nodePools": {"enabled": False}}}


def two_gpu_pools() -> dict[str, Any]:
    return yaml.safe_load((EXAMPLES / "two-gpu-pools.yaml").read_text())


VALUE_SETS = {
    "default": lambda: {},
    "nodepools-off": lambda: copy.deepcopy(NODEPOOLS_OFF),
    "two-gpu-pools": two_gpu_pools,
}


@lru_cache(maxsize=8)
def _render_cached(values_json: str) -> tuple[tuple[str, str], ...]:
    import helm_python as helm

    with helm.Chart.load(CHART) as chart:
        out = chart.render(values=json.loads(values_json), name=RELEASE, namespace=NAMESPACE, is_install=True)
    return tuple(sorted(out.items()))


def render(values: dict[str, Any] | None = None) -> dict[str, str]:
    """Template path -> rendered text."""
    return dict(_render_cached(json.dumps(values or {}, sort_keys=True)))


def objects(values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Every Kubernetes object the chart renders (NOTES.txt excluded)."""
    out = []
    for path, text in render(values).items():
        if path.endswith("NOTES.txt"):
            continue
        for doc in yaml.safe_load_all(text):
            if doc:
                doc.setdefault("metadata", {}).setdefault("annotations", {})
                doc["metadata"]["annotations"].setdefault("gpu-ops.test/template", path)
                out.append(doc)
    return out


def by_kind(objs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objs if o["kind"] == kind]


TRAINING_WORKER = "training-worker"


def is_training_worker(obj: dict[str, Any]) -> bool:
    """Objects for the training workers' identity (their own ServiceAccount and RBAC)."""
    return obj["metadata"].get("labels", {}).get("app.kubernetes.io/component") == TRAINING_WORKER


def code_server_objects(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o for o in objs if not is_training_worker(o)]


def one(objs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = by_kind(objs, kind)
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


def container_env(deployment: dict[str, Any]) -> dict[str, dict[str, Any]]:
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e for e in container["env"]}


def container_context(deployment: dict[str, Any]) -> dict[str, Any]:
    return json.loads(container_env(deployment)["DAGSTER_CONTAINER_CONTEXT"]["value"])


def write_config(objs: list[dict[str, Any]], folder: Path) -> Path:
    """Write the rendered GPU_OPS_CONFIG file where the pod would read it."""
    cm = one(objs, "ConfigMap")
    path = folder / "gpu_ops.yaml"
    path.write_text(cm["data"]["gpu_ops.yaml"])
    return path
