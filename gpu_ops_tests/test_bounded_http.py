"""gpu_ops.flows.bounded_http against real servers on 127.0.0.1: what each failure is called,
and whether the request may have arrived (``sent``)."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from gpu_ops.flows.bounded_http import Bounds, RemoteError, exchange, fetch
from gpu_ops.flows.compute.local import free_port
from gpu_ops_tests.hostile_http import endless, fixed, hostile, slow, trickle_headers

B = Bounds(deadline_s=1.0, max_body_bytes=1000)


def raw_server(answer: bytes) -> tuple[str, socket.socket]:
    """Reads the request head, writes ``answer`` as it is, closes."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                conn.recv(65536)
                conn.sendall(answer)

    threading.Thread(target=serve, daemon=True).start()
    return f"http://127.0.0.1:{listener.getsockname()[1]}", listener


def test_a_complete_answer_and_its_headers():
    with hostile(then=fixed(201, b'{"ok":true}', {"Retry-After": "3"})) as server:
        answer = fetch("POST", server.url + "/x?token=abc", bounds=B, headers={"X-Key": "k"}, body=b"hello")
        seen = server.requests[0]
    assert answer.status == 201 and answer.body == b'{"ok":true}' and answer.headers["retry-after"] == "3"
    assert seen.path == "/x?token=abc" and seen.body == b"hello" and seen.headers["X-Key"] == "k"


def test_a_body_over_the_cap_is_an_error_or_cut():
    with hostile(endless(200), endless(200)) as server:
        with pytest.raises(RemoteError) as err:
            fetch("GET", server.url, bounds=B)
        cut = fetch("GET", server.url, bounds=B, cut_at_cap=True)
    assert err.value.kind == "too_large" and "larger than 1,000 bytes" in str(err.value)
    assert cut.cut and len(cut.body) == 1000


def test_a_connection_closed_before_content_length_is_dropped_not_complete():
    url, listener = raw_server(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly this")
    try:
        with pytest.raises(RemoteError) as err:
            fetch("GET", url, bounds=B)
    finally:
        listener.close()
    assert err.value.kind == "dropped" and err.value.sent and "91 bytes before the end" in str(err.value)


def test_an_answer_that_is_not_http_is_a_protocol_error():
    url, listener = raw_server(b"SSH-2.0-OpenSSH_9.6\r\n")
    try:
        with pytest.raises(RemoteError) as err:
            fetch("GET", url, bounds=B)
    finally:
        listener.close()
    assert err.value.kind == "protocol" and err.value.sent


def test_deadlines_name_the_phase_and_say_the_request_was_sent():
    for behaviour in (trickle_headers(), slow(5.0)):
        with hostile(then=behaviour) as server:
            t0 = time.monotonic()
            with pytest.raises(RemoteError) as err:
                fetch("POST", server.url + "/secret-path", bounds=B, body=b"x")
            assert time.monotonic() - t0 < 1.0 + 3.0
        assert err.value.kind == "deadline" and err.value.sent and "waiting for the answer" in str(err.value)
        assert "secret-path" not in str(err.value) and err.value.where.endswith("/…")


def test_a_refused_connection_was_not_sent():
    with pytest.raises(RemoteError) as err:
        fetch("GET", f"http://127.0.0.1:{free_port()}/", bounds=B)
    assert err.value.kind == "connect" and not err.value.sent


def test_the_deadline_covers_a_body_streamed_by_the_caller():
    with hostile(then=endless(200, chunk=1)) as server:
        with exchange("GET", server.url, bounds=Bounds(1.0, 10**12)) as answer:
            t0 = time.monotonic()
            with pytest.raises(RemoteError) as err:
                for _ in answer.chunks():
                    pass
    assert err.value.kind == "deadline" and time.monotonic() - t0 < 1.0 + 3.0


@pytest.mark.parametrize("url", ["ftp://example.com/x", "http://example.com:99999/x", "http://example.com:port/x", "http://[::1/x", "http:///x"])
def test_not_an_http_url(url):
    """A port past 65535 or not a number, an unclosed IPv6 host: a RemoteError that sends
    nothing (a port past 65535 was a raw ValueError from urllib)."""
    with pytest.raises(RemoteError, match="not an http") as caught:
        fetch("GET", url, bounds=B)
    assert caught.value.sent is False
