"""Delivery through real receivers on 127.0.0.1: retries, failures, secrets, SMTP."""

from __future__ import annotations

import datetime as dt
import email
import json
import logging
import ssl
from pathlib import Path

import pytest

from gpu_ops.domain.alerts import messages
from gpu_ops.flows.alerts.channels import DeliverySettings, Redactor, deliver, send
from gpu_ops.domain.alerts.model import Alert
from gpu_ops.flows.compute.local import free_port
from gpu_ops.domain.config import EmailChannel, PagerDutyChannel, SlackChannel, WebhookChannel

FAST = DeliverySettings(attempts=3, backoff_s=0.02, timeout_s=0.4)
SLACK_TOKEN = "T0000/B0000/XoXbSeCrEtToKeN"
PD_KEY = "R0UT1NGKEYR0UT1NGKEYR0UT1NGKEY00"
HOOK_SECRET = "whsec-very-secret-value"


def alert(channels: tuple[str, ...], **kw) -> Alert:
    base = dict(
        kind="trigger", budget="nlp-monthly", period_start="2026-11-01", period_end="2026-12-01",
        threshold="actual-80pct", basis="actual", threshold_usd=12_000.0, severity="warning",
        amount_usd=15_000.0, spend_usd=12_500.0, percent_used=83.3, forecast_usd=None,
        scope={"team": "nlp"}, channels=channels, partition_key="2026-11-19",
    )
    base.update(kw)
    return Alert(**base)


@pytest.fixture
def secrets(monkeypatch):
    def set_env(slack_base: str) -> None:
        monkeypatch.setenv("SLACK_WEBHOOK_URL", f"{slack_base}/services/{SLACK_TOKEN}")
        monkeypatch.setenv("PD_ROUTING_KEY", PD_KEY)
        monkeypatch.setenv("HOOK_SECRET", HOOK_SECRET)

    return set_env


def test_500_twice_then_200_is_delivered_once(receiver):
    r = receiver([500, 500])
    ch = {"slack": SlackChannel(type="slack", webhook_url=r.url + "/hook")}
    result = send("slack", ch["slack"], alert(("slack",)), settings=FAST, redact=Redactor(ch))
    assert result.ok and result.attempts == 3
    assert [x.status for x in r.requests] == [500, 500, 200]
    assert len(r.acknowledged) == 1
    assert len({x.body for x in r.requests}) == 1


def test_timeout_is_retried_with_the_same_idempotency_key(receiver, monkeypatch):
    monkeypatch.setenv("HOOK_SECRET", HOOK_SECRET)
    r = receiver(["hang"], hang_s=1.0)
    ch = {"hook": WebhookChannel(type="webhook", url=r.url + "/gpu", secret={"env": "HOOK_SECRET"})}
    result = send("hook", ch["hook"], alert(("hook",)), settings=FAST, redact=Redactor(ch))
    assert result.ok and result.attempts == 2
    assert [x.status for x in r.requests] == [None, 200]
    # The receiver may have seen the first copy: one key, so it processes one.
    assert {x.headers["Idempotency-Key"] for x in r.requests} == {"gpu-ops/nlp-monthly/2026-11-01/actual-80pct/trigger"}
    for x in r.requests:
        assert messages.verify(HOOK_SECRET, x.headers["X-GPU-Ops-Timestamp"], x.body, x.headers["X-GPU-Ops-Signature"])


def test_refused_channel_fails_without_blocking_the_others(receiver, secrets, monkeypatch):
    slack = receiver([500])
    pd = receiver()
    secrets(slack.url)
    port = free_port()
    channels = {
        "down": WebhookChannel(type="webhook", url=f"http://127.0.0.1:{port}/x", secret={"env": "HOOK_SECRET"}),
        "slack": SlackChannel(type="slack", webhook_url={"env": "SLACK_WEBHOOK_URL"}),
        "pd": PagerDutyChannel(type="pagerduty", routing_key={"env": "PD_ROUTING_KEY"}, events_url=pd.url + "/v2/enqueue"),
    }
    recorded = []
    results = deliver(alert(("down", "slack", "pd")), channels, settings=FAST, on_result=recorded.append)
    by = {r.channel: r for r in results}
    assert not by["down"].ok and not by["down"].permanent and by["down"].attempts == 3
    assert "connection refused" in by["down"].detail
    assert by["slack"].ok and by["pd"].ok
    assert [r.channel for r in recorded] == ["down", "slack", "pd"]
    assert len(slack.acknowledged) == 1 and len(pd.acknowledged) == 1
    # Already delivered channels are skipped on the next attempt.
    again = deliver(alert(("down", "slack", "pd")), channels, settings=FAST, skip={"slack", "pd"})
    assert [r.channel for r in again] == ["down"]
    assert len(slack.requests) == 2 and len(pd.requests) == 1


def test_client_errors_are_permanent(receiver):
    r = receiver([400])
    ch = {"slack": SlackChannel(type="slack", webhook_url=r.url + "/hook")}
    result = send("slack", ch["slack"], alert(("slack",)), settings=FAST, redact=Redactor(ch))
    assert not result.ok and result.permanent and result.attempts == 1 and "HTTP 400" in result.detail


def test_missing_secret_names_the_variable_only(monkeypatch):
    monkeypatch.delenv("PD_ROUTING_KEY", raising=False)
    ch = {"pd": PagerDutyChannel(type="pagerduty", routing_key={"env": "PD_ROUTING_KEY"})}
    result = send("pd", ch["pd"], alert(("pd",)), settings=FAST, redact=Redactor(ch))
    assert not result.ok and result.permanent and "PD_ROUTING_KEY is not set" in result.detail


def test_no_secret_in_any_body_header_log_line_or_result(receiver, secrets, caplog):
    slack = receiver([500])
    pd = receiver([503])
    hook = receiver(["hang"], hang_s=1.0)
    secrets(slack.url)
    port = free_port()
    monkey_channels = {
        "slack": SlackChannel(type="slack", webhook_url={"env": "SLACK_WEBHOOK_URL"}),
        "pd": PagerDutyChannel(type="pagerduty", routing_key={"env": "PD_ROUTING_KEY"}, events_url=pd.url + "/v2/enqueue"),
        "hook": WebhookChannel(type="webhook", url=hook.url + "/gpu", secret={"env": "HOOK_SECRET"}),
        # A Slack channel whose endpoint is down: its failure text must not carry the URL.
        "slack-down": SlackChannel(type="slack", webhook_url=f"http://127.0.0.1:{port}/services/{SLACK_TOKEN}"),
        "log": {"type": "log"},
    }
    from gpu_ops.domain.config import LogChannel

    monkey_channels["log"] = LogChannel(type="log")
    lines: list[str] = []
    caplog.set_level(logging.DEBUG)
    results = deliver(alert(tuple(monkey_channels)), monkey_channels, settings=FAST, log=lines.append)
    assert {r.channel: r.ok for r in results} == {"slack": True, "pd": True, "hook": True, "slack-down": False, "log": True}

    everything_logged = "\n".join(lines + [r.getMessage() for r in caplog.records] + [r.detail for r in results])
    for secret in (SLACK_TOKEN, PD_KEY, HOOK_SECRET):
        assert secret not in everything_logged
    assert "/services/" not in everything_logged  # URLs are cut to scheme and host
    # Each receiver sees no other channel's secret, and the webhook never sees its own.
    for rec, allowed in ((slack, set()), (pd, {PD_KEY}), (hook, set())):
        for req in rec.requests:
            blob = req.body.decode() + json.dumps(req.headers)
            for secret in {SLACK_TOKEN, PD_KEY, HOOK_SECRET} - allowed:
                assert secret not in blob
    assert json.loads(pd.requests[-1].body)["routing_key"] == PD_KEY


def test_pagerduty_trigger_and_resolve_share_the_dedup_key(receiver):
    pd = receiver()
    ch = {"pd": PagerDutyChannel(type="pagerduty", routing_key="rk-1234", events_url=pd.url + "/v2/enqueue")}
    for kind in ("trigger", "resolve"):
        assert send("pd", ch["pd"], alert(("pd",), kind=kind, severity="critical"), settings=FAST, redact=Redactor(ch)).ok
    trig, res = (json.loads(r.body) for r in pd.requests)
    assert (trig["event_action"], res["event_action"]) == ("trigger", "resolve")
    assert trig["dedup_key"] == res["dedup_key"] == "gpu-ops/nlp-monthly/2026-11-01/actual-80pct"
    assert trig["payload"]["severity"] == "critical" and pd.requests[0].path == "/v2/enqueue"


# --------------------------------------------------------------------------- e-mail


def test_email_through_a_local_smtp_server(smtp_server):
    controller, inbox = smtp_server()
    ch = EmailChannel(type="email", to=["finops@example.com", "ml@example.com"], sender="gpu-ops@example.com", smtp={"host": "127.0.0.1", "port": controller.port})
    result = send("finance", ch, alert(("finance",)), settings=FAST, redact=Redactor({"finance": ch}))
    assert result.ok, result.detail
    assert len(inbox.messages) == 1
    msg = inbox.messages[0]
    assert msg["Subject"].startswith("GPU budget nlp-monthly: spend $12,500.00")
    assert msg["To"] == "finops@example.com, ml@example.com"
    assert "Spend" in msg.get_payload()


def _self_signed(tmp_path: Path) -> tuple[Path, Path]:
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    # OpenSSL checks validity against the system clock, whatever clock the test runs on.
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(dt.datetime(2000, 1, 1, tzinfo=dt.timezone.utc))
        .not_valid_after(dt.datetime(2099, 12, 31, tzinfo=dt.timezone.utc))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = tmp_path / "smtp.crt", tmp_path / "smtp.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    return cert_path, key_path


def test_email_uses_starttls_when_offered(smtp_server, tmp_path):
    cert, key = _self_signed(tmp_path)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    controller, inbox = smtp_server(tls_context=context, require_starttls=True)
    ch = EmailChannel(type="email", to=["finops@example.com"], smtp={"host": "127.0.0.1", "port": controller.port, "ca_file": str(cert)})
    result = send("finance", ch, alert(("finance",)), settings=FAST, redact=Redactor({"finance": ch}))
    assert result.ok, result.detail
    assert len(inbox.messages) == 1
    # With STARTTLS turned off the server (which requires it) refuses: permanent, clear.
    plain = EmailChannel(type="email", to=["finops@example.com"], smtp={"host": "127.0.0.1", "port": controller.port, "starttls": "never"})
    refused = send("finance", plain, alert(("finance",)), settings=FAST, redact=Redactor({"finance": plain}))
    assert not refused.ok and refused.permanent and "SMTP 530" in refused.detail
    # An untrusted certificate is a permanent failure, not a silent downgrade.
    untrusted = EmailChannel(type="email", to=["finops@example.com"], smtp={"host": "127.0.0.1", "port": controller.port})
    bad = send("finance", untrusted, alert(("finance",)), settings=FAST, redact=Redactor({"finance": untrusted}))
    assert not bad.ok and bad.permanent and "STARTTLS" in bad.detail
    assert len(inbox.messages) == 1


def test_smtp_server_down_is_retried_and_reported(tmp_path):
    ch = EmailChannel(type="email", to=["finops@example.com"], smtp={"host": "127.0.0.1", "port": free_port()})
    result = send("finance", ch, alert(("finance",)), settings=FAST, redact=Redactor({"finance": ch}))
    assert not result.ok and not result.permanent and result.attempts == 3


def test_email_module_parses_our_message():
    msg = messages.email_message(alert(("x",)), "a@example.com", ["b@example.com"])
    parsed = email.message_from_bytes(msg.as_bytes())
    assert parsed["X-GPU-Ops-Idempotency-Key"] == "gpu-ops/nlp-monthly/2026-11-01/actual-80pct/trigger"
