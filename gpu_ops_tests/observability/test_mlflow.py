"""A training run's cost on its MLflow run, against a real `mlflow server` (SQLite backend
store) on 127.0.0.1, and `gpu-ops cost attribution --by experiment_id` answering what the
experiment cost.

The active-run test trains for real: a preempted-and-resumed run of train_demo_model
(worker SIGKILLed after its first checkpoint, step retried, resumed) inside
``mlflow.start_run()``. On a machine without a GPU those attempts run on CPU, which the
ledger records as CPU and the cost engine never prices, so its figures compare at 0
GPU-hours; the other tests send the attempts a worker on 2x A100 reports through the same
settlement (the attempt record settled with its bill and its queued MLflow record, then
the outbox drained as the orphan sensor drains it), ledger and engine, to show priced
experiments.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpu_ops.storage.tables import TableStore

from gpu_ops_tests.conftest import skip_or_fail
from gpu_ops_tests.observability.servers import free_port
from gpu_ops_tests.observability.training import DEMO, QUIET, write_config
from gpu_ops_tests.waiting import wait_until

pytestmark = pytest.mark.slow


@pytest.fixture(scope="session")  # once per worker (see conftest.py)
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    binary = shutil.which("mlflow") or str(Path(sys.executable).with_name("mlflow"))
    if not Path(binary).exists():
        skip_or_fail("the mlflow server is not installed (pip install 'gpu_ops[test]')")
    folder = tmp_path_factory.mktemp("mlflow")
    port = free_port()
    log = open(folder / "server.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        [binary, "server", "--backend-store-uri", f"sqlite:///{folder / 'mlflow.db'}", "--default-artifact-root", str(folder / "artifacts"),
         "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,  # its own group: uvicorn stops with it
        # No job-execution workers (MLflow's background jobs, which gpu_ops never uses): they
        # more than doubled the server's start-up.
        env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},
    )
    url = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        assert proc.poll() is None, (folder / "server.log").read_text()[-3000:]
        try:
            return httpx.get(f"{url}/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        assert wait_until(healthy, timeout=180, every=0.5), (folder / "server.log").read_text()[-3000:]
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()


def _train(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Any]:
    from gpu_ops.storage import ledger
    from gpu_ops.demo.training import materialize_with_preemption

    config = write_config(tmp_path, ledger_only=True)
    monkeypatch.setenv("GPU_OPS_CONFIG", str(config))
    meta = materialize_with_preemption(str(config), after_s=0.3, echo=lambda _m: None, run_config=QUIET)
    rows = ledger.read(TableStore(f"sqlite:///{tmp_path / 'costs.db'}")).sort_values("attempt")
    assert list(rows["outcome"]) == ["preempted", "completed"] and int(meta["attempts"]) == 2
    return config, rows


def _attribution_by_experiment(config: Path, day: dt.date) -> dict[str, dict[str, Any]]:
    from click.testing import CliRunner

    from gpu_ops.cli import main

    out = CliRunner().invoke(main, ["cost", "attribution", "--config", str(config), "--date", day.isoformat(), "--by", "experiment_id", "--format", "json"])
    assert out.exit_code == 0, out.output
    rows = json.loads(out.output[out.output.index("[") :]) if "[" in out.output else []
    return {r["experiment_id"]: r for r in rows}


def _check_run(client: Any, run_id: str, rows: Any, attribution: dict[str, dict[str, Any]]) -> None:
    run = client.get_run(run_id)
    m, tags = run.data.metrics, run.data.tags
    assert m["gpu_ops.attempts"] == 2 and m["gpu_ops.preemptions"] == 1
    gpu_hours = float((rows["gpu_count"] * rows["gpu_share"] * (rows["end"] - rows["start"]).dt.total_seconds()).sum() / 3600)
    assert m["gpu_ops.gpu_hours"] == pytest.approx(gpu_hours, abs=1e-9)
    history = {h.step: h.value for h in client.get_metric_history(run_id, "gpu_ops.attempt.preempted")}
    assert history == {1: 1.0, 2: 0.0}
    assert client.get_metric_history(run_id, "gpu_ops.preemptions")[-1].value == 1.0
    last = rows.iloc[-1]
    assert (tags["gpu_ops.gpu_type"], tags["gpu_ops.gpu_count"], tags["gpu_ops.capacity_type"]) == (last.gpu_type, str(last.gpu_count), last.capacity_type)
    assert tags["gpu_ops.declared_gpu"] == "1x t4" and tags["gpu_ops.hardware_source"] == last.hardware_source
    assert tags["dagster.run_id"] == last.run_id and tags["dagster.asset_key"] == "train_demo_model"
    assert tags["gpu_ops.label.experiment_id"] == "demo-mlp"  # the asset's own label, kept beside the MLflow experiment
    # Every attempt's usage row carries the run's experiment id, and the cost engine groups by it.
    assert set(rows["experiment_id"]) == {run.info.experiment_id}
    if gpu_hours > 0:  # a GPU machine: the engine prices the attempts, grouped by the experiment
        row = attribution[run.info.experiment_id]
        assert row["gpu_hours"] == pytest.approx(m["gpu_ops.gpu_hours"], abs=1e-6)
        assert row["cost_usd"] == pytest.approx(m["gpu_ops.cost_usd"], abs=0.005)
    else:  # CPU attempts: no GPU-hours, no cost, on the run and in the engine alike
        assert m["gpu_ops.cost_usd"] == 0 and run.info.experiment_id not in attribution


def test_attempts_are_logged_to_the_active_mlflow_run_and_its_experiment_is_the_usage_rows(mlflow_server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import mlflow
    from mlflow.tracking import MlflowClient

    mlflow.set_tracking_uri(mlflow_server)
    experiment = mlflow.set_experiment("llm-finetune")
    try:
        with mlflow.start_run() as run:
            config, rows = _train(tmp_path, monkeypatch)
    finally:
        mlflow.set_tracking_uri("")
    _check_run(MlflowClient(mlflow_server), run.info.run_id, rows, _attribution_by_experiment(config, rows["start"].min().date()))
    assert set(rows["experiment_id"]) == {experiment.experiment_id}


def test_a_configured_tracking_uri_gets_one_run_per_dagster_run(mlflow_server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No active MLflow run: GPU_OPS_MLFLOW_TRACKING_URI makes gpu_ops keep one run per
    Dagster run and asset; the resumed attempt finds the run the preempted one created,
    and the run's totals add both attempts up (2x A100 spot, preempted after 30 minutes,
    resumed 2 minutes later for an hour)."""
    import dataclasses

    import yaml
    from mlflow.tracking import MlflowClient

    from gpu_ops.storage import ledger

    config = write_config(tmp_path, ledger_only=True)
    monkeypatch.setenv("GPU_OPS_MLFLOW_TRACKING_URI", mlflow_server)
    second = dataclasses.replace(_gpu_row(DAY), attempt=2)
    first = dataclasses.replace(second, start=second.start - dt.timedelta(minutes=32), end=second.start - dt.timedelta(minutes=2), attempt=1,
                                outcome="preempted", lost_seconds=600.0)
    store = TableStore(f"sqlite:///{tmp_path / 'costs.db'}")
    for row in (first, second):
        settled = _settle(store, config, row)
        assert dataclasses.replace(settled.row, last_checkpoint_at=None) == row  # the bill as the worker reported it, before any MLflow call
        assert _drain(store).sent == 1
    client = MlflowClient(mlflow_server)
    experiment = client.get_experiment_by_name("gpu_ops/train_llm")
    (run,) = client.search_runs([experiment.experiment_id], filter_string="tags.`dagster.run_id` = 'dagster-run-1'")
    spot = yaml.safe_load((DEMO / "prices.yaml").read_text())["gpus"]["a100-80gb"]["spot"]
    m = run.data.metrics
    assert (m["gpu_ops.attempts"], m["gpu_ops.preemptions"]) == (2, 1)
    assert m["gpu_ops.gpu_hours"] == pytest.approx(2 * 1.5) and m["gpu_ops.cost_usd"] == pytest.approx(2 * 1.5 * spot, abs=1e-9)
    assert {h.step: h.value for h in client.get_metric_history(run.info.run_id, "gpu_ops.attempt.cost_usd")} == pytest.approx({1: spot, 2: 2 * spot})
    rows = ledger.read(store)
    assert set(rows["experiment_id"]) == {experiment.experiment_id}
    assert _attribution_by_experiment(config, DAY)[experiment.experiment_id]["cost_usd"] == pytest.approx(m["gpu_ops.cost_usd"], abs=0.005)


def test_an_unreachable_tracking_server_costs_a_warning_not_the_attempt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from gpu_ops.storage.outbox import Outbox
    from gpu_ops.storage import ledger

    config = write_config(tmp_path, ledger_only=True)
    monkeypatch.setenv("GPU_OPS_MLFLOW_TRACKING_URI", f"http://127.0.0.1:{free_port()}")
    row = _gpu_row(dt.date(2026, 11, 1))
    store = TableStore(f"sqlite:///{tmp_path / 'costs.db'}")
    assert _settle(store, config, row).row == row  # billed, unchanged, no exception
    report = _drain(store)
    assert report.sent == 0 and len(report.failed) == 1
    assert "MLflow record of attempt 1" in report.failed[0] and "http://127.0.0.1:" in report.failed[0] and "refused" in report.failed[0]
    (stored,) = ledger.read(store).itertuples(index=False)
    assert stored.experiment_id == "" and stored.end == row.end
    (entry,) = Outbox(store).entries()
    assert entry.sent_at is None and entry.tries == 1  # kept for the next drain


def _settle(store: TableStore, config: Path, row: Any) -> Any:
    """Settle the attempt ``row`` describes (a record launched at its start, ended at its
    end) as its owner does: one transaction with its bill and queued telemetry."""
    from gpu_ops.domain.config import load_config
    from gpu_ops.flows.observability.hooks import Pricing
    from gpu_ops.domain.training import attempts as tr
    from gpu_ops.storage.attempt_store import AttemptStore
    from gpu_ops.storage.ledger import LEDGER_COLUMNS
    from gpu_ops.flows.training.settle import settle_attempt

    fixed = {c: getattr(row, c) for c in LEDGER_COLUMNS if c not in ("start", "end", "run_id", "asset_key", "attempt", "outcome", "last_checkpoint_at", "lost_seconds")}
    records = AttemptStore(store)
    a = tr.plan(f"{row.run_id}-{row.attempt}", row.run_id, row.asset_key, row.attempt, tr.Owner.this_process(row.run_id, "train"), launch_name="l",
                bill=fixed, at=row.start.timestamp())
    a = records.create(tr.launch(a, host="h", pids=(), started=(), at=row.start.timestamp(), workdir=None))
    saved = row.end - dt.timedelta(seconds=row.lost_seconds) if row.lost_seconds else None
    done = settle_attempt(records, a, tr.settle(a, row.outcome, "", row.end.timestamp()), last_checkpoint_at=saved, pricing=Pricing.of(load_config(config)))
    assert done is not None and done.record_ids
    return done


def _drain(store: TableStore) -> Any:
    """What the orphan sensor and `gpu-ops validate --settle-orphans` run."""
    from gpu_ops.flows.observability.sender import drain

    return drain(store, deadline_s=10.0, due_only=False)


DAY = dt.date(2026, 11, 24)  # the synthetic attempts' day: any finished day


def _gpu_row(day: dt.date) -> Any:
    """The attempt a worker on 2x A100-80GB spot reports: one hour of ``day``."""
    from gpu_ops.storage import ledger

    end = dt.datetime(day.year, day.month, day.day, 11, tzinfo=dt.timezone.utc)
    return ledger.LedgerRow(
        start=end - dt.timedelta(hours=1), end=end, namespace="ml", pod="llm-0", node="n1", team="nlp", project="llm", cost_center="",
        experiment_id="", gpu_type="a100-80gb", gpu_count=2, capacity_type="spot", sharing="none", gpu_share=1.0, run_id="dagster-run-1",
        asset_key="train_llm", attempt=1, outcome="completed", last_checkpoint_at=None, lost_seconds=0.0, declared_gpu_type="a100-80gb",
        declared_gpu_count=2, hardware_source="worker",
    )


def test_a_gpu_attempt_in_an_mlflow_run_is_what_its_experiment_costs(mlflow_server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The attempt a worker on 2x A100-80GB spot reports (one hour), recorded inside an
    MLflow run through the training hook: the run shows its cost, and the cost engine
    attributes exactly that to the run's experiment."""
    import mlflow
    import yaml
    from mlflow.tracking import MlflowClient

    from gpu_ops.storage import ledger

    config = write_config(tmp_path, ledger_only=True)
    row = _gpu_row(DAY)
    store = TableStore(f"sqlite:///{tmp_path / 'costs.db'}")
    mlflow.set_tracking_uri(mlflow_server)
    experiment = mlflow.set_experiment("llm-pretrain")
    try:
        with mlflow.start_run() as run:
            recorded = _settle(store, config, row).row
    finally:
        mlflow.set_tracking_uri("")
    assert _drain(store).sent == 1  # after the run ended: the record names its run
    spot = yaml.safe_load((DEMO / "prices.yaml").read_text())["gpus"]["a100-80gb"]["spot"]
    assert recorded.experiment_id == experiment.experiment_id  # the active run's: known without asking, billed with it
    assert set(ledger.read(store)["experiment_id"]) == {experiment.experiment_id}
    metrics = MlflowClient(mlflow_server).get_run(run.info.run_id).data.metrics
    assert metrics["gpu_ops.cost_usd"] == pytest.approx(2 * spot, abs=1e-9) and metrics["gpu_ops.gpu_hours"] == pytest.approx(2.0)
    by_experiment = _attribution_by_experiment(config, DAY)
    assert by_experiment[experiment.experiment_id]["cost_usd"] == pytest.approx(metrics["gpu_ops.cost_usd"], abs=0.005)
    assert by_experiment[experiment.experiment_id]["gpu_hours"] == pytest.approx(2.0, abs=1e-6)
