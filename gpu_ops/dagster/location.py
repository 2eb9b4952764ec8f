"""`build_defs`: the reference code location's definitions for one configuration.

`gpu_ops.definitions:defs` is ``build_defs()`` (``$GPU_OPS_CONFIG``, else the plain
defaults), built when that module is imported; the demo and tests build theirs from here
with the configuration they name, without building the default one first.

Configuration is validated here, at load time, so a broken file shows up in the UI as a
load error naming file and field, never at 3 a.m. inside a run. Importing this module
must not import torch or kubetorch, nor pandas, numpy, SQLAlchemy, httpx or kubernetes:
the flows import those where they run (checked by tests and by benchmarks/load.py).
"""

from __future__ import annotations

import dagster as dg

from gpu_ops.dagster.alerts.definitions import build_defs as alerts_defs
from gpu_ops.dagster.compute.definitions import build_defs as compute_defs
from gpu_ops.domain.config import load_config
from gpu_ops.dagster.cost.definitions import build_defs as cost_defs
from gpu_ops.dagster.resources import shared_defs
from gpu_ops.dagster.training.definitions import build_defs as training_defs
from gpu_ops.dagster.training.definitions import training_executor


def build_defs(config_path: str | None = None) -> dg.Definitions:
    """The reference code location on ``config_path`` (else ``$GPU_OPS_CONFIG``, else the
    plain defaults): training (``train_demo_model``), compute, cost and alerts."""
    config = load_config(config_path)
    # Step processes fork from a server that has Dagster and the training step's modules
    # imported: a retried training step whose process died resumes in well under a
    # second instead of a new interpreter's seconds of imports.
    shared = dg.Definitions.merge(shared_defs(config), dg.Definitions(executor=training_executor()))
    return dg.Definitions.merge(shared, compute_defs(config), training_defs(config), cost_defs(config), alerts_defs(config, bind_to=shared))
