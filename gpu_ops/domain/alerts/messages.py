"""Notification bodies for each channel, and webhook signing. Pure: no I/O, no Dagster.

Bodies are built from the :class:`Alert` alone, which carries no channel secrets, so a
secret of one channel cannot leak into another channel's message.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import json
import time
from email.message import EmailMessage
from email.utils import format_datetime
from typing import Any

from gpu_ops.domain.alerts.model import Alert, money

SIGNATURE_HEADER = "X-GPU-Ops-Signature"
TIMESTAMP_HEADER = "X-GPU-Ops-Timestamp"
IDEMPOTENCY_HEADER = "Idempotency-Key"
SIGNATURE_TOLERANCE_S = 300

_EMOJI = {"trigger": {"info": ":information_source:", "warning": ":warning:", "critical": ":rotating_light:"}}


def _forecast_text(alert: Alert) -> str:
    if alert.forecast_usd is None:
        return "not yet (too little history this period)"
    return f"{money(alert.forecast_usd)} ({alert.forecast_usd / alert.amount_usd * 100:.0f}% of budget)"


def _title(alert: Alert) -> str:
    if alert.kind == "resolve":
        head = f":white_check_mark: {alert.budget}: back under {alert.threshold_label}"
    else:
        head = f"{_EMOJI['trigger'].get(alert.severity, ':warning:')} {alert.budget}: {alert.percent_used:.0f}% of budget used"
    return f"[TEST] {head}" if alert.is_test else head


def facts(alert: Alert) -> list[tuple[str, str]]:
    """The numbers every channel shows, in reading order."""
    rows = [
        ("Budget", alert.budget),
        ("Scope", alert.scope_label),
        ("Period", alert.period_label),
        ("Spend", f"{money(alert.spend_usd)} of {money(alert.amount_usd)}"),
        ("Used", f"{alert.percent_used:.1f}%"),
        ("Forecast", _forecast_text(alert)),
        ("Threshold", f"{alert.threshold_label} ({alert.severity})"),
    ]
    if alert.enforcement != "alert":
        rows.append(("Enforcement", alert.enforcement))
    return rows


def slack_payload(alert: Alert) -> dict[str, Any]:
    """An incoming-webhook message: Block Kit for people, ``text`` for notifications."""
    fields = [{"type": "mrkdwn", "text": f"*{k}*\n{v}"} for k, v in facts(alert)]
    blocks: list[dict[str, Any]] = [
        {"type": "header", "text": {"type": "plain_text", "text": _title(alert)[:150], "emoji": True}},
    ]
    if alert.is_test:
        blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": "*This is a test notification from `gpu-ops alerts test`; no budget was crossed.*"}})
    # Slack allows at most 10 fields per section.
    for i in range(0, len(fields), 10):
        blocks.append({"type": "section", "fields": fields[i : i + 10]})
    if alert.top_spenders and alert.kind != "resolve":
        lines = "\n".join(f"• {name}: {money(cost)}" for name, cost in alert.top_spenders)
        blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": f"*Top spenders this period*\n{lines}"}})
    blocks.append(
        {
            "type": "actions",
            "elements": [{"type": "button", "text": {"type": "plain_text", "text": "Open gpu_budget_status in Dagster"}, "url": alert.asset_url}],
        }
    )
    blocks.append({"type": "context", "elements": [{"type": "mrkdwn", "text": f"gpu-ops · {alert.dedup_key}"}]})
    return {"text": alert.summary(), "blocks": blocks}


_PD_SEVERITY = {"info": "info", "warning": "warning", "critical": "critical"}


def pagerduty_event(alert: Alert, routing_key: str) -> dict[str, Any]:
    """Events API v2. Trigger and resolve share ``dedup_key`` so one incident opens and closes."""
    if alert.kind == "resolve":
        return {"routing_key": routing_key, "event_action": "resolve", "dedup_key": alert.dedup_key}
    return {
        "routing_key": routing_key,
        "event_action": "trigger",
        "dedup_key": alert.dedup_key,
        "payload": {
            "summary": alert.summary()[:1024],
            "source": "gpu-ops",
            "severity": _PD_SEVERITY[alert.severity],
            "component": alert.budget,
            "group": alert.scope_label,
            "class": "gpu-budget-test" if alert.is_test else "gpu-budget-threshold",
            "custom_details": webhook_payload(alert),
        },
        "client": "gpu-ops",
        "client_url": alert.asset_url,
        "links": [{"href": alert.asset_url, "text": "gpu_budget_status in Dagster"}],
    }


def webhook_payload(alert: Alert) -> dict[str, Any]:
    kind = "spend_anomaly" if alert.basis == "anomaly" else {"trigger": "threshold_crossed", "resolve": "resolved", "test": "test"}[alert.kind]
    return {
        "type": f"gpu_ops.budget.{kind}",
        "id": alert.idempotency_key,
        "dedup_key": alert.dedup_key,
        "test": alert.is_test,
        "budget": alert.budget,
        "scope": alert.scope,
        "period_start": alert.period_start,
        "period_end": alert.period_end,
        "threshold": alert.threshold,
        "basis": alert.basis,
        "threshold_usd": round(alert.threshold_usd, 2),
        "severity": alert.severity,
        "amount_usd": round(alert.amount_usd, 2),
        "spend_usd": round(alert.spend_usd, 2),
        "percent_used": round(alert.percent_used, 2),
        "forecast_usd": None if alert.forecast_usd is None else round(alert.forecast_usd, 2),
        "enforcement": alert.enforcement,
        "top_spenders": [{"name": n, "cost_usd": round(c, 2)} for n, c in alert.top_spenders],
        "as_of": alert.as_of,
        "url": alert.asset_url,
    }


def webhook_body(alert: Alert) -> bytes:
    return json.dumps(webhook_payload(alert), sort_keys=True, separators=(",", ":")).encode()


def sign(secret: str, timestamp: str, body: bytes) -> str:
    """``v1=<hex HMAC-SHA256 of "<timestamp>.<body>">``: a replayed body with a new
    timestamp, or a new body with an old signature, does not verify."""
    mac = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256)
    return "v1=" + mac.hexdigest()


def verify(secret: str, timestamp: str, body: bytes, signature: str, *, now: float | None = None, tolerance_s: int = SIGNATURE_TOLERANCE_S) -> bool:
    """What a receiver runs: constant-time compare, and reject stale timestamps. The
    timestamp and signature are the sender's headers as received: one that is missing
    (None), not ASCII text or not a number is a request that does not verify (False),
    never an exception."""
    if not (isinstance(timestamp, str) and isinstance(signature, str) and timestamp.isascii() and signature.isascii()):
        return False
    try:
        age = abs((now if now is not None else time.time()) - int(timestamp))
    except ValueError:  # not a number, or past int()'s 4,300 digits
        return False
    return age <= tolerance_s and hmac.compare_digest(sign(secret, timestamp, bytes(body)), signature)


verify_webhook_signature = verify  # the name exported as gpu_ops.verify_webhook_signature


def webhook_request(alert: Alert, secret: str | None, *, now: float | None = None) -> tuple[dict[str, str], bytes]:
    body = webhook_body(alert)
    timestamp = str(int(now if now is not None else time.time()))
    headers = {"Content-Type": "application/json", IDEMPOTENCY_HEADER: alert.idempotency_key, TIMESTAMP_HEADER: timestamp}
    if secret:
        headers[SIGNATURE_HEADER] = sign(secret, timestamp, body)
    return headers, body


def email_message(alert: Alert, sender: str, to: list[str]) -> EmailMessage:
    msg = EmailMessage()
    msg["Subject"] = alert.summary()
    msg["From"] = sender
    msg["To"] = ", ".join(to)
    msg["Date"] = format_datetime(dt.datetime.now(dt.timezone.utc))
    # Derived from the idempotency key: a resent copy has the same Message-ID, which
    # mail systems use to collapse duplicates.
    digest = hashlib.sha256(alert.idempotency_key.encode()).hexdigest()[:32]
    msg["Message-ID"] = f"<{digest}@gpu-ops>"
    msg["X-GPU-Ops-Idempotency-Key"] = alert.idempotency_key
    width = max(len(k) for k, _ in facts(alert))
    lines = []
    if alert.is_test:
        lines += ["THIS IS A TEST NOTIFICATION from `gpu-ops alerts test`; no budget was crossed.", ""]
    lines.append(alert.summary())
    lines.append("")
    lines += [f"{k.ljust(width)}  {v}" for k, v in facts(alert)]
    if alert.top_spenders and alert.kind != "resolve":
        lines += ["", "Top spenders this period:"] + [f"  - {n}: {money(c)}" for n, c in alert.top_spenders]
    lines += ["", f"Details: {alert.asset_url}", f"Reference: {alert.dedup_key}"]
    msg.set_content("\n".join(lines) + "\n")
    return msg


def log_line(alert: Alert) -> str:
    return f"{alert.summary()} [scope {alert.scope_label}; period {alert.period_label}; forecast {_forecast_text(alert)}; {alert.dedup_key}]"


__all__ = [
    "IDEMPOTENCY_HEADER",
    "SIGNATURE_HEADER",
    "TIMESTAMP_HEADER",
    "email_message",
    "facts",
    "log_line",
    "pagerduty_event",
    "sign",
    "slack_payload",
    "verify",
    "verify_webhook_signature",
    "webhook_body",
    "webhook_payload",
    "webhook_request",
]
