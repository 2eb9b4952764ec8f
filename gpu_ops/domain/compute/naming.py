"""Names and labels of everything a launch creates. Pure: no Dagster, no Kubernetes client.

Every object gets ``gpu-ops.io/managed-by: gpu-ops`` plus the Dagster run id, the asset
key and the attribution labels, so cost can be attributed per team and the orphan sensor
can find what a finished run left behind.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable

from gpu_ops.domain.compute.request import GpuRequest

MANAGED_BY = "gpu-ops.io/managed-by"
MANAGED_BY_VALUE = "gpu-ops"
RUN_ID = "gpu-ops.io/run-id"
ASSET_KEY = "gpu-ops.io/asset-key"
ATTEMPT = "gpu-ops.io/attempt"
GPU_TYPE = "gpu-ops.io/gpu-type"
CAPACITY = "gpu-ops.io/capacity"
TEAM = "gpu-ops.io/team"
GPU_RESOURCE = "nvidia.com/gpu"  # the extended resource of an NVIDIA GPU (device plugin)
# Kubetorch keeps the user-visible name under 40 characters (it adds suffixes).
MAX_SERVICE_NAME = 40


def dns_label(text: str, max_len: int = 63) -> str:
    """Lower-case RFC 1123 label: ``Train/Demo_Model`` -> ``train-demo-model``."""
    out = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")
    out = re.sub(r"-{2,}", "-", out)
    return out[:max_len].rstrip("-") or "x"


def label_value(text: str) -> str:
    """A valid label value (<= 63, alphanumerics, ``-_.``, alphanumeric at both ends)."""
    out = re.sub(r"[^A-Za-z0-9_.-]+", "-", text)
    if len(out) > 63:  # keep it unique: a digest of the whole value at the end
        digest = hashlib.sha1(text.encode()).hexdigest()[:8]
        out = f"{out[:54]}-{digest}"
    return out.strip("-_.")


def asset_key_label(asset_key: str | list[str] | tuple[str, ...] | None) -> str:
    if asset_key is None:
        return ""
    parts = [asset_key] if isinstance(asset_key, str) else list(asset_key)
    return label_value(".".join(parts))


def launch_name(run_id: str | None, asset_key: str | list[str] | tuple[str, ...] | None, attempt: int = 0) -> str:
    """``train-demo-model-1a2b3c4d-0``: asset, first 8 of the run id, attempt; <= 40 chars."""
    asset = dns_label(asset_key if isinstance(asset_key, str) else "-".join(asset_key or ["launch"]))
    run = dns_label(run_id or "norun")[:8]
    suffix = f"-{run}-{attempt}"
    asset = asset[: MAX_SERVICE_NAME - len(suffix)].rstrip("-")
    if not asset or not asset[0].isalpha():  # DNS-1035: must start with a letter
        asset = ("g" + asset)[: MAX_SERVICE_NAME - len(suffix)].rstrip("-")
    return f"{asset}{suffix}"


def launch_labels(
    run_id: str | None,
    asset_key: str | list[str] | tuple[str, ...] | None,
    request: GpuRequest,
    attempt: int = 0,
) -> dict[str, str]:
    labels = {
        MANAGED_BY: MANAGED_BY_VALUE,
        GPU_TYPE: request.gpu_type,
        CAPACITY: request.capacity,
        ATTEMPT: str(attempt),
        **request.labels.as_labels(),
    }
    if run_id:
        labels[RUN_ID] = label_value(run_id)
    if asset_key:
        labels[ASSET_KEY] = asset_key_label(asset_key)
    return {k: v for k, v in labels.items() if v}


def managed_selector(labels: Iterable[tuple[str, str]] = ()) -> str:
    """Label selector of gpu_ops objects (``gpu-ops.io/managed-by=gpu-ops``) that also
    carry each ``(label, value)`` of ``labels``, in that order."""
    return ",".join(f"{label}={value}" for label, value in [(MANAGED_BY, MANAGED_BY_VALUE), *labels])
