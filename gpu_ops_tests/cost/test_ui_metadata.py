"""What the Dagster UI gets for the cost tables, read through dagster-webserver's GraphQL
(the queries the asset pages run): a column schema and a row count on every table
asset, typed tables instead of Markdown, numeric per-budget entries for the Plots tab."""

from __future__ import annotations

import dagster as dg
import pytest

from gpu_ops_tests.cost.test_assets import Env
from gpu_ops_tests.training.test_ui_launch import MATERIALIZATION, dagster_ui_processes, gql, wait_for_location

TABLES = {
    "gpu_usage": None,
    "gpu_usage_quarantine": "quarantine",
    "gpu_cost_attribution": "top_teams",
    "gpu_cost_daily": None,
    "gpu_budget_status": "status",
    "gpu_roi_report": "recommendations",
}


@pytest.mark.slow
def test_latest_cost_materializations_carry_schema_row_count_tables_and_budget_numbers(tmp_path):
    env = Env(tmp_path, f"sqlite:///{tmp_path / 'costs.db'}")
    with dagster_ui_processes(tmp_path, env.path, daemon=False) as (url, home):
        with dg.DagsterInstance.from_config(str(home)) as instance:
            env.materialize("2026-10-14", instance)
        wait_for_location(url, tmp_path)
        latest = {}
        for key in TABLES:
            mats = gql(url, MATERIALIZATION, {"key": {"path": [key]}})["assetOrError"]["assetMaterializations"]
            assert mats and mats[0]["partition"] == "2026-10-14", key
            latest[key] = {e["label"]: e for e in mats[0]["metadataEntries"]}

    for key, table_label in TABLES.items():
        entries = latest[key]
        schema = entries["dagster/column_schema"]
        assert schema["__typename"] == "TableSchemaMetadataEntry" and schema["schema"]["columns"], key
        assert entries["dagster/row_count"]["__typename"] == "IntMetadataEntry", key
        assert not any(e["__typename"] == "MarkdownMetadataEntry" for e in entries.values()), key
        if table_label:
            table = entries[table_label]
            assert table["__typename"] == "TableMetadataEntry", key
            assert table["table"]["schema"]["columns"], key

    assert latest["gpu_usage"]["dagster/row_count"]["intValue"] > 0
    columns = {c["name"]: c["type"] for c in latest["gpu_cost_attribution"]["dagster/column_schema"]["schema"]["columns"]}
    assert columns["cost_usd"] == "float" and columns["team"] == "string"
    assert len(latest["gpu_budget_status"]["status"]["table"]["records"]) == 2
    budget = latest["gpu_budget_status"]
    for name in ("nlp-monthly", "vision-monthly"):
        for field in ("spend_usd", "amount_usd", "percent_used"):
            entry = budget[f"budget/{name}/{field}"]
            assert entry["__typename"] == "FloatMetadataEntry" and entry["floatValue"] >= 0, (name, field)
    assert budget["budget/nlp-monthly/amount_usd"]["floatValue"] == 15000
    teams = [e for label, e in latest["gpu_cost_attribution"].items() if label.startswith("team/") and label.endswith("/cost_usd")]
    assert teams and all(e["__typename"] == "FloatMetadataEntry" for e in teams)
