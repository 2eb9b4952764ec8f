"""The cloud bill: AWS Cost and Usage Report (CUR 2.0) lines of GPU instances, per day.
Pure logic, no Dagster.

Design: docs/concepts/cost-sources.md#the-cloud-bill-cur-20
"""

from __future__ import annotations

import csv
import glob as globmod
import gzip
import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from gpu_ops.domain.compute.catalog import CATALOG
from gpu_ops.domain.config import gpu_ops_home
from gpu_ops.flows.cost.inventory import load_inventory
from gpu_ops.flows.cost.read import first_line, handler_failures, header_names, ragged_line, write_without_ragged_lines
from gpu_ops.domain.cost.sources import SourceSet
from gpu_ops.flows.cost.frames import QUARANTINE_COLUMNS, empty_quarantine
from gpu_ops.errors import BillingSourceError
from gpu_ops.domain.formatting import not_utf8
from gpu_ops.domain.paths import NOT_REGULAR, PathNotUsable, path_kind

START = "line_item_usage_start_date"
END = "line_item_usage_end_date"
RESOURCE = "line_item_resource_id"
USAGE_TYPE = "line_item_usage_type"
LINE_TYPE = "line_item_line_item_type"
UNBLENDED = "line_item_unblended_cost"
NET = "line_item_net_unblended_cost"
SP_EFFECTIVE = "savings_plan_savings_plan_effective_cost"
RI_EFFECTIVE = "reservation_effective_cost"
INSTANCE_TYPE = "product_instance_type"
PRICING_TERM = "pricing_term"
CURRENCY = "line_item_currency_code"
LINE_ID = "identity_line_item_id"
INTERVAL = "identity_time_interval"
CUR_COLUMNS = (START, END, RESOURCE, USAGE_TYPE, LINE_TYPE, UNBLENDED, NET, SP_EFFECTIVE, RI_EFFECTIVE, INSTANCE_TYPE, PRICING_TERM, CURRENCY, LINE_ID, INTERVAL)
REQUIRED = (START, RESOURCE, USAGE_TYPE, UNBLENDED)
BILLED_COLUMNS = ("day", "instance_id", "instance_type", "pricing_term", "billed_usd", "lines")
ADJUSTMENT_COLUMNS = ("day", "instance_id", "line_type", "amount", "location", "row")
# Where each index row comes from (not CUR columns): file, row in it, the file's version,
# the parsed start, and for a line that cannot be read its field and reason ("" otherwise).
PROVENANCE = ("location", "row", "file_version", "start_ns", "problem_field", "problem")
INDEX_VERSION = "2"
_INSTANCE_HOURS = r"(?:^|:|-)(?:BoxUsage|SpotUsage|DedicatedUsage|HeavyUsage|HostUsage)(?::|$)"
_INSTANCE_ID = re.compile(r"^i-[0-9a-f]{8,17}$")
_DISCOUNTS = ("EdpDiscount", "PrivateRateDiscount", "BundledDiscount", "DistributorDiscount")
_NOT_INSTANCE_COST = ("SavingsPlanNegation", "SavingsPlanRecurringFee", "SavingsPlanUpfrontFee", "RIFee", "Fee", "Tax")
_KNOWN_TYPES = ("Usage", "SavingsPlanCoveredUsage", "DiscountedUsage", "Refund", "Credit", *_DISCOUNTS)
_NAT = np.iinfo(np.int64).min
GPU_INSTANCE_TYPES = {t: (g, n) for g, spec in CATALOG.items() for t, n in spec.instance_types.items()}


# --------------------------------------------------------------------------- reading


def cur_files(patterns: Iterable[str], base_dir: Path | None = None) -> list[Path]:
    """The CUR files a glob (or file, or folder) names; none is an error naming the pattern."""
    out: list[Path] = []
    for pattern in patterns:
        p = Path(pattern).expanduser()
        if not p.is_absolute() and base_dir is not None:
            p = base_dir / p
        try:
            folder = path_kind(p) == "dir"
        except PathNotUsable as exc:
            raise BillingSourceError(f"{p}: {exc}") from None
        if folder:
            found = sorted(x for x in p.iterdir() if _readable_name(x))
        else:
            found = sorted(Path(x) for x in globmod.glob(str(p), recursive=True))
        if not found:
            raise BillingSourceError(f"{p}: no CUR file matches {pattern!r}")
        if special := [f for f in found if path_kind(f) == "special"]:
            raise BillingSourceError(f"{special[0]}: {NOT_REGULAR}")
        out += [f for f in found if f not in out]
    return out


def _readable_name(p: Path) -> bool:
    return p.name.endswith((".parquet", ".csv", ".csv.gz"))


def _csv_header(path: Path) -> list[str]:
    opener: Any = gzip.open if path.name.endswith(".gz") else open
    try:
        with opener(path, "rb") as f:  # the header line only: a bad byte further down costs its line
            return header_names(f) or []
    except UnicodeDecodeError as exc:
        raise BillingSourceError(f"{path}: {not_utf8(exc)}") from None
    except (OSError, EOFError, csv.Error) as exc:  # a .gz that is not gzip, a NUL in the header
        raise BillingSourceError(f"{path}: cannot be read: {exc}") from None


class _Unhanded(Exception):
    """Arrow's reader could not hand a line of the wrong number of fields over (its bytes
    are not UTF-8): the file is read again without such lines (:func:`_read_lines`)."""


def _csv_batches(path: Path, source: Path, cols: list[str], batch_rows: int, skipped: list[tuple[int, str]]) -> Iterator[Any]:
    """``cols`` of the CSV ``source`` in batches, cells as bytes (a cell that is not UTF-8
    costs its line: :func:`_as_text`); each line of the wrong number of fields appended to
    ``skipped`` (data row, reason) as the reader meets it, and left out."""
    def bad_line(row: Any) -> str:
        skipped.append(ragged_line(row.number - 1, row.expected_columns, row.actual_columns))
        return "skip"

    read = pacsv.ReadOptions(block_size=max(1 << 20, min(batch_rows * 64, 1 << 26)), use_threads=False)
    convert = pacsv.ConvertOptions(include_columns=cols, column_types={c: pa.binary() for c in cols}, strings_can_be_null=False)
    with handler_failures(bad_line) as failed:
        try:
            yield from pacsv.open_csv(source, read_options=read, parse_options=pacsv.ParseOptions(invalid_row_handler=bad_line), convert_options=convert)
        except (pa.ArrowException, OSError, EOFError) as exc:
            if failed:
                raise _Unhanded from None
            raise BillingSourceError(f"{path}: not a readable CSV file: {first_line(exc)}") from None


def _parquet_batches(path: Path, batch_rows: int) -> Iterator[Any]:
    try:
        pf = pq.ParquetFile(path)
        names = list(pf.schema_arrow.names)
        _require(path, names)
        yield from pf.iter_batches(batch_size=batch_rows, columns=[c for c in CUR_COLUMNS if c in names])
    except (pa.ArrowException, OSError) as exc:
        raise BillingSourceError(f"{path}: not a readable Parquet file: {first_line(exc)}") from None


def _require(path: Path, names: list[str]) -> None:
    missing = [c for c in REQUIRED if c not in names]
    if missing:
        raise BillingSourceError(f"{path}: missing CUR column(s) {', '.join(missing)}")


def _as_text(col: Any) -> tuple[Any, dict[int, str]]:
    """A column as text, and position -> reason of each cell of a binary column that is not
    UTF-8 (blanked in the text): one cast when every cell is UTF-8, Python only for a
    batch where one is not."""
    try:
        if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
            col.validate(full=True)  # Parquet text is not checked as it is read
        return pc.cast(col, pa.string()), {}
    except pa.ArrowInvalid:
        col = pc.cast(col, pa.large_binary() if pa.types.is_large_string(col.type) else pa.binary())
    bad: dict[int, str] = {}
    for i, value in enumerate(col.to_pylist()):
        try:
            value is None or value.decode("utf-8")
        except UnicodeDecodeError as exc:
            bad[i] = not_utf8(exc)
    blanked = pc.if_else(pa.array(np.isin(np.arange(len(col)), list(bad))), pa.scalar(b"", col.type), col)
    return pc.cast(blanked, pa.string()), bad


def _relevant(batch: Any) -> Any:
    """Instance-hour lines of an ``i-…`` resource (the rest of the bill is never kept), and
    lines whose resource or usage type is not UTF-8 (which cannot be told apart: quarantined)."""
    (resource, bad_resource), (usage, bad_usage) = _as_text(batch.column(RESOURCE)), _as_text(batch.column(USAGE_TYPE))
    keep = pc.and_(pc.match_substring_regex(resource, _INSTANCE_ID.pattern), pc.match_substring_regex(usage, _INSTANCE_HOURS))
    keep = np.asarray(pc.fill_null(keep, False), dtype=bool)
    keep[[*bad_resource, *bad_usage]] = True
    return batch.filter(pa.array(keep))


def _uniform(batch: Any, location: str, rows: np.ndarray, version: int) -> Any:
    """A batch as string columns (every CUR column, blank where absent) plus provenance,
    the parsed start (``start_ns``) and, for a line that cannot be read, the field and
    reason (a cell that is not UTF-8 is blanked and named): Arrow all the way, no Python
    object per cell."""
    n = batch.num_rows
    arrays, start_ns = [], None
    problems: dict[int, tuple[str, str]] = {}
    for c in CUR_COLUMNS:
        if c not in batch.schema.names:
            arrays.append(pa.array([""] * n, pa.string()))
            continue
        col = batch.column(c)
        if c == START and pa.types.is_timestamp(col.type):
            ts = pc.cast(col, pa.timestamp("ns", tz="UTC") if col.type.tz else pa.timestamp("ns"))
            start_ns = np.asarray(ts.cast(pa.int64()).fill_null(_NAT), dtype=np.int64)
        text, bad = _as_text(col)
        for i, reason in bad.items():
            problems.setdefault(i, (c, reason))
        arrays.append(pc.fill_null(text, ""))
    if start_ns is None:
        start_ns = _parse_start(arrays[CUR_COLUMNS.index(START)])
    fields = [problems[i][0] if i in problems else "" for i in range(n)] if problems else [""] * n
    reasons = [problems[i][1] if i in problems else "" for i in range(n)] if problems else [""] * n
    arrays += [pa.array([location] * n, pa.string()), pa.array(rows, pa.int64()), pa.array(np.full(n, version, np.int64)), pa.array(start_ns, pa.int64()),
               pa.array(fields, pa.string()), pa.array(reasons, pa.string())]
    return pa.RecordBatch.from_arrays(arrays, names=[*CUR_COLUMNS, *PROVENANCE])


def _unread_lines(skipped: list[tuple[int, str]], location: str, version: int) -> Any:
    """Index rows for lines the reader left out (wrong number of fields): blank, named ``<line>``."""
    n = len(skipped)
    arrays = [pa.array([""] * n, pa.string()) for _ in CUR_COLUMNS]
    arrays += [pa.array([location] * n, pa.string()), pa.array([r for r, _ in skipped], pa.int64()), pa.array(np.full(n, version, np.int64)),
               pa.array(np.full(n, _NAT, np.int64)), pa.array(["<line>"] * n, pa.string()), pa.array([reason for _, reason in skipped], pa.string())]
    return pa.RecordBatch.from_arrays(arrays, names=[*CUR_COLUMNS, *PROVENANCE])


def _frame(table: Any) -> pd.DataFrame:
    """Index rows (Arrow) -> the text frame :func:`gpu_bill` reads."""
    out = table.to_pandas()
    for c in (*CUR_COLUMNS, "location"):
        out[c] = out[c].astype(object)
    return out


def _parse_start(text: Any) -> np.ndarray:
    """ISO 8601 texts (an Arrow string array, or objects) -> UTC ns, the NaT sentinel where
    unparseable or outside what a time can hold; each distinct text parsed once."""
    encoded = pc.dictionary_encode(pa.array(text, pa.string()) if not isinstance(text, pa.Array) else text)
    uniques = pd.Series(encoded.dictionary.to_pylist(), dtype=object).str.strip()
    parsed = pd.to_datetime(uniques, utc=True, errors="coerce", format="ISO8601")
    held = parsed.notna() & (parsed >= pd.Timestamp.min.tz_localize("UTC")) & (parsed <= pd.Timestamp.max.tz_localize("UTC"))
    lut = np.append(np.where(held, parsed.where(held, pd.Timestamp(0, tz="UTC")).dt.as_unit("ns").array.asi8, _NAT).astype(np.int64) if len(parsed) else np.zeros(0, np.int64), _NAT)
    codes = np.asarray(encoded.indices.fill_null(len(lut) - 1), dtype=np.int64)
    return lut[codes]


class _RowNumbers:
    """Data-row numbers (1-based) of a file's batches, passing over the lines the reader left out."""

    def __init__(self, skipped: list[tuple[int, str]]):
        self.skipped, self.next = skipped, 1

    def take(self, n: int) -> np.ndarray:
        pending = [r for r, _ in self.skipped if r >= self.next]
        span = np.arange(self.next, self.next + n + len(pending), dtype=np.int64)
        rows = span[~np.isin(span, pending)][:n]
        if n:
            self.next = int(rows[-1]) + 1
        return rows


def _file_lines(path: Path, batch_rows: int, clean: Path | None = None, skipped: list[tuple[int, str]] | None = None) -> Iterator[Any]:
    """The relevant lines of one file (Arrow batches from :func:`_uniform`), with their row
    numbers (1-based), then the lines that could not be read. ``clean``: read this copy of
    a CSV instead (``skipped``: the lines it leaves out)."""
    version = path.stat().st_mtime_ns
    skipped = [] if skipped is None else skipped
    if path.name.endswith(".parquet"):
        batches = _parquet_batches(path, batch_rows)
    else:
        names = _csv_header(path)
        _require(path, names)
        batches = _csv_batches(path, clean or path, [c for c in CUR_COLUMNS if c in names], batch_rows, skipped)
    numbers, shown = _RowNumbers(skipped), 0
    for batch in batches:
        numbered = batch.append_column("__row", pa.array(numbers.take(batch.num_rows)))
        kept = _relevant(numbered)
        if kept.num_rows:
            yield _uniform(kept.drop_columns(["__row"]), str(path), np.asarray(kept.column("__row"), dtype=np.int64), version)
        if len(skipped) > shown:
            yield _unread_lines(skipped[shown:], str(path), version)
            shown = len(skipped)
    if len(skipped) > shown:
        yield _unread_lines(skipped[shown:], str(path), version)


def _read_lines(path: Path, batch_rows: int, consume: Any, restart: Any = None) -> Any:
    """``consume(lines of path)``; when Arrow's reader cannot hand a line of the wrong number
    of fields over, ``restart()`` and ``consume`` a copy of the CSV without such lines
    (written to a temporary file, field by field: memory stays a batch)."""
    try:
        return consume(_file_lines(path, batch_rows))
    except _Unhanded:
        pass
    if restart is not None:
        restart()
    opener: Any = gzip.open if path.name.endswith(".gz") else open
    skipped: list[tuple[int, str]] = []
    with tempfile.TemporaryDirectory(prefix="gpu_ops-cur-") as tmp:
        clean = Path(tmp) / "clean.csv"
        with opener(path, "rt", encoding="utf-8-sig", errors="surrogateescape", newline="") as src, clean.open("w", encoding="utf-8", errors="surrogateescape", newline="") as out:
            try:
                write_without_ragged_lines(src, len(_csv_header(path)), skipped, out)
            except csv.Error as exc:
                raise BillingSourceError(f"{path}: not a readable CSV file: {exc}") from None
        return consume(_file_lines(path, batch_rows, clean, skipped))


def read_cur(patterns: Iterable[str], base_dir: Path | None = None, batch_rows: int = 16_384) -> pd.DataFrame:
    """Every instance-hour line of the CUR files (CSV or Parquet) as text, with file and row.
    (:class:`CurIndex` reads one day of them; this reads them all, for small bills and tests.)"""
    batches = [b for path in cur_files(patterns, base_dir) for b in _read_lines(path, batch_rows, list)]
    return _frame(pa.Table.from_batches(batches)) if batches else _empty_lines()


def _empty_lines() -> pd.DataFrame:
    out = pd.DataFrame({c: pd.Series([], dtype=object) for c in (*CUR_COLUMNS, "location")})
    for c in ("row", "file_version", "start_ns"):
        out[c] = pd.Series([], dtype=np.int64)
    for c in ("problem_field", "problem"):
        out[c] = pd.Series([], dtype=object)
    return out


def _write_days(folder: Path, lines: Iterator[Any]) -> list[str]:
    """Index batches into ``folder``: one Parquet file per UTC day of their start
    (``unknown``: no readable start). Returns the days written."""
    writers: dict[str, Any] = {}
    try:
        for batch in lines:
            ns = np.asarray(batch.column("start_ns"), dtype=np.int64)
            day = np.where(ns == _NAT, -1, ns // 86_400_000_000_000)
            for d in np.unique(day):
                name = "unknown" if d < 0 else f"{np.datetime64(int(d), 'D')}"
                if name not in writers:
                    writers[name] = pq.ParquetWriter(folder / f"{name}.parquet", batch.schema)
                writers[name].write_batch(batch.filter(pa.array(day == d)))
    finally:
        for w in writers.values():
            w.close()
    return sorted(writers)


class CurIndex:
    """One indexed read per CUR file: its instance-hour lines, one Parquet file per UTC day.

    ``folder/<key>/<YYYY-MM-DD>.parquet`` (``unknown.parquet``: lines whose start cannot be
    read), ``key`` from the file's resolved path, size and modification time: a changed or
    redelivered file is indexed anew; an unchanged one never again.
    """

    def __init__(self, folder: Path, batch_rows: int = 16_384):
        self.folder, self.batch_rows = Path(folder), batch_rows

    def _key(self, path: Path) -> Path:
        st = path.stat()
        digest = hashlib.sha256(f"{INDEX_VERSION}|{path.resolve()}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[:24]
        return self.folder / digest

    def build(self, path: Path) -> Path:
        """The index of ``path`` (built now if it is missing): one streaming read."""
        where = self._key(path)
        if (where / "_done").exists():
            return where
        tmp = where.with_name(where.name + f".tmp{os.getpid()}")

        def empty() -> None:
            shutil.rmtree(tmp, ignore_errors=True)
            try:
                tmp.mkdir(parents=True)
            except OSError as exc:  # a file where a folder should be, a folder this user cannot write
                raise BillingSourceError(
                    f"cannot keep the CUR index in {self.folder} (usage.billing.index_path): {exc.strerror or exc}; "
                    "point usage.billing.index_path at a folder this user can write (gpu-ops validate checks it)"
                ) from None

        empty()
        days = _read_lines(path, self.batch_rows, lambda lines: _write_days(tmp, lines), restart=empty)
        (tmp / "_done").write_text(json.dumps({"file": str(path.resolve()), "days": days}))
        if where.exists() and not (where / "_done").exists():
            shutil.rmtree(where, ignore_errors=True)  # a build that was interrupted
        try:
            tmp.rename(where)
        except OSError:  # another process finished the same index first: use it
            shutil.rmtree(tmp, ignore_errors=True)
        self._forget_older_versions(path, where)
        return where

    def _forget_older_versions(self, path: Path, current: Path) -> None:
        """Delete the indexes of earlier versions of ``path`` (the folder holds one per file)."""
        for done in self.folder.glob("*/_done"):
            if done.parent == current:
                continue
            try:
                same = json.loads(done.read_text()).get("file") == str(path.resolve())
            except (OSError, ValueError):
                continue
            if same:
                shutil.rmtree(done.parent, ignore_errors=True)

    def day_lines(self, files: Iterable[Path], day: Any) -> pd.DataFrame:
        """The lines of every file that start on ``day`` (UTC), and those whose start is unreadable."""
        name = f"{pd.Timestamp(day):%Y-%m-%d}"
        frames = []
        for path in files:
            where = self.build(Path(path))
            for part in (where / f"{name}.parquet", where / "unknown.parquet"):
                if part.exists():
                    frames.append(_frame(pq.read_table(part)))
        return pd.concat(frames, ignore_index=True) if frames else _empty_lines()


# --------------------------------------------------------------------------- the bill of a day


@dataclass
class Bill:
    lines: pd.DataFrame  # BILLED_COLUMNS, one row per day × instance
    quarantine: pd.DataFrame  # QUARANTINE_COLUMNS of gpu_ops.flows.cost.usage
    adjustments: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=list(ADJUSTMENT_COLUMNS)))  # negative lines, not in the rate
    duplicates: int = 0  # lines seen again with the same identity and amount: counted once
    restated: int = 0  # lines seen again with another amount: the newest file's copy counts
    duplicate_amount: float = 0.0  # what the copies would have added
    converted: dict[str, str] = field(default_factory=dict)  # currency -> "N lines at RATE (as of DATE)"

    def notes(self) -> list[str]:
        """What was done to the bill before it priced anything, in words."""
        out = [f"{cur} converted: {text}" for cur, text in sorted(self.converted.items())]
        if self.duplicates:
            out.append(f"{self.duplicates} duplicate line(s) counted once (the copies would have added {self.duplicate_amount:,.2f} in the bill's currency)")
        if self.restated:
            out.append(f"{self.restated} restated line(s): the newest file's amount counts")
        if len(self.adjustments):
            by_node = self.adjustments.groupby("instance_id")["amount"].sum().sort_values()
            parts = ", ".join(f"{iid} {amount:+,.2f}" for iid, amount in by_node.head(5).items())
            out.append(f"{len(self.adjustments)} negative line(s) (refunds, credits) left out of the rate; they would change the billed cost by {float(self.adjustments['amount'].sum()):+,.2f} ({parts})")
        if len(self.quarantine):
            out.append(f"{len(self.quarantine)} bill line(s) quarantined: {'; '.join(sorted(set(self.quarantine['reason'].str.slice(0, 160)))[:3])}")
        return out


def _text(raw: pd.DataFrame, col: str) -> pd.Series:
    if col not in raw:
        return pd.Series([""] * len(raw), index=raw.index, dtype=object)
    s = raw[col].astype(object)
    return s.where(s.notna(), "").astype(str).str.strip()


def _money(raw: pd.DataFrame, col: str) -> tuple[np.ndarray, np.ndarray]:
    """(values, unparseable mask); blank is NaN and not unparseable."""
    if col not in raw:
        return np.full(len(raw), np.nan), np.zeros(len(raw), bool)
    text = _text(raw, col)
    values = pd.to_numeric(text.where(text != "", None), errors="coerce").to_numpy(dtype=float)
    return values, np.isnan(values) & (text != "").to_numpy() | np.isinf(values)


class _Reasons:
    """Per-line problems: the first reason per line and field, rendered as quarantine rows."""

    def __init__(self, n: int):
        self.bad = np.zeros(n, bool)
        self.items: list[tuple[np.ndarray, str, Any]] = []

    def add(self, mask: np.ndarray, field_: str, message: Any) -> None:
        mask = np.asarray(mask, bool) & ~self.bad
        if mask.any():
            self.bad |= mask
            self.items.append((mask, field_, message))

    def render(self, raw: pd.DataFrame, start: pd.Series) -> pd.DataFrame:
        if not self.bad.any():
            return empty_quarantine()
        parts = []
        for mask, field_, message in self.items:
            idx = np.flatnonzero(mask)
            sub = raw.iloc[idx]
            reasons = message(idx) if callable(message) else [message] * len(idx)
            records = [json.dumps({k: v for k, v in r.items() if v not in ("", None)}, sort_keys=True) for r in sub[list(CUR_COLUMNS)].astype(object).to_dict("records")]
            parts.append(pd.DataFrame({
                "source": "aws_cur", "location": sub["location"].astype(str).to_numpy(), "row": pd.array(sub["row"].to_numpy(), dtype="Int64"),
                "field": field_, "reason": [f"{field_}: {r}" for r in reasons], "record": records,
                "start": start.iloc[idx].to_numpy(), "end": start.iloc[idx].to_numpy(),
            }))
        out = pd.concat(parts, ignore_index=True)
        out["start"] = pd.to_datetime(out["start"], utc=True).astype("datetime64[ns, UTC]")
        out["end"] = pd.to_datetime(out["end"], utc=True).astype("datetime64[ns, UTC]")
        return out[list(QUARANTINE_COLUMNS)]


def _identity(raw: pd.DataFrame) -> np.ndarray:
    """``identity_line_item_id/identity_time_interval``; without them, the line's own fields."""
    line_id, interval = _text(raw, LINE_ID), _text(raw, INTERVAL)
    fallback = _text(raw, RESOURCE) + "|" + _text(raw, START) + "|" + _text(raw, USAGE_TYPE) + "|" + _text(raw, LINE_TYPE) + "|" + _text(raw, UNBLENDED) + "|" + _text(raw, NET)
    has = (line_id != "") & (interval != "")
    return np.where(has.to_numpy(), (line_id + "/" + interval).to_numpy(dtype=object), ("~" + fallback).to_numpy(dtype=object))


def _dedupe(raw: pd.DataFrame) -> tuple[pd.DataFrame, int, int, float]:
    """One copy of each line identity: the newest file's (then the last row). Returns the
    kept lines, how many copies were equal, how many differed, and what the copies add."""
    if not len(raw):
        return raw, 0, 0, 0.0
    ident = _identity(raw)
    version = raw["file_version"].to_numpy(dtype=np.int64) if "file_version" in raw else np.zeros(len(raw), np.int64)
    order = np.lexsort((raw["row"].to_numpy(dtype=np.int64), raw["location"].astype(str).to_numpy(), version, ident))
    ident_sorted = ident[order]
    last = np.append(ident_sorted[1:] != ident_sorted[:-1], True)  # the newest copy of each identity
    keep, drop = order[last], order[~last]
    if not len(drop):
        return raw, 0, 0, 0.0
    amount = (_text(raw, NET) + "|" + _text(raw, UNBLENDED) + "|" + _text(raw, SP_EFFECTIVE) + "|" + _text(raw, RI_EFFECTIVE)).to_numpy(dtype=object)
    kept_amount = dict(zip(ident[keep], amount[keep]))
    same = np.array([kept_amount[i] == a for i, a in zip(ident[drop], amount[drop])], dtype=bool)
    net = _text(raw, NET).where(_text(raw, NET) != "", _text(raw, UNBLENDED)).to_numpy(dtype=object)
    added = float(pd.to_numeric(pd.Series(net[drop][same]), errors="coerce").fillna(0.0).sum())
    return raw.iloc[np.sort(keep)].reset_index(drop=True), int(same.sum()), int((~same).sum()), added


def gpu_bill(raw: pd.DataFrame, inventory_ids: Iterable[str] = (), *, currency: str = "USD", rates: Mapping[str, Any] | None = None) -> Bill:
    """Billed effective cost of GPU instances per UTC day, in ``currency`` (see the module docstring).

    ``rates``: currency code -> :class:`gpu_ops.domain.config.CurrencyRate` (rate, as_of, source).
    """
    if not len(raw):
        return Bill(pd.DataFrame({c: pd.Series([], dtype=float if c in ("billed_usd", "lines") else object) for c in BILLED_COLUMNS}), empty_quarantine())
    if "row" not in raw:
        raw = raw.assign(row=np.arange(1, len(raw) + 1), location=raw.get("location", ""))
    rates = rates or {}
    known = set(inventory_ids)
    resource, usage_type, itype = _text(raw, RESOURCE), _text(raw, USAGE_TYPE), _text(raw, INSTANCE_TYPE)
    line_type = _text(raw, LINE_TYPE).where(_text(raw, LINE_TYPE) != "", "Usage")
    relevant = (
        resource.str.match(_INSTANCE_ID.pattern).to_numpy()
        & usage_type.str.contains(_INSTANCE_HOURS).to_numpy()
        & (resource.isin(known) | itype.isin(GPU_INSTANCE_TYPES)).to_numpy()
        & ~line_type.isin(_NOT_INSTANCE_COST).to_numpy()
    )
    has_net = NET in raw and bool(_text(raw, NET).ne("").any())
    if has_net:
        relevant &= ~line_type.isin(_DISCOUNTS).to_numpy()
    unread = (_text(raw, "problem_field") != "").to_numpy()  # lines that could not be read: no identity to compare
    kept, duplicates, restated, dup_amount = _dedupe(raw[relevant & ~unread].reset_index(drop=True))
    raw = pd.concat([kept, raw[unread]], ignore_index=True) if unread.any() else kept
    resource, itype = _text(raw, RESOURCE), _text(raw, INSTANCE_TYPE)
    lt = _text(raw, LINE_TYPE).where(_text(raw, LINE_TYPE) != "", "Usage").to_numpy(dtype=object)
    problems = _Reasons(len(raw))
    field_ = _text(raw, "problem_field").to_numpy(dtype=object)
    for name in dict.fromkeys(field_[field_ != ""]):
        problems.add(field_ == name, name, lambda idx: [raw["problem"].iloc[i] for i in idx])
    start = _start(raw)
    problems.add(start.isna().to_numpy(), START, lambda idx: [f"unparseable or missing time {raw[START].iloc[i]!r}" for i in idx])
    cost = _effective_cost(raw, lt, has_net, problems)
    problems.add(~np.isin(lt, _KNOWN_TYPES), LINE_TYPE, lambda idx: [f"unknown line item type {lt[i]!r}" for i in idx])
    factor, converted = _currency(raw, currency, rates, cost, problems)
    cost = cost * factor
    quarantine = problems.render(raw, start)
    ok = ~problems.bad
    negative = ok & (cost < 0)
    day = start.dt.floor("D")
    adjustments = pd.DataFrame({
        "day": day[negative].to_numpy(), "instance_id": resource[negative].to_numpy(), "line_type": lt[negative],
        "amount": cost[negative], "location": raw["location"].astype(str).to_numpy()[negative], "row": raw["row"].to_numpy()[negative],
    })
    use = ok & ~negative
    frame = pd.DataFrame({
        "day": day[use].to_numpy(), "instance_id": resource[use].to_numpy(), "instance_type": itype[use].to_numpy(),
        "pricing_term": _text(raw, PRICING_TERM)[use].to_numpy(), "billed_usd": cost[use], "lines": 1.0,
    })
    lines = frame.groupby(["day", "instance_id"], as_index=False, sort=True).agg(
        instance_type=("instance_type", "first"), pricing_term=("pricing_term", _terms), billed_usd=("billed_usd", "sum"), lines=("lines", "sum"),
    )
    lines["day"] = pd.to_datetime(lines["day"], utc=True)
    return Bill(lines[list(BILLED_COLUMNS)], quarantine, adjustments, duplicates, restated, dup_amount, converted)


def _start(raw: pd.DataFrame) -> pd.Series:
    ns = raw["start_ns"].to_numpy(dtype=np.int64) if "start_ns" in raw else _parse_start(_text(raw, START).to_numpy(dtype=object))
    return pd.Series(pd.to_datetime(np.where(ns == _NAT, np.datetime64("NaT"), ns.astype("datetime64[ns]")), utc=True), index=raw.index)


def _effective_cost(raw: pd.DataFrame, lt: np.ndarray, has_net: bool, problems: _Reasons) -> np.ndarray:
    cost = np.full(len(raw), np.nan)
    for col, types in ((SP_EFFECTIVE, ("SavingsPlanCoveredUsage",)), (RI_EFFECTIVE, ("DiscountedUsage",)), (UNBLENDED, None)):
        values, bad = _money(raw, col)
        rows = np.isin(lt, types) if types else ~np.isin(lt, ("SavingsPlanCoveredUsage", "DiscountedUsage"))
        if col == UNBLENDED and has_net:
            net, bad_net = _money(raw, NET)
            problems.add(rows & bad_net, NET, _not_a_number(raw, NET))
            values = np.where(np.isnan(net), values, net)
        problems.add(rows & bad, col, _not_a_number(raw, col))
        problems.add(rows & np.isnan(values) & ~bad, col, _missing_cost(lt, col))
        cost = np.where(rows, values, cost)
    return cost


def _currency(raw: pd.DataFrame, currency: str, rates: Mapping[str, Any], cost: np.ndarray, problems: _Reasons) -> tuple[np.ndarray, dict[str, str]]:
    """Per line, the factor into ``currency`` (NaN where no rate: quarantined with its amount)."""
    code = _text(raw, CURRENCY).str.upper().to_numpy(dtype=object)
    want = currency.upper()
    factor = np.ones(len(raw))
    converted: dict[str, str] = {}
    problems.add(code == "", CURRENCY, f"missing: the line's currency cannot be checked against the prices' {want}")
    for cur in sorted(set(code) - {"", want}):
        mask = code == cur
        rate = rates.get(cur)
        if rate is None:
            problems.add(mask, CURRENCY, lambda idx, c=cur: [f"{c}, not the prices' {want}, and usage.billing.currency_rates has no {c} rate ({cost[i]:,.2f} {c} not counted)" for i in idx])
            factor[mask] = np.nan
            continue
        factor[mask] = float(rate.rate)
        converted[cur] = f"{int(mask.sum())} line(s) at {rate.rate:g} {want}/{cur} (as of {rate.as_of}{', ' + rate.source if rate.source else ''})"
    return factor, converted


def _not_a_number(raw: pd.DataFrame, col: str) -> Any:
    return lambda idx: [f"not a number: {raw[col].iloc[i]!r}" for i in idx]


def _missing_cost(line_types: np.ndarray, col: str) -> Any:
    return lambda idx: [f"missing (a {line_types[i]} line is billed at its {col})" for i in idx]


def _terms(s: pd.Series) -> str:
    return ",".join(sorted({t for t in s if t}))


def node_instance_ids(inventory: Any) -> dict[str, str]:
    """node -> EC2 instance id of a node inventory (a :class:`~gpu_ops.flows.cost.engine.UsageInput`
    from :func:`~gpu_ops.flows.cost.inventory.load_inventory`, or None): its ``instance_id``
    column, else the node name when it is one (``i-…``), else the id in a Karpenter
    ``provider_id`` (``aws:///zone/i-…``)."""
    out: dict[str, str] = {}
    for raw in _id_frames(inventory):
        nodes = _text(raw, "node")
        ids = _text(raw, "instance_id")
        provider = _text(raw, "provider_id").str.extract(r"(i-[0-9a-f]+)$", expand=False).fillna("")
        chosen = ids.where(ids != "", nodes.where(nodes.str.match(_INSTANCE_ID.pattern), provider))
        out.update((n, i) for n, i in zip(nodes, chosen) if n and i)
    return out


_ID_COLUMNS = ("node", "instance_id", "provider_id")


def _id_frames(inventory: Any) -> list[pd.DataFrame]:
    """The node and id columns of each part of an inventory, as text (a CSV's bytes
    decoded, what is not UTF-8 replaced: an id is matched, never priced)."""
    if inventory is None:
        return []
    frames = [f for f in inventory.frames if len(f)]
    for f in inventory.files:
        table = f.load()[0]
        cols = [c for c in _ID_COLUMNS if c in table.column_names]
        frames.append(pd.DataFrame({c: [v.decode("utf-8", "replace") if isinstance(v, bytes) else v for v in table.column(c).to_pylist()] for c in cols}))
    return frames


# --------------------------------------------------------------------------- reconciliation

def reconcile(usage: pd.DataFrame, bill: pd.DataFrame, node_ids: dict[str, str], day: Any, tolerance_percent: float = 2.0) -> dict[str, Any]:
    """Fleet cost of the day (inventory × prices: the idle rows' ``fleet_cost_usd``) against
    the bill, per node. ``passed`` when the totals differ by at most ``tolerance_percent``
    of the bill; ``nodes`` lists each node's difference, largest first."""
    d = pd.Timestamp(day).tz_localize("UTC") if pd.Timestamp(day).tzinfo is None else pd.Timestamp(day)
    idle = usage[usage["kind"].astype(str) == "idle"]
    fleet = idle.groupby(idle["node"].astype(str))["fleet_cost_usd"].sum()
    billed_day = bill[bill["day"] == d]
    billed = billed_day.groupby("instance_id")["billed_usd"].sum()
    by_id = {node_ids.get(n, n): n for n in fleet.index}
    rows = []
    for node, cost in fleet.items():
        iid = node_ids.get(node, node)
        rows.append({"node": node, "instance_id": iid, "fleet_usd": float(cost), "billed_usd": float(billed.get(iid, 0.0)), "in_bill": iid in billed.index})
    for iid, cost in billed.items():
        if iid not in by_id:
            rows.append({"node": "", "instance_id": iid, "fleet_usd": 0.0, "billed_usd": float(cost), "in_bill": True})
    nodes = pd.DataFrame(rows, columns=["node", "instance_id", "fleet_usd", "billed_usd", "in_bill"])
    nodes["difference_usd"] = nodes["fleet_usd"] - nodes["billed_usd"]
    nodes = nodes.reindex(nodes["difference_usd"].abs().sort_values(ascending=False, kind="stable").index).reset_index(drop=True)
    fleet_total, billed_total = float(nodes["fleet_usd"].sum()), float(nodes["billed_usd"].sum())
    diff = fleet_total - billed_total
    limit = tolerance_percent / 100.0 * abs(billed_total)
    passed = abs(diff) <= max(limit, 0.005)
    return {"passed": passed, "fleet_usd": fleet_total, "billed_usd": billed_total, "difference_usd": diff, "tolerance_usd": limit, "nodes": nodes, "description": _explain(passed, fleet_total, billed_total, diff, nodes, tolerance_percent)}


def _explain(passed: bool, fleet: float, billed: float, diff: float, nodes: pd.DataFrame, tol: float) -> str:
    pct = f" ({diff / billed * 100:+.2f}%)" if billed else ""
    head = f"fleet ${fleet:,.2f} (inventory × prices) vs billed ${billed:,.2f}: {diff:+,.2f}{pct}, tolerance {tol:g}%"
    if passed:
        return head
    worst = nodes[nodes["difference_usd"].abs() >= 0.005].head(5)
    parts = []
    for r in worst.itertuples(index=False):
        who = r.node or f"instance {r.instance_id} (billed, not in the inventory)"
        note = "" if r.in_bill or not r.node else " (no bill line for its instance)"
        parts.append(f"{who} [{r.instance_id}]: fleet ${r.fleet_usd:,.2f} vs billed ${r.billed_usd:,.2f} ({r.difference_usd:+,.2f}){note}")
    return head + ". Explained by: " + "; ".join(parts)


# --------------------------------------------------------------------------- from_bill


def apply_bill(rows: pd.DataFrame, bill: pd.DataFrame, node_ids: dict[str, str]) -> tuple[pd.DataFrame, dict[str, Any]]:
    """Priced rows (allocated and idle) re-priced at the billed effective cost per GPU-hour
    of each node and day: rate = billed ÷ the node's GPU-hours that day. Afterwards, per
    billed node, allocated + idle = billed. Nodes without a bill line keep list prices
    (reported in the returned summary); rows off the inventory are unchanged.
    """
    rows = rows.copy()
    idle = rows["kind"].astype(str).to_numpy() == "idle"
    node = rows["node"].astype(str).to_numpy()
    day = pd.to_datetime(rows["day"], utc=True)
    fleet = pd.DataFrame({"node": node[idle], "day": day[idle].to_numpy(), "fleet_gpu_hours": rows.loc[idle, "fleet_gpu_hours"].to_numpy(dtype=float)})
    fleet["instance_id"] = [node_ids.get(n, n) for n in fleet["node"]]
    fleet["day"] = pd.to_datetime(fleet["day"], utc=True)
    fleet = fleet.merge(bill[["day", "instance_id", "billed_usd"]], on=["day", "instance_id"], how="left")
    fleet["rate"] = fleet["billed_usd"] / fleet["fleet_gpu_hours"]
    rate_of = pd.Series(fleet["rate"].to_numpy(), index=pd.MultiIndex.from_arrays([fleet["node"], fleet["day"]]))
    rate = rate_of.reindex(pd.MultiIndex.from_arrays([node, day])).to_numpy(dtype=float)
    repriced = ~np.isnan(rate) & ~idle
    gh = rows["gpu_hours"].to_numpy(dtype=float)
    cost = rows["cost_usd"].to_numpy(dtype=float).copy()
    price = pd.to_numeric(rows["price_per_gpu_hour"], errors="coerce").to_numpy(dtype=float).copy()
    cost[repriced] = gh[repriced] * rate[repriced]
    price[repriced] = rate[repriced]
    for col, per_hour in (("lost_cost_usd", "lost_gpu_hours"),):
        if col in rows and per_hour in rows:
            v = rows[col].to_numpy(dtype=float).copy()
            v[repriced] = rows[per_hour].to_numpy(dtype=float)[repriced] * rate[repriced]
            rows[col] = v
    if "unused_cost_usd" in rows:
        unused = rows["unused_cost_usd"].to_numpy(dtype=float).copy()
        m = repriced & ~np.isnan(unused)
        unused[m] = (rows["metered_gpu_hours"].to_numpy(dtype=float)[m] - rows["active_gpu_hours"].to_numpy(dtype=float)[m]) * rate[m]
        rows["unused_cost_usd"] = unused
    # Idle = billed − allocated, per node and day: the bill is conserved exactly.
    alloc = pd.DataFrame({"node": node[repriced], "day": day[repriced].to_numpy(), "cost": cost[repriced]}).groupby(["node", "day"])["cost"].sum()
    idle_billed = idle & ~np.isnan(rate)
    keys = pd.MultiIndex.from_arrays([node[idle_billed], day[idle_billed]])
    billed_of = pd.Series(fleet["billed_usd"].to_numpy(), index=pd.MultiIndex.from_arrays([fleet["node"], fleet["day"]]))
    billed_rows = billed_of.reindex(keys).to_numpy(dtype=float)
    cost[idle_billed] = billed_rows - alloc.reindex(keys).fillna(0.0).to_numpy(dtype=float)
    price[idle_billed] = rate[idle_billed]
    rows["cost_usd"], rows["price_per_gpu_hour"] = cost, price
    if "fleet_cost_usd" in rows:
        fc = rows["fleet_cost_usd"].to_numpy(dtype=float).copy()
        fc[idle_billed] = billed_rows
        rows["fleet_cost_usd"] = fc
    unbilled = sorted(set(fleet.loc[fleet["billed_usd"].isna(), "node"]))
    return rows, {"billed_usd": float(fleet["billed_usd"].sum()), "billed_nodes": int(fleet["billed_usd"].notna().sum()), "unbilled_nodes": unbilled}


# --------------------------------------------------------------------------- the day's settlement


@dataclass
class Settlement:
    """What the bill does to the usage rows of some days: the check per day, the rows
    (re-priced when ``prices.from_bill``, on the days that reconcile), the CUR lines set aside.

    With ``from_bill``, a day whose reconciliation fails is *blocked*: its rows keep list
    prices and the (then blocking) ``billing_reconciled`` check stops attribution."""

    table: pd.DataFrame
    quarantine: pd.DataFrame  # with partition_key per day
    days: list[dict[str, Any]]  # reconcile() per day, with "day", "notes" and "blocked"
    from_bill: dict[str, Any] | None

    @property
    def passed(self) -> bool:
        return all(d["passed"] for d in self.days)

    @property
    def blocked_days(self) -> list[str]:
        return [f"{d['day']:%Y-%m-%d}" for d in self.days if d["blocked"]]

    @staticmethod
    def _day_text(d: dict[str, Any]) -> str:
        text = str(d["description"])
        if d["notes"]:
            text += ". " + ". ".join(d["notes"])
        if d["blocked"]:
            text = f"attribution blocked (prices.from_bill: the bill does not reconcile): {text}"
        return text

    def description(self) -> str:
        if len(self.days) == 1:
            return self._day_text(self.days[0])
        bad = [d for d in self.days if not d["passed"]]
        return "; ".join(f"{d['day']:%Y-%m-%d}: {self._day_text(d)}" for d in bad) if bad else f"all {len(self.days)} days within tolerance"

    def metadata(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "billed_usd": round(sum(d["billed_usd"] for d in self.days), 2),
            "fleet_usd": round(sum(d["fleet_usd"] for d in self.days), 2),
            "difference_usd": round(sum(d["difference_usd"] for d in self.days), 2),
            "quarantined_bill_lines": len(self.quarantine),
            "duplicate_bill_lines": sum(d["bill"].duplicates + d["bill"].restated for d in self.days),
            "negative_bill_lines_usd": round(sum(float(d["bill"].adjustments["amount"].sum()) for d in self.days), 2),
        }
        converted = sorted({f"{c}: {t}" for d in self.days for c, t in d["bill"].converted.items()})
        if converted:
            out["currency_converted"] = "; ".join(converted)
        if self.blocked_days:
            out["attribution_blocked_days"] = ", ".join(self.blocked_days)
        worst = pd.concat([d["nodes"].assign(day=f"{d['day']:%Y-%m-%d}") for d in self.days], ignore_index=True) if self.days else pd.DataFrame()
        if len(worst):
            worst = worst.reindex(worst["difference_usd"].abs().sort_values(ascending=False, kind="stable").index).head(10)
            out["nodes"] = worst[["day", "node", "instance_id", "fleet_usd", "billed_usd", "difference_usd"]].round(2)
        return out


def index_folder(config: Any) -> Path:
    """Where the per-day CUR index lives: ``usage.billing.index_path`` (relative to the
    configuration file), else ``<GPU_OPS_HOME>/cur_index``."""
    path = config.usage.billing.index_path
    if path is None:
        return gpu_ops_home() / "cur_index"
    p = Path(path).expanduser()
    return p if p.is_absolute() or config.base_dir is None else config.base_dir / p


def settle_billing(config: Any, table: pd.DataFrame, first: Any, last: Any, store: Any = None) -> Settlement:
    """Read the bill (``usage.billing``) day by day, reconcile each day of ``first..last``
    against the fleet in ``table`` and, with ``prices.from_bill``, re-price the days that
    reconcile at the bill."""
    billing = config.usage.billing
    node_ids = node_instance_ids(load_inventory(SourceSet.from_config(config), store))
    files = cur_files([billing.path], config.base_dir)
    index = CurIndex(index_folder(config), billing.batch_rows)
    days = list(pd.date_range(pd.Timestamp(first), pd.Timestamp(last), freq="D", tz="UTC"))
    table_day = pd.to_datetime(table["day"], utc=True) if len(table) else pd.Series([], dtype="datetime64[ns, UTC]")
    from_bill = bool(config.prices.from_bill)
    checks, quarantine, lines = [], [], []
    for d in days:
        bill = gpu_bill(index.day_lines(files, d), node_ids.values(), currency=config.prices.currency, rates=billing.currency_rates)
        result = reconcile(table[(table_day == d).to_numpy()], bill.lines, node_ids, d, billing.tolerance_percent)
        checks.append({"day": d, **result, "bill": bill, "notes": bill.notes(), "blocked": from_bill and not result["passed"]})
        quarantine.append(bill.quarantine.assign(partition_key=f"{d:%Y-%m-%d}"))
        if result["passed"]:
            lines.append(bill.lines)
    summary = None
    if from_bill and len(table):
        table = table.reset_index(drop=True)
        good = table_day.isin([c["day"] for c in checks if not c["blocked"]]).to_numpy()
        summary = {"billed_usd": 0.0, "billed_nodes": 0, "unbilled_nodes": []}
        if good.any():  # blocked days keep list prices
            repriced, summary = apply_bill(table[good], pd.concat(lines, ignore_index=True), node_ids)
            table = pd.concat([repriced, table[~good]]).sort_index()
    return Settlement(table, pd.concat(quarantine, ignore_index=True), checks, summary)
