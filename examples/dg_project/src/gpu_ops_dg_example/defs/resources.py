"""The resource GPU training components need: where GPU work runs (local subprocess
workers here; KubetorchGpuCompute(namespace="ml") on a cluster). Its budget
gate reads the enforcement table of the same configuration as the cost component."""

from pathlib import Path

import dagster as dg

from gpu_ops import GpuCompute

CONFIG = Path(__file__).parent / "gpu_costs" / "gpu_ops.yaml"


@dg.definitions
def resources() -> dg.Definitions:
    return dg.Definitions(resources={"gpu_compute": GpuCompute(config_path=str(CONFIG))})
