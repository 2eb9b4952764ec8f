"""Standby workers that outlive the attempt that started them: a keeper process, its warm
worker and their rendezvous record. No Dagster, no third-party import.

Design: docs/concepts/compute.md#standby-workers
"""

from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing
import os
import secrets
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

KEEPER_LOST = 255  # the claimant's return code when the keeper vanished without an exit status
_TICK_S = 0.2
_STOP = threading.Event()  # the keeper received SIGTERM
_CLAIM_TIMEOUT_S = 10.0


def run_owner_pid() -> int:
    """The process whose end means the run is over. Dagster's multiprocess executor runs
    each step in a ``multiprocessing`` child of the run's process; the in-process executor
    runs steps in the run's process itself."""
    parent = multiprocessing.parent_process()
    return parent.pid if parent is not None and parent.pid else os.getpid()


@dataclass(frozen=True)
class StandbyScope:
    """Which attempts may claim a standby: the same run and launch (asset key)."""

    run_id: str
    launch: str
    folder: Path
    idle_s: float = 600.0
    owner_pid: int = field(default_factory=run_owner_pid)

    def digest(self, rank: int) -> str:
        return hashlib.sha256(f"{self.run_id}\0{self.launch}\0{rank}".encode()).hexdigest()[:32]

    def records(self, rank: int | None = None) -> list[Path]:
        pattern = f"{self.digest(rank)}.*.json" if rank is not None else "*.json"
        found = rendezvous_files(self.folder, pattern)
        if rank is not None:
            return found
        return [p for p in found if (r := _read(p)) is not None and (r.get("run_id"), r.get("launch")) == (self.run_id, self.launch)]


def rendezvous_files(folder: Path, pattern: str = "*.json") -> list[Path]:
    return sorted(folder.glob(pattern)) if folder.is_dir() else []


def env_digest(env: dict[str, str], extra: Iterable[str] = ()) -> str:
    """What a standby must share with the attempt that claims it (environment and warm-up)."""
    return hashlib.sha256(json.dumps([sorted(env.items()), list(extra)]).encode()).hexdigest()


# --------------------------------------------------------------------------- processes


def _stat_fields(pid: int) -> list[str] | None:
    """``/proc/<pid>/stat`` after the command name (field 3 on: state first, start time at
    index 19); None where it cannot be read."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def process_start(pid: int) -> str:
    """The kernel's start time of ``pid`` (ticks since boot), '' where /proc is unreadable.
    A pid with another start time is another process (the pid was reused)."""
    fields = _stat_fields(pid)
    return fields[19] if fields is not None and len(fields) > 19 else ""


def is_alive(pid: int, start: str = "") -> bool:
    """``pid`` runs and is the process that had start time ``start`` (zombies do not run)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    fields = _stat_fields(pid)
    if fields is None:
        return not start
    return fields[0] != "Z" and (not start or fields[19] == start)


def _kill_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _read(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _remove_stale(path: Path, rec: dict[str, Any]) -> None:
    """A record whose keeper died without cleaning up (SIGKILL): remove it and its socket."""
    path.unlink(missing_ok=True)
    sock = Path(str(rec.get("socket", "")))
    if sock.suffix == ".sock" and sock.parent.name.startswith("gpu-ops-standby-"):
        sock.unlink(missing_ok=True)


def _socket_dir() -> Path:
    """Unix socket paths are limited to ~100 bytes: a private folder under the temp dir."""
    folder = Path(tempfile.gettempdir()) / f"gpu-ops-standby-{os.getuid()}"
    folder.mkdir(mode=0o700, exist_ok=True)
    st = folder.stat()
    if st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise PermissionError(f"{folder} must belong to this user with mode 0700")
    return folder


# --------------------------------------------------------------------------- holder side


class Standby:
    """The holder's handle on a keeper it started."""

    def __init__(self, proc: subprocess.Popen, scope: StandbyScope, rank: int):
        self.proc, self.scope, self.rank = proc, scope, rank

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def _records(self) -> Iterator[tuple[Path, dict[str, Any]]]:
        """The records its keeper wrote (one, once written), with their contents."""
        for path in self.scope.records(self.rank):
            rec = _read(path) or {}
            if rec.get("keeper_pid") == self.proc.pid:
                yield path, rec

    @property
    def worker_pid(self) -> int | None:
        """Its warm worker's pid, from the keeper's record (None before it is written)."""
        return next((int(rec["worker_pid"]) for _, rec in self._records()), None)

    def park(self) -> None:
        """The attempt is over: the keeper's idle countdown starts (its stdin closes)."""
        try:
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        except OSError:
            pass

    def stop(self, grace_s: float = 10.0) -> None:
        """End the keeper and its worker now, and reap the keeper. A keeper that does not
        end within ``grace_s`` of SIGTERM (stopped, or starved of CPU) is SIGKILLed, and
        its record removed here: it cannot remove it itself, and a record left behind
        would outlive the run."""
        self.park()
        if not self._terminate(grace_s):
            self.proc.kill()  # its worker follows it (it watches its parent)
            # Dead but not reaped: its pid cannot be reused while its record is removed.
            os.waitid(os.P_PID, self.proc.pid, os.WEXITED | os.WNOWAIT)
            for path, rec in list(self._records()):
                _remove_stale(path, rec)
            self.proc.wait()

    def _terminate(self, grace_s: float) -> bool:
        """SIGTERM until it ends or ``grace_s`` passes; True when it ended. Sent again
        every 0.1 s, because one that arrives before the keeper's own handler is in place
        can be lost: between fork and exec the child still runs its parent's handler
        (Dagster installs one in step processes), and a parent that ignores SIGTERM
        passes SIG_IGN on through exec."""
        deadline = time.monotonic() + grace_s
        while self.proc.poll() is None:
            if time.monotonic() >= deadline:
                return False
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=0.1)
            except subprocess.TimeoutExpired:
                pass
        return True


Popen = Callable[[list[str], dict[str, str], Any, Any, Any], subprocess.Popen]


def start(scope: StandbyScope, rank: int, env: dict[str, str], digest: str, worker_cmd: list[str], popen: Popen, python: str = sys.executable) -> Standby:
    """Start a keeper (and through it a warm worker) for ``rank`` of the next attempt."""
    scope.folder.mkdir(parents=True, exist_ok=True)
    sweep(scope.folder)
    spec = {
        "run_id": scope.run_id, "launch": scope.launch, "rank": rank, "env_digest": digest, "folder": str(scope.folder),
        "digest": scope.digest(rank), "idle_s": scope.idle_s, "owner_pid": scope.owner_pid, "owner_start": process_start(scope.owner_pid),
    }
    cmd = [python, "-m", "gpu_ops.flows.compute.standby", "--spec", json.dumps(spec), "--", *worker_cmd]
    return Standby(popen(cmd, env, subprocess.PIPE, subprocess.DEVNULL, subprocess.DEVNULL), scope, rank)


def sweep(folder: Path) -> int:
    """Remove the records (and sockets) of keepers that died without cleaning up, any run's."""
    n = 0
    for path in rendezvous_files(folder):
        rec = _read(path)
        if rec is not None and not is_alive(int(rec.get("keeper_pid", 0)), str(rec.get("keeper_start", ""))):
            _remove_stale(path, rec)
            n += 1
    return n


def discard(scope: StandbyScope) -> int:
    """Stop every live standby of ``scope``, whoever started it; remove stale records."""
    n = 0
    for path in scope.records():
        rec = _read(path) or {}
        if is_alive(int(rec.get("keeper_pid", 0)), str(rec.get("keeper_start", ""))):
            os.kill(int(rec["keeper_pid"]), signal.SIGTERM)
            n += 1
        else:
            _remove_stale(path, rec)
    return n


# --------------------------------------------------------------------------- claimant side


class AdoptedProcess:
    """A claimed standby worker, seen through its keeper: it is not this process's child,
    so its output and exit status arrive over the socket. Quacks like ``subprocess.Popen``
    where the local backend needs it (``pid``, ``poll``, ``wait``, ``returncode``)."""

    stdin = None
    stdout = None
    stderr = None

    def __init__(self, pid: int, keeper_pid: int, conn: socket.socket, reader: IO[bytes], grace_s: float = 30.0):
        self.pid, self.keeper_pid, self.grace_s = pid, keeper_pid, grace_s
        self.start = process_start(pid)  # it runs now: its identity, should the keeper vanish
        self.returncode: int | None = None
        self._conn, self._reader = conn, reader
        self._done = threading.Event()

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._done.wait(timeout):
            raise subprocess.TimeoutExpired(f"adopted worker {self.pid}", timeout or 0.0)
        assert self.returncode is not None
        return self.returncode

    def pump(self, put: Callable[[str], None]) -> None:
        """Relay the worker's lines to ``put`` until the keeper reports its exit status."""
        code = KEEPER_LOST
        try:
            for raw in self._reader:
                msg = json.loads(raw)
                if "line" in msg:
                    put(msg["line"])
                elif "exit" in msg:
                    code = int(msg["exit"])
                    break
        except (OSError, ValueError):
            pass
        finally:
            for closable in (self._reader, self._conn):
                try:
                    closable.close()
                except OSError:
                    pass
            if code == KEEPER_LOST:
                self._outlive_worker()
            self.returncode = code
            self._done.set()

    def _outlive_worker(self) -> None:
        """The keeper vanished without an exit status: the worker stops itself (it watches
        its parent, then SIGTERM, then SIGKILL after its grace); report only once it is gone,
        so its own outcome (the result file) is complete and no new attempt overlaps it."""
        deadline = time.monotonic() + self.grace_s + 5.0
        while is_alive(self.pid, self.start) and time.monotonic() < deadline:
            time.sleep(_TICK_S)
        if is_alive(self.pid, self.start):
            _kill_group(self.pid, signal.SIGKILL)


def claim(scope: StandbyScope, rank: int, digest: str, order: dict[str, Any], grace_s: float = 30.0) -> AdoptedProcess | None:
    """Take over this scope's standby for ``rank`` with ``order`` (payload, result, env);
    None when there is none alive with the same environment. ``grace_s``: the worker's
    SIGTERM-to-SIGKILL grace."""
    for path in scope.records(rank):
        rec = _read(path)
        if rec is None:
            continue
        if not is_alive(int(rec.get("keeper_pid", 0)), str(rec.get("keeper_start", ""))):
            _remove_stale(path, rec)  # its keeper is gone
            continue
        if (rec.get("run_id"), rec.get("launch"), rec.get("rank")) != (scope.run_id, scope.launch, rank):
            continue  # never another run's or launch's
        if rec.get("env_digest") != digest:
            os.kill(int(rec["keeper_pid"]), signal.SIGTERM)  # started for another environment: no attempt of this launch can use it
            continue
        adopted = _connect(rec, {**order, "run_id": scope.run_id, "launch": scope.launch, "rank": rank, "env_digest": digest, "token": rec["token"]}, grace_s)
        if adopted is not None:
            return adopted
    return None


def _connect(rec: dict[str, Any], order: dict[str, Any], grace_s: float) -> AdoptedProcess | None:
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.settimeout(_CLAIM_TIMEOUT_S)
        conn.connect(rec["socket"])
        conn.sendall((json.dumps(order) + "\n").encode())
        reader = conn.makefile("rb")
        reply = json.loads(reader.readline() or b"{}")
    except (OSError, ValueError):
        conn.close()
        return None  # claimed by someone else a moment ago, or it just ended
    if not reply.get("ok"):
        conn.close()
        return None
    conn.settimeout(None)
    return AdoptedProcess(int(reply["pid"]), int(rec["keeper_pid"]), conn, reader, grace_s)


# --------------------------------------------------------------------------- the keeper


class _Keeper:
    def __init__(self, spec: dict[str, Any], worker_cmd: list[str]):
        self.spec = spec
        self.folder = Path(spec["folder"])
        self.token = secrets.token_hex(16)
        self.record = self.folder / f"{spec['digest']}.{self.token[:12]}.json"
        self.sock_path = _socket_dir() / f"{self.token[:24]}.sock"
        self.listener: socket.socket | None = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(str(self.sock_path))
        self.listener.listen(4)
        self.early = bytearray()  # the worker's warm-up output, replayed to the claimant (last 64 KiB)
        self.worker = subprocess.Popen(worker_cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
        self._write_record()

    def _write_record(self) -> None:
        rec = {
            **{k: self.spec[k] for k in ("run_id", "launch", "rank", "env_digest", "owner_pid", "owner_start", "idle_s")},
            "token": self.token, "socket": str(self.sock_path), "keeper_pid": os.getpid(), "keeper_start": process_start(os.getpid()),
            "worker_pid": self.worker.pid, "created": time.time(),
        }
        tmp = self.record.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(rec, f)
        os.replace(tmp, self.record)

    def _unregister(self) -> None:
        self.record.unlink(missing_ok=True)
        if self.listener is not None:
            self.listener.close()
            self.listener = None
        self.sock_path.unlink(missing_ok=True)

    def _owner_alive(self) -> bool:
        return is_alive(int(self.spec["owner_pid"]), str(self.spec["owner_start"]))

    def wait_for_claim(self) -> socket.socket | None:
        """Until claimed (the claimant's connection) or a reason to end (None)."""
        holder_open, parked_at = True, None
        out = self.worker.stdout
        assert out is not None and self.listener is not None
        while not _STOP.is_set() and self.worker.poll() is None and self._owner_alive():
            if parked_at is not None and time.monotonic() - parked_at >= float(self.spec["idle_s"]):
                return None
            watch: list[Any] = [self.listener, out] + ([sys.stdin] if holder_open else [])
            ready, _, _ = _select(watch, _TICK_S)  # interrupted: nothing ready, look again
            if holder_open and sys.stdin in ready and not os.read(sys.stdin.fileno(), 4096):
                # the holder's attempt is over (or it died): count idle time from now
                holder_open, parked_at = False, time.monotonic()
            if out in ready:
                self._keep_early_output(out)
            if self.listener in ready:
                conn, _ = self.listener.accept()
                if self._accept(conn):
                    return conn
        return None

    def _keep_early_output(self, out: Any) -> None:
        """The worker's output before a claim: its last 64 KiB are kept for the claimant."""
        data = os.read(out.fileno(), 65536)
        self.early += data
        del self.early[:-65536]
        if not data:
            time.sleep(_TICK_S)  # the worker is ending; poll() says so next turn

    def _accept(self, conn: socket.socket) -> bool:
        try:
            conn.settimeout(_CLAIM_TIMEOUT_S)
            order = json.loads(conn.makefile("rb").readline() or b"{}")
            want = (self.spec["run_id"], self.spec["launch"], self.spec["rank"], self.spec["env_digest"], self.token)
            if (order.get("run_id"), order.get("launch"), order.get("rank"), order.get("env_digest"), order.get("token")) != want:
                _send(conn, {"ok": False, "why": "not this standby's run, launch, rank or environment"})
                conn.close()
                return False
            self._unregister()  # claimed: nobody else can find or reach it
            assert self.worker.stdin is not None
            activation = {k: order.get(k) for k in ("payload", "result", "env")}
            self.worker.stdin.write((json.dumps(activation) + "\n").encode())
            self.worker.stdin.close()
            _send(conn, {"ok": True, "pid": self.worker.pid})
            for line in bytes(self.early).decode("utf-8", "replace").splitlines():
                _send(conn, {"line": line})
            conn.settimeout(None)
            return True
        except (OSError, ValueError):
            conn.close()
            return False

    def relay(self, conn: socket.socket) -> None:
        """The worker's output to the claimant, then its exit status. A claimant that
        disconnects (it died) or a SIGTERM here stops the worker."""
        out = self.worker.stdout
        assert out is not None
        pending = b""
        open_ = True
        while open_:
            if _STOP.is_set():
                self._stop_worker()
            ready, _, _ = _select([out, conn], _TICK_S)
            if conn in ready and not conn.recv(4096):
                self._stop_worker()  # the claimant is gone
                return
            if out in ready:
                data = os.read(out.fileno(), 65536)
                open_ = bool(data)
                pending += data
            elif self.worker.poll() is not None:
                open_ = False  # exited; a grandchild may hold the pipe: do not wait for EOF
            *lines, pending = pending.split(b"\n")
            if not _send_lines(conn, lines):
                self._stop_worker()
                return
        _send_end(conn, pending, self.worker.wait())

    def _stop_worker(self) -> None:
        if self.worker.poll() is not None:
            return
        self.worker.send_signal(signal.SIGTERM)
        try:
            self.worker.wait(timeout=float(os.environ.get("GPU_OPS_GRACE_S", "10")))
        except subprocess.TimeoutExpired:
            _kill_group(self.worker.pid, signal.SIGKILL)
            self.worker.wait()

    def shut_down(self) -> None:
        self._unregister()
        if self.worker.poll() is None:
            _kill_group(self.worker.pid, signal.SIGKILL)  # an idle standby holds no work
            self.worker.wait()


def _send(conn: socket.socket, msg: dict[str, Any]) -> None:
    conn.sendall((json.dumps(msg) + "\n").encode())


def _send_lines(conn: socket.socket, lines: list[bytes]) -> bool:
    """Each of the worker's lines to the claimant; False when it cannot be reached."""
    try:
        for line in lines:
            _send(conn, {"line": line.decode("utf-8", "replace").rstrip("\r")})
    except OSError:
        return False
    return True


def _send_end(conn: socket.socket, pending: bytes, code: int) -> None:
    """The worker's last, unterminated line and its exit status, then the connection closes."""
    try:
        if pending:
            _send(conn, {"line": pending.decode("utf-8", "replace")})
        _send(conn, {"exit": code})
    except OSError:
        pass
    conn.close()


def _select(fds: list[Any], timeout: float) -> tuple[list[Any], list[Any], list[Any]]:
    try:
        return select.select(fds, [], [], timeout)
    except InterruptedError:
        return [], [], []


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpu_ops.flows.compute.standby")
    parser.add_argument("--spec", required=True)
    parser.add_argument("worker_cmd", nargs=argparse.REMAINDER)
    opts = parser.parse_args(argv)
    worker_cmd = opts.worker_cmd[1:] if opts.worker_cmd[:1] == ["--"] else opts.worker_cmd
    signal.signal(signal.SIGTERM, lambda _s, _f: _STOP.set())
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C in the terminal that started the run is the run's business
    keeper = _Keeper(json.loads(opts.spec), worker_cmd)
    try:
        conn = keeper.wait_for_claim()
        if conn is not None:
            keeper.relay(conn)
    finally:
        keeper.shut_down()
    return 0


if __name__ == "__main__":
    sys.exit(main())
