"""The preemption policy and the checkpoint-interval maths (pure)."""

from __future__ import annotations

import math
import random

import pytest
from pydantic import ValidationError

from gpu_ops.domain.compute.request import GpuRequest
from gpu_ops.domain.training.classify import Classification, Outcome
from gpu_ops.domain.training.interval import (
    CheckpointSchedule,
    estimate_mtbp,
    expected_wall_time,
    expected_wall_time_from_scratch,
    optimal_interval,
    young_daly_interval,
)
from gpu_ops.domain.training.policy import Action, AttemptRecord, PreemptionPolicy, backoff_s, decide, plan_attempt

BASE = GpuRequest(gpu_type="a100-80gb", gpus=8, memory="64Gi", capacity="spot-then-on-demand")


def rec(attempt: int, outcome: Outcome, capacity: str = "spot") -> AttemptRecord:
    return AttemptRecord(attempt, outcome, capacity, 60.0)


def cls(outcome: Outcome) -> Classification:
    return Classification(outcome, "test")


def test_preemptions_without_progress_retry_with_growing_jittered_backoff() -> None:
    """Attempts preempted before any checkpoint (all their time lost) back off, so a
    preemption loop cannot spin."""
    policy = PreemptionPolicy(backoff_s=2, backoff_max_s=30, jitter=0.25, fallback_after=None)
    rng = random.Random(1)
    history: list[AttemptRecord] = []
    waits = []
    for n in range(1, 6):
        history.append(AttemptRecord(n, Outcome.PREEMPTED, "spot", 60.0, 60.0))
        d = decide(policy, BASE, history, cls(Outcome.PREEMPTED), rng)
        assert d.action is Action.RETRY
        nominal = min(30, 2 * 2 ** (n - 1))
        assert nominal * 0.75 <= d.wait_s <= nominal * 1.25
        waits.append(d.wait_s)
    assert waits[3] > waits[0]


def test_a_preemption_after_progress_retries_at_once() -> None:
    """The default backoff (5 s) must not stand between a preemption and its resume when the
    attempt had saved a checkpoint: there is nothing to wait for."""
    policy = PreemptionPolicy()
    d = decide(policy, BASE, [AttemptRecord(1, Outcome.PREEMPTED, "spot", 60.0, 2.5)], cls(Outcome.PREEMPTED), random.Random(1))
    assert d.action is Action.RETRY and d.wait_s == 0.0 and "no backoff" in d.reason
    lost_all = [AttemptRecord(1, Outcome.PREEMPTED, "spot", 60.0, 2.5), AttemptRecord(2, Outcome.PREEMPTED, "spot", 3.0, 3.0)]
    d = decide(policy, BASE, lost_all, cls(Outcome.PREEMPTED), random.Random(1))
    assert 5 * 0.75 <= d.wait_s <= 5 * 1.25  # the second, without a checkpoint, backs off


def test_preemptions_are_counted_separately_from_errors() -> None:
    policy = PreemptionPolicy(max_preemptions=2, max_infrastructure_retries=1)
    history = [rec(1, Outcome.PREEMPTED), rec(2, Outcome.PREEMPTED), rec(3, Outcome.INFRASTRUCTURE)]
    assert decide(policy, BASE, history, cls(Outcome.INFRASTRUCTURE)).action is Action.RETRY
    history.append(rec(4, Outcome.PREEMPTED))
    d = decide(policy, BASE, history, cls(Outcome.PREEMPTED))
    assert d.action is Action.FAIL and "max_preemptions=2" in d.reason
    assert d.counts.preemptions == 3 and d.counts.infrastructure == 1


def test_user_errors_are_not_retried_unless_asked() -> None:
    history = [rec(1, Outcome.USER_ERROR)]
    d = decide(PreemptionPolicy(), BASE, history, cls(Outcome.USER_ERROR))
    assert d.action is Action.FAIL and "not retried" in d.reason
    assert decide(PreemptionPolicy(retry_user_errors=1), BASE, history, cls(Outcome.USER_ERROR)).action is Action.RETRY


def test_oom_retries_with_more_memory_up_to_the_cap() -> None:
    policy = PreemptionPolicy(oom_memory_factor=1.5, oom_memory_cap="128Gi", max_oom_retries=5)
    history = [rec(1, Outcome.OOM)]
    assert plan_attempt(policy, BASE, history).request.memory == "96Gi"
    d = decide(policy, BASE, history, cls(Outcome.OOM))
    assert d.action is Action.RETRY and "64Gi -> 96Gi" in d.reason
    history.append(rec(2, Outcome.OOM))
    assert plan_attempt(policy, BASE, history).request.memory == "128Gi"  # 144Gi capped
    history.append(rec(3, Outcome.OOM))
    d = decide(policy, BASE, history, cls(Outcome.OOM))
    assert d.action is Action.FAIL and "cap" in d.reason


def test_oom_default_cap_and_retry_limit() -> None:
    policy = PreemptionPolicy(max_oom_retries=1)
    history = [rec(1, Outcome.OOM), rec(2, Outcome.OOM)]
    assert decide(policy, BASE, history, cls(Outcome.OOM)).action is Action.FAIL


def test_fallback_to_on_demand_after_spot_preemptions() -> None:
    policy = PreemptionPolicy(fallback_after=2)
    history = [rec(1, Outcome.PREEMPTED)]
    assert plan_attempt(policy, BASE, history).request.capacity == "spot-then-on-demand"
    history.append(rec(2, Outcome.PREEMPTED))
    planned = plan_attempt(policy, BASE, history)
    assert planned.request.capacity == "on-demand"
    assert any("on-demand" in n for n in planned.notes)
    assert "on-demand" in decide(policy, BASE, history, cls(Outcome.PREEMPTED)).reason
    # preemptions on on-demand capacity do not count towards the spot fallback
    on_demand = [rec(1, Outcome.PREEMPTED, "on-demand"), rec(2, Outcome.PREEMPTED, "on-demand")]
    assert plan_attempt(policy, BASE, on_demand).request.capacity == "spot-then-on-demand"


def test_spot_never_falls_back_to_on_demand() -> None:
    policy = PreemptionPolicy(fallback_after=1, max_preemptions=5)
    spot = BASE.with_capacity("spot")
    history = [rec(n, Outcome.PREEMPTED) for n in range(1, 5)]
    planned = plan_attempt(policy, spot, history)
    assert planned.request.capacity == "spot" and planned.request.capacity_types == ["spot"]
    assert not any("on-demand" in n for n in planned.notes)
    d = decide(policy, spot, history, cls(Outcome.PREEMPTED))
    assert d.action is Action.RETRY and "on-demand" not in d.reason


def test_completed() -> None:
    assert decide(PreemptionPolicy(), BASE, [rec(1, Outcome.COMPLETED)], cls(Outcome.COMPLETED)).action is Action.COMPLETE


def test_policy_validation_names_the_field() -> None:
    with pytest.raises(ValidationError, match="oom_memory_factor"):
        PreemptionPolicy(oom_memory_factor=0.5)
    with pytest.raises(ValidationError, match="checkpoint_interval"):
        PreemptionPolicy(checkpoint_interval="sometimes")
    with pytest.raises(ValidationError, match="not a memory quantity"):
        PreemptionPolicy(oom_memory_cap="lots")


def test_backoff_is_capped() -> None:
    policy = PreemptionPolicy(backoff_s=10, backoff_max_s=60, jitter=0)
    assert backoff_s(policy, 1) == 10 and backoff_s(policy, 3) == 40 and backoff_s(policy, 10) == 60


# --------------------------------------------------------------------------- interval maths


def test_young_daly() -> None:
    assert young_daly_interval(10, 3600) == pytest.approx(math.sqrt(2 * 10 * 3600))
    with pytest.raises(ValueError):
        young_daly_interval(1, 0)


def test_optimal_interval_matches_young_daly_when_cost_is_small() -> None:
    for cost, mtbp in [(1.0, 1800.0), (10.0, 4 * 3600.0), (0.05, 8 * 3600.0)]:
        assert optimal_interval(cost, mtbp) == pytest.approx(young_daly_interval(cost, mtbp), rel=0.05)


def test_expected_wall_time_checkpointing_beats_restarting_from_scratch() -> None:
    work, mtbp = 8 * 3600.0, 3600.0
    with_ckpt = expected_wall_time(work, young_daly_interval(30, mtbp), 30, mtbp)
    assert work < with_ckpt < work * 1.2
    assert expected_wall_time_from_scratch(work, mtbp) > 100 * work


def test_mtbp_estimate_counts_survived_time() -> None:
    assert estimate_mtbp(0, 0, prior_s=7200) == 7200
    assert estimate_mtbp(10 * 3600, 0, prior_s=7200) == pytest.approx(12 * 3600)
    assert estimate_mtbp(9 * 3600, 8, prior_s=3600) == pytest.approx(3600 * 10 / 9)


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_fixed_schedule() -> None:
    clock = FakeClock()
    s = CheckpointSchedule(interval=5.0, clock=clock)
    assert not s.due()
    clock.t += 5
    assert s.due()
    s.record_save(0.1)
    assert not s.due()


def test_auto_schedule_uses_measured_cost_and_learned_mtbp() -> None:
    clock = FakeClock()
    s = CheckpointSchedule(interval="auto", mtbp_prior_s=3600, past_exposure_s=0, past_preemptions=0, clock=clock)
    assert s.current_interval() == pytest.approx(math.sqrt(2 * 1.0 * 3600))  # cost prior 1 s
    s.record_save(2.0)
    assert s.current_interval() == pytest.approx(math.sqrt(2 * 2.0 * 3600))
    frequent = CheckpointSchedule(interval="auto", mtbp_prior_s=3600, past_exposure_s=3 * 3600, past_preemptions=11, clock=clock)
    frequent.record_save(2.0)
    assert frequent.current_interval() == pytest.approx(math.sqrt(2 * 2.0 * 1200))
    with pytest.raises(ValueError):
        CheckpointSchedule(interval=-1)


def test_dagster_attempt_count_caps_retries_when_the_ledger_lost_rows() -> None:
    policy = PreemptionPolicy(max_preemptions=2, max_oom_retries=0, max_infrastructure_retries=0)
    # The ledger only knows the last attempt, but Dagster says this is attempt 3.
    d = decide(policy, BASE, [rec(3, Outcome.PREEMPTED)], cls(Outcome.PREEMPTED), attempt=3)
    assert d.action is Action.FAIL and "budget" in d.reason
    assert decide(policy, BASE, [rec(2, Outcome.PREEMPTED)], cls(Outcome.PREEMPTED), attempt=2).action is Action.RETRY


@pytest.mark.parametrize("field", ["backoff_s", "backoff_max_s", "checkpoint_interval", "mtbp_prior_s", "spot_notice_poll_s", "oom_memory_factor"])
@pytest.mark.parametrize("value", [float("inf"), float("nan")])
def test_a_policy_of_endless_waits_is_refused(field: str, value: float) -> None:
    """A backoff of inf would sleep for ever before the retry (the step never ends); an
    interval of inf would never checkpoint. Refused with the field named, as NaN is."""
    with pytest.raises(ValidationError, match=field):
        PreemptionPolicy(**{field: value})
