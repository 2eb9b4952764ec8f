"""Small builders shared by the cost tests: a price table with round numbers, raw rows."""

from __future__ import annotations

import datetime as dt
from typing import Any

import numpy as np
import pandas as pd

from gpu_ops.domain.config import PriceTable
from gpu_ops.flows.cost.pricing import PriceMatrix

# Round prices so that every expected figure can be worked out by hand.
PRICES = PriceTable(
    source="test prices",
    as_of=dt.date(2026, 10, 1),
    gpus={
        "a100-80gb": {"on-demand": 4.0, "spot": 1.0, "reserved": 2.0},
        "h100": {"on-demand": 10.0, "spot": 3.0},
        "l4": {"on-demand": 0.8, "spot": 0.4},
    },
    regions={"us-east-1": {"multiplier": 1.0}, "eu-west-1": {"multiplier": 1.5}},
)
MATRIX = PriceMatrix.from_table(PRICES)


def row(start: str, end: str | None, team: str = "nlp", gpu_type: str = "a100-80gb", gpu_count: Any = 1, capacity_type: str = "on-demand", **kw: Any) -> dict[str, Any]:
    base = {
        "start": start, "end": end or "", "namespace": kw.pop("namespace", "ml"), "pod": kw.pop("pod", ""), "node": kw.pop("node", "n1"),
        "team": team, "project": kw.pop("project", "p"), "cost_center": "", "experiment_id": "",
        "gpu_type": gpu_type, "gpu_count": str(gpu_count), "capacity_type": capacity_type,
        "sharing": kw.pop("sharing", ""), "gpu_share": kw.pop("gpu_share", ""),
    }
    base.update({k: str(v) for k, v in kw.items()})
    return base


def raw(rows: list[dict[str, Any]], location: str = "test.csv") -> pd.DataFrame:
    df = pd.DataFrame(rows).astype(object)
    df["source"] = "file"
    df["location"] = location
    df["row"] = np.arange(1, len(df) + 1)
    return df


def inventory(rows: list[dict[str, Any]]) -> pd.DataFrame:
    df = pd.DataFrame(rows).astype(object)
    df["source"] = "inventory"
    df["location"] = "inventory.csv"
    df["row"] = np.arange(1, len(df) + 1)
    return df
