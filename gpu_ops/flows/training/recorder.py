"""The owner's side of an attempt record: each transition written before it takes effect.

:class:`AttemptRecorder` is what the Dagster step holds while it drives one attempt. It
applies the pure transitions of :mod:`gpu_ops.domain.training.attempts`, writes each result
through :class:`~gpu_ops.storage.attempt_store.AttemptStore`, settles it in one
transaction with its bill and telemetry (:func:`gpu_ops.flows.training.settle.settle_attempt`),
sends that telemetry in the background and waits for it at most the deadline (:meth:`stop`),
and keeps the owner's heartbeat (``beat_at``) going while the workers run. A database that
cannot be written does not stop the training: the failure is logged and the next
transition is written over the last one stored; a settlement that could not be written is
left to the orphan settlers (the record is not decided past it). When a settler got there
first (the owner looked dead to it), the owner's moves are refused and it learns how the
attempt was settled. No Dagster here.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import socket
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from gpu_ops.flows.observability.sender import Flush
from gpu_ops.domain.training import attempts as tr
from gpu_ops.storage.attempt_store import AttemptStore
from gpu_ops.domain.training.attempts import Attempt, Decision, Owner, State
from gpu_ops.flows.training.settle import settle_attempt

BEAT_S = 2.0
TELEMETRY_DEADLINE_S = 1.0


class AttemptRecorder:
    def __init__(
        self, table_store: Any, record: Attempt, log_error: Callable[[str], None], beat_s: float = BEAT_S, log: Any = None,
        pricing: Any = None, deadline_s: float = TELEMETRY_DEADLINE_S,
    ):
        self.table_store = table_store
        self.store = AttemptStore(table_store)
        self.record = record
        self.stored: Attempt | None = None  # the last version the database has
        self.log_error = log_error
        self.log = log  # the step's logger (telemetry's warnings)
        self.pricing, self.deadline_s = pricing, deadline_s  # the spans' prices; one telemetry export's deadline
        self.taken_over: Attempt | None = None  # how a settler settled it, when one did
        self.unsettled = False  # the settlement could not be written: the orphan settlers bill it
        self.flush: Any = None  # gpu_ops.flows.observability.sender.Flush of the settled attempt's telemetry
        self._beat_s = beat_s
        self._beating = threading.Event()

    @classmethod
    def plan(
        cls, table_store: Any, *, run_id: str, step_key: str, asset_key: str, attempt: int, launch_name: str, bill: Mapping[str, Any],
        log_error: Callable[[str], None], log: Any = None, pricing: Any = None, deadline_s: float = TELEMETRY_DEADLINE_S,
    ) -> "AttemptRecorder":
        owner = Owner.this_process(run_id, step_key)
        record = tr.plan(uuid.uuid4().hex, run_id, asset_key, attempt, owner, launch_name=launch_name, bill=bill, at=time.time())
        rec = cls(table_store, record, log_error, log=log, pricing=pricing, deadline_s=deadline_s)
        try:
            rec.stored = rec.store.create(record)
        except Exception as exc:  # noqa: BLE001 - the database is down: train anyway, say so
            log_error(f"could not write attempt {attempt}'s record (state planned): {type(exc).__name__}: {exc}")
        return rec

    # ---- writes

    def _write(self, new: Attempt) -> bool:
        self.record = new
        try:
            if self.stored is None:
                self.stored = self.store.create(new)
                return True
            if self.store.move(self.stored, new):
                self.stored = new
                return True
            self.taken_over = self.store.get(new.attempt_id)
            return False
        except Exception as exc:  # noqa: BLE001 - see the module docstring
            self.log_error(f"could not write attempt {new.attempt}'s record (state {new.state.value}): {type(exc).__name__}: {exc}")
            return True

    def admitted(self, lease: Any) -> None:
        """The quota lease is held (``lease``: a :class:`~gpu_ops.storage.quota.Lease`), or None when no quota applies."""
        self._write(tr.admit(self.record, lease.lease_id if lease else None, lease.token if lease else None))

    def launched(self, pids: list[int], workdir: str | None) -> None:
        """The workers exist (billing starts now)."""
        at = time.time()
        starts = tuple(tr.started_since_boot(p) for p in pids)
        self._write(tr.launch(self.record, host=socket.gethostname(), pids=tuple(pids), started=starts, at=at, workdir=workdir))
        self._start_beating()

    def running(self, at: float, bill: Mapping[str, Any] | None = None) -> None:
        if self.record.state is State.LAUNCHED:
            new = tr.run(self.record, at)
            self._write(new if bill is None else _with_bill(new, bill))

    def settle(
        self, outcome: str, reason: str, ended_at: float, bill: Mapping[str, Any] | None, last_checkpoint_at: dt.datetime | None, *, billed: bool = True
    ) -> Any:
        """Settle as the owner (:func:`~gpu_ops.flows.training.settle.settle_attempt`); the ledger row
        written (None when a settler had already settled and billed it, when it could not be
        written, or with ``billed=False``: a refused launch is no attempt to bill). Its
        telemetry starts going out in the background."""
        self._beating.set()
        record = self.record if bill is None else _with_bill(self.record, bill)
        self.record = new = tr.settle(record, outcome, reason, ended_at)
        warn = self.log.warning if self.log is not None else self.log_error
        try:
            done = settle_attempt(self.store, self.stored, new, billed=billed, last_checkpoint_at=last_checkpoint_at, pricing=self.pricing, warn=warn)
        except Exception as exc:  # noqa: BLE001 - see the module docstring
            self.unsettled = True
            self.log_error(
                f"could not settle attempt {new.attempt} (its record and ledger row): {type(exc).__name__}: {exc}; "
                "the orphaned-attempts sensor or `gpu-ops validate --settle-orphans` bills it once this process is gone"
            )
            return None
        if done is None:
            self.taken_over = self.store.get(new.attempt_id)
            return None
        self.stored = new
        if done.record_ids:
            self.flush = Flush(self.table_store, done.record_ids, self.deadline_s)
        return done.row

    def decide(self, decision: Decision, reason: str) -> None:
        if self.record.state is State.SETTLED and not self.unsettled and self.taken_over is None:
            self._write(tr.decide(self.record, decision, reason))

    # ---- heartbeat

    def _start_beating(self) -> None:
        def beat() -> None:
            while not self._beating.wait(self._beat_s):
                try:
                    self.store.beat(self.record.attempt_id)
                except Exception:  # noqa: BLE001 - the next beat retries; a settler waits stale_s
                    pass

        threading.Thread(target=beat, name="gpu-ops-attempt-beat", daemon=True).start()

    def stop(self) -> None:
        """The heartbeat stops; the settled attempt's telemetry is waited for, at most the
        deadline, and what became of it is logged (what was not sent stays queued)."""
        self._beating.set()
        flush, self.flush = self.flush, None
        if flush is None:
            return
        for sent, message in flush.wait():
            if sent:
                if self.log is not None:
                    self.log.info(f"telemetry: {message}")
            else:
                (self.log.warning if self.log is not None else self.log_error)(
                    f"{message}; queued in gpu_ops_telemetry_outbox: the orphaned-attempts sensor and `gpu-ops validate --settle-orphans` send it later"
                )


def _with_bill(a: Attempt, bill: Mapping[str, Any]) -> Attempt:
    return dataclasses.replace(a, bill={**a.bill, **bill})


__all__ = ["AttemptRecorder"]
