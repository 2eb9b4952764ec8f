"""The reference code location: `workspace.yaml` loads `gpu_ops.definitions:defs`.

Configuration is validated here, at load time, so a broken file shows up in the UI as a
load error naming file and field, never at 3 a.m. inside a run. Importing this module
must not import torch or kubetorch, nor pandas, numpy, SQLAlchemy, httpx or kubernetes:
the flows import those where they run (checked by tests and by benchmarks/load.py).
"""

from __future__ import annotations

import dagster as dg

from gpu_ops.alerts.definitions import build_defs as alerts_defs
from gpu_ops.compute.definitions import build_defs as compute_defs
from gpu_ops.config import GpuOpsConfig, SecretRef, load_config
from gpu_ops.cost.definitions import build_defs as cost_defs
from gpu_ops.resources import GpuOpsSettings
from gpu_ops.storage.io_manager import TableIOManager
from gpu_ops.training.definitions import build_defs as training_defs


def storage_io_manager(config: GpuOpsConfig) -> TableIOManager:
    """The IO manager on ``storage``, holding no secret: a password stays ``{env: NAME}``
    (or the whole URL a ``dg.EnvVar``) until a table is read or written, so Dagster's run
    snapshots and event logs never see it."""
    storage = config.storage
    url = storage.url_template()
    return TableIOManager(
        url=dg.EnvVar(url.env) if isinstance(url, SecretRef) else url,
        connect_timeout_s=storage.connect_timeout_s,
        statement_timeout_s=storage.statement_timeout_s,
        row_level_path=storage.row_level_path,
    )


def build_defs(config_path: str | None = None) -> dg.Definitions:
    config = load_config(config_path)
    shared = dg.Definitions(
        resources={
            "gpu_ops": GpuOpsSettings(config_path=str(config.source_path) if config.source_path else None),
            "table_io_manager": storage_io_manager(config),
        }
    )
    return dg.Definitions.merge(
        shared,
        compute_defs(config),
        training_defs(config),
        cost_defs(config),
        alerts_defs(config),
    )


defs = build_defs()
