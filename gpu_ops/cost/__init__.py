"""The cost flow: every GPU-second priced, attributed, held against budgets, turned into ROI.

Pure modules (pandas/numpy/pyarrow, no Dagster): ``pricing`` (price matrix), ``usage``
(sources and validation), ``kubernetes`` (pod and node collector), ``attribution``
(day split, idle, grouping), ``budgets``, ``roi``, ``pipeline`` (the flow end to end);
``sources`` (which sources a configuration names) needs none of them.
Dagster wiring lives in ``assets`` and ``definitions`` only; ``cli`` is `gpu-ops cost`.
Nothing is imported here so that `gpu-ops cost` stays fast.
"""
