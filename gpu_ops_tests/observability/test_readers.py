"""The exporter's reads: the same figures from PostgreSQL (production) as from SQLite, the
dialect-specific SQL (epochs, LEAD over attempts, the database clock for leases) included;
a database that is down is a 0 on gpu_ops_exporter_read_ok and a reason, not a traceback."""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
import yaml

from gpu_ops.domain.config import DEMO_CONFIG, load_config
from gpu_ops.dagster.cost.assets import build_assets
from gpu_ops.domain.metrics import families
from gpu_ops.flows.observability.readers import Reader
from gpu_ops.dagster.resources import GpuOpsSettings
from gpu_ops.dagster.io_manager import TableIOManager
from gpu_ops.storage.tables import TableStore
from gpu_ops_tests.waiting import wait_until

DEMO = DEMO_CONFIG.parent
DAYS = ["2026-10-01", "2026-10-02", "2026-10-03"]


def fill(tmp_path: Path, url: str) -> TableStore:
    from gpu_ops.storage.quota import LeaseBook, Quotas
    from gpu_ops.storage import ledger

    demo = yaml.safe_load(DEMO_CONFIG.read_text())
    cfg = {
        "storage": {"url": url}, "prices": str(DEMO / "prices.yaml"), "budgets": demo["budgets"], "channels": demo["channels"],
        "usage": {"sources": [{"type": "file", "path": str(DEMO / "usage" / "*.csv")}], "inventory": {"type": "file", "path": str(DEMO / "inventory.csv")},
                  "idle": "row", "group_by": ["team", "project"], "partitions_start": DAYS[0]},
    }
    (tmp_path / "gpu_ops.yaml").write_text(yaml.safe_dump(cfg))
    assets, _ = build_assets(load_config(tmp_path / "gpu_ops.yaml"))
    resources = {"gpu_ops": GpuOpsSettings(config_path=str(tmp_path / "gpu_ops.yaml")), "table_io_manager": TableIOManager(url=url)}
    with dg.DagsterInstance.ephemeral() as instance:
        for day in DAYS:
            assert dg.materialize(assets, partition_key=day, resources=resources, instance=instance).success
    store = TableStore(url)
    t0 = dt.datetime(2026, 10, 2, 9, 0, 0, 250_000, tzinfo=dt.timezone.utc)
    common = dict(namespace="ml", pod="", node="n1", team="nlp", project="p", cost_center="", experiment_id="", gpu_type="h100", gpu_count=4,
                  capacity_type="spot", sharing="none", gpu_share=1.0, asset_key="train_llm")
    rows = []
    for run in ("r1", "r2"):
        rows += [
            ledger.LedgerRow(start=t0, end=t0 + dt.timedelta(minutes=20, milliseconds=125), attempt=1, outcome="preempted", last_checkpoint_at=None,
                             lost_seconds=1200.125, run_id=run, **common),  # type: ignore[arg-type]
            ledger.LedgerRow(start=t0 + dt.timedelta(minutes=21, seconds=7), end=t0 + dt.timedelta(minutes=50), attempt=2, outcome="completed",
                             last_checkpoint_at=None, lost_seconds=0.0, run_id=run, **common),  # type: ignore[arg-type]
        ]
    ledger.append(store, rows)
    assert LeaseBook(store, ttl_s=600).try_acquire(Quotas(team={"nlp": 8}), team="nlp", pools=["p1"], gpus=4, run_id="r3", asset_key="train_llm").granted
    return store


def figures(store: TableStore) -> dict[tuple, float]:
    snap = Reader(store, quotas={"team": {"nlp": 8}}, per_pod=True).read()
    assert snap.errors == {}
    return {(f.metric.name, labels): value for f in families(snap) if f.metric.name != "gpu_ops_exporter_read_seconds" for labels, value in f.samples}


@pytest.mark.postgres
def test_postgresql_and_sqlite_give_the_same_figures(tmp_path: Path, pg_url: str) -> None:
    (tmp_path / "lite").mkdir()
    (tmp_path / "pg").mkdir()
    lite = figures(fill(tmp_path / "lite", f"sqlite:///{tmp_path / 'lite' / 'costs.db'}"))
    pg = figures(fill(tmp_path / "pg", pg_url))
    assert set(pg) == set(lite)
    assert [k for k in lite if abs(lite[k] - pg[k]) > 1e-6 * max(1.0, abs(lite[k]))] == []
    # The hand-worked training figures (identical on both): two runs, each preempted once and resumed 66.875 s later.
    assert lite[("gpu_ops_training_recoveries_total", ("train_llm", "nlp"))] == 2
    assert lite[("gpu_ops_training_recovery_seconds_total", ("train_llm", "nlp"))] == pytest.approx(2 * 66.875, abs=1e-9)
    assert lite[("gpu_ops_training_gpu_seconds_total", ("train_llm", "nlp", "h100", "spot"))] == pytest.approx(2 * 4 * (1200.125 + 1733), abs=1e-6)
    assert lite[("gpu_ops_training_lost_gpu_seconds_total", ("train_llm", "nlp", "h100", "spot"))] == pytest.approx(2 * 4 * 1200.125, abs=1e-6)
    assert lite[("gpu_ops_quota_gpus_held", ("team", "nlp"))] == 4 and lite[("gpu_ops_quota_leases", ("nlp", "live"))] == 1
    assert any(name == "gpu_ops_pod_cost_usd" for name, _ in lite)  # --per-pod


def test_a_database_that_is_down_is_reported_per_source_not_raised() -> None:
    store = TableStore("postgresql://gpu_ops@127.0.0.1:9/nowhere", connect_timeout_s=2)
    snap = Reader(store).read()
    assert set(snap.errors) == set(snap.sources) and len(snap.sources) >= 10
    assert all("cannot reach the gpu_ops database" in reason for reason in snap.errors.values())
    ok = {labels: v for f in families(snap) if f.metric.name == "gpu_ops_exporter_read_ok" for labels, v in f.samples}
    assert set(ok.values()) == {0.0} and len(ok) == len(snap.sources)


def test_history_sums_are_reread_at_most_every_history_seconds_and_a_fresh_reader_sees_everything(tmp_path: Path) -> None:
    from gpu_ops.storage import ledger

    store = fill(tmp_path, f"sqlite:///{tmp_path / 'costs.db'}")
    key = ("gpu_ops_training_attempts_total", ("train_llm", "nlp", "h100", "spot", "completed"))
    cached, uncached = Reader(store, history_s=3600), Reader(store, history_s=0)

    def attempts(reader: Reader) -> float:
        return {(f.metric.name, labels): v for f in families(reader.read()) for labels, v in f.samples}[key]

    assert attempts(cached) == attempts(uncached) == 2
    t0 = dt.datetime(2026, 10, 3, 9, tzinfo=dt.timezone.utc)
    ledger.append(store, [ledger.LedgerRow(start=t0, end=t0 + dt.timedelta(hours=1), namespace="ml", pod="", node="n1", team="nlp", project="p",
                                           cost_center="", experiment_id="", gpu_type="h100", gpu_count=4, capacity_type="spot", sharing="none",
                                           gpu_share=1.0, run_id="r9", asset_key="train_llm", attempt=1, outcome="completed", last_checkpoint_at=None,
                                           lost_seconds=0.0)])
    assert attempts(cached) == 2  # within history_s: the sums read before
    assert attempts(uncached) == 3 and attempts(Reader(store, history_s=3600)) == 3  # a restart reads the table


def test_the_exporter_command_says_why_it_cannot_listen(tmp_path: Path) -> None:
    import socket

    from click.testing import CliRunner

    from gpu_ops.cli import main

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        out = CliRunner().invoke(main, ["exporter", "--host", "127.0.0.1", "--port", str(port)])
    assert out.exit_code == 1 and f"cannot listen on 127.0.0.1:{port}" in out.output and "Traceback" not in out.output
    # 99999 was an OverflowError traceback; nan and inf started serving.
    bad_values = [("--port", "99999"), ("--port", "-1"), ("--cache-seconds", "-5"), ("--history-seconds", "-1"), ("--deadline-seconds", "0")]
    bad_values += [(option, value) for option in ("--cache-seconds", "--history-seconds", "--deadline-seconds") for value in ("nan", "inf", "-inf", "NaN", "infinity")]
    for option, value in bad_values:
        out = CliRunner().invoke(main, ["exporter", "--host", "127.0.0.1", option, value])
        assert out.exit_code == 2 and option in out.output and isinstance(out.exception, SystemExit), out.output  # a usage error, not an exception caught by the runner
    bad = tmp_path / "bad.yaml"
    bad.write_text("storage: {url: 42}\n")
    out = CliRunner().invoke(main, ["exporter", "--config", str(bad)])
    assert out.exit_code == 1 and str(bad) in out.output and "Traceback" not in out.output


def test_attempts_waiting_for_quota_are_counted_per_team_from_the_attempt_records(tmp_path: Path) -> None:
    import time

    from gpu_ops.domain.training import attempts as tr
    from gpu_ops.storage.attempt_store import AttemptStore
    from gpu_ops.domain.training.attempts import Owner

    store = TableStore(f"sqlite:///{tmp_path / 'c.db'}")
    records = AttemptStore(store)
    bill = {"team": "nlp", "gpu_count": 4, "gpu_type": "h100"}
    for i, run in enumerate(("w1", "w2")):  # planned: waiting for admission, owned by this (live) process
        records.create(tr.plan(f"a{i}", run, "train", 1, Owner.this_process(run, "train"), launch_name="l", bill=bill, at=time.time()))
    running = tr.plan("a9", "r9", "train", 1, Owner.this_process("r9", "train"), launch_name="l", bill={**bill, "team": "cv"}, at=time.time())
    records.create(tr.launch(running, host=os.uname().nodename, pids=(os.getpid(),), started=(None,), at=time.time(), workdir=None))
    got = figures_of(store)
    assert got[("gpu_ops_quota_waiting_attempts", ("nlp",))] == 2
    assert got[("gpu_ops_quota_waiting_gpus", ("nlp",))] == 8
    assert not any(name.startswith("gpu_ops_quota_waiting") and labels == ("cv",) for name, labels in got)  # launched: not waiting


def figures_of(store: TableStore) -> dict[tuple, float]:
    snap = Reader(store, quotas={}).read()
    assert snap.errors == {}
    return {(f.metric.name, labels): value for f in families(snap) for labels, value in f.samples}


def test_hostile_label_values_are_escaped_and_parse_back() -> None:
    """The exposition text is written by the exporter itself: quotes, backslashes, newlines,
    braces and non-ASCII in label values (a team name is whatever a pod label said) parse
    back to themselves, and one family's label sets stay apart."""
    from prometheus_client.parser import text_string_to_metric_families

    from gpu_ops.cli.exporter import exposition
    from gpu_ops.domain.metrics import CATALOG, Family

    hostile = ['a"b', "back\\slash", "new\nline", "}{,=", "équipe-日本", "", 'end\\"']
    cost = Family(CATALOG["gpu_ops_savings_usd"])
    for i, team in enumerate(hostile):
        cost.add({"window": "day", "team": team, "source": "spot"}, float(i) + 0.5)
    attempts = Family(CATALOG["gpu_ops_training_attempts_total"])
    attempts.add({"asset_key": "a", "team": hostile[0], "gpu_type": "h100", "capacity_type": "spot", "outcome": "completed"}, 3)
    parsed = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in text_string_to_metric_families(exposition([cost, attempts]).decode()) for s in f.samples}
    for i, team in enumerate(hostile):
        assert parsed[("gpu_ops_savings_usd", (("source", "spot"), ("team", team), ("window", "day")))] == float(i) + 0.5
    assert parsed[("gpu_ops_training_attempts_total", (("asset_key", "a"), ("capacity_type", "spot"), ("gpu_type", "h100"), ("outcome", "completed"), ("team", 'a"b')))] == 3
    assert len(parsed) == len(hostile) + 1


@pytest.mark.postgres
def test_sums_that_miss_the_deadline_are_read_on_and_served_by_the_next_scrape(tmp_path: Path, pg_url: str) -> None:
    """The ledger locked by another session past the deadline: the scrape answers (ledger
    read_ok 0); once the lock goes, the read that went on lands and the next scrape serves
    its sums without reading again (history_s), and the counters never vanished between."""
    import sqlalchemy as sa

    from gpu_ops.storage import ledger

    store = TableStore(pg_url)
    t0 = dt.datetime(2026, 10, 3, 9, tzinfo=dt.timezone.utc)
    row = dict(namespace="ml", pod="", node="n1", team="nlp", project="p", cost_center="", experiment_id="", gpu_type="h100", gpu_count=4, capacity_type="spot",
               sharing="none", gpu_share=1.0, asset_key="train_llm", attempt=1, outcome="completed", last_checkpoint_at=None, lost_seconds=0.0)
    ledger.append(store, [ledger.LedgerRow(start=t0, end=t0 + dt.timedelta(hours=1), run_id="r1", **row)])  # type: ignore[arg-type]
    reader = Reader(store, history_s=3600, deadline_s=2)
    key = ("gpu_ops_training_attempts_total", ("train_llm", "nlp", "h100", "spot", "completed"))

    def attempts(snap: Any) -> float | None:
        return {(f.metric.name, labels): v for f in families(snap) for labels, v in f.samples}.get(key)

    assert attempts(reader.read()) == 1  # read, and kept for an hour
    ledger.append(store, [ledger.LedgerRow(start=t0, end=t0 + dt.timedelta(hours=1), run_id="r2", **row)])  # type: ignore[arg-type]
    fresh = Reader(store, history_s=3600, deadline_s=2)
    holder = sa.create_engine(pg_url.replace("postgresql://", "postgresql+psycopg2://", 1))
    with holder.connect() as conn:
        conn.execute(sa.text('LOCK TABLE "gpu_usage_ledger" IN ACCESS EXCLUSIVE MODE'))
        late = fresh.read()
        assert "no answer within the scrape deadline" in late.errors["gpu_usage_ledger"] and attempts(late) is None  # nothing read before
        conn.rollback()  # the lock goes: the read that went on lands
    assert wait_until(lambda: "gpu_usage_ledger" not in fresh.in_flight(), timeout=60)
    with holder.connect() as conn:  # locked again: a scrape that read the ledger now would miss the deadline
        conn.execute(sa.text('LOCK TABLE "gpu_usage_ledger" IN ACCESS EXCLUSIVE MODE'))
        served = fresh.read()
        assert "gpu_usage_ledger" not in served.errors and attempts(served) == 2  # the late read's sums, kept
        assert attempts(reader.read()) == 1  # the first reader keeps its own sums for history_s
        conn.rollback()
    every_time = Reader(store, history_s=0, deadline_s=2)  # sums due on every read
    assert attempts(every_time.read()) == 2
    with holder.connect() as conn:
        conn.execute(sa.text('LOCK TABLE "gpu_usage_ledger" IN ACCESS EXCLUSIVE MODE'))
        missed = every_time.read()
        conn.rollback()
    holder.dispose()
    assert "gpu_usage_ledger" in missed.errors and attempts(missed) == 2  # read_ok 0, and the counter keeps its last value


def test_estimates_intraday_spend_and_anomaly_scores(tmp_path: Path) -> None:
    """The foresight families from real tables at an injected clock: the newest launch
    estimate per asset, the training cost after the newest gpu_budget_status day (settled
    and running, priced as the budget sensor prices it), the newest day's anomaly scores."""
    import pandas as pd

    from gpu_ops.domain.config import parse_config
    from gpu_ops.domain.training import attempts
    from gpu_ops.storage import estimate_store, ledger
    from gpu_ops.storage.attempt_store import AttemptStore
    from gpu_ops.domain.training.estimate import Estimate, Leg

    cfg = parse_config({"storage": {"url": f"sqlite:///{tmp_path / 'costs.db'}"},
                        "prices": {"currency": "USD", "source": "t", "as_of": dt.date(2026, 1, 1), "gpus": {"a100-80gb": {"spot": 2.0, "on-demand": 5.0}}}}, None)
    store = TableStore.from_config(cfg)
    day = dt.datetime(2026, 11, 20, tzinfo=dt.timezone.utc)
    store.write("gpu_budget_status", pd.DataFrame({"budget": ["nlp"], "spend_usd": [10.0]}), partition_keys=["2026-11-19"])
    common = dict(namespace="ml", pod="", node="n1", team="nlp", project="llm", cost_center="", experiment_id="", gpu_type="a100-80gb", gpu_count=8,
                  capacity_type="spot", sharing="none", gpu_share=1.0, asset_key="train_llm", outcome="completed", last_checkpoint_at=None, lost_seconds=0.0)
    ledger.append(store, [
        ledger.LedgerRow(start=day - dt.timedelta(hours=3), end=day - dt.timedelta(hours=1), run_id="yesterday", attempt=1, **common),  # type: ignore[arg-type]
        ledger.LedgerRow(start=day - dt.timedelta(hours=1), end=day + dt.timedelta(hours=2), run_id="straddles", attempt=1, **common),  # type: ignore[arg-type]
    ])
    owner = attempts.Owner("host", 1, None, "run", "step")
    bill = {"team": "nlp", "project": "llm", "gpu_type": "a100-80gb", "gpu_count": 4, "gpu_share": 1.0, "capacity_type": "on-demand"}
    a = attempts.plan("a1", "run", "train_vision", 1, owner, launch_name="x", bill=bill, at=(day + dt.timedelta(hours=4)).timestamp())
    book = AttemptStore(store)
    book.create(a)
    book.move(a, attempts.launch(a, host="host", pids=(1,), started=(None,), at=(day + dt.timedelta(hours=4)).timestamp(), workdir=None))
    for at, usd in ((day - dt.timedelta(days=2), 50.0), (day - dt.timedelta(hours=1), 64.0)):
        estimate_store.record(store, f"run-{usd}", "train_llm", 1, at, "spot", Estimate("history", 3, 3600.0, 5400.0, 3600.0, 5400.0, 8.0, (Leg("spot", 2.0, 0.0, usd, usd * 1.5),)))
    store.write("gpu_spend_anomalies", pd.DataFrame({"dimension": ["team", "asset"], "key": ["nlp", "train_llm"], "score": [7.5, float("nan")], "baseline_usd": [100.0, 40.0]}),
                partition_keys=["2026-11-19"])

    snap = Reader(store, config=cfg, clock=lambda: day + dt.timedelta(hours=5)).read()
    assert snap.errors == {}
    got = {(f.metric.name, labels): v for f in families(snap) for labels, v in f.samples if f.metric.name.startswith(("gpu_ops_launch", "gpu_ops_intraday", "gpu_ops_spend"))}
    assert got == {
        ("gpu_ops_launch_estimate_usd", ("train_llm", "spot", "history")): 64.0,
        ("gpu_ops_launch_estimate_p90_usd", ("train_llm", "spot", "history")): 96.0,
        ("gpu_ops_intraday_cost_usd", ("nlp", "llm", "train_llm", "settled")): pytest.approx(8 * 2.0 * 2),  # the 2 h after 2026-11-20 00:00
        ("gpu_ops_intraday_cost_usd", ("nlp", "llm", "train_vision", "running")): pytest.approx(4 * 5.0 * 1),  # 1 h since launch
        ("gpu_ops_spend_anomaly_score", ("team", "nlp")): 7.5,  # the asset without a score is absent, never 0
        ("gpu_ops_spend_anomaly_baseline_usd", ("team", "nlp")): 100.0,
        ("gpu_ops_spend_anomaly_baseline_usd", ("asset", "train_llm")): 40.0,
    }
    assert "intraday" not in Reader(store).steps()  # without a configuration, no prices: no intraday source

    # A writer holding the database's write lock (a partition being written) past the
    # scrape deadline: the intraday source reads on the exporter's read-only connections
    # (no write lock, no index created), so it answers with the same figures.
    import sqlalchemy as sa

    writer = sa.create_engine(f"sqlite:///{tmp_path / 'costs.db'}", connect_args={"isolation_level": None})
    with writer.connect() as conn:
        conn.exec_driver_sql("BEGIN IMMEDIATE")
        locked = Reader(store, config=cfg, clock=lambda: day + dt.timedelta(hours=5), deadline_s=2).read()
        conn.exec_driver_sql("ROLLBACK")
    writer.dispose()
    assert "intraday" not in locked.errors
    assert {(f.metric.name, labels): v for f in families(locked) for labels, v in f.samples if f.metric.name == "gpu_ops_intraday_cost_usd"} == {
        k: v for k, v in got.items() if k[0] == "gpu_ops_intraday_cost_usd"}
