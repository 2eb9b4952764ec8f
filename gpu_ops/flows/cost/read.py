"""Reading usage files as Arrow for the engine: nothing is parsed or judged here.

A Parquet file is read with its own column types (only the row groups that can touch a
window, see :mod:`gpu_ops.flows.cost.window`); a CSV file as BINARY cells (the rule book
decodes them as UTF-8, quarantining a bad value on its own row) with its line-level
problems (a line with the wrong number of fields). What stops a whole file (no such
file, not Parquet, a missing or duplicated column name, an empty CSV) is one
:class:`UsageSourceError` naming the file; the engine turns it into
a file-level quarantine row.
"""

from __future__ import annotations

import csv
import os
import sys
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from gpu_ops.flows.cost import window as win
from gpu_ops.domain.cost.columns import parquet_columns
from gpu_ops.flows.cost.window import ReadStats, Window
from gpu_ops.errors import UsageSourceError
from gpu_ops.domain.formatting import not_utf8

if TYPE_CHECKING:
    from gpu_ops.flows.cost.footers import FooterCache


USAGE_COLUMNS = (
    "start", "end", "namespace", "pod", "node", "team", "project", "cost_center", "experiment_id",
    "gpu_type", "gpu_count", "capacity_type", "sharing", "gpu_share",
)
USAGE_REQUIRED = ("start", "end", "team", "gpu_type", "gpu_count", "capacity_type")
INVENTORY_REQUIRED = ("node", "capacity_type", "start")
INVENTORY_COLUMNS = ("node", "instance_type", "gpu_type", "gpu_count", "capacity_type", "region", "start", "end")
USAGE, INVENTORY = "usage", "inventory"  # the two formats a file is read as
_FORMATS = {USAGE: (USAGE_REQUIRED, USAGE_COLUMNS), INVENTORY: (INVENTORY_REQUIRED, INVENTORY_COLUMNS)}


def distinct_files(
    patterns: Iterable[str], base_dir: Path | None, window: Window | None = None, lookback_days: Mapping[str, int] | None = None, stats: ReadStats | None = None,
) -> Iterator[tuple[Path | None, UsageSourceError | None]]:
    """Each file the patterns match, once (by real path); a pattern matching nothing is an
    error. With a ``window``, only files of days that can hold its rows (see
    :func:`gpu_ops.flows.cost.window.list_files`; ``lookback_days`` per pattern)."""
    seen: set[str] = set()
    for pattern in patterns:
        try:
            paths = win.list_files(pattern, base_dir, window, (lookback_days or {}).get(pattern, win.DEFAULT_LOOKBACK_DAYS), stats)
        except UsageSourceError as exc:
            yield None, exc
            continue
        for path in paths:
            real = os.path.realpath(path)
            if real not in seen:
                seen.add(real)
                yield path, None


def require_usage_columns(path: Path, names: Iterable[str]) -> None:
    require_columns(path, names, USAGE)


def require_columns(path: Path, names: Iterable[str], kind: str = USAGE) -> None:
    """A file-level error naming the missing columns of the ``kind`` format (usage or inventory)."""
    required, layout = _FORMATS[kind]
    raise_missing(path, names, required, kind, layout)


def raise_missing(path: Path, names: Iterable[str], required: Sequence[str], kind: str, layout: Sequence[str]) -> None:
    present = set(names)
    missing = [c for c in required if c not in present]
    if missing:
        raise UsageSourceError(path, f"missing column(s) {', '.join(missing)} (the {kind} format is: {', '.join(layout)})")


@dataclass
class FileRows:
    """One file's rows as Arrow, with 1-based row numbers and CSV lines not read; or a
    Parquet file the engine scans itself (``scan``: ``table`` and ``rows`` are None until
    :meth:`load`)."""

    path: Path
    table: Any
    rows: Any
    bad_lines: list[tuple[int, str]] = field(default_factory=list)
    scan: ParquetScan | None = None

    def load(self, columns: Sequence[str] | None = None) -> tuple[Any, Any]:
        """(the rows as Arrow, their 1-based row numbers in the file), read now for a scan;
        ``columns``: only those (of the file's columns read)."""
        if self.scan is None:
            return self.table if columns is None else self.table.select(list(columns)), self.rows
        import numpy as np
        import pyarrow.parquet as pq

        groups, firsts = self.scan.groups, self.scan.firsts
        try:
            table = pq.ParquetFile(self.path).read_row_groups(groups, columns=list(self.scan.schema.names if columns is None else columns))
        except Exception as exc:  # a corrupt page, a truncated file
            raise _unreadable_parquet(self.path, exc) from None
        rows = np.concatenate([np.arange(firsts[i] + 1, firsts[i + 1] + 1, dtype=np.int64) for i in groups])
        return table, rows

    def narrowed(self, columns: Sequence[str]) -> "FileRows":
        """The same rows with only ``columns`` of those read (a scan reads no others)."""
        if self.scan is None:
            return replace(self, table=self.table.select([c for c in self.table.column_names if c in columns]))
        import pyarrow as pa

        schema = pa.schema([f for f in self.scan.schema if f.name in columns])
        return replace(self, scan=replace(self.scan, schema=schema, times={c: t for c, t in self.scan.times.items() if c in columns}))


@dataclass(frozen=True)
class ParquetScan:
    """A Parquet file whose columns DuckDB reads as the Arrow reader would (see
    :func:`scannable`): its ``schema`` (the columns read), the row ``groups`` that can
    touch the window and the first row of each group (``firsts``, plus the row count)."""

    schema: Any
    groups: list[int]
    firsts: list[int]
    times: dict[str, tuple[int, int] | None] = field(default_factory=dict)  # time column -> (min, max) stored integer

    def ranges(self) -> list[tuple[int, int]]:
        """0-based [first, last] file rows of the groups read, runs of groups merged."""
        out: list[tuple[int, int]] = []
        for i in self.groups:
            lo, hi = self.firsts[i], self.firsts[i + 1] - 1
            if out and out[-1][1] + 1 == lo:
                out[-1] = (out[-1][0], hi)
            elif hi >= lo:
                out.append((lo, hi))
        return out

    def text_batches(self, path: Path, columns: Sequence[str]) -> Iterator[Any]:
        """The ``columns`` of the groups read, one group at a time, in order (dictionary-typed
        columns as dictionaries). The next groups are read meanwhile, on
        :data:`_TEXT_READERS` threads, each with its own reader: at most one group more
        than that is held."""
        import threading
        from collections import deque
        from concurrent.futures import ThreadPoolExecutor

        import pyarrow as pa
        import pyarrow.parquet as pq

        dictionaries = [c for c in columns if pa.types.is_dictionary(self.schema.field(c).type)]
        local = threading.local()

        def read(i: int) -> Any:
            if not hasattr(local, "file"):
                local.file = pq.ParquetFile(path, read_dictionary=dictionaries)
            return local.file.read_row_group(i, columns=list(columns))

        if len(self.groups) < 2:  # nothing to read meanwhile: on this thread (its allocator's memory is handed back)
            yield from (read(i) for i in self.groups)
            return
        memory = pa.default_memory_pool()
        with ThreadPoolExecutor(_TEXT_READERS, thread_name_prefix="gpu_ops-text") as pool:
            pending: deque[Any] = deque()
            for i in self.groups:
                pending.append(pool.submit(read, i))
                if len(pending) > _TEXT_READERS:
                    memory.release_unused()  # the groups already checked: back to the system, not kept by the allocator
                    yield pending.popleft().result()
            while pending:
                memory.release_unused()
                yield pending.popleft().result()


# Row groups whose text columns are read at once, on threads, while the text check runs.
_TEXT_READERS = 2

# A time whose stored integer DuckDB reads as infinity (or near it) is read by Arrow.
_SCAN_TIME_LIMIT = 2**62


def scannable(pf: Any, columns: Sequence[str], groups: Sequence[int]) -> dict[str, tuple[int, int] | None] | None:
    """Whether DuckDB reads ``columns`` of row ``groups`` of Parquet file ``pf`` as the
    Arrow reader does: text, integers, floats and INT64 times in µs or ns whose footer
    statistics are well inside what DuckDB holds (no sentinel read as infinity), and
    names that stay distinct without case. If so, the smallest and largest value of each
    time column (None: every value missing); None when the file is read as Arrow."""
    import pyarrow as pa

    schema, md = pf.schema_arrow, pf.metadata
    if len({n.lower() for n in schema.names}) < len(schema.names) or "file_row_number" in schema.names:
        return None
    leaves = {md.schema.column(j).path: j for j in range(md.num_columns)}
    times: dict[str, tuple[int, int] | None] = {}
    for name in columns:
        t = schema.field(name).type
        t = t.value_type if pa.types.is_dictionary(t) else t
        if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_integer(t) or pa.types.is_float32(t) or pa.types.is_float64(t):
            continue
        if not (pa.types.is_timestamp(t) and t.unit in ("us", "ns") and name in leaves):
            return None
        span = _time_span(md, leaves[name], groups)
        if span is False:
            return None
        times[name] = span
    return times


def _time_span(md: Any, j: int, groups: Sequence[int]) -> tuple[int, int] | None | Literal[False]:
    """(min, max) of INT64 column ``j`` over row ``groups`` from their statistics, None when
    every value is missing; False without statistics or past ±2**62."""
    lo = hi = None
    for i in groups:
        col = md.row_group(i).column(j)
        st = col.statistics
        if col.physical_type != "INT64" or st is None or not st.has_null_count or not st.has_min_max and st.null_count != col.num_values:
            return False
        if st.has_min_max:
            if not -_SCAN_TIME_LIMIT < st.min_raw <= st.max_raw < _SCAN_TIME_LIMIT:
                return False
            lo, hi = min(st.min_raw, lo if lo is not None else st.min_raw), max(st.max_raw, hi if hi is not None else st.max_raw)
    return None if lo is None or hi is None else (lo, hi)


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _unique_names(path: Path, names: Sequence[str]) -> None:
    twice = sorted(n for n, k in Counter(names).items() if k > 1)
    if twice:
        raise UsageSourceError(path, f"duplicate column name(s) {', '.join(repr(n) for n in twice)}: each column must appear once")


def _is_parquet(path: Path) -> bool:
    """Whether ``path`` is read as Parquet (else as CSV); any other extension: a file-level error."""
    suffix = path.suffix.lower()
    if suffix not in (".parquet", ".pq", ".csv"):
        raise UsageSourceError(path, f"unsupported extension {suffix!r} (use .csv or .parquet)")
    return suffix != ".csv"


def _unreadable_parquet(path: Path, exc: BaseException) -> UsageSourceError:
    return UsageSourceError(path, f"not a readable Parquet file: {first_line(exc)}")


def _unreadable_csv(path: Path, exc: BaseException) -> UsageSourceError:
    return UsageSourceError(path, f"not a readable CSV file: {first_line(exc)}")


def read_file(
    path: Path, columns: Sequence[str] | None = None, window: Window | None = None, stats: ReadStats | None = None, footers: FooterCache | None = None, kind: str = USAGE,
) -> FileRows:
    if _is_parquet(path):
        return _parquet(path, columns, window, stats, footers, kind)
    return _csv(path, columns, stats, kind)


def column_names(path: Path) -> list[str]:
    """A file's column names as the read sees them: its CSV header line or its Parquet
    footer, each name once (a file-level error otherwise, with the read's own reason)."""
    if _is_parquet(path):
        import pyarrow.parquet as pq

        try:
            names = list(pq.read_schema(path).names)
        except Exception as exc:  # any reader error names the file
            raise _unreadable_parquet(path, exc) from None
    else:
        names = _csv_header(path)[0]
    _unique_names(path, names)
    return names


def probe_files(patterns: Sequence[str], base_dir: Path | None, kind: str = USAGE, limit: int = 200) -> tuple[int, list[str]]:
    """A cheap look at what a read would find (`gpu-ops validate`): each pattern matches a
    file, each file (up to ``limit``) has the ``kind`` format's columns, judged by
    :func:`column_names` as the read judges them. Only headers and Parquet footers are
    read. -> (files seen, problems as "location: reason")."""
    problems, seen = [], 0
    for path, problem in distinct_files(patterns, base_dir):
        if problem is not None:
            problems.append(str(problem))
            continue
        seen += 1
        if seen > limit:
            continue
        assert path is not None
        try:
            require_columns(path, column_names(path), kind)
        except UsageSourceError as exc:
            problems.append(str(exc))
    return seen, problems


@dataclass
class Read:
    """What the files of some patterns hold, as the engine takes it: each file's rows, and
    the patterns or files that gave nothing (location, reason)."""

    files: list[FileRows] = field(default_factory=list)
    problems: list[tuple[str, str]] = field(default_factory=list)


def read_files(
    patterns: Sequence[str], base_dir: Path | None, columns: Sequence[str] | None = None, window: Window | None = None, stats: ReadStats | None = None,
    footers: FooterCache | None = None, lookback_days: Mapping[str, int] | None = None, kind: str = USAGE,
) -> Read:
    """Each file the patterns match, once, as Arrow (what cannot be read: a problem). With
    a ``window`` only what can touch it (see :mod:`gpu_ops.flows.cost.window`); ``footers``
    remembers Parquet footers so that a later read rules a file out unopened."""
    out = Read()
    files = list(distinct_files(patterns, base_dir, window, lookback_days, stats))
    if footers is not None:
        footers.load(p for p, _ in files if p is not None and p.suffix.lower() in (".parquet", ".pq"))
    for path, problem in files:
        try:
            if problem is not None:
                raise problem
            assert path is not None
            if not _ruled_out(path, columns, window, stats, footers, kind):
                out.files.append(read_file(path, columns, window, stats, footers, kind))
        except UsageSourceError as exc:
            out.problems.append((exc.location, exc.reason))
    if footers is not None:
        footers.save()
        if footers.problem and stats is not None:
            stats.footer_cache_problem = footers.problem
    return out


def _ruled_out(path: Path, columns: Sequence[str] | None, window: Window | None, stats: ReadStats | None, footers: FooterCache | None, kind: str) -> bool:
    """Whether the cached footer of ``path`` says nothing in it can touch ``window`` (its
    columns are still checked: a file missing one is an error every day)."""
    if footers is None or window is None:
        return False
    cached = win.ruled_out(path, window, footers, stats)
    if cached is None:
        return False
    require_columns(path, parquet_columns(cached, columns), kind)
    return True


def empty_table(schema: Any) -> Any:
    """An Arrow table of ``schema`` with no rows (``schema.empty_table`` would import pandas)."""
    import pyarrow as pa

    return pa.Table.from_arrays([pa.nulls(0, f.type) for f in schema], schema=schema)


def _parquet(path: Path, columns: Sequence[str] | None, window: Window | None, stats: ReadStats | None, footers: FooterCache | None, kind: str = USAGE) -> FileRows:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
        schema = pf.schema_arrow
    except Exception as exc:  # any reader error names the file
        raise _unreadable_parquet(path, exc) from None
    if footers is not None and window is not None:  # remembered even when its columns are wrong
        footers.remember(path, win.FooterSummary.of(schema, pf.metadata))
    _unique_names(path, schema.names)
    present = parquet_columns(schema.names, columns)
    try:
        require_columns(path, present, kind)
    except UsageSourceError:
        if stats is not None and window is not None:  # counted as a read of its footer counts them
            stats.row_groups_total += pf.metadata.num_row_groups
        raise
    md = pf.metadata
    groups = list(range(md.num_row_groups)) if window is None else win.row_groups(pf, path, window, stats or win.ReadStats(), footers)
    firsts = [0]
    for i in range(md.num_row_groups):
        firsts.append(firsts[-1] + md.row_group(i).num_rows)
    schema = pa.schema([schema.field(c) for c in present])
    if not groups:
        return FileRows(path, empty_table(schema), [])
    times = scannable(pf, present, groups) if kind == USAGE and not any(c in str(path) for c in "*?[{") else None
    rows = FileRows(path, None, None, scan=ParquetScan(schema, groups, firsts, times or {}))
    if times is not None:
        return rows
    table, numbers = rows.load()
    return FileRows(path, table, numbers)


def _csv_header(path: Path) -> tuple[list[str], bool]:
    """The header's names, and whether any byte follows the header line."""
    try:
        with path.open("rb") as f:  # the header line only: a bad byte further down costs its row
            header = header_names(f)
            more = bool(f.read(1))
    except UnicodeDecodeError as exc:
        raise UsageSourceError(path, not_utf8(exc)) from None
    except (OSError, csv.Error) as exc:
        raise UsageSourceError(path, f"cannot be read: {exc}") from None
    if not header:
        raise UsageSourceError(path, "empty file (a CSV needs a header row)")
    return header, more


def header_names(f: Any) -> list[str] | None:
    """The names on the CSV header line of the binary file ``f`` (its first MiB at most; a
    byte-order mark is not part of the first name); None when the file is empty. Raises
    UnicodeDecodeError and csv.Error for the caller to name the file."""
    text = f.readline(1 << 20).decode("utf-8-sig")
    return next(csv.reader([text.rstrip("\r\n")]), None)


def _not_text(path: Path) -> None:
    """Raise "not UTF-8 text" when the file's first 64 KiB are not UTF-8."""
    with path.open("rb") as f:
        head = f.read(1 << 16)
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as exc:
        if exc.start < len(head) - 4:  # not just a character cut at the block's end
            raise UsageSourceError(path, not_utf8(exc)) from None


def ragged_line(row: int, expected: int, saw: int) -> tuple[int, str]:
    """A line with the wrong number of fields, as the quarantine names it (``row``: its data row)."""
    return row, f"line {row + 1}: expected {expected} fields, saw {saw}; the line was not read"


def _csv_table(path: Path, header: list[str], present: list[str], skipped: list[tuple[int, str]]) -> Any:
    """The CSV's rows (columns ``present``, cells as bytes: the rule book decodes them, so
    one bad byte costs one row); each line with the wrong number of fields appended to
    ``skipped`` and left out. Arrow's reader cannot hand such a line over when its bytes
    are not UTF-8 (its handler fails and the read with it): the file is then read again
    without those lines (:func:`write_without_ragged_lines`)."""
    import io

    import pyarrow as pa
    import pyarrow.csv as pacsv

    opts = pacsv.ConvertOptions(column_types={c: pa.binary() for c in header}, include_columns=present, strings_can_be_null=True, null_values=[""], quoted_strings_can_be_null=True)
    read = pacsv.ReadOptions(column_names=header, skip_rows=1, use_threads=False, block_size=1 << 24)

    def bad_line(row: Any) -> str:
        skipped.append(ragged_line(row.number - 1, row.expected_columns, row.actual_columns))
        return "skip"

    with handler_failures(bad_line) as failed:
        try:
            return pacsv.read_csv(path, read_options=read, parse_options=pacsv.ParseOptions(invalid_row_handler=bad_line), convert_options=opts)
        except (pa.ArrowException, OSError) as exc:
            if not failed:
                raise _unreadable_csv(path, exc) from None
    skipped.clear()
    out = io.StringIO()
    with path.open(encoding="utf-8", errors="surrogateescape", newline="") as src:
        try:
            write_without_ragged_lines(src, len(header), skipped, out)
        except csv.Error as exc:
            raise _unreadable_csv(path, exc) from None
    try:
        return pacsv.read_csv(io.BytesIO(out.getvalue().encode("utf-8", "surrogateescape")), read_options=read, convert_options=opts)
    except pa.ArrowException as exc:
        raise _unreadable_csv(path, exc) from None


@contextmanager
def handler_failures(handler: Any) -> Iterator[list[BaseException]]:
    """The exceptions raised where Arrow calls ``handler`` (it reports them as unraisable,
    printing a traceback, and fails the read): collected instead of printed."""
    failed: list[BaseException] = []
    previous = sys.unraisablehook

    def hook(unraisable: Any) -> None:
        if unraisable.object is handler:
            failed.append(unraisable.exc_value)
        else:
            previous(unraisable)

    sys.unraisablehook = hook
    try:
        yield failed
    finally:
        sys.unraisablehook = previous


def write_without_ragged_lines(src: Any, fields: int, skipped: list[tuple[int, str]], out: Any) -> None:
    """A CSV's text (``src``, read with errors="surrogateescape") written to ``out`` with each
    record of the wrong number of fields left out (appended to ``skipped``), the others
    written again field by field; bytes that are not UTF-8 stay as they are (for the rule
    book). Records are numbered as Arrow numbers them (blank lines not counted). For a file
    whose ragged line Arrow's reader could not hand over (:func:`handler_failures`);
    ``csv.Error`` for text the csv module cannot split."""
    writer = csv.writer(out, lineterminator="\n")
    records = (r for r in csv.reader(src) if r)
    writer.writerow(next(records, []))  # the header
    for row, record in enumerate(records, start=1):
        if len(record) == fields:
            writer.writerow(record)
        else:
            skipped.append(ragged_line(row, fields, len(record)))


def _csv(path: Path, columns: Sequence[str] | None, stats: ReadStats | None, kind: str = USAGE) -> FileRows:
    import numpy as np
    import pyarrow as pa

    header, more = _csv_header(path)
    present = [c for c in header if columns is None or c in columns or c.startswith("label:")]
    try:
        require_columns(path, present, kind)
    except UsageSourceError:
        _not_text(path)  # bytes that are no text at all say so, rather than "missing columns"
        raise
    _unique_names(path, header)
    skipped: list[tuple[int, str]] = []
    if more:
        table = _csv_table(path, header, present, skipped)
    else:  # the header alone, without a line end: Arrow's reader would find no row to skip
        table = pa.table({c: pa.array([], pa.binary()) for c in present})
    numbers = np.arange(1, table.num_rows + len(skipped) + 1, dtype=np.int64)
    rows = np.setdiff1d(numbers, np.asarray([r for r, _ in skipped], np.int64)) if skipped else numbers
    if stats is not None:
        stats.files_read.append(str(path))
        stats.rows_read += table.num_rows
    return FileRows(path, table, rows, skipped)
