"""Usage intervals: reading the sources and validating rows against the usage format.

Every source (CSV/Parquet files, the training ledger table, the Kubernetes collector)
yields a *raw* frame in the DESIGN usage format plus three provenance columns
(``source``, ``location``, ``row``). :func:`validate_usage` turns it into typed,
priced rows and a quarantine frame; a bad row is never priced at zero or at a default.

Validation is vectorised (ten million rows in a few seconds): string columns are checked
once per distinct value through ``pd.factorize``, not once per row.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from gpu_ops.compute.catalog import CATALOG, UnknownGpuType, canonical_gpu_type
from gpu_ops.cost.pricing import CAPACITY_TYPES, SHARING_MODES, PriceMatrix
from gpu_ops.cost.read import (  # re-exported: the readers' names
    INVENTORY_COLUMNS,
    INVENTORY_REQUIRED,
    USAGE_COLUMNS,
    USAGE_REQUIRED,
    UsageSourceError,
    distinct_files,
    raise_missing,
    require_usage_columns,
)

if TYPE_CHECKING:
    from gpu_ops.cost.footers import FooterCache
    from gpu_ops.cost.window import ReadStats, Window

# Optional columns a source may carry (the ledger has all of them; a billing export may
# carry any): region prices through the region multiplier, the rest feeds ROI.
OPTIONAL_COLUMNS = ("region", "labels", "run_id", "asset_key", "attempt", "outcome", "last_checkpoint_at", "lost_seconds")
ATTRIBUTE_COLUMNS = ("namespace", "pod", "node", "team", "project", "cost_center", "experiment_id")
PROVENANCE_COLUMNS = ("source", "location", "row")
QUARANTINE_COLUMNS = ("source", "location", "row", "field", "reason", "record", "start", "end")
LEDGER_TABLE = "gpu_usage_ledger"
OUTCOMES = ("completed", "preempted", "oom", "infrastructure", "user_error")

NS_PER_HOUR = 3_600 * 10**9


# A file or pattern that yields no rows at all is one quarantine row: this field, no row
# number, and the reason. Readers carry it as a raw row with a FILE_ERROR column.
FILE_FIELD = "<file>"
FILE_ERROR = "file_error"
DUPLICATE_FIELD = "<row>"
LINE_FIELD = "<line>"  # a CSV line that could not be split into the header's fields
# List, struct or map cells of a Parquet file: the reader blanks them and records, per
# row, {field: what the cell held} here; validation quarantines those rows.
CELL_ERRORS = "cell_errors"
# More GPUs than this in one interval is a unit or export error, not a job.
MAX_GPUS_PER_ROW = 100_000


@dataclass
class Validated:
    rows: pd.DataFrame  # typed, canonical, priced
    quarantine: pd.DataFrame  # QUARANTINE_COLUMNS


# --------------------------------------------------------------------------- helpers


def const_column(n: int, value: Any) -> pd.Categorical:
    """A constant string column that costs one byte per row."""
    return pd.Categorical.from_codes(np.zeros(n, dtype=np.int8), categories=[value])


def _factorized(s: pd.Series) -> tuple[np.ndarray, pd.Index]:
    if isinstance(s.dtype, pd.CategoricalDtype):
        # Parquet dictionaries arrive as categoricals: their codes already are the factorization.
        return s.cat.codes.to_numpy(), pd.Index(s.cat.categories)
    codes, uniques = pd.factorize(s, use_na_sentinel=True)
    return codes, pd.Index(uniques)


def _map_distinct(s: pd.Series, fn: Callable[[Any], Any]) -> tuple[np.ndarray, list[Any]]:
    """Apply ``fn`` once per distinct value; returns (codes, results per code); NA code -1."""
    codes, uniques = _factorized(s)
    return codes, [fn(u) for u in uniques]


def _lut(values: list[Any], missing: Any, dtype: Any) -> np.ndarray:
    """Look-up table indexed by codes; code -1 (missing) hits the extra last entry."""
    return np.array([*values, missing], dtype=dtype)


def _blank(s: pd.Series) -> np.ndarray:
    codes, uniques = _factorized(s)
    return _lut([str(u).strip() == "" for u in uniques], True, bool)[codes]


_EDGE_SPACE = re.compile(r"(?:\A|\x00)\s|\s(?:\x00|\Z)")


def _stripped_text(cats: pd.Index) -> bool:
    """All categories are distinct ``str`` with nothing ``str.strip`` would remove.

    One regular-expression pass over the values joined by NUL, not a Python loop per value:
    a unique column such as ``pod`` has as many categories as rows. ``\\s`` in a ``str``
    pattern is exactly ``str.isspace``, what ``strip()`` removes; a NUL inside a value can
    only make this say no (then the caller takes its exact per-value path)."""
    values = cats.to_numpy(dtype=object)
    try:
        joined = "\x00".join(values)
    except TypeError:  # not all str
        return False
    return _EDGE_SPACE.search(joined) is None and cats.is_unique


def _as_text(s: pd.Series) -> pd.Series:
    """Missing -> "" and everything else stripped text; categorical in, categorical out."""
    if isinstance(s.dtype, pd.CategoricalDtype):
        if _stripped_text(s.cat.categories) and not (s.cat.codes.to_numpy() < 0).any():
            return s  # the common Parquet case: nothing to normalise, no pass over the rows
    if isinstance(s.dtype, pd.StringDtype) and s.dtype.storage == "pyarrow":
        # Arrow-backed text (a high-cardinality column read plainly): strip and factorize
        # in C rather than once per distinct value in Python.
        codes, uniques = pd.factorize(s.str.strip().fillna(""), use_na_sentinel=True)
        cats = pd.Index(uniques) if "" in uniques else pd.Index([*uniques, ""])  # "" always a category, as below
        return pd.Series(pd.Categorical.from_codes(codes, categories=cats), index=s.index)
    codes, uniques = _factorized(s)
    cats = [str(u).strip() for u in uniques]
    if "" not in cats:
        cats.append("")
    empty = cats.index("")
    # Distinct values may collapse after stripping ("a " and "a"): re-factorize the labels.
    labels, remap = np.unique(np.array(cats, dtype=object), return_inverse=True)
    lut = np.append(remap, remap[empty]).astype(np.int32)
    return pd.Series(pd.Categorical.from_codes(lut[codes], categories=list(labels)), index=s.index)


def parse_times(s: pd.Series) -> tuple[pd.Series, np.ndarray]:
    """Any time column -> UTC datetime64[ns]; returns (parsed, bad mask).

    Naive times are UTC (the format says so); offsets are converted. Missing stays NaT.
    Bad means unparseable or outside what datetime64[ns] holds (1677-09-21 to
    2262-04-11): a ``9999-12-31`` "still running" sentinel is reported, never wrapped
    round to a wrong day. :func:`time_problem` says which, for the rows that are bad.
    """
    if isinstance(s.dtype, pd.DatetimeTZDtype) or pd.api.types.is_datetime64_dtype(s.dtype):
        return _utc_ns(s)
    # Strings (CSV): parse each distinct value once, then index by code.
    blank = _blank(s)
    codes, uniques = _factorized(s)
    texts = pd.Series([u if isinstance(u, (pd.Timestamp, dt.date)) else str(u).strip() for u in uniques], dtype=object)
    parsed_u, _ = _utc_ns(pd.to_datetime(texts, utc=True, errors="coerce", format="ISO8601"))
    ints = _lut(list(parsed_u.array.asi8), _NAT, np.int64)[codes]
    return utc_series(ints, s.index), ~blank & (ints == _NAT)


_NAT = np.iinfo(np.int64).min
_UNIT_NS = {"s": 10**9, "ms": 10**6, "us": 10**3, "ns": 1}
TIME_RANGE = "1677-09-21 to 2262-04-11"


def _utc_ns(s: pd.Series) -> tuple[pd.Series, np.ndarray]:
    """A datetime column of any unit -> UTC nanoseconds; values it cannot hold -> NaT, flagged."""
    if not isinstance(s.dtype, pd.DatetimeTZDtype):
        s = s.dt.tz_localize("UTC")
    elif str(s.dtype.tz) != "UTC":
        s = s.dt.tz_convert("UTC")
    unit = np.datetime_data(s.dtype.base)[0]
    if unit == "ns":
        return (s if str(s.dtype) == "datetime64[ns, UTC]" else s.astype("datetime64[ns, UTC]")), np.zeros(len(s), bool)
    scale = _UNIT_NS[unit]
    ints = s.array.asi8
    nat = ints == _NAT
    out = ~nat & ((ints > np.iinfo(np.int64).max // scale) | (ints <= _NAT // scale))
    ns = np.where(nat | out, _NAT, np.where(nat | out, 0, ints) * scale)
    return utc_series(ns, s.index), out


def time_problem(value: Any) -> str:
    """Why a time value was refused: outside the datetime64[ns] range, or unparseable."""
    when = value if isinstance(value, (pd.Timestamp, dt.date)) else None
    if when is None:
        try:
            parsed = pd.to_datetime(pd.Series([str(value).strip()]), utc=True, errors="coerce", format="ISO8601").iloc[0]
            when = None if pd.isna(parsed) else parsed
        except (ValueError, OverflowError):
            when = None
    if when is None:
        return f"unparseable time {_show(value)}"
    if isinstance(value, pd.Timestamp):
        text = (value.tz_convert("UTC").tz_localize(None) if value.tzinfo else value).isoformat()
    else:
        text = value.isoformat() if isinstance(value, dt.date) else _show(value)
    return f"{text} is outside the range of supported times ({TIME_RANGE}); a \"still running\" interval has an empty end"


def _show(value: Any) -> str:
    return repr(value if isinstance(value, str) else str(value))


def utc_series(ns: np.ndarray, index: Any = None) -> pd.Series:
    """UTC nanoseconds (NaT = int64 min) -> datetime Series without a pass over the data.

    ``pd.to_datetime(..., utc=True)``, ``tz_localize`` and even ``DatetimeIndex(...,
    dtype=...)`` copy or convert every value; at ten million rows each costs as much as
    pricing them. The values already are UTC instants, so they are wrapped as they are.
    """
    from pandas.arrays import DatetimeArray

    values = np.asarray(ns, dtype=np.int64).view("datetime64[ns]")
    return pd.Series(DatetimeArray._simple_new(values, dtype=pd.DatetimeTZDtype("ns", "UTC")), index=index, copy=False)


def _numbers(s: pd.Series) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """-> (float values, blank mask, bad mask); bad: unparseable, NaN text or not finite
    (``inf``, ``1e400``). Bad values are NaN in the result, so no check downstream can
    take them for a number; :func:`number_problem` says what was wrong."""
    if pd.api.types.is_integer_dtype(s.dtype) and not isinstance(s.dtype, pd.api.extensions.ExtensionDtype):
        vals = s.to_numpy()  # plain ints have no missing values; no float copy needed
        return vals, np.zeros(len(s), bool), np.zeros(len(s), bool)
    if pd.api.types.is_numeric_dtype(s.dtype) and not pd.api.types.is_bool_dtype(s.dtype):
        vals = s.to_numpy(dtype=float, na_value=np.nan)
        inf = np.isinf(vals)
        if inf.any():
            vals = np.where(inf, np.nan, vals)
        return vals, np.isnan(vals) & ~inf, inf
    codes, uniques = _factorized(s)
    parsed = []
    for u in uniques:
        text = str(u).strip()
        try:
            value = float(text) if text else np.nan
        except ValueError:
            value = np.nan
        parsed.append(value if np.isfinite(value) else np.nan)
    blank = _lut([str(u).strip() == "" for u in uniques], True, bool)[codes]
    vals = _lut(parsed, np.nan, float)[codes]
    return vals, blank, ~blank & np.isnan(vals)


def number_problem(value: Any) -> str:
    try:
        f = float(str(value).strip())
    except ValueError:
        return f"not a number: {_show(value)}"
    if np.isnan(f):
        return f"not a number: {_show(value)}"
    return f"not a finite number: {_show(value)}"


# --------------------------------------------------------------------------- sources


def read_table_file(
    path: Path, columns: Sequence[str] | None = None, window: Window | None = None, stats: ReadStats | None = None, footers: FooterCache | None = None,
) -> pd.DataFrame:
    """CSV (all text, parsed later) or Parquet (types kept; strings as categoricals).

    Anything that stops the file from being read raises :class:`UsageSourceError`
    naming the file and what is wrong, never a reader's own exception. With a
    ``window``, a Parquet file's row groups that cannot touch it are not read (the frame
    then carries ``row``, the 1-based row number in the file; no rows at all when
    nothing can touch it) and ``stats`` records what was read; ``footers`` remembers
    the footer's summary (:mod:`gpu_ops.cost.footers`).
    """
    suffix = path.suffix.lower()
    if suffix in (".parquet", ".pq"):
        import pyarrow as pa
        import pyarrow.parquet as pq

        from gpu_ops.cost import window as win
        from gpu_ops.cost.columns import parquet_columns

        try:
            if window is None:
                schema = pq.read_schema(path)
                return arrow_to_frame(pq.read_table(path, columns=parquet_columns(schema.names, columns)))
            table, rows = win.read_parquet(path, columns, window, stats or win.ReadStats(), footers)
            if not len(rows):  # nothing of the window: the file's columns, no rows
                return pd.DataFrame(np.empty((0, table.num_columns), dtype=object), columns=table.column_names)
            df = arrow_to_frame(table)
        except (pa.ArrowException, OSError, ValueError) as exc:  # a corrupt or truncated file: name it
            raise UsageSourceError(path, f"not a readable Parquet file: {_first_line(exc)}") from None
        df["row"] = rows
        return df
    if suffix == ".csv":
        try:
            return _read_csv(path, columns)
        except pd.errors.EmptyDataError:
            raise UsageSourceError(path, "empty file (a CSV needs a header row)") from None
        except UnicodeDecodeError as exc:
            raise UsageSourceError(path, f"not UTF-8 text (byte {exc.object[exc.start:exc.start + 1]!r} at offset {exc.start})") from None
        except (pd.errors.ParserError, ValueError, OSError) as exc:
            raise UsageSourceError(path, f"not a readable CSV file: {_first_line(exc)}") from None
    raise UsageSourceError(path, f"unsupported extension {suffix!r} (use .csv or .parquet)")


def _read_csv(path: Path, columns: Sequence[str] | None) -> pd.DataFrame:
    """All text; a line with the wrong number of fields is skipped and listed in
    ``attrs["bad_lines"]`` as (data row, reason) for the quarantine. Every column is
    parsed (``usecols`` would silently cut a line with too many fields, e.g. an unquoted
    comma, to the right length) and the unneeded ones dropped afterwards."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", pd.errors.ParserWarning)
        df = pd.read_csv(path, dtype=str, keep_default_na=False, na_values=[""], encoding="utf-8-sig", on_bad_lines="warn")
    bad = [(int(m.group(1)) - 1, f"line {m.group(1)}: {m.group(2).strip()}; the line was not read")
           for w in caught for m in re.finditer(r"Skipping line (\d+): ([^\n]*)", str(w.message))]
    if columns is not None:
        df = df[[c for c in df.columns if c in columns or str(c).startswith("label:")]]
    df.attrs["bad_lines"] = bad
    return df


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def arrow_to_frame(table: Any) -> pd.DataFrame:
    """Arrow table -> DataFrame with one copy per column at most.

    ``Table.to_pandas`` consolidates same-typed columns into 2-D blocks and localises
    timestamps value by value; at ten million rows that costs more than the attribution.
    Here each column's chunks are copied once into one numpy array: dictionary columns
    become categoricals over the (unified) dictionary, timestamps UTC nanoseconds.
    """
    import pyarrow as pa

    table = table.unify_dictionaries()
    cols: dict[str, Any] = {}
    nested: dict[str, list[str | None]] = {}
    n = table.num_rows
    for name, chunked in zip(table.column_names, table.columns):
        chunks = chunked.chunks
        t = chunked.type
        if pa.types.is_dictionary(t):
            cats = chunks[0].dictionary.to_pylist() if chunks else []
            if len(set(cats)) != len(cats):  # a Categorical needs unique categories
                cols[name] = pd.Series(chunked.cast(t.value_type).to_pandas(), copy=False).astype("category")
                continue
            codes = _concat([c.indices.fill_null(-1) if c.null_count else c.indices for c in chunks], np.int32 if len(cats) > 32000 else np.int16, n)
            cols[name] = pd.Categorical.from_codes(codes, categories=cats)
        elif _is_nested(t):
            nested[name] = _nested_cells_of(chunked, t)
            cols[name] = pd.Series([None] * n, dtype=object)
        elif pa.types.is_timestamp(t) and not _fits_ns(chunked, t.unit):
            cols[name] = chunked.to_pandas()  # its own unit: validation flags what ns cannot hold
        elif pa.types.is_timestamp(t):
            scale = _UNIT_NS[t.unit]
            ints = _concat([c.view(pa.int64()).fill_null(0) if c.null_count else c.view(pa.int64()) for c in chunks], np.int64, n, scale)
            nulls = chunked.null_count
            if nulls:
                ints[_concat([c.is_null() for c in chunks], bool, n)] = np.iinfo(np.int64).min
            # Naive timestamps are UTC by the format; aware ones are stored as UTC instants.
            cols[name] = utc_series(ints)
        elif (pa.types.is_integer(t) or pa.types.is_floating(t)) and not chunked.null_count:
            cols[name] = _concat(chunks, np.float64 if pa.types.is_floating(t) else np.int64, n)
        else:
            cols[name] = chunked.to_pandas()
    if nested:
        per_row = [{f: v[i] for f, v in nested.items() if v[i] is not None} for i in range(n)]
        cols[CELL_ERRORS] = pd.Series([d or None for d in per_row], dtype=object)
    return pd.DataFrame(cols, copy=False)


def _is_nested(t: Any) -> bool:
    import pyarrow as pa

    return bool(pa.types.is_nested(t))


def _nested_cells_of(chunked: Any, t: Any) -> list[str | None]:
    """What each list/struct/map cell held, as text (None for a null cell)."""
    import pyarrow as pa

    kind = "struct" if pa.types.is_struct(t) else "map" if pa.types.is_map(t) else "list" if "list" in str(t) else str(t)
    return [None if v is None else f"a {kind} cell {json.dumps(v, default=str)}, where the usage format has one value" for v in chunked.to_pylist()]


def _fits_ns(chunked: Any, unit: str) -> bool:
    """Whether every timestamp of ``unit`` is within datetime64[ns] (checked on the ints, no copy)."""
    if unit == "ns" or chunked.null_count == len(chunked):
        return True
    import pyarrow as pa
    import pyarrow.compute as pc

    scale = _UNIT_NS[unit]
    lo_hi = pc.min_max(chunked.cast(pa.int64()))
    lo, hi = lo_hi["min"].as_py(), lo_hi["max"].as_py()
    return lo is None or (lo > _NAT // scale and hi <= np.iinfo(np.int64).max // scale)


def _concat(chunks: list[Any], dtype: Any, n: int, scale: int = 1) -> np.ndarray:
    """Chunks into one array in a single pass (scaled on the way, e.g. µs -> ns)."""
    out = np.empty(n, dtype=dtype)
    pos = 0
    for c in chunks:
        view = c.to_numpy(zero_copy_only=False)
        if scale == 1:
            out[pos : pos + len(view)] = view
        else:
            np.multiply(view, scale, out=out[pos : pos + len(view)])
        pos += len(view)
    return out


def read_usage_files(
    patterns: Iterable[str],
    base_dir: Path | None = None,
    columns: Sequence[str] | None = None,
    row_numbers: bool = True,
    window: Window | None = None,
    lookback_days: Mapping[str, int] | None = None,
    stats: ReadStats | None = None,
    footers: FooterCache | None = None,
) -> pd.DataFrame:
    """Read CSV/Parquet usage files (globs); rows carry the file name and 1-based row number.

    Each file is read once however many patterns match it. A pattern that matches
    nothing, or a file that cannot be read, becomes one file-level row (``FILE_ERROR``)
    that :func:`validate_usage` quarantines; the other files are still read.
    With ``row_numbers=False`` no ``row`` column is built (80 MB at ten million rows); the
    quarantine still names rows, working them out from positions (files are concatenated
    in order). With a ``window``, only what can touch it is listed, read and kept (see
    :mod:`gpu_ops.cost.window`; ``lookback_days`` per pattern); ``stats`` records it, and
    ``footers`` spares opening Parquet files whose cached footer rules them out
    (:mod:`gpu_ops.cost.footers`).
    """
    return _read_files(patterns, base_dir, columns, "file", USAGE_REQUIRED, USAGE_COLUMNS, row_numbers, window, lookback_days, stats, footers)


def _read_files(
    patterns: Iterable[str], base_dir: Path | None, columns: Sequence[str] | None, source: str,
    required: Sequence[str], layout: Sequence[str], row_numbers: bool = True,
    window: Window | None = None, lookback_days: Mapping[str, int] | None = None, stats: ReadStats | None = None,
    footers: FooterCache | None = None,
) -> pd.DataFrame:
    from gpu_ops.cost import window as win
    from gpu_ops.cost.columns import parquet_columns

    frames = []
    files = list(distinct_files(patterns, base_dir, window, lookback_days, stats))
    footers = footers if window is not None else None
    if footers is not None:
        footers.load(p for p, _ in files if p is not None and p.suffix.lower() in (".parquet", ".pq"))
    for path, problem in files:
        try:
            if problem is not None:
                raise problem
            assert path is not None
            cached = win.ruled_out(path, window, footers, stats) if footers is not None and window is not None else None
            if cached is not None:  # its cached footer says nothing can touch the window: check its columns only
                raise_missing(path, parquet_columns(cached, columns), required, "usage" if source == "file" else source, layout)
                continue
            df = read_table_file(path, columns, window, stats, footers)
            raise_missing(path, df.columns, required, "usage" if source == "file" else source, layout)
        except UsageSourceError as exc:
            frames.append(source_problem(exc, source))
            continue
        bad_lines = df.attrs.pop("bad_lines", [])
        if window is None:
            frames.append(usage_frame(df, path, 1 if row_numbers or bad_lines else None, [r for r, _ in bad_lines], source))
        elif len(df):  # numbered (rows of the window keep their file row numbers), then filtered
            if source == "file" and path.suffix.lower() == ".csv" and stats is not None:
                stats.files_read.append(str(path))
            frame = win.keep_touching(usage_frame(df, path, None if "row" in df else 1, [r for r, _ in bad_lines], source), window, stats)
            if len(frame):
                frames.append(frame)
        if bad_lines:
            frames.append(line_problems(path, bad_lines, source))
    if any("row" in f for f in frames) and not all("row" in f for f in frames if FILE_ERROR not in f):
        for f in frames:  # numbered files next to unnumbered ones: number them all
            if "row" not in f and FILE_ERROR not in f:
                f["row"] = np.arange(1, len(f) + 1, dtype=np.int64)
    if footers is not None:
        footers.save()
        if footers.problem and stats is not None:
            stats.footer_cache_problem = footers.problem
    return concat_raw(frames)


def source_problem(exc: UsageSourceError, source: str = "file") -> pd.DataFrame:
    """A file or pattern that yields no rows, as the one raw row validation quarantines."""
    return pd.DataFrame({"source": [source], "location": [exc.location], FILE_ERROR: [exc.reason]})


def line_problems(path: Path, bad_lines: Sequence[tuple[int, str]], source: str = "file") -> pd.DataFrame:
    """CSV lines that could not be split into the header's fields: (data row, reason) each."""
    return pd.DataFrame({"source": source, "location": str(path), "row": [r for r, _ in bad_lines], FILE_ERROR: [why for _, why in bad_lines]})


def probe_files(
    patterns: Iterable[str], base_dir: Path | None, required: Sequence[str] = USAGE_REQUIRED, kind: str = "usage", layout: Sequence[str] = USAGE_COLUMNS, limit: int = 200,
) -> tuple[int, list[str]]:
    """Cheap look at what a read would find: each pattern matches a file, each file
    (up to ``limit`` per read) opens as CSV or Parquet with the required columns. Only
    headers and Parquet footers are read. -> (files seen, problems as "location: reason")."""
    import csv

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
            suffix = path.suffix.lower()
            if suffix in (".parquet", ".pq"):
                import pyarrow.parquet as pq

                try:
                    names = pq.read_schema(path).names
                except Exception as exc:  # any reader error names the file
                    raise UsageSourceError(path, f"not a readable Parquet file: {_first_line(exc)}") from None
            elif suffix == ".csv":
                try:
                    with path.open(newline="", encoding="utf-8-sig") as f:
                        names = next(csv.reader(f), None) or []
                except (UnicodeDecodeError, OSError, csv.Error) as exc:
                    raise UsageSourceError(path, f"cannot be read as CSV: {_first_line(exc)}") from None
                if not names:
                    raise UsageSourceError(path, "empty file (a CSV needs a header row)")
            else:
                raise UsageSourceError(path, f"unsupported extension {suffix!r} (use .csv or .parquet)")
            raise_missing(path, names, required, kind, layout)
        except UsageSourceError as exc:
            problems.append(str(exc))
    return seen, problems


def file_problems(quarantine: pd.DataFrame) -> pd.DataFrame:
    """The quarantine's file-level rows: patterns that matched nothing, files not readable."""
    if quarantine.empty:
        return quarantine
    return quarantine[quarantine["field"] == FILE_FIELD].reset_index(drop=True)


def usage_frame(df: pd.DataFrame, path: Path, first_row: int | None = 1, skipped: Sequence[int] = (), source: str = "file") -> pd.DataFrame:
    """Rows read from a usage file (or one batch of it) -> raw rows with provenance.

    ``first_row`` is the file's row number of the frame's first row (a batch further in
    the file starts later); ``None`` builds no ``row`` column (see :func:`read_usage_files`).
    ``skipped``: data rows of this stretch of the file that were not read (bad CSV
    lines); the rows after them keep their own numbers.
    """
    if source == "file":
        require_usage_columns(path, df.columns)
        df = _collect_label_columns(df)
    df["source"] = const_column(len(df), source)
    df["location"] = const_column(len(df), str(path))
    # CSV: data row N is line N+1 (the header is line 1).
    if first_row is not None:
        numbers = np.arange(first_row, first_row + len(df) + len(skipped), dtype=np.int64)
        df["row"] = np.setdiff1d(numbers, np.asarray(skipped, dtype=np.int64)) if len(skipped) else numbers
    return df


def _row_numbers(raw: pd.DataFrame, idx: np.ndarray) -> np.ndarray:
    """1-based row numbers within each file for positions ``idx``."""
    if "row" in raw:
        return raw["row"].to_numpy()[idx]
    loc = raw["location"]
    codes = loc.cat.codes.to_numpy() if isinstance(loc.dtype, pd.CategoricalDtype) else pd.factorize(loc)[0]
    first: dict[int, int] = {}
    change = np.flatnonzero(np.diff(codes, prepend=-2) != 0)  # where each file's rows begin
    for start in change:
        first.setdefault(int(codes[start]), int(start))
    return np.array([i - first[int(codes[i])] + 1 for i in idx], dtype=np.int64)


def _collect_label_columns(df: pd.DataFrame) -> pd.DataFrame:
    """``label:<name>`` columns of a file -> the ``labels`` JSON column."""
    label_cols = [c for c in df.columns if str(c).startswith("label:")]
    if not label_cols:
        return df
    names = [c[len("label:") :] for c in label_cols]
    sub = df[label_cols].astype(object)
    extra = [
        {n: str(v) for n, v in zip(names, vals) if v is not None and not (isinstance(v, float) and np.isnan(v)) and str(v) != ""}
        for vals in sub.itertuples(index=False, name=None)
    ]
    if "labels" in df.columns:
        base = [v if isinstance(v, str) and v.strip() else "{}" for v in df["labels"].astype(object)]
        # A labels cell that is not a JSON object is kept as written: validation quarantines it.
        merged: list[Any] = [{**b, **e} if isinstance(b := _json_object(v), dict) else v for v, e in zip(base, extra)]
    else:
        merged = extra
    df = df.drop(columns=label_cols)
    df["labels"] = [json.dumps(m, sort_keys=True) if isinstance(m, dict) else m for m in merged]
    return df


def read_ledger(store: Any, window: Window | None = None, stats: ReadStats | None = None, twins_of: Sequence[Any] = ()) -> pd.DataFrame:
    """The training ledger (``gpu_usage_ledger``), or its rows that can touch ``window``
    (a range query), or with ``twins_of`` its rows starting at those times that ended
    before the window (see :func:`read_intervals`); absent table -> no rows.

    Attempts that held no GPU (``gpu_count`` 0: a launch that never started, a run on
    CPU) are the retry policy's memory, not GPU usage: their GPU-hours are zero by
    construction, so they are left out here rather than quarantined. Any other value,
    blank or malformed, still goes through validation.
    """
    df = read_intervals(store, LEDGER_TABLE, window, stats, twins_of)
    if not df.empty and "gpu_count" in df.columns:
        df = df[pd.to_numeric(df["gpu_count"], errors="coerce") != 0].reset_index(drop=True)
    if df.empty:
        return pd.DataFrame()
    df = df.drop(columns=[c for c in ("partition_key",) if c in df.columns])
    df["source"] = const_column(len(df), "ledger")
    # A table row has no number (what a query returns depends on its window): a ledger
    # row is named by its run and attempt, as a collected pod is by its name.
    if {"run_id", "attempt"} <= set(df.columns):
        attempt = df["attempt"].astype(object).where(df["attempt"].notna(), "?")
        df["location"] = LEDGER_TABLE + " run " + df["run_id"].astype(str) + " attempt " + attempt.astype(str)
    else:
        df["location"] = const_column(len(df), LEDGER_TABLE)
    df["row"] = pd.array([None] * len(df), dtype="Int64")
    return df


def read_intervals(store: Any, table: str, window: Window | None = None, stats: ReadStats | None = None, twins_of: Sequence[Any] = ()) -> pd.DataFrame:
    """All rows of an interval table, or (with a window) those that can touch it, or (with
    ``twins_of``, start times of running rows) those starting then that ended before it."""
    if window is None:
        return store.read(table, missing_ok=True)
    if twins_of:
        return store.read_closed_twins(table, twins_of, window.start)
    df = store.read_range(table, window.start, window.end, missing_ok=True)
    if stats is not None:
        stats.table_rows[table] = len(df)
    return df


def running_starts(raw: pd.DataFrame, before: pd.Timestamp) -> list[pd.Timestamp]:
    """Start times of named, still-running rows that started before ``before``: the rows
    whose closed twin (same namespace, pod and start) may lie outside a window's read."""
    if raw.empty or not {"start", "end", "pod"} <= set(raw.columns):
        return []
    start, end = parse_times(raw["start"])[0], parse_times(raw["end"])[0]
    mask = end.isna().to_numpy() & (start < before).to_numpy() & (raw["pod"].astype(str) != "").to_numpy()
    return sorted(set(start[mask]))


def concat_raw(frames: Sequence[pd.DataFrame]) -> pd.DataFrame:
    frames = [f for f in frames if len(f.columns)]
    if not frames:
        return pd.DataFrame({c: pd.Series([], dtype=object) for c in (*USAGE_COLUMNS, *PROVENANCE_COLUMNS)})
    if len(frames) == 1:
        return frames[0]
    # Categoricals with different categories would become object; union them first.
    cols = list(dict.fromkeys(c for f in frames for c in f.columns))
    out = {}
    for c in cols:
        parts = [f[c] if c in f.columns else pd.Series([None] * len(f), dtype=object) for f in frames]
        if all(isinstance(p.dtype, pd.CategoricalDtype) for p in parts):
            out[c] = pd.Series(pd.api.types.union_categoricals([p.array for p in parts], ignore_order=True))
        else:
            out[c] = pd.concat([p.astype(object) if isinstance(p.dtype, pd.CategoricalDtype) else p for p in parts], ignore_index=True)
    return pd.DataFrame(out)


def _json_object(text: Any) -> Any:
    """``labels`` text -> its dict, or a string saying why it is not a JSON object of labels."""
    try:
        value = json.loads(text)
    except (TypeError, ValueError) as exc:
        return f"not valid JSON ({exc}): {_show(text)}"
    if not isinstance(value, dict) or any(isinstance(v, (dict, list)) for v in value.values()):
        return f"must be a JSON object of label names to values, got {_show(text)}"
    return value


# --------------------------------------------------------------------------- validation


class Problems:
    """Per-row problems, collected as (mask, field, message-per-row) and rendered once."""

    def __init__(self, n: int):
        self.n = n
        self.bad = np.zeros(n, bool)
        self.items: list[tuple[np.ndarray, str, Callable[[np.ndarray], list[str]]]] = []
        self.fields: dict[str, np.ndarray] = {}  # rows already given a reason, per field

    def add(self, mask: np.ndarray, field: str, message: str | Callable[[np.ndarray], list[str]]) -> None:
        mask = np.asarray(mask, bool)
        if not mask.any():
            return
        if field in self.fields:  # one reason per field and row: the first, most specific one
            mask = mask & ~self.fields[field]
            if not mask.any():
                return
            self.fields[field] |= mask
        else:
            self.fields[field] = mask.copy()
        self.bad |= mask
        msg = message if callable(message) else (lambda idx, m=message: [m] * len(idx))
        self.items.append((mask, field, msg))

    def render(self, raw: pd.DataFrame, start: pd.Series, end: pd.Series) -> pd.DataFrame:
        idx = np.flatnonzero(self.bad)
        if not len(idx):
            return empty_quarantine()
        reasons: dict[int, list[str]] = {int(i): [] for i in idx}
        first_field: dict[int, str] = {}
        for mask, field, msg in self.items:
            rows = np.flatnonzero(mask)
            for i, text in zip(rows, msg(rows)):
                reasons[int(i)].append(f"{field}: {text}")
                first_field.setdefault(int(i), field)
        sub = raw.iloc[idx]
        records = []
        for rec in sub.drop(columns=[c for c in PROVENANCE_COLUMNS if c in sub.columns]).astype(object).to_dict("records"):
            records.append(json.dumps({k: _jsonable(v) for k, v in rec.items()}, sort_keys=True))
        return pd.DataFrame(
            {
                "source": sub["source"].astype(str).to_numpy() if "source" in sub else "",
                "location": sub["location"].astype(str).to_numpy() if "location" in sub else "",
                "row": pd.array(_row_numbers(raw, idx) if ("row" in raw or "location" in raw) else [None] * len(idx), dtype="Int64"),
                "field": [first_field[int(i)] for i in idx],
                "reason": ["; ".join(reasons[int(i)]) for i in idx],
                "record": records,
                # Parsed times (NaT when unparseable) place the row in its day's partition.
                "start": start.iloc[idx].reset_index(drop=True),
                "end": end.iloc[idx].reset_index(drop=True),
            }
        )


def _jsonable(v: Any) -> Any:
    if v is None or (isinstance(v, float) and np.isnan(v)) or v is pd.NaT:
        return None
    if isinstance(v, (pd.Timestamp,)):
        return v.isoformat()
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, (np.floating,)):
        return float(v)
    return v if isinstance(v, (int, float, str, bool)) else str(v)


def empty_quarantine() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "source": pd.Series([], dtype=object),
            "location": pd.Series([], dtype=object),
            "row": pd.Series([], dtype="Int64"),
            "field": pd.Series([], dtype=object),
            "reason": pd.Series([], dtype=object),
            "record": pd.Series([], dtype=object),
            "start": pd.Series([], dtype="datetime64[ns, UTC]"),
            "end": pd.Series([], dtype="datetime64[ns, UTC]"),
        }
    )


def quarantine_in_window(q: pd.DataFrame, window_start: pd.Timestamp, window_end: pd.Timestamp) -> pd.DataFrame:
    """Bad rows that belong to ``[window_start, window_end)``.

    A row whose start cannot be read could belong to any day, so it is reported in every
    window rather than lost; otherwise the (possibly inverted) interval must touch it.
    """
    if q.empty:
        return q
    s, e = q["start"], q["end"]
    lo = s.where(e.isna() | (s <= e), e)
    hi = e.where(e.notna() & (e >= s), s)
    open_ = e.isna()
    keep = s.isna() | ((lo < window_end) & (open_ | (hi >= window_start)))
    return q[keep.to_numpy()].reset_index(drop=True)


def _canonical_or_error(name: Any) -> tuple[str | None, str | None]:
    try:
        return canonical_gpu_type(str(name)), None
    except UnknownGpuType as exc:
        return None, str(exc)


def _choice_codes(s: pd.Series, choices: Sequence[str], blank: int = -1) -> tuple[np.ndarray, list[Any]]:
    """-> (index into choices per row, -1 when not one of them; ``blank`` for blank values)."""
    codes, uniques = _map_distinct(s, lambda v: str(v).strip().lower())
    lut = _lut([choices.index(u) if u in choices else (blank if u == "" else -1) for u in uniques], blank, np.int8)
    return lut[codes], list(uniques)


def _price_columns(
    prices: PriceMatrix, gpu_types: list[str], gcodes: np.ndarray, cap_codes: np.ndarray, region_mult: list[float], r_codes: np.ndarray | None
) -> tuple[pd.Categorical, pd.Categorical]:
    """Price and on-demand price per row, as categoricals over the few distinct prices.

    Prices depend only on (gpu type, capacity, region): a small dense table of those
    combinations is priced once and each row gets a one- or two-byte code into it, so
    ten million rows cost no 80 MB float arrays (attribution sums GPU-hours per price
    and multiplies afterwards). Missing prices are code -1 (NaN), never 0.
    """
    G, C = len(gpu_types), len(CAPACITY_TYPES)
    mults = [1.0] if r_codes is None else region_mult
    R = len(mults)
    # Slot 0 of each axis is "missing" (code -1 shifted by one).
    table = np.full((G + 1, C + 1, R + 1), np.nan)
    od_table = np.full((G + 1, C + 1, R + 1), np.nan)
    for gi, g in enumerate(gpu_types):
        od_price = prices.price(g, "on-demand")
        for ci, c in enumerate(CAPACITY_TYPES):
            base = prices.price(g, c)
            for ri, m in enumerate(mults):
                table[gi + 1, ci + 1, ri + 1] = base * m
                od_table[gi + 1, ci + 1, ri + 1] = od_price * m
    if r_codes is None:
        table[:, :, 0], od_table[:, :, 0] = table[:, :, 1], od_table[:, :, 1]  # no region column: multiplier 1
    idx = gcodes.astype(np.int32) + 1
    idx *= C + 1
    idx += cap_codes + 1
    idx *= R + 1
    if r_codes is not None:
        idx += r_codes + 1
    return _coded(table.ravel(), idx), _coded(od_table.ravel(), idx)


def _coded(values: np.ndarray, idx: np.ndarray) -> pd.Categorical:
    cats = np.unique(values[~np.isnan(values)])
    lut = np.where(np.isnan(values), -1, np.searchsorted(cats, np.nan_to_num(values))).astype(np.int16 if len(cats) > 120 else np.int8)
    return pd.Categorical.from_codes(lut[idx], categories=cats)


def as_floats(s: pd.Series) -> np.ndarray:
    """A numeric column as float64; categorical price columns are expanded (NaN for -1)."""
    if isinstance(s.dtype, pd.CategoricalDtype):
        values = np.append(s.cat.categories.to_numpy(dtype=float), np.nan)
        return values[s.cat.codes.to_numpy()]
    return s.to_numpy(dtype=float, na_value=np.nan)


_REQUIRED_TEXT = {
    "team": "missing (every interval must name the team that pays)",
    "node": "missing (the inventory is matched to usage by node name)",
}


def validate_usage(raw: pd.DataFrame, prices: PriceMatrix, required: Sequence[str] = ("team",)) -> Validated:
    """Check every row; return typed, priced rows and the quarantined ones with reasons.

    Rules: ``start`` required and ``end`` optional, both parseable and within what
    datetime64[ns] holds, ``end`` not before ``start``; ``team`` not blank; ``gpu_type``
    known to the catalog (aliases mapped); ``gpu_count`` a whole number in
    (0, MAX_GPUS_PER_ROW]; ``capacity_type`` one of spot/on-demand/reserved; ``sharing``
    one of none/mig/mps/timeslice (blank = none); ``gpu_share`` in (0, 1], 1 (or blank)
    for unshared GPUs; numbers finite; ``labels`` a JSON object; no list/struct cells;
    a price for gpu type × capacity and, when the table lists regions, for the row's
    region. Rows identical to an earlier good row are counted once (the copy is
    quarantined as a duplicate); ``seen`` carries the rows of earlier batches when a
    read is validated batch by batch. ``identity``: text columns that are only needed to
    tell rows apart; the typed rows carry a 64-bit hash of their stripped text
    (:func:`text_identity`) instead of categories, the quarantine record the text. File-level rows from the readers become quarantine rows with field
    ``<file>`` and no row number.
    """
    file_q = empty_quarantine()
    if FILE_ERROR in raw:
        failed = raw[FILE_ERROR].notna().to_numpy()
        file_q = _file_quarantine(raw[failed])
        raw = raw[~failed].drop(columns=FILE_ERROR).reset_index(drop=True)
    n = len(raw)
    problems = Problems(n)
    _cell_errors(raw, problems)  # first: a blanked list cell is reported as such, not as "missing"
    out: dict[str, Any] = {}

    no_times = (pd.Series(pd.NaT, index=raw.index, dtype="datetime64[ns, UTC]"), np.zeros(n, bool))
    start, bad_start = parse_times(raw["start"]) if "start" in raw else no_times
    problems.add(bad_start, "start", lambda idx: [time_problem(raw["start"].iloc[i]) for i in idx])
    problems.add(start.isna().to_numpy() & ~bad_start, "start", "missing")
    end, bad_end = parse_times(raw["end"]) if "end" in raw else no_times
    problems.add(bad_end, "end", lambda idx: [time_problem(raw["end"].iloc[i]) for i in idx])
    s_ns, e_ns = start.array.asi8, end.array.asi8
    # NaT is the smallest int64: a missing end is "before" any start, so exclude it.
    problems.add((e_ns < s_ns) & (e_ns != _NAT), "end", lambda idx: [f"{end.iloc[i].isoformat()} is before start {start.iloc[i].isoformat()}" for i in idx])
    out["start"], out["end"] = start, end

    for col in ATTRIBUTE_COLUMNS:
        out[col] = _as_text(raw[col]) if col in raw else pd.Series(const_column(n, ""), index=raw.index)
    for col in required:
        problems.add(_blank(raw[col]) if col in raw else np.ones(n, bool), col, _REQUIRED_TEXT[col])

    # gpu type: once per distinct name; aliases map to canonical names, unknown names are errors.
    if "gpu_type" in raw:
        codes, results = _map_distinct(raw["gpu_type"], _canonical_or_error)
        canon = [r[0] for r in results]
        errors = [r[1] for r in results]
        known = _lut([c is not None for c in canon], False, bool)[codes]
        problems.add(codes < 0, "gpu_type", "missing")
        problems.add((codes >= 0) & ~known, "gpu_type", lambda idx: [errors[codes[i]] for i in idx])
        cats = sorted({c for c in canon if c})
        canon_codes = _lut([cats.index(c) if c else -1 for c in canon], -1, np.int16)[codes]
        out["gpu_type"] = pd.Series(pd.Categorical.from_codes(canon_codes, categories=cats), index=raw.index)
    else:
        problems.add(np.ones(n, bool), "gpu_type", "missing")
        out["gpu_type"] = pd.Series(pd.Categorical.from_codes(np.full(n, -1), categories=[]), index=raw.index)

    count = _number_column(raw, "gpu_count", problems, required=True)
    # NaN (blank or bad, reported above) compares False below.
    problems.add(count <= 0, "gpu_count", lambda idx: [f"must be > 0, got {count[i]:g}" for i in idx])
    problems.add(count > MAX_GPUS_PER_ROW, "gpu_count", lambda idx: [f"implausibly large: {count[i]:g} GPUs in one interval (at most {MAX_GPUS_PER_ROW:,})" for i in idx])
    if count.dtype.kind == "f":
        problems.add(np.isfinite(count) & (count != np.floor(count)), "gpu_count", lambda idx: [f"must be a whole number of GPUs, got {count[i]:g} (a fraction of a GPU is gpu_share with sharing mig, mps or timeslice)" for i in idx])
    out["gpu_count"] = count

    cap_codes, cap_uniques = _choice_codes(raw["capacity_type"], CAPACITY_TYPES) if "capacity_type" in raw else (np.full(n, -1), [])
    cap_blank = _blank(raw["capacity_type"]) if "capacity_type" in raw else np.ones(n, bool)
    problems.add(cap_blank, "capacity_type", "missing (spot, on-demand or reserved)")
    problems.add((cap_codes < 0) & ~cap_blank, "capacity_type", lambda idx: [f"{str(raw['capacity_type'].iloc[i])!r} is not one of {', '.join(CAPACITY_TYPES)}" for i in idx])
    out["capacity_type"] = pd.Series(pd.Categorical.from_codes(cap_codes, categories=list(CAPACITY_TYPES)), index=raw.index)

    if "sharing" in raw:
        sh_codes, _ = _choice_codes(raw["sharing"], SHARING_MODES, blank=0)  # blank = not shared
        problems.add(sh_codes < 0, "sharing", lambda idx: [f"{str(raw['sharing'].iloc[i])!r} is not one of {', '.join(SHARING_MODES)}" for i in idx])
    else:
        sh_codes = np.zeros(n, np.int8)
    out["sharing"] = pd.Series(pd.Categorical.from_codes(sh_codes, categories=list(SHARING_MODES)), index=raw.index)

    share, share_blank = _number_column(raw, "gpu_share", problems, required=False, with_blank=True)
    unshared = sh_codes == 0
    # A whole GPU is a share of 1 by definition; a shared one must say how much it got.
    if share_blank.any():
        share = np.where(share_blank & unshared, 1.0, share)
    problems.add(share_blank & (sh_codes > 0), "gpu_share", "missing (required when sharing is mig, mps or timeslice)")
    problems.add((share <= 0) | (share > 1), "gpu_share", lambda idx: [f"must be in (0, 1], got {share[i]:g}" for i in idx])
    problems.add(unshared & (share < 1), "gpu_share", lambda idx: [f"{share[i]:g} but sharing is none: a share below 1 needs sharing mig, mps or timeslice" for i in idx])
    out["gpu_share"] = share

    if "region" in raw:
        region = _as_text(raw["region"])
        r_codes = region.cat.codes.to_numpy()
        region_mult = [prices.region_multiplier(c) for c in region.cat.categories]
        bad_region = _lut([np.isnan(m) for m in region_mult], False, bool)[r_codes]
        problems.add(bad_region, "region", lambda idx: [f"no price multiplier for region {region.iloc[i]!r} (regions: {', '.join(sorted(prices.regions))})" for i in idx])
    else:
        region = pd.Series(const_column(n, ""), index=raw.index)
        r_codes, region_mult, bad_region = None, [], None
    out["region"] = region

    gpu_cats = out["gpu_type"].cat.categories
    gcodes = out["gpu_type"].cat.codes.to_numpy()
    price, od = _price_columns(prices, list(gpu_cats), gcodes, cap_codes, region_mult, r_codes)
    priceable = (cap_codes >= 0) & (gcodes >= 0)
    if bad_region is not None:
        priceable &= ~bad_region
    problems.add(priceable & (price.codes < 0), "price", lambda idx: [prices.describe_missing(gpu_cats[gcodes[i]], CAPACITY_TYPES[cap_codes[i]]) for i in idx])
    out["price_per_gpu_hour"] = pd.Series(price, index=raw.index, copy=False)
    out["on_demand_price_per_gpu_hour"] = pd.Series(od, index=raw.index, copy=False)

    if "labels" in raw:
        out["labels"] = _as_text(raw["labels"])
        lab = out["labels"]
        verdicts = [None if c == "" else _json_object(c) for c in lab.cat.categories]
        bad_labels = _lut([isinstance(v, str) for v in verdicts], False, bool)[lab.cat.codes.to_numpy()]
        problems.add(bad_labels, "labels", lambda idx: [verdicts[lab.cat.codes.iloc[i]] for i in idx])
    for col in ("run_id", "asset_key", "outcome", "instance_type"):
        if col in raw:
            out[col] = _as_text(raw[col])
    if "attempt" in raw:
        out["attempt"], _, _ = _numbers(raw["attempt"])
    if "last_checkpoint_at" in raw:
        out["last_checkpoint_at"], _ = parse_times(raw["last_checkpoint_at"])
    if "lost_seconds" in raw:
        lost, _, lost_bad = _numbers(raw["lost_seconds"])
        problems.add(lost_bad | (~np.isnan(lost) & (lost < 0)), "lost_seconds", lambda idx: [f"must be a finite number >= 0, got {_show(raw['lost_seconds'].iloc[i])}" for i in idx])
        out["lost_seconds"] = np.nan_to_num(lost, nan=0.0)
    for col in PROVENANCE_COLUMNS:
        if col in raw:
            out[col] = raw[col]
        elif col != "row":
            out[col] = pd.Series(const_column(n, "unknown"), index=raw.index)

    typed = pd.DataFrame(out, index=raw.index, copy=False)
    _duplicates(typed, raw, problems)
    quarantine = problems.render(raw, start, end)
    if len(file_q):
        quarantine = pd.concat([file_q, quarantine], ignore_index=True) if len(quarantine) else file_q
    good = ~problems.bad
    rows = typed if good.all() else typed.loc[good].reset_index(drop=True)
    return Validated(rows.reset_index(drop=True), quarantine)


def _number_column(raw: pd.DataFrame, col: str, problems: Problems, required: bool, with_blank: bool = False) -> Any:
    """A numeric column with its blank (when required) and bad values reported."""
    n = len(raw)
    vals, blank, bad = _numbers(raw[col]) if col in raw else (np.full(n, np.nan), np.ones(n, bool), np.zeros(n, bool))
    if required:
        problems.add(blank, col, "missing")
    problems.add(bad, col, lambda idx: [number_problem(raw[col].iloc[i]) for i in idx])
    return (vals, blank) if with_blank else vals


def _cell_errors(raw: pd.DataFrame, problems: Problems) -> None:
    """Report the list/struct/map cells the reader recorded (:data:`CELL_ERRORS`), per field."""
    if CELL_ERRORS not in raw:
        return
    errors = raw[CELL_ERRORS].to_numpy()
    rows = np.flatnonzero(pd.notna(errors))
    fields = sorted({f for i in rows for f in errors[i]})
    for field in fields:
        mask = np.zeros(len(raw), bool)
        mask[[i for i in rows if field in errors[i]]] = True
        problems.add(mask, field, lambda idx, f=field: [errors[i][f] for i in idx])  # type: ignore[misc]


def _duplicates(typed: pd.DataFrame, raw: pd.DataFrame, problems: Problems) -> None:
    """Quarantine good rows identical (after parsing) to an earlier good row: counted once."""
    good = np.flatnonzero(~problems.bad)
    cols = [c for c in typed.columns if c not in PROVENANCE_COLUMNS and c != CELL_ERRORS]
    sub = typed.iloc[good][cols] if len(good) < len(typed) else typed[cols]
    # Numbers hash as floats: a CSV's "1" and a Parquet file's integer 1 are the same count.
    ints = {c: sub[c].astype(float) for c in ("gpu_count", "attempt") if c in sub and sub[c].dtype.kind in "iu"}
    hashes = pd.util.hash_pandas_object(sub.assign(**ints) if ints else sub, index=False).to_numpy() if len(good) else np.empty(0, np.uint64)
    dup = np.array(pd.Series(hashes).duplicated(keep="first")) if len(good) > 1 else np.zeros(len(good), bool)
    earlier: dict[int, str] = {}  # row position -> "row N" or "<file> row N" of its first copy
    location = raw["location"] if "location" in raw else pd.Series([""] * len(raw), dtype=object)

    def loc(idx: Any) -> np.ndarray:  # location text of some rows (not a pass over all of them)
        idx = np.atleast_1d(idx)
        if isinstance(location.dtype, pd.CategoricalDtype):  # files: a few names, coded
            names = np.array([str(c) for c in location.cat.categories] + [""], dtype=object)
            return names[location.cat.codes.to_numpy()[idx]]
        return np.array([str(v) for v in location.iloc[idx]], dtype=object)

    if dup.any():
        first_of = pd.Series(np.arange(len(hashes))).groupby(hashes).transform("first").to_numpy()
        later, first = np.flatnonzero(dup), first_of[dup]
        same = _same_values(sub, later, first)  # a hash collision is not a duplicate
        dup[later[~same]] = False
        later, first = good[later[same]], good[first[same]]
        numbers: Any = _row_numbers(raw, first) if len(first) else []
        for i, _j, n, li, lj in zip(later.tolist(), first.tolist(), numbers, loc(later), loc(first)):
            earlier[i] = f"row {n}" if lj == li else f"{lj} row {n}"
    if not earlier:
        return
    mask = np.zeros(len(typed), bool)
    mask[list(earlier)] = True
    problems.add(mask, DUPLICATE_FIELD, lambda idx: [f"duplicate of {earlier[int(i)]}: identical in every column, counted once" for i in idx])


def _same_values(sub: pd.DataFrame, later: np.ndarray, first: np.ndarray) -> np.ndarray:
    same = np.ones(len(later), bool)
    for c in sub.columns:
        col = sub[c]
        v = col.cat.codes.to_numpy() if isinstance(col.dtype, pd.CategoricalDtype) else col.to_numpy()
        a, b = v[later], v[first]
        eq = a == b
        if v.dtype.kind == "f":
            eq |= np.isnan(a) & np.isnan(b)
        elif v.dtype.kind in "Mm" or isinstance(col.dtype, pd.DatetimeTZDtype):
            eq |= pd.isna(a) & pd.isna(b)
        same &= np.asarray(eq, bool)
    return same


def _file_quarantine(failed: pd.DataFrame) -> pd.DataFrame:
    """Reader problems: a whole file or pattern (no row: ``<file>``) or a CSV line (``<line>``)."""
    n = len(failed)
    q = empty_quarantine()
    row = pd.array(failed["row"].to_numpy() if "row" in failed else [None] * n, dtype="Int64")
    return pd.DataFrame(
        {
            "source": failed["source"].astype(str).to_numpy() if "source" in failed else ["file"] * n,
            "location": failed["location"].astype(str).to_numpy(),
            "row": row,
            "field": np.where(pd.isna(row), FILE_FIELD, LINE_FIELD),
            "reason": failed[FILE_ERROR].astype(str).to_numpy(),
            "record": [""] * n,
            "start": pd.Series(pd.NaT, index=range(n), dtype=q["start"].dtype),
            "end": pd.Series(pd.NaT, index=range(n), dtype=q["end"].dtype),
        }
    )


# --------------------------------------------------------------------------- inventory


def validate_inventory(raw: pd.DataFrame, prices: PriceMatrix) -> Validated:
    """Node inventory rows; ``gpu_type``/``gpu_count`` may be derived from a known instance type."""
    raw = raw.copy()
    n = len(raw)
    if "instance_type" in raw:
        it = raw["instance_type"].astype(object).map(lambda v: "" if v is None or (isinstance(v, float) and np.isnan(v)) else str(v).strip())
        derived_type = it.map(lambda t: next((g for g, spec in CATALOG.items() if t in spec.instance_types), ""))
        derived_count = it.map(lambda t: next((spec.instance_types[t] for spec in CATALOG.values() if t in spec.instance_types), np.nan))
        if "gpu_type" in raw:
            raw["gpu_type"] = raw["gpu_type"].astype(object).where(~_blank(raw["gpu_type"]), derived_type.where(derived_type != "", None))
        else:
            raw["gpu_type"] = derived_type.where(derived_type != "", None)
        if "gpu_count" in raw:
            raw["gpu_count"] = raw["gpu_count"].astype(object).where(~_blank(raw["gpu_count"]), derived_count)
        else:
            raw["gpu_count"] = derived_count
    v = validate_usage(raw.assign(sharing=const_column(n, "none"), gpu_share=np.ones(n)), prices, required=("node",))
    return v


def read_inventory_files(patterns: Iterable[str], base_dir: Path | None = None) -> pd.DataFrame:
    return _read_files(patterns, base_dir, None, "inventory", INVENTORY_REQUIRED, INVENTORY_COLUMNS)
