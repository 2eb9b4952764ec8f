"""The reference code location: `workspace.yaml` loads `gpu_ops.definitions:defs`.

``defs`` is :func:`gpu_ops.dagster.location.build_defs` on ``$GPU_OPS_CONFIG``, else on the plain
defaults (said once, with where their tables are); `make dev` names the demo's file. Code
that builds the definitions of a configuration it names imports ``gpu_ops.dagster.location``.
"""

from __future__ import annotations

from gpu_ops.dagster.location import build_defs

defs = build_defs()
