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
    from gpu_ops.config import load_config
    from gpu_ops.cost.assets import build_assets
    from gpu_ops.resources import GpuOpsSettings
    from gpu_ops.storage.io_manager import TableIOManager
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
