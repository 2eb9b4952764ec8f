"""The estimates recorded at launch: table ``gpu_launch_estimates``, one row per attempt.

Every launch of a ``gpu_asset`` records what it was expected to cost
(:mod:`gpu_ops.domain.training.estimate`) before it starts, unique on (``run_id``, ``asset_key``,
``attempt``) like the ledger, so that an asset's estimate can be joined with what its
run really cost (``gpu_estimate_accuracy``): the run's first attempt holds the estimate
of the whole run. No Dagster here.
"""

from __future__ import annotations

import datetime as dt
import math

import pandas as pd

from gpu_ops.storage.tables import TableStore
from gpu_ops.domain.training.estimate import Estimate

ESTIMATE_TABLE = "gpu_launch_estimates"
KEY = ("run_id", "asset_key", "attempt")
COLUMNS = (
    "run_id", "asset_key", "attempt", "estimated_at", "capacity", "basis", "runs", "estimate_usd", "estimate_p90_usd",
    "median_s", "p90_s", "gpus", "currency", "detail",
)


def _number(value: float | None) -> float:
    return float("nan") if value is None else float(value)


def to_frame(run_id: str, asset_key: str, attempt: int, at: dt.datetime, capacity: str, est: Estimate) -> pd.DataFrame:
    if at.tzinfo is None:
        raise ValueError(f"estimated_at must be timezone-aware (UTC), got {at!r}")
    return pd.DataFrame({
        "run_id": [run_id], "asset_key": [asset_key], "attempt": [int(attempt)], "estimated_at": [pd.Timestamp(at).tz_convert("UTC")],
        "capacity": [capacity], "basis": [est.basis], "runs": [int(est.runs)], "estimate_usd": [_number(est.usd)],
        "estimate_p90_usd": [_number(est.p90_usd)], "median_s": [_number(est.median_s)], "p90_s": [_number(est.p90_s)],
        "gpus": [float(est.gpus)], "currency": [est.currency], "detail": [est.describe()],
    })


def _template() -> pd.DataFrame:
    est = Estimate("no history", 0, None, None, None, None, 0.0, ())
    return to_frame("", "", 0, dt.datetime(2000, 1, 1, tzinfo=dt.timezone.utc), "", est)


def record(store: TableStore, run_id: str, asset_key: str, attempt: int, at: dt.datetime, capacity: str, est: Estimate) -> bool:
    """Store the estimate of this attempt; False when it was stored already (a retried write)."""
    store.ensure_unique(ESTIMATE_TABLE, _template(), KEY)
    with store.engine.begin() as conn:
        return store.insert_new(conn, ESTIMATE_TABLE, to_frame(run_id, asset_key, attempt, at, capacity, est), KEY) == 1


def read(store: TableStore, **where: object) -> pd.DataFrame:
    df = store.read(ESTIMATE_TABLE, where=where or None, missing_ok=True)
    return df if not df.empty else _template().iloc[:0]


def first_of_runs(estimates: pd.DataFrame) -> pd.DataFrame:
    """The estimate of each run: the one recorded at its first attempt."""
    if estimates.empty:
        return estimates
    return estimates.sort_values(["run_id", "asset_key", "attempt"]).groupby(["run_id", "asset_key"], as_index=False, sort=False).head(1)


def known(value: object) -> float | None:
    """A stored figure, or None for the NaN/NULL an unknown estimate is stored as."""
    if value is None:
        return None
    number = float(value)  # type: ignore[arg-type]
    return None if math.isnan(number) else number


__all__ = ["COLUMNS", "ESTIMATE_TABLE", "KEY", "first_of_runs", "known", "read", "record", "to_frame"]
