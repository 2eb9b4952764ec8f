"""``GpuCostComponent``: the GPU cost flow declared in YAML.

    type: gpu_ops.components.GpuCostComponent
    attributes:
      config_file: gpu_ops.yaml      # sources, prices, budgets, channels (the GPU_OPS_CONFIG format)

It builds what the reference code location has for cost: the daily assets
``gpu_usage`` (+ ``gpu_usage_quarantine``), ``gpu_cost_attribution``,
``gpu_budget_status``, ``gpu_roi_report`` with their checks, ``daily_gpu_cost_schedule``,
``budget_alert_sensor`` with its alert and enforcement jobs, and the resources they use
(``gpu_ops``, ``table_io_manager``). Relative paths in the configuration file resolve
against that file's folder, as everywhere in gpu_ops.
"""

from __future__ import annotations

from pathlib import Path

import dagster as dg
from dagster.components import Scaffolder, ScaffoldRequest
from dagster.components.component_scaffolding import scaffold_component

from gpu_ops.domain.config import load_config


class GpuCostScaffolder(Scaffolder):
    """``dg scaffold defs gpu_ops.components.GpuCostComponent NAME``: ``defs.yaml`` naming
    the project's one gpu_ops configuration (``<project root>/gpu_ops.yaml``, written with
    usage from the training ledger, the bundled price table and one budget alerting to the
    log unless it exists), so that it loads as it is and shares its storage with the
    training components."""

    def scaffold(self, request: ScaffoldRequest) -> None:
        from gpu_ops.components.scaffolding import config_ref, ensure_project_config

        if request.scaffold_format != "yaml":
            scaffold_component(request, {"config_file": config_ref(request)})
            ensure_project_config(request)
            return
        request.target_path.mkdir(parents=True, exist_ok=True)
        (request.target_path / "defs.yaml").write_text(COST_TEMPLATE.format(type=request.type_name, config_file=config_ref(request)))
        ensure_project_config(request)


COST_TEMPLATE = """\
type: {type}
attributes:
  # The gpu_ops configuration: usage sources, prices, budgets, channels, storage. The
  # project's one file by default, which the training components and gpu_compute also read.
  config_file: "{config_file}"
"""


@dg.scaffold_with(GpuCostScaffolder)
class GpuCostComponent(dg.Component, dg.Resolvable, dg.Model):
    """Daily GPU cost assets (usage, attribution, budget status, ROI) with their checks,
    the daily schedule and the budget alert sensor, from a gpu_ops configuration file."""

    config_file: str = "gpu_ops.yaml"

    def config_path(self, context: dg.ComponentLoadContext) -> Path:
        p = Path(self.config_file).expanduser()
        return p if p.is_absolute() else Path(context.path) / p

    def build_defs(self, context: dg.ComponentLoadContext) -> dg.Definitions:
        from gpu_ops.dagster.alerts.definitions import build_defs as alerts_defs
        from gpu_ops.dagster.cost.definitions import build_defs as cost_defs
        from gpu_ops.dagster.resources import shared_defs

        path = self.config_path(context)
        config = load_config(path)  # errors name the file and the field
        shared = shared_defs(config)
        return dg.Definitions.merge(shared, cost_defs(config), alerts_defs(config, bind_to=shared))

