"""A ``gpu_asset`` whose Definitions lack the ``gpu_compute`` resource fails at load
time (``Definitions.validate_loadable``: what ``dg check defs`` and ``dagster dev`` run)
with a message that names ``GpuCompute`` and the line to add; Definitions that provide
it, under the default key or the asset's own ``compute_resource_key``, load and
materialize on the local backend."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from gpu_ops.dagster.compute.resource import GpuCompute, Lifecycle
from gpu_ops.dagster.training.asset import gpu_asset, gpu_op
from gpu_ops_tests.training import workloads
from gpu_ops_tests.training.test_gpu_asset import REQUEST, write_config


@pytest.fixture
def config_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("GPU_OPS_PIDFILE_DIR", str(tmp_path / "pids"))
    return write_config(tmp_path)


def training_asset(config: Path, name: str, **kw: Any) -> dg.AssetsDefinition:
    return gpu_asset(workloads.counting, name=name, request=REQUEST, params={"steps": 5}, config_path=str(config), **kw)


def load_error(defs: dg.Definitions) -> str:
    with pytest.raises(dg.DagsterInvalidDefinitionError) as raised:
        dg.Definitions.validate_loadable(defs)
    return str(raised.value)


def test_a_missing_gpu_compute_names_the_resource_and_the_fix(config_path: Path) -> None:
    message = load_error(dg.Definitions(assets=[training_asset(config_path, "finetune")]))
    assert "GpuCompute" in message
    assert "resources={'gpu_compute': gpu_ops.GpuCompute()}" in message
    assert "under key 'gpu_compute'" in message
    assert "required by op" not in message  # not Dagster's generic wording


def test_the_fix_names_the_assets_own_resource_key(config_path: Path) -> None:
    message = load_error(dg.Definitions(assets=[training_asset(config_path, "finetune", compute_resource_key="cluster")]))
    assert "resources={'cluster': gpu_ops.GpuCompute()}" in message


def test_a_gpu_compute_under_another_key_is_pointed_out(config_path: Path) -> None:
    defs = dg.Definitions(assets=[training_asset(config_path, "finetune")], resources={"my_gpus": GpuCompute()})
    message = load_error(defs)
    assert "compute_resource_key='my_gpus'" in message


def test_materialize_without_resources_gives_the_same_guidance(config_path: Path) -> None:
    with pytest.raises(dg.DagsterInvalidDefinitionError, match=r"gpu_ops\.GpuCompute\(\)"):
        dg.materialize([training_asset(config_path, "finetune")], instance=dg.DagsterInstance.ephemeral())


def materialized_metadata(result: dg.ExecuteInJobResult, node: str) -> dict[str, Any]:
    mat = result.asset_materializations_for_node(node)[-1]
    return {k: getattr(v, "value", v) for k, v in mat.metadata.items()}


@pytest.mark.parametrize("key", ["gpu_compute", "training_gpus"])
def test_definitions_with_the_resource_load_and_materialize(config_path: Path, key: str) -> None:
    # two training assets share the compute resource (no conflicting resource definitions)
    assets = [training_asset(config_path, name, compute_resource_key=key) for name in ("first_model", "second_model")]
    defs = dg.Definitions(assets=assets, resources={key: GpuCompute(lifecycle=Lifecycle(grace_period_s=5))})
    dg.Definitions.validate_loadable(defs)
    result = defs.resolve_implicit_global_asset_job_def().execute_in_process(instance=dg.DagsterInstance.ephemeral(), asset_selection=[dg.AssetKey("first_model")])
    assert result.success
    md = materialized_metadata(result, "first_model")
    assert md["attempts"] == 1 and md["final_loss"] == float(sum(range(5)))


def test_an_asset_job_over_the_training_asset_gives_the_same_guidance(config_path: Path) -> None:
    # what GpuTrainingComponent builds: the asset and a job selecting it (the job resolves
    # its resources on its own path)
    asset = training_asset(config_path, "finetune")
    message = load_error(dg.Definitions(assets=[asset], jobs=[dg.define_asset_job("finetune_job", selection=[asset])]))
    assert "resources={'gpu_compute': gpu_ops.GpuCompute()}" in message


def training_job(config: Path, compute_key: str = "gpu_compute", **job_kw: Any) -> dg.JobDefinition:
    op = gpu_op(workloads.counting, name="count_op", request=REQUEST, params={"steps": 3}, config_path=str(config), compute_resource_key=compute_key)

    @dg.job(**job_kw)
    def counting_job() -> None:
        op()

    return counting_job


def test_a_gpu_op_in_a_job_without_gpu_compute_names_the_resource_and_the_fix(config_path: Path) -> None:
    # ops carry no resources: the job itself is refused when it is built, with the same guidance
    with pytest.raises(dg.DagsterInvalidDefinitionError) as raised:
        training_job(config_path, resource_defs={"other": dg.ResourceDefinition.none_resource()})
    message = str(raised.value)
    assert "resources={'gpu_compute': gpu_ops.GpuCompute()}" in message and "gpu_op 'count_op'" in message
    assert "required by op" not in message


def test_a_gpu_op_job_in_definitions_without_gpu_compute_gives_the_same_guidance(config_path: Path) -> None:
    message = load_error(dg.Definitions(jobs=[training_job(config_path, compute_key="cluster")], resources={"my_gpus": GpuCompute()}))
    assert "resources={'cluster': gpu_ops.GpuCompute()}" in message and "compute_resource_key='my_gpus'" in message


def test_a_gpu_op_job_with_the_resource_runs(config_path: Path) -> None:
    job = training_job(config_path, resource_defs={"gpu_compute": GpuCompute()})
    result = job.execute_in_process(instance=dg.DagsterInstance.ephemeral())
    assert result.success and result.output_for_node("count_op")["final_loss"] == float(sum(range(3)))
    # a configured copy of the op keeps the guidance
    op = job.graph.node_defs[0]
    configured = op.configured({"params": {"steps": 2}}, name="count_two")
    assert type(configured) is type(op) and configured.gpu_compute_key == "gpu_compute"


def test_the_handover_prints_no_beta_warning_per_asset(config_path: Path) -> None:
    # asset-level resource_defs is a beta parameter of dg.asset: gpu_ops's choice, so its
    # warning is not shown to the author (once per asset, at every code-location load)
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        training_asset(config_path, "quiet")
    assert [str(w.message) for w in caught if "resource_defs" in str(w.message)] == []
