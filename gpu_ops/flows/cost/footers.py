"""Parquet footer summaries cached in the gpu_ops database (table ``gpu_usage_file_footers``),
so a flat folder of daily files costs a ``stat`` per file, not a footer read.

Design: docs/concepts/cost-sources.md#footer-summaries-in-the-database
"""

from __future__ import annotations

import datetime as dt
import json
import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from gpu_ops.flows.cost.window import FooterSummary

FOOTERS_TABLE = "gpu_usage_file_footers"
VERSION = 1  # raise when FooterSummary's meaning changes: older rows are then ignored
SETTLE_NS = 2 * 10**9  # coarser than any file system's timestamp tick (FAT: 2 s)
_CHUNK = 500  # paths per lookup query (SQLite's bound-parameter limit)

_META = sa.MetaData()
_TABLE = sa.Table(
    FOOTERS_TABLE, _META,
    sa.Column("path", sa.Text, primary_key=True),  # real path (symlinks resolved)
    sa.Column("size", sa.BigInteger, nullable=False),
    sa.Column("mtime_ns", sa.BigInteger, nullable=False),
    sa.Column("ctime_ns", sa.BigInteger, nullable=False),
    sa.Column("version", sa.Integer, nullable=False),
    sa.Column("lo_ns", sa.BigInteger),  # NULL: no usable statistics, always read
    sa.Column("hi_ns", sa.BigInteger),  # NULL: rows still running, or no statistics for end
    sa.Column("open_intervals", sa.Boolean, nullable=False),
    sa.Column("row_groups", sa.Integer, nullable=False),
    sa.Column("columns", sa.Text, nullable=False),  # JSON list of the file's column names
    sa.Column("summarized_at", sa.DateTime(timezone=True), nullable=False),
)

_StatKey = tuple[int, int, int]


def _stat_key(st: os.stat_result) -> _StatKey:
    return st.st_size, st.st_mtime_ns, st.st_ctime_ns


class FooterCache:
    """Footer summaries of the files one read lists: :meth:`load` them in one query, ask
    :meth:`summary` per file, :meth:`remember` footers read, then :meth:`save`."""

    def __init__(self, store: Any, settle_ns: int = SETTLE_NS):
        self.store, self.settle_ns = store, settle_ns
        self._real: dict[str, str] = {}  # path as listed -> real path
        self._stats: dict[str, _StatKey | None] = {}  # real path -> stat key at load (None: stat failed)
        self._known: dict[str, FooterSummary] = {}  # real path -> summary whose stat key still matches
        self._new: dict[str, tuple[_StatKey, FooterSummary]] = {}
        self.problem: str | None = None  # why summaries could not be read or stored, when so

    def load(self, paths: Iterable[Path]) -> None:
        """Stat ``paths`` and read the stored summaries that still match them."""
        for p in paths:
            real = self._real[str(p)] = os.path.realpath(p)
            try:
                self._stats[real] = _stat_key(os.stat(real))
            except OSError:
                self._stats[real] = None  # the read reports it
        wanted = [r for r, k in self._stats.items() if k is not None]
        if not wanted or not self.store.has_table(FOOTERS_TABLE):
            return
        t = _TABLE
        try:
            with self.store.engine.connect() as conn:
                for i in range(0, len(wanted), _CHUNK):
                    for row in conn.execute(sa.select(t).where(t.c.path.in_(wanted[i : i + _CHUNK]), t.c.version == VERSION)):
                        if (row.size, row.mtime_ns, row.ctime_ns) == self._stats[row.path]:
                            self._known[row.path] = FooterSummary(row.lo_ns, row.hi_ns, bool(row.open_intervals), tuple(json.loads(row.columns)), row.row_groups)
        except sa.exc.SQLAlchemyError as exc:
            self._known.clear()
            self._failed(exc, "not read from")

    def _failed(self, exc: BaseException, what: str) -> None:
        """A database error that is not the database being out of reach: the day's figures do
        not depend on the cache, so the read goes on without it and says why (metadata)."""
        unavailable = self.store.unavailable(exc)
        if unavailable is not None:
            raise unavailable from exc
        self.problem = f"footer summaries {what} {FOOTERS_TABLE}: {str(getattr(exc, 'orig', exc)).strip().splitlines()[0]}"

    def summary(self, path: Path) -> FooterSummary | None:
        """The stored summary of ``path``, when the file is unchanged since it was made."""
        return self._known.get(self._realpath(path))

    def remember(self, path: Path, summary: FooterSummary) -> None:
        """Keep the summary of a footer just read, if the file was settled and unchanged
        since :meth:`load` stat'ed it (the stat before the read is the one stored)."""
        real = self._realpath(path)
        before = self._stats.get(real)
        try:
            now = _stat_key(os.stat(real))
        except OSError:
            return
        if before is None or now != before or time.time_ns() - max(now[1], now[2]) < self.settle_ns:
            return
        if self._known.get(real) != summary:
            self._new[real] = (now, summary)

    def _realpath(self, path: Path) -> str:
        real = self._real.get(str(path))
        return real if real is not None else os.path.realpath(path)

    def save(self) -> int:
        """Store the summaries remembered (replacing older rows of the same files); how many."""
        if not self._new:
            return 0

        at = dt.datetime.now(dt.timezone.utc)
        rows = [
            {"path": real, "size": k[0], "mtime_ns": k[1], "ctime_ns": k[2], "version": VERSION, "lo_ns": s.lo, "hi_ns": s.hi,
             "open_intervals": s.open_intervals, "row_groups": s.row_groups, "columns": json.dumps(list(s.columns)), "summarized_at": at}
            for real, (k, s) in self._new.items()
        ]
        try:
            with self.store.engine.begin() as conn:
                self.store.lock(conn, FOOTERS_TABLE)  # also makes concurrent first writers create the table once
                _TABLE.create(conn, checkfirst=True)
                paths = list(self._new)
                for i in range(0, len(paths), _CHUNK):
                    conn.execute(_TABLE.delete().where(_TABLE.c.path.in_(paths[i : i + _CHUNK])))
                conn.execute(_TABLE.insert(), rows)
        except sa.exc.SQLAlchemyError as exc:
            self._failed(exc, "not stored in")
            return 0
        self._known.update({real: s for real, (_, s) in self._new.items()})
        self._new.clear()
        return len(rows)
