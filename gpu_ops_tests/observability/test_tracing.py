"""OpenTelemetry spans received by a real OTLP/HTTP receiver on 127.0.0.1 (a server in this
test that decodes ExportTraceServiceRequest protobufs with opentelemetry-proto).

A real preempted-and-resumed run of train_demo_model (its worker SIGKILLed after the first
checkpoint, the step retried and resumed) gives one span per attempt, queued with each
attempt's bill and sent after it; a real cost materialization gives one span per
partition. Without OTEL_EXPORTER_OTLP_ENDPOINT no OpenTelemetry module is imported, by the
code location or by a settlement.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpu_ops_tests.conftest import REPO
from gpu_ops_tests.http_receiver import QuietHandler, reply, serving
from gpu_ops_tests.observability.training import DEMO, write_config



class Receiver:
    spans: list[dict[str, Any]] = []
    requests: list[dict[str, str]] = []
    lock = threading.Lock()


class OtlpHandler(QuietHandler):
    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest, ExportTraceServiceResponse

        body = self.rfile.read(int(self.headers["Content-Length"]))
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        with Receiver.lock:
            Receiver.requests.append({"path": self.path, "content_type": self.headers.get("Content-Type", "")})
            for rs in request.resource_spans:
                resource = {kv.key: _value(kv.value) for kv in rs.resource.attributes}
                for ss in rs.scope_spans:
                    for span in ss.spans:
                        Receiver.spans.append({
                            "name": span.name, "trace_id": span.trace_id.hex(), "span_id": span.span_id.hex(), "scope": ss.scope.name,
                            "start": span.start_time_unix_nano, "end": span.end_time_unix_nano, "status": span.status.code,
                            "attributes": {kv.key: _value(kv.value) for kv in span.attributes}, "resource": resource,
                        })
        reply(self, 200, ExportTraceServiceResponse().SerializeToString(), "application/x-protobuf")


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


@pytest.fixture
def otlp(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    Receiver.spans, Receiver.requests = [], []
    with serving(OtlpHandler) as url:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", url)
        monkeypatch.setenv("OTEL_SERVICE_NAME", "gpu-ops-test")
        yield url


@pytest.mark.slow
def test_a_preempted_and_resumed_run_sends_one_span_per_attempt(otlp: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from gpu_ops.storage.tables import TableStore
    from gpu_ops.storage import ledger
    from gpu_ops.demo.training import materialize_with_preemption

    config = write_config(tmp_path)
    monkeypatch.setenv("GPU_OPS_CONFIG", str(config))  # the deployment's config: what spans are priced with
    meta = materialize_with_preemption(str(config), after_s=0.3, echo=lambda _m: None, run_config={"loggers": {"console": {"config": {"log_level": "WARNING"}}}})
    rows = ledger.read(TableStore(f"sqlite:///{tmp_path / 'costs.db'}")).sort_values("attempt")
    assert list(rows["outcome"]) == ["preempted", "completed"] and int(meta["attempts"]) == 2

    spans = sorted((s for s in Receiver.spans if s["name"] == "gpu_ops.training.attempt"), key=lambda s: s["attributes"]["gpu_ops.training.attempt"])
    assert len(spans) == len(rows) == 2
    assert {r["path"] for r in Receiver.requests} == {"/v1/traces"} and all(r["content_type"] == "application/x-protobuf" for r in Receiver.requests)
    assert len({s["trace_id"] for s in spans}) == 1  # one trace per run: the resume is beside the attempt it resumes
    prices = yaml.safe_load((DEMO / "prices.yaml").read_text())
    for span, row in zip(spans, rows.itertuples()):
        a = span["attributes"]
        assert span["resource"]["service.name"] == "gpu-ops-test" and span["scope"] == "gpu_ops"
        assert abs(span["start"] - row.start.timestamp() * 1e9) < 2000
        assert abs(span["end"] - row.end.timestamp() * 1e9) < 2000
        assert a["gpu_ops.compute.provider"] == "local"
        assert (a["gpu_ops.compute.gpu_type"], a["gpu_ops.compute.gpu_count"], a["gpu_ops.compute.capacity_type"]) == (row.gpu_type, row.gpu_count, row.capacity_type)
        assert (a["gpu_ops.team"], a["gpu_ops.project"]) == (row.team, row.project)
        assert a["dagster.run_id"] == row.run_id and a["dagster.asset_key"] == "train_demo_model"
        assert a["gpu_ops.training.outcome"] == row.outcome
        assert a["gpu_ops.training.preempted"] is (row.outcome == "preempted")
        price = prices["gpus"].get(row.gpu_type, {}).get(row.capacity_type, 0.0) if row.gpu_count else 0.0
        assert a["gpu_ops.cost.total"] == pytest.approx(row.gpu_count * row.gpu_share * (row.end - row.start).total_seconds() / 3600 * price, abs=1e-6)
        assert a["gpu_ops.cost.currency"] == prices.get("currency", "USD")
        assert "error.type" not in a and span["status"] == 0  # a preemption is not an error
    first, second = spans
    assert "gpu_ops.training.recovery_seconds" not in first["attributes"]
    recovery = (rows["start"].iloc[1] - rows["end"].iloc[0]).total_seconds()
    assert second["attributes"]["gpu_ops.training.recovery_seconds"] == pytest.approx(recovery, abs=1e-3) and recovery >= 0
    assert first["attributes"]["gpu_ops.training.lost_seconds"] == pytest.approx(float(rows["lost_seconds"].iloc[0]))


def test_a_cost_partition_sends_one_span_with_its_figures(otlp: str, tmp_path: Path) -> None:
    import dagster as dg

    from gpu_ops.domain.config import load_config
    from gpu_ops.dagster.cost.assets import build_assets
    from gpu_ops.dagster.resources import GpuOpsSettings
    from gpu_ops.dagster.io_manager import TableIOManager
    from gpu_ops.storage.tables import TableStore

    config = write_config(tmp_path)
    assets, _ = build_assets(load_config(config))
    url = f"sqlite:///{tmp_path / 'costs.db'}"
    resources = {"gpu_ops": GpuOpsSettings(config_path=str(config)), "table_io_manager": TableIOManager(url=url)}
    with dg.DagsterInstance.ephemeral() as instance:
        result = dg.materialize(assets, partition_key="2026-10-05", resources=resources, instance=instance)
    finished_ns = time.time_ns()  # observed after the run: the span ended before it
    assert result.success
    (span,) = [s for s in Receiver.spans if s["name"] == "gpu_ops.cost.partition"]
    attribution = TableStore(url).read("gpu_cost_attribution")
    a = span["attributes"]
    assert a["gpu_ops.cost.partition"] == "2026-10-05" and a["gpu_ops.cost.asset"] == "gpu_cost_attribution" and a["dagster.run_id"] == result.run_id
    assert a["gpu_ops.cost.total"] == pytest.approx(attribution["cost_usd"].sum(), abs=0.005)
    allocated = attribution[attribution["team"] != "__idle__"]
    assert a["gpu_ops.gpu_hours.allocated"] == pytest.approx(allocated["gpu_hours"].sum(), rel=1e-9)
    assert a["gpu_ops.cost.idle"] == pytest.approx(attribution["idle_cost_usd"].sum(), abs=0.005)
    assert span["start"] <= span["end"] <= finished_ns


def _modules_after(code: str, env: dict[str, str]) -> list[str]:
    probe = code + "\nimport sys, json; print(json.dumps(sorted(m for m in sys.modules if m.startswith(('opentelemetry', 'mlflow', 'prometheus_client', 'grafanalib')))))"
    done = subprocess.run([sys.executable, "-c", probe], env={**os.environ, "PYTHONPATH": str(REPO), **env}, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_without_an_endpoint_or_mlflow_run_nothing_is_imported_and_the_code_location_never_imports_the_sdks() -> None:
    env = {k: "" for k in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "MLFLOW_RUN_ID", "GPU_OPS_MLFLOW_TRACKING_URI")}
    settling = (  # a real settlement: record, ledger row, and no telemetry to queue
        "import tempfile, time\nfrom gpu_ops.storage.tables import TableStore\nfrom gpu_ops.domain.training import attempts as tr\n"
        "from gpu_ops.storage.attempt_store import AttemptStore\nfrom gpu_ops.flows.training.settle import settle_attempt\n"
        "from gpu_ops_tests.training.test_attempts import BILL\n"
        "store = AttemptStore(TableStore('sqlite:///' + tempfile.mkdtemp() + '/c.db'))\n"
        "a = tr.plan('i', 'r', 'a', 1, tr.Owner.this_process(), launch_name='l', bill=BILL, at=time.time())\n"
        "a = store.create(tr.launch(a, host='h', pids=(1,), started=(None,), at=time.time(), workdir=None))\n"
        "done = settle_attempt(store, a, tr.settle(a, 'completed', '', time.time()))\n"
        "assert done is not None and done.row is not None and done.record_ids == ()"
    )
    assert _modules_after(settling, env) == []
    # The code location loads without the SDK, even with an endpoint set (spans are made only when an attempt ends).
    assert _modules_after("import gpu_ops.definitions", {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"}) == []
