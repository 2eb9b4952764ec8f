"""The DuckDB engine: one day's priced cells from large Parquet usage files, with the
quarantine and duplicate rule of :func:`~gpu_ops.cost.usage.validate_usage`, exactly.

DuckDB does the work per row, in C++ on every core, and Python only what is small:

1. **Cells** (one query per file): the rows that pass the row checks that need no
   catalog (times, counts, shares: :data:`_ROW_OK`) are summed into GPU-hours of the day
   per *combination* of the raw text columns that are validated, priced or grouped on
   (team, gpu type, capacity type, sharing, region, the group-by keys).
2. **Combinations** (a few thousand rows, Python): each combination is validated and
   priced by :func:`validate_usage` itself, so a gpu-type alias, a blank team or a
   missing price means here what it means everywhere else.
3. **Quarantine**: rows that failed a check are read back with pyarrow, as the batch
   reader reads them, a row group at a time, and validated by :func:`validate_usage`
   for their exact reasons. If any of them turns out good, DuckDB and Python disagree
   and the read falls back to the batch reader (never a silent difference).
4. **Identical rows**: a 64-bit hash per good row that touches the day, of the columns
   whose raw value decides its parsed value (times, count, share, and the text columns
   whose spellings do not collapse); hashes are kept in partitions spilled to disk, so
   memory is bounded by ``batch_rows``. Rows whose hash repeats are read back and put
   through :func:`validate_usage` together, in reading order: it finds the true copies
   (all columns, pod included) and names the first; their files' cells are summed again
   without them.

Anything the engine does not model (CSV, labels, checkpoint columns, several windows, a
file that cannot be read, mixed schemas) raises :class:`NotApplicable`, and the caller
uses the batch reader (:mod:`gpu_ops.cost.stream`). ``duckdb`` is optional: it is
imported only here, only when the engine runs.
"""

from __future__ import annotations

import tempfile
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from gpu_ops.cost.attribution import DAY_NS
from gpu_ops.cost.columns import parquet_columns
from gpu_ops.cost.pricing import PriceMatrix
from gpu_ops.cost.sources import SourceSet
from gpu_ops.cost.texthash import SPACES
from gpu_ops.errors import GpuOpsError
from gpu_ops.cost.usage import (
    ATTRIBUTE_COLUMNS,
    DUPLICATE_FIELD,
    MAX_GPUS_PER_ROW,
    _distinct_files,
    arrow_to_frame,
    concat_raw,
    empty_quarantine,
    quarantine_in_window,
    usage_frame,
    validate_usage,
)

_TEXT_CHECKED = ("team", "gpu_type", "capacity_type", "sharing", "region", "labels")  # validated or priced per value
_NUMBERS = ("gpu_count", "gpu_share")
_TIMES = ("start", "end")
_SUPPORTED = frozenset((*_TIMES, *_NUMBERS, *_TEXT_CHECKED, *ATTRIBUTE_COLUMNS))
# What pandas' datetime64[ns] holds (validate_usage quarantines the rest), in ns.
_NS_MIN, _NS_MAX = pd.Timestamp.min.value, pd.Timestamp.max.value


class NotApplicable(GpuOpsError):
    """This read is not one the engine models; use the batch reader."""


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


class _Layout:
    """The columns of the files (all alike) and the SQL over them."""

    def __init__(self, paths: list[Path], columns: Sequence[str] | None, keys: Sequence[str]):
        import pyarrow as pa
        import pyarrow.parquet as pq

        metas: list[Any] = []
        for path in paths:
            if path.suffix.lower() not in (".parquet", ".pq"):
                raise NotApplicable(f"{path.name}: not Parquet")
            try:
                metas.append(pq.ParquetFile(path))  # the footer, read once: schema and row count
            except Exception:
                raise NotApplicable(f"{path.name}: unreadable footer") from None
        schemas = [m.schema_arrow for m in metas]
        present = parquet_columns(schemas[0].names, columns)
        for s in schemas[1:]:
            if parquet_columns(s.names, columns) != present or any(s.field(c).type != schemas[0].field(c).type for c in present):
                raise NotApplicable("files with different columns or types")
        types = {c: schemas[0].field(c).type for c in present}
        if not {"start", "end", "team", "gpu_type", "gpu_count", "capacity_type"} <= set(present):
            raise NotApplicable("a required column is missing")
        for c, t in types.items():
            text = pa.types.is_string(t) or pa.types.is_large_string(t) or (pa.types.is_dictionary(t) and pa.types.is_string(t.value_type))
            ok = pa.types.is_timestamp(t) if c in _TIMES else (pa.types.is_integer(t) or pa.types.is_floating(t)) if c in _NUMBERS else text
            if c not in _SUPPORTED or not ok:
                raise NotApplicable(f"column {c} ({t}) is not modelled")
        self.paths, self.present, self.types, self.schema = paths, present, types, schemas[0]
        self.rows = sum(m.metadata.num_rows for m in metas)
        # Grouped on: the checked text columns and the keys (as they are spelled in the file).
        self.combo = [c for c in (*_TEXT_CHECKED, *keys) if c in present and c not in ("start", "end")]
        self.combo = list(dict.fromkeys(self.combo))
        self.identity = [c for c in ATTRIBUTE_COLUMNS if c in present and c not in self.combo]

        self.unit = "ns" if any(self.types[c].unit == "ns" for c in _TIMES) else "us"  # times are compared and summed in this unit
        self.per_hour = 3_600 * (10**9 if self.unit == "ns" else 10**6)

    def time(self, col: str) -> str:
        """A time column as an integer in ``unit``; NULL where a coarser value is outside
        what ns can hold (its check is then on the raw column: see ``ok``)."""
        c = _quote(col)
        if self.unit == "us" or self.types[col].unit == "ns":
            return f"epoch_{self.unit}({c})"
        return f"CASE WHEN epoch_us({c}) BETWEEN {_NS_MIN // 1000 + 1} AND {_NS_MAX // 1000} THEN epoch_us({c}) * 1000 END"

    def source(self, path: Path) -> str:
        """The rows of one file with their times (integers in ``unit``), whether the share
        is missing, and the row check ``ok``: what validate_usage checks without a catalog."""
        share = "gpu_share" in self.present
        share_null = ("gpu_share IS NULL" + (" OR isnan(gpu_share)" if _is_float(self.types["gpu_share"]) else "")) if share else "true"
        # What datetime64[ns] holds (validate_usage quarantines the rest): any ns value.
        lo, hi = (_NS_MIN, _NS_MAX) if self.unit == "ns" else (_NS_MIN // 1000 + 1, _NS_MAX // 1000)
        ok = " AND ".join(
            [
                f"s BETWEEN {lo} AND {hi}",
                f'coalesce(e BETWEEN s AND {hi}, "end" IS NULL)',  # e is NULL when end is, or is out of range (ns unit)
                # isfinite first: DuckDB orders NaN above every number, and a range test can be rewritten.
                ("isfinite(gpu_count) AND gpu_count = floor(gpu_count) AND " if _is_float(self.types["gpu_count"]) else "") + f"gpu_count > 0 AND gpu_count <= {MAX_GPUS_PER_ROW}",
                ("(share_null OR (isfinite(gpu_share) AND gpu_share > 0 AND gpu_share <= 1))" if _is_float(self.types["gpu_share"]) else "(share_null OR (gpu_share > 0 AND gpu_share <= 1))") if share else "true",
            ]
        )
        cols = ", ".join(_quote(c) for c in self.present)
        return (
            f"(SELECT *, coalesce({ok}, false) AS ok FROM (SELECT {cols}, file_row_number AS rn, {self.time('start')} AS s, "
            f"{self.time('end')} AS e, ({share_null}) AS share_null FROM read_parquet({_literal(str(path))}, file_row_number = true)))"
        )

    def share_lt1(self) -> str:
        return "(NOT share_null AND gpu_share < 1)" if "gpu_share" in self.present else "false"

    def share_value(self) -> str:
        return "CASE WHEN share_null THEN 1.0 ELSE gpu_share::DOUBLE END" if "gpu_share" in self.present else "1.0"


def _is_float(t: Any) -> bool:
    import pyarrow as pa

    return bool(pa.types.is_floating(t))


class _Day:
    def __init__(self, window_start: pd.Timestamp, window_end: pd.Timestamp, as_of: pd.Timestamp):
        self.window = (window_start, window_end)  # what quarantine_in_window keeps
        self.lo, self.end = window_start.value, window_end.value
        self.hi = min(window_end.value, as_of.value)  # priced up to here

    def bounds(self, lay: _Layout, hi: int | None = None) -> tuple[int, int]:
        scale = 1 if lay.unit == "ns" else 1000
        return self.lo // scale, -(-(self.hi if hi is None else hi) // scale)

    def hours(self, lay: _Layout) -> str:
        """GPU-hours of a row inside the day, as split_by_day and price_pieces count them."""
        lo, hi = self.bounds(lay)
        pe, ps = f"least(coalesce(e, {hi}), {hi})", f"greatest(s, {lo})"
        return f"gpu_count::DOUBLE * {lay.share_value()} * (greatest({pe}, {ps}) - {ps}) / {lay.per_hour:.1f}"

    def touching(self, lay: _Layout) -> str:
        """As SeenRows and quarantine_in_window keep them (to the window's end, not as_of)."""
        lo, hi = self.bounds(lay, self.end)
        return f"(s < {hi} AND (e IS NULL OR e >= {lo}))"


# --------------------------------------------------------------------------- combinations


class _Combos:
    """The distinct combinations of the grouped text columns, validated and priced once each."""

    def __init__(self, lay: _Layout, cells: pd.DataFrame, prices: PriceMatrix, keys: Sequence[str], day: _Day):
        distinct = cells.drop_duplicates("ch").reset_index(drop=True)
        if len(distinct) != len(cells.drop_duplicates([*lay.combo, "share_null", "share_lt1"])):
            raise NotApplicable("two combinations share a hash")
        raw = pd.DataFrame({c: distinct[c].astype(object).where(distinct[c].notna(), None) for c in lay.combo})
        n = len(raw)
        # Stand-in numbers that pass every row check: only the text columns (and whether
        # the share is missing or below 1) decide what validate_usage says of a combination.
        raw["start"] = pd.to_datetime(day.lo + np.arange(n), utc=True)  # distinct: no two are duplicates
        raw["end"] = raw["start"] + pd.Timedelta(hours=1)
        raw["gpu_count"] = np.ones(n, np.int64)
        raw["gpu_share"] = np.where(distinct["share_null"], np.nan, np.where(distinct["share_lt1"], 0.5, 1.0))
        v = validate_usage(usage_frame(raw, Path("<combinations>")), prices)
        good = v.rows["row"].to_numpy() - 1
        self.valid = np.zeros(n, bool)
        self.valid[good] = True
        self.hashes = pd.Index(distinct["ch"].to_numpy(np.uint64))
        self.bad = self.hashes.to_numpy()[~self.valid]
        priced = pd.DataFrame({k: v.rows[k].astype(str).to_numpy() for k in keys})
        for col in ("price_per_gpu_hour", "on_demand_price_per_gpu_hour"):
            priced[col] = v.rows[col].to_numpy(dtype=float)
        priced.index = good
        self.priced = priced
        # A column's raw spellings may stand in for its parsed value in the duplicate hash
        # when no two of them parse to the same value.
        self.hashable = [c for c in lay.combo if _injective(distinct[c].to_numpy()[good], v.rows[c].astype(str).to_numpy())]

    def of(self, cells: pd.DataFrame) -> np.ndarray:
        """Each cell's combination number."""
        return self.hashes.get_indexer(cells["ch"].to_numpy(np.uint64))


def _injective(raw: np.ndarray, typed: np.ndarray) -> bool:
    pairs = pd.DataFrame({"raw": pd.Series(raw, dtype=object).fillna("\x00<null>"), "typed": typed}).drop_duplicates()
    return not pairs["typed"].duplicated().any()


# --------------------------------------------------------------------------- identical rows


class HashSpill:
    """64-bit hashes kept in ``2**bits`` partitions by their top bits, each partition in a
    file once more than ``memory_rows`` hashes are expected: finding repeated hashes then
    holds one partition at a time."""

    def __init__(self, expected: int, memory_rows: int):
        self.bits = 0
        while (expected >> self.bits) > memory_rows and self.bits < 8:  # at most 256 files open
            self.bits += 1
        self.tmp = tempfile.TemporaryDirectory(prefix="gpu_ops-hashes-") if self.bits else None
        self.parts: list[list[np.ndarray]] = [[] for _ in range(1 << self.bits)]
        self.files = [open(Path(self.tmp.name) / f"{i}.u64", "wb") for i in range(1 << self.bits)] if self.tmp else []

    def add(self, h: np.ndarray) -> None:
        if not len(h):
            return
        if not self.bits:
            self.parts[0].append(h)
            return
        part = (h >> np.uint64(64 - self.bits)).astype(np.uint16)
        if self.bits <= 2:  # a few masks cost less than a sort
            for i, f in enumerate(self.files):
                h[part == i].tofile(f)
            return
        order = np.argsort(part, kind="stable")
        bounds = np.searchsorted(part[order], np.arange((1 << self.bits) + 1))
        h = h[order]
        for i, f in enumerate(self.files):
            if bounds[i] < bounds[i + 1]:
                h[bounds[i] : bounds[i + 1]].tofile(f)

    def repeated(self) -> tuple[np.ndarray, int]:
        """The hashes that occur more than once, and how many rows have one of them."""
        out, rows = [], 0
        for i in range(1 << self.bits):
            if self.bits:
                self.files[i].close()
                h = np.fromfile(Path(self.tmp.name) / f"{i}.u64", dtype=np.uint64)  # type: ignore[union-attr]
            else:
                h = np.concatenate(self.parts[0]) if self.parts[0] else np.empty(0, np.uint64)
                self.parts[0] = []
            h.sort()
            same = h[1:] == h[:-1]
            if same.any():
                values = np.unique(h[1:][same])
                out.append(values)
                rows += int(same.sum()) + len(values)
        if self.tmp:
            self.tmp.cleanup()
        return (np.concatenate(out) if out else np.empty(0, np.uint64)), rows


# --------------------------------------------------------------------------- reading rows back


def read_rows(path: Path, lay: _Layout, row_numbers: np.ndarray, batch_rows: int) -> Any:
    """Batches of the rows ``row_numbers`` (0-based, sorted) of a Parquet file, read as the
    batch reader reads them, visiting only the row groups that hold them: (table, rows)."""
    import pyarrow as pa

    from gpu_ops.cost.stream import usage_parquet

    pf = usage_parquet(path, lay.schema, lay.present)
    starts = np.cumsum([0] + [pf.metadata.row_group(i).num_rows for i in range(pf.metadata.num_row_groups)])
    groups = np.unique(np.searchsorted(starts, row_numbers, side="right") - 1)
    for g in groups.tolist():
        lo, hi = int(starts[g]), int(starts[g + 1])
        at = row_numbers[(row_numbers >= lo) & (row_numbers < hi)]
        group = pf.read_row_group(g, columns=list(lay.present))
        for chunk in range(0, len(at), batch_rows):
            mine = at[chunk : chunk + batch_rows]
            yield group.take(pa.array(mine - lo)), mine


def _raw(path: Path, table: Any, rows: np.ndarray) -> pd.DataFrame:
    raw = usage_frame(arrow_to_frame(table), path, first_row=1)
    raw["row"] = rows + 1
    return raw


# --------------------------------------------------------------------------- the read


def day_parts(
    sources: SourceSet,
    prices: PriceMatrix,
    window_start: pd.Timestamp,
    window_end: pd.Timestamp,
    as_of: pd.Timestamp,
    keys: Sequence[str],
    columns: Sequence[str] | None,
    batch_rows: int,
    identity: Collection[str],
) -> list[tuple[pd.DataFrame, pd.DataFrame]]:
    """Per file: (its priced cells keyed by ``keys``, its quarantined rows of the day), as
    :class:`gpu_ops.cost.stream` sums them. Raises :class:`NotApplicable`."""
    try:
        import duckdb
    except ImportError:
        raise NotApplicable("duckdb is not installed") from None
    day = _Day(window_start, window_end, as_of)
    if (day.hi - 1) // DAY_NS != day.lo // DAY_NS:
        raise NotApplicable("a window of more than one day")
    paths: list[Path] = []
    for path, problem in _distinct_files(sources.usage_files, sources.base_dir):
        if path is None:
            raise NotApplicable(str(problem))
        paths.append(path)
    lay = _Layout(paths, columns, keys)
    con = duckdb.connect()
    con.execute("SET enable_progress_bar = false")
    con.execute("SET preserve_insertion_order = false")  # results are sums and sorted row numbers: no order to keep
    # Memory follows the setting, not the files: 1 KiB per batch row (256 MiB by default).
    con.execute(f"SET memory_limit = '{max(128 << 20, batch_rows << 10)}B'")
    con.execute(f"SET temp_directory = {_literal(str(Path(tempfile.gettempdir()) / 'gpu_ops-duckdb'))}")
    try:
        return _Read(con, lay, day, prices, list(keys), batch_rows, identity).parts()
    except duckdb.Error as exc:  # a file DuckDB reads differently: the batch reader decides
        raise NotApplicable(f"DuckDB: {str(exc).splitlines()[0]}") from None
    finally:
        con.close()


class _Read:
    def __init__(self, con: Any, lay: _Layout, day: _Day, prices: PriceMatrix, keys: list[str], batch_rows: int, identity: Collection[str]):
        self.con, self.lay, self.day, self.prices, self.keys = con, lay, day, prices, keys
        self.batch_rows, self.identity = batch_rows, identity
        combo = ", ".join(_quote(c) for c in lay.combo)
        # The same hash of a combination per cell (share_lt1 a column) and per row (an expression).
        self.combo_hash = f"hash({combo}{', ' if combo else ''}share_null, share_lt1)"
        self.row_combo_hash = self.combo_hash.replace("share_lt1)", f"{lay.share_lt1()})")
        self.bad = np.empty(0, np.uint64)  # combination hashes that fail validation

    def parts(self) -> list[tuple[pd.DataFrame, pd.DataFrame]]:
        cells = [self.cells(p) for p in self.lay.paths]
        ok = pd.concat([c[c["ok"]] for c in cells], ignore_index=True)
        self.combos = _Combos(self.lay, ok, self.prices, self.keys, self.day)
        self.bad = self.combos.bad
        if len(self.bad):  # named by the row filters below
            self.register("bad_combos", "ch", self.bad)
        quarantine = [self.quarantine(p, c) for p, c in zip(self.lay.paths, cells)]
        for i, (path, dups) in enumerate(zip(self.lay.paths, self.duplicates())):
            if len(dups):
                cells[i] = self.cells(path, without=dups["row"].to_numpy(np.int64) - 1)
                both = [q for q in (quarantine[i], dups) if len(q)]
                quarantine[i] = pd.concat(both, ignore_index=True).sort_values("row", kind="stable").reset_index(drop=True) if len(both) > 1 else both[0]
        return [(self.priced(c), q) for c, q in zip(cells, quarantine)]  # both kinds of quarantine row are of the day already

    def register(self, name: str, column: str, values: np.ndarray) -> None:
        import pyarrow as pa

        self.con.register(name, pa.table({column: values}))

    def cells(self, path: Path, without: np.ndarray | None = None) -> pd.DataFrame:
        """GPU-hours of the day per (combination, share missing, share below 1, row check)."""
        combo = ", ".join(_quote(c) for c in self.lay.combo)
        where = ""
        if without is not None:
            self.register("without_rows", "rn", without)
            where = "WHERE rn NOT IN (SELECT rn FROM without_rows)"
        q = (
            f"SELECT *, {self.combo_hash} AS ch FROM (SELECT {combo}{', ' if combo else ''}share_null, {self.lay.share_lt1()} AS share_lt1, ok, "
            f"sum({self.day.hours(self.lay)}) AS gpu_hours{self.decoded()} FROM {self.lay.source(path)} {where} GROUP BY ALL)"
        )
        return self.con.execute(q).df()

    def decoded(self) -> str:
        """Aggregates that make DuckDB decode the columns the sums do not need: a corrupt
        page anywhere fails the read here, as it fails the batch reader (never priced)."""
        return "".join(f", max(length({_quote(c)})) AS {_quote('decoded ' + c)}" for c in self.lay.identity)

    def priced(self, cells: pd.DataFrame) -> pd.DataFrame:
        """Cells of good rows as (keys, price, on-demand price, GPU-hours)."""
        ok = cells[cells["ok"].to_numpy()]
        combo = self.combos.of(ok)
        valid = self.combos.valid[combo]
        p = self.combos.priced.loc[combo[valid]].reset_index(drop=True)
        p["gpu_hours"] = ok["gpu_hours"].to_numpy(float)[valid]
        if not np.isfinite(p["gpu_hours"].to_numpy()).all():  # a value the row check let through
            raise NotApplicable("GPU-hours that are not a finite number")
        return p

    def bad_rows_sql(self, path: Path) -> str:
        cond = "NOT ok"
        if len(self.bad):
            cond += f" OR {self.row_combo_hash} IN (SELECT ch FROM bad_combos)"
        return f"SELECT rn FROM {self.lay.source(path)} WHERE {cond} ORDER BY rn"

    def quarantine(self, path: Path, cells: pd.DataFrame) -> pd.DataFrame:
        """The file's rows that fail validation, with validate_usage's reasons."""
        if cells["ok"].all() and not cells["ch"].isin(self.bad).any():
            return empty_quarantine()
        rows = self.con.execute(self.bad_rows_sql(path)).fetchnumpy()["rn"].astype(np.int64)
        out = []
        for table, at in read_rows(path, self.lay, rows, self.batch_rows):
            v = validate_usage(_raw(path, table, at), self.prices, identity=self.identity)
            if len(v.rows):
                raise NotApplicable(f"{len(v.rows)} row(s) DuckDB rejects validate_usage accepts")
            out.append(quarantine_in_window(v.quarantine, *self.day.window))
        return pd.concat(out, ignore_index=True) if out else empty_quarantine()

    def dedupe_hash(self, full: bool) -> str:
        """A hash equal for rows validate_usage parses alike. Not ``full``: cheap, from the
        raw columns whose spellings cannot collapse (more rows may share it). ``full``: with
        the other text columns stripped as ``str.strip`` strips them (DuckDB's trim with
        the same characters), for files where many rows differ only there."""
        cols = ["s", "e", "gpu_count::DOUBLE", self.lay.share_value(), *(_quote(c) for c in self.combos.hashable)]
        if full:
            cols += [f"coalesce(trim({_quote(c)}, {_literal(SPACES)}), '')" for c in self.lay.identity]
        return f"hash({', '.join(cols)})"

    def good_touching(self) -> str:
        cond = f"ok AND {self.day.touching(self.lay)}"
        if len(self.bad):
            cond += f" AND {self.row_combo_hash} NOT IN (SELECT ch FROM bad_combos)"
        return cond

    def repeated(self, hash_sql: str) -> tuple[np.ndarray, int]:
        spill = HashSpill(self.lay.rows, max(32 * self.batch_rows, 1 << 20))
        for path in self.lay.paths:
            rel = self.con.sql(f"SELECT {hash_sql} AS h FROM {self.lay.source(path)} WHERE {self.good_touching()}")
            reader = getattr(rel, "to_arrow_reader", None) or rel.fetch_arrow_reader  # DuckDB 2 / 1.x
            for batch in reader(1 << 20):
                spill.add(np.asarray(batch.column(0)).astype(np.uint64, copy=False))
        return spill.repeated()

    def duplicates(self) -> list[pd.DataFrame]:
        """Per file, its rows identical to an earlier good row (quarantine rows)."""
        limit = max(4 * self.batch_rows, 1 << 16)  # rows compared in memory at most
        hash_sql = self.dedupe_hash(full=False)
        repeated, rows = self.repeated(hash_sql)
        if rows > limit:  # e.g. hourly exports: times and teams alike, pods not
            hash_sql = self.dedupe_hash(full=True)
            repeated, rows = self.repeated(hash_sql)
        if rows > limit:
            raise NotApplicable(f"{rows:,} rows alike to compare (at most {limit:,} in memory)")
        if not len(repeated):
            return [empty_quarantine() for _ in self.lay.paths]
        self.register("repeated", "h", repeated)
        raw: list[pd.DataFrame] = []
        for path in self.lay.paths:
            at = self.con.execute(f"SELECT rn FROM {self.lay.source(path)} WHERE {self.good_touching()} AND {hash_sql} IN (SELECT h FROM repeated) ORDER BY rn").fetchnumpy()["rn"].astype(np.int64)
            raw.extend(_raw(path, t, got) for t, got in read_rows(path, self.lay, at, len(at) or 1))
        q = validate_usage(concat_raw(raw), self.prices, identity=self.identity).quarantine
        if len(q) and (q["field"] != DUPLICATE_FIELD).any():
            raise NotApplicable("a row DuckDB accepts validate_usage rejects")
        return [q[q["location"] == str(path)].reset_index(drop=True) for path in self.lay.paths]
