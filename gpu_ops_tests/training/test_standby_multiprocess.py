"""The standby worker under Dagster's multiprocess executor (the UI's and the CLI's):
a retry with nothing to wait for runs at once in the same step process, on the standby
the killed attempt left running (when the step process itself dies, the standby outlives
it and the next step process claims it: test_process_deaths.py). A real run of `train_demo_model_job` on a persistent instance, its worker
SIGKILLed; afterwards no process of the run is left (real pids, and every process on
the machine that carries this test's GPU_OPS_HOME)."""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

import dagster as dg
import pytest

from gpu_ops.flows.compute.standby import is_alive, rendezvous_files
from gpu_ops.domain.config import gpu_ops_home
from gpu_ops_tests.training.test_gpu_asset import Killer, messages, reference_weights, write_config
from gpu_ops_tests.training.test_process_deaths import STEPS  # killed 0.2 s after its first checkpoint; the same reference
from gpu_ops_tests.waiting import wait_until


def demo_job() -> dg.JobDefinition:
    """The demo job with its default (multiprocess) executor, rebuilt in each step process."""
    from gpu_ops.dagster.location import build_defs

    return build_defs(os.environ["GPU_OPS_CONFIG"]).resolve_job_def("train_demo_model_job")


def processes_with_home(home: Path) -> list[int]:
    """Every live process whose environment names ``home`` as its GPU_OPS_HOME, except
    multiprocessing's resource tracker of this test process (it lives as long as pytest)."""
    mark = f"GPU_OPS_HOME={home}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            tracker = b"multiprocessing.resource_tracker" in (entry / "cmdline").read_bytes()
            if mark in (entry / "environ").read_bytes().split(b"\0") and is_alive(int(entry.name)) and not tracker:
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def describe(pid: int) -> str:
    try:
        return f"{pid}: " + Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return f"{pid}: gone"


@pytest.fixture(scope="session")  # once per worker (see conftest.py)
def demo_sha() -> str:
    return reference_weights(STEPS)


@pytest.mark.slow
def test_the_retry_claims_the_standby_and_nothing_is_left(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, demo_sha: str) -> None:
    config = write_config(tmp_path, STEPS)
    monkeypatch.setenv("GPU_OPS_CONFIG", str(config))
    monkeypatch.setenv("GPU_OPS_PIDFILE_DIR", str(tmp_path / "pids"))
    (tmp_path / "dagster_home").mkdir()
    killer = Killer(tmp_path, signal.SIGKILL, delay=(0.2, 0.2))
    killer.start()
    with dg.DagsterInstance.local_temp(tempdir=str(tmp_path / "dagster_home")) as instance:
        result = dg.execute_job(dg.reconstructable(demo_job), instance=instance)
        assert result.success
        run_id = result.run_id
        log = messages(instance, run_id)
        step_pids = {e.dagster_event.pid for e in instance.all_logs(run_id) if e.dagster_event and e.dagster_event.step_key} - {os.getpid(), None}
        (mat,) = instance.fetch_materializations(dg.AssetKey("train_demo_model"), limit=1).records
        md = {k: getattr(v, "value", v) for k, v in mat.asset_materialization.metadata.items()}
    killer.join()
    assert killer.killed_pid is not None

    # Attempt 1 left a standby; attempt 2 ran on it at once, in the same step process.
    assert len(step_pids) == 1  # one step process, not this one
    parked = [m for m in log if m.startswith("standby worker pid=") and "left running for the next attempt" in m]
    assert len(parked) == 1, log
    standby_pid, keeper_pid = (int(x) for x in re.findall(r"pid=(\d+)", parked[0]))
    assert f"worker started pid={standby_pid} rank=0 (standby, already warm)" in log
    assert any(m.startswith("attempt 2 start-up on a standby worker") for m in log)
    assert md["attempts"] == 2 and md["preemptions"] == 1
    assert md["worker_start"] == "standby" and md["worker_pid"] == standby_pid != killer.killed_pid
    assert md["weights_sha256"] == demo_sha

    # Nothing of the run is left running: the killed worker, the standby and its keeper,
    # the standby attempt 2 started (stopped when it completed), the step processes.
    for pid in (killer.killed_pid, standby_pid, keeper_pid, *step_pids):
        assert wait_until(lambda pid=pid: not is_alive(pid)), f"pid {pid} still runs"
    assert wait_until(lambda: processes_with_home(gpu_ops_home()) == []), [describe(p) for p in processes_with_home(gpu_ops_home())]
    assert rendezvous_files(gpu_ops_home() / "standby") == []
