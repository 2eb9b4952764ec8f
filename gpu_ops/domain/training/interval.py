"""Checkpoint-interval maths (pure): Young/Daly, an MTBP estimate, and a schedule.

With checkpoint cost ``C`` and mean time between preemptions ``M``, checkpointing every
``tau`` seconds wastes about ``C/tau`` (writing) plus ``tau/(2M)`` (work redone after a
preemption) per second of training; ``tau = sqrt(2 C M)`` minimises that (Young 1974,
Daly 2006). ``expected_wall_time`` is Daly's exact expectation for exponential
preemptions, which the benchmark uses as the lower bound.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable, Literal, Union

Interval = Union[float, Literal["auto"]]

# Before the first save has been timed, assume a checkpoint costs this much (seconds).
DEFAULT_COST_PRIOR_S = 1.0
# Never checkpoint more often than this, whatever the estimate says.
MIN_INTERVAL_S = 1.0


def young_daly_interval(checkpoint_cost_s: float, mtbp_s: float) -> float:
    """``sqrt(2 × C × M)``: the interval that minimises expected lost work."""
    if checkpoint_cost_s < 0 or mtbp_s <= 0:
        raise ValueError(f"checkpoint cost must be >= 0 and MTBP > 0 (got C={checkpoint_cost_s}, M={mtbp_s})")
    return math.sqrt(2.0 * checkpoint_cost_s * mtbp_s)


def estimate_mtbp(exposure_s: float, preemptions: int, prior_s: float, prior_weight: float = 1.0) -> float:
    """Mean time between preemptions: total time exposed over preemptions seen.

    Survived time counts as exposure (censored observations), and a prior worth
    ``prior_weight`` preemptions keeps the estimate sane before any have happened.
    """
    if prior_s <= 0 or prior_weight <= 0:
        raise ValueError("the MTBP prior and its weight must be > 0")
    return (max(exposure_s, 0.0) + prior_s * prior_weight) / (max(preemptions, 0) + prior_weight)


def expected_wall_time(work_s: float, interval_s: float, cost_s: float, mtbp_s: float, restart_s: float = 0.0) -> float:
    """Daly's expected wall time to finish ``work_s`` with periodic checkpoints.

    Each segment is ``interval_s`` of work plus a checkpoint of ``cost_s``; a
    preemption (exponential, mean ``mtbp_s``) costs ``restart_s`` and the segment.
    """
    lam = 1.0 / mtbp_s
    segments = work_s / interval_s
    per_segment = math.exp(lam * restart_s) * (math.expm1(lam * (interval_s + cost_s))) / lam
    return segments * per_segment


def expected_wall_time_from_scratch(work_s: float, mtbp_s: float, restart_s: float = 0.0) -> float:
    """The same without checkpoints: every preemption restarts the whole job."""
    lam = 1.0 / mtbp_s
    return math.exp(lam * restart_s) * math.expm1(lam * work_s) / lam


def optimal_interval(cost_s: float, mtbp_s: float, restart_s: float = 0.0) -> float:
    """The interval minimising :func:`expected_wall_time` (golden-section search)."""
    lo, hi = max(cost_s * 1e-3, 1e-6), max(10 * young_daly_interval(max(cost_s, 1e-9), mtbp_s), 10 * cost_s)
    f = lambda t: expected_wall_time(1.0, t, cost_s, mtbp_s, restart_s)  # noqa: E731
    g = (math.sqrt(5) - 1) / 2
    a, b = math.log(lo), math.log(hi)
    c, d = b - g * (b - a), a + g * (b - a)
    for _ in range(200):
        if f(math.exp(c)) < f(math.exp(d)):
            b = d
        else:
            a = c
        c, d = b - g * (b - a), a + g * (b - a)
    return math.exp((a + b) / 2)


@dataclass
class CheckpointSchedule:
    """When to checkpoint next: a fixed interval, or ``auto`` (Young/Daly, learned).

    ``auto`` measures the cost of each save (an exponential moving average) and
    estimates the MTBP from the history the parent passes in (exposure and
    preemptions of earlier attempts) plus the time this attempt has survived.
    """

    interval: Interval = "auto"
    mtbp_prior_s: float = 7200.0
    past_exposure_s: float = 0.0
    past_preemptions: int = 0
    cost_prior_s: float = DEFAULT_COST_PRIOR_S
    clock: Callable[[], float] = time.monotonic

    def __post_init__(self) -> None:
        if self.interval != "auto" and not (isinstance(self.interval, (int, float)) and self.interval > 0):
            raise ValueError(f"checkpoint interval must be a positive number of seconds or 'auto', got {self.interval!r}")
        self.started = self.clock()
        self.last_save = self.started
        self.measured_cost_s: float | None = None
        self.saves = 0

    def restart(self) -> None:
        """Count the interval from now (call when training proper begins)."""
        self.last_save = self.clock()

    def record_save(self, cost_s: float, at: float | None = None) -> None:
        self.measured_cost_s = cost_s if self.measured_cost_s is None else 0.7 * self.measured_cost_s + 0.3 * cost_s
        self.last_save = self.clock() if at is None else at
        self.saves += 1

    def mtbp_s(self) -> float:
        survived = self.clock() - self.started
        return estimate_mtbp(self.past_exposure_s + survived, self.past_preemptions, self.mtbp_prior_s)

    def cost_s(self) -> float:
        return self.measured_cost_s if self.measured_cost_s is not None else self.cost_prior_s

    def current_interval(self) -> float:
        if self.interval != "auto":
            return float(self.interval)
        return max(MIN_INTERVAL_S, young_daly_interval(self.cost_s(), self.mtbp_s()))

    def due(self) -> bool:
        return self.clock() - self.last_save >= self.current_interval()
