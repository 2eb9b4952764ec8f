"""A frozen GPU lease holder never shares its GPU: a lease is handed on only once its
holder's workers are confirmed gone.

A stopped process keeps its GPU memory and cannot read its fence, so the fence alone
cannot stop a holder frozen whole (a VM pause, a frozen node). Real processes, real
signals, a real 1-GPU quota on SQLite: the first launch runs in a process of its own
(``GpuCompute.launch`` on the local backend, as a Dagster step process runs it) with a
worker that ticks and ignores SIGTERM; every non-empty subset of {launcher, worker} is
SIGSTOPped (once with the database locked past the lease's expiry as well, once with the
launcher SIGKILLed under its stopped worker); a second launch in the test process waits
for the quota. A sampler counts, every 20 ms, the live, non-zombie worker processes
of that quota: every worker a lease ever recorded (pid and start time) or a pidfile named.
It never sees two, the second is admitted only once the first's worker is gone, and it
trains. Also: a stale lease whose workers cannot be confirmed gone (another host) is not
reclaimed; a recorded pid that now names another process is not killed; workers do not
run before their pids are on the lease.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

from gpu_ops.domain.compute.backend import LeaseLost, WorkerExit
from gpu_ops.flows.compute.local import PIDFILE_DIR_ENV, LocalBackend
from gpu_ops.storage.quota import LeaseBook, Quotas
from gpu_ops.domain.compute.request import Attribution, GpuRequest
from gpu_ops.dagster.compute.admission import BudgetGate, GpuAdmission
from gpu_ops.dagster.compute.resource import GpuCompute, LocalGpuCompute, StandbySettings
from gpu_ops.flows.compute.standby import is_alive, process_start
from gpu_ops.storage.tables import TableStore
from gpu_ops_tests.compute import worker_fns
from gpu_ops_tests.compute.test_fencing import database_unavailable
from gpu_ops_tests.waiting import wait_until

REPO = Path(__file__).resolve().parents[2]
TTL = 3.0
QUOTA = Quotas(team={"nlp": 1})
REQUEST = GpuRequest(gpu_type="t4", gpus=1, capacity="spot", labels=Attribution(team="nlp"))

# The first launch: what a Dagster step process does with GpuCompute, in its own process.
HOLDER = textwrap.dedent(
    """
    import sys
    from gpu_ops.domain.compute.request import Attribution, GpuRequest
    from gpu_ops_tests.compute import worker_fns
    from gpu_ops_tests.compute.test_frozen_holder import local_compute
    cfg, folder = sys.argv[1], sys.argv[2]
    compute = local_compute(cfg, folder + "/work-first")
    request = GpuRequest(gpu_type="t4", gpus=1, capacity="spot", labels=Attribution(team="nlp"))
    report = compute.launch(
        None, request, worker_fns.tick_until, args=(folder + "/ticks", folder + "/stop"),
        on_start=lambda pids: print("pid-of-worker", pids[0], flush=True), log=lambda m: print(m, flush=True),
    )
    print("ended", report.exit.value, flush=True)
    """
)


def write_config(folder: Path) -> Path:
    cfg = folder / "gpu_ops.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "storage": {"url": f"sqlite:///{folder / 'leases.db'}", "statement_timeout_s": 1},
                "prices": {"source": "t", "as_of": "2026-11-01", "gpus": {"t4": {"spot": 0.2}}},
                "compute": {
                    "quotas": {"team": {"nlp": 1}},
                    "admission": {"lease_ttl_s": TTL, "backoff_s": 0.1, "backoff_max_s": 0.2, "wait_timeout_s": 60},
                },
            }
        )
    )
    return cfg


def local_compute(cfg: str, workdir: str) -> LocalGpuCompute:
    return LocalGpuCompute(
        local_workdir=workdir, config_path=cfg, standby=StandbySettings(enabled=False), admission=GpuAdmission(config_path=cfg), budget_gate=BudgetGate(config_path=cfg),
    )


class Sampler(threading.Thread):
    """Every 20 ms: the live, non-zombie workers among every (pid, start time) that a lease
    row ever recorded or a pidfile ever named; the most seen at once."""

    def __init__(self, db: Path, pid_dir: Path):
        super().__init__(daemon=True)
        self.db, self.pid_dir = db, pid_dir
        self.seen: set[tuple[int, str]] = set()
        self.most = 0
        self.done = threading.Event()

    def named(self) -> set[tuple[int, str]]:
        found = set()
        for path in self.pid_dir.glob("*.pid"):
            try:
                pid = int(path.read_text())
            except (OSError, ValueError):
                continue
            found.add((pid, process_start(pid)))
        try:
            with sqlite3.connect(f"file:{self.db}?mode=ro", uri=True, timeout=0.01) as conn:
                rows = conn.execute("SELECT workers FROM gpu_ops_gpu_leases").fetchall()
        except sqlite3.OperationalError:  # not created yet
            rows = []
        for (workers,) in rows:
            for pid, start in json.loads(workers or "{}").get("workers", []):
                found.add((int(pid), str(start)))
        return {(pid, start) for pid, start in found if start}  # '': gone before it was looked at

    def run(self) -> None:
        while not self.done.wait(0.02):
            self.seen |= self.named()
            self.most = max(self.most, sum(is_alive(pid, start) for pid, start in self.seen))


class Second(threading.Thread):
    """The second launch, waiting for the quota: when it was admitted, whether the first's
    worker was still alive then, and its report."""

    def __init__(self, compute: GpuCompute, folder: Path, first_worker: tuple[int, str]):
        super().__init__(daemon=True)
        self.compute, self.folder, self.first_worker = compute, folder, first_worker
        self.messages: list[str] = []
        self.admitted_at: float | None = None
        self.first_alive_when_admitted: bool | None = None
        self.started = threading.Event()
        self.report: Any = None

    def admitted(self, _lease: Any) -> None:
        self.first_alive_when_admitted = is_alive(*self.first_worker)
        self.admitted_at = time.monotonic()

    def run(self) -> None:
        log = SimpleNamespace(info=self.messages.append, warning=self.messages.append)
        self.report = self.compute.launch(
            SimpleNamespace(log=log), REQUEST, worker_fns.train_steps, args=(str(self.folder / "steps"), 10, 0.05),
            on_admitted=self.admitted, on_start=lambda _pids: self.started.set(),
        )


def start_holder(cfg: Path, folder: Path) -> tuple[subprocess.Popen, int]:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(cfg), str(folder)], stdout=subprocess.PIPE, text=True, cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("pid-of-worker "):
            return proc, int(line.split()[1])
    raise AssertionError(f"the first launch ended before its worker started (exit {proc.wait()})")


# (SIGSTOPped, SIGKILLed, database locked past the lease's expiry)
CASES = [
    (("launcher",), (), False),
    (("worker",), (), False),
    (("launcher", "worker"), (), False),
    (("launcher", "worker"), (), True),
    (("worker",), ("launcher",), False),
]
IDS = ["launcher", "worker", "launcher+worker", "launcher+worker+db-outage", "worker+launcher-killed"]


@pytest.mark.parametrize(("frozen", "killed", "outage"), CASES, ids=IDS)
def test_a_frozen_holder_never_shares_its_gpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, frozen: tuple[str, ...], killed: tuple[str, ...], outage: bool
) -> None:
    pid_dir = tmp_path / "pids"
    monkeypatch.setenv(PIDFILE_DIR_ENV, str(pid_dir))
    cfg = write_config(tmp_path)
    sampler = Sampler(tmp_path / "leases.db", pid_dir)
    sampler.start()
    holder, worker = start_holder(cfg, tmp_path)
    procs = {"launcher": holder.pid, "worker": worker}
    renewing = "launcher" not in frozen + killed  # its lease stays live while its worker is frozen
    try:
        assert wait_until(lambda: (tmp_path / "ticks").exists(), timeout=30)
        first = (worker, process_start(worker))
        for name in frozen:
            os.kill(procs[name], signal.SIGSTOP)
        for name in killed:
            os.kill(procs[name], signal.SIGKILL)
        second = Second(local_compute(str(cfg), str(tmp_path / "work-second")), tmp_path, first)
        second.start()
        if outage:  # the database is unavailable past the lease's expiry: nobody is admitted meanwhile
            with database_unavailable(f"sqlite:///{tmp_path / 'leases.db'}"):
                time.sleep(TTL + 1.0)
                assert second.admitted_at is None
        if renewing:
            time.sleep(1.5 * TTL)
            assert second.admitted_at is None
            os.kill(worker, signal.SIGCONT)
            (tmp_path / "stop").touch()  # the first launch ends by itself
        assert second.started.wait(timeout=60)
        for name in frozen:  # resumed after the GPU was handed on: the first launch starts nothing
            with contextlib.suppress(ProcessLookupError):  # a worker that ended is reaped
                os.kill(procs[name], signal.SIGCONT)
        second.join(timeout=60)
    finally:
        for pid in procs.values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        (tmp_path / "stop").touch()
        assert holder.wait(timeout=30) == (-signal.SIGKILL if killed else 0)
        sampler.done.set()
        sampler.join()
    assert second.report is not None and second.report.ok and second.report.value == 10  # it trained
    assert second.first_alive_when_admitted is False  # admitted only once the first's worker was gone
    assert sampler.most == 1 and len(sampler.seen) == 2, (sampler.most, sampler.seen)
    reclaims = [m for m in second.messages if m.startswith("reclaimed an expired GPU lease")]
    if renewing:
        assert reclaims == []  # released by its holder
    elif "worker" in frozen:
        assert len(reclaims) == 1 and f"SIGKILL of worker pid {worker}" in reclaims[0], reclaims
    else:  # its fence had stopped it
        assert len(reclaims) == 1 and "had already exited" in reclaims[0], reclaims
    assert LeaseBook(TableStore(f"sqlite:///{tmp_path / 'leases.db'}")).snapshot()[1] == []


def test_a_stale_lease_whose_workers_run_on_another_host_is_not_reclaimed(pg_url: str) -> None:
    book = LeaseBook(TableStore(pg_url), ttl_s=0.5, reclaimer=LocalBackend(name="reclaimer"))
    held = book.try_acquire(QUOTA, team="nlp", pools=[], gpus=1, run_id="frozen", asset_key="a").lease
    assert held is not None and book.record_workers(held, {"backend": "local", "host": "gpu-node-7", "workers": [[4242, "1234"]]})
    assert wait_until(lambda: book.snapshot()[0] > held.expires_at + 0.05, timeout=10)
    waiting = book.try_acquire(QUOTA, team="nlp", pools=[], gpus=1, run_id="second", asset_key="a")
    assert not waiting.granted and waiting.reclaimed == ()
    assert "nlp holds 1 of 1 GPUs; waiting for 1" in waiting.reason
    assert f"lease {held.lease_id[:8]} of run frozen (1 GPU(s) of nlp" in waiting.reason and "expired but is not reclaimed" in waiting.reason
    assert "its workers ran on host gpu-node-7" in waiting.reason and "cannot be stopped or confirmed gone from here" in waiting.reason
    assert [le.run_id for le in book.snapshot()[1]] == ["frozen"]


def test_a_recorded_pid_that_names_another_process_now_is_not_killed(tmp_path: Path) -> None:
    """The recorded worker is gone and its pid belongs to someone else (another start time):
    the lease is reclaimed and that process lives on."""
    book = LeaseBook(TableStore(f"sqlite:///{tmp_path / 'c.db'}"), ttl_s=0.5, reclaimer=LocalBackend(name="reclaimer"))
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        held = book.try_acquire(QUOTA, team="nlp", pools=[], gpus=1, run_id="gone", asset_key="a").lease
        assert held is not None
        import socket

        book.record_workers(held, {"backend": "local", "host": socket.gethostname(), "workers": [[other.pid, str(int(process_start(other.pid)) + 1)]]})
        assert wait_until(lambda: book.snapshot()[0] > held.expires_at + 0.05, timeout=10)
        second = book.try_acquire(QUOTA, team="nlp", pools=[], gpus=1, run_id="second", asset_key="a")
        assert second.granted and [le.run_id for le in second.reclaimed] == ["gone"]
        assert other.poll() is None  # not killed
    finally:
        other.kill()
        other.wait()


def test_workers_do_not_run_before_their_pids_are_on_the_lease(tmp_path: Path) -> None:
    """The backend records its workers through ``hold`` before they may start the function:
    while ``hold`` runs the workers exist (their pids are what it records) and have not
    ticked; a ``hold`` that finds the lease gone stops them before they ever run it."""
    ticks = tmp_path / "ticks"
    seen: list[dict[str, Any]] = []

    def hold(workers: dict[str, Any]) -> None:
        seen.append(dict(workers))
        (pid, start), = workers["workers"]
        assert is_alive(pid, start)
        time.sleep(0.5)  # the worker waits meanwhile
        assert not ticks.exists()

    backend = LocalBackend(name="gated", workdir=tmp_path / "work")
    report = backend.run(worker_fns.train_steps, (str(ticks), 3, 0.01), hold=hold, log=lambda _m: None)
    assert report.ok and report.value == 3 and len(ticks.read_text().split()) == 3
    assert seen[0]["host"] and seen[0]["backend"] == "local" and seen[0]["workers"][0][0] == report.ranks[0].pid

    def lost(_workers: dict[str, Any]) -> None:
        raise LeaseLost("GPU lease 1234abcd expired before its workers were recorded on it")

    backend = LocalBackend(name="refused", workdir=tmp_path / "work")
    report = backend.run(worker_fns.train_steps, (str(tmp_path / "never"), 3, 0.01), hold=lost, log=lambda _m: None)
    assert report.exit is WorkerExit.LOST and "expired before its workers were recorded" in (report.error_message or "")
    assert not (tmp_path / "never").exists() and not is_alive(report.ranks[0].pid, "")


def test_an_adopted_standby_waits_for_its_pid_on_the_lease_too(tmp_path: Path) -> None:
    """A retry that adopts a parked standby worker (already warm) records that worker's pid
    before the worker runs the function, as for a cold one."""
    from gpu_ops_tests.compute.test_standby import parked_attempt, scope

    s = scope(tmp_path)
    _keeper, standby_worker = parked_attempt(tmp_path, s)
    ticks = tmp_path / "ticks"
    recorded: list[int] = []

    def hold(workers: dict[str, Any]) -> None:
        (pid, start), = workers["workers"]
        recorded.append(pid)
        assert is_alive(pid, start)
        time.sleep(0.5)
        assert not ticks.exists()

    backend = LocalBackend(name="a2", workdir=tmp_path / "work", standby=s, warm=("json",))
    try:
        report = backend.run(worker_fns.train_steps, (str(ticks), 3, 0.01), env={"GPU_OPS_TEST_VALUE": "v"}, hold=hold, log=lambda _m: None)
    finally:
        backend.stop_spares()
        backend.teardown()
    assert backend.adopted == 1 and recorded == [standby_worker] and report.ranks[0].pid == standby_worker
    assert report.ok and report.value == 3
