"""The launch estimate (gpu_ops.domain.training.estimate): pure, from hand-made ledgers and prices."""

from __future__ import annotations

import datetime as dt

import pytest

from gpu_ops.domain.compute.request import GpuRequest
from gpu_ops.storage import ledger
from gpu_ops.domain.training.estimate import estimate_launch, run_work

T0 = dt.datetime(2026, 3, 2, 8, tzinfo=dt.timezone.utc)
PRICES = {"a100-80gb": {"spot": 2.0, "on-demand": 5.0}}


def row(run: str, attempt: int, outcome: str, seconds: float, *, capacity: str = "spot", lost: float = 0.0, asset: str = "train", at: dt.datetime = T0) -> ledger.LedgerRow:
    return ledger.LedgerRow(
        start=at, end=at + dt.timedelta(seconds=seconds), namespace="ml", pod=f"{run}-{attempt}", node="n", team="nlp", project="p", cost_center="",
        experiment_id="", gpu_type="a100-80gb", gpu_count=8, capacity_type=capacity, sharing="none", gpu_share=1.0, run_id=run, asset_key=asset,
        attempt=attempt, outcome=outcome, last_checkpoint_at=None, lost_seconds=lost, declared_gpu_type="a100-80gb", declared_gpu_count=8, hardware_source="worker",
    )


def frame(*rows: ledger.LedgerRow):  # type: ignore[no-untyped-def]
    return ledger.to_frame(list(rows))


REQ = GpuRequest(gpu_type="a100-80gb", gpus=4, workers=2, capacity="spot")


def test_median_and_p90_of_the_asset_s_successful_runs() -> None:
    # Five completed runs of 1, 2, 3, 4 and 10 hours of work; a failed run is not a sample.
    hours = [1, 2, 3, 4, 10]
    rows = [row(f"r{i}", 1, "completed", h * 3600) for i, h in enumerate(hours)]
    rows.append(row("bad", 1, "user_error", 99 * 3600))
    est = estimate_launch(REQ, frame(*rows), PRICES)
    assert est.basis == "history" and est.runs == 5
    assert est.median_s == 3 * 3600
    assert est.p90_s == pytest.approx(7.6 * 3600)  # linear between 4 h and 10 h
    (leg,) = est.legs
    # 8 GPUs (4 per worker × 2) × $2/h × 3 h.
    assert leg.capacity == "spot" and leg.usd == pytest.approx(48.0)
    assert leg.p90_usd == pytest.approx(8 * 2.0 * 7.6)
    assert est.usd == pytest.approx(48.0) and est.p90_usd == pytest.approx(8 * 2.0 * 7.6)
    assert "5 successful run(s)" in est.describe()


def test_a_run_s_work_is_its_attempts_time_less_the_work_they_lost() -> None:
    # A preempted attempt ran 2 h and lost 30 min after its last checkpoint; the resumed one ran 1.5 h.
    rows = [row("r1", 1, "preempted", 7200, lost=1800), row("r1", 2, "completed", 5400, at=T0 + dt.timedelta(hours=3))]
    work = run_work(frame(*rows))
    assert work.loc[work["run_id"] == "r1", "work_s"].item() == pytest.approx(7200 - 1800 + 5400)


def test_preemption_overhead_the_ledger_saw_on_that_capacity() -> None:
    # Spot: 1 h lost per 9 h of work (an overhead of 1/9); on-demand: none lost.
    rows = [
        row("r1", 1, "preempted", 4 * 3600, lost=3600), row("r1", 2, "completed", 6 * 3600, at=T0 + dt.timedelta(hours=5)),
        row("r2", 1, "completed", 9 * 3600, capacity="on-demand"),
    ]
    est = estimate_launch(REQ, frame(*rows), PRICES)
    (leg,) = est.legs
    assert leg.overhead == pytest.approx(3600 / (3 * 3600 + 6 * 3600))
    assert est.median_s == pytest.approx(9 * 3600)
    assert leg.usd == pytest.approx(8 * 2.0 * 9 * (1 + 1 / 9))


def test_spot_then_on_demand_shows_both_legs() -> None:
    rows = [row("r1", 1, "preempted", 2 * 3600, lost=3600), row("r1", 2, "completed", 3 * 3600)]
    req = REQ.with_capacity("spot-then-on-demand")
    est = estimate_launch(req, frame(*rows), PRICES)
    spot, od = est.legs
    assert (spot.capacity, od.capacity) == ("spot", "on-demand")
    assert spot.usd == pytest.approx(8 * 2.0 * 4 * 1.25)  # 4 h of work, 1 h lost per 4 h on spot
    assert od.usd == pytest.approx(8 * 5.0 * 4)  # nothing lost on on-demand in this ledger
    # The estimate is the leg the launch starts on; its p90 the dearest leg's.
    assert est.usd == pytest.approx(spot.usd) and est.p90_usd == pytest.approx(od.p90_usd)
    assert "spot" in est.describe() and "on-demand" in est.describe()


def test_no_history_is_said_plainly() -> None:
    est = estimate_launch(REQ, frame(), PRICES)
    assert est.basis == "no history" and est.usd is None and est.p90_usd is None
    assert est.describe().startswith("no history")
    # Only failed runs: still no history.
    est = estimate_launch(REQ, frame(row("r", 1, "user_error", 60)), PRICES)
    assert est.basis == "no history"


def test_a_declared_duration_until_the_asset_has_runs() -> None:
    est = estimate_launch(REQ, frame(), PRICES, declared_s=2 * 3600)
    assert est.basis == "declared" and est.median_s == est.p90_s == 7200
    assert est.usd == pytest.approx(8 * 2.0 * 2)
    # Once the asset has a successful run, its history is the estimate.
    est = estimate_launch(REQ, frame(row("r", 1, "completed", 3600)), PRICES, declared_s=2 * 3600)
    assert est.basis == "history" and est.usd == pytest.approx(16.0)


def test_only_the_asset_s_own_runs_and_the_rest_of_this_run() -> None:
    rows = [row("r1", 1, "completed", 3600), row("other", 1, "completed", 100 * 3600, asset="other")]
    assert estimate_launch(REQ, frame(*rows), PRICES, asset_key="train").median_s == 3600
    # A retry of a run that already did 40 min of work is estimated for what is left.
    est = estimate_launch(REQ, frame(*rows), PRICES, asset_key="train", done_s=2400)
    assert est.remaining_s == pytest.approx(1200) and est.usd == pytest.approx(8 * 2.0 * 1200 / 3600)


def test_an_unpriced_capacity_is_unknown_not_zero() -> None:
    est = estimate_launch(REQ, frame(row("r", 1, "completed", 3600)), {"a100-80gb": {"on-demand": 5.0}})
    assert est.usd is None and "no price" in est.describe()


def test_a_cpu_run_is_timed_by_its_duration() -> None:
    # The demo: a CPU run records gpu_count 0; its wall time still says how long the asset trains.
    cpu = ledger.LedgerRow(**{**row("r", 1, "completed", 1800).__dict__, "gpu_type": "cpu", "gpu_count": 0})
    est = estimate_launch(REQ, frame(cpu), PRICES)
    assert est.median_s == 1800 and est.usd == pytest.approx(8 * 2.0 * 0.5)
