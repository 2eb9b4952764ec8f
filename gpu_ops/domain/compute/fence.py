"""The fence between a GPU lease and the workers that use it: the fence file, its watchdog,
the go-ahead, and the relay to remote (Kubetorch) workers. Standard library only.

Design: docs/concepts/compute.md#the-fence-file
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

FENCE_ENV = "GPU_OPS_FENCE_FILE"
GRACE_ENV = "GPU_OPS_FENCE_GRACE_S"
GO_ENV = "GPU_OPS_GO_FILE"
VALID_FRACTION = 0.5  # of the TTL: a renewal is good for this long on the launcher's clock
GRACE_FRACTION = 0.3  # of the TTL: then the worker is killed (stopped by 0.8 TTL, expired at 1.0)


@dataclass(frozen=True)
class Fence:
    lease_id: str
    token: int
    valid_until: float
    revoked: bool = False

    def lapsed(self, now: float | None = None) -> str | None:
        """Why the worker must stop now, or None while the lease is good."""
        if self.revoked:
            return f"GPU lease {self.lease_id[:8]} (token {self.token}) was revoked: another holder may have it"
        t = time.time() if now is None else now
        if t > self.valid_until:
            return f"GPU lease {self.lease_id[:8]} (token {self.token}) not renewed for {t - self.valid_until:.1f} s past its validity (launcher paused or database unreachable)"
        return None


def write(path: str | os.PathLike[str], fence: Fence) -> None:
    p = Path(path)
    tmp = p.with_name(p.name + ".tmp")
    tmp.write_text(json.dumps({"lease_id": fence.lease_id, "token": fence.token, "valid_until": fence.valid_until, "revoked": fence.revoked}))
    os.replace(tmp, p)  # readers never see half a file


def wait_for_go(every_s: float = 0.01) -> None:
    """In the worker: until ``$GPU_OPS_GO_FILE`` exists (none set: at once). A launcher
    that dies meanwhile ends the worker through its parent watch; SIGTERM interrupts it."""
    path = os.environ.get(GO_ENV)
    while path and not os.path.exists(path):
        time.sleep(every_s)


def read(path: str | os.PathLike[str]) -> Fence | None:
    try:
        d = json.loads(Path(path).read_text())
        return Fence(str(d["lease_id"]), int(d["token"]), float(d["valid_until"]), bool(d.get("revoked")))
    except (OSError, ValueError, KeyError, TypeError):
        return None


class FenceCheck:
    """The worker's view of its fence (from ``$GPU_OPS_FENCE_FILE``), read at most every ``every_s``."""

    def __init__(self, path: str | None = None, every_s: float = 0.2):
        self.path = path if path is not None else os.environ.get(FENCE_ENV)
        self.every_s = every_s
        self._at = -1e18
        self._fence: Fence | None = None

    def current(self) -> Fence | None:
        if not self.path:
            return None
        now = time.monotonic()
        if now - self._at >= self.every_s:
            self._at = now
            found = read(self.path)
            self._fence = found if found is not None else self._fence
        return self._fence

    def lapsed(self) -> str | None:
        fence = self.current()
        return fence.lapsed() if fence is not None else None

    def revoked(self) -> bool:
        fence = self.current()
        return bool(fence and fence.revoked)


def start_watchdog(
    path: str, grace_s: float, notice: Callable[[str], None], every_s: float = 0.2, before_kill: Callable[[], None] | None = None
) -> threading.Thread:
    """In the worker: ``notice(reason)`` once the fence lapses (the training loop then
    checkpoints and stops), SIGKILL of this process ``grace_s`` later or at once when
    revoked (``before_kill()`` first: the worker notes when it ended, for the ledger)."""

    def watch() -> None:
        check = FenceCheck(path, every_s=0.0)
        noticed_at: float | None = None
        while True:
            time.sleep(every_s)
            fence = check.current()
            reason = fence.lapsed() if fence is not None else None
            if reason is None:
                noticed_at = None
                continue
            if noticed_at is None:
                noticed_at = time.monotonic()
                notice(reason)
            if (fence is not None and fence.revoked) or time.monotonic() - noticed_at >= grace_s:
                if before_kill is not None:
                    before_kill()
                os.kill(os.getpid(), signal.SIGKILL)

    t = threading.Thread(target=watch, name="gpu-ops-fence", daemon=True)
    t.start()
    return t


# ---------------------------------------------------------------------- remote workers


def to_remote(fence: Fence, now: float | None = None) -> dict[str, Any]:
    """A fence as sent to a pod: its validity as seconds left on the launcher's clock."""
    t = time.time() if now is None else now
    return {"lease_id": fence.lease_id, "token": fence.token, "valid_for_s": fence.valid_until - t, "revoked": fence.revoked}


def from_remote(data: dict[str, Any], now: float | None = None) -> Fence:
    """A fence received in a pod, dated on the pod's clock."""
    t = time.time() if now is None else now
    return Fence(str(data["lease_id"]), int(data["token"]), t + float(data["valid_for_s"]), bool(data.get("revoked")))


_POD_LOCK = threading.Lock()
_POD_WATCHDOG: list[threading.Thread] = []


def _pod_renew(path: str, data: dict[str, Any]) -> float:
    """Extend this pod's fence (never shorten it: renewals may arrive out of order; a
    revocation always wins). Returns the seconds of validity the pod now has."""
    new = from_remote(data)
    with _POD_LOCK:
        current = read(path)
        if current is None or new.revoked or (not current.revoked and new.token == current.token and new.valid_until > current.valid_until):
            write(path, new)
            current = new
    return -1.0 if current.revoked else current.valid_until - time.time()


def _pod_notice(reason: str) -> None:
    sys.stderr.write(f"gpu_ops: {reason}: stopping (checkpoint, then exit)\n")
    sys.stderr.flush()


def _target(ref: str) -> Callable[..., Any]:
    module, _, qualname = ref.partition(":")
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def pod_call(call: dict[str, Any]) -> Any:
    """The function the Kubetorch backend deploys for a fenced launch (runs in the pod).

    ``{"renew": fence}`` (:func:`to_remote`): extends this pod's fence, returns at once
    with the seconds of validity left. ``{"fence": fence, "target": "module:qualname",
    "args": [...], "kwargs": {...}}``: the launch: the fence written to
    ``$GPU_OPS_FENCE_FILE``, the watchdog started (:func:`start_watchdog`, grace
    ``$GPU_OPS_FENCE_GRACE_S``), then ``target(*args, **kwargs)``."""
    path = os.environ[FENCE_ENV]
    if "renew" in call:
        return _pod_renew(path, call["renew"])
    _pod_renew(path, call["fence"])
    with _POD_LOCK:
        if not _POD_WATCHDOG:
            _POD_WATCHDOG.append(start_watchdog(path, float(os.environ.get(GRACE_ENV, "10")), _pod_notice))
    return _target(call["target"])(*call.get("args", ()), **call.get("kwargs", {}))


class FenceRelay(threading.Thread):
    """Launcher side: forwards each change of the launcher's fence file (a renewal, a
    revocation) to a remote worker with ``send(to_remote(fence))``; a send that fails is
    reported once per failure streak and retried on the next change or tick (meanwhile
    the pod's fence runs down, as a local one does when the database is unreachable)."""

    def __init__(self, path: str, send: Callable[[dict[str, Any]], Any], on_error: Callable[[str], None], every_s: float = 0.5):
        super().__init__(name="gpu-ops-fence-relay", daemon=True)
        self.path, self.send, self.on_error, self.every_s = path, send, on_error, every_s
        self.sent: Fence | None = None
        self._failing = False
        self._done = threading.Event()

    def initial(self) -> dict[str, Any] | None:
        """The fence the launch call carries (None: the launcher has none)."""
        fence = read(self.path)
        self.sent = fence
        return to_remote(fence) if fence is not None else None

    def tick(self) -> None:
        fence = read(self.path)
        if fence is None or fence == self.sent:
            return
        try:
            self.send(to_remote(fence))
        except Exception as exc:  # noqa: BLE001 - the cluster is unreachable for now: the pod's fence runs down
            if not self._failing:
                self.on_error(f"could not renew the remote workers' fence (lease {fence.lease_id[:8]}): {type(exc).__name__}: {exc}")
            self._failing = True
            return
        self.sent, self._failing = fence, False

    def run(self) -> None:
        while not self._done.wait(self.every_s):
            self.tick()

    def stop(self) -> None:
        self._done.set()


__all__ = [
    "FENCE_ENV", "Fence", "FenceCheck", "FenceRelay", "GO_ENV", "GRACE_ENV", "from_remote", "pod_call", "read", "start_watchdog", "to_remote",
    "wait_for_go", "write",
]
