"""Storage errors, importable without pandas or SQLAlchemy (the CLI catches them)."""

from __future__ import annotations

from gpu_ops.errors import GpuOpsError


class StorageError(GpuOpsError, RuntimeError):
    """A table could not be read or written; the message says which and why."""


class StorageUnavailable(StorageError):
    """The database could not be reached, did not answer in time, or stayed locked.

    The message names the database (password hidden) and says what to check.
    """
