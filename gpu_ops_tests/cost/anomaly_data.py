"""Generated daily spend for the anomaly tests: a month with a weekly rhythm, and the daily
tables the gpu_spend_anomalies asset reads, written to a real store."""

from __future__ import annotations

import datetime as dt
from typing import Any

import numpy as np
import pandas as pd

START = dt.date(2026, 10, 3)  # a Saturday: the first days are a weekend


def month(days: int = 42, seed: int = 7, start: dt.date = START) -> tuple[pd.DataFrame, list[dt.date]]:
    """Team nlp: about $1,000 on weekdays, $150 on weekends, 8% noise; team cv about $300 flat."""
    rng = np.random.default_rng(seed)
    dates = [start + dt.timedelta(days=i) for i in range(days)]
    rows = []
    for d in dates:
        nlp = (150.0 if d.weekday() >= 5 else 1000.0) * rng.normal(1.0, 0.08)
        rows += [(d, "team", "nlp", "nlp", "", nlp), (d, "team", "cv", "cv", "", 300.0 * rng.normal(1.0, 0.08))]
    return pd.DataFrame(rows, columns=["day", "dimension", "key", "team", "project", "spend_usd"]), dates


def write_daily_tables(store: Any, daily: pd.DataFrame, dates: list[dt.date]) -> None:
    """Per day: gpu_cost_attribution rows of the teams (project p) and an idle row, and one
    training run of asset train_llm (team nlp) in gpu_estimate_accuracy."""
    for d in dates:
        day = daily[daily["day"] == d]
        attribution = pd.DataFrame({"team": [*day["key"], "__idle__"], "project": "p", "cost_usd": [*day["spend_usd"], 50.0]})
        store.write("gpu_cost_attribution", attribution, partition_keys=[d.isoformat()])
        runs = pd.DataFrame({"run_id": ["r"], "asset_key": ["train_llm"], "team": ["nlp"], "project": ["p"], "actual_usd": [200.0]})
        store.write("gpu_estimate_accuracy", runs, partition_keys=[d.isoformat()])
