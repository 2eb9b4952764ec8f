"""What an alert is, and the keys that make its delivery idempotent. Pure: no Dagster.

One :class:`Alert` is one notification about one budget threshold in one period: a
``trigger`` when spend (or the forecast) crosses it, a ``resolve`` when it falls back
under, or a ``test`` sent by ``gpu-ops alerts test``. Its keys are derived, never random,
so every retry, re-execution or re-evaluation of the same event carries the same ones:

- ``run_key`` (``budget/period/threshold``): Dagster launches each key once per sensor.
- ``dedup_key``: shared by a trigger and its resolve (PagerDuty closes the incident).
- ``idempotency_key``: one per notification; our webhook's ``Idempotency-Key`` header,
  the e-mail ``Message-ID`` and the key of the delivery history.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from dataclasses import dataclass, field
from collections.abc import Mapping
from typing import Any, Literal

AlertKind = Literal["trigger", "resolve", "test"]


def money(value: float) -> str:
    """``$12,345.68``: how every alert, log line and launch refusal shows an amount."""
    return f"${value:,.2f}"


def period_label(period_start: str, period_end: str) -> str:
    """``2026-11-01 to 2026-11-30``: the period's first and last day (``period_end``, an ISO
    date, is exclusive)."""
    end = dt.date.fromisoformat(period_end) - dt.timedelta(days=1)
    return f"{period_start} to {end.isoformat()}"


def scope_label(scope: dict[str, str], everything: str) -> str:
    """``project=llm, team=nlp``; ``everything`` for an empty scope."""
    return ", ".join(f"{k}={v}" for k, v in sorted(scope.items())) or everything


@dataclass(frozen=True)
class Alert:
    kind: AlertKind
    budget: str
    period_start: str  # ISO date, first day of the period
    period_end: str  # ISO date, first day of the next period
    threshold: str  # Threshold.key(): "actual-80pct", "forecast-120pct", "actual-20000usd"
    basis: Literal["actual", "forecast", "anomaly"]  # anomaly: threshold "anomaly-<day>-<dimension>-<key>", threshold_usd that day's spend
    threshold_usd: float
    severity: Literal["info", "warning", "critical"]
    amount_usd: float
    spend_usd: float
    percent_used: float
    forecast_usd: float | None
    scope: dict[str, str] = field(default_factory=dict)
    channels: tuple[str, ...] = ()
    episode: int = 1  # >1 when a threshold re-alarms after a resolve in the same period
    partition_key: str | None = None  # the gpu_budget_status partition evaluated
    as_of: str | None = None
    enforcement: str = "alert"
    top_spenders: tuple[tuple[str, float], ...] = ()
    dagster_url: str = "http://localhost:3000"

    # ---- keys

    @property
    def _event_id(self) -> str:
        base = f"{self.budget}/{self.period_start}/{self.threshold}"
        return base if self.episode <= 1 else f"{base}#{self.episode}"

    @property
    def run_key(self) -> str:
        if self.kind == "trigger":
            return self._event_id
        return f"{self._event_id}/{self.kind}"

    @property
    def trigger_run_key(self) -> str:
        """The run key of the trigger this alert (a resolve) answers."""
        return self._event_id

    @property
    def dedup_key(self) -> str:
        return f"gpu-ops/{self._event_id}"

    @property
    def idempotency_key(self) -> str:
        return f"gpu-ops/{self.run_key}" if self.kind != "trigger" else f"gpu-ops/{self.run_key}/trigger"

    # ---- presentation helpers shared by every channel

    @property
    def anomaly_label(self) -> str:
        """``spend anomaly: team nlp spent $5,000.00 on 2026-11-20`` (an anomaly alert's key, in words)."""
        day, rest = self.threshold[len("anomaly-") : len("anomaly-") + 10], self.threshold[len("anomaly-") + 11 :]
        dimension, _, key = rest.partition("-")
        return f"spend anomaly: {dimension} {key} spent {money(self.threshold_usd)} on {day}"

    @property
    def threshold_label(self) -> str:
        if self.basis == "anomaly":
            return self.anomaly_label
        if self.threshold.endswith("pct"):
            pct = self.threshold.split("-", 1)[1][:-3]
            what = f"{pct}% of budget ({money(self.threshold_usd)})"
        else:
            what = money(self.threshold_usd)
        return f"forecast {what}" if self.basis == "forecast" else what

    @property
    def scope_label(self) -> str:
        return scope_label(self.scope, "all GPU spend")

    @property
    def period_label(self) -> str:
        return period_label(self.period_start, self.period_end)

    @property
    def asset_url(self) -> str:
        return asset_ui_url(self.dagster_url, "gpu_budget_status", self.partition_key)

    @property
    def is_test(self) -> bool:
        return self.kind == "test"

    def summary(self) -> str:
        """One line: the Slack fallback text, the PagerDuty summary, the e-mail subject."""
        prefix = "[TEST] " if self.is_test else ""
        spend = f"{money(self.spend_usd)} of {money(self.amount_usd)} ({self.percent_used:.1f}%)"
        if self.kind == "resolve":
            return f"{prefix}GPU budget {self.budget}: back under {self.threshold_label}; spend {spend}"
        if self.basis == "anomaly":
            return f"{prefix}GPU budget {self.budget}: {self.anomaly_label}, far above its usual spend; spend so far {spend}"
        if self.basis == "forecast" and self.forecast_usd is not None:
            return (
                f"{prefix}GPU budget {self.budget}: forecast {money(self.forecast_usd)} crosses "
                f"{self.threshold_label}; spend so far {spend}"
            )
        return f"{prefix}GPU budget {self.budget}: spend {spend} crossed {self.threshold_label}"

    # ---- transport (run config of the alert job; JSON-safe, no secrets)

    def to_dict(self) -> dict[str, Any]:
        # Field by field: dataclasses.asdict deep-copies every value, which was most of a
        # 10,000-budget first tick.
        d = {f.name: getattr(self, f.name) for f in _FIELDS}
        d["scope"] = dict(self.scope)
        d["channels"] = list(self.channels)
        d["top_spenders"] = [list(t) for t in self.top_spenders]
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Alert":
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - names
        if unknown:
            raise ValueError(f"alert payload has unknown fields {sorted(unknown)}")
        d = dict(data)
        d["channels"] = tuple(d.get("channels") or ())
        d["top_spenders"] = tuple((str(n), float(c)) for n, c in d.get("top_spenders") or ())
        d["scope"] = dict(d.get("scope") or {})
        return cls(**d)

    def with_top_spenders(self, spenders: list[tuple[str, float]]) -> "Alert":
        return dataclasses.replace(self, top_spenders=tuple(spenders))


_FIELDS = dataclasses.fields(Alert)


def asset_ui_url(dagster_url: str, asset: str, partition_key: str | None = None) -> str:
    """The Dagster UI page of ``asset`` (its ``partition_key`` selected) under ``dagster_url``."""
    url = f"{dagster_url.rstrip('/')}/assets/{asset}"
    return f"{url}?view=partitions&partition={partition_key}" if partition_key else url


def test_alert(channel: str, dagster_url: str, today: dt.date | None = None) -> Alert:
    """A clearly marked sample notification for ``gpu-ops alerts test <channel>``."""
    today = today or dt.datetime.now(dt.timezone.utc).date()
    start = today.replace(day=1)
    end = (start + dt.timedelta(days=32)).replace(day=1)
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%S")
    return Alert(
        kind="test",
        budget="gpu-ops-test",
        period_start=start.isoformat(),
        period_end=end.isoformat(),
        threshold=f"test-{stamp}",  # a fresh key per test, so receivers never dedup a test away
        basis="actual",
        threshold_usd=800.0,
        severity="info",
        amount_usd=1000.0,
        spend_usd=812.5,
        percent_used=81.25,
        forecast_usd=1100.0,
        scope={"team": "example"},
        channels=(channel,),
        top_spenders=(("project=example-a", 500.0), ("project=example-b", 312.5)),
        dagster_url=dagster_url,
    )


# pytest would otherwise try to collect the helper above when a test imports it.
test_alert.__test__ = False  # type: ignore[attr-defined]


@dataclass(frozen=True)
class Refusal:
    """A launch a gate refuses: the reason the user reads and the metadata of the step
    failure (``refused_by`` and what the gate weighed). The flows return it; the Dagster
    wiring (:mod:`gpu_ops.dagster.compute.admission`) raises it as ``LaunchRefused``."""

    reason: str
    metadata: Mapping[str, Any]
