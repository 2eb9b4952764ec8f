"""Reconciliation with the AWS CUR 2.0 and billed-cost attribution (prices.from_bill).

The CUR month (October 2026, hourly lines) is built by :func:`cur_month` in the CUR 2.0
column layout: four GPU instances — a100 spot, a100 on-demand, h100 under a Compute
Savings Plan (covered usage at the SP effective cost, plus the SP negation and recurring
fee lines that must not count), l40s under a reserved instance (DiscountedUsage) — a
refund line, a non-GPU instance, data transfer on a GPU instance and one unreadable line.
List prices are set so that inventory × prices equals the effective cost of the bill.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from pathlib import Path

import dagster as dg
import numpy as np
import pandas as pd
import pytest
import yaml

from gpu_ops.flows.cost.billing import apply_bill, gpu_bill, node_instance_ids, read_cur, reconcile

DAYS = pd.date_range("2026-10-01", "2026-10-31", freq="D", tz="UTC")
PRICES = {
    "source": "test list prices equal to the bill's effective rates",
    "as_of": "2026-10-01",
    "gpus": {"a100-80gb": {"spot": 1.79, "on-demand": 5.12}, "h100": {"on-demand": 12.29, "reserved": 7.0}, "l40s": {"on-demand": 2.25, "reserved": 1.5}},
}
# node, instance id, instance type, gpu type, gpus, capacity type, line type, per-instance-hour effective cost
NODES = [
    ("ip-10-0-1-11.ec2.internal", "i-0a1b2c3d4e5f60011", "p4de.24xlarge", "a100-80gb", 8, "spot", "Usage", 8 * 1.79),
    ("ip-10-0-1-12.ec2.internal", "i-0a1b2c3d4e5f60012", "p4de.24xlarge", "a100-80gb", 8, "on-demand", "Usage", 8 * 5.12),
    ("ip-10-0-3-31.ec2.internal", "i-0a1b2c3d4e5f60031", "p5.48xlarge", "h100", 8, "reserved", "SavingsPlanCoveredUsage", 8 * 7.0),
    ("ip-10-0-2-21.ec2.internal", "i-0a1b2c3d4e5f60021", "g6e.12xlarge", "l40s", 4, "reserved", "DiscountedUsage", 4 * 1.5),
]
A_SPOT, B_OD, C_SP, D_RI = (n[0] for n in NODES)
REFUND_DAY = "2026-10-10"
BAD_LINE_DAY = "2026-10-03"


def _line(hour: pd.Timestamp, iid: str, itype: str, line_type: str, usage_type: str, unblended: float, **kw: object) -> dict[str, object]:
    return {
        "bill_billing_period_start_date": "2026-10-01T00:00:00Z", "line_item_usage_start_date": hour.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "line_item_usage_end_date": (hour + pd.Timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ"), "line_item_line_item_type": line_type,
        "line_item_resource_id": iid, "line_item_usage_type": usage_type, "product_instance_type": itype, "line_item_product_code": "AmazonEC2",
        "line_item_unblended_cost": f"{unblended:.8f}", "line_item_net_unblended_cost": kw.pop("net", f"{unblended:.8f}"),
        "savings_plan_savings_plan_effective_cost": kw.pop("sp", ""), "reservation_effective_cost": kw.pop("ri", ""),
        "pricing_term": kw.pop("term", "OnDemand"), "line_item_currency_code": kw.pop("currency", "USD"),
        "identity_time_interval": f"{hour:%Y-%m-%dT%H:%M:%SZ}/{hour + pd.Timedelta(hours=1):%Y-%m-%dT%H:%M:%SZ}", **kw,
    }


def cur_month(extra: list[dict[str, object]] | None = None) -> pd.DataFrame:
    lines = []
    for hour in pd.date_range("2026-10-01", "2026-11-01", freq="h", tz="UTC", inclusive="left"):
        for _node, iid, itype, _gpu, _n, cap, line_type, rate in NODES:
            if line_type == "Usage":
                spot = cap == "spot"
                lines.append(_line(hour, iid, itype, "Usage", f"USE1-{'SpotUsage' if spot else 'BoxUsage'}:{itype}", rate, term="Spot" if spot else "OnDemand"))
            elif line_type == "SavingsPlanCoveredUsage":
                od = 8 * 12.29
                lines.append(_line(hour, iid, itype, "SavingsPlanCoveredUsage", f"USE1-BoxUsage:{itype}", od, sp=f"{rate:.8f}", term=""))
                lines.append(_line(hour, iid, itype, "SavingsPlanNegation", f"USE1-BoxUsage:{itype}", -od, term=""))  # not instance cost
            else:
                lines.append(_line(hour, iid, itype, "DiscountedUsage", f"USE1-BoxUsage:{itype}", 0.0, ri=f"{rate:.8f}", term="Reserved"))
        lines.append(_line(hour, "i-0ccc0000000000001", "m5.xlarge", "Usage", "USE1-BoxUsage:m5.xlarge", 0.192))  # not a GPU instance
        lines.append(_line(hour, NODES[0][1], "p4de.24xlarge", "Usage", "USE1-DataTransfer-Regional-Bytes", 0.01))  # not instance-hours
    for day in DAYS:
        lines.append(_line(day, "arn:aws:savingsplans::123456789012:savingsplan/sp-1", "", "SavingsPlanRecurringFee", "ComputeSP:1yrNoUpfront", 1344.0, term=""))
    # One hour of the on-demand a100 node refunded.
    lines.append(_line(pd.Timestamp(f"{REFUND_DAY}T05:00:00Z"), NODES[1][1], "p4de.24xlarge", "Refund", "USE1-BoxUsage:p4de.24xlarge", -8 * 5.12))
    # An extra line with an unreadable cost: quarantined, never a zero.
    bad = _line(pd.Timestamp(f"{BAD_LINE_DAY}T07:00:00Z"), NODES[0][1], "p4de.24xlarge", "Usage", "USE1-SpotUsage:p4de.24xlarge", 0.0, term="Spot")
    bad["line_item_unblended_cost"] = bad["line_item_net_unblended_cost"] = "n/a"
    lines.append(bad)
    out = pd.DataFrame(lines + (extra or []))
    # CUR 2.0 identity: a line id per line (unique within its hour)
    out["identity_line_item_id"] = [hashlib.sha256(f"{i}".encode()).hexdigest()[:52] for i in range(len(out))]
    return out


def inventory() -> pd.DataFrame:
    return pd.DataFrame(
        [{"node": node, "instance_id": iid, "instance_type": itype, "gpu_type": gpu, "gpu_count": n, "capacity_type": cap, "region": "us-east-1",
          "start": "2026-09-28T00:00:00Z", "end": "2026-11-01T00:00:00Z"} for node, iid, itype, gpu, n, cap, _t, _r in NODES]
    )


def write(tmp_path: Path, cur: pd.DataFrame, fmt: str = "parquet", from_bill: bool = False) -> Path:
    (tmp_path / "cur").mkdir(exist_ok=True)
    if fmt == "parquet":
        cur.to_parquet(tmp_path / "cur" / "cur-00001.parquet", index=False)
    else:
        cur.to_csv(tmp_path / "cur" / "cur-00001.csv", index=False)
    inventory().to_csv(tmp_path / "nodes.csv", index=False)
    usage = pd.DataFrame(
        [
            # 2 a100s on the on-demand node for 12 h, a whole h100 node for 6 h, one l40s all day, on the refund day and the planted day.
            {"start": f"{d}T06:00:00Z", "end": f"{d}T18:00:00Z", "namespace": "ml", "pod": f"bert-{d}", "node": B_OD, "team": "nlp", "project": "bert",
             "gpu_type": "a100-80gb", "gpu_count": 2, "capacity_type": "on-demand"} for d in (REFUND_DAY, "2026-10-21")
        ]
        + [{"start": f"{d}T00:00:00Z", "end": f"{d}T06:00:00Z", "namespace": "ml", "pod": f"llm-{d}", "node": C_SP, "team": "llm", "project": "pretrain",
            "gpu_type": "h100", "gpu_count": 8, "capacity_type": "reserved"} for d in (REFUND_DAY, "2026-10-21")]
        + [{"start": f"{d}T00:00:00Z", "end": f"{d}T23:00:00Z", "namespace": "cv", "pod": f"vit-{d}", "node": D_RI, "team": "vision", "project": "vit",
            "gpu_type": "l40s", "gpu_count": 1, "capacity_type": "reserved"} for d in (REFUND_DAY, "2026-10-21")]
    )
    usage.to_csv(tmp_path / "usage.csv", index=False)
    cfg = {
        "storage": {"url": f"sqlite:///{tmp_path / 'costs.db'}"},
        "prices": {**PRICES, **({"from_bill": True} if from_bill else {})},
        "usage": {
            "sources": [{"type": "file", "path": "usage.csv"}], "inventory": {"type": "file", "path": "nodes.csv"},
            "billing": {"type": "aws_cur", "path": f"cur/*.{fmt}"}, "group_by": ["team"], "partitions_start": "2026-10-01",
        },
    }
    (tmp_path / "gpu_ops.yaml").write_text(yaml.safe_dump(cfg))
    return tmp_path / "gpu_ops.yaml"


def materialize(config_path: Path, day: str) -> tuple[dg.ExecuteInProcessResult, pd.DataFrame, pd.DataFrame | None]:
    """The day's cost assets through Dagster; attribution is None when it was not materialized
    (a blocking check held it back)."""
    from gpu_ops.domain.config import load_config
    from gpu_ops.dagster.cost.assets import build_assets
    from gpu_ops.dagster.resources import GpuOpsSettings
    from gpu_ops.dagster.io_manager import TableIOManager
    from gpu_ops.storage.tables import TableStore

    config = load_config(config_path)
    url = config.storage.resolved_url()
    assets, _ = build_assets(config)
    resources = {"gpu_ops": GpuOpsSettings(config_path=str(config_path)), "table_io_manager": TableIOManager(url=url)}
    with dg.DagsterInstance.ephemeral() as instance:
        result = dg.materialize(assets, partition_key=day, resources=resources, instance=instance,
                                selection=["gpu_usage", "gpu_usage_quarantine", "gpu_cost_attribution", "gpu_cost_daily"], raise_on_error=False)
    store = TableStore(url)
    attribution = store.read("gpu_cost_attribution") if result.asset_materializations_for_node("gpu_cost_attribution") else None
    return result, store.read("gpu_usage"), attribution


def check(result: dg.ExecuteInProcessResult, name: str) -> dg.AssetCheckEvaluation:
    return next(e for e in result.get_asset_check_evaluations() if e.check_name == name)


def test_gpu_bill_takes_each_line_type_at_its_effective_cost(tmp_path):
    cur_month().to_parquet(tmp_path / "cur.parquet", index=False)
    bill = gpu_bill(read_cur([str(tmp_path / "cur.parquet")]), [n[1] for n in NODES])
    per_day = bill.lines.pivot_table(index="day", columns="instance_id", values="billed_usd", aggfunc="sum")
    ordinary = per_day.loc[pd.Timestamp("2026-10-20", tz="UTC")]
    for _node, iid, *_rest, rate in NODES:
        assert ordinary[iid] == pytest.approx(24 * rate, abs=1e-6)  # SP effective, RI effective, spot and on-demand net unblended
    assert "i-0ccc0000000000001" not in per_day.columns  # m5.xlarge is no GPU instance
    # The refund is no price: left out of the node's billed cost, reported with its amount.
    assert per_day.loc[pd.Timestamp(REFUND_DAY, tz="UTC"), NODES[1][1]] == pytest.approx(24 * 8 * 5.12)
    adj = bill.adjustments
    assert len(adj) == 1 and adj.iloc[0]["instance_id"] == NODES[1][1] and adj.iloc[0]["amount"] == pytest.approx(-8 * 5.12)
    assert adj.iloc[0]["day"] == pd.Timestamp(REFUND_DAY, tz="UTC")
    assert any("1 negative line(s)" in n and "-40.96" in n for n in bill.notes())
    assert per_day.loc[pd.Timestamp(BAD_LINE_DAY, tz="UTC"), NODES[0][1]] == pytest.approx(24 * 8 * 1.79)  # the extra unreadable line is set aside
    q = bill.quarantine
    assert len(q) == 1 and q.iloc[0]["field"] == "line_item_net_unblended_cost" and "not a number" in q.iloc[0]["reason"]
    assert q.iloc[0]["row"] == len(cur_month()) and q.iloc[0]["location"] == str(tmp_path / "cur.parquet")  # the last line of the file
    month = float(bill.lines["billed_usd"].sum())
    assert month == pytest.approx(sum(31 * 24 * r for *_x, r in NODES), abs=1e-6)


def test_a_line_without_the_effective_cost_its_type_needs_is_quarantined_with_file_and_row(tmp_path):
    cur = cur_month()
    i = int(np.flatnonzero(cur["line_item_line_item_type"] == "DiscountedUsage")[5])
    cur.loc[i, "reservation_effective_cost"] = ""
    cur.to_csv(tmp_path / "cur.csv", index=False)
    bill = gpu_bill(read_cur([str(tmp_path / "cur.csv")]), [n[1] for n in NODES])
    q = bill.quarantine[bill.quarantine["field"] == "reservation_effective_cost"]
    assert len(q) == 1 and q.iloc[0]["location"] == str(tmp_path / "cur.csv") and q.iloc[0]["row"] == i + 1
    assert "DiscountedUsage" in q.iloc[0]["reason"]


@pytest.mark.parametrize("fmt", ["parquet", "csv"])
def test_reconciliation_passes_on_matching_data_and_conserves(tmp_path, fmt):
    result, usage, _ = materialize(write(tmp_path, cur_month(), fmt), REFUND_DAY)
    assert result.success
    ev = check(result, "billing_reconciled")
    # The refund (one on-demand a100 hour, $40.96) is no price: reported, not in the billed cost.
    assert ev.passed, ev.description
    assert ev.metadata["difference_usd"].value == pytest.approx(0, abs=0.01)
    assert ev.metadata["billed_usd"].value == pytest.approx(24 * sum(r for *_x, r in NODES), abs=0.01)
    assert ev.metadata["negative_bill_lines_usd"].value == pytest.approx(-40.96)
    assert "would change the billed cost by -40.96" in ev.description
    assert check(result, "conservation").passed


def test_a_planted_mismatch_fails_the_check_and_names_the_node(tmp_path):
    # On the 21st the l40s node's reservation lapses: billed on demand ($9.00/h, not $6.00/h),
    # and an a100 instance nobody has in the inventory is billed for 10 hours.
    cur = cur_month()
    day21 = cur["line_item_usage_start_date"].str.startswith("2026-10-21") & (cur["line_item_resource_id"] == NODES[3][1])
    cur.loc[day21, ["line_item_line_item_type", "reservation_effective_cost", "line_item_unblended_cost", "line_item_net_unblended_cost"]] = ["Usage", "", "9.0", "9.0"]
    stray = [_line(pd.Timestamp("2026-10-21T00:00:00Z") + pd.Timedelta(hours=h), "i-0fffffffffffffff9", "p4de.24xlarge", "Usage", "USE1-BoxUsage:p4de.24xlarge", 40.96) for h in range(10)]
    cur = pd.concat([cur, pd.DataFrame(stray)], ignore_index=True)
    result, _, _ = materialize(write(tmp_path, cur, "parquet"), "2026-10-21")
    ev = check(result, "billing_reconciled")
    assert not ev.passed and ev.severity == dg.AssetCheckSeverity.ERROR
    assert D_RI in ev.description and "i-0fffffffffffffff9" in ev.description and "not in the inventory" in ev.description
    assert ev.metadata["difference_usd"].value == pytest.approx(-(24 * 3.0 + 10 * 40.96), abs=0.01)
    nodes = {r.data["node"]: r.data["difference_usd"] for r in ev.metadata["nodes"].records}  # a typed table in the UI
    assert nodes[D_RI] == pytest.approx(-72.00)


def test_from_bill_attributes_the_billed_cost_and_conserves_it_to_the_cent(tmp_path):
    result, usage, attribution = materialize(write(tmp_path, cur_month(), "csv", from_bill=True), REFUND_DAY)
    assert result.success and check(result, "conservation").passed
    billed = round(24 * sum(r for *_x, r in NODES), 2)  # the refund is reported, not a price
    assert round(float(usage["cost_usd"].sum()), 2) == billed  # allocated + idle = billed
    assert round(float(attribution["cost_usd"].sum()), 2) == billed
    by_pod = usage.set_index("pod")
    # The refund of one hour does not shrink the on-demand a100 node's rate: $40.96 × 24 / 192 GPU-hours.
    assert by_pod.loc[f"bert-{REFUND_DAY}", "price_per_gpu_hour"] == pytest.approx(8 * 5.12 * 24 / 192)
    assert by_pod.loc[f"bert-{REFUND_DAY}", "cost_usd"] == pytest.approx(24 * 8 * 5.12 * 24 / 192)
    assert by_pod.loc[f"llm-{REFUND_DAY}", "price_per_gpu_hour"] == pytest.approx(7.0)  # the savings plan's effective rate
    assert by_pod.loc[f"llm-{REFUND_DAY}", "on_demand_usd"] == pytest.approx(48 * 12.29)  # the on-demand equivalent is still list
    md = result.asset_materializations_for_node("gpu_usage")[0].metadata
    assert "4 node-day(s) at billed cost" in md["priced_from_bill"].value


def test_apply_bill_keeps_list_prices_for_a_node_without_bill_lines():
    from gpu_ops.domain.config import PriceTable
    from gpu_ops.flows.cost.engine import UsageInput
    from gpu_ops.flows.cost.pipeline import price_window
    from gpu_ops.flows.cost.pricing import PriceMatrix
    from gpu_ops_tests.cost.helpers import inventory as inv_frame, raw, row

    matrix = PriceMatrix.from_table(PriceTable.model_validate(PRICES))
    inv = inv_frame([{"node": n[0], "instance_id": n[1], "instance_type": n[2], "gpu_type": n[3], "gpu_count": str(n[4]), "capacity_type": n[5], "start": "2026-10-01T00:00:00Z", "end": ""} for n in NODES])
    usage = raw([row("2026-10-20T00:00:00Z", "2026-10-20T12:00:00Z", node=A_SPOT, gpu_count=4, capacity_type="spot")])
    priced = price_window(usage, inv, matrix, "2026-10-20", "2026-10-21", "2026-10-21")
    lines = gpu_bill(cur_month(), [n[1] for n in NODES]).lines
    lines = lines[lines["instance_id"] != NODES[0][1]]  # the spot node's lines are missing
    out, summary = apply_bill(priced.rows, lines, node_instance_ids(UsageInput(frames=[inv])))
    assert summary["unbilled_nodes"] == [A_SPOT]
    alloc = out[out["kind"].astype(str) != "idle"]
    assert alloc["cost_usd"].sum() == pytest.approx(48 * 1.79)  # list price kept, never zero
    assert float(out["cost_usd"].sum()) == pytest.approx(24 * sum(r for *_x, r in NODES))


def test_reconcile_names_an_inventory_node_the_bill_does_not_have():
    usage = pd.DataFrame({"kind": ["idle"], "node": ["n-x"], "fleet_cost_usd": [100.0], "day": [pd.Timestamp("2026-10-05", tz="UTC")]})
    out = reconcile(usage, gpu_bill(pd.DataFrame()).lines, {"n-x": "i-0123456789abcdef0"}, dt.date(2026, 10, 5))
    assert not out["passed"] and "n-x" in out["description"] and "no bill line" in out["description"]


def test_from_bill_without_a_bill_is_a_config_error_naming_the_field(tmp_path):
    from gpu_ops.domain.config import ConfigError, load_config

    (tmp_path / "gpu_ops.yaml").write_text(yaml.safe_dump({"prices": {**PRICES, "from_bill": True}}))
    with pytest.raises(ConfigError, match=r"gpu_ops\.yaml: prices\.from_bill: needs usage\.billing"):
        load_config(tmp_path / "gpu_ops.yaml")


def test_a_cur_index_under_a_regular_file_fails_the_usage_asset_naming_the_setting(tmp_path):
    """It was a raw NotADirectoryError naming no setting (`gpu-ops validate` checks it first too)."""
    config = write(tmp_path, cur_month())
    (tmp_path / "file").write_text("not a folder")
    cfg = yaml.safe_load(config.read_text())
    cfg["usage"]["billing"]["index_path"] = "file/index"
    config.write_text(yaml.safe_dump(cfg))
    from gpu_ops.domain.config import load_config
    from gpu_ops.dagster.cost.assets import build_assets
    from gpu_ops.dagster.resources import GpuOpsSettings
    from gpu_ops.dagster.io_manager import TableIOManager

    loaded = load_config(config)
    resources = {"gpu_ops": GpuOpsSettings(config_path=str(config)), "table_io_manager": TableIOManager(url=loaded.storage.resolved_url())}
    with dg.DagsterInstance.ephemeral() as instance:
        result = dg.materialize(build_assets(loaded)[0], partition_key=REFUND_DAY, resources=resources, instance=instance,
                                selection=["gpu_usage", "gpu_usage_quarantine"], raise_on_error=False)
    assert not result.success
    failure = next(e for e in result.all_events if e.is_step_failure).step_failure_data.error
    assert failure is not None
    error = failure.cause or failure  # Dagster wraps what the step raised
    assert "usage.billing.index_path" in error.message and str(tmp_path / "file" / "index") in error.message, error.message
    assert error.cls_name == "BillingSourceError" and "Traceback" not in error.message, error.cls_name
