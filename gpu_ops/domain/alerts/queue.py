"""Alerts evaluated but not yet requested: the sensor's queue, kept in its cursor. Pure.

Design: docs/concepts/budgets-and-alerts.md#the-queue
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpu_ops.domain.alerts.model import Alert


# A context: what the alerts of one budget row share.
_CONTEXT = ("budget", "period_start", "period_end", "amount_usd", "spend_usd", "forecast_usd", "partition_key", "as_of", "scope", "channels", "enforcement", "dagster_url")
# An entry: one alert, and the index of its context ("ctx").
_ENTRY = ("kind", "threshold", "episode", "basis", "threshold_usd", "severity", "ctx")


@dataclass
class AlertQueue:
    """Columns: ``entries[field][i]`` is a field of the i-th waiting alert (oldest first),
    ``contexts[field][c]`` one of the c-th context."""

    entries: dict[str, list[Any]] = field(default_factory=lambda: {f: [] for f in _ENTRY})
    contexts: dict[str, list[Any]] = field(default_factory=lambda: {f: [] for f in _CONTEXT})

    def __len__(self) -> int:
        return len(self.entries["ctx"])

    def copy(self) -> "AlertQueue":
        return AlertQueue({f: list(v) for f, v in self.entries.items()}, {f: list(v) for f, v in self.contexts.items()})

    def add(self, alert: Alert) -> None:
        """One alert, with a context of its own."""
        ctx = len(self.contexts["budget"])
        for f in _CONTEXT:
            self.contexts[f].append(getattr(alert, f))
        self.contexts["scope"][-1] = dict(alert.scope)
        self.contexts["channels"][-1] = list(alert.channels)
        for f in _ENTRY[:-1]:
            self.entries[f].append(getattr(alert, f))
        self.entries["ctx"].append(ctx)

    @property
    def next_context(self) -> int:
        """The index the next context appended gets."""
        return len(self.contexts["budget"])

    def extend(self, entries: list[tuple[Any, ...]], contexts: list[tuple[Any, ...]]) -> None:
        """Rows in the queue's own layout: ``entries`` in the order of this module's entry fields (``ctx`` an
        index from :attr:`next_context` on), ``contexts`` in that of its context fields
        (:func:`gpu_ops.domain.alerts.state.queue_alerts` builds them from an evaluation)."""
        _extend(self.entries, _ENTRY, entries)
        _extend(self.contexts, _CONTEXT, contexts)

    def pop(self, n: int) -> list[Alert]:
        """The ``n`` oldest alerts, removed from the queue."""
        taken = {f: v[:n] for f, v in self.entries.items()}
        self.entries = {f: v[n:] for f, v in self.entries.items()}
        alerts = [self._alert(*entry) for entry in zip(*(taken[f] for f in _ENTRY))]
        rest = self.entries["ctx"]
        drop = min(rest) if rest else len(self.contexts["budget"])  # contexts no waiting alert refers to
        if drop:
            self.contexts = {f: v[drop:] for f, v in self.contexts.items()}
            self.entries["ctx"] = [i - drop for i in rest]
        return alerts

    def _alert(self, kind: Any, threshold: str, episode: int, basis: Any, threshold_usd: float, severity: Any, ctx: int) -> Alert:
        budget, start, end, amount, spend, forecast, partition, as_of, scope, channels, enforcement, url = (self.contexts[f][ctx] for f in _CONTEXT)
        return Alert(
            kind=kind, budget=budget, period_start=start, period_end=end, threshold=threshold, basis=basis,
            threshold_usd=threshold_usd, severity=severity, amount_usd=amount, spend_usd=spend,
            percent_used=spend / amount * 100.0, forecast_usd=forecast, scope=dict(scope), channels=tuple(channels),
            episode=episode, partition_key=partition, as_of=as_of, enforcement=enforcement, dagster_url=url,
        )

    def to_json(self) -> dict[str, Any]:
        """Columns; one whose values are all equal (the dashboard URL, the period, often
        the channels) is stored once, as ``{"all": value}``."""
        return {"e": {f: _pack(v) for f, v in self.entries.items()}, "c": {f: _pack(v) for f, v in self.contexts.items()}}

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> "AlertQueue":
        if not data:
            return cls()
        n, m = _size(data["e"]), _size(data["c"])
        return cls({f: _unpack(data["e"][f], n) for f in _ENTRY}, {f: _unpack(data["c"][f], m) for f in _CONTEXT})


def _extend(columns: dict[str, list[Any]], fields: tuple[str, ...], rows: list[tuple[Any, ...]]) -> None:
    for f, values in zip(fields, zip(*rows)):
        columns[f].extend(values)


def _pack(values: list[Any]) -> Any:
    if values and values.count(values[0]) == len(values):
        return {"all": values[0], "n": len(values)}
    return values


def _unpack(column: Any, n: int) -> list[Any]:
    return [column["all"]] * n if isinstance(column, dict) else column


def _size(columns: dict[str, Any]) -> int:
    first = next(iter(columns.values()))
    return first["n"] if isinstance(first, dict) else len(first)
