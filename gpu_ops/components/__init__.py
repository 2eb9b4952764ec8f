"""gpu_ops's Dagster components, listed by `dg list components` (the package registers this
module under the `dagster_dg_cli.registry_modules` entry point):

- :class:`GpuTrainingComponent`: a ``gpu_asset`` declared in YAML;
- :class:`GpuCostComponent`: the daily cost assets, checks, schedule and budget sensor
  from a gpu_ops configuration file.

`dg scaffold defs gpu_ops.components.GpuTrainingComponent NAME` (or ``GpuCostComponent``)
writes a YAML that loads as it is.
"""

from gpu_ops.components.cost import GpuCostComponent
from gpu_ops.components.training import GpuTrainingComponent

__all__ = ["GpuCostComponent", "GpuTrainingComponent"]
