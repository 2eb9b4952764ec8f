"""Exporter benchmark: what one scrape costs at scale, as history grows, and against a
silent database.

A gpu_ops database (SQLite file, or PostgreSQL with ``--pg URL``) is filled with a
month of compact cost tables (``gpu_cost_daily``, ``gpu_roi_report``: 31 partitions),
``gpu_budget_status`` of ``--budgets`` budgets (31 partitions), a newest ``gpu_usage`` day
of ``--usage-rows`` rows (also written as row-level Parquet, ``storage.row_level_path``),
and a growing history of append-only rows (ledger attempts and alert deliveries) of each
size in ``--history``. It prints:

1. for each history size, one scrape (every source read and all families rendered, as
   ``/metrics`` answers) with the history sums re-read (what a scrape costs once every
   ``--history-seconds``) and with them cached (every other scrape), beside two floors
   measured in the same run on the same database: ``SELECT 1`` round trips (one per
   source) and a bare ``COUNT(*)`` of the ledger (the least any scan of it costs); the
   same scrape with ``gpu_usage`` read from its Parquet file; and each source's read
   alone (the sources run side by side: the scrape is about the slowest, not the sum).
   Goal: at 10,000 budgets and a million usage rows, a scrape within 2 s.
2. three scrapes in a row against a TCP listener on 127.0.0.1 that accepts and never
   answers (``storage.connect_timeout_s`` 10 s, past the deadline), each with how many
   sources were served as ``gpu_ops_exporter_read_ok 0``. Goal: each within
   ``--deadline`` (the exporter's ``--deadline-seconds``).

Prints figures only. Usage:
``flock /tmp/gpu_ops_bench.lock python benchmarks/exporter.py [--budgets 10000] [--usage-rows 1000000] [--history 10000,100000,1000000] [--pg URL]``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import logging
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import sqlalchemy as sa

from gpu_ops.cli.exporter import Scrapes
from gpu_ops.flows.observability.readers import DEFAULT_DEADLINE_S, Reader
from gpu_ops.storage.files import PartitionFiles
from gpu_ops.storage.tables import TableStore
from gpu_ops_tests.observability.servers import silent_listener

DAYS = [f"2026-10-{d:02d}" for d in range(1, 32)]
TEAMS = [f"team-{i}" for i in range(20)]


def month(store: TableStore, budgets: int) -> None:
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
    n = budgets * len(DAYS)
    status = pd.DataFrame({
        "budget": np.tile([f"b-{i}" for i in range(budgets)], len(DAYS)), "period": "monthly", "amount_usd": 1e4, "spend_usd": rng.uniform(0, 2e4, n),
        "percent_used": rng.uniform(0, 200, n), "forecast_usd": 9e3, "status": rng.choice(["ok", "warning", "exceeded"], n),
        "thresholds_crossed": [["actual-50pct"]] * n, "days_missing": 0, "severity": rng.choice(["none", "info", "warning", "critical"], n),
        "partition_key": np.repeat(DAYS, budgets),
    })
    store.write("gpu_budget_status", status, partition_keys=DAYS)


def usage_day(rows: int) -> pd.DataFrame:
    rng = np.random.default_rng(2)
    return pd.DataFrame({
        "kind": "allocated", "team": rng.choice(TEAMS, rows), "namespace": "ns", "pod": [f"pod-{i % 5000}" for i in range(rows)],
        "gpu_type": rng.choice(["h100", "a100-80gb", "l4"], rows), "capacity_type": rng.choice(["spot", "on-demand"], rows),
        "gpu_hours": rng.uniform(0, 2, rows), "cost_usd": rng.uniform(0, 20, rows),
    })


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
    deliveries = pd.DataFrame({"budget": rng.choice([f"b-{i}" for i in range(100)], rows), "channel": "slack", "channel_type": "slack",
                               "status": rng.choice(["delivered", "failed"], rows), "at": start})
    store.write("gpu_alert_deliveries", deliveries)


def timed(fn: Callable[[], object], repeat: int = 5) -> float:
    samples = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t)
    return statistics.median(samples)


def scrape(reader: Reader) -> bytes:
    """What /metrics answers: one read and every family rendered as exposition text."""
    return Scrapes(reader, cache_seconds=0).text()


def primed(reader: Reader) -> Reader:
    """``reader`` once its sums of the append-only tables are in (a read past the deadline goes on)."""
    reader.read()
    while reader.in_flight():
        time.sleep(0.1)
    return reader


def per_source(reader: Reader) -> str:
    """Each source's read alone (median of 3), slowest first."""
    times = {name: timed(lambda: step(time.monotonic() + 600), repeat=3) for name, step in reader.steps().items()}
    return ", ".join(f"{name} {t * 1000:.0f} ms" for name, t in sorted(times.items(), key=lambda kv: -kv[1]))


def at_scale(store: TableStore, files: PartitionFiles, sizes: list[int], deadline: float) -> None:
    quotas = {"team": {t: 64 for t in TEAMS}}
    print(f"{'history rows':>14} {'scrape, sums re-read':>21} {'sums cached':>12} {'row-level usage':>16} {'floor: SELECT 1 x11':>20} {'floor: COUNT(*) ledger':>23} {'series':>7}")
    for n in sizes:
        t = time.perf_counter()
        history(store, n)
        written = time.perf_counter() - t
        reader = Reader(store, quotas=quotas, deadline_s=deadline)  # history_s=0: every read sums the whole history
        series = sum(1 for line in scrape(reader).decode().splitlines() if line and not line.startswith("#"))
        full = timed(lambda: scrape(reader))
        cached = primed(Reader(store, quotas=quotas, history_s=1e9, deadline_s=deadline))
        between = timed(lambda: scrape(cached))
        row_level_reader = primed(Reader(store, quotas=quotas, history_s=1e9, files=files, deadline_s=deadline))
        row_level = timed(lambda: scrape(row_level_reader))

        def ping11() -> None:
            for _ in range(11):
                with store.reading() as conn:
                    conn.execute(sa.text("SELECT 1"))

        def count() -> None:
            with store.reading() as conn:
                conn.execute(sa.text('SELECT COUNT(*) FROM "gpu_usage_ledger"')).scalar()

        print(f"{n:>14,} {full * 1000:>18.1f} ms {between * 1000:>9.1f} ms {row_level * 1000:>13.1f} ms {timed(ping11) * 1000:>17.1f} ms "
              f"{timed(count) * 1000:>20.1f} ms {series:>7}   (history written in {written:.0f} s)")
        print(f"{'':>14} each source alone: {per_source(reader)}")


def silent(deadline: float) -> None:
    """Three scrapes in a row against a listener that accepts and never answers."""
    with silent_listener() as port:
        _scrape_silent(port, deadline)


def _scrape_silent(port: int, deadline: float) -> None:
    store = TableStore(f"postgresql://gpu_ops@127.0.0.1:{port}/costs", connect_timeout_s=10)
    reader = Reader(store, deadline_s=deadline)
    print(f"silent database (accepts, never answers; connect timeout 10 s), deadline {deadline:g} s:")
    for i in range(3):
        t = time.perf_counter()
        text = scrape(reader).decode()
        took = time.perf_counter() - t
        zeros = sum(1 for line in text.splitlines() if line.startswith("gpu_ops_exporter_read_ok{") and line.endswith(" 0.0"))
        print(f"  scrape {i + 1}: {took * 1000:.0f} ms, {zeros} sources at gpu_ops_exporter_read_ok 0")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--history", default="10000,100000,1000000")
    ap.add_argument("--usage-rows", type=int, default=1_000_000)
    ap.add_argument("--budgets", type=int, default=10_000)
    ap.add_argument("--deadline", type=float, default=DEFAULT_DEADLINE_S)
    ap.add_argument("--pg", default=None, help="a scratch PostgreSQL database URL (its tables are replaced)")
    args = ap.parse_args()
    logging.getLogger("gpu_ops.exporter").setLevel(logging.ERROR)  # the silent database's read failures, once per source and scrape
    folder = Path(tempfile.mkdtemp(prefix="gpu-ops-exporter-bench-"))
    store = TableStore(args.pg or f"sqlite:///{folder / 'costs.db'}")
    files = PartitionFiles(folder / "rows")
    t = time.perf_counter()
    month(store, args.budgets)
    day = usage_day(args.usage_rows)
    store.write("gpu_usage", day, partition_keys=[DAYS[-1]])
    files.write("gpu_usage", day, [DAYS[-1]])
    print(f"database {store.dialect}; {args.budgets:,} budgets and 31 days of compact tables; newest gpu_usage day: {args.usage_rows:,} rows "
          f"(SQL and Parquet); written in {time.perf_counter() - t:.0f} s; {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}")
    at_scale(store, files, [int(x) for x in args.history.split(",")], args.deadline)
    silent(args.deadline)


if __name__ == "__main__":
    main()
