"""Settling attempts whose owner is gone: the worker stopped, the time that ran billed, the lease released.

The owner of an attempt (the Dagster step process that drives it) settles it itself when
it can. When it cannot (SIGKILL of the step process or of the run worker, a node lost)
the attempt stays in a non-final state; whoever finds it there without a live owner
settles it: the next attempt (:func:`settle_orphans` at its start), the orphan sensor and
``gpu-ops validate`` (:func:`settle_orphans` with ``found_by``). An owner on this host is
checked by pid and process start time; one on another host is taken for gone when it has
not beaten for ``stale_s`` seconds (database clock).

An orphan is claimed before its workers are stopped (:meth:`AttemptStore.claim
<gpu_ops.storage.attempt_store.AttemptStore.claim>`: the settler becomes its owner), so the
settler that waits the workers' grace period is the one that writes. Settling is one
transaction (:func:`settle_attempt`, the owner's and every settler's): the record moves to
``settled`` by compare-and-set and its ledger row and telemetry outbox rows are written with
it, so an attempt is billed once whoever races to settle it, and nothing that can block sits
between reading the record and writing it.

Billing (:func:`ledger_row`): from the workers' start (``launched_at``) to their end,
never the quota wait. The end of a worker that is still running when the attempt is
found is *now* (it is stopped first: SIGTERM, so it checkpoints, then SIGKILL after the
grace period); of one already gone, the time its result file was written, or the owner's
last heartbeat. No Dagster here.
"""

from __future__ import annotations

import datetime as dt
import os
import signal
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpu_ops.flows.compute.local import recorded_end
from gpu_ops.storage.quota import LeaseBook
from gpu_ops.domain.formatting import redact_urls
from gpu_ops.flows.observability import hooks
from gpu_ops.storage.outbox import Outbox
from gpu_ops.storage import ledger
from gpu_ops.storage.attempt_store import AttemptStore
from gpu_ops.domain.training.attempts import Attempt, Decision, Owner, State, decide, same_process, settle
from gpu_ops.domain.training.classify import Outcome

ORPHANED = Outcome.PREEMPTED.value  # the orchestrator was lost: a preemption, not the user's error


@dataclass(frozen=True)
class Settled:
    attempt: Attempt
    message: str


def owner_gone(a: Attempt, quiet_s: float, stale_s: float) -> bool:
    here = a.owner.alive_here()
    if here is not None:
        return not here
    return quiet_s > stale_s


def _live_workers(a: Attempt) -> list[int]:
    if a.worker_host != socket.gethostname():
        return []
    starts = list(a.worker_started) + [None] * (len(a.worker_pids) - len(a.worker_started))
    return [pid for pid, st in zip(a.worker_pids, starts) if same_process(pid, st)]


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def stop_workers(a: Attempt, grace_s: float) -> bool:
    """Stop the attempt's live workers on this host (SIGTERM, SIGKILL after ``grace_s``);
    True when any was still running."""
    alive = _live_workers(a)
    for pid in alive:
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while _live_workers(a) and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid in _live_workers(a):
        _signal(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5.0  # a SIGKILLed (even a stopped) process exits at once, unless uninterruptible
    while _live_workers(a) and time.monotonic() < deadline:
        time.sleep(0.02)
    return bool(alive)


def _result_written(a: Attempt) -> float | None:
    return recorded_end(a.workdir)


def workers_ended_at(a: Attempt, quiet_s: float, stopped_now: bool) -> float:
    now = time.time()
    if stopped_now:
        return now
    return _result_written(a) or (now - quiet_s)


def ledger_row(a: Attempt, last_checkpoint_at: dt.datetime | None = None) -> Any:
    """The usage-ledger row of a settled attempt: from its workers' start to their end. An
    attempt that never launched a worker is a row without GPUs (``bill`` says so), kept
    because the ledger is also the retry policy's memory."""
    assert a.ended_at is not None and a.outcome is not None
    utc = dt.timezone.utc
    began = a.launched_at if a.launched_at is not None else min(a.planned_at or a.ended_at, a.ended_at)
    start, end = dt.datetime.fromtimestamp(began, utc), dt.datetime.fromtimestamp(a.ended_at, utc)
    last = last_checkpoint_at if last_checkpoint_at is not None and last_checkpoint_at >= start else None
    outcome = Outcome(a.outcome)
    return ledger.LedgerRow(
        start=start, end=end, run_id=a.run_id, asset_key=a.asset_key, attempt=a.attempt, outcome=outcome.value,
        last_checkpoint_at=last, lost_seconds=ledger.lost_seconds(outcome, start, end, last), **a.bill,
    )


@dataclass(frozen=True)
class Committed:
    """A settlement that was written: the record, its ledger row (None when not billed)
    and the ids of its telemetry outbox rows."""

    attempt: Attempt
    row: Any
    record_ids: tuple[str, ...]


def _telemetry(table_store: Any, row: Any, pricing: Any, warn: Callable[[str], None]) -> tuple[Any, list[Any]]:
    """The row (with its MLflow experiment id when known without asking) and its outbox
    records; none when telemetry is not set up, or could not be built (said, never raised)."""
    if not hooks.wanted():
        return row, []

    try:
        return hooks.attempt_records(row, ledger=ledger.read(table_store, run_id=row.run_id, asset_key=row.asset_key), pricing=pricing)
    except Exception as exc:  # noqa: BLE001 - telemetry never holds or loses the bill
        warn(f"attempt {row.attempt}: no span or MLflow record queued: {type(exc).__name__}: {redact_urls(str(exc))}")
        return row, []


def settle_attempt(
    attempts: AttemptStore, previous: Attempt | None, settled: Attempt, *, billed: bool = True, last_checkpoint_at: dt.datetime | None = None,
    pricing: Any = None, warn: Callable[[str], None] = print,
) -> Committed | None:
    """The one way an attempt is settled, by its owner or by whoever found it orphaned.

    One database transaction: the record moves from ``previous`` to ``settled`` (compare
    and set on its state; ``previous`` None: it was never stored), its ledger row is
    inserted (unique on run, asset and attempt: a second insert is a no-op) and its span
    and MLflow record are queued in the telemetry outbox. None when the record was moved
    by someone else first: nothing is written. Nothing between reading and writing the
    record blocks: the telemetry is sent after the commit (:mod:`gpu_ops.flows.observability.sender`).
    ``pricing``: a :class:`gpu_ops.flows.observability.hooks.Pricing` for the spans' cost."""
    table_store = attempts.store
    row: Any = None
    records: list[Any] = []
    if billed:
        row, records = _telemetry(table_store, ledger_row(settled, last_checkpoint_at), pricing, warn)
        ledger.ensure(table_store)
    box = Outbox(table_store)
    if records:
        box.ensure()
    with table_store.engine.begin() as conn:
        if not attempts.move_in(conn, previous, settled):
            return None
        if row is not None:
            ledger.insert(table_store, conn, row)
        ids = box.enqueue(conn, records)
    return Committed(settled, row, ids)


def _release(table_store: Any, lease_id: str | None) -> None:
    if lease_id:
        LeaseBook(table_store).release_id(lease_id)


def _decision_for(a: Attempt, successor: tuple[str, str] | None) -> tuple[Decision, str]:
    if successor == (a.run_id, a.asset_key):
        return Decision.RETRY, "the next attempt of the run resumes from the newest checkpoint"
    return Decision.FAIL, "found orphaned outside its run (the run's own retry or re-execution resumes from the checkpoint)"


def settle_orphan(
    stores: tuple[AttemptStore, Any], a: Attempt, quiet_s: float, *, found_by: str, successor: tuple[str, str] | None, grace_s: float,
    last_checkpoint: Callable[[Attempt], dt.datetime | None] = lambda _a: None, log: Any = None, pricing: Any = None,
) -> Settled | None:
    """Settle one orphaned attempt (:func:`settle_attempt`) and decide it; None when someone
    else moved it first. One found ``settled`` was billed with its record: it is decided."""
    attempts, table_store = stores
    if a.state is State.SETTLED:
        settled = a
    else:
        # Claimed first: the settler that stops the workers (and waits their grace) is the
        # one that writes; another that read the same record sees the claim and leaves it.
        claimed = attempts.claim(a, Owner.this_process(a.run_id, f"settling it for {found_by}"))
        if claimed is None:
            return None
        stopped = stop_workers(claimed, grace_s)
        ended = workers_ended_at(claimed, quiet_s, stopped)
        why = f"its owner (pid {a.owner.pid} on {a.owner.host}, step {a.owner.step_key or '?'}) died while the attempt was {a.state.value}"
        settled = settle(claimed, ORPHANED, why, ended, by=found_by)
        last = last_checkpoint(settled) if settled.held_hardware else None
        warn = log.warning if log is not None else print
        if settle_attempt(attempts, claimed, settled, billed=settled.held_hardware, last_checkpoint_at=last, pricing=pricing, warn=warn) is None:
            return None
    # The GPUs go back at once only when no worker can still hold them: none started, or
    # they ran here and were stopped above. A remote worker's lease expires on its own
    # (its fence stops the worker first).
    released = settled.lease_id is not None and (not settled.worker_pids or settled.worker_host == socket.gethostname()) and not _live_workers(settled)
    if released:
        _release(table_store, settled.lease_id)
    decision, what = _decision_for(settled, successor)
    final = decide(settled, decision)
    if not attempts.move(settled, final):
        return None  # another settler decided it
    secs = (settled.ended_at or 0) - (settled.launched_at or settled.ended_at or 0)
    msg = (
        f"attempt {a.attempt} of {a.asset_key} (run {a.run_id[:8]}): {settled.reason}; settled by {found_by} as {settled.outcome}"
        + (f", {secs:.1f} s of worker time billed" if settled.held_hardware else ", no worker had started")
        + (", lease released" if released else ", lease left to expire" if settled.lease_id else "") + f"; {decision.value}: {what}"
    )
    return Settled(final, msg)


def settle_orphans(
    table_store: Any, *, found_by: str, successor: tuple[str, str] | None = None, stale_s: float = 60.0, grace_s: float = 10.0,
    last_checkpoint: Callable[[Attempt], dt.datetime | None] = lambda _a: None, log: Any = None, pricing: Any = None,
) -> list[Settled]:
    """Settle every attempt in a non-final state whose owner is gone; what was done, one message each."""
    attempts = AttemptStore(table_store)
    done = []
    for a, quiet_s in attempts.open_attempts():
        if not owner_gone(a, quiet_s, stale_s):
            continue  # its owner is running it (or deciding, when settled)
        found = settle_orphan(
            (attempts, table_store), a, quiet_s, found_by=found_by, successor=successor, grace_s=grace_s, last_checkpoint=last_checkpoint, log=log,
            pricing=pricing,
        )
        if found is not None:
            done.append(found)
    return done


__all__ = ["Committed", "Settled", "ledger_row", "owner_gone", "settle_attempt", "settle_orphan", "settle_orphans", "stop_workers"]
