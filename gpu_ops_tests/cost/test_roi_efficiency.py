"""ROI recommendations from DCGM measurements: right-size (MIG slice or a cheaper GPU),
time-slice, idle allocations, each with its dollar impact and the evidence.

Usage rows are priced by the real pipeline and joined to per-pod steps by
:func:`join_efficiency` (the Prometheus side is covered by test_utilization.py)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from gpu_ops.flows.cost.pipeline import price_window
from gpu_ops.flows.cost.roi import TOTAL, roi_report
from gpu_ops.flows.cost.utilization import SAMPLE_COLUMNS, join_efficiency
from gpu_ops_tests.cost.helpers import MATRIX, raw, row

DAY = "2026-10-14"
STEP_S = 60
L4_TOTAL_MIB = 23034


def steps(namespace: str, pod: str, start: str, hours: float, activity: float, memory: float, total: float) -> pd.DataFrame:
    t0 = pd.Timestamp(start).value // 10**6
    t = t0 + STEP_S * 1000 * np.arange(1, int(hours * 3600 / STEP_S) + 1)
    n = len(t)
    return pd.DataFrame({"namespace": namespace, "pod": pod, "t": t, "activity": np.full(n, activity), "devices": 1, "memory_peak_mib": memory, "memory_total_mib": total})[list(SAMPLE_COLUMNS)]


def measured_day() -> pd.DataFrame:
    s = f"{DAY}T00:00:00Z"
    usage = raw([
        row(s, f"{DAY}T08:00:00Z", team="nlp", project="small", pod="small-0"),  # a100-80gb on demand $4/h: 10 % busy, 8 GB
        row(s, f"{DAY}T03:00:00Z", team="nlp", project="notebook", pod="notebook-0"),  # allocated, doing nothing
        row(s, f"{DAY}T05:00:00Z", team="llm", project="big", pod="big-0", gpu_type="h100"),  # $10/h: 50 GB, 40 % busy
        row(s, f"{DAY}T10:00:00Z", team="cv", project="detect", pod="l4-0", gpu_type="l4"),  # $0.80/h, no MIG: 20 % busy, 5 GB
        row(s, f"{DAY}T04:00:00Z", team="cv", project="blind", pod="blind-0"),  # no metrics
    ])
    priced = price_window(raw_usage=usage, raw_inventory=None, prices=MATRIX, window_start=DAY, window_end="2026-10-15", as_of="2026-10-15")
    samples = pd.concat([
        steps("ml", "small-0", s, 8, 0.10, 8000, 81920),
        steps("ml", "notebook-0", s, 3, 0.0, 2000, 81920),
        steps("ml", "big-0", s, 5, 0.40, 50000, 81559),
        steps("ml", "l4-0", s, 10, 0.20, 5000, L4_TOTAL_MIB),
    ], ignore_index=True)
    return join_efficiency(priced.rows, samples, STEP_S)


def recommendations(report: pd.DataFrame) -> dict[tuple[str, str], dict]:
    return {(r["kind"], r["target"]): r for rs in report["recommendations"] for r in rs}


def test_measured_recommendations_with_dollar_impact_and_evidence():
    rows = measured_day()
    assert rows.set_index("pod").loc["small-0", "efficiency"] == pytest.approx(0.10)
    recs = recommendations(roi_report(rows, MATRIX))

    # 8 GB and 10 % fit the smallest A100 slice, 1g.10gb = 1/7 GPU: $32 would have been $4.57.
    small = recs[("right-size", "nlp/small")]
    assert "1g.10gb" in small["detail"] and small["impact_usd"] == pytest.approx(round(32 * 6 / 7, 2))
    assert small["evidence"]["activity_p95"] == pytest.approx(0.10) and small["evidence"]["memory_peak_mib_max"] == 8000
    assert small["evidence"]["measured_gpu_hours"] == pytest.approx(8.0)

    # 50 GB fits no H100 slice below 7g; at 40 % a cheaper GPU with the memory does it: A100-80GB at $4 instead of $10, 5 h.
    big = recs[("right-size", "llm/big")]
    assert "a100-80gb" in big["detail"] and big["impact_usd"] == pytest.approx(5 * (10.0 - 4.0))

    # An L4 has no MIG and is the cheapest type: 20 % busy, 5 GB of 22.5 GB -> 4 replicas by time-slicing.
    l4 = recs[("time-slice", "cv/detect")]
    assert "4 ways" in l4["detail"] and l4["impact_usd"] == pytest.approx(10 * 0.8 * 3 / 4)

    # Three hours allocated at 0 %: all of it is the impact.
    idle = recs[("idle-allocation", "ml/notebook-0")]
    assert idle["impact_usd"] == pytest.approx(3 * 4.0) and "3.0 h" in idle["detail"]
    assert ("idle-allocation", "ml/small-0") not in recs  # 10 % is not idle

    # Without measurements the old estimate (a half-GPU slice "if their memory fits") stays, only there.
    assert ("share", "cv/blind") in recs and ("share", "nlp/small") not in recs


def test_recommendations_are_sorted_by_impact_and_on_their_team():
    report = roi_report(measured_day(), MATRIX).set_index("team")
    for rs in report["recommendations"]:
        assert [r["impact_usd"] for r in rs] == sorted((r["impact_usd"] for r in rs), reverse=True)
    assert {r["kind"] for r in report.loc["nlp", "recommendations"]} == {"right-size", "idle-allocation"}
    assert report.loc[TOTAL, "recommendations"] == []


def test_without_prices_no_cheaper_gpu_is_named_and_without_metrics_nothing_is_measured():
    rows = measured_day()
    recs = recommendations(roi_report(rows))
    assert ("right-size", "llm/big") not in recs  # no price table: no cheaper type to name
    bare = recommendations(roi_report(join_efficiency(rows.drop(columns=[c for c in rows.columns if c in SAMPLE_COLUMNS[3:]]), None, STEP_S)))
    assert not any(k in ("right-size", "time-slice", "idle-allocation") for k, _ in bare)
