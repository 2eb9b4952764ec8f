"""Start reading Parquet usage files while `gpu-ops cost` is still importing pandas.

Parquet decoding runs in Arrow's C++ threads without the GIL, so a read begun before
``import pandas`` (0.4 s) overlaps with it. :func:`read_table_file` picks a prefetched
table up when the file and column set match, and otherwise reads as usual (errors are
reported there, never here). Imports nothing heavier than pyarrow.
"""

from __future__ import annotations

import glob as globmod
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

_lock = threading.Lock()
_pending: dict[tuple[str, tuple[str, ...] | None], "_Read"] = {}


def attribution_columns(group_by: Sequence[str], with_inventory: bool) -> list[str]:
    """Columns an attribution needs after validation."""
    cols = [k for k in group_by if not k.startswith("label:")]
    if any(k.startswith("label:") for k in group_by):
        cols.append("labels")
    if with_inventory:
        cols.append("node")
    return cols


def needed_columns(group_by: Sequence[str], with_inventory: bool, dedupe: bool) -> list[str]:
    """Columns to read from files for an attribution: fewer columns, less I/O at 10M rows."""
    cols = {"start", "end", "team", "gpu_type", "gpu_count", "capacity_type", "sharing", "gpu_share", "region", "lost_seconds", "outcome"}
    cols |= set(attribution_columns(group_by, with_inventory))
    if dedupe:
        cols |= {"namespace", "pod"}
    return sorted(cols)


def parquet_columns(schema_names: Iterable[str], columns: Sequence[str] | None) -> list[str]:
    """The columns of a Parquet file that a read with ``columns`` loads (labels always)."""
    return [c for c in schema_names if columns is None or c in columns or c.startswith("label:")]


class _Read(threading.Thread):
    def __init__(self, path: str, columns: Sequence[str] | None):
        super().__init__(daemon=True, name=f"prefetch {path}")
        self.path, self.columns = path, columns
        self.table: Any = None

    def run(self) -> None:
        import pyarrow.parquet as pq

        try:
            present = parquet_columns(pq.read_schema(self.path).names, self.columns)
            self.table = pq.read_table(self.path, columns=present)
        except Exception:  # the regular read reports it with the file's name
            self.table = None


def start(patterns: Iterable[str], columns: Sequence[str] | None, base_dir: Path | None = None) -> int:
    """Begin reading the Parquet files the patterns name; returns how many were started."""
    started = 0
    for pattern in patterns:
        p = Path(pattern).expanduser()
        if not p.is_absolute() and base_dir is not None:
            p = base_dir / p
        paths = sorted(globmod.glob(str(p), recursive=True)) if any(c in str(p) for c in "*?[") else [str(p)]
        for path in paths:
            if not path.lower().endswith((".parquet", ".pq")):
                continue
            key = (str(Path(path)), tuple(columns) if columns is not None else None)
            with _lock:
                if key not in _pending:
                    _pending[key] = _Read(path, columns)
                    _pending[key].start()
                    started += 1
    return started


def take(path: Path, columns: Sequence[str] | None) -> Any:
    """The prefetched Arrow table for ``path`` and ``columns``, or None."""
    key = (str(path), tuple(columns) if columns is not None else None)
    with _lock:
        read = _pending.pop(key, None)
    if read is None:
        return None
    read.join()
    return read.table
