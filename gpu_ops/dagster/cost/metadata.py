"""Materialization metadata the Dagster UI can use, for the cost tables. pandas is only
touched through the frames passed in.

Design: docs/concepts/cost-sources.md#metadata-the-dagster-ui-can-use
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import dagster as dg

from gpu_ops.domain.column_descriptions import describe
from gpu_ops.domain.formatting import column_rounder, round_hours, round_money

if TYPE_CHECKING:
    import pandas as pd

TOP_TEAMS = 5


def money(value: Any) -> float | None:
    """To the cent, None (shown empty, never NaN) when missing: :mod:`gpu_ops.domain.formatting`."""
    return round_money(value)


def hours(value: Any) -> float | None:
    """To three decimals, None when missing: :mod:`gpu_ops.domain.formatting`."""
    return round_hours(value)


def _column_type(dtype: Any) -> str:
    kind = getattr(dtype, "kind", "O")
    if str(dtype) == "category":
        return "string"
    return {"b": "bool", "i": "int", "u": "int", "f": "float", "M": "datetime", "m": "timedelta"}.get(kind, "string")


def _rounder(column: str) -> Any:
    return column_rounder(column)


# The IO manager's own column (the UTC day): every stored table has it, the schema shows the data's.
_STORAGE_COLUMNS = {"partition_key"}


def table_schema(df: pd.DataFrame, types: Mapping[str, str] | None = None) -> dg.TableSchema:
    types = types or {}
    return dg.TableSchema(
        columns=[
            dg.TableColumn(str(c), types.get(str(c)) or _column_type(df[c].dtype), description=describe(str(c)) or None)
            for c in df.columns
            if c not in _STORAGE_COLUMNS
        ]
    )


def table_metadata(df: pd.DataFrame | None, like: pd.DataFrame | None = None) -> dict[str, Any]:
    """``dagster/column_schema`` and ``dagster/row_count`` of a stored table (``like``
    gives the columns when ``df`` is None, an empty output)."""
    frame = df if df is not None else like
    out: dict[str, Any] = {"dagster/row_count": dg.MetadataValue.int(0 if df is None else len(df))}
    if frame is not None:
        out["dagster/column_schema"] = dg.MetadataValue.table_schema(table_schema(frame))
    return out


def _arrow_type(t: Any) -> str:
    """The column type an Arrow type is shown as (what the same column in pandas shows)."""
    import pyarrow as pa

    checks = ((pa.types.is_boolean, "bool"), (pa.types.is_integer, "int"), (pa.types.is_floating, "float"), (pa.types.is_timestamp, "datetime"), (pa.types.is_duration, "timedelta"))
    return next((name for check, name in checks if check(t)), "string")


def schema_metadata(schema: Any, rows: int) -> dict[str, Any]:
    """:func:`table_metadata` of a table handed by reference: its Arrow ``schema`` and ``rows``."""
    columns = [dg.TableColumn(f.name, _arrow_type(f.type), description=describe(f.name) or None) for f in schema if f.name not in _STORAGE_COLUMNS]
    return {"dagster/row_count": dg.MetadataValue.int(rows), "dagster/column_schema": dg.MetadataValue.table_schema(dg.TableSchema(columns=columns))}


def _cell(value: Any, rounder: Any) -> Any:
    if value is None:
        return None
    if isinstance(value, (list, tuple, set)):
        return ", ".join(map(str, value))
    if hasattr(value, "isoformat"):
        return value.isoformat()
    if isinstance(value, bool):
        return value
    if hasattr(value, "item") and not isinstance(value, str):  # numpy scalars
        value = value.item()
    if isinstance(value, float):
        if math.isnan(value):
            return None
        return rounder(value) if rounder else value
    if isinstance(value, int):
        return value
    return str(value)


def table_value(df: pd.DataFrame, limit: int = 50) -> dg.TableMetadataValue:
    """The first ``limit`` rows as a typed table (money in cents, hours to 3 decimals)."""
    types = {str(c): ("string" if df[c].dtype == object else _column_type(df[c].dtype)) for c in df.columns}
    rounders = {str(c): _rounder(str(c)) for c in df.columns}
    records = [
        dg.TableRecord({str(c): _cell(v, rounders[str(c)]) for c, v in zip(df.columns, row)})
        for row in df.head(limit).itertuples(index=False, name=None)
    ]
    return dg.MetadataValue.table(records, schema=dg.TableSchema(columns=[dg.TableColumn(c, t, description=describe(c) or None) for c, t in types.items()]))


def per_key(prefix: str, rows: Iterable[Mapping[str, Any]], key: str, fields: Iterable[str]) -> dict[str, Any]:
    """Numeric entries ``<prefix>/<row[key]>/<field>`` for the Plots tab."""
    out: dict[str, Any] = {}
    fields = list(fields)
    for row in rows:
        for field in fields:
            value = row.get(field)
            if value is None or (isinstance(value, float) and math.isnan(value)):
                continue
            rounder = _rounder(field) or float
            out[f"{prefix}/{row[key]}/{field}"] = dg.MetadataValue.float(rounder(value))
    return out


def top_teams(table: pd.DataFrame, limit: int = TOP_TEAMS) -> pd.DataFrame:
    """Teams by cost, largest first (an empty frame with the columns when there is no team)."""
    columns = ["team", "gpu_hours", "cost_usd", "savings_usd"]
    if table.empty or "team" not in table:
        return table.reindex(columns=columns).head(0)
    return table.groupby("team", as_index=False)[columns[1:]].sum().sort_values("cost_usd", ascending=False).head(limit)
