"""Telemetry after the commit, off the training path: a real `gpu_asset` materialization
(the counting workload on the local backend) against collectors that answer two bytes a
second, that refuse connections, and with a password in the tracking URI.

The bill never waits for telemetry: the ledger row exists when the export request reaches
the collector (checked by the collector itself, as the request arrives), the export ends
at the deadline setting (``training.telemetry_deadline_s``; its recorded duration), the
record stays in the outbox, and a later drain (what the orphan sensor and `gpu-ops
validate --settle-orphans` run) delivers it to a healthy collector once.
"""

from __future__ import annotations

import http.server
from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from gpu_ops.storage.tables import TableStore
from gpu_ops.storage import ledger
from gpu_ops_tests.hostile_http import hostile, trickle_headers
from gpu_ops_tests.http_receiver import serving
from gpu_ops_tests.observability.servers import free_port
from gpu_ops_tests.observability.test_tracing import OtlpHandler, Receiver
from gpu_ops_tests.training.test_gpu_asset import counting_asset, run, write_config

DEADLINE_S = 0.5
SECRET = "s3cret-pw"


@pytest.fixture
def config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("GPU_OPS_PIDFILE_DIR", str(tmp_path / "pids"))
    for var in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "GPU_OPS_MLFLOW_TRACKING_URI", "MLFLOW_RUN_ID"):
        monkeypatch.delenv(var, raising=False)
    return write_config(tmp_path, telemetry_deadline_s=DEADLINE_S)


def _store(config: Path) -> TableStore:
    return TableStore(f"sqlite:///{config.parent / 'ledger.db'}")


def _checking_the_ledger(config: Path, seen: list[int]) -> Any:
    """Two bytes a second, after noting how many ledger rows exist as the request arrives."""
    trickle = trickle_headers(0.5)

    def answer(h: http.server.BaseHTTPRequestHandler) -> None:
        seen.append(len(ledger.read(_store(config))))
        trickle(h)

    return answer


def _everything_logged(instance: dg.DagsterInstance, run_id: str) -> str:
    return "\n".join(f"{e.message} {e.user_message} {e.dagster_event!r}" for e in instance.all_logs(run_id))


def _tried_entry(store: TableStore) -> Any:
    """The one outbox entry once its first export has ended: the owner waits for it at most
    the deadline and a little more, so on a loaded machine the export (bounded by its own
    deadline) may still be finishing in the background when the run has returned."""
    import time

    from gpu_ops.storage.outbox import Outbox

    give_up = time.monotonic() + 10.0
    while True:
        (entry,) = Outbox(store).entries()
        if entry.tries or time.monotonic() > give_up:
            return entry
        time.sleep(0.05)


def _said_not_sent(log: str, what: str, url: str) -> bool:
    """The run said the record is not sent yet: the export's own failure, or (the owner
    having stopped waiting first) that it is still being sent and stays queued."""
    return f"{what} not sent yet ({url}/…" in log or ("still being sent after" in log and "queued in gpu_ops_telemetry_outbox" in log)


def _materialize(config: Path, name: str) -> tuple[dg.DagsterInstance, dg.ExecuteInJobResult]:
    instance = dg.DagsterInstance.ephemeral()
    result = run(counting_asset(config, name, {"steps": 5}), instance)
    assert result.success
    return instance, result


def test_a_trickling_collector_gets_the_span_after_the_bill_and_never_holds_the_attempt(config: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from gpu_ops.storage.outbox import Outbox
    from gpu_ops.flows.observability.sender import drain

    seen: list[int] = []
    with hostile(then=_checking_the_ledger(config, seen)) as collector:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector.url)
        instance, result = _materialize(config, "traced")
    assert seen == [1]  # the row was committed before the span left
    store = _store(config)
    (row,) = ledger.read(store).itertuples(index=False)
    assert row.outcome == "completed"
    entry = _tried_entry(store)
    assert (entry.kind, entry.sent_at, entry.tries) == ("span", None, 1)
    assert entry.last_export_s is not None and entry.last_export_s <= DEADLINE_S + 0.5  # ended at the deadline
    assert "deadline" in (entry.last_error or "")
    log = _everything_logged(instance, result.run_id)
    assert _said_not_sent(log, "span of attempt 1", collector.url)

    Receiver.spans, Receiver.requests = [], []
    with serving(OtlpHandler) as healthy:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", healthy)
        report = drain(store, deadline_s=5.0, due_only=False)
        assert report.sent == 1 and drain(store, deadline_s=5.0, due_only=False).sent == 0  # sent once
    (span,) = Receiver.spans
    assert span["attributes"]["dagster.run_id"] == result.run_id and span["attributes"]["gpu_ops.training.outcome"] == "completed"
    assert abs(span["end"] - row.end.timestamp() * 1e9) < 2000
    assert Outbox(store).entries()[0].sent_at is not None


@pytest.mark.parametrize("server", ["trickling", "unreachable"])
def test_a_tracking_server_that_trickles_or_is_down_costs_a_warning_without_its_password(config: Path, monkeypatch: pytest.MonkeyPatch, server: str) -> None:

    seen: list[int] = []
    with hostile(then=_checking_the_ledger(config, seen)) as tracking:
        base = tracking.url if server == "trickling" else f"http://127.0.0.1:{free_port()}"
        monkeypatch.setenv("GPU_OPS_MLFLOW_TRACKING_URI", base.replace("http://", f"http://alice:{SECRET}@"))
        instance, result = _materialize(config, "tracked")
    if server == "trickling":
        assert seen == [1] and tracking.requests[0].headers["Authorization"].startswith("Basic ")  # the credentials were used
    store = _store(config)
    (row,) = ledger.read(store).itertuples(index=False)
    assert row.experiment_id == ""  # filled in only once MLflow answers
    entry = _tried_entry(store)
    assert entry.kind == "mlflow" and entry.sent_at is None and entry.last_export_s <= DEADLINE_S + 0.5
    log = _everything_logged(instance, result.run_id)
    assert _said_not_sent(log, "MLflow record of attempt 1", base)
    assert SECRET not in log and "alice" not in log
    assert SECRET not in (entry.last_error or "") and SECRET not in str(entry.payload)
