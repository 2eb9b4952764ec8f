"""The local backend with real worker subprocesses and real signals."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from gpu_ops.domain.compute.backend import WorkerExit
from gpu_ops.flows.compute.local import LaunchError, LocalBackend
from gpu_ops_tests.compute import worker_fns


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is not alive: its parent has not reaped it, but it runs nothing
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


class Recorder:
    """A log sink that can act (send a signal, raise) when a line appears."""

    def __init__(self, trigger: str | None = None, action=None):
        self.lines: list[str] = []
        self.trigger, self.action, self.fired = trigger, action, False

    def __call__(self, line: str) -> None:
        self.lines.append(line)
        if self.trigger and not self.fired and self.trigger in line:
            self.fired = True
            self.action(self)

    def pids(self) -> list[int]:
        return [int(l.split("pid=")[1].split()[0]) for l in self.lines if l.startswith("worker started pid=")]


def test_completes_with_value_env_and_streamed_output(tmp_path: Path) -> None:
    log, started = Recorder(), []
    report = LocalBackend(workdir=tmp_path).run(
        worker_fns.add, (1, 2), {"scale": 3}, env={"GPU_OPS_TEST_VALUE": "hello"}, log=log, on_start=started.append
    )
    assert report.exit is WorkerExit.COMPLETED and report.ok
    assert report.value == {"sum": 9, "env": "hello", "rank": "0", "world": "1"}
    assert "adding 1 2" in log.lines and "to stderr" in log.lines
    assert started == [log.pids()] and len(started[0]) == 1
    assert report.ranks[0].pid == started[0][0] and report.ranks[0].exit_code == 0


def test_crash_reports_remote_traceback(tmp_path: Path) -> None:
    log = Recorder()
    report = LocalBackend(workdir=tmp_path).run(worker_fns.crash, ("boom at step 7",), log=log)
    assert report.exit is WorkerExit.ERROR and report.exit_code == 1
    assert report.error_type == "ValueError" and report.error_message == "boom at step 7"
    assert "worker_fns.py" in report.traceback and 'raise ValueError(message)' in report.traceback
    assert "about to crash" in log.lines


def test_memory_error_is_oom(tmp_path: Path) -> None:
    report = LocalBackend(workdir=tmp_path).run(worker_fns.run_out_of_memory, log=Recorder())
    assert report.exit is WorkerExit.OOM and report.error_type == "MemoryError"


def test_cuda_out_of_memory_is_oom(tmp_path: Path) -> None:
    report = LocalBackend(workdir=tmp_path).run(worker_fns.cuda_out_of_memory, log=Recorder())
    assert report.exit is WorkerExit.OOM
    assert report.error_type == "torch.OutOfMemoryError" and "Tried to allocate" in report.error_message


def test_sigterm_reaches_the_function_and_is_reported(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    log = Recorder("sleeping", lambda r: os.kill(r.pids()[0], signal.SIGTERM))
    report = LocalBackend(workdir=tmp_path).run(worker_fns.sleep_forever, (str(marker),), log=log)
    assert report.exit is WorkerExit.SIGTERM and report.exit_code == 143
    assert marker.read_text() == "WorkerTerminated"  # the function could checkpoint


def test_sigkill_is_reported_via_pidfile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPU_OPS_PIDFILE_DIR", str(tmp_path / "pids"))

    def kill_from_pidfile(r: Recorder) -> None:
        (pidfile,) = (tmp_path / "pids").glob("*.pid")
        assert pidfile.name == "job-1.rank0.pid"
        os.kill(int(pidfile.read_text()), signal.SIGKILL)

    log = Recorder("sleeping", kill_from_pidfile)
    report = LocalBackend(name="job-1", workdir=tmp_path).run(worker_fns.sleep_forever, log=log)
    assert report.exit is WorkerExit.SIGKILL and report.exit_code == -signal.SIGKILL
    assert not list((tmp_path / "pids").glob("*.pid"))  # removed when the worker ended


def test_exit_without_result_is_lost(tmp_path: Path) -> None:
    report = LocalBackend(workdir=tmp_path).run(worker_fns.exit_hard, (3,), log=Recorder())
    assert report.exit is WorkerExit.LOST and report.exit_code == 3
    assert "without reporting" in report.error_message


def test_interrupt_forwards_sigterm_and_propagates(tmp_path: Path) -> None:
    marker = tmp_path / "marker"

    def interrupt(r: Recorder) -> None:
        raise KeyboardInterrupt

    log = Recorder("sleeping", interrupt)
    with pytest.raises(KeyboardInterrupt):
        LocalBackend(workdir=tmp_path).run(worker_fns.sleep_forever, (str(marker),), log=log)
    assert marker.read_text() == "WorkerTerminated"
    assert not _alive(log.pids()[0])


def test_worker_ignoring_sigterm_is_killed_after_grace(tmp_path: Path) -> None:
    def interrupt(r: Recorder) -> None:
        raise KeyboardInterrupt

    log = Recorder("ignoring SIGTERM", interrupt)
    t0 = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        LocalBackend(workdir=tmp_path, grace_period_s=0.5).run(worker_fns.ignore_sigterm, log=log)
    assert time.monotonic() - t0 < 10
    assert not _alive(log.pids()[0])


def test_unimportable_callables_are_refused(tmp_path: Path) -> None:
    with pytest.raises(LaunchError, match="module level"):
        LocalBackend(workdir=tmp_path).run(lambda: 1, log=Recorder())


def test_teardown_removes_the_workdir(tmp_path: Path) -> None:
    backend = LocalBackend(workdir=tmp_path)
    backend.run(worker_fns.add, (1, 1), log=Recorder())
    assert backend.workdir is not None and (backend.workdir / "payload.pkl").exists()
    backend.teardown()
    assert not backend.workdir.exists()


def test_two_gloo_workers_end_with_identical_weights(tmp_path: Path) -> None:
    import torch

    log = Recorder()
    report = LocalBackend(workers=2, workdir=tmp_path).run(worker_fns.ddp_train, (15, str(tmp_path)), log=log)
    assert report.ok, report.error_message
    assert [r.exit for r in report.ranks] == [WorkerExit.COMPLETED] * 2
    w0, w1 = torch.load(tmp_path / "weights-0.pt"), torch.load(tmp_path / "weights-1.pt")
    assert torch.equal(w0, w1)
    assert report.value == report.ranks[0].value and report.ranks[1].value["rank"] == 1
    assert len(log.pids()) == 2


def test_losing_one_rank_fails_the_attempt_without_a_hung_survivor(tmp_path: Path) -> None:
    log = Recorder("[rank 1] step 2", lambda r: os.kill(r.pids()[1], signal.SIGKILL))
    t0 = time.monotonic()
    report = LocalBackend(workers=2, workdir=tmp_path, grace_period_s=3).run(
        worker_fns.ddp_train, (10_000, str(tmp_path), 0.05), log=log
    )
    elapsed = time.monotonic() - t0
    assert not report.ok
    assert report.exit is WorkerExit.SIGKILL and report.error_message.startswith("rank 1:")
    assert report.ranks[1].exit is WorkerExit.SIGKILL
    assert report.ranks[0].exit is not WorkerExit.COMPLETED  # stopped, not left running
    assert not any(_alive(pid) for pid in log.pids())
    assert elapsed < 60
    assert any("stopping the other workers" in l for l in log.lines)


def _phase_line(lines: list[str]) -> dict:
    import json

    (line,) = [l for l in lines if l.startswith("gpu_ops:phase ")]
    return json.loads(line.split(" ", 1)[1])


# Standby workers (in this process or another): gpu_ops_tests/compute/test_standby.py


def test_a_cold_worker_reports_its_start_up_phases(tmp_path: Path) -> None:
    log = Recorder()
    LocalBackend(workdir=tmp_path).run(worker_fns.add, (1, 1), log=log)
    phases = _phase_line(log.lines)
    assert phases["standby"] is False and "activated" not in phases["phases"]
    p = phases["phases"]
    assert p["process"] <= p["interpreter"] <= p["imports"] <= p["cuda_init"] <= p["payload"]


def test_a_notice_during_start_up_is_not_lost(tmp_path: Path) -> None:
    """SIGUSR1 sent the instant the worker process exists (before Python has started):
    delivered once the handler is in place, so the attempt stops as preempted after a
    checkpoint instead of dying of SIGUSR1's default action."""
    from dataclasses import asdict

    from gpu_ops.domain.compute.backend import NOTICE_SIGNAL
    from gpu_ops.flows.training.context import WorkerSpec
    from gpu_ops.flows.training.worker import run_training

    spec = WorkerSpec("gpu_ops_tests.training.workloads", "counting", "run", "asset", 1, str(tmp_path / "ckpts"), params={"wait_for_notice": True})
    log = Recorder("worker started pid=", lambda r: os.kill(r.pids()[0], NOTICE_SIGNAL))
    report = LocalBackend(workdir=tmp_path).run(run_training, (asdict(spec),), log=log)
    assert report.exit is WorkerExit.SIGTERM and report.exit_code == 143  # stopped as preempted, not killed by the signal
    assert "preemption notice (SIGUSR1)" in report.error_message
    assert any(l.startswith("gpu_ops:checkpoint ") for l in log.lines)
