"""The attempt record: pure transitions, a conditional store, and orphans settled by whoever finds them.

The orphan test uses real processes: an owner process writes its attempt (planned,
admitted with a real GPU lease, launched with a real local worker) and is SIGKILLed;
the settler finds the record, stops the worker (still training: its own process
session survives the owner), bills the time it really ran, and releases the lease.
SQLite and PostgreSQL.
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

from gpu_ops.storage.quota import LeaseBook
from gpu_ops.storage.tables import TableStore
from gpu_ops.storage import ledger
from gpu_ops.domain.training import attempts as tr
from gpu_ops.storage.attempt_store import AttemptStore
from gpu_ops.domain.training.attempts import Decision, Owner, State, TransitionError
from gpu_ops.flows.training.settle import settle_orphans
from gpu_ops_tests.waiting import pinned

REPO = Path(__file__).resolve().parents[2]
BILL = {
    "namespace": "default", "pod": "p", "node": "n", "team": "nlp", "project": "t", "cost_center": "", "experiment_id": "", "gpu_type": "t4",
    "gpu_count": 1, "capacity_type": "spot", "sharing": "none", "gpu_share": 1.0, "declared_gpu_type": "t4", "declared_gpu_count": 1,
    "hardware_source": "declared",
}


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'costs.db'}" if request.param == "sqlite" else request.getfixturevalue("pg_url")


def planned() -> tr.Attempt:
    return tr.plan("id1", "run-1", "train", 1, Owner.this_process("run-1", "train"), launch_name="l", bill=BILL, at=100.0)


def test_the_diagram_allows_each_state_its_next_and_settling_from_any_open_state() -> None:
    a = planned()
    b = tr.admit(a, "lease", 7)
    c = tr.launch(b, host="h", pids=(1,), started=(None,), at=110.0, workdir=None)
    d = tr.run(c, 111.0)
    e = tr.settle(d, "preempted", "killed", 150.0)
    f = tr.decide(e, Decision.RETRY)
    assert [x.state for x in (a, b, c, d, e, f)] == [State.PLANNED, State.ADMITTED, State.LAUNCHED, State.RUNNING, State.SETTLED, State.DECIDED]
    assert tr.billed_seconds(e) == 40.0  # from the workers' start, not from the plan (the quota wait)
    assert tr.settle(a, "infrastructure", "refused", 101.0).state is State.SETTLED
    with pytest.raises(TransitionError, match="running -> admitted"):
        tr.admit(d, None, None)
    with pytest.raises(TransitionError, match="decided -> settled"):
        tr.settle(f, "completed", "", 1.0)


def test_the_docs_state_diagram_is_the_codes() -> None:
    """docs/concepts/training-attempts.md draws exactly the states and arrows of attempts.NEXT."""
    import re

    text = (REPO / "docs/concepts/training-attempts.md").read_text()
    diagram = text.split("```mermaid", 1)[1].split("```", 1)[0]
    arrows = set(re.findall(r"^\s*(\S+) --> (\S+)\s*$", diagram, flags=re.M))
    inner = {(a, b) for a, b in arrows if "[*]" not in (a, b)}
    assert inner == {(a.value, b.value) for a, nexts in tr.NEXT.items() for b in nexts}
    assert ("[*]", State.PLANNED.value) in arrows  # every attempt starts planned
    assert {a for a, b in arrows if b == "[*]"} == {s.value for s, nexts in tr.NEXT.items() if not nexts}


def test_the_store_moves_a_record_only_from_the_state_it_was_read_in(tmp_path: Path) -> None:
    store = AttemptStore(TableStore(f"sqlite:///{tmp_path / 'c.db'}"))
    a = store.create(planned())
    b = tr.admit(a, None, None)
    assert store.move(a, b)
    assert not store.move(a, tr.admit(a, "other", 1))  # a second writer from the same old state loses
    c = tr.settle(b, "preempted", "x", 200.0, by="someone")
    assert store.move(b, c) and store.get("id1") == c
    assert not store.move(b, tr.settle(b, "completed", "y", 201.0))  # settled once
    assert store.move(c, tr.decide(c, Decision.FAIL))
    assert [x.state for x in store.of_run("run-1", "train")] == [State.DECIDED]


OWNER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from gpu_ops.flows.compute.local import LocalBackend
    from gpu_ops.storage.quota import LeaseBook, Quotas
    from gpu_ops.storage.tables import TableStore
    from gpu_ops.flows.training.recorder import AttemptRecorder
    from gpu_ops_tests.compute import worker_fns
    from gpu_ops_tests.training.test_attempts import BILL
    url, folder = sys.argv[1], Path(sys.argv[2])
    store = TableStore(url)
    rec = AttemptRecorder.plan(store, run_id="run-1", step_key="train", asset_key="train", attempt=1, launch_name="l", bill=BILL, log_error=print)
    adm = LeaseBook(store, ttl_s=600).try_acquire(Quotas(team={"nlp": 1}), team="nlp", pools=[], gpus=1, run_id="run-1", asset_key="train")
    rec.admitted(adm.lease)
    backend = LocalBackend(name="owner", workdir=folder / "work")
    def started(pids):
        rec.launched(pids, str(backend.workdir))
        print("pid-of-worker", pids[0], flush=True)
    backend.run(worker_fns.tick, (str(folder / "ticks"),), on_start=started, log=lambda line: None)
    """
)


def test_an_attempt_whose_owner_was_killed_is_settled_billed_and_its_lease_released(tmp_path: Path, db_url: str) -> None:
    owner = subprocess.Popen([sys.executable, "-c", OWNER, db_url, str(tmp_path)], stdout=subprocess.PIPE, text=True, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert owner.stdout is not None
    worker = next(int(line.split()[1]) for line in owner.stdout if line.startswith("pid-of-worker "))
    worker_alive = pinned(worker)  # this worker, not a later process given its pid
    ticks = tmp_path / "ticks"
    while not ticks.exists() or not ticks.read_text().split():
        time.sleep(0.05)
    time.sleep(1.5)
    os.kill(owner.pid, signal.SIGKILL)  # the step process dies; its worker (own session, deaf to SIGTERM) trains on
    owner.wait()
    store = TableStore(db_url)
    (record, _quiet), = AttemptStore(store).open_attempts()
    assert record.state is State.LAUNCHED and record.lease_id is not None

    found = settle_orphans(store, found_by="attempt 2 of run run-1", successor=("run-1", "train"), grace_s=1.0)
    ticks_text = ticks.read_text().split()
    ran = float(ticks_text[-1]) - float(ticks_text[0])
    (settled,) = found
    assert f"its owner (pid {owner.pid} on " in settled.message and "died while the attempt was launched" in settled.message
    assert "settled by attempt 2 of run run-1 as preempted" in settled.message and "lease released" in settled.message
    assert settled.attempt.state is State.DECIDED and settled.attempt.decision is Decision.RETRY
    assert not worker_alive()  # the worker was stopped (SIGKILL: it ignores SIGTERM)
    (row,) = ledger.read(store).itertuples(index=False)
    billed = (row.end - row.start).total_seconds()
    assert abs(billed - ran) < 2.0, (billed, ran)  # what the worker really ran, not the owner's life
    assert (row.outcome, row.attempt, row.gpu_count) == ("preempted", 1, 1)
    assert LeaseBook(store).holders() == []  # the GPUs are back at once, not after the TTL
    assert AttemptStore(store).open_attempts() == []
    assert settle_orphans(store, found_by="again") == []  # settled once, billed once
    assert len(ledger.read(store)) == 1


def test_a_live_owner_is_left_alone(tmp_path: Path) -> None:
    store = TableStore(f"sqlite:///{tmp_path / 'c.db'}")
    AttemptStore(store).create(planned())  # owned by this (live) process
    assert settle_orphans(store, found_by="sensor") == []
    assert [a.state for a, _ in AttemptStore(store).open_attempts()] == [State.PLANNED]


def test_the_sensor_settles_an_attempt_whose_step_died_with_no_attempt_after_it(tmp_path: Path) -> None:
    import dagster as dg
    import yaml

    from gpu_ops.domain.config import load_config
    from gpu_ops.dagster.training.definitions import ATTEMPT_SENSOR, build_attempt_sensor

    cfg = tmp_path / "gpu_ops.yaml"
    cfg.write_text(yaml.safe_dump({"storage": {"url": "sqlite:///c.db"}, "prices": {"source": "t", "as_of": "2026-11-01", "gpus": {"t4": {"spot": 0.2}}}}))
    config = load_config(cfg)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    started = tr.started_since_boot(dead.pid)
    dead.wait()
    owner = Owner(os.uname().nodename, dead.pid, started, "run-9", "train")
    a = tr.plan("gone", "run-9", "train", 1, owner, launch_name="l", bill=BILL, at=time.time() - 5)
    a = tr.launch(a, host=os.uname().nodename, pids=(dead.pid,), started=(started,), at=time.time() - 4, workdir=None)
    store = TableStore.from_config(config)
    AttemptStore(store).create(a)
    sensor = build_attempt_sensor(config)
    assert sensor.name == ATTEMPT_SENSOR and sensor.default_status == dg.DefaultSensorStatus.RUNNING
    result = sensor.evaluate_tick(dg.build_sensor_context(instance=dg.DagsterInstance.ephemeral()))
    assert result.skip_message == "1 orphaned attempt(s) settled"
    (record,) = AttemptStore(store).of_run("run-9", "train")
    assert record.state is State.DECIDED and record.decision is Decision.FAIL and record.settled_by == "the orphaned-attempts sensor"
    (row,) = ledger.read(store).itertuples(index=False)
    assert row.outcome == "preempted" and 3.0 < (row.end - row.start).total_seconds() < 6.0  # up to its owner's last beat


def test_validate_reports_an_orphaned_attempt_and_settles_it_only_when_asked(tmp_path: Path) -> None:
    import yaml

    cfg = tmp_path / "gpu_ops.yaml"
    cfg.write_text(yaml.safe_dump({"storage": {"url": "sqlite:///c.db"}, "prices": {"source": "t", "as_of": "2026-11-01", "gpus": {"t4": {"spot": 0.2}}}}))
    env = {**os.environ, "PYTHONPATH": str(REPO), "GPU_OPS_CONFIG": str(cfg)}
    validate = [sys.executable, "-m", "gpu_ops.cli", "validate", "--only", "orphaned_attempts"]
    before = subprocess.run(validate, capture_output=True, text=True, env=env, cwd=tmp_path)
    assert before.returncode == 0 and "no training attempt recorded yet" in before.stdout
    assert not (tmp_path / "c.db").exists()  # validate writes nothing unless asked

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    started = tr.started_since_boot(dead.pid)
    dead.wait()
    owner = Owner(os.uname().nodename, dead.pid, started, "run-7", "train")
    a = tr.plan("gone7", "run-7", "train", 1, owner, launch_name="l", bill=BILL, at=time.time() - 5)
    a = tr.launch(a, host=os.uname().nodename, pids=(dead.pid,), started=(started,), at=time.time() - 4, workdir=None)
    store = TableStore(f"sqlite:///{tmp_path / 'c.db'}")
    AttemptStore(store).create(a)

    found = subprocess.run(validate, capture_output=True, text=True, env=env, cwd=tmp_path)
    assert found.returncode == 1, found.stdout
    assert f"run-7 train attempt 1 is launched and its owner (pid {dead.pid} on" in found.stdout and "--settle-orphans" in found.stdout
    assert ledger.read(store).empty and len(AttemptStore(store).open_attempts()) == 1  # reported, not touched

    settled = subprocess.run([*validate, "--settle-orphans"], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert settled.returncode == 0, settled.stdout
    assert "settled 1 orphaned attempt(s)" in settled.stdout and "settled by gpu-ops validate as preempted" in settled.stdout
    assert AttemptStore(store).open_attempts() == []
    (row,) = ledger.read(store).itertuples(index=False)
    assert row.outcome == "preempted" and row.run_id == "run-7"
