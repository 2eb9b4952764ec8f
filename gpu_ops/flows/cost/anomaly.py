"""Spend anomalies: each day's spend of a team, project or training asset against its own
trailing days, with a robust baseline. Pure: daily aggregates in, scores out.

Design: docs/concepts/budgets-and-alerts.md#spend-anomalies
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

MAD_TO_SIGMA = 1.4826  # the MAD of a normal distribution, in standard deviations
DIMENSIONS = ("team", "project", "asset")
# One row per dimension and key scored on a day.
SCORE_COLUMNS = ("day", "dimension", "key", "team", "project", "spend_usd", "baseline_usd", "band_usd", "basis", "points", "score", "anomalous")


@dataclass(frozen=True)
class Baseline:
    median: float
    spread: float  # the band's half-width per unit of score: spread × widen
    basis: str  # "weekday" | "all days" | "none"
    points: int


def baseline(values: np.ndarray, weekdays: np.ndarray, weekday: int, settings: Any) -> Baseline:
    """The baseline of a day of ``weekday`` from its history (``values`` on days of
    ``weekdays``), under ``settings`` (an :class:`gpu_ops.domain.config.AnomalyConfig`)."""
    same = values[weekdays == weekday]
    if len(same) >= settings.min_weekday_points:
        pool, basis, widen = same, "weekday", 1.0
    elif len(values) >= settings.min_points:
        pool, basis, widen = values, "all days", settings.fallback_widen
    else:
        return Baseline(float("nan"), float("nan"), "none", len(values))
    median = float(np.median(pool))
    mad = float(np.median(np.abs(pool - median)))
    spread = max(MAD_TO_SIGMA * mad, settings.relative_floor * abs(median), 1.0)
    return Baseline(median, spread * widen, basis, len(pool))


def _series(daily: pd.DataFrame, days: Sequence[dt.date]) -> pd.DataFrame:
    """``daily`` as a key × day matrix of spend over ``days`` (0 where a key spent nothing)."""
    keyed = daily.groupby(["dimension", "key", "day"], sort=False)["spend_usd"].sum().unstack("day", fill_value=0.0)
    return keyed.reindex(columns=list(days), fill_value=0.0)


def score_day(daily: pd.DataFrame, day: dt.date, present: Sequence[dt.date], settings: Any) -> pd.DataFrame:
    """The scores of ``day`` (:data:`SCORE_COLUMNS`, one row per key that spent on it or in
    its window). ``daily``: columns ``day`` (date), ``dimension``, ``key``, ``team``,
    ``project``, ``spend_usd``, at daily grain; ``present``: the days that have data."""
    window = [d for d in present if day - dt.timedelta(days=settings.window_days) <= d < day]
    rows = daily[daily["day"].isin([*window, day])]
    if rows.empty:
        return pd.DataFrame({c: pd.Series([], dtype=object) for c in SCORE_COLUMNS})
    matrix = _series(rows, [*window, day])
    weekdays = np.array([d.weekday() for d in window], dtype=np.int64)
    attrs = rows.drop_duplicates(["dimension", "key"]).set_index(["dimension", "key"])[["team", "project"]]
    out = []
    for (dimension, key), values in zip(matrix.index, matrix.to_numpy()):
        b = baseline(values[:-1], weekdays, day.weekday(), settings)
        spend = float(values[-1])
        score = (spend - b.median) / b.spread if b.basis != "none" else float("nan")
        anomalous = bool(score >= settings.check_score and spend - b.median >= settings.min_excess_usd)
        team, project = attrs.loc[(dimension, key)]
        out.append((day, dimension, key, team, project, spend, b.median, b.spread, b.basis, b.points, score, anomalous))
    return pd.DataFrame(out, columns=list(SCORE_COLUMNS))


def describe(row: Any) -> str:
    """``team nlp spent $5,200.00 on 2026-11-20, usually $1,000.00 (score 12.4, weekday baseline)``."""
    return (
        f"{row['dimension']} {row['key']} spent ${row['spend_usd']:,.2f} on {row['day']}, usually ${row['baseline_usd']:,.2f} "
        f"(score {row['score']:.1f}, {row['basis']} baseline of {row['points']} day(s))"
    )


__all__ = ["DIMENSIONS", "SCORE_COLUMNS", "Baseline", "baseline", "describe", "score_day"]
