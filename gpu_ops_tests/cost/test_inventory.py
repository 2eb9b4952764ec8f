"""The node inventory's fleet against the pandas oracle on random inventories: snapshots of
running nodes, re-deliveries, records of one node that overlap or disagree, copies and bad
rows. A node is one machine: at any moment it is in the fleet once (the engine's identity
and overlap rules for ``kind`` inventory; :func:`oracle.one_node_at_a_time` in Python)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from gpu_ops.cost.allocate import fleet_days
from gpu_ops.cost.engine import UsageEngine, add_frame
from gpu_ops.cost.read import INVENTORY

from .helpers import MATRIX
from .oracle import one_node_at_a_time, split_by_day, validate_inventory

DAY = pd.Timestamp("2026-10-02", tz="UTC")
TYPES = [("p4de.24xlarge", "", ""), ("", "a100-80gb", 4), ("", "l4", 1), ("g6.xlarge", "", ""), ("", "h100", 8)]


def _random_inventory(seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(int(rng.integers(15, 40))):
        instance, gpu, count = TYPES[int(rng.integers(len(TYPES)))]
        start = DAY + pd.Timedelta(hours=int(rng.integers(-30, 40)))
        end = "" if rng.random() < 0.25 else (start + pd.Timedelta(minutes=int(rng.integers(0, 60 * 30)))).isoformat()
        rows.append({"node": f"n{rng.integers(6)}", "instance_type": instance, "gpu_type": gpu, "gpu_count": count,
                     "capacity_type": str(rng.choice(["spot", "on-demand", "reserved"])), "region": "us-east-1", "start": start.isoformat(), "end": end})
        if rng.random() < 0.3:  # the same node exported while it ran, or again
            rows.append({**rows[-1], "end": "" if rows[-1]["end"] else (start + pd.Timedelta(hours=3)).isoformat()})
        if rng.random() < 0.15:  # an exact copy, delivered again
            rows.append(dict(rows[-1]))
        if rng.random() < 0.1:  # a bad row
            rows.append({**rows[-1], "capacity_type": "weekly"})
    order = rng.permutation(len(rows))
    df = pd.DataFrame([rows[i] for i in order]).astype(object)
    return df.assign(source="inventory", location="inventory.csv", row=np.arange(1, len(df) + 1))


def _why(q: pd.DataFrame) -> dict[int, str]:
    """Row -> the field that failed, or for a row set aside whole its first word (duplicate,
    superseded, overlaps)."""
    return {int(r): reason.removeprefix("<row>: ").split(" ")[0] if field == "<row>" else field for r, field, reason in zip(q["row"], q["field"], q["reason"])}


def _engine_fleet(raw: pd.DataFrame, lo: int, hi: int) -> tuple[dict, dict]:
    engine = UsageEngine(MATRIX, INVENTORY)
    try:
        add_frame(engine, raw)
        engine.check()
        fleet = fleet_days(engine, lo, hi).to_pylist()
        q = engine.result_quarantine()
    finally:
        engine.close()
    dollars = {(r["node"], r["day_us"]): r["fleet_cost_usd"] for r in fleet if r["fleet_gpu_hours"] > 0}
    return dollars, _why(q)


def _oracle_fleet(raw: pd.DataFrame, lo: pd.Timestamp, hi: pd.Timestamp) -> tuple[dict, dict]:
    v = validate_inventory(raw, MATRIX)
    held, aside = one_node_at_a_time(v.rows)
    pieces = split_by_day(held, lo, hi, hi)
    pieces = pieces.assign(cost=pieces["gpu_count"].to_numpy(dtype=float) * pieces["hours"].to_numpy() * pieces["price_per_gpu_hour"].to_numpy(dtype=float))
    pieces = pieces[pieces["hours"] > 0]
    dollars = pieces.groupby([pieces["node"].astype(str), pieces["day"].array.asi8 // 1000])["cost"].sum().to_dict()
    quarantine = _why(v.quarantine)
    quarantine.update({int(v.rows["row"].iloc[i]): why for i, why in aside.items()})
    return dollars, quarantine


@pytest.mark.parametrize("seed", range(12))
def test_the_fleet_and_its_quarantine_agree_with_the_oracle_on_random_inventories(seed: int) -> None:
    raw = _random_inventory(seed)
    for lo, hi in ((DAY, DAY + pd.Timedelta(days=1)), (DAY - pd.Timedelta(days=1), DAY + pd.Timedelta(days=2))):
        got, got_q = _engine_fleet(raw, lo.value // 1000, hi.value // 1000)
        want, want_q = _oracle_fleet(raw, lo, hi)
        assert got.keys() == want.keys()
        for k in want:
            assert got[k] == pytest.approx(want[k], rel=1e-9, abs=1e-9), k
        assert got_q == want_q
    assert {"overlaps", "superseded", "duplicate"} <= set(want_q.values())  # each seed has all three
