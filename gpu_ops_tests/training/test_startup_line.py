"""The start-up line of an attempt: which worker served it and how long each phase took,
also for an attempt that resumes with no step left to train (its worker still started)."""

from __future__ import annotations

import json
from typing import Any

from gpu_ops.dagster.training.asset import _EventSink


class Lines:
    """A Dagster-like log that keeps its lines."""

    def __init__(self) -> None:
        self.lines: list[tuple[str, str]] = []

    def info(self, msg: str) -> None:
        self.lines.append(("info", msg))

    def debug(self, msg: str) -> None:
        self.lines.append(("debug", msg))

    def warning(self, msg: str) -> None:
        self.lines.append(("warning", msg))


def _event(name: str, **fields: Any) -> str:
    return f"gpu_ops:{name} {json.dumps(fields)}"


def _feed(*lines: str) -> list[str]:
    log = Lines()
    sink = _EventSink(log, attempt=2)
    for line in lines:
        sink(line)
    return [m for _, m in log.lines]


PHASE = _event("phase", phases={"process": 100.0, "interpreter": 100.1, "imports": 101.0, "payload": 101.2}, standby=True, t=101.2)


def test_an_attempt_with_steps_reports_its_start_up_at_its_first_step() -> None:
    got = _feed(PHASE, _event("start", resumed=True, seq=3, step=90, t=101.5), _event("progress", step=91, total=250, t=101.75), _event("finished", last_step=250, t=103.0))
    (line,) = [m for m in got if "start-up on" in m]
    assert line == "attempt 2 start-up on a standby worker (warm before the attempt began): interpreter +0.10 s, imports +0.90 s, payload +0.20 s, checkpoint_loaded +0.30 s, first_step +0.25 s"
    assert got.index(line) < got.index("training function returned after step 250")


def test_an_attempt_resumed_at_its_last_step_still_reports_its_start_up() -> None:
    """A worker killed after its last checkpoint leaves nothing to train: the next attempt
    resumes, its function returns at once, and its start-up (a standby here) is still told."""
    got = _feed(PHASE, _event("start", resumed=True, seq=3, step=250, t=101.5), _event("finished", last_step=None, t=101.6))
    (line,) = [m for m in got if "start-up on" in m]
    assert line.startswith("attempt 2 start-up on a standby worker") and line.endswith("checkpoint_loaded +0.30 s, finished +0.10 s")
    assert '"finished": 101.6' in next(m for m in got if "startup_times=" in m)
    assert got[-1] == "training function returned (it reported no step)"


def test_no_phases_no_start_up_line() -> None:
    assert not [m for m in _feed(_event("finished", last_step=None, t=1.0)) if "start-up" in m]
