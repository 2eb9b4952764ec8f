"""Redelivery of alerts whose run failed: at least once, through any outage. Pure.

Design: docs/concepts/budgets-and-alerts.md#redelivery-at-least-once-through-any-outage
"""

from __future__ import annotations

import datetime as dt
import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

RunOutcome = Literal["success", "failure", "active"]
REDELIVERY_MARK = "/redelivery-"


@dataclass(frozen=True)
class Pending:
    """An alert not yet delivered to every channel."""

    first: float  # epoch seconds of the first request
    last: float  # epoch seconds of the latest request
    n: int = 1  # requests so far; 1 is the original run
    seen: str = ""  # what was seen of the latest request's run: "" nothing yet, "active", "failure"

    def run_key(self, key: str) -> str:
        return key if self.n <= 1 else f"{key}{REDELIVERY_MARK}{self.n}"

    def to_json(self) -> list[Any]:
        return [self.first, self.last, self.n, self.seen]

    @classmethod
    def from_json(cls, v: list[Any]) -> "Pending":
        return cls(float(v[0]), float(v[1]), int(v[2]), str(v[3]) if len(v) > 3 else "")


@dataclass(frozen=True)
class Policy:
    interval_s: float
    max_pending_s: float

    def deadline(self, p: Pending) -> float:
        return p.first + self.max_pending_s

    def is_final(self, p: Pending) -> bool:
        """No redelivery could follow this request before the deadline."""
        return p.last + self.interval_s >= self.deadline(p)

    def max_requests(self) -> int:
        return 1 + int(self.max_pending_s // self.interval_s)

    def delivery(self, p: Pending) -> dict[str, Any]:
        """What a run of the alert is told about its place in the redelivery schedule."""
        return {
            "request": p.n,
            "pending_since": _iso(p.first),
            "redelivery_interval_s": self.interval_s,
            "dead_letter_at": _iso(self.deadline(p)),
            "final": self.is_final(p),
        }


@dataclass(frozen=True)
class DeadLetter:
    key: str
    pending: Pending
    reason: str


@dataclass
class Step:
    pending: dict[str, Pending]
    redeliver: list[tuple[str, Pending]] = field(default_factory=list)  # key, its new request
    dead: list[DeadLetter] = field(default_factory=list)
    delivered: list[str] = field(default_factory=list)
    seen: list[str] = field(default_factory=list)  # keys whose latest run changed state

    @property
    def changed(self) -> bool:
        return bool(self.redeliver or self.dead or self.delivered or self.seen)


def advance(pending: Mapping[str, Pending], outcomes: Mapping[str, RunOutcome], now: float, policy: Policy, *, limit: int | None = None) -> Step:
    """Each pending alert, given what was seen of its latest run since the last step (by
    run key; absent when nothing new): delivered, still waiting, requested again, or
    dead-lettered. At most ``limit`` are requested again; the others due stay as they
    are (their failure seen) and are due again at the next step."""
    news: dict[str, dict[int, RunOutcome]] = {}
    for run_key, run_outcome in outcomes.items():
        base, _, n = run_key.partition(REDELIVERY_MARK)
        news.setdefault(base, {})[int(n) if n.isdigit() else 1] = run_outcome
    step = Step({})
    for key, p in pending.items():
        seen = news.get(key)
        outcome: str | None = seen.get(p.n) if seen else None
        if outcome is None and not p.seen and now < p.first + policy.max_pending_s:
            step.pending[key] = p  # the common case at scale: nothing new, waiting for its run
            continue
        outcome = outcome or p.seen or None
        if outcome != "success" and outcome != p.seen:
            p = Pending(p.first, p.last, p.n, outcome or "")
            step.seen.append(key)
        past = now >= policy.deadline(p)
        if outcome == "success":
            step.delivered.append(key)
        elif outcome == "failure" and (past or policy.is_final(p)):
            step.dead.append(DeadLetter(key, p, f"{_requests(p.n)} failed between {_iso(p.first)} and {_iso(now)}; alerts.max_pending_s is {policy.max_pending_s:g}"))
        elif outcome == "failure" and now - p.last >= policy.interval_s and (limit is None or len(step.redeliver) < limit):
            again = Pending(p.first, now, p.n + 1)
            step.redeliver.append((key, again))
            step.pending[key] = again
        elif outcome is None and past:
            step.dead.append(DeadLetter(key, p, f"no run of {p.run_key(key)} was launched within alerts.max_pending_s ({policy.max_pending_s:g}s)"))
        else:
            step.pending[key] = p  # running, queued, or failed less than an interval ago
    return step


def _requests(n: int) -> str:
    return "its run" if n == 1 else f"all {n} runs"


@functools.lru_cache(maxsize=4096)  # a tick stamps thousands of requests with one time
def _iso(epoch: float) -> str:
    return dt.datetime.fromtimestamp(epoch, dt.timezone.utc).isoformat(timespec="seconds")
