"""Random hostile usage files (seeded), shared by the engine's differential tests: time
units and zones, naive and aware times, text spellings (case, edge spaces, GPU aliases),
bad numbers, inverted and open intervals, identical copies, running-then-finished
snapshots of one interval across files, deliveries differing in the node alone, control
characters in columns a grouping by team does not read, dictionary and plain pages, empty row groups, CSV
with offsets and a BOM. A test may narrow the choices (``GPUS``, ``CAPACITY``, ...) with
``monkeypatch.setattr`` on this module."""

from __future__ import annotations

import datetime as dt
import random
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

DAY = pd.Timestamp("2026-10-01", tz="UTC")
WS, WE = DAY, DAY + pd.Timedelta(days=1)
TEAMS = ["nlp", " nlp", "NLP", "vision ", "", "research"]
GPUS = ["a100-80gb", "NVIDIA-A100-SXM4-80GB", "h100", "l4", "a10", "t4"]
CAPACITY = ["spot", "on-demand", "SPOT", "reserved", "preemptible", ""]
SHARING = ["none", "", "mig", "timeslice", "gpu"]


def random_row(rng: random.Random, i: int) -> dict[str, Any]:
    start = DAY + pd.Timedelta(minutes=rng.randrange(-36 * 60, 30 * 60, 15))
    kind = rng.random()
    end = None if kind < 0.12 else start - pd.Timedelta(hours=1) if kind < 0.16 else start + pd.Timedelta(minutes=rng.randrange(15, 40 * 60, 15))
    sharing = rng.choice(SHARING)
    share = rng.choice([None, 1.0, 0.5, 1 / 7, 0.0, 1.5]) if sharing not in ("none", "") else rng.choice([None, 1.0, 1.0, 0.5])
    count = rng.choice([1, 1, 2, 8, 0, -1, 1.5, 200_000])
    return {
        "start": start, "end": end, "namespace": rng.choice(["ml", "research"]), "pod": f"pod-{i}", "node": f"n{rng.randrange(3)}",
        "team": rng.choice(TEAMS), "project": "l\x01m" if i % 25 == 7 else rng.choice(["llm", "det", ""]), "cost_center": "", "experiment_id": "",
        "gpu_type": rng.choice(GPUS), "gpu_count": count, "capacity_type": rng.choice(CAPACITY), "sharing": sharing, "gpu_share": share,
    }


def random_rows(seed: int, n: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    rows = [random_row(rng, seed * 10_000 + i) for i in range(n)]
    for r in rng.sample(rows, n // 10):  # identical copies
        rows.append(dict(r))
    for r in rng.sample(rows, n // 10):  # the same interval, running here (finished elsewhere)
        rows.append({**r, "end": None})
    for r in rng.sample(rows, n // 20):  # delivered again from another node (a column a grouping by team does not read)
        rows.append({**r, "node": "n9"})
    for r in rng.sample(rows, n // 20):  # re-exported with a later end
        if r["end"] is not None:
            rows.append({**r, "end": r["end"] + pd.Timedelta(hours=1)})
    rng.shuffle(rows)
    return rows


def write_parquet(rows: list[dict[str, Any]], path: Path, rng: random.Random) -> None:
    unit = rng.choice(["s", "ms", "us", "ns"])
    tz = rng.choice(["UTC", None, "Europe/Paris"])
    def times(key: str) -> pa.Array:
        values = [None if r[key] is None else (r[key] if tz else r[key].tz_convert("UTC").tz_localize(None)) for r in rows]
        return pa.array(values, pa.timestamp(unit, tz=tz))
    count_float = any(isinstance(r["gpu_count"], float) for r in rows)
    table = pa.table({
        "start": times("start"), "end": times("end"),
        **{c: pa.array([r[c] for r in rows]) for c in ("namespace", "pod", "node", "team", "project", "cost_center", "experiment_id", "gpu_type", "capacity_type", "sharing")},
        "gpu_count": pa.array([float(r["gpu_count"]) if count_float else int(r["gpu_count"]) for r in rows]),
        "gpu_share": pa.array([r["gpu_share"] for r in rows], pa.float64()),
    })
    dictionary = rng.random() < 0.5
    with pq.ParquetWriter(path, table.schema, use_dictionary=dictionary) as w:
        w.write_table(table.slice(0, 0))  # an empty row group
        for lo in range(0, table.num_rows, 37):
            w.write_table(table.slice(lo, 37))


def write_csv(rows: list[dict[str, Any]], path: Path, rng: random.Random) -> None:
    offset = rng.choice([0, 2, -5])
    def t(v: Any) -> str:
        if v is None:
            return ""
        local = v.tz_convert(dt.timezone(dt.timedelta(hours=offset)))
        return local.isoformat() if offset else v.strftime("%Y-%m-%dT%H:%M:%SZ")
    cols = list(rows[0])
    lines = [",".join(cols)]
    for r in rows:
        vals = [t(r[c]) if c in ("start", "end") else "" if r[c] is None else (f"{r[c]:g}" if isinstance(r[c], float) else str(r[c])) for c in cols]
        lines.append(",".join(vals))
    data = ("\ufeff" if rng.random() < 0.5 else "") + "\n".join(lines) + "\n"
    path.write_text(data, encoding="utf-8")


def random_files(tmp_path: Path, seed: int) -> list[Path]:
    rng = random.Random(seed)
    rows = random_rows(seed, 160)
    cut = len(rows) // 3
    parts = [rows[:cut], rows[cut : 2 * cut], rows[2 * cut :]]
    paths = []
    for i, part in enumerate(parts):
        if rng.random() < 0.5:
            path = tmp_path / f"u{seed}-{i}.parquet"
            write_parquet(part, path, rng)
        else:
            path = tmp_path / f"u{seed}-{i}.csv"
            write_csv(part, path, rng)
        paths.append(path)
    return paths


NODE_TYPES = [("p4de.24xlarge", "", ""), ("", "a100-80gb", 4), ("", "l4", 1), ("g6.xlarge", "", ""), ("", "h100", 8)]


def random_inventory(seed: int, day: pd.Timestamp = DAY) -> pd.DataFrame:
    """A random node inventory around ``day`` (a frame with provenance): snapshots of
    running nodes, re-deliveries, records of one node that overlap or disagree, copies, bad
    rows, in random order."""
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(int(rng.integers(15, 40))):
        instance, gpu, count = NODE_TYPES[int(rng.integers(len(NODE_TYPES)))]
        start = day + pd.Timedelta(hours=int(rng.integers(-30, 40)))
        end = "" if rng.random() < 0.25 else (start + pd.Timedelta(minutes=int(rng.integers(0, 60 * 30)))).isoformat()
        rows.append({"node": f"n{rng.integers(6)}", "instance_type": instance, "gpu_type": gpu, "gpu_count": count,
                     "capacity_type": str(rng.choice(["spot", "on-demand", "reserved"])), "region": "us-east-1", "start": start.isoformat(), "end": end})
        if rng.random() < 0.3:  # the same node exported while it ran, or again
            rows.append({**rows[-1], "end": "" if rows[-1]["end"] else (start + pd.Timedelta(hours=3)).isoformat()})
        if rng.random() < 0.15:  # an exact copy, delivered again
            rows.append(dict(rows[-1]))
        if rng.random() < 0.1:  # a bad row
            rows.append({**rows[-1], "capacity_type": "weekly"})
    order = rng.permutation(len(rows))
    df = pd.DataFrame([rows[i] for i in order]).astype(object)
    return df.assign(source="inventory", location="inventory.csv", row=np.arange(1, len(df) + 1))
