"""Alerts evaluated but not yet requested: the sensor's queue, kept in its cursor. Pure.

A tick requests at most ``alerts.max_runs_per_tick`` alert runs (a fleet's first
evaluation can cross tens of thousands of thresholds at once, and each run request costs
Dagster time in the tick and a run to launch). The rest wait here, oldest first, and go
out on the next ticks. Each waiting alert is kept as it was evaluated (spend, forecast,
severity, scope, channels), so the run requested later carries exactly the payload an
uncapped tick would have sent, under the same run key.

Stored compactly: the fields of the budget's row and configuration (shared by every
alert of one budget and evaluation) once per *context*, the threshold's own fields per
entry; plain JSON arrays, so a queue of 60,000 alerts encodes in a few tens of ms.
Taking from the queue is deterministic, so a tick replayed from the same cursor (a daemon
that died before storing it) takes the same alerts and Dagster skips their run keys.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpu_ops.alerts.model import Alert

if TYPE_CHECKING:
    from gpu_ops.alerts.state import ThresholdEvent, ThresholdPlan

# A context: what the alerts of one budget row share.
_CONTEXT = ("budget", "period_start", "period_end", "amount_usd", "spend_usd", "forecast_usd", "partition_key", "as_of", "scope", "channels", "enforcement", "dagster_url")
# An entry: one alert; its last element is the index of its context.
_ENTRY = ("kind", "threshold", "episode", "basis", "threshold_usd", "severity")


@dataclass
class AlertQueue:
    entries: list[list[Any]] = field(default_factory=list)  # _ENTRY values + context index
    contexts: list[list[Any]] = field(default_factory=list)  # _CONTEXT values

    def __len__(self) -> int:
        return len(self.entries)

    def add(self, alert: Alert) -> None:
        """One alert, with a context of its own."""
        self.contexts.append([getattr(alert, f) for f in _CONTEXT[:-4]] + [dict(alert.scope), list(alert.channels), alert.enforcement, alert.dagster_url])
        self.entries.append([getattr(alert, f) for f in _ENTRY] + [len(self.contexts) - 1])

    def add_events(self, events: Iterable[ThresholdEvent], plan: ThresholdPlan, dagster_url: str) -> None:
        """The alerts of one evaluation (events of budgets without channels are left out:
        their state advances, there is nothing to send). One context per budget row."""
        context_of: dict[int, int] = {}
        for ev in events:
            budget = plan.budgets[ev.budget]
            if not budget.channels:
                continue
            row = ev.row
            ctx = context_of.get(id(row))
            if ctx is None:
                ctx = context_of[id(row)] = len(self.contexts)
                self.contexts.append([
                    budget.name, row.period_start, row.period_end, budget.amount_usd, row.spend_usd, row.forecast_usd,
                    row.partition_key, row.as_of, plan.filters(budget.name), list(budget.channels), budget.enforcement.action, dagster_url,
                ])
            th = plan.threshold(budget.name, ev.threshold)
            amount = budget.amount_usd
            self.entries.append([ev.kind, ev.threshold, ev.episode, th.basis, th.amount_usd(amount), th.effective_severity(amount), ctx])

    def pop(self, n: int) -> list[Alert]:
        """The ``n`` oldest alerts, removed from the queue."""
        taken, self.entries = self.entries[:n], self.entries[n:]
        alerts = [self._alert(e) for e in taken]
        if self.entries:  # drop the contexts no waiting entry refers to any more
            drop = min(e[-1] for e in self.entries)
            if drop:
                self.contexts = self.contexts[drop:]
                self.entries = [e[:-1] + [e[-1] - drop] for e in self.entries]
        else:
            self.contexts = []
        return alerts

    def _alert(self, entry: list[Any]) -> Alert:
        kind, threshold, episode, basis, threshold_usd, severity, ctx = entry
        budget, start, end, amount, spend, forecast, partition, as_of, scope, channels, enforcement, url = self.contexts[ctx]
        return Alert(
            kind=kind, budget=budget, period_start=start, period_end=end, threshold=threshold, basis=basis,
            threshold_usd=threshold_usd, severity=severity, amount_usd=amount, spend_usd=spend,
            percent_used=spend / amount * 100.0, forecast_usd=forecast, scope=dict(scope), channels=tuple(channels),
            episode=episode, partition_key=partition, as_of=as_of, enforcement=enforcement, dagster_url=url,
        )

    def to_json(self) -> list[Any]:
        return [self.entries, self.contexts]

    @classmethod
    def from_json(cls, data: list[Any] | None) -> "AlertQueue":
        return cls(*data) if data else cls()
