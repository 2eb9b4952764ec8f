"""Attribution worked out by hand: prices a100-80gb $4 on-demand / $1 spot / $2 reserved,
h100 $10 / $3, l4 $0.80 / $0.40, eu-west-1 × 1.5 (see helpers.PRICES)."""

from __future__ import annotations

import pandas as pd
import pytest

from gpu_ops.flows.cost.allocate import IDLE
from gpu_ops.flows.cost.attribution import attribute, conservation, key_column
from gpu_ops.flows.cost.pipeline import price_window

from .helpers import MATRIX, inventory, raw, row

D1, D2, D3 = "2026-10-01", "2026-10-02", "2026-10-03"


def day(rows, d, as_of=None, inv=None, drop_empty=True):
    start = pd.Timestamp(d, tz="UTC")
    end = start + pd.Timedelta(days=1)
    return price_window(raw(rows), inventory(inv) if inv else None, MATRIX, start, end, as_of or end, drop_empty=drop_empty)


def by(priced, keys=("team",), idle="row"):
    return attribute(priced.rows, list(keys), idle).table.set_index([key_column(k) for k in keys])


def test_interval_across_midnight_is_split_between_the_days():
    # 2 spot A100s from 22:00 to 03:00: 2 h on day 1, 3 h on day 2.
    rows = [row("2026-10-01T22:00:00Z", "2026-10-02T03:00:00Z", gpu_count=2, capacity_type="spot")]
    d1, d2 = by(day(rows, D1)).loc["nlp"], by(day(rows, D2)).loc["nlp"]
    assert d1["gpu_hours"] == pytest.approx(4.0) and d1["cost_usd"] == pytest.approx(4.0)
    assert d2["gpu_hours"] == pytest.approx(6.0) and d2["cost_usd"] == pytest.approx(6.0)
    assert d1["on_demand_equivalent_usd"] == pytest.approx(16.0) and d1["savings_usd"] == pytest.approx(12.0)
    assert d2["on_demand_equivalent_usd"] == pytest.approx(24.0) and d2["savings_usd"] == pytest.approx(18.0)


def test_multi_day_window_splits_each_midnight():
    rows = [row("2026-10-01T12:00:00Z", "2026-10-03T06:00:00Z")]
    p = price_window(raw(rows), None, MATRIX, pd.Timestamp(D1, tz="UTC"), pd.Timestamp("2026-10-04", tz="UTC"), pd.Timestamp("2026-10-04", tz="UTC"))
    hours = p.rows.groupby(p.rows["day"].dt.strftime("%Y-%m-%d"))["hours"].sum().to_dict()
    assert hours == {D1: pytest.approx(12.0), D2: pytest.approx(24.0), D3: pytest.approx(6.0)}


def test_open_interval_is_clipped_at_the_as_of_time():
    rows = [row("2026-10-02T20:00:00Z", None, gpu_type="h100")]
    assert by(day(rows, D2, as_of=pd.Timestamp("2026-10-02T22:30:00Z"))).loc["nlp", "cost_usd"] == pytest.approx(25.0)
    # A past day: open until the end of the day (4 h).
    assert by(day(rows, D2)).loc["nlp", "cost_usd"] == pytest.approx(40.0)
    # Not started yet at the as-of time: nothing.
    assert day(rows, D2, as_of=pd.Timestamp("2026-10-02T19:00:00Z")).rows.empty


def test_mig_slice_and_time_sliced_gpu_cost_their_share():
    rows = [
        # three 1g.10gb slices (1/7 of an A100-80GB each) for 7 h = 3 GPU-hours at $4
        row("2026-10-02T01:00:00Z", "2026-10-02T08:00:00Z", team="mig", gpu_count=3, sharing="mig", gpu_share=1 / 7),
        # one of four time-slice replicas of an L4 for 8 h = 2 GPU-hours at $0.80
        row("2026-10-02T00:00:00Z", "2026-10-02T08:00:00Z", team="ts", gpu_type="l4", sharing="timeslice", gpu_share=0.25),
    ]
    t = by(day(rows, D2))
    assert t.loc["mig", "gpu_hours"] == pytest.approx(3.0) and t.loc["mig", "cost_usd"] == pytest.approx(12.0)
    assert t.loc["ts", "gpu_hours"] == pytest.approx(2.0) and t.loc["ts", "cost_usd"] == pytest.approx(1.6)


def test_spot_on_demand_and_reserved_prices_and_savings():
    rows = [
        row("2026-10-02T00:00:00Z", "2026-10-02T10:00:00Z", team="spot", capacity_type="spot"),
        row("2026-10-02T00:00:00Z", "2026-10-02T10:00:00Z", team="od", capacity_type="on-demand"),
        row("2026-10-02T00:00:00Z", "2026-10-02T10:00:00Z", team="res", capacity_type="reserved"),
    ]
    t = by(day(rows, D2))
    assert t["cost_usd"].to_dict() == {"od": pytest.approx(40.0), "res": pytest.approx(20.0), "spot": pytest.approx(10.0)}
    assert list(t["on_demand_equivalent_usd"]) == pytest.approx([40.0, 40.0, 40.0])
    assert t["savings_usd"].to_dict() == {"od": pytest.approx(0.0), "res": pytest.approx(20.0), "spot": pytest.approx(30.0)}


def test_alias_names_price_as_the_canonical_type_and_regions_multiply():
    rows = [
        row("2026-10-02T00:00:00Z", "2026-10-02T01:00:00Z", team="alias", gpu_type="NVIDIA-A100-SXM4-80GB"),
        row("2026-10-02T00:00:00Z", "2026-10-02T01:00:00Z", team="eu", region="eu-west-1"),
    ]
    p = day(rows, D2)
    assert set(p.rows["gpu_type"].astype(str)) == {"a100-80gb"}
    t = by(p)
    assert t.loc["alias", "cost_usd"] == pytest.approx(4.0)
    assert t.loc["eu", "cost_usd"] == pytest.approx(6.0) and t.loc["eu", "on_demand_equivalent_usd"] == pytest.approx(6.0)


def test_grouping_by_project_namespace_and_label():
    rows = [
        row("2026-10-02T00:00:00Z", "2026-10-02T01:00:00Z", project="a", namespace="x", labels='{"tier": "gold"}'),
        row("2026-10-02T00:00:00Z", "2026-10-02T02:00:00Z", project="b", namespace="x", labels='{"tier": "bronze"}'),
        row("2026-10-02T00:00:00Z", "2026-10-02T04:00:00Z", project="b", namespace="y", labels="{}"),
    ]
    p = day(rows, D2)
    assert by(p, ("namespace",))["cost_usd"].to_dict() == {"x": pytest.approx(12.0), "y": pytest.approx(16.0)}
    t = by(p, ("team", "label:tier"))
    assert list(t.index.names) == ["team", "label_tier"]
    assert t["cost_usd"].to_dict() == {("nlp", "gold"): pytest.approx(4.0), ("nlp", "bronze"): pytest.approx(8.0), ("nlp", ""): pytest.approx(16.0)}


FLEET = [{"node": "n1", "instance_type": "p4de.24xlarge", "capacity_type": "on-demand", "region": "us-east-1", "start": "2026-09-01T00:00:00Z", "end": ""}]
USE = [
    row("2026-10-02T00:00:00Z", "2026-10-02T12:00:00Z", team="a", gpu_count=2),  # 24 GPU-h, $96
    row("2026-10-02T06:00:00Z", "2026-10-02T12:00:00Z", team="b", gpu_count=1),  # 6 GPU-h, $24
]


def test_idle_is_fleet_minus_allocated_as_an_explicit_row():
    # p4de.24xlarge: 8 A100-80GB (gpu type and count come from the catalog) × 24 h × $4 = $768.
    p = day(USE, D2, inv=FLEET)
    res = attribute(p.rows, ["team"], "row")
    t = res.table.set_index("team")
    assert t.loc[IDLE, "gpu_hours"] == pytest.approx(192 - 30)
    assert t.loc[IDLE, "cost_usd"] == pytest.approx(768 - 120)
    assert t["cost_usd"].sum() == pytest.approx(768.0)
    assert res.totals["fleet_cost_usd"] == pytest.approx(768.0)
    ok, msg = conservation(res.table, res.totals)
    assert ok, msg


def test_idle_shared_by_weight_conserves_the_total():
    p = day(USE, D2, inv=FLEET)
    res = attribute(p.rows, ["team"], "share")
    t = res.table.set_index("team")
    assert IDLE not in t.index
    # $648 idle shared 96:24 -> a +$518.40, b +$129.60
    assert t.loc["a", "cost_usd"] == pytest.approx(96 + 518.4) and t.loc["a", "idle_cost_usd"] == pytest.approx(518.4)
    assert t.loc["b", "cost_usd"] == pytest.approx(24 + 129.6)
    assert t["cost_usd"].sum() == pytest.approx(768.0)
    assert conservation(res.table, res.totals)[0]


def test_over_allocated_node_fails_conservation_and_names_the_node():
    rows = [row("2026-10-02T00:00:00Z", "2026-10-03T00:00:00Z", team="a", gpu_count=10)]
    res = attribute(day(rows, D2, inv=FLEET).rows, ["team"], "row")
    ok, msg = conservation(res.table, res.totals)
    assert not ok and "n1" in msg


def test_usage_on_nodes_outside_the_inventory_is_counted_as_off_fleet():
    rows = [*USE, row("2026-10-02T00:00:00Z", "2026-10-02T01:00:00Z", team="c", node="elsewhere")]
    res = attribute(day(rows, D2, inv=FLEET).rows, ["team"], "row")
    assert res.totals["off_fleet_cost_usd"] == pytest.approx(4.0)
    assert res.table["cost_usd"].sum() == pytest.approx(772.0)
    assert conservation(res.table, res.totals)[0]


def test_zero_hour_rows_kept_by_the_fast_path_make_no_groups():
    rows = [*USE, row("2026-09-30T00:00:00Z", "2026-09-30T05:00:00Z", team="yesterday")]
    fast = attribute(day(rows, D2, drop_empty=False).rows, ["team"]).table
    exact = attribute(day(rows, D2).rows, ["team"]).table
    pd.testing.assert_frame_equal(fast, exact)
    assert "yesterday" not in set(fast["team"])


def test_missing_on_demand_price_leaves_the_equivalent_unknown_not_zero():
    from gpu_ops.domain.config import PriceTable
    from gpu_ops.flows.cost.pricing import PriceMatrix

    spot_only = PriceMatrix.from_table(PriceTable(source="t", as_of="2026-10-01", gpus={"t4": {"spot": 0.2}}))
    rows = [row("2026-10-02T00:00:00Z", "2026-10-02T10:00:00Z", gpu_type="t4", capacity_type="spot")]
    p = price_window(raw(rows), None, spot_only, pd.Timestamp(D2, tz="UTC"), pd.Timestamp(D3, tz="UTC"), pd.Timestamp(D3, tz="UTC"))
    fast = price_window(raw(rows), None, spot_only, pd.Timestamp(D2, tz="UTC"), pd.Timestamp(D3, tz="UTC"), pd.Timestamp(D3, tz="UTC"), drop_empty=False)
    for priced in (p, fast):  # per-row dollars, and coded prices summed per group
        t = attribute(priced.rows, ["team"]).table
        assert t.loc[0, "cost_usd"] == pytest.approx(2.0)
        assert pd.isna(t.loc[0, "on_demand_equivalent_usd"]) and pd.isna(t.loc[0, "savings_usd"])


# A node is one machine: at any moment it is in the fleet once, whatever its records say.
P4DE = {"node": "n1", "instance_type": "p4de.24xlarge", "region": "us-east-1"}  # 8 A100-80GB: $32/h on-demand, $8/h spot


def _fleet(inv):
    res = attribute(day([], D2, inv=inv, drop_empty=False).rows, ["team"], "row")
    return res.totals["fleet_cost_usd"], day([], D2, inv=inv).quarantine


def test_a_node_exported_open_then_closed_is_in_the_fleet_once():
    inv = [
        {**P4DE, "capacity_type": "on-demand", "start": "2026-10-01T00:00:00Z", "end": ""},  # the snapshot while it ran
        {**P4DE, "capacity_type": "on-demand", "start": "2026-10-01T00:00:00Z", "end": "2026-10-02T12:00:00Z"},  # the final export
    ]
    fleet, q = _fleet(inv)
    assert fleet == pytest.approx(32 * 12)
    assert q["row"].tolist() == [1] and q["reason"].str.contains("superseded by row 2").all()
    assert q["reason"].str.contains("closed there, open here").all()


def test_overlapping_records_of_one_node_count_the_overlap_once_the_earlier_record_holding_it():
    inv = [
        {**P4DE, "capacity_type": "spot", "start": "2026-10-02T00:00:00Z", "end": "2026-10-02T12:00:00Z"},
        {**P4DE, "capacity_type": "on-demand", "start": "2026-10-02T06:00:00Z", "end": "2026-10-02T18:00:00Z"},  # counted from 12:00
        {**P4DE, "capacity_type": "on-demand", "start": "2026-10-02T13:00:00Z", "end": "2026-10-02T14:00:00Z"},  # wholly inside row 2
    ]
    fleet, q = _fleet(inv)
    assert fleet == pytest.approx(8 * 12 + 32 * 6)  # 00-12 spot, 12-18 on-demand; not 8*12 + 32*12 + 32
    assert q["row"].tolist() == [3] and q["field"].tolist() == ["<row>"]
    assert "overlaps row 2" in q["reason"].iloc[0] and "counted once" in q["reason"].iloc[0]


def test_records_of_different_nodes_at_the_same_time_are_each_counted():
    inv = [
        {**P4DE, "capacity_type": "spot", "start": "2026-10-02T00:00:00Z", "end": "2026-10-02T12:00:00Z"},
        {**P4DE, "node": "n2", "capacity_type": "spot", "start": "2026-10-02T00:00:00Z", "end": "2026-10-02T12:00:00Z"},
    ]
    fleet, q = _fleet(inv)
    assert fleet == pytest.approx(2 * 8 * 12) and q.empty
