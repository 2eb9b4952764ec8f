"""Row-level tables as Parquet files, one per partition, under a folder.

At a million usage intervals a day a SQL table is the wrong home for the row-level
pieces (README, "Row-level storage"): PostgreSQL took 40 s to COPY one day in and kept
390 MiB of it, where Parquet takes 4 s and 65 MiB, and a step that needs 13 of the
41 columns reads them in under a second. The aggregates stay in SQL.

Layout (hive-style, so DuckDB, Spark or pyarrow.dataset read the folder as one table):

    <root>/<table>/partition_key=<key>/data.parquet

A partition's file is replaced atomically (written beside it, then renamed): a failed
write leaves the old file, a re-run never duplicates rows. No Dagster imports here.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from gpu_ops.domain.memory import freed_blocks_back_at_once
from gpu_ops.storage.errors import StorageError
from gpu_ops.domain.cost.columns import PARTITION_COLUMN

FILE_NAME = "data.parquet"
ROW_GROUP = 256_000
# Snappy, as DuckDB writes by default: at a million rows of gpu_usage (47 columns) 0.70 s
# against zstd's 1.03 s, for a fifth more bytes (docs/benchmarks/cost.md).
COMPRESSION = "snappy"


class PartitionFiles:
    """Partitioned DataFrames as Parquet files under ``root`` (a local or mounted folder)."""

    def __init__(self, root: str | os.PathLike[str]):
        self.root = Path(root)

    def path(self, name: str, key: str) -> Path:
        return self.root / name / f"{PARTITION_COLUMN}={key}" / FILE_NAME

    def write(self, name: str, df: pd.DataFrame, partition_keys: Sequence[str]) -> int:
        """Replace the files of ``partition_keys`` with the rows of ``df`` (which carries
        ``partition_key`` unless a single key is written). Every key gets a file, empty
        or not, so that a day without rows reads as a day without rows."""
        keys = list(partition_keys)
        if PARTITION_COLUMN in df.columns:
            present = set(pd.unique(df[PARTITION_COLUMN].astype(str)))  # the distinct keys (a set of the rows' would make a string per row)
            stray = present - set(keys)
            if stray:
                raise StorageError(f"{name}: rows for partitions {sorted(stray)[:5]} outside the ones written {keys[:5]}")
            whole = df.drop(columns=[PARTITION_COLUMN])
            groups = {k: whole if present == {k} else whole[(df[PARTITION_COLUMN].astype(str) == k).to_numpy()] for k in keys}
        elif len(keys) == 1:
            groups = {keys[0]: df}
        else:
            raise StorageError(f"{name}: writing {len(keys)} partitions needs a {PARTITION_COLUMN!r} column")
        for key, part in groups.items():
            target = self._target(name, key)
            tmp = target.with_name(f".{FILE_NAME}.{uuid.uuid4().hex}.tmp")
            try:
                _write_slices(part, tmp)
                os.replace(tmp, target)
            finally:
                tmp.unlink(missing_ok=True)
        return len(df)

    def _target(self, name: str, key: str) -> Path:
        """The file of ``key``, its folder made (a file where a folder should be, or a folder
        this user cannot write, is a StorageError naming the setting)."""
        target = self.path(name, key)
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StorageError(
                f"{name}: cannot write under {self.root} (storage.row_level_path): {exc.strerror or exc}; "
                "point storage.row_level_path at a folder this user can write (gpu-ops validate checks it)"
            ) from None
        return target

    def adopt(self, name: str, parts: "ParquetParts") -> int:
        """Put the files of ``parts`` (written elsewhere, e.g. by the cost flow from DuckDB)
        in place of the files of their partitions: each renamed in when it is on the same
        file system, else copied beside its target first; a failed move leaves the old file."""
        for key, source in parts.paths.items():
            target = self._target(name, key)
            tmp = target.with_name(f".{FILE_NAME}.{uuid.uuid4().hex}.tmp")
            try:
                shutil.move(str(source), tmp)
                os.replace(tmp, target)
            finally:
                tmp.unlink(missing_ok=True)
        return parts.rows

    def parts(self, name: str, partition_keys: Iterable[str]) -> "ParquetParts":
        """The files of ``partition_keys`` that exist, by reference (not read)."""
        paths = {k: self.path(name, k) for k in partition_keys if self.path(name, k).exists()}
        rows = sum(pq.ParquetFile(p).metadata.num_rows for p in paths.values())
        return ParquetParts(paths, rows, pq.read_schema(next(iter(paths.values()))) if paths else None)

    def read(self, name: str, partition_keys: Iterable[str] | None = None, columns: Sequence[str] | None = None) -> pd.DataFrame:
        """Rows of the partitions that have a file (all when ``partition_keys`` is None),
        with ``partition_key`` when more than one was asked for; with ``columns``, only
        those of them the files have."""
        freed_blocks_back_at_once()  # a day's columns, read and converted one after another
        keys = list(partition_keys) if partition_keys is not None else self.partitions(name)
        tables = []
        for key in keys:
            path = self.path(name, key)
            if not path.exists():
                continue
            present = pq.read_schema(path).names
            cols = [c for c in columns if c in present] if columns is not None else None
            t = pq.read_table(path, columns=cols)
            if len(keys) > 1 or partition_keys is None:
                t = t.append_column(PARTITION_COLUMN, pa.array([key] * len(t), pa.string()))
            tables.append(t)
        if not tables:
            return pd.DataFrame()
        table = pa.concat_tables(_text_unified(tables), promote_options="permissive") if len(tables) > 1 else tables[0]
        del tables
        df = table.to_pandas(split_blocks=True, self_destruct=True)
        del table
        pa.default_memory_pool().release_unused()  # what reading the files took and let go (~60 MiB a million rows) goes back now
        return df

    def sql_view(self, con: Any, name: str, view: str | None = None) -> None:
        """Create (or replace) the DuckDB view ``view`` (default: ``name``) over every
        partition file of ``name`` on connection ``con``: the row-level table read from SQL
        under its table name, ``partition_key`` as text, columns added later included."""
        view = view or name
        for part in (name, view):
            if not part or not all(c.isalnum() or c == "_" for c in part):
                raise StorageError(f"{part!r} is not a usable table or view name (letters, digits and _)")
        if not self.partitions(name):
            raise StorageError(f"{name}: no partition file under {self.root / name}")
        pattern = str(self.root / name / f"{PARTITION_COLUMN}=*" / FILE_NAME).replace("'", "''")
        con.execute(
            f'CREATE OR REPLACE VIEW "{view}" AS SELECT * FROM read_parquet(\'{pattern}\', hive_partitioning = true, '
            f"hive_types = {{'{PARTITION_COLUMN}': 'VARCHAR'}}, union_by_name = true)"
        )

    def partitions(self, name: str) -> list[str]:
        folder = self.root / name
        if not folder.is_dir():
            return []
        prefix = f"{PARTITION_COLUMN}="
        return sorted(p.name[len(prefix) :] for p in folder.iterdir() if p.name.startswith(prefix) and (p / FILE_NAME).exists())


@dataclass
class ParquetParts:
    """A row-level table handed by reference: one Parquet file per partition key, already
    written (:class:`PartitionWriter`), and how many rows they hold together."""

    paths: dict[str, Path]
    rows: int = 0
    schema: Any = None  # the files' Arrow schema

    def to_pandas(self) -> pd.DataFrame:
        """The rows as one frame, with ``partition_key`` (the storage boundary of a SQL store)."""
        tables = []
        for key, path in self.paths.items():
            t = pq.read_table(path)
            tables.append(t.append_column(PARTITION_COLUMN, pa.array([key] * t.num_rows, pa.string())))
        if not tables:
            return pd.DataFrame()
        return pa.concat_tables(tables).to_pandas(split_blocks=True, self_destruct=True)


@dataclass
class PartitionWriter:
    """Arrow record batches of a row-level table into one Parquet file per partition key
    under ``folder`` (row groups as the batches come: nothing of the table is held), with
    the options :meth:`PartitionFiles.write` uses. ``plain``: columns written without a
    dictionary (about one value per row: a day's pods, times and measures)."""

    folder: Path
    schema: Any
    keys: Sequence[str]
    plain: Sequence[str] = ()
    writers: dict[str, Any] = field(default_factory=dict)
    rows: int = 0

    def _writer(self, key: str) -> Any:
        if key not in self.writers:
            if key not in self.keys:
                raise StorageError(f"rows for partition {key!r} outside the ones written {list(self.keys)[:5]}")
            dictionary: bool | list[str] = [f.name for f in self.schema if f.name not in self.plain] if self.plain else True
            self.writers[key] = pq.ParquetWriter(self.folder / f"{key}.parquet", self.schema, compression=COMPRESSION, use_dictionary=dictionary)
        return self.writers[key]

    def write(self, key: str, batch: Any) -> None:
        if batch.num_rows:
            self._writer(key).write_batch(batch, row_group_size=ROW_GROUP)
            self.rows += batch.num_rows

    def close(self) -> ParquetParts:
        """Close every file; a key without rows gets an empty file (a day without rows)."""
        for key in self.keys:
            self._writer(key)
        for w in self.writers.values():
            w.close()
        return ParquetParts({k: self.folder / f"{k}.parquet" for k in self.keys}, self.rows, self.schema)


def _is_text(t: Any) -> bool:
    """Text, or a column of no type (a day written without rows)."""
    if pa.types.is_dictionary(t):
        t = t.value_type
    return bool(pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_null(t))


def _text_unified(tables: list[Any]) -> list[Any]:
    """``tables`` with each text column of one type where partitions written by different
    runs stored it differently and one of them as a dictionary (of one index width or
    another, beside string, large string or no type: a categorical or plain text in the
    frame written, or a day without rows): a dictionary of int32 indices over strings in
    all of them. Other differences (plain text beside no type, integers beside floats, a
    column a partition lacks) are Arrow's permissive promotion's."""
    types: dict[str, set[Any]] = {}
    for t in tables:
        for f in t.schema:
            types.setdefault(f.name, set()).add(f.type)
    text = {name for name, ts in types.items() if len(ts) > 1 and all(_is_text(t) for t in ts) and any(pa.types.is_dictionary(t) for t in ts)}
    if not text:
        return tables
    target = pa.dictionary(pa.int32(), pa.string())
    out = []
    for t in tables:
        for name in text & set(t.column_names):
            t = t.set_column(t.schema.get_field_index(name), name, t.column(name).cast(target))
        out.append(t)
    return out


def _write_slices(df: pd.DataFrame, path: Path) -> None:
    """One row group per slice of the frame: Arrow holds one slice at a time, not a copy
    of the whole frame. A categorical column's categories are converted to Arrow once,
    each slice a dictionary array of its codes over them (converting the slice would
    convert every category again: a day's million pods, four times over)."""
    schema = _plain_text(pa.Schema.from_pandas(df, preserve_index=False))  # types from all rows, not the first slice
    categorical = [c for c in df.columns if isinstance(df[c].dtype, pd.CategoricalDtype)]
    words = {c: _words(df[c].cat.categories, schema.field(c).type.value_type) for c in categorical}
    # A categorical column with about one category per row (a day's pods) gains nothing from
    # a dictionary page that overflows anyway: written plain (a quarter of the write time
    # at a million rows), read back as the same categorical.
    plain = {c for c in categorical if len(df[c].cat.categories) > len(df) // 2}
    dictionary: bool | list[str] = [c for c in df.columns if c not in plain] if plain else True
    others = pa.schema([f for f in schema if f.name not in words])
    with pq.ParquetWriter(path, schema, compression=COMPRESSION, use_dictionary=dictionary) as writer:
        for at in range(0, max(len(df), 1), ROW_GROUP):
            part = df.iloc[at : at + ROW_GROUP]
            rest = pa.Table.from_pandas(part.drop(columns=categorical), schema=others, preserve_index=False)
            columns = [_dictionary(part[c], words[c], schema.field(c).type) if c in words else rest.column(c) for c in df.columns]
            writer.write_table(pa.Table.from_arrays(columns, schema=schema))


def _plain_text(schema: Any) -> Any:
    """``schema`` with a dictionary of Arrow-backed text categories (``large_string``
    values) as ``string`` values: the file Python-string categories give."""
    for i, f in enumerate(schema):
        if pa.types.is_dictionary(f.type) and pa.types.is_large_string(f.type.value_type):
            schema = schema.set(i, f.with_type(pa.dictionary(f.type.index_type, pa.string(), f.type.ordered)))
    return schema


def _words(categories: pd.Index, kind: Any) -> Any:
    """A categorical's categories as an Arrow array of ``kind``: Arrow-backed text taken
    as it is (no Python string per category), other categories converted."""
    if isinstance(categories.array, pd.arrays.ArrowStringArray):
        return pa.array(categories.array).cast(kind)
    return pa.array(categories.to_numpy(dtype=object), type=kind)


def _dictionary(s: pd.Series, words: Any, kind: Any) -> Any:
    """A categorical slice as an Arrow dictionary array over ``words`` (its categories, converted once)."""
    codes = s.cat.codes.to_numpy()
    return pa.DictionaryArray.from_arrays(pa.array(codes, type=kind.index_type, mask=codes < 0), words, ordered=kind.ordered)
