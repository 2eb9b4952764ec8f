"""Alert receivers that never finish answering: every delivery ends within its documented
bound (attempts × delivery_timeout_s + backoff, plus a margin for a loaded machine) with
bounded memory, measured as the peak RSS of a child process that does the sending.

The receivers are real servers on 127.0.0.1 (gpu_ops_tests/hostile_http.py): an endless
chunked body, headers or a body trickled byte by byte, a 200 after the deadline, a
``Retry-After`` that is no number.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpu_ops.flows.alerts.channels import DeliverySettings, Redactor, parse_retry_after, send
from gpu_ops.domain.alerts.messages import IDEMPOTENCY_HEADER
from gpu_ops.domain.config import PagerDutyChannel, SlackChannel, WebhookChannel
from gpu_ops_tests.alerts.test_channels import SLACK_TOKEN, alert
from gpu_ops_tests.hostile_http import endless, fixed, hostile, slow, trickle_body, trickle_headers

REPO = Path(__file__).resolve().parents[2]
MARGIN_S = 3.0  # scheduling slack on a shared two-core machine; the bound itself is the deadline
MAX_GROWTH_MIB = 40  # what one bounded delivery may add to the child's peak RSS

CHILD = r"""
import json, resource, sys, time
from gpu_ops.flows.alerts.channels import DeliverySettings, Redactor, send
from gpu_ops.domain.alerts.model import Alert
from gpu_ops.domain.config import SlackChannel

url, timeout, attempts = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
a = Alert(kind="trigger", budget="nlp-monthly", period_start="2026-11-01", period_end="2026-12-01", threshold="actual-80pct",
          basis="actual", threshold_usd=12000.0, severity="warning", amount_usd=15000.0, spend_usd=12500.0, percent_used=83.3,
          forecast_usd=None, scope={"team": "nlp"}, channels=("slack",), partition_key="2026-11-19")
ch = {"slack": SlackChannel(type="slack", webhook_url=url)}
settings = DeliverySettings(attempts=attempts, backoff_s=0.05, timeout_s=timeout)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t0 = time.monotonic()
r = send("slack", ch["slack"], a, settings=settings, redact=Redactor(ch))
elapsed = time.monotonic() - t0
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"ok": r.ok, "attempts": r.attempts, "detail": r.detail, "maybe": r.maybe_delivered, "elapsed": elapsed, "growth_mib": (after - before) / 1024}))
"""


def deliver_in_child(url: str, timeout_s: float, attempts: int) -> dict:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", CHILD, url, str(timeout_s), str(attempts)], capture_output=True, text=True, timeout=120, env=env, cwd=REPO)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def bound(timeout_s: float, attempts: int) -> float:
    backoff = sum(0.05 * 2**i * 1.2 for i in range(attempts - 1))
    return attempts * timeout_s + backoff + MARGIN_S


@pytest.mark.parametrize("status", [200, 500])
def test_an_endless_chunked_answer_ends_at_the_cap_with_bounded_memory(status):
    with hostile(endless(status), endless(status)) as server:
        out = deliver_in_child(f"{server.url}/services/{SLACK_TOKEN}", 5.0, 2)
    if status == 200:  # the status says delivered; the endless body is never read
        assert out["ok"] and out["attempts"] == 1 and out["detail"].startswith("HTTP 200")
    else:  # a 500 is retried; its body is read up to the cap (64 KiB) for the first 200 characters
        assert not out["ok"] and out["attempts"] == 2 and "HTTP 500: [[[[" in out["detail"]
        assert out["elapsed"] < bound(5.0, 2)
    assert out["growth_mib"] < MAX_GROWTH_MIB, out
    assert SLACK_TOKEN not in out["detail"]


def test_headers_trickled_byte_by_byte_end_at_the_total_deadline():
    with hostile(trickle_headers(), trickle_headers()) as server:
        out = deliver_in_child(f"{server.url}/services/{SLACK_TOKEN}", 1.0, 2)
        assert len(server.requests) == 2
    assert not out["ok"] and out["attempts"] == 2
    assert out["elapsed"] < bound(1.0, 2), out  # was: past 150 s with a 5 s timeout × 2
    assert "deadline" in out["detail"] and out["maybe"]  # sent, then no answer: it may have arrived
    assert out["growth_mib"] < MAX_GROWTH_MIB, out
    assert SLACK_TOKEN not in out["detail"] and "/services/" not in out["detail"]


def test_a_500_body_trickled_byte_by_byte_is_cut_at_the_deadline_and_retried():
    with hostile(trickle_body(503, prefix=b'{"error":"busy"'), fixed(200, b"ok")) as server:
        t0 = time.monotonic()
        ch = {"hook": WebhookChannel(type="webhook", url=server.url + "/gpu")}
        result = send("hook", ch["hook"], alert(("hook",)), settings=DeliverySettings(attempts=2, backoff_s=0.05, timeout_s=1.0), redact=Redactor(ch))
        elapsed = time.monotonic() - t0
    assert result.ok and result.attempts == 2
    assert elapsed < bound(1.0, 2)


def test_a_200_after_the_deadline_is_retried_with_the_same_key_and_reported_as_maybe_delivered():
    """The receiver gets every attempt (it may process each): at-least-once, one key."""
    with hostile(slow(3.0), slow(3.0)) as server:
        ch = {"pd": PagerDutyChannel(type="pagerduty", routing_key="rk-secret-1234", events_url=server.url + "/v2/enqueue")}
        t0 = time.monotonic()
        result = send("pd", ch["pd"], alert(("pd",)), settings=DeliverySettings(attempts=2, backoff_s=0.05, timeout_s=1.0), redact=Redactor(ch))
        elapsed = time.monotonic() - t0
        seen = list(server.requests)
    assert not result.ok and not result.permanent and result.maybe_delivered
    assert "may have it" in result.detail and "rk-secret-1234" not in result.detail
    assert elapsed < bound(1.0, 2)
    assert len(seen) == 2
    assert {r.headers[IDEMPOTENCY_HEADER] for r in seen} == {"gpu-ops/nlp-monthly/2026-11-01/actual-80pct/trigger"}
    assert {json.loads(r.body)["dedup_key"] for r in seen} == {"gpu-ops/nlp-monthly/2026-11-01/actual-80pct"}
    assert len({r.body for r in seen}) == 1


def test_a_retry_after_that_is_no_number_is_ignored_and_the_delivery_goes_on():
    with hostile(fixed(503, b"busy", {"Retry-After": "²"}), fixed(429, b"slow down", {"Retry-After": "99999"})) as server:
        ch = {"slack": SlackChannel(type="slack", webhook_url=server.url + "/hook")}
        settings = DeliverySettings(attempts=3, backoff_s=0.05, timeout_s=2.0)
        t0 = time.monotonic()
        result = send("slack", ch["slack"], alert(("slack",)), settings=settings, redact=Redactor(ch))
        elapsed = time.monotonic() - t0
    assert result.ok and result.attempts == 3, result.detail  # was: "unexpected ValueError" after 1 attempt
    assert elapsed < 3 * 2.0 + 2 * 0.05 * 16 * 1.2 + MARGIN_S  # 99999 s capped at backoff × 16


def test_retry_after_is_parsed_strictly():
    now = dt.datetime(2026, 11, 19, 12, 0, 0, tzinfo=dt.timezone.utc)
    assert parse_retry_after("120", now) == 120.0
    assert parse_retry_after(" 7 ", now) == 7.0
    assert parse_retry_after("Thu, 19 Nov 2026 12:00:30 GMT", now) == 30.0
    assert parse_retry_after("Thu, 19 Nov 2026 11:00:00 GMT", now) == 0.0  # in the past: now
    for bad in ("²", "٣", "1.5", "-5", "", None, "soon", "Thu, 19 Nov 2026 12:00:30", "99999999999"):
        assert parse_retry_after(bad, now) is None, bad


def test_a_refused_connection_is_not_maybe_delivered():
    from gpu_ops.flows.compute.local import free_port

    ch = {"slack": SlackChannel(type="slack", webhook_url=f"http://127.0.0.1:{free_port()}/hook")}
    result = send("slack", ch["slack"], alert(("slack",)), settings=DeliverySettings(attempts=2, backoff_s=0.01, timeout_s=1.0), redact=Redactor(ch))
    assert not result.ok and not result.maybe_delivered and "refused" in result.detail


def test_an_smtp_server_that_trickles_its_greeting_ends_at_the_deadline():
    import socket
    import threading

    from gpu_ops.domain.config import EmailChannel

    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def trickle() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                try:
                    for b in b"220 " + b"x" * 10_000:  # never a line end
                        conn.sendall(bytes([b]))
                        time.sleep(0.05)
                except OSError:
                    pass

    threading.Thread(target=trickle, daemon=True).start()
    try:
        ch = EmailChannel(type="email", to=["finops@example.com"], smtp={"host": "127.0.0.1", "port": listener.getsockname()[1], "timeout_s": 1.0})
        t0 = time.monotonic()
        result = send("finance", ch, alert(("finance",)), settings=DeliverySettings(attempts=2, backoff_s=0.05, timeout_s=5.0), redact=Redactor({"finance": ch}))
        elapsed = time.monotonic() - t0
    finally:
        stop.set()
        listener.close()
    assert not result.ok and not result.permanent and result.attempts == 2
    assert "no complete SMTP session within 1 s" in result.detail
    assert elapsed < bound(1.0, 2)
