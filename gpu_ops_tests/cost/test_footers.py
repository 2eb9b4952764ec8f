"""Parquet footer summaries cached in the gpu_ops database (gpu_ops.flows.cost.footers).

A later day's read stats the files of other days instead of opening them, and gives what
a read without the cache gives, to the cent: files of other days, open intervals,
intervals crossing both midnights, a file rewritten between runs, a deleted file. Files
are written, then left to settle (:data:`SETTLE_NS`: a file changed within a timestamp
tick of being summarised is never cached), so these tests wait that long once each.
"""

from __future__ import annotations

import datetime as dt
import os
import time
from pathlib import Path

import pandas as pd
import pytest

from gpu_ops.flows.cost.footers import FOOTERS_TABLE, SETTLE_NS, FooterCache
from gpu_ops.flows.cost.pipeline import SourceSet, usage_for_days
from gpu_ops.flows.cost.window import FooterSummary, Window
from gpu_ops.storage.tables import TableStore
from gpu_ops_tests.cost.helpers import MATRIX
from gpu_ops_tests.cost.test_window import DAY, DAYS, intervals, plain, same_day, unpruned, write_parquet

CLOSED_BEFORE = DAYS[:2]  # no running rows: their footers rule them out of later days


def settle() -> None:
    time.sleep(SETTLE_NS / 1e9 + 0.1)


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request, tmp_path):
    url = f"sqlite:///{tmp_path / 'c.db'}" if request.param == "sqlite" else request.getfixturevalue("pg_url")
    return TableStore(url)


def export_day(d: dt.date, folder: Path) -> Path:
    """A day's export: intervals crossing both midnights, inverted and unpriced rows, and a
    running one except on the oldest days; one later day lacks a required column."""
    rows = intervals(d)
    if d in CLOSED_BEFORE:
        rows = rows[~rows["pod"].str.startswith("open-")]
    if d == DAYS[-1]:
        rows = rows.drop(columns="capacity_type")
    path = folder / f"usage-{d}.parquet"
    write_parquet(rows, path)
    return path


def flat_folder(folder: Path) -> SourceSet:
    for d in DAYS:
        export_day(d, folder)
    settle()
    return SourceSet(usage_files=["usage-*.parquet"], base_dir=folder)


def same_cost(a, b) -> None:
    """Two bounded reads of a day give the same rows, quarantine and cost."""
    key = ["location", "start", "end", "pod", "kind"]
    x, y = (plain(u.table).sort_values(key).reset_index(drop=True) for u in (a, b))
    pd.testing.assert_frame_equal(x, y, check_dtype=False)
    assert round(x["cost_usd"].sum(), 2) == round(y["cost_usd"].sum(), 2)
    qcols = ["location", "row", "field", "reason"]
    assert sorted(map(tuple, a.quarantine[qcols].astype(str).to_numpy().tolist())) == sorted(map(tuple, b.quarantine[qcols].astype(str).to_numpy().tolist()))


def names(paths: list[str]) -> set[str]:
    return {Path(p).name for p in paths}


def test_a_later_day_stats_other_days_files_and_equals_a_read_without_the_cache(store, tmp_path):
    sources = flat_folder(tmp_path)
    first = usage_for_days(sources, store, MATRIX, DAY)  # opens every footer, remembers them
    assert first.stats.files_skipped_by_summary == []
    assert len(store.read(FOOTERS_TABLE)) == len(DAYS)
    for day in (DAY, DAY + dt.timedelta(days=1)):
        cached = usage_for_days(sources, store, MATRIX, day)
        same_cost(cached, usage_for_days(sources, None, MATRIX, day))
        same_day(cached, unpruned(sources, None, day), day)
        skipped = names(cached.stats.files_skipped_by_summary)
        # Later days start after the day; the oldest end before it and have no running rows.
        assert {f"usage-{d}.parquet" for d in DAYS if d > day or d in CLOSED_BEFORE} == skipped
        assert not skipped & names(cached.stats.files_read + cached.stats.files_footer_only)
        assert cached.stats.row_groups_total == first.stats.row_groups_total
    # The file missing a required column is quarantined from its cached columns too.
    assert any("capacity_type" in r for r in cached.quarantine["reason"])


def test_a_file_rewritten_in_place_is_read_again(store, tmp_path):
    sources = flat_folder(tmp_path)
    usage_for_days(sources, store, MATRIX, DAY)
    later = tmp_path / f"usage-{DAY + dt.timedelta(days=2)}.parquet"
    old = later.stat()
    write_parquet(intervals(DAY, seed=99), later)  # same name, now rows of the day
    os.utime(later, ns=(old.st_atime_ns, old.st_mtime_ns))  # even with its old mtime back
    got = usage_for_days(sources, store, MATRIX, DAY)
    assert later.name in names(got.stats.files_read)
    same_cost(got, usage_for_days(sources, None, MATRIX, DAY))
    same_day(got, unpruned(sources, None, DAY), DAY)
    assert (got.table["location"] == str(later)).any()


def test_a_deleted_files_summary_is_ignored_and_a_new_file_there_is_read(store, tmp_path):
    sources = flat_folder(tmp_path)
    usage_for_days(sources, store, MATRIX, DAY)
    gone = tmp_path / f"usage-{DAYS[0]}.parquet"
    gone.unlink()
    got = usage_for_days(sources, store, MATRIX, DAY)
    assert gone.name not in names(got.stats.files_skipped_by_summary + got.stats.files_read + got.stats.files_footer_only)
    same_cost(got, usage_for_days(sources, None, MATRIX, DAY))
    write_parquet(intervals(DAY, seed=5), gone)  # a new file under the deleted one's name
    got = usage_for_days(sources, store, MATRIX, DAY)
    assert gone.name in names(got.stats.files_read)
    same_cost(got, usage_for_days(sources, None, MATRIX, DAY))


def test_a_range_read_with_the_cache_equals_each_day_without_it(store, tmp_path):
    sources = flat_folder(tmp_path)
    usage_for_days(sources, store, MATRIX, DAYS[0])
    first, last = DAY - dt.timedelta(days=1), DAY + dt.timedelta(days=1)
    ranged = usage_for_days(sources, store, MATRIX, first, last)
    assert ranged.stats.files_skipped_by_summary
    for d in Window.of_days(first, last).days():
        same_day(ranged, unpruned(sources, None, d), d)


def test_times_beyond_nanoseconds_are_remembered_as_unbounded(store, tmp_path):
    """An end in year 9999 (seconds unit) is past what int64 nanoseconds hold: the summary
    keeps the file unbounded (always read) rather than failing to store it."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = intervals(DAY).query("pod.str.startswith('p-')").reset_index(drop=True)
    table = pa.Table.from_pandas(rows, preserve_index=False)
    far = pa.array([dt.datetime(9999, 12, 31, tzinfo=dt.timezone.utc)] * len(rows), pa.timestamp("s", tz="UTC"))
    pq.write_table(table.set_column(table.schema.get_field_index("end"), "end", far), tmp_path / "far.parquet")
    settle()
    sources = SourceSet(usage_files=["far.parquet"], base_dir=tmp_path)
    first = usage_for_days(sources, store, MATRIX, DAY + dt.timedelta(days=3))
    assert len(store.read(FOOTERS_TABLE)) == 1
    again = usage_for_days(sources, store, MATRIX, DAY + dt.timedelta(days=3))
    assert again.stats.files_skipped_by_summary == [] and names(again.stats.files_read) == {"far.parquet"}
    same_cost(again, first)
    same_cost(again, usage_for_days(sources, None, MATRIX, DAY + dt.timedelta(days=3)))


def test_a_footer_table_the_database_rejects_leaves_the_figures_alone_and_says_so(store, tmp_path):
    import sqlalchemy as sa

    with store.engine.begin() as conn:  # someone else's table under our name
        conn.execute(sa.text(f"CREATE TABLE {FOOTERS_TABLE} (path TEXT)"))
    sources = flat_folder(tmp_path)
    for _ in range(2):
        got = usage_for_days(sources, store, MATRIX, DAY)
        assert "footer_cache_problem" in got.stats.metadata() and got.stats.files_skipped_by_summary == []
        same_cost(got, usage_for_days(sources, None, MATRIX, DAY))


# --------------------------------------------------------------------------- the cache itself


SUMMARY = FooterSummary(1, 2, False, ("start", "end"), 3)


def test_the_stat_key_includes_ctime_so_restoring_size_and_mtime_does_not_fool_it(tmp_path):
    store = TableStore(f"sqlite:///{tmp_path / 'c.db'}")
    f = tmp_path / "a.parquet"
    f.write_bytes(b"x" * 100)
    settle()
    cache = FooterCache(store)
    cache.load([f])
    cache.remember(f, SUMMARY)
    assert cache.save() == 1
    again = FooterCache(store)
    again.load([f])
    assert again.summary(f) == SUMMARY
    old = f.stat()
    f.write_bytes(b"y" * 100)  # same size, new content
    os.utime(f, ns=(old.st_atime_ns, old.st_mtime_ns))  # and the old mtime, as cp -p / rsync -t leave it
    assert f.stat().st_size == old.st_size and f.stat().st_mtime_ns == old.st_mtime_ns
    third = FooterCache(store)
    third.load([f])
    assert third.summary(f) is None


def test_a_file_changed_within_the_settle_time_or_during_the_read_is_not_remembered(tmp_path):
    store = TableStore(f"sqlite:///{tmp_path / 'c.db'}")
    fresh = tmp_path / "fresh.parquet"
    fresh.write_bytes(b"x")
    cache = FooterCache(store)
    cache.load([fresh])
    cache.remember(fresh, SUMMARY)
    assert cache.save() == 0  # just written: its stat key could survive a same-tick rewrite
    moving = tmp_path / "moving.parquet"
    moving.write_bytes(b"x")
    settle()
    cache = FooterCache(store)
    cache.load([moving])
    moving.write_bytes(b"xy")  # changed between the stat and the footer read
    cache.remember(moving, SUMMARY)
    assert cache.save() == 0


def test_a_symlink_is_keyed_by_its_target(tmp_path):
    store = TableStore(f"sqlite:///{tmp_path / 'c.db'}")
    target = tmp_path / "pool" / "a.parquet"
    target.parent.mkdir()
    target.write_bytes(b"x")
    link = tmp_path / "link.parquet"
    link.symlink_to(target)
    settle()
    cache = FooterCache(store)
    cache.load([link])
    cache.remember(link, SUMMARY)
    cache.save()
    assert list(store.read(FOOTERS_TABLE)["path"]) == [os.path.realpath(target)]
    other = FooterCache(store)
    other.load([target])
    assert other.summary(target) == SUMMARY


def test_file_summary_rules_out_only_what_no_row_group_can_touch():
    w = Window.of_days(DAY)
    at = lambda h: (pd.Timestamp(DAY.isoformat(), tz="UTC") + pd.Timedelta(hours=h)).value  # noqa: E731
    assert not FooterSummary(at(24), at(30), False, (), 1).may_touch(w)  # starts at the day's end
    assert not FooterSummary(at(-30), at(-1), False, (), 1).may_touch(w)  # ended before it
    assert FooterSummary(at(-30), None, True, (), 1).may_touch(w)  # still running
    assert FooterSummary(at(-30), at(0), False, (), 1).may_touch(w)  # ends at its first instant
    assert FooterSummary(None, None, False, (), 1).may_touch(w)  # no usable statistics
