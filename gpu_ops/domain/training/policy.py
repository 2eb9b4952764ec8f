"""What to do after an attempt ends (pure): retry, with what request, after how long.

Preemptions, OOMs, infrastructure failures and user errors each have their own budget,
so a run preempted five times can still retry an OOM. The history is the list of
earlier attempts of the same run and asset (read from the usage ledger) plus the one
that just ended. Nothing here imports Dagster; the wiring turns a :class:`Decision`
into ``dg.RetryRequested`` or ``dg.Failure``.
"""

from __future__ import annotations

import enum
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, Union

from pydantic import BaseModel, ConfigDict, Field, NonNegativeFloat, NonNegativeInt, PositiveFloat, field_validator

from gpu_ops.domain.compute.request import GpuRequest, parse_memory
from gpu_ops.domain.training.classify import Classification, Outcome


class PreemptionPolicy(BaseModel):
    """Per-asset retry policy. Defaults follow SkyPilot managed jobs: preemptions are
    retried (and resume from the newest checkpoint), user errors are not."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)  # a backoff or interval of inf: a wait that never ends

    max_preemptions: NonNegativeInt = 20
    """Preemptions retried (each resumes from the newest checkpoint) before the asset fails."""
    max_oom_retries: NonNegativeInt = 2
    """Out-of-memory failures retried, each with ``oom_memory_factor`` times the memory."""
    oom_memory_factor: float = Field(default=1.5, gt=1.0)
    """How much the memory grows after each OOM."""
    # Memory never grows past this; unset means 4× the asset's own request.
    oom_memory_cap: str | None = None
    max_infrastructure_retries: NonNegativeInt = 3
    """Infrastructure failures (a lost worker, a failed launch) retried, with backoff."""
    retry_user_errors: NonNegativeInt = 0
    """Times an exception of the training function is retried (none by default)."""
    # Backoff before attempt n+1 is backoff_s × 2^(k-1) for the k-th failure of a kind,
    # capped at backoff_max_s, times a random factor in [1 - jitter, 1 + jitter].
    backoff_s: NonNegativeFloat = 5.0
    backoff_max_s: NonNegativeFloat = 300.0
    """The longest backoff, seconds."""
    jitter: float = Field(default=0.25, ge=0.0, le=1.0)
    """The backoff's random factor is in ``[1 - jitter, 1 + jitter]``."""
    # With capacity "spot-then-on-demand", after this many spot preemptions the next
    # attempt asks for on-demand (None: never). A request for "spot" never falls back:
    # on-demand costs about 3x more and was not asked for.
    fallback_after: NonNegativeInt | None = 3
    # A retry with nothing to wait for (a preemption after progress) starts in the same
    # Dagster step process at once; False: every retry is a Dagster step retry (under
    # the multiprocess executor a new step process, seconds of start-up).
    retry_in_step: bool = True
    # Seconds between checkpoints, or "auto" for Young/Daly sqrt(2 × cost × MTBP).
    checkpoint_interval: Union[PositiveFloat, Literal["auto"]] = "auto"
    # The MTBP assumed before any preemption of this asset has been seen.
    mtbp_prior_s: PositiveFloat = 7200.0
    # Poll a spot-interruption notice: None, "imds" (EC2 instance metadata) or a URL
    # whose 200 answer is a notice; every spot_notice_poll_s seconds (EC2 warns 120 s ahead).
    spot_notice: str | None = None
    spot_notice_poll_s: PositiveFloat = 5.0
    """Seconds between two looks for a spot notice (``spot_notice``, ``kubernetes_notice``)."""
    # In a Kubernetes pod, also watch the node's karpenter.sh/disrupted taint, spot
    # interruption events and the pod's deletionTimestamp (needs `get` on its node and pod).
    kubernetes_notice: bool = True

    @field_validator("oom_memory_cap")
    @classmethod
    def _cap(cls, v: str | None) -> str | None:
        if v is not None:
            parse_memory(v)
        return v


class Action(str, enum.Enum):
    COMPLETE = "complete"
    RETRY = "retry"
    FAIL = "fail"


@dataclass(frozen=True)
class AttemptRecord:
    """One finished attempt, as the ledger remembers it."""

    attempt: int
    outcome: Outcome
    capacity_type: str = "spot"
    duration_s: float = 0.0
    lost_seconds: float = 0.0


@dataclass(frozen=True)
class Counts:
    preemptions: int = 0
    spot_preemptions: int = 0
    ooms: int = 0
    infrastructure: int = 0
    user_errors: int = 0

    @classmethod
    def of(cls, history: Sequence[AttemptRecord]) -> "Counts":
        return cls(
            preemptions=sum(r.outcome is Outcome.PREEMPTED for r in history),
            spot_preemptions=sum(r.outcome is Outcome.PREEMPTED and r.capacity_type == "spot" for r in history),
            ooms=sum(r.outcome is Outcome.OOM for r in history),
            infrastructure=sum(r.outcome is Outcome.INFRASTRUCTURE for r in history),
            user_errors=sum(r.outcome is Outcome.USER_ERROR for r in history),
        )


@dataclass(frozen=True)
class Decision:
    action: Action
    reason: str
    wait_s: float = 0.0
    counts: Counts = field(default_factory=Counts)


@dataclass(frozen=True)
class PlannedAttempt:
    """The request for the next attempt and why it differs from the asset's own."""

    request: GpuRequest
    notes: tuple[str, ...] = ()


def memory_cap(policy: PreemptionPolicy, base: GpuRequest) -> int:
    return parse_memory(policy.oom_memory_cap) if policy.oom_memory_cap else 4 * base.memory_bytes


def plan_attempt(policy: PreemptionPolicy, base: GpuRequest, history: Sequence[AttemptRecord]) -> PlannedAttempt:
    """The request for the attempt after ``history``: more memory after OOMs, on-demand
    capacity after ``fallback_after`` spot preemptions when the request allows it
    (``spot-then-on-demand``; ``spot`` stays spot)."""
    counts = Counts.of(history)
    request, notes = base, []
    if counts.ooms:
        cap = memory_cap(policy, base)
        request = base.with_memory_factor(policy.oom_memory_factor**counts.ooms, cap=f"{cap}")
        notes.append(f"memory {base.memory} -> {request.memory} after {counts.ooms} OOM(s) (×{policy.oom_memory_factor} each, cap {cap / 2**30:g}Gi)")
    if policy.fallback_after is not None and counts.spot_preemptions >= policy.fallback_after and base.capacity == "spot-then-on-demand":
        request = request.with_capacity("on-demand")
        notes.append(f"capacity on-demand after {counts.spot_preemptions} spot preemption(s) (fallback_after={policy.fallback_after})")
    return PlannedAttempt(request, tuple(notes))


def backoff_s(policy: PreemptionPolicy, nth: int, rng: random.Random | None = None) -> float:
    """Exponential backoff with jitter before retrying the ``nth`` failure of a kind."""
    base = min(policy.backoff_max_s, policy.backoff_s * 2 ** max(nth - 1, 0))
    r = rng or random
    return max(0.0, base * (1.0 + policy.jitter * (2 * r.random() - 1)))


def preemptions_without_progress(history: Sequence[AttemptRecord]) -> int:
    """Preemptions at the end of ``history`` in a row whose attempts saved no checkpoint
    (all their time was lost): only those back off, so a preemption loop cannot spin."""
    n = 0
    for r in reversed(history):
        if r.outcome is not Outcome.PREEMPTED or r.lost_seconds < r.duration_s - 1e-6:
            break
        n += 1
    return n


def max_attempts(policy: PreemptionPolicy) -> int:
    """Every retry budget spent, plus the first attempt: no run retries more than this."""
    return 1 + policy.max_preemptions + policy.max_oom_retries + policy.max_infrastructure_retries + policy.retry_user_errors


@dataclass(frozen=True)
class _Case:
    """What every per-outcome rule needs."""

    policy: PreemptionPolicy
    base: GpuRequest
    history: Sequence[AttemptRecord]
    counts: Counts
    rng: random.Random | None

    def retry(self, nth: int, limit: int, what: str, extra: str = "") -> Decision:
        wait = backoff_s(self.policy, nth, self.rng)
        return Decision(Action.RETRY, f"{what} {nth} of at most {limit}: retrying in {wait:.1f} s from the newest checkpoint{extra}", wait, self.counts)

    def fail(self, reason: str) -> Decision:
        return Decision(Action.FAIL, reason, 0.0, self.counts)


def _preempted(c: _Case) -> Decision:
    p, n = c.policy, c.counts.preemptions
    if n > p.max_preemptions:
        return c.fail(f"preempted {n} times, more than max_preemptions={p.max_preemptions}")
    nxt = plan_attempt(p, c.base, c.history)
    extra = f"; next attempt: {'; '.join(nxt.notes)}" if nxt.notes else ""
    idle = preemptions_without_progress(c.history)
    if idle == 0:
        # The preempted attempt had saved a checkpoint: nothing to wait for, resume now.
        reason = f"preemption {n} of at most {p.max_preemptions}: retrying now from the newest checkpoint (the attempt had made progress; no backoff){extra}"
        return Decision(Action.RETRY, reason, 0.0, c.counts)
    return c.retry(idle, p.max_preemptions, "preemption", f" ({idle} in a row without a checkpoint){extra}")


def _oom(c: _Case) -> Decision:
    p, n = c.policy, c.counts.ooms
    if n > p.max_oom_retries:
        return c.fail(f"out of memory {n} times, more than max_oom_retries={p.max_oom_retries}")
    before = plan_attempt(p, c.base, c.history[:-1]).request
    after = plan_attempt(p, c.base, c.history).request
    if after.memory_bytes <= before.memory_bytes:
        return c.fail(f"out of memory at {before.memory}, already at the memory cap; more memory cannot be requested")
    return c.retry(n, p.max_oom_retries, "OOM", f" with memory {before.memory} -> {after.memory}")


def _infrastructure(c: _Case) -> Decision:
    p, n = c.policy, c.counts.infrastructure
    if n > p.max_infrastructure_retries:
        return c.fail(f"{n} infrastructure failures, more than max_infrastructure_retries={p.max_infrastructure_retries}")
    return c.retry(n, p.max_infrastructure_retries, "infrastructure failure")


def _user_error(c: _Case) -> Decision:
    p, n = c.policy, c.counts.user_errors
    if n > p.retry_user_errors:
        asked = f" (retry_user_errors={p.retry_user_errors})" if p.retry_user_errors else " (user errors are not retried unless retry_user_errors > 0)"
        return c.fail(f"the training function failed{asked}")
    return c.retry(n, p.retry_user_errors, "user error")


_RULES = {Outcome.PREEMPTED: _preempted, Outcome.OOM: _oom, Outcome.INFRASTRUCTURE: _infrastructure, Outcome.USER_ERROR: _user_error}


def decide(
    policy: PreemptionPolicy,
    base: GpuRequest,
    history: Sequence[AttemptRecord],
    classification: Classification,
    rng: random.Random | None = None,
    attempt: int | None = None,
) -> Decision:
    """``history`` includes the attempt that just ended (last). ``attempt`` is Dagster's
    own count; it caps retries even when the ledger lost rows (a database outage)."""
    counts = Counts.of(history)
    outcome = classification.outcome
    if outcome is Outcome.COMPLETED:
        return Decision(Action.COMPLETE, f"completed after {attempt or len(history)} attempt(s)", 0.0, counts)
    if attempt is not None and attempt >= max_attempts(policy):
        return Decision(Action.FAIL, f"{attempt} attempts, every retry budget of the policy spent ({max_attempts(policy)} attempts at most)", 0.0, counts)
    return _RULES[outcome](_Case(policy, base, history, counts, rng))
