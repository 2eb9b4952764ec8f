"""The fence between a GPU lease and the workers that use it.

A lease (:mod:`gpu_ops.compute.quota`) lives in the database; the workers run elsewhere
and cannot renew it. The launcher that holds the lease writes a small *fence file* next
to its workers after every successful renewal::

    {"lease_id": "...", "token": 17, "valid_until": 1764012345.6, "revoked": false}

``valid_until`` is the launcher's clock *before* the renewal it confirms, plus half the
TTL, so it always ends before the database can expire the lease (its TTL counts from the
renewal, on the database's clock, and the next admission only reclaims it after that).
``token`` is the lease's fencing token (a counter the database raises for every lease it
grants); a lease found gone is written ``revoked``.

The worker reads the file before each checkpoint and step batch
(:class:`gpu_ops.training.context.TrainingContext`) and in a watchdog thread
(:func:`start_watchdog`): once ``valid_until`` has passed it stops as if preempted
(checkpoint, then exit); ``grace_s`` later, or at once when the lease is revoked, it is
killed. So a holder that cannot renew (SIGSTOP past the TTL, a database outage) has
stopped its GPUs before the lease can be handed on. Standard library only: workers
import it while they start.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

FENCE_ENV = "GPU_OPS_FENCE_FILE"
GRACE_ENV = "GPU_OPS_FENCE_GRACE_S"
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


__all__ = ["FENCE_ENV", "Fence", "FenceCheck", "GRACE_ENV", "read", "start_watchdog", "write"]
