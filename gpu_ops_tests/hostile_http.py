"""A hostile HTTP server on 127.0.0.1 for the bounded-answer tests.

Each request is answered by a ``behaviour`` (a function of the handler): an endless
chunked body, headers or a body trickled byte by byte, a 200 after a long sleep, or a
fixed answer. Every request (path, headers, body) is recorded. Writing stops when the
client hangs up.
"""

from __future__ import annotations

import contextlib
import http.server
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

Behaviour = Callable[[http.server.BaseHTTPRequestHandler], None]


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Hostile:
    url: str
    requests: list[Seen] = field(default_factory=list)


def _write(handler: http.server.BaseHTTPRequestHandler, data: bytes) -> None:
    handler.wfile.write(data)
    handler.wfile.flush()


def endless(status: int = 200, chunk: int = 65_536, fill: bytes = b"[") -> Behaviour:
    """A chunked body of ``fill`` that never ends, written as fast as the client reads."""

    def answer(h: http.server.BaseHTTPRequestHandler) -> None:
        _write(h, f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n".encode())
        piece = f"{chunk:x}\r\n".encode() + fill * chunk + b"\r\n"
        while True:
            _write(h, piece)

    return answer


def trickle_headers(interval_s: float = 0.05) -> Behaviour:
    """A status line and then headers, one byte at a time, forever."""

    def answer(h: http.server.BaseHTTPRequestHandler) -> None:
        head = b"HTTP/1.1 200 OK\r\n"
        n = 0
        while True:
            for b in head if n == 0 else b"X-Pad-%d: %s\r\n" % (n, b"a" * 40):
                _write(h, bytes([b]))
                time.sleep(interval_s)
            n += 1

    return answer


def trickle_body(status: int = 200, interval_s: float = 0.05, prefix: bytes = b"") -> Behaviour:
    """Headers at once, then ``prefix`` and a body of spaces one byte per interval, forever."""

    def answer(h: http.server.BaseHTTPRequestHandler) -> None:
        _write(h, f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n".encode())
        if prefix:
            _write(h, f"{len(prefix):x}\r\n".encode() + prefix + b"\r\n")
        while True:
            _write(h, b"1\r\n \r\n")
            time.sleep(interval_s)

    return answer


def slow(seconds: float, status: int = 200, body: bytes = b'{"status":"success"}') -> Behaviour:
    """The right answer, after ``seconds``."""

    def answer(h: http.server.BaseHTTPRequestHandler) -> None:
        time.sleep(seconds)
        fixed(status, body)(h)

    return answer


def fixed(status: int, body: bytes, headers: dict[str, str] | None = None) -> Behaviour:
    def answer(h: http.server.BaseHTTPRequestHandler) -> None:
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        _write(h, f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n{extra}Connection: close\r\n\r\n".encode() + body)

    return answer


@contextlib.contextmanager
def hostile(*script: Behaviour, then: Behaviour | None = None) -> Iterator[Hostile]:
    """Answer the requests with ``script`` in order, then with ``then`` (default: 200)."""
    queue = list(script)
    after = then or fixed(200, b'{"status":"success"}')
    lock = threading.Lock()
    state: dict[str, Any] = {}

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            pass

        def _any(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            with lock:
                state["server"].requests.append(Seen(self.command, self.path, dict(self.headers), body))
                behaviour = queue.pop(0) if queue else after
            self.close_connection = True
            try:
                behaviour(self)
            except (BrokenPipeError, ConnectionResetError, ConnectionAbortedError):
                pass  # the client hung up: what a bounded client does

        do_GET = do_POST = _any  # noqa: N815

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    state["server"] = Hostile(f"http://127.0.0.1:{server.server_address[1]}")
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield state["server"]
    finally:
        server.shutdown()
        server.server_close()
