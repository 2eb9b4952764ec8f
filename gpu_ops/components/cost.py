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


class GpuCostScaffolder(Scaffolder):
    """``dg scaffold defs gpu_ops.components.GpuCostComponent NAME``: ``defs.yaml`` naming
    the project's one gpu_ops configuration (``<project root>/gpu_ops.yaml``, written with
    usage from the training ledger, the bundled price table and one budget alerting to the
    log unless it exists), so that it loads as it is and shares its storage with the
    training components."""

    def scaffold(self, request: ScaffoldRequest) -> None:
        from gpu_ops.components.scaffolding import config_ref, ensure_project_config

        if request.scaffold_format != "yaml":
            from dagster.components.component_scaffolding import scaffold_component

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
        from gpu_ops.alerts.definitions import build_defs as alerts_defs
        from gpu_ops.config import load_config
        from gpu_ops.cost.definitions import build_defs as cost_defs
        from gpu_ops.resources import shared_defs

        path = self.config_path(context)
        config = load_config(path)  # errors name the file and the field
        return with_bound_op_jobs(dg.Definitions.merge(shared_defs(config), cost_defs(config), alerts_defs(config)))


def with_bound_op_jobs(defs: dg.Definitions) -> dg.Definitions:
    """``defs`` with its op jobs (the alert and enforcement jobs) and the sensors that
    launch them already bound to ``defs``' own resources.

    Left unbound, Dagster binds them whenever the project's definitions are resolved, and
    each time its ``SensorDefinition.with_attributes`` passes ``owners=[]`` back to the
    constructor, which prints "Parameter `owners` ... is currently in beta" (a dozen times
    per ``dg launch``; no gpu_ops sensor has owners). Bound here, with the same resource
    objects the definitions carry, there is nothing left to bind and nothing to print.
    """
    op_jobs = [j for j in defs.jobs or [] if isinstance(j, dg.JobDefinition)]
    launchers = [s for s in defs.sensors or [] if s.targets and all(t.has_job_def and t.job_def in op_jobs for t in s.targets)]
    if not op_jobs:
        return defs
    repo = dg.Definitions(jobs=op_jobs, sensors=launchers, resources=defs.resources).get_repository_def()
    bound = {id(j): repo.get_job(j.name) for j in op_jobs}
    return dg.Definitions(
        assets=defs.assets,
        asset_checks=defs.asset_checks,
        schedules=defs.schedules,
        sensors=[repo.get_sensor_def(s.name) if s in launchers else s for s in defs.sensors or []],
        jobs=[bound.get(id(j), j) for j in defs.jobs or []],
        resources=defs.resources,
        executor=defs.executor,
        loggers=defs.loggers,
        metadata=defs.metadata,
    )
