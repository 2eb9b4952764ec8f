"""`TableIOManager`: Dagster's handle on :class:`TableStore`. Thin wiring only."""

from __future__ import annotations

import dagster as dg
from pydantic import Field
import pandas as pd

from gpu_ops.storage.tables import PARTITION_COLUMN, StorageError, TableStore, display_url


def table_name(key: dg.AssetKey) -> str:
    return "__".join(key.path)


class TableIOManager(dg.ConfigurableIOManager):
    """Stores DataFrame outputs as SQL tables (SQLite by default, PostgreSQL in production).

    A partitioned asset's write replaces exactly its partitions' rows in one transaction.
    Loading one upstream partition gives its rows without ``partition_key``; loading
    several (a window of days) keeps ``partition_key`` so they can be told apart.
    """

    url: str = Field(description="SQLAlchemy URL: sqlite:///path.db or postgresql://user@host/db")

    def _store(self) -> TableStore:
        return TableStore(self.url)

    def handle_output(self, context: dg.OutputContext, obj: pd.DataFrame) -> None:
        if obj is None:
            return
        if not isinstance(obj, pd.DataFrame):
            raise StorageError(f"{context.asset_key.to_user_string()}: TableIOManager stores pandas DataFrames, got {type(obj).__name__}")
        name = table_name(context.asset_key)
        keys = list(context.asset_partition_keys) if context.has_asset_partitions else None
        rows = self._store().write(name, obj, partition_keys=keys)
        context.add_output_metadata(
            {"table": name, "rows": dg.MetadataValue.int(rows), "storage": display_url(self.url)}
        )

    def load_input(self, context: dg.InputContext) -> pd.DataFrame:
        key = context.asset_key
        name = table_name(key)
        if context.has_asset_partitions:
            keys = list(context.asset_partition_keys)
            df = self._store().read(name, partition_keys=keys, missing_ok=True)
            if len(keys) == 1 and PARTITION_COLUMN in df.columns:
                df = df.drop(columns=[PARTITION_COLUMN])
            return df
        return self._store().read(name, missing_ok=True)
