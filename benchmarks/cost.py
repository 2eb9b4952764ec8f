"""Cost attribution at scale: 10 million usage intervals in one Parquet file.

    .venv/bin/python benchmarks/cost.py [--rows 10000000] [--keep DIR]

Prints wall time and peak memory (max RSS of each whole process) of:
  1. `gpu-ops cost attribution --by team` (the real CLI, validation and all),
  2. a pyarrow+numpy floor computing the same per-team totals from the same file,
  3. a straightforward pandas read + merge-with-prices + groupby,
and checks that all three agree to the cent. Goal: (1) at most 2x the floor, at most 4 GB.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parents[1]
PRICES = REPO / "gpu_ops" / "demo" / "prices.yaml"
DAY = "2026-10-14"
DAY_START_US = int(np.datetime64(f"{DAY}T00:00:00", "us").astype(np.int64))
US_PER_H = 3_600 * 10**6

# gpu_type values as billing exports write them: canonical names and aliases.
GPU_NAMES = ["a100-80gb", "NVIDIA-A100-SXM4-80GB", "h100", "NVIDIA-H100-80GB-HBM3", "l40s", "l4", "a10g", "t4", "h200", "a100"]


def generate(path: Path, n: int, seed: int = 7) -> None:
    rng = np.random.default_rng(seed)
    chunk = 2_000_000
    writer = None
    for off in range(0, n, chunk):
        m = min(chunk, n - off)
        # Starts from 6 h before the day to its end; ~2 h mean duration: some intervals cross
        # each midnight, 1% are still running (no end).
        start = DAY_START_US - 6 * US_PER_H + rng.integers(0, 30 * US_PER_H, m)
        end = start + rng.exponential(2 * US_PER_H, m).astype(np.int64) + 60_000_000
        open_ = rng.random(m) < 0.01
        sharing_i = rng.choice(4, m, p=[0.8, 0.1, 0.05, 0.05])
        share = np.choose(sharing_i, [np.ones(m), np.full(m, 1 / 7), np.full(m, 0.5), np.full(m, 0.25)])
        ids = pa.array(np.arange(off, off + m))
        cols = {
            "start": pa.array(start, pa.timestamp("us", tz="UTC")),
            "end": pa.array(np.where(open_, 0, end), pa.timestamp("us", tz="UTC"), mask=open_),
            "namespace": pa.DictionaryArray.from_arrays(pa.array(rng.integers(0, 40, m), pa.int32()), pa.array([f"ns-{i}" for i in range(40)])),
            "pod": pc.binary_join_element_wise("pod-", pc.cast(ids, pa.string()), ""),
            "node": pa.DictionaryArray.from_arrays(pa.array(rng.integers(0, 2000, m), pa.int32()), pa.array([f"node-{i}" for i in range(2000)])),
            "team": pa.DictionaryArray.from_arrays(pa.array(rng.integers(0, 25, m), pa.int32()), pa.array([f"team-{i:02d}" for i in range(25)])),
            "project": pa.DictionaryArray.from_arrays(pa.array(rng.integers(0, 200, m), pa.int32()), pa.array([f"proj-{i}" for i in range(200)])),
            "cost_center": pa.DictionaryArray.from_arrays(pa.array(rng.integers(0, 10, m), pa.int32()), pa.array([f"cc-{i}" for i in range(10)])),
            "experiment_id": pa.DictionaryArray.from_arrays(pa.array(rng.integers(0, 5000, m), pa.int32()), pa.array([f"exp-{i}" for i in range(5000)])),
            "gpu_type": pa.DictionaryArray.from_arrays(pa.array(rng.integers(0, len(GPU_NAMES), m), pa.int32()), pa.array(GPU_NAMES)),
            "gpu_count": pa.array(np.where(sharing_i == 0, rng.choice([1, 2, 4, 8], m), 1).astype(np.int64)),
            "capacity_type": pa.DictionaryArray.from_arrays(pa.array(rng.choice(3, m, p=[0.5, 0.4, 0.1]), pa.int32()), pa.array(["spot", "on-demand", "reserved"])),
            "sharing": pa.DictionaryArray.from_arrays(pa.array(sharing_i, pa.int32()), pa.array(["none", "mig", "mps", "timeslice"])),
            "gpu_share": pa.array(share),
        }
        table = pa.table(cols)
        if writer is None:
            writer = pq.ParquetWriter(path, table.schema)
        writer.write_table(table)
    assert writer is not None
    writer.close()


FLOOR = textwrap.dedent(
    """
    import json, sys
    import numpy as np, pyarrow.parquet as pq, yaml
    from gpu_ops.compute.catalog import canonical_gpu_type
    path, prices_path, day_us, asof_us = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    prices = yaml.safe_load(open(prices_path))["gpus"]
    t = pq.read_table(path, columns=["start", "end", "team", "gpu_type", "gpu_count", "gpu_share", "capacity_type"])
    def codes(name):
        col = t.column(name).combine_chunks()
        return np.asarray(col.indices), col.dictionary.to_pylist()
    s = np.asarray(t.column("start").combine_chunks().cast("int64"))
    e_col = t.column("end").combine_chunks()
    e = np.asarray(e_col.cast("int64").fill_null(asof_us))
    hi = min(day_us + 86_400_000_000, asof_us)
    h = np.clip(np.minimum(e, hi) - np.maximum(s, day_us), 0, None) / 3.6e9
    gi, gnames = codes("gpu_type"); ci, cnames = codes("capacity_type"); ti, tnames = codes("team")
    table = np.array([[prices[canonical_gpu_type(g)].get(c, np.nan) for c in cnames] for g in gnames])
    gpu_h = np.asarray(t.column("gpu_count").combine_chunks(), dtype=float) * np.asarray(t.column("gpu_share").combine_chunks()) * h
    cost = np.bincount(ti, weights=gpu_h * table[gi, ci], minlength=len(tnames))
    hours = np.bincount(ti, weights=gpu_h, minlength=len(tnames))
    print(json.dumps({n: [hours[i], cost[i]] for i, n in enumerate(tnames)}))
    """
)

PANDAS = textwrap.dedent(
    """
    import json, sys
    import pandas as pd, yaml
    from gpu_ops.compute.catalog import canonical_gpu_type
    path, prices_path, day, asof = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
    prices = yaml.safe_load(open(prices_path))["gpus"]
    p = pd.DataFrame([(g, c, v) for g, caps in prices.items() for c, v in caps.items()], columns=["gpu_type", "capacity_type", "price"])
    df = pd.read_parquet(path)
    df["gpu_type"] = df["gpu_type"].astype(str).map(canonical_gpu_type)
    df["capacity_type"] = df["capacity_type"].astype(str)
    df["team"] = df["team"].astype(str)
    lo, hi = pd.Timestamp(day, tz="UTC"), min(pd.Timestamp(day, tz="UTC") + pd.Timedelta(days=1), pd.Timestamp(asof))
    s = df["start"].clip(lower=lo); e = df["end"].fillna(pd.Timestamp(asof)).clip(upper=hi)
    df["hours"] = ((e - s).dt.total_seconds() / 3600).clip(lower=0)
    df = df.merge(p, on=["gpu_type", "capacity_type"], how="left")
    df["gpu_hours"] = df["gpu_count"] * df["gpu_share"] * df["hours"]
    df["cost"] = df["gpu_hours"] * df["price"]
    g = df.groupby("team")[["gpu_hours", "cost"]].sum()
    print(json.dumps({t: [r.gpu_hours, r.cost] for t, r in g.iterrows()}))
    """
)


def run_measured(cmd: list[str]) -> tuple[float, float, str, float]:
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    # Read the pipes on threads so that wait4 can reap this child and give its own rusage.
    import threading

    bufs: dict[str, bytes] = {}
    threads = [threading.Thread(target=lambda k=k, f=f: bufs.__setitem__(k, f.read())) for k, f in (("out", proc.stdout), ("err", proc.stderr))]
    for th in threads:
        th.start()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    for th in threads:
        th.join()
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd[:4])}... failed ({proc.returncode}):\n{bufs['err'].decode()[-3000:]}")
    return wall, usage.ru_maxrss / 1024, bufs["out"].decode(), usage.ru_utime + usage.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--keep", help="write the Parquet file here and keep it")
    ap.add_argument("--repeat", type=int, default=3, help="runs of each, interleaved; the best wall time is reported")
    args = ap.parse_args()
    tmp = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="gpu_ops_bench_"))
    tmp.mkdir(parents=True, exist_ok=True)
    path = tmp / "usage.parquet"
    if not path.exists():
        t0 = time.perf_counter()
        generate(path, args.rows)
        print(f"generated {args.rows:,} intervals in {time.perf_counter() - t0:.1f}s: {path} ({path.stat().st_size / 2**20:.0f} MiB)")
    asof = "2026-10-15T00:00:00+00:00"
    asof_us = DAY_START_US + 24 * US_PER_H
    py = sys.executable
    gpu_ops = [py, "-m", "gpu_ops.cli", "cost", "attribution", "--usage", str(path), "--prices", str(PRICES), "--date", DAY, "--by", "team", "--format", "json"]
    floor = [py, "-c", FLOOR, str(path), str(PRICES), str(DAY_START_US), str(asof_us)]
    naive = [py, "-c", PANDAS, str(path), str(PRICES), DAY, asof]

    # Interleaved, best of --repeat: on a shared machine the load changes from run to run.
    commands = (("floor (pyarrow+numpy)", floor), ("gpu-ops cost attribution", gpu_ops), ("pandas merge+groupby", naive))
    runs: dict[str, list] = {name: [] for name, _ in commands}
    for _ in range(args.repeat):
        for name, cmd in commands:
            runs[name].append(run_measured(cmd))
    results = {}
    for name, rs in runs.items():
        best = min(rs, key=lambda r: r[0])
        results[name] = (best[0], max(r[1] for r in rs), best[2], min(r[3] for r in rs))

    floor_totals = json.loads(results["floor (pyarrow+numpy)"][2])
    ours = {r["team"]: [r["gpu_hours"], r["cost_usd"]] for r in json.loads(results["gpu-ops cost attribution"][2])}
    naive_totals = json.loads(results["pandas merge+groupby"][2])
    for team, (h, c) in floor_totals.items():
        assert abs(ours[team][1] - c) < 0.01 and abs(naive_totals[team][1] - c) < 0.01, (team, c, ours[team], naive_totals[team])
        assert abs(ours[team][0] - h) < 1e-6 * max(1, h)
    total = sum(c for _, c in floor_totals.values())
    print(f"\n{args.rows:,} intervals, {DAY}, {len(floor_totals)} teams, ${total:,.2f} (all three agree to the cent)")
    print(f"{'':28} {'wall s':>8} {'CPU s':>7} {'peak RSS MiB':>13} {'x floor':>8}")
    fw = results["floor (pyarrow+numpy)"][0]
    for name, (wall, rss, _, cpu) in results.items():
        print(f"{name:28} {wall:8.2f} {cpu:7.2f} {rss:13.0f} {wall / fw:8.2f}")
    ours_wall, ours_rss, _, _ = results["gpu-ops cost attribution"]
    print(f"\ngoal: <= 2x floor ({'met' if ours_wall <= 2 * fw else 'MISSED'}), <= 4096 MiB peak ({'met' if ours_rss <= 4096 else 'MISSED'})")


if __name__ == "__main__":
    main()
