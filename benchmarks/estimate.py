"""The launch estimate's accuracy on a generated history (prints figures; not a test).

    python benchmarks/estimate.py [--runs 60] [--seed 7]

An asset trains ``--runs`` times in a row on ``spot-then-on-demand`` 8× A100-80GB: each run
needs a work time drawn around 3 h (lognormal, sigma 0.25), is preempted on spot at a
rate of one per 6 h of spot time, loses the work since its last checkpoint (uniform up
to 10 min), and falls back to on-demand after 3 spot preemptions (the policy's default).
Before each run the estimate is made from the runs before it (what a launch sees), and
compared with what the run then cost. Prints the median absolute error, in dollars and
percent, and how often the p90 covered the actual cost, after the first 5 runs.
"""

from __future__ import annotations

import argparse
import datetime as dt
import random
import statistics

from gpu_ops.compute.request import GpuRequest
from gpu_ops.training import ledger
from gpu_ops.training.estimate import estimate_launch, run_cost

PRICES = {"a100-80gb": {"spot": 1.79, "on-demand": 5.12}}
REQ = GpuRequest(gpu_type="a100-80gb", gpus=8, capacity="spot-then-on-demand")
T0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)


def one_run(rng: random.Random, run: str, at: dt.datetime) -> list[ledger.LedgerRow]:
    need = rng.lognormvariate(0.0, 0.25) * 3 * 3600
    rows, attempt, spot_preemptions = [], 1, 0
    while need > 0:
        capacity = "spot" if spot_preemptions < 3 else "on-demand"
        until_preempted = rng.expovariate(1 / (6 * 3600)) if capacity == "spot" else float("inf")
        if until_preempted >= need:
            rows.append(_row(run, attempt, at, need, capacity, "completed", 0.0))
            break
        lost = min(until_preempted, rng.uniform(0, 600))
        rows.append(_row(run, attempt, at, until_preempted, capacity, "preempted", lost))
        need -= until_preempted - lost
        at += dt.timedelta(seconds=until_preempted + 60)
        attempt, spot_preemptions = attempt + 1, spot_preemptions + 1
    return rows


def _row(run: str, attempt: int, at: dt.datetime, seconds: float, capacity: str, outcome: str, lost: float) -> ledger.LedgerRow:
    return ledger.LedgerRow(
        start=at, end=at + dt.timedelta(seconds=seconds), namespace="ml", pod=f"{run}-{attempt}", node="n", team="nlp", project="p", cost_center="",
        experiment_id="", gpu_type="a100-80gb", gpu_count=8, capacity_type=capacity, sharing="none", gpu_share=1.0, run_id=run, asset_key="train",
        attempt=attempt, outcome=outcome, last_checkpoint_at=None, lost_seconds=lost, declared_gpu_type="a100-80gb", declared_gpu_count=8, hardware_source="worker",
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=60)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    history: list[ledger.LedgerRow] = []
    errors, pct, covered = [], [], 0
    for i in range(args.runs):
        est = estimate_launch(REQ, ledger.to_frame(history), PRICES)
        rows = one_run(rng, f"r{i}", T0 + dt.timedelta(days=i))
        actual = float(run_cost(ledger.to_frame(rows), PRICES).sum())
        history.extend(rows)
        if i < 5 or est.usd is None or est.p90_usd is None:
            continue
        errors.append(abs(actual - est.usd))
        pct.append(abs(actual - est.usd) / actual * 100)
        covered += actual <= est.p90_usd
    print(f"runs scored: {len(errors)} (after 5 of history); median absolute error ${statistics.median(errors):.2f} ({statistics.median(pct):.1f}% of the actual cost); "
          f"actual within the p90: {covered}/{len(errors)}")


if __name__ == "__main__":
    main()
