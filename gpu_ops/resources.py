"""`GpuOpsSettings`: the loaded `GPU_OPS_CONFIG` file as a Dagster resource."""

from __future__ import annotations

import dagster as dg
from pydantic import Field

from gpu_ops.config import GpuOpsConfig, load_config


class GpuOpsSettings(dg.ConfigurableResource):
    """Gives assets, sensors and jobs the validated configuration (prices, budgets, channels)."""

    config_path: str | None = Field(
        default=None, description="Path of the gpu_ops YAML file; defaults to $GPU_OPS_CONFIG, then the bundled demo."
    )

    def load(self) -> GpuOpsConfig:
        return load_config(self.config_path)
