"""Where GPU work runs.

- ``catalog``, ``request``, ``naming``: pure data and names (GPU catalog, ``GpuRequest``,
  object names and labels);
- ``backend``: the contract (``WorkerReport``, ``WorkerExit``) with the training layer;
- ``local`` (+ ``worker``, ``distributed``): subprocess workers on this machine;
- ``kubetorch_backend``: Kubetorch on Karpenter nodes; ``karpenter``: NodePools;
  ``kube``: loading the cluster's client configuration, API calls that tolerate a status
  (shared with the alerts and cost flows);
- ``resource``: the ``GpuCompute`` Dagster resource; ``orphans`` and ``definitions``:
  the orphan cleanup sensor; ``cli``: ``gpu-ops plan``; ``checks``: ``gpu-ops validate``.

Nothing here imports torch or kubetorch at module level.
"""
