"""Notification bodies and webhook signing (pure)."""

from __future__ import annotations

import json

from gpu_ops.domain.alerts import messages
from gpu_ops.domain.alerts.model import Alert, test_alert


def alert(**kw) -> Alert:
    base = dict(
        kind="trigger", budget="nlp-monthly", period_start="2026-11-01", period_end="2026-12-01",
        threshold="actual-80pct", basis="actual", threshold_usd=12_000.0, severity="warning",
        amount_usd=15_000.0, spend_usd=12_345.67, percent_used=82.3, forecast_usd=16_100.0,
        scope={"team": "nlp"}, channels=("slack",), partition_key="2026-11-19",
        top_spenders=(("project=llm", 9_000.0), ("project=ner", 3_345.67)), dagster_url="http://dagster.example:3000/",
    )
    base.update(kw)
    return Alert(**base)


def test_keys_are_derived_and_shared_by_trigger_and_resolve():
    t, r = alert(), alert(kind="resolve")
    assert t.run_key == "nlp-monthly/2026-11-01/actual-80pct"
    assert r.run_key == "nlp-monthly/2026-11-01/actual-80pct/resolve"
    assert t.dedup_key == r.dedup_key == "gpu-ops/nlp-monthly/2026-11-01/actual-80pct"
    assert t.idempotency_key != r.idempotency_key
    assert alert(episode=2).run_key == "nlp-monthly/2026-11-01/actual-80pct#2"
    assert Alert.from_dict(json.loads(json.dumps(t.to_dict()))) == t


def test_slack_message_is_readable():
    payload = messages.slack_payload(alert())
    text = json.dumps(payload, ensure_ascii=False)
    assert payload["text"] == "GPU budget nlp-monthly: spend $12,345.67 of $15,000.00 (82.3%) crossed 80% of budget ($12,000.00)"
    header = payload["blocks"][0]
    assert header["type"] == "header" and "nlp-monthly: 82% of budget used" in header["text"]["text"]
    fields = {f["text"].split("\n")[0]: f["text"].split("\n")[1] for f in payload["blocks"][1]["fields"]}
    assert fields == {
        "*Budget*": "nlp-monthly",
        "*Scope*": "team=nlp",
        "*Period*": "2026-11-01 to 2026-11-30",
        "*Spend*": "$12,345.67 of $15,000.00",
        "*Used*": "82.3%",
        "*Forecast*": "$16,100.00 (107% of budget)",
        "*Threshold*": "80% of budget ($12,000.00) (warning)",
    }
    assert "• project=llm: $9,000.00" in text
    button = next(b for b in payload["blocks"] if b["type"] == "actions")["elements"][0]
    assert button["url"] == "http://dagster.example:3000/assets/gpu_budget_status?view=partitions&partition=2026-11-19"
    no_forecast = json.dumps(messages.slack_payload(alert(forecast_usd=None)))
    assert "too little history" in no_forecast


def test_test_notifications_are_clearly_marked():
    a = test_alert("slack", "http://d")
    assert a.summary().startswith("[TEST] ")
    slack = json.dumps(messages.slack_payload(a))
    assert "[TEST]" in slack and "test notification" in slack
    assert "TEST NOTIFICATION" in messages.email_message(a, "a@b", ["c@d"]).get_content()
    assert messages.webhook_payload(a)["test"] is True and messages.webhook_payload(a)["type"] == "gpu_ops.budget.test"


def test_pagerduty_trigger_and_resolve():
    trig = messages.pagerduty_event(alert(severity="critical"), "RKEY")
    res = messages.pagerduty_event(alert(kind="resolve"), "RKEY")
    assert trig["event_action"] == "trigger" and res["event_action"] == "resolve"
    assert trig["dedup_key"] == res["dedup_key"]
    assert trig["payload"]["severity"] == "critical" and trig["payload"]["source"] == "gpu-ops"
    assert len(trig["payload"]["summary"]) <= 1024
    assert set(res) == {"routing_key", "event_action", "dedup_key"}


def test_webhook_signature_covers_timestamp_and_body():
    headers, body = messages.webhook_request(alert(), "s3cret", now=1_700_000_000)
    ts, sig = headers["X-GPU-Ops-Timestamp"], headers["X-GPU-Ops-Signature"]
    assert headers["Idempotency-Key"] == "gpu-ops/nlp-monthly/2026-11-01/actual-80pct/trigger"
    assert messages.verify("s3cret", ts, body, sig, now=1_700_000_010)
    assert not messages.verify("s3cret", ts, body + b" ", sig, now=1_700_000_010)
    assert not messages.verify("s3cret", str(int(ts) + 1), body, sig, now=1_700_000_010)
    assert not messages.verify("other", ts, body, sig, now=1_700_000_010)
    assert not messages.verify("s3cret", ts, body, sig, now=1_700_000_000 + 3600)  # replayed later
    assert json.loads(body)["spend_usd"] == 12345.67


def test_a_receiver_given_a_forged_or_missing_header_gets_false_not_an_exception():
    """What a receiver hands over comes from the sender: a header that is missing (None),
    not ASCII, or a timestamp of 5,000 digits is a request that does not verify (a
    TypeError from hmac.compare_digest or int() was a 500 in the receiver)."""
    headers, body = messages.webhook_request(alert(), "s3cret", now=1_700_000_000)
    ts, sig = headers["X-GPU-Ops-Timestamp"], headers["X-GPU-Ops-Signature"]
    for forged_ts, forged_sig in ((None, sig), (ts, None), (ts, "v1=\u00e9" + sig[4:]), ("9" * 5000, sig), ("\u0661\u0662", sig), (ts, b"v1=00")):
        assert messages.verify("s3cret", forged_ts, body, forged_sig, now=1_700_000_010) is False  # type: ignore[arg-type]
    assert messages.verify("s3cret", ts, bytearray(body), sig, now=1_700_000_010)  # a framework's bytearray body is bytes enough


def test_email_message():
    msg = messages.email_message(alert(), "gpu-ops@example.com", ["finops@example.com"])
    assert msg["Subject"].startswith("GPU budget nlp-monthly")
    body = msg.get_content()
    assert "Spend      $12,345.67 of $15,000.00" in body and "project=llm: $9,000.00" in body
    again = messages.email_message(alert(), "gpu-ops@example.com", ["finops@example.com"])
    assert msg["Message-ID"] == again["Message-ID"]  # a resent copy collapses
