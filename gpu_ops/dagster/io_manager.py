"""`TableIOManager`: Dagster's handle on :class:`TableStore`. Thin wiring only.

pandas and SQLAlchemy are imported when a table is read or written, not when the code
location loads (they would double its load time).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from importlib.metadata import version
from typing import TYPE_CHECKING, Any

import dagster as dg
from pydantic import Field

from gpu_ops.domain.config import resolve_storage_url
from gpu_ops.domain.cost.columns import PARTITION_COLUMN

if TYPE_CHECKING:
    from gpu_ops.storage.tables import TableStore

# `dg.AssetIn(metadata={COLUMNS: [...]})`: load only these columns of the upstream table.
COLUMNS = "columns"
# `dg.AssetIn(metadata={GROUPED: {"groupings": {label: [columns]}, "sums": [...], "keep": [...]}})`:
# load the upstream partitions summed by the database per grouping (TableStore.read_grouped).
GROUPED = "gpu_ops/grouped"
# `dg.AssetIn(metadata={BY_REFERENCE: True})`: a row-level table kept as Parquet files is loaded
# as the files (gpu_ops.storage.files.ParquetParts), for DuckDB to read where they lie.
BY_REFERENCE = "gpu_ops/by_reference"
# `dg.AssetOut(metadata={ROW_LEVEL: True})`: a row-level table, kept as Parquet files under
# `row_level_path` when that is set (gpu_ops.storage.files), else as a SQL table.
ROW_LEVEL = "gpu_ops/row_level"
# An op tag (`op_tags={ROW_LEVEL_READER: "true"}`) of the steps that load a row-level table
# whole (a day's million usage pieces): the code location's executor runs them one at a
# time (gpu_ops.dagster.training.definitions), so their peaks never add up in one run.
ROW_LEVEL_READER = "gpu_ops/row_level_reader"
# `dg.AssetOut(metadata={COLUMN_SCHEMA: dg.TableSchema(...)})`: the table's columns; a read of it
# before any partition was written gives them, typed, with no rows (instead of a frame without columns).
COLUMN_SCHEMA = "dagster/column_schema"
# Pandas dtypes of dagster/column_schema types (others: object, as text and dates are read back).
_DTYPES = {"int": "int64", "float": "float64", "bool": "bool", "datetime": "datetime64[ns, UTC]"}
# What Dagster names a type inferred from `pd.DataFrame` (its __module__ became "pandas" in pandas 3).
_DATAFRAME_QUALNAME = "pandas.DataFrame" if int(version("pandas").split(".")[0]) >= 3 else "pandas.core.frame.DataFrame"


def _is_dataframe(_context: Any, value: object) -> dg.TypeCheck:
    import pandas as pd

    if not isinstance(value, pd.DataFrame):
        return dg.TypeCheck(
            success=False,
            description=f"Value of type {type(value)} failed type check for Dagster type DataFrame, expected value to be of Python type {_DATAFRAME_QUALNAME}.",
        )
    return dg.TypeCheck(success=True)


class _DataFrameType(dg.DagsterType):
    """The Dagster type a ``pd.DataFrame`` annotation gives an input or output (same key,
    name, description and isinstance check), built without importing pandas: asset
    annotations are evaluated when the code location loads."""

    def __init__(self) -> None:
        super().__init__(
            type_check_fn=_is_dataframe,
            key=f"_TypeHintInferred[{_DATAFRAME_QUALNAME}]",
            description=f"DagsterType created from a type hint for the Python type {_DATAFRAME_QUALNAME}",
        )

    @property
    def display_name(self) -> str:
        return "DataFrame"

    @property
    def typing_type(self) -> Any:
        import pandas as pd

        return pd.DataFrame


# For `dg.AssetIn(dagster_type=...)` / `@dg.asset(dagster_type=...)` in place of a `pd.DataFrame` annotation.
DATAFRAME_TYPE: dg.DagsterType = _DataFrameType()


@contextmanager
def _failure_on_unreachable_database() -> Iterator[None]:
    """A database out of reach fails the step with the store's one-paragraph explanation
    (database named, password hidden, what to check), not a driver traceback."""
    from gpu_ops.storage.errors import StorageUnavailable

    try:
        yield
    except StorageUnavailable as exc:
        raise dg.Failure(description=str(exc), metadata={"storage_unavailable": True}) from None


def table_name(key: dg.AssetKey) -> str:
    return "__".join(key.path)


class TableIOManager(dg.ConfigurableIOManager):
    """Stores DataFrame outputs as SQL tables (SQLite by default, PostgreSQL in production).

    A row-level output handed by reference (:class:`~gpu_ops.storage.files.ParquetParts`:
    the day files the cost flow wrote from DuckDB) is moved under ``row_level_path``, or
    loaded into the SQL store; an input marked :data:`BY_REFERENCE` gets such files back
    (not read) when the table lives under ``row_level_path``.

    A partitioned asset's write replaces exactly its partitions' rows in one transaction.
    Loading one upstream partition gives its rows without ``partition_key``; loading
    several (a window of days) keeps ``partition_key`` so they can be told apart. An
    input whose metadata names ``columns`` gets only those (the ones the table has).
    """

    url: str = Field(
        description=(
            "SQLAlchemy URL: sqlite:///path.db or postgresql://user@host/db. A password is written "
            "{env: NAME} in its place (resolved when a table is read or written, so run storage only "
            "ever holds the reference), or the whole URL given as dg.EnvVar."
        )
    )
    connect_timeout_s: float = Field(default=10.0, description="Give up opening a connection after this long (storage.connect_timeout_s).")
    statement_timeout_s: float = Field(default=300.0, description="Cancel a statement running longer (storage.statement_timeout_s).")
    row_level_path: str | None = Field(
        default=None,
        description="Folder for row-level tables (outputs marked gpu_ops/row_level) as Parquet, one file per partition (storage.row_level_path); unset: SQL tables.",
    )

    def _files(self, metadata: Any) -> Any:
        """The Parquet store when this output is row-level and a folder is configured, else None."""
        if not self.row_level_path or not (metadata or {}).get(ROW_LEVEL):
            return None
        from gpu_ops.storage.files import PartitionFiles

        return PartitionFiles(self.row_level_path)

    def _store(self) -> "TableStore":
        from gpu_ops.storage.tables import TableStore

        return TableStore(
            resolve_storage_url(self.url), connect_timeout_s=self.connect_timeout_s, statement_timeout_s=self.statement_timeout_s
        )

    def handle_output(self, context: dg.OutputContext, obj: Any) -> None:
        import pandas as pd

        from gpu_ops.storage.tables import StorageError, display_url

        from gpu_ops.storage.files import ParquetParts

        if obj is None:
            return
        if isinstance(obj, ParquetParts):
            self._adopt(context, obj)
            return
        if not isinstance(obj, pd.DataFrame):
            raise StorageError(f"{context.asset_key.to_user_string()}: TableIOManager stores pandas DataFrames, got {type(obj).__name__}")
        name = table_name(context.asset_key)
        keys = list(context.asset_partition_keys) if context.has_asset_partitions else None
        files = self._files(context.definition_metadata) if keys else None
        if files is not None:
            assert keys  # row-level files are per partition
            t0 = time.perf_counter()
            rows = files.write(name, obj, partition_keys=keys)
            where = files.path(name, keys[0]) if len(keys) == 1 else files.root / name
            context.add_output_metadata(
                {"table": name, "rows": dg.MetadataValue.int(rows), "storage": dg.MetadataValue.path(str(where)), "write_seconds": dg.MetadataValue.float(round(time.perf_counter() - t0, 3))}
            )
            return
        store = self._store()
        t0 = time.perf_counter()
        with _failure_on_unreachable_database():
            rows = store.write(name, obj, partition_keys=keys)
        context.add_output_metadata(
            {"table": name, "rows": dg.MetadataValue.int(rows), "storage": display_url(store.url), "write_seconds": dg.MetadataValue.float(round(time.perf_counter() - t0, 3))}
        )

    def _adopt(self, context: dg.OutputContext, parts: Any) -> None:
        """A row-level table handed by reference (Parquet files already written): moved in
        place under ``row_level_path``, or loaded into the SQL store (its storage boundary)."""
        from gpu_ops.storage.tables import display_url

        name = table_name(context.asset_key)
        keys = list(parts.paths)
        files = self._files(context.definition_metadata) if context.has_asset_partitions else None
        t0 = time.perf_counter()
        if files is not None:
            rows = files.adopt(name, parts)
            where = str(files.path(name, keys[0]) if len(keys) == 1 else files.root / name)
        else:
            store = self._store()
            with _failure_on_unreachable_database():
                rows = store.write(name, parts.to_pandas(), partition_keys=keys if context.has_asset_partitions else None)
            where = display_url(store.url)
        context.add_output_metadata(
            {"table": name, "rows": dg.MetadataValue.int(rows), "storage": dg.MetadataValue.path(where) if files is not None else where,
             "write_seconds": dg.MetadataValue.float(round(time.perf_counter() - t0, 3))}
        )

    def load_input(self, context: dg.InputContext) -> Any:
        with _failure_on_unreachable_database():
            return self._load(context)

    def _load(self, context: dg.InputContext) -> Any:
        from gpu_ops.storage.files import ParquetParts

        df = self._read(context)
        if isinstance(df, ParquetParts) or len(df.columns):  # files handed by reference, or a frame with its columns
            return df
        # No table yet: the upstream's declared columns, typed, without rows.
        return _empty_table(context.upstream_output.definition_metadata if context.upstream_output else None, df, context)

    def _read(self, context: dg.InputContext) -> Any:
        name = table_name(context.asset_key)
        columns = (context.definition_metadata or {}).get(COLUMNS)
        columns = list(columns) if columns is not None else None
        if context.has_asset_partitions:
            keys = list(context.asset_partition_keys)
            if columns is not None and len(keys) > 1:
                columns.append(PARTITION_COLUMN)
            files = self._files(context.upstream_output.definition_metadata if context.upstream_output else None)
            if files is not None and (context.definition_metadata or {}).get(BY_REFERENCE):
                return files.parts(name, keys)
            if files is not None:
                return files.read(name, partition_keys=keys, columns=columns)
            grouped = (context.definition_metadata or {}).get(GROUPED)
            if grouped is not None:
                df = self._store().read_grouped(name, grouped["groupings"], grouped["sums"], keep=grouped.get("keep", ()), partition_keys=keys, missing_ok=True)
            else:
                df = self._store().read(name, partition_keys=keys, columns=columns, missing_ok=True)
            if len(keys) == 1 and PARTITION_COLUMN in df.columns:
                df = df.drop(columns=[PARTITION_COLUMN])
            return df
        return self._store().read(name, columns=columns, missing_ok=True)


def _empty_table(metadata: Any, df: Any, context: dg.InputContext) -> Any:
    """The empty typed table that ``metadata``'s column schema declares (only the columns
    the input asks for, plus ``partition_key`` when it reads several partitions), or ``df``
    as it is without a schema."""
    import pandas as pd

    declared = (metadata or {}).get(COLUMN_SCHEMA)
    schema = getattr(declared, "schema", declared)  # a TableSchemaMetadataValue or the TableSchema itself
    if not isinstance(schema, dg.TableSchema):
        return df
    wanted = (context.definition_metadata or {}).get(COLUMNS)
    cols = {c.name: _DTYPES.get(c.type, "object") for c in schema.columns if wanted is None or c.name in wanted}
    if context.has_asset_partitions and len(context.asset_partition_keys) > 1:
        cols[PARTITION_COLUMN] = "object"
    return pd.DataFrame({name: pd.Series([], dtype=dtype) for name, dtype in cols.items()})
