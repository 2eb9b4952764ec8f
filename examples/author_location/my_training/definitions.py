"""The code location: one training asset, its job, and the `gpu_compute` resource.

    dagster dev -m my_training.definitions        # from examples/author_location
"""

import dagster as dg

from gpu_ops import Attribution, GpuCompute, GpuRequest, PreemptionPolicy, gpu_asset, gpu_run_tags
from my_training.train import finetune

REQUEST = GpuRequest(gpu_type="t4", gpus=1, cpus=2, memory="4Gi", capacity="spot-then-on-demand",
                     labels=Attribution(team="nlp", project="sentiment"))

finetuned_model = gpu_asset(
    finetune,
    name="finetuned_model",
    request=REQUEST,
    policy=PreemptionPolicy(max_preemptions=5, checkpoint_interval=1.0, backoff_s=0.5),
    params={"steps": 2000},
    group_name="training",
    kinds={"pytorch"},
)

defs = dg.Definitions(
    assets=[finetuned_model],
    # Launched as this job, runs carry the tags the run queue limits (gpu-ops/gpu-launch, gpu-ops/team).
    jobs=[dg.define_asset_job("finetune_job", selection=[finetuned_model], tags=gpu_run_tags(REQUEST))],
    # GPU work runs through this resource: local subprocess workers here; on a cluster
    # KubetorchGpuCompute(namespace="ml"), or GpuCompute.from_config(config.compute).
    resources={"gpu_compute": GpuCompute()},
)
