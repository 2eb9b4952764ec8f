"""GPU steps are limited however they are launched: a Dagster pool, and run tags for jobs."""

from __future__ import annotations

import yaml

from gpu_ops import GPU_POOL, gpu_run_tags
from gpu_ops.definitions import defs
from gpu_ops.dagster.training.definitions import DEMO_REQUEST
from gpu_ops_tests.conftest import REPO


def test_gpu_steps_take_a_slot_of_the_gpu_pool():
    asset = defs.resolve_assets_def("train_demo_model")
    assert asset.op.pool == GPU_POOL == "gpu"


def test_the_demo_job_carries_the_tags_the_production_queue_limits():
    job = defs.resolve_job_def("train_demo_model_job")
    assert job.tags == gpu_run_tags(DEMO_REQUEST) == {"gpu-ops/gpu-launch": "true", "gpu-ops/team": "ml-platform"}
    queue = yaml.safe_load((REPO / "deploy" / "dagster.yaml").read_text())["run_coordinator"]["config"]["tag_concurrency_limits"]
    assert {limit["key"] for limit in queue} >= set(job.tags)
