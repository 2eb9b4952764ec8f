"""DataFrames as SQL tables through SQLAlchemy: SQLite by default, PostgreSQL in production.

- A write replaces a partition's rows (or the whole table) in one transaction, so writing
  the same day again never duplicates or loses rows, and a failed write leaves the old
  rows in place.
- Writes to one table are serialised (a PostgreSQL advisory lock, SQLite's
  ``BEGIN IMMEDIATE``): concurrent backfills of different days queue rather than deadlock.
- Reads take no write lock: they run on a second engine of the same database
  (:meth:`TableStore.reading`) whose transactions are read-only (SQLite: a plain deferred
  ``BEGIN`` under WAL, ``query_only``; PostgreSQL: ``READ ONLY``), so a read never waits
  behind a partition write and sees the rows committed before it began.
- A new column in a frame is added to an existing table; an int column that starts
  carrying floats is widened. Any other type change is an error that names the column.
- Column kinds are recorded in ``gpu_ops_columns`` so that a read gives back the dtypes
  that were written (UTC timestamps, dates, bools, nullable ints, JSON lists).
- PostgreSQL writes and reads use COPY (CSV written and parsed by Arrow, no Python
  object per value); reads can name the columns they need.
- Every engine has a connect timeout and a statement timeout (``storage.connect_timeout_s``,
  ``storage.statement_timeout_s``; SQLite: how long a writer waits for the file's lock).
  A database that is down, silent or too slow raises :class:`StorageUnavailable`, whose
  message names the database (password hidden) and says what to check: never a raw
  driver traceback, never a hang.
- Schema changes (the first write of a table, ``gpu_ops_columns``) are serialised by an
  advisory lock, so concurrent first writers on a fresh PostgreSQL database all land.

No Dagster imports here: the IO manager, the ledger and the alert state all use this.
"""

from __future__ import annotations

import datetime as dt
import io
import json
import math
import pathlib
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.csv as pacsv
import sqlalchemy as sa
from sqlalchemy.engine import URL, Engine, make_url

from gpu_ops.domain.config import storage_backend
from gpu_ops.domain.formatting import redact_url
from gpu_ops.storage.errors import StorageError, StorageUnavailable
from gpu_ops.domain.cost.columns import PARTITION_COLUMN

_COLUMNS_TABLE = "gpu_ops_columns"
_BATCH = 10_000


DEFAULT_CONNECT_TIMEOUT_S = 10.0
DEFAULT_STATEMENT_TIMEOUT_S = 300.0


def display_url(url: str | URL) -> str:
    """The database URL for logs and metadata: scheme, host, port and database, without
    user, password or query (:func:`gpu_ops.domain.formatting.redact_url`)."""
    text = url.render_as_string(hide_password=True) if isinstance(url, URL) else url
    return redact_url(text, keep_path=True)


def _scrub(text: str, url: str | URL) -> str:
    password = make_url(url).password
    return text.replace(str(password), "***") if password else text


def unavailable_reason(exc: BaseException, url: str | URL, connect_timeout_s: float, statement_timeout_s: float) -> str | None:
    """What to tell an operator when ``exc`` means the database is out of reach, else None.

    Connection failures (refused, unknown host, no answer within the connect timeout,
    dropped), statements cancelled by the statement timeout and a SQLite file that stayed
    locked are "unavailable"; anything else (a constraint, a bad type) is the caller's.
    """
    orig = getattr(exc, "orig", None) or exc
    first = _scrub(str(orig).strip().splitlines()[0] if str(orig).strip() else type(orig).__name__, url)
    where = f"the gpu_ops database {display_url(url)}"
    sqlite = make_url(url).get_backend_name() == "sqlite"
    if getattr(orig, "pgcode", None) == "57014" or "statement timeout" in first:
        return (
            f"{where}: a statement ran longer than storage.statement_timeout_s ({statement_timeout_s:g} s) and was cancelled "
            f"({first}). Check for sessions holding locks (pg_stat_activity), or raise storage.statement_timeout_s."
        )
    if sqlite:
        if "locked" in first or "unable to open" in first:
            return (
                f"{where}: {first} (waited up to storage.statement_timeout_s = {statement_timeout_s:g} s). "
                "Check that the folder exists and is writable and that no other process holds the file locked."
            )
        return None
    connection_level = isinstance(exc, sa.exc.DBAPIError) and (exc.connection_invalidated or exc.connection_invalidated is None)
    driver = type(orig).__name__
    if "timeout expired" in first or "timed out" in first:
        return (
            f"cannot reach {where}: no answer within storage.connect_timeout_s ({connect_timeout_s:g} s): {first}. "
            "Check that storage.url's host and port point at PostgreSQL (something there accepts connections but does not answer), "
            "and that the network path (firewall, NetworkPolicy) lets this pod through."
        )
    if driver in ("OperationalError", "InterfaceError") or connection_level and isinstance(exc, sa.exc.OperationalError):
        return (
            f"cannot reach {where}: {first}. Check storage.url (host, port, user, database name), that the server is running "
            "and accepts connections from here, and that the password's environment variable is set."
        )
    return None


# --------------------------------------------------------------------------- column kinds


# A column's kind from its dtype, first match wins; an object column's from its values.
_DTYPE_KINDS = (
    (pd.api.types.is_bool_dtype, "bool"),
    (pd.api.types.is_integer_dtype, "int"),
    (pd.api.types.is_float_dtype, "float"),
    (pd.api.types.is_datetime64_any_dtype, "datetime"),
)


def column_kind(series: pd.Series) -> str:
    dtype = series.dtype
    for is_kind, kind in _DTYPE_KINDS:
        if is_kind(dtype):
            return kind
    sample = series.dropna()
    return _values_kind(sample) if len(sample) else "str"


def _values_kind(sample: pd.Series) -> str:
    """The kind of an object column's non-null values, judged by the first (bools: all)."""
    first = sample.iloc[0]
    if isinstance(first, (list, dict, tuple)):
        return "json"
    if isinstance(first, dt.datetime) or isinstance(first, pd.Timestamp):
        return "datetime"
    if isinstance(first, dt.date):
        return "date"
    if isinstance(first, (bool, np.bool_)) and all(isinstance(v, (bool, np.bool_)) for v in sample):
        return "bool"
    return "str"


_SQL_TYPES: dict[str, Any] = {
    "bool": sa.Boolean,
    "int": sa.BigInteger,
    "float": sa.Double,
    "datetime": lambda: sa.DateTime(timezone=True),
    "date": sa.Date,
    "json": sa.Text,
    "str": sa.Text,
}


def _sql_type(kind: str) -> Any:
    return _SQL_TYPES[kind]()


def _to_utc(series: pd.Series) -> pd.Series:
    s = pd.to_datetime(series, utc=True, format="mixed")
    return s


def _encode(df: pd.DataFrame, kinds: Mapping[str, str]) -> dict[str, list[Any]]:
    """Frame -> plain Python values per column (UTC datetimes, JSON text, None for nulls).

    Built as lists, not a DataFrame: pandas would re-infer dtypes and turn None into NaN.
    """
    out: dict[str, list[Any]] = {}
    for col in df.columns:
        kind = kinds[col]
        s = _to_utc(df[col]) if kind == "datetime" else df[col]
        missing = s.isna().to_numpy() if kind != "json" else [v is None or (isinstance(v, float) and math.isnan(v)) for v in s]
        converters: dict[str, Callable[[Any], Any]] = {
            "datetime": lambda v: v.to_pydatetime(),
            "json": lambda v: json.dumps(v, default=str),
            "bool": bool,
            "int": int,
            "float": float,
            "date": lambda v: v,
            "str": str,
        }
        convert = converters[kind]
        out[col] = [None if miss else convert(v) for v, miss in zip(s.tolist() if kind != "datetime" else list(s), missing)]
    return out


def _decode(df: pd.DataFrame, kinds: Mapping[str, str]) -> pd.DataFrame:
    for col in df.columns:
        kind = kinds.get(col)
        if kind == "datetime":
            df[col] = _to_utc(df[col])
        elif kind == "date":
            df[col] = pd.to_datetime(df[col]).dt.date
        elif kind == "bool":
            df[col] = df[col].astype("boolean") if df[col].isna().any() else df[col].astype(bool)
        elif kind == "int":
            df[col] = df[col].astype("Int64") if df[col].isna().any() else df[col].astype("int64")
        elif kind == "float":
            df[col] = df[col].astype(float)
        elif kind == "json":
            df[col] = df[col].map(lambda v: json.loads(v) if isinstance(v, str) else v)
    return df


# --------------------------------------------------------------------------- PostgreSQL COPY


def _text_categories(series: pd.Series) -> bool:
    """A categorical column whose categories are all text (Arrow writes it by dictionary)."""
    return isinstance(series.dtype, pd.CategoricalDtype) and pd.api.types.infer_dtype(series.cat.categories, skipna=False) == "string"


def _arrow_column(series: pd.Series, kind: str, text_categories: bool = False) -> Any:
    """One column as an Arrow array for CSV (nulls for None/NaN/NaT, as _encode gives).
    ``text_categories``: :func:`_text_categories` of the whole column (judged once, not
    per slice: a million-category column costs a second per check)."""
    if kind == "datetime":
        # UTC wall time without a zone (the COPY runs with TimeZone UTC): Arrow writes
        # zone-less timestamps as CSV fifteen times faster than zoned ones.
        return pa.array(_to_utc(series), from_pandas=True).cast(pa.timestamp("us", tz="UTC"), safe=False).cast(pa.timestamp("us"))
    if kind == "json":
        return pa.array([None if v is None or (isinstance(v, float) and math.isnan(v)) else json.dumps(v, default=str) for v in series], pa.string())
    if kind == "str" and text_categories:
        return pa.array(series, from_pandas=True).dictionary_decode()
    if kind == "str":
        values = series.astype(object) if isinstance(series.dtype, pd.CategoricalDtype) else series
        try:
            return pa.array(values, pa.string(), from_pandas=True)
        except (pa.ArrowInvalid, pa.ArrowTypeError):  # not all text: as _encode, str() of each
            return pa.array([None if m else str(v) for v, m in zip(values, values.isna())], pa.string())
    if kind == "float":
        return pa.array(series.astype(float), pa.float64(), from_pandas=True)
    if kind == "date":
        return pa.array(series, pa.date32(), from_pandas=True)
    return pa.array(series, from_pandas=True)


class _CsvStream(io.RawIOBase):
    """A file psycopg2's ``copy_expert`` reads: the frame as CSV, Arrow-written a slice at a time."""

    ROWS = 100_000

    def __init__(self, df: pd.DataFrame, kinds: Mapping[str, str]):
        self._df, self._kinds = df, kinds
        self._text = {c: _text_categories(df[c]) for c in df.columns}
        self._at = 0
        self._chunk = memoryview(b"")
        self._off = 0

    def readable(self) -> bool:
        return True

    def _next(self) -> bytes:
        part = self._df.iloc[self._at : self._at + self.ROWS]
        self._at += self.ROWS
        table = pa.table({c: _arrow_column(part[c], self._kinds[c], self._text[c]) for c in part.columns})
        out = io.BytesIO()
        pacsv.write_csv(table, out, pacsv.WriteOptions(include_header=False))
        return out.getvalue()

    def read(self, size: int = -1) -> bytes:  # type: ignore[override]
        if self._off >= len(self._chunk):
            if self._at >= len(self._df):
                return b""
            self._chunk, self._off = memoryview(self._next()), 0
        end = len(self._chunk) if size < 0 else self._off + size
        out = bytes(self._chunk[self._off : end])
        self._off += len(out)
        return out


def _copy_out(conn: sa.Connection, query: sa.Select, kinds: Mapping[str, str]) -> pd.DataFrame:
    """Run ``query`` as COPY ... TO STDOUT and parse the CSV with Arrow (columns typed by
    their recorded kinds): a twentieth of the time of fetching rows as Python tuples."""
    names = [c.name for c in query.selected_columns]
    # Timestamps leave as UTC wall time, which Arrow parses without a zone suffix.
    utc_cols = [sa.func.timezone("UTC", c).label(c.name) if kinds.get(c.name) == "datetime" else c for c in query.selected_columns]
    sql = str(query.with_only_columns(*utc_cols).compile(dialect=conn.dialect, compile_kwargs={"literal_binds": True}))
    buf = io.BytesIO()
    raw = conn.connection.driver_connection
    assert raw is not None
    with raw.cursor() as cur:
        cur.copy_expert(f"COPY ({sql}) TO STDOUT WITH (FORMAT csv, HEADER)", buf)
    if not names:
        return pd.DataFrame()
    buf.seek(0)
    arrow_types = {"datetime": pa.timestamp("us"), "date": pa.date32(), "bool": pa.bool_(), "int": pa.int64(), "float": pa.float64()}
    types = {c: arrow_types.get(kinds.get(c, "str"), pa.string()) for c in names}
    table = pacsv.read_csv(
        buf,
        read_options=pacsv.ReadOptions(block_size=1 << 24),
        convert_options=pacsv.ConvertOptions(
            column_types=types, strings_can_be_null=True, quoted_strings_can_be_null=False, null_values=[""],
            true_values=["t"], false_values=["f"],
        ),
    )
    del buf
    df = table.to_pandas(self_destruct=True, split_blocks=True)
    for c in names:
        if kinds.get(c) == "datetime":
            df[c] = df[c].dt.tz_localize("UTC").astype("datetime64[ns, UTC]")
    return _decode(df, {c: k for c, k in kinds.items() if k != "datetime"})


# --------------------------------------------------------------------------- the store


class TableStore:
    """Tables of DataFrames in one database, addressed by a SQLAlchemy URL."""

    _engines: dict[tuple[str, float, float, bool], Engine] = {}
    _engines_lock = threading.Lock()

    def __init__(
        self,
        url: str,
        *,
        connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
        statement_timeout_s: float = DEFAULT_STATEMENT_TIMEOUT_S,
    ):
        self.url = url
        self.connect_timeout_s = connect_timeout_s
        self.statement_timeout_s = statement_timeout_s
        key = (url, float(connect_timeout_s), float(statement_timeout_s))
        self.engine = self._engine_for((*key, False))
        self.dialect = self.engine.dialect.name
        # Reads: the same database through connections that never take a write lock (an
        # in-memory SQLite database exists once per engine: it reads through the writer's).
        self.read_engine = self.engine if ":memory:" in url else self._engine_for((*key, True))
        # COPY goes through the raw driver, whose errors SQLAlchemy does not wrap.
        self._driver_error: type[BaseException] = self.engine.dialect.loaded_dbapi.Error

    @classmethod
    def from_config(cls, config: Any) -> "TableStore":
        """The store a ``GpuOpsConfig`` names in ``storage`` (secret references resolved)."""
        storage = config.storage
        return cls(storage.resolved_url(), connect_timeout_s=storage.connect_timeout_s, statement_timeout_s=storage.statement_timeout_s)

    @classmethod
    def _engine_for(cls, key: tuple[str, float, float, bool]) -> Engine:
        with cls._engines_lock:
            engine = cls._engines.get(key)
            if engine is None:
                engine = cls._engines[key] = _create_engine(*key)
            return engine

    def unavailable(self, exc: BaseException) -> StorageUnavailable | None:
        """``exc`` as a :class:`StorageUnavailable` when it means the database is out of reach."""
        if isinstance(exc, StorageUnavailable):
            return exc
        reason = unavailable_reason(exc, self.url, self.connect_timeout_s, self.statement_timeout_s)
        return StorageUnavailable(reason) if reason else None

    @contextmanager
    def reading(self, deadline: float | None = None) -> Iterator[sa.Connection]:
        """A connection in a read-only transaction that takes no write lock (rolled back on
        exit). ``deadline`` (a ``time.monotonic()`` instant): statements still running then
        are cancelled (PostgreSQL: the transaction's statement timeout; SQLite: interrupted)."""
        with self.read_engine.connect() as conn:
            if self.dialect == "postgresql":  # read-only by the session's default (see _create_engine)
                if deadline is not None:
                    conn.exec_driver_sql(f"SET LOCAL statement_timeout = {max(1, int((deadline - time.monotonic()) * 1000))}")
            elif deadline is not None:
                raw = conn.connection.driver_connection
                assert raw is not None
                raw.set_progress_handler(lambda: time.monotonic() > deadline, 10_000)
            try:
                yield conn
            finally:
                if self.dialect == "sqlite" and deadline is not None and conn.connection.driver_connection is not None:
                    conn.connection.driver_connection.set_progress_handler(None, 0)
                conn.rollback()

    def ping(self) -> None:
        """Open a connection and run ``SELECT 1``; raises :class:`StorageUnavailable`."""
        with self.engine.connect() as conn:
            conn.execute(sa.text("SELECT 1"))

    @classmethod
    def dispose_all(cls) -> None:
        with cls._engines_lock:
            for engine in cls._engines.values():
                engine.dispose()
            cls._engines.clear()

    # ---- schema

    def has_table(self, name: str) -> bool:
        with self.reading() as conn:
            return sa.inspect(conn).has_table(name)

    def column_kinds(self, conn: sa.Connection, name: str) -> dict[str, str]:
        """The recorded kind of each column of ``name`` (``str``, ``float``, ...; see
        :func:`column_kind`); {} for a table never written. Reads only."""
        if not sa.inspect(conn).has_table(_COLUMNS_TABLE):
            return {}
        rows = conn.execute(sa.text(f"SELECT column_name, kind FROM {_COLUMNS_TABLE} WHERE table_name = :t"), {"t": name})
        return dict(rows.fetchall())

    def _kinds(self, conn: sa.Connection, name: str) -> dict[str, str]:
        self._ensure_columns_table(conn)
        rows = conn.execute(sa.text(f"SELECT column_name, kind FROM {_COLUMNS_TABLE} WHERE table_name = :t"), {"t": name})
        return dict(rows.fetchall())

    def _ensure_columns_table(self, conn: sa.Connection) -> None:
        """Create ``gpu_ops_columns`` when it is missing, safely under concurrency.

        On PostgreSQL ``CREATE TABLE IF NOT EXISTS`` is not safe against itself: two
        sessions that both find the table missing both insert its row type, and one fails
        on ``pg_type_typname_nsp_index``. Creators therefore take an advisory lock held to
        the end of their transaction; the next one in line then finds the table. (SQLite's
        ``BEGIN IMMEDIATE`` already serialises.)
        """
        if sa.inspect(conn).has_table(_COLUMNS_TABLE):
            return
        self.lock(conn, _COLUMNS_TABLE)
        conn.execute(
            sa.text(
                f"CREATE TABLE IF NOT EXISTS {_COLUMNS_TABLE} ("
                "table_name TEXT NOT NULL, column_name TEXT NOT NULL, kind TEXT NOT NULL,"
                " PRIMARY KEY (table_name, column_name))"
            )
        )

    def _ensure_table(self, conn: sa.Connection, name: str, kinds: Mapping[str, str], index_on: str | None) -> sa.Table:
        known = self._kinds(conn, name)
        if not sa.inspect(conn).has_table(name):
            _create_table(conn, name, kinds, index_on)
            known = {}
        else:
            self._fit_columns(conn, name, kinds, known)
        _record_kinds(conn, name, kinds, known)
        return sa.Table(name, sa.MetaData(), autoload_with=conn)

    def _fit_columns(self, conn: sa.Connection, name: str, kinds: Mapping[str, str], known: Mapping[str, str]) -> None:
        """An existing table takes the new rows' columns: a missing one is added, an int
        column widens to float; any other change of kind is refused."""
        present = {c["name"] for c in sa.inspect(conn).get_columns(name)}
        for col, kind in kinds.items():
            if col not in present:
                coltype = _sql_type(kind).compile(dialect=conn.dialect)
                conn.execute(sa.text(f'ALTER TABLE "{name}" ADD COLUMN "{col}" {coltype}'))
                continue
            old = known.get(col)
            if old is None or old == kind or kind == "str" and old == "json":
                continue
            if old == "int" and kind == "float":
                if self.dialect == "postgresql":
                    conn.execute(sa.text(f'ALTER TABLE "{name}" ALTER COLUMN "{col}" TYPE DOUBLE PRECISION'))
                continue
            if old == "float" and kind == "int":
                continue  # ints fit a float column; the recorded kind stays float
            raise StorageError(f"table {name}, column {col}: was {old}, the new rows have {kind}; migrate the table or rename the column")

    def lock(self, conn: sa.Connection, name: str) -> None:
        """Serialise the writers of ``name`` (and its schema changes) to the end of ``conn``'s
        transaction: a PostgreSQL advisory lock; SQLite's ``BEGIN IMMEDIATE`` (see
        ``_create_engine``) already holds the write lock."""
        if self.dialect == "postgresql":
            conn.execute(sa.text("SELECT pg_advisory_xact_lock(hashtext(:k))"), {"k": f"gpu_ops:{name}"})


    # ---- writes

    def write(
        self,
        name: str,
        df: pd.DataFrame,
        *,
        partition_keys: Sequence[str] | None = None,
        replace: bool = True,
    ) -> int:
        """Write ``df`` to ``name`` in one transaction.

        With ``partition_keys``, rows of those partitions are replaced (the frame must then
        carry ``partition_key``, or a single key is stamped onto every row). Without, the
        whole table is replaced, or appended to when ``replace`` is false.
        """
        _check_name(name)
        df = df.copy(deep=False)  # a new column must not touch the caller's frame; the data is not copied
        if partition_keys is not None:
            _stamp_partitions(name, df, list(partition_keys))
        for col in df.columns:
            _check_name(col)
        kinds = {c: column_kind(df[c]) for c in df.columns}
        try:
            with self.engine.begin() as conn:
                self.lock(conn, name)
                table = self._ensure_table(conn, name, kinds, PARTITION_COLUMN if partition_keys is not None else None)
                if partition_keys is not None:
                    conn.execute(table.delete().where(table.c[PARTITION_COLUMN].in_(list(partition_keys))))
                elif replace:
                    conn.execute(table.delete())
                self._insert(conn, table, df, kinds)
        except (sa.exc.DBAPIError, self._driver_error) as exc:
            unavailable = self.unavailable(exc)
            if unavailable is not None:
                raise unavailable from exc
            reason = _scrub(str(getattr(exc, "orig", exc)).strip().splitlines()[0], self.url)
            raise StorageError(f"table {name}: the database rejected the write; nothing was changed: {reason}") from exc
        return len(df)

    def append(self, name: str, df: pd.DataFrame) -> int:
        return self.write(name, df, replace=False)

    def _insert(self, conn: sa.Connection, table: sa.Table, df: pd.DataFrame, kinds: Mapping[str, str]) -> None:
        if not len(df):
            return
        if self.dialect == "postgresql":
            self._copy(conn, table, df, kinds)
            return
        columns = _encode(df, kinds)
        names = list(columns)
        rows = list(zip(*columns.values()))
        for i in range(0, len(rows), _BATCH):
            conn.execute(table.insert(), [dict(zip(names, row)) for row in rows[i : i + _BATCH]])

    def _copy(self, conn: sa.Connection, table: sa.Table, df: pd.DataFrame, kinds: Mapping[str, str]) -> None:
        """COPY FROM STDIN of CSV that Arrow writes, a slice of rows at a time: no Python
        object per value, and memory bounded by the slice, not the frame."""
        cols = ", ".join(f'"{c}"' for c in df.columns)
        raw = conn.connection.driver_connection
        assert raw is not None
        with raw.cursor() as cur:
            cur.execute("SET LOCAL TimeZone = 'UTC'")
            cur.copy_expert(f'COPY "{table.name}" ({cols}) FROM STDIN WITH (FORMAT csv)', _CsvStream(df, kinds), size=1 << 20)

    def delete(self, name: str, where: Mapping[str, Any]) -> int:
        if not self.has_table(name):
            return 0
        with self.engine.begin() as conn:
            self.lock(conn, name)
            table = sa.Table(name, sa.MetaData(), autoload_with=conn)
            result = conn.execute(table.delete().where(*(table.c[k] == v for k, v in where.items())))
            return result.rowcount

    # ---- reads

    def read(
        self,
        name: str,
        *,
        partition_keys: Iterable[str] | None = None,
        where: Mapping[str, Any] | None = None,
        columns: Sequence[str] | None = None,
        missing_ok: bool = False,
        clause: Callable[[sa.Table, Mapping[str, str]], Any] | None = None,
        deadline: float | None = None,
    ) -> pd.DataFrame:
        """Rows of ``name``: of some partitions, equal to ``where`` values, and/or matching
        ``clause(table, column kinds)`` (a SQLAlchemy condition); with ``columns``, only
        those of them that the table has; ``deadline``: as :meth:`reading`'s. PostgreSQL
        reads go through COPY TO."""
        _check_name(name)
        with self.reading(deadline) as conn:
            table = self._table(conn, name, missing_ok)
            if table is None:
                return pd.DataFrame()
            selected = [table.c[c] for c in columns if c in table.c] if columns is not None else list(table.c)
            query = sa.select(*selected)
            if partition_keys is not None:
                query = query.where(table.c[PARTITION_COLUMN].in_(list(partition_keys)))
            for col, value in (where or {}).items():
                query = query.where(table.c[col].in_(value) if isinstance(value, (list, tuple, set)) else table.c[col] == value)
            kinds = self.column_kinds(conn, name)
            if clause is not None:
                query = query.where(clause(table, kinds))
            df, decoded = self._fetch(conn, query, kinds)
        return df if decoded else _decode(df, kinds)

    def _table(self, conn: sa.Connection, name: str, missing_ok: bool) -> sa.Table | None:
        """The stored table ``name`` (None when it does not exist and ``missing_ok``)."""
        if not sa.inspect(conn).has_table(name):
            if missing_ok:
                return None
            raise StorageError(f"table {name} does not exist in {display_url(self.url)}")
        return sa.Table(name, sa.MetaData(), autoload_with=conn)

    def _fetch(self, conn: sa.Connection, query: sa.Select, kinds: Mapping[str, str]) -> tuple[pd.DataFrame, bool]:
        """(the rows of ``query``, whether they are decoded already): PostgreSQL's through COPY
        TO (decoded), SQLite's as fetched, to be decoded once the connection (and SQLite's
        read transaction) is let go."""
        if self.dialect == "postgresql":
            try:
                return _copy_out(conn, query, kinds), True
            except self._driver_error as exc:  # raw COPY: SQLAlchemy's handle_error does not see it
                raise (self.unavailable(exc) or exc) from exc
        result = conn.execute(query)
        return pd.DataFrame(result.fetchall(), columns=list(result.keys())), False

    def read_grouped(
        self,
        name: str,
        groupings: Mapping[str, Sequence[str]],
        sums: Sequence[str],
        *,
        keep: Sequence[str] = (),
        partition_keys: Iterable[str] | None = None,
        missing_ok: bool = False,
    ) -> pd.DataFrame:
        """``sums`` of ``name`` per ``keep`` columns and each grouping, summed by the database:
        for each ``label -> columns`` of ``groupings``, one row set with ``grouping`` = label,
        the grouping's columns as they are and every other grouping column "" (so that a
        reader sums a grouping's rows without the rows of the others). Columns the table
        lacks read as "". Rows of ``partition_keys`` when given (``partition_key`` kept).
        The rows handed over grow with the groupings' values, not with the table's grain."""
        _check_name(name)
        grouped = list(dict.fromkeys(c for cols in groupings.values() for c in cols))
        with self.reading() as conn:
            table = self._table(conn, name, missing_ok)
            if table is None:
                return pd.DataFrame()
            kinds = self.column_kinds(conn, name)
            keep = [c for c in keep if c in table.c] + ([PARTITION_COLUMN] if partition_keys is not None else [])
            selects = []
            for label, cols in groupings.items():
                by = [table.c[c] for c in keep] + [table.c[c] for c in cols if c in table.c]
                blank = [sa.literal("").label(c) if c not in cols or c not in table.c else table.c[c] for c in grouped]
                q = sa.select(sa.literal(label).label("grouping"), *(table.c[c] for c in keep), *blank, *(sa.func.sum(table.c[c]).label(c) for c in sums))
                if partition_keys is not None:
                    q = q.where(table.c[PARTITION_COLUMN].in_(list(partition_keys)))
                selects.append(q.group_by(*by))
            union = sa.union_all(*selects).subquery() if len(selects) > 1 else selects[0].subquery()
            df, decoded = self._fetch(conn, sa.select(*union.c), kinds)
        return df if decoded else _decode(df, {c: k for c, k in kinds.items() if c in keep or c in sums})

    def read_range(
        self, name: str, window_start: dt.datetime, window_end: dt.datetime, *, start: str = "start", end: str = "end", missing_ok: bool = False,
        deadline: float | None = None,
    ) -> pd.DataFrame:
        """Rows of interval table ``name`` that can touch ``[window_start, window_end)``.

        Kept: ``start < window_end`` and (``end`` missing, i.e. still running, or
        ``end >= window_start``); rows with a missing ``start``; inverted rows (``end <
        start``) starting in or after the window (validation quarantines them; the
        quarantine keeps those whose two times straddle the window). The ``start`` and ``end`` columns
        are indexed on first use, so the query reads the window's rows, not the history.
        Text time columns (ISO 8601 UTC, as the collector writes them) compare as text
        in byte order (``COLLATE "C"`` on PostgreSQL).

        With a ``deadline`` (:meth:`reading`'s: a read that must end by then, as an exporter
        scrape's) the read only reads: no index is created (a write, under the table's
        lock); the writers' reads have created them.
        """
        if deadline is None and self.has_table(name):
            self.ensure_indexes(name, [start, end])

        def touches(table: sa.Table, kinds: Mapping[str, str]) -> Any:
            s, e = (self._time_column(table, c, kinds) for c in (start, end))
            lo, hi = (self._time_value(v, kinds.get(start)) for v in (window_start, window_end))
            return sa.or_(
                sa.and_(e >= lo, s < hi),  # closed intervals ending in or after the window (index on end)
                sa.and_(e.is_(None), sa.or_(s < hi, s.is_(None))),  # still running (index on end)
                s.is_(None),
                # Inverted (quarantined in every day between its times); a superset, on the start index.
                sa.and_(s >= lo, e < s),
            )

        return self.read(name, clause=touches, missing_ok=missing_ok, deadline=deadline)

    def read_groups_ending_in(self, name: str, keys: Sequence[str], window_start: dt.datetime, window_end: dt.datetime, *, end: str = "end") -> pd.DataFrame:
        """Every row of the groups (equal ``keys``) of ``name`` that have a row ending in
        ``[window_start, window_end)``: the attempts of the runs that ended in a day, their
        earlier days' attempts with them. The ``end`` column is indexed on first use, so
        the query reads the window's groups, not the history."""
        if not self.has_table(name):
            return pd.DataFrame()
        self.ensure_indexes(name, [end])

        def ending(table: sa.Table, kinds: Mapping[str, str]) -> Any:
            e = self._time_column(table, end, kinds)
            lo, hi = (self._time_value(v, kinds.get(end)) for v in (window_start, window_end))
            inner = sa.select(*(table.c[k] for k in keys)).where(e >= lo, e < hi)
            return sa.tuple_(*(table.c[k] for k in keys)).in_(inner)

        return self.read(name, clause=ending)

    def read_closed_twins(self, name: str, starts: Sequence[Any], before: Any, *, start: str = "start", end: str = "end") -> pd.DataFrame:
        """Rows of interval table ``name`` that start at one of ``starts`` and ended before
        ``before``: what a range read leaves out but de-duplicating a running row needs
        (the row that saw the interval end wins). Uses the ``start`` index."""
        if not starts or not self.has_table(name):
            return pd.DataFrame()

        def twins(table: sa.Table, kinds: Mapping[str, str]) -> Any:
            s, e = (self._time_column(table, c, kinds) for c in (start, end))
            return sa.and_(s.in_([self._time_value(v, kinds.get(start)) for v in starts]), e < self._time_value(before, kinds.get(end)))

        return self.read(name, clause=twins)

    def ensure_indexes(self, name: str, columns: Sequence[str], kinds: Mapping[str, str] | None = None) -> None:
        """One index per column of ``name`` (text columns in byte order on PostgreSQL)."""
        with self.reading() as conn:
            indexes = sa.inspect(conn).get_indexes(name)
            kinds = kinds if kinds is not None else self.column_kinds(conn, name)
        present = {ix["name"] for ix in indexes} | {ix["column_names"][0] for ix in indexes if len(ix["column_names"]) == 1}
        missing = [c for c in columns if c not in present and _index_name(name, c) not in present]
        if not missing:
            return
        with self.engine.begin() as conn:
            self.lock(conn, name)
            for c in missing:
                _check_name(c)
                expr = f'"{c}" COLLATE "C"' if self.dialect == "postgresql" and kinds.get(c, "str") != "datetime" else f'"{c}"'
                conn.execute(sa.text(f'CREATE INDEX IF NOT EXISTS "{_index_name(name, c)}" ON "{name}" ({expr})'))

    def _time_column(self, table: sa.Table, col: str, kinds: Mapping[str, str]) -> Any:
        c = table.c[col]
        return sa.collate(c, "C") if self.dialect == "postgresql" and kinds.get(col) != "datetime" else c

    @staticmethod
    def _time_value(value: Any, kind: str | None) -> Any:
        ts = pd.Timestamp(value)
        ts = ts.tz_localize("UTC") if ts.tzinfo is None else ts.tz_convert("UTC")
        return ts.to_pydatetime() if kind == "datetime" else ts.isoformat()

    def partitions(self, name: str) -> list[str]:
        with self.reading() as conn:
            if not sa.inspect(conn).has_table(name):
                return []
            rows = conn.execute(sa.text(f'SELECT DISTINCT "{PARTITION_COLUMN}" FROM "{name}" ORDER BY 1'))
            return [r[0] for r in rows]

    # ---- rows unique on a key, written inside a caller's transaction

    def ensure_unique(self, name: str, template: pd.DataFrame, keys: Sequence[str]) -> None:
        """Table ``name`` exists with ``template``'s columns and kinds and a unique index on
        ``keys``. A table made before the index may hold rows that repeat a key: all but
        the first stored are deleted, then the index is made (under the table's lock)."""
        index = _index_name(name, "_".join(("uq", *keys)))
        with self.engine.connect() as conn:
            inspector = sa.inspect(conn)
            if inspector.has_table(name) and any(ix["name"] == index for ix in inspector.get_indexes(name)):
                return
        self.write(name, template.iloc[:0], replace=False)  # creates it, or adds the columns it lacks
        cols = ", ".join(f'"{_checked(c)}"' for c in keys)
        row_id = "ctid" if self.dialect == "postgresql" else "rowid"
        with self.engine.begin() as conn:
            self.lock(conn, name)
            same = " AND ".join(f'a."{c}" = b."{c}"' for c in keys)
            conn.execute(sa.text(f'DELETE FROM "{name}" AS a WHERE EXISTS (SELECT 1 FROM "{name}" AS b WHERE {same} AND b.{row_id} < a.{row_id})'))
            conn.execute(sa.text(f'CREATE UNIQUE INDEX IF NOT EXISTS "{index}" ON "{name}" ({cols})'))

    def insert_new(self, conn: sa.Connection, name: str, df: pd.DataFrame, keys: Sequence[str]) -> int:
        """Insert ``df``'s rows into ``name`` inside the caller's transaction ``conn``; a row
        whose ``keys`` are stored already is skipped (``INSERT ... ON CONFLICT DO NOTHING``
        on the unique index :meth:`ensure_unique` made). The number of rows inserted."""
        from sqlalchemy.dialects import postgresql, sqlite

        if not len(df):
            return 0
        table = sa.Table(name, sa.MetaData(), autoload_with=conn)
        values = _encode(df, {c: column_kind(df[c]) for c in df.columns})
        rows = [dict(zip(values, row)) for row in zip(*values.values())]
        insert = (postgresql.insert if self.dialect == "postgresql" else sqlite.insert)(table)
        return int(conn.execute(insert.on_conflict_do_nothing(index_elements=list(keys)), rows).rowcount)


def _create_table(conn: sa.Connection, name: str, kinds: Mapping[str, str], index_on: str | None) -> None:
    meta = sa.MetaData()
    table = sa.Table(name, meta, *(sa.Column(c, _sql_type(k)) for c, k in kinds.items()))
    if index_on:
        sa.Index(f"ix_{name}_{index_on}"[:63], table.c[index_on])
    meta.create_all(conn)


def _record_kinds(conn: sa.Connection, name: str, kinds: Mapping[str, str], known: Mapping[str, str]) -> None:
    """Record each column's kind where it changed (a float column written with ints stays float)."""
    for col, kind in kinds.items():
        old = known.get(col)
        if old == "float" and kind == "int":
            continue
        if old != kind:
            conn.execute(sa.text(f"DELETE FROM {_COLUMNS_TABLE} WHERE table_name = :t AND column_name = :c"), {"t": name, "c": col})
            conn.execute(sa.text(f"INSERT INTO {_COLUMNS_TABLE} VALUES (:t, :c, :k)"), {"t": name, "c": col, "k": kind})


def _stamp_partitions(name: str, df: pd.DataFrame, keys: list[str]) -> None:
    """The frame carries ``partition_key`` (a single key is stamped onto every row), and
    only the partitions being written."""
    if PARTITION_COLUMN not in df.columns:
        if len(keys) != 1:
            raise StorageError(f"table {name}: writing {len(keys)} partitions needs a {PARTITION_COLUMN!r} column")
        df[PARTITION_COLUMN] = keys[0]
    stray = set(df[PARTITION_COLUMN].astype(str)) - set(keys)
    if stray:
        raise StorageError(f"table {name}: rows for partitions {sorted(stray)[:5]} outside the ones written {keys[:5]}")


def _index_name(table: str, column: str) -> str:
    return f"ix_{table}_{column}"[:63]


def _check_name(name: str) -> None:
    if not name or not all(c.isalnum() or c == "_" for c in name) or name[0].isdigit():
        raise StorageError(f"{name!r} is not a usable table or column name (letters, digits and _; not starting with a digit)")


def _checked(name: str) -> str:
    _check_name(name)
    return name


def _create_engine(url: str, connect_timeout_s: float, statement_timeout_s: float, read_only: bool = False) -> Engine:
    backend = storage_backend(url)
    try:
        parsed = make_url(url)
    except (sa.exc.ArgumentError, ValueError):  # not shown: an unparsed URL's password cannot be told apart
        backend = None
    if backend is None:
        raise StorageError("storage.url is no database URL: only sqlite:/// and postgresql:// are supported")
    if backend == "sqlite":
        engine = _sqlite_engine(url, parsed, statement_timeout_s, read_only)
    else:  # postgresql
        if parsed.drivername == "postgresql":
            parsed = parsed.set(drivername="postgresql+psycopg2")
        connect_args = {
            # libpq: the whole connection attempt, a silent listener included (min 2 s).
            "connect_timeout": max(2, math.ceil(connect_timeout_s)),
            # Server side: any statement (advisory lock waits included) is cancelled after this.
            "options": f"-c statement_timeout={int(statement_timeout_s * 1000)}" + (" -c default_transaction_read_only=on" if read_only else ""),
            # A peer that vanishes mid-query is noticed in about a minute, not hours.
            "keepalives": 1,
            "keepalives_idle": 30,
            "keepalives_interval": 10,
            "keepalives_count": 3,
        }
        # Readers (the exporter's sources) run side by side: room for all of them at once.
        pool = {"pool_size": 16, "max_overflow": 4} if read_only else {}
        engine = sa.create_engine(parsed, pool_pre_ping=True, pool_timeout=max(connect_timeout_s, 1), connect_args=connect_args, **pool)

    @sa.event.listens_for(engine, "handle_error")
    def _explain(ctx: sa.engine.ExceptionContext) -> BaseException | None:
        # Every statement and every connection attempt: "cannot reach <db>: ...; check ..."
        # in place of the driver's OperationalError (the original stays as __cause__).
        reason = unavailable_reason(ctx.sqlalchemy_exception or ctx.original_exception, url, connect_timeout_s, statement_timeout_s)
        if reason is None:
            return None
        err = StorageUnavailable(reason)
        err.__cause__ = ctx.original_exception
        return err

    return engine


def _sqlite_engine(url: str, parsed: URL, busy_timeout_s: float, read_only: bool = False) -> Engine:
    if parsed.database and parsed.database != ":memory:":
        pathlib.Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
    engine = sa.create_engine(url, connect_args={"timeout": busy_timeout_s, "check_same_thread": False})

    @sa.event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        # Let SQLAlchemy, not pysqlite, issue BEGIN; WAL lets readers run during writes
        # (the mode is the file's: set by the writers, whose first write makes the file).
        dbapi_conn.isolation_level = None
        if read_only:
            dbapi_conn.execute("PRAGMA query_only=ON")
        else:
            dbapi_conn.execute("PRAGMA journal_mode=WAL")
        dbapi_conn.execute(f"PRAGMA busy_timeout={int(busy_timeout_s * 1000)}")

    @sa.event.listens_for(engine, "begin")
    def _on_begin(conn: sa.Connection) -> None:
        # Writers take the write lock up front: two deferred transactions that both
        # upgrade to writers deadlock in SQLite; IMMEDIATE makes the second one wait.
        # Readers begin deferred: under WAL they read the last commit and never wait.
        conn.exec_driver_sql("BEGIN" if read_only else "BEGIN IMMEDIATE")

    return engine
