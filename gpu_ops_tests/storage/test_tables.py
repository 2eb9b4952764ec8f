"""TableStore and TableIOManager on real SQLite and real PostgreSQL."""


import datetime as dt
import multiprocessing as mp

import dagster as dg
import pandas as pd
import pytest
import sqlalchemy as sa

from gpu_ops.dagster.io_manager import TableIOManager
from gpu_ops.storage.tables import PARTITION_COLUMN, StorageError, TableStore

UTC = dt.timezone.utc


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def url(request, tmp_path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'tables.db'}"
    return request.getfixturevalue("pg_url")


def day_frame(day: str, n: int = 3, team: str = "nlp") -> pd.DataFrame:
    start = pd.Timestamp(day, tz="UTC")
    return pd.DataFrame(
        {
            "team": [team] * n,
            "gpu_hours": [1.5 * (i + 1) for i in range(n)],
            "gpu_count": list(range(1, n + 1)),
            "start": [start + pd.Timedelta(hours=i) for i in range(n)],
        }
    )


def test_round_trip_keeps_dtypes(url):
    store = TableStore(url)
    df = pd.DataFrame(
        {
            "when": pd.to_datetime(["2026-11-01T10:00:00Z", None], utc=True),
            "day": [dt.date(2026, 11, 1), dt.date(2026, 11, 2)],
            "ok": [True, False],
            "n": pd.array([1, None], dtype="Int64"),
            "x": [0.25, float("nan")],
            "crossed": [["actual-50pct", "actual-80pct"], []],
            "name": ["a", None],
        }
    )
    store.write("round_trip", df)
    back = store.read("round_trip")
    assert back["when"].iloc[0] == pd.Timestamp("2026-11-01T10:00:00Z") and pd.isna(back["when"].iloc[1])
    assert str(back["when"].dtype).startswith("datetime64") and str(back["when"].dt.tz) == "UTC"
    assert list(back["day"]) == [dt.date(2026, 11, 1), dt.date(2026, 11, 2)]
    assert back["ok"].tolist() == [True, False]
    assert back["n"].iloc[0] == 1 and pd.isna(back["n"].iloc[1])
    assert back["x"].iloc[0] == 0.25 and pd.isna(back["x"].iloc[1])
    assert back["crossed"].tolist() == [["actual-50pct", "actual-80pct"], []]
    assert back["name"].iloc[0] == "a" and pd.isna(back["name"].iloc[1])


def test_awkward_text_and_column_projection_round_trip(url):
    # What the CSV of a COPY must carry intact: separators, quotes, newlines, backslashes,
    # an empty string next to a NULL, sub-microsecond timestamps (stored to the microsecond).
    store = TableStore(url)
    text = ['a,b "quoted"', "line\nbreak", "back\\slash \\N", "", None, "ünï"]
    df = pd.DataFrame(
        {
            "text": text,
            "mixed": [1, "two", 3.5, None, "", "x"],  # not all text: stored as str() of each
            "at": pd.to_datetime(["2026-11-01T10:00:00.123456Z"] * 6, utc=True),
            "v": [1.0, -0.0, 1e-300, float("inf"), float("nan"), 2.5],
        }
    )
    store.write("awkward", df)
    back = store.read("awkward")
    assert back["text"].tolist()[:4] == text[:4] and pd.isna(back["text"].iloc[4]) and back["text"].iloc[5] == "ünï"
    assert back["mixed"].tolist()[:3] == ["1", "two", "3.5"] and pd.isna(back["mixed"].iloc[3]) and back["mixed"].iloc[4] == ""
    assert (back["at"] == pd.Timestamp("2026-11-01T10:00:00.123456Z")).all()
    assert back["v"].iloc[2] == 1e-300 and back["v"].iloc[3] == float("inf") and pd.isna(back["v"].iloc[4])
    # Only the columns asked for (and that exist), in the order asked.
    part = store.read("awkward", columns=["v", "text", "no_such_column"])
    assert list(part.columns) == ["v", "text"] and part["text"].tolist()[:4] == text[:4]


def test_partition_replace_is_idempotent_and_leaves_other_days_alone(url):
    store = TableStore(url)
    store.write("usage", day_frame("2026-11-01"), partition_keys=["2026-11-01"])
    for _ in range(3):
        store.write("usage", day_frame("2026-11-02", n=4), partition_keys=["2026-11-02"])
    df = store.read("usage")
    assert df.groupby(PARTITION_COLUMN).size().to_dict() == {"2026-11-01": 3, "2026-11-02": 4}
    assert store.partitions("usage") == ["2026-11-01", "2026-11-02"]
    day2 = store.read("usage", partition_keys=["2026-11-02"]).sort_values("gpu_count")
    assert day2["gpu_hours"].tolist() == [1.5, 3.0, 4.5, 6.0]


def _write_day(url: str, day: str, barrier) -> None:
    barrier.wait(timeout=30)
    for _ in range(5):
        TableStore(url).write("concurrent", day_frame(day, n=50), partition_keys=[day])


def test_two_processes_writing_different_days_both_land(url):
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(2)
    procs = [ctx.Process(target=_write_day, args=(url, day, barrier)) for day in ("2026-11-01", "2026-11-02")]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    assert [p.exitcode for p in procs] == [0, 0]
    df = TableStore(url).read("concurrent")
    assert df.groupby(PARTITION_COLUMN).size().to_dict() == {"2026-11-01": 50, "2026-11-02": 50}


def test_a_write_the_database_rejects_rolls_back_and_keeps_the_old_rows(url):
    store = TableStore(url)
    store.write("guarded", day_frame("2026-11-01"), partition_keys=["2026-11-01"])
    # A real constraint in the database rejects the second write after its DELETE ran.
    with store.engine.begin() as conn:
        if store.dialect == "postgresql":
            conn.execute(sa.text('ALTER TABLE guarded ADD CONSTRAINT non_negative CHECK (gpu_hours >= 0)'))
        else:
            conn.execute(
                sa.text(
                    "CREATE TRIGGER non_negative BEFORE INSERT ON guarded WHEN NEW.gpu_hours < 0 "
                    "BEGIN SELECT RAISE(ABORT, 'gpu_hours must be >= 0'); END"
                )
            )
    bad = day_frame("2026-11-01", n=5)
    bad.loc[4, "gpu_hours"] = -1.0
    with pytest.raises(StorageError, match="table guarded: the database rejected the write; nothing was changed"):
        store.write("guarded", bad, partition_keys=["2026-11-01"])
    kept = store.read("guarded")
    assert len(kept) == 3 and kept["gpu_hours"].min() > 0


def test_a_new_column_extends_the_table_and_int_widens_to_float(url):
    store = TableStore(url)
    store.write("evolving", day_frame("2026-11-01"), partition_keys=["2026-11-01"])
    newer = day_frame("2026-11-02").assign(savings_usd=[1.0, 2.0, 3.0], gpu_count=[0.5, 1.0, 1.5])
    store.write("evolving", newer, partition_keys=["2026-11-02"])
    df = store.read("evolving").sort_values([PARTITION_COLUMN, "start"])
    assert df["savings_usd"].isna().sum() == 3 and df["savings_usd"].dropna().tolist() == [1.0, 2.0, 3.0]
    assert df["gpu_count"].tolist() == [1.0, 2.0, 3.0, 0.5, 1.0, 1.5]
    with pytest.raises(StorageError, match="table evolving, column start: was datetime, the new rows have str"):
        store.write("evolving", newer.assign(start="yesterday"), partition_keys=["2026-11-03"])


def test_rows_outside_the_written_partitions_are_refused(url):
    store = TableStore(url)
    frame = day_frame("2026-11-01").assign(**{PARTITION_COLUMN: ["2026-11-01", "2026-11-01", "2026-11-09"]})
    with pytest.raises(StorageError, match=r"rows for partitions \['2026-11-09'\]"):
        store.write("strays", frame, partition_keys=["2026-11-01"])


DAILY = dg.DailyPartitionsDefinition(start_date="2026-11-01", timezone="UTC")


@dg.asset(partitions_def=DAILY, io_manager_key="table_io_manager")
def daily_usage(context: dg.AssetExecutionContext) -> pd.DataFrame:
    return day_frame(context.partition_key)


@dg.asset(partitions_def=DAILY, io_manager_key="table_io_manager")
def daily_total(daily_usage: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame({"gpu_hours": [daily_usage["gpu_hours"].sum()], "rows": [len(daily_usage)]})


def test_io_manager_materializes_a_day_three_times_with_the_same_rows(url):
    instance = dg.DagsterInstance.ephemeral()
    resources = {"table_io_manager": TableIOManager(url=url)}
    for _ in range(3):
        result = dg.materialize([daily_usage, daily_total], partition_key="2026-11-03", resources=resources, instance=instance)
        assert result.success
    store = TableStore(url)
    assert len(store.read("daily_usage")) == 3
    total = store.read("daily_total")
    assert total[["gpu_hours", "rows"]].values.tolist() == [[9.0, 3]]
    mat = result.asset_materializations_for_node("daily_total")[0]
    assert mat.metadata["rows"].value == 1 and mat.metadata["table"].value == "daily_total"


def test_read_grouped_sums_per_grouping_in_the_database(url):
    store = TableStore(url)
    awkward = 'a "quoted", comma\nline — ü'
    df = pd.DataFrame({
        "kind": ["allocated", "allocated", "allocated", "idle"],
        "team": [awkward, awkward, "nlp", ""],
        "project": ["p1", "p2", "p1", ""],
        "cost_usd": [1.25, 2.5, 4.0, 8.0],
        "intervals": [1, 2, 3, 4],
    })
    store.write("daily", df, partition_keys=["2026-10-01"])
    store.write("daily", df.assign(cost_usd=df["cost_usd"] * 100), partition_keys=["2026-10-02"])
    got = store.read_grouped("daily", {"": [], "team": ["team"], "region": ["region"]}, ["cost_usd", "intervals"], keep=["kind", "absent"], partition_keys=["2026-10-01"])
    got = got.sort_values(["grouping", "kind", "team"]).reset_index(drop=True)
    assert list(got.columns) == ["grouping", "kind", PARTITION_COLUMN, "team", "region", "cost_usd", "intervals"]
    rows = [tuple(r) for r in got[["grouping", "kind", "team", "region", "cost_usd", "intervals"]].itertuples(index=False)]
    assert rows == [
        ("", "allocated", "", "", 7.75, 6), ("", "idle", "", "", 8.0, 4),
        ("region", "allocated", "", "", 7.75, 6), ("region", "idle", "", "", 8.0, 4),  # a column the table lacks reads as ""
        ("team", "allocated", awkward, "", 3.75, 3), ("team", "allocated", "nlp", "", 4.0, 3), ("team", "idle", "", "", 8.0, 4),
    ]
    assert set(got[PARTITION_COLUMN]) == {"2026-10-01"}
    assert store.read_grouped("nothing", {"": []}, ["cost_usd"], missing_ok=True).empty
    with pytest.raises(StorageError, match="does not exist"):
        store.read_grouped("nothing", {"": []}, ["cost_usd"])


@pytest.mark.parametrize("bad", ["not a url", "", "mysql://u:hunter2@db/x", "postgresql://u:hunter2@[::1/x"])
def test_a_storage_url_that_is_no_database_url_is_a_storage_error_that_keeps_its_secret(bad):
    """A URL from the environment (storage.url: {env: NAME}) is only seen when the store
    opens: one that SQLAlchemy cannot parse was an ArgumentError; now a StorageError saying
    what is accepted, with no password in it."""
    with pytest.raises(StorageError, match=r"only sqlite:/// and postgresql:// are supported") as caught:
        TableStore(bad).read("t", missing_ok=True)
    assert "hunter2" not in str(caught.value)
