"""The attempt records' table, ``gpu_ops_training_attempts``, in the gpu_ops database.

A thin store for :class:`gpu_ops.domain.training.attempts.Attempt`: one row per attempt, written
with the state it moves *from* as a condition (``UPDATE ... WHERE state = :previous``), so
the owner and a settler that found the attempt orphaned cannot both move it: the second
write reports ``False`` and its writer reads the record again. :meth:`AttemptStore.move_in`
is that write inside a caller's transaction: settling moves the record and writes the
ledger row and the telemetry outbox rows in one (:func:`gpu_ops.flows.training.settle.settle_attempt`).
Times of the heartbeat (``beat_at``) come from the database's clock. No Dagster here.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite

from gpu_ops.storage.quota import db_clock
from gpu_ops.domain.training.attempts import OPEN_STATES, Attempt, Decision, Owner, State

ATTEMPT_TABLE = "gpu_ops_training_attempts"


def _to_row(a: Attempt) -> dict[str, Any]:
    return {
        "attempt_id": a.attempt_id, "run_id": a.run_id, "asset_key": a.asset_key, "attempt": a.attempt, "state": a.state.value,
        "owner_host": a.owner.host, "owner_pid": a.owner.pid, "owner_started": a.owner.started, "step_key": a.owner.step_key,
        "launch_name": a.launch_name, "lease_id": a.lease_id, "token": a.token, "worker_host": a.worker_host,
        "worker_pids": json.dumps(list(a.worker_pids)), "worker_started": json.dumps(list(a.worker_started)), "workdir": a.workdir,
        "planned_at": a.planned_at, "launched_at": a.launched_at, "first_step_at": a.first_step_at, "ended_at": a.ended_at,
        "outcome": a.outcome, "reason": a.reason, "decision": a.decision.value if a.decision else None,
        "bill": json.dumps(dict(a.bill), default=str), "settled_by": a.settled_by,
    }


def _from_row(r: Any) -> Attempt:
    owner = Owner(r["owner_host"], int(r["owner_pid"]), r["owner_started"], r["run_id"], r["step_key"] or "")
    return Attempt(
        attempt_id=r["attempt_id"], run_id=r["run_id"], asset_key=r["asset_key"], attempt=int(r["attempt"]), owner=owner,
        state=State(r["state"]), launch_name=r["launch_name"] or "", lease_id=r["lease_id"], token=r["token"],
        worker_host=r["worker_host"], worker_pids=tuple(json.loads(r["worker_pids"] or "[]")),
        worker_started=tuple(json.loads(r["worker_started"] or "[]")), workdir=r["workdir"], planned_at=r["planned_at"],
        launched_at=r["launched_at"], first_step_at=r["first_step_at"], ended_at=r["ended_at"], outcome=r["outcome"],
        reason=r["reason"] or "", decision=Decision(r["decision"]) if r["decision"] else None,
        bill=json.loads(r["bill"] or "{}"), settled_by=r["settled_by"],
    )


class AttemptStore:
    """The attempt records of one gpu_ops database (a :class:`~gpu_ops.storage.tables.TableStore`)."""

    def __init__(self, store: Any):
        self.store, self._sa = store, sa
        self.db_now = db_clock(store.dialect)
        self._created = False
        F, T, I = sa.Float, sa.Text, sa.Integer  # noqa: E741, N806
        self.table = sa.Table(
            ATTEMPT_TABLE, sa.MetaData(),
            sa.Column("attempt_id", sa.String(64), primary_key=True),
            *(sa.Column(n, T, nullable=False) for n in ("run_id", "asset_key", "state", "owner_host")),
            sa.Column("attempt", I, nullable=False), sa.Column("owner_pid", I, nullable=False),
            *(sa.Column(n, T) for n in ("step_key", "launch_name", "lease_id", "worker_host", "worker_pids", "worker_started")),
            *(sa.Column(n, T) for n in ("workdir", "outcome", "reason", "decision", "bill", "settled_by")),
            sa.Column("token", I),
            *(sa.Column(n, F) for n in ("owner_started", "planned_at", "launched_at", "first_step_at", "ended_at", "beat_at")),
            # Finders read the open attempts, an attempt its run's: neither scans the history.
            sa.Index(f"ix_{ATTEMPT_TABLE}_state", "state"),
            sa.Index(f"ix_{ATTEMPT_TABLE}_run", "run_id", "asset_key"),
        )

    def _ensure(self, conn: Any) -> None:
        if not self._created:
            self.table.create(conn, checkfirst=True)
            self._created = True

    def create(self, a: Attempt) -> Attempt:
        with self.store.engine.begin() as conn:
            self._ensure(conn)
            conn.execute(self.table.insert().values(**_to_row(a), beat_at=self.db_now))
        return a

    def move(self, previous: Attempt, new: Attempt) -> bool:
        """Write ``new`` if the stored record is still in ``previous.state``; False when
        someone else moved it first (read it again with :meth:`get`)."""
        with self.store.engine.begin() as conn:
            return self.move_in(conn, previous, new)

    def move_in(self, conn: Any, previous: Attempt | None, new: Attempt) -> bool:
        """:meth:`move` inside the caller's transaction ``conn`` (the compare and the set are
        one statement). ``previous`` None: the record was never stored (its first write
        failed); it is inserted unless it exists."""
        self._ensure(conn)
        t = self.table
        stmt: Any
        if previous is None:
            insert = (postgresql.insert if self.store.dialect == "postgresql" else sqlite.insert)(t)
            stmt = insert.values(**_to_row(new), beat_at=self.db_now).on_conflict_do_nothing(index_elements=["attempt_id"])
        else:
            stmt = t.update().where(t.c.attempt_id == new.attempt_id, t.c.state == previous.state.value).values(**_to_row(new), beat_at=self.db_now)
        return bool(conn.execute(stmt).rowcount)

    def claim(self, a: Attempt, by: Owner) -> Attempt | None:
        """Make ``by`` the owner of ``a``, found orphaned, if the stored record is still
        ``a``'s state and owner (one statement): the settler that claims it stops its
        workers, the others see the claim and leave it. A claimant that dies leaves an
        orphan owned by a dead process, found and claimed again. None when someone else
        moved or claimed it first."""
        t = self.table
        owned = (t.c.owner_host == a.owner.host) & (t.c.owner_pid == a.owner.pid)
        owned &= t.c.owner_started.is_(None) if a.owner.started is None else t.c.owner_started == a.owner.started
        mine = {"owner_host": by.host, "owner_pid": by.pid, "owner_started": by.started, "step_key": by.step_key}
        with self.store.engine.begin() as conn:
            self._ensure(conn)
            stmt = t.update().where(t.c.attempt_id == a.attempt_id, t.c.state == a.state.value, owned).values(**mine, beat_at=self.db_now)
            won = bool(conn.execute(stmt).rowcount)
        return dataclasses.replace(a, owner=by) if won else None

    def beat(self, attempt_id: str) -> None:
        """The owner is alive (database clock)."""
        t = self.table
        with self.store.engine.begin() as conn:
            self._ensure(conn)
            conn.execute(t.update().where(t.c.attempt_id == attempt_id).values(beat_at=self.db_now))

    def get(self, attempt_id: str) -> Attempt | None:
        with self.store.engine.begin() as conn:
            self._ensure(conn)
            row = conn.execute(self.table.select().where(self.table.c.attempt_id == attempt_id)).mappings().first()
        return _from_row(row) if row is not None else None

    def open_attempts(self, deadline: float | None = None) -> list[tuple[Attempt, float]]:
        """Every attempt in a non-final state, with the seconds since its owner's last beat.
        With a ``deadline`` (:meth:`TableStore.reading <gpu_ops.storage.tables.TableStore.reading>`'s:
        an exporter scrape's) it only reads, on a read-only connection whose statements end
        by then (no table created: none yet is no attempt)."""
        t = self.table
        states = [s.value for s in OPEN_STATES] + [State.SETTLED.value]
        query = self._sa.select(t, (self.db_now - t.c.beat_at).label("quiet_s")).where(t.c.state.in_(states))
        if deadline is not None:
            with self.store.reading(deadline) as conn:
                rows = conn.execute(query).mappings().all() if self._sa.inspect(conn).has_table(ATTEMPT_TABLE) else []
        else:
            with self.store.engine.begin() as conn:
                self._ensure(conn)
                rows = conn.execute(query).mappings().all()
        return [(_from_row(r), float(r["quiet_s"] or 0.0)) for r in rows]

    def of_run(self, run_id: str, asset_key: str) -> list[Attempt]:
        t = self.table
        with self.store.engine.begin() as conn:
            self._ensure(conn)
            rows = conn.execute(t.select().where(t.c.run_id == run_id, t.c.asset_key == asset_key).order_by(t.c.attempt)).mappings().all()
        return [_from_row(r) for r in rows]


__all__ = ["ATTEMPT_TABLE", "AttemptStore"]
