"""The launch estimate's accuracy on a generated history (prints figures; not a test).

    python benchmarks/estimate.py [--runs 60] [--seed 7]

An asset trains ``--runs`` times in a row on ``spot-then-on-demand`` 8× A100-80GB: each run
needs a work time drawn around 3 h (lognormal, sigma 0.25), is preempted on spot at a
rate of one per 6 h of spot time, loses the work since its last checkpoint (uniform up
to 10 min), and falls back to on-demand after 3 spot preemptions (the policy's default).
Before each run the estimate is made from the runs before it (what a launch sees), and
compared with what the run then cost. Prints the median absolute error, in dollars and
percent, and how often the p90 covered the actual cost, after the first 5 runs.

    python benchmarks/estimate.py --demo

The demo's history instead: the training pods of the demo's October 2026 usage
(``gpu_ops/demo/usage/2026-10.csv``: whole GPUs, no sharing, us-east-1, at the demo's
prices) as runs of one asset per project (a pod is a run of one attempt, preempted ones
with the work they lost). They go through the real tables in a scratch SQLite database:
each run, in launch order, is estimated from the runs of its asset that had ended by its
launch (what a launch sees) and the estimate recorded in ``gpu_launch_estimates``; the
runs go into ``gpu_usage_ledger``; then estimate against actual is what the
``gpu_estimate_accuracy`` asset computes from those two tables
(:func:`gpu_ops.domain.training.estimate.accuracy`). Prints the median absolute error per asset
and over all, for the runs estimated from 5 or more earlier runs.
"""

from __future__ import annotations

import argparse
import datetime as dt
import random
import statistics
from pathlib import Path
from typing import Any

from gpu_ops.domain.compute.request import GpuRequest
from gpu_ops.storage import ledger
from gpu_ops.domain.training.estimate import estimate_launch, run_cost

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


DEMO_USAGE = Path(__file__).resolve().parent.parent / "gpu_ops" / "demo" / "usage" / "2026-10.csv"
MIN_HISTORY = 5  # runs an estimate must come from to be scored


def demo_runs() -> list[ledger.LedgerRow]:
    """The demo's training pods as ledger rows: one run (run_id = pod) of asset = project."""
    import csv

    from gpu_ops.domain.compute.catalog import canonical_gpu_type

    rows = []
    with DEMO_USAGE.open() as f:
        for r in csv.DictReader(f):
            if r["sharing"] != "none" or r["region"] != "us-east-1" or not r["team"] or r["gpu_type"] == "a10":  # the quarantined rows
                continue
            start, end = (dt.datetime.fromisoformat(r[k].replace("Z", "+00:00")) for k in ("start", "end"))
            gpu = canonical_gpu_type(r["gpu_type"])
            rows.append(ledger.LedgerRow(
                start=start, end=end, namespace=r["namespace"], pod=r["pod"], node=r["node"], team=r["team"], project=r["project"], cost_center=r["cost_center"],
                experiment_id=r["experiment_id"], gpu_type=gpu, gpu_count=int(r["gpu_count"]), capacity_type=r["capacity_type"], sharing="none", gpu_share=1.0,
                run_id=r["pod"], asset_key=r["project"], attempt=1, outcome=r["outcome"], last_checkpoint_at=None, lost_seconds=float(r["lost_seconds"]),
                declared_gpu_type=gpu, declared_gpu_count=int(r["gpu_count"]), hardware_source="worker",
            ))
    return sorted(rows, key=lambda row: (row.start, row.run_id))


def demo_accuracy() -> Any:
    """The gpu_estimate_accuracy table of the demo's history (see the module's docstring)."""
    import tempfile

    import pandas as pd

    from gpu_ops.domain.config import DEMO_CONFIG, load_config
    from gpu_ops.storage.tables import TableStore
    from gpu_ops.storage import estimate_store

    prices = load_config(DEMO_CONFIG).prices.gpus
    runs = demo_runs()
    frame = ledger.to_frame(runs)
    with tempfile.TemporaryDirectory() as tmp:
        store = TableStore(f"sqlite:///{tmp}/history.db")
        ledger.append(store, runs)
        for run in runs:
            seen = frame[(frame["asset_key"] == run.asset_key) & (frame["end"] <= pd.Timestamp(run.start))]
            capacity = run.capacity_type
            request = GpuRequest(gpu_type=run.gpu_type, gpus=run.gpu_count, capacity="on-demand" if capacity == "reserved" else capacity)  # type: ignore[arg-type]
            est = estimate_launch(request, seen, prices, asset_key=run.asset_key, capacities=[capacity])
            estimate_store.record(store, run.run_id, run.asset_key, 1, run.start, capacity, est)
        estimates = estimate_store.first_of_runs(estimate_store.read(store))
        table = _materialized_accuracy(Path(tmp), store)
        TableStore.dispose_all()
    return table, estimates


def _materialized_accuracy(tmp: Path, store: Any) -> Any:
    """The gpu_estimate_accuracy asset materialized for each October day (the real asset,
    on a configuration naming the scratch database and the demo's prices), read back."""
    import dagster as dg
    import yaml

    from gpu_ops.domain.config import DEMO_CONFIG, load_config
    from gpu_ops.dagster.cost.assets import build_assets
    from gpu_ops.dagster.resources import GpuOpsSettings
    from gpu_ops.dagster.io_manager import TableIOManager

    url = store.url
    cfg = {"storage": {"url": url}, "prices": str(DEMO_CONFIG.parent / "prices.yaml"),
           "usage": {"sources": [{"type": "ledger"}], "partitions_start": "2026-10-01", "partitions_end": "2026-10-31"}}
    (tmp / "gpu_ops.yaml").write_text(yaml.safe_dump(cfg))
    assets, _ = build_assets(load_config(tmp / "gpu_ops.yaml"))
    resources = {"gpu_ops": GpuOpsSettings(config_path=str(tmp / "gpu_ops.yaml")), "table_io_manager": TableIOManager(url=url)}
    quiet = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}
    days = [(dt.date(2026, 10, 1) + dt.timedelta(days=i)).isoformat() for i in range(31)]
    with dg.DagsterInstance.ephemeral() as instance:
        for day in days:
            result = dg.materialize(assets, partition_key=day, resources=resources, instance=instance, selection=["gpu_estimate_accuracy"], run_config=quiet)
            assert result.success, day
    return store.read("gpu_estimate_accuracy", partition_keys=days)


def demo_main() -> None:
    import pandas as pd

    table, estimates = demo_accuracy()
    enough = estimates.loc[pd.to_numeric(estimates["runs"]) >= MIN_HISTORY, ["run_id", "asset_key"]]
    table = table.merge(enough, on=["run_id", "asset_key"], how="inner")
    scored = table.dropna(subset=["abs_error_usd"])
    print(f"demo history: {len(table)} completed run(s) with an estimate from {MIN_HISTORY}+ earlier runs of their asset, {len(scored)} scored")
    for asset, group in [*scored.groupby("asset_key"), ("all", scored)]:
        print(f"  {asset:<14} runs {len(group):>4}  median absolute error ${group['abs_error_usd'].median():,.2f} "
              f"({group['abs_pct_error'].median():.1f}% of the actual cost); median actual ${group['actual_usd'].median():,.2f}; "
              f"actual within the p90: {int(group['within_p90'].sum())}/{len(group)}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=60)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--demo", action="store_true", help="the demo's history (its October 2026 training pods) instead of a generated one")
    args = parser.parse_args()
    if args.demo:
        demo_main()
        return
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
