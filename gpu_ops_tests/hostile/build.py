"""Parquet cases of the hostile corpus, written at test time with pyarrow.

Binary files are built here rather than committed so that each case says in code what
is wrong with it (a timestamp unit, a list-typed cell, a flipped byte in a data page).
``build(folder)`` writes every file named in ``PARQUET`` under ``folder/parquet/`` and
the generated CSV files (``GENERATED_CSV``) under ``folder/csv/``.
"""

from __future__ import annotations

import datetime as dt
import decimal
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

UTC = dt.timezone.utc
T0 = dt.datetime(2026, 10, 1, 0, 0, tzinfo=UTC)
T2 = dt.datetime(2026, 10, 1, 2, 0, tzinfo=UTC)
FAR = dt.datetime(9999, 12, 31, tzinfo=UTC)
EARLY = dt.datetime(1, 1, 1, tzinfo=UTC)
JUST_AFTER = dt.datetime(2263, 1, 1, tzinfo=UTC)  # one year past what datetime64[ns] holds


def _table(n: int = 2, **override: pa.Array) -> pa.Table:
    """``n`` good rows (2 GPU-hours of a100-80gb on-demand each: $8.00), columns overridable."""
    cols: dict[str, pa.Array] = {
        "start": pa.array([T0] * n, pa.timestamp("us", tz="UTC")),
        "end": pa.array([T2] * n, pa.timestamp("us", tz="UTC")),
        "namespace": pa.array(["ml"] * n),
        "pod": pa.array([f"p{i}" for i in range(n)]),
        "node": pa.array(["n1"] * n),
        "team": pa.array(["nlp"] * n).dictionary_encode(),
        "project": pa.array(["llm"] * n),
        "gpu_type": pa.array(["a100-80gb"] * n).dictionary_encode(),
        "gpu_count": pa.array([1] * n, pa.int64()),
        "capacity_type": pa.array(["on-demand"] * n),
        "sharing": pa.array(["none"] * n),
        "gpu_share": pa.array([1.0] * n),
    }
    cols.update(override)
    return pa.table(cols)


def _times(unit: str, second: dt.datetime, tz: str | None = "UTC", first: dt.datetime = T2) -> pa.Array:
    """[first, second] as a timestamp column of ``unit``; naive when ``tz`` is None."""
    values = [first, second] if tz else [first.replace(tzinfo=None), second.replace(tzinfo=None)]
    return pa.array(values, pa.timestamp(unit, tz=tz))


def _corrupt(path: Path) -> None:
    """A good file whose data pages are overwritten: the footer reads, the pages do not."""
    table = _table(200, pod=pa.array([f"pod-{i:05d}-" + "x" * 40 for i in range(200)]))
    pq.write_table(table, path, compression="snappy")
    data = bytearray(path.read_bytes())
    meta = pq.ParquetFile(path).metadata
    col = meta.row_group(0).column(3)  # pod: the largest column
    begin = col.data_page_offset + 20
    data[begin : begin + 200] = b"\xff" * 200
    path.write_bytes(bytes(data))


def _truncated(path: Path) -> None:
    pq.write_table(_table(50), path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


PARQUET: dict[str, Callable[[Path], None]] = {
    "good.parquet": lambda p: pq.write_table(_table(), p),
    # Timestamps past 2262 (or before 1677) in every unit: datetime64[ns] cannot hold them.
    **{
        f"end_9999_{unit}.parquet": (lambda p, unit=unit: pq.write_table(_table(end=_times(unit, FAR)), p))
        for unit in ("s", "ms", "us")
    },
    "end_9999_s_naive.parquet": lambda p: pq.write_table(_table(end=_times("s", FAR, tz=None)), p),
    "start_0001_us.parquet": lambda p: pq.write_table(_table(start=_times("us", EARLY, first=T0)), p),
    "start_2263_ms.parquet": lambda p: pq.write_table(_table(start=_times("ms", JUST_AFTER, first=T0)), p),
    "end_null_ns.parquet": lambda p: pq.write_table(_table(end=pa.array([T2, None], pa.timestamp("ns", tz="UTC"))), p),
    "end_date32_9999.parquet": lambda p: pq.write_table(_table(end=pa.array([T2.date() + dt.timedelta(days=1), FAR.date()], pa.date32())), p),
    "gpu_count_inf.parquet": lambda p: pq.write_table(_table(gpu_count=pa.array([1.0, float("inf")])), p),
    "gpu_count_nan.parquet": lambda p: pq.write_table(_table(gpu_count=pa.array([1.0, float("nan")])), p),
    "gpu_count_fraction.parquet": lambda p: pq.write_table(_table(gpu_count=pa.array([1.0, 0.5])), p),
    "gpu_count_huge_int.parquet": lambda p: pq.write_table(_table(gpu_count=pa.array([1, 2**62], pa.int64())), p),
    "gpu_share_nan_mig.parquet": lambda p: pq.write_table(_table(sharing=pa.array(["none", "mig"]), gpu_share=pa.array([1.0, float("nan")])), p),
    "list_cell.parquet": lambda p: pq.write_table(_table(team=pa.array([["nlp"], ["nlp", "vision"]], pa.list_(pa.string()))), p),
    "struct_cell.parquet": lambda p: pq.write_table(_table(gpu_count=pa.array([{"n": 1}, {"n": 2}], pa.struct([("n", pa.int64())]))), p),
    "list_cell_gpu_count.parquet": lambda p: pq.write_table(_table(gpu_count=pa.array([[1], [2]], pa.list_(pa.int64()))), p),
    "labels_bad_json.parquet": lambda p: pq.write_table(_table(labels=pa.array(['{"tier": "gold"}', "{tier"])), p),
    "duplicate_rows.parquet": lambda p: pq.write_table(_table(pod=pa.array(["p0", "p0"])), p),
    "missing_columns.parquet": lambda p: pq.write_table(_table().drop_columns(["gpu_count", "capacity_type"]), p),
    "corrupt_page.parquet": _corrupt,
    # Issue 19: one bad value takes down its row, not its file or day.
    "year_75000_us.parquet": lambda p: pq.write_table(_table(end=pa.array([int(T2.timestamp() * 1e6), YEAR_75000_US], pa.int64()).cast(pa.timestamp("us", tz="UTC"))), p),
    # The extremes of the stored integer (-2**63 is also what some writers store for "no time").
    "int64_extreme_times.parquet": lambda p: pq.write_table(
        _table(3, start=pa.array([-(2**63), int(T0.timestamp() * 1e6), int(T0.timestamp() * 1e6)], pa.int64()).cast(pa.timestamp("us", tz="UTC")),
               end=pa.array([int(T2.timestamp() * 1e6), 2**63 - 1, int(T2.timestamp() * 1e6)], pa.int64()).cast(pa.timestamp("us", tz="UTC"))), p
    ),
    "bad_utf8_team.parquet": lambda p: pq.write_table(_table(team=_bad_utf8_text([b"nlp", b"n\xfflp"])), p),
    # Arrow types that an Arrow read hands over and DuckDB or Arrow's text kernels do not take.
    "view_types.parquet": lambda p: pq.write_table(_table(
        team=pa.array(["nlp", "vision "], pa.string_view()), pod=pa.array(["p0", "p\x00"], pa.string_view()), labels=pa.array(['{"tier": "gold"}', None], pa.string_view()),
        gpu_count=pa.array([1.0, 1.0], pa.float16()), gpu_share=pa.array([1.0, 1.0], pa.float16()),
    ), p),
    "decimal256_count.parquet": lambda p: pq.write_table(_table(gpu_count=pa.array([decimal.Decimal("1.0"), decimal.Decimal("0.5")], pa.decimal256(40, 1))), p),
    "binary_team.parquet": lambda p: pq.write_table(_table(team=pa.array([b"nlp", b"vision"], pa.binary())), p),
    "binary_team_bad_utf8.parquet": lambda p: pq.write_table(_table(team=pa.array([b"nlp", b"\xff"], pa.binary())), p),
    "nul_team.parquet": lambda p: pq.write_table(_table(team=pa.array(["nlp", "nl\x00p"]).dictionary_encode()), p),
    "dup_columns.parquet": lambda p: pq.write_table(pa.Table.from_arrays([*_table().columns, pa.array(["x", "y"])], names=[*_table().column_names, "team"]), p),
    "truncated.parquet": _truncated,
    "csv_named_parquet.parquet": lambda p: p.write_text("start,end\n2026-10-01,2026-10-02\n"),
}


def _big_csv(path: Path) -> None:
    """1,200 rows of $1.00 (a quarter hour of a100-80gb on demand), about 130 kB: more
    than one block of the streaming CSV reader. Row 1100 repeats row 1, line 1151 (row
    1150) has a field too many, row 1180 has gpu_count "x": $1,197.00 is priced."""
    header = "start,end,namespace,pod,node,team,project,cost_center,experiment_id,gpu_type,gpu_count,capacity_type,sharing,gpu_share"
    lines = [header]
    for i in range(1, 1201):
        pod = "pod-00001" if i == 1100 else f"pod-{i:05d}"
        count = "x" if i == 1180 else "1"
        line = f"2026-10-01T00:00:00Z,2026-10-01T00:15:00Z,ml,{pod},n1,nlp,llm,,,a100-80gb,{count},on-demand,none,"
        lines.append(line + ",oops" if i == 1150 else line)
    path.write_text("\n".join(lines) + "\n")


HEADER = "start,end,namespace,pod,node,team,project,cost_center,experiment_id,gpu_type,gpu_count,capacity_type,sharing,gpu_share"
GOOD_LINE = "2026-10-01T00:00:00Z,2026-10-01T02:00:00Z,ml,p1,n1,nlp,llm,,,a100-80gb,1,on-demand,none,"


def _nul_team(path: Path) -> None:
    """Row 2's team has a NUL byte inside: refused before any database sees it."""
    path.write_bytes(f"{HEADER}\n{GOOD_LINE}\n".encode() + GOOD_LINE.replace("p1", "p2").replace(",nlp,", ",nl\x00p,").encode() + b"\n")


def _control_in_unread(path: Path) -> None:
    """Control characters in columns a grouping by team does not read (project, node,
    cost center): rows 2-4 are quarantined whatever the grouping."""
    lines = [GOOD_LINE, GOOD_LINE.replace("p1", "p2").replace(",llm,", ",l\x01lm,"), GOOD_LINE.replace("p1", "p3").replace(",n1,", ",n\x00 1,"), GOOD_LINE.replace("p1", "p4").replace(",llm,,", ",llm,c\x7fc,")]
    path.write_bytes(f"{HEADER}\n".encode() + "\n".join(lines).encode() + b"\n")


def _differs_in_node(path: Path) -> None:
    """One interval (namespace, pod, start, GPU type) delivered twice, the second from
    another node: the second supersedes the first, whether the node is grouped by or not."""
    path.write_text(f"{HEADER}\n{GOOD_LINE}\n{GOOD_LINE.replace(',n1,', ',n2,')}\n")


GENERATED_CSV: dict[str, Callable[[Path], None]] = {
    "big_with_problems.csv": _big_csv, "nul_team.csv": _nul_team, "control_in_unread.csv": _control_in_unread, "differs_in_node.csv": _differs_in_node,
}
YEAR_75000_US = 2_304_000_000_000_000_000  # a seconds value written as microseconds, roughly


def _bad_utf8_text(values: list[bytes]) -> pa.Array:
    """A string (UTF-8 annotated) column holding bytes that are not UTF-8."""
    return pa.array(values, pa.binary()).cast(pa.string(), safe=False)


def _day_file(name: str, **override: pa.Array) -> Callable[[Path], None]:
    def write(path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(_table(1, **override), path)

    return write


D = dt.timedelta
# Files in date folders (sources with a `{date}` path): written under parquet/.
DAY_FILES: dict[str, Callable[[Path], None]] = {
    # The same interval exported while running (no end), then finished: billed once.
    "snap/day=2026-10-01/export-0800.parquet": _day_file("a", pod=pa.array(["snap1"]), end=pa.array([None], pa.timestamp("us", tz="UTC"))),
    "snap/day=2026-10-01/export-2359.parquet": _day_file("b", pod=pa.array(["snap1"])),
    # An interval of four days, exported once in the file of the day it started: longer
    # than lookback_days (1). 2026-10-01 holds 24 of its hours: $96.00.
    "long/day=2026-09-28/export.parquet": _day_file(
        "long", start=pa.array([T0 - D(days=3)], pa.timestamp("us", tz="UTC")), end=pa.array([T0 + D(days=1)], pa.timestamp("us", tz="UTC")),
    ),
    "long/day=2026-10-01/export.parquet": _day_file("other", start=pa.array([T0 + D(hours=5)], pa.timestamp("us", tz="UTC")), end=pa.array([T0 + D(hours=7)], pa.timestamp("us", tz="UTC"))),
}


def build(folder: Path) -> None:
    out = folder / "parquet"
    out.mkdir(parents=True, exist_ok=True)
    for name, write in {**PARQUET, **DAY_FILES}.items():
        write(out / name)
    for name, write in GENERATED_CSV.items():
        write(folder / "csv" / name)
