"""Fenced GPU leases: a holder that cannot renew has its workers stopped before the lease
can be handed on, so a quota never admits more GPUs than it has.

Real processes: a lease holder in its own process (``LeaseBook`` + ``Heartbeat`` writing
the fence file) launches a real local worker that ticks a timestamp into a file and
ignores SIGTERM. Then either the holder is SIGSTOPped past the TTL, or the database is
made unavailable to it past the TTL (another connection holds an exclusive lock: SQLite
``BEGIN EXCLUSIVE``, PostgreSQL ``LOCK TABLE ... ACCESS EXCLUSIVE``). A contender in the
test process asks for the same GPUs every 50 ms; when it is granted, the first worker's
last tick must be older than the grant and its process gone.
"""

from __future__ import annotations

import os
import signal
import socket
import sqlite3
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import sqlalchemy as sa

from gpu_ops.domain.compute.fence import Fence, FenceCheck, read, write
from gpu_ops.storage.quota import Lease, LeaseBook, Quotas, SharedSqliteLeases
from gpu_ops.storage.tables import TableStore
from gpu_ops_tests.waiting import pinned

REPO = Path(__file__).resolve().parents[2]
TTL = 4.0
QUOTAS = Quotas(team={"nlp": 4})

HOLDER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from gpu_ops.domain.compute import fence
    from gpu_ops.flows.compute.local import LocalBackend
    from gpu_ops.storage.quota import Heartbeat, LeaseBook, Quotas
    from gpu_ops.storage.tables import TableStore
    from gpu_ops_tests.compute import worker_fns
    url, folder, ttl = sys.argv[1], Path(sys.argv[2]), float(sys.argv[3])
    book = LeaseBook(TableStore(url), ttl_s=ttl)
    adm = book.try_acquire(Quotas(team={"nlp": 4}), team="nlp", pools=[], gpus=4, run_id="first", asset_key="a")
    assert adm.granted, adm.reason
    path = str(folder / "fence.json")
    hb = Heartbeat(book, adm.lease, ttl / 6, on_error=lambda m: print("heartbeat:", m, flush=True), fence_path=path)
    hb.start()
    backend = LocalBackend(name="holder", workdir=folder / "work")
    env = {fence.FENCE_ENV: path, fence.GRACE_ENV: str(ttl * fence.GRACE_FRACTION)}
    report = backend.run(worker_fns.tick, (str(folder / "ticks"),), env=env, on_start=lambda pids: print("pid-of-worker", pids[0], flush=True), log=print)
    print("ended", report.exit.value, flush=True)
    """
)


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'costs.db'}" if request.param == "sqlite" else request.getfixturevalue("pg_url")


def start_holder(url: str, folder: Path) -> tuple[subprocess.Popen, int]:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, url, str(folder), str(TTL)], stdout=subprocess.PIPE, text=True, cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("pid-of-worker "):
            return proc, int(line.split()[1])
    raise AssertionError(f"the holder ended before its worker started (exit {proc.wait()})")


def last_tick(path: Path) -> float:
    lines = path.read_text().split()
    return float(lines[-1]) if lines else 0.0


@contextmanager
def database_unavailable(url: str) -> Iterator[None]:
    """Another connection holds an exclusive lock: the holder cannot renew (nor anyone admit)."""
    if url.startswith("sqlite"):
        conn = sqlite3.connect(url.removeprefix("sqlite:///"), isolation_level=None, timeout=30)
        conn.execute("BEGIN EXCLUSIVE")
        try:
            yield
        finally:
            conn.execute("ROLLBACK")
            conn.close()
        return
    engine = sa.create_engine(url.replace("postgresql://", "postgresql+psycopg2://", 1) if url.startswith("postgresql://") else url)
    with engine.connect() as conn:
        tx = conn.begin()
        conn.execute(sa.text("LOCK TABLE gpu_ops_gpu_leases IN ACCESS EXCLUSIVE MODE"))
        try:
            yield
        finally:
            tx.rollback()
    engine.dispose()


def contend(book: LeaseBook, deadline_s: float) -> tuple[float, Lease]:
    """Ask for the quota's 4 GPUs every 50 ms; (grant time, lease) once granted."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        adm = book.try_acquire(QUOTAS, team="nlp", pools=[], gpus=4, run_id="second", asset_key="a")
        if adm.granted and adm.lease is not None:
            return time.time(), adm.lease
        time.sleep(0.05)
    raise AssertionError("the contender was never admitted")


@pytest.mark.parametrize("outage", ["sigstop", "database"])
def test_a_holder_that_cannot_renew_is_fenced_before_its_lease_is_handed_on(tmp_path: Path, db_url: str, outage: str) -> None:
    holder, worker = start_holder(db_url, tmp_path)
    alive = pinned(worker)  # this worker, not a later process given its pid
    book = LeaseBook(TableStore(db_url), ttl_s=TTL)
    ticks = tmp_path / "ticks"
    try:
        deadline = time.monotonic() + 30
        while not (ticks.exists() and last_tick(ticks) > 0) and time.monotonic() < deadline:
            time.sleep(0.05)
        (first,) = book.holders()
        samples: list[tuple[float, bool]] = []
        if outage == "sigstop":
            os.kill(holder.pid, signal.SIGSTOP)
            granted_at, second = contend(book, 6 * TTL)
        else:
            with database_unavailable(db_url):
                pause_end = time.monotonic() + 1.5 * TTL
                while time.monotonic() < pause_end:  # sample: the worker must be gone well before the lock is released
                    samples.append((time.time(), alive()))
                    time.sleep(0.05)
            granted_at, second = contend(book, 6 * TTL)
        stopped_tick = last_tick(ticks)
        # The first worker stopped (killed by its fence) before the GPUs went to the second.
        assert not alive()
        assert stopped_tick < granted_at, (stopped_tick, granted_at)
        assert second.token > first.token  # fencing tokens only grow
        assert second.lease_id != first.lease_id
        if samples:
            assert not samples[-1][1] and any(a for _, a in samples[:3]), samples[:3]
            gone_at = next(t for t, a in samples if not a)
            assert gone_at - samples[0][0] < TTL  # stopped within the TTL of the outage
        # Sampled: never two workers beyond the quota (the only other holder is the contender).
        assert [le.run_id for le in book.holders()] == ["second"]
    finally:
        if outage == "sigstop":
            os.kill(holder.pid, signal.SIGCONT)
        holder.kill()
        holder.wait(timeout=30)
        if alive():
            os.kill(worker, signal.SIGKILL)


def test_a_renewal_never_revives_an_expired_lease(tmp_path: Path) -> None:
    book = LeaseBook(TableStore(f"sqlite:///{tmp_path / 'c.db'}"), ttl_s=0.3)
    adm = book.try_acquire(QUOTAS, team="nlp", pools=[], gpus=1, run_id="r", asset_key="a")
    assert adm.lease is not None and book.renew(adm.lease)
    time.sleep(0.5)
    assert not book.renew(adm.lease)  # expired: a late heartbeat does not bring it back


def test_the_fence_lapses_after_half_the_ttl_and_a_revoked_one_at_once(tmp_path: Path) -> None:
    path = tmp_path / "fence.json"
    now = time.time()
    write(path, Fence("abc", 3, now + 0.3))
    check = FenceCheck(str(path), every_s=0.0)
    assert check.lapsed() is None and read(path) == Fence("abc", 3, now + 0.3)
    time.sleep(0.4)
    assert "not renewed" in (check.lapsed() or "")
    write(path, Fence("abc", 3, now + 100, revoked=True))
    assert check.revoked() and "revoked" in (check.lapsed() or "")


def test_sqlite_refuses_a_second_launching_host(tmp_path: Path) -> None:
    """SQLite's clock is each launcher's own: a lease from another host means two clocks."""
    store = TableStore(f"sqlite:///{tmp_path / 'c.db'}")
    book = LeaseBook(store, ttl_s=60)
    assert book.try_acquire(QUOTAS, team="nlp", pools=[], gpus=1, run_id="here", asset_key="a").granted
    other = {"lease_id": "other", "team": "nlp", "pools": "[]", "gpus": 1, "run_id": "there", "asset_key": "a", "holder": f"not-{socket.gethostname()}:7", "acquired_at": 0.0, "expires_at": 1e12, "token": 99}
    with store.engine.begin() as conn:
        conn.execute(book.table.insert().values(**other))
    with pytest.raises(SharedSqliteLeases, match="Use a PostgreSQL storage.url"):
        book.try_acquire(QUOTAS, team="nlp", pools=[], gpus=1, run_id="here2", asset_key="a")
