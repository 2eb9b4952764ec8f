"""Loopback HTTP receivers for tests: one home for the answer boilerplate.

`QuietHandler` is a ``BaseHTTPRequestHandler`` that keeps the test output clean;
`reply` answers a request completely (status, ``Content-Type``, ``Content-Length``,
body), so a client never waits for a body that is not coming; `serving` runs a handler
class on 127.0.0.1 in a daemon thread and yields its base URL.
"""

from __future__ import annotations

import contextlib
import http.server
import threading
from collections.abc import Iterator
from typing import Any


class QuietHandler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args: Any) -> None:
        pass


def reply(handler: http.server.BaseHTTPRequestHandler, status: int, body: bytes, content_type: str | None = None) -> None:
    handler.send_response(status)
    if content_type:
        handler.send_header("Content-Type", content_type)
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


@contextlib.contextmanager
def serving(handler: type[http.server.BaseHTTPRequestHandler], port: int = 0) -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
