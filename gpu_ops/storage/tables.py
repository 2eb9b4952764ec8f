"""DataFrames as SQL tables through SQLAlchemy: SQLite by default, PostgreSQL in production.

- A write replaces a partition's rows (or the whole table) in one transaction, so writing
  the same day again never duplicates or loses rows, and a failed write leaves the old
  rows in place.
- Writes to one table are serialised (a PostgreSQL advisory lock, SQLite's
  ``BEGIN IMMEDIATE``): concurrent backfills of different days queue rather than deadlock.
- A new column in a frame is added to an existing table; an int column that starts
  carrying floats is widened. Any other type change is an error that names the column.
- Column kinds are recorded in ``gpu_ops_columns`` so that a read gives back the dtypes
  that were written (UTC timestamps, dates, bools, nullable ints, JSON lists).
- PostgreSQL bulk inserts use COPY.

No Dagster imports here: the IO manager, the ledger and the alert state all use this.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
import math
import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
import sqlalchemy as sa
from sqlalchemy.engine import URL, Engine, make_url

PARTITION_COLUMN = "partition_key"
_COLUMNS_TABLE = "gpu_ops_columns"
_BATCH = 10_000


class StorageError(RuntimeError):
    pass


def display_url(url: str | URL) -> str:
    """The URL with its password hidden, for logs and metadata."""
    return make_url(url).render_as_string(hide_password=True)


# --------------------------------------------------------------------------- column kinds


def column_kind(series: pd.Series) -> str:
    dtype = series.dtype
    if pd.api.types.is_bool_dtype(dtype):
        return "bool"
    if pd.api.types.is_integer_dtype(dtype):
        return "int"
    if pd.api.types.is_float_dtype(dtype):
        return "float"
    if pd.api.types.is_datetime64_any_dtype(dtype):
        return "datetime"
    sample = series.dropna()
    if len(sample):
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


_SQL_TYPES = {
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
        convert = {
            "datetime": lambda v: v.to_pydatetime(),
            "json": lambda v: json.dumps(v, default=str),
            "bool": bool,
            "int": int,
            "float": float,
            "date": lambda v: v,
            "str": str,
        }[kind]
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


# --------------------------------------------------------------------------- the store


class TableStore:
    """Tables of DataFrames in one database, addressed by a SQLAlchemy URL."""

    _engines: dict[str, Engine] = {}
    _engines_lock = threading.Lock()

    def __init__(self, url: str):
        self.url = url
        self.engine = self._engine_for(url)
        self.dialect = self.engine.dialect.name
        # COPY goes through the raw driver, whose errors SQLAlchemy does not wrap.
        self._driver_error: type[BaseException] = self.engine.dialect.loaded_dbapi.Error

    @classmethod
    def from_config(cls, config: Any) -> "TableStore":
        """The store a ``GpuOpsConfig`` names in ``storage.url`` (a secret reference resolved)."""
        return cls(config.storage.resolved_url())

    @classmethod
    def _engine_for(cls, url: str) -> Engine:
        with cls._engines_lock:
            engine = cls._engines.get(url)
            if engine is None:
                engine = cls._engines[url] = _create_engine(url)
            return engine

    @classmethod
    def dispose_all(cls) -> None:
        with cls._engines_lock:
            for engine in cls._engines.values():
                engine.dispose()
            cls._engines.clear()

    # ---- schema

    def has_table(self, name: str) -> bool:
        return sa.inspect(self.engine).has_table(name)

    def _kinds(self, conn: sa.Connection, name: str) -> dict[str, str]:
        self._ensure_columns_table(conn)
        rows = conn.execute(sa.text(f"SELECT column_name, kind FROM {_COLUMNS_TABLE} WHERE table_name = :t"), {"t": name})
        return dict(rows.fetchall())

    def _ensure_columns_table(self, conn: sa.Connection) -> None:
        conn.execute(
            sa.text(
                f"CREATE TABLE IF NOT EXISTS {_COLUMNS_TABLE} ("
                "table_name TEXT NOT NULL, column_name TEXT NOT NULL, kind TEXT NOT NULL,"
                " PRIMARY KEY (table_name, column_name))"
            )
        )

    def _ensure_table(self, conn: sa.Connection, name: str, kinds: Mapping[str, str], index_on: str | None) -> sa.Table:
        known = self._kinds(conn, name)
        exists = sa.inspect(conn).has_table(name)
        if not exists:
            meta = sa.MetaData()
            table = sa.Table(name, meta, *(sa.Column(c, _sql_type(k)) for c, k in kinds.items()))
            if index_on:
                sa.Index(f"ix_{name}_{index_on}"[:63], table.c[index_on])
            meta.create_all(conn)
            known = {}
        else:
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
        for col, kind in kinds.items():
            old = known.get(col)
            if old == "float" and kind == "int":
                continue
            if old != kind:
                conn.execute(
                    sa.text(f"DELETE FROM {_COLUMNS_TABLE} WHERE table_name = :t AND column_name = :c"), {"t": name, "c": col}
                )
                conn.execute(sa.text(f"INSERT INTO {_COLUMNS_TABLE} VALUES (:t, :c, :k)"), {"t": name, "c": col, "k": kind})
        return sa.Table(name, sa.MetaData(), autoload_with=conn)

    def _lock(self, conn: sa.Connection, name: str) -> None:
        if self.dialect == "postgresql":
            conn.execute(sa.text("SELECT pg_advisory_xact_lock(hashtext(:k))"), {"k": f"gpu_ops:{name}"})
        # SQLite: BEGIN IMMEDIATE (see _create_engine) already holds the write lock.

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
        df = df.copy()
        if partition_keys is not None:
            keys = list(partition_keys)
            if PARTITION_COLUMN not in df.columns:
                if len(keys) != 1:
                    raise StorageError(f"table {name}: writing {len(keys)} partitions needs a {PARTITION_COLUMN!r} column")
                df[PARTITION_COLUMN] = keys[0]
            stray = set(df[PARTITION_COLUMN].astype(str)) - set(keys)
            if stray:
                raise StorageError(f"table {name}: rows for partitions {sorted(stray)[:5]} outside the ones written {keys[:5]}")
        for col in df.columns:
            _check_name(col)
        kinds = {c: column_kind(df[c]) for c in df.columns}
        encoded = _encode(df, kinds)
        try:
            with self.engine.begin() as conn:
                self._lock(conn, name)
                table = self._ensure_table(conn, name, kinds, PARTITION_COLUMN if partition_keys is not None else None)
                if partition_keys is not None:
                    conn.execute(table.delete().where(table.c[PARTITION_COLUMN].in_(list(partition_keys))))
                elif replace:
                    conn.execute(table.delete())
                self._insert(conn, table, encoded)
        except (sa.exc.DBAPIError, self._driver_error) as exc:
            reason = str(getattr(exc, "orig", exc)).strip().splitlines()[0]
            raise StorageError(f"table {name}: the database rejected the write; nothing was changed: {reason}") from exc
        return len(df)

    def append(self, name: str, df: pd.DataFrame) -> int:
        return self.write(name, df, replace=False)

    def _insert(self, conn: sa.Connection, table: sa.Table, columns: dict[str, list[Any]]) -> None:
        names = list(columns)
        rows = list(zip(*columns.values()))
        if not rows:
            return
        if self.dialect == "postgresql":
            self._copy(conn, table, names, rows)
            return
        for i in range(0, len(rows), _BATCH):
            conn.execute(table.insert(), [dict(zip(names, row)) for row in rows[i : i + _BATCH]])

    def _copy(self, conn: sa.Connection, table: sa.Table, names: list[str], rows: list[tuple]) -> None:
        buf = io.StringIO()
        writer = csv.writer(buf)
        for row in rows:
            writer.writerow(["\\N" if v is None else (v.isoformat() if isinstance(v, (dt.datetime, dt.date)) else v) for v in row])
        buf.seek(0)
        cols = ", ".join(f'"{c}"' for c in names)
        raw = conn.connection.driver_connection
        with raw.cursor() as cur:
            cur.copy_expert(f'COPY "{table.name}" ({cols}) FROM STDIN WITH (FORMAT csv, NULL \'\\N\')', buf)

    def delete(self, name: str, where: Mapping[str, Any]) -> int:
        if not self.has_table(name):
            return 0
        with self.engine.begin() as conn:
            self._lock(conn, name)
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
        missing_ok: bool = False,
    ) -> pd.DataFrame:
        _check_name(name)
        with self.engine.connect() as conn:
            if not sa.inspect(conn).has_table(name):
                if missing_ok:
                    return pd.DataFrame()
                raise StorageError(f"table {name} does not exist in {display_url(self.url)}")
            table = sa.Table(name, sa.MetaData(), autoload_with=conn)
            query = sa.select(table)
            if partition_keys is not None:
                query = query.where(table.c[PARTITION_COLUMN].in_(list(partition_keys)))
            for col, value in (where or {}).items():
                query = query.where(table.c[col].in_(value) if isinstance(value, (list, tuple, set)) else table.c[col] == value)
            kinds = self._kinds(conn, name)
            result = conn.execute(query)
            df = pd.DataFrame(result.fetchall(), columns=list(result.keys()))
        return _decode(df, kinds)

    def partitions(self, name: str) -> list[str]:
        if not self.has_table(name):
            return []
        with self.engine.connect() as conn:
            rows = conn.execute(sa.text(f'SELECT DISTINCT "{PARTITION_COLUMN}" FROM "{name}" ORDER BY 1'))
            return [r[0] for r in rows]


def _check_name(name: str) -> None:
    if not name or not all(c.isalnum() or c == "_" for c in name) or name[0].isdigit():
        raise StorageError(f"{name!r} is not a usable table or column name (letters, digits and _; not starting with a digit)")


def _create_engine(url: str) -> Engine:
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            import pathlib

            pathlib.Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
        engine = sa.create_engine(url, connect_args={"timeout": 60, "check_same_thread": False})

        @sa.event.listens_for(engine, "connect")
        def _on_connect(dbapi_conn: Any, _record: Any) -> None:
            # Let SQLAlchemy, not pysqlite, issue BEGIN; WAL lets readers run during writes.
            dbapi_conn.isolation_level = None
            dbapi_conn.execute("PRAGMA journal_mode=WAL")
            dbapi_conn.execute("PRAGMA busy_timeout=60000")

        @sa.event.listens_for(engine, "begin")
        def _on_begin(conn: sa.Connection) -> None:
            # Take the write lock up front: two deferred transactions that both upgrade
            # to writers deadlock in SQLite; IMMEDIATE makes the second one wait.
            conn.exec_driver_sql("BEGIN IMMEDIATE")

        return engine
    if parsed.get_backend_name() == "postgresql":
        if parsed.drivername == "postgresql":
            parsed = parsed.set(drivername="postgresql+psycopg2")
        return sa.create_engine(parsed, pool_pre_ping=True)
    raise StorageError(f"storage.url {display_url(url)}: only sqlite:/// and postgresql:// are supported")
