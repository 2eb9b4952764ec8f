"""Reads bounded by the day: pruned results equal unpruned ones, and pruning really skips.

Each layout (one Parquet file per day in a flat folder, hive ``day=`` folders, a
``{date}`` placeholder, CSV, ledger and collector tables on SQLite and PostgreSQL) holds
days around the one priced, intervals crossing both of its midnights, open intervals,
inverted and unpriceable rows. "Never opened" is shown by files that are not Parquet at
all: opening one would fail the read.
"""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from gpu_ops.flows.cost.attribution import day_window
from gpu_ops.flows.cost.kubernetes import COLLECTED_PODS_TABLE, drop_expired
from gpu_ops.flows.cost.pipeline import SourceSet, default_as_of, load_raw, price_window, usage_for_days, usage_table
from gpu_ops.storage.ledger import LEDGER_TABLE
from gpu_ops.flows.cost.window import ReadStats, Window, hive_day
from gpu_ops_tests.cost.oracle import touch_mask
from gpu_ops.storage.tables import TableStore
from gpu_ops_tests.conftest import REPO
from gpu_ops_tests.cost.helpers import MATRIX

DAY = dt.date(2026, 10, 10)
DAYS = [DAY + dt.timedelta(days=i) for i in range(-4, 4)]  # the day, four before, three after
TEAMS = ["nlp", "vision", "speech"]
GPUS = ["a100-80gb", "h100", "l4"]


def ts(day: dt.date, hours: float) -> pd.Timestamp:
    return pd.Timestamp(day.isoformat(), tz="UTC") + pd.Timedelta(hours=hours)


def intervals(day: dt.date, n: int = 60, seed: int = 0) -> pd.DataFrame:
    """Intervals that start on ``day``: short ones, ones crossing midnight, and specials."""
    rng = np.random.default_rng(seed + day.toordinal())
    start = [ts(day, h) for h in rng.uniform(0, 24, n)]
    hours = rng.choice([0.5, 3.0, 7.5, 20.0], n)
    rows = pd.DataFrame({
        "start": start,
        "end": [s + pd.Timedelta(hours=float(h)) for s, h in zip(start, hours)],
        "namespace": "ml", "pod": [f"p-{day}-{i}" for i in range(n)], "node": "n1",
        "team": rng.choice(TEAMS, n), "project": "p", "cost_center": "", "experiment_id": "",
        "gpu_type": rng.choice(GPUS, n), "gpu_count": rng.integers(1, 9, n).astype(float),
        "capacity_type": rng.choice(["spot", "on-demand"], n), "sharing": "none", "gpu_share": 1.0,
    })
    special = pd.DataFrame([
        # crosses both midnights of the next day (starts 23:00, runs 26 h)
        {**rows.iloc[0].to_dict(), "start": ts(day, 23), "end": ts(day, 49), "pod": f"both-{day}"},
        # still running (clipped at each day's end)
        {**rows.iloc[0].to_dict(), "start": ts(day, 12), "end": pd.NaT, "pod": f"open-{day}"},
        # inverted: quarantined in every day between its times
        {**rows.iloc[0].to_dict(), "start": ts(day, 30), "end": ts(day, 2), "pod": f"inv-{day}"},
        # no price for l4 reserved: quarantined on its day
        {**rows.iloc[0].to_dict(), "gpu_type": "l4", "capacity_type": "reserved", "pod": f"noprice-{day}"},
    ])
    rows = pd.concat([rows, special], ignore_index=True)
    for c in ("start", "end"):
        rows[c] = pd.to_datetime(rows[c], utc=True).astype("datetime64[us, UTC]")
    return rows


def write_parquet(df: pd.DataFrame, path: Path, row_group_size: int = 16) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pandas(df, preserve_index=False), path, row_group_size=row_group_size)


def unpruned(sources: SourceSet, store: TableStore | None, day: dt.date):
    raw, inventory = load_raw(sources, store)
    return price_window(raw, inventory, MATRIX, *day_window(day), default_as_of(day))


def plain(df: pd.DataFrame) -> pd.DataFrame:
    """Categoricals as plain values: their category list (and so their sort order) depends
    on what else was read, and is not part of the result."""
    return df.astype({c: object for c in df.columns if isinstance(df[c].dtype, pd.CategoricalDtype)})


def assert_same_rows(a: pd.DataFrame, b: pd.DataFrame) -> None:
    """Equal values, column by column."""
    pd.testing.assert_frame_equal(plain(a), plain(b), check_dtype=False)


def same_day(pruned, full, day: dt.date, drop: tuple[str, ...] = ()) -> None:
    """The day's priced rows and quarantine are the same, row for row, to the cent."""
    key = ["location", "start", "end", "pod", "kind"]
    a = pruned.table[pruned.table["partition_key"] == day.isoformat()].drop(columns=["partition_key", *drop])
    b = usage_table(full.rows).drop(columns=list(drop))
    a, b = (plain(x).sort_values(key).reset_index(drop=True) for x in (a, b))
    assert len(b) > 0
    assert_same_rows(a, b)
    assert round(a["cost_usd"].sum(), 2) == round(b["cost_usd"].sum(), 2)
    qa = pruned.quarantine[pruned.quarantine["partition_key"] == day.isoformat()]
    qcols = ["location", "field", "reason"] + ([] if "row" in drop else ["row"])
    as_set = lambda q: sorted(map(tuple, q[qcols].astype(str).to_numpy().tolist()))  # noqa: E731
    assert as_set(qa) == as_set(full.quarantine) and len(qa) > 0


# --------------------------------------------------------------------------- Parquet


def test_flat_daily_parquet_files_are_pruned_by_footer_and_equal_a_full_read(tmp_path):
    for d in DAYS:
        write_parquet(intervals(d), tmp_path / f"usage-{d}.parquet")
    sources = SourceSet(usage_files=["usage-*.parquet"], base_dir=tmp_path)
    got = usage_for_days(sources, None, MATRIX, DAY)
    same_day(got, unpruned(sources, None, DAY), DAY)
    read = {Path(p).name for p in got.stats.files_read}
    # The day's file, the day before (crossing midnight, inverted rows) and all files
    # with an open interval (no statistics can bound an open end).
    assert {f"usage-{DAY}.parquet", f"usage-{DAY - dt.timedelta(days=1)}.parquet"} <= read
    # Later days' files start after the day: footer only, running rows or not.
    later = {f"usage-{d}.parquet" for d in DAYS if d > DAY}
    assert later <= {Path(p).name for p in got.stats.files_footer_only} and not later & read
    assert got.stats.row_groups_read < got.stats.row_groups_total


def test_row_groups_without_open_rows_are_skipped_and_other_days_read_footer_only(tmp_path):
    frames = {d: intervals(d).query("pod.str.startswith('p-') or pod.str.startswith('both-')") for d in DAYS}
    for d, df in frames.items():
        write_parquet(df, tmp_path / f"usage-{d}.parquet")
    sources = SourceSet(usage_files=["usage-*.parquet"], base_dir=tmp_path)
    got = usage_for_days(sources, None, MATRIX, DAY)
    full = unpruned(sources, None, DAY)
    a = got.table.drop(columns="partition_key").pipe(plain).sort_values(["location", "start", "pod"]).reset_index(drop=True)
    b = usage_table(full.rows).pipe(plain).sort_values(["location", "start", "pod"]).reset_index(drop=True)
    assert_same_rows(a, b)
    read = sorted(Path(p).name for p in got.stats.files_read)
    footer = sorted(Path(p).name for p in got.stats.files_footer_only)
    # The day, the day before, and two days before (its 26-hour interval ends at 01:00).
    assert read == [f"usage-{DAY - dt.timedelta(days=i)}.parquet" for i in (2, 1, 0)]
    assert len(footer) == len(DAYS) - 3  # the other days: footer only, no data
    assert got.stats.rows_read < sum(len(f) for f in frames.values()) / 3


def test_one_multi_day_file_reads_only_the_row_groups_of_the_day(tmp_path):
    rows = pd.concat([intervals(d).query("pod.str.startswith('p-')") for d in DAYS], ignore_index=True).sort_values("start")
    write_parquet(rows, tmp_path / "all.parquet", row_group_size=20)
    sources = SourceSet(usage_files=["all.parquet"], base_dir=tmp_path)
    got = usage_for_days(sources, None, MATRIX, DAY)
    full = unpruned(sources, None, DAY)
    a = got.table.drop(columns="partition_key").sort_values(["row", "start"]).reset_index(drop=True)
    b = usage_table(full.rows).sort_values(["row", "start"]).reset_index(drop=True)
    assert_same_rows(a, b)  # row numbers are the file's, not the read's
    assert got.stats.row_groups_read <= got.stats.row_groups_total / 3


@pytest.mark.parametrize("layout", ["hive", "placeholder"])
def test_date_partitioned_layouts_never_open_files_of_other_days(tmp_path, layout):
    for d in DAYS:
        folder = tmp_path / "exports" / f"day={d}"
        if d in (DAY, DAY - dt.timedelta(days=1)):
            write_parquet(intervals(d), folder / "part-0.parquet")
        else:  # not Parquet at all: opening it would fail the read
            folder.mkdir(parents=True)
            (folder / "part-0.parquet").write_bytes(b"not a parquet file")
    pattern = "exports/**/*.parquet" if layout == "hive" else "exports/day={date}/*.parquet"
    sources = SourceSet(usage_files=[pattern], base_dir=tmp_path)
    got = usage_for_days(sources, None, MATRIX, DAY)
    assert sorted(Path(p).parent.name for p in got.stats.files_read) == [f"day={DAY - dt.timedelta(days=1)}", f"day={DAY}"]
    assert got.stats.files_footer_only == []
    if layout == "hive":
        assert got.stats.files_skipped_by_date == len(DAYS) - 2
    # Equal to a full read of the same two days' files (the others are not Parquet).
    for d in DAYS:
        if d not in (DAY, DAY - dt.timedelta(days=1)):
            (tmp_path / "exports" / f"day={d}" / "part-0.parquet").unlink()
    same_day(got, unpruned(SourceSet(usage_files=["exports/**/*.parquet"], base_dir=tmp_path), None, DAY), DAY)


def test_placeholder_reports_days_without_files_and_lookback_is_a_setting(tmp_path):
    write_parquet(intervals(DAY), tmp_path / f"{DAY}.parquet")
    sources = SourceSet(usage_files=["{date}.parquet"], lookback_days={"{date}.parquet": 2}, base_dir=tmp_path)
    got = usage_for_days(sources, None, MATRIX, DAY)
    assert got.stats.days_without_files == [str(DAY - dt.timedelta(days=2)), str(DAY - dt.timedelta(days=1))]
    assert got.stats.metadata()["days_without_files"]


def test_hive_day_folders():
    assert hive_day(Path("x/day=2026-10-10/a.parquet")) == dt.date(2026, 10, 10)
    assert hive_day(Path("x/year=2026/dt=2026-10-11/part/a.parquet")) == dt.date(2026, 10, 11)
    assert hive_day(Path("x/day=2026-13-40/a.parquet")) is None
    assert hive_day(Path("x/2026-10-10/a.parquet")) is None


# --------------------------------------------------------------------------- CSV


def test_csv_one_pass_keeps_only_rows_that_touch_the_day(tmp_path):
    rows = pd.concat([intervals(d) for d in DAYS], ignore_index=True)
    text = rows.astype(object).where(rows.notna(), "")
    text.loc[3, "start"] = "yesterday-ish"  # unparseable start: quarantined in every day
    text.loc[4, "start"] = ""  # missing start: likewise
    text.to_csv(tmp_path / "usage.csv", index=False)
    sources = SourceSet(usage_files=["usage.csv"], base_dir=tmp_path)
    got = usage_for_days(sources, None, MATRIX, DAY)
    same_day(got, unpruned(sources, None, DAY), DAY)
    assert got.stats.rows_kept < got.stats.rows_read / 3
    assert {3 + 1, 4 + 1} <= set(got.quarantine["row"].astype(int))


def test_touch_mask_matches_the_quarantine_rule():
    w = Window.of_days(DAY)
    s = pd.Series([ts(DAY, -2), ts(DAY, -2), ts(DAY, 25), pd.NaT, ts(DAY, 30), ts(DAY, 30), ts(DAY, -30), ts(DAY, 0), ts(DAY, 24)])
    e = pd.Series([ts(DAY, -1), pd.NaT, pd.NaT, ts(DAY, 3), ts(DAY, 2), ts(DAY, 26), ts(DAY, 40), ts(DAY, 0), ts(DAY, 25)])
    assert touch_mask(s, e, w).tolist() == [False, True, False, True, True, False, True, True, False]


# --------------------------------------------------------------------------- tables


def _ledger_rows() -> pd.DataFrame:
    rows = pd.concat([intervals(d, n=30) for d in DAYS], ignore_index=True)
    extra = {"run_id": "r", "asset_key": "a", "attempt": 1, "outcome": "completed", "last_checkpoint_at": pd.NaT, "lost_seconds": 0.0}
    return rows.assign(**extra)


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request, tmp_path):
    url = f"sqlite:///{tmp_path / 'c.db'}" if request.param == "sqlite" else request.getfixturevalue("pg_url")
    return TableStore(url)


def test_ledger_range_query_equals_a_full_read(store):
    store.write(LEDGER_TABLE, _ledger_rows())
    sources = SourceSet(ledger=True)
    got = usage_for_days(sources, store, MATRIX, DAY)
    same_day(got, unpruned(sources, store, DAY), DAY)
    assert got.stats.table_rows[LEDGER_TABLE] < len(_ledger_rows()) / 2
    with store.engine.connect() as conn:
        import sqlalchemy as sa

        names = {ix["name"] for ix in sa.inspect(conn).get_indexes(LEDGER_TABLE)}
    assert {f"ix_{LEDGER_TABLE}_start", f"ix_{LEDGER_TABLE}_end"} <= names


def test_collected_table_with_text_times_range_query(store):
    rows = _ledger_rows()[[c for c in _ledger_rows().columns if c not in ("run_id", "asset_key", "attempt", "outcome", "last_checkpoint_at", "lost_seconds")]]
    text = rows.assign(**{c: rows[c].map(lambda v: None if pd.isna(v) else v.isoformat()) for c in ("start", "end")})
    store.write(COLLECTED_PODS_TABLE, text.astype({c: object for c in ("start", "end")}))
    window = Window.of_days(DAY)
    got = store.read_range(COLLECTED_PODS_TABLE, window.start, window.end)
    everything = store.read(COLLECTED_PODS_TABLE)
    expected = everything[touch_mask(everything["start"], everything["end"], window)]
    assert set(expected["pod"]) <= set(got["pod"]) and 0 < len(got) < len(everything) / 2
    # Beyond what touches the day, only inverted rows (a superset the quarantine narrows).
    extra = got[~got["pod"].isin(expected["pod"])]
    assert (pd.to_datetime(extra["end"]) < pd.to_datetime(extra["start"])).all()


def test_a_running_row_whose_twin_ended_before_the_day_is_de_duplicated_as_in_a_full_read(store, tmp_path):
    """An export still has a pod running that the ledger saw end the day before: a full
    read keeps the ledger's row (it knows the end) and prices nothing of it on the day."""
    base = {"namespace": "ml", "node": "n1", "team": "nlp", "project": "p", "cost_center": "", "experiment_id": "",
            "gpu_type": "h100", "gpu_count": 1.0, "capacity_type": "spot", "sharing": "none", "gpu_share": 1.0}
    start = ts(DAY, -30)
    export = pd.DataFrame([{**base, "pod": "twin", "start": start, "end": pd.NaT}, {**base, "pod": "alone", "start": start, "end": pd.NaT}])
    export["end"] = pd.Series([pd.NaT, pd.NaT], dtype="datetime64[us, UTC]")
    write_parquet(export.astype({"start": "datetime64[us, UTC]"}), tmp_path / "export.parquet")
    ledger = pd.DataFrame([{**base, "pod": "twin", "start": start, "end": ts(DAY, -20)}, {**base, "pod": "other", "start": ts(DAY, 3), "end": ts(DAY, 5)}])
    store.write(LEDGER_TABLE, ledger.assign(run_id="r", asset_key="a", attempt=1, outcome="completed", last_checkpoint_at=pd.NaT, lost_seconds=0.0))
    sources = SourceSet(usage_files=["export.parquet"], ledger=True, base_dir=tmp_path)
    got, full = usage_for_days(sources, store, MATRIX, DAY).table, usage_table(unpruned(sources, store, DAY).rows)
    assert sorted(got["pod"]) == sorted(full["pod"]) == ["alone", "other"]
    assert round(got["cost_usd"].sum(), 2) == round(full["cost_usd"].sum(), 2) > 0


def test_collected_retention_keeps_open_and_recent_rows():
    now = dt.datetime(2026, 11, 1, tzinfo=dt.timezone.utc)
    rec = pd.DataFrame({"pod": ["old", "recent", "open"], "start": ["2026-09-01T00:00:00+00:00", "2026-10-30T00:00:00+00:00", "2026-08-01T00:00:00+00:00"],
                        "end": ["2026-09-02T00:00:00+00:00", "2026-10-31T00:00:00+00:00", None]})
    assert list(drop_expired(rec, now, 35)["pod"]) == ["recent", "open"]
    assert list(drop_expired(rec, now, None)["pod"]) == ["old", "recent", "open"]


def test_mixed_sources_over_a_range_equal_each_day_alone(tmp_path):
    for d in DAYS:
        write_parquet(intervals(d, seed=7), tmp_path / "exports" / f"day={d}" / "a.parquet")
    store = TableStore(f"sqlite:///{tmp_path / 'c.db'}")
    store.write(LEDGER_TABLE, _ledger_rows())
    sources = SourceSet(usage_files=["exports/day={date}/*.parquet"], ledger=True, base_dir=tmp_path)
    first, last = DAY - dt.timedelta(days=2), DAY + dt.timedelta(days=1)
    ranged = usage_for_days(sources, store, MATRIX, first, last)
    for d in Window.of_days(first, last).days():
        alone = usage_for_days(sources, store, MATRIX, d)
        key = ["location", "start", "end", "pod", "kind"]
        a = plain(ranged.table[ranged.table["partition_key"] == d.isoformat()]).drop(columns="row").sort_values(key).reset_index(drop=True)
        b = plain(alone.table).drop(columns="row").sort_values(key).reset_index(drop=True)
        assert_same_rows(a, b)
        qa, qb = (q[q["partition_key"] == d.isoformat()] for q in (ranged.quarantine, alone.quarantine))
        assert sorted(qa["reason"]) == sorted(qb["reason"])
    # The range's days, the lookback day, and (issue 19) the earlier days whose footer says
    # an interval still reaches the range: each day's file has one still running.
    beyond = ranged.stats.files_beyond_lookback
    assert beyond and all(Path(p).parent.name < f"day={first - dt.timedelta(days=1)}" for p in beyond)
    assert isinstance(ranged.stats, ReadStats) and len(ranged.stats.files_read) == len(Window.of_days(first, last).days()) + 1 + len(beyond)


# --------------------------------------------------------------------------- Dagster


def _cost_config(tmp_path: Path, url: str) -> Path:
    import yaml

    from gpu_ops.domain.config import BUNDLED_PRICES

    for d in DAYS:
        write_parquet(intervals(d, seed=3), tmp_path / "exports" / f"day={d}" / "part-0.parquet")
    cfg = {
        "storage": {"url": url},
        "prices": str(BUNDLED_PRICES),
        "usage": {"sources": [{"type": "ledger"}, {"type": "file", "path": "exports/day={date}/*.parquet"}], "partitions_start": "2026-10-01", "backfill_days_per_run": 5},
    }
    path = tmp_path / "gpu_ops.yaml"
    path.write_text(yaml.safe_dump(cfg))
    TableStore(url).write(LEDGER_TABLE, _ledger_rows())
    return path


def _materialize(tmp_path: Path, first: dt.date, last: dt.date, one_run: bool) -> dict[str, pd.DataFrame]:
    import dagster as dg
    from dagster._core.storage.tags import ASSET_PARTITION_RANGE_END_TAG, ASSET_PARTITION_RANGE_START_TAG

    from gpu_ops.domain.config import load_config
    from gpu_ops.dagster.cost.assets import build_assets
    from gpu_ops.dagster.resources import GpuOpsSettings
    from gpu_ops.dagster.io_manager import TableIOManager

    url = f"sqlite:///{tmp_path / 'costs.db'}"
    path = _cost_config(tmp_path, url)
    assets, _ = build_assets(load_config(path))
    assert all(a.backfill_policy == dg.BackfillPolicy.multi_run(5) for a in assets if {"gpu_usage", "gpu_cost_attribution"} & {k.path[-1] for k in a.keys})
    selection = dg.AssetSelection.assets("gpu_usage", "gpu_usage_quarantine", "gpu_cost_attribution", "gpu_cost_daily")
    resources = {"gpu_ops": GpuOpsSettings(config_path=str(path)), "table_io_manager": TableIOManager(url=url)}
    days = Window.of_days(first, last).days()
    with dg.instance_for_test() as instance:
        runs = [{ASSET_PARTITION_RANGE_START_TAG: first.isoformat(), ASSET_PARTITION_RANGE_END_TAG: last.isoformat()}] if one_run else [None] * len(days)
        for d, tags in zip(days, runs):
            result = dg.materialize(assets, selection=selection, instance=instance, resources=resources, tags=tags, partition_key=None if tags else d.isoformat())
            assert result.success
        mats = instance.fetch_materializations(dg.AssetKey("gpu_usage"), limit=100).records
        assert sorted(m.partition_key for m in mats) == [d.isoformat() for d in days]  # one materialization per day
    store = TableStore(url)
    return {t: store.read(t) for t in ("gpu_usage", "gpu_usage_quarantine", "gpu_cost_attribution", "gpu_cost_daily")}


def test_a_range_backfill_in_one_run_equals_day_by_day_runs(tmp_path):
    first, last = DAY - dt.timedelta(days=1), DAY + dt.timedelta(days=2)
    ranged = _materialize(tmp_path / "range", first, last, one_run=True)
    daily = _materialize(tmp_path / "daily", first, last, one_run=False)
    for name, key in (("gpu_usage", ["partition_key", "location", "start", "end", "pod", "kind"]), ("gpu_usage_quarantine", ["partition_key", "location", "row", "reason"]), ("gpu_cost_attribution", ["partition_key", "team", "project"]), ("gpu_cost_daily", ["partition_key", "kind", "team", "project", "namespace", "labels"])):
        a, b = (x[name].replace({str(tmp_path / w): "" for w in ("range", "daily")}, regex=True) for x in (ranged, daily))
        a, b = (plain(x).sort_values(key).reset_index(drop=True) for x in (a, b))
        assert len(a) > 0 and sorted(a["partition_key"].unique()) == [d.isoformat() for d in Window.of_days(first, last).days()]
        assert_same_rows(a, b)


def test_the_days_files_come_from_duckdb_with_the_stored_columns_and_types(tmp_path):
    """The day's stored rows are written from DuckDB (no pandas frame on the way): the
    file has every stored column in the stored type (text as text, times as UTC
    nanoseconds, ``row`` as nullable integers), and reads back as the rows the pandas
    pricing gives (:func:`usage_table` over :func:`price_window`), written the old way."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from gpu_ops.flows.cost.stored import USAGE_TABLE_COLUMNS
    from gpu_ops.storage.files import PartitionFiles

    write_parquet(intervals(DAY), tmp_path / f"usage-{DAY}.parquet")
    sources = SourceSet(usage_files=["usage-*.parquet"], base_dir=tmp_path)
    got = usage_for_days(sources, None, MATRIX, DAY)
    path = got.parts.paths[DAY.isoformat()]
    files = PartitionFiles(tmp_path / "rows")
    files.write("pandas", usage_table(unpruned(sources, None, DAY).rows), [DAY.isoformat()])
    new, old = pq.read_table(path), pq.read_table(files.path("pandas", DAY.isoformat()))
    assert new.schema.names == list(USAGE_TABLE_COLUMNS) == old.schema.names
    unwrapped = [f.type.value_type if pa.types.is_dictionary(f.type) else f.type for f in old.schema]
    assert [f.type for f in new.schema] == unwrapped
    assert new.schema.field("day").type == pa.timestamp("ns", "UTC") and new.schema.field("row").type == pa.int64()
    key = ["location", "start", "end", "pod", "kind"]
    a, b = (plain(t.to_pandas()).sort_values(key).reset_index(drop=True) for t in (new, old))
    assert str(a["row"].dtype) == "Int64" and len(a) == got.totals.intervals > 0
    assert_same_rows(a, b)
    assert round(got.totals.allocated_cost_usd, 6) == round(b["cost_usd"].sum(), 6)


_POOL_PROBE = """
import os, sys
import gpu_ops.definitions
assert "pyarrow" not in sys.modules
import numpy as np, pyarrow as pa
pool = pa.default_memory_pool()
a = pa.array(np.arange(1_000_000, dtype=np.float64)) + 0  # allocated by pyarrow's default pool
held = pool.bytes_allocated()
del a
print(os.environ.get("ARROW_DEFAULT_MEMORY_POOL"), pool.backend_name, held >= 8_000_000, pool.bytes_allocated())
"""


@pytest.mark.parametrize("chosen", ["", "mimalloc", "jemalloc"])
def test_loading_the_code_location_has_pyarrow_allocate_from_the_system(chosen):
    """Loading the code location (as the run, its forkserver and every step process do
    before a step imports pyarrow) sets ARROW_DEFAULT_MEMORY_POOL=system, so that pyarrow's
    own C++ allocations come from the system allocator too, and a freed million-row column
    is handed back; a pool the environment chose is kept."""
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"} | ({"ARROW_DEFAULT_MEMORY_POOL": chosen} if chosen else {})
    r = subprocess.run([sys.executable, "-c", _POOL_PROBE], capture_output=True, text=True, env=env, timeout=120, cwd=REPO)
    assert r.returncode == 0, r.stderr
    variable, backend, held, left = r.stdout.split()[-4:]
    assert variable == (chosen or "system") and backend == (chosen or "system") and held == "True" and left == "0"
