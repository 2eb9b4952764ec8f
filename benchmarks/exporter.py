"""Exporter benchmark: what one scrape costs as history grows.

A gpu_ops database (SQLite file, or PostgreSQL with ``--pg URL``) is filled with a
month of compact cost tables (``gpu_cost_daily``, ``gpu_roi_report``,
``gpu_budget_status``: 31 partitions) plus a newest ``gpu_usage`` day of ``--usage-rows``
rows, and a growing history of append-only rows (ledger attempts and alert deliveries) of
each size in ``--history``. For each size it times one scrape (every source read and all
families rendered) with the history sums re-read (what a scrape costs once every
``--history-seconds``) and with them cached (every other scrape), beside two floors
measured in the same run on the same database: ``SELECT 1`` round trips (one per source)
and a bare ``COUNT(*)`` of the ledger (the least any scan of it costs).

Prints figures only. Usage:
``python benchmarks/exporter.py [--history 10000,100000,1000000] [--usage-rows 100000] [--pg URL]``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import sqlalchemy as sa

from gpu_ops.observability.exporter import build_registry
from gpu_ops.observability.readers import Reader
from gpu_ops.storage.tables import TableStore

DAYS = [f"2026-10-{d:02d}" for d in range(1, 32)]
TEAMS = [f"team-{i}" for i in range(20)]


def month(store: TableStore, usage_rows: int) -> None:
    rng = np.random.default_rng(1)
    daily = pd.DataFrame([
        {"day": dt.date.fromisoformat(d), "kind": "allocated", "team": t, "project": f"{t}-p{j}", "namespace": f"ns-{t}", "cost_center": "cc",
         "labels": "{}", "label_keys": "[]", "intervals": 10, "gpu_hours": float(rng.uniform(1, 100)), "cost_usd": float(rng.uniform(1, 500)),
         "on_demand_usd": 600.0, "partition_key": d}
        for d in DAYS for t in TEAMS for j in range(5)
    ])
    store.write("gpu_cost_daily", daily, partition_keys=DAYS)
    roi = pd.DataFrame([
        {"team": t, "spot_savings_usd": 1.0, "reserved_savings_usd": 2.0, "sharing_savings_usd": 3.0, "preemption_waste_usd": 0.5,
         "preemption_lost_gpu_hours": 0.1, "partition_key": d}
        for d in DAYS for t in TEAMS
    ])
    store.write("gpu_roi_report", roi, partition_keys=DAYS)
    status = pd.DataFrame([
        {"budget": f"b-{t}", "period": "monthly", "amount_usd": 1e4, "spend_usd": 5e3, "percent_used": 50.0, "forecast_usd": 9e3, "status": "ok",
         "thresholds_crossed": ["50%"], "days_missing": 0, "partition_key": d}
        for d in DAYS for t in TEAMS
    ])
    store.write("gpu_budget_status", status, partition_keys=DAYS)
    n = usage_rows
    usage = pd.DataFrame({
        "kind": "allocated", "team": rng.choice(TEAMS, n), "namespace": "ns", "pod": [f"pod-{i % 5000}" for i in range(n)],
        "gpu_type": rng.choice(["h100", "a100-80gb", "l4"], n), "capacity_type": rng.choice(["spot", "on-demand"], n),
        "gpu_hours": rng.uniform(0, 2, n), "cost_usd": rng.uniform(0, 20, n), "partition_key": DAYS[-1],
    })
    store.write("gpu_usage", usage, partition_keys=[DAYS[-1]])


def history(store: TableStore, rows: int) -> None:
    """Append ledger attempts and alert deliveries up to ``rows`` each."""
    rng = np.random.default_rng(rows)
    t0 = pd.Timestamp("2025-01-01", tz="UTC")
    start = t0 + pd.to_timedelta(rng.integers(0, 600 * 86400, rows), unit="s")
    ledger = pd.DataFrame({
        "start": start, "end": start + pd.to_timedelta(rng.integers(60, 7200, rows), unit="s"), "namespace": "ns", "pod": "", "node": "n",
        "team": rng.choice(TEAMS, rows), "project": "p", "cost_center": "", "experiment_id": "", "gpu_type": rng.choice(["h100", "a100-80gb"], rows),
        "gpu_count": rng.integers(1, 9, rows), "capacity_type": rng.choice(["spot", "on-demand"], rows), "sharing": "none", "gpu_share": 1.0,
        "run_id": [f"run-{i // 3}" for i in range(rows)], "asset_key": rng.choice(["a", "b", "c"], rows), "attempt": [i % 3 + 1 for i in range(rows)],
        "outcome": rng.choice(["completed", "preempted"], rows), "lost_seconds": rng.uniform(0, 300, rows),
    })
    store.write("gpu_usage_ledger", ledger)
    deliveries = pd.DataFrame({"budget": rng.choice([f"b-{t}" for t in TEAMS], rows), "channel": "slack", "channel_type": "slack",
                               "status": rng.choice(["delivered", "failed"], rows), "at": start})
    store.write("gpu_alert_deliveries", deliveries)


def timed(fn, repeat: int = 5) -> float:  # type: ignore[no-untyped-def]
    samples = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t)
    return statistics.median(samples)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--history", default="10000,100000,1000000")
    ap.add_argument("--usage-rows", type=int, default=100_000)
    ap.add_argument("--pg", default=None, help="a scratch PostgreSQL database URL (its tables are replaced)")
    args = ap.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="gpu-ops-exporter-bench-"))
    url = args.pg or f"sqlite:///{folder / 'costs.db'}"
    store = TableStore(url)
    month(store, args.usage_rows)
    quotas = {"team": {t: 64 for t in TEAMS}}
    reader = Reader(store, quotas=quotas)  # history_s=0: every read sums the whole history
    from prometheus_client import generate_latest

    print(f"database {store.dialect}; newest gpu_usage day: {args.usage_rows:,} rows; 31 days of compact tables")
    print(f"{'history rows':>14} {'scrape, sums re-read':>21} {'scrape, sums cached':>20} {'floor: SELECT 1 x11':>20} {'floor: COUNT(*) ledger':>23} {'series':>7}")
    for n in [int(x) for x in args.history.split(",")]:
        history(store, n)
        registry = build_registry(reader, cache_seconds=0)
        text = generate_latest(registry).decode()
        series = sum(1 for line in text.splitlines() if line and not line.startswith("#"))
        scrape = timed(lambda: generate_latest(registry))
        cached = Reader(store, quotas=quotas, history_s=1e9)
        cached.read()  # the sums, once
        between = timed(lambda: generate_latest(build_registry(cached, cache_seconds=0)))

        def ping11() -> None:
            for _ in range(11):
                with store.engine.connect() as conn:
                    conn.execute(sa.text("SELECT 1"))

        def count() -> None:
            with store.engine.connect() as conn:
                conn.execute(sa.text('SELECT COUNT(*) FROM "gpu_usage_ledger"')).scalar()

        print(f"{n:>14,} {scrape * 1000:>18.1f} ms {between * 1000:>17.1f} ms {timed(ping11) * 1000:>17.1f} ms {timed(count) * 1000:>20.1f} ms {series:>7}")


if __name__ == "__main__":
    main()
