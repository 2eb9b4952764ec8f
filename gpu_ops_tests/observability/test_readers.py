"""The exporter's reads: the same figures from PostgreSQL (production) as from SQLite, the
dialect-specific SQL (epochs, LEAD over attempts, the database clock for leases) included;
a database that is down is a 0 on gpu_ops_exporter_read_ok and a reason, not a traceback."""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path

import dagster as dg
import pytest
import yaml

from gpu_ops.config import DEMO_CONFIG, load_config
from gpu_ops.cost.assets import build_assets
from gpu_ops.observability.metrics import families
from gpu_ops.observability.readers import Reader
from gpu_ops.resources import GpuOpsSettings
from gpu_ops.storage.io_manager import TableIOManager
from gpu_ops.storage.tables import TableStore

DEMO = DEMO_CONFIG.parent
DAYS = ["2026-10-01", "2026-10-02", "2026-10-03"]


def fill(tmp_path: Path, url: str) -> TableStore:
    from gpu_ops.compute.quota import LeaseBook, Quotas
    from gpu_ops.training import ledger

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
    from gpu_ops.training import ledger

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
    for option, value in (("--port", "99999"), ("--port", "-1"), ("--cache-seconds", "-5"), ("--history-seconds", "-1")):  # 99999 was an OverflowError traceback
        out = CliRunner().invoke(main, ["exporter", "--host", "127.0.0.1", option, value])
        assert out.exit_code == 2 and option in out.output and isinstance(out.exception, SystemExit), out.output  # a usage error, not an exception caught by the runner
    bad = tmp_path / "bad.yaml"
    bad.write_text("storage: {url: 42}\n")
    out = CliRunner().invoke(main, ["exporter", "--config", str(bad)])
    assert out.exit_code == 1 and str(bad) in out.output and "Traceback" not in out.output


def test_attempts_waiting_for_quota_are_counted_per_team_from_the_attempt_records(tmp_path: Path) -> None:
    import time

    from gpu_ops.training import attempts as tr
    from gpu_ops.training.attempt_store import AttemptStore
    from gpu_ops.training.attempts import Owner

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
