"""The node inventory's fleet against the pandas oracle on random inventories: snapshots of
running nodes, re-deliveries, records of one node that overlap or disagree, copies and bad
rows. A node is one machine: at any moment it is in the fleet once (the engine's identity
and overlap rules for ``kind`` inventory; :func:`oracle.one_node_at_a_time` in Python)."""

from __future__ import annotations

import pandas as pd
import pytest

from gpu_ops.flows.cost.allocate import fleet_days
from gpu_ops.flows.cost.engine import UsageEngine, add_frame
from gpu_ops.flows.cost.read import INVENTORY

from .helpers import MATRIX
from .oracle import one_node_at_a_time, split_by_day, validate_inventory
from .random_files import random_inventory

DAY = pd.Timestamp("2026-10-02", tz="UTC")


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
    raw = random_inventory(seed, DAY)
    for lo, hi in ((DAY, DAY + pd.Timedelta(days=1)), (DAY - pd.Timedelta(days=1), DAY + pd.Timedelta(days=2))):
        got, got_q = _engine_fleet(raw, lo.value // 1000, hi.value // 1000)
        want, want_q = _oracle_fleet(raw, lo, hi)
        assert got.keys() == want.keys()
        for k in want:
            assert got[k] == pytest.approx(want[k], rel=1e-9, abs=1e-9), k
        assert got_q == want_q
    assert {"overlaps", "superseded", "duplicate"} <= set(want_q.values())  # each seed has all three
