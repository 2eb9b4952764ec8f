"""One deadline per scrape, and reads that never wait behind a writer, with real servers and
real processes:

- a TCP listener on 127.0.0.1 that accepts and never answers, as the database of a real
  `gpu-ops exporter` process: /metrics answers within ``--deadline-seconds`` with every
  source at ``gpu_ops_exporter_read_ok 0`` (whether the connect timeout is shorter than the
  deadline or longer), scrape after scrape;
- PostgreSQL with one table locked by another session: that source misses the deadline and
  says so, the others are served;
- a SQLite write transaction held open by another process: the scrape (and a table read,
  what the UI does) completes without waiting, with the rows committed before it.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import httpx
import pandas as pd
import pytest
import sqlalchemy as sa
from prometheus_client.parser import text_string_to_metric_families

from gpu_ops.domain.metrics import families
from gpu_ops.flows.observability.readers import Reader
from gpu_ops.storage.tables import TableStore
from gpu_ops_tests.observability.servers import Exporter, free_port, silent_listener

DEADLINE_S = 3.0
PRICES = "prices: {currency: USD, source: test, as_of: 2026-11-01, gpus: {t4: {on-demand: 0.53}}}\n"


def samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    return [(s.name, s.labels, s.value) for f in text_string_to_metric_families(text) for s in f.samples]


def read_ok(text: str) -> dict[str, float]:
    return {labels["source"]: value for name, labels, value in samples(text) if name == "gpu_ops_exporter_read_ok"}


def read_seconds(text: str) -> float:
    return next(value for name, _, value in samples(text) if name == "gpu_ops_exporter_read_seconds")


@pytest.mark.parametrize("connect_timeout_s", [2, 30], ids=["connect-timeout-below-the-deadline", "connect-timeout-past-the-deadline"])
def test_a_silent_database_answers_within_the_deadline_with_every_read_at_0(tmp_path: Path, connect_timeout_s: int) -> None:
    with silent_listener() as port:
        config = tmp_path / "gpu_ops.yaml"
        config.write_text(f"storage: {{url: 'postgresql://gpu_ops@127.0.0.1:{port}/costs', connect_timeout_s: {connect_timeout_s}}}\n{PRICES}")
        exporter = Exporter(config, free_port(), tmp_path / "exporter.log", ("--deadline-seconds", str(DEADLINE_S)))
        exporter.start()
        try:
            # Scrape after scrape: the second finds the first one's reads still waiting on
            # the silent host (connect timeout 30 s) and does not wait for them either.
            for _ in range(3):
                answer = httpx.get(exporter.url, timeout=DEADLINE_S + 5)
                assert answer.status_code == 200
                ok = read_ok(answer.text)
                assert len(ok) >= 11 and set(ok.values()) == {0.0}, ok
                assert read_seconds(answer.text) <= DEADLINE_S + 0.5  # the exporter's own clock: reads end at the deadline
        finally:
            exporter.stop()
    log = (tmp_path / "exporter.log").read_text()
    assert "Traceback" not in log
    reason = "no answer within the scrape deadline" if connect_timeout_s > DEADLINE_S else "cannot reach the gpu_ops database"
    assert reason in log, log[-3000:]
    if connect_timeout_s > DEADLINE_S:
        assert "--deadline-seconds" in log, log[-3000:]


@pytest.mark.postgres
def test_a_source_that_misses_the_deadline_is_0_and_the_others_are_served(pg_url: str) -> None:
    store = TableStore(pg_url)
    day = "2026-10-31"
    store.write("gpu_cost_daily", pd.DataFrame({"day": [pd.Timestamp(day).date()], "kind": ["allocated"], "team": ["nlp"], "project": ["p"], "namespace": ["ml"],
                                                "cost_center": [""], "gpu_hours": [2.0], "cost_usd": [7.0], "on_demand_usd": [9.0]}), partition_keys=[day])
    store.write("gpu_budget_status", pd.DataFrame({"budget": ["b"], "period": ["monthly"], "amount_usd": [10.0], "spend_usd": [7.0], "percent_used": [70.0],
                                                   "status": ["ok"], "thresholds_crossed": [[]], "days_missing": [0]}), partition_keys=[day])
    holder = sa.create_engine(pg_url.replace("postgresql://", "postgresql+psycopg2://", 1))
    try:
        with holder.connect() as conn:
            conn.execute(sa.text('LOCK TABLE "gpu_budget_status" IN ACCESS EXCLUSIVE MODE'))
            snap = Reader(store, deadline_s=DEADLINE_S).read()
            conn.rollback()
    finally:
        holder.dispose()
    assert set(snap.errors) == {"gpu_budget_status"}, snap.errors
    assert "no answer within the scrape deadline (3 s" in snap.errors["gpu_budget_status"]
    assert snap.read_seconds is not None and snap.read_seconds <= DEADLINE_S + 0.5
    got = {(f.metric.name, labels): v for f in families(snap) for labels, v in f.samples}
    assert got[("gpu_ops_exporter_read_ok", ("gpu_budget_status",))] == 0.0 and got[("gpu_ops_exporter_read_ok", ("gpu_cost_daily",))] == 1.0
    assert got[("gpu_ops_cost_usd", ("day", "allocated", "nlp", "p", "ml", ""))] == 7.0
    assert not any(name.startswith("gpu_ops_budget_") for name, _ in got)


# Another process opens a write transaction on the file (a partition write: delete the
# day's rows, insert the new ones), says so, and holds it until told to commit.
WRITER = textwrap.dedent(
    """\
    import sqlite3, sys
    con = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=60)
    con.execute("BEGIN IMMEDIATE")
    con.execute("DELETE FROM gpu_cost_daily WHERE partition_key = '2026-10-31'")
    con.execute("INSERT INTO gpu_cost_daily (day, kind, team, project, namespace, cost_center, gpu_hours, cost_usd, on_demand_usd, partition_key) "
                "VALUES ('2026-10-31', 'allocated', 'nlp', 'p', 'ml', '', 3.0, 11.0, 12.0, '2026-10-31')")
    print("holding", flush=True)
    sys.stdin.readline()
    con.execute("COMMIT")
    print("committed", flush=True)
    """
)


def test_a_scrape_does_not_wait_behind_a_sqlite_write_held_by_another_process(tmp_path: Path) -> None:
    db = tmp_path / "costs.db"
    url = f"sqlite:///{db}"
    day = "2026-10-31"
    TableStore(url).write("gpu_cost_daily", pd.DataFrame({"day": [pd.Timestamp(day).date()], "kind": ["allocated"], "team": ["nlp"], "project": ["p"],
                                                          "namespace": ["ml"], "cost_center": [""], "gpu_hours": [2.0], "cost_usd": [7.0],
                                                          "on_demand_usd": [9.0]}), partition_keys=[day])
    config = tmp_path / "gpu_ops.yaml"
    # A writer would wait up to 60 s for the file's lock: a reader that took it would too.
    config.write_text(f"storage: {{url: 'sqlite:///{db}', statement_timeout_s: 60}}\n{PRICES}")
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(db)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    exporter = Exporter(config, free_port(), tmp_path / "exporter.log", ("--deadline-seconds", "20"))
    try:
        assert writer.stdout is not None and writer.stdin is not None
        assert writer.stdout.readline().strip() == "holding"
        exporter.start()
        answer = httpx.get(exporter.url, timeout=30).text
        assert set(read_ok(answer).values()) == {1.0}, read_ok(answer)
        cost = {labels["window"]: v for name, labels, v in samples(answer) if name == "gpu_ops_cost_usd"}
        assert cost == {"day": 7.0, "month": 7.0}  # the rows committed before the write began
        # The UI's path (the IO manager, `gpu-ops cost`) reads the same way: no wait, no "database is locked".
        quick = TableStore(url, statement_timeout_s=1)
        assert quick.has_table("gpu_cost_daily") and quick.partitions("gpu_cost_daily") == [day]
        assert quick.read("gpu_cost_daily")["cost_usd"].tolist() == [7.0]
        writer.stdin.write("\n")
        writer.stdin.flush()
        assert writer.stdout.readline().strip() == "committed"
        answer = httpx.get(exporter.url, timeout=30).text
        assert {labels["window"]: v for name, labels, v in samples(answer) if name == "gpu_ops_cost_usd"} == {"day": 11.0, "month": 11.0}
    finally:
        exporter.stop()
        writer.kill()
        writer.wait()
