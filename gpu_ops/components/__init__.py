"""gpu_ops's Dagster components, listed by `dg list components` (the package registers this
module under the `dagster_dg_cli.registry_modules` entry point):

- :class:`GpuTrainingComponent`: a ``gpu_asset`` declared in YAML;
- :class:`GpuCostComponent`: the daily cost assets, checks, schedule and budget sensor
  from a gpu_ops configuration file.

`dg scaffold defs gpu_ops.components.GpuTrainingComponent NAME` (or ``GpuCostComponent``)
writes a YAML that loads as it is.
"""

import warnings

import dagster as dg

# Dagster 1.13.27's SensorDefinition.with_attributes passes `owners=[]` back to the
# constructor, which warns "Parameter `owners` ... is currently in beta" for every sensor
# each time definitions are resolved (about a dozen lines per `dg launch`), though no
# gpu_ops sensor sets owners. Only that message is silenced; other BetaWarnings still show.
warnings.filterwarnings("ignore", message=r"Parameter `owners` of initializer `SensorDefinition\.__init__`", category=dg.BetaWarning)

from gpu_ops.components.cost import GpuCostComponent  # noqa: E402
from gpu_ops.components.training import GpuTrainingComponent  # noqa: E402

__all__ = ["GpuCostComponent", "GpuTrainingComponent"]
