"""`GpuCompute` on the local backend: real Dagster runs, real workers, cleanup per policy."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import pytest

from gpu_ops.domain.compute.backend import WorkerExit
from gpu_ops.domain.compute.naming import MAX_SERVICE_NAME, launch_labels, launch_name
from gpu_ops.dagster.compute.admission import BudgetGate
from gpu_ops.dagster.compute.resource import GpuCompute, KarpenterPools, KubetorchGpuCompute, Lifecycle, LocalGpuCompute, StandbySettings, should_clean_up
from gpu_ops_tests.compute import launch_assets, worker_fns


def _launch_dirs(root: Path) -> list[Path]:
    return sorted(p for p in root.iterdir() if p.is_dir()) if root.exists() else []


def test_materialize_launches_a_worker_and_streams_into_the_dagster_log(tmp_path: Path) -> None:
    instance = dg.DagsterInstance.ephemeral()
    result = dg.materialize(
        [launch_assets.summed],
        resources={"gpu_compute": GpuCompute(local_workdir=str(tmp_path))},
        instance=instance,
    )
    assert result.success
    assert result.output_for_node("summed")["sum"] == 5
    messages = [e.message for e in instance.all_logs(result.run_id) if e.message]
    assert "adding 2 3" in messages
    assert any(m.startswith("worker started pid=") for m in messages)
    assert _launch_dirs(tmp_path) == []  # cleanup=always removed the launch folder


@pytest.mark.parametrize(
    ("policy", "asset", "kept"),
    [
        ("always", "summed", False),
        ("always", "crashing", False),
        ("on_exception", "summed", True),
        ("on_exception", "crashing", False),
        ("never", "crashing", True),
    ],
)
def test_cleanup_policy(tmp_path: Path, policy: str, asset: str, kept: bool) -> None:
    result = dg.materialize(
        [getattr(launch_assets, asset)],
        resources={"gpu_compute": LocalGpuCompute(local_workdir=str(tmp_path), lifecycle=Lifecycle(cleanup=policy))},
        raise_on_error=False,
    )
    assert result.success is (asset == "summed")
    dirs = _launch_dirs(tmp_path)
    assert bool(dirs) is kept
    if kept:  # named from the asset key and run id
        assert dirs[0].name.startswith(f"gpu-ops-{asset}-{result.run_id[:8]}-0-")
        assert (dirs[0] / "payload.pkl").exists()


@pytest.mark.parametrize(("policy", "kept"), [("always", False), ("on_exception", False), ("never", True)])
def test_interrupt_stops_workers_and_cleans_up_per_policy(tmp_path: Path, policy: str, kept: bool) -> None:
    compute = LocalGpuCompute(local_workdir=str(tmp_path), lifecycle=Lifecycle(cleanup=policy, grace_period_s=2))
    pids: list[int] = []

    def interrupt_on_output(line: str) -> None:
        if line == "sleeping":
            raise KeyboardInterrupt  # what a terminated Dagster run raises in the step

    with dg.build_asset_context() as context:
        with pytest.raises(KeyboardInterrupt):
            compute.launch(context, launch_assets.REQUEST, worker_fns.sleep_forever, log=interrupt_on_output, on_start=pids.extend)
    assert pids and not any(Path(f"/proc/{p}").exists() and "Z" not in Path(f"/proc/{p}/stat").read_text().split()[2] for p in pids)
    assert bool(_launch_dirs(tmp_path)) is kept


def test_launch_reports_worker_failure_without_raising(tmp_path: Path) -> None:
    compute = GpuCompute(local_workdir=str(tmp_path))
    with dg.build_asset_context() as context:
        report = compute.launch(context, launch_assets.REQUEST, worker_fns.run_out_of_memory, log=lambda _l: None)
    assert report.exit is WorkerExit.OOM


def test_gpus_zero_hides_the_machines_gpus(tmp_path: Path) -> None:
    compute = GpuCompute(local_workdir=str(tmp_path))
    with dg.build_asset_context() as context:
        report = compute.launch(context, launch_assets.REQUEST, worker_fns.getenv, args=("CUDA_VISIBLE_DEVICES",), log=lambda _l: None)
    assert report.ok and report.value == ""


def test_should_clean_up_rejects_unknown_policy() -> None:
    assert should_clean_up("always", False) and should_clean_up("on_exception", True)
    assert not should_clean_up("on_exception", False) and not should_clean_up("never", True)
    with pytest.raises(ValueError, match="cleanup: unknown policy 'sometimes'"):
        should_clean_up("sometimes", True)


def test_names_and_labels_fit_kubernetes() -> None:
    name = launch_name("0f3a9c2e-1111-2222-3333-444455556666", ["Team", "A_very_long_asset_name_that_goes_on_and_on"], 12)
    assert len(name) <= MAX_SERVICE_NAME and name[0].isalpha() and name.endswith("-0f3a9c2e-12")
    assert launch_name(None, ["9lives"], 0).startswith("g9lives")
    labels = launch_labels("0f3a9c2e-1111", ["nlp", "train"], launch_assets.REQUEST, 1)
    assert labels == {
        "gpu-ops.io/managed-by": "gpu-ops",
        "gpu-ops.io/gpu-type": "t4",
        "gpu-ops.io/capacity": "spot-then-on-demand",
        "gpu-ops.io/attempt": "1",
        "gpu-ops.io/team": "nlp",
        "gpu-ops.io/project": "demo",
        "gpu-ops.io/run-id": "0f3a9c2e-1111",
        "gpu-ops.io/asset-key": "nlp.train",
    }


# ---------------------------------------------------------------------- kubetorch backend policy


@pytest.fixture
def cluster_boundary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, karpenter_crds: dict):
    """No credentials (so Kubetorch refuses to deploy) and a stand-in API server for NodePools."""
    from gpu_ops.flows.compute import kubetorch_backend
    from gpu_ops_tests.fake_k8s import FakeCoreV1, FakeCustomObjects

    if Path("/var/run/secrets/kubernetes.io/serviceaccount/token").exists():
        pytest.skip("running inside a cluster: credentials exist")
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "absent-kubeconfig"))
    custom = FakeCustomObjects(schemas=karpenter_crds)
    monkeypatch.setattr(kubetorch_backend, "_kube_clients", lambda _path: (FakeCoreV1(), custom))
    return custom


@pytest.mark.parametrize(("policy", "kept"), [("always", False), ("on_exception", False), ("never", True)])
def test_kubetorch_setup_failure_cleans_up_run_pools_per_policy(cluster_boundary, policy: str, kept: bool) -> None:
    from gpu_ops.flows.compute.kubetorch_backend import ComputeSetupError

    compute = KubetorchGpuCompute(namespace="ml", lifecycle=Lifecycle(cleanup=policy), karpenter=KarpenterPools(pool_scope="run"))
    request = launch_assets.REQUEST.model_copy(update={"gpus": 1})
    lines: list[str] = []
    with dg.build_asset_context() as context:
        with pytest.raises(ComputeSetupError, match="no Kubernetes credentials"):
            compute.launch(context, request, worker_fns.add, args=(1, 2), log=lines.append)
    assert any(line.startswith("NodePool gpu-ops-nlp-t4-") and line.endswith(" created") for line in lines)
    assert bool(cluster_boundary.objects) is kept


def test_kubetorch_team_pools_are_shared_and_kept(cluster_boundary) -> None:
    from gpu_ops.flows.compute.kubetorch_backend import ComputeSetupError

    compute = KubetorchGpuCompute(namespace="ml", lifecycle=Lifecycle(cleanup="always"))
    with dg.build_asset_context() as context:
        with pytest.raises(ComputeSetupError):
            compute.launch(context, launch_assets.REQUEST.model_copy(update={"gpus": 1}), worker_fns.add, args=(1, 2), log=lambda _l: None)
    assert sorted(n for (_g, _p, n) in cluster_boundary.objects) == ["gpu-ops-nlp-t4-on-demand", "gpu-ops-nlp-t4-spot"]


def test_a_budget_block_refuses_the_launch_before_anything_starts(tmp_path: Path) -> None:
    import datetime as dt

    import yaml

    from gpu_ops.flows.alerts.enforcement import ENFORCEMENT_TABLE, EnforcementOrder, EnforcementOutcome, record_frame
    from gpu_ops.dagster.failures import LaunchRefused
    from gpu_ops.storage.tables import TableStore

    cfg = tmp_path / "gpu_ops.yaml"
    cfg.write_text(yaml.safe_dump({"storage": {"url": "sqlite:///costs.db"}, "prices": {"source": "t", "as_of": "2026-11-01", "gpus": {"t4": {"spot": 0.2}}}}))
    now = dt.datetime.now(dt.timezone.utc)
    start = (now.date() - dt.timedelta(days=35)).replace(day=1)  # a period around today, wide enough that
    order = EnforcementOrder(  # the launch a moment later is in it on any day (a month's end included)
        event="apply", budget="nlp-monthly", action="block", period_start=start.isoformat(),
        period_end=(start + dt.timedelta(days=95)).replace(day=1).isoformat(), scope={"team": "nlp"}, amount_usd=100, spend_usd=120,
    )
    TableStore(f"sqlite:///{tmp_path / 'costs.db'}").append(ENFORCEMENT_TABLE, record_frame(EnforcementOutcome(order), at=now, run_id="r0"))

    compute = GpuCompute(local_workdir=str(tmp_path / "work"), config_path=str(cfg))
    started: list[list[int]] = []
    with dg.build_asset_context() as context:
        # A step failure of its own (a dg.Failure and a GpuOpsError), never retried.
        with pytest.raises(LaunchRefused, match="blocked by budget 'nlp-monthly'") as info:
            compute.launch(context, launch_assets.REQUEST, worker_fns.add, args=(1, 2), on_start=started.append)
    assert info.value.allow_retries is False and started == []
    # Another team is not affected; and the gate can be switched off.
    other = launch_assets.REQUEST.model_copy(update={"labels": launch_assets.Attribution(team="vision")})
    with dg.build_asset_context() as context:
        assert compute.launch(context, other, worker_fns.add, args=(1, 2), log=lambda _l: None).ok
        ungated = LocalGpuCompute(local_workdir=str(tmp_path / "work"), config_path=str(cfg), budget_gate=BudgetGate(enabled=False))
        assert ungated.launch(context, launch_assets.REQUEST, worker_fns.add, args=(1, 2), log=lambda _l: None).ok


def test_one_class_per_backend_with_nested_settings(tmp_path: Path) -> None:
    from gpu_ops.dagster.compute.admission import GpuAdmission
    from gpu_ops.dagster.compute.resource import KubetorchLaunch

    # The abstract class called builds the default backend with the same (nested) keywords.
    assert type(GpuCompute()) is LocalGpuCompute
    local = GpuCompute(local_workdir=str(tmp_path), lifecycle=Lifecycle(cleanup="never"), standby=StandbySettings(enabled=False), budget_gate=BudgetGate(enabled=False))
    assert isinstance(local, LocalGpuCompute) and local.lifecycle.cleanup == "never" and not local.standby.enabled and not local.budget_gate.enabled
    # The flat keywords of 0.1 are gone: refused, never silently ignored.
    with pytest.raises(TypeError, match=r"unexpected keyword\(s\): backend, namespace .*lifecycle=Lifecycle"):
        GpuCompute(backend="kubetorch", namespace="ml")
    with pytest.raises(TypeError, match="LocalGpuCompute got unexpected keyword"):
        LocalGpuCompute(cleanup="never")
    with pytest.raises(TypeError, match="KubetorchGpuCompute got unexpected keyword.*pool_scope"):
        KubetorchGpuCompute(namespace="ml", pool_scope="run")

    # The new shape: nested settings, the gates injected (and shared) as resources.
    gate = BudgetGate(enabled=False)
    new = LocalGpuCompute(local_workdir=str(tmp_path), lifecycle=Lifecycle(cleanup="always", grace_period_s=2), standby=StandbySettings(enabled=False), budget_gate=gate)
    assert new.budget_gate is gate and isinstance(new.admission, GpuAdmission)
    instance = dg.DagsterInstance.ephemeral()
    result = dg.materialize([launch_assets.summed], resources={"gpu_compute": new}, instance=instance)
    assert result.success and result.output_for_node("summed")["sum"] == 5
    assert KubetorchGpuCompute(kubetorch=KubetorchLaunch(launch_timeout_s=60)).backend == "kubetorch"


@pytest.mark.parametrize("make", [lambda: Lifecycle(grace_period_s=float("inf")), lambda: StandbySettings(idle_s=float("inf")), lambda: Lifecycle(grace_period_s=float("nan"))])
def test_a_grace_or_idle_time_of_inf_is_refused(make) -> None:
    """inf seconds of SIGTERM grace would never SIGKILL a worker that ignores SIGTERM; a
    standby idle for ever would never exit."""
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="finite number"):
        make()
