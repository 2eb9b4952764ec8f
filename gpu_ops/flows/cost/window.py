"""Reads bounded by a time window: a daily partition reads what can touch its day (Parquet
footers and row groups, ``{date}`` layouts, CSV, tables); :class:`ReadStats` records what
was read.

Design: docs/concepts/cost-sources.md#reads-bounded-by-a-window
"""

from __future__ import annotations

import datetime as dt
import fnmatch
import glob as globmod
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from gpu_ops.errors import UsageSourceError
from gpu_ops.domain.paths import NOT_REGULAR, PathNotUsable, path_kind

DATE_PLACEHOLDER = "{date}"
DEFAULT_LOOKBACK_DAYS = 1
_HIVE_DAY = re.compile(r"^(?:day|date|dt)=(\d{4}-\d{2}-\d{2})$")
_DAY = dt.timedelta(days=1)
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


@dataclass(frozen=True)
class Window:
    """``[start, end)`` in UTC; ``first``/``last`` are the UTC days it covers. The bounds
    are pandas Timestamps (:meth:`of_days`) or aware datetimes (:meth:`of_utc_days`,
    what the CLI uses without loading pandas)."""

    start: Any
    end: Any

    @classmethod
    def of_days(cls, first: dt.date, last: dt.date | None = None) -> "Window":
        import pandas as pd

        last = last or first
        return cls(pd.Timestamp(first.isoformat(), tz="UTC"), pd.Timestamp((last + _DAY).isoformat(), tz="UTC"))

    @classmethod
    def of_utc_days(cls, first: dt.date, last: dt.date | None = None) -> "Window":
        last = last or first
        utc = dt.timezone.utc
        return cls(dt.datetime(first.year, first.month, first.day, tzinfo=utc), dt.datetime(last.year, last.month, last.day, tzinfo=utc) + _DAY)

    @property
    def start_ns(self) -> int:
        return epoch_ns(self.start)

    @property
    def end_ns(self) -> int:
        return epoch_ns(self.end)

    @property
    def first(self) -> dt.date:
        return self.start.date()

    @property
    def last(self) -> dt.date:
        return (self.end - dt.timedelta(microseconds=1)).date()

    def days(self) -> list[dt.date]:
        return [self.first + i * _DAY for i in range((self.last - self.first).days + 1)]

    def file_days(self, lookback_days: int) -> tuple[dt.date, dt.date]:
        """The days whose files can hold rows of this window (interval start days)."""
        return self.first - lookback_days * _DAY, self.last


def epoch_ns(t: Any) -> int:
    """UTC nanoseconds of a pandas Timestamp or an aware ``datetime``."""
    if hasattr(t, "value"):  # pandas: exact to the nanosecond
        return int(t.value)
    delta = t - dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
    return (delta.days * 86_400 + delta.seconds) * 10**9 + delta.microseconds * 1000


@dataclass
class ReadStats:
    """What a bounded read listed, opened and read; reported as ``gpu_usage`` metadata."""

    files_read: list[str] = field(default_factory=list)  # data read (all or some row groups)
    files_footer_only: list[str] = field(default_factory=list)  # footer read, no row group can touch the window
    files_skipped_by_summary: list[str] = field(default_factory=list)  # cached footer summary rules it out: stat'ed, never opened
    files_skipped_by_date: int = 0  # hive day folders outside the window: never opened
    days_without_files: list[str] = field(default_factory=list)  # `{date}` days with no file
    # `{date}` files of days before lookback_days whose footer says they reach the window: read too.
    files_beyond_lookback: list[str] = field(default_factory=list)
    row_groups_total: int = 0
    row_groups_read: int = 0
    rows_read: int = 0  # rows decoded from files
    rows_kept: int = 0  # of those, rows that can touch the window
    table_rows: dict[str, int] = field(default_factory=dict)  # rows a range query returned, per table
    footer_cache_problem: str | None = None  # footer summaries could not be stored (figures unaffected)

    def metadata(self) -> dict[str, Any]:
        return {
            "files_read": len(self.files_read),
            "files_footer_only": len(self.files_footer_only),
            "files_skipped_by_summary": len(self.files_skipped_by_summary),
            "files_skipped_by_date": self.files_skipped_by_date,
            "row_groups_read": f"{self.row_groups_read} of {self.row_groups_total}",
            "file_rows_read": self.rows_read,
            "file_rows_kept": self.rows_kept,
            **{f"{t}_rows_read": n for t, n in sorted(self.table_rows.items())},
            **({"days_without_files": ", ".join(self.days_without_files)} if self.days_without_files else {}),
            **({"footer_cache_problem": self.footer_cache_problem} if self.footer_cache_problem else {}),
            **({"lookback_warning": self.lookback_warning()} if self.files_beyond_lookback else {}),
        }

    def lookback_warning(self) -> str:
        """What a read of files older than ``lookback_days`` says (CLI: stderr; asset: metadata)."""
        names = ", ".join(self.files_beyond_lookback[:5]) + (" …" if len(self.files_beyond_lookback) > 5 else "")
        return (
            f"{len(self.files_beyond_lookback)} file(s) older than lookback_days hold intervals that reach this window and were read "
            f"(their footers say so): {names}; raise the source's lookback_days so that they are listed directly"
        )


# --------------------------------------------------------------------------- listing


def expand_pattern(pattern: str, base_dir: Path | None, missing_ok: bool = False) -> list[Path]:
    """The files a source path names: a glob, a folder (its CSV and Parquet files) or a
    file; matching nothing is an error, or no files with ``missing_ok``."""
    p = Path(pattern).expanduser()
    if not p.is_absolute() and base_dir is not None:
        p = base_dir / p
    if any(c in str(p) for c in "*?["):
        return _globbed(p, pattern, missing_ok)
    try:
        kind = path_kind(p)
    except PathNotUsable as exc:
        raise UsageSourceError(p, str(exc)) from None
    if kind == "dir":
        paths = sorted([*p.glob("*.csv"), *p.glob("*.parquet")])
        if not paths and not missing_ok:
            raise UsageSourceError(p, "no .csv or .parquet file in this folder")
        return _regular(paths)
    if kind == "missing":
        if missing_ok:
            return []
        raise UsageSourceError(p, "no such file")
    if kind == "special":
        raise UsageSourceError(p, NOT_REGULAR)
    return [p]


def _globbed(p: Path, pattern: str, missing_ok: bool) -> list[Path]:
    paths = sorted(Path(x) for x in globmod.glob(str(p), recursive=True))
    if not paths and not missing_ok:
        raise UsageSourceError(p, f"no file matches {pattern!r}")
    return _regular(paths)


def _regular(paths: list[Path]) -> list[Path]:
    """``paths``, each a regular file or a folder (a glob may match one), or the error naming the first that is not."""
    for path in paths:
        if path_kind(path) == "special":
            raise UsageSourceError(path, NOT_REGULAR)
    return paths


def list_files(pattern: str, base_dir: Path | None, window: Window | None, lookback_days: int, stats: ReadStats | None = None) -> list[Path]:
    """The files of ``pattern`` that can hold rows of ``window`` (all of them without one).

    ``{date}`` is replaced by each day of :meth:`Window.file_days`; without a window it
    matches every day (a glob ``*``). Hive day folders outside those days are dropped.
    """
    if DATE_PLACEHOLDER not in pattern:
        paths = expand_pattern(pattern, base_dir)
    elif window is None:
        paths = expand_pattern(pattern.replace(DATE_PLACEHOLDER, "*"), base_dir)
    else:
        lo, hi = window.file_days(lookback_days)
        paths = _older_reaching(pattern, base_dir, window, lo, stats)
        for i in range((hi - lo).days + 1):
            day = (lo + i * _DAY).isoformat()
            found = expand_pattern(pattern.replace(DATE_PLACEHOLDER, day), base_dir, missing_ok=True)
            if not found and stats is not None:
                stats.days_without_files.append(day)
            paths.extend(found)
        return paths
    if window is None:
        return paths
    lo, hi = window.file_days(lookback_days)
    kept = [p for p in paths if _in_days(hive_day(p), lo, hi)]
    if stats is not None:
        stats.files_skipped_by_date += len(paths) - len(kept)
    return kept


_ISO_DAY = re.compile(r"\d{4}-\d{2}-\d{2}")


def _older_reaching(pattern: str, base_dir: Path | None, window: Window, lo: dt.date, stats: ReadStats | None) -> list[Path]:
    """Parquet files of ``{date}`` days before ``lo`` (the lookback) whose footer says
    some interval reaches ``window``: an interval longer than ``lookback_days`` is read
    (and reported) rather than silently priced at $0. Footers only; CSV files of those
    days cannot be judged without reading them and follow ``lookback_days``."""
    out = []
    for path in expand_pattern(pattern.replace(DATE_PLACEHOLDER, "*"), base_dir, missing_ok=True):
        if path.suffix.lower() not in (".parquet", ".pq"):
            continue
        text = str(path)
        days = [m.group(0) for m in _ISO_DAY.finditer(text) if fnmatch.fnmatch(text, str(_rooted(pattern.replace(DATE_PLACEHOLDER, m.group(0)), base_dir)))]
        try:
            day = dt.date.fromisoformat(days[0]) if days else None
        except ValueError:
            day = None
        if day is None or day >= lo:
            continue
        if _footer_reaches(path, window):
            out.append(path)
            if stats is not None:
                stats.files_beyond_lookback.append(str(path))
    return out


def _rooted(pattern: str, base_dir: Path | None) -> Path:
    p = Path(pattern).expanduser()
    return base_dir / p if not p.is_absolute() and base_dir is not None else p


def _footer_reaches(path: Path, window: Window) -> bool:
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
        return FooterSummary.of(pf.schema_arrow, pf.metadata).may_touch(window)
    except Exception:  # an unreadable file of an old day: the read of its own day reports it
        return False


def hive_day(path: Path) -> dt.date | None:
    """The day a ``day=YYYY-MM-DD`` folder (or ``date=``, ``dt=``) in ``path`` names."""
    for part in reversed(path.parts[:-1]):
        m = _HIVE_DAY.match(part)
        if m:
            try:
                return dt.date.fromisoformat(m.group(1))
            except ValueError:
                return None
    return None


def _in_days(day: dt.date | None, lo: dt.date, hi: dt.date) -> bool:
    return day is None or lo <= day <= hi


# --------------------------------------------------------------------------- Parquet


class FooterStore(Protocol):
    """Where footer summaries are kept between days (:class:`gpu_ops.flows.cost.footers.FooterCache`)."""

    def summary(self, path: Path) -> FooterSummary | None: ...

    def remember(self, path: Path, summary: FooterSummary) -> None: ...


def ruled_out(path: Path, window: Window, footers: FooterStore, stats: ReadStats | None) -> tuple[str, ...] | None:
    """The column names of Parquet file ``path`` when its cached :class:`FooterSummary`
    shows no row can touch ``window`` (counted in ``files_skipped_by_summary``: the file
    is stat'ed, never opened); None when it must be read."""
    cached = footers.summary(path)
    if cached is None or cached.may_touch(window):
        return None
    if stats is not None:
        stats.files_skipped_by_summary.append(str(path))
        stats.row_groups_total += cached.row_groups
    return cached.columns


def row_groups(pf: Any, path: Path, window: Window, stats: ReadStats, footers: FooterStore | None = None) -> list[int]:
    """The row groups of Parquet file ``pf`` (at ``path``) that can touch ``window``, from
    its footer (whose summary is remembered in ``footers``). A file with none is counted
    as footer-only: its columns are still checked, no row is read."""
    schema, md = pf.schema_arrow, pf.metadata
    if footers is not None:
        footers.remember(path, FooterSummary.of(schema, md))
    bounds = _TimeStats(schema, md)
    keep = [i for i in range(md.num_row_groups) if bounds.may_touch(i, window)]
    stats.row_groups_total += md.num_row_groups
    stats.row_groups_read += len(keep)
    (stats.files_read if keep else stats.files_footer_only).append(str(path))
    return keep


class _TimeStats:
    """``start``/``end`` statistics of a Parquet file's row groups, from its footer."""

    def __init__(self, schema: Any, md: Any):
        import pyarrow as pa

        self.md = md
        self.cols: dict[str, tuple[int, int]] = {}  # name -> (column index in row groups, ns per unit)
        leaves = [md.schema.column(j).path for j in range(md.num_columns)]
        for name in ("start", "end"):
            idx = schema.get_field_index(name)
            if idx >= 0 and pa.types.is_timestamp(schema.field(idx).type) and name in leaves:
                self.cols[name] = (leaves.index(name), {"s": 10**9, "ms": 10**6, "us": 10**3, "ns": 1}[schema.field(idx).type.unit])

    def may_touch(self, i: int, window: Window) -> bool:
        """False only when the statistics prove no row of row group ``i`` can touch ``window``.

        Every row starts (and, when closed, ends) at or after the smallest ``start``/``end``:
        a group whose smallest time is at or after the window's end is skipped even with
        running rows. A group that ends before the window's start is skipped only when it
        has no running rows (a missing ``end`` runs into every later day).
        """
        s, e = self.bounds(i, "start"), self.bounds(i, "end")
        if s is None or s[2] or s[0] is None:
            return True  # no usable statistics for start, or a missing start (touches every day)
        lo = min(s[0], e[0]) if e is not None and e[0] is not None else s[0]
        if lo >= window.end_ns:
            return False
        if e is None or e[2] or e[1] is None:
            return True  # running rows, or no statistics for end
        return max(s[1], e[1]) >= window.start_ns  # type: ignore[type-var, operator]

    def file_bounds(self) -> tuple[int | None, int | None, bool]:
        """(lo, hi, open intervals) of the whole file (see :class:`FooterSummary`)."""
        lows, highs, running = [], [], False
        for i in range(self.md.num_row_groups):
            s, e = self.bounds(i, "start"), self.bounds(i, "end")
            if s is None or s[2] or s[0] is None:
                return None, None, False
            lows.append(min(s[0], e[0]) if e is not None and e[0] is not None else s[0])
            running = running or (e is not None and e[2])
            closed = e is not None and not e[2] and e[1] is not None
            highs.append(max(s[1], e[1]) if closed else None)  # type: ignore[type-var, index]
        if not lows:
            return None, None, False
        return min(lows), None if None in highs else max(highs), running  # type: ignore[type-var]

    def bounds(self, i: int, name: str) -> tuple[int | None, int | None, bool] | None:
        """(min, max, has nulls) of column ``name`` in row group ``i`` in UTC nanoseconds
        (None when every value is null); None without a typed column or statistics."""
        if name not in self.cols:
            return None
        j, scale = self.cols[name]
        rg = self.md.row_group(i)
        col = rg.column(j)
        st = col.statistics
        if st is None or not st.has_null_count or col.physical_type != "INT64":
            return None
        nulls = st.null_count > 0
        if not st.has_min_max:
            return (None, None, nulls) if st.null_count == rg.num_rows else None
        return int(st.min_raw) * scale, int(st.max_raw) * scale, nulls


@dataclass(frozen=True)
class FooterSummary:
    """What a Parquet file's footer says, all a read needs to rule the file out without
    opening it: its column names, row group count and times in UTC nanoseconds. ``lo``
    is the smallest ``start``/``end``; ``hi`` the largest, None when some ``end`` is
    missing (still running) or has no statistics; ``lo`` is None when the statistics
    cannot bound the file (untyped times, a missing ``start``, no statistics, no row
    groups), which is then always read."""

    lo: int | None
    hi: int | None
    open_intervals: bool
    columns: tuple[str, ...]
    row_groups: int

    @classmethod
    def of(cls, schema: Any, md: Any) -> "FooterSummary":
        lo, hi, running = _TimeStats(schema, md).file_bounds()
        # A time past what int64 nanoseconds hold (year 9999 in seconds) bounds nothing storable: unbounded.
        lo, hi = (None if v is None or not _INT64_MIN <= v <= _INT64_MAX else v for v in (lo, hi))
        return cls(lo, hi, running, tuple(schema.names), md.num_row_groups)

    def may_touch(self, window: Window) -> bool:
        """False only when no row of the file can touch ``window``: the file-wide form of
        :meth:`_TimeStats.may_touch` (it may keep a file no single row group can touch;
        reading the footer then skips it)."""
        if self.lo is None:
            return True
        if self.lo >= window.end_ns:
            return False
        return self.hi is None or self.hi >= window.start_ns


# --------------------------------------------------------------------------- rows
