"""PartitionFiles: row-level tables as one Parquet file per partition, on a real folder."""

from __future__ import annotations

import pandas as pd
import pytest

from gpu_ops.storage.errors import StorageError
from gpu_ops.storage.files import PartitionFiles


def frame(day: str, n: int, team: str = "nlp") -> pd.DataFrame:
    return pd.DataFrame(
        {
            "start": pd.date_range(day, periods=n, freq="h", tz="UTC"),
            "team": [team] * n,
            "pod": [f"p-{i}" if i else None for i in range(n)],
            "row": pd.array([i if i % 2 else None for i in range(n)], dtype="Int64"),
            "cost_usd": [1.5 * i for i in range(n)],
        }
    )


def test_partitions_replace_read_back_with_dtypes_and_only_the_columns_asked(tmp_path):
    files = PartitionFiles(tmp_path)
    files.write("usage", frame("2026-10-01", 3), ["2026-10-01"])
    files.write("usage", frame("2026-10-02", 5, "vision"), ["2026-10-02"])
    files.write("usage", frame("2026-10-01", 2), ["2026-10-01"])  # a re-run replaces, never appends
    assert files.partitions("usage") == ["2026-10-01", "2026-10-02"]
    one = files.read("usage", ["2026-10-01"])
    pd.testing.assert_frame_equal(one, frame("2026-10-01", 2))  # tz-aware times, None, nullable ints kept
    both = files.read("usage", ["2026-10-01", "2026-10-02", "2026-10-03"], columns=["cost_usd", "team", "absent"])
    assert list(both.columns) == ["cost_usd", "team", "partition_key"]
    assert both.groupby("partition_key")["team"].first().to_dict() == {"2026-10-01": "nlp", "2026-10-02": "vision"}
    assert not list((tmp_path / "usage" / "partition_key=2026-10-01").glob(".*tmp"))  # no temporary left behind


def test_a_root_under_a_regular_file_is_an_error_naming_the_setting(tmp_path):
    (tmp_path / "file").write_text("not a folder")
    with pytest.raises(StorageError, match=r"usage: cannot write under .*/file/rows \(storage\.row_level_path\)"):
        PartitionFiles(tmp_path / "file" / "rows").write("usage", frame("2026-10-01", 1), ["2026-10-01"])


def test_several_partitions_in_one_write_and_stray_rows_refused(tmp_path):
    files = PartitionFiles(tmp_path)
    df = pd.concat([frame("2026-10-01", 2).assign(partition_key="2026-10-01"), frame("2026-10-02", 1).assign(partition_key="2026-10-02")])
    assert files.write("usage", df, ["2026-10-01", "2026-10-02", "2026-10-03"]) == 3
    assert files.partitions("usage") == ["2026-10-01", "2026-10-02", "2026-10-03"]  # the empty day has its (empty) file
    assert len(files.read("usage", ["2026-10-03"])) == 0
    with pytest.raises(StorageError, match="outside the ones written"):
        files.write("usage", df, ["2026-10-01"])
    assert len(files.read("usage", ["2026-10-02"])) == 1  # the refused write changed nothing


@pytest.fixture
def small_row_groups(monkeypatch: pytest.MonkeyPatch) -> int:
    """Row groups of 1,000 rows instead of 256,000: what is written per row group (one
    slice at a time, categories converted once, plain or dictionary pages) is the same
    at any size, and several row groups take thousands of rows instead of a million."""
    import gpu_ops.storage.files as files_module

    monkeypatch.setattr(files_module, "ROW_GROUP", 1_000)
    return 1_000


def test_a_categorical_with_a_category_per_row_is_written_plain_and_reads_back_the_same(tmp_path, small_row_groups):
    import pyarrow.parquet as pq

    files = PartitionFiles(tmp_path)
    n = 6 * small_row_groups  # more than two row groups
    df = pd.DataFrame({
        "pod": pd.Categorical([f"pod-{i}" if i % 1000 else None for i in range(n)]),
        "team": pd.Categorical(["nlp", "vision", "ü \"q\""] * (n // 3)),
        "cost_usd": [0.25 * (i % 7) for i in range(n)],
    })
    files.write("usage", df, ["2026-10-01"])
    meta = pq.ParquetFile(files.path("usage", "2026-10-01")).metadata
    assert meta.num_row_groups == 6
    encodings = {meta.row_group(0).column(i).path_in_schema: meta.row_group(0).column(i).encodings for i in range(meta.num_columns)}
    assert "RLE_DICTIONARY" not in encodings["pod"] and "RLE_DICTIONARY" in encodings["team"]
    back = files.read("usage", ["2026-10-01"])
    pd.testing.assert_frame_equal(back, df, check_categorical=False)
    assert back["pod"].isna().sum() == n // 1000 and isinstance(back["pod"].dtype, pd.CategoricalDtype)


@pytest.mark.parametrize("n", [0, 7, 3_500])
def test_categoricals_of_every_kind_read_back_as_arrow_converts_the_whole_frame(tmp_path, n, small_row_groups):
    """Each slice's categoricals are built from categories converted once: the file reads
    back as Arrow's conversion of the whole frame does (missing values, ordered, numbers
    as categories, unused categories, several row groups, no rows)."""
    import pyarrow as pa

    files = PartitionFiles(tmp_path)
    df = pd.DataFrame({
        "team": pd.Categorical([["nlp", None, "vision"][i % 3] for i in range(n)], categories=["vision", "nlp", "unused"]),
        "size": pd.Categorical([i % 4 for i in range(n)], categories=[3, 2, 1, 0], ordered=True),
        "pod": pd.Categorical([f"pod-{i}" for i in range(n)]),
        "note": [""] * n,
        "cost_usd": [0.5 * i for i in range(n)],
    })
    files.write("usage", df, ["2026-10-01"])
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pandas(df, preserve_index=False), tmp_path / "whole.parquet")
    stored, expected = pq.read_table(files.path("usage", "2026-10-01")), pq.read_table(tmp_path / "whole.parquet")
    assert stored.schema.equals(expected.schema, check_metadata=True)
    pd.testing.assert_frame_equal(files.read("usage", ["2026-10-01"]), expected.to_pandas(), check_categorical=False)


@pytest.mark.parametrize("n", [5, 3_500])
def test_text_categories_held_by_arrow_are_stored_as_python_string_categories_are(tmp_path, n, small_row_groups):
    """A categorical whose categories are Arrow-backed text (pandas' "str", as the engine
    hands a day's pods over) is the same file as with Python-string categories: the same
    schema and metadata (``string`` values, not ``large_string``), the same rows back."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    pods = [f"pod-{i}" for i in range(n)]
    codes = [i if i % 4 else -1 for i in range(n)]
    arrow = pd.Index(pd.array(pa.array(pods), dtype="str"))
    assert isinstance(arrow.array, pd.arrays.ArrowStringArray)
    frames = {
        name: pd.DataFrame({"pod": pd.Categorical.from_codes(codes, categories=cats), "team": pd.Categorical.from_codes([i % 2 for i in range(n)], categories=pd.Index(pd.array(pa.array(["nlp", "cv"]), dtype="str")) if name == "arrow" else ["nlp", "cv"])})
        for name, cats in (("arrow", arrow), ("python", pd.Index(pods, dtype=object)))
    }
    files = PartitionFiles(tmp_path)
    for name, df in frames.items():
        files.write(name, df, ["2026-10-01"])
    arrow_file, python_file = (pq.read_table(files.path(name, "2026-10-01")) for name in frames)
    assert pq.ParquetFile(files.path("arrow", "2026-10-01")).metadata.num_row_groups == -(-max(n, 1) // small_row_groups)
    assert arrow_file.schema.field("pod").type.value_type == pa.string()
    assert arrow_file.schema.equals(python_file.schema, check_metadata=True)
    assert arrow_file.equals(python_file)
    pd.testing.assert_frame_equal(files.read("arrow", ["2026-10-01"]), files.read("python", ["2026-10-01"]))


def test_duckdb_reads_the_row_level_table_through_a_view_under_its_name(tmp_path):
    import duckdb

    files = PartitionFiles(tmp_path / "it's rows")  # a quote in the folder name
    files.write("gpu_usage", frame("2026-10-01", 5), ["2026-10-01"])
    files.write("gpu_usage", frame("2026-10-02", 3, team="vision").assign(labels='{"tier": "gold"}'), ["2026-10-02"])  # a column added later
    con = duckdb.connect()
    files.sql_view(con, "gpu_usage")
    got = con.execute("SELECT partition_key, team, count(*), sum(cost_usd), count(labels) FROM gpu_usage GROUP BY ALL ORDER BY 1").fetchall()
    assert got == [("2026-10-01", "nlp", 5, 15.0, 0), ("2026-10-02", "vision", 3, 4.5, 3)]
    ref = files.read("gpu_usage")
    assert con.execute("SELECT count(*), sum(cost_usd) FROM gpu_usage").fetchone() == (len(ref), ref["cost_usd"].sum())
    with pytest.raises(StorageError, match="no partition file"):
        files.sql_view(con, "gpu_usage_quarantine")
    with pytest.raises(StorageError, match="not a usable"):
        files.sql_view(con, "gpu_usage", view='x"; DROP TABLE y; --')


def test_partitions_written_by_different_runs_read_together_whatever_each_stored_a_text_column_as(tmp_path):
    """A day written with ``kind`` categorical (one value, Parquet dictionary), another
    with it as plain text, a third with a categorical of other width and a number column
    as integers where the others have floats, a fourth without rows: a range run that
    reads the four (a downstream asset over row-level Parquet) gets one frame, not Arrow's
    "Unable to merge: Field kind has incompatible types"."""
    files = PartitionFiles(tmp_path)
    files.write("t", pd.DataFrame({"kind": pd.Categorical(["allocated", "allocated"]), "n": [1.5, 2.0]}), ["2026-10-01"])
    files.write("t", pd.DataFrame({"kind": ["allocated", "idle"], "n": [3.0, 4.0]}), ["2026-10-02"])
    many = pd.Categorical([f"k{i}" for i in range(300)])  # more categories than int8 indices hold
    files.write("t", pd.DataFrame({"kind": many, "n": range(300)}), ["2026-10-03"])
    files.write("t", pd.DataFrame({"kind": pd.Series([], dtype=object), "n": pd.Series([], dtype=float)}), ["2026-10-04"])  # a day without rows: text of no type
    got = files.read("t", ["2026-10-01", "2026-10-02", "2026-10-03", "2026-10-04"])
    assert got["kind"].astype(str).tolist() == ["allocated", "allocated", "allocated", "idle", *[f"k{i}" for i in range(300)]]
    assert got["n"].tolist()[:4] == [1.5, 2.0, 3.0, 4.0] and got["n"].iloc[-1] == 299
    assert got["partition_key"].tolist()[:4] == ["2026-10-01", "2026-10-01", "2026-10-02", "2026-10-02"]
    assert files.read("t")["kind"].astype(str).tolist() == got["kind"].astype(str).tolist()
