"""``gpu-ops exporter``: the HTTP endpoint Prometheus scrapes (``/metrics``, port 9464).

Each scrape reads the gpu_ops database (the tables the Dagster UI shows, see
:mod:`gpu_ops.observability.readers`) through a custom ``prometheus_client`` collector:
the exporter keeps no state of its own, so a restart changes no value and several
replicas serve the same figures. ``--cache-seconds`` lets scrapes within that many
seconds share one read (an HA pair of Prometheus servers costs one set of queries).
A database that is down answers ``gpu_ops_exporter_read_ok{source=...} 0`` and a log line
naming the database (password hidden), never a traceback or an empty 200.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import click
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry

from gpu_ops.observability.metrics import COUNTER, Family, Snapshot, families
from gpu_ops.observability.readers import Reader

log = logging.getLogger("gpu_ops.exporter")
DEFAULT_PORT = 9464


def to_prometheus(family: Family) -> Any:
    m = family.metric
    cls = CounterMetricFamily if m.kind == COUNTER else GaugeMetricFamily
    out = cls(m.family, m.help, labels=list(m.labels), unit="")
    for labels, value in family.samples:
        out.add_metric(list(labels), value)
    return out


class TableCollector(Collector):
    """Collects :func:`~gpu_ops.observability.metrics.families` from a fresh read (or one
    at most ``cache_seconds`` old)."""

    def __init__(self, reader: Reader, cache_seconds: float = 0.0):
        self.reader, self.cache_seconds = reader, cache_seconds
        self._lock = threading.Lock()
        self._cached: tuple[float, Snapshot] | None = None

    def snapshot(self) -> Snapshot:
        with self._lock:
            now = time.monotonic()
            if self._cached is not None and now - self._cached[0] < self.cache_seconds:
                return self._cached[1]
            snap = self.reader.read()
            for source, reason in snap.errors.items():
                log.warning("gpu-ops exporter: could not read %s: %s", source, reason)
            self._cached = (now, snap)
            return snap

    def collect(self) -> Iterator[Any]:
        for family in families(self.snapshot()):
            yield to_prometheus(family)

    def describe(self) -> Iterator[Any]:
        return iter(())  # no read at registration


def build_registry(reader: Reader, cache_seconds: float = 0.0) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(TableCollector(reader, cache_seconds))
    return registry


def reader_from_config(config_path: str | None, per_pod: bool, history_s: float = 0.0) -> Reader:
    from gpu_ops.config import load_config
    from gpu_ops.storage.tables import TableStore

    cfg = load_config(config_path)
    quotas = {"team": dict(cfg.compute.quotas.team), "pool": dict(cfg.compute.quotas.pool)}
    return Reader(TableStore.from_config(cfg), quotas=quotas, per_pod=per_pod, history_s=history_s)


def serve(reader: Reader, host: str, port: int, cache_seconds: float, ready: Any = None) -> None:
    """Serve until SIGTERM or SIGINT."""
    from prometheus_client import start_http_server

    try:
        server, thread = start_http_server(port, addr=host, registry=build_registry(reader, cache_seconds))
    except OSError as exc:  # in use, not an address of this host, a privileged port
        raise click.ClickException(f"cannot listen on {host}:{port}: {exc.strerror or exc}; pick another --port or --host") from None
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    log.info("gpu-ops exporter serving http://%s:%d/metrics", host, server.server_port)
    if ready is not None:
        ready(server.server_port)
    stop.wait()
    server.shutdown()
    thread.join(timeout=5)


@click.command("exporter")
@click.option("--host", default="0.0.0.0", show_default=True, help="Address to listen on.")
@click.option("--port", default=DEFAULT_PORT, show_default=True, type=click.IntRange(0, 65535), help="Port of /metrics (0: any free port, printed).")
@click.option("--config", "config_path", default=None, help="GPU_OPS_CONFIG file (default: $GPU_OPS_CONFIG, else the plain defaults).")
@click.option("--per-pod", is_flag=True, help="Also export per-pod series (pod names are unbounded: opt in knowingly).")
@click.option("--cache-seconds", default=15.0, show_default=True, type=click.FloatRange(min=0), help="Scrapes this close together share one database read.")
@click.option("--history-seconds", default=300.0, show_default=True, type=click.FloatRange(min=0),
              help="Re-read the sums of the append-only tables (ledger, alert deliveries, dead letters), which grow with history, at most this often.")
def exporter(host: str, port: int, config_path: str | None, per_pod: bool, cache_seconds: float, history_seconds: float) -> None:
    """Serve gpu_ops cost, budget, alert, training and quota metrics for Prometheus."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    reader = reader_from_config(config_path, per_pod, history_seconds)
    serve(reader, host, port, cache_seconds, ready=lambda p: click.echo(f"gpu-ops exporter listening on http://{host}:{p}/metrics", err=True))
