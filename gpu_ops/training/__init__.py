"""Training assets that survive preemption: `gpu_asset`, checkpoints, classification, policy, ledger.

Pure modules (no Dagster): ``classify``, ``policy``, ``interval``, ``checkpoint``,
``ledger``, ``context``, ``worker``, ``demo``. Dagster wiring: ``asset``, ``definitions``,
``demo_run``. Nothing here imports torch at module level.
"""
