"""Usage tables and the pandas boundary around the engine: the tables read as raw frames
with provenance columns, file header probes, the quarantine's shape and the deprecated
:func:`validate_usage`.

Design: docs/concepts/cost-sources.md#the-cost-flow-end-to-end
"""

from __future__ import annotations

import datetime as dt
import json
import re
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from gpu_ops.flows.cost.engine import validate
from gpu_ops.flows.cost.frames import utc_series
from gpu_ops.flows.cost.pricing import PriceMatrix
from gpu_ops.flows.cost.read import INVENTORY, USAGE
from gpu_ops.domain.cost.rules import CONTROL, FILE_FIELD
from gpu_ops.storage.ledger import LEDGER_TABLE

if TYPE_CHECKING:
    from gpu_ops.flows.cost.window import ReadStats, Window

# Optional columns a source may carry (the ledger has all of them; a billing export may
# carry any): region prices through the region multiplier, the rest feeds ROI.
OPTIONAL_COLUMNS = ("region", "labels", "run_id", "asset_key", "attempt", "outcome", "last_checkpoint_at", "lost_seconds")
PROVENANCE_COLUMNS = ("source", "location", "row")




@dataclass
class Validated:
    rows: pd.DataFrame  # typed, canonical, priced
    quarantine: pd.DataFrame  # QUARANTINE_COLUMNS


# --------------------------------------------------------------------------- helpers


def const_column(n: int, value: Any) -> pd.Categorical:
    """A constant string column that costs one byte per row."""
    return pd.Categorical.from_codes(np.zeros(n, dtype=np.int8), categories=[value])


def factorized(s: pd.Series) -> tuple[np.ndarray, pd.Index]:
    if isinstance(s.dtype, pd.CategoricalDtype):
        # Parquet dictionaries arrive as categoricals: their codes already are the factorization.
        return s.cat.codes.to_numpy(), pd.Index(s.cat.categories)
    codes, uniques = pd.factorize(s, use_na_sentinel=True)
    return codes, pd.Index(uniques)


def lut(values: list[Any], missing: Any, dtype: Any) -> np.ndarray:
    """Look-up table indexed by codes; code -1 (missing) hits the extra last entry."""
    return np.array([*values, missing], dtype=dtype)


def blank_mask(s: pd.Series) -> np.ndarray:
    codes, uniques = factorized(s)
    return lut([str(u).strip() == "" for u in uniques], True, bool)[codes]


def parse_times(s: pd.Series) -> tuple[pd.Series, np.ndarray]:
    """Any time column -> UTC datetime64[ns]; returns (parsed, bad mask).

    Naive times are UTC (the format says so); offsets are converted. Missing stays NaT.
    Bad means unparseable or outside what datetime64[ns] holds (1677-09-21 to
    2262-04-11): a ``9999-12-31`` "still running" sentinel is reported, never wrapped
    round to a wrong day. :func:`time_problem` says which, for the rows that are bad.
    """
    if isinstance(s.dtype, pd.DatetimeTZDtype) or pd.api.types.is_datetime64_dtype(s.dtype):
        return _utc_ns(s)
    # Strings (CSV): parse each distinct value once, then index by code.
    blank = blank_mask(s)
    codes, uniques = factorized(s)
    texts = pd.Series([u if isinstance(u, (pd.Timestamp, dt.date)) else str(u).strip() for u in uniques], dtype=object)
    parsed_u, _ = _utc_ns(pd.to_datetime(texts, utc=True, errors="coerce", format="ISO8601"))
    ints = lut(list(parsed_u.array.asi8), _NAT, np.int64)[codes]
    return utc_series(ints, s.index), ~blank & (ints == _NAT)


_NAT = np.iinfo(np.int64).min
_UNIT_NS = {"s": 10**9, "ms": 10**6, "us": 10**3, "ns": 1}


def _utc_ns(s: pd.Series) -> tuple[pd.Series, np.ndarray]:
    """A datetime column of any unit -> UTC nanoseconds; values it cannot hold -> NaT, flagged."""
    if not isinstance(s.dtype, pd.DatetimeTZDtype):
        s = s.dt.tz_localize("UTC")
    elif str(s.dtype.tz) != "UTC":
        s = s.dt.tz_convert("UTC")
    unit = np.datetime_data(s.dtype.base)[0]
    if unit == "ns":
        return (s if str(s.dtype) == "datetime64[ns, UTC]" else s.astype("datetime64[ns, UTC]")), np.zeros(len(s), bool)
    scale = _UNIT_NS[unit]
    ints = s.array.asi8
    nat = ints == _NAT
    out = ~nat & ((ints > np.iinfo(np.int64).max // scale) | (ints <= _NAT // scale))
    ns = np.where(nat | out, _NAT, np.where(nat | out, 0, ints) * scale)
    return utc_series(ns, s.index), out


def show_value(value: Any) -> str:
    return repr(value if isinstance(value, str) else str(value))


# --------------------------------------------------------------------------- sources


def file_problems(quarantine: pd.DataFrame) -> pd.DataFrame:
    """The quarantine's file-level rows: patterns that matched nothing, files not readable."""
    if quarantine.empty:
        return quarantine
    return quarantine[quarantine["field"] == FILE_FIELD].reset_index(drop=True)


def read_ledger(store: Any, window: Window | None = None, stats: ReadStats | None = None, twins_of: Sequence[Any] = ()) -> pd.DataFrame:
    """The training ledger (``gpu_usage_ledger``), or its rows that can touch ``window``
    (a range query), or with ``twins_of`` its rows starting at those times that ended
    before the window (see :func:`read_intervals`); absent table -> no rows.

    Attempts that held no GPU (``gpu_count`` 0: a launch that never started, a run on
    CPU) are the retry policy's memory, not GPU usage: their GPU-hours are zero by
    construction, so they are left out here rather than quarantined. Any other value,
    blank or malformed, still goes through validation.
    """
    df = read_intervals(store, LEDGER_TABLE, window, stats, twins_of)
    if not df.empty and "gpu_count" in df.columns:
        df = df[pd.to_numeric(df["gpu_count"], errors="coerce") != 0].reset_index(drop=True)
    if df.empty:
        return pd.DataFrame()
    df = df.drop(columns=[c for c in ("partition_key",) if c in df.columns])
    df["source"] = const_column(len(df), "ledger")
    # A table row has no number (what a query returns depends on its window): a ledger
    # row is named by its run and attempt, as a collected pod is by its name.
    if {"run_id", "attempt"} <= set(df.columns):
        attempt = df["attempt"].astype(object).where(df["attempt"].notna(), "?")
        df["location"] = LEDGER_TABLE + " run " + df["run_id"].astype(str) + " attempt " + attempt.astype(str)
    else:
        df["location"] = const_column(len(df), LEDGER_TABLE)
    df["row"] = pd.array([None] * len(df), dtype="Int64")
    return df


def read_intervals(store: Any, table: str, window: Window | None = None, stats: ReadStats | None = None, twins_of: Sequence[Any] = ()) -> pd.DataFrame:
    """All rows of an interval table, or (with a window) those that can touch it, or (with
    ``twins_of``, start times of running rows) those starting then that ended before it."""
    if window is None:
        return store.read(table, missing_ok=True)
    if twins_of:
        return store.read_closed_twins(table, twins_of, window.start)
    df = store.read_range(table, window.start, window.end, missing_ok=True)
    if stats is not None:
        stats.table_rows[table] = len(df)
    return df


def running_starts(raw: pd.DataFrame, before: pd.Timestamp) -> list[pd.Timestamp]:
    """Start times of named, still-running rows that started before ``before``: the rows
    whose closed twin (same namespace, pod and start) may lie outside a window's read."""
    if raw.empty or not {"start", "end", "pod"} <= set(raw.columns):
        return []
    start, end = parse_times(raw["start"])[0], parse_times(raw["end"])[0]
    mask = end.isna().to_numpy() & (start < before).to_numpy() & (raw["pod"].astype(str) != "").to_numpy()
    return sorted(set(start[mask]))


def json_object(text: Any) -> Any:
    """``labels`` text -> its dict, or a string saying why it is not a JSON object of labels."""
    try:
        value = json.loads(text)
    except (TypeError, ValueError) as exc:
        return f"not valid JSON ({exc}): {show_value(text)}"
    if not isinstance(value, dict) or any(isinstance(v, (dict, list)) for v in value.values()):
        return f"must be a JSON object of label names to values, got {show_value(text)}"
    if any(re.search(CONTROL, x) for kv in value.items() for x in kv if isinstance(x, str)):
        return f"a label name or value holds a control character (NUL or another) once its JSON escapes are read: {show_value(text)}"
    return value


# --------------------------------------------------------------------------- validation


def quarantine_in_window(q: pd.DataFrame, window_start: pd.Timestamp, window_end: pd.Timestamp) -> pd.DataFrame:
    """Bad rows that belong to ``[window_start, window_end)``.

    A row whose start cannot be read could belong to any day, so it is reported in every
    window rather than lost; otherwise the (possibly inverted) interval must touch it.
    """
    if q.empty:
        return q
    s, e = q["start"], q["end"]
    lo = s.where(e.isna() | (s <= e), e)
    hi = e.where(e.notna() & (e >= s), s)
    open_ = e.isna()
    keep = s.isna() | ((lo < window_end) & (open_ | (hi >= window_start)))
    return q[keep.to_numpy()].reset_index(drop=True)


# --------------------------------------------------------------------------- inventory


def validate_usage(raw: pd.DataFrame, prices: PriceMatrix, required: Sequence[str] = ("team",)) -> Validated:
    """Deprecated: usage is checked by the one engine (:func:`gpu_ops.flows.cost.engine.validate`).

    Kept so that callers of ``gpu_ops.validate_usage`` keep working: the same return
    shape (good rows typed, canonical and priced; the quarantine), computed by the engine
    and its rule book (``required=("node",)``: the node inventory's rules). The pandas
    reader it was lives on as the tests' oracle."""
    warnings.warn(
        "gpu_ops.validate_usage is deprecated; usage is checked by the cost engine (gpu_ops.flows.cost.engine.validate)",
        DeprecationWarning, stacklevel=2,
    )
    got = validate(raw, prices, kind=INVENTORY if tuple(required) == ("node",) else USAGE)
    return Validated(got.rows, got.quarantine)
