"""Dagster objects of the cost flow, merged into `gpu_ops.definitions:defs`."""

from __future__ import annotations

import dagster as dg

from gpu_ops.config import GpuOpsConfig


def build_defs(config: GpuOpsConfig) -> dg.Definitions:
    return dg.Definitions()
