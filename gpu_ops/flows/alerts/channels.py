"""Sending one alert through one configured channel, with retries. No Dagster. Nothing here
raises with a secret in it (:class:`Redactor`).

Design: docs/concepts/budgets-and-alerts.md#channels
"""

from __future__ import annotations

import datetime as dt
import email.utils
import json
import logging
import random
import re
import smtplib
import socket
import ssl
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from gpu_ops.domain.alerts import messages
from gpu_ops.domain.alerts.model import Alert
from gpu_ops.flows.bounded_http import Bounds, RemoteError, Watchdog, exchange
from gpu_ops.domain.config import (
    AlertsConfig,
    ConfigError,
    EmailChannel,
    LiteralSecret,
    LogChannel,
    PagerDutyChannel,
    SecretRef,
    SlackChannel,
    WebhookChannel,
)
from gpu_ops.domain.formatting import redact_url, redact_urls

logger = logging.getLogger("gpu_ops.alerts")
_DELTA_SECONDS = re.compile(r"[0-9]{1,10}", re.ASCII)
SNIPPET_CHARS = 200
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
        # Also any other URL's userinfo, path and query, in case a library echoes a redirect target.
        return redact_urls(text)


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
    timeout_s: float = 10.0  # total per request (connect to last byte), not per read
    max_response_bytes: int = 65_536  # of an answer's body; a 2xx answer's body is not read at all

    @classmethod
    def from_config(cls, alerts: AlertsConfig) -> "DeliverySettings":
        return cls(alerts.delivery_attempts, alerts.delivery_backoff_s, alerts.delivery_timeout_s, alerts.delivery_max_response_bytes)

    @property
    def bounds(self) -> Bounds:
        return Bounds(self.timeout_s, self.max_response_bytes)


@dataclass(frozen=True)
class DeliveryResult:
    """What one delivery came to. Built without its channel while it is tried
    (:func:`_with_retries` knows only the attempts); :func:`send` names the channel."""

    channel: str
    channel_type: str
    ok: bool
    attempts: int
    detail: str  # redacted: safe for logs, metadata and exceptions
    permanent: bool = False  # a failure that retrying will not fix
    # A failed delivery whose request may still have arrived (a timeout or a dropped
    # connection after it was sent): at-least-once, redelivered with the same keys.
    maybe_delivered: bool = False


class _Retryable(Exception):
    def __init__(self, text: str, *, retry_after: float | None = None, maybe_delivered: bool = False):
        super().__init__(text)
        self.retry_after, self.maybe_delivered = retry_after, maybe_delivered


class _Permanent(Exception):
    pass


def parse_retry_after(value: str | None, now: dt.datetime | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` value: delta-seconds (ASCII digits only) or
    an HTTP-date (RFC 9110); anything else (``²``, ``-5``, ``1.5``, a date without a zone)
    is None: ignored, never an error."""
    text = (value or "").strip()
    if _DELTA_SECONDS.fullmatch(text):
        return float(text)
    if not text or text[0].isdigit():
        return None
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when.tzinfo is None:
        return None
    return max(0.0, (when - (now or dt.datetime.now(dt.timezone.utc))).total_seconds())


def _http_post(url: str, *, headers: dict[str, str], content: bytes, settings: DeliverySettings) -> str:
    """One POST within the settings' bounds; a short description on 2xx, else raises
    _Retryable/_Permanent. A 2xx answer's body is never read (the status says it all)."""
    try:
        with exchange("POST", url, bounds=settings.bounds, headers=headers, body=content) as answer:
            if 200 <= answer.status < 300:
                return f"HTTP {answer.status}"
            status, retry_after = answer.status, parse_retry_after(answer.headers.get("Retry-After"))
            try:
                snippet = answer.read(cut_at_cap=True).body[: SNIPPET_CHARS * 4].decode(errors="replace")[:SNIPPET_CHARS].replace("\n", " ")
            except RemoteError as exc:  # the status is known; the body did not come in time
                snippet = f"(answer body unread: {exc.what})"
    except RemoteError as exc:
        if exc.kind == "protocol" and not exc.sent:  # an untrusted certificate stays untrusted
            raise _Permanent(exc.what) from None
        if exc.sent and exc.kind in ("deadline", "dropped", "protocol"):
            raise _Retryable(f"{exc.what}; the receiver may have it (retried with the same idempotency key)", maybe_delivered=True) from None
        raise _Retryable(exc.what) from None
    if status >= 500 or status in (408, 429):
        raise _Retryable(f"HTTP {status}: {snippet}", retry_after=retry_after)
    raise _Permanent(f"HTTP {status}: {snippet}")


def _outcome(ok: bool, attempts: int, detail: str, permanent: bool = False, maybe_delivered: bool = False) -> DeliveryResult:
    """A delivery's result before :func:`send` names its channel."""
    return DeliveryResult("", "", ok, attempts, detail, permanent, maybe_delivered)


def _with_retries(attempt: Callable[[], str], settings: DeliverySettings, describe: str, log: Log, redact: Redactor) -> DeliveryResult:
    delay = settings.backoff_s
    last, maybe = "", False
    for n in range(1, settings.attempts + 1):
        try:
            return _outcome(True, n, attempt())
        except _Permanent as exc:
            return _outcome(False, n, str(exc), permanent=True, maybe_delivered=maybe)
        except _Retryable as exc:
            last, maybe = str(exc), maybe or exc.maybe_delivered
            if n == settings.attempts:
                break
            wait = min(exc.retry_after if exc.retry_after is not None else delay, settings.backoff_s * 16) * random.uniform(0.8, 1.2)
            log(redact(f"{describe}: attempt {n} of {settings.attempts} failed ({last}); retrying in {wait:.1f}s"))
            time.sleep(wait)
            delay *= 2
    return _outcome(False, settings.attempts, f"{last} (after {settings.attempts} attempts)", maybe_delivered=maybe)


def send(name: str, channel: AnyChannel, alert: Alert, *, settings: DeliverySettings, redact: Redactor, log: Log | None = None) -> DeliveryResult:
    """Deliver ``alert`` through one channel; never raises for delivery problems."""
    log = log or (lambda line: logger.warning(line))
    try:
        out = _send(name, channel, alert, settings, redact, log)
    except ConfigError as exc:  # an unset environment variable: names the variable only
        out = _outcome(False, 0, str(exc), permanent=True)
    except Exception as exc:  # a bug or an unexpected library error: reported, redacted
        out = _outcome(False, 1, f"unexpected {type(exc).__name__}: {exc}")
    return replace(out, channel=name, channel_type=channel.type, detail=redact(out.detail))


def _request(alert: Alert, channel: SlackChannel | PagerDutyChannel | WebhookChannel) -> tuple[str, dict[str, str], bytes]:
    """URL, headers and body of one channel's POST; the same for every attempt."""
    key = {messages.IDEMPOTENCY_HEADER: alert.idempotency_key}
    if isinstance(channel, SlackChannel):
        return channel.webhook_url.get(), {"Content-Type": "application/json", **key}, _json(messages.slack_payload(alert))
    if isinstance(channel, PagerDutyChannel):
        return channel.events_url, {"Content-Type": "application/json", **key}, _json(messages.pagerduty_event(alert, channel.routing_key.get()))
    secret = channel.secret.get() if channel.secret else None
    headers, body = messages.webhook_request(alert, secret)
    return channel.url.get(), {**{k: v.get() for k, v in channel.headers.items()}, **headers}, body


def _send(name: str, channel: AnyChannel, alert: Alert, settings: DeliverySettings, redact: Redactor, log: Log) -> DeliveryResult:
    describe = f"{channel.type} channel {name!r}"
    if isinstance(channel, LogChannel):
        log(messages.log_line(alert))  # the op's Dagster log, the CLI's stderr, else `gpu_ops.alerts`
        return _outcome(True, 1, "written to the log")
    if isinstance(channel, EmailChannel):
        return _with_retries(lambda: _send_email(channel, alert, settings), settings, describe, log, redact)
    url, headers, body = _request(alert, channel)
    out = _with_retries(lambda: _http_post(url, headers=headers, content=body, settings=settings), settings, describe, log, redact)
    return replace(out, detail=f"{out.detail} from {redact_url(url)}")


def _json(payload: object) -> bytes:
    return json.dumps(payload, separators=(",", ":")).encode()


def _send_email(channel: EmailChannel, alert: Alert, settings: DeliverySettings) -> str:
    smtp = channel.smtp
    msg = messages.email_message(alert, channel.sender, channel.to)
    timeout = min(smtp.timeout_s, settings.timeout_s)
    watchdog = Watchdog(time.monotonic() + timeout)  # the whole SMTP session, not each reply
    try:
        with _WatchedSMTP(watchdog, smtp.host, smtp.port, timeout=timeout) as server:
            refused = _smtp_session(server, channel, msg)
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
        if watchdog.fired:
            raise _Retryable(f"{smtp.host}:{smtp.port}: no complete SMTP session within {timeout:g} s") from None
        raise _Retryable(f"{smtp.host}:{smtp.port}: {type(exc).__name__}") from None
    finally:
        watchdog.close()
    if refused:
        raise _Permanent(f"{smtp.host}:{smtp.port} refused {len(refused)} of {len(channel.to)} recipients")
    return f"accepted by {smtp.host}:{smtp.port} for {len(channel.to)} recipient(s)"


class _WatchedSMTP(smtplib.SMTP):
    """An SMTP client whose socket is watched from the moment it connects (the server's
    greeting is read inside the constructor: a greeting trickled byte by byte is bounded too)."""

    def __init__(self, watchdog: Watchdog, host: str, port: int, timeout: float):
        self._watchdog = watchdog
        super().__init__(host, port, timeout=timeout)

    def _get_socket(self, host: str, port: int, timeout: float) -> socket.socket:
        sock = super()._get_socket(host, port, timeout)  # type: ignore[misc]  # smtplib's socket factory, absent from typeshed
        self._watchdog.watch(sock)
        return sock


def _smtp_session(server: smtplib.SMTP, channel: EmailChannel, msg: Any) -> dict[str, Any]:
    """EHLO, STARTTLS as configured, login, send; the recipients the server refused."""
    smtp = channel.smtp
    server.ehlo()
    offered = server.has_extn("starttls")
    if smtp.starttls == "always" and not offered:
        raise _Permanent(f"{smtp.host}:{smtp.port} does not offer STARTTLS and smtp.starttls is 'always'")
    if offered and smtp.starttls != "never":
        server.starttls(context=ssl.create_default_context(cafile=smtp.ca_file))
        server.ehlo()
    if smtp.username:
        if smtp.password is None:
            raise _Permanent("smtp.username is set but smtp.password is not")
        server.login(smtp.username, smtp.password.get())
    return dict(server.send_message(msg))


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
