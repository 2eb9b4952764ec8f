"""Real Dagster materializations of `gpu_asset`s on the local backend: real worker
processes, killed by real signals at random points; retries verified in the event log."""

from __future__ import annotations

import functools
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from gpu_ops.flows.training import hardware
from gpu_ops.domain.compute.request import Attribution, GpuRequest
from gpu_ops.dagster.compute.resource import GpuCompute, Lifecycle, LocalGpuCompute
from gpu_ops.domain.config import load_config
from gpu_ops.storage.tables import TableStore
from gpu_ops.storage import ledger
from gpu_ops.dagster.training.asset import gpu_asset, gpu_op
from gpu_ops.flows.training.context import TrainingContext, WorkerSpec
from gpu_ops_tests.http_receiver import QuietHandler, reply, serving
from gpu_ops_tests.training import workloads

REPO = Path(__file__).resolve().parents[2]
PRICES = REPO / "gpu_ops" / "demo" / "prices.yaml"
DEMO_STEPS = 400
REQUEST = GpuRequest(gpu_type="t4", gpus=1, memory="4Gi", capacity="spot-then-on-demand", labels=Attribution(team="nlp", project="tests"))


def write_config(folder: Path, steps: int = DEMO_STEPS, simulate_gpu_pricing: bool = False, telemetry_deadline_s: float = 1.0, standby: bool = True) -> Path:
    """``standby=False`` for a run that is never retried: its standby worker would warm
    torch (~3 s of CPU) for a retry that does not come."""
    path = folder / "gpu_ops.yaml"
    compute = "" if standby else "compute: {standby: false}\n"
    path.write_text(
        f"""
storage: {{url: "sqlite:///ledger.db"}}
prices: {PRICES}
{compute}training:
  checkpoint_url: ckpts
  keep_last: 3
  demo_steps: {steps}
  demo_checkpoint_interval_s: 0.4
  retry_backoff_s: 0.1
  simulate_gpu_pricing: {str(simulate_gpu_pricing).lower()}
  telemetry_deadline_s: {telemetry_deadline_s}
"""
    )
    return path


@pytest.fixture
def config_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("GPU_OPS_PIDFILE_DIR", str(tmp_path / "pids"))
    return write_config(tmp_path)


def uninterrupted_sha(folder: Path, steps: int = DEMO_STEPS) -> str:
    """The uninterrupted run's weights, trained in this process (no Dagster, no worker)."""
    from gpu_ops.flows.training.demo import train_demo

    spec = WorkerSpec("m", "f", "ref", "train_demo_model", 1, str(folder), checkpoint_interval=1000.0, progress_every_s=1e9)
    return train_demo(TrainingContext(spec), steps=steps)["weights_sha256"]


@functools.lru_cache(maxsize=None)
def reference_weights(steps: int = DEMO_STEPS) -> str:
    """``uninterrupted_sha`` of ``steps``, trained once per test process: the end-to-end
    tests of several files compare against it (under `make test` they share one worker)."""
    with tempfile.TemporaryDirectory(prefix="gpu_ops_ref_") as folder:
        return uninterrupted_sha(Path(folder), steps)


@pytest.fixture(scope="session")  # once per worker (see conftest.py)
def reference_sha() -> str:
    return reference_weights()


def demo_assets(config: Path) -> list[dg.AssetsDefinition]:
    from gpu_ops.dagster.location import build_defs

    return [build_defs(str(config)).resolve_assets_def("train_demo_model")]


def events(instance: dg.DagsterInstance, run_id: str, kind: str) -> list[Any]:
    return [e for e in instance.all_logs(run_id) if e.dagster_event is not None and e.dagster_event.event_type_value == kind]


def messages(instance: dg.DagsterInstance, run_id: str) -> list[str]:
    return [e.message for e in instance.all_logs(run_id) if e.message]


def metadata(result: dg.ExecuteInJobResult, node: str) -> dict[str, Any]:
    mat = result.asset_materializations_for_node(node)[-1]
    return {k: getattr(v, "value", v) for k, v in mat.metadata.items()}


def ledger_rows(config: Path) -> Any:
    return ledger.read(TableStore(load_config(config).storage.resolved_url())).sort_values(["run_id", "attempt"])


class Killer(threading.Thread):
    """Sends ``sig`` to the run's first worker at a random point of its training.

    It waits until training is under way (the first checkpoint of the run exists, so
    the machine's load does not decide whether the kill lands before or after torch
    starts), then waits a random delay, or, with ``during_write``, until a checkpoint
    write is in progress (its temporary file exists).
    """

    def __init__(self, root: Path, sig: int, *, delay: tuple[float, float] = (0.0, 0.0), during_write: bool = False, seed: int | None = None):
        super().__init__(daemon=True)
        self.pid_dir, self.ckpts, self.sig, self.during_write = root / "pids", root / "ckpts", sig, during_write
        self.delay = random.Random(seed).uniform(*delay)
        self.killed_pid: int | None = None
        self.mid_write = False
        self.rank = 0

    def _wait(self, probe: Any, timeout: float = 120, every: float = 0.01) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = probe()
            if found:
                return found
            time.sleep(every)
        return None

    def _pid(self) -> int | None:
        for f in self.pid_dir.glob(f"*.rank{self.rank}.pid") if self.pid_dir.exists() else []:
            try:
                return int(f.read_text())
            except (OSError, ValueError):
                pass
        return None

    def run(self) -> None:
        before = set(self.ckpts.glob("*/*/ckpt-*.json"))  # another run's checkpoints do not count
        if not self._wait(lambda: set(self.ckpts.glob("*/*/ckpt-*.json")) - before):
            return
        pid = self._pid()
        if pid is None:
            return
        time.sleep(self.delay)
        if self.during_write:
            self.mid_write = bool(self._wait(lambda: list(self.ckpts.glob("*/*/.tmp-*")), timeout=30, every=0.0005))
        try:
            os.kill(pid, self.sig)
            self.killed_pid = pid
        except ProcessLookupError:
            pass


# --------------------------------------------------------------------------- the demo


@pytest.mark.slow
def test_demo_uninterrupted(tmp_path: Path, config_path: Path, reference_sha: str) -> None:
    config_path = write_config(tmp_path, standby=False)  # one attempt: no standby for a retry
    instance = dg.DagsterInstance.ephemeral()
    result = dg.materialize(demo_assets(config_path), instance=instance)
    assert result.success
    md = metadata(result, "train_demo_model")
    assert md["weights_sha256"] == reference_sha
    assert md["attempts"] == 1 and md["preemptions"] == 0
    assert 0 < md["final_loss"] < 2.5
    ran = hardware.detect()  # the worker ran on this machine: the ledger records what it has
    assert md["declared_gpu"] == "1x t4" and md["actual_gpu"] == ran.describe()
    if ran.is_cpu:
        assert md["gpu_hours"] == 0 and md["cost_usd"] == 0 and "no GPU" in md["hardware_warning"]
    else:
        assert md["gpu_hours"] > 0 and md["cost_usd"] > 0
    logs = messages(instance, result.run_id)
    assert any(m.startswith(f"step {DEMO_STEPS}/{DEMO_STEPS} (100%) loss=") for m in logs)  # ctx.progress in the run log
    assert any(m.startswith("checkpoint #") for m in logs)
    rows = ledger_rows(config_path)
    assert list(rows["outcome"]) == ["completed"] and rows.iloc[0]["run_id"] == result.run_id
    assert rows.iloc[0]["team"] == "ml-platform" and rows.iloc[0]["gpu_type"] == (ran.gpu_type if ran.gpu_count else "cpu")
    assert rows.iloc[0]["declared_gpu_type"] == "t4" and rows.iloc[0]["hardware_source"] == "worker"


@pytest.mark.slow
@pytest.mark.parametrize(("sig", "seed"), [(signal.SIGTERM, 11), (signal.SIGKILL, 12)])
def test_demo_survives_a_kill_at_a_random_point(config_path: Path, reference_sha: str, sig: int, seed: int) -> None:
    instance = dg.DagsterInstance.ephemeral()
    killer = Killer(config_path.parent, sig, delay=(0.0, 1.5), seed=seed)
    killer.start()
    result = dg.materialize(demo_assets(config_path), instance=instance)
    killer.join(timeout=5)
    assert killer.killed_pid is not None, "the worker finished before it could be killed"
    assert result.success
    md = metadata(result, "train_demo_model")
    assert md["weights_sha256"] == reference_sha  # same weights as the uninterrupted run
    assert md["attempts"] == 2 and md["preemptions"] == 1
    # A preemption after progress has nothing to wait for: attempt 2 runs at once in the
    # same step process (a new Dagster step process would cost seconds of start-up).
    assert events(instance, result.run_id, "STEP_UP_FOR_RETRY") == []
    assert "attempt 2 starts in this step process at once (nothing to wait for)" in messages(instance, result.run_id)
    rows = ledger_rows(config_path)
    assert list(rows["outcome"]) == ["preempted", "completed"] and list(rows["attempt"]) == [1, 2]
    assert rows.iloc[0]["lost_seconds"] >= 0 and rows.iloc[1]["lost_seconds"] == 0
    logs = messages(instance, result.run_id)
    assert any("attempt 2 resumes from checkpoint #" in m for m in logs)
    assert any("-> retry: preemption 1 of at most" in m for m in logs)
    if sig == signal.SIGTERM:
        # The worker saved on the way out: the preempted attempt lost (almost) nothing.
        assert not pd_isna(rows.iloc[0]["last_checkpoint_at"])
        assert any("preemption notice in the worker (SIGTERM)" in m for m in logs)
        assert not any("Traceback" in m for m in logs)  # a preemption is not an error


def pd_isna(v: Any) -> bool:
    import pandas as pd

    return bool(pd.isna(v))


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_demo_survives_a_kill_during_a_checkpoint_write(config_path: Path, reference_sha: str, sig: int) -> None:
    instance = dg.DagsterInstance.ephemeral()
    killer = Killer(config_path.parent, sig, delay=(0.5, 0.5), during_write=True)
    killer.start()
    result = dg.materialize(demo_assets(config_path), instance=instance)
    killer.join(timeout=5)
    assert killer.killed_pid is not None
    assert result.success
    md = metadata(result, "train_demo_model")
    assert md["weights_sha256"] == reference_sha and md["preemptions"] == 1
    assert killer.mid_write  # the kill was aimed at a write in progress


# --------------------------------------------------------------------------- the policy, end to end


def counting_asset(config: Path, name: str, params: dict[str, Any], **policy: Any) -> dg.AssetsDefinition:
    return gpu_asset(
        workloads.counting,
        name=name,
        request=REQUEST,
        policy={"backoff_s": 0.05, "checkpoint_interval": 0.05, **policy},
        params=params,
        config_path=str(config),
    )


def run(asset: dg.AssetsDefinition, instance: dg.DagsterInstance) -> dg.ExecuteInJobResult:
    return dg.materialize([asset], instance=instance, resources={"gpu_compute": GpuCompute(lifecycle=Lifecycle(grace_period_s=5))}, raise_on_error=False)


def test_user_error_is_not_retried(config_path: Path) -> None:
    instance = dg.DagsterInstance.ephemeral()
    result = run(counting_asset(config_path, "bad_hparams", {"fail_on_attempt": 1}), instance)
    assert not result.success
    assert events(instance, result.run_id, "STEP_UP_FOR_RETRY") == []
    failure = events(instance, result.run_id, "STEP_FAILURE")[0].dagster_event.step_failure_data
    assert "user_error" in failure.error.message and "not retried" in failure.error.message
    tb = failure.user_failure_data.metadata["remote_traceback"].value
    assert "ValueError: bad hyperparameter" in tb and "workloads.py" in tb
    assert list(ledger_rows(config_path)["outcome"]) == ["user_error"]


def test_fake_oom_retries_once_with_more_memory(config_path: Path) -> None:
    instance = dg.DagsterInstance.ephemeral()
    result = run(counting_asset(config_path, "hungry", {"oom_on_attempts": 1}), instance)
    assert result.success
    assert len(events(instance, result.run_id, "STEP_UP_FOR_RETRY")) == 1
    md = metadata(result, "hungry")
    assert md["memory"] == "6Gi"  # 4Gi × 1.5, as the second attempt's request
    assert md["oom_retries"] == 1 and md["attempts"] == 2
    assert list(ledger_rows(config_path)["outcome"]) == ["oom", "completed"]
    assert any("memory 4Gi -> 6Gi" in m for m in messages(instance, result.run_id))


def test_spot_preemptions_fall_back_to_on_demand(config_path: Path) -> None:
    instance = dg.DagsterInstance.ephemeral()
    asset = counting_asset(config_path, "flaky_spot", {"sigterm_self_on_attempts": 2, "steps": 30}, fallback_after=2)
    result = run(asset, instance)
    assert result.success
    md = metadata(result, "flaky_spot")
    assert md["capacity"] == "on-demand" and md["preemptions"] == 2 and md["attempts"] == 3
    assert md["final_loss"] == float(sum(range(30)))  # resumed, never double-counted
    rows = ledger_rows(config_path)
    assert list(rows["capacity_type"]) == ["spot", "spot", "on-demand"]
    assert list(rows["outcome"]) == ["preempted", "preempted", "completed"]


def test_retry_in_step_false_leaves_every_retry_to_dagster(config_path: Path) -> None:
    instance = dg.DagsterInstance.ephemeral()
    result = run(counting_asset(config_path, "by_dagster", {"sigterm_self_on_attempts": 1, "steps": 10}, retry_in_step=False), instance)
    assert result.success
    assert len(events(instance, result.run_id, "STEP_UP_FOR_RETRY")) == 1  # Dagster re-ran the step
    assert list(ledger_rows(config_path)["outcome"]) == ["preempted", "completed"]


def test_max_preemptions_exhausted_fails_without_retry(config_path: Path) -> None:
    instance = dg.DagsterInstance.ephemeral()
    result = run(counting_asset(config_path, "always_preempted", {"sigterm_self_on_attempts": 9}, max_preemptions=1), instance)
    assert not result.success
    assert events(instance, result.run_id, "STEP_UP_FOR_RETRY") == []  # the one retry ran in the step process
    assert "attempt 2 starts in this step process at once (nothing to wait for)" in messages(instance, result.run_id)
    failure = events(instance, result.run_id, "STEP_FAILURE")[0].dagster_event.step_failure_data
    assert "max_preemptions=1" in failure.error.message


class _Notice(QuietHandler):
    """EC2's spot/instance-action: one notice (for the first node), then 404 (a new node)."""

    served = 0

    def do_GET(self) -> None:  # noqa: N802
        if type(self).served:
            self.send_error(404)
            return
        type(self).served += 1
        reply(self, 200, b'{"action": "terminate", "time": "2026-11-20T12:02:00Z"}')


def test_spot_notice_preempts_and_the_next_attempt_resumes(config_path: Path) -> None:
    with serving(_Notice) as base:
        url = f"{base}/latest/meta-data/spot/instance-action"
        instance = dg.DagsterInstance.ephemeral()
        asset = counting_asset(config_path, "noticed", {"wait_for_notice": True, "steps": 10}, spot_notice=url, spot_notice_poll_s=0.1)
        result = run(asset, instance)
    assert result.success
    assert metadata(result, "noticed")["preemptions"] == 1
    assert any("spot interruption notice" in m for m in messages(instance, result.run_id))


def test_gpu_op_in_a_job(config_path: Path) -> None:
    op = gpu_op(workloads.counting, name="count_op", request=REQUEST, policy={"backoff_s": 0.05}, params={"steps": 5, "oom_on_attempts": 1}, config_path=str(config_path))

    @dg.job(resource_defs={"gpu_compute": GpuCompute()})
    def counting_job() -> None:
        op()

    instance = dg.DagsterInstance.ephemeral()
    result = counting_job.execute_in_process(instance=instance)
    assert result.success
    assert result.output_for_node("count_op")["final_loss"] == float(sum(range(5)))
    assert list(ledger_rows(config_path)["asset_key"].unique()) == ["op/counting_job/count_op"]


def test_run_config_params_override_the_declared_ones(config_path: Path) -> None:
    instance = dg.DagsterInstance.ephemeral()
    asset = counting_asset(config_path, "configurable", {"steps": 50})
    result = dg.materialize(
        [asset],
        instance=instance,
        resources={"gpu_compute": GpuCompute()},
        run_config={"ops": {"configurable": {"config": {"params": {"steps": 4}}}}},
    )
    assert metadata(result, "configurable")["final_loss"] == float(sum(range(4)))


def test_nested_functions_are_rejected_at_definition_time() -> None:
    def local_train(ctx: TrainingContext) -> None:
        pass

    with pytest.raises(TypeError, match="module level"):
        gpu_asset(local_train, request=REQUEST)


def test_loading_the_code_location_imports_neither_torch_nor_kubetorch() -> None:
    code = "import sys, gpu_ops.definitions as d; d.defs.resolve_asset_graph(); print(sorted(m for m in ('torch', 'kubetorch') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.slow
def test_demo_with_an_injected_preemption_helper(config_path: Path, reference_sha: str) -> None:
    from gpu_ops.demo.training import materialize_with_preemption

    lines: list[str] = []
    md = materialize_with_preemption(str(config_path), after_s=0.5, echo=lines.append)
    assert md["injected_pid"] is not None and md["preemptions"] == 1 and md["attempts"] == 2
    assert md["weights_sha256"] == reference_sha
    assert "injected SIGKILL to worker pid" in lines[0]
    assert os.environ["GPU_OPS_PIDFILE_DIR"] == str(config_path.parent / "pids")  # restored


class NoCapacityOnce(LocalGpuCompute):
    """The first launch fails the way the Kubetorch backend reports missing capacity
    (its ComputeSetupError raised from kubetorch's ResourceNotAvailableError)."""

    def launch(self, context: Any, request: GpuRequest, fn: Any, args: tuple = (), kwargs: dict | None = None, **kw: Any):  # type: ignore[override]
        if context.retry_number == 0:
            from kubetorch.resources.compute.utils import ResourceNotAvailableError

            from gpu_ops.flows.compute.kubetorch_backend import ComputeSetupError

            try:
                raise ResourceNotAvailableError("no a100 nodes could be provisioned within 900s")
            except ResourceNotAvailableError as exc:
                raise ComputeSetupError("no GPU capacity", "raise the NodePool limit or wait", exc) from exc
        return super().launch(context, request, fn, args, kwargs, **kw)


def test_a_launch_without_capacity_is_an_infrastructure_retry(config_path: Path) -> None:
    instance = dg.DagsterInstance.ephemeral()
    asset = counting_asset(config_path, "capacity", {"steps": 5})
    result = dg.materialize([asset], instance=instance, resources={"gpu_compute": NoCapacityOnce()})
    assert result.success
    md = metadata(result, "capacity")
    assert md["infrastructure_retries"] == 1 and md["attempts"] == 2
    rows = ledger_rows(config_path)
    assert list(rows["outcome"]) == ["infrastructure", "completed"]
    assert list(rows["hardware_source"]) == ["none", "worker"]  # the failed launch used no GPU
    assert rows.iloc[0]["gpu_count"] == 0 and rows.iloc[1]["gpu_count"] == hardware.detect().gpu_count


@pytest.mark.slow
def test_two_workers_losing_one_rank_resume_together(config_path: Path) -> None:
    request = GpuRequest(gpu_type="t4", gpus=1, workers=2, memory="4Gi", labels=Attribution(team="nlp"))

    def ddp_asset(name: str) -> dg.AssetsDefinition:
        return gpu_asset(workloads.ddp_train, name=name, request=request, policy={"backoff_s": 0.05, "checkpoint_interval": 0.3}, config_path=str(config_path))

    resources = {"gpu_compute": GpuCompute(lifecycle=Lifecycle(grace_period_s=3))}
    straight = dg.materialize([ddp_asset("ddp_straight")], instance=dg.DagsterInstance.ephemeral(), resources=resources)
    reference = metadata(straight, "ddp_straight")
    assert reference["ranks_agree"] is True and reference["world_size"] == 2

    instance = dg.DagsterInstance.ephemeral()
    killer = Killer(config_path.parent, signal.SIGKILL, delay=(0.2, 0.6), seed=5)
    killer.rank = 1  # kill the second rank: the attempt fails as a whole
    killer.start()
    result = dg.materialize([ddp_asset("ddp_killed")], instance=instance, resources=resources)
    killer.join(timeout=5)
    assert killer.killed_pid is not None
    md = metadata(result, "ddp_killed")
    assert md["preemptions"] == 1 and md["attempts"] == 2
    assert md["ranks_agree"] is True and md["weights_sha256"] == reference["weights_sha256"]
    assert any("rank 1" in m and "-> retry" in m for m in messages(instance, result.run_id))
    rows = ledger_rows(config_path)
    ran = hardware.detect()  # both local ranks see this machine's GPUs (counted once), or none
    assert list(rows[rows["asset_key"] == "ddp_killed"]["gpu_count"]) == [ran.gpu_count] * 2


def test_a_budget_block_fails_the_step_with_its_own_message_and_no_retry(config_path: Path) -> None:
    import datetime as dt

    from gpu_ops.flows.alerts.enforcement import ENFORCEMENT_TABLE, EnforcementOrder, EnforcementOutcome, record_frame

    now = dt.datetime.now(dt.timezone.utc)
    start = (now.date() - dt.timedelta(days=35)).replace(day=1)  # a period around today, wide enough that
    order = EnforcementOrder(  # the launch a moment later is in it on any day (a month's end included)
        event="apply", budget="nlp-monthly", action="block", period_start=start.isoformat(),
        period_end=(start + dt.timedelta(days=95)).replace(day=1).isoformat(), scope={"team": "nlp"}, amount_usd=100, spend_usd=120,
    )
    store = TableStore(load_config(config_path).storage.resolved_url())
    store.append(ENFORCEMENT_TABLE, record_frame(EnforcementOutcome(order), at=now, run_id="r0"))

    instance = dg.DagsterInstance.ephemeral()
    asset = counting_asset(config_path, "blocked", {})
    result = dg.materialize([asset], instance=instance, resources={"gpu_compute": GpuCompute(config_path=str(config_path))}, raise_on_error=False)
    assert not result.success
    assert events(instance, result.run_id, "STEP_UP_FOR_RETRY") == []
    failure = events(instance, result.run_id, "STEP_FAILURE")[0].dagster_event.step_failure_data
    assert "blocked by budget 'nlp-monthly'" in failure.error.message
    assert "the training function raised" not in failure.error.message
    assert ledger.read(store).empty  # no worker started, no GPU-seconds to record
