"""The telemetry outbox, table ``gpu_ops_telemetry_outbox``: an attempt's span and MLflow
record, queued in the transaction that settles it and sent afterwards. No Dagster.

Design: docs/concepts/observability.md#the-telemetry-outbox
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite

from gpu_ops.storage.quota import db_clock
from gpu_ops.domain.training.attempts import Owner

OUTBOX_TABLE = "gpu_ops_telemetry_outbox"
CLAIM_MARGIN_S = 5.0  # a claim outlasts its export's deadline by this much (the marking write)
BACKOFF_S, BACKOFF_MAX_S = 30.0, 3600.0


@dataclass(frozen=True)
class Record:
    """One telemetry record of an attempt, to queue: ``kind`` ``span`` or ``mlflow``."""

    kind: str
    run_id: str
    asset_key: str
    attempt: int
    payload: Mapping[str, Any] = field(default_factory=dict)

    @property
    def record_id(self) -> str:
        return hashlib.sha256(f"{self.kind}\0{self.run_id}\0{self.asset_key}\0{self.attempt}".encode()).hexdigest()[:32]


@dataclass(frozen=True)
class Entry:
    """A stored record and its delivery state."""

    record_id: str
    kind: str
    run_id: str
    asset_key: str
    attempt: int
    payload: dict[str, Any]
    tries: int = 0
    sent_at: float | None = None
    last_error: str | None = None
    last_export_s: float | None = None
    claim_token: str | None = None
    claimed_by: Owner | None = None

    def what(self) -> str:
        return f"{'span' if self.kind == 'span' else 'MLflow record'} of attempt {self.attempt}"


class Outbox:
    """The outbox of one gpu_ops database (a :class:`~gpu_ops.storage.tables.TableStore`)."""

    def __init__(self, store: Any):
        self.store, self._sa = store, sa
        self.db_now = db_clock(store.dialect)
        F, T, I = sa.Float, sa.Text, sa.Integer  # noqa: E741, N806
        self.table = sa.Table(
            OUTBOX_TABLE, sa.MetaData(),
            sa.Column("record_id", sa.String(32), primary_key=True),
            *(sa.Column(n, T, nullable=False) for n in ("kind", "run_id", "asset_key", "payload")),
            sa.Column("attempt", I, nullable=False), sa.Column("tries", I, nullable=False, default=0),
            *(sa.Column(n, F) for n in ("queued_at", "due_at", "sent_at", "claimed_until", "last_export_s", "claimed_started")),
            *(sa.Column(n, T) for n in ("claim_token", "claimed_host", "last_error")),
            sa.Column("claimed_pid", I),
            sa.Index(f"ix_{OUTBOX_TABLE}_due", "sent_at", "due_at"),
        )

    def ensure(self) -> None:
        """Create the table when it is missing (under its lock: concurrent first settlers)."""
        if self.store.has_table(OUTBOX_TABLE):
            return
        with self.store.engine.begin() as conn:
            self.store.lock(conn, OUTBOX_TABLE)
            self.table.create(conn, checkfirst=True)

    def enqueue(self, conn: Any, records: Sequence[Record]) -> tuple[str, ...]:
        """Queue ``records`` in the caller's transaction (after :meth:`ensure`); their ids.
        A record queued already is left as it is."""
        if not records:
            return ()
        insert = (postgresql.insert if self.store.dialect == "postgresql" else sqlite.insert)(self.table)
        rows = [
            {"record_id": r.record_id, "kind": r.kind, "run_id": r.run_id, "asset_key": r.asset_key, "attempt": int(r.attempt),
             "payload": json.dumps(r.payload, default=str, sort_keys=True), "tries": 0}
            for r in records
        ]
        conn.execute(insert.values(queued_at=self.db_now, due_at=self.db_now).on_conflict_do_nothing(index_elements=["record_id"]), rows)
        return tuple(r.record_id for r in records)

    # ---- reading

    def entries(self, ids: Sequence[str] | None = None, *, due_only: bool = False, unsent: bool = False, limit: int | None = None) -> list[Entry]:
        """Stored records (those of ``ids``; only unsent ones, only those due now), oldest first."""
        if not self.store.has_table(OUTBOX_TABLE):
            return []
        t = self.table
        query = self._sa.select(t).order_by(t.c.due_at, t.c.record_id)
        if ids is not None:
            query = query.where(t.c.record_id.in_(list(ids)))
        if unsent or due_only:
            query = query.where(t.c.sent_at.is_(None))
        if due_only:
            query = query.where(t.c.due_at <= self.db_now)
        if limit is not None:
            query = query.limit(limit)
        with self.store.engine.connect() as conn:
            rows = conn.execute(query).mappings().all()
        return [_entry(r) for r in rows]

    # ---- delivering

    def claim(self, entry: Entry, lease_s: float) -> str | None:
        """Take ``entry`` to send it for ``lease_s`` seconds: the claim's token, or None when it
        is sent already or another live sender holds it."""
        t = self.table
        free = (t.c.claim_token.is_(None)) | (t.c.claimed_until < self.db_now)
        if entry.claim_token is not None and entry.claimed_by is not None and entry.claimed_by.alive_here() is False:
            free = free | (t.c.claim_token == entry.claim_token)  # its holder died here: take it over now
        me, token = Owner.this_process(), uuid.uuid4().hex
        values = {"claim_token": token, "claimed_until": self.db_now + lease_s, "claimed_host": me.host, "claimed_pid": me.pid,
                  "claimed_started": me.started, "tries": t.c.tries + 1}
        with self.store.engine.begin() as conn:
            done = conn.execute(t.update().where(t.c.record_id == entry.record_id, t.c.sent_at.is_(None), free).values(**values))
        return token if done.rowcount else None

    def sent(self, conn: Any, entry: Entry, seconds: float) -> None:
        """Mark ``entry`` sent, in the caller's transaction (with what the answer fills in)."""
        t = self.table
        conn.execute(
            t.update().where(t.c.record_id == entry.record_id, t.c.sent_at.is_(None))
            .values(sent_at=self.db_now, last_export_s=seconds, last_error=None, claim_token=None, claimed_until=None)
        )

    def failed(self, entry: Entry, token: str, error: str, seconds: float, tries: int) -> None:
        """The export under claim ``token`` failed: due again after the backoff."""
        t = self.table
        backoff = min(BACKOFF_S * 2 ** max(0, tries - 1), BACKOFF_MAX_S)
        with self.store.engine.begin() as conn:
            conn.execute(
                t.update().where(t.c.record_id == entry.record_id, t.c.claim_token == token)
                .values(last_error=error[:2000], last_export_s=seconds, due_at=self.db_now + backoff, claim_token=None, claimed_until=None)
            )


def _entry(r: Mapping[str, Any]) -> Entry:
    holder = Owner(r["claimed_host"], int(r["claimed_pid"]), r["claimed_started"]) if r["claimed_host"] and r["claimed_pid"] is not None else None
    return Entry(
        record_id=r["record_id"], kind=r["kind"], run_id=r["run_id"], asset_key=r["asset_key"], attempt=int(r["attempt"]),
        payload=json.loads(r["payload"]), tries=int(r["tries"] or 0), sent_at=r["sent_at"], last_error=r["last_error"],
        last_export_s=r["last_export_s"], claim_token=r["claim_token"], claimed_by=holder,
    )


__all__ = ["CLAIM_MARGIN_S", "OUTBOX_TABLE", "Entry", "Outbox", "Record"]
