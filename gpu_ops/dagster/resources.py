"""`GpuOpsSettings`: the loaded `GPU_OPS_CONFIG` file as a Dagster resource; `shared_defs`:
the resources every flow uses (the reference code location and the components), and
`bound_jobs`, op jobs bound to them before a sensor targets them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import dagster as dg
from pydantic import Field

from gpu_ops.domain.config import GpuOpsConfig, SecretRef, StorageConfig, load_config
from gpu_ops.dagster.io_manager import TableIOManager


class GpuOpsSettings(dg.ConfigurableResource):
    """Gives assets, sensors and jobs the validated configuration (prices, budgets, channels)."""

    config_path: str | None = Field(
        default=None, description="Path of the gpu_ops YAML file; defaults to $GPU_OPS_CONFIG, then the plain defaults."
    )

    def load(self) -> GpuOpsConfig:
        return load_config(self.config_path)


def storage_io_manager(storage: StorageConfig) -> TableIOManager:
    """The IO manager on ``storage``, holding no secret: a password stays ``{env: NAME}``
    (or the whole URL a ``dg.EnvVar``) until a table is read or written, so Dagster's run
    snapshots and event logs never see it."""
    url = storage.url_template()
    return TableIOManager(
        url=dg.EnvVar(url.env) if isinstance(url, SecretRef) else url,
        connect_timeout_s=storage.connect_timeout_s,
        statement_timeout_s=storage.statement_timeout_s,
        row_level_path=storage.row_level_path,
    )


def shared_defs(config: GpuOpsConfig) -> dg.Definitions:
    """``gpu_ops`` (the configuration, reloaded by path in runs) and ``table_io_manager``."""
    return dg.Definitions(
        resources={
            "gpu_ops": GpuOpsSettings(config_path=str(config.source_path) if config.source_path else None),
            "table_io_manager": storage_io_manager(config.storage),
        }
    )


def bound_jobs(jobs: list[dg.JobDefinition], to: dg.Definitions, resources: Mapping[str, Any] | None = None) -> list[dg.JobDefinition]:
    """``jobs`` bound to the resources (with ``resources``), executor and loggers of ``to``,
    as Dagster binds them when the definitions resolve.

    A sensor that targets op jobs Dagster still has to bind is re-created by Dagster through
    ``SensorDefinition.with_attributes``, which passes ``owners=[]`` back to the constructor
    and prints "Parameter `owners` ... is currently in beta" (Dagster 1.13; no gpu_ops sensor
    has owners). A sensor built on bound jobs is left as it is: nothing is printed.
    """
    repo = dg.Definitions(jobs=jobs, resources={**(to.resources or {}), **(resources or {})}, executor=to.executor, loggers=to.loggers)
    return [repo.resolve_job_def(j.name) for j in jobs]
