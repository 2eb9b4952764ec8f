"""Sending the telemetry outbox (:mod:`gpu_ops.storage.outbox`), after the commit and
off the training path: :class:`Flush` (the owner's) and :func:`drain`. No Dagster.

Design: docs/concepts/observability.md#the-telemetry-outbox
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpu_ops.flows.bounded_http import describe_failure
from gpu_ops.flows.observability import mlflow_runs, tracing
from gpu_ops.storage.outbox import CLAIM_MARGIN_S, Entry, Outbox
from gpu_ops.storage import ledger

JOIN_MARGIN_S = 0.1  # the owner's wait beyond the export deadline (the claim's and the mark's writes)
DRAIN_BUDGET_S = 10.0


def _export_span(payload: Mapping[str, Any], deadline_s: float) -> str | None:
    tracing.export(payload, deadline_s)
    return None


EXPORTS: Mapping[str, Callable[[Mapping[str, Any], float], str | None]] = {"span": _export_span, "mlflow": mlflow_runs.export}


def _configured(entry: Entry) -> bool:
    """Can this process send ``entry``? Spans need an OTLP endpoint in its environment."""
    return tracing.enabled() if entry.kind == "span" else entry.kind in EXPORTS


@dataclass(frozen=True)
class Delivery:
    entry: Entry
    ok: bool
    seconds: float
    error: str | None = None

    def describe(self) -> str:
        if self.ok:
            return f"{self.entry.what()} sent in {self.seconds:.2f} s"
        return f"{self.entry.what()} not sent yet ({self.error})"


def deliver(store: Any, entry: Entry, deadline_s: float, box: Outbox | None = None) -> Delivery | None:
    """Claim ``entry``, export it within ``deadline_s``, mark it; None when it was not ours
    to send (sent already, or claimed by a live sender)."""
    box = box or Outbox(store)
    token = box.claim(entry, deadline_s + CLAIM_MARGIN_S)
    if token is None:
        return None
    started = time.monotonic()
    try:
        experiment_id = EXPORTS[entry.kind](entry.payload, deadline_s)
    except Exception as exc:  # noqa: BLE001 - any failure leaves the record for later
        seconds = time.monotonic() - started
        error = describe_failure(exc)
        box.failed(entry, token, error, seconds, entry.tries + 1)
        return Delivery(entry, False, seconds, error)
    seconds = time.monotonic() - started
    with store.engine.begin() as conn:
        if experiment_id:
            ledger.fill_experiment_id(conn, entry.run_id, entry.asset_key, entry.attempt, experiment_id)
        box.sent(conn, entry, seconds)
    return Delivery(entry, True, seconds)


class Flush:
    """The owner's sending of its attempt's records, each in a daemon thread."""

    def __init__(self, store: Any, record_ids: Sequence[str], deadline_s: float):
        self.deadline_s = deadline_s
        self.started = time.monotonic()
        self.deliveries: list[Delivery] = []
        self.failures: list[str] = []
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._send, args=(store, rid), name="gpu-ops-telemetry", daemon=True) for rid in record_ids]
        for t in self._threads:
            t.start()

    def _send(self, store: Any, record_id: str) -> None:
        try:
            box = Outbox(store)
            for entry in box.entries([record_id]):
                done = deliver(store, entry, self.deadline_s, box)
                if done is not None:
                    with self._lock:
                        self.deliveries.append(done)
        except Exception as exc:  # noqa: BLE001 - the database failed under the sender: the record stays queued
            with self._lock:
                self.failures.append(describe_failure(exc))

    def wait(self) -> list[tuple[bool, str]]:
        """Wait for the exports, at most the deadline (and a margin) since they started; what
        happened, one (sent, message) each (a record still in flight says so)."""
        until = self.started + self.deadline_s + JOIN_MARGIN_S
        for t in self._threads:
            t.join(max(0.0, until - time.monotonic()))
        with self._lock:
            out = [(d.ok, d.describe()) for d in self.deliveries] + [(False, f"telemetry not sent yet: {f}") for f in self.failures]
        late = sum(t.is_alive() for t in self._threads)
        if late:
            out.append((False, f"{late} telemetry record(s) still being sent after {self.deadline_s:g} s (left to finish in the background)"))
        return out


@dataclass
class DrainReport:
    sent: int = 0
    failed: list[str] = field(default_factory=list)
    left: int = 0  # unsent and not tried by this drain (another kind failed, the budget ran out, claimed elsewhere, no endpoint here)

    @property
    def tried(self) -> bool:
        return bool(self.sent or self.failed or self.left)

    def describe(self) -> str:
        parts = [f"{self.sent} record(s) sent"]
        if self.failed:
            parts.append(f"{len(self.failed)} not ({'; '.join(self.failed[:3])})")
        if self.left:
            parts.append(f"{self.left} left for later")
        return "telemetry: " + ", ".join(parts)


def drain(store: Any, *, deadline_s: float, budget_s: float = DRAIN_BUDGET_S, due_only: bool = True, limit: int = 200) -> DrainReport:
    """Send the outbox's unsent records (those due now, or all), one export at a time, each
    within ``deadline_s`` and all within ``budget_s``."""
    report = DrainReport()
    box = Outbox(store)
    until = time.monotonic() + budget_s
    given_up: set[str] = set()
    for entry in box.entries(due_only=due_only, unsent=True, limit=limit):
        left = until - time.monotonic()
        if entry.kind in given_up or not _configured(entry) or left <= 0.05:
            report.left += 1
            continue
        done = deliver(store, entry, min(deadline_s, left), box)
        if done is None:
            report.left += 1
        elif done.ok:
            report.sent += 1
        else:
            report.failed.append(f"{entry.what()}: {done.error}")
            given_up.add(entry.kind)
    return report


__all__ = ["DRAIN_BUDGET_S", "Delivery", "DrainReport", "Flush", "deliver", "drain"]
