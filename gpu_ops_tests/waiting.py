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
