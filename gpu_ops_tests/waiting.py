"""Polling for tests that wait on real processes and servers."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_until(probe: Callable[[], object], timeout: float = 60.0, every: float = 0.05) -> bool:
    """Polls ``probe`` until it is true; the bound only keeps a broken build from hanging."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if probe():
            return True
        time.sleep(every)
    return False


def pinned(pid: int) -> Callable[[], bool]:
    """Is ``pid`` still the process it is now? Pinned to its start time: under a full suite
    pids wrap (``pid_max`` is often 32768), and a dead worker's pid reused by another
    process (another test's) is not that worker, to count or to kill."""
    from gpu_ops.domain.training.attempts import same_process, started_since_boot

    started = started_since_boot(pid)
    return lambda: started is not None and same_process(pid, started)
