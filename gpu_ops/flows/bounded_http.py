"""One HTTP exchange with a remote party, bounded in time (a total deadline) and in size (a
body cap). No Dagster; no proxy.

Design: docs/concepts/observability.md#bounded-http-answers
"""

from __future__ import annotations

import contextlib
import http.client
import socket
import ssl
import threading
import time
import urllib.parse
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from gpu_ops.domain.config import is_http_url
from gpu_ops.errors import RemoteError
from gpu_ops.domain.formatting import redact_url, redact_urls

CHUNK = 65_536


@dataclass(frozen=True)
class Bounds:
    deadline_s: float  # the whole exchange, connect to last body byte
    max_body_bytes: int


@dataclass(frozen=True)
class Answer:
    status: int
    headers: Mapping[str, str]  # case-insensitive (an http.client message)
    body: bytes
    cut: bool = False  # the body was longer than the cap and was cut there (cut_at_cap)
    elapsed_s: float = 0.0


class Watchdog:
    """Shuts a connection down when the deadline passes (wakes a blocked read)."""

    def __init__(self, deadline: float):
        self.deadline = deadline
        self.fired = False
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()
        self._timer: threading.Timer | None = None

    def watch(self, sock: socket.socket) -> None:
        with self._lock:
            self._sock = sock.dup()  # the same connection; shutting it down ends every read
        self._timer = threading.Timer(max(0.0, self.deadline - time.monotonic()), self._fire)
        self._timer.daemon = True
        self._timer.start()

    def _fire(self) -> None:
        with self._lock:
            self.fired = True
            if self._sock is not None:
                with contextlib.suppress(OSError):
                    self._sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        with self._lock:
            if self._sock is not None:
                self._sock.close()
                self._sock = None


class Exchange:
    """An open exchange: status and headers read, the body still to stream (:meth:`chunks`)."""

    def __init__(self, conn: http.client.HTTPConnection, response: http.client.HTTPResponse, watchdog: Watchdog, where: str, bounds: Bounds, started: float):
        self._conn, self._response, self._watchdog = conn, response, watchdog
        self.where, self.bounds, self.started = where, bounds, started
        self.status = response.status
        self.headers: Mapping[str, str] = response.headers  # type: ignore[assignment]
        self.read_bytes = 0
        self.cut = False

    def left(self) -> float:
        return self._watchdog.deadline - time.monotonic()

    def chunks(self, *, cut_at_cap: bool = False) -> Iterator[bytes]:
        """The body, piece by piece, within the deadline and the cap."""
        cap = self.bounds.max_body_bytes
        while True:
            if self.left() <= 0:
                raise self._deadline()
            self._set_timeout()
            try:
                piece = self._response.read1(min(CHUNK, cap - self.read_bytes + 1))
            except (OSError, http.client.HTTPException, ValueError) as exc:
                raise self._failed(exc) from None
            if not piece:
                if self._watchdog.fired:
                    raise self._deadline()
                if self._response.length:  # EOF before Content-Length was reached
                    raise RemoteError(self.where, f"connection closed {self._response.length:,} bytes before the end of the answer", kind="dropped", sent=True)
                return
            if self.read_bytes + len(piece) > cap:
                if cut_at_cap:
                    self.cut = True
                    yield piece[: cap - self.read_bytes]
                    self.read_bytes = cap
                    return
                raise RemoteError(self.where, f"answer body larger than {cap:,} bytes (read no further)", kind="too_large", sent=True)
            self.read_bytes += len(piece)
            yield piece

    def read(self, *, cut_at_cap: bool = False) -> Answer:
        body = b"".join(self.chunks(cut_at_cap=cut_at_cap))
        return Answer(self.status, self.headers, body, self.cut, time.monotonic() - self.started)

    def _set_timeout(self) -> None:
        if self._conn.sock is not None:
            self._conn.sock.settimeout(max(0.001, self.left()))

    def _deadline(self) -> RemoteError:
        return RemoteError(self.where, f"no complete answer within the deadline of {self.bounds.deadline_s:g} s (after {self.read_bytes:,} body bytes)", kind="deadline", sent=True)

    def _failed(self, exc: BaseException) -> RemoteError:
        if self._watchdog.fired or self.left() <= 0 or isinstance(exc, TimeoutError):
            return self._deadline()
        return RemoteError(self.where, f"connection dropped while reading the answer ({type(exc).__name__})", kind="dropped", sent=True)

    def close(self) -> None:
        self._watchdog.close()
        self._conn.close()


def _connection(url: str, timeout: float, ca_file: str | None) -> tuple[http.client.HTTPConnection, str]:
    if not is_http_url(url):
        raise RemoteError(redact_url(url), "not an http(s) URL", kind="connect", sent=False)
    parts = urllib.parse.urlsplit(url)
    host = str(parts.hostname)  # there is one: is_http_url
    target = urllib.parse.urlunsplit(("", "", parts.path or "/", parts.query, ""))
    if parts.scheme == "https":
        context = ssl.create_default_context(cafile=ca_file)
        return http.client.HTTPSConnection(host, parts.port, timeout=timeout, context=context), target
    return http.client.HTTPConnection(host, parts.port, timeout=timeout), target


@contextlib.contextmanager
def exchange(method: str, url: str, *, bounds: Bounds, headers: Mapping[str, str] | None = None, body: bytes = b"", ca_file: str | None = None) -> Iterator[Exchange]:
    """Send one request and yield the open answer; every step within ``bounds``.

    Raises :class:`RemoteError` (never a library exception) when no answer comes.
    """
    where = redact_url(url)
    started = time.monotonic()
    watchdog = Watchdog(started + bounds.deadline_s)
    conn, target = _connection(url, bounds.deadline_s, ca_file)

    def create(address: Any, timeout: Any = None, source_address: Any = None) -> socket.socket:
        sock = socket.create_connection(address, timeout, source_address)
        watchdog.watch(sock)  # from here on the deadline holds whatever the server does
        return sock

    conn._create_connection = create  # type: ignore[attr-defined]  # http.client's socket factory (set per connection)
    sent = False
    try:
        try:
            conn.connect()
        except (OSError, ssl.SSLError) as exc:
            raise _connect_error(where, exc, watchdog) from None
        try:
            if conn.sock is not None:
                conn.sock.settimeout(max(0.001, watchdog.deadline - time.monotonic()))
            conn.request(method, target, body=body, headers=dict(headers or {}))
            sent = True
            if conn.sock is not None:
                conn.sock.settimeout(max(0.001, watchdog.deadline - time.monotonic()))
            response = conn.getresponse()
            if watchdog.fired:  # http.client takes a connection shut mid-headers for their end
                raise TimeoutError
        except (OSError, http.client.HTTPException, ValueError) as exc:
            raise _exchange_error(where, exc, watchdog, sent, bounds) from None
        ex = Exchange(conn, response, watchdog, where, bounds, started)
        yield ex
    finally:
        watchdog.close()
        conn.close()


def _connect_error(where: str, exc: BaseException, watchdog: Watchdog) -> RemoteError:
    if isinstance(exc, ssl.SSLCertVerificationError):
        return RemoteError(where, f"TLS certificate not trusted ({exc.reason or type(exc).__name__})", kind="protocol", sent=False)
    if isinstance(exc, TimeoutError) or watchdog.fired:
        return RemoteError(where, "could not connect within the deadline", kind="deadline", sent=False)
    return RemoteError(where, "connection refused or unreachable", kind="connect", sent=False)


def _exchange_error(where: str, exc: BaseException, watchdog: Watchdog, sent: bool, bounds: Bounds) -> RemoteError:
    if watchdog.fired or isinstance(exc, TimeoutError) or time.monotonic() >= watchdog.deadline:
        phase = "waiting for the answer" if sent else "sending the request"
        return RemoteError(where, f"timed out {phase} (deadline {bounds.deadline_s:g} s)", kind="deadline", sent=sent)
    if isinstance(exc, (http.client.BadStatusLine, http.client.LineTooLong, http.client.HTTPException)) and not isinstance(exc, http.client.RemoteDisconnected):
        return RemoteError(where, f"answer is not valid HTTP ({type(exc).__name__})", kind="protocol", sent=sent)
    return RemoteError(where, f"connection dropped ({type(exc).__name__})", kind="dropped", sent=sent)


def fetch(method: str, url: str, *, bounds: Bounds, headers: Mapping[str, str] | None = None, body: bytes = b"", cut_at_cap: bool = False) -> Answer:
    """:func:`exchange` and the whole (capped) body."""
    with exchange(method, url, bounds=bounds, headers=headers, body=body) as ex:
        return ex.read(cut_at_cap=cut_at_cap)


def describe_failure(exc: BaseException) -> str:
    """A failed exchange for a message: a :class:`RemoteError`'s own text (the server as
    scheme and host); any other exception as its type and its text with every URL redacted."""
    return str(exc) if isinstance(exc, RemoteError) else redact_urls(f"{type(exc).__name__}: {exc}")


__all__ = ["Answer", "Bounds", "Exchange", "RemoteError", "Watchdog", "describe_failure", "exchange", "fetch"]
