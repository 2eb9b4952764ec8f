"""The exceptions of gpu_ops: every one derives from :class:`GpuOpsError`.

    try:
        ...
    except gpu_ops.GpuOpsError as exc:   # anything gpu_ops raised on purpose
        ...

Two families:

- **Plain errors** (configuration, catalog, storage, usage files, checkpoints, launches):
  ``GpuOpsError`` plus the builtin they refine (``ConfigError`` is also a ``ValueError``),
  defined next to the code that raises them and listed in :data:`PLAIN_ERRORS`. They import
  no Dagster, so training workers and the CLI raise them cheaply.
- **Step failures**: :class:`GpuOpsFailure` and its subclasses are Dagster ``Failure``\\ s
  carrying metadata, raised where gpu_ops deliberately ends a step (as dagster-dbt's
  ``DagsterDbtError`` does): :class:`TrainingFailed` (the preemption policy gave up or
  the function raised), :class:`LaunchRefused` (a budget blocks GPU launches),
  :class:`AlertDeliveryFailed` (a notification channel failed). They are defined in
  :mod:`gpu_ops._failures` and resolved here on first use, so that importing this module
  does not import Dagster.

:class:`gpu_ops.compute.backend.WorkerTerminated` is deliberately no ``GpuOpsError``: it
is the ``BaseException`` a worker's SIGTERM handler raises so that ``except Exception`` in
user code cannot swallow a preemption.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpu_ops._failures import AlertDeliveryFailed, GpuOpsFailure, LaunchRefused, TrainingFailed

__all__ = ["GpuOpsError", "GpuOpsFailure", "TrainingFailed", "LaunchRefused", "AlertDeliveryFailed", "PLAIN_ERRORS"]


class GpuOpsError(Exception):
    """Base class of every exception gpu_ops raises on purpose."""


# Where each plain error lives (module, class): one list, checked by a test.
PLAIN_ERRORS: tuple[tuple[str, str], ...] = (
    ("gpu_ops.config", "ConfigError"),
    ("gpu_ops.fastyaml", "YamlFileError"),
    ("gpu_ops.compute.catalog", "UnknownGpuType"),
    ("gpu_ops.compute.catalog", "UnknownMigProfile"),
    ("gpu_ops.compute.karpenter", "NotManagedError"),
    ("gpu_ops.compute.kubetorch_backend", "ComputeSetupError"),
    ("gpu_ops.compute.local", "LaunchError"),
    ("gpu_ops.compute.quota", "QuotaExceeded"),
    ("gpu_ops.compute.quota", "SharedSqliteLeases"),
    ("gpu_ops.training.context", "TrainingPreempted"),
    ("gpu_ops.training.worker", "TrainingFunctionError"),
    ("gpu_ops.training.checkpoint", "CheckpointError"),
    ("gpu_ops.training.attempts", "TransitionError"),
    ("gpu_ops.storage.errors", "StorageError"),
    ("gpu_ops.storage.errors", "StorageUnavailable"),
    ("gpu_ops.cost.read", "UsageSourceError"),
    ("gpu_ops.validate", "UnknownCheck"),
)

_FAILURES = {"GpuOpsFailure", "TrainingFailed", "LaunchRefused", "AlertDeliveryFailed"}


def __getattr__(name: str) -> Any:
    if name in _FAILURES:
        from gpu_ops import _failures

        return getattr(_failures, name)
    raise AttributeError(f"module 'gpu_ops.errors' has no attribute {name!r}")
