"""The owner's side of an attempt record: each transition written before it takes effect.

:class:`AttemptRecorder` is what the Dagster step holds while it drives one attempt. It
applies the pure transitions of :mod:`gpu_ops.training.attempts`, writes each result
through :class:`~gpu_ops.training.attempt_store.AttemptStore`, bills the ledger when the
attempt settles, and keeps the owner's heartbeat (``beat_at``) going while the workers
run. A database that cannot be written does not stop the training: the failure is logged
and the next transition is written over the last one stored. When a settler got there
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

from gpu_ops.training import attempts as tr
from gpu_ops.training.attempt_store import AttemptStore
from gpu_ops.training.attempts import Attempt, Decision, Owner, State
from gpu_ops.training.settle import bill_once, ledger_row

BEAT_S = 2.0


class AttemptRecorder:
    def __init__(self, table_store: Any, record: Attempt, log_error: Callable[[str], None], beat_s: float = BEAT_S, log: Any = None):
        self.table_store = table_store
        self.store = AttemptStore(table_store)
        self.record = record
        self.stored: Attempt | None = None  # the last version the database has
        self.log_error = log_error
        self.log = log  # the step's logger, for observers of the ledger row (settle.bill_once)
        self.taken_over: Attempt | None = None  # how a settler settled it, when one did
        self._beat_s = beat_s
        self._beating = threading.Event()

    @classmethod
    def plan(
        cls, table_store: Any, *, run_id: str, step_key: str, asset_key: str, attempt: int, launch_name: str, bill: Mapping[str, Any],
        log_error: Callable[[str], None], log: Any = None,
    ) -> "AttemptRecorder":
        owner = Owner.this_process(run_id, step_key)
        record = tr.plan(uuid.uuid4().hex, run_id, asset_key, attempt, owner, launch_name=launch_name, bill=bill, at=time.time())
        rec = cls(table_store, record, log_error, log=log)
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
        """The quota lease is held (``lease``: a :class:`~gpu_ops.compute.quota.Lease`), or None when no quota applies."""
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
        """Settle as the owner; the ledger row written (None when a settler had already
        settled and billed it, or with ``billed=False``: a refused launch is no attempt to bill)."""
        self._beating.set()
        record = self.record if bill is None else _with_bill(self.record, bill)
        if not self._write(tr.settle(record, outcome, reason, ended_at)) or not billed:
            return None
        row = ledger_row(self.record, last_checkpoint_at)
        bill_once(self.table_store, row, self.log)
        return row

    def decide(self, decision: Decision, reason: str) -> None:
        if self.record.state is State.SETTLED:
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
        self._beating.set()


def _with_bill(a: Attempt, bill: Mapping[str, Any]) -> Attempt:
    return dataclasses.replace(a, bill={**a.bill, **bill})


__all__ = ["AttemptRecorder"]
