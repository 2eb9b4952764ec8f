"""A throw-away PostgreSQL database, for tests and benchmarks."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator

import sqlalchemy as sa

from gpu_ops.storage.tables import TableStore


@contextlib.contextmanager
def scratch_database(admin_url: str, prefix: str = "gpu_ops_scratch") -> Iterator[str]:
    """Create a fresh database next to ``admin_url``'s, yield its URL, then drop it
    (terminating what is still connected)."""
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    admin = sa.create_engine(admin_url.replace("postgresql://", "postgresql+psycopg2://", 1), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    try:
        yield admin_url.rsplit("/", 1)[0] + f"/{name}"
    finally:
        TableStore.dispose_all()
        with admin.connect() as conn:
            conn.execute(sa.text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = :d AND pid <> pg_backend_pid()"), {"d": name})
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}"'))
        admin.dispose()
