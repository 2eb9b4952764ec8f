"""The step failures: Dagster ``Failure`` subclasses under :class:`gpu_ops.errors.GpuOpsError`.

Raised where gpu_ops deliberately ends a step (as dagster-dbt's ``DagsterDbtError`` does):
:class:`TrainingFailed` (the preemption policy gave up or the function raised),
:class:`LaunchRefused` (a budget blocks GPU launches), :class:`AlertDeliveryFailed` (a
notification channel failed). Apart from :mod:`gpu_ops.errors` only because this module
imports Dagster and that one imports nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import dagster as dg

from gpu_ops.errors import GpuOpsError


class GpuOpsFailure(dg.Failure, GpuOpsError):
    """A step failure raised by gpu_ops: a description and metadata the UI shows.

    Unless ``allow_retries`` is given, Dagster's retry policy does not retry it: gpu_ops
    raises these after deciding that a retry would not help.
    """

    def __init__(self, description: str, metadata: Mapping[str, Any] | None = None, allow_retries: bool = False):
        super().__init__(description=description, metadata=dict(metadata or {}), allow_retries=allow_retries)


class TrainingFailed(GpuOpsFailure):
    """A training step gave up: a user error, an OOM beyond the policy's memory steps, or
    preemptions beyond ``max_preemptions``. Metadata: ``outcome``, ``reason``,
    ``decision``, ``attempts`` and the worker's ``remote_traceback``."""


class LaunchRefused(GpuOpsFailure):
    """A budget's throttle or block refused this GPU launch (metadata ``refused_by``); the
    description says which budget and how to lift it. Never retried."""


class AlertDeliveryFailed(GpuOpsFailure):
    """A budget notification could not be delivered to one or more channels. Retried by
    the alert op's retry policy unless every failure is permanent."""
