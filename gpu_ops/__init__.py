"""gpu_ops: GPU training as Dagster assets, with the GPU bill visible and under control.

    from gpu_ops import GpuCompute, GpuRequest, gpu_asset, TrainingContext

Names resolve lazily so that ``import gpu_ops`` stays cheap and never imports torch or
kubetorch; each comes from the module that owns it.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS: dict[str, str] = {
    # configuration and storage
    "GpuOpsConfig": "gpu_ops.config",
    "ConfigError": "gpu_ops.config",
    "load_config": "gpu_ops.config",
    "GpuOpsSettings": "gpu_ops.resources",
    "TableIOManager": "gpu_ops.storage.io_manager",
    "TableStore": "gpu_ops.storage.tables",
    # compute
    "GpuRequest": "gpu_ops.compute.request",
    "Attribution": "gpu_ops.compute.request",
    "UnknownGpuType": "gpu_ops.compute.catalog",
    "canonical_gpu_type": "gpu_ops.compute.catalog",
    "WorkerExit": "gpu_ops.compute.backend",
    "WorkerReport": "gpu_ops.compute.backend",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'gpu_ops' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
