"""``GpuTrainingComponent``: a ``gpu_asset`` declared in YAML.

    type: gpu_ops.components.GpuTrainingComponent
    attributes:
      function: my_project.train.finetune        # a module-level function(ctx, **params)
      name: finetune
      request: {gpu_type: a100-80gb, gpus: 8, capacity: spot-then-on-demand, labels: {team: nlp}}
      policy: {max_preemptions: 10, checkpoint_interval: auto}
      params: {lr: 0.0003}
      partitions: {type: daily, start_date: "2026-10-01"}
      group_name: training
      kinds: [pytorch]

Everything ``gpu_asset`` does comes with it: preemption-aware step retries that resume
from the newest checkpoint, the usage ledger, GPU-hours and cost in the metadata, the
``gpu`` concurrency pool. The definitions need a ``gpu_compute`` resource
(``GpuCompute``); a ``dg`` project provides it once, e.g. in ``defs/resources.py``.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any, Literal

import dagster as dg
from dagster.components import Scaffolder, ScaffoldRequest
from dagster.components.component_scaffolding import scaffold_component
from pydantic import ValidationError

from gpu_ops.domain.compute.request import GpuRequest
from gpu_ops.domain.config import ConfigError


class PartitionsSpec(dg.Model):
    """Time or static partitions of the training asset (each partition trains separately)."""

    type: Literal["hourly", "daily", "weekly", "monthly", "static"]
    start_date: str | None = None
    end_date: str | None = None
    timezone: str = "UTC"
    keys: list[str] | None = None

    def build(self) -> dg.PartitionsDefinition:
        if self.type == "static":
            if not self.keys:
                raise ValueError("partitions.keys: a static partitioning needs its keys")
            return dg.StaticPartitionsDefinition(self.keys)
        if not self.start_date:
            raise ValueError(f"partitions.start_date: {self.type} partitions need a start_date")
        cls = {
            "hourly": dg.HourlyPartitionsDefinition,
            "daily": dg.DailyPartitionsDefinition,
            "weekly": dg.WeeklyPartitionsDefinition,
            "monthly": dg.MonthlyPartitionsDefinition,
        }[self.type]
        return cls(start_date=self.start_date, end_date=self.end_date, timezone=self.timezone)


def resolve_function(dotted: str) -> Any:
    """``package.module.fn`` or ``package.module:fn`` -> the function object."""
    module, sep, name = dotted.partition(":")
    if not sep:
        module, _, name = dotted.rpartition(".")
    if not module or not name:
        raise ValueError(f"function: {dotted!r} is not a dotted path such as my_project.train.finetune")
    try:
        obj: Any = importlib.import_module(module)
    except ImportError as exc:
        raise ValueError(f"function: cannot import module {module!r} ({exc})") from None
    for part in name.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            raise ValueError(f"function: module {module!r} has no attribute {name!r}")
    if not callable(obj):
        raise ValueError(f"function: {dotted!r} is not callable")
    return obj


class GpuTrainingScaffolder(Scaffolder):
    """``dg scaffold defs gpu_ops.components.GpuTrainingComponent NAME``: a working YAML
    that trains gpu_ops's bundled demo model; point ``function`` at your own."""

    def scaffold(self, request: ScaffoldRequest) -> None:
        if request.scaffold_format != "yaml":
            scaffold_component(request, {})
            return
        from gpu_ops.components.scaffolding import config_ref, ensure_gpu_compute_resource, ensure_project_config

        name = request.target_path.name.replace("-", "_")
        request.target_path.mkdir(parents=True, exist_ok=True)
        (request.target_path / "defs.yaml").write_text(TRAINING_TEMPLATE.format(type=request.type_name, name=name, config_file=config_ref(request)))
        ensure_project_config(request)  # the project's one gpu_ops.yaml, shared with the cost component
        ensure_gpu_compute_resource(request)  # defs/gpu_compute.py, unless the project has one


TRAINING_TEMPLATE = """\
type: {type}
attributes:
  # A module-level function `fn(ctx: gpu_ops.TrainingContext, **params)`; workers import it
  # by name. This one is gpu_ops's small deterministic demo model: replace it with yours.
  function: gpu_ops.flows.training.demo.train_demo
  name: {name}
  request:                      # gpu_ops.GpuRequest
    gpu_type: t4
    gpus: 1
    cpus: 2
    memory: 4Gi
    capacity: spot-then-on-demand
    labels: {{team: ml-platform, project: {name}}}
  policy:                       # gpu_ops.PreemptionPolicy
    max_preemptions: 5
    checkpoint_interval: 5      # seconds, or auto (Young/Daly)
  params: {{steps: 600}}
  group_name: training
  kinds: [pytorch]
  # partitions: {{type: daily, start_date: "2026-10-01"}}
  # The project's gpu_ops configuration (prices, ledger storage), shared with the cost component.
  config_file: "{config_file}"
"""


@dg.scaffold_with(GpuTrainingScaffolder)
class GpuTrainingComponent(dg.Component, dg.Resolvable, dg.Model):
    """A GPU training asset: a module-level training function run on the GPUs of a
    ``GpuRequest``, retried through preemptions under a ``PreemptionPolicy`` and resumed
    from its newest checkpoint (``gpu_ops.gpu_asset``). Needs the ``gpu_compute``
    resource."""

    function: str
    name: str | None = None
    request: dict[str, Any]
    policy: dict[str, Any] = {}
    params: dict[str, Any] = {}
    env: dict[str, str] = {}
    partitions: PartitionsSpec | None = None
    group_name: str | None = None
    kinds: list[str] = []
    description: str | None = None
    tags: dict[str, str] = {}
    owners: list[str] = []
    deps: list[str] = []
    checkpoint_url: str | None = None
    config_file: str | None = None
    job: bool = True

    def build_defs(self, context: dg.ComponentLoadContext) -> dg.Definitions:
        from gpu_ops.dagster.training.asset import gpu_asset, gpu_run_tags
        from gpu_ops.domain.training.policy import PreemptionPolicy

        problems: list[str] = []
        fn = _checked(problems, context, "", lambda: resolve_function(self.function))
        request = _checked(problems, context, "request.", lambda: GpuRequest.model_validate(self.request))
        policy = _checked(problems, context, "policy.", lambda: PreemptionPolicy.model_validate(self.policy))
        partitions = _checked(problems, context, "", lambda: self.partitions.build() if self.partitions else None)
        if problems:
            raise ConfigError(problems)
        config_path = str(_relative_to(context, self.config_file)) if self.config_file else None
        asset = gpu_asset(
            fn,
            name=self.name or fn.__name__,
            request=request,
            policy=policy,
            params=self.params,
            env=self.env,
            checkpoint_url=self.checkpoint_url,
            config_path=config_path,
            partitions_def=partitions,
            group_name=self.group_name,
            kinds=set(self.kinds),
            description=self.description,
            tags=self.tags or None,
            owners=self.owners or None,
            deps=[dg.AssetKey.from_user_string(d) for d in self.deps] or None,
        )
        jobs = []
        if self.job:  # launched as this job, runs carry the GPU tags the run queue limits
            jobs.append(dg.define_asset_job(f"{asset.key.to_python_identifier()}_job", selection=[asset], tags=gpu_run_tags(request)))
        return dg.Definitions(assets=[asset], jobs=jobs)


def _checked(problems: list[str], context: dg.ComponentLoadContext, prefix: str, build: Any) -> Any:
    """``build()``, or None with its problems (naming the component's file and field) recorded."""
    try:
        return build()
    except (ValueError, ValidationError) as exc:
        where = Path(context.path) / "defs.yaml"
        problems.extend(f"{where}: attributes.{prefix}{line}" for line in _lines(exc))
        return None


def _relative_to(context: dg.ComponentLoadContext, path: str) -> Path:
    p = Path(path).expanduser()
    return p if p.is_absolute() else Path(context.path) / p


def _lines(exc: Exception) -> list[str]:
    if isinstance(exc, ValidationError):
        return [f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()]
    return [str(exc)]
