"""OpenTelemetry spans: one per training attempt, one per cost partition, over OTLP/HTTP.

Exported only when ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or ``..._TRACES_ENDPOINT``) is set;
otherwise every function returns at once without importing the SDK, so the code location
and a run that does not trace pay nothing. The exporter follows the standard OTEL_*
variables (headers, timeout, protocol http/protobuf); ``OTEL_SERVICE_NAME`` defaults to
``gpu_ops``. Spans go out synchronously when they end (a few per run), each bounded by
the exporter's timeout; a receiver that is down costs one logged warning, never the run.

Attributes follow OpenTelemetry's semantic conventions where one exists
(``k8s.namespace.name``, ``k8s.pod.name``, ``k8s.node.name``, ``error.type``,
``cloud.provider``); the rest are in the ``gpu_ops.`` namespace, with the names of the
GenOps design (``gpu_ops.compute.gpu_type``, ``gpu_ops.cost.total``, ...). Every attempt
of one Dagster run (and asset) lands in one trace whose id is derived from the run id.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import logging
import os
import threading
from collections.abc import Mapping
from typing import Any

log = logging.getLogger("gpu_ops.tracing")
ENDPOINT_VARS = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
TRACER = "gpu_ops"
ATTEMPT_SPAN = "gpu_ops.training.attempt"
PARTITION_SPAN = "gpu_ops.cost.partition"

_lock = threading.Lock()
_providers: dict[tuple[str, ...], Any] = {}


def enabled() -> bool:
    return any(os.environ.get(v) for v in ENDPOINT_VARS) and os.environ.get("OTEL_SDK_DISABLED", "").lower() != "true"


def _tracer() -> Any:
    """A tracer of this module's own provider (the global one is the application's)."""
    key = tuple(os.environ.get(v, "") for v in (*ENDPOINT_VARS, "OTEL_SERVICE_NAME", "OTEL_EXPORTER_OTLP_HEADERS"))
    with _lock:
        provider = _providers.get(key)
        if provider is None:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            from opentelemetry.sdk.resources import SERVICE_NAME, Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import SimpleSpanProcessor

            provider = TracerProvider(resource=Resource.create({SERVICE_NAME: os.environ.get("OTEL_SERVICE_NAME") or "gpu_ops"}))
            provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter()))
            _providers[key] = provider
    return provider.get_tracer(TRACER)


def _ns(t: dt.datetime) -> int:
    return int(t.timestamp() * 1_000_000_000)


def _digest(text: str, bits: int) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[: bits // 8], "big") or 1


def _parent(trace_key: str) -> Any:
    """A remote parent whose trace id is derived from ``trace_key`` (the Dagster run and asset)."""
    from opentelemetry import trace
    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

    ctx = SpanContext(trace_id=_digest(trace_key, 128), span_id=_digest("root:" + trace_key, 64), is_remote=True, trace_flags=TraceFlags(TraceFlags.SAMPLED))
    return trace.set_span_in_context(NonRecordingSpan(ctx))


def _clean(attributes: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in attributes.items() if v is not None and v != ""}


def emit(name: str, start: dt.datetime, end: dt.datetime, attributes: Mapping[str, Any], *, trace_key: str, error: str | None = None) -> bool:
    """One finished span; False when tracing is off or the span could not be made."""
    if not enabled():
        return False
    try:
        from opentelemetry.trace import SpanKind, Status, StatusCode

        span = _tracer().start_span(name, context=_parent(trace_key), kind=SpanKind.INTERNAL, attributes=_clean(attributes), start_time=_ns(start))
        if error:
            span.set_status(Status(StatusCode.ERROR, error))
        span.end(end_time=_ns(end))
        return True
    except Exception as exc:  # noqa: BLE001 - tracing never breaks a run
        log.warning("gpu_ops: could not export the %s span: %s: %s", name, type(exc).__name__, exc)
        return False


def attempt_attributes(row: Any, *, provider: str, cost_usd: float | None, currency: str, recovery_s: float | None) -> dict[str, Any]:
    """A ledger row (:class:`~gpu_ops.training.ledger.LedgerRow`) as span attributes."""
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


def attempt_span(row: Any, *, provider: str, cost_usd: float | None, currency: str = "USD", recovery_s: float | None = None) -> bool:
    if not enabled():
        return False
    attrs = attempt_attributes(row, provider=provider, cost_usd=cost_usd, currency=currency, recovery_s=recovery_s)
    error = None if row.outcome in ("completed", "preempted") else row.outcome
    return emit(ATTEMPT_SPAN, row.start, row.end, attrs, trace_key=f"{row.run_id}/{row.asset_key}", error=error)


def partition_span(asset: str, partition_keys: list[str], start: dt.datetime, end: dt.datetime, figures: Mapping[str, Any], *, run_id: str) -> bool:
    """A cost asset's materialization of ``partition_keys`` (``figures``: cost, GPU-hours, ...)."""
    if not enabled():
        return False
    attrs = {
        "gpu_ops.cost.asset": asset,
        "gpu_ops.cost.partition": partition_keys[0] if len(partition_keys) == 1 else f"{partition_keys[0]}..{partition_keys[-1]}",
        "gpu_ops.cost.partitions": len(partition_keys),
        "dagster.run_id": run_id,
        **{f"gpu_ops.{k}": v for k, v in figures.items()},
    }
    return emit(PARTITION_SPAN, start, end, attrs, trace_key=f"{run_id}/{asset}")
