"""Streaming attribution (`gpu_ops.cost.stream`): batches of a few rows give exactly what
the whole-file path gives, the quarantine is `validate_usage`'s to the row, and the
figures agree with an independent row-by-row reference written in plain Python."""

from __future__ import annotations

import datetime as dt
import json
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gpu_ops.compute.catalog import UnknownGpuType, canonical_gpu_type
from gpu_ops.cost.attribution import attribute
from gpu_ops.cost.pipeline import attribution_columns, load_inventory, load_raw, price_window
from gpu_ops.cost.sources import SourceSet
from gpu_ops.cost.stream import stream_priced
from gpu_ops.cost.usage import DUPLICATE_FIELD, quarantine_in_window, read_usage_files, validate_usage
from gpu_ops_tests.conftest import REPO

from .helpers import MATRIX, PRICES

DAY = "2026-10-02"
NAT = np.iinfo(np.int64).min
WS, WE = pd.Timestamp(DAY, tz="UTC"), pd.Timestamp("2026-10-03", tz="UTC")
COLUMNS = ["start", "end", "namespace", "pod", "node", "team", "project", "gpu_type", "gpu_count", "capacity_type", "sharing", "gpu_share", "region", "labels"]
GPU_NAMES = ["a100-80gb", "NVIDIA-A100-SXM4-80GB", "h100", "l4", "NVIDIA-L4"]
# Rows no price can be put on, one of each kind; their row numbers are checked below.
BAD = [
    {"team": ""},  # no team
    {"gpu_type": "a10"},  # unknown type (never matched to a100)
    {"gpu_count": 0},
    {"capacity_type": "preemptible"},
    {"sharing": "mig", "gpu_share": None},  # a slice must say its share
    {"gpu_share": 1.5},
    {"gpu_type": "l4", "capacity_type": "reserved"},  # no reserved L4 price
    {"region": "ap-south-1"},  # no multiplier for the region
    {"start": None},
    {"end": "2026-10-01T00:00:00+00:00"},  # before its start
]


def usage_rows(n: int, seed: int = 3) -> list[dict]:
    """Random intervals around the day (crossing both midnights, some open), with BAD rows mixed in."""
    rng = random.Random(seed)
    day0 = dt.datetime(2026, 10, 2, tzinfo=dt.timezone.utc)
    rows = []
    for i in range(n):
        start = day0 + dt.timedelta(minutes=rng.randrange(-8 * 60, 26 * 60))
        end = None if rng.random() < 0.05 else start + dt.timedelta(minutes=rng.randrange(1, 20 * 60))
        sharing = rng.choice(["none", "none", "mig", "timeslice", ""])
        row = {
            "start": start.isoformat(), "end": end.isoformat() if end else None, "namespace": f"ns{rng.randrange(3)}", "pod": f"pod-{i}",
            "node": f"n{rng.randrange(4)}", "team": rng.choice(["nlp", "vision", "research"]), "project": rng.choice(["a", "b"]),
            "gpu_type": rng.choice(GPU_NAMES), "gpu_count": rng.choice([1, 2, 8]), "capacity_type": rng.choice(["spot", "on-demand"]),
            "sharing": sharing, "gpu_share": {"mig": 1 / 7, "timeslice": 0.25}.get(sharing), "region": rng.choice(["us-east-1", "eu-west-1", ""]),
            "labels": json.dumps({"tier": rng.choice(["gold", "bronze"])}),
        }
        if i % 17 == 5:
            row.update(BAD[(i // 17) % len(BAD)])
        if i % 29 == 11 and i > 40:  # identical to a row further up (another batch): counted once
            row = dict(rows[i - 37])
        rows.append(row)
    return rows


def write_parquet(path: Path, rows: list[dict]) -> Path:
    df = pd.DataFrame(rows, columns=COLUMNS)
    for c in ("start", "end"):
        df[c] = pd.to_datetime(df[c], utc=True)
    # Small row groups: batches cross their boundaries.
    pq.write_table(pa.Table.from_pandas(df, preserve_index=False), path, row_group_size=13)
    return path


def write_csv(path: Path, rows: list[dict]) -> Path:
    pd.DataFrame(rows, columns=COLUMNS).to_csv(path, index=False)
    return path


def whole_file(sources: SourceSet, group_by: list[str]) -> tuple[pd.DataFrame, pd.DataFrame]:
    raw, inventory = load_raw(sources)
    priced = price_window(raw, inventory, MATRIX, WS, WE, WE)
    return attribute(priced.rows, group_by).table, priced.quarantine


def streamed(sources: SourceSet, group_by: list[str], batch_rows: int, workers: int = 2) -> tuple[pd.DataFrame, pd.DataFrame]:
    keys = attribution_columns(group_by, sources.has_inventory)
    priced = stream_priced(sources, MATRIX, WS, WE, WE, keys, None, batch_rows, workers=workers)
    return attribute(priced.rows, group_by).table, priced.quarantine


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("stream")
    rows = usage_rows(300)
    inv = pd.DataFrame([{"node": f"n{i}", "instance_type": "p4de.24xlarge", "capacity_type": "on-demand", "region": "us-east-1", "start": "2026-09-01T00:00:00Z", "end": ""} for i in range(3)])
    inv.to_csv(d / "inventory.csv", index=False)
    return {"parquet": write_parquet(d / "usage.parquet", rows), "csv": write_csv(d / "usage.csv", rows), "inventory": d / "inventory.csv", "rows": rows}  # type: ignore[dict-item]


@pytest.mark.parametrize("fmt", ["parquet", "csv"])
@pytest.mark.parametrize("group_by", [["team"], ["team", "project", "label:tier"]])
def test_batches_of_seven_rows_give_the_whole_file_figures(files, fmt, group_by):
    sources = SourceSet(usage_files=[str(files[fmt])])
    expected, _ = whole_file(sources, group_by)
    got, _ = streamed(sources, group_by, batch_rows=11)
    pd.testing.assert_frame_equal(got, expected, rtol=1e-12)
    assert len(got) > 1


def test_idle_rows_and_fleet_totals_from_streamed_cells(files):
    sources = SourceSet(usage_files=[str(files["parquet"])], inventory_files=[str(files["inventory"])])
    raw, inventory = load_raw(sources)
    whole = attribute(price_window(raw, inventory, MATRIX, WS, WE, WE).rows, ["team"])
    priced = stream_priced(sources, MATRIX, WS, WE, WE, attribution_columns(["team"], True), None, 11)
    got = attribute(priced.rows, ["team"])
    pd.testing.assert_frame_equal(got.table, whole.table, rtol=1e-12)
    assert "__idle__" in set(got.table["team"])
    for k in ("fleet_cost_usd", "idle_cost_usd", "off_fleet_cost_usd", "allocated_cost_usd"):
        assert got.totals[k] == pytest.approx(whole.totals[k], rel=1e-12)
    assert priced.fleet_known and load_inventory(sources) is not None


@pytest.mark.parametrize("fmt", ["parquet", "csv"])
def test_quarantine_is_exactly_validate_usage_on_the_whole_file(files, fmt):
    sources = SourceSet(usage_files=[str(files[fmt])])
    v = validate_usage(read_usage_files(sources.usage_files), MATRIX)
    expected = quarantine_in_window(v.quarantine, WS, WE)
    for batch_rows, workers in ((7, 2), (64, 1), (10_000, 2)):
        _, q = streamed(sources, ["team"], batch_rows, workers)
        pd.testing.assert_frame_equal(q.reset_index(drop=True), expected.reset_index(drop=True))
    # Every kind of bad row is there, named by file and its own row number.
    assert set(q["location"]) == {str(files[fmt])}
    assert {"team", "gpu_type", "gpu_count", "capacity_type", "gpu_share", "price", "region", "start", "end", DUPLICATE_FIELD} <= set(q["field"])
    assert len(q) >= 5 and set(q["row"]) <= {i + 1 for i in range(300) if i % 17 == 5 or (i % 29 == 11 and i > 40)}
    assert q[q["field"] == DUPLICATE_FIELD]["reason"].str.contains(r"duplicate of row \d+", regex=True).all()


# --------------------------------------------------------------------------- reference


def reference(rows: list[dict]) -> dict[str, list[float]]:
    """Per-team GPU-hours and cost for DAY, row by row, in plain Python: the usage format's
    rules read straight from DESIGN.md, no code shared with gpu_ops except the GPU catalog."""
    prices = {g: dict(p) for g, p in PRICES.gpus.items()}
    regions = {r: m.multiplier for r, m in PRICES.regions.items()}
    lo = dt.datetime(2026, 10, 2, tzinfo=dt.timezone.utc)
    hi = lo + dt.timedelta(days=1)
    out: dict[str, list[float]] = {}
    counted: set[tuple] = set()
    for r in rows:
        try:
            gpu = canonical_gpu_type(r["gpu_type"])
        except UnknownGpuType:
            continue
        start = dt.datetime.fromisoformat(r["start"]) if r["start"] else None
        end = dt.datetime.fromisoformat(r["end"]) if r["end"] else None
        sharing = r["sharing"] or "none"
        share = r["gpu_share"] if r["gpu_share"] is not None else (1.0 if sharing == "none" else None)
        price = prices.get(gpu, {}).get(r["capacity_type"])
        mult = regions.get(r["region"]) if r["region"] else 1.0
        if not r["team"] or start is None or (end is not None and end < start) or not r["gpu_count"] > 0 or share is None or not 0 < share <= 1 or price is None or mult is None:
            continue
        if tuple(r.values()) in counted:
            continue
        counted.add(tuple(r.values()))
        hours = max(0.0, (min(end or hi, hi) - max(start, lo)).total_seconds() / 3600)
        if hours > 0:
            gpu_hours = r["gpu_count"] * share * hours
            acc = out.setdefault(r["team"], [0.0, 0.0])
            acc[0] += gpu_hours
            acc[1] += gpu_hours * price * mult
    return out


@pytest.mark.parametrize("fmt", ["parquet", "csv"])
def test_streamed_figures_agree_with_an_independent_reference(files, fmt):
    expected = reference(files["rows"])
    got, _ = streamed(SourceSet(usage_files=[str(files[fmt])]), ["team"], batch_rows=9)
    got = got.set_index("team")
    assert set(got.index) == set(expected)
    for team, (hours, cost) in expected.items():
        assert got.loc[team, "gpu_hours"] == pytest.approx(hours, rel=1e-6)
        assert got.loc[team, "cost_usd"] == pytest.approx(cost, rel=1e-6)


def test_cli_streams_with_batch_rows_and_names_bad_rows(files, tmp_path):
    prices = tmp_path / "prices.yaml"
    prices.write_text(json.dumps(PRICES.model_dump(mode="json")))
    qpath = tmp_path / "q.csv"
    args = ["--usage", str(files["parquet"]), "--prices", str(prices), "--date", DAY, "--by", "team", "--format", "json", "--quarantine", str(qpath)]
    runs = [subprocess.run([sys.executable, "-m", "gpu_ops.cli", "cost", "attribution", *args, *extra], capture_output=True, text=True, cwd=REPO, timeout=120) for extra in ([], ["--batch-rows", "16"])]
    expected_q = quarantine_in_window(validate_usage(read_usage_files([str(files["parquet"])]), MATRIX).quarantine, WS, WE)
    for r in runs:
        assert r.returncode == 0, r.stderr
        assert f"quarantined {len(expected_q)} row(s)" in r.stderr and f"usage.parquet row {expected_q['row'][0]}:" in r.stderr
    a, b = ({x["team"]: x["cost_usd"] for x in json.loads(r.stdout)} for r in runs)
    assert a == pytest.approx(b, rel=1e-12)
    assert b == pytest.approx({t: c for t, (_, c) in reference(files["rows"]).items()}, rel=1e-6)
    bad = pd.read_csv(qpath)
    assert list(bad["row"]) == list(expected_q["row"]) and list(bad["reason"]) == list(expected_q["reason"])


def test_unreadable_files_and_lines_are_quarantined_and_the_rest_is_priced(tmp_path):
    bad = tmp_path / "broken.parquet"
    bad.write_bytes(b"PAR1 not really parquet")
    short = write_csv(tmp_path / "short.csv", usage_rows(3))
    short.write_text(short.read_text() + "2026-10-02T00:00:00Z,too,few\n")
    p = stream_priced(SourceSet(usage_files=[str(bad), str(short)]), MATRIX, WS, WE, WE, ["team"], None, 2)
    q = p.quarantine.set_index("location")
    assert q.loc[str(bad), "field"] == "<file>" and "not a readable Parquet file" in q.loc[str(bad), "reason"]
    assert q.loc[str(short), "field"] == "<line>" and q.loc[str(short), "row"] == 4 and "line 5" in q.loc[str(short), "reason"]
    assert p.rows["gpu_hours"].sum() > 0  # the three good rows are priced


@pytest.mark.parametrize("fmt", ["parquet", "csv"])
def test_pods_differing_only_by_edge_whitespace_are_one_row_streamed_as_whole(files, fmt, tmp_path):
    """pod is hashed from Arrow's buffers when streamed, not made into categories: the same
    rows are still identical (after strip, with Unicode spaces) and the rest distinct."""
    rows = [dict(r) for r in files["rows"][:120]]
    rows += [{**rows[i], "pod": f"\u3000{rows[i]['pod']} "} for i in range(0, 120, 3)]  # copies, padded
    rows += [{**rows[i], "pod": rows[i]["pod"] + "x"} for i in range(1, 120, 3)]  # not copies
    path = (write_parquet if fmt == "parquet" else write_csv)(tmp_path / f"pods.{fmt}", rows)
    sources = SourceSet(usage_files=[str(path)])
    v = validate_usage(read_usage_files(sources.usage_files), MATRIX)
    expected_table, _ = whole_file(sources, ["team"])
    for batch_rows in (9, 1000):
        table, q = streamed(sources, ["team"], batch_rows)
        pd.testing.assert_frame_equal(table, expected_table, rtol=1e-12)
        pd.testing.assert_frame_equal(q.reset_index(drop=True), quarantine_in_window(v.quarantine, WS, WE).reset_index(drop=True))
    assert (q["field"] == DUPLICATE_FIELD).sum() >= 30


def test_rows_outside_the_window_are_not_remembered_for_duplicates():
    """Identical copies share their times: rows that cannot touch the window need no place
    in the duplicate set (a month-long file costs one day's rows)."""
    from gpu_ops.cost.usage import SeenRows

    ns = lambda s: pd.Timestamp(s, tz="UTC").value  # noqa: E731
    seen = SeenRows((ns("2026-10-02"), ns("2026-10-03")))
    starts = np.array([ns("2026-09-30"), ns("2026-10-01T23:00"), ns("2026-10-02T05:00"), ns("2026-10-03T00:00"), ns("2026-10-01")])
    ends = np.array([ns("2026-10-01"), ns("2026-10-02T01:00"), NAT, ns("2026-10-03T02:00"), NAT])
    hashes = np.arange(1, 6, dtype=np.uint64)
    again, _ = seen.check_and_add(hashes, np.array(["f"] * 5, dtype=object), np.arange(1, 6), (starts, ends))
    assert not again.any() and len(seen) == 3  # rows 2, 3 and 5 touch the day
    again, earlier = seen.check_and_add(hashes, np.array(["g"] * 5, dtype=object), np.arange(1, 6), (starts, ends))
    assert again.tolist() == [False, True, True, False, True] and earlier == [("f", 2), ("f", 3), ("f", 5)]
