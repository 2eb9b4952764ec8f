"""OpenTelemetry spans: one per training attempt, one per cost partition, over OTLP/HTTP.
Nothing is imported unless ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set.

Design: docs/concepts/observability.md#opentelemetry-spans
"""

from __future__ import annotations

import datetime as dt
import gzip
import hashlib
import logging
import os
import urllib.parse
from collections.abc import Mapping
from typing import Any

from gpu_ops.flows.bounded_http import Bounds, RemoteError, describe_failure, exchange
from gpu_ops.domain.formatting import redact_url

log = logging.getLogger("gpu_ops.tracing")
ENDPOINT_VARS = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
TRACER = "gpu_ops"
ATTEMPT_SPAN = "gpu_ops.training.attempt"
PARTITION_SPAN = "gpu_ops.cost.partition"
PARTITION_DEADLINE_S = 1.0
_MAX_ANSWER = 65_536


def enabled() -> bool:
    return any(os.environ.get(v) for v in ENDPOINT_VARS) and os.environ.get("OTEL_SDK_DISABLED", "").lower() != "true"


def _setting(name: str) -> str:
    """``OTEL_EXPORTER_OTLP_TRACES_<name>``, else ``OTEL_EXPORTER_OTLP_<name>``."""
    return os.environ.get(f"OTEL_EXPORTER_OTLP_TRACES_{name}") or os.environ.get(f"OTEL_EXPORTER_OTLP_{name}") or ""


def endpoint() -> str:
    """Where spans go: the traces endpoint as given, or the base endpoint's ``/v1/traces``."""
    traces = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    return traces if traces else os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").rstrip("/") + "/v1/traces"


def _pairs(text: str) -> dict[str, str]:
    """``k1=v1,k2=v2`` (values percent-encoded), as the OTEL_* header and resource variables are written."""
    out = {}
    for item in text.split(","):
        key, sep, value = item.partition("=")
        if sep and key.strip():
            out[urllib.parse.unquote(key.strip())] = urllib.parse.unquote(value.strip())
    return out


def _digest(text: str, bits: int) -> bytes:
    raw = hashlib.sha256(text.encode()).digest()[: bits // 8]
    return raw if any(raw) else b"\x01".rjust(bits // 8, b"\x00")


def _ns(t: dt.datetime) -> int:
    return int(t.timestamp() * 1_000_000_000)


def _clean(attributes: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in attributes.items() if v is not None and v != ""}


def span_payload(name: str, start: dt.datetime, end: dt.datetime, attributes: Mapping[str, Any], *, trace_key: str, span_key: str, error: str | None = None) -> dict[str, Any]:
    """One finished span as JSON (what :func:`export` sends)."""
    return {"name": name, "trace_key": trace_key, "span_key": span_key, "start_ns": _ns(start), "end_ns": _ns(end), "attributes": _clean(attributes), "error": error}


def _any_value(value: Any) -> Any:
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue

    if isinstance(value, bool):
        return AnyValue(bool_value=value)
    if isinstance(value, int):
        return AnyValue(int_value=value)
    if isinstance(value, float):
        return AnyValue(double_value=value)
    return AnyValue(string_value=str(value))


def _request(payload: Mapping[str, Any]) -> bytes:
    """The OTLP ``ExportTraceServiceRequest`` of one span, serialized."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
    from opentelemetry.proto.common.v1.common_pb2 import InstrumentationScope, KeyValue
    from opentelemetry.proto.resource.v1.resource_pb2 import Resource
    from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span, Status

    def kvs(attributes: Mapping[str, Any]) -> list[Any]:
        return [KeyValue(key=k, value=_any_value(v)) for k, v in attributes.items()]

    trace_key = str(payload["trace_key"])
    span = Span(
        trace_id=_digest(trace_key, 128), span_id=_digest("span:" + str(payload["span_key"]), 64), parent_span_id=_digest("root:" + trace_key, 64),
        name=str(payload["name"]), kind=Span.SPAN_KIND_INTERNAL, start_time_unix_nano=int(payload["start_ns"]), end_time_unix_nano=int(payload["end_ns"]),
        attributes=kvs(payload["attributes"]),
        status=Status(code=Status.STATUS_CODE_ERROR, message=str(payload["error"])) if payload.get("error") else Status(),
    )
    resource = {**_pairs(os.environ.get("OTEL_RESOURCE_ATTRIBUTES", "")), "service.name": os.environ.get("OTEL_SERVICE_NAME") or "gpu_ops"}
    spans = ResourceSpans(resource=Resource(attributes=kvs(resource)), scope_spans=[ScopeSpans(scope=InstrumentationScope(name=TRACER), spans=[span])])
    return bytes(ExportTraceServiceRequest(resource_spans=[spans]).SerializeToString())


def export(payload: Mapping[str, Any], deadline_s: float) -> None:
    """POST one span (a :func:`span_payload`) to the configured endpoint within ``deadline_s``
    (connect, send and read together). Raises :class:`~gpu_ops.flows.bounded_http.RemoteError`
    (it names the collector as scheme and host only) when it was not accepted."""
    url = endpoint()
    body = _request(payload)
    headers = {"Content-Type": "application/x-protobuf", **_pairs(_setting("HEADERS"))}
    if _setting("COMPRESSION").lower() == "gzip":
        body, headers["Content-Encoding"] = gzip.compress(body), "gzip"
    with exchange("POST", url, bounds=Bounds(deadline_s, _MAX_ANSWER), headers=headers, body=body, ca_file=_setting("CERTIFICATE") or None) as ex:
        answer = ex.read(cut_at_cap=True)
    if not 200 <= answer.status < 300:
        raise RemoteError(redact_url(url), f"the collector answered HTTP {answer.status}", kind="protocol", sent=True)


def attempt_attributes(row: Any, *, provider: str, cost_usd: float | None, currency: str, recovery_s: float | None) -> dict[str, Any]:
    """A ledger row (:class:`~gpu_ops.storage.ledger.LedgerRow`) as span attributes."""
    preempted = row.outcome == "preempted"
    return {
        "gpu_ops.compute.provider": provider,
        "cloud.provider": "aws" if provider == "kubetorch" else None,
        "gpu_ops.compute.gpu_type": row.gpu_type,
        "gpu_ops.compute.gpu_count": int(row.gpu_count),
        "gpu_ops.compute.gpu_share": float(row.gpu_share),
        "gpu_ops.compute.capacity_type": row.capacity_type,
        "gpu_ops.compute.declared_gpu_type": row.declared_gpu_type,
        "gpu_ops.team": row.team,
        "gpu_ops.project": row.project,
        "gpu_ops.cost_center": row.cost_center,
        "gpu_ops.experiment_id": row.experiment_id,
        "gpu_ops.cost.total": None if cost_usd is None else round(float(cost_usd), 6),
        "gpu_ops.cost.currency": currency,
        "gpu_ops.gpu_hours": round(float(row.gpu_hours), 9),
        "gpu_ops.training.attempt": int(row.attempt),
        "gpu_ops.training.outcome": row.outcome,
        "gpu_ops.training.preempted": preempted,
        "gpu_ops.training.lost_seconds": float(row.lost_seconds),
        "gpu_ops.training.recovery_seconds": None if recovery_s is None else float(recovery_s),
        "dagster.run_id": row.run_id,
        "dagster.asset_key": row.asset_key,
        "k8s.namespace.name": row.namespace,
        "k8s.pod.name": row.pod,
        "k8s.node.name": row.node,
        "error.type": None if row.outcome in ("completed", "preempted") else row.outcome,
    }


def attempt_payload(row: Any, *, provider: str, cost_usd: float | None, currency: str = "USD", recovery_s: float | None = None) -> dict[str, Any]:
    """The span of a settled attempt's ledger row, to queue in the outbox."""
    attrs = attempt_attributes(row, provider=provider, cost_usd=cost_usd, currency=currency, recovery_s=recovery_s)
    error = None if row.outcome in ("completed", "preempted") else row.outcome
    trace_key = f"{row.run_id}/{row.asset_key}"
    return span_payload(ATTEMPT_SPAN, row.start, row.end, attrs, trace_key=trace_key, span_key=f"{trace_key}/{row.attempt}", error=error)


def partition_span(asset: str, partition_keys: list[str], start: dt.datetime, end: dt.datetime, figures: Mapping[str, Any], *, run_id: str) -> bool:
    """A cost asset's materialization of ``partition_keys`` (``figures``: cost, GPU-hours, ...),
    sent now within :data:`PARTITION_DEADLINE_S`; False (and a logged warning) when not."""
    if not enabled():
        return False
    where = partition_keys[0] if len(partition_keys) == 1 else f"{partition_keys[0]}..{partition_keys[-1]}"
    attrs = {
        "gpu_ops.cost.asset": asset,
        "gpu_ops.cost.partition": where,
        "gpu_ops.cost.partitions": len(partition_keys),
        "dagster.run_id": run_id,
        **{f"gpu_ops.{k}": v for k, v in figures.items()},
    }
    trace_key = f"{run_id}/{asset}"
    try:
        export(span_payload(PARTITION_SPAN, start, end, attrs, trace_key=trace_key, span_key=f"{trace_key}/{where}"), PARTITION_DEADLINE_S)
    except Exception as exc:  # noqa: BLE001 - tracing never breaks a run
        log.warning("gpu_ops: the %s span was not sent: %s", PARTITION_SPAN, describe_failure(exc))
        return False
    return True

