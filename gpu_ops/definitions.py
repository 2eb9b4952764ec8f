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
from gpu_ops.config import load_config
from gpu_ops.cost.definitions import build_defs as cost_defs
from gpu_ops.resources import shared_defs
from gpu_ops.training.definitions import build_defs as training_defs
from gpu_ops.training.definitions import training_executor


def build_defs(config_path: str | None = None) -> dg.Definitions:
    config = load_config(config_path)
    return dg.Definitions.merge(
        shared_defs(config),
        compute_defs(config),
        training_defs(config),
        cost_defs(config),
        alerts_defs(config),
        # Step processes fork from a server that has Dagster and the training step's modules
        # imported: a retried training step whose process died resumes in well under a
        # second instead of a new interpreter's seconds of imports.
        dg.Definitions(executor=training_executor()),
    )


defs = build_defs()
