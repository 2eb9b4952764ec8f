"""Standby workers that outlive the attempt that started them (compute.standby).

Real keeper and worker processes, real rendezvous files under GPU_OPS_HOME, real signals;
"gone" is checked on real pids. The Dagster multiprocess case is in
gpu_ops_tests/training/test_standby_multiprocess.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from gpu_ops.domain.compute.backend import WorkerExit
from gpu_ops.flows.compute.local import LocalBackend
from gpu_ops.flows.compute.standby import StandbyScope, discard, rendezvous_files
from gpu_ops.flows.compute.standby import start as standby_start
from gpu_ops_tests.compute import worker_fns
from gpu_ops_tests.compute.test_local import Recorder, _alive, _phase_line
from gpu_ops_tests.waiting import wait_until


def scope(home: Path, run_id: str = "run-1", launch: str = "train", idle_s: float = 600.0, owner_pid: int | None = None) -> StandbyScope:
    return StandbyScope(run_id=run_id, launch=launch, folder=home / "standby", idle_s=idle_s, owner_pid=owner_pid or os.getpid())


def parked_attempt(tmp_path: Path, s: StandbyScope, name: str = "a1") -> tuple[int, int]:
    """An attempt whose worker is SIGKILLed: its standby is parked. Returns the standby's
    (keeper pid, worker pid) from its rendezvous record."""
    first = LocalBackend(name=name, workdir=tmp_path / "work", standby=s, warm=("json",))
    log = Recorder("sleeping", lambda r: os.kill(r.pids()[0], signal.SIGKILL))
    report = first.run(worker_fns.sleep_forever, env={"GPU_OPS_TEST_VALUE": "v"}, log=log)
    assert report.exit is WorkerExit.SIGKILL
    first.park_spares()
    first.teardown()
    assert wait_until(lambda: len(rendezvous_files(s.folder)) == 1)
    record = json.loads(rendezvous_files(s.folder)[0].read_text())
    assert _alive(record["keeper_pid"]) and _alive(record["worker_pid"])
    return record["keeper_pid"], record["worker_pid"]


def test_a_parked_standby_runs_the_next_attempt_and_reports_how_it_ended(tmp_path: Path) -> None:
    s = scope(tmp_path)
    keeper, worker = parked_attempt(tmp_path, s)
    second = LocalBackend(name="a2", workdir=tmp_path / "work", standby=s, warm=("json",))
    log = Recorder("sleeping", lambda r: os.kill(r.pids()[0], signal.SIGKILL))
    report = second.run(worker_fns.sleep_forever, env={"GPU_OPS_TEST_VALUE": "v"}, log=log)
    # The adopted worker is not this process's child: its end still comes back exactly.
    assert report.exit is WorkerExit.SIGKILL and report.ranks[0].pid == worker and second.adopted == 1
    assert any(line.endswith("(standby, already warm)") for line in log.lines)
    assert _phase_line(log.lines)["standby"] is True
    second.stop_spares()
    second.teardown()
    assert wait_until(lambda: not _alive(keeper) and not _alive(worker))
    assert rendezvous_files(s.folder) == []


def test_an_adopted_standby_returns_the_value_and_the_output(tmp_path: Path) -> None:
    s = scope(tmp_path)
    keeper, worker = parked_attempt(tmp_path, s)
    second = LocalBackend(name="a2", workdir=tmp_path / "work", standby=s, warm=("json",))
    log = Recorder()
    report = second.run(worker_fns.add, (2, 3), {"scale": 2}, env={"GPU_OPS_TEST_VALUE": "v"}, log=log)
    assert report.ok and report.value["sum"] == 10 and report.value["env"] == "v" and report.ranks[0].pid == worker
    assert "adding 2 3" in log.lines and "to stderr" in log.lines
    second.stop_spares()
    second.teardown()
    assert wait_until(lambda: not _alive(keeper) and not _alive(worker))


def test_a_standby_is_never_claimed_by_another_run_or_launch(tmp_path: Path) -> None:
    s = scope(tmp_path)
    keeper, worker = parked_attempt(tmp_path, s)
    for other in (scope(tmp_path, run_id="run-2"), scope(tmp_path, launch="other_asset")):
        b = LocalBackend(name="x", workdir=tmp_path / "work", standby=other, warm=("json",))
        report = b.run(worker_fns.add, (1, 1), env={"GPU_OPS_TEST_VALUE": "v"}, log=Recorder())
        assert report.ok and report.ranks[0].pid != worker and b.adopted == 0
        b.stop_spares()
        b.teardown()
    assert _alive(keeper) and _alive(worker)  # still waiting for its own run
    mine = LocalBackend(name="z", workdir=tmp_path / "work", warm=("json",), standby=s)
    report = mine.run(worker_fns.add, (1, 1), env={"GPU_OPS_TEST_VALUE": "v"}, log=Recorder())
    assert report.ranks[0].pid == worker
    mine.stop_spares()
    mine.teardown()
    assert wait_until(lambda: not _alive(keeper) and not _alive(worker))


def test_a_standby_started_with_another_environment_is_stopped_not_adopted(tmp_path: Path) -> None:
    s = scope(tmp_path)
    keeper, worker = parked_attempt(tmp_path, s)
    b = LocalBackend(name="y", workdir=tmp_path / "work", standby=s, warm=("json",))
    report = b.run(worker_fns.add, (1, 1), env={"GPU_OPS_TEST_VALUE": "other"}, log=Recorder())
    assert report.ok and report.value["env"] == "other" and report.ranks[0].pid != worker and b.adopted == 0
    b.stop_spares()
    b.teardown()
    assert wait_until(lambda: not _alive(keeper) and not _alive(worker))
    assert rendezvous_files(s.folder) == []


def test_an_unclaimed_standby_exits_by_itself_after_its_idle_timeout(tmp_path: Path) -> None:
    s = scope(tmp_path, idle_s=1.0)
    keeper, worker = parked_attempt(tmp_path, s)
    assert wait_until(lambda: not _alive(keeper) and not _alive(worker))
    assert rendezvous_files(s.folder) == []


def test_a_standby_ends_with_the_process_that_owns_the_run(tmp_path: Path) -> None:
    owner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        s = scope(tmp_path, owner_pid=owner.pid)
        keeper, worker = parked_attempt(tmp_path, s)
        owner.kill()
        owner.wait()
        assert wait_until(lambda: not _alive(keeper) and not _alive(worker))
        assert rendezvous_files(s.folder) == []
    finally:
        owner.kill()


def test_a_stale_rendezvous_is_ignored_and_removed(tmp_path: Path) -> None:
    s = scope(tmp_path)
    keeper, worker = parked_attempt(tmp_path, s)
    os.kill(keeper, signal.SIGKILL)  # the keeper dies without cleaning up; its worker follows it
    assert wait_until(lambda: not _alive(keeper) and not _alive(worker))
    (stale,) = rendezvous_files(s.folder)
    sock = Path(json.loads(stale.read_text())["socket"])
    assert sock.exists()  # a SIGKILLed keeper could not remove its socket either
    b = LocalBackend(name="a2", workdir=tmp_path / "work", standby=s, warm=("json",))
    report = b.run(worker_fns.add, (1, 1), env={"GPU_OPS_TEST_VALUE": "v"}, log=Recorder())
    assert report.ok and b.adopted == 0 and report.ranks[0].pid != worker
    assert not stale.exists() and not sock.exists()
    b.stop_spares()
    b.teardown()
    assert wait_until(lambda: rendezvous_files(s.folder) == [])


def test_a_keeper_that_does_not_end_on_sigterm_is_killed_and_its_record_removed(tmp_path: Path) -> None:
    """A keeper starved of CPU (or stopped) past the grace cannot remove its own record:
    the holder that SIGKILLs it removes it, so nothing is left for the next run to sweep."""
    s = scope(tmp_path)
    b = LocalBackend(name="a1", workdir=tmp_path / "work", standby=s, warm=("json",))
    assert b.run(worker_fns.add, (1, 1), env={"GPU_OPS_TEST_VALUE": "v"}, log=Recorder()).ok
    assert wait_until(lambda: len(rendezvous_files(s.folder)) == 1)  # the spare's keeper has written its record
    (spare,) = b.spares
    rec = json.loads(rendezvous_files(s.folder)[0].read_text())
    os.kill(spare.proc.pid, signal.SIGSTOP)  # it will not act on SIGTERM
    try:
        spare.stop(grace_s=0.5)
    finally:
        if spare.proc.poll() is None:  # whatever stop() did, no stopped keeper outlives the test
            spare.proc.kill()
            spare.proc.wait()
    assert spare.proc.returncode == -signal.SIGKILL
    assert rendezvous_files(s.folder) == [] and not Path(rec["socket"]).exists()
    assert wait_until(lambda: not _alive(rec["worker_pid"]))  # its worker followed it
    b.spares = []
    b.teardown()


def test_a_keeper_started_by_a_process_that_ignores_sigterm_still_ends_when_stopped(tmp_path: Path) -> None:
    """A SIGTERM that reaches a keeper before its own handler is in place can be lost
    (SIG_IGN survives exec; between fork and exec the parent's Python handler runs), and
    the keeper would sit out the grace and be SIGKILLed. The holder sends it again until
    the keeper acts on it."""
    s = scope(tmp_path)

    def popen(cmd: list[str], env: dict[str, str], stdin: object, stdout: object, stderr: object) -> subprocess.Popen:
        return subprocess.Popen(cmd, env=env, stdin=stdin, stdout=stdout, stderr=stderr, start_new_session=True)

    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        spare = standby_start(s, 0, dict(os.environ), "digest", [sys.executable, "-m", "gpu_ops.flows.compute.worker", "--standby"], popen)
        spare.stop(grace_s=30)  # at once: before the keeper can have installed its handler
    finally:
        signal.signal(signal.SIGTERM, previous)
    # It ended within the grace, not SIGKILLed after it (0, or -SIGTERM when a repeated
    # SIGTERM lands during interpreter shutdown, once the handlers are reset).
    assert spare.proc.returncode in (0, -signal.SIGTERM)
    assert rendezvous_files(s.folder) == []


def attempt_process(tmp_path: Path, fn: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "gpu_ops_tests.compute.standby_attempt", str(tmp_path / "standby"), str(os.getpid()), fn]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)


def test_a_claimant_that_dies_takes_its_adopted_worker_with_it(tmp_path: Path) -> None:
    """Two attempts in two processes, as under Dagster's multiprocess executor: the first
    ends and parks its standby; the second claims it and is SIGKILLed while the adopted
    worker runs: that worker must not live on (as a launched worker does not when its
    parent dies)."""
    first = attempt_process(tmp_path, "add")
    out, _ = first.communicate()
    assert first.returncode == 0 and "exit completed" in out
    assert wait_until(lambda: len(rendezvous_files(tmp_path / "standby")) == 1)  # its keeper may still be starting
    (record,) = rendezvous_files(tmp_path / "standby")
    rec = json.loads(record.read_text())
    keeper, worker = rec["keeper_pid"], rec["worker_pid"]
    second = attempt_process(tmp_path, "sleep_forever")
    assert second.stdout is not None
    lines = []
    for line in second.stdout:
        lines.append(line.rstrip())
        if "sleeping" in line:
            break
    assert f"worker started pid={worker} rank=0 (standby, already warm)" in lines and _alive(worker)
    second.kill()
    second.wait()
    assert wait_until(lambda: not _alive(keeper) and not _alive(worker))
    # the second attempt's own standby (parked by its death) would follow its idle timeout: discard it
    assert wait_until(lambda: discard(scope(tmp_path)) == 0 and rendezvous_files(tmp_path / "standby") == [])


def test_a_keeper_killed_under_its_adopted_worker_is_reported_once_the_worker_has_ended(tmp_path: Path) -> None:
    """The keeper is SIGKILLed while the worker it handed over runs: the worker stops itself
    (it watches its parent) and writes its outcome; the launch reports that outcome only
    once the worker is gone, never while it may still be writing a checkpoint."""
    s = scope(tmp_path)
    keeper, worker = parked_attempt(tmp_path, s)
    second = LocalBackend(name="a2", workdir=tmp_path / "work", standby=s, warm=("json",))
    log = Recorder("sleeping", lambda r: os.kill(keeper, signal.SIGKILL))
    report = second.run(worker_fns.sleep_forever, env={"GPU_OPS_TEST_VALUE": "v"}, log=log)
    assert report.ranks[0].pid == worker and not _alive(worker)
    assert report.exit is WorkerExit.SIGTERM  # what the worker itself wrote on its way out
    second.stop_spares()
    second.teardown()


def test_starting_a_standby_sweeps_the_records_of_dead_keepers_of_any_run(tmp_path: Path) -> None:
    other_run = scope(tmp_path, run_id="run-0")
    keeper, worker = parked_attempt(tmp_path, other_run)
    os.kill(keeper, signal.SIGKILL)
    assert wait_until(lambda: not _alive(keeper) and not _alive(worker))
    (stale,) = rendezvous_files(other_run.folder)
    sock = Path(json.loads(stale.read_text())["socket"])
    b = LocalBackend(name="b", workdir=tmp_path / "work", standby=scope(tmp_path), warm=("json",))
    assert b.run(worker_fns.add, (1, 1), env={"GPU_OPS_TEST_VALUE": "v"}, log=Recorder()).ok
    assert not stale.exists() and not sock.exists()
    b.stop_spares()
    b.teardown()
    assert wait_until(lambda: rendezvous_files(other_run.folder) == [])
