"""Storage errors, importable without pandas or SQLAlchemy (the CLI catches them)."""

from __future__ import annotations

from gpu_ops.errors import StorageError as StorageError
from gpu_ops.errors import StorageUnavailable as StorageUnavailable

