"""The cost engine: every usage source through one DuckDB query built from the rule book.

Sources are handed over as Arrow tables (files read by :mod:`gpu_ops.flows.cost.read`, the
ledger and collected tables, raw frames of a caller) with their provenance (source,
location, row). One pass compiles :mod:`gpu_ops.domain.cost.rules` for the way each source
stores its columns and yields, from the same tables:

- **good rows**: typed, canonical (catalog names), priced per GPU-hour (price table ×
  region multiplier), each interval once (see *identity* below);
- **quarantine rows**: source, location, row, field, reason, the raw record and the
  parsed times (which place the row in its day); file-level problems (a pattern that
  matches nothing, an unreadable file) and CSV lines that could not be split come in as
  ready-made quarantine rows.

*Identity*: a good row identical in every typed column to an earlier one is a
``duplicate``; good rows with the same :data:`~gpu_ops.domain.cost.rules.IDENTITY_KEY`
(namespace, pod — or run and attempt —, start, GPU type) are one interval seen several
times: the closed record supersedes the open one, the latest end the earlier ends, and
among equal ends the last delivered; the others are quarantined as ``superseded``,
naming the winning record and the fields in which the two differ.

``duckdb`` and ``pyarrow`` are imported when the engine runs; pandas only to hand the
result to the pandas consumers (:meth:`UsageEngine.frame`: ``pipeline.price_window`` for
the CLI's budgets and ROI commands, the deprecated ``validate``); the daily partition's
stored rows go from here to their files in DuckDB (:mod:`gpu_ops.flows.cost.stored`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from gpu_ops.domain.memory import freed_blocks_back_at_once
from gpu_ops.domain.cost import rules as R
from gpu_ops.flows.cost.read import INVENTORY, USAGE, FileRows, UsageSourceError, empty_table
from gpu_ops.domain.cost.columns import CAPACITY_TYPES
from gpu_ops.flows.cost.pricing import PriceMatrix
from gpu_ops.domain.cost.repeats import MEMORY_BYTES, Fingerprints, RepeatedHashes

# Schema metadata of a quarantine built for its first rows only (UsageEngine.quarantine_arrow):
# how many rows the whole quarantine holds (file and line problems included).
QUARANTINE_ROWS = "gpu_ops.quarantine_rows"
# Good-row columns handed on (optional ones only when some source has them).
_ALWAYS = ("namespace", "pod", "node", "team", "project", "cost_center", "experiment_id", "gpu_type", "capacity_type", "sharing", "region")
_OPTIONAL_TEXT = ("labels", "run_id", "asset_key", "outcome", "instance_type")
_IKEY = "CASE WHEN pod <> '' THEN pod WHEN run_id <> '' THEN 'run ' || run_id || ' attempt ' || coalesce(CAST(attempt AS VARCHAR), '?') END"


def _key_hash(ikey: str) -> str:
    """SQL: the hash of an identity key without its GPU type (namespace, ``ikey``: pod or
    attempt, start): rows whose keys are equal share it (so do the few whose keys differ
    only in the GPU type; the identity rules compare the whole key). Without the GPU type
    it needs no catalog name, so the screening pass can do without the lookup join."""
    return f"hash(namespace, {ikey}, start_us)"


_KEY_HASH = _key_hash(_IKEY)


# The raw columns the lookup is keyed by, and their names in the typed layer.
_LOOKUP_KEYS = ("gpu_type", "capacity_type", "region")
_LOOKUP_TYPED = ("gpu_type_raw", "capacity_type", "region")
# Distinct raw values of a lookup key column the text check keeps at most (beyond: a scan).
_MAX_CHOICES = 10_000
# Values of a text column that need a trim the text check names at most (beyond: every
# row of the column is trimmed and searched).
_MAX_FAILING = 1_000


def _tally_keys(tally: Tally) -> str:
    """SQL: the columns a tally is grouped by (its keys, then the lookup's)."""
    return ", ".join(dict.fromkeys((*tally.keys, *_LOOKUP_TYPED)))


# Key hashes a batch of the tally's hash pass holds (8 MiB): fewer, larger batches to copy
# (10M rows: 0.8 s -> 0.7 s for the pass when they were split into buckets).
_HASH_BATCH = 1 << 20
_POS_SPAN = 1 << 40  # a bad row's place, ord and pos in one integer: ord * _POS_SPAN + pos
_IDENTITY_COLUMNS = (
    "start_us", "end_us", *R.TEXT_COLUMNS, "gpu_type", "gpu_count", "capacity_type", "sharing", "gpu_share", "attempt", "last_checkpoint_us", "lost_seconds",
)


@dataclass(frozen=True)
class _Key:
    """What makes records one interval seen several times: columns of table ``good``
    (``ikey``: the pod or attempt, or the node), and how a reason names them."""

    columns: tuple[str, ...]
    named: str


_INTERVAL_KEY = _Key(("namespace", "ikey", "start_us", "gpu_type"), "the same interval (namespace, pod, start, gpu_type)")
_NODE_KEY = _Key(("ikey", "start_us"), "the same node record (node, start)")
_OPEN = 2**63 - 1  # the end of an open record, in the node inventory's overlap rule


def _record_at(location: str, row: str, here: str) -> str:
    """SQL: a record named by its ``location`` (left out when it is ``here``) and ``row``."""
    return f"(CASE WHEN {location} = {here} THEN '' ELSE {location} || ' ' END) || 'row ' || coalesce(CAST({row} AS VARCHAR), '?')"


@dataclass
class Part:
    """One source table registered in the engine."""

    name: str
    layout: dict[str, R.Stored]
    source: str
    location: str | None  # None: the table has a location column
    has_row: bool
    labels: dict[str, R.Stored]  # label:<name> columns
    has_source: bool
    clean: frozenset[str] = frozenset()  # text columns no value of which needs a trim or holds a control character
    by_value: R.ByValue = field(default_factory=dict)  # text columns only these values of which may (their text in dictionaries)
    file: FileRows | None = None  # a Parquet file DuckDB scans (read as Arrow instead if the scan fails)
    rows: int = 0
    # The raw values of the columns the lookup is keyed by (None: a missing value), as the
    # text check met them (a dictionary's values); None: not known, the lookup scans for them.
    choices: dict[str, set[Any]] | None = None


@dataclass(frozen=True)
class Tally:
    """Sums of the good rows a caller wants from the screening pass itself (see
    :meth:`UsageEngine.check`): ``value`` (SQL over a typed row, with the lookup's keys
    ``gpu_type_raw``, ``capacity_type``, ``region``) summed per ``keys`` (typed columns)
    and lookup key. The copies and superseded records the identity rules find are
    subtracted: each interval is counted once, as in the good rows."""

    keys: tuple[str, ...]
    value: str


@dataclass
class EngineResult:
    rows: Any  # pandas DataFrame of good rows (validate_usage's layout)
    quarantine: Any  # pandas DataFrame, QUARANTINE_COLUMNS


def stored(t: Any) -> R.Stored:
    """How an Arrow type stores a usage column."""
    import pyarrow as pa

    if pa.types.is_dictionary(t):
        t = t.value_type
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return R.Stored(R.STORED_TEXT)
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t) or pa.types.is_binary_view(t):
        return R.Stored(R.STORED_BINARY)
    if pa.types.is_timestamp(t):
        return R.Stored(R.STORED_TIME, unit=t.unit)
    if pa.types.is_date(t):
        return R.Stored(R.STORED_TIME, unit="day" if pa.types.is_date32(t) else "ms")
    if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t):
        return R.Stored(R.STORED_NUMBER)
    if pa.types.is_null(t):
        return R.Stored(R.STORED_NULL)
    if pa.types.is_nested(t):
        kind = "struct" if pa.types.is_struct(t) else "map" if pa.types.is_map(t) else "list"
        return R.Stored(R.STORED_NESTED, nested=kind)
    return R.Stored(R.STORED_OTHER)


def _held_type(t: Any) -> Any:
    """The type DuckDB and Arrow's compute kernels take for a value of type ``t``: views
    as their large layouts, half floats as doubles, 256-bit decimals as doubles (a usage
    number past 1e38 is quarantined as implausible either way), dictionaries and nested
    types by their values; ``t`` itself when it is taken as it is."""
    import pyarrow as pa

    if pa.types.is_string_view(t):
        return pa.large_string()
    if pa.types.is_binary_view(t):
        return pa.large_binary()
    if pa.types.is_float16(t) or pa.types.is_decimal256(t):
        return pa.float64()
    if pa.types.is_dictionary(t):
        value = _held_type(t.value_type)
        return t if value.equals(t.value_type) else pa.dictionary(t.index_type, value)
    fields = [t.field(i) for i in range(t.num_fields)]
    held = [f.with_type(_held_type(f.type)) for f in fields]
    if all(a.equals(b) for a, b in zip(fields, held)):
        return t
    if pa.types.is_struct(t):
        return pa.struct(held)
    if pa.types.is_map(t):
        return pa.map_(_held_type(t.key_type), _held_type(t.item_type))
    return pa.large_list(held[0].type)  # the list layouts


def _held_types(table: Any) -> Any:
    """``table`` with each column of a type DuckDB or Arrow's text kernels refuse (string
    and binary views, half floats, 256-bit decimals, anywhere in a nested type) cast to
    one they take (:func:`_held_type`); the values are unchanged."""
    import pyarrow as pa

    for i, fld in enumerate(table.schema):
        want = _held_type(fld.type)
        if want.equals(fld.type):
            continue
        col = table.column(i)
        if pa.types.is_dictionary(fld.type):  # Arrow casts no dictionary to another value type
            col = pa.chunked_array([pa.DictionaryArray.from_arrays(c.indices, c.dictionary.cast(want.value_type)) for c in col.chunks], want)
        else:
            col = col.cast(want)
        table = table.set_column(i, pa.field(fld.name, want), col)
    return table


def _text_as_binary_where_invalid(table: Any) -> Any:
    """Text columns with invalid UTF-8 become BINARY (the rule book quarantines the bad
    values row by row); DuckDB refuses such text outright."""
    import pyarrow as pa

    for i, fld in enumerate(table.schema):
        t = fld.type.value_type if pa.types.is_dictionary(fld.type) else fld.type
        if not (pa.types.is_string(t) or pa.types.is_large_string(t)):
            continue
        col = table.column(i)
        try:
            for chunk in col.chunks:
                chunk.validate(full=True)
        except pa.ArrowInvalid:
            plain = col.cast(t) if pa.types.is_dictionary(fld.type) else col
            binary = pa.large_binary() if pa.types.is_large_string(t) else pa.binary()
            table = table.set_column(i, pa.field(fld.name, binary), plain.cast(binary))
    return table


class UsageEngine:
    """Collects sources, then :meth:`run` validates, de-duplicates and prices them at once."""

    def __init__(self, prices: PriceMatrix, kind: str = USAGE):
        """``kind``: usage intervals, or the node inventory (``node`` required, no
        sharing, a blank GPU type and count taken from a known instance type)."""
        import duckdb

        freed_blocks_back_at_once()  # the pieces are gathered and converted column by column
        self.prices, self.kind = prices, kind
        self.con = duckdb.connect()
        self.con.execute("SET TimeZone = 'UTC'")
        self.con.execute("SET enable_progress_bar = false")
        self.con.execute("SET allocator_flush_threshold = '16MB'")
        # What DuckDB frees is handed back to the system by the allocator's own background
        # threads, as the passes run: 30-50 MiB less at the CLI's peak over 10M rows, at no
        # cost in time (handing it back at once, in the query's own threads, slows a pass:
        # see _freeing_at_once).
        self.con.execute("SET allocator_background_threads = true")
        self.parts: list[Part] = []
        self._parts_made = 0
        self.problems: list[dict[str, Any]] = []  # ready-made quarantine rows (file, line)
        # After check(): the good rows' columns, whether rows are left out, whether keys repeat.
        self._columns: tuple[dict[str, str], list[str], list[str], list[str]] = ({}, [], [], [])
        self._excluding = self._repeats = self._bad = self._clipping = False
        # Whether the screening pass joins the lookup and runs the rules that read it on
        # every row: None, only when some row of the lookup fails them (else they cannot
        # fail on any row); True, always (the general path, which tests hold it to).
        self.screen_lookup: bool | None = None
        # What the good rows' identity-key hashes may hold in one array (beyond: bucket files).
        self.key_memory_bytes = MEMORY_BYTES
        # After check(tally=...): table ``tally`` holds the tally's sums (keys, lookup keys, value, n).
        self.tallied = False
        # After the screening pass: the places (ord * span + pos) of the rows that may hold a
        # repeated key hash, and how many hashes it counted among the repeated ones (every
        # row's, or only the good rows' when not _hashed_every_row); None: not known.
        self._candidates: tuple[Any, int] | None = None
        self._hashed_every_row = False
        self._bad_times = False  # table bad_times holds the bad rows' places and times
        if kind == INVENTORY:
            _register_instance_map(self.con)

    def close(self) -> None:
        self.con.close()

    # ------------------------------------------------------------------ input

    def add_arrow(self, table: Any, source: str = "file", location: str | None = None, rows: Any = None) -> None:
        """A source table (any subset of the usage columns; provenance columns ``source``,
        ``location``, ``row`` are used when present). ``rows``: 1-based row numbers."""
        import numpy as np
        import pyarrow as pa

        if self.kind == INVENTORY:  # a node's GPUs are whole: sharing is a pod's
            table = table.drop_columns([c for c in ("sharing", "gpu_share") if c in table.column_names])
        table = _text_as_binary_where_invalid(_held_types(table))
        layout = {f.name: stored(f.type) for f in table.schema if f.name in R.ALL_COLUMNS}
        labels = {f.name: stored(f.type) for f in table.schema if f.name.startswith("label:")}
        if labels:
            layout["labels"] = layout.get("labels", R.Stored(R.STORED_NULL))
        table = _times_as_integers(table)
        layout = _with_time_spans(table, layout)
        n = table.num_rows
        if rows is not None:
            table = _set(table, "__row", int_array(np.asarray(rows, np.int64)))
        elif "row" in table.column_names:
            table = _set(table, "__row", table.column("row").cast(pa.int64()))
        table = _set(table, "__pos", int_array(np.arange(n, dtype=np.int64)))
        if location is None and "location" not in table.column_names:
            location = "<table>"
        if "location" in table.column_names and location is None:
            table = _set(table, "__location", table.column("location").cast(pa.string()))
        if "source" in table.column_names:
            table = _set(table, "__source", table.column("source").cast(pa.string()))
        name = self._name()
        self.con.register(name, table)
        choices = self._choices_to_gather(layout)
        failing: dict[str, set[str] | None] = {}
        clean = clean_text_columns([table], layout, bool(labels), choices=choices, failing=failing) | {c for c, st in layout.items() if st.bounded}
        part = Part(name, layout, source, location, "__row" in table.column_names, labels, "__source" in table.column_names, clean, _by_value(failing), rows=n, choices=_known(choices))
        self.parts.append(part)

    def _name(self) -> str:
        self._parts_made += 1
        return f"part_{self._parts_made}"

    def add_file(self, f: FileRows, source: str = "file") -> None:
        """A file's rows: a Parquet scan (:class:`~gpu_ops.flows.cost.read.ParquetScan`) read by
        DuckDB as the query runs, its text columns checked first one row group at a time
        (invalid UTF-8 anywhere: read as Arrow, where the rule book quarantines it by row);
        otherwise its Arrow table."""
        import pyarrow as pa

        if f.scan is None:
            self.add_arrow(f.table, source, str(f.path), f.rows)
            return
        schema = f.scan.schema
        layout = {n: stored(schema.field(n).type) for n in schema.names if n in R.ALL_COLUMNS}
        labels = {n: stored(schema.field(n).type) for n in schema.names if n.startswith("label:")}
        if labels:
            layout["labels"] = layout.get("labels", R.Stored(R.STORED_NULL))
        text = [n for n in schema.names if stored(schema.field(n).type).kind == R.STORED_TEXT]
        choices = self._choices_to_gather(layout)
        failing: dict[str, set[str] | None] = {}
        try:
            clean = clean_text_columns(f.scan.text_batches(f.path, text), layout, bool(labels), utf8=True, choices=choices, failing=failing)
        except (pa.ArrowException, OSError):  # not UTF-8, or unreadable: the Arrow read judges it
            self._add_loaded(f, source)
            return
        finally:
            pa.default_memory_pool().release_unused()  # the row groups read: gone before DuckDB reads
        select = []
        for n in schema.names:
            st = layout.get(n) or labels[n]
            if st.kind == R.STORED_TIME:
                unit = schema.field(n).type.unit
                layout[n] = _time_layout(unit, f.scan.times[n])
                select.append(f"epoch_{unit}({R.quote(n)}) AS {R.quote(n)}")
            else:
                select.append(R.quote(n))
        clean |= {n for n, st in layout.items() if st.bounded}
        ranges = f.scan.ranges()
        where = "" if ranges == [(0, f.scan.firsts[-1] - 1)] else " WHERE " + (" OR ".join(f"file_row_number BETWEEN {lo} AND {hi}" for lo, hi in ranges) or "false")
        name = self._name()
        self.con.execute(
            f"CREATE OR REPLACE TEMP VIEW {name} AS SELECT {', '.join(select)}, file_row_number + 1 AS __row, file_row_number AS __pos "
            f"FROM read_parquet({R.literal(str(f.path))}, file_row_number = true){where}"
        )
        rows = sum(f.scan.firsts[i + 1] - f.scan.firsts[i] for i in f.scan.groups)
        self.parts.append(Part(name, layout, source, str(f.path), True, labels, False, clean, _by_value(failing), f, rows, _known(choices)))

    def _choices_to_gather(self, layout: dict[str, R.Stored]) -> dict[str, set[Any] | None] | None:
        """Sets for the text check to fill with the raw values of the lookup's key columns
        (a missing column: its one value is None); None where they cannot stand for the
        typed values: a key column not stored as text, or the node inventory (whose blank
        GPU types are filled from instance types)."""
        if self.kind != USAGE or any(c in layout and layout[c].kind != R.STORED_TEXT for c in _LOOKUP_KEYS):
            return None
        return {c: set() if c in layout else {None} for c in _LOOKUP_KEYS}

    def _add_loaded(self, f: FileRows, source: str) -> None:
        """A scanned file read as Arrow (what cannot be read: a file-level problem, and no rows)."""
        try:
            table, rows = f.load()
        except UsageSourceError as exc:
            self.add_problem(exc.location, exc.reason, source)
            table, rows = empty_table(f.scan.schema) if f.scan else f.table.slice(0, 0), []
        self.add_arrow(table, source, str(f.path), rows)

    def add_problem(self, location: str, reason: str, source: str = "file", row: int | None = None) -> None:
        """A file or pattern that gave no rows (no ``row``), or one CSV line (``row``)."""
        field = R.FILE_FIELD if row is None else R.LINE_FIELD
        self.problems.append({"source": source, "location": location, "row": row, "field": field, "reason": reason, "record": "", "start": None, "end": None})

    # ------------------------------------------------------------------ the query

    def _part_sql(self, i: int, p: Part, record: bool = False, where: str = "") -> str:
        loc = "__location" if p.location is None else R.literal(p.location)
        src = "__source" if p.has_source else R.literal(p.source)
        row = "__row" if p.has_row else f"row_number() OVER (PARTITION BY {loc} ORDER BY __pos)"
        cols = R.raw_select(p.layout, p.labels, record=record)
        return f"SELECT {', '.join(cols)}, CAST({src} AS VARCHAR) AS source, CAST({loc} AS VARCHAR) AS location, CAST({row} AS BIGINT) AS row, {i} AS ord, __pos AS pos FROM {p.name} {where}"

    def _typed_sql(self, positions: str = "") -> str:
        """Raw and typed layers per part (each compiled for its own clean columns), then one
        union. ``positions``: a table of (ord, pos); only those rows of parts whose row
        numbers are given (the others are computed whole: their numbers count every row)."""
        return " UNION ALL BY NAME ".join(self._typed_parts(positions))

    def _typed_parts(self, positions: str = "") -> list[str]:
        parts = []
        for i, p in enumerate(self.parts):
            where = f"WHERE __pos IN (SELECT pos FROM {positions} WHERE ord = {i})" if positions and p.has_row else ""
            raw = self._part_sql(i, p, where=where)
            if self.kind == INVENTORY:
                raw = R.inventory_raw(raw)
            parts.append(f"SELECT *, {R.text_control(p.clean, p.by_value)} AS text_control FROM (SELECT *, {', '.join(R.typed_select(p.clean, p.by_value))} FROM ({raw}))")
        return parts

    def _distinct_keys(self) -> tuple[list[str], list[str], list[str]]:
        """The distinct typed GPU types (raw), capacity types and regions: from the raw values
        the text check met (each through the rule book's typed expression, on a few
        values), or else one scan for the three (never NULL in the typed layer)."""
        raw = [p.choices for p in self.parts]
        if all(raw):
            typed = R.typed_columns()
            sql = ", ".join(f"(SELECT list(DISTINCT {typed[t]}) FROM (SELECT unnest(${i + 1}::VARCHAR[]) AS {R.quote('r_' + c)}))" for i, (c, t) in enumerate(zip(_LOOKUP_KEYS, _LOOKUP_TYPED)))
            got = self.con.execute(f"SELECT {sql}", [sorted(set().union(*(r[c] for r in raw if r)), key=str) for c in _LOOKUP_KEYS]).fetchall()[0]
        else:
            got = self.con.execute(f"SELECT {', '.join(f'list(DISTINCT {t})' for t in _LOOKUP_TYPED)} FROM typed").fetchall()[0]
        gpu_raw, caps, regions = (list(values or []) for values in got)
        return gpu_raw, caps, regions

    def _lookups(self) -> None:
        """The catalog, region and price tables of the values present (a few rows each)."""

        from gpu_ops.domain.compute.catalog import UnknownGpuType, canonical_gpu_type

        gpu_raw, caps, regions = self._distinct_keys()
        canon: dict[str, tuple[str | None, str | None]] = {}  # raw name -> (catalog name, error)
        for g in gpu_raw:
            try:
                canon[g] = (canonical_gpu_type(g) if g else None, None)
            except UnknownGpuType as exc:
                canon[g] = (None, str(exc))
        known = ", ".join(sorted(self.prices.regions))
        mult = {r: m if (m := self.prices.region_multiplier(r)) == m else None for r in regions}  # NaN: no multiplier
        if len(gpu_raw) * len(caps) * len(regions) <= 100_000:
            keys = [(g, c, r) for g in gpu_raw for c in caps for r in regions]
        else:  # many distinct values (a hostile file): the combinations present
            keys = self.con.execute("SELECT DISTINCT gpu_type_raw, capacity_type, region FROM typed").fetchall()
        rows = [(g, c, r, *canon[g], mult[r], None if mult[r] is not None else f"no price multiplier for region {r!r} (regions: {known})", *self._price(canon[g][0], c, mult[r])) for g, c, r in keys]
        names = ("gpu_type_raw", "capacity_type", "region", "gpu_type", "gpu_type_error", "region_multiplier", "region_error", "price_per_gpu_hour", "on_demand_price_per_gpu_hour", "price_error")
        types = ("VARCHAR",) * 5 + ("DOUBLE", "VARCHAR", "DOUBLE", "DOUBLE", "VARCHAR")
        values_table(self.con, "lookup", {n: (t, [row[i] for row in rows]) for i, (n, t) in enumerate(zip(names, types))})

    def _price(self, gpu: str | None, capacity: str, multiplier: float | None) -> tuple[float | None, float | None, str | None]:
        """(price per GPU-hour, on-demand price per GPU-hour, why there is no price) of a
        catalog GPU type and capacity type in a region (its multiplier)."""
        if gpu is None or capacity not in CAPACITY_TYPES:
            return None, None, None
        base, on_demand = self.prices.price(gpu, capacity), self.prices.price(gpu, "on-demand")
        m = multiplier
        return None if m is None or base != base else base * m, None if m is None or on_demand != on_demand else on_demand * m, self.prices.describe_missing(gpu, capacity)

    def run(self, keep: Sequence[str] | None = None) -> EngineResult:
        """Validate, de-duplicate and price everything added, as pandas frames; the
        quarantine is not yet limited to a window. ``keep``: the text columns the good
        rows need (None: all)."""
        if not self.parts:
            return EngineResult(_empty_rows(), _quarantine_frame(self.problems, None))
        out = self.check(keep)
        return EngineResult(self._good_rows(*out), self._quarantine())

    def time_span(self) -> tuple[int, int] | None:
        """(first start, last end: the first start when no row has ended) in UTC
        microseconds over every row whose times the rule book reads, good or bad, or None:
        where the usage is (the CLI's hint for an empty day). Nothing is checked."""
        import duckdb

        if not self.parts:
            return None
        try:  # the typed layer's times are supported ones or NULL
            first, last = self.con.execute(f"SELECT min(start_us), max(end_us) FROM ({self._typed_sql()})").fetchall()[0]
        except duckdb.Error:  # a file DuckDB cannot scan: no hint rather than a traceback
            return None
        return None if first is None else (first, first if last is None else last)

    def check(self, keep: Sequence[str] | None = None, tally: Tally | None = None) -> tuple[dict[str, str], list[str], list[str], list[str]]:
        """Run the rule book and the identity rules; the good rows are then
        :meth:`good_sql` (a query that streams from the sources), the quarantine
        :meth:`quarantine_arrow`. Returns the good rows' columns (times: engine name ->
        name, text, numbers, provenance).

        Nothing as large as the rows is kept: one pass over every row (:meth:`_screen`)
        keeps only the positions of bad rows and the identity-key hashes that repeat
        among good rows (none, usually); the identity rules then look at the rows of
        those keys alone, and the rows they and the rule book set aside are excluded from
        the good rows by position. A Parquet scan DuckDB cannot read through is read as
        Arrow and the check run again.

        With a ``tally`` the pass is split in two: the rule book with the tally's sums
        (an aggregate: no row leaves DuckDB) and the identity-key hash of every row
        (streamed); a key whose hash repeats, even a bad row's, goes to the identity rules,
        which look at the good rows alone, and the sums of the copies and superseded
        records they find are subtracted. The sums are then :attr:`tallied`: the caller
        needs no second pass over the good rows."""
        import duckdb

        try:
            return self._check(keep, tally)
        except duckdb.Error:
            if not any(p.file for p in self.parts):
                raise
        parts, self.parts = self.parts, []
        for p in parts:
            if p.file is None:
                self.parts.append(p)
            else:
                self._add_loaded(p.file, p.source)
        return self._check(keep, tally)

    def _check(self, keep: Sequence[str] | None, tally: Tally | None) -> tuple[dict[str, str], list[str], list[str], list[str]]:
        self.con.execute(f"CREATE OR REPLACE TEMP VIEW typed AS {self._typed_sql()}")
        self._bad_times = False
        self._lookups()
        if tally is None:
            self._screen()
        else:
            self._tally(tally)
        repeats = self._identity()
        parts = ["SELECT ord, pos FROM bad_pos", *(["SELECT ord, pos FROM copies", "SELECT ord, pos FROM superseded"] if repeats else [])]
        self.con.execute(f"CREATE OR REPLACE TEMP TABLE excluded AS {' UNION ALL '.join(parts)}")
        self._bad = bool(self.con.execute("SELECT count(*) FROM bad_pos").fetchall()[0][0])
        self._excluding = bool(self.con.execute("SELECT count(*) FROM excluded").fetchall()[0][0])
        self._repeats = repeats
        if tally is not None and repeats:
            self._untally(tally)
        self.tallied = tally is not None
        self._columns = self._out_columns(keep)
        return self._columns

    def _untally(self, tally: Tally) -> None:
        """Takes the copies and superseded records (counted once by the identity rules) out
        of table ``tally``: their own sums and counts, per key, subtracted."""
        self.con.execute("CREATE OR REPLACE TEMP TABLE counted_twice AS SELECT ord, pos FROM copies UNION ALL SELECT ord, pos FROM superseded")
        if not self.con.execute("SELECT count(*) FROM counted_twice").fetchall()[0][0]:
            return
        import duckdb

        keys = _tally_keys(tally)
        # Their typed records are in table ``good`` (the identity rules compared them): no
        # pass over the sources, unless the tally reads a column ``good`` lacks.
        try:
            self.con.execute(
                f"CREATE OR REPLACE TEMP TABLE twice AS SELECT {keys}, sum(v) AS value, count(v) AS n FROM "
                f"(SELECT {keys}, {tally.value} AS v FROM good SEMI JOIN counted_twice USING (ord, pos)) GROUP BY ALL"
            )
        except duckdb.BinderException:
            self.con.execute(
                f"CREATE OR REPLACE TEMP TABLE twice AS SELECT {keys}, sum(v) AS value, count(v) AS n FROM (SELECT {keys}, {tally.value} AS v "
                f"FROM ({self._typed_sql('counted_twice')}) WHERE (ord, pos) IN (SELECT (ord, pos) FROM counted_twice)) GROUP BY ALL"
            )
        self.con.execute(
            f"CREATE OR REPLACE TEMP TABLE tally AS SELECT t.* REPLACE (t.value - coalesce(m.value, 0) AS value, t.n - coalesce(m.n, 0) AS n) "
            f"FROM tally t LEFT JOIN twice m USING ({keys})"
        )

    def _flagged_parts(self, columns: str) -> list[str]:
        """SQL per part: ``columns`` of its typed rows (the lookup joined if some row of it
        fails a rule) and ``bad``, whether a row fails the rule book; each part's rules
        with its own flags written in, those that read only the lookup's keys left out when
        no row of the lookup fails them."""
        lookup = self.screen_lookup if self.screen_lookup is not None else self.lookup_fails()
        keys = self.screen_lookup is not None or self.key_rules_fail()
        out = []
        for p, typed in zip(self.parts, self._typed_parts()):
            bad = f"storage_bad OR {R.rules_bad(self.kind, p.layout if self.kind == USAGE else None, lookup=False, keys=keys)}"
            if lookup:
                out.append(f"SELECT {columns}, bad0 OR {R.rules_bad(self.kind, lookup=True)} AS bad FROM ({_joined(f'(SELECT *, {bad} AS bad0 FROM ({typed}))')})")
            else:
                out.append(f"SELECT {columns}, {bad} AS bad FROM ({typed})")
        return out

    def _tally(self, tally: Tally) -> None:
        """The screening pass split in two (see :meth:`check`): every row's identity-key hash
        (table ``repeats``), then the rule book with the tally's sums into table ``tally``
        and the bad rows' places into ``bad_pos``, run while the hashes are sorted (numpy,
        on a thread of its own: the sort uses one core, DuckDB the others)."""
        import numpy as np

        keys = _tally_keys(tally)
        rows = " UNION ALL ".join(self._flagged_parts(f"{keys}, ord, pos, start_us, end_us, {tally.value} AS __value"))
        bad_at: list[Any] = []

        def rule_book() -> None:
            self.con.execute(
                f"CREATE OR REPLACE TEMP TABLE tally_raw AS SELECT {keys}, sum(__value) FILTER (WHERE NOT bad) AS value, count(__value) FILTER (WHERE NOT bad) AS n, "
                f"list({{'place': ord * {_POS_SPAN} + pos, 'start_us': start_us, 'end_us': end_us}}) FILTER (WHERE bad) AS bad_at FROM ({rows}) GROUP BY ALL"
            )
            self.con.execute(f"CREATE OR REPLACE TEMP TABLE tally AS SELECT {keys}, value, n FROM tally_raw WHERE n > 0")
            # The bad rows' times (the typed layer's): which of them a window's quarantine holds,
            # known without computing their records again (see quarantine_arrow's ``first``).
            self.con.execute(
                f"CREATE OR REPLACE TEMP TABLE bad_times AS SELECT b.place // {_POS_SPAN} AS ord, b.place % {_POS_SPAN} AS pos, b.start_us, b.end_us, b.place "
                "FROM (SELECT unnest(bad_at) AS b FROM tally_raw WHERE bad_at IS NOT NULL)"
            )
            self._bad_times = True
            places = self.con.sql("SELECT place FROM bad_times").to_arrow_table().column("place")
            bad_at.extend(_values(c, np.int64) for c in places.chunks if len(c))  # (combine_chunks of none would import pandas)
            self.con.execute("DROP TABLE tally_raw")

        reader = self.con.sql(f"SELECT {_KEY_HASH} AS key_hash FROM typed").to_arrow_reader(_HASH_BATCH)
        self._hashed_every_row = True
        repeats = self._repeated_hashes(reader, meanwhile=rule_book)
        self._keep_screened(bad_at, repeats)

    def _repeated_hashes(self, reader: Any, bad_at: list[Any] | None = None, meanwhile: Callable[[], None] | None = None) -> Any:
        """The hashes of column ``key_hash`` of ``reader``'s batches (a NULL: none) that occur
        more than once; with ``bad_at``, the non-NULL values of column ``bad_at`` appended.
        ``reader`` streams the rows of table ``typed`` in their order: where the hashes are
        held in memory, each row's fingerprint is kept by its place, and the rows that may
        hold a repeated hash are found from them (:attr:`_candidates`, for the identity
        rules: no second pass computing every row's hash). ``meanwhile``: run on this
        thread once the stream is read, while the hashes are sorted on another."""
        import numpy as np

        rows = sum(p.rows for p in self.parts)
        keys = RepeatedHashes(rows, self.key_memory_bytes)
        prints = Fingerprints(rows) if not keys.bits else None
        self._candidates = None
        try:
            for batch in reader:
                key = batch.column("key_hash")
                if bad_at is not None and (at := batch.column("bad_at")).null_count < len(at):
                    bad_at.append(_values(at.drop_null(), np.int64).copy())
                if prints is not None:
                    prints.add(_values(key, np.uint64))  # a NULL's place holds some value: the identity step judges it
                if key.null_count:
                    key = key.drop_null()
                keys.add(_values(key, np.uint64))
            if meanwhile is None:
                return self._sorted_repeats(keys, prints, rows)
            from concurrent.futures import ThreadPoolExecutor

            with ThreadPoolExecutor(1, thread_name_prefix="gpu_ops-key-sort") as pool:
                sorting = pool.submit(self._sorted_repeats, keys, prints, rows)
                meanwhile()
                return sorting.result()
        finally:
            keys.close()
            if prints is not None:
                prints.close()

    def _sorted_repeats(self, keys: RepeatedHashes, prints: Fingerprints | None, rows: int) -> Any:
        """The repeated hashes of ``keys``, and :attr:`_candidates` from ``prints`` (every row's
        fingerprint, when held)."""
        repeats = keys.repeats()
        if prints is not None and len(repeats) and prints.n == rows:
            self._candidates = (self._at_places(prints.places(repeats)), keys.repeated_rows)
        return repeats

    def _at_places(self, places: Any) -> Any:
        """``ord * span + pos`` of the rows at ``places`` (ascending) of table ``typed``'s
        rows in order: each part's rows in turn, those of a scanned file in the ranges of
        row groups it reads."""
        import numpy as np

        out = np.empty(len(places), np.int64)
        first = 0
        for i, p in enumerate(self.parts):
            spans = p.file.scan.ranges() if p.file is not None and p.file.scan is not None else [(0, p.rows - 1)]
            lo, hi = np.searchsorted(places, [first, first + p.rows])
            local = places[lo:hi] - first
            lengths = np.array([b - a + 1 for a, b in spans], np.int64)
            ends = np.cumsum(lengths)
            k = np.searchsorted(ends, local, side="right")
            starts = np.array([a for a, _ in spans], np.int64)
            out[lo:hi] = i * _POS_SPAN + starts[k] + local - (ends[k] - lengths[k])
            first += p.rows
        return out

    def _keep_screened(self, bad_at: list[Any], repeats: Any) -> None:
        """Tables ``bad_pos`` (ord, pos of each bad row, from the int64 arrays ``bad_at``:
        ord * span + pos) and ``repeats`` (key_hash)."""
        import numpy as np
        import pyarrow as pa

        at_all = np.concatenate(bad_at) if bad_at else np.empty(0, np.int64)

        self.con.register("screened_bad", pa.table({"ord": int_array(at_all // _POS_SPAN), "pos": int_array(at_all % _POS_SPAN)}))
        self.con.register("screened_repeats", pa.table({"key_hash": pa.Array.from_buffers(pa.uint64(), len(repeats), [None, pa.py_buffer(repeats)])}))
        self.con.execute("CREATE OR REPLACE TEMP TABLE bad_pos AS SELECT * FROM screened_bad")
        self.con.execute("CREATE OR REPLACE TEMP TABLE repeats AS SELECT * FROM screened_repeats")
        self.con.unregister("screened_bad")
        self.con.unregister("screened_repeats")
        pa.default_memory_pool().release_unused()

    def _screen(self) -> None:
        """One pass of the rule book over every row, streamed out as two narrow columns: the
        place of each bad row (table ``bad_pos``: ord, pos) and the identity-key hash of
        each good row; the hashes are sorted (numpy) and those several good rows share
        kept (table ``repeats``, usually empty). Nothing as large as the rows is kept in
        DuckDB."""
        parts = self._flagged_parts(f"ord, pos, namespace, {_IKEY} AS ikey, start_us")
        sql = f"SELECT CASE WHEN bad THEN ord * {_POS_SPAN} + pos END AS bad_at, CASE WHEN NOT bad THEN {_key_hash('ikey')} END AS key_hash FROM ({' UNION ALL '.join(parts)})"
        bad_at: list[Any] = []
        self._hashed_every_row = False
        repeats = self._repeated_hashes(self.con.sql(sql).to_arrow_reader(1 << 16), bad_at)
        self._keep_screened(bad_at, repeats)

    def lookup_fails(self) -> bool:
        """Whether some row of table ``lookup`` (each GPU type, capacity type and region
        present, or every combination of them) fails a rule that reads the lookup: the
        rules evaluated once per combination instead of once per row."""
        return bool(self.con.execute(f"SELECT count(*) FROM lookup WHERE {R.rules_bad(self.kind, lookup=True)}").fetchall()[0][0])

    def key_rules_fail(self) -> bool:
        """Whether some row of table ``lookup`` fails a rule that reads nothing but the
        lookup's keys (an empty GPU type, a missing or unknown capacity type): else no row
        of the sources can, and the screening pass leaves them out."""
        return bool(self.con.execute(f"SELECT count(*) FROM lookup WHERE {R.key_rules_bad(self.kind)}").fetchall()[0][0])

    def tallied_sql(self) -> str:
        """SQL: the tally's rows (keys, lookup keys, ``value``; see :attr:`tallied`) with the
        lookup's catalog name, region multiplier and prices."""
        assert self.tallied, "no tally to read: check() was not given one"
        return _joined("(SELECT * FROM tally WHERE n > 0)")

    def good_sql(self, columns: Sequence[str] | None = None) -> str:
        """SQL: the good rows after :meth:`check` (each interval once), ``columns`` of them
        (None: every column the good rows hand on, with ``ord``, ``pos`` and provenance),
        read from the sources through the typed layer; the rows set aside are left out
        by position."""
        times, text, numbers, prov = self._columns
        select = [R.quote(c) for c in dict.fromkeys((*times, *text, *numbers, "ord", "pos"))]
        select += [c if c in prov else f"CAST(NULL AS {t}) AS {c}" for c, t in (("source", "VARCHAR"), ("location", "VARCHAR"), ("row", "BIGINT"))]
        rows = _joined("typed")
        if self._excluding:  # an anti join built on the few rows set aside (NOT EXISTS would hold every row)
            rows = f"SELECT g.* FROM ({rows}) g ANTI JOIN excluded e ON e.ord = g.ord AND e.pos = g.pos"
        if self._clipping:  # node records that count from where earlier records of the node end
            rows = f"SELECT g.* REPLACE (coalesce(c.start_us, g.start_us) AS start_us) FROM ({rows}) g LEFT JOIN clipped c ON c.ord = g.ord AND c.pos = g.pos"
        rows = f"SELECT {', '.join(select)} FROM ({rows})"
        cols = "*" if columns is None else ", ".join(R.quote(c) for c in columns)
        return f"SELECT {cols} FROM ({rows})"

    def _identity(self) -> bool:
        """Duplicates (identical typed rows: the first counts) and superseded records
        (same identity key: the closed, latest-ending, last-delivered record wins), into
        tables ``copies`` and ``superseded``; False (and no tables) when no identity-key
        hash repeats among the good usage rows. The node inventory (small, node-scale) is
        looked at whole, keyed by node and start, and its overlaps set aside too
        (:meth:`_node_overlaps`)."""
        if self.kind == INVENTORY:
            self._gather(f"SELECT t.* FROM ({_joined('typed')}) t ANTI JOIN bad_pos b ON b.ord = t.ord AND b.pos = t.pos", "node", repeated=False)
            self._copies_and_superseded(_NODE_KEY)
            return self._node_overlaps()
        if not self.con.execute("SELECT count(*) FROM repeats").fetchall()[0][0]:
            return False
        # Identical rows share their key (namespace, pod or attempt, start, GPU type); only
        # good rows whose key hash repeats are kept in ``good`` and compared column by
        # column (rows without a pod or attempt share a NULL key with their copies and are
        # compared too). Their full records are computed again and the key itself decides.
        rows = self._repeated_rows()
        if rows is None:  # not known from the screening pass: every row's hash again
            self.con.execute(
                f"CREATE OR REPLACE TEMP TABLE colliding AS SELECT c.ord, c.pos FROM (SELECT ord, pos, {_KEY_HASH} AS key_hash FROM typed) c "
                "ANTI JOIN bad_pos b ON b.ord = c.ord AND b.pos = c.pos WHERE c.key_hash IN (SELECT key_hash FROM repeats)"
            )
            typed = "(" + self._typed_sql("colliding") + ")"
            rows = f"SELECT * FROM ({_joined(typed)}) WHERE (ord, pos) IN (SELECT (ord, pos) FROM colliding)"
        self._gather(rows, _IKEY, repeated=True)
        self._copies_and_superseded(_INTERVAL_KEY)
        return True

    def _repeated_rows(self) -> str | None:
        """SQL: the good rows whose key hash repeats, from the rows the screening pass placed
        (:attr:`_candidates`: table ``candidates`` holds their typed records and hashes);
        None when it placed none, or when the rows found there are not every row of a
        repeated hash it counted (then they are looked for again by their hashes)."""
        if self._candidates is None:
            return None
        import pyarrow as pa

        at, counted = self._candidates
        self.con.register("placed", pa.table({"ord": int_array(at // _POS_SPAN), "pos": int_array(at % _POS_SPAN)}))
        typed = "(" + self._typed_sql("placed") + ")"
        self.con.execute(
            f"CREATE OR REPLACE TEMP TABLE candidates AS SELECT * FROM (SELECT *, {_KEY_HASH} AS key_hash FROM ({_joined(typed)}) "
            "WHERE (ord, pos) IN (SELECT (ord, pos) FROM placed)) WHERE key_hash IN (SELECT key_hash FROM repeats)"
        )
        self.con.unregister("placed")
        # The hashes counted: every row's with a tally, else the good rows' only.
        counting = "candidates" if self._hashed_every_row else "(SELECT c.* FROM candidates c ANTI JOIN bad_pos b ON b.ord = c.ord AND b.pos = c.pos)"
        found = self.con.execute(f"SELECT count(*) FROM {counting}").fetchall()[0][0]
        if found != counted:
            return None
        return "SELECT c.* FROM candidates c ANTI JOIN bad_pos b ON b.ord = c.ord AND b.pos = c.pos"

    def _gather(self, rows: str, ikey: str, repeated: bool) -> None:
        """Table ``good``: the records of ``rows`` the identity rules compare, with their
        ``ikey`` (pod or attempt; node), only those whose interval key repeats when
        ``repeated``."""
        cols = ", ".join(R.quote(c) for c in (*_IDENTITY_COLUMNS, "gpu_type_raw", "price_per_gpu_hour", "on_demand_price_per_gpu_hour", "source", "location", "row", "ord", "pos"))
        gathered = f"SELECT {cols}, {ikey} AS ikey FROM ({rows})"
        if repeated:
            key = ", ".join(_INTERVAL_KEY.columns)
            gathered = f"SELECT * EXCLUDE (n_key) FROM (SELECT *, count(*) OVER (PARTITION BY {key}) AS n_key FROM ({gathered})) WHERE n_key > 1"
        self.con.execute(f"CREATE OR REPLACE TEMP TABLE good AS {gathered}")

    def _copies_and_superseded(self, key: _Key) -> None:
        """Tables ``copies`` (identical to an earlier record) and ``superseded`` (the same
        ``key`` as the record that wins) from table ``good``."""
        ident = ", ".join(R.quote(c) for c in _IDENTITY_COLUMNS)
        window = f"OVER (PARTITION BY {ident} ORDER BY ord, pos)"
        self.con.execute(
            "CREATE OR REPLACE TEMP TABLE copies AS SELECT ord, pos, "
            f"row_number() {window} AS copy_n, first_value(location) {window} AS first_location, first_value(row) {window} AS first_row "
            "FROM good"
        )
        self.con.execute("DELETE FROM copies WHERE copy_n = 1")
        by = ", ".join(key.columns)
        self.con.execute(
            "CREATE OR REPLACE TEMP TABLE keyed AS SELECT *, "
            f"row_number() OVER (PARTITION BY {by} ORDER BY end_us IS NULL, end_us DESC, ord DESC, pos DESC) AS rank, "
            f"count(*) OVER (PARTITION BY {by}) AS records "
            "FROM good g WHERE ikey IS NOT NULL AND NOT EXISTS (SELECT 1 FROM copies c WHERE c.ord = g.ord AND c.pos = g.pos)"
        )
        self.con.execute("DELETE FROM keyed WHERE records = 1")
        diff = ", ".join(f"CASE WHEN l.{R.quote(c)} IS DISTINCT FROM w.{R.quote(c)} THEN {R.literal(c.removesuffix('_us'))} END" for c in _IDENTITY_COLUMNS)
        same = " AND ".join(f"l.{c} = w.{c}" for c in key.columns)
        self.con.execute(
            "CREATE OR REPLACE TEMP TABLE superseded AS SELECT l.ord, l.pos, "
            f"'superseded by ' || {_record_at('w.location', 'w.row', 'l.location')} || "
            f"': {key.named} ' || (CASE WHEN l.end_us IS NULL AND w.end_us IS NOT NULL THEN 'closed there, open here' "
            "WHEN l.end_us < w.end_us THEN 'ending later there' ELSE 'delivered again later' END) || '; counted once; differs in: ' || "
            f"coalesce(nullif(array_to_string(list_filter([{diff}], lambda x: x IS NOT NULL), ', '), ''), 'nothing else') AS reason "
            f"FROM keyed l JOIN keyed w ON w.rank = 1 AND {same} WHERE l.rank > 1"
        )

    def _node_overlaps(self) -> bool:
        """A node is one machine: at any moment it is in the fleet once. Among a node's
        records left after the identity rules, ordered by start, the earlier record holds
        the time they share: a record wholly inside the time of earlier ones is set aside
        (table ``superseded``: "overlaps"), one partly inside counts from where they end
        (table ``clipped``: its new start). True when anything is set aside or clipped."""
        held = (
            f"SELECT ord, pos, ikey AS node, start_us, coalesce(end_us, {_OPEN}) AS until, location, row FROM good g "
            "WHERE NOT EXISTS (SELECT 1 FROM copies c WHERE c.ord = g.ord AND c.pos = g.pos) AND NOT EXISTS (SELECT 1 FROM superseded s WHERE s.ord = g.ord AND s.pos = g.pos)"
        )
        earlier = "OVER (PARTITION BY node ORDER BY start_us, ord, pos ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING)"
        self.con.execute(
            f"CREATE OR REPLACE TEMP TABLE covered AS SELECT * FROM (SELECT *, max(until) {earlier} AS cover, "
            f"arg_max({{'location': location, 'row': row}}, [until, -ord, -pos]) {earlier} AS holder FROM ({held})) WHERE cover > start_us"
        )
        until = f"CASE WHEN cover = {_OPEN} THEN 'it ends (open there)' ELSE {R.utc_text('cover')} END"
        self.con.execute(
            f"INSERT INTO superseded SELECT ord, pos, 'overlaps ' || {_record_at('holder.location', 'holder.row', 'location')} || ': node ' || node || "
            f"' is in the fleet there until ' || {until} || ', and a node is counted once at any time; counted once' FROM covered WHERE until <= cover"
        )
        self.con.execute("CREATE OR REPLACE TEMP TABLE clipped AS SELECT ord, pos, cover AS start_us FROM covered WHERE until > cover")
        self._clipping = bool(self.con.execute("SELECT count(*) FROM clipped").fetchall()[0][0])
        return bool(self.con.execute("SELECT (SELECT count(*) FROM copies) + (SELECT count(*) FROM superseded)").fetchall()[0][0])

    def _present(self) -> set[str]:
        return {c for p in self.parts for c in p.layout}

    def _out_columns(self, keep: Sequence[str] | None) -> tuple[dict[str, str], list[str], list[str], list[str]]:
        """The good rows' columns: (times: engine name -> name, text, numbers, provenance)."""
        present = self._present()
        text = [c for c in (*_ALWAYS, *(c for c in _OPTIONAL_TEXT if c in present)) if keep is None or c in keep]
        numbers = ["gpu_count", "gpu_share", "price_per_gpu_hour", "on_demand_price_per_gpu_hour", *(c for c in ("attempt", "lost_seconds") if c in present and (keep is None or c in keep))]
        times = {"start_us": "start", "end_us": "end", **({"last_checkpoint_us": "last_checkpoint_at"} if "last_checkpoint_at" in present and keep is None else {})}
        prov = ["source", "location", "row"] if keep is None else []
        return times, text, numbers, prov

    def _good_rows(self, times: dict[str, str], text: list[str], numbers: list[str], prov: list[str]) -> Any:
        sql = self.good_sql([*times, *text, *numbers, *prov]) + " ORDER BY ord, pos"
        return self.frame(sql, times, text, numbers, prov)

    def frame(self, sql: str, times: dict[str, str], text: list[str], numbers: list[str], prov: list[str], order_by: Sequence[str] = ()) -> Any:
        """The rows of ``sql`` as a pandas frame (the boundary to the pandas consumers):
        ``times`` (UTC microseconds, engine name -> name) as datetime64[ns, UTC], text as
        categoricals, numbers as floats, ``row`` as Int64. ``order_by``: result columns
        to order the rows by, applied here one column at a time (an ORDER BY in DuckDB
        holds a sorted copy of every column: about 300 MiB more at a million pieces).

        The result streams out of DuckDB a batch at a time, each batch made compact at
        once (text dictionary-encoded, numbers as numpy): neither the whole result as
        Arrow (its text spelled out on every row: 300 MiB at a million pieces) nor
        DuckDB's buffers for it are held while the frame is built."""
        import pandas as pd

        from gpu_ops.flows.cost.frames import utc_series

        parts = _Batches(times, [*text, *(c for c in prov if c != "row")], numbers, "row" in prov, order_by)
        with _freeing_at_once(self.con):
            reader = self.con.sql(sql).to_arrow_reader(_FRAME_BATCH)
            for batch in reader:
                parts.add(batch)
        if not parts.rows:
            parts.add(_empty_batch(reader.schema))
        order = parts.ordering()
        out: dict[str, Any] = {}
        for c, name in times.items():
            out[name] = utc_series(parts.numbers(c, order))
        for c in parts.text:
            out[c] = parts.categorical(c, order)
        for c in numbers:
            out[c] = parts.numbers(c, order)
        if parts.row:
            out["row"] = parts.integers("row", order)
        return pd.DataFrame(out, copy=False)  # the arrays are this frame's own: no consolidating copy

    def _quarantine(self) -> Any:
        # No row set aside by check() (no part, bad row, copy or superseded record): the file
        # and line problems alone, no query.
        if not self._excluding:
            return _quarantine_frame(self.problems, None)
        return _quarantine_frame(self.problems, self.con.execute(self._quarantine_sql()).fetchnumpy())

    def result_quarantine(self) -> Any:
        """The quarantine as a pandas frame (:data:`QUARANTINE_COLUMNS`), after :meth:`check`."""
        return self._quarantine()

    def quarantine_arrow(self, window_start_us: int | None = None, window_end_us: int | None = None, first: int | None = None) -> Any:
        """The quarantine as Arrow (:data:`QUARANTINE_COLUMNS`, times as UTC microseconds
        ``start_us``/``end_us``): file and line problems first, then the rows in reading
        order; with a window, only the rows that belong to it (what
        :func:`gpu_ops.flows.cost.usage.quarantine_in_window` keeps). ``first``: only that many
        of the rows (the problems all) when the screening pass kept the bad rows' times
        (a tally): their reasons and records are built for those alone, and the schema's
        metadata :data:`QUARANTINE_ROWS` says how many rows the whole quarantine holds."""
        import pyarrow as pa

        only = self._first_in_window(window_start_us, window_end_us, first) if first is not None and self.parts and self._bad_times else None
        sql = "SELECT * FROM (" + (self._quarantine_sql(only is not None) if self._excluding else _NO_QUARANTINE) + ")"  # as _quarantine
        if window_start_us is not None:
            sql += f" WHERE {_in_window(window_start_us, window_end_us)}"
        rows = self.con.sql(sql).to_arrow_table()
        if only is not None:
            rows = rows.replace_schema_metadata({QUARANTINE_ROWS: str(only + len(self.problems))})
        if not self.problems:
            return rows
        problems = pa.table({
            "source": [p["source"] for p in self.problems], "location": [p["location"] for p in self.problems],
            "row": pa.array([p["row"] for p in self.problems], pa.int64()), "field": [p["field"] for p in self.problems],
            "reason": [p["reason"] for p in self.problems], "record": [p["record"] for p in self.problems],
            "start_us": pa.nulls(len(self.problems), pa.int64()), "end_us": pa.nulls(len(self.problems), pa.int64()),
        })
        out = pa.concat_tables([problems, rows.cast(problems.schema)])
        return out if only is None else out.replace_schema_metadata({QUARANTINE_ROWS: str(only + len(self.problems))})

    def _first_in_window(self, lo: int | None, hi: int | None, first: int) -> int:
        """Table ``kept``: the places of the ``first`` rows set aside (bad, copies,
        superseded) that belong to the window, in reading order, from their times alone;
        returns how many rows belong to it."""
        sets = ["SELECT ord, pos, start_us, end_us FROM bad_times"]
        if self._repeats:
            sets.append("SELECT ord, pos, start_us, end_us FROM good SEMI JOIN (SELECT ord, pos FROM copies UNION ALL SELECT ord, pos FROM superseded) x USING (ord, pos)")
        where = "true" if lo is None else _in_window(lo, hi)
        self.con.execute(f"CREATE OR REPLACE TEMP TABLE in_window AS SELECT ord, pos FROM ({' UNION ALL '.join(sets)}) WHERE {where}")
        self.con.execute(f"CREATE OR REPLACE TEMP TABLE kept AS SELECT ord, pos FROM in_window ORDER BY ord, pos LIMIT {int(first)}")
        self.con.execute("CREATE OR REPLACE TEMP TABLE bad_kept AS SELECT ord, pos FROM bad_pos SEMI JOIN kept USING (ord, pos)")
        return int(self.con.execute("SELECT count(*) FROM in_window").fetchall()[0][0])

    def _quarantine_sql(self, kept: bool = False) -> str:
        """SQL: the quarantined rows in reading order (``kept``: only those of table ``kept``)."""
        reason = "array_to_string(list_transform(problems, lambda x: x.field || ': ' || x.reason), '; ')"
        dup = (
            "'duplicate of ' || (CASE WHEN first_location = location THEN '' ELSE first_location || ' ' END) || 'row ' || coalesce(CAST(first_row AS VARCHAR), '?') "
            "|| ': identical in every column, counted once'"
        )
        lo, hi = R.TIME_MIN_US, R.TIME_MAX_US
        only = " SEMI JOIN kept USING (ord, pos)" if kept else ""
        identity = (
            f" UNION ALL SELECT source, location, row, '{R.ROW_FIELD}', {dup}, start_us, end_us, ord, pos FROM good JOIN copies USING (ord, pos){only} "
            f"UNION ALL SELECT source, location, row, '{R.ROW_FIELD}', s.reason, start_us, end_us, ord, pos FROM superseded s JOIN good USING (ord, pos){only}"
        ) if self._repeats else ""
        bad = "bad_kept" if kept else "bad_pos"
        self.con.execute(
            f"CREATE OR REPLACE TEMP TABLE quarantined AS SELECT source, location, row, problems[1].field AS field, {reason} AS reason, "
            f"CASE WHEN p_start BETWEEN {lo} AND {hi} THEN p_start END AS start_us, CASE WHEN p_end BETWEEN {lo} AND {hi} THEN p_end END AS end_us, ord, pos "
            f"FROM ({self._bad_rows_sql(bad) if self._bad else _NO_BAD_ROWS}){identity}"
        )
        records = self._records()
        return f"SELECT q.source, q.location, q.row, q.field, q.reason, coalesce(r.record, '') AS record, q.start_us, q.end_us FROM quarantined q LEFT JOIN ({records}) r USING (ord, pos) ORDER BY q.ord, q.pos"

    def _bad_rows_sql(self, bad: str = "bad_pos") -> str:
        """SQL: the bad rows (of table ``bad``: ord, pos) computed again, alone, with their
        problems: one reason per field (the first, most specific one)."""
        first_per_field = "list_filter(all_problems, lambda x, i: NOT list_contains(list_transform(all_problems[1:i - 1], lambda y: y.field), x.field))"
        typed = "(" + self._typed_sql(bad) + ")"
        return (
            f"SELECT source, location, row, p_start, p_end, ord, pos, {first_per_field} AS problems FROM ("
            f"SELECT source, location, row, p_start, p_end, ord, pos, list_concat(storage_problems, {R.rules_select(self.kind)}) AS all_problems FROM ({_joined(typed)}) "
            f"WHERE (ord, pos) IN (SELECT (ord, pos) FROM {bad}))"
        )

    def _records(self) -> str:
        """SQL: the raw record (JSON of each column's text) of every quarantined row,
        computed for those rows only."""
        present = [c for c in R.ALL_COLUMNS if c in self._present()]
        record = "json_object(" + ", ".join(f"{R.literal(c)}, {R.quote('r_' + c)}" for c in present) + ")" if present else "'{}'"
        parts = [
            f"SELECT ord, pos, CAST({record} AS VARCHAR) AS record FROM ({self._part_sql(i, p, record=True, where=f'WHERE __pos IN (SELECT pos FROM quarantined WHERE ord = {i})')})"
            for i, p in enumerate(self.parts)
        ]
        return " UNION ALL ".join(parts)


_NO_BAD_ROWS = (
    "SELECT CAST(NULL AS VARCHAR) AS source, CAST(NULL AS VARCHAR) AS location, CAST(NULL AS BIGINT) AS row, CAST(NULL AS BIGINT) AS p_start, CAST(NULL AS BIGINT) AS p_end, "
    "0 AS ord, CAST(0 AS BIGINT) AS pos, CAST([] AS STRUCT(field VARCHAR, reason VARCHAR)[]) AS problems WHERE false"
)
_NO_QUARANTINE = (
    "SELECT CAST(NULL AS VARCHAR) AS source, CAST(NULL AS VARCHAR) AS location, CAST(NULL AS BIGINT) AS row, CAST(NULL AS VARCHAR) AS field, "
    "CAST(NULL AS VARCHAR) AS reason, CAST(NULL AS VARCHAR) AS record, CAST(NULL AS BIGINT) AS start_us, CAST(NULL AS BIGINT) AS end_us WHERE false"
)


@contextmanager
def _freeing_at_once(con: Any) -> Iterator[None]:
    """Memory DuckDB frees goes back to the system at once while a result streams into a
    frame: at a million pieces its allocator otherwise held ~150 MiB of the streamed
    result while the step built and stored the day's table. Not for the passes that stream
    nothing the caller keeps (the screening pass, the key hashes): there, handing each
    block back at once nearly doubles the time of a scan (0.26 s -> 0.46 s for 10M key
    hashes)."""
    con.execute("SET allocator_bulk_deallocation_flush_threshold = '0MB'")
    try:
        yield
    finally:
        con.execute("RESET allocator_bulk_deallocation_flush_threshold")


def _in_window(lo: int, hi: int | None) -> str:
    """SQL over start_us/end_us: a bad row belongs to ``[lo, hi)`` when its start is
    unknown (any day), or its (possibly inverted) interval touches the window."""
    first = "CASE WHEN end_us IS NULL OR start_us <= end_us THEN start_us ELSE end_us END"
    last = "CASE WHEN end_us IS NOT NULL AND end_us >= start_us THEN end_us ELSE start_us END"
    return f"(start_us IS NULL OR ({first} < {hi} AND (end_us IS NULL OR {last} >= {lo})))"


def int_array(values: Any) -> Any:
    """An int64 numpy array as Arrow without a copy (``pa.array`` would first look for
    pandas and import it, a quarter of a second the CLI does not need)."""
    import numpy as np
    import pyarrow as pa

    values = np.ascontiguousarray(values, dtype=np.int64)
    return pa.Array.from_buffers(pa.int64(), len(values), [None, pa.py_buffer(values)])


def _values(array: Any, dtype: Any) -> Any:
    """The values of an Arrow integer array without nulls as numpy, no copy (``to_numpy``
    would import pandas)."""
    import numpy as np

    return np.frombuffer(array.buffers()[1], dtype, len(array), array.offset * np.dtype(dtype).itemsize)


def _sql_value(v: Any) -> str:
    if v is None:
        return "NULL"
    if isinstance(v, str):  # a NUL cannot stand in a literal: chr(0) between the parts
        return " || chr(0) || ".join(R.literal(part) for part in v.split("\x00"))
    return repr(float(v))


def values_table(con: Any, name: str, columns: dict[str, tuple[str, list[Any]]]) -> None:
    """A small lookup table (``columns``: name -> (SQL type, values)) made in DuckDB from
    literals: no Arrow array built from Python objects (which would load pandas)."""
    cols = list(columns.items())
    n = len(cols[0][1][1]) if cols else 0
    typed = ", ".join(f"CAST(c{i} AS {t}) AS {R.quote(c)}" for i, (c, (t, _)) in enumerate(cols))
    if not n:
        con.execute(f"CREATE OR REPLACE TEMP TABLE {name} AS SELECT {', '.join(f'CAST(NULL AS {t}) AS {R.quote(c)}' for c, (t, _) in cols)} WHERE false")
        return
    rows = ", ".join("(" + ", ".join(_sql_value(vals[j]) for _, (_, vals) in cols) + ")" for j in range(n))
    con.execute(f"CREATE OR REPLACE TEMP TABLE {name} AS SELECT {typed} FROM (VALUES {rows}) t({', '.join(f'c{i}' for i in range(len(cols)))})")


def _register_instance_map(con: Any) -> None:
    """``instance_map``: the GPU type and count of each instance type the catalog knows
    (the first GPU naming it, in catalog order)."""

    from gpu_ops.domain.compute.catalog import CATALOG

    seen: dict[str, tuple[str, int]] = {}
    for gpu, spec in CATALOG.items():
        for instance, count in spec.instance_types.items():
            seen.setdefault(instance, (gpu, count))
    values_table(con, "instance_map", {
        "instance_type": ("VARCHAR", list(seen)),
        "d_gpu_type": ("VARCHAR", [v[0] for v in seen.values()]),
        "d_gpu_count": ("DOUBLE", [float(v[1]) for v in seen.values()]),
    })


def clean_text_columns(
    tables: Iterable[Any], layout: dict[str, R.Stored], has_label_columns: bool, utf8: bool = False, choices: dict[str, set[Any] | None] | None = None,
    failing: dict[str, set[str] | None] | None = None,
) -> frozenset[str]:
    """The text columns (stored as text) no value of which needs a trim or holds a control
    character, over ``tables`` (a table, or a file's row groups one at a time): checked
    once per distinct value where a column is dictionary-encoded (as Parquet hands most
    text over), by its bytes otherwise; and ``lower:<column>`` for each choice column
    (:data:`~gpu_ops.domain.cost.rules.LOWERED`) with no upper-case letter. ``utf8``: every text
    column is also validated (``ArrowInvalid`` when some value is not UTF-8). ``choices``:
    sets (column -> set) filled with the distinct values met, None meaning missing (a set
    becomes None past :data:`_MAX_CHOICES` values). ``failing``: filled, for each column
    that is not clean, with the values that need a trim or hold a control character when
    every such value came in a dictionary (at most :data:`_MAX_FAILING`), else None."""
    import pyarrow as pa

    text = {c for c, st in layout.items() if st == R.Stored(R.STORED_TEXT)}
    candidates = {c for c in R.CLEAN_COLUMNS if c in text and not (c == "labels" and has_label_columns)}
    lowered = {c for c in R.LOWERED if c in text}
    failed: set[str] = set()  # columns with a value that needs a trim or holds a control character; "lower:<c>": an upper-case letter
    choices = choices or {}
    failing = {} if failing is None else failing
    for table in tables:
        for col in table.column_names if utf8 else candidates | lowered | (choices.keys() & set(table.column_names)):
            for chunk in table.column(col).chunks:
                dictionary = pa.types.is_dictionary(chunk.type)
                values = chunk.dictionary if dictionary else chunk
                if utf8:
                    values.validate(full=True)
                failed |= _failing(col, values, dictionary, candidates, lowered, failed, failing)
                if (seen := choices.get(col)) is not None:
                    choices[col] = _gathered(seen, chunk, values)
    out = {c for c in R.CLEAN_COLUMNS if c not in layout and not (c == "labels" and has_label_columns)}  # missing: NULL, ''
    out |= {f"lower:{c}" for c in R.LOWERED if c not in layout}
    return frozenset(out | (candidates - failed) | {f"lower:{c}" for c in lowered if f"lower:{c}" not in failed})


def _gathered(seen: set[Any], chunk: Any, values: Any) -> set[Any] | None:
    """``seen`` with the distinct values of ``chunk`` (``values``: its dictionary, if it has
    one) and None if some are missing; None past :data:`_MAX_CHOICES`."""
    if values is chunk:  # no dictionary
        values = values.unique()
    if len(values) + len(seen) > _MAX_CHOICES:
        return None
    seen.update(values.to_pylist())
    if chunk.null_count:
        seen.add(None)
    return seen if len(seen) <= _MAX_CHOICES else None


def _known(choices: dict[str, set[Any] | None] | None) -> dict[str, set[Any]] | None:
    """The gathered choices if every column's values are known."""
    if choices is None or any(v is None for v in choices.values()):
        return None
    return choices  # type: ignore[return-value]


def _failing(col: str, values: Any, dictionary: bool, candidates: set[str], lowered: set[str], failed: set[str], failing: dict[str, set[str] | None]) -> set[str]:
    """What ``values`` (a ``dictionary``'s, or a plain chunk) of column ``col`` newly fail
    of the checks of :func:`clean_text_columns`; ``failing`` gathers the values that do
    (see there)."""
    out = set()
    looking = col not in failed or failing.get(col) is not None  # a failed column's values still gathered
    if col in candidates and looking and _needs_clean(values):
        out.add(col)
        failing[col] = _failing_values(values, failing.get(col, set())) if dictionary else None
    if col in lowered and f"lower:{col}" not in failed and _has_upper(values):
        out.add(f"lower:{col}")
    return out


def _failing_values(values: Any, seen: set[str] | None) -> set[str] | None:
    """``seen`` with the values of ``values`` (a dictionary's) that need a trim or hold a
    control character; None past :data:`_MAX_FAILING`."""
    import pyarrow.compute as pc

    if seen is None:
        return None
    seen.update(values.filter(pc.match_substring_regex(values, R.clean_pattern())).to_pylist())
    return seen if len(seen) <= _MAX_FAILING else None


def _by_value(failing: dict[str, set[str] | None]) -> R.ByValue:
    """The columns of ``failing`` whose values that need a trim are all known."""
    return {c: frozenset(v) for c, v in failing.items() if v is not None}


def _has_upper(values: Any) -> bool:
    """Whether some text value changes when lower-cased: by its bytes when they are all
    ASCII (an upper-case letter is a byte A-Z), else by the lower-casing itself."""
    got = _text_bytes(values)
    if got is not None and not len(got[1]):
        return False
    if got is not None and got[1].max() < 128:
        data = got[1]
        return bool(((data >= 65) & (data <= 90)).any())
    import pyarrow.compute as pc

    return pc.all(pc.equal(pc.utf8_lower(values), values)).as_py() is False  # None: no value


def _time_layout(unit: str, span: tuple[int, int] | None) -> R.Stored:
    """A time column stored as integers of ``unit`` whose values span ``span`` (None: no value)."""
    return R.Stored(R.STORED_TIME, unit=unit, bounded=span is None or R.in_time_range(*span, unit))


def _with_time_spans(table: Any, layout: dict[str, R.Stored]) -> dict[str, R.Stored]:
    """``layout`` with each time column (integers) marked bounded when all its values are supported times."""
    import pyarrow.compute as pc

    out = dict(layout)
    for c, st in layout.items():
        if st.kind == R.STORED_TIME:
            span = pc.min_max(table.column(c))
            lo, hi = span["min"].as_py(), span["max"].as_py()
            out[c] = _time_layout(st.unit, None if lo is None else (lo, hi))
    return out


def _byte_set(*codes: int) -> Any:
    import numpy as np

    table = np.zeros(256, bool)
    table[list(codes)] = True
    return table


def _needs_clean(values: Any) -> bool:
    """Whether some text value needs a trim or holds a control character. By its bytes
    (UTF-8 keeps every ASCII byte for itself): no byte outside printable ASCII without the
    space (33-126) says no at once, with one look at the bytes (every space and control
    character has a byte outside); a control byte anywhere says yes; the pattern itself
    runs only when some value's first or last byte may belong to a space."""
    if values.null_count:
        values = values.drop_null()
    if not len(values):
        return False
    got = _text_bytes(values)
    if got is None:
        return _matches_clean_pattern(values)
    offsets, data = got
    lo, hi = (data.min(), data.max()) if len(data) else (33, 126)
    if lo > 32 and hi < 127:  # printable ASCII, no space byte anywhere (most columns)
        return False
    if lo < 32 or hi >= 127:  # else no control byte
        low = (data < 32) | (data == 127)
        if low.any() and _CONTROL_BYTES[data[low]].any():
            return True
    filled = offsets[1:] > offsets[:-1]
    starts, ends = offsets[:-1] - offsets[0], offsets[1:] - offsets[0]
    if not filled.all():
        starts, ends = starts[filled], ends[filled]
    first, last = data[starts], data[ends - 1]
    if len(first) and (_EDGE_FIRST[first].any() or _EDGE_LAST[last].any()):
        return _matches_clean_pattern(values)
    return False


def _matches_clean_pattern(values: Any) -> bool:
    import pyarrow.compute as pc

    return bool(pc.any(pc.match_substring_regex(values, R.clean_pattern())).as_py())


def _text_bytes(values: Any) -> tuple[Any, Any] | None:
    """(offsets, the bytes they index) of a text array, as numpy views (no copy); None for
    an array of another type or without a data buffer. Null entries keep their bytes, if any."""
    import numpy as np
    import pyarrow as pa

    if not (pa.types.is_string(values.type) or pa.types.is_large_string(values.type)) or values.buffers()[2] is None:
        return None
    width = np.dtype(np.int64 if pa.types.is_large_string(values.type) else np.int32)
    offsets = np.frombuffer(values.buffers()[1], width, len(values) + 1, values.offset * width.itemsize)
    return offsets, np.frombuffer(values.buffers()[2], np.uint8)[offsets[0]:offsets[-1]]


# Bytes of R.CONTROL; the first bytes of the characters of R.SPACES; their last bytes (any
# byte past ASCII: the pattern decides).
_CONTROL_BYTES = _byte_set(*range(0, 9), 11, 12, *range(14, 32), 127)
_EDGE_FIRST = _byte_set(*range(9, 14), *range(28, 33), 0xC2, 0xE1, 0xE2, 0xE3)
_EDGE_LAST = _byte_set(*range(9, 14), *range(28, 33), *range(0x80, 0x100))


def _joined(typed: str) -> str:
    """SQL: the typed rows of ``typed`` with their catalog name, region multiplier and prices
    (table ``lookup``, one row per GPU type, capacity type and region present)."""
    return (
        f"SELECT t.*, {', '.join('l.' + c for c in R.LOOKUP_COLUMNS)} FROM {typed} t "
        "LEFT JOIN lookup l ON l.gpu_type_raw = t.gpu_type_raw AND l.capacity_type = t.capacity_type AND l.region = t.region"
    )


def _times_as_integers(table: Any) -> Any:
    """Timestamp and date columns as their integers (unit in the layout): any value, even
    past what DuckDB's timestamps hold, reaches the rule book, which judges it."""
    import pyarrow as pa

    for i, fld in enumerate(table.schema):
        if pa.types.is_timestamp(fld.type) or pa.types.is_date64(fld.type):
            table = table.set_column(i, fld.name, table.column(i).cast(pa.int64()))
        elif pa.types.is_date32(fld.type):
            table = table.set_column(i, fld.name, table.column(i).cast(pa.int32()).cast(pa.int64()))
    return table


def _set(table: Any, name: str, values: Any) -> Any:
    i = table.schema.get_field_index(name)
    return table.set_column(i, name, values) if i >= 0 else table.append_column(name, values)


def _us_to_ns(us: Any) -> Any:
    import numpy as np

    nat = np.iinfo(np.int64).min
    if hasattr(us, "fill_null"):  # Arrow
        vals = us.fill_null(nat).to_numpy()
        return np.where(vals == nat, nat, vals * 1000)
    if np.ma.isMaskedArray(us):
        vals = np.ma.filled(us.astype(np.int64), nat)
    else:
        vals = np.asarray(us)
        if vals.dtype.kind == "f" or vals.dtype == object:
            vals = np.array([nat if v is None or v != v else int(v) for v in vals], dtype=np.int64)
    vals = np.asarray(vals, np.int64)
    return np.where(vals == nat, nat, vals * 1000)


def _int64(values: Any) -> Any:
    """A fetched integer column (NULLs masked) as pandas Int64."""
    import numpy as np
    import pandas as pd

    if np.ma.isMaskedArray(values):
        return pd.arrays.IntegerArray(np.asarray(values.data, np.int64), np.ma.getmaskarray(values).copy())
    return pd.array(np.asarray(values, np.int64), dtype="Int64")


_FRAME_BATCH = 1 << 17  # rows of the result converted at a time (UsageEngine.frame)


class _Batches:
    """A query result gathered batch by batch in compact form: text dictionary-encoded,
    times and numbers as numpy copies (DuckDB's buffers go back as each batch is done);
    then ordered and handed over one column at a time, each column let go once handed."""

    def __init__(self, times: dict[str, str], text: list[str], numbers: list[str], row: bool, order_by: Sequence[str]):
        self.times, self.text, self.row, self.order_by = list(times), text, row, list(order_by)
        self.number_columns = numbers
        self.keys = [c for c in self.order_by if c not in times and c not in numbers]  # only to order by
        self.chunks: dict[str, list[Any]] = {c: [] for c in [*self.times, *text, *numbers, *self.keys, *(["row", "row_null"] if row else [])]}
        self.rows = 0

    def add(self, batch: Any) -> None:
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc

        for c in self.times:
            self.chunks[c].append(_us_to_ns(batch.column(c)))
        for c in self.text:
            self.chunks[c].append(pc.dictionary_encode(batch.column(c).cast(pa.string()).fill_null("")))
        for c in self.number_columns:
            self.chunks[c].append(np.array(batch.column(c).to_numpy(zero_copy_only=False), dtype=float))
        for c in self.keys:
            self.chunks[c].append(np.array(batch.column(c).to_numpy(zero_copy_only=False), dtype=np.int64))
        if self.row:
            row = batch.column("row")
            self.chunks["row"].append(np.array(row.fill_null(0).to_numpy(zero_copy_only=False), dtype=np.int64))
            self.chunks["row_null"].append(np.array(row.is_null().to_numpy(zero_copy_only=False), dtype=bool))
        self.rows += batch.num_rows

    def _take(self, c: str, order: Any) -> Any:
        import numpy as np

        chunks = self.chunks.pop(c)
        whole = np.concatenate(chunks) if len(chunks) != 1 else chunks[0]
        del chunks
        return whole if order is None else whole[order]

    def ordering(self) -> Any:
        """The row positions that order the rows by ``order_by`` (None: keep their order)."""
        if not self.order_by or self.rows < 2:
            return None
        import numpy as np

        keys = [np.concatenate(self.chunks.pop(k) if k in self.keys else self.chunks[k]) for k in reversed(self.order_by)]
        return np.lexsort(keys)

    def numbers(self, c: str, order: Any) -> Any:
        return self._take(c, order)

    def integers(self, c: str, order: Any) -> Any:
        import pandas as pd

        null = self._take(f"{c}_null", order)
        return pd.arrays.IntegerArray(self._take(c, order), null)

    def categorical(self, c: str, order: Any) -> Any:
        """Text as a pandas Categorical, its categories (Arrow-backed text) in the order they
        first appear in the (ordered) rows."""
        import numpy as np
        import pandas as pd
        import pyarrow as pa
        import pyarrow.compute as pc

        chunks = pa.chunked_array(self.chunks.pop(c), pa.dictionary(pa.int32(), pa.string())).unify_dictionaries()
        words = chunks.chunk(0).dictionary if chunks.num_chunks else pa.array([], pa.string())
        codes = np.concatenate([np.asarray(ch.indices.to_numpy(zero_copy_only=False), np.int32) for ch in chunks.chunks]) if chunks.num_chunks else np.empty(0, np.int32)
        del chunks
        if order is not None:
            first = pc.dictionary_encode(pa.array(codes[order]))  # codes renumbered as they first appear
            codes, words = first.indices.to_numpy(zero_copy_only=False), words.take(first.dictionary)
        out = pd.Categorical.from_codes(np.asarray(codes, np.int32), dtype=_text_categories(words))
        pa.default_memory_pool().release_unused()  # the dictionaries unified and renumbered (~100 MiB for a day's pods) go back now, not seconds later
        return out


def _text_categories(words: Any) -> Any:
    """The categorical dtype of distinct Arrow text ``words``, the categories left in
    Arrow's memory (pandas' Arrow-backed "str"): a day's million pods as Python strings
    were ~70 MiB and a second to build. pandas' public constructor checks that the
    categories are unique with a hash table of a Python string per category, kept with
    them (~100 MiB more at a million); ``words`` are unique already (a dictionary's
    values), so the dtype is made without that check where pandas offers it. No words:
    an empty object index, as before (stored, a column of nulls)."""
    import pandas as pd
    import pyarrow as pa

    if not len(words):
        return pd.CategoricalDtype(pd.Index([], dtype=object))
    categories = pd.Index(pd.array(words.cast(pa.string()), dtype="str"))
    unchecked = getattr(pd.CategoricalDtype, "_from_fastpath", None)  # pandas 2 and 3; absent: the checked path
    return unchecked(categories, False) if unchecked is not None else pd.CategoricalDtype(categories)


def _empty_batch(schema: Any) -> Any:
    import pyarrow as pa

    return pa.record_batch([pa.array([], f.type) for f in schema], schema=schema)


def _empty_rows() -> Any:
    import pandas as pd

    from gpu_ops.flows.cost.frames import utc_series
    import numpy as np

    out: dict[str, Any] = {"start": utc_series(np.empty(0, np.int64)), "end": utc_series(np.empty(0, np.int64))}
    for c in _ALWAYS:
        out[c] = pd.Series([], dtype=object)
    for c in ("gpu_count", "gpu_share", "price_per_gpu_hour", "on_demand_price_per_gpu_hour"):
        out[c] = pd.Series([], dtype=float)
    out.update(source=pd.Series([], dtype=object), location=pd.Series([], dtype=object), row=pd.array([], dtype="Int64"))
    return pd.DataFrame(out)


def _quarantine_frame(problems: list[dict[str, Any]], got: Any) -> Any:
    import numpy as np
    import pandas as pd

    from gpu_ops.flows.cost.frames import utc_series

    frames = []
    if problems:
        f = pd.DataFrame(problems)
        frames.append(pd.DataFrame({
            "source": f["source"].astype(object), "location": f["location"].astype(object), "row": pd.array(f["row"].tolist(), dtype="Int64"),
            "field": f["field"].astype(object), "reason": f["reason"].astype(object), "record": f["record"].astype(object),
            "start": utc_series(np.full(len(f), np.iinfo(np.int64).min)), "end": utc_series(np.full(len(f), np.iinfo(np.int64).min)),
        }))
    if got is not None and len(got["source"]):
        frames.append(pd.DataFrame({
            "source": np.asarray(got["source"], dtype=object), "location": np.asarray(got["location"], dtype=object),
            "row": _int64(got["row"]),
            "field": np.asarray(got["field"], dtype=object), "reason": np.asarray(got["reason"], dtype=object), "record": np.asarray(got["record"], dtype=object),
            "start": utc_series(_us_to_ns(got["start_us"])), "end": utc_series(_us_to_ns(got["end_us"])),
        }))
    if not frames:
        from gpu_ops.flows.cost.frames import empty_quarantine

        return empty_quarantine()
    return pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]


# --------------------------------------------------------------------------- raw frames


def add_frame(engine: UsageEngine, raw: Any) -> None:
    """A raw pandas frame (the usage format plus provenance: a table's rows, a caller's
    frame) into the engine."""
    import pyarrow as pa

    if not len(raw.columns):
        return
    arrays, names = [], []
    for c in raw.columns:
        arrays.append(_arrow_column(raw[c]))
        names.append(str(c))
    table = pa.Table.from_arrays(arrays, names=names)
    engine.add_arrow(table, source=str(raw["source"].iloc[0]) if "source" in raw and len(raw) else "file", location=None if "location" in raw else "<frame>")


def _arrow_column(s: Any) -> Any:
    import pandas as pd
    import pyarrow as pa

    if isinstance(s.dtype, pd.CategoricalDtype):
        s = s.astype(object)
    try:
        return pa.array(s, from_pandas=True)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError):
        return pa.array([None if v is None or (isinstance(v, float) and v != v) else str(v) for v in s], pa.string())


@dataclass
class UsageInput:
    """What a read found: files as Arrow, tables (ledger, collected pods) as raw frames,
    and the patterns or files that gave nothing (location, reason)."""

    files: list[FileRows] = field(default_factory=list)
    frames: list[Any] = field(default_factory=list)
    problems: list[tuple[str, str]] = field(default_factory=list)
    source: str = "file"  # the files' source name in the quarantine ("inventory" for the node inventory)

    def add_to(self, engine: "UsageEngine") -> None:
        for location, reason in self.problems:
            engine.add_problem(location, reason, self.source)
        for f in self.files:
            engine.add_file(f, self.source)
            for row, why in f.bad_lines:
                engine.add_problem(str(f.path), why, self.source, row=row)
        for raw in self.frames:
            add_frame(engine, raw)


def validate(usage: Any, prices: PriceMatrix, keep: Sequence[str] | None = None, kind: str = USAGE) -> EngineResult:
    """The engine over a :class:`UsageInput`, or raw pandas frames (a frame or a list);
    ``keep``: the text columns the good rows need (None: all); ``kind``: usage or the
    node inventory."""
    engine = UsageEngine(prices, kind)
    try:
        if isinstance(usage, UsageInput):
            usage.add_to(engine)
        else:
            for raw in usage if isinstance(usage, (list, tuple)) else [usage]:
                add_frame(engine, raw)
        return engine.run(keep)
    finally:
        engine.close()
