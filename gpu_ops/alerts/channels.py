"""Sending one alert through one configured channel, with retries. No Dagster.

- Retried with exponential backoff: HTTP 5xx and 429, timeouts, refused or reset
  connections, SMTP 4xx replies and dropped SMTP sessions. Not retried: other 4xx (a
  wrong routing key stays wrong), SMTP 5xx, TLS certificate errors.
- A delivery counts as sent only on a 2xx reply (SMTP: the server accepted the message).
- Nothing here raises with a secret in it: every message that leaves this module (result
  details, log lines, exceptions) goes through :class:`Redactor`, which masks every
  channel secret known to the configuration and shortens URLs to scheme and host.
  Library exceptions are never passed on as they are, because httpx puts the full URL
  (a Slack webhook URL *is* the secret) into its messages.
"""

from __future__ import annotations

import json
import logging
import random
import re
import smtplib
import socket
import ssl
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import httpx

from gpu_ops.alerts import messages
from gpu_ops.alerts.model import Alert
from gpu_ops.config import (
    AlertsConfig,
    ConfigError,
    EmailChannel,
    LiteralSecret,
    LogChannel,
    PagerDutyChannel,
    SecretRef,
    SlackChannel,
    WebhookChannel,
    redact_url,
)

logger = logging.getLogger("gpu_ops.alerts")
_URL_PATH = re.compile(r"\b([a-zA-Z][a-zA-Z0-9+.-]*://[^\s/'\"]+)/[^\s'\"]*")


class _UrlPathScrubber(logging.Filter):
    """httpx logs every request's full URL at INFO; a Slack webhook URL *is* a secret."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        scrubbed = _URL_PATH.sub(lambda m: f"{m.group(1)}/…", message)
        if scrubbed != message:
            record.msg, record.args = scrubbed, ()
        return True


for _name in ("httpx", "httpcore"):
    if not any(isinstance(f, _UrlPathScrubber) for f in logging.getLogger(_name).filters):
        logging.getLogger(_name).addFilter(_UrlPathScrubber())
AnyChannel = SlackChannel | PagerDutyChannel | WebhookChannel | EmailChannel | LogChannel
Log = Callable[[str], None]


class Redactor:
    """Masks every secret the configured channels hold, wherever it appears in a text."""

    def __init__(self, channels: Mapping[str, AnyChannel]):
        urls: set[str] = set()
        plain: set[str] = set()
        for ch in channels.values():
            for attr in ("webhook_url", "url"):
                value = _secret_value(getattr(ch, attr, None))
                if value:
                    urls.add(value)
            for attr in ("routing_key", "secret"):
                value = _secret_value(getattr(ch, attr, None))
                if value:
                    plain.add(value)
            for header in (getattr(ch, "headers", None) or {}).values():
                value = _secret_value(header)
                if value:
                    plain.add(value)
            smtp = getattr(ch, "smtp", None)
            value = _secret_value(getattr(smtp, "password", None)) if smtp else None
            if value:
                plain.add(value)
        # Longest first, so a URL is replaced before a token inside it.
        self._subs = sorted(((u, redact_url(u)) for u in urls), key=lambda p: -len(p[0]))
        self._subs += sorted(((p, "***") for p in plain if len(p) >= 4), key=lambda p: -len(p[0]))

    def __call__(self, text: str) -> str:
        for secret, replacement in self._subs:
            text = text.replace(secret, replacement)
        # Also any URL's path and query, in case a library echoes a redirect target.
        return _URL_PATH.sub(lambda m: f"{m.group(1)}/…", text)


def _secret_value(secret: SecretRef | LiteralSecret | None) -> str | None:
    if secret is None:
        return None
    try:
        return secret.get()
    except ConfigError:
        return None  # unset: nothing to hide


@dataclass(frozen=True)
class DeliverySettings:
    attempts: int = 4
    backoff_s: float = 1.0
    timeout_s: float = 10.0

    @classmethod
    def from_config(cls, alerts: AlertsConfig) -> "DeliverySettings":
        return cls(alerts.delivery_attempts, alerts.delivery_backoff_s, alerts.delivery_timeout_s)


@dataclass(frozen=True)
class DeliveryResult:
    channel: str
    channel_type: str
    ok: bool
    attempts: int
    detail: str  # redacted: safe for logs, metadata and exceptions
    permanent: bool = False  # a failure that retrying will not fix


class _Retryable(Exception):
    pass


class _Permanent(Exception):
    pass


def _http_post(client: httpx.Client, url: str, *, headers: dict[str, str], content: bytes) -> str:
    """One POST; returns a short description on 2xx, raises _Retryable/_Permanent otherwise."""
    try:
        resp = client.post(url, headers=headers, content=content)
    except httpx.TimeoutException as exc:
        raise _Retryable(f"timed out ({type(exc).__name__})") from None
    except httpx.ConnectError:
        raise _Retryable("connection refused or unreachable") from None
    except (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError) as exc:
        raise _Retryable(f"connection dropped ({type(exc).__name__})") from None
    except httpx.HTTPError as exc:
        raise _Permanent(f"request failed ({type(exc).__name__})") from None
    if 200 <= resp.status_code < 300:
        return f"HTTP {resp.status_code}"
    snippet = resp.text[:200].replace("\n", " ")
    if resp.status_code >= 500 or resp.status_code in (408, 429):
        retry_after = resp.headers.get("Retry-After", "")
        retryable = _Retryable(f"HTTP {resp.status_code}: {snippet}")
        retryable.retry_after = float(retry_after) if retry_after.isdigit() else None  # type: ignore[attr-defined]
        raise retryable
    raise _Permanent(f"HTTP {resp.status_code}: {snippet}")


def _with_retries(attempt: Callable[[], str], settings: DeliverySettings, describe: str, log: Log, redact: Redactor) -> tuple[bool, int, str, bool]:
    delay = settings.backoff_s
    last = ""
    for n in range(1, settings.attempts + 1):
        try:
            return True, n, attempt(), False
        except _Permanent as exc:
            return False, n, str(exc), True
        except _Retryable as exc:
            last = str(exc)
            if n == settings.attempts:
                break
            wait = getattr(exc, "retry_after", None) or delay
            wait = min(wait, settings.backoff_s * 16) * random.uniform(0.8, 1.2)
            log(redact(f"{describe}: attempt {n} of {settings.attempts} failed ({last}); retrying in {wait:.1f}s"))
            time.sleep(wait)
            delay *= 2
    return False, settings.attempts, f"{last} (after {settings.attempts} attempts)", False


def send(name: str, channel: AnyChannel, alert: Alert, *, settings: DeliverySettings, redact: Redactor, log: Log | None = None) -> DeliveryResult:
    """Deliver ``alert`` through one channel; never raises for delivery problems."""
    log = log or (lambda line: logger.warning(line))
    try:
        ok, attempts, detail, permanent = _send(name, channel, alert, settings, redact, log)
    except ConfigError as exc:  # an unset environment variable: names the variable only
        ok, attempts, detail, permanent = False, 0, str(exc), True
    except Exception as exc:  # a bug or an unexpected library error: reported, redacted
        ok, attempts, detail, permanent = False, 1, f"unexpected {type(exc).__name__}: {exc}", False
    return DeliveryResult(name, channel.type, ok, attempts, redact(detail), permanent)


def _send(name: str, channel: AnyChannel, alert: Alert, settings: DeliverySettings, redact: Redactor, log: Log) -> tuple[bool, int, str, bool]:
    describe = f"{channel.type} channel {name!r}"
    if isinstance(channel, LogChannel):
        log(messages.log_line(alert))  # the op's Dagster log, the CLI's stderr, else `gpu_ops.alerts`
        return True, 1, "written to the log", False

    if isinstance(channel, EmailChannel):
        return _with_retries(lambda: _send_email(channel, alert, settings), settings, describe, log, redact)

    if isinstance(channel, SlackChannel):
        url = channel.webhook_url.get()
        headers = {"Content-Type": "application/json"}
        body = _json(messages.slack_payload(alert))
    elif isinstance(channel, PagerDutyChannel):
        url = channel.events_url
        headers = {"Content-Type": "application/json"}
        body = _json(messages.pagerduty_event(alert, channel.routing_key.get()))
    elif isinstance(channel, WebhookChannel):
        url = channel.url.get()
        secret = channel.secret.get() if channel.secret else None
        headers, body = messages.webhook_request(alert, secret)
        headers = {**{k: v.get() for k, v in channel.headers.items()}, **headers}
    else:  # pragma: no cover - the config model admits no other type
        raise TypeError(f"unknown channel type {type(channel).__name__}")

    with httpx.Client(timeout=settings.timeout_s, follow_redirects=False) as client:
        ok, attempts, detail, permanent = _with_retries(
            lambda: _http_post(client, url, headers=headers, content=body), settings, describe, log, redact
        )
    return ok, attempts, f"{detail} from {redact_url(url)}", permanent


def _json(payload: object) -> bytes:
    return json.dumps(payload, separators=(",", ":")).encode()


def _send_email(channel: EmailChannel, alert: Alert, settings: DeliverySettings) -> str:
    smtp = channel.smtp
    msg = messages.email_message(alert, channel.sender, channel.to)
    try:
        with smtplib.SMTP(smtp.host, smtp.port, timeout=min(smtp.timeout_s, settings.timeout_s)) as server:
            server.ehlo()
            offered = server.has_extn("starttls")
            if smtp.starttls == "always" and not offered:
                raise _Permanent(f"{smtp.host}:{smtp.port} does not offer STARTTLS and smtp.starttls is 'always'")
            if offered and smtp.starttls != "never":
                context = ssl.create_default_context(cafile=smtp.ca_file)
                server.starttls(context=context)
                server.ehlo()
            if smtp.username:
                if smtp.password is None:
                    raise _Permanent("smtp.username is set but smtp.password is not")
                server.login(smtp.username, smtp.password.get())
            refused = server.send_message(msg)
    except (_Permanent, _Retryable, ConfigError):
        raise
    except ssl.SSLError as exc:
        raise _Permanent(f"STARTTLS with {smtp.host}:{smtp.port} failed: {exc.reason or type(exc).__name__}") from None
    except smtplib.SMTPResponseException as exc:
        text = exc.smtp_error.decode(errors="replace") if isinstance(exc.smtp_error, bytes) else str(exc.smtp_error)
        err = f"SMTP {exc.smtp_code} from {smtp.host}:{smtp.port}: {text[:200]}"
        raise (_Retryable(err) if 400 <= exc.smtp_code < 500 else _Permanent(err)) from None
    except smtplib.SMTPRecipientsRefused as exc:
        raise _Permanent(f"{smtp.host}:{smtp.port} refused every recipient ({len(exc.recipients)})") from None
    except (smtplib.SMTPServerDisconnected, socket.timeout, TimeoutError, ConnectionError, OSError) as exc:
        raise _Retryable(f"{smtp.host}:{smtp.port}: {type(exc).__name__}") from None
    if refused:
        raise _Permanent(f"{smtp.host}:{smtp.port} refused {len(refused)} of {len(channel.to)} recipients")
    return f"accepted by {smtp.host}:{smtp.port} for {len(channel.to)} recipient(s)"


def deliver(
    alert: Alert,
    channels: Mapping[str, AnyChannel],
    *,
    settings: DeliverySettings,
    skip: set[str] = frozenset(),  # type: ignore[assignment]
    log: Log | None = None,
    on_result: Callable[[DeliveryResult], None] | None = None,
) -> list[DeliveryResult]:
    """Send to every channel the alert names, except ``skip``; one failure never stops
    the others. ``on_result`` runs right after each channel, so a success is recorded
    before the next channel is tried."""
    redact = Redactor(channels)
    results = []
    for name in alert.channels:
        if name in skip:
            continue
        channel = channels.get(name)
        if channel is None:
            result = DeliveryResult(name, "?", False, 0, f"no channel named {name!r} in the configuration", True)
        else:
            result = send(name, channel, alert, settings=settings, redact=redact, log=log)
        results.append(result)
        if on_result:
            on_result(result)
    return results
