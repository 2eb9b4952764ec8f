"""The pandas file reader the package had before the one engine, kept as the oracle's
reader: CSV and Parquet usage files (globs) as raw pandas frames with provenance, each
file once, a pattern or file that gives nothing as one ``file_error`` row, CSV lines that
cannot be split as rows of their own. Independent of :mod:`gpu_ops.flows.cost.read` (the
package's one reader), so that the differential tests compare two readers as well as two
rule books. Nothing in ``gpu_ops`` imports this module."""

from __future__ import annotations

import json
import re
import warnings
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from gpu_ops.flows.cost.read import USAGE_COLUMNS, USAGE_REQUIRED, UsageSourceError, distinct_files, raise_missing, require_usage_columns
from gpu_ops.flows.cost.frames import utc_series
from gpu_ops.flows.cost.usage import PROVENANCE_COLUMNS, const_column, json_object

# A file or pattern that yields no rows, or a CSV line that cannot be split: a raw row with
# the reason in this column.
FILE_ERROR = "file_error"
# List, struct or map cells of a Parquet file: the reader blanks them and records, per
# row, {field: what the cell held} here; the oracle quarantines those rows.
CELL_ERRORS = "cell_errors"

_NAT = np.iinfo(np.int64).min
_UNIT_NS = {"s": 10**9, "ms": 10**6, "us": 10**3, "ns": 1}


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def read_table_file(path: Path, columns: Sequence[str] | None = None) -> pd.DataFrame:
    """CSV (all text, parsed later) or Parquet (types kept; strings as categoricals).

    Anything that stops the file from being read raises :class:`UsageSourceError`
    naming the file and what is wrong, never a reader's own exception.
    """
    suffix = path.suffix.lower()
    if suffix in (".parquet", ".pq"):
        import pyarrow as pa
        import pyarrow.parquet as pq

        from gpu_ops.domain.cost.columns import parquet_columns

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
    positions). Bounded reads of a window go through :func:`gpu_ops.flows.cost.read.read_files`.
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
