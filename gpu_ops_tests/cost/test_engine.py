"""The DuckDB engine (`gpu_ops.cost.engine`) prices and quarantines exactly what the batch
reader (`engine="arrow"`) does: the same tables, the same quarantine rows and reasons,
the same identical-row rule, on the hostile corpus and on generated files; and where it
does not apply it says so, and ``auto`` falls back."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gpu_ops.cost import engine
from gpu_ops.cost.attribution import attribute
from gpu_ops.cost.columns import needed_columns
from gpu_ops.cost.pipeline import attribution_columns
from gpu_ops.cost.sources import SourceSet
from gpu_ops.cost.stream import stream_priced
from gpu_ops.cost.usage import DUPLICATE_FIELD
from gpu_ops_tests.conftest import REPO
from gpu_ops_tests.hostile import build

from .helpers import MATRIX, PRICES
from .test_stream import usage_rows, write_parquet

pytest.importorskip("duckdb", reason="the DuckDB engine needs duckdb (installed by make venv)")


def priced(paths: list[Path], engine_name: str, group_by: list[str], day: str, as_of: str | None = None, all_columns: bool = False, batch_rows: int = 7) -> tuple[pd.DataFrame, pd.DataFrame]:
    ws, we = pd.Timestamp(day, tz="UTC"), pd.Timestamp(day, tz="UTC") + pd.Timedelta(days=1)
    sources = SourceSet(usage_files=[str(p) for p in paths])
    cols = None if all_columns else needed_columns(group_by, False, False)
    p = stream_priced(sources, MATRIX, ws, we, pd.Timestamp(as_of) if as_of else we, attribution_columns(group_by, False), cols, batch_rows=batch_rows, engine=engine_name)
    return attribute(p.rows, group_by).table, p.quarantine


def assert_alike(paths: list[Path], group_by: list[str], day: str, **kw) -> tuple[pd.DataFrame, pd.DataFrame]:
    table, q = priced(paths, "duckdb", group_by, day, **kw)
    want_table, want_q = priced(paths, "arrow", group_by, day, **kw)
    pd.testing.assert_frame_equal(table, want_table, rtol=1e-9)
    pd.testing.assert_frame_equal(q.reset_index(drop=True), want_q.reset_index(drop=True))
    return table, q


def applies(paths: list[Path], day: str = "2026-10-01") -> bool:
    ws = pd.Timestamp(day, tz="UTC")
    try:
        engine.day_parts(SourceSet(usage_files=[str(p) for p in paths]), MATRIX, ws, ws + pd.Timedelta(days=1), ws + pd.Timedelta(days=1), ["team"], needed_columns(["team"], False, False), 7, ())
    except engine.NotApplicable:
        return False
    return True


# Cases of the hostile corpus the engine must model (the others fall back, checked alike).
MODELLED = {
    "good.parquet", "end_9999_us.parquet", "end_9999_ms.parquet", "end_9999_s.parquet", "end_9999_s_naive.parquet", "start_0001_us.parquet",
    "end_null_ns.parquet", "gpu_count_inf.parquet", "gpu_count_nan.parquet", "gpu_count_fraction.parquet", "gpu_count_huge_int.parquet",
    "gpu_share_nan_mig.parquet", "labels_bad_json.parquet", "duplicate_rows.parquet",
}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("corpus")
    (folder / "csv").mkdir()
    build.build(folder)
    return folder / "parquet"


@pytest.mark.parametrize("name", sorted(build.PARQUET))
def test_hostile_parquet_cases_price_and_quarantine_as_the_batch_reader(corpus, name):
    path = corpus / name
    if name in MODELLED:
        assert applies([path]), f"{name}: the engine should model this file"
    table, q = priced([path], "auto", ["team"], "2026-10-01")
    want_table, want_q = priced([path], "arrow", ["team"], "2026-10-01")
    pd.testing.assert_frame_equal(table, want_table, rtol=1e-9)
    pd.testing.assert_frame_equal(q.reset_index(drop=True), want_q.reset_index(drop=True))


def split_files(tmp_path: Path, rows: list[dict], parts: int) -> list[Path]:
    return [write_parquet(tmp_path / f"usage-{i}.parquet", rows[i::parts]) for i in range(parts)]


@pytest.mark.parametrize("group_by", [["team"], ["team", "project", "label:tier"], ["namespace"], ["node"]])
def test_generated_files_with_bad_rows_and_copies_across_files(tmp_path, group_by):
    rows = usage_rows(400, seed=11)
    rows += [dict(rows[i]) for i in range(0, 400, 23)]  # copies in later files than their first
    paths = split_files(tmp_path, rows, 3)
    assert applies(paths, "2026-10-02")
    table, q = assert_alike(paths, group_by, "2026-10-02")
    assert len(table) > 1 and (q["field"] == DUPLICATE_FIELD).sum() >= 10
    assert {"team", "gpu_type", "gpu_count", "capacity_type", "gpu_share", "price", "start", "end", "region"} <= set(q["field"])
    # As of the middle of the day: open intervals run to it, later ones are not priced.
    assert_alike(paths, group_by, "2026-10-02", as_of="2026-10-02T13:17:05.123456+00:00")


def test_spellings_that_parse_alike_are_copies_and_other_spellings_are_not(tmp_path):
    """An alias and its canonical name, a team with edge spaces, an integer count, a
    missing and a NaN share of an unshared GPU, a pod padded with Unicode spaces: the
    parsed rows are identical, so each copy is counted once; a changed pod is not a copy."""
    t0, t1 = pd.Timestamp("2026-10-01T01:00Z"), pd.Timestamp("2026-10-01T03:00Z")
    base = {"start": t0, "end": t1, "namespace": "ml", "pod": "p1", "team": "nlp", "gpu_type": "a100-80gb", "gpu_count": 2.0, "capacity_type": "on-demand", "sharing": "none", "gpu_share": 1.0}
    variants = [
        {}, {"gpu_type": "NVIDIA-A100-SXM4-80GB"}, {"team": " nlp\u00a0"}, {"gpu_share": None}, {"gpu_share": float("nan")},
        {"pod": "\u3000p1 "}, {"sharing": None}, {"pod": "p1x"}, {"team": "nlpx"}, {"end": t1 + pd.Timedelta(microseconds=1)},
    ]
    df = pd.DataFrame([base | v for v in variants])
    path = tmp_path / "spellings.parquet"
    pq.write_table(pa.Table.from_pandas(df, preserve_index=False), path)
    assert applies([path])
    table, q = assert_alike([path], ["team"], "2026-10-01")
    dup_rows = q.loc[q["field"] == DUPLICATE_FIELD, "row"].tolist()
    assert dup_rows == [2, 3, 4, 5, 6, 7] and set(q["reason"].str.contains("duplicate of row 1")) == {True}
    assert table.set_index("team").loc["nlp", "gpu_hours"] == pytest.approx(4 * 3)  # rows 1, 8 and 10 (2 GPUs x 2 h each)


def test_copies_across_files_name_the_first_file(tmp_path):
    rows = usage_rows(60, seed=5)
    a = write_parquet(tmp_path / "a.parquet", rows[:40])
    b = write_parquet(tmp_path / "b.parquet", rows[20:60])  # rows 21..40 again
    _, q = assert_alike([a, b], ["team"], "2026-10-02")
    dups = q[q["field"] == DUPLICATE_FIELD]
    assert len(dups) and dups["location"].eq(str(b)).all() and dups["reason"].str.contains(str(a)).all()


def test_hash_partitions_on_disk_find_what_one_partition_in_memory_finds():
    rng = np.random.default_rng(3)
    h = rng.integers(0, 2**63, 50_000, dtype=np.int64).view(np.uint64)
    h[rng.integers(0, 50_000, 500)] = h[rng.integers(0, 50_000, 500)]  # some repeats
    results = []
    for memory_rows in (10**9, 20_000, 1_000):  # in memory; 4 files (split by masks); 64 files (by a sort)
        spill = engine.HashSpill(len(h), memory_rows)
        for chunk in np.array_split(h, 7):
            spill.add(chunk.copy())
        repeated, rows = spill.repeated()
        results.append((spill.bits, (np.sort(repeated), rows)))
    assert [bits for bits, _ in results] == [0, 2, 6]
    values, counts = np.unique(h, return_counts=True)
    for _, (repeated, rows) in results:
        np.testing.assert_array_equal(repeated, values[counts > 1])
        assert rows == counts[counts > 1].sum()


def test_csv_or_mixed_schemas_are_not_modelled_auto_falls_back(tmp_path):
    rows = usage_rows(50, seed=2)
    csv = tmp_path / "u.csv"
    pd.DataFrame(rows).to_csv(csv, index=False)
    with pytest.raises(ValueError, match="DuckDB engine does not apply.*not Parquet"):
        priced([csv], "duckdb", ["team"], "2026-10-02")
    auto, arrow = priced([csv], "auto", ["team"], "2026-10-02"), priced([csv], "arrow", ["team"], "2026-10-02")
    pd.testing.assert_frame_equal(auto[0], arrow[0])
    a = write_parquet(tmp_path / "a.parquet", rows[:25])
    b = tmp_path / "b.parquet"
    pq.write_table(pq.read_table(write_parquet(tmp_path / "b0.parquet", rows[25:])).drop_columns(["region"]), b)
    assert not applies([a, b])
    assert_alike([a], ["team"], "2026-10-02")


def test_cli_engines_print_the_same_figures(tmp_path):
    split_files(tmp_path, usage_rows(200, seed=9), 2)
    prices = tmp_path / "prices.yaml"
    prices.write_text(json.dumps(PRICES.model_dump(mode="json")))
    out = {}
    for name in ("duckdb", "arrow"):
        cmd = [sys.executable, "-m", "gpu_ops.cli", "cost", "attribution", "--usage", str(tmp_path / "usage-*.parquet"), "--prices", str(prices), "--date", "2026-10-02", "--by", "team", "--format", "json", "--engine", name, "--quarantine", str(tmp_path / f"q-{name}.csv")]
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=120)
        assert proc.returncode == 0, proc.stderr
        out[name] = json.loads(proc.stdout)
    assert [r["team"] for r in out["duckdb"]] == [r["team"] for r in out["arrow"]]
    for a, b in zip(out["duckdb"], out["arrow"]):
        assert a["cost_usd"] == pytest.approx(b["cost_usd"], rel=1e-9) and a["gpu_hours"] == pytest.approx(b["gpu_hours"], rel=1e-9)
    assert (tmp_path / "q-duckdb.csv").read_text() == (tmp_path / "q-arrow.csv").read_text()


def test_an_empty_file_and_a_file_of_bad_rows(tmp_path):
    rows = usage_rows(40, seed=4)
    empty = write_parquet(tmp_path / "empty.parquet", rows[:1])  # one row for the column types, then none
    pq.write_table(pq.read_table(empty).slice(0, 0), empty)
    bad = write_parquet(tmp_path / "bad.parquet", [r | {"gpu_count": 0} for r in rows])
    for paths in ([empty], [bad], [empty, bad]):
        assert applies(paths, "2026-10-02")
        table, q = assert_alike(paths, ["team"], "2026-10-02")
        assert table.empty
    assert len(q) and q["reason"].str.contains("gpu_count: must be > 0").all()


def test_hourly_rows_alike_but_for_their_pods_are_told_apart_in_duckdb(tmp_path):
    """An hourly export: 70,000 rows share their hour, team and type and differ only by pod,
    more than are compared in memory. The duplicate hash then takes the pods too (stripped
    as str.strip strips them), so copies, padded copies included, are still found there."""
    n = 70_000
    t0, t1 = pd.Timestamp("2026-10-01T05:00Z"), pd.Timestamp("2026-10-01T06:00Z")
    pods = [f"pod-{i}" for i in range(n)] + ["pod-7", "\u3000pod-8 ", "pod-9x"]
    table = pa.table({
        "start": pa.array([t0] * len(pods), pa.timestamp("us", tz="UTC")), "end": pa.array([t1] * len(pods), pa.timestamp("us", tz="UTC")),
        "namespace": pa.array(["ml"] * len(pods)).dictionary_encode(), "pod": pa.array(pods), "team": pa.array(["nlp"] * len(pods)).dictionary_encode(),
        "gpu_type": pa.array(["a100-80gb"] * len(pods)).dictionary_encode(), "gpu_count": pa.array([1] * len(pods), pa.int64()),
        "capacity_type": pa.array(["spot"] * len(pods)).dictionary_encode(),
    })
    path = tmp_path / "hourly.parquet"
    pq.write_table(table, path)
    assert applies([path])
    table_, q = assert_alike([path], ["team"], "2026-10-01", batch_rows=16_384)  # in memory: 65,536 rows at most
    assert q["row"].tolist() == [n + 1, n + 2] and q["reason"].str.startswith("<row>: duplicate of row").all()
    assert table_["gpu_hours"].tolist() == [pytest.approx(n + 1)]
