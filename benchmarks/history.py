"""The daily cost flow against history: does one day cost what the day costs?

    .venv/bin/python benchmarks/history.py [--section NAME ...] [--intervals N] [--pg URL]

Sections (all by default):
  usage_files    the gpu_usage step for one day with 3, 30 and 365 daily Parquet files
                 present (--rows-per-day intervals each), in two layouts: a flat folder
                 matched by a glob (other days' files ruled out by footer summaries cached
                 in the database, after the day before's run read their footers) and
                 `exports/day={date}/*.parquet` (other days never listed). Goal: flat
                 within 1.2x across history.
  usage_ledger   the same step with a gpu_usage_ledger of 1, 30 and 365 days (SQLite,
                 --ledger-rows-per-day rows a day; an indexed range query).
  budget_status  gpu_budget_status on day 1, 10 and 30 of a month whose days are all in
                 gpu_cost_daily (goal: day 30 within 1.5x of day 1).
  daily_job      the four cost assets for one day of --intervals (default 1M) usage
                 intervals on PostgreSQL, days 1 and 2: wall time and peak RSS per step,
                 rows written per second (goal: < 60 s and < 2 GB peak for the day).
  daily_job_mp   the daily job as users run it: `dagster job execute -j daily_gpu_cost_job`
                 (what the schedule runs: in-process executor), beside `dagster asset
                 materialize` of every cost asset (the implicit job: multiprocess
                 executor) and the one-process baseline (DuckDB applies the rules and
                 the identity, prices, writes row-level Parquet, builds attribution,
                 daily and budget tables and COPYs them into PostgreSQL), interleaved
                 --repeat times (best); day 1 and day 30, nested and independent keys;
                 wall time, the ratio to the baseline, and the process tree's peak, as
                 summed RSS (every process's resident pages, shared ones counted in
                 each) and summed PSS (each page once: what the tree holds) (--steps:
                 each step's work, start-up and peak; --row-level-mp
                 parquet|postgresql). Goal (issue 39): the job <= 2x the baseline,
                 <= 1 GiB of tree peak, day 30 <= 1.1x day 1.
Big runs hold the benchmark lock:
    flock /tmp/gpu_ops_bench.lock .venv/bin/python benchmarks/history.py --section daily_job
The PostgreSQL server is --pg (default $GPU_OPS_TEST_PG or postgres@127.0.0.1/test); a
scratch database is created for the run and dropped after.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import os
import tempfile
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from gpu_ops.flows.cost.footers import SETTLE_NS

REPO = Path(__file__).resolve().parents[1]
PRICES = REPO / "gpu_ops" / "demo" / "prices.yaml"
PG_ADMIN = os.environ.get("GPU_OPS_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")
MONTH = dt.date(2026, 10, 1)
US_PER_H = 3_600 * 10**6
GPU_TYPES = ["a100-80gb", "h100", "l40s", "l4", "a10g", "h200"]
TEAMS, PROJECTS = 25, 200


# --------------------------------------------------------------------------- helpers


def load_note() -> str:
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg()) + f", {os.cpu_count()} cores"


def scratch_database(admin_url: str) -> contextlib.AbstractContextManager[str]:
    from gpu_ops.storage.scratch import scratch_database as scratch

    return scratch(admin_url, prefix="gpu_ops_bench")


def month_days(n: int) -> list[dt.date]:
    return [MONTH + dt.timedelta(days=i) for i in range(n)]


def write_usage_day(path: Path, day: dt.date, n: int, seed: int = 0, **shape: Any) -> None:
    pq.write_table(usage_day(day, n, seed, **shape), path, row_group_size=256_000)


def usage_day(day: dt.date, n: int, seed: int = 0, open_share: float = 0.01, first_h: int = -2, last_h: int = 23, max_h: float | None = None, keys: str = "nested") -> pa.Table:
    """``n`` intervals that start in ``[day + first_h, day + last_h)`` (by default some from
    the evening before), ``open_share`` of them still open, at most ``max_h`` hours long,
    keyed the way a fleet is: each project belongs to one team, namespace and cost
    center, so budget scopes have hundreds of key combinations, not millions."""
    rng = np.random.default_rng(seed + day.toordinal())
    day_us = int(np.datetime64(day.isoformat(), "us").astype(np.int64))
    start = day_us + first_h * US_PER_H + rng.integers(0, (last_h - first_h) * US_PER_H, n)
    length = rng.exponential(2 * US_PER_H, n).astype(np.int64) + 60_000_000
    end = start + (length if max_h is None else np.minimum(length, int(max_h * US_PER_H)))
    open_ = rng.random(n) < open_share
    project = rng.integers(0, PROJECTS, n)
    team = project % TEAMS
    # "independent": team, namespace and cost center vary on their own (as real clusters
    # have them), so the combinations of keys are as many as the day's intervals allow.
    namespace = rng.integers(0, 400, n) if keys == "independent" else team
    cost_center = rng.integers(0, 50, n) if keys == "independent" else team % 10
    if keys == "independent":
        team = rng.integers(0, TEAMS, n)
    sharing = rng.choice(4, n, p=[0.85, 0.07, 0.04, 0.04])
    share = np.choose(sharing, [np.ones(n), np.full(n, 1 / 7), np.full(n, 0.5), np.full(n, 0.25)])

    def coded(codes: np.ndarray, names: list[str]) -> pa.DictionaryArray:
        return pa.DictionaryArray.from_arrays(pa.array(codes.astype(np.int32)), pa.array(names))

    return pa.table(
        {
            "start": pa.array(start, pa.timestamp("us", tz="UTC")),
            "end": pa.array(np.where(open_, 0, end), pa.timestamp("us", tz="UTC"), mask=open_),
            "namespace": coded(namespace, [f"ns-{i:03d}" for i in range(400)]),
            "pod": pa.array([f"pod-{day:%m%d}-{i}" for i in range(n)]),
            "node": coded(rng.integers(0, 2000, n), [f"node-{i}" for i in range(2000)]),
            "team": coded(team, [f"team-{i:02d}" for i in range(TEAMS)]),
            "project": coded(project, [f"proj-{i:03d}" for i in range(PROJECTS)]),
            "cost_center": coded(cost_center, [f"cc-{i}" for i in range(50)]),
            "experiment_id": coded(rng.integers(0, 5000, n), [f"exp-{i}" for i in range(5000)]),
            "gpu_type": coded(rng.integers(0, len(GPU_TYPES), n), GPU_TYPES),
            "gpu_count": pa.array(np.where(sharing == 0, rng.choice([1, 2, 4, 8], n), 1).astype(np.int64)),
            "capacity_type": coded(rng.choice(3, n, p=[0.5, 0.4, 0.1]), ["spot", "on-demand", "reserved"]),
            "sharing": coded(sharing, ["none", "mig", "mps", "timeslice"]),
            "gpu_share": pa.array(share),
        }
    )


def bench_config(tmp: Path, url: str, usage_glob: str, budgets: list[dict], row_level_path: str | None = None) -> Path:
    cfg = {
        "storage": {"url": url, **({"row_level_path": row_level_path} if row_level_path else {})},
        "prices": str(PRICES),
        "usage": {"sources": [{"type": "file", "path": usage_glob}], "group_by": ["team", "project"], "partitions_start": MONTH.isoformat()},
        "budgets": budgets,
        "channels": {"log": {"type": "log"}},
    }
    path = tmp / "gpu_ops.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def fleet_budgets() -> list[dict]:
    """A budget per team and per project, one on everything: 226 budgets, three scope shapes."""
    out = [{"name": "everything", "amount_usd": 5e7, "thresholds": [{"percent": 80}, {"percent": 120, "basis": "forecast"}]}]
    out += [{"name": f"team-{i:02d}", "scope": {"team": f"team-{i:02d}"}, "amount_usd": 2e6} for i in range(TEAMS)]
    out += [{"name": f"proj-{i:03d}", "scope": {"project": f"proj-{i:03d}"}, "amount_usd": 2e5} for i in range(PROJECTS)]
    return out


def materialize(config: Path, url: str, day: dt.date, instance: Any, selection: list[str] | None = None) -> Any:
    import dagster as dg

    from gpu_ops.domain.config import load_config
    from gpu_ops.dagster.cost.assets import build_assets
    from gpu_ops.dagster.resources import GpuOpsSettings
    from gpu_ops.dagster.io_manager import TableIOManager

    assets, _ = build_assets(load_config(config))
    resources = {"gpu_ops": GpuOpsSettings(config_path=str(config)), "table_io_manager": TableIOManager(url=url)}
    quiet = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}
    result = dg.materialize(assets, partition_key=day.isoformat(), resources=resources, instance=instance, selection=selection, run_config=quiet)
    return result


# --------------------------------------------------------------------------- sections


def section_budget_status(args: argparse.Namespace) -> None:
    """gpu_budget_status on day 1, 10 and 30: a month of gpu_cost_daily is written from
    one generated day (the same key combinations every day), then the budget asset alone
    is materialized for each day, five times; the best wall time is reported."""
    import dagster as dg
    import pandas as pd

    from gpu_ops.domain.config import load_config
    from gpu_ops.flows.cost.budgets import daily_costs, evaluate_budgets
    from gpu_ops.flows.cost.pipeline import default_as_of, load_raw, price_window, usage_table
    from gpu_ops.flows.cost.pricing import PriceMatrix
    from gpu_ops.domain.cost.sources import SourceSet
    from gpu_ops.storage.tables import TableStore

    n = args.budget_intervals
    with tempfile.TemporaryDirectory(prefix="gpu_ops_hist_") as tmp_, scratch_database(args.pg) as url:
        tmp = Path(tmp_)
        write_usage_day(tmp / "day.parquet", MONTH, n)
        config = bench_config(tmp, url, str(tmp / "day.parquet"), fleet_budgets())
        cfg = load_config(config)
        raw, _ = load_raw(SourceSet.from_config(cfg))
        start, end = pd.Timestamp(MONTH, tz="UTC"), pd.Timestamp(MONTH + dt.timedelta(days=1), tz="UTC")
        one_day = daily_costs(usage_table(price_window(raw, None, PriceMatrix.from_table(cfg.prices), start, end, end).rows), [MONTH])
        store = TableStore(url)
        for d in month_days(30):
            store.write("gpu_cost_daily", one_day.assign(day=d), partition_keys=[d.isoformat()])
        print(f"gpu_budget_status: {len(cfg.budgets)} budgets; gpu_cost_daily has {len(one_day):,} rows a day (from {n:,} intervals a day), 30 days")
        print(f"{'day':>5} {'step s (best of 5)':>19} {'evaluate s':>11} {'days read':>10}")
        walls = {}
        with dg.DagsterInstance.ephemeral() as instance:
            for day in (1, 10, 30):
                d = MONTH + dt.timedelta(days=day - 1)
                best = float("inf")
                for _ in range(5):
                    t0 = time.perf_counter()
                    materialize(config, url, d, instance, selection=["gpu_budget_status"])
                    best = min(best, time.perf_counter() - t0)
                daily = store.read("gpu_cost_daily", partition_keys=[(d - dt.timedelta(days=i)).isoformat() for i in range(31)])
                t0 = time.perf_counter()
                evaluate_budgets(cfg.budgets, daily, d, default_as_of(d), expected_from=MONTH)
                pure = time.perf_counter() - t0
                walls[day] = best
                print(f"{day:>5} {best:19.2f} {pure:11.3f} {daily['day'].nunique():>10}")
        ratio = walls[30] / walls[1]
        print(f"day 30 / day 1: {ratio:.2f}x (goal <= 1.5x: {'met' if ratio <= 1.5 else 'MISSED'}); {load_note()}")


STEPS = (
    ("gpu_usage", ["gpu_usage", "gpu_usage_quarantine"]),
    ("gpu_cost_attribution", ["gpu_cost_attribution", "gpu_cost_daily"]),
    ("gpu_roi_report", ["gpu_roi_report"]),
    ("gpu_budget_status", ["gpu_budget_status"]),
)


def run_step(config: Path, url: str, day: dt.date, selection: list[str], row_level: str | None) -> None:
    """One step in this process (the child side of daily_job): prints what it wrote."""
    import json

    import dagster as dg

    from gpu_ops.domain.config import load_config
    from gpu_ops.dagster.cost.assets import build_assets
    from gpu_ops.dagster.resources import GpuOpsSettings
    from gpu_ops.dagster.io_manager import TableIOManager

    assets, _ = build_assets(load_config(config))
    resources = {"gpu_ops": GpuOpsSettings(config_path=str(config)), "table_io_manager": TableIOManager(url=url, row_level_path=row_level)}
    quiet = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}
    with dg.DagsterInstance.ephemeral() as instance:
        t0 = time.perf_counter()
        result = dg.materialize(assets, partition_key=day.isoformat(), resources=resources, instance=instance, selection=selection, run_config=quiet)
        step = time.perf_counter() - t0
    out = {"step_s": step}
    for e in result.get_asset_materialization_events():
        m = e.materialization.metadata
        out[e.materialization.asset_key.to_user_string()] = {"rows": m["rows"].value if "rows" in m else 0, "write_s": m["write_seconds"].value if "write_seconds" in m else None}
    print("RESULT " + json.dumps(out))


def measured_child(args: list[str]) -> tuple[float, float, dict]:
    """Run this script with ``args`` in a fresh process: (wall s, peak RSS MiB, its RESULT)."""
    import json
    import subprocess
    import sys

    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, __file__, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO)
    out: dict[str, bytes] = {}
    readers = [threading.Thread(target=lambda k=k, f=f: out.__setitem__(k, f.read())) for k, f in (("out", proc.stdout), ("err", proc.stderr))]
    for r in readers:
        r.start()
    _, status, usage = os.wait4(proc.pid, 0)  # this child's own rusage: its peak RSS
    wall = time.perf_counter() - t0
    for r in readers:
        r.join()
    if os.waitstatus_to_exitcode(status):
        raise SystemExit(f"step {args} failed:\n{out['err'].decode()[-3000:]}")
    line = next(x for x in out["out"].decode().splitlines() if x.startswith("RESULT "))
    return wall, usage.ru_maxrss / 1024, json.loads(line[len("RESULT ") :])


def section_daily_job(args: argparse.Namespace) -> None:
    """The four cost steps for days 1 and 2 at --intervals a day on PostgreSQL, each step
    a process of its own (as Dagster's multiprocess executor runs them): wall time and
    peak RSS per step, rows written per second. Row-level usage in a PostgreSQL table,
    then as Parquet files (storage.row_level_path); the aggregates agree to the cent."""
    from gpu_ops.storage.tables import TableStore

    n = args.intervals
    totals = {}
    with tempfile.TemporaryDirectory(prefix="gpu_ops_hist_") as tmp_:
        tmp = Path(tmp_)
        for d in month_days(2):
            write_usage_day(tmp / f"usage-{d}.parquet", d, n)
        print(f"daily job: {n:,} intervals a day, {len(fleet_budgets())} budgets, each step its own process; {load_note()}")
        for mode in ("postgresql", "parquet"):
            row_level = str(tmp / "rows") if mode == "parquet" else None
            with scratch_database(args.pg) as url:
                config = bench_config(tmp, url, str(tmp / "usage-*.parquet"), fleet_budgets())
                print(f"\nrow-level gpu_usage as {mode}; aggregates on PostgreSQL")
                print(f"{'day':>4} {'step':<22} {'wall s':>7} {'in-step s':>9} {'peak RSS MiB':>12} {'rows':>10} {'write s':>8} {'rows/s':>10}")
                for d in month_days(2):
                    wall_sum, peak = 0.0, 0.0
                    for step, selection in STEPS:
                        child = ["--step", ",".join(selection), "--day", d.isoformat(), "--config", str(config), "--url", url] + (["--row-level", row_level] if row_level else [])
                        wall, rss, res = measured_child(child)
                        wall_sum, peak = wall_sum + wall, max(peak, rss)
                        w = res.get(step, {})
                        rate = f"{w['rows'] / w['write_s']:10,.0f}" if w.get("write_s") else f"{'':>10}"
                        write_s = f"{w['write_s']:8.2f}" if w.get("write_s") is not None else f"{'':>8}"
                        print(f"{d.day:>4} {step:<22} {wall:7.2f} {res['step_s']:9.2f} {rss:12.0f} {w.get('rows', ''):>10} {write_s} {rate}", flush=True)
                    goal = "met" if wall_sum < 60 and peak < 2048 else "MISSED"
                    print(f"{d.day:>4} {'the day':<22} {wall_sum:7.2f} {'':>9} {peak:12.0f}   goal < 60 s and < 2048 MiB: {goal}; {load_note()}")
                store = TableStore(url)
                attribution = store.read("gpu_cost_attribution")
                totals[mode] = round(float(attribution["cost_usd"].sum()), 2)
                if mode == "postgresql":
                    with store.engine.connect() as conn:
                        size = conn.exec_driver_sql("SELECT pg_total_relation_size('gpu_usage')").scalar()
                    print(f"gpu_usage in PostgreSQL: {size / 2**20:,.0f} MiB for 2 days")
                else:
                    size = sum(p.stat().st_size for p in (tmp / "rows").rglob("*.parquet"))
                    print(f"gpu_usage as Parquet: {size / 2**20:,.0f} MiB for 2 days")
                TableStore.dispose_all()
    same = len(set(totals.values())) == 1
    print(f"\nattributed cost of the 2 days: {totals} ({'equal to the cent' if same else 'DIFFERENT'})")


def tree_rss(pid: int) -> dict[int, int]:
    """Resident bytes of a process and each of its descendants now (from /proc)."""
    out, todo = {}, [pid]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/statm") as f:
                out[p] = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
    return out


def tree_pss_mib(pids: Iterable[int]) -> float:
    """Proportional set size of ``pids`` summed, MiB: each shared page counted once across
    them (a step forked from the forkserver shares its imports), what the tree really holds."""
    total = 0
    for p in pids:
        try:
            with open(f"/proc/{p}/smaps_rollup") as f:
                total += next((int(line.split()[1]) for line in f if line.startswith("Pss:")), 0)
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
    return total / 1024


def tree_rss_mib(pid: int) -> float:
    """Resident memory of a process and all its descendants now (from /proc), MiB."""
    return sum(tree_rss(pid).values()) / 2**20


def process_label(pid: int) -> str:
    """What a process of the job's tree is, from its command line."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return "?"
    for needle, label in (("forkserver import main", "forkserver or a step forked from it"), ("resource_tracker", "resource tracker"), ("watch_orphans", "watch_orphans"), ("tail -F", "tail"), ("asset materialize", "the run (dagster CLI)"), ("job execute", "the run (dagster CLI)")):
        if needle in cmd:
            return label
    return cmd[:40]


def run_job_tree(cmd: list[str], env: dict[str, str]) -> tuple[float, float, float, str, dict[int, float], dict[int, tuple[str, float]]]:
    """Run ``cmd`` (a whole process tree) sampling its summed RSS and summed PSS every
    50 ms: (wall s, process-tree peak MiB of summed RSS, of summed PSS, output, peak RSS
    MiB of each process of the tree, each process's RSS MiB and label at the tree's RSS
    peak)."""
    import subprocess

    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=REPO, env=env)
    peak, pss_peak, out, per_pid = 0.0, 0.0, [], {}
    at_peak: dict[int, tuple[str, float]] = {}
    reader = threading.Thread(target=lambda: out.append(proc.stdout.read()))  # type: ignore[union-attr]
    reader.start()
    while proc.poll() is None:
        now = tree_rss(proc.pid)
        if sum(now.values()) / 2**20 > peak:
            peak = sum(now.values()) / 2**20
            at_peak = {p: (process_label(p), b / 2**20) for p, b in now.items()}
        for p, b in now.items():
            per_pid[p] = max(per_pid.get(p, 0.0), b / 2**20)
        pss_peak = max(pss_peak, tree_pss_mib(now))
        time.sleep(0.05)
    reader.join()
    text = out[0].decode(errors="replace") if out else ""
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd[:6])}... failed ({proc.returncode}):\n{text[-3000:]}")
    return time.perf_counter() - t0, peak, pss_peak, text, per_pid, at_peak


def step_profile(home: Path, per_pid: dict[int, float]) -> list[tuple[str, float, float, float]]:
    """(step, seconds from its worker's launch to its start — process start-up and imports —,
    seconds from its start to its end, its process's peak MiB) of the latest run in the
    Dagster instance at ``home``, from the run's event log."""
    import dagster as dg

    with dg.DagsterInstance.from_config(str(home)) as instance:
        run = instance.get_runs(limit=1)[0]
        at: dict[tuple[str, str], float] = {}
        pids: dict[str, int] = {}
        for e in instance.all_logs(run.run_id):
            ev = e.dagster_event
            if not e.step_key or ev is None:
                continue
            kind = ev.event_type_value
            at.setdefault((e.step_key, kind), e.timestamp)
            if kind == "STEP_START" and ev.pid is not None:
                pids[e.step_key] = ev.pid
    steps = sorted(pids, key=lambda k: at[(k, "STEP_START")])
    out = []
    for k in steps:
        launched = at.get((k, "STEP_WORKER_STARTING"), at[(k, "STEP_START")])
        ended = at.get((k, "STEP_SUCCESS"), at.get((k, "STEP_FAILURE"), float("nan")))
        out.append((k, at[(k, "STEP_START")] - launched, ended - at[(k, "STEP_START")], per_pid.get(pids[k], float("nan"))))
    return out


def step_pids(home: Path) -> dict[int, str]:
    """pid -> "step <key>" of the latest run's steps in the Dagster instance at ``home``."""
    import dagster as dg

    with dg.DagsterInstance.from_config(str(home)) as instance:
        run = instance.get_runs(limit=1)[0]
        return {e.dagster_event.pid: f"step {e.step_key}" for e in instance.all_logs(run.run_id) if e.step_key and e.dagster_event is not None and e.dagster_event.event_type_value == "STEP_START" and e.dagster_event.pid is not None}


COST_ASSETS = "gpu_usage,gpu_usage_quarantine,gpu_cost_attribution,gpu_cost_daily,gpu_roi_report,gpu_budget_status"


def budget_read(config: Path, store: Any, day: dt.date) -> Any:
    """What gpu_budget_status reads of ``day``'s gpu_cost_daily: its sums per budget grain."""
    from gpu_ops.domain.config import load_config
    from gpu_ops.domain.cost.columns import BUDGET_READ_KEEP, BUDGET_READ_SUMS, budget_groupings

    groupings = budget_groupings(b.scope.as_filters() for b in load_config(config).budgets)
    return store.read_grouped("gpu_cost_daily", groupings, list(BUDGET_READ_SUMS), keep=list(BUDGET_READ_KEEP), partition_keys=[day.isoformat()])


def section_daily_job_mp(args: argparse.Namespace) -> None:
    """The daily cost job as users run it, beside its peers, in the same run: the job the
    schedule runs (`dagster job execute -j daily_gpu_cost_job`, in-process executor, a
    persistent instance), `dagster asset materialize` of every cost asset (the implicit
    asset job: the code location's multiprocess executor) and the one-process baseline
    (:func:`one_process_day`), each a whole process tree, interleaved --repeat times;
    best wall time, the tree's peak (summed RSS and summed PSS) of that run, and each
    against the baseline. PostgreSQL. Day 1 of a month, then day 30 with the 28 days
    between present in gpu_cost_daily (copies of day 1's; the baseline's daily table
    likewise), for both key layouts. Before day 30, day 1's file is exported again with
    its intervals closed (as a later export delivers them): left open, its 1 % still-running
    intervals would be running on day 30 too, and day 30 would price (and read) a
    month-old file. Row-level gpu_usage as Parquet under storage.row_level_path
    (--row-level-mp parquet, the default) or a PostgreSQL table; the baseline's always
    as Parquet. The day's cost of each (gpu_cost_daily; the baseline's own) is printed:
    they agree to the cent."""
    from gpu_ops.storage.tables import TableStore

    n = args.intervals
    print(f"daily job: {n:,} intervals a day, {len(fleet_budgets())} budgets, row-level gpu_usage as {args.row_level_mp}, aggregates on PostgreSQL; "
          f"best of {args.repeat} interleaved; {load_note()}")
    print(f"{'keys':<12} {'day':>4} {'variant':<22} {'wall s':>8} {'walls s':>17} {'tree peak MiB':>14} {'PSS peak MiB':>13} {'x baseline':>11} {'day cost USD':>15}")
    for layout in args.keys or ("nested", "independent"):
        with tempfile.TemporaryDirectory(prefix="gpu_ops_hist_") as tmp_, scratch_database(args.pg) as url:
            tmp = Path(tmp_)
            last = MONTH + dt.timedelta(days=29)
            for d in (MONTH, last):
                pq.write_table(usage_day(d, n, keys=layout), tmp / f"usage-{d}.parquet", row_group_size=256_000)
            config = bench_config(tmp, url, str(tmp / "usage-*.parquet"), fleet_budgets(), str(tmp / "rows") if args.row_level_mp == "parquet" else None)
            home = tmp / "dagster_home"
            home.mkdir()
            (home / "dagster.yaml").write_text("telemetry: {enabled: false}\n")
            env = {**os.environ, "DAGSTER_HOME": str(home), "GPU_OPS_CONFIG": str(config), "PYTHONPATH": str(REPO)}
            store = TableStore(url)
            for d in (MONTH, last):
                if d == last:  # day 1 re-exported closed; the days between, as day 1 left them
                    pq.write_table(usage_day(MONTH, n, open_share=0.0, keys=layout), tmp / f"usage-{MONTH}.parquet", row_group_size=256_000)
                    fill_month(store, url)
                walls: dict[str, list[tuple[float, float, float, list[str]]]] = {v: [] for v in DAILY_VARIANTS}
                costs: dict[str, float] = {}
                for _ in range(args.repeat):
                    for variant in DAILY_VARIANTS:
                        wall, peak, pss, _, per_pid, at_peak = run_job_tree(daily_command(variant, d, config, url, tmp / "rows"), env)
                        steps = step_lines(home, per_pid, at_peak) if args.steps and variant != BASELINE else []  # this run's, read before the next
                        walls[variant].append((wall, peak, pss, steps))
                        costs[variant] = day_cost(store, d, variant)
                base = min(w[0] for w in walls[BASELINE])
                for variant, runs in walls.items():
                    wall, peak, pss, steps = min(runs, key=lambda r: r[0])
                    spread = "-".join(f"{w[0]:.2f}" for w in sorted(runs, key=lambda r: r[0]))
                    print(f"{layout:<12} {(d - MONTH).days + 1:>4} {variant:<22} {wall:8.2f} {spread:>17} {peak:14.0f} {pss:13.0f} {wall / base:10.2f}x {costs[variant]:15,.2f}", flush=True)
                    for line in steps:
                        print(line, flush=True)
                print(f"{'':<12} {'':>4} {load_note()}", flush=True)
            TableStore.dispose_all()
    print(load_note())


JOB, MATERIALIZE, BASELINE = "job (in-process)", "asset materialize (mp)", "one process (DuckDB)"
DAILY_VARIANTS = (JOB, MATERIALIZE, BASELINE)


def daily_command(variant: str, day: dt.date, config: Path, url: str, row_level: Path) -> list[str]:
    """The command line of one variant of daily_job_mp for ``day``."""
    import json

    dagster = str(Path(sys.executable).with_name("dagster"))
    if variant == JOB:
        return [dagster, "job", "execute", "-m", "gpu_ops.definitions", "-j", "daily_gpu_cost_job", "--tags", json.dumps({"dagster/partition": day.isoformat()})]
    if variant == MATERIALIZE:
        return [dagster, "asset", "materialize", "-m", "gpu_ops.definitions", "--select", COST_ASSETS, "--partition", day.isoformat()]
    return [sys.executable, __file__, "--one-process", "--config", str(config), "--url", url, "--day", day.isoformat(), "--row-level", str(row_level)]


def fill_month(store: Any, url: str) -> None:
    """Days 2-29 of gpu_cost_daily (and of the baseline's daily table) as copies of day 1's."""
    import sqlalchemy as sa

    daily = store.read("gpu_cost_daily", partition_keys=[MONTH.isoformat()]).drop(columns=["partition_key"], errors="ignore")
    for i in range(1, 29):
        other = MONTH + dt.timedelta(days=i)
        store.write("gpu_cost_daily", daily.assign(day=other), partition_keys=[other.isoformat()])
    with store.engine.begin() as conn:
        conn.execute(sa.text("DELETE FROM base_cost_daily WHERE day > :d1 AND day < :d30"), {"d1": MONTH, "d30": MONTH + dt.timedelta(days=29)})
        conn.execute(sa.text(
            "INSERT INTO base_cost_daily SELECT to_char(day + i, 'YYYY-MM-DD'), day + i, kind, team, project, namespace, cost_center, intervals, gpu_hours, cost_usd, on_demand_usd "
            "FROM base_cost_daily, generate_series(1, 28) AS i WHERE day = :d1"
        ), {"d1": MONTH})


def day_cost(store: Any, day: dt.date, variant: str) -> float:
    """The day's cost as ``variant`` just wrote it: gpu_cost_daily, or the baseline's own daily table."""
    import sqlalchemy as sa

    if variant != BASELINE:
        return float(store.read("gpu_cost_daily", partition_keys=[day.isoformat()])["cost_usd"].sum())
    with store.engine.connect() as conn:
        return float(conn.execute(sa.text("SELECT sum(cost_usd) FROM base_cost_daily WHERE day = :d"), {"d": day}).scalar() or 0.0)


def step_lines(home: Path, per_pid: dict[int, float], at_peak: dict[int, tuple[str, float]]) -> list[str]:
    """Each step of the latest run (start-up before it, its work, its process's peak) and the tree at its peak, as lines to print."""
    out = [
        f"{'':<40} {secs:8.2f} {mib:14.0f}   step {step}: {boot:.2f} s start-up before it, then its work; its process's peak"
        for step, boot, secs, mib in step_profile(home, per_pid)
    ]
    steps = step_pids(home)
    moment = sorted(((steps.get(p, label), mib) for p, (label, mib) in at_peak.items()), key=lambda x: -x[1])
    return [*out, f"{'':<40} at the tree's peak: " + ", ".join(f"{label} {mib:.0f}" for label, mib in moment)]

# The one-process baseline of daily_job_mp: the day's work done by DuckDB in one process.
BASE_TABLES = ("base_cost_attribution", "base_cost_daily", "base_budget_status")
BASE_DDL = (
    "CREATE TABLE IF NOT EXISTS base_cost_attribution (partition_key TEXT, team TEXT, project TEXT, intervals BIGINT, gpu_hours DOUBLE PRECISION, cost_usd DOUBLE PRECISION, on_demand_usd DOUBLE PRECISION)",
    "CREATE TABLE IF NOT EXISTS base_cost_daily (partition_key TEXT, day DATE, kind TEXT, team TEXT, project TEXT, namespace TEXT, cost_center TEXT, intervals BIGINT, gpu_hours DOUBLE PRECISION, cost_usd DOUBLE PRECISION, on_demand_usd DOUBLE PRECISION)",
    "CREATE TABLE IF NOT EXISTS base_budget_status (partition_key TEXT, budget TEXT, amount_usd DOUBLE PRECISION, spend_usd DOUBLE PRECISION, percent_used DOUBLE PRECISION, forecast_usd DOUBLE PRECISION, status TEXT)",
)
# The row rules of the baseline (those the generated files could fail: what the rule book
# checks of each column, by SQL on the typed file): a known start, an end not before it,
# a positive GPU count, a share in (0, 1], a known GPU and capacity type, a namespace and
# either a pod, text without edges to trim.
BASE_BAD = (
    "start IS NULL OR (\"end\" IS NOT NULL AND \"end\" < start) OR gpu_count IS NULL OR NOT isfinite(gpu_count) OR gpu_count <= 0 "
    "OR gpu_share IS NULL OR NOT (gpu_share > 0 AND gpu_share <= 1) OR p.price IS NULL OR coalesce(namespace, '') = '' OR coalesce(pod, '') = '' "
    "OR namespace <> trim(namespace) OR pod <> trim(pod) OR team <> trim(team) OR project <> trim(project)"
)


def one_process_day(config: Path, url: str, day: dt.date, row_level: Path) -> None:
    """The daily job's work in one process, DuckDB throughout (the baseline of
    daily_job_mp): the day's rows from the files through the row rules, the identity (a
    key seen several times counted once, the closed and latest-ending record winning:
    a window over the rows of the repeated key hashes alone), clipped to the day and
    priced; row-level Parquet written; attribution (team, project), the daily table
    (day, kind, budget scope keys) and each budget's month to date (read back from
    PostgreSQL per grain) built and COPYed into PostgreSQL. Prints RESULT with the day's cost."""
    import io
    import json

    import duckdb
    import psycopg2
    import pyarrow.csv as pcsv

    from gpu_ops.domain.compute.catalog import UnknownGpuType, canonical_gpu_type

    cfg = yaml.safe_load(config.read_text())
    gpus = yaml.safe_load(Path(cfg["prices"]).read_text())["gpus"]
    glob = cfg["usage"]["sources"][0]["path"]
    key = day.isoformat()
    lo, hi = f"TIMESTAMPTZ '{day}'", f"TIMESTAMPTZ '{day + dt.timedelta(days=1)}'"  # as-of: the day's end (a past day)
    con = duckdb.connect()
    con.execute("SET TimeZone = 'UTC'")
    con.execute("SET enable_progress_bar = false")
    names = [r[0] for r in con.execute(f"SELECT DISTINCT gpu_type FROM read_parquet({glob!r})").fetchall()]
    rows = []
    for g in names:
        try:
            canon = canonical_gpu_type(g)
        except UnknownGpuType:
            continue
        rows += [(g, canon, c, v, gpus[canon].get("on-demand")) for c, v in gpus.get(canon, {}).items()]
    con.execute("CREATE TABLE p (gpu_raw VARCHAR, gpu_type VARCHAR, capacity_type VARCHAR, price DOUBLE, on_demand DOUBLE)")
    con.executemany("INSERT INTO p VALUES (?, ?, ?, ?, ?)", rows)
    con.execute(
        "CREATE TEMP TABLE r AS SELECT u.* EXCLUDE (gpu_type), p.gpu_type, p.price, p.on_demand, "
        f"({BASE_BAD}) AS bad FROM read_parquet({glob!r}, filename = true, file_row_number = true) u "
        "LEFT JOIN p ON p.gpu_raw = u.gpu_type AND p.capacity_type = u.capacity_type "
        f"WHERE start < {hi} AND coalesce(\"end\", {hi}) > {lo}"
    )
    con.execute(
        "CREATE TEMP TABLE losers AS SELECT filename, file_row_number FROM (SELECT * FROM r WHERE NOT bad AND hash(namespace, pod, start) IN "
        "(SELECT h FROM (SELECT hash(namespace, pod, start) AS h FROM r WHERE NOT bad) GROUP BY h HAVING count(*) > 1)) "
        "QUALIFY row_number() OVER (PARTITION BY namespace, pod, start, gpu_type ORDER BY \"end\" IS NULL, \"end\" DESC, filename DESC, file_row_number DESC) > 1"
    )
    hours = f"greatest(epoch_us(least(coalesce(\"end\", {hi}), {hi})) - epoch_us(greatest(start, {lo})), 0) / 3.6e9"
    con.execute(
        f"CREATE TEMP TABLE priced AS SELECT * EXCLUDE (bad, filename, file_row_number, price, on_demand), {hours} AS hours, "
        f"gpu_count * gpu_share * {hours} AS gpu_hours, price AS price_per_gpu_hour, gpu_count * gpu_share * {hours} * price AS cost_usd, "
        f"gpu_count * gpu_share * {hours} * on_demand AS on_demand_usd, 'allocated' AS kind, DATE '{day}' AS day, {key!r} AS partition_key "
        "FROM r ANTI JOIN losers USING (filename, file_row_number) WHERE NOT bad"
    )
    out = row_level / "base_usage" / f"partition_key={key}"
    out.mkdir(parents=True, exist_ok=True)
    con.execute(f"COPY priced TO '{out / 'part-0.parquet'}' (FORMAT parquet)")
    sums = "count(*) AS intervals, sum(gpu_hours) AS gpu_hours, sum(cost_usd) AS cost_usd, sum(on_demand_usd) AS on_demand_usd"
    tables = {
        "base_cost_attribution": f"SELECT partition_key, team, project, {sums} FROM priced GROUP BY ALL",
        "base_cost_daily": f"SELECT partition_key, day, kind, team, project, '' AS namespace, '' AS cost_center, {sums} FROM priced GROUP BY ALL",
    }
    pg = psycopg2.connect(url.replace("postgresql+psycopg2://", "postgresql://"))

    def copy_in(name: str, arrow: Any) -> None:
        buf = io.BytesIO()
        pcsv.write_csv(arrow, buf, pcsv.WriteOptions(include_header=False))
        buf.seek(0)
        with pg.cursor() as cur:
            cur.execute(f"DELETE FROM {name} WHERE partition_key = %s", (key,))
            cur.copy_expert(f"COPY {name} ({', '.join(arrow.schema.names)}) FROM STDIN WITH (FORMAT csv)", buf)

    with pg, pg.cursor() as cur:
        for ddl in BASE_DDL:
            cur.execute(ddl)
    with pg:
        for name, sql in tables.items():
            copy_in(name, con.sql(sql).to_arrow_table())
    # Budgets: the month to date of the daily table, summed by PostgreSQL per grain.
    month = day.replace(day=1)
    with pg.cursor() as cur:
        cur.execute("SELECT team, project, sum(cost_usd), grouping(team, project) FROM base_cost_daily WHERE day BETWEEN %s AND %s GROUP BY GROUPING SETS ((team), (project), ())", (month, day))
        spend = {("team", t) if g == 1 else ("project", p) if g == 2 else ("", ""): c for t, p, c, g in cur.fetchall()}
    days_in = ((month + dt.timedelta(days=32)).replace(day=1) - month).days
    elapsed = (day - month).days + 1
    status = []
    for b in fleet_budgets():
        scope = b.get("scope") or {}
        k = next(iter(scope.items()), ("", ""))
        s = float(spend.get(k) or 0.0)
        forecast = s / elapsed * days_in
        status.append((key, b["name"], b["amount_usd"], s, 100 * s / b["amount_usd"], forecast, "exceeded" if s > b["amount_usd"] else "warning" if s > 0.8 * b["amount_usd"] else "ok"))
    con.execute("CREATE TABLE st (partition_key VARCHAR, budget VARCHAR, amount_usd DOUBLE, spend_usd DOUBLE, percent_used DOUBLE, forecast_usd DOUBLE, status VARCHAR)")
    con.executemany("INSERT INTO st VALUES (?, ?, ?, ?, ?, ?, ?)", status)
    with pg:
        copy_in("base_budget_status", con.sql("SELECT * FROM st").to_arrow_table())
    cost = con.execute("SELECT sum(cost_usd), count(*) FROM priced").fetchall()[0]
    pg.close()
    con.close()
    print("RESULT " + json.dumps({"cost_usd": cost[0], "rows": cost[1]}))


# ------------------------------------------------------------------ reads against history

DAY = dt.date(2026, 11, 1)  # the day priced: the last day of a year of history (a past day)
FILE_HISTORY = (3, 30, 365)  # days of daily files
LEDGER_HISTORY = (1, 30, 365)  # days of ledger


def history_days(n: int) -> list[dt.date]:
    return [DAY - dt.timedelta(days=i) for i in range(n - 1, -1, -1)]


def history_day(d: dt.date, n: int) -> pa.Table:
    """A day of a billing export: intervals start that day (at most 24 h long); only the
    last two days' files hold intervals still running."""
    return usage_day(d, n, open_share=0.01 if d >= DAY - dt.timedelta(days=1) else 0.0, first_h=0, last_h=24, max_h=24)


def link_history(pool: Path, root: Path, n: int) -> None:
    """``root/flat/usage-<day>.parquet`` and ``root/exports/day=<day>/part-0.parquet`` for the last ``n`` days of ``pool``."""
    for d in history_days(n):
        for link in (root / "flat" / f"usage-{d}.parquet", root / "exports" / f"day={d}" / "part-0.parquet"):
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(pool / f"{d}.parquet")


def write_ledger(url: str, days: int, rows_per_day: int) -> None:
    """The first day through TableStore (table, column kinds), the rest bulk-inserted in
    the text layout SQLAlchemy writes to SQLite (a year through TableStore takes an hour)."""
    import sqlite3

    from gpu_ops.storage.tables import TableStore

    def day_frame(d: dt.date) -> Any:
        t = history_day(d, rows_per_day).to_pandas()
        t = t.assign(**{c: t[c].astype(str) for c in t.columns if str(t[c].dtype) == "category"})
        return t.assign(run_id=[f"run-{d}-{k % 500}" for k in range(len(t))], asset_key="train", attempt=1, outcome="completed", lost_seconds=0.0, last_checkpoint_at=t["end"])

    first, *rest = history_days(days)
    TableStore(url).write("gpu_usage_ledger", day_frame(first))
    con = sqlite3.connect(url.removeprefix("sqlite:///"))
    with con:
        for d in rest:
            t = day_frame(d)
            for c in ("start", "end", "last_checkpoint_at"):
                t[c] = t[c].dt.strftime("%Y-%m-%d %H:%M:%S.%f")
            cols = ", ".join(f'"{c}"' for c in t.columns)
            con.executemany(f"INSERT INTO gpu_usage_ledger ({cols}) VALUES ({', '.join('?' * len(t.columns))})", t.itertuples(index=False, name=None))
    con.close()
    t0 = time.perf_counter()
    TableStore(url).ensure_indexes("gpu_usage_ledger", ["start", "end"])  # what the first range read does
    print(f"  indexes on start/end (created once, by the first range read): {time.perf_counter() - t0:.1f} s")


def history_config(root: Path, name: str, url: str, sources: list[dict]) -> Path:
    path = root / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"storage": {"url": url}, "prices": str(PRICES), "usage": {"sources": sources, "partitions_start": "2025-01-01"}}))
    return path


def read_and_price(config: Path, day: dt.date = DAY) -> tuple[float, dict]:
    """``usage_for_days`` for ``day`` (read, validate, split, price): (wall s, what it read)."""
    from gpu_ops.domain.config import load_config
    from gpu_ops.flows.cost.pipeline import usage_for_days
    from gpu_ops.flows.cost.pricing import PriceMatrix
    from gpu_ops.domain.cost.sources import SourceSet
    from gpu_ops.storage.tables import TableStore

    cfg = load_config(config)
    t0 = time.perf_counter()
    usage = usage_for_days(SourceSet.from_config(cfg), TableStore.from_config(cfg), PriceMatrix.from_table(cfg.prices), day)
    return time.perf_counter() - t0, {"rows": len(usage.table), "cost": round(float(usage.table["cost_usd"].sum()), 2), **usage.stats.metadata()}


def _read_detail(i: dict) -> str:
    return (f"files read {i['files_read']}, footer only {i['files_footer_only']}, skipped by cached summary {i['files_skipped_by_summary']}, "
            f"row groups {i['row_groups_read']}, rows {i['rows']:,}, ${i['cost']:,.2f}")


def usage_step(config: Path) -> tuple[float, dict]:
    """A real Dagster materialization of gpu_usage for DAY (writes the day to SQLite)."""
    import dagster as dg

    from gpu_ops.domain.config import load_config

    with dg.DagsterInstance.ephemeral() as instance:
        t0 = time.perf_counter()
        result = materialize(config, load_config(config).storage.resolved_url(), DAY, instance, selection=["gpu_usage", "gpu_usage_quarantine"])
        wall = time.perf_counter() - t0
    assert result.success
    return wall, {}


def interleaved(cases: dict[str, Path], fn: Callable[[Path], tuple[float, dict]], repeat: int) -> dict[str, tuple[float, dict]]:
    """Median wall per case, the cases run in turn ``repeat`` times (load falls on all alike)."""
    walls: dict[str, list[float]] = {k: [] for k in cases}
    info: dict[str, dict] = {}
    for _ in range(repeat):
        for name, path in cases.items():
            wall, info[name] = fn(path)
            walls[name].append(wall)
    return {k: (statistics.median(v), info[k]) for k, v in walls.items()}


def report(title: str, results: dict[str, tuple[float, dict]], detail: Callable[[dict], str] = lambda i: "") -> None:
    base = next(iter(results.values()))[0]
    worst = max(w for w, _ in results.values()) / base
    print(f"{title}  (max / first: {worst:.2f}x, goal <= 1.2x: {'met' if worst <= 1.2 else 'MISSED'})")
    for name, (wall, info) in results.items():
        print(f"  {name:<22} {wall:7.2f} s  {wall / base:5.2f}x   {detail(info)}")


@contextlib.contextmanager
def history_work(args: argparse.Namespace, name: str) -> Iterator[Path]:
    """``--keep``/name (kept), else a temporary folder removed afterwards."""
    if args.keep is not None:
        (args.keep / name).mkdir(parents=True, exist_ok=True)
        yield args.keep / name
        return
    with tempfile.TemporaryDirectory(prefix=f"gpu_ops_hist_{name}_") as tmp:
        yield Path(tmp)


def section_usage_files(args: argparse.Namespace) -> None:
    """gpu_usage for DAY with 3, 30 and 365 daily Parquet files present, two layouts."""
    with history_work(args, "files") as work:
        _usage_files(work, args)


def _usage_files(work: Path, args: argparse.Namespace) -> None:
    pool = work / "pool"
    pool.mkdir(exist_ok=True)
    t0 = time.perf_counter()
    for d in history_days(max(FILE_HISTORY)):
        if not (pool / f"{d}.parquet").exists():
            pq.write_table(history_day(d, args.rows_per_day), pool / f"{d}.parquet", row_group_size=256_000)
    print(f"a year of daily files, {args.rows_per_day:,} intervals each ({time.perf_counter() - t0:.0f} s to write, "
          f"{sum(f.stat().st_size for f in pool.iterdir()) / 2**20:,.0f} MiB); median of {args.repeat}, interleaved; {load_note()}")
    layouts = {"flat glob usage-*.parquet": "flat/usage-*.parquet", "exports/day={date}/*.parquet": "exports/day={date}/*.parquet"}
    cases: dict[str, dict[str, Path]] = {layout: {} for layout in layouts}
    for n in FILE_HISTORY:
        root = work / f"history-{n}"
        if not root.exists():
            link_history(pool, root, n)
        for i, (layout, pattern) in enumerate(layouts.items()):
            cases[layout][f"{n} days of files"] = history_config(root, f"layout{i}", f"sqlite:///{root / 'costs.db'}", [{"type": "file", "path": pattern}])
    time.sleep(SETTLE_NS / 1e9)  # files changed within this are never cached (gpu_ops.flows.cost.footers)
    for layout, by_n in cases.items():
        # The day before's run (footer cache empty) fills the cache, as daily runs do.
        report(f"\nthe day before, footer cache empty: read+price, {layout}", {k: read_and_price(p, DAY - dt.timedelta(days=1)) for k, p in by_n.items()}, _read_detail)
        report(f"gpu_usage read+price, {layout}", interleaved(by_n, read_and_price, args.repeat), _read_detail)
        report(f"gpu_usage step (Dagster, the day written to SQLite), {layout}", interleaved(by_n, usage_step, args.repeat))
    print(load_note())


def section_usage_ledger(args: argparse.Namespace) -> None:
    """gpu_usage for DAY with a gpu_usage_ledger of 1, 30 and 365 days (SQLite)."""
    with history_work(args, "ledger") as work:
        _usage_ledger(work, args)


def _usage_ledger(work: Path, args: argparse.Namespace) -> None:
    by_n: dict[str, Path] = {}
    for n in LEDGER_HISTORY:
        root = work / f"ledger-{n}"
        root.mkdir(exist_ok=True)
        url = f"sqlite:///{root / 'costs.db'}"
        if not (root / "costs.db").exists():
            t0 = time.perf_counter()
            write_ledger(url, n, args.ledger_rows_per_day)
            print(f"ledger of {n} days x {args.ledger_rows_per_day:,} rows: {time.perf_counter() - t0:.0f} s to write")
        by_n[f"ledger of {n} days"] = history_config(root, "ledger", url, [{"type": "ledger"}])
    print(f"median of {args.repeat}, interleaved; {load_note()}")
    report("gpu_usage read+price, ledger (indexed range query)", interleaved(by_n, read_and_price, args.repeat),
           lambda i: f"ledger rows read {i.get('gpu_usage_ledger_rows_read', 0):,}, rows {i['rows']:,}, ${i['cost']:,.2f}")
    report("gpu_usage step (Dagster, the day written to SQLite), ledger", interleaved(by_n, usage_step, args.repeat))
    print(load_note())


SECTIONS: dict[str, Callable[[argparse.Namespace], None]] = {
    "usage_files": section_usage_files,
    "usage_ledger": section_usage_ledger,
    "budget_status": section_budget_status,
    "daily_job": section_daily_job,
    "daily_job_mp": section_daily_job_mp,
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--section", action="append", choices=sorted(SECTIONS), help="run only these sections (repeatable); default: all")
    ap.add_argument("--intervals", type=int, default=1_000_000, help="daily_job: usage intervals a day")
    ap.add_argument("--budget-intervals", type=int, default=100_000, help="budget_status: intervals of the generated day")
    ap.add_argument("--rows-per-day", type=int, default=100_000, help="usage_files: intervals in each daily file")
    ap.add_argument("--ledger-rows-per-day", type=int, default=10_000, help="usage_ledger: ledger rows a day")
    ap.add_argument("--repeat", type=int, default=3, help="usage_files, usage_ledger: timings per case (median); daily_job_mp: runs of each variant, interleaved (best)")
    ap.add_argument("--keep", type=Path, help="usage_files, usage_ledger: keep (and reuse) generated data in this folder")
    ap.add_argument("--keys", action="append", choices=["nested", "independent"], help="daily_job_mp: only these key layouts (repeatable); default: both")
    ap.add_argument("--row-level-mp", choices=["postgresql", "parquet"], default="parquet", help="daily_job_mp: where row-level gpu_usage lives (storage.row_level_path set or not)")
    ap.add_argument("--steps", action="store_true", help="daily_job_mp: also each step's seconds and its process's peak RSS")
    ap.add_argument("--pg", default=PG_ADMIN, help="PostgreSQL server (a scratch database is created on it)")
    ap.add_argument("--step", help=argparse.SUPPRESS)  # daily_job's child processes
    ap.add_argument("--one-process", action="store_true", help=argparse.SUPPRESS)  # daily_job_mp's baseline
    ap.add_argument("--day", help=argparse.SUPPRESS)
    ap.add_argument("--config", help=argparse.SUPPRESS)
    ap.add_argument("--url", help=argparse.SUPPRESS)
    ap.add_argument("--row-level", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one_process:
        one_process_day(Path(args.config), args.url, dt.date.fromisoformat(args.day), Path(args.row_level))
        return
    if args.step:
        run_step(Path(args.config), args.url, dt.date.fromisoformat(args.day), args.step.split(","), args.row_level)
        return
    for name in args.section or list(SECTIONS):
        print(f"\n== {name}")
        SECTIONS[name](args)


if __name__ == "__main__":
    main()
