"""Database faults with real sockets, real PostgreSQL and real processes.

- a listener on 127.0.0.1 that accepts TCP and never answers: the connect timeout bounds
  the wait, and the error names the database and the timeout;
- a closed port: one clear paragraph through the CLI (`validate`, `cost`), the IO manager,
  the budget sensor and the launch gate, never a driver traceback or the password;
- statement timeouts: a write stuck behind a lock is cancelled (PostgreSQL) or gives up
  (SQLite);
- N processes writing their first rows to different tables of a fresh PostgreSQL database
  at the same moment all land, trial after trial.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pandas as pd
import pytest
import sqlalchemy as sa

from gpu_ops.dagster.io_manager import TableIOManager
from gpu_ops.storage.tables import StorageUnavailable, TableStore
from gpu_ops_tests.observability.servers import silent_listener

PASSWORD = "pw-marker-7f3a9c"
# Generous: a hang would be minutes (the OS's TCP timeouts) or forever.
BOUND_S = 60


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A TCP listener on 127.0.0.1 that accepts every connection and never says a word."""
    with silent_listener() as port:
        yield port


@pytest.fixture
def closed_port() -> int:
    """A port on 127.0.0.1 where nothing listens (bound, then released)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    return port


def raw_engine(url: str) -> sa.Engine:
    """A plain engine of the test's own (SQLAlchemy 2.1 maps bare postgresql:// to psycopg 3)."""
    return sa.create_engine(url.replace("postgresql://", "postgresql+psycopg2://", 1))


def pg_url_at(port: int) -> str:
    return f"postgresql://gpu_ops:{PASSWORD}@127.0.0.1:{port}/costs"


def assert_clear(message: str, port: int) -> None:
    assert f"postgresql+psycopg2://127.0.0.1:{port}/costs" in message or f"postgresql://127.0.0.1:{port}/costs" in message, message
    assert PASSWORD not in message and "gpu_ops:***@" not in message  # no userinfo at all (formatting.redact_url)
    assert "Check" in message or "check" in message


# --------------------------------------------------------------------------- timeouts


def test_a_silent_listener_is_given_up_on_after_the_connect_timeout(silent_port):
    store = TableStore(pg_url_at(silent_port), connect_timeout_s=2)
    started = time.monotonic()
    with pytest.raises(StorageUnavailable) as err:
        store.read("gpu_usage", missing_ok=True)
    elapsed = time.monotonic() - started
    assert elapsed < BOUND_S, f"took {elapsed:.1f}s"
    assert "no answer within storage.connect_timeout_s (2 s)" in str(err.value)
    assert_clear(str(err.value), silent_port)


@pytest.mark.postgres
def test_a_write_stuck_behind_a_lock_is_cancelled_by_the_statement_timeout(pg_url):
    store = TableStore(pg_url, statement_timeout_s=1)
    store.write("usage", pd.DataFrame({"team": ["nlp"], "gpu_hours": [1.0]}))
    holder = raw_engine(pg_url)
    with holder.connect() as conn:
        conn.execute(sa.text("LOCK TABLE usage IN ACCESS EXCLUSIVE MODE"))
        started = time.monotonic()
        with pytest.raises(StorageUnavailable) as err:
            store.write("usage", pd.DataFrame({"team": ["cv"], "gpu_hours": [2.0]}))
        elapsed = time.monotonic() - started
        with pytest.raises(StorageUnavailable, match="statement_timeout_s"):
            store.read("usage")  # a read (COPY TO, through the raw driver) is bounded too
        conn.rollback()
    holder.dispose()
    assert elapsed < BOUND_S
    assert "storage.statement_timeout_s (1 s)" in str(err.value) and "pg_stat_activity" in str(err.value)
    assert TableStore(pg_url).read("usage")["team"].tolist() == ["nlp"]  # nothing half-written


def test_a_sqlite_file_locked_by_another_writer_gives_up_after_the_statement_timeout(tmp_path):
    url = f"sqlite:///{tmp_path / 'costs.db'}"
    TableStore(url).write("usage", pd.DataFrame({"team": ["nlp"]}))
    import sqlite3

    other = sqlite3.connect(tmp_path / "costs.db", isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    try:
        store = TableStore(url, statement_timeout_s=1)
        with pytest.raises(StorageUnavailable) as err:
            store.write("usage", pd.DataFrame({"team": ["cv"]}))
    finally:
        other.execute("ROLLBACK")
        other.close()
    assert "locked" in str(err.value) and "storage.statement_timeout_s = 1 s" in str(err.value)
    assert str(tmp_path / "costs.db") in str(err.value)


# --------------------------------------------------------------------------- a closed port, everywhere


def write_config(tmp_path: Path, port: int, *, extra: str = "") -> Path:
    cfg = tmp_path / "gpu_ops.yaml"
    cfg.write_text(
        textwrap.dedent(
            f"""\
            storage:
              url: "postgresql://gpu_ops@127.0.0.1:{port}/costs"
              password: {{env: GPU_OPS_TEST_DB_PASSWORD}}
              connect_timeout_s: 2
            prices:
              currency: USD
              source: test
              as_of: 2026-11-01
              gpus: {{t4: {{on-demand: 0.53, spot: 0.21}}}}
            usage:
              sources: [{{type: ledger}}]
            """
        )
        + extra
    )
    return cfg


def run_cli(*args: str, config: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GPU_OPS_TEST_DB_PASSWORD": PASSWORD, "GPU_OPS_HOME": str(config.parent / "home")}
    env.pop("GPU_OPS_CONFIG", None)
    return subprocess.run(
        [sys.executable, "-m", "gpu_ops.cli", *args, "--config", str(config)], capture_output=True, text=True, env=env, timeout=BOUND_S * 3
    )


@pytest.mark.parametrize(
    "args",
    [("validate", "--only", "storage"), ("cost", "attribution", "--date", "2026-11-02")],
    ids=["validate", "cost"],
)
def test_a_closed_port_is_one_clear_paragraph_through_the_cli(tmp_path, closed_port, args):
    out = run_cli(*args, config=write_config(tmp_path, closed_port))
    text = out.stdout + out.stderr
    assert out.returncode != 0, text
    assert "Traceback" not in text and "OperationalError" not in text, text
    assert "Connection refused" in text and "cannot reach the gpu_ops database" in text, text
    assert_clear(text, closed_port)


def test_validate_against_a_silent_listener_fails_within_the_bound_naming_the_timeout(tmp_path, silent_port):
    started = time.monotonic()
    out = run_cli("validate", "--only", "storage", config=write_config(tmp_path, silent_port))
    elapsed = time.monotonic() - started
    text = out.stdout + out.stderr
    assert out.returncode == 1 and elapsed < BOUND_S, text
    assert "storage.connect_timeout_s (2 s)" in text and "Traceback" not in text, text
    assert_clear(text, silent_port)


def test_the_io_manager_fails_the_step_naming_the_database(closed_port):
    @dg.asset
    def costs() -> pd.DataFrame:
        return pd.DataFrame({"team": ["nlp"]})

    os.environ["GPU_OPS_TEST_DB_PASSWORD"] = PASSWORD
    try:
        io = TableIOManager(url=f"postgresql://gpu_ops:{{env: GPU_OPS_TEST_DB_PASSWORD}}@127.0.0.1:{closed_port}/costs", connect_timeout_s=2)
        result = dg.materialize([costs], resources={"io_manager": io}, raise_on_error=False)
    finally:
        del os.environ["GPU_OPS_TEST_DB_PASSWORD"]
    assert not result.success
    failure = next(e for e in result.all_events if e.is_step_failure).step_failure_data
    assert failure.error.cause is None  # no driver traceback under it
    description = failure.user_failure_data.description
    assert "cannot reach the gpu_ops database" in description and "Connection refused" in description
    assert_clear(description, closed_port)


def test_a_cost_asset_fails_its_step_naming_the_database(tmp_path, closed_port, monkeypatch):
    from gpu_ops.dagster.location import build_defs

    monkeypatch.setenv("GPU_OPS_TEST_DB_PASSWORD", PASSWORD)
    defs = build_defs(str(write_config(tmp_path, closed_port)))
    job = defs.resolve_implicit_global_asset_job_def().get_subset(asset_selection={dg.AssetKey("gpu_usage")})
    with dg.instance_for_test() as instance:
        result = job.execute_in_process(partition_key="2026-11-02", instance=instance, raise_on_error=False)
    assert not result.success
    (failure,) = [e.step_failure_data for e in result.all_events if e.is_step_failure]
    # Dagster's "Error occurred while executing op" wraps the step's own error, which the UI shows next.
    chain, error = [], failure.error
    while error is not None:
        chain.append(error)
        error = error.cause
    (ours,) = [e for e in chain if e.cls_name == "StorageUnavailable"]
    assert "cannot reach the gpu_ops database" in ours.message and "Connection refused" in ours.message
    assert_clear(ours.message, closed_port)
    assert not any(PASSWORD in e.message or PASSWORD in "".join(e.stack) for e in chain)


def test_the_budget_sensor_tick_names_the_database(tmp_path, closed_port, monkeypatch):
    from gpu_ops.dagster.location import build_defs

    monkeypatch.setenv("GPU_OPS_TEST_DB_PASSWORD", PASSWORD)
    defs = build_defs(str(write_config(tmp_path, closed_port)))
    sensor = defs.resolve_sensor_def("budget_alert_sensor")
    with dg.instance_for_test() as instance:
        context = dg.build_sensor_context(instance=instance, resources={"gpu_ops": defs.resources["gpu_ops"]})
        with pytest.raises(StorageUnavailable) as err:
            sensor.evaluate_tick(context)
    assert "cannot reach the gpu_ops database" in str(err.value)
    assert_clear(str(err.value), closed_port)


def test_the_launch_gate_goes_ahead_within_the_bound_and_says_why(silent_port, caplog):
    from gpu_ops.dagster.compute.admission import assert_launch_allowed

    store = TableStore(pg_url_at(silent_port), connect_timeout_s=2)
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="gpu_ops.alerts"):
        assert_launch_allowed(store, {"team": "nlp"})
    assert time.monotonic() - started < BOUND_S
    warning = caplog.records[-1].getMessage()
    assert "the launch goes ahead" in warning and "storage.connect_timeout_s (2 s)" in warning
    assert_clear(warning, silent_port)


# --------------------------------------------------------------------------- concurrent first writes

WRITERS = 6
TRIALS = 10


def _first_writer(url: str, index: int, start, done, results) -> None:
    # Four writers create a table each; two append to one more (the ledger's pattern).
    table = f"table_{index}" if index < 4 else "ledger"
    frame = pd.DataFrame({"writer": [index] * 3, "at": pd.to_datetime(["2026-11-01"] * 3, utc=True), "n": [1, 2, 3]})
    for trial in range(TRIALS):
        try:
            start.wait(timeout=120)
        except threading.BrokenBarrierError:
            return
        try:
            if table == "ledger":
                TableStore(url).append(table, frame)
            else:
                TableStore(url).write(table, frame, partition_keys=[f"2026-11-0{trial % 9 + 1}"])
            results.put((trial, index, "ok"))
        except Exception as exc:  # reported to the parent, which fails the test
            results.put((trial, index, f"{type(exc).__name__}: {exc}"))
        try:
            done.wait(timeout=120)
        except threading.BrokenBarrierError:
            return


@pytest.mark.postgres
def test_concurrent_first_writers_on_a_fresh_database_all_land(pg_url):
    ctx = mp.get_context("fork")  # fast to start; each child opens its own connections
    start, done = ctx.Barrier(WRITERS + 1), ctx.Barrier(WRITERS + 1)
    results = ctx.Queue()
    procs = [ctx.Process(target=_first_writer, args=(pg_url, i, start, done, results)) for i in range(WRITERS)]
    for p in procs:
        p.start()
    admin = raw_engine(pg_url)
    try:
        for trial in range(TRIALS):
            with admin.begin() as conn:  # a fresh database: no table, no row type
                conn.execute(sa.text("DROP SCHEMA public CASCADE"))
                conn.execute(sa.text("CREATE SCHEMA public"))
            start.wait(timeout=120)
            outcomes = [results.get(timeout=120) for _ in range(WRITERS)]
            assert [o for o in outcomes if o[2] != "ok"] == [], f"trial {trial}"
            with admin.connect() as conn:
                for i in range(4):
                    assert conn.execute(sa.text(f"SELECT count(*) FROM table_{i}")).scalar() == 3
                assert conn.execute(sa.text("SELECT count(*) FROM ledger")).scalar() == 6
                kinds = conn.execute(sa.text("SELECT count(DISTINCT table_name) FROM gpu_ops_columns")).scalar()
                assert kinds == 5
            done.wait(timeout=120)
    finally:
        start.abort()  # a failed trial releases the writers instead of leaving them waiting
        done.abort()
        for p in procs:
            p.join(timeout=60)
        admin.dispose()
