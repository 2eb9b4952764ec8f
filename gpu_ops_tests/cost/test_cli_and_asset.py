"""The CLI and the `gpu_usage` asset on the same random hostile files: the same dollars
per team and the same quarantine, row for row and reason for reason.

The hostile corpus checks both against hand-written expectations; this checks them
against each other on files nobody wrote by hand (``random_files``: copies, snapshots,
deliveries differing in a column the CLI's grouping does not read, control characters,
bad numbers, time units and zones, CSV and Parquet), with a random node inventory
(snapshots, overlapping records of one node, copies) for the idle rows. The CLI runs in this process
through the real console entry point (``gpu_ops_tests.hostile.cli_driver``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import dagster as dg
import pandas as pd
import pytest
import yaml

from gpu_ops_tests.hostile.cli_driver import run_one

from .random_files import random_files, random_inventory

PRICES = Path(__file__).parents[1] / "hostile" / "prices.yaml"
DAY = "2026-10-01"


def _quarantine(locations: Any, rows: Any, fields: Any, reasons: Any) -> set[tuple[str, int, str, str]]:
    return {(Path(str(loc)).name, int(row), str(field), str(reason)) for loc, row, field, reason in zip(locations, rows, fields, reasons)}


def _cli(paths: list[Path], inventory: Path, folder: Path) -> tuple[dict[str, float], set[tuple[str, int, str, str]]]:
    q = folder / "quarantine.csv"
    argv = ["cost", "attribution", "--date", DAY, "--format", "json", "--by", "team", "--quarantine", str(q), "--prices", str(PRICES), "--inventory", str(inventory)]
    for p in paths:
        argv += ["--usage", str(p)]
    r = run_one(argv, str(folder))
    assert "Traceback" not in r["stderr"] and r["exit"] == 0, r["stderr"][-2000:]
    totals = {str(x["team"]): float(x["cost_usd"]) for x in json.loads(str(r["stdout"])) if float(x["cost_usd"])}
    got = pd.read_csv(q, keep_default_na=False)
    return totals, _quarantine(got["location"], got["row"], got["field"], got["reason"])


def _asset(paths: list[Path], inventory: Path, folder: Path, instance: dg.DagsterInstance) -> tuple[dict[str, float], set[tuple[str, int, str, str]]]:
    from gpu_ops.domain.config import load_config
    from gpu_ops.dagster.cost.assets import build_assets
    from gpu_ops.dagster.resources import GpuOpsSettings
    from gpu_ops.dagster.io_manager import TableIOManager
    from gpu_ops.storage.tables import TableStore

    config = folder / "gpu_ops.yaml"
    config.write_text(yaml.safe_dump({
        "storage": {"url": f"sqlite:///{folder / 'costs.db'}"}, "prices": str(PRICES),
        "usage": {"sources": [{"type": "file", "path": str(p)} for p in paths], "inventory": {"type": "file", "path": str(inventory)}},
    }))
    assets, _ = build_assets(load_config(config))
    url = f"sqlite:///{folder / 'tables.db'}"
    resources = {"gpu_ops": GpuOpsSettings(config_path=str(config)), "table_io_manager": TableIOManager(url=url)}
    assert dg.materialize([assets[0]], partition_key=DAY, resources=resources, instance=instance).success
    store = TableStore(url)
    usage = store.read("gpu_usage")
    totals = {str(k): float(v) for k, v in usage.groupby(usage["team"].astype(str))["cost_usd"].sum().items() if v}
    q = store.read("gpu_usage_quarantine", missing_ok=True)
    return totals, _quarantine(q["location"], q["row"], q["field"], q["reason"])


@pytest.mark.parametrize("seed", range(3))
def test_the_cli_and_gpu_usage_price_and_quarantine_random_hostile_files_alike(tmp_path: Path, seed: int) -> None:
    (tmp_path / "files").mkdir()
    paths = random_files(tmp_path / "files", seed)
    inventory = tmp_path / "files" / "inventory.csv"  # snapshots, overlaps, copies: each node in the fleet once
    random_inventory(seed, pd.Timestamp(DAY, tz="UTC")).drop(columns=["source", "location", "row"]).to_csv(inventory, index=False)
    (tmp_path / "cli").mkdir()
    (tmp_path / "asset").mkdir()
    cli_totals, cli_q = _cli(paths, inventory, tmp_path / "cli")
    with dg.DagsterInstance.ephemeral() as instance:
        asset_totals, asset_q = _asset(paths, inventory, tmp_path / "asset", instance)
    assert sorted(cli_totals) == sorted(asset_totals)
    for team, usd in asset_totals.items():
        assert cli_totals[team] == pytest.approx(usd, rel=1e-9, abs=1e-9), team
    assert cli_q == asset_q, (sorted(cli_q - asset_q)[:5], sorted(asset_q - cli_q)[:5])
    assert any(f == "<row>" for _, _, f, _ in asset_q) and len(asset_q) > 20  # copies and snapshots found
    assert any("project: contains a control character" in reason for *_, reason in asset_q)  # in a column the grouping does not read
    assert "__idle__" in asset_totals and any(loc == "inventory.csv" and field == "<row>" for loc, _, field, _ in asset_q)  # a node counted once


def _inventory_case(tmp_path: Path, text: str) -> tuple[Path, Path]:
    for d in ("files", "cli", "asset"):
        (tmp_path / d).mkdir()
    usage = tmp_path / "files" / "usage.csv"
    usage.write_text("start,end,namespace,pod,node,team,gpu_type,gpu_count,capacity_type\n2026-10-01T02:00:00Z,,ml,p2,n2,cv,l4,1,on-demand\n")
    inventory = tmp_path / "files" / "inventory.csv"
    inventory.write_text(text)
    return usage, inventory


def test_an_inventory_line_that_cannot_be_split_is_quarantined_alone_by_the_cli_and_gpu_usage(tmp_path: Path) -> None:
    """One line with too many fields: that line is quarantined and the others price, in both
    (the asset read inventory files with a pandas reader of its own, which shifted every row
    by the extra fields and quarantined them all: no idle at all)."""
    usage, inventory = _inventory_case(tmp_path, "node,instance_type,gpu_type,gpu_count,capacity_type,region,start,end\n"
                                       "n1,,a100-80gb,8,spot,,2026-10-01T00:00:00Z,,extra,fields\nn2,,l4,1,on-demand,,2026-10-01T00:00:00Z,\n")
    cli_totals, cli_q = _cli([usage], inventory, tmp_path / "cli")
    with dg.DagsterInstance.ephemeral() as instance:
        asset_totals, asset_q = _asset([usage], inventory, tmp_path / "asset", instance)
    assert cli_totals == pytest.approx(asset_totals) and cli_q == asset_q
    assert {(row, field) for loc, row, field, _ in asset_q if loc == "inventory.csv"} == {(1, "<line>")}
    assert asset_totals["__idle__"] == pytest.approx(0.8 * 24 - 0.8 * 22)  # n2's L4 all day, 22 h of it used


def test_an_inventory_file_without_a_node_column_fails_gpu_usages_blocking_check(tmp_path: Path) -> None:
    from gpu_ops.storage.tables import TableStore

    usage, inventory = _inventory_case(tmp_path, "gpu_type,gpu_count,capacity_type,start,end\nl4,1,on-demand,2026-10-01T00:00:00Z,\n")
    r = run_one(["cost", "attribution", "--date", DAY, "--usage", str(usage), "--inventory", str(inventory), "--prices", str(PRICES)], str(tmp_path / "cli"))
    assert r["exit"] == 1 and "inventory.csv: missing column(s) node" in str(r["stderr"]) and "Traceback" not in str(r["stderr"])
    with dg.DagsterInstance.ephemeral() as instance, pytest.raises(Exception, match="blocking asset check failed.*\n.*gpu_usage: sources_complete"):
        _asset([usage], inventory, tmp_path / "asset", instance)
    q = TableStore(f"sqlite:///{tmp_path / 'asset' / 'tables.db'}").read("gpu_usage_quarantine", missing_ok=True)
    assert [(Path(loc).name, f) for loc, f in zip(q["location"], q["field"])] == [("inventory.csv", "<file>")] and "missing column(s) node" in q["reason"].iloc[0]
