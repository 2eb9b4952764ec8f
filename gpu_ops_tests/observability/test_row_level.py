"""Row-level storage (``storage.row_level_path``: ``gpu_usage`` as Parquet files) serves the
same families as SQL storage: the demo's day with a hostile row (quarantined) materialized
through the real cost assets twice, once into SQL tables and once with the row-level
table in files, read by `gpu-ops exporter`'s reader built from each configuration."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gpu_ops.domain.config import DEMO_CONFIG, load_config
from gpu_ops.cli.exporter import reader_from_config
from gpu_ops.domain.metrics import families

DEMO = DEMO_CONFIG.parent
DAY = "2026-10-01"
HOSTILE = "start,end,namespace,pod,node,team,project,cost_center,experiment_id,gpu_type,gpu_count,capacity_type,sharing,gpu_share\n" \
    "2026-10-01T02:00:00Z,2026-10-01T03:00:00Z,ml-nlp,odd-0,n9,nlp,llm-eval,cc-1001,,quantum-9000,1,on-demand,none,1\n"
USAGE_FAMILIES = ("gpu_ops_hardware_cost_usd", "gpu_ops_hardware_gpu_seconds", "gpu_ops_pod_cost_usd", "gpu_ops_pod_gpu_seconds", "gpu_ops_usage_quarantined_rows")


def materialized(folder: Path, row_level: bool) -> Path:
    import dagster as dg

    from gpu_ops.dagster.cost.assets import build_assets
    from gpu_ops.dagster.resources import GpuOpsSettings
    from gpu_ops.dagster.io_manager import TableIOManager

    folder.mkdir()
    (folder / "hostile.csv").write_text(HOSTILE)
    url = f"sqlite:///{folder / 'costs.db'}"
    storage = {"url": url, **({"row_level_path": str(folder / "rows")} if row_level else {})}
    cfg = {
        "storage": storage, "prices": str(DEMO / "prices.yaml"),
        "usage": {"sources": [{"type": "file", "path": str(DEMO / "usage" / "*.csv")}, {"type": "file", "path": str(folder / "hostile.csv")}],
                  "inventory": {"type": "file", "path": str(DEMO / "inventory.csv")}, "partitions_start": DAY},
    }
    config = folder / "gpu_ops.yaml"
    config.write_text(yaml.safe_dump(cfg))
    assets, _ = build_assets(load_config(config))
    io = TableIOManager(url=url, row_level_path=storage.get("row_level_path"))
    with dg.DagsterInstance.ephemeral() as instance:
        assert dg.materialize(assets, partition_key=DAY, resources={"gpu_ops": GpuOpsSettings(config_path=str(config)), "table_io_manager": io},
                              instance=instance, selection=["gpu_usage", "gpu_usage_quarantine"]).success
    return config


def figures(config: Path) -> tuple[dict[tuple, float], dict[str, str]]:
    snap = reader_from_config(str(config), per_pod=True).read()
    got = {(f.metric.name, labels): v for f in families(snap) if f.metric.name != "gpu_ops_exporter_read_seconds" for labels, v in f.samples}
    return got, snap.errors


def test_row_level_usage_serves_the_families_sql_storage_serves(tmp_path: Path) -> None:
    sql, sql_errors = figures(materialized(tmp_path / "sql", row_level=False))
    files_config = materialized(tmp_path / "files", row_level=True)
    assert (tmp_path / "files" / "rows" / "gpu_usage" / f"partition_key={DAY}" / "data.parquet").exists()
    files, files_errors = figures(files_config)
    assert sql_errors == files_errors == {}
    for name in USAGE_FAMILIES:
        mine = {k: v for k, v in files.items() if k[0] == name}
        theirs = {k: v for k, v in sql.items() if k[0] == name}
        assert mine and mine.keys() == theirs.keys(), name
        assert [k for k in mine if mine[k] != pytest.approx(theirs[k], rel=1e-9)] == [], name
    fresh = ("gpu_ops_cost_partition_timestamp_seconds", ("gpu_usage",))
    assert files[fresh] == sql[fresh]
    assert files[("gpu_ops_exporter_read_ok", ("gpu_usage",))] == 1.0
    assert sum(v for (name, _), v in files.items() if name == "gpu_ops_usage_quarantined_rows") >= 1  # the hostile row
