"""Dagster assets that launch through `GpuCompute` (imported by test_resource.py)."""


import dagster as dg

from gpu_ops.domain.compute.request import Attribution, GpuRequest
from gpu_ops.dagster.compute.resource import GpuCompute
from gpu_ops_tests.compute import worker_fns

REQUEST = GpuRequest(gpu_type="t4", gpus=0, labels=Attribution(team="nlp", project="demo"))


@dg.asset
def summed(context: dg.AssetExecutionContext, gpu_compute: GpuCompute) -> dict:
    report = gpu_compute.launch(context, REQUEST, worker_fns.add, args=(2, 3), env={"GPU_OPS_TEST_VALUE": "v"})
    assert report.ok, report.error_message
    context.add_output_metadata({"workers": len(report.ranks)})
    return report.value


@dg.asset
def crashing(context: dg.AssetExecutionContext, gpu_compute: GpuCompute) -> None:
    report = gpu_compute.launch(context, REQUEST, worker_fns.crash, args=("bad batch",))
    raise dg.Failure(description=f"training failed: {report.exit.value}: {report.error_message}")
