"""Settling is one transaction: the record moves to ``settled`` and its ledger row and
telemetry outbox rows are written together, the row unique on (run, asset, attempt) in the
schema, on SQLite and PostgreSQL.

Real settlers in real processes: two racing on the same orphaned attempts (both read the
records before either writes, so both reach the compare-and-set), and an owner SIGKILLed
after its attempt settled while its span export hangs on a collector that answers two
bytes a second, then two `gpu-ops validate --settle-orphans` at once: one ledger row, one
outbox row, one span at the collector, whatever the interleaving.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from gpu_ops.storage.tables import TableStore
from gpu_ops.domain.training import attempts as tr
from gpu_ops.storage import ledger
from gpu_ops.storage.attempt_store import AttemptStore
from gpu_ops.domain.training.attempts import Decision, Owner, State
from gpu_ops_tests.hostile_http import hostile, trickle_headers
from gpu_ops_tests.http_receiver import serving
from gpu_ops_tests.training.test_attempts import BILL
from gpu_ops_tests.waiting import wait_until

REPO = Path(__file__).resolve().parents[2]
PRICES = REPO / "gpu_ops" / "demo" / "prices.yaml"
ENV = {**os.environ, "PYTHONPATH": str(REPO)}


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'costs.db'}" if request.param == "sqlite" else request.getfixturevalue("pg_url")


def _dead_pid() -> tuple[int, float | None]:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    started = tr.started_since_boot(dead.pid)
    dead.wait()
    return dead.pid, started


def orphan(store: TableStore, run_id: str, attempt: int) -> tr.Attempt:
    """An attempt launched by a step process that is gone (its worker gone too)."""
    pid, started = _dead_pid()
    owner = Owner(os.uname().nodename, pid, started, run_id, "train")
    a = tr.plan(f"{run_id}-{attempt}", run_id, "train", attempt, owner, launch_name="l", bill=BILL, at=time.time() - 5)
    a = tr.launch(a, host=os.uname().nodename, pids=(pid,), started=(started,), at=time.time() - 4, workdir=None)
    return AttemptStore(store).create(a)


def outbox_rows(store: TableStore) -> list:
    from gpu_ops.storage.outbox import Outbox

    return Outbox(store).entries()


RACER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from gpu_ops.storage.tables import TableStore
    from gpu_ops.storage.attempt_store import AttemptStore
    from gpu_ops.flows.training.settle import settle_orphan
    url, go, name = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
    store = TableStore(url)
    attempts = AttemptStore(store)
    seen = sorted(attempts.open_attempts(), key=lambda p: p[0].attempt)  # both settlers hold the same records
    print("ready", len(seen), flush=True)
    while not go.exists():
        time.sleep(0.001)
    won = [a.attempt for a, quiet in seen if settle_orphan((attempts, store), a, quiet, found_by=name, successor=None, grace_s=0.1) is not None]
    print("won", *won, flush=True)
    """
)


def test_two_settlers_racing_on_the_same_records_bill_each_attempt_once(tmp_path: Path, db_url: str) -> None:
    store = TableStore(db_url)
    for n in range(1, 5):
        orphan(store, "race", n)
    env = {**ENV, "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"}  # spans are queued (nobody sends here)
    go = tmp_path / "go"
    racers = [subprocess.Popen([sys.executable, "-c", RACER, db_url, str(go), f"settler {i}"], stdout=subprocess.PIPE, text=True, env=env) for i in (1, 2)]
    for r in racers:
        assert r.stdout is not None and r.stdout.readline().split() == ["ready", "4"]
    go.touch()
    won = []
    for r in racers:
        out, _ = r.communicate(timeout=120)
        assert r.returncode == 0, out
        (line,) = [x for x in out.splitlines() if x.startswith("won")]
        won += [int(x) for x in line.split()[1:]]
    assert sorted(won) == [1, 2, 3, 4]  # each attempt settled by exactly one of them
    rows = ledger.read(store)
    assert sorted(rows["attempt"]) == [1, 2, 3, 4] and set(rows["outcome"]) == {"preempted"}
    box = outbox_rows(store)
    assert sorted((e.kind, e.attempt) for e in box) == [("span", n) for n in (1, 2, 3, 4)]
    assert all(e.sent_at is None for e in box)
    assert [a.state for a in AttemptStore(store).of_run("race", "train")] == [State.DECIDED] * 4


DEAF_WORKER = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(600)"


def test_a_settler_claims_the_orphan_before_stopping_its_worker_and_the_other_does_not_wait(db_url: str) -> None:
    """Two settlers read the same orphan, whose worker still runs and ignores SIGTERM. The
    first claims the record (it becomes the attempt's owner) before it stops the worker and
    waits the grace period; the second finds the claim and returns at once, while the
    worker still runs: nothing blocks between a settler's read and its write, and the
    worker is stopped, waited for and billed by one settler only."""
    import threading

    from gpu_ops.flows.training.settle import settle_orphan

    store = TableStore(db_url)
    attempts = AttemptStore(store)
    worker = subprocess.Popen([sys.executable, "-c", DEAF_WORKER], stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert worker.stdout is not None and worker.stdout.readline().strip() == "up"
        started = tr.started_since_boot(worker.pid)
        pid, owner_started = _dead_pid()
        here = os.uname().nodename
        a = tr.plan("claim-1", "run-c", "train", 1, Owner(here, pid, owner_started, "run-c", "train"), launch_name="l", bill=BILL, at=time.time() - 5)
        attempts.create(tr.launch(a, host=here, pids=(worker.pid,), started=(started,), at=time.time() - 4, workdir=None))
        (seen, quiet), = attempts.open_attempts()  # both settlers hold this record
        results: dict[str, object] = {}

        def settler(name: str, grace_s: float) -> None:
            results[name] = settle_orphan((attempts, store), seen, quiet, found_by=name, successor=None, grace_s=grace_s, log=None)

        first = threading.Thread(target=settler, args=("settler 1", 8.0))
        first.start()
        assert wait_until(lambda: attempts.get("claim-1").owner.pid == os.getpid(), timeout=30)  # claimed: owned by this process now
        claimed = attempts.get("claim-1")
        assert claimed.state is State.LAUNCHED and "settler 1" in claimed.owner.step_key
        settler("settler 2", 8.0)  # the same record read before the claim
        assert results["settler 2"] is None
        assert worker.poll() is None  # returned while the claimant still waits its grace: it did not wait
        first.join(timeout=60)
    finally:
        worker.kill()
        worker.wait()
    settled = results["settler 1"]
    assert settled is not None and settled.attempt.state is State.DECIDED and settled.attempt.settled_by == "settler 1"
    assert f"its owner (pid {pid} on " in settled.message  # the owner that died, not the claimant
    assert len(ledger.read(store)) == 1


def test_a_ledger_made_before_the_unique_key_is_de_duplicated_and_keyed(db_url: str) -> None:
    """A table the old code wrote, holding the same attempt twice (the double bill), with no
    index: the next settlement keeps one of them, makes the key, and reads the same columns."""
    import dataclasses

    from gpu_ops.flows.training.settle import ledger_row, settle_attempt

    store = TableStore(db_url)
    a = orphan(store, "old", 1)
    done = tr.settle(a, "preempted", "x", time.time())
    old = ledger_row(done)
    store.append(ledger.LEDGER_TABLE, ledger.to_frame([old, dataclasses.replace(old, end=old.end), dataclasses.replace(old, attempt=2)]))
    legacy = ledger.read(store)
    assert len(legacy) == 3
    b = orphan(store, "new", 1)
    committed = settle_attempt(AttemptStore(store), b, tr.settle(b, "completed", "done", time.time()))
    assert committed is not None and committed.row is not None
    rows = ledger.read(store).sort_values(["run_id", "attempt"])
    assert list(zip(rows["run_id"], rows["attempt"])) == [("new", 1), ("old", 1), ("old", 2)]
    assert list(rows.columns) == list(legacy.columns) == list(ledger.LEDGER_COLUMNS) and dict(rows.dtypes) == dict(legacy.dtypes)  # what readers read
    assert rows[rows["run_id"] == "new"].iloc[0]["end"] == committed.row.end
    with pytest.raises(Exception, match="(?i)unique|duplicate"):
        store.append(ledger.LEDGER_TABLE, ledger.to_frame([old]))  # the schema refuses a second row for an attempt
    assert settle_attempt(AttemptStore(store), b, tr.settle(b, "completed", "again", time.time())) is None  # the CAS: settled already


OWNER = textwrap.dedent(
    """
    import os, sys, time
    from gpu_ops.storage.tables import TableStore
    from gpu_ops.flows.training.recorder import AttemptRecorder
    from gpu_ops_tests.training.test_attempts import BILL
    store = TableStore(sys.argv[1])
    rec = AttemptRecorder.plan(store, run_id="run-k", step_key="train", asset_key="train", attempt=1, launch_name="l", bill=BILL,
                               log_error=print, deadline_s=60.0)
    rec.launched([os.getpid()], None)
    rec.settle("completed", "done", time.time(), None, None)
    print("settled", flush=True)
    rec.stop()  # waits for the span's delivery: the collector trickles
    """
)


def test_an_owner_killed_after_settling_leaves_one_row_one_record_and_one_span(tmp_path: Path, db_url: str) -> None:
    from gpu_ops_tests.observability.test_tracing import OtlpHandler, Receiver

    cfg = tmp_path / "gpu_ops.yaml"
    cfg.write_text(f"storage: {{url: '{db_url}'}}\nprices: {PRICES}\ntraining: {{telemetry_deadline_s: 5}}\n")
    store = TableStore(db_url)
    with hostile(then=trickle_headers(0.5)) as collector:  # two bytes a second, forever
        owner = subprocess.Popen([sys.executable, "-c", OWNER, db_url], stdout=subprocess.PIPE, text=True, env={**ENV, "OTEL_EXPORTER_OTLP_ENDPOINT": collector.url})
        assert owner.stdout is not None and owner.stdout.readline().strip() == "settled"
        assert wait_until(lambda: collector.requests, timeout=60)  # the span export is in flight
        os.kill(owner.pid, signal.SIGKILL)
        owner.wait()
    (record,) = AttemptStore(store).of_run("run-k", "train")
    assert record.state is State.SETTLED and len(ledger.read(store)) == 1  # the bill was committed with the record
    ((entry,),) = [outbox_rows(store)]
    assert entry.sent_at is None and entry.claim_token is not None  # claimed by the dead owner, not sent

    Receiver.spans, Receiver.requests = [], []
    with serving(OtlpHandler) as healthy:
        validate = [sys.executable, "-m", "gpu_ops.cli", "validate", "--config", str(cfg), "--only", "orphaned_attempts", "--settle-orphans"]
        env = {**ENV, "OTEL_EXPORTER_OTLP_ENDPOINT": healthy}
        both = [subprocess.Popen(validate, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=tmp_path) for _ in range(2)]
        outs = [p.communicate(timeout=120)[0] for p in both]
    assert all(p.returncode == 0 for p in both), outs
    assert sorted("settled 1 orphaned attempt(s)" in o for o in outs) == [False, True], outs  # one of them decided it
    assert sum("telemetry: 1 record(s) sent" in o for o in outs) == 1, outs
    assert len(ledger.read(store)) == 1
    (entry,) = outbox_rows(store)
    assert entry.sent_at is not None
    (span,) = Receiver.spans
    assert span["attributes"]["dagster.run_id"] == "run-k" and span["attributes"]["gpu_ops.training.attempt"] == 1
    (record,) = AttemptStore(store).of_run("run-k", "train")
    assert record.state is State.DECIDED and record.decision is Decision.FAIL
