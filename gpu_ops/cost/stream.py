"""Priced usage from large files in memory bounded by ``usage.batch_rows``, not by the input.

Files are read in record batches (Parquet: only the needed columns, text columns
dictionary-decoded; CSV: Arrow's streaming reader). Each batch goes through the one
validation, :func:`~gpu_ops.cost.usage.validate_usage` (rows numbered from the batch's
place in its file, so a quarantined row is named exactly as a whole-file read names it),
then the same day split and pricing as every other path, and is summed into *cells*:
one row per (key columns, price, on-demand price) with its GPU-hours
(:func:`~gpu_ops.cost.attribution.priced_cells`). The cells of all batches are summed and
priced once (:func:`~gpu_ops.cost.attribution.cell_pieces`): a few thousand rows that
:func:`~gpu_ops.cost.attribution.attribute`, the idle rows and the fleet totals sum to
the same figures as the pieces they stand for.

Batches are validated on worker threads while the next ones are decoded: Arrow decoding
and numpy's large-array loops run without the GIL, so two cores are both used.

One day of Parquet files is first offered to the DuckDB engine (:mod:`gpu_ops.cost.engine`),
which gives the same cells and quarantine several times faster; the batches here answer
whatever it does not model.
"""

from __future__ import annotations

import csv
import logging
import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pandas as pd

from gpu_ops.cost.attribution import DAY_NS, cell_pieces, combine_cells, price_pieces, priced_cells, split_by_day, utc
from gpu_ops.cost.pipeline import PricedUsage, load_inventory, with_idle
from gpu_ops.cost.columns import parquet_columns
from gpu_ops.cost.pricing import PriceMatrix
from gpu_ops.cost.sources import SourceSet
from gpu_ops.cost.usage import (
    ATTRIBUTE_COLUMNS,
    UsageSourceError,
    _distinct_files,
    arrow_to_frame,
    concat_raw,
    empty_quarantine,
    line_problems,
    quarantine_in_window,
    require_usage_columns,
    source_problem,
    SeenRows,
    usage_frame,
    validate_usage,
)

DEFAULT_BATCH_ROWS = 262_144
_IDENTITY_ONLY = frozenset(ATTRIBUTE_COLUMNS) - {"team"}  # team must not be blank: validated as text
_PRICING = ["start", "end", "gpu_count", "gpu_share", "price_per_gpu_hour", "on_demand_price_per_gpu_hour"]


def streamable(sources: SourceSet) -> bool:
    """Files only: rows from several sources are matched across them (one pass cannot)."""
    return bool(sources.usage_files) and sources.count == 1


# --------------------------------------------------------------------------- reading


def record_batches(path: Path, columns: Sequence[str] | None, batch_rows: int) -> Iterator[tuple[Any, int, list[tuple[int, str]]]]:
    """(Arrow record batch, 1-based row number of its first row, CSV lines skipped in its
    stretch as (data row, reason)) for one usage file."""
    suffix = path.suffix.lower()
    if suffix in (".parquet", ".pq"):
        yield from _parquet_batches(path, columns, batch_rows)
    elif suffix == ".csv":
        yield from _csv_batches(path, columns, batch_rows)
    else:
        raise UsageSourceError(path, f"unsupported extension {suffix!r} (use .csv or .parquet)")


def usage_parquet(path: Path, schema: Any, present: Sequence[str]) -> Any:
    """A usage Parquet file opened as every reader of its rows opens it (the batches here,
    the DuckDB engine's read-back of quarantined rows), so that rows read either way are
    the same values."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    # Text columns arrive as dictionaries: validation then works once per distinct value.
    # pod is as distinct as the rows: read plainly, not as a dictionary as large as the batch.
    text = [c for c in present if c != "pod" and (pa.types.is_string(schema.field(c).type) or pa.types.is_large_string(schema.field(c).type))]
    # Column chunks are read through a small buffer, not whole: memory follows batch_rows.
    return pq.ParquetFile(path, read_dictionary=text, pre_buffer=False, buffer_size=1 << 20)


def _parquet_batches(path: Path, columns: Sequence[str] | None, batch_rows: int) -> Iterator[tuple[Any, int, list[tuple[int, str]]]]:
    import pyarrow.parquet as pq

    try:
        schema = pq.read_schema(path)
        present = parquet_columns(schema.names, columns)
        require_usage_columns(path, present)
        pf = usage_parquet(path, schema, present)
    except UsageSourceError:
        raise
    except Exception as exc:  # a corrupt file: name it
        raise UsageSourceError(path, f"not a readable Parquet file: {str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__}") from None
    first = 1
    batches = pf.iter_batches(batch_size=batch_rows, columns=present, use_threads=True)
    while True:
        try:
            batch = next(batches)
        except StopIteration:
            return
        except Exception as exc:
            raise UsageSourceError(path, f"not a readable Parquet file (after row {first - 1}): {exc}") from None
        yield batch, first, []
        first += batch.num_rows


def _csv_batches(path: Path, columns: Sequence[str] | None, batch_rows: int) -> Iterator[tuple[Any, int, list[tuple[int, str]]]]:
    import pyarrow as pa
    import pyarrow.csv as pacsv

    try:
        with path.open(newline="", encoding="utf-8-sig") as f:  # a byte-order mark is not part of the first name
            header = next(csv.reader(f), None)
    except UnicodeDecodeError as exc:
        raise UsageSourceError(path, f"not UTF-8 text (byte {exc.object[exc.start:exc.start + 1]!r} at offset {exc.start})") from None
    except (OSError, csv.Error) as exc:
        raise UsageSourceError(path, f"cannot be read: {exc}") from None
    if not header:
        raise UsageSourceError(path, "empty file (a CSV needs a header row)")
    present = [c for c in header if columns is None or c in columns or c.startswith("label:")]
    require_usage_columns(path, present)
    # Everything is text, as a whole-file read gives it (validation parses it); a blank
    # cell is missing. Dictionaries: each distinct value is parsed once.
    text = pa.dictionary(pa.int32(), pa.string())
    opts = pacsv.ConvertOptions(column_types={c: text for c in header}, include_columns=present, strings_can_be_null=True, null_values=[""], quoted_strings_can_be_null=True)
    # A block is about batch_rows rows of a typical usage file (~160 bytes a row). One
    # thread, so that a line with the wrong number of fields is known by its number.
    read = pacsv.ReadOptions(block_size=max(1 << 16, min(batch_rows * 160, 1 << 30)), use_threads=False)
    skipped: list[tuple[int, str]] = []

    def bad_line(row: Any) -> str:
        skipped.append((row.number - 1, f"line {row.number}: expected {row.expected_columns} fields, saw {row.actual_columns}; the line was not read"))
        return "skip"

    first = 1
    try:
        reader = pacsv.open_csv(path, read_options=read, parse_options=pacsv.ParseOptions(invalid_row_handler=bad_line), convert_options=opts)
        for batch in reader:
            mine: list[tuple[int, str]] = []  # the skipped lines among this batch's rows
            while skipped and skipped[0][0] < first + batch.num_rows + len(mine):
                mine.append(skipped.pop(0))
            yield batch, first, mine
            first += batch.num_rows + len(mine)
        if skipped:  # bad lines after the last good one
            yield pa.RecordBatch.from_pylist([], schema=reader.schema), first, list(skipped)
    except (pa.ArrowException, OSError) as exc:
        what = "not UTF-8 text" if "UTF8" in str(exc) else f"not a readable CSV file: {exc}"
        raise UsageSourceError(path, f"{what} (after data row {first - 1})") from None


def raw_batches(sources: SourceSet, columns: Sequence[str] | None, batch_rows: int) -> Iterator[tuple[Any, Any, int, list[tuple[int, str]]]]:
    """(batch, path, first row, skipped lines) per batch of each file (once per real path);
    (None, UsageSourceError, 0, []) for a pattern matching nothing or a file that breaks."""
    for path, problem in _distinct_files(sources.usage_files, sources.base_dir):
        if problem is not None:
            yield None, problem, 0, []
            continue
        try:
            for batch, first, skipped in record_batches(path, columns, batch_rows):  # type: ignore[arg-type]
                yield batch, path, first, skipped
        except UsageSourceError as exc:
            yield None, exc, 0, []


# --------------------------------------------------------------------------- pricing


class _Window:
    def __init__(self, prices: PriceMatrix, window_start: Any, window_end: Any, as_of: Any, keys: Sequence[str]):
        self.prices, self.keys = prices, list(keys)
        self.ws, self.we, self.as_of = utc(window_start), utc(window_end), utc(as_of)
        hi = min(self.we.value, self.as_of.value)
        # One day: rows outside it keep zero hours instead of being copied out (see split_by_day).
        self.one_day = (hi - 1) // DAY_NS == self.ws.value // DAY_NS
        self.cell_keys = self.keys if self.one_day else [*self.keys, "day"]
        self.turns = _Turns((self.ws.value, self.we.value))
        # Columns that only tell rows apart travel as hashes: a column as distinct as its
        # rows (pod) is never made into categories.
        self.identity = _IDENTITY_ONLY.difference(self.keys)

    def cells(self, seq: int, batch: Any, path: Any, first: int, skipped: list[tuple[int, str]]) -> tuple[pd.DataFrame | None, pd.DataFrame]:
        """One batch -> (its priced cells, its quarantined rows inside the window); a file
        that could not be read -> (None, its file-level quarantine row)."""
        import pyarrow as pa

        turn = self.turns.take(seq)
        try:
            if batch is None:
                return None, validate_usage(source_problem(path), self.prices).quarantine
            raw = usage_frame(arrow_to_frame(pa.Table.from_batches([batch])), path, first, [r for r, _ in skipped])
            if skipped:
                raw = concat_raw([raw, line_problems(path, skipped)])
            v = validate_usage(raw, self.prices, seen=turn, identity=self.identity)  # type: ignore[arg-type]  # a _Turn stands in for SeenRows
        finally:
            turn.done()
        rows = v.rows[[c for c in v.rows.columns if c in set(self.keys) | set(_PRICING)]]
        pieces = price_pieces(split_by_day(rows, self.ws, self.we, self.as_of, drop_empty=not self.one_day), per_row=False)
        return priced_cells(pieces, self.cell_keys), quarantine_in_window(v.quarantine, self.ws, self.we)

    def priced(self, parts: Sequence[tuple[pd.DataFrame | None, pd.DataFrame]]) -> PricedUsage:
        cells = cell_pieces(combine_cells([c for c, _ in parts if c is not None], self.cell_keys))
        cells = cells[cells["gpu_hours"].to_numpy() != 0].reset_index(drop=True)
        cells["day"] = pd.to_datetime(cells["day"], utc=True) if not self.one_day else pd.Series([self.ws] * len(cells), dtype="datetime64[ns, UTC]")
        quarantine = [q for _, q in parts if len(q)]
        q = pd.concat(quarantine, ignore_index=True) if quarantine else empty_quarantine()
        return PricedUsage(cells, q, self.ws, self.we, self.as_of)


class _Turns:
    """Batches take their turn at the identical-row check in reading order, so that the
    first copy of a row is the one counted whichever worker thread finishes first."""

    def __init__(self, window: tuple[int, int]) -> None:
        self.seen = SeenRows(window)
        self.cond = threading.Condition()
        self.next = 0

    def take(self, seq: int) -> "_Turn":
        return _Turn(self, seq)


class _Turn:
    """What ``validate_usage(seen=...)`` calls for one batch; ``done()`` ends the turn
    whether or not the batch got that far (a batch that failed must not stall the rest)."""

    def __init__(self, turns: _Turns, seq: int):
        self.turns, self.seq, self.finished = turns, seq, False

    def check_and_add(self, hashes: Any, locations: Any, rows: Any, times: Any = None) -> Any:
        with self.turns.cond:
            self.turns.cond.wait_for(lambda: self.turns.next == self.seq)
            try:
                return self.turns.seen.check_and_add(hashes, locations, rows, times)
            finally:
                self._advance()

    def done(self) -> None:
        with self.turns.cond:
            if not self.finished:
                self.turns.cond.wait_for(lambda: self.turns.next == self.seq)
                self._advance()

    def _advance(self) -> None:
        self.finished = True
        self.turns.next += 1
        self.turns.cond.notify_all()


def stream_priced(
    sources: SourceSet,
    prices: PriceMatrix,
    window_start: Any,
    window_end: Any,
    as_of: Any,
    keys: Sequence[str],
    columns: Sequence[str] | None = None,
    batch_rows: int = DEFAULT_BATCH_ROWS,
    store: Any = None,
    workers: int = 2,
    engine: str = "auto",
) -> PricedUsage:
    """Priced usage of the file sources for ``[window_start, window_end)``, as cells keyed
    by ``keys`` (plus ``node`` with an inventory, for its idle rows), with idle rows and
    the quarantine. ``columns``: what to read from the files (None: everything).
    ``engine``: ``duckdb`` (:mod:`gpu_ops.cost.engine`; an error where it does not apply),
    ``arrow`` (the batches below) or ``auto`` (DuckDB where it applies and is installed)."""
    if not streamable(sources):
        raise ValueError("stream_priced reads file sources only (no ledger or Kubernetes source)")
    keys = list(dict.fromkeys([*keys, *(["node"] if sources.has_inventory else [])]))
    window = _Window(prices, window_start, window_end, as_of, keys)
    _no_huge_pages()
    parts = _engine_parts(engine, window, sources, columns, batch_rows)
    priced = window.priced(parts if parts is not None else _batch_parts(window, sources, columns, batch_rows, workers))
    return with_idle(priced, load_inventory(sources, store), prices)


def _engine_parts(engine: str, window: _Window, sources: SourceSet, columns: Sequence[str] | None, batch_rows: int) -> list[tuple[pd.DataFrame, pd.DataFrame]] | None:
    if engine == "arrow":
        return None
    from gpu_ops.cost.engine import NotApplicable, day_parts

    try:
        return day_parts(sources, window.prices, window.ws, window.we, window.as_of, window.keys, columns, max(1, int(batch_rows)), window.identity)
    except NotApplicable as exc:
        if engine == "duckdb":
            raise ValueError(f"the DuckDB engine does not apply to this read: {exc} (use engine auto or arrow)") from None
        return None
    except Exception as exc:  # a defect of the engine must not cost the answer: the batch reader gives it
        if engine == "duckdb":
            raise
        logging.getLogger(__name__).warning("the DuckDB engine failed (%s: %s); summing with the batch reader instead", type(exc).__name__, exc)
        return None


def _batch_parts(window: _Window, sources: SourceSet, columns: Sequence[str] | None, batch_rows: int, workers: int) -> list[tuple[pd.DataFrame | None, pd.DataFrame]]:
    parts: list[tuple[pd.DataFrame | None, pd.DataFrame]] = []
    with ThreadPoolExecutor(max(1, workers), thread_name_prefix="gpu_ops-batch") as pool:
        pending: list[Future] = []
        for seq, (batch, path, first, skipped) in enumerate(raw_batches(sources, columns, max(1, int(batch_rows)))):
            pending.append(pool.submit(window.cells, seq, batch, path, first, skipped))
            # At most workers + 1 batches decoded and waiting: memory is bounded by batch_rows.
            while len(pending) > workers:
                parts.append(pending.pop(0).result())
        parts.extend(f.result() for f in pending)
    return parts


def _no_huge_pages() -> None:
    """Batches reuse memory of the same size: numpy's transparent-huge-page advice only
    makes the kernel zero 2 MB pages for each of them (a quarter of the time at 10M rows)."""
    try:
        from numpy._core.multiarray import _set_madvise_hugepage  # type: ignore[attr-defined]
    except ImportError:  # numpy < 2
        return
    _set_madvise_hugepage(False)
