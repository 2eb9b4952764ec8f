"""Cost attribution at scale: 10, 30 and 100 million usage intervals in one Parquet file.

    .venv/bin/python benchmarks/cost.py [--rows 10M,30M,100M] [--data DIR] [--repeat 3]

Files over 10M rows are several GB: they are generated once into ``--data`` (default
/work/bench_data, outside the repository) and kept. On a shared machine run anything over
10M under the benchmark lock: ``flock /tmp/gpu_ops_bench.lock .venv/bin/python benchmarks/cost.py ...``.

Per size, each contender is a whole process (interpreter start and imports included), run
interleaved ``--repeat`` times; the best wall time and the highest peak RSS (max RSS of the
process) are reported, and every answer (per-team GPU-hours and cost) must agree with the
floor's to 1e-6:
  1. `gpu-ops cost attribution --by team` (the real CLI: the rule book compiled to SQL,
     quarantine, identical rows and superseded records — gpu_ops/cost/rules.py,
     engine.py —, then day split, pricing and grouping in SQL — allocate.py —, the table
     printed from plain Python: no pandas or pydantic of its own),
  2. DuckDB: one SQL query over the file (join with a price table, GROUP BY team),
  2b. DuckDB with the CLI's duplicate rule: the same query over SELECT DISTINCT of the
     columns the CLI compares (identical rows counted once), i.e. the CLI's work,
  3. Polars: a lazy scan, join and group-by run by its streaming engine,
  4. a floor: pyarrow record batches + numpy clip, price and ``bincount`` per team,
  5. (10M only) pandas ``read_parquet`` + ``merge`` with prices + ``groupby``.
Goal: the CLI at or under DuckDB's wall time at 10M and 100M; peak memory at most 2× DuckDB's
and at most 4 GB at 100M.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PRICES = REPO / "gpu_ops" / "demo" / "prices.yaml"
DAY = "2026-10-14"
AS_OF = "2026-10-15T00:00:00+00:00"
DAY_START_US = 1_791_936_000 * 10**6  # 2026-10-14T00:00:00Z
US_PER_H = 3_600 * 10**6

# gpu_type values as billing exports write them: canonical names and aliases.
GPU_NAMES = ["a100-80gb", "NVIDIA-A100-SXM4-80GB", "h100", "NVIDIA-H100-80GB-HBM3", "l40s", "l4", "a10g", "t4", "h200", "a100"]


def generate(path: Path, n: int, seed: int = 7) -> None:
    # Imported here: the measuring process stays small, since a child's peak RSS starts
    # from its parent's (fork) on Linux.
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    rng = np.random.default_rng(seed)
    chunk = 2_000_000
    writer = None
    tmp = path.with_suffix(".partial")
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
            writer = pq.ParquetWriter(tmp, table.schema)
        writer.write_table(table)
    assert writer is not None
    writer.close()
    tmp.rename(path)


# Every contender prints {team: [gpu_hours, cost_usd]} as JSON. The price table of the
# peers maps each raw gpu_type name in the file to its canonical prices (as a join would).
FLOOR = textwrap.dedent(
    """
    import json, sys
    import numpy as np, pyarrow.parquet as pq, yaml
    from gpu_ops.compute.catalog import canonical_gpu_type
    path, prices_path, day_us, asof_us = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    prices = yaml.safe_load(open(prices_path))["gpus"]
    hi = min(day_us + 86_400_000_000, asof_us)
    hours, cost = {}, {}
    cols = ["start", "end", "team", "gpu_type", "gpu_count", "gpu_share", "capacity_type"]
    for b in pq.ParquetFile(path).iter_batches(batch_size=1 << 20, columns=cols):
        c = dict(zip(b.schema.names, b.columns))
        s = np.asarray(c["start"].cast("int64"))
        e = np.asarray(c["end"].cast("int64").fill_null(asof_us))
        h = np.clip(np.minimum(e, hi) - np.maximum(s, day_us), 0, None) / 3.6e9
        gi, gnames = np.asarray(c["gpu_type"].indices), c["gpu_type"].dictionary.to_pylist()
        ci, cnames = np.asarray(c["capacity_type"].indices), c["capacity_type"].dictionary.to_pylist()
        ti, tnames = np.asarray(c["team"].indices), c["team"].dictionary.to_pylist()
        table = np.array([[prices[canonical_gpu_type(g)].get(x, np.nan) for x in cnames] for g in gnames])
        gpu_h = np.asarray(c["gpu_count"], dtype=float) * np.asarray(c["gpu_share"]) * h
        hb = np.bincount(ti, weights=gpu_h, minlength=len(tnames))
        cb = np.bincount(ti, weights=gpu_h * table[gi, ci], minlength=len(tnames))
        for i, n in enumerate(tnames):
            hours[n] = hours.get(n, 0.0) + hb[i]
            cost[n] = cost.get(n, 0.0) + cb[i]
    print(json.dumps({n: [hours[n], cost[n]] for n in hours}))
    """
)

PEER_PRICES = textwrap.dedent(
    """
    import json, sys, yaml
    from gpu_ops.compute.catalog import canonical_gpu_type
    path, prices_path, day, asof, names = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5].split(",")
    gpus = yaml.safe_load(open(prices_path))["gpus"]
    price_rows = [(n, c, v) for n in names for c, v in gpus[canonical_gpu_type(n)].items()]
    """
)

DUCKDB = PEER_PRICES + textwrap.dedent(
    """
    import duckdb
    con = duckdb.connect()
    con.execute("SET enable_progress_bar = false")
    con.execute("CREATE TABLE p(gpu_type VARCHAR, capacity_type VARCHAR, price DOUBLE)")
    con.executemany("INSERT INTO p VALUES (?, ?, ?)", price_rows)
    q = f'''
    WITH u AS (
      SELECT team, gpu_type, capacity_type, gpu_count * gpu_share *
        greatest(epoch_us(least(coalesce("end", TIMESTAMPTZ '{asof}'), TIMESTAMPTZ '{day}' + INTERVAL 1 DAY, TIMESTAMPTZ '{asof}'))
                 - epoch_us(greatest(start, TIMESTAMPTZ '{day}')), 0) / 3.6e9 AS gpu_h
      FROM read_parquet('{path}'))
    SELECT team, sum(gpu_h), sum(gpu_h * price) FROM u JOIN p USING (gpu_type, capacity_type) GROUP BY team
    '''
    print(json.dumps({t: [h, c] for t, h, c in con.execute(q).fetchall()}))
    """
)

# The same query over distinct rows of the columns the CLI compares to count an identical
# row once (its duplicate rule): the CLI's work, done by DuckDB.
DUCKDB_DISTINCT = DUCKDB.replace(
    "FROM read_parquet('{path}'))",
    "FROM (SELECT DISTINCT start, \"end\", namespace, pod, team, gpu_type, gpu_count, capacity_type, sharing, gpu_share FROM read_parquet('{path}')))",
)
assert DUCKDB_DISTINCT != DUCKDB

POLARS = PEER_PRICES + textwrap.dedent(
    """
    from datetime import datetime, timedelta, timezone
    import polars as pl
    p = pl.DataFrame(price_rows, schema=["gpu_type", "capacity_type", "price"], orient="row")
    lo = datetime.fromisoformat(day).replace(tzinfo=timezone.utc)
    a = datetime.fromisoformat(asof)
    hi = min(lo + timedelta(days=1), a)
    span = pl.min_horizontal(pl.col("end").fill_null(a), pl.lit(hi)) - pl.max_horizontal(pl.col("start"), pl.lit(lo))
    u = pl.scan_parquet(path).select(
        pl.col("team").cast(pl.String), pl.col("gpu_type").cast(pl.String), pl.col("capacity_type").cast(pl.String),
        (pl.col("gpu_count") * pl.col("gpu_share") * (span.dt.total_microseconds().clip(lower_bound=0) / 3.6e9)).alias("gpu_h"),
    )
    r = u.join(p.lazy(), on=["gpu_type", "capacity_type"]).group_by("team").agg(pl.col("gpu_h").sum(), (pl.col("gpu_h") * pl.col("price")).sum().alias("cost"))
    print(json.dumps({t: [h, c] for t, h, c in r.collect(engine="streaming").iter_rows()}))
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
    df = pd.read_parquet(path, columns=["start", "end", "team", "gpu_type", "gpu_count", "gpu_share", "capacity_type"])
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

CLI = "gpu-ops cost attribution"
DISTINCT = "DuckDB, duplicates once"


def run_measured(cmd: list[str]) -> tuple[float, float, str, float]:
    """(wall s, peak RSS MiB, stdout, CPU s) of one whole process."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    # Read the pipes on threads so that wait4 can reap this child and give its own rusage.
    bufs: dict[str, bytes] = {}
    threads = [threading.Thread(target=lambda k=k, f=f: bufs.__setitem__(k, f.read())) for k, f in (("out", proc.stdout), ("err", proc.stderr))]
    for th in threads:
        th.start()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    for th in threads:
        th.join()
    code = os.waitstatus_to_exitcode(status)
    if code:
        raise SystemExit(f"{' '.join(cmd[:4])}... failed ({code}):\n{bufs['err'].decode()[-3000:]}")
    return wall, usage.ru_maxrss / 1024, bufs["out"].decode(), usage.ru_utime + usage.ru_stime


def contenders(path: Path, rows: int, batch_rows: int | None, skip: Sequence[str] = ()) -> list[tuple[str, list[str]]]:
    py = sys.executable
    peer_args = [str(path), str(PRICES), DAY, AS_OF, ",".join(GPU_NAMES)]
    cli = [py, "-m", "gpu_ops.cli", "cost", "attribution", "--usage", str(path), "--prices", str(PRICES), "--date", DAY, "--by", "team", "--format", "json"]
    if batch_rows:
        cli += ["--batch-rows", str(batch_rows)]
    out = [
        ("floor (pyarrow+numpy)", [py, "-c", FLOOR, str(path), str(PRICES), str(DAY_START_US), str(DAY_START_US + 24 * US_PER_H)]),
        (CLI, cli),
        ("DuckDB", [py, "-c", DUCKDB, *peer_args]),
        (DISTINCT, [py, "-c", DUCKDB_DISTINCT, *peer_args]),
        ("Polars (streaming)", [py, "-c", POLARS, *peer_args]),
    ]
    if rows <= 10_000_000:
        out.append(("pandas merge+groupby", [py, "-c", PANDAS, str(path), str(PRICES), DAY, AS_OF]))
    unknown = set(skip) - {name for name, _ in out}
    if unknown or CLI in skip or "DuckDB" in skip:
        raise SystemExit(f"--skip: no such contender, or one every figure is measured against: {sorted(set(skip))}")
    return [(name, cmd) for name, cmd in out if name not in skip]


def totals(name: str, stdout: str) -> dict[str, list[float]]:
    try:
        data = json.loads(stdout)
    except json.JSONDecodeError:
        raise SystemExit(f"{name} printed no JSON answer: {stdout[:500]!r}") from None
    if name == CLI:
        return {r["team"]: [r["gpu_hours"], r["cost_usd"]] for r in data}
    return data


def load() -> str:
    return os.popen("uptime").read().strip().split("load average:")[-1].strip()


def bench_size(rows: int, data: Path, repeat: int, batch_rows: int | None, skip: Sequence[str] = ()) -> dict[str, tuple[float, float, float]]:
    path = data / (f"usage-{rows // 1_000_000}M.parquet" if rows % 1_000_000 == 0 else f"usage-{rows}.parquet")
    if not path.exists():
        t0 = time.perf_counter()
        subprocess.run([sys.executable, __file__, "--generate", str(path), str(rows)], check=True)
        print(f"generated {rows:,} intervals in {time.perf_counter() - t0:.0f} s: {path} ({path.stat().st_size / 2**20:,.0f} MiB)")
    cmds = contenders(path, rows, batch_rows, skip)
    runs: dict[str, list] = {name: [] for name, _ in cmds}
    load_before = load()
    # Interleaved, best of --repeat: on a shared machine the load changes from run to run.
    for _ in range(repeat):
        for name, cmd in cmds:
            runs[name].append(run_measured(cmd))
    load_after = load()
    floor = totals(cmds[0][0], runs[cmds[0][0]][0][2])
    for name, rs in runs.items():
        for r in rs:
            got = totals(name, r[2])
            assert set(got) == set(floor), (name, sorted(got), sorted(floor))
            for team, (h, c) in floor.items():
                assert abs(got[team][0] - h) <= 1e-6 * max(1.0, abs(h)), (name, team, got[team], h)
                assert abs(got[team][1] - c) <= 1e-6 * max(1.0, abs(c)), (name, team, got[team], c)
    best = {name: (min(r[0] for r in rs), max(r[1] for r in rs), min(r[3] for r in rs)) for name, rs in runs.items()}
    total = sum(c for _, c in floor.values())
    print(f"\n{rows:,} intervals ({path.stat().st_size / 2**20:,.0f} MiB), {DAY}, {len(floor)} teams, ${total:,.2f}: all agree to 1e-6")
    print(f"load average before/after: {load_before} / {load_after}; best of {repeat} interleaved runs")
    duck_wall, duck_rss, _ = best["DuckDB"]
    same_wall, same_rss, _ = best.get(DISTINCT, (float("nan"), float("nan"), 0.0))
    print(f"{'':26} {'wall s':>8} {'CPU s':>8} {'peak RSS MiB':>13} {'x DuckDB wall':>14} {'x DuckDB RSS':>13} {'x same-work wall':>17}")
    for name, (wall, rss, cpu) in best.items():
        print(f"{name:26} {wall:8.2f} {cpu:8.2f} {rss:13,.0f} {wall / duck_wall:14.2f} {rss / duck_rss:13.2f} {wall / same_wall:17.2f}")
    wall, rss, _ = best[CLI]
    print(f"goal: CLI wall <= DuckDB's: {'met' if wall <= duck_wall else 'MISSED'} ({wall / duck_wall:.2f}x); "
          f"peak <= 2x DuckDB's: {'met' if rss <= 2 * duck_rss else 'MISSED'} ({rss / duck_rss:.2f}x); <= 4096 MiB: {'met' if rss <= 4096 else 'MISSED'}")
    print(f"against DuckDB doing the CLI's duplicate rule too ({DISTINCT}): wall {wall / same_wall:.2f}x, peak {rss / same_rss:.2f}x")
    return best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="10M", help="comma-separated sizes, e.g. 10M,30M,100M")
    ap.add_argument("--data", default="/work/bench_data", help="where the generated files are kept")
    ap.add_argument("--repeat", type=int, default=3, help="runs of each, interleaved; the best wall time is reported")
    ap.add_argument("--batch-rows", type=int, help="the CLI's --batch-rows (default: its own)")
    ap.add_argument("--skip", action="append", default=[], help=f"a contender left out, by name (repeatable; e.g. '{DISTINCT}' at 100M: its SELECT DISTINCT holds ~2 GB per 10M rows)")
    ap.add_argument("--generate", nargs=2, metavar=("PATH", "ROWS"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.generate:
        return generate(Path(args.generate[0]), int(args.generate[1]))
    data = Path(args.data)
    data.mkdir(parents=True, exist_ok=True)
    for size in args.rows.split(","):
        text = size.strip().upper()
        rows = int(float(text[:-1]) * (1_000_000 if text.endswith("M") else 1_000)) if text[-1:] in ("M", "K") else int(text)
        bench_size(rows, data, args.repeat, args.batch_rows, args.skip)


if __name__ == "__main__":
    main()
