"""gpu_ops: GPU training as Dagster assets, with the GPU bill visible and under control.

    import dagster as dg
    from gpu_ops import GpuCompute, GpuRequest, PreemptionPolicy, TrainingContext, gpu_asset

    @gpu_asset(request=GpuRequest(gpu_type="a100-80gb", gpus=8), policy=PreemptionPolicy(max_preemptions=10))
    def finetune(ctx: TrainingContext, lr: float = 3e-4): ...

    defs = dg.Definitions(assets=[finetune], resources={"gpu_compute": GpuCompute()})

The public API is ``__all__`` below, grouped as in the README:

- **Training**: ``gpu_asset``, ``gpu_op`` (preemption-aware training assets and ops),
  ``TrainingContext`` (what the training function receives), ``PreemptionPolicy``,
  ``CheckpointStore``, ``Outcome`` (how an attempt ended), ``young_daly_interval``,
  ``GPU_POOL`` and ``gpu_run_tags`` (the concurrency pool and run tags GPU work uses).
- **Compute**: ``GpuCompute`` (the ``gpu_compute`` resource), ``GpuRequest``,
  ``Attribution``, ``WorkerReport``, ``WorkerExit``, ``WorkerTerminated``,
  ``canonical_gpu_type``.
- **Configuration and storage**: ``GpuOpsConfig``, ``load_config``, ``GpuOpsSettings``
  (the ``gpu_ops`` resource), ``TableIOManager``, ``TableStore``.
- **Cost** (pure pandas): ``PriceMatrix``, ``validate_usage``, ``attribute``,
  ``evaluate_budgets``, ``roi_report``.
- **Alerts**: ``assert_launch_allowed``, ``verify_webhook_signature``.
- **Errors** (:mod:`gpu_ops.errors`): ``GpuOpsError`` and its subclasses.

``import gpu_ops`` stays cheap: each name is imported from the module that owns it on
first use, so neither this import nor loading a code location pulls in torch,
kubetorch, pandas, SQLAlchemy or the Kubernetes client. The ``TYPE_CHECKING`` imports
below are the same names, for type checkers and IDEs.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpu_ops.dagster.failures import AlertDeliveryFailed as AlertDeliveryFailed
    from gpu_ops.dagster.failures import GpuOpsFailure as GpuOpsFailure
    from gpu_ops.dagster.failures import LaunchRefused as LaunchRefused
    from gpu_ops.dagster.failures import TrainingFailed as TrainingFailed
    from gpu_ops.dagster.compute.admission import assert_launch_allowed as assert_launch_allowed
    from gpu_ops.domain.alerts.messages import verify_webhook_signature as verify_webhook_signature
    from gpu_ops.domain.compute.backend import WorkerExit as WorkerExit
    from gpu_ops.domain.compute.backend import WorkerReport as WorkerReport
    from gpu_ops.domain.compute.backend import WorkerTerminated as WorkerTerminated
    from gpu_ops.errors import UnknownGpuType as UnknownGpuType
    from gpu_ops.domain.compute.catalog import canonical_gpu_type as canonical_gpu_type
    from gpu_ops.errors import ComputeSetupError as ComputeSetupError
    from gpu_ops.domain.compute.request import Attribution as Attribution
    from gpu_ops.domain.compute.request import GpuRequest as GpuRequest
    from gpu_ops.dagster.compute.resource import GpuCompute as GpuCompute
    from gpu_ops.dagster.compute.resource import LocalGpuCompute as LocalGpuCompute
    from gpu_ops.dagster.compute.resource import KubetorchGpuCompute as KubetorchGpuCompute
    from gpu_ops.dagster.compute.resource import Lifecycle as Lifecycle
    from gpu_ops.dagster.compute.resource import StandbySettings as StandbySettings
    from gpu_ops.dagster.compute.resource import KubetorchLaunch as KubetorchLaunch
    from gpu_ops.dagster.compute.resource import KarpenterPools as KarpenterPools
    from gpu_ops.dagster.compute.admission import GpuAdmission as GpuAdmission
    from gpu_ops.dagster.compute.admission import BudgetGate as BudgetGate
    from gpu_ops.errors import ConfigError as ConfigError
    from gpu_ops.domain.config import GpuOpsConfig as GpuOpsConfig
    from gpu_ops.domain.config import load_config as load_config
    from gpu_ops.flows.cost.attribution import attribute as attribute
    from gpu_ops.flows.cost.budgets import evaluate_budgets as evaluate_budgets
    from gpu_ops.flows.cost.pricing import PriceMatrix as PriceMatrix
    from gpu_ops.flows.cost.roi import roi_report as roi_report
    from gpu_ops.flows.cost.usage import validate_usage as validate_usage
    from gpu_ops.errors import GpuOpsError as GpuOpsError
    from gpu_ops.dagster.resources import GpuOpsSettings as GpuOpsSettings
    from gpu_ops.dagster.io_manager import TableIOManager as TableIOManager
    from gpu_ops.storage.tables import TableStore as TableStore
    from gpu_ops.dagster.training.asset import GPU_POOL as GPU_POOL
    from gpu_ops.dagster.training.asset import gpu_asset as gpu_asset
    from gpu_ops.dagster.training.asset import gpu_op as gpu_op
    from gpu_ops.dagster.training.asset import gpu_run_tags as gpu_run_tags
    from gpu_ops.flows.training.checkpoint import CheckpointStore as CheckpointStore
    from gpu_ops.domain.training.classify import Outcome as Outcome
    from gpu_ops.flows.training.context import TrainingContext as TrainingContext
    from gpu_ops.errors import TrainingPreempted as TrainingPreempted
    from gpu_ops.domain.training.interval import young_daly_interval as young_daly_interval
    from gpu_ops.domain.training.policy import PreemptionPolicy as PreemptionPolicy

# name -> the module that owns it (a test checks this agrees with the imports above).
_EXPORTS: dict[str, str] = {
    # training
    "gpu_asset": "gpu_ops.dagster.training.asset",
    "gpu_op": "gpu_ops.dagster.training.asset",
    "gpu_run_tags": "gpu_ops.dagster.training.asset",
    "GPU_POOL": "gpu_ops.dagster.training.asset",
    "TrainingContext": "gpu_ops.flows.training.context",
    "PreemptionPolicy": "gpu_ops.domain.training.policy",
    "CheckpointStore": "gpu_ops.flows.training.checkpoint",
    "Outcome": "gpu_ops.domain.training.classify",
    "young_daly_interval": "gpu_ops.domain.training.interval",
    # compute
    "GpuCompute": "gpu_ops.dagster.compute.resource",
    "LocalGpuCompute": "gpu_ops.dagster.compute.resource",
    "KubetorchGpuCompute": "gpu_ops.dagster.compute.resource",
    "Lifecycle": "gpu_ops.dagster.compute.resource",
    "StandbySettings": "gpu_ops.dagster.compute.resource",
    "KubetorchLaunch": "gpu_ops.dagster.compute.resource",
    "KarpenterPools": "gpu_ops.dagster.compute.resource",
    "GpuAdmission": "gpu_ops.dagster.compute.admission",
    "BudgetGate": "gpu_ops.dagster.compute.admission",
    "GpuRequest": "gpu_ops.domain.compute.request",
    "Attribution": "gpu_ops.domain.compute.request",
    "WorkerReport": "gpu_ops.domain.compute.backend",
    "WorkerExit": "gpu_ops.domain.compute.backend",
    "WorkerTerminated": "gpu_ops.domain.compute.backend",
    "canonical_gpu_type": "gpu_ops.domain.compute.catalog",
    # configuration and storage
    "GpuOpsConfig": "gpu_ops.domain.config",
    "load_config": "gpu_ops.domain.config",
    "GpuOpsSettings": "gpu_ops.dagster.resources",
    "TableIOManager": "gpu_ops.dagster.io_manager",
    "TableStore": "gpu_ops.storage.tables",
    # cost
    "PriceMatrix": "gpu_ops.flows.cost.pricing",
    "validate_usage": "gpu_ops.flows.cost.usage",
    "attribute": "gpu_ops.flows.cost.attribution",
    "evaluate_budgets": "gpu_ops.flows.cost.budgets",
    "roi_report": "gpu_ops.flows.cost.roi",
    # alerts
    "assert_launch_allowed": "gpu_ops.dagster.compute.admission",
    "verify_webhook_signature": "gpu_ops.domain.alerts.messages",
    # errors
    "GpuOpsError": "gpu_ops.errors",
    "GpuOpsFailure": "gpu_ops.dagster.failures",
    "TrainingFailed": "gpu_ops.dagster.failures",
    "LaunchRefused": "gpu_ops.dagster.failures",
    "AlertDeliveryFailed": "gpu_ops.dagster.failures",
    "ConfigError": "gpu_ops.errors",
    "UnknownGpuType": "gpu_ops.errors",
    "ComputeSetupError": "gpu_ops.errors",
    "TrainingPreempted": "gpu_ops.errors",
}

__all__ = [
    "GPU_POOL",
    "AlertDeliveryFailed",
    "Attribution",
    "CheckpointStore",
    "ComputeSetupError",
    "ConfigError",
    "GpuCompute",
    "LocalGpuCompute",
    "KubetorchGpuCompute",
    "Lifecycle",
    "StandbySettings",
    "KubetorchLaunch",
    "KarpenterPools",
    "GpuAdmission",
    "BudgetGate",
    "GpuOpsConfig",
    "GpuOpsError",
    "GpuOpsFailure",
    "GpuOpsSettings",
    "GpuRequest",
    "LaunchRefused",
    "Outcome",
    "PreemptionPolicy",
    "PriceMatrix",
    "TableIOManager",
    "TableStore",
    "TrainingContext",
    "TrainingFailed",
    "TrainingPreempted",
    "UnknownGpuType",
    "WorkerExit",
    "WorkerReport",
    "WorkerTerminated",
    "assert_launch_allowed",
    "attribute",
    "canonical_gpu_type",
    "evaluate_budgets",
    "gpu_asset",
    "gpu_op",
    "gpu_run_tags",
    "load_config",
    "roi_report",
    "validate_usage",
    "verify_webhook_signature",
    "young_daly_interval",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'gpu_ops' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
