"""`LocalBackend`: run a launch as real subprocess workers on this machine.

Design: docs/concepts/compute.md#the-local-backend
"""

from __future__ import annotations

import os
import pickle
import queue
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Callable

from gpu_ops.domain.compute import fence
from gpu_ops.flows.compute import standby as standby_mod
from gpu_ops.domain.compute.backend import NOTICE_SIGNAL, Gone, HoldSink, LeaseLost, LogSink, RankReport, StartSink, WorkerExit, WorkerReport, hold_workers, lost_report
from gpu_ops.flows.compute.standby import AdoptedProcess, Standby, StandbyScope, is_alive, process_start
from gpu_ops.errors import LaunchError

PIDFILE_DIR_ENV = "GPU_OPS_PIDFILE_DIR"
_POLL_S = 0.05


def recorded_end(workdir: str | os.PathLike[str] | None) -> float | None:
    """When the workers of a launch folder ended, as they recorded it (wall clock): the
    result file's write, or the time a worker killed by its fence wrote just before dying
    (``result-N.pkl.ended``); None: unknown (killed from outside, or the folder is gone)."""
    folder = Path(workdir) if workdir else None
    if folder is None or not folder.is_dir():
        return None
    times = [p.stat().st_mtime for p in folder.glob("result-*.pkl")]
    for marker in folder.glob("result-*.pkl.ended"):
        try:
            times.append(float(marker.read_text()))
        except (OSError, ValueError):
            continue
    return max(times) if times else None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _pickle_by_reference(fn: Callable[..., Any], args: tuple, kwargs: dict) -> bytes:
    module = getattr(fn, "__module__", None)
    name = getattr(fn, "__qualname__", repr(fn))
    if module == "__main__":
        raise LaunchError(
            f"{name} is defined in __main__, which a worker cannot import: move it into a module "
            "(the Kubetorch backend has the same rule)"
        )
    if "<locals>" in name or "<lambda>" in name:
        raise LaunchError(f"{module}.{name} is a local function or lambda: define it at module level so a worker can import it")
    try:
        return pickle.dumps({"fn": fn, "args": tuple(args), "kwargs": dict(kwargs)}, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:
        raise LaunchError(f"cannot ship {module}.{name} and its arguments to a worker: {type(exc).__name__}: {exc}") from None


def _oom_kills() -> int | None:
    """This cgroup's OOM-kill counter (v2 memory.events or v1 memory.oom_control), if readable."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":
            candidate = Path("/sys/fs/cgroup") / path.lstrip("/") / "memory.events"
        elif "memory" in controllers.split(","):
            candidate = Path("/sys/fs/cgroup/memory") / path.lstrip("/") / "memory.oom_control"
        else:
            continue
        try:
            for row in candidate.read_text().splitlines():
                key, _, value = row.partition(" ")
                if key == "oom_kill":
                    return int(value)
        except (OSError, ValueError):
            continue
    return None


class _Route:
    """Where a worker's output lines go: a standby's go nowhere until it is adopted."""

    def __init__(self, lines: "queue.Queue[str] | None", prefix: str = ""):
        self.lines, self.prefix = lines, prefix

    def put(self, line: str) -> None:
        if self.lines is not None:
            self.lines.put(self.prefix + line)


@dataclass
class _Worker:
    rank: int
    proc: "subprocess.Popen[bytes] | AdoptedProcess"
    result_path: Path
    pidfile: Path | None
    readers: list[threading.Thread] = field(default_factory=list)
    sent_sigterm: bool = False
    ended_at: float | None = None
    route: _Route = field(default_factory=lambda: _Route(None))


# Variables that differ between attempts of the same launch; a standby started for one
# attempt receives the next attempt's values with its payload.
_PER_ATTEMPT_ENV = ("MASTER_PORT", fence.FENCE_ENV, fence.GRACE_ENV, fence.GO_ENV)


def _env_digest(env: dict[str, str], warm_args: list[str]) -> str:
    return standby_mod.env_digest({k: v for k, v in env.items() if k not in _PER_ATTEMPT_ENV}, warm_args)


class LocalBackend:
    """Runs ``fn`` in ``workers`` local subprocesses; see the module docstring."""

    def __init__(
        self,
        workers: int = 1,
        *,
        gpus: int | None = None,
        name: str | None = None,
        grace_period_s: float = 10.0,
        python: str = sys.executable,
        workdir: str | os.PathLike[str] | None = None,
        pidfile_dir: str | os.PathLike[str] | None = None,
        warm: tuple[str, ...] | list[str] = (),
        standby: StandbyScope | None = None,
        reap_wait_s: float = 5.0,
    ):
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        self.workers = workers
        self.gpus = gpus
        self.name = name or f"local-{uuid.uuid4().hex[:8]}"
        self.grace_period_s = grace_period_s
        self.python = python
        pid_dir = pidfile_dir or os.environ.get(PIDFILE_DIR_ENV)
        self.pidfile_dir = Path(pid_dir) if pid_dir else None
        self._workdir_parent = Path(workdir) if workdir else None
        self.workdir: Path | None = None
        self._workers: list[_Worker] = []
        # Modules every worker imports before the payload (and CUDA init when it has GPUs).
        self.warm = [m for m in warm if m]
        # standby: claim this scope's standbys (left by the previous attempt, in this
        # process or another) instead of starting cold workers, and while the launch runs
        # start one per rank for the next attempt (see gpu_ops.flows.compute.standby); after the
        # launch the caller parks them (park_spares: a retry may come) or stops them.
        self.standby = standby
        self.spares: list[Standby] = []
        self.adopted = 0
        self.reap_wait_s = reap_wait_s  # make_gone: how long SIGKILLed workers may take to exit

    # ------------------------------------------------------------------ launch

    def _env(self, rank: int, port: int, extra: dict[str, str]) -> dict[str, str]:
        env = dict(os.environ)
        env.update(extra)
        # The worker imports the author's module by name: give it the caller's sys.path.
        paths = [p for p in sys.path if p] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
        env.update(
            {
                "PYTHONUNBUFFERED": "1",  # lines reach the log as they are printed
                "RANK": str(rank),
                "LOCAL_RANK": str(rank),
                "WORLD_SIZE": str(self.workers),
                "LOCAL_WORLD_SIZE": str(self.workers),
                "NODE_RANK": "0",
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
                "GPU_OPS_WORKER": "1",
                "GPU_OPS_GRACE_S": str(self.grace_period_s),
            }
        )
        if self.gpus == 0:
            env["CUDA_VISIBLE_DEVICES"] = ""  # asked for no GPU: hide the machine's
        return env

    def _warm_args(self) -> list[str]:
        args = ["--warm", ",".join(self.warm)] if self.warm else []
        return args + (["--cuda"] if self.gpus and "torch" in self.warm else [])

    def _popen(self, cmd: list[str], env: dict[str, str], stdin: Any, stdout: Any = subprocess.PIPE, stderr: Any = subprocess.PIPE) -> subprocess.Popen:
        # The child starts with the notice signal blocked (the mask is inherited through
        # fork and exec) and unblocks it once its handler is in place: a notice during
        # start-up is delivered then, instead of killing the worker (SIGUSR1's default).
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, {NOTICE_SIGNAL})
        try:
            return subprocess.Popen(
                cmd,
                env=env,
                stdin=stdin,
                stdout=stdout,
                stderr=stderr,
                start_new_session=True,  # its own process group: kill the whole tree
            )
        except OSError as exc:
            raise LaunchError(f"cannot start a worker with {self.python}: {exc}") from None
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)

    def _start_readers(self, worker: _Worker) -> None:
        proc = worker.proc
        if isinstance(proc, AdoptedProcess):  # its keeper relays its lines and exit status
            targets: list[tuple[Callable[..., None], tuple]] = [(proc.pump, (worker.route.put,))]
        else:
            targets = [(_pump, (stream, worker.route)) for stream in (proc.stdout, proc.stderr)]
        for target, args in targets:
            t = threading.Thread(target=target, args=args, daemon=True)
            t.start()
            worker.readers.append(t)

    def _prefix(self, rank: int) -> str:
        return f"[rank {rank}] " if self.workers > 1 else ""

    def _write_pidfile(self, worker: _Worker) -> None:
        if self.pidfile_dir is not None:
            self.pidfile_dir.mkdir(parents=True, exist_ok=True)
            worker.pidfile = self.pidfile_dir / f"{self.name}.rank{worker.rank}.pid"
            tmp = worker.pidfile.with_suffix(".tmp")
            tmp.write_text(f"{worker.proc.pid}\n")
            os.replace(tmp, worker.pidfile)

    def _spawn(self, rank: int, port: int, payload: Path, env: dict[str, str], lines: "queue.Queue[str]") -> _Worker:
        assert self.workdir is not None
        result = self.workdir / f"result-{rank}.pkl"
        full = self._env(rank, port, env)
        proc: subprocess.Popen | AdoptedProcess | None = None
        if self.standby is not None:
            order = {"payload": str(payload), "result": str(result), "env": {k: full[k] for k in _PER_ATTEMPT_ENV if k in full}}
            proc = standby_mod.claim(self.standby, rank, _env_digest(full, self._warm_args()), order, self.grace_period_s)
            self.adopted += proc is not None
        if proc is None:
            cmd = [self.python, "-m", "gpu_ops.flows.compute.worker", "--payload", str(payload), "--result", str(result), *self._warm_args()]
            proc = self._popen(cmd, full, subprocess.DEVNULL)
        worker = _Worker(rank, proc, result, None, route=_Route(lines, self._prefix(rank)))
        self._start_readers(worker)
        self._write_pidfile(worker)
        return worker

    def _spawn_standby(self, rank: int, port: int, env: dict[str, str]) -> Standby:
        assert self.standby is not None
        full = self._env(rank, port, env)
        cmd = [self.python, "-m", "gpu_ops.flows.compute.worker", "--standby", *self._warm_args()]
        return standby_mod.start(self.standby, rank, full, _env_digest(full, self._warm_args()), cmd, self._popen, self.python)

    def run(
        self,
        fn: Callable[..., Any],
        args: tuple = (),
        kwargs: dict | None = None,
        *,
        env: dict[str, str] | None = None,
        log: LogSink = print,
        on_start: StartSink | None = None,
        hold: HoldSink | None = None,
    ) -> WorkerReport:
        data = _pickle_by_reference(fn, args, kwargs or {})
        if self._workdir_parent is not None:
            self._workdir_parent.mkdir(parents=True, exist_ok=True)
        self.workdir = Path(tempfile.mkdtemp(prefix=f"gpu-ops-{self.name}-", dir=self._workdir_parent))
        payload = self.workdir / "payload.pkl"
        payload.write_bytes(data)
        go = self.workdir / "go"
        extra = dict(env or {}, **({fence.GO_ENV: str(go)} if hold is not None else {}))
        lines: "queue.Queue[str]" = queue.Queue()
        port = free_port()
        oom_before = _oom_kills()
        started = time.monotonic()
        self._workers = []
        try:
            for rank in range(self.workers):
                self._workers.append(self._spawn(rank, port, payload, extra, lines))
            lost = self._go(hold, go)
            if lost is not None:
                log(f"{lost}")
                self._stop_all(lines, log)
                return lost_report(lost, time.monotonic() - started, self._lost_ranks(lost))
            self._started(port, env or {}, log, on_start)
            self._supervise(lines, log)
        except BaseException:
            # An interrupt (Dagster run termination, Ctrl-C) or a failing callback: stop
            # every worker before the exception propagates, so nothing outlives the step.
            self._stop_all(lines, log)
            self.stop_spares()
            raise
        finally:
            self._join_readers()
            _drain(lines, log)
            for w in self._workers:
                if w.pidfile is not None:
                    w.pidfile.unlink(missing_ok=True)
        return self._report(time.monotonic() - started, oom_before)

    def _started(self, port: int, env: dict[str, str], log: LogSink, on_start: StartSink | None) -> None:
        for w in self._workers:
            warm = " (standby, already warm)" if isinstance(w.proc, AdoptedProcess) else ""
            log(f"worker started pid={w.proc.pid} rank={w.rank}{warm}")
        if on_start is not None:
            on_start([w.proc.pid for w in self._workers])
        if self.standby is not None:
            self.spares = [self._spawn_standby(rank, port, env) for rank in range(self.workers)]

    def _go(self, hold: HoldSink | None, go: Path) -> LeaseLost | None:
        """Under a lease: write the workers on it, then let them start (the go file they wait for)."""
        lost = hold_workers(hold, self.holding())
        if lost is None and hold is not None:
            go.touch()
        return lost

    def _lost_ranks(self, lost: LeaseLost) -> list[RankReport]:
        return [RankReport(rank=w.rank, exit=WorkerExit.LOST, exit_code=w.proc.returncode, pid=w.proc.pid, error_message=str(lost)) for w in self._workers]

    def holding(self) -> dict[str, Any]:
        """This launch's workers as its lease records them: this host, each worker's pid
        and the kernel's start time of that process (so a reused pid is never taken for it)."""
        return {"backend": "local", "host": socket.gethostname(), "workers": [[w.proc.pid, process_start(w.proc.pid)] for w in self._workers]}

    def make_gone(self, workers: Mapping[str, Any]) -> Gone:
        """Stop the workers a stale lease recorded (:meth:`holding`, any process's on this
        host) and confirm they are gone; see :func:`stop_recorded`."""
        return stop_recorded(workers, self.reap_wait_s)

    def _supervise(self, lines: "queue.Queue[str]", log: LogSink) -> None:
        kill_at: float | None = None
        while True:
            try:
                log(lines.get(timeout=_POLL_S))
                _drain(lines, log, limit=1000)
            except queue.Empty:
                pass
            now = time.monotonic()
            running, failed = self._poll(now)
            if not running:
                return
            kill_at = self._escalate(running, failed, kill_at, now, log)

    def _poll(self, now: float) -> tuple[list[_Worker], bool]:
        """The workers still running, and whether any has ended with a failure."""
        running, failed = [], False
        for w in self._workers:
            code = w.proc.poll()
            if code is None:
                running.append(w)
                continue
            if w.ended_at is None:
                w.ended_at = now
            failed |= code != 0
        return running, failed

    def _escalate(self, running: list[_Worker], failed: bool, kill_at: float | None, now: float, log: LogSink) -> float | None:
        if failed and kill_at is None:
            # One rank is gone: the attempt has failed as a whole. Stop the others
            # now rather than let them block in a collective until a timeout.
            bad = [w.rank for w in self._workers if w.proc.returncode not in (None, 0)]
            log(f"rank {bad[0]} ended (exit {self._workers[bad[0]].proc.returncode}); stopping the other workers")
            for w in running:
                self._signal(w, signal.SIGTERM)
            return now + self.grace_period_s
        if kill_at is not None and now >= kill_at:
            for w in running:
                log(f"worker pid={w.proc.pid} rank={w.rank} ignored SIGTERM for {self.grace_period_s:g}s: SIGKILL")
                self._signal(w, signal.SIGKILL)
            return float("inf")
        return kill_at

    def _signal(self, w: _Worker, sig: int) -> None:
        if w.proc.poll() is not None:
            return
        try:
            if sig == signal.SIGKILL:
                os.killpg(w.proc.pid, signal.SIGKILL)  # the worker and anything it started
            else:
                w.sent_sigterm = True
                os.kill(w.proc.pid, sig)
        except ProcessLookupError:
            pass

    def _stop_all(self, lines: "queue.Queue[str]", log: LogSink) -> None:
        alive = [w for w in self._workers if w.proc.poll() is None]
        for w in alive:
            self._signal(w, signal.SIGTERM)
        deadline = time.monotonic() + self.grace_period_s
        while any(w.proc.poll() is None for w in alive) and time.monotonic() < deadline:
            time.sleep(_POLL_S)
        for w in alive:
            self._signal(w, signal.SIGKILL)
        for w in alive:
            try:
                w.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass

    def _join_readers(self) -> None:
        for w in self._workers:
            for t in w.readers:
                # A grandchild holding the pipe open must not hang the launch.
                t.join(timeout=2.0)

    # ------------------------------------------------------------------ report

    def _rank_report(self, w: _Worker, oom_kill: bool) -> tuple[RankReport, dict[str, Any]]:
        code = w.proc.returncode
        result: dict[str, Any] = {}
        if w.result_path.exists():
            try:
                result = pickle.loads(w.result_path.read_bytes())
            except Exception as exc:  # a result the parent cannot read (missing module)
                result = {"status": "error", "error_type": type(exc).__name__, "error_message": f"cannot read the worker's result: {exc}"}
        status = result.get("status")
        if status == "ok":
            exit, msg = WorkerExit.COMPLETED, None
        elif status in ("error", "oom"):
            exit = WorkerExit.OOM if status == "oom" else WorkerExit.ERROR
            msg = f"{result.get('error_type')}: {result.get('error_message')}"
        elif status == "sigterm" or code in (-signal.SIGTERM, 128 + signal.SIGTERM, -signal.SIGINT):
            exit, msg = WorkerExit.SIGTERM, "terminated by SIGTERM"
        elif code in (-signal.SIGKILL, 128 + signal.SIGKILL):
            if oom_kill:
                exit, msg = WorkerExit.OOM, "killed by the kernel OOM killer (exit 137)"
            else:
                exit, msg = WorkerExit.SIGKILL, "killed by SIGKILL"
        elif code is not None and code < 0:
            exit, msg = WorkerExit.ERROR, f"killed by {signal.Signals(-code).name}"
        else:
            exit, msg = WorkerExit.LOST, f"worker exited with code {code} without reporting a result"
        rank = RankReport(rank=w.rank, exit=exit, exit_code=code, pid=w.proc.pid, error_message=msg, value=result.get("value"))
        return rank, result

    def _cause_order(self, i: int) -> tuple[bool, float, bool]:
        w = self._workers[i]
        return (w.sent_sigterm, w.ended_at or float("inf"), (w.proc.returncode or 0) >= 0)

    def _report(self, duration: float, oom_before: int | None) -> WorkerReport:
        oom_after = _oom_kills()
        oom_kill = oom_before is not None and oom_after is not None and oom_after > oom_before
        ranks, results = [], []
        for w in self._workers:
            r, res = self._rank_report(w, oom_kill)
            ranks.append(r)
            results.append(res)
        failed = [i for i, r in enumerate(ranks) if r.exit is not WorkerExit.COMPLETED]
        ended_at = recorded_end(self.workdir)
        if not failed:
            return WorkerReport(exit=WorkerExit.COMPLETED, exit_code=0, value=ranks[0].value, duration_s=duration, ranks=ranks, ended_at=ended_at)
        # The root cause is the rank that ended first; the others were stopped because of it.
        # Ranks seen ending in the same poll: one killed by a signal comes first (a survivor's
        # error in a collective follows the loss of its peer, not the other way round).
        first = min(failed, key=self._cause_order)
        r, res = ranks[first], results[first]
        return WorkerReport(
            exit=r.exit,
            exit_code=r.exit_code,
            error_type=res.get("error_type"),
            error_message=(f"rank {r.rank}: " if self.workers > 1 else "") + (res.get("error_message") or r.error_message or ""),
            traceback=res.get("traceback"),
            duration_s=duration,
            ranks=ranks,
            ended_at=ended_at,
        )

    # ------------------------------------------------------------------ cleanup

    @property
    def pids(self) -> list[int]:
        return [w.proc.pid for w in self._workers]

    def park_spares(self) -> list[Standby]:
        """The launch failed and a retry may follow: leave its standbys running (their
        idle countdown starts) and hand them to the caller."""
        spares, self.spares = self.spares, []
        for s in spares:
            s.park()
        return spares

    def stop_spares(self) -> None:
        for s in self.spares:
            s.stop()
        self.spares = []

    def teardown(self) -> None:
        """Stop any live worker and standby not parked, and remove the launch's folder."""
        if any(w.proc.poll() is None for w in self._workers):
            self._stop_all(queue.Queue(), lambda _line: None)
        self.stop_spares()
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)


def stop_recorded(workers: Mapping[str, Any], wait_s: float = 5.0) -> Gone:
    """SIGKILL each recorded worker (``{"backend": "local", "host", "workers": [[pid,
    start], ...]}``) that is still the process recorded, its process group with it, and
    wait up to ``wait_s`` for every one to exit. SIGKILL ends a stopped process too; a
    zombie has exited. Confirmed only on the host that recorded them, and only when each
    pid is gone, is a zombie, or now names another process (another start time)."""
    refused = _not_here(workers)
    if refused is not None:
        return Gone(False, refused)
    procs = [(int(pid), str(start)) for pid, start in workers.get("workers", [])]
    killed = [pid for pid, start in procs if _kill_if_same(pid, start)]
    deadline = time.monotonic() + wait_s
    alive = [pid for pid, start in procs if is_alive(pid, start)]
    while alive and time.monotonic() < deadline:
        time.sleep(0.02)
        alive = [pid for pid, start in procs if is_alive(pid, start)]
    if alive:
        return Gone(False, f"worker pid {', '.join(map(str, alive))} still runs {wait_s:g} s after SIGKILL (uninterruptible, not this user's, or of unknown start time)")
    if killed:
        return Gone(True, f"its workers were stopped: SIGKILL of worker pid {', '.join(map(str, killed))}, confirmed gone")
    return Gone(True, f"its workers had already exited (pid {', '.join(str(pid) for pid, _ in procs) or 'none'})")


def _not_here(workers: Mapping[str, Any]) -> str | None:
    """Why the recorded workers cannot be stopped from here; None when they can."""
    if workers.get("backend") != "local":
        return f"its workers were started by the {workers.get('backend')!r} backend, which a local admission cannot stop"
    host, here = workers.get("host"), socket.gethostname()
    if host != here:
        return (
            f"its workers ran on host {host} and this admission runs on {here}: they cannot be stopped or confirmed gone from here "
            f"(an admission on {host} reclaims it; once {host} is known to be down, delete the lease's row from gpu_ops_gpu_leases)"
        )
    return None


def _kill_if_same(pid: int, start: str) -> bool:
    """SIGKILL ``pid`` (and its process group, when it leads one) if it is still the process
    that started at ``start``; True when it was signalled. Through a pidfd where there is
    one, so the check and the kill name the same process."""
    if not start:
        return False  # of unknown identity: never killed (and so never confirmed gone)
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return False
    except OSError:
        fd = -1  # no pidfd here: the start-time check alone
    try:
        if not is_alive(pid, start):
            return False  # gone, a zombie, or another process now
        leads = os.getpgid(pid) == pid  # its own session (the backend starts it so): what it started goes too
        if fd >= 0:
            signal.pidfd_send_signal(fd, signal.SIGKILL)
        else:
            os.kill(pid, signal.SIGKILL)
        if leads:  # the leader is a zombie now at most: its group id is not reused yet
            os.killpg(pid, signal.SIGKILL)
        return True
    except (ProcessLookupError, PermissionError):
        return False
    finally:
        if fd >= 0:
            os.close(fd)


def simulate_preemption(pid: int, notice_s: float | None, sig: int = signal.SIGKILL) -> threading.Thread:
    """What a spot reclaim looks like to a local worker: a notice (:data:`NOTICE_SIGNAL`)
    ``notice_s`` seconds before ``sig`` (None: no notice, only the kill). Returns the
    started thread that sends them."""

    def send() -> None:
        try:
            if notice_s is not None:
                os.kill(pid, NOTICE_SIGNAL)
                time.sleep(notice_s)
            os.kill(pid, sig)
        except ProcessLookupError:
            pass  # it already stopped after the notice

    t = threading.Thread(target=send, name="gpu-ops-simulated-preemption", daemon=True)
    t.start()
    return t


def _pump(stream: IO[bytes] | None, route: _Route) -> None:
    if stream is None:
        return
    with stream:
        for raw in iter(stream.readline, b""):
            route.put(raw.decode("utf-8", "replace").rstrip("\r\n"))


def _drain(lines: "queue.Queue[str]", log: LogSink, limit: int | None = None) -> None:
    n = 0
    while limit is None or n < limit:
        try:
            log(lines.get_nowait())
        except queue.Empty:
            return
        n += 1
