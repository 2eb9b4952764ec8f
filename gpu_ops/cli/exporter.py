"""``gpu-ops exporter``: the HTTP endpoint Prometheus scrapes (``/metrics``, port 9464).

Design: docs/concepts/observability.md#the-exporter
"""

from __future__ import annotations

import gzip
import http.server
import logging
import math
import signal
import socket
import threading
import time
from collections.abc import Iterable
from typing import Any

import click

from gpu_ops.cli.types import seconds
from gpu_ops.domain.config import load_config
from gpu_ops.domain.metrics import Family, families
from gpu_ops.flows.observability.readers import DEFAULT_DEADLINE_S, Reader
from gpu_ops.storage.files import PartitionFiles
from gpu_ops.storage.tables import TableStore

log = logging.getLogger("gpu_ops.exporter")
DEFAULT_PORT = 9464
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_LABEL_VALUE = str.maketrans({"\\": "\\\\", "\n": "\\n", '"': '\\"'})
_HELP = str.maketrans({"\\": "\\\\", "\n": "\\n"})


def _value(v: float) -> str:
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return repr(float(v))


def _escaped(v: str) -> str:
    return v.translate(_LABEL_VALUE) if "\\" in v or '"' in v or "\n" in v else v


def exposition(fams: Iterable[Family]) -> bytes:
    """The families in Prometheus' text format 0.0.4: ``# HELP``, ``# TYPE``, a line per sample."""
    out: list[str] = []
    rendered: dict[tuple[tuple[str, ...], tuple[str, ...]], str] = {}  # families of one grain share their label sets
    for family in fams:
        m = family.metric
        out.append(f"# HELP {m.name} {m.help.translate(_HELP)}\n# TYPE {m.name} {m.kind}\n")
        for labels, value in family.samples:
            inner = rendered.get((m.labels, labels))
            if inner is None:
                inner = rendered[(m.labels, labels)] = "{" + ",".join(f'{n}="{_escaped(v)}"' for n, v in zip(m.labels, labels)) + "}" if labels else ""
            out.append(f"{m.name}{inner} {_value(value)}\n")
    return "".join(out).encode()


class Scrapes:
    """The answer to a scrape: the families of a fresh read (or one at most
    ``cache_seconds`` old) as exposition text. Scrapes that arrive during a read share its
    answer: each waits at most one read, which ends by the reader's deadline.

    The deadline is the whole scrape's: the reads are given what is left of it once the
    text has been written (half again the longest of the last scrapes' writing, a quarter
    of the deadline before any, half of it at most), so that 130,000 series written after
    a read that used all of its time still arrive within it."""

    def __init__(self, reader: Reader, cache_seconds: float = 0.0):
        self.reader, self.cache_seconds = reader, cache_seconds
        self._lock = threading.Lock()
        self._cached: tuple[float, bytes] | None = None
        self._reading: threading.Event | None = None  # set when the read under way ends
        self._render_s: list[float] = []  # how long the last scrapes took to write their text

    def text(self) -> bytes:
        with self._lock:
            now = time.monotonic()
            if self._cached is not None and now - self._cached[0] < self.cache_seconds:
                return self._cached[1]
            under_way, leader = self._reading, self._reading is None
            if leader:
                under_way = self._reading = threading.Event()
        assert under_way is not None
        if not leader:
            under_way.wait()
            assert self._cached is not None  # the leader's answer has been kept
            return self._cached[1]
        try:
            body = self._answer(now)
            with self._lock:
                self._cached = (now, body)
            return body
        finally:
            with self._lock:
                self._reading = None
            under_way.set()

    def _answer(self, started: float) -> bytes:
        deadline_s = self.reader.deadline_s
        reserve = 1.5 * max(self._render_s) if self._render_s else deadline_s / 4
        snap = self.reader.read(started + deadline_s - min(reserve, deadline_s / 2))
        for source, reason in snap.errors.items():
            log.warning("gpu-ops exporter: could not read %s: %s", source, reason)
        t = time.monotonic()
        body = exposition(families(snap))
        self._render_s = [*self._render_s[-4:], time.monotonic() - t]
        return body


def reader_from_config(config_path: str | None, per_pod: bool, history_s: float = 0.0, deadline_s: float = DEFAULT_DEADLINE_S) -> Reader:
    cfg = load_config(config_path)
    quotas = {"team": dict(cfg.compute.quotas.team), "pool": dict(cfg.compute.quotas.pool)}
    files = PartitionFiles(cfg.storage.row_level_path) if cfg.storage.row_level_path else None
    return Reader(TableStore.from_config(cfg), quotas=quotas, per_pod=per_pod, history_s=history_s, files=files, deadline_s=deadline_s, config=cfg)


def _handler(scrapes: Scrapes) -> type[http.server.BaseHTTPRequestHandler]:
    class Metrics(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            if self.path.split("?")[0] == "/favicon.ico":
                self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            body = scrapes.text()
            zipped = "gzip" in self.headers.get("Accept-Encoding", "")
            if zipped:
                body = gzip.compress(body, compresslevel=1)
            self.send_response(200)
            self.send_header("Content-Type", CONTENT_TYPE)
            if zipped:
                self.send_header("Content-Encoding", "gzip")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:  # scrapes are not logged; read failures are
            pass

    return Metrics


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True


def listen(reader: Reader, host: str, port: int, cache_seconds: float) -> http.server.ThreadingHTTPServer:
    """The /metrics server on ``host:port`` (an IPv6 address too), serving in a thread of its own."""
    server_cls = type("Server", (_Server,), {"address_family": socket.AF_INET6 if ":" in host else socket.AF_INET})
    try:
        server = server_cls((host, port), _handler(Scrapes(reader, cache_seconds)))
    except OSError as exc:  # in use, not an address of this host, a privileged port
        raise click.ClickException(f"cannot listen on {host}:{port}: {exc.strerror or exc}; pick another --port or --host") from None
    threading.Thread(target=server.serve_forever, name="gpu-ops-exporter-http", daemon=True).start()
    return server


def serve(reader: Reader, host: str, port: int, cache_seconds: float, ready: Any = None) -> None:
    """Serve until SIGTERM or SIGINT."""
    server = listen(reader, host, port, cache_seconds)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    log.info("gpu-ops exporter serving http://%s:%d/metrics", host, server.server_port)
    if ready is not None:
        ready(server.server_port)
    stop.wait()
    server.shutdown()
    server.server_close()


@click.command("exporter")
@click.option("--host", default="0.0.0.0", show_default=True, help="Address to listen on.")
@click.option("--port", default=DEFAULT_PORT, show_default=True, type=click.IntRange(0, 65535), help="Port of /metrics (0: any free port, printed).")
@click.option("--config", "config_path", default=None, help="GPU_OPS_CONFIG file (default: $GPU_OPS_CONFIG, else the plain defaults).")
@click.option("--per-pod", is_flag=True, help="Also export per-pod series (pod names are unbounded: opt in knowingly).")
@click.option("--cache-seconds", default=15.0, show_default=True, type=seconds(), help="Scrapes this close together share one database read.")
@click.option("--history-seconds", default=300.0, show_default=True, type=seconds(),
              help="Re-read the sums of the append-only tables (ledger, alert deliveries, dead letters), which grow with history, at most this often.")
@click.option("--deadline-seconds", default=DEFAULT_DEADLINE_S, show_default=True, type=seconds(min_open=True),
              help="Every scrape answers within this long: sources the database has not answered by then are served as gpu_ops_exporter_read_ok 0. "
              "Keep it below the scrape_timeout of the Prometheus that scrapes (10 s by default).")
def exporter(host: str, port: int, config_path: str | None, per_pod: bool, cache_seconds: float, history_seconds: float, deadline_seconds: float) -> None:
    """Serve gpu_ops cost, budget, alert, training and quota metrics for Prometheus."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    reader = reader_from_config(config_path, per_pod, history_seconds, deadline_seconds)
    serve(reader, host, port, cache_seconds, ready=lambda p: click.echo(f"gpu-ops exporter listening on http://{host}:{p}/metrics", err=True))
