"""Budget status and ROI backfilled as ranges: one run over many days gives the tables
day-by-day runs give, on a real Dagster instance and database, a day missing upstream
included; the whole cost chain shares one BackfillPolicy."""

from __future__ import annotations

import datetime as dt
import warnings
from pathlib import Path

import dagster as dg
import pandas as pd
from dagster._core.storage.tags import ASSET_PARTITION_RANGE_END_TAG, ASSET_PARTITION_RANGE_START_TAG

from gpu_ops.dagster.cost.definitions import DAILY_JOB, build_defs
from gpu_ops.storage.tables import TableStore
from gpu_ops_tests.cost.test_assets import Env

FIRST, LAST = dt.date(2026, 10, 14), dt.date(2026, 10, 20)
GAP = dt.date(2026, 10, 16)  # never materialized upstream
DAYS = [FIRST + dt.timedelta(days=i) for i in range((LAST - FIRST).days + 1)]
UPSTREAM = ["gpu_usage", "gpu_usage_quarantine", "gpu_cost_attribution", "gpu_cost_daily"]
DOWNSTREAM = ["gpu_budget_status", "gpu_roi_report"]
EXTRA_BUDGETS = [
    {"name": "fleet-weekly", "scope": {}, "period": "weekly", "reset_day": 1, "amount_usd": 50000,
     "thresholds": [{"percent": 50}, {"percent": 100, "basis": "forecast", "severity": "warning"}], "channels": []},
    {"name": "nlp-daily", "scope": {"team": "nlp"}, "period": "daily", "amount_usd": 100, "thresholds": [{"percent": 100}], "channels": []},
]


def env_for(tmp_path: Path) -> Env:
    tmp_path.mkdir()
    return Env(tmp_path, f"sqlite:///{tmp_path / 'costs.db'}", extra_budgets=EXTRA_BUDGETS, start=FIRST.isoformat())


def upstream(env: Env, instance: dg.DagsterInstance) -> None:
    for d in DAYS:
        if d != GAP:
            env.materialize(d.isoformat(), instance, selection=UPSTREAM)


def downstream_tables(env: Env) -> dict[str, pd.DataFrame]:
    store = TableStore(env.url)
    out = {}
    for name in DOWNSTREAM:
        df = store.read(name)
        key = ["partition_key", "budget"] if name == "gpu_budget_status" else ["partition_key", "team"]
        out[name] = df.sort_values(key).reset_index(drop=True)
    return out


def test_a_range_run_of_budgets_and_roi_equals_day_by_day_runs_with_a_day_missing(tmp_path):
    by_day, ranged = env_for(tmp_path / "by_day"), env_for(tmp_path / "ranged")
    with dg.instance_for_test() as instance:
        upstream(by_day, instance)
        for d in DAYS:
            by_day.materialize(d.isoformat(), instance, selection=DOWNSTREAM)
    with dg.instance_for_test() as instance:
        upstream(ranged, instance)
        tags = {ASSET_PARTITION_RANGE_START_TAG: FIRST.isoformat(), ASSET_PARTITION_RANGE_END_TAG: LAST.isoformat()}
        result = dg.materialize(ranged.assets, selection=DOWNSTREAM, resources=ranged.resources, instance=instance, tags=tags)
        assert result.success
        for name in DOWNSTREAM:  # one run, one materialization per day
            mats = instance.fetch_materializations(dg.AssetKey(name), limit=100).records
            assert sorted(m.partition_key for m in mats) == [d.isoformat() for d in DAYS]
            assert len({m.run_id for m in mats}) == 1
    a, b = downstream_tables(by_day), downstream_tables(ranged)
    for name in DOWNSTREAM:
        assert sorted(a[name]["partition_key"].unique()) == [d.isoformat() for d in DAYS]
        pd.testing.assert_frame_equal(a[name], b[name], check_exact=True)
    status = b["gpu_budget_status"].set_index(["partition_key", "budget"])
    assert status.loc[(GAP.isoformat(), "nlp-monthly"), "days_missing"] == 1
    assert status.loc[(LAST.isoformat(), "nlp-monthly"), "days_missing"] == 1  # still missing at the end of the range
    assert status.loc[(LAST.isoformat(), "nlp-daily"), "days_missing"] == 0
    assert status.loc[(FIRST.isoformat(), "nlp-monthly"), "days_missing"] == 0
    assert status.loc[(LAST.isoformat(), "nlp-monthly"), "spend_usd"] > status.loc[(FIRST.isoformat(), "nlp-monthly"), "spend_usd"] > 0
    roi = b["gpu_roi_report"]
    assert (roi.loc[roi["partition_key"] == GAP.isoformat(), "cost_usd"] == 0).all()


def test_the_daily_job_has_one_backfill_policy_and_loading_warns_of_nothing(tmp_path):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        env = env_for(tmp_path / "e")
        defs = dg.Definitions.merge(build_defs(env.config), dg.Definitions(resources=env.resources))
        job = defs.resolve_job_def(DAILY_JOB)
    # Neither Dagster's "varying BackfillPolicies" nor a beta-parameter warning at load.
    assert [str(w.message) for w in caught if issubclass(w.category, dg.BetaWarning) or "BackfillPolicies" in str(w.message)] == []
    policies = {a.backfill_policy for a in env.assets}
    assert policies == {dg.BackfillPolicy.multi_run(env.config.usage.backfill_days_per_run)}
    assert job.backfill_policy == dg.BackfillPolicy.multi_run(env.config.usage.backfill_days_per_run)


def test_a_range_run_of_usage_and_attribution_on_random_hostile_files_equals_day_by_day_runs(tmp_path):
    """The tables of gpu_usage and attribution (budgets and ROI over a range: the test
    above): random hostile files (copies, snapshots, bad rows, intervals across midnights)
    and a node inventory on the last day alone. Files' rows carry no lost work: 0.0 on
    every day (a range run that held the idle rows of another day had NaN there: the idle
    rows brought the column, the usage rows lacked it)."""
    import numpy as np
    import yaml

    from gpu_ops.domain.config import load_config
    from gpu_ops.dagster.cost.assets import build_assets
    from gpu_ops.dagster.resources import GpuOpsSettings
    from gpu_ops.dagster.io_manager import TableIOManager
    from gpu_ops_tests.cost.random_files import random_files

    days = ["2026-10-01", "2026-10-02"]
    (tmp_path / "files").mkdir()
    paths = random_files(tmp_path / "files", 4)
    inventory = tmp_path / "files" / "inventory.csv"
    inventory.write_text("node,instance_type,gpu_type,gpu_count,capacity_type,region,start,end\nn1,,a100-80gb,4,spot,,2026-10-02T06:00:00Z,\n")

    def env(name: str) -> tuple[list, dict, str]:
        (tmp_path / name).mkdir()
        config = tmp_path / name / "gpu_ops.yaml"
        config.write_text(yaml.safe_dump({
            "storage": {"url": f"sqlite:///{tmp_path / name / 'costs.db'}"}, "prices": str(Path(__file__).parents[1] / "hostile" / "prices.yaml"),
            "usage": {"sources": [{"type": "file", "path": str(p)} for p in paths], "inventory": {"type": "file", "path": str(inventory)}, "partitions_start": days[0]},
        }))
        assets, _ = build_assets(load_config(config))
        url = f"sqlite:///{tmp_path / name / 'tables.db'}"
        return assets, {"gpu_ops": GpuOpsSettings(config_path=str(config)), "table_io_manager": TableIOManager(url=url)}, url

    (a1, r1, by_day), (a2, r2, ranged) = env("by_day"), env("ranged")
    with dg.instance_for_test() as instance:
        for d in days:
            assert dg.materialize(a1, partition_key=d, resources=r1, instance=instance, selection=UPSTREAM).success
        tags = {ASSET_PARTITION_RANGE_START_TAG: days[0], ASSET_PARTITION_RANGE_END_TAG: days[-1]}
        assert dg.materialize(a2, resources=r2, instance=instance, tags=tags, selection=UPSTREAM).success
    for name in UPSTREAM:
        a, b = TableStore(by_day).read(name), TableStore(ranged).read(name)
        assert sorted(a["partition_key"].unique()) == days, name
        key = [c for c in ("partition_key", "kind", "team", "location", "row", "start", "field") if c in a.columns]
        a, b = (x.sort_values(key, kind="stable").reset_index(drop=True) for x in (a, b))
        pd.testing.assert_frame_equal(a, b, check_exact=False, rtol=1e-12, obj=name)
    usage = TableStore(ranged).read("gpu_usage")
    files = usage[usage["kind"] == "allocated"]
    assert len(files) and (files["lost_gpu_hours"] == 0).all() and (files["lost_cost_usd"] == 0).all()
    assert set(usage.loc[usage["kind"] == "idle", "partition_key"]) == {days[-1]} and np.isfinite(usage["cost_usd"]).all()
