"""Pandas building blocks the cost engine and the usage tables share: UTC datetime columns
wrapped without a pass over the data, and the quarantine's empty frame."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
from pandas.arrays import DatetimeArray

QUARANTINE_COLUMNS = ("source", "location", "row", "field", "reason", "record", "start", "end")


def utc_series(ns: np.ndarray, index: Any = None) -> pd.Series:
    """UTC nanoseconds (NaT = int64 min) -> datetime Series without a pass over the data.

    ``pd.to_datetime(..., utc=True)``, ``tz_localize`` and even ``DatetimeIndex(...,
    dtype=...)`` copy or convert every value; at ten million rows each costs as much as
    pricing them. The values already are UTC instants, so they are wrapped as they are.
    """
    values = np.asarray(ns, dtype=np.int64).view("datetime64[ns]")
    return pd.Series(DatetimeArray._simple_new(values, dtype=pd.DatetimeTZDtype("ns", "UTC")), index=index, copy=False)


def empty_quarantine() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "source": pd.Series([], dtype=object),
            "location": pd.Series([], dtype=object),
            "row": pd.Series([], dtype="Int64"),
            "field": pd.Series([], dtype=object),
            "reason": pd.Series([], dtype=object),
            "record": pd.Series([], dtype=object),
            "start": pd.Series([], dtype="datetime64[ns, UTC]"),
            "end": pd.Series([], dtype="datetime64[ns, UTC]"),
        }
    )
