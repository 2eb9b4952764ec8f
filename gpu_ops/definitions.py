"""The reference code location: `workspace.yaml` loads `gpu_ops.definitions:defs`.

``defs`` is :func:`gpu_ops.dagster.location.build_defs` on ``$GPU_OPS_CONFIG``, else on the plain
defaults (said once, with where their tables are); `make dev` names the demo's file. Code
that builds the definitions of a configuration it names imports ``gpu_ops.dagster.location``.

Once the definitions are built, what the process holds (Dagster, the code location, the
modules they import: ~130,000 objects) lives as long as the process: no collection runs
while it loads, and it is then moved out of the garbage collector's sight (``gc.freeze``,
by :mod:`gpu_ops.domain.memory`). Later full collections, and the one at interpreter
exit, no longer walk it: a `dagster job execute` of the daily cost job spent ~0.7 s
exiting before (docs/benchmarks/cost.md), and a forked step process no longer touches
(and copies) those pages when it collects. Only this entry point does so: a code location
of one's own that imports ``gpu_ops`` decides for itself.
"""

from __future__ import annotations

from gpu_ops.domain.memory import collection_deferred, freeze_long_lived

with collection_deferred():
    from gpu_ops.dagster.location import build_defs

    defs = build_defs()
freeze_long_lived()
