"""Dagster objects of the alerts flow, merged into `gpu_ops.definitions:defs`.

`budget_alert_sensor`, `budget_alert_job` (one notification per run) and
`budget_enforcement_job` (one throttle/block apply or revert per run), the
`alerts_delivered` check on `gpu_budget_status` (dead-lettered alerts), plus the
`gpu_ops_karpenter` resource the enforcement op uses to reach NodePools. The `gpu_ops`
resource (the loaded configuration) comes from the shared definitions.
"""

from __future__ import annotations

import dagster as dg

from gpu_ops.dagster.alerts.sensor import Clock, KarpenterAccess, build_alert_definitions
from gpu_ops.domain.config import GpuOpsConfig


def build_defs(
    config: GpuOpsConfig, *, karpenter: KarpenterAccess | None = None, clock: Clock | None = None, bind_to: dg.Definitions | None = None
) -> dg.Definitions:
    """``clock`` (a function returning the aware UTC now) replaces the sensor's wall clock
    in tests that simulate hours or days of ticks. ``bind_to``: the definitions (resources,
    executor) the alert and enforcement jobs run with, bound before the sensor targets them."""
    return build_alert_definitions(config, karpenter=karpenter, bind_to=bind_to, **({"clock": clock} if clock else {}))
