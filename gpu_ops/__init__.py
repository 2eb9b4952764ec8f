"""gpu_ops: GPU training as Dagster assets, with the GPU bill visible and under control.

    from gpu_ops import GpuCompute, GpuRequest, gpu_asset, TrainingContext

Names resolve lazily so that ``import gpu_ops`` stays cheap and never imports torch or
kubetorch; each comes from the module that owns it.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS: dict[str, str] = {
    # alerts
    "assert_launch_allowed": "gpu_ops.alerts.enforcement",
    "verify_webhook_signature": "gpu_ops.alerts.messages",
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
    # cost (pure pandas; no Dagster import)
    "PriceMatrix": "gpu_ops.cost.pricing",
    "validate_usage": "gpu_ops.cost.usage",
    "price_window": "gpu_ops.cost.pipeline",
    "attribute": "gpu_ops.cost.attribution",
    "evaluate_budgets": "gpu_ops.cost.budgets",
    "roi_report": "gpu_ops.cost.roi",
    "WorkerTerminated": "gpu_ops.compute.backend",
    "GpuCompute": "gpu_ops.compute.resource",
    "LocalBackend": "gpu_ops.compute.local",
    "ComputeSetupError": "gpu_ops.compute.kubetorch_backend",
    "NodePoolClient": "gpu_ops.compute.karpenter",
    # training
    "gpu_asset": "gpu_ops.training.asset",
    "gpu_op": "gpu_ops.training.asset",
    "gpu_run_tags": "gpu_ops.training.asset",
    "GPU_POOL": "gpu_ops.training.asset",
    "TrainingContext": "gpu_ops.training.context",
    "TrainingPreempted": "gpu_ops.training.context",
    "CheckpointStore": "gpu_ops.training.checkpoint",
    "PreemptionPolicy": "gpu_ops.training.policy",
    "Outcome": "gpu_ops.training.classify",
    "Classification": "gpu_ops.training.classify",
    "classify_report": "gpu_ops.training.classify",
    "classify_pod": "gpu_ops.training.classify",
    "classify_exception": "gpu_ops.training.classify",
    "young_daly_interval": "gpu_ops.training.interval",
    "LEDGER_TABLE": "gpu_ops.training.ledger",
    "LEDGER_COLUMNS": "gpu_ops.training.ledger",
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
