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
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from gpu_ops.cost.pricing import PriceMatrix
from gpu_ops.cost.read import (  # re-exported: the readers' names
    USAGE_COLUMNS,
    USAGE_REQUIRED,
    UsageSourceError,
    distinct_files,
    raise_missing,
    require_usage_columns,
)

if TYPE_CHECKING:
    from gpu_ops.cost.window import ReadStats, Window

# Optional columns a source may carry (the ledger has all of them; a billing export may
# carry any): region prices through the region multiplier, the rest feeds ROI.
OPTIONAL_COLUMNS = ("region", "labels", "run_id", "asset_key", "attempt", "outcome", "last_checkpoint_at", "lost_seconds")
PROVENANCE_COLUMNS = ("source", "location", "row")
QUARANTINE_COLUMNS = ("source", "location", "row", "field", "reason", "record", "start", "end")
LEDGER_TABLE = "gpu_usage_ledger"

NS_PER_HOUR = 3_600 * 10**9


# A file or pattern that yields no rows at all is one quarantine row: this field, no row
# number, and the reason. Readers carry it as a raw row with a FILE_ERROR column.
FILE_FIELD = "<file>"
FILE_ERROR = "file_error"
LINE_FIELD = "<line>"  # a CSV line that could not be split into the header's fields
# List, struct or map cells of a Parquet file: the reader blanks them and records, per
# row, {field: what the cell held} here; validation quarantines those rows.
CELL_ERRORS = "cell_errors"


@dataclass
class Validated:
    rows: pd.DataFrame  # typed, canonical, priced
    quarantine: pd.DataFrame  # QUARANTINE_COLUMNS


# --------------------------------------------------------------------------- helpers


def const_column(n: int, value: Any) -> pd.Categorical:
    """A constant string column that costs one byte per row."""
    return pd.Categorical.from_codes(np.zeros(n, dtype=np.int8), categories=[value])


def factorized(s: pd.Series) -> tuple[np.ndarray, pd.Index]:
    if isinstance(s.dtype, pd.CategoricalDtype):
        # Parquet dictionaries arrive as categoricals: their codes already are the factorization.
        return s.cat.codes.to_numpy(), pd.Index(s.cat.categories)
    codes, uniques = pd.factorize(s, use_na_sentinel=True)
    return codes, pd.Index(uniques)


def lut(values: list[Any], missing: Any, dtype: Any) -> np.ndarray:
    """Look-up table indexed by codes; code -1 (missing) hits the extra last entry."""
    return np.array([*values, missing], dtype=dtype)


def blank_mask(s: pd.Series) -> np.ndarray:
    codes, uniques = factorized(s)
    return lut([str(u).strip() == "" for u in uniques], True, bool)[codes]


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
    blank = blank_mask(s)
    codes, uniques = factorized(s)
    texts = pd.Series([u if isinstance(u, (pd.Timestamp, dt.date)) else str(u).strip() for u in uniques], dtype=object)
    parsed_u, _ = _utc_ns(pd.to_datetime(texts, utc=True, errors="coerce", format="ISO8601"))
    ints = lut(list(parsed_u.array.asi8), _NAT, np.int64)[codes]
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


def show_value(value: Any) -> str:
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


# --------------------------------------------------------------------------- sources


def read_table_file(path: Path, columns: Sequence[str] | None = None) -> pd.DataFrame:
    """CSV (all text, parsed later) or Parquet (types kept; strings as categoricals).

    Anything that stops the file from being read raises :class:`UsageSourceError`
    naming the file and what is wrong, never a reader's own exception.
    """
    suffix = path.suffix.lower()
    if suffix in (".parquet", ".pq"):
        import pyarrow as pa
        import pyarrow.parquet as pq

        from gpu_ops.cost.columns import parquet_columns

        try:
            schema = pq.read_schema(path)
            return arrow_to_frame(pq.read_table(path, columns=parquet_columns(schema.names, columns)))
        except (pa.ArrowException, OSError, ValueError) as exc:  # a corrupt or truncated file: name it
            raise UsageSourceError(path, f"not a readable Parquet file: {_first_line(exc)}") from None
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
            cols[name] = _categorical(chunked, n)
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


def _categorical(chunked: Any, n: int) -> Any:
    """A dictionary column (unified dictionaries) as a pandas Categorical."""
    chunks = chunked.chunks
    cats = chunks[0].dictionary.to_pylist() if chunks else []
    if len(set(cats)) != len(cats):  # a Categorical needs unique categories
        return pd.Series(chunked.cast(chunked.type.value_type).to_pandas(), copy=False).astype("category")
    codes = _concat([c.indices.fill_null(-1) if c.null_count else c.indices for c in chunks], np.int32 if len(cats) > 32000 else np.int16, n)
    return pd.Categorical.from_codes(codes, categories=cats)


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


def read_usage_files(patterns: Iterable[str], base_dir: Path | None = None, columns: Sequence[str] | None = None, row_numbers: bool = True) -> pd.DataFrame:
    """Read CSV/Parquet usage files (globs) as pandas frames (the oracle's reader, and the
    CLI's look for where usage is); rows carry the file name and 1-based row number.

    Each file is read once however many patterns match it. A pattern that matches
    nothing, or a file that cannot be read, becomes one file-level row (``FILE_ERROR``)
    that the engine quarantines; the other files are still read. With
    ``row_numbers=False`` no ``row`` column is built (the quarantine works rows out from
    positions). Bounded reads of a window go through :func:`gpu_ops.cost.read.read_files`.
    """
    return _read_files(patterns, base_dir, columns, "file", USAGE_REQUIRED, USAGE_COLUMNS, row_numbers)


def _read_files(
    patterns: Iterable[str], base_dir: Path | None, columns: Sequence[str] | None, source: str,
    required: Sequence[str], layout: Sequence[str], row_numbers: bool = True,
) -> pd.DataFrame:
    frames = []
    for path, problem in distinct_files(patterns, base_dir):
        try:
            if problem is not None:
                raise problem
            assert path is not None
            df = read_table_file(path, columns)
            raise_missing(path, df.columns, required, "usage" if source == "file" else source, layout)
        except UsageSourceError as exc:
            frames.append(source_problem(exc, source))
            continue
        bad_lines = df.attrs.pop("bad_lines", [])
        frames.append(usage_frame(df, path, 1 if row_numbers or bad_lines else None, [r for r, _ in bad_lines], source))
        if bad_lines:
            frames.append(line_problems(path, bad_lines, source))
    _number_all(frames)
    return concat_raw(frames)


def _number_all(frames: list[pd.DataFrame]) -> None:
    """Numbered files next to unnumbered ones: number them all."""
    if any("row" in f for f in frames) and not all("row" in f for f in frames if FILE_ERROR not in f):
        for f in frames:
            if "row" not in f and FILE_ERROR not in f:
                f["row"] = np.arange(1, len(f) + 1, dtype=np.int64)


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
            raise_missing(path, _column_names(path), required, kind, layout)
        except UsageSourceError as exc:
            problems.append(str(exc))
    return seen, problems


def _column_names(path: Path) -> list[str]:
    """The column names of a CSV header or a Parquet footer (a file-level error otherwise)."""
    import csv

    suffix = path.suffix.lower()
    if suffix in (".parquet", ".pq"):
        import pyarrow.parquet as pq

        try:
            return list(pq.read_schema(path).names)
        except Exception as exc:  # any reader error names the file
            raise UsageSourceError(path, f"not a readable Parquet file: {_first_line(exc)}") from None
    if suffix != ".csv":
        raise UsageSourceError(path, f"unsupported extension {suffix!r} (use .csv or .parquet)")
    try:
        with path.open(newline="", encoding="utf-8-sig") as f:
            names = next(csv.reader(f), None) or []
    except (UnicodeDecodeError, OSError, csv.Error) as exc:
        raise UsageSourceError(path, f"cannot be read as CSV: {_first_line(exc)}") from None
    if not names:
        raise UsageSourceError(path, "empty file (a CSV needs a header row)")
    return names


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
        merged: list[Any] = [{**b, **e} if isinstance(b := json_object(v), dict) else v for v, e in zip(base, extra)]
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


def json_object(text: Any) -> Any:
    """``labels`` text -> its dict, or a string saying why it is not a JSON object of labels."""
    try:
        value = json.loads(text)
    except (TypeError, ValueError) as exc:
        return f"not valid JSON ({exc}): {show_value(text)}"
    if not isinstance(value, dict) or any(isinstance(v, (dict, list)) for v in value.values()):
        return f"must be a JSON object of label names to values, got {show_value(text)}"
    return value


# --------------------------------------------------------------------------- validation


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



# --------------------------------------------------------------------------- inventory


def validate_usage(raw: pd.DataFrame, prices: PriceMatrix, required: Sequence[str] = ("team",)) -> Validated:
    """Deprecated: usage is checked by the one engine (:func:`gpu_ops.cost.engine.validate`).

    Kept so that callers of ``gpu_ops.validate_usage`` keep working: the same return
    shape (good rows typed, canonical and priced; the quarantine), computed by the engine
    and its rule book (``required=("node",)``: the node inventory's rules). The pandas
    reader it was lives on as the tests' oracle."""
    from gpu_ops.cost.engine import validate
    from gpu_ops.cost.read import INVENTORY, USAGE

    warnings.warn(
        "gpu_ops.validate_usage is deprecated; usage is checked by the cost engine (gpu_ops.cost.engine.validate)",
        DeprecationWarning, stacklevel=2,
    )
    got = validate(raw, prices, kind=INVENTORY if tuple(required) == ("node",) else USAGE)
    return Validated(got.rows, got.quarantine)
