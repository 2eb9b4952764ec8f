"""ROI from measurements, worked out by hand with the helpers' prices."""

from __future__ import annotations

import pandas as pd
import pytest

from gpu_ops.flows.cost.attribution import attribute
from gpu_ops.flows.cost.pipeline import price_window
from gpu_ops.flows.cost.roi import ROI_COLUMNS, TOTAL, roi_report

from .helpers import MATRIX, inventory, raw, row

DAY = pd.Timestamp("2026-10-02", tz="UTC")
NEXT = DAY + pd.Timedelta(days=1)

ROWS = [
    # nlp: 4 spot A100s 10:00-15:00 = 20 GPU-h, $20 (on-demand $80); preempted, 30 min lost = 2 GPU-h, $2
    row("2026-10-02T10:00:00Z", "2026-10-02T15:00:00Z", team="nlp", gpu_count=4, capacity_type="spot", outcome="preempted", lost_seconds=1800),
    # nlp again, completed: lost_seconds of a completed attempt is not preemption waste
    row("2026-10-02T16:00:00Z", "2026-10-02T17:00:00Z", team="nlp", gpu_count=4, capacity_type="spot", outcome="completed", lost_seconds=0),
    # cv: 2 spot L4s for 1 h = $0.80 (saves $0.80); preempted with the whole hour lost: waste $0.80
    row("2026-10-02T00:00:00Z", "2026-10-02T01:00:00Z", team="cv", gpu_type="l4", gpu_count=2, capacity_type="spot", outcome="preempted", lost_seconds=3600),
    # vision: three 1g.10gb slices for 7 h = 3 GPU-h, $12; whole GPUs would have cost 21 GPU-h, $84
    row("2026-10-02T00:00:00Z", "2026-10-02T07:00:00Z", team="vision", gpu_count=3, sharing="mig", gpu_share=1 / 7, outcome="completed", lost_seconds=0),
    # res: 1 reserved A100 for 10 h = $20 (on-demand $40)
    row("2026-10-02T00:00:00Z", "2026-10-02T10:00:00Z", team="res", capacity_type="reserved", outcome="completed", lost_seconds=0),
]


def report(rows=ROWS, inv=None):
    p = price_window(raw(rows), inventory(inv) if inv else None, MATRIX, DAY, NEXT, NEXT)
    return roi_report(p.rows).set_index("team"), p


def test_savings_and_waste_are_sums_of_measured_rows():
    r, _ = report()
    assert list(r.reset_index().columns) == list(ROI_COLUMNS)
    assert r.loc["nlp", "cost_usd"] == pytest.approx(24.0)
    assert r.loc["nlp", "spot_savings_usd"] == pytest.approx(72.0)  # (4 - 1) × 24 GPU-h
    assert r.loc["nlp", "preemption_lost_gpu_hours"] == pytest.approx(2.0)
    assert r.loc["nlp", "preemption_waste_usd"] == pytest.approx(2.0)
    assert r.loc["nlp", "net_spot_savings_usd"] == pytest.approx(70.0)
    assert r.loc["vision", "sharing_savings_usd"] == pytest.approx(84.0 - 12.0)
    assert r.loc["res", "reserved_savings_usd"] == pytest.approx(20.0)
    assert r.loc["cv", "net_spot_savings_usd"] == pytest.approx(0.0)
    assert r.loc[TOTAL, "cost_usd"] == pytest.approx(24 + 0.8 + 12 + 20)
    assert r.loc[TOTAL, "preemption_waste_usd"] == pytest.approx(2.8)


def test_recommendations_carry_their_dollar_impact():
    r, _ = report()
    nlp = r.loc["nlp", "recommendations"]
    assert nlp[0]["kind"] == "checkpointing" and nlp[0]["impact_usd"] == pytest.approx(2.0)
    cv = r.loc["cv", "recommendations"]
    assert cv[0]["kind"] == "preemption" and "on-demand" in cv[0]["detail"]
    # res ran a single whole A100 for 10 h ($20): half a GPU (3g.40gb) would have cost $10.
    res = r.loc["res", "recommendations"]
    assert res[0]["kind"] == "share" and res[0]["impact_usd"] == pytest.approx(10.0) and "3g.40gb" in res[0]["detail"]
    assert r.loc["vision", "recommendations"] == []  # already shared


def test_idle_waste_matches_attribution_and_names_the_node():
    inv = [{"node": "n1", "instance_type": "p4de.24xlarge", "capacity_type": "on-demand", "region": "", "start": "2026-10-01T00:00:00Z", "end": ""}]
    rows = [row("2026-10-02T00:00:00Z", "2026-10-02T12:00:00Z", team="a", gpu_count=2, outcome="completed", lost_seconds=0)]
    r, p = report(rows, inv)
    idle = attribute(p.rows, ["team"]).totals["idle_cost_usd"]
    assert idle == pytest.approx(768 - 96)
    assert r.loc[TOTAL, "idle_waste_usd"] == pytest.approx(idle)
    assert r.loc[TOTAL, "idle_gpu_hours"] == pytest.approx(192 - 24)
    rec = r.loc[TOTAL, "recommendations"][0]
    assert rec["kind"] == "idle-node" and rec["target"] == "n1" and rec["impact_usd"] == pytest.approx(672.0)


def test_empty_day_gives_a_zero_total_row():
    r, _ = report(rows=[row("2026-09-01T00:00:00Z", "2026-09-01T01:00:00Z")])
    assert list(r.index) == [TOTAL] and r.loc[TOTAL, "cost_usd"] == 0.0


def test_the_report_is_the_same_from_categorical_or_plain_text_columns():
    """The pieces come as categoricals (the engine, the Parquet store), pandas text or
    plain Python strings (a SQL table); a missing value among them too, categories no row
    has: the report (which compares a categorical's codes) does not depend on which."""
    _, p = report(ROWS, inv=[{"node": "n1", "gpu_type": "a100-80gb", "gpu_count": 8}])
    cat = p.rows.reset_index(drop=True)
    cat["outcome"] = pd.Categorical(cat["outcome"].astype(object).where(cat.index != 0, None))
    plain = cat.assign(**{c: cat[c].astype(object) for c in cat.columns if isinstance(cat[c].dtype, pd.CategoricalDtype)})
    assert any(isinstance(cat[c].dtype, pd.CategoricalDtype) for c in ("team", "kind", "capacity_type", "sharing"))
    pd.testing.assert_frame_equal(roi_report(cat, MATRIX), roi_report(plain, MATRIX))
    _, p = report(ROWS, inv=[{"node": "n1", "gpu_type": "a100-80gb", "gpu_count": 8, "capacity_type": "on-demand", "start": "2026-10-02T00:00:00Z", "end": ""}])
    cat = p.rows.reset_index(drop=True).astype({c: "category" for c in ("kind", "capacity_type", "sharing")})
    cat["team"] = cat["team"].astype("category").cat.add_categories(["zz-unused", ""]).where(cat.index != 1, None)
    cat["outcome"] = cat["outcome"].astype(object).astype("str")
    assert isinstance(cat["outcome"].dtype, pd.StringDtype) and cat["team"].isna().sum() == 1 and (cat["kind"].astype(str) == "idle").any()
    plain = cat.assign(**{c: cat[c].astype(object) for c in ("team", "kind", "capacity_type", "sharing", "outcome")})
    pd.testing.assert_frame_equal(roi_report(cat, MATRIX), roi_report(plain, MATRIX))


def test_the_report_of_many_pieces_holds_less_than_the_pieces_themselves():
    """The pieces are summed by DuckDB where they lie (a registered frame: no copy of
    them in numpy or Python): computing the report of 200,000 pieces allocates (numpy
    and Python, tracemalloc) less than the pieces' own columns (a pandas report once
    allocated 1.8 times their size: the allocated rows copied, then a frame of nine
    figures per row)."""
    import tracemalloc

    import numpy as np

    n = 200_000
    rng = np.random.default_rng(0)

    def cat(names: list[str]) -> pd.Categorical:
        return pd.Categorical.from_codes(rng.integers(0, len(names), n), categories=names)

    rows = pd.DataFrame({
        "kind": cat(["allocated"]), "team": cat(["nlp", "cv", "res"]), "project": cat(["p1", "p2"]), "node": cat(["n1", "n2"]),
        "gpu_type": cat(["a100-80gb", "l4"]), "gpu_count": rng.choice([1.0, 2.0], n), "gpu_share": rng.choice([1.0, 0.5], n), "sharing": cat(["none", "mig"]),
        "capacity_type": cat(["spot", "on-demand", "reserved"]), "hours": rng.random(n), "gpu_hours": rng.random(n), "price_per_gpu_hour": np.full(n, 2.0),
        "cost_usd": rng.random(n), "on_demand_usd": rng.random(n) + 1, "outcome": cat(["completed", "preempted"]), "lost_gpu_hours": rng.random(n),
        "lost_cost_usd": rng.random(n), "fleet_gpu_hours": np.zeros(n),
    })
    tracemalloc.start()
    try:
        got = roi_report(rows)
        held = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert held < rows.memory_usage(deep=True).sum()
    # The same figures as a groupby of the rows gives.
    spot = rows["capacity_type"] == "spot"
    expected = (rows["on_demand_usd"] - rows["cost_usd"]).where(spot, 0.0).groupby(rows["team"], observed=True).sum()
    assert got.set_index("team").loc[["cv", "nlp", "res"], "spot_savings_usd"].to_numpy() == pytest.approx(expected.loc[["cv", "nlp", "res"]].to_numpy(), rel=1e-12)
