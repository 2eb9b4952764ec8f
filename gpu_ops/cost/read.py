"""Reading usage files as Arrow for the engine: nothing is parsed or judged here.

A Parquet file is read with its own column types (only the row groups that can touch a
window, see :mod:`gpu_ops.cost.window`); a CSV file as BINARY cells (the rule book
decodes them as UTF-8, quarantining a bad value on its own row) with its line-level
problems (a line with the wrong number of fields). What stops a whole file (no such
file, not Parquet, a missing or duplicated column name, an empty CSV) is one
:class:`~gpu_ops.cost.usage.UsageSourceError` naming the file; the engine turns it into
a file-level quarantine row.
"""

from __future__ import annotations

import csv
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpu_ops.cost.columns import parquet_columns
from gpu_ops.cost.usage import UsageSourceError, require_usage_columns

if TYPE_CHECKING:
    from gpu_ops.cost.footers import FooterCache
    from gpu_ops.cost.window import ReadStats, Window


@dataclass
class FileRows:
    """One file's rows as Arrow, with 1-based row numbers and CSV lines not read."""

    path: Path
    table: Any
    rows: Any
    bad_lines: list[tuple[int, str]] = field(default_factory=list)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _unique_names(path: Path, names: Sequence[str]) -> None:
    twice = sorted(n for n, k in Counter(names).items() if k > 1)
    if twice:
        raise UsageSourceError(path, f"duplicate column name(s) {', '.join(repr(n) for n in twice)}: each column must appear once")


def read_file(path: Path, columns: Sequence[str] | None = None, window: Window | None = None, stats: ReadStats | None = None, footers: FooterCache | None = None) -> FileRows:
    suffix = path.suffix.lower()
    if suffix in (".parquet", ".pq"):
        return _parquet(path, columns, window, stats, footers)
    if suffix == ".csv":
        return _csv(path, columns, stats)
    raise UsageSourceError(path, f"unsupported extension {suffix!r} (use .csv or .parquet)")


def _parquet(path: Path, columns: Sequence[str] | None, window: Window | None, stats: ReadStats | None, footers: FooterCache | None) -> FileRows:
    import numpy as np
    import pyarrow.parquet as pq

    from gpu_ops.cost import window as win

    try:
        pf = pq.ParquetFile(path)
        schema = pf.schema_arrow
    except Exception as exc:  # any reader error names the file
        raise UsageSourceError(path, f"not a readable Parquet file: {_first_line(exc)}") from None
    if footers is not None and window is not None:  # remembered even when its columns are wrong
        footers.remember(path, win.FooterSummary.of(schema, pf.metadata))
    _unique_names(path, schema.names)
    present = parquet_columns(schema.names, columns)
    try:
        require_usage_columns(path, present)
    except UsageSourceError:
        if stats is not None and window is not None:  # counted as a read of its footer counts them
            stats.row_groups_total += pf.metadata.num_row_groups
        raise
    try:
        if window is None:
            table = pq.read_table(path, columns=present)
            return FileRows(path, table, np.arange(1, table.num_rows + 1, dtype=np.int64))
        table, rows = win.read_parquet(path, columns, window, stats or win.ReadStats(), footers)
        return FileRows(path, table, rows)
    except UsageSourceError:
        raise
    except Exception as exc:  # a corrupt page, a truncated file
        raise UsageSourceError(path, f"not a readable Parquet file: {_first_line(exc)}") from None


def _csv_header(path: Path) -> list[str]:
    try:
        with path.open("rb") as f:  # the header line only: a bad byte further down costs its row
            first = f.readline(1 << 20)
        text = first.decode("utf-8-sig")  # a byte-order mark is not part of the first name
        header = next(csv.reader([text.rstrip("\r\n")]), None)
    except UnicodeDecodeError as exc:
        raise UsageSourceError(path, f"not UTF-8 text (byte {exc.object[exc.start:exc.start + 1]!r} at offset {exc.start})") from None
    except (OSError, csv.Error) as exc:
        raise UsageSourceError(path, f"cannot be read: {exc}") from None
    if not header:
        raise UsageSourceError(path, "empty file (a CSV needs a header row)")
    return header


def _not_text(path: Path) -> None:
    """Raise "not UTF-8 text" when the file's first 64 KiB are not UTF-8."""
    with path.open("rb") as f:
        head = f.read(1 << 16)
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as exc:
        if exc.start < len(head) - 4:  # not just a character cut at the block's end
            raise UsageSourceError(path, f"not UTF-8 text (byte {exc.object[exc.start:exc.start + 1]!r} at offset {exc.start})") from None


def _csv(path: Path, columns: Sequence[str] | None, stats: ReadStats | None) -> FileRows:
    import numpy as np
    import pyarrow as pa
    import pyarrow.csv as pacsv

    header = _csv_header(path)
    present = [c for c in header if columns is None or c in columns or c.startswith("label:")]
    try:
        require_usage_columns(path, present)
    except UsageSourceError:
        _not_text(path)  # bytes that are no text at all say so, rather than "missing columns"
        raise
    _unique_names(path, header)
    # Cells as bytes: the rule book decodes them, so one bad byte costs one row.
    opts = pacsv.ConvertOptions(column_types={c: pa.binary() for c in header}, include_columns=present, strings_can_be_null=True, null_values=[""], quoted_strings_can_be_null=True)
    read = pacsv.ReadOptions(column_names=header, skip_rows=1, use_threads=False, block_size=1 << 24)
    skipped: list[tuple[int, str]] = []

    def bad_line(row: Any) -> str:
        skipped.append((row.number - 1, f"line {row.number}: expected {row.expected_columns} fields, saw {row.actual_columns}; the line was not read"))
        return "skip"

    try:
        table = pacsv.read_csv(path, read_options=read, parse_options=pacsv.ParseOptions(invalid_row_handler=bad_line), convert_options=opts)
    except (pa.ArrowException, OSError) as exc:
        raise UsageSourceError(path, f"not a readable CSV file: {_first_line(exc)}") from None
    numbers = np.arange(1, table.num_rows + len(skipped) + 1, dtype=np.int64)
    rows = np.setdiff1d(numbers, np.asarray([r for r, _ in skipped], np.int64)) if skipped else numbers
    if stats is not None:
        stats.files_read.append(str(path))
        stats.rows_read += table.num_rows
    return FileRows(path, table, rows, skipped)
