"""One `budget_alert_sensor` tick at 10,000 and 100,000 budgets with 5 thresholds each.

    flock /tmp/gpu_ops_bench.lock .venv/bin/python benchmarks/alerts.py [--budgets 10000,100000] [--repeat 3]

Builds a configuration of N budgets (benchmarks/fleet.py: 5 thresholds each, every 10th
throttles) and one `gpu_budget_status` partition of N rows in SQLite, then times, with
the real sensor through Dagster's `evaluate_tick` on a real instance:

  1. the first tick (empty cursor: about a third of the budgets cross thresholds; at most
     alerts.max_runs_per_tick (500) run requests, the rest queued in the cursor);
  2. a queue tick (the stored cursor, no new data: the next 500 queued alerts requested);
  3. a steady-state tick (same data, the queue drained: nothing to send; every alert of
     tick 1 is still pending, its run not launched, so the redelivery pass runs too);
  4. a next-day tick (10% of the budgets cross one more threshold) after the steady one;
  5. a new month's first tick (the period rolls over for every budget with a state);

next to, in the same process, the old path on the same steady state (every row turned
into a StatusRow and evaluated in Python, every state copied, the version-1 cursor with
one JSON object per budget) and two floors: fetching the N status rows as raw tuples,
and a stateless Python loop over every threshold of every budget. Goal: each tick
under 2 s (Dagster's sensor timeout is 60 s). Prints the median of --repeat runs, wall
and CPU seconds of this process (on a shared machine the CPU time says more), and the
load average.
"""

from __future__ import annotations

import argparse
import base64
import datetime as dt
import json
import os
import statistics
import sys
import tempfile
import time
import zlib
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).parent))
from fleet import budget_name, fleet_data  # noqa: E402


def build(n: int, folder: Path):
    from gpu_ops.domain.config import parse_config

    return parse_config(fleet_data(n, folder), folder / "gpu_ops.yaml")


def status(n: int, day: str, spend: np.ndarray) -> pd.DataFrame:
    start = dt.date(2026, 11, 1)
    return pd.DataFrame(
        {
            "budget": [budget_name(i) for i in range(n)],
            "period_start": start,
            "period_end": dt.date(2026, 11, 30),  # inclusive, as the cost asset writes it
            "amount_usd": 10_000.0,
            "spend_usd": spend,
            "percent_used": spend / 100.0,
            "forecast_usd": spend * 1.4,
            "status": np.where(spend >= 10_000, "exceeded", np.where(spend >= 8_000, "warning", "ok")),
            "thresholds_crossed": [[] for _ in range(n)],
            "scope": "{}",
            "as_of": pd.Timestamp(day, tz="UTC") + pd.Timedelta(days=1),
        }
    )


def old_steady(store, config, cursor_text: str, now: dt.datetime) -> float:
    """The pre-fleet path on the same state: version-1 cursor, every row in detail."""
    from gpu_ops.flows.alerts.records import read_latest_status
    from gpu_ops.domain.alerts.state import AlertCursor, evaluate

    c = AlertCursor.decode(cursor_text)
    v1 = json.dumps({"v": 1, "m": c.last_storage_id, "at": None, "b": {k: s.to_json() for k, s in c.budgets.items() if not s.empty},
                     "r": {k: p.to_json() for k, p in c.pending.items()}}, separators=(",", ":"))
    v1 = "z:" + base64.b64encode(zlib.compress(v1.encode(), 6)).decode()
    t = time.perf_counter()
    old = AlertCursor.decode(v1)
    _, table = read_latest_status(store)
    rows = [table.row(i) for i in range(len(table))]
    state = {name: st.copy() for name, st in old.budgets.items()}
    result = evaluate({b.name: b for b in config.budgets}, rows, state, now)
    text = json.dumps({"v": 1, "b": {k: s.to_json() for k, s in result.state.items() if not s.empty}, "r": {k: p.to_json() for k, p in old.pending.items()}}, separators=(",", ":"))
    base64.b64encode(zlib.compress(text.encode(), 6))
    return time.perf_counter() - t


def run(n: int, repeat: int) -> None:
    import logging

    import dagster as dg

    logging.getLogger("dagster").setLevel(logging.WARNING)  # the sensor's per-tick summary line

    from gpu_ops.dagster.alerts.definitions import build_defs
    from gpu_ops.domain.alerts.state import STATUS_TABLE
    from gpu_ops.domain.alerts.redelivery import Pending
    from gpu_ops.domain.alerts.state import AlertCursor
    from gpu_ops.dagster.resources import GpuOpsSettings
    from gpu_ops.storage.tables import TableStore

    rng = np.random.default_rng(7)
    with tempfile.TemporaryDirectory() as tmp, dg.instance_for_test(temp_dir=tmp) as instance:
        folder = Path(tmp)
        t0 = time.perf_counter()
        config = build(n, folder)
        config_s = time.perf_counter() - t0
        store = TableStore.from_config(config)
        day1 = rng.uniform(0, 9_000, n)  # a third cross 50% (some 80%, a few forecast)

        # The sensor reads the file through GpuOpsSettings; give it the parsed object.
        class Settings(GpuOpsSettings):
            def load(self):  # type: ignore[override]
                return config

        resources = {"gpu_ops": Settings()}
        defs = dg.Definitions.merge(build_defs(config), dg.Definitions(resources=resources))
        sensor = defs.resolve_sensor_def("budget_alert_sensor")

        def tick(cursor: str | None, timings: list[tuple[float, float]]):
            ctx = dg.build_sensor_context(instance=instance, cursor=cursor, resources=resources)
            t, c = time.perf_counter(), time.process_time()
            data = sensor.evaluate_tick(ctx)
            timings.append((time.perf_counter() - t, time.process_time() - c))
            return data

        def forced(cursor: str, drained: bool = False) -> str:
            c = AlertCursor.decode(cursor)
            c.evaluated_at = None
            if drained:  # as if every queued alert had been requested already (their runs not launched)
                for alert in c.queue.pop(len(c.queue)):
                    c.pending[alert.run_key] = Pending(time.time(), time.time())
            return c.encode()

        first: list[tuple[float, float]] = []
        queued: list[tuple[float, float]] = []
        steady: list[tuple[float, float]] = []
        nextday: list[tuple[float, float]] = []
        rollover: list[tuple[float, float]] = []
        old, read_floor, loop_floor = [], [], []
        for _ in range(repeat):
            store.write(STATUS_TABLE, status(n, "2026-11-19", day1), partition_keys=["2026-11-19"])
            d1 = tick(None, first)
            dq = tick(d1.cursor, queued)
            assert len(dq.run_requests) == min(len(AlertCursor.decode(d1.cursor).queue), config.alerts.max_runs_per_tick), "a queue tick requests the next alerts"
            drained = forced(d1.cursor, drained=True)
            d2 = tick(drained, steady)
            assert not d2.run_requests, "a steady tick must request nothing"
            old.append(old_steady(store, config, drained, dt.datetime.now(dt.timezone.utc)))
            bump = day1.copy()
            idx = rng.choice(n, n // 10, replace=False)
            bump[idx] += 3_500
            store.write(STATUS_TABLE, status(n, "2026-11-20", bump), partition_keys=["2026-11-20"])
            d3 = tick(forced(drained), nextday)
            store.delete(STATUS_TABLE, {"partition_key": "2026-11-20"})
            december = status(n, "2026-12-01", day1 / 6)  # a new period: every stored state starts afresh
            december["period_start"], december["period_end"] = dt.date(2026, 12, 1), dt.date(2026, 12, 31)
            store.write(STATUS_TABLE, december, partition_keys=["2026-12-01"])
            d4 = tick(forced(drained), rollover)
            store.delete(STATUS_TABLE, {"partition_key": "2026-12-01"})

            # Floors: fetch the same columns as raw tuples; compare every threshold with no state.
            t = time.perf_counter()
            with store.engine.connect() as conn:
                raw = conn.exec_driver_sql(
                    "SELECT budget, period_start, period_end, amount_usd, spend_usd, percent_used, forecast_usd, partition_key, as_of "
                    "FROM gpu_budget_status WHERE partition_key = '2026-11-19'"
                ).fetchall()
            read_floor.append(time.perf_counter() - t)
            df = pd.DataFrame({"budget": [r[0] for r in raw], "spend_usd": [r[4] for r in raw], "forecast_usd": [r[6] for r in raw]})
            t = time.perf_counter()
            lines = [(b.name, [(th.basis, th.amount_usd(b.amount_usd)) for th in b.thresholds]) for b in config.budgets]
            spend = dict(zip(df["budget"], zip(df["spend_usd"], df["forecast_usd"])))
            crossed = sum(1 for name, ths in lines for basis, line in ths if spend[name][basis == "forecast"] >= line)
            loop_floor.append(time.perf_counter() - t)

        med = statistics.median
        load = os.getloadavg()

        def wall_cpu(t: list[tuple[float, float]]) -> str:
            return f"{med(w for w, _ in t):6.3f} s wall {med(c for _, c in t):6.3f} s CPU"

        waiting = len(AlertCursor.decode(d1.cursor).queue)
        print(f"budget_alert_sensor: {n:,} budgets x 5 thresholds (config parse {config_s:.1f} s, not in the tick); load average {load[0]:.2f} {load[1]:.2f} on {os.cpu_count()} CPUs")
        print(f"  first tick   (empty cursor)        {wall_cpu(first)}   {len(d1.run_requests):>6,} run requests, {waiting:,} queued, cursor {len(d1.cursor):,} chars")
        print(f"  queue tick   (no new data)         {wall_cpu(queued)}   {len(dq.run_requests):>6,} run requests, {len(AlertCursor.decode(dq.cursor).queue):,} still queued")
        print(f"  steady tick  (queue drained)       {wall_cpu(steady)}   {len(d2.run_requests):>6,} run requests, {len(AlertCursor.decode(d2.cursor).pending):,} alerts pending")
        print(f"  next-day tick (10% cross more)     {wall_cpu(nextday)}   {len(d3.run_requests):>6,} run requests, {len(AlertCursor.decode(d3.cursor).queue):,} queued")
        print(f"  new month (period rolls over)      {wall_cpu(rollover)}   {len(d4.run_requests):>6,} run requests")
        print(f"  old path, steady (per-row, v1 cursor) {med(old):6.3f} s   (the same state, in this process)")
        print(f"  floor: SELECT {n:,} status rows    {med(read_floor):6.3f} s")
        print(f"  floor: stateless threshold loop    {med(loop_floor):6.3f} s   ({crossed:,} crossings)")
        worst = max(med(w for w, _ in t) for t in (first, queued, steady, nextday, rollover))
        print(f"  goal: every tick < 2 s -> {'met' if worst < 2 else 'NOT met'} in wall time (worst {worst:.3f} s)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--budgets", default="10000,100000", help="comma-separated sizes")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    for n in (int(x) for x in args.budgets.split(",") if x):
        run(n, args.repeat if n <= 10_000 else max(1, args.repeat // 3))


if __name__ == "__main__":
    main()
