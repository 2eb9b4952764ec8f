"""The fleet configuration the alerts and load benchmarks share: N budgets of 5
thresholds (50/80/100 % actual, 120 % forecast, an absolute amount), every 10th
throttling, all notifying one log channel."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def budget_name(i: int) -> str:
    return f"team-{i:06d}-monthly"


def fleet_data(n: int, folder: Path) -> dict[str, Any]:
    budgets = []
    for i in range(n):
        b: dict[str, Any] = {
            "name": budget_name(i),
            "scope": {"team": f"team-{i:06d}"},
            "amount_usd": 10_000,
            "thresholds": [{"percent": 50}, {"percent": 80}, {"percent": 100, "severity": "critical"}, {"percent": 120, "basis": "forecast"}, {"absolute_usd": 12_000}],
            "channels": ["log"],
        }
        if i % 10 == 0:
            b["enforcement"] = {"action": "throttle", "grace_period": "0s", "max_gpus": 8}
        budgets.append(b)
    return {
        "storage": {"url": f"sqlite:///{folder / 'costs.db'}"},
        "prices": {"source": "bench", "as_of": "2026-11-01", "gpus": {"h100": {"on-demand": 12.29}}},
        "budgets": budgets,
        "channels": {"log": {"type": "log"}},
    }
