"""GPU-weighted admission: quotas counted in GPUs per team and per NodePool, held as fenced
leases in the gpu_ops database, on the database's clock. No Dagster here.

Design: docs/concepts/training-attempts.md#fenced-leases and docs/concepts/compute.md#admission
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa

from gpu_ops.domain.compute import fence
from gpu_ops.domain.compute.backend import Gone, LeaseLost
from gpu_ops.errors import QuotaExceeded, SharedSqliteLeases

LEASE_TABLE = "gpu_ops_gpu_leases"


TOKEN_TABLE = "gpu_ops_lease_tokens"


@dataclass(frozen=True)
class Lease:
    lease_id: str
    team: str
    pools: tuple[str, ...]
    gpus: int
    run_id: str
    asset_key: str
    holder: str
    acquired_at: float  # database clock, seconds since the epoch
    expires_at: float
    renewed_at: float | None = None  # the last heartbeat (database clock); None before the first
    token: int = 0  # fencing token: larger for every lease granted later
    workers: str | None = None  # the launch's workers as its backend recorded them (JSON); None before they exist

    @property
    def host(self) -> str:
        return self.holder.rsplit(":", 1)[0]

    def scopes(self) -> list[tuple[str, str]]:
        return [("team", self.team), *(("pool", p) for p in self.pools)]


@dataclass(frozen=True)
class Admission:
    granted: bool
    reason: str  # why it waits, or what it was granted against
    lease: Lease | None = None
    holders: tuple[Lease, ...] = ()  # the leases held when it was decided (the new one and unreclaimed expired ones included)
    reclaimed: tuple[Lease, ...] = ()  # expired leases removed by this admission (their workers confirmed gone)
    stopped: Mapping[str, str] = field(default_factory=dict)  # lease id -> how its workers were made gone
    unreclaimed: tuple[tuple[Lease, str], ...] = ()  # expired leases kept (still counted), with why


@dataclass(frozen=True)
class Quotas:
    team: Mapping[str, int] = field(default_factory=dict)
    pool: Mapping[str, int] = field(default_factory=dict)

    def limit(self, kind: str, name: str) -> int | None:
        return (self.team if kind == "team" else self.pool).get(name)

    def __bool__(self) -> bool:
        return bool(self.team or self.pool)


def decide(quotas: Quotas, want: Lease, held: Iterable[Lease]) -> tuple[bool, str]:
    """Pure: may ``want`` start next to the ``held`` leases? (granted, reason)."""
    held = list(held)
    for kind, name in want.scopes():
        limit = quotas.limit(kind, name)
        if limit is None:
            continue
        if want.gpus > limit:
            raise QuotaExceeded(f"{kind} {name}: the launch asks for {want.gpus} GPUs, more than its whole quota of {limit}")
        used = sum(lease.gpus for lease in held if (kind, name) in lease.scopes())
        if used + want.gpus > limit:
            return False, f"{name} holds {used} of {limit} GPUs; waiting for {want.gpus}"
    scopes = [f"{n} {sum(le.gpus for le in held if (k, n) in le.scopes()) + want.gpus} of {quotas.limit(k, n)}" for k, n in want.scopes() if quotas.limit(k, n)]
    return True, "admitted: " + (", ".join(scopes) + " GPUs" if scopes else "no quota applies")


def _row(lease: Lease) -> dict[str, Any]:
    return {
        "lease_id": lease.lease_id, "team": lease.team, "pools": json.dumps(list(lease.pools)), "gpus": lease.gpus,
        "run_id": lease.run_id, "asset_key": lease.asset_key, "holder": lease.holder,
        "acquired_at": lease.acquired_at, "expires_at": lease.expires_at, "renewed_at": lease.renewed_at, "token": lease.token,
        "workers": lease.workers,
    }


def _lease(row: Mapping[str, Any]) -> Lease:
    return Lease(
        str(row["lease_id"]), str(row["team"]), tuple(json.loads(row["pools"])), int(row["gpus"]), str(row["run_id"]),
        str(row["asset_key"]), str(row["holder"]), float(row["acquired_at"]), float(row["expires_at"]),
        float(row["renewed_at"]) if row.get("renewed_at") is not None else None,
        int(row.get("token") or 0),
        row.get("workers"),
    )


# The database's clock as seconds since the epoch, per dialect. PostgreSQL's
# clock_timestamp() moves during a transaction (now() is the transaction's start).
DB_NOW_SQL = {
    "postgresql": "extract(epoch from clock_timestamp())",
    "sqlite": "((julianday('now') - 2440587.5) * 86400.0)",
}


def db_clock(dialect: str) -> Any:
    """The database's clock as a SQL expression (seconds since the epoch), per dialect:
    every time the leases and the attempt records keep is on it."""
    return sa.literal_column(DB_NOW_SQL[dialect], sa.Float)


class LeaseBook:
    """The leases table of one gpu_ops database (a :class:`~gpu_ops.storage.tables.TableStore`)."""

    def __init__(self, store: Any, ttl_s: float = 60.0, reclaimer: Any = None):
        # reclaimer: the backend that makes an expired lease's workers gone (``make_gone``);
        # without one, only leases that recorded no worker are reclaimed.
        self.store, self.ttl_s, self.reclaimer = store, ttl_s, reclaimer
        self._sa = sa
        self.db_now = db_clock(store.dialect)
        self._migrated = False
        meta = sa.MetaData()
        self.table = sa.Table(
            LEASE_TABLE, meta,
            sa.Column("lease_id", sa.String(64), primary_key=True),
            sa.Column("team", sa.Text, nullable=False),
            sa.Column("pools", sa.Text, nullable=False),
            sa.Column("gpus", sa.Integer, nullable=False),
            sa.Column("run_id", sa.Text, nullable=False),
            sa.Column("asset_key", sa.Text, nullable=False),
            sa.Column("holder", sa.Text, nullable=False),
            sa.Column("acquired_at", sa.Float, nullable=False),
            sa.Column("expires_at", sa.Float, nullable=False),
            sa.Column("renewed_at", sa.Float, nullable=True),
            sa.Column("token", sa.Integer, nullable=True),
            sa.Column("workers", sa.Text, nullable=True),
        )
        self.tokens = sa.Table(TOKEN_TABLE, meta, sa.Column("name", sa.String(64), primary_key=True), sa.Column("token", sa.Integer, nullable=False))

    def _locked(self, conn: Any) -> float:
        """Take the admission lock; the database's time, once it is held."""
        # One admission at a time; the table is created under the same lock, so two first
        # admissions on a fresh database do not race on CREATE TABLE.
        self.store.lock(conn, LEASE_TABLE)
        self.table.create(conn, checkfirst=True)
        self.tokens.create(conn, checkfirst=True)
        if not self._migrated:  # a table from before heartbeats (tokens, workers) were recorded
            have = {c["name"] for c in self._sa.inspect(conn).get_columns(LEASE_TABLE)}
            for name, kind in (("renewed_at", "FLOAT"), ("token", "INTEGER"), ("workers", "TEXT")):
                if name not in have:
                    conn.execute(self._sa.text(f"ALTER TABLE {LEASE_TABLE} ADD COLUMN {name} {kind}"))
            self._migrated = True
        return float(conn.execute(self._sa.select(self.db_now)).scalar_one())

    def _make_gone_expired(self) -> dict[str, tuple[str | None, Gone]]:
        """Outside the admission lock: every expired lease's workers made gone by the
        reclaimer, by lease id, with the worker record that was acted on."""
        now, leases = self.snapshot()
        return {le.lease_id: (le.workers, self._make_gone(le)) for le in leases if le.expires_at < now}

    def _make_gone(self, lease: Lease) -> Gone:
        if not lease.workers:
            return Gone(True, "no worker was recorded on it")
        if self.reclaimer is None:
            return Gone(False, "this admission has no backend that could stop its workers")
        try:
            return self.reclaimer.make_gone(json.loads(lease.workers))
        except Exception as exc:  # noqa: BLE001 - a reclaimer that fails has confirmed nothing
            return Gone(False, f"stopping its workers failed ({type(exc).__name__}: {exc})")

    def _settle_expired(self, conn: Any, now: float, gone: Mapping[str, tuple[str | None, Gone]]) -> tuple[list[Lease], list[Lease], list[tuple[Lease, str]]]:
        """Under the lock: (live, reclaimed, kept). An expired lease is deleted only when its
        workers were confirmed gone and its record has not changed since."""
        rows = [_lease(r._mapping) for r in conn.execute(self.table.select())]
        reclaimed: list[Lease] = []
        kept: list[tuple[Lease, str]] = []
        for le in (r for r in rows if r.expires_at < now):
            seen = gone.get(le.lease_id)
            if seen is None or seen[0] != le.workers:
                kept.append((le, "it expired a moment ago: its workers are stopped before it is handed on"))
            elif not seen[1].confirmed:
                kept.append((le, seen[1].why))
            elif self._delete_unchanged(conn, le):
                reclaimed.append(le)
            else:
                kept.append((le, "it changed while its workers were stopped"))
        return [r for r in rows if r.expires_at >= now], reclaimed, kept

    def _delete_unchanged(self, conn: Any, lease: Lease) -> bool:
        t = self.table
        same = t.c.workers.is_(None) if lease.workers is None else t.c.workers == lease.workers
        return bool(conn.execute(t.delete().where((t.c.lease_id == lease.lease_id) & same & (t.c.expires_at < self.db_now))).rowcount)

    def _next_token(self, conn: Any) -> int:
        t = self.tokens
        current = conn.execute(self._sa.select(t.c.token).where(t.c.name == LEASE_TABLE)).scalar()
        if current is None:
            conn.execute(t.insert().values(name=LEASE_TABLE, token=1))
            return 1
        conn.execute(t.update().where(t.c.name == LEASE_TABLE).values(token=int(current) + 1))
        return int(current) + 1

    def _refuse_other_hosts(self, conn: Any) -> None:
        """SQLite's clock is the querying host's: one launching host per file."""
        if self.store.dialect != "sqlite":
            return
        here = socket.gethostname()
        others = sorted({le.host for le in (_lease(r._mapping) for r in conn.execute(self.table.select())) if le.host != here})
        if others:
            raise SharedSqliteLeases(
                f"GPU leases on SQLite are timed by each launcher's own clock, and host(s) {', '.join(others)} also launch here ({here}): "
                "a skewed clock could reclaim a live lease. Use a PostgreSQL storage.url for several launching hosts "
                f"(or remove the other hosts' rows from {LEASE_TABLE} once they have stopped)"
            )

    def try_acquire(self, quotas: Quotas, *, team: str, pools: Iterable[str], gpus: int, run_id: str, asset_key: str) -> Admission:
        gone = self._make_gone_expired()
        with self.store.engine.begin() as conn:
            now = self._locked(conn)
            self._refuse_other_hosts(conn)
            want = Lease(uuid.uuid4().hex, team, tuple(pools), gpus, run_id, asset_key, f"{socket.gethostname()}:{os.getpid()}", now, now + self.ttl_s)
            live, reclaimed, kept = self._settle_expired(conn, now, gone)
            held = live + [le for le, _ in kept]  # a lease whose workers may still run still holds its GPUs
            granted, reason = decide(quotas, want, held)
            if granted:
                want = dataclasses.replace(want, token=self._next_token(conn))
                conn.execute(self.table.insert().values(**_row(want)))
                held.append(want)
        if not granted and kept:
            reason += "; " + "; ".join(
                f"lease {le.lease_id[:8]} of run {le.run_id or '?'} ({le.gpus} GPU(s) of {le.team}, holder {le.holder}) expired but is not reclaimed: {why}"
                for le, why in kept
            )
        stopped = {le.lease_id: gone[le.lease_id][1].why for le in reclaimed}
        return Admission(granted, reason, want if granted else None, tuple(held), tuple(reclaimed), stopped, tuple(kept))

    def record_workers(self, lease: Lease, workers: Mapping[str, Any]) -> bool:
        """Write the launch's workers on its lease (the backend's record, for a later
        reclaimer); False when the lease has expired or is gone: they must not start."""
        t = self.table
        live = (t.c.lease_id == lease.lease_id) & (t.c.expires_at >= self.db_now)
        with self.store.engine.begin() as conn:
            return bool(conn.execute(t.update().where(live).values(workers=json.dumps(dict(workers), sort_keys=True))).rowcount)

    def renew(self, lease: Lease) -> bool:
        """A heartbeat: the lease expires ``ttl_s`` after now on the database's clock;
        False when it is gone (expired and reclaimed)."""
        with self.store.engine.begin() as conn:
            t = self.table
            # Never a lease that has expired: a renewal delayed past the TTL (a paused
            # holder, a lock held on the table) must not revive what may be handed on.
            live = (t.c.lease_id == lease.lease_id) & (t.c.expires_at >= self.db_now)
            done = conn.execute(t.update().where(live).values(expires_at=self.db_now + self.ttl_s, renewed_at=self.db_now))
            return bool(done.rowcount)

    def release(self, lease: Lease) -> None:
        self.release_id(lease.lease_id)

    def release_id(self, lease_id: str) -> None:
        """Give a lease's GPUs back (its holder is known to be gone, or done)."""
        with self.store.engine.begin() as conn:
            self.table.create(conn, checkfirst=True)
            conn.execute(self.table.delete().where(self.table.c.lease_id == lease_id))

    def snapshot(self) -> tuple[float, list[Lease]]:
        """The database's time and every lease row, expired ones not yet reclaimed included."""
        with self.store.engine.begin() as conn:
            now = self._locked(conn)
            return now, [_lease(r._mapping) for r in conn.execute(self.table.select())]

    def holders(self) -> list[Lease]:
        """Live leases (expired ones are left for the next admission to reclaim)."""
        now, leases = self.snapshot()
        return [le for le in leases if le.expires_at >= now]


class Heartbeat(threading.Thread):
    """Renews a lease every ``every_s`` until stopped; then releases it. With
    ``fence_path``, each renewal is confirmed to the workers in their fence file (see the
    module docstring); ``on_lost`` is called once when the lease is found gone."""

    def __init__(self, book: LeaseBook, lease: Lease, every_s: float, on_error: Any = None, fence_path: str | None = None, on_lost: Any = None):
        super().__init__(name=f"gpu-ops-lease-{lease.lease_id[:8]}", daemon=True)
        self.book, self.lease, self.every_s = book, lease, every_s
        self.on_error = on_error or (lambda _m: None)
        self.on_lost = on_lost or (lambda _m: None)
        self.fence_path = fence_path
        self.lost = False
        self.admission: Admission | None = None  # what granted the lease (for the metadata)
        self._stop_event = threading.Event()
        self._confirm(time.time())

    def _confirm(self, asked_at: float, revoked: bool = False) -> None:
        if self.fence_path is not None:
            valid = 0.0 if revoked else asked_at + self.book.ttl_s * fence.VALID_FRACTION
            fence.write(self.fence_path, fence.Fence(self.lease.lease_id, self.lease.token, valid, revoked))

    def beat(self) -> None:
        asked_at = time.time()
        try:
            renewed = self.book.renew(self.lease)
        except Exception as exc:  # noqa: BLE001 - a database hiccup: the next beat retries; the fence lapses meanwhile
            self.on_error(f"could not renew GPU lease {self.lease.lease_id[:8]}: {type(exc).__name__}: {exc}")
            return
        if renewed:
            self._confirm(asked_at)
            return
        self._confirm(asked_at, revoked=True)
        if not self.lost:
            self.lost = True
            message = f"GPU lease {self.lease.lease_id[:8]} expired before it was renewed (holder paused or database unreachable for more than its TTL): its workers are stopped"
            self.on_error(message)
            self.on_lost(message)

    def hold(self, workers: Mapping[str, Any]) -> None:
        """Write the launch's workers on the lease, before they may use its GPUs (the
        backend's :data:`~gpu_ops.domain.compute.backend.HoldSink`). A database that does not
        answer is retried for as long as the fence is good; raises :class:`LeaseLost`
        when the lease has expired or is gone, or the write did not land in time."""
        deadline = time.monotonic() + self.book.ttl_s * fence.VALID_FRACTION
        name = self.lease.lease_id[:8]
        while True:
            try:
                written = self.book.record_workers(self.lease, workers)
            except Exception as exc:  # noqa: BLE001 - retried below, then the workers are stopped unstarted
                if time.monotonic() >= deadline:
                    raise LeaseLost(f"could not write the workers on GPU lease {name} ({type(exc).__name__}: {exc}): they were stopped before they ran") from exc
                time.sleep(0.2)
                continue
            if not written:
                raise LeaseLost(
                    f"GPU lease {name} expired before its workers were recorded on it (its holder was paused or the database unreachable "
                    f"for more than its TTL of {self.book.ttl_s:g} s): they were stopped before they ran"
                )
            return

    def run(self) -> None:
        while not self._stop_event.wait(self.every_s):
            self.beat()

    def stop(self) -> None:
        self._stop_event.set()
        self.join(timeout=5)
        try:
            self.book.release(self.lease)
        except Exception as exc:  # noqa: BLE001 - it expires after its TTL anyway
            self.on_error(f"could not release GPU lease {self.lease.lease_id[:8]} (it expires after {self.book.ttl_s:g} s): {type(exc).__name__}: {exc}")


def scope_usage(leases: Iterable[Lease], quotas: Quotas) -> list[dict[str, Any]]:
    """GPUs held against each quota: ``{scope, name, held, quota}`` per team and pool."""
    leases = list(leases)
    return [
        {"scope": kind, "name": name, "held": sum(le.gpus for le in leases if (kind, name) in le.scopes()), "quota": limit}
        for kind, limits in (("team", quotas.team), ("pool", quotas.pool))
        for name, limit in sorted(limits.items())
    ]


LEASE_COLUMNS = ("team", "pools", "run_id", "asset_key", "gpus", "holder", "since", "last_heartbeat", "expires", "expires_in_s", "state")


def lease_rows(leases: Iterable[Lease], now: float) -> list[dict[str, Any]]:
    """Who holds what, one row per lease (:data:`LEASE_COLUMNS`), oldest first. Times are
    UTC datetimes on the database's clock; ``state`` is ``live``, or ``expired`` for a
    lease whose holder stopped renewing it and that the next admission reclaims."""
    def at(t: float | None) -> dt.datetime | None:
        return None if t is None else dt.datetime.fromtimestamp(t, dt.timezone.utc)

    return [
        {
            "team": le.team, "pools": ", ".join(le.pools), "run_id": le.run_id, "asset_key": le.asset_key, "gpus": le.gpus,
            "holder": le.holder, "since": at(le.acquired_at), "last_heartbeat": at(le.renewed_at), "expires": at(le.expires_at),
            "expires_in_s": round(le.expires_at - now, 1), "state": "live" if le.expires_at >= now else "expired",
        }
        for le in sorted(leases, key=lambda le: le.acquired_at)
    ]


def holders_markdown(leases: Iterable[Lease], quotas: Quotas) -> str:
    """Who holds what: one row per scope with a quota, then the leases."""
    leases = list(leases)
    lines = ["| scope | held | quota |", "|---|---|---|"]
    lines += [f"| {u['scope']} {u['name']} | {u['held']} | {u['quota']} |" for u in scope_usage(leases, quotas)]
    lines += ["", "| run | asset | team | GPUs | holder |", "|---|---|---|---|---|"]
    lines += [f"| {le.run_id[:8]} | {le.asset_key} | {le.team} | {le.gpus} | {le.holder} |" for le in leases]
    return "\n".join(lines)
