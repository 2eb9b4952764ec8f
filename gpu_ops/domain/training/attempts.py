"""A training attempt as a durable record: its states and the pure steps between them.

    planned → admitted → launched → running → settled(outcome) → decided(retry | done | fail)

An attempt used to live in the stack frame of the Dagster step that ran it; when that
process died (SIGKILL of the step or run worker) the attempt vanished with it, its GPU
time unbilled and its lease held until the TTL. Here every transition is a pure function
(``Attempt`` in, ``Attempt`` out, refusing a move the diagram does not allow) and the
caller writes the new record to storage (:class:`gpu_ops.storage.attempt_store.AttemptStore`)
*before* the step takes effect. Whoever finds an attempt in a non-final state whose owner
is gone settles it (:mod:`gpu_ops.flows.training.settle`).

- ``planned``: the request is decided (history read, memory/capacity adjusted);
- ``admitted``: the quota lease is held (``lease_id``, fencing ``token``), or no quota applies;
- ``launched``: worker processes exist (pids, their start times, host): GPU time is billed
  from ``launched_at``;
- ``running``: the worker reported its first step (``first_step_at``);
- ``settled``: the workers are gone; ``outcome`` (completed, preempted, oom,
  infrastructure, user_error) and ``ended_at`` are known, the ledger row is written;
- ``decided``: ``decision`` is ``retry``, ``done`` or ``fail`` (final).

No I/O, no Dagster here.
"""

from __future__ import annotations

import dataclasses
import enum
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpu_ops.errors import TransitionError


class State(str, enum.Enum):
    PLANNED = "planned"
    ADMITTED = "admitted"
    LAUNCHED = "launched"
    RUNNING = "running"
    SETTLED = "settled"
    DECIDED = "decided"


class Decision(str, enum.Enum):
    RETRY = "retry"
    DONE = "done"
    FAIL = "fail"


# The diagram: a state may also go straight to settled (the launch failed, was refused
# or its owner died before the next step).
NEXT: Mapping[State, frozenset[State]] = {
    State.PLANNED: frozenset({State.ADMITTED, State.SETTLED}),
    State.ADMITTED: frozenset({State.LAUNCHED, State.SETTLED}),
    State.LAUNCHED: frozenset({State.RUNNING, State.SETTLED}),
    State.RUNNING: frozenset({State.SETTLED}),
    State.SETTLED: frozenset({State.DECIDED}),
    State.DECIDED: frozenset(),
}
OPEN_STATES = (State.PLANNED, State.ADMITTED, State.LAUNCHED, State.RUNNING)


def started_since_boot(pid: int) -> float | None:
    """When process ``pid`` started (seconds since boot, /proc); None where unknown or gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


@dataclass(frozen=True)
class Owner:
    """The process that drives an attempt: host, pid and its start time (so a reused pid
    is not mistaken for it), with the Dagster run and step it runs for."""

    host: str
    pid: int
    started: float | None
    run_id: str = ""
    step_key: str = ""

    @classmethod
    def this_process(cls, run_id: str = "", step_key: str = "") -> "Owner":
        return cls(socket.gethostname(), os.getpid(), started_since_boot(os.getpid()), run_id, step_key)

    def alive_here(self) -> bool | None:
        """True/False when the owner is on this host; None when it runs elsewhere."""
        if self.host != socket.gethostname():
            return None
        return same_process(self.pid, self.started)


def same_process(pid: int, started: float | None) -> bool:
    """Is ``pid`` alive and the same process that started at ``started`` (not a reuse)?"""
    now = started_since_boot(pid)
    if now is None:
        return False
    state = _proc_state(pid)
    if state in ("Z", "X"):  # a zombie has finished running
        return False
    return started is None or abs(now - started) < 0.5


def _proc_state(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


@dataclass(frozen=True)
class Attempt:
    attempt_id: str
    run_id: str
    asset_key: str
    attempt: int
    owner: Owner
    state: State = State.PLANNED
    launch_name: str = ""
    lease_id: str | None = None
    token: int | None = None  # the lease's fencing token
    worker_host: str | None = None
    worker_pids: tuple[int, ...] = ()
    worker_started: tuple[float | None, ...] = ()
    workdir: str | None = None
    planned_at: float | None = None  # wall clock, seconds since the epoch
    launched_at: float | None = None
    first_step_at: float | None = None
    ended_at: float | None = None
    outcome: str | None = None
    reason: str = ""
    decision: Decision | None = None
    # The ledger row's fixed part (labels, GPUs, capacity, namespace...): whoever settles
    # the attempt bills it with the times above, even when the owner is gone.
    bill: Mapping[str, Any] = field(default_factory=dict)
    settled_by: str | None = None  # "owner", or who found the attempt orphaned

    @property
    def held_hardware(self) -> bool:
        return self.launched_at is not None


def _move(a: Attempt, to: State, **changes: Any) -> Attempt:
    if to not in NEXT[a.state]:
        raise TransitionError(f"attempt {a.attempt} of {a.asset_key} (run {a.run_id[:8]}): {a.state.value} -> {to.value} is not a transition")
    return dataclasses.replace(a, state=to, **changes)


def plan(
    attempt_id: str, run_id: str, asset_key: str, attempt: int, owner: Owner, *, launch_name: str, bill: Mapping[str, Any], at: float
) -> Attempt:
    return Attempt(attempt_id, run_id, asset_key, attempt, owner, State.PLANNED, launch_name=launch_name, bill=dict(bill), planned_at=at)


def admit(a: Attempt, lease_id: str | None, token: int | None) -> Attempt:
    return _move(a, State.ADMITTED, lease_id=lease_id, token=token)


def launch(a: Attempt, *, host: str, pids: tuple[int, ...], started: tuple[float | None, ...], at: float, workdir: str | None) -> Attempt:
    if a.state is State.PLANNED:  # launched without a quota step (a backend that admits nothing)
        a = admit(a, None, None)
    return _move(a, State.LAUNCHED, worker_host=host, worker_pids=tuple(pids), worker_started=tuple(started), launched_at=at, workdir=workdir)


def run(a: Attempt, at: float) -> Attempt:
    return _move(a, State.RUNNING, first_step_at=at)


def settle(a: Attempt, outcome: str, reason: str, ended_at: float, by: str = "owner") -> Attempt:
    end = max(ended_at, a.launched_at) if a.launched_at is not None else ended_at
    return _move(a, State.SETTLED, outcome=outcome, reason=reason, ended_at=end, settled_by=by)


def decide(a: Attempt, decision: Decision, reason: str | None = None) -> Attempt:
    return _move(a, State.DECIDED, decision=decision, reason=reason if reason is not None else a.reason)


def billed_seconds(a: Attempt) -> float:
    """GPU time of the attempt: from its workers' start to their end, never the quota wait."""
    if a.launched_at is None or a.ended_at is None:
        return 0.0
    return max(0.0, a.ended_at - a.launched_at)


__all__ = [
    "Attempt", "Decision", "NEXT", "OPEN_STATES", "Owner", "State", "TransitionError",
    "admit", "billed_seconds", "decide", "launch", "plan", "started_since_boot", "run", "same_process", "settle",
]
