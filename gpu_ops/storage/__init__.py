"""Table storage: SQLite by default, PostgreSQL in production."""

from gpu_ops.storage.tables import PARTITION_COLUMN, StorageError, TableStore, display_url

__all__ = ["PARTITION_COLUMN", "StorageError", "TableStore", "display_url"]
