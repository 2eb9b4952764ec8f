"""How figures read, everywhere gpu_ops shows them (CLI, demo, logs, asset metadata): money
to the cent, hours to three decimals, percentages to one, and a missing figure said as
``n/a``, never ``NaN``; and how a file that is not UTF-8 text is said
(:func:`not_utf8`); and how a URL is said in any message (:func:`redact_url`,
:func:`redact_urls`): never with its userinfo or query. Pure: no Dagster, no pandas import.

Two kinds of helpers: ``round_*`` give numbers (for metadata the UI plots and sorts; None
when there is no figure) and the others give text (for logs and terminals).
"""

from __future__ import annotations

import math
import re
import urllib.parse
from collections.abc import Callable, Sequence
from typing import Any

MISSING = "n/a"


def first_of(items: Sequence[str], n: int) -> str:
    """The first ``n`` of ``items`` joined by commas, and how many more there are."""
    return ", ".join(items[:n]) + (f" and {len(items) - n} more" if len(items) > n else "")


def finite(value: Any) -> float | None:
    """``value`` as a float, or None when there is no figure (None, NaN, ±inf, not a number)."""
    if value is None or isinstance(value, bool):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def not_utf8(exc: UnicodeDecodeError) -> str:
    """The reason a file that failed to decode as UTF-8 is refused, naming the first bad
    byte and its offset (a usage CSV, a YAML file): ``not UTF-8 text (byte b'\\xe9' at offset 41)``."""
    return f"not UTF-8 text (byte {exc.object[exc.start : exc.start + 1]!r} at offset {exc.start})"


def round_money(value: Any) -> float | None:
    """To the cent; None when missing (metadata shows it as empty, not NaN)."""
    number = finite(value)
    return None if number is None else round(number, 2) + 0.0  # + 0.0: no "-0.0"


def round_hours(value: Any) -> float | None:
    """To three decimals (3.6 s of a GPU); None when missing."""
    number = finite(value)
    return None if number is None else round(number, 3) + 0.0


def round_percent(value: Any) -> float | None:
    number = finite(value)
    return None if number is None else round(number, 1) + 0.0


def money(value: Any, currency: str = "USD") -> str:
    """``$12,345.68`` (``12,345.68 EUR`` in other currencies); ``n/a`` when missing."""
    number = round_money(value)
    if number is None:
        return MISSING
    if currency.upper() == "USD":
        return f"-${-number:,.2f}" if number < 0 else f"${number:,.2f}"
    return f"{number:,.2f} {currency}"


def hours(value: Any) -> str:
    """``1,234.568``; ``n/a`` when missing."""
    number = round_hours(value)
    return MISSING if number is None else f"{number:,.3f}"


def gpu_hours(value: Any) -> str:
    """``0.018 GPU-h``."""
    text = hours(value)
    return text if text == MISSING else f"{text} GPU-h"


def percent(value: Any) -> str:
    """``87.5%``; ``n/a`` when missing."""
    number = round_percent(value)
    return MISSING if number is None else f"{number:,.1f}%"


def column_formatter(column: str) -> Callable[[Any], str] | None:
    """The text formatter of a table column by its name (``*_usd`` money, ``*hours*``
    hours, ``percent*`` percent), or None for columns shown as they are."""
    if column.endswith("_usd") or column in ("cost", "impact"):
        return lambda v: money(v).lstrip("$") if finite(v) is not None else MISSING
    if "hours" in column:
        return hours
    if column.startswith("percent"):
        return lambda v: MISSING if finite(v) is None else f"{round_percent(v):,.1f}"
    return None


def column_rounder(column: str) -> Callable[[Any], float | None] | None:
    """The numeric rounding of a table column by its name (see :func:`column_formatter`)."""
    if column.endswith("_usd") or column in ("cost", "impact"):
        return round_money
    if "hours" in column:
        return round_hours
    if column.startswith("percent"):
        return round_percent
    return None


# --------------------------------------------------------------------------- URLs in messages

# A URL inside free text: scheme, authority (userinfo and host), then path, query and
# fragment up to a space, a quote or a bracket.
_URL_IN_TEXT = re.compile(r"\b[a-zA-Z][a-zA-Z0-9+.-]*://[^\s'\"<>()\[\]]*(?:\[[0-9a-fA-F:.]+\][^\s'\"<>()]*)?")


def redact_url(url: str, *, keep_path: bool = False) -> str:
    """``url`` as any message may show it: scheme and host (and port), never the userinfo
    (user, password, token), the query or the fragment; the path only with ``keep_path``
    (a path can be a secret: a Slack webhook's). ``http://u:pw@host:5000/api?k=v`` ->
    ``http://host:5000/…`` (``http://host:5000/api`` with ``keep_path``). Text that is not
    a URL is ``<redacted>``, or itself with ``keep_path`` (a local path has no userinfo).

    The one helper every URL passes through before it is logged, raised or stored in a
    message (alert channels, MLflow and OTLP warnings, storage, Prometheus, checkpoints)."""
    if "://" not in url:
        return url if keep_path else "<redacted>"
    try:
        parts = urllib.parse.urlsplit(url.strip())
    except ValueError:
        return "<redacted>"
    if not parts.scheme:
        return "<redacted>"
    host = parts.netloc.rpartition("@")[2]
    return f"{parts.scheme}://{host}{parts.path if keep_path else '/…'}"


def redact_urls(text: str) -> str:
    """Every URL inside ``text`` (an exception's message, a library's log line) as
    :func:`redact_url` shows it."""
    return _URL_IN_TEXT.sub(lambda m: redact_url(m.group(0)), text)
