"""Every metric family's labels are the grain of the table it reads: for every combination
of the grouping keys ``usage.group_by`` allows (team, project, namespace, cost_center,
experiment_id and a label), no two samples of a family share a label set (Prometheus would
keep one of them) and each additive family sums to its table's total.

The tables are the real pipeline's: the demo's first two days materialized through the cost
assets (usage, the daily table, budgets, ROI), the ledger and a lease written by the modules
that write them in production, and, per combination, ``gpu_cost_attribution`` grouped the
way its asset groups it (``attribute`` then ``group_efficiency``) from the stored usage rows
with DCGM measurements on them. The exporter's reader reads each combination's database.
"""

from __future__ import annotations

import datetime as dt
import itertools
import json
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import sqlalchemy as sa
import yaml

from gpu_ops.domain.config import DEMO_CONFIG, load_config
from gpu_ops.domain.cost.columns import GROUPING_KEYS
from gpu_ops.flows.cost.attribution import attribute
from gpu_ops.flows.cost.utilization import group_efficiency
from gpu_ops.domain.metrics import Family, families
from gpu_ops.flows.observability.readers import Reader
from gpu_ops.storage.tables import TableStore

DEMO = DEMO_CONFIG.parent
DAYS = ["2026-10-01", "2026-10-02"]
KEYS = (*GROUPING_KEYS, "label:tier")
COMBINATIONS = [list(c) for n in range(1, len(KEYS) + 1) for c in itertools.combinations(KEYS, n)]


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A database of the demo's first two days (all but gpu_cost_attribution), a ledger and a lease."""
    import dagster as dg

    from gpu_ops.storage.quota import LeaseBook, Quotas
    from gpu_ops.dagster.cost.assets import build_assets
    from gpu_ops.dagster.resources import GpuOpsSettings
    from gpu_ops.dagster.io_manager import TableIOManager
    from gpu_ops.storage import ledger

    folder = tmp_path_factory.mktemp("labels")
    url = f"sqlite:///{folder / 'costs.db'}"
    demo = yaml.safe_load(DEMO_CONFIG.read_text())
    cfg = {
        "storage": {"url": url}, "prices": str(DEMO / "prices.yaml"), "budgets": demo["budgets"], "channels": demo["channels"],
        "usage": {"sources": [{"type": "file", "path": str(DEMO / "usage" / "*.csv")}], "inventory": {"type": "file", "path": str(DEMO / "inventory.csv")},
                  "idle": "row", "partitions_start": DAYS[0]},
    }
    (folder / "gpu_ops.yaml").write_text(yaml.safe_dump(cfg))
    assets, _ = build_assets(load_config(folder / "gpu_ops.yaml"))
    resources = {"gpu_ops": GpuOpsSettings(config_path=str(folder / "gpu_ops.yaml")), "table_io_manager": TableIOManager(url=url)}
    with dg.DagsterInstance.ephemeral() as instance:
        for day in DAYS:
            assert dg.materialize(assets, partition_key=day, resources=resources, instance=instance,
                                  selection=["gpu_usage", "gpu_usage_quarantine", "gpu_cost_daily", "gpu_budget_status", "gpu_roi_report"]).success
    store = TableStore(url)
    t0 = dt.datetime(2026, 10, 2, 9, tzinfo=dt.timezone.utc)
    common = dict(namespace="ml", pod="", node="n1", project="p", cost_center="", experiment_id="", gpu_type="h100", gpu_count=4, capacity_type="spot",
                  sharing="none", gpu_share=1.0, asset_key="train_llm", last_checkpoint_at=None)
    ledger.append(store, [
        ledger.LedgerRow(start=t0, end=t0 + dt.timedelta(minutes=20), attempt=1, outcome="preempted", lost_seconds=600.0, run_id=f"r{i}", team=team, **common)  # type: ignore[arg-type]
        for i, team in enumerate(("nlp", "vision", "nlp"))
    ])
    assert LeaseBook(store, ttl_s=600).try_acquire(Quotas(team={"nlp": 8}), team="nlp", pools=["p1"], gpus=4, run_id="r9", asset_key="train_llm").granted
    TableStore.dispose_all()  # the file is copied next: nothing of it held open
    return folder / "costs.db"


def measured(rows: pd.DataFrame, seed: int) -> pd.DataFrame:
    """The stored usage rows with DCGM measurements on the allocated ones (as
    gpu_ops.flows.cost.utilization writes them) and a ``tier`` label."""
    rng = np.random.default_rng(seed)
    rows = rows.copy()
    alloc = (rows["kind"].astype(str) != "idle").to_numpy()
    metered = np.where(alloc, rows["gpu_hours"].to_numpy(dtype=float) * rng.uniform(0.5, 1.0, len(rows)), np.nan)
    active = metered * rng.uniform(0.0, 1.0, len(rows))
    price = pd.to_numeric(rows["price_per_gpu_hour"], errors="coerce").to_numpy(dtype=float)
    rows["metered_gpu_hours"], rows["active_gpu_hours"], rows["unused_cost_usd"] = metered, active, (metered - active) * price
    rows["labels"] = [json.dumps({"tier": t}) if t else "{}" for t in rng.choice(["gold", "silver", ""], len(rows))]
    return rows


@pytest.fixture(scope="module")
def usage(template: Path) -> dict[str, pd.DataFrame]:
    """Each day's stored usage rows, measured."""
    store = TableStore(f"sqlite:///{template}")
    rows = store.read("gpu_usage")
    out = {day: measured(rows[rows["partition_key"] == day].drop(columns="partition_key").reset_index(drop=True), i) for i, day in enumerate(DAYS)}
    store.engine.dispose()
    store.read_engine.dispose()
    return out


def with_attribution(template: Path, usage: dict[str, pd.DataFrame], folder: Path, group_by: list[str]) -> TableStore:
    """A copy of the template with gpu_cost_attribution of both days grouped by ``group_by``."""
    db = folder / "costs.db"
    shutil.copy(template, db)
    store = TableStore(f"sqlite:///{db}")
    for day, rows in usage.items():
        table = group_efficiency(attribute(rows, group_by, "row").table, rows, group_by)
        store.write("gpu_cost_attribution", table, partition_keys=[day])
    return store


def repeated(family: Family) -> list[tuple[str, ...]]:
    return [labels for labels, n in Counter(labels for labels, _ in family.samples).items() if n > 1]


def total(family: Family, **where: str) -> float:
    at = {k: family.metric.labels.index(k) for k in where}
    return sum(v for labels, v in family.samples if all(labels[i] == where[k] for k, i in at.items()))


def efficiency_totals(store: TableStore) -> dict[str, Any]:
    """What the efficiency families must sum to (the newest day's measured groups)."""
    attribution = store.read("gpu_cost_attribution")
    attribution = attribution[(attribution["partition_key"] == DAYS[-1]) & attribution["efficiency"].notna()]
    return {"gpu_ops_active_gpu_seconds": attribution["active_gpu_hours"].sum() * 3600, "gpu_ops_unused_cost_usd": attribution["unused_cost_usd"].sum()}


@pytest.fixture(scope="module")
def totals(template: Path) -> dict[str, Any]:
    """What each other additive family must sum to, worked out from the tables with pandas."""
    store = TableStore(f"sqlite:///{template}")
    newest = DAYS[-1]
    daily, usage, roi = store.read("gpu_cost_daily"), store.read("gpu_usage"), store.read("gpu_roi_report")
    day = {"daily": daily[daily["partition_key"] == newest], "usage": usage[usage["partition_key"] == newest]}
    teams = roi[roi["team"] != "__total__"]
    status = store.read("gpu_budget_status")
    status = status[status["partition_key"] == newest]
    q = store.read("gpu_usage_quarantine")
    ledger = store.read("gpu_usage_ledger")
    store.engine.dispose()
    store.read_engine.dispose()
    return {
        ("gpu_ops_cost_usd", "day"): day["daily"]["cost_usd"].sum(), ("gpu_ops_cost_usd", "month"): daily["cost_usd"].sum(),
        ("gpu_ops_gpu_seconds", "day"): day["daily"]["gpu_hours"].sum() * 3600, ("gpu_ops_gpu_seconds", "month"): daily["gpu_hours"].sum() * 3600,
        ("gpu_ops_on_demand_equivalent_usd", "month"): daily["on_demand_usd"].sum(),
        "gpu_ops_hardware_cost_usd": day["usage"]["cost_usd"].sum(), "gpu_ops_hardware_gpu_seconds": day["usage"]["gpu_hours"].sum() * 3600,
        ("gpu_ops_savings_usd", "month"): teams[["spot_savings_usd", "reserved_savings_usd", "sharing_savings_usd"]].to_numpy().sum(),
        ("gpu_ops_preemption_waste_usd", "month"): teams["preemption_waste_usd"].sum(),
        "gpu_ops_budget_amount_usd": status["amount_usd"].sum(), "gpu_ops_budget_spend_usd": status["spend_usd"].sum(),
        "gpu_ops_budget_thresholds_crossed": float(sum(len(c) for c in status["thresholds_crossed"])),
        "gpu_ops_usage_quarantined_rows": float((q["partition_key"] == newest).sum()),
        "gpu_ops_training_attempts_total": float(len(ledger)), "gpu_ops_training_preemptions_total": float((ledger["outcome"] == "preempted").sum()),
        "gpu_ops_training_lost_gpu_seconds_total": float((ledger["gpu_count"] * ledger["lost_seconds"]).sum()),
        "gpu_ops_quota_gpus_held": 8.0,  # the lease's 4 GPUs, against its team and its pool
    }


def test_no_family_repeats_a_label_set_and_each_sums_to_its_table_for_every_group_by(
    template: Path, usage: dict[str, pd.DataFrame], totals: dict[str, Any], tmp_path: Path
) -> None:
    checked: set[str] = set()
    for i, group_by in enumerate(COMBINATIONS):
        (tmp_path / str(i)).mkdir()
        store = with_attribution(template, usage, tmp_path / str(i), group_by)
        snap = Reader(store, quotas={"team": {"nlp": 8}}, per_pod=True).read()
        assert snap.errors == {}, (group_by, snap.errors)
        got = {f.metric.name: f for f in families(snap)}
        assert {n: repeated(f) for n, f in got.items() if repeated(f)} == {}, group_by
        # The efficiency families are labelled by exactly the keys the table was grouped by.
        columns = [k if not k.startswith("label:") else "label_" + k[len("label:"):] for k in group_by]
        assert set(got["gpu_ops_unused_cost_usd"].metric.labels) == set(columns), group_by
        for key, want in {**totals, **efficiency_totals(store)}.items():
            name, window = key if isinstance(key, tuple) else (key, None)
            have = total(got[name], **({"window": window} if window else {}))
            assert have == pytest.approx(want, rel=1e-9, abs=1e-6), (group_by, key)
            checked.add(name)
        ratio = {labels: v for labels, v in got["gpu_ops_efficiency_ratio"].samples}
        table = store.read("gpu_cost_attribution")
        table = table[(table["partition_key"] == DAYS[-1]) & table["efficiency"].notna()]
        keys = got["gpu_ops_efficiency_ratio"].metric.labels
        assert ratio == pytest.approx({tuple("" if pd.isna(r[k]) else str(r[k]) for k in keys): r["efficiency"] for _, r in table.iterrows()}), group_by
        assert len(ratio) > 1
        store.engine.dispose()
        store.read_engine.dispose()
    assert len(COMBINATIONS) == 2 ** len(KEYS) - 1 and len(checked) >= 17
    with sa.create_engine(f"sqlite:///{template}").connect() as conn:  # the template held what each combination was checked against
        assert conn.execute(sa.text('SELECT COUNT(*) FROM "gpu_usage_ledger"')).scalar() == 3
