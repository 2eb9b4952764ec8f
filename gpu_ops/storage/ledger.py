"""The usage ledger: one row per training attempt in table ``gpu_usage_ledger``.

This is the cost flow's ``ledger`` usage source; the columns are a contract (the
usage-interval format of DESIGN.md plus run id, asset key, attempt and outcome):

    start, end, namespace, pod, node, team, project, cost_center, experiment_id,
    gpu_type, gpu_count, capacity_type, sharing, gpu_share,
    run_id, asset_key, attempt, outcome, last_checkpoint_at, lost_seconds

plus what the asset declared and where the recorded hardware comes from:

    declared_gpu_type, declared_gpu_count, hardware_source

``gpu_type``/``gpu_count`` are what really ran, as the worker reported it
(``hardware_source`` ``worker``): a CPU run is ``cpu`` with ``gpu_count`` 0, never
priced. ``declared`` means the worker started but died before reporting (the request
is recorded); ``none`` that no worker started (``gpu_count`` 0).

It is also the memory of the preemption policy: the attempts of a run (how many
preemptions, OOMs, ...) and an asset's preemption history (for the MTBP estimate).

One row per (``run_id``, ``asset_key``, ``attempt``), in the schema: a unique index
(:data:`KEY`, made by :func:`ensure`, which first drops the repeats a table made before it
may hold). A row is written by :func:`insert` inside the transaction that settles its
attempt (:func:`gpu_ops.flows.training.settle.settle_attempt`); a second settler's insert is a
no-op. No Dagster imports.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd
import sqlalchemy as sa

from gpu_ops.domain.cost.columns import CAPACITY_TYPES, SHARING_MODES
from gpu_ops.storage.tables import TableStore
from gpu_ops.domain.training.classify import Outcome
from gpu_ops.domain.training.policy import AttemptRecord

LEDGER_TABLE = "gpu_usage_ledger"
LEDGER_COLUMNS: tuple[str, ...] = (
    "start",
    "end",
    "namespace",
    "pod",
    "node",
    "team",
    "project",
    "cost_center",
    "experiment_id",
    "gpu_type",
    "gpu_count",
    "capacity_type",
    "sharing",
    "gpu_share",
    "run_id",
    "asset_key",
    "attempt",
    "outcome",
    "last_checkpoint_at",
    "lost_seconds",
    "declared_gpu_type",
    "declared_gpu_count",
    "hardware_source",
)
KEY = ("run_id", "asset_key", "attempt")  # unique in the schema
HARDWARE_SOURCES = ("worker", "declared", "none")


@dataclass(frozen=True)
class LedgerRow:
    start: dt.datetime
    end: dt.datetime
    namespace: str
    pod: str
    node: str
    team: str
    project: str
    cost_center: str
    experiment_id: str
    gpu_type: str
    gpu_count: int
    capacity_type: str
    sharing: str
    gpu_share: float
    run_id: str
    asset_key: str
    attempt: int
    outcome: str
    last_checkpoint_at: dt.datetime | None
    lost_seconds: float
    declared_gpu_type: str = ""
    declared_gpu_count: int = 0
    hardware_source: str = "declared"

    def __post_init__(self) -> None:
        for name in ("start", "end", "last_checkpoint_at"):
            value = getattr(self, name)
            if value is not None and value.tzinfo is None:
                raise ValueError(f"ledger {name} must be timezone-aware (UTC), got {value!r}")
        if self.end < self.start:
            raise ValueError(f"ledger row ends ({self.end}) before it starts ({self.start})")
        if self.capacity_type not in CAPACITY_TYPES:
            raise ValueError(f"capacity_type {self.capacity_type!r} is not one of {CAPACITY_TYPES}")
        if self.sharing not in SHARING_MODES:
            raise ValueError(f"sharing {self.sharing!r} is not one of {SHARING_MODES}")
        if self.outcome not in {o.value for o in Outcome}:
            raise ValueError(f"outcome {self.outcome!r} is not one of {[o.value for o in Outcome]}")
        if self.hardware_source not in HARDWARE_SOURCES:
            raise ValueError(f"hardware_source {self.hardware_source!r} is not one of {HARDWARE_SOURCES}")
        if self.outcome == Outcome.COMPLETED.value and self.lost_seconds != 0:
            raise ValueError("a completed attempt loses no work (lost_seconds must be 0)")

    @property
    def duration_s(self) -> float:
        return (self.end - self.start).total_seconds()

    @property
    def gpu_hours(self) -> float:
        return self.gpu_count * self.gpu_share * self.duration_s / 3600.0


def lost_seconds(outcome: Outcome, start: dt.datetime, end: dt.datetime, last_checkpoint_at: dt.datetime | None) -> float:
    """Wall seconds of work after the last checkpoint (or since the start) that a failed attempt lost."""
    if outcome is Outcome.COMPLETED:
        return 0.0
    since = max(start, last_checkpoint_at) if last_checkpoint_at is not None else start
    return max(0.0, (end - since).total_seconds())


def to_frame(rows: Sequence[LedgerRow]) -> pd.DataFrame:
    """Rows -> a frame with the contract's columns and dtypes (UTC timestamps, ints)."""
    data = {c: [getattr(r, c) for r in rows] for c in LEDGER_COLUMNS}
    df = pd.DataFrame(data, columns=list(LEDGER_COLUMNS))
    for col in ("start", "end", "last_checkpoint_at"):
        df[col] = pd.to_datetime(pd.Series(data[col], dtype="object"), utc=True).astype("datetime64[us, UTC]")
    df["gpu_count"] = df["gpu_count"].astype("int64")
    df["attempt"] = df["attempt"].astype("int64")
    df["declared_gpu_count"] = df["declared_gpu_count"].astype("int64")
    df["gpu_share"] = df["gpu_share"].astype("float64")
    df["lost_seconds"] = df["lost_seconds"].astype("float64")
    for col in (c for c in LEDGER_COLUMNS if c not in _TYPED):
        df[col] = df[col].astype(object)  # text, also in a frame without rows (the table's template)
    return df


_TYPED = {"start", "end", "last_checkpoint_at", "gpu_count", "attempt", "declared_gpu_count", "gpu_share", "lost_seconds"}


def ensure(store: TableStore) -> None:
    """The ledger table exists with its columns and the unique index on :data:`KEY`."""
    store.ensure_unique(LEDGER_TABLE, to_frame([]), KEY)


def insert(store: TableStore, conn: sa.Connection, row: LedgerRow) -> bool:
    """Write ``row`` in the caller's transaction ``conn`` (after :func:`ensure`); False when
    its run, asset and attempt have a row already (nothing is written)."""
    return store.insert_new(conn, LEDGER_TABLE, to_frame([row]), KEY) == 1


def fill_experiment_id(conn: sa.Connection, run_id: str, asset_key: str, attempt: int, experiment_id: str) -> None:
    """The attempt's row takes ``experiment_id`` (its MLflow experiment, known once the
    MLflow record was sent: after the bill, never before it)."""
    table = sa.Table(LEDGER_TABLE, sa.MetaData(), autoload_with=conn)
    where = (table.c.run_id == run_id, table.c.asset_key == asset_key, table.c.attempt == attempt)
    conn.execute(table.update().where(*where).values(experiment_id=experiment_id))


def append(store: TableStore, rows: Sequence[LedgerRow]) -> int:
    """Rows of attempts that were not settled here (imports, tests): the same table and
    index; a row whose key is stored already is refused (``StorageError``)."""
    ensure(store)
    return store.append(LEDGER_TABLE, to_frame(rows))


def read(store: TableStore, **where: object) -> pd.DataFrame:
    return store.read(LEDGER_TABLE, where=where or None, missing_ok=True)


def runs_ending_in(store: TableStore, window_start: dt.datetime, window_end: dt.datetime) -> pd.DataFrame:
    """The rows of every run and asset with an attempt that ended in the window (all their
    attempts, earlier days' included): what a day's figures per run read, not the history."""
    return store.read_groups_ending_in(LEDGER_TABLE, ("run_id", "asset_key"), window_start, window_end)


def watermark(store: TableStore) -> list[object] | None:
    """``[rows, newest end]`` of the ledger (None without one): it moves when an attempt
    settles; one aggregate query (the budget sensor asks it every tick)."""
    if not store.has_table(LEDGER_TABLE):
        return None
    with store.engine.connect() as conn:
        count, newest = conn.execute(sa.text(f'SELECT COUNT(*), MAX("end") FROM "{LEDGER_TABLE}"')).one()
    return [int(count), None if newest is None else str(newest)]


def run_history(store: TableStore, run_id: str, asset_key: str) -> list[AttemptRecord]:
    """Earlier attempts of this run and asset, oldest first."""
    df = read(store, run_id=run_id, asset_key=asset_key)
    if df.empty:
        return []
    df = df.sort_values(["attempt", "start"])
    return [
        AttemptRecord(
            attempt=int(r.attempt),
            outcome=Outcome(r.outcome),
            capacity_type=str(r.capacity_type),
            duration_s=float((r.end - r.start).total_seconds()),
            lost_seconds=float(r.lost_seconds),
        )
        for r in df.itertuples(index=False)
    ]


def preemption_exposure(store: TableStore, asset_key: str, capacity_type: str = "spot") -> tuple[float, int]:
    """(seconds this asset ran on ``capacity_type``, preemptions seen there): the MTBP data."""
    df = read(store, asset_key=asset_key, capacity_type=capacity_type)
    if df.empty:
        return 0.0, 0
    seconds = float((df["end"] - df["start"]).dt.total_seconds().sum())
    return seconds, int((df["outcome"] == Outcome.PREEMPTED.value).sum())
