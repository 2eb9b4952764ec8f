"""The cost assets on real Dagster instances: SQLite by default, PostgreSQL in production."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import dagster as dg
import pandas as pd
import pytest
import yaml
from dagster._core.storage.tags import ASSET_PARTITION_RANGE_END_TAG, ASSET_PARTITION_RANGE_START_TAG

from gpu_ops.domain.config import DEMO_CONFIG, load_config
from gpu_ops.dagster.cost.assets import build_assets
from gpu_ops.dagster.cost.definitions import DAILY_SCHEDULE
from gpu_ops.dagster.resources import GpuOpsSettings
from gpu_ops.dagster.io_manager import TableIOManager
from gpu_ops.storage.tables import TableStore

DEMO = DEMO_CONFIG.parent
TABLES = ("gpu_usage", "gpu_usage_quarantine", "gpu_cost_attribution", "gpu_cost_daily", "gpu_budget_status", "gpu_roi_report", "gpu_estimate_accuracy", "gpu_spend_anomalies")


def write_config(tmp_path: Path, url: str, ledger: bool = False, extra_budgets: list | None = None, start: str = "2026-10-01") -> Path:
    demo = yaml.safe_load(DEMO_CONFIG.read_text())
    sources = [{"type": "file", "path": str(DEMO / "usage" / "*.csv")}]
    if ledger:
        sources.insert(0, {"type": "ledger"})
    cfg = {
        "storage": {"url": url},
        "prices": str(DEMO / "prices.yaml"),
        "usage": {"sources": sources, "inventory": {"type": "file", "path": str(DEMO / "inventory.csv")}, "idle": "row", "group_by": ["team", "project"], "partitions_start": start},
        "budgets": demo["budgets"] + (extra_budgets or []),
        "channels": demo["channels"],
    }
    path = tmp_path / "gpu_ops.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


class Env:
    def __init__(self, tmp_path: Path, url: str, ledger: bool = False, extra_budgets: list | None = None, start: str = "2026-10-01", row_level_path: str | None = None):
        self.path = write_config(tmp_path, url, ledger, extra_budgets, start)
        self.config = load_config(self.path)
        self.url = url
        self.assets, self.partitions = build_assets(self.config)
        self.resources = {"gpu_ops": GpuOpsSettings(config_path=str(self.path)), "table_io_manager": TableIOManager(url=url, row_level_path=row_level_path)}

    def materialize(self, day: str, instance: dg.DagsterInstance, selection: list[str] | None = None) -> dg.ExecuteInProcessResult:
        result = dg.materialize(self.assets, partition_key=day, resources=self.resources, instance=instance, selection=selection)
        assert result.success
        return result

    def materialize_range(self, first: str, last: str, instance: dg.DagsterInstance) -> dg.ExecuteInProcessResult:
        """One run over the days ``first`` .. ``last``, as a backfill under the assets' policy launches it."""
        tags = {ASSET_PARTITION_RANGE_START_TAG: first, ASSET_PARTITION_RANGE_END_TAG: last}
        result = dg.materialize(self.assets, resources=self.resources, instance=instance, tags=tags)
        assert result.success
        return result

    def tables(self) -> dict[str, pd.DataFrame]:
        store = TableStore(self.url)
        out = {}
        for name in TABLES:
            df = store.read(name, missing_ok=True)
            out[name] = df.sort_values(list(df.columns[:6])).reset_index(drop=True) if len(df) else df
        return out


def checks(result: dg.ExecuteInProcessResult) -> dict[str, dg.AssetCheckEvaluation]:
    return {e.check_name: e for e in result.get_asset_check_evaluations()}


def test_demo_day_materializes_with_checks_and_metadata(tmp_path):
    env = Env(tmp_path, f"sqlite:///{tmp_path / 'costs.db'}", ledger=True)
    # One preempted training attempt from the ledger (the training engineer's contract columns).
    ledger = pd.DataFrame(
        [{
            "start": pd.Timestamp("2026-10-14T02:00:00Z"), "end": pd.Timestamp("2026-10-14T04:00:00Z"), "namespace": "ml-nlp",
            "pod": "train-demo-1", "node": "ip-10-0-1-11.ec2.internal", "team": "nlp", "project": "demo", "cost_center": "",
            "experiment_id": "", "gpu_type": "a100-80gb", "gpu_count": 1, "capacity_type": "spot", "sharing": "none", "gpu_share": 1.0,
            "run_id": "r1", "asset_key": "train_demo_model", "attempt": 1, "outcome": "preempted",
            "last_checkpoint_at": pd.Timestamp("2026-10-14T03:30:00Z"), "lost_seconds": 1800.0,
        }]
    )
    TableStore(env.url).write("gpu_usage_ledger", ledger)
    with dg.instance_for_test() as instance:
        result = env.materialize("2026-10-14", instance)
    c = checks(result)
    assert c["conservation"].passed
    assert not c["quarantine_empty"].passed and c["quarantine_empty"].severity == dg.AssetCheckSeverity.WARN
    t = env.tables()
    q = t["gpu_usage_quarantine"]
    assert len(q) == 2 and set(q["field"]) == {"gpu_type", "team"} and q["location"].str.endswith("2026-10.csv").all()
    attribution = t["gpu_cost_attribution"]
    usage = t["gpu_usage"]
    assert attribution["cost_usd"].sum() == pytest.approx(usage["cost_usd"].sum())
    assert ("nlp", "demo") in set(zip(attribution["team"], attribution["project"]))
    roi = t["gpu_roi_report"].set_index("team")
    assert roi.loc["nlp", "preemption_waste_usd"] == pytest.approx(0.5 * 1.79)  # 30 min lost on a spot A100-80GB
    status = t["gpu_budget_status"]
    assert list(status["budget"]) == ["nlp-monthly", "vision-monthly"]
    mats = {e.materialization.asset_key.to_user_string(): e.materialization.metadata for e in result.get_asset_materialization_events()}
    assert "top_teams" in mats["gpu_cost_attribution"] and mats["gpu_usage"]["quarantined_rows"].value == 2


@pytest.mark.parametrize(("selected", "other"), [("gpu_usage", "gpu_usage_quarantine"), ("gpu_usage_quarantine", "gpu_usage")])
def test_each_usage_table_can_be_materialized_alone(tmp_path, selected, other):
    """gpu_usage and gpu_usage_quarantine come from one read of the sources but each can be
    selected without the other (the UI's Materialize on one of them, `--select gpu_usage`)."""
    env = Env(tmp_path, f"sqlite:///{tmp_path / 'costs.db'}")
    with dg.instance_for_test() as instance:
        result = dg.materialize(env.assets, selection=[selected], partition_key="2026-10-14", resources=env.resources, instance=instance)
        assert result.success
        assert instance.get_latest_materialization_event(dg.AssetKey(selected)) is not None
        assert instance.get_latest_materialization_event(dg.AssetKey(other)) is None
    written = TableStore(env.url).partitions(selected)
    assert written == ["2026-10-14"] and TableStore(env.url).partitions(other) == []
    # The check belongs to gpu_usage: it runs with it, not with the quarantine alone.
    assert ("quarantine_empty" in checks(result)) == (selected == "gpu_usage")


def test_attribution_and_the_daily_table_can_be_materialized_alone(tmp_path):
    env = Env(tmp_path, f"sqlite:///{tmp_path / 'costs.db'}")
    with dg.instance_for_test() as instance:
        dg.materialize(env.assets, selection=["gpu_usage"], partition_key="2026-10-14", resources=env.resources, instance=instance)
        for selected, other in (("gpu_cost_attribution", "gpu_cost_daily"), ("gpu_cost_daily", None)):
            result = dg.materialize(env.assets, selection=[selected], partition_key="2026-10-14", resources=env.resources, instance=instance)
            assert result.success
            assert [e.asset_key.to_user_string() for e in result.get_asset_materialization_events()] == [selected]
            if other:
                assert instance.get_latest_materialization_event(dg.AssetKey(other)) is None


def test_table_metadata_is_typed_rounded_and_plottable(tmp_path):
    """Column schema and row count on every table; tables as TableMetadataValue; money in
    cents, hours to 3 decimals; one numeric entry per budget and per top team."""
    env = Env(tmp_path, f"sqlite:///{tmp_path / 'costs.db'}")
    with dg.instance_for_test() as instance:
        result = env.materialize("2026-10-14", instance)
    mats = {e.materialization.asset_key.to_user_string(): e.materialization.metadata for e in result.get_asset_materialization_events()}
    tables = env.tables()
    for name, md in mats.items():
        schema = md["dagster/column_schema"].schema
        assert [c.name for c in schema.columns] == [c for c in tables[name].columns if c != "partition_key"], name
        assert md["dagster/row_count"].value == len(tables[name]), name
    usage = mats["gpu_usage"]
    assert usage["gpu_hours"].value == round(usage["gpu_hours"].value, 3)
    attribution = mats["gpu_cost_attribution"]
    teams = attribution["top_teams"]
    assert isinstance(teams, dg.TableMetadataValue) and [c.name for c in teams.schema.columns] == ["team", "gpu_hours", "cost_usd", "savings_usd"]
    first = teams.records[0].data
    assert first["cost_usd"] == round(first["cost_usd"], 2) and first["gpu_hours"] == round(first["gpu_hours"], 3)
    assert attribution[f"team/{first['team']}/cost_usd"].value == first["cost_usd"]
    status = mats["gpu_budget_status"]
    assert isinstance(status["status"], dg.TableMetadataValue) and len(status["status"].records) == 2
    for budget in ("nlp-monthly", "vision-monthly"):
        spend, amount, percent = (status[f"budget/{budget}/{k}"].value for k in ("spend_usd", "amount_usd", "percent_used"))
        assert spend == round(spend, 2) and amount > 0 and percent == pytest.approx(100 * spend / amount, abs=0.06)
    quarantine = mats["gpu_usage_quarantine"]["quarantine"]
    assert isinstance(quarantine, dg.TableMetadataValue) and {r.data["field"] for r in quarantine.records} == {"gpu_type", "team"}
    assert isinstance(mats["gpu_roi_report"]["recommendations"], dg.TableMetadataValue)
    for md in mats.values():
        assert not any(isinstance(v, dg.MarkdownMetadataValue) for v in md.values())


def test_budget_status_accumulates_the_period_and_its_check_escalates(tmp_path):
    daily = [
        {"name": "nlp-daily", "scope": {"team": "nlp"}, "period": "daily", "amount_usd": 100, "thresholds": [{"percent": 80}, {"percent": 100}]},
        {"name": "vision-daily", "scope": {"team": "vision"}, "period": "daily", "amount_usd": 10000, "thresholds": [{"percent": 1}]},
    ]
    env = Env(tmp_path, f"sqlite:///{tmp_path / 'costs.db'}", extra_budgets=daily)
    with dg.DagsterInstance.ephemeral() as instance:
        results = {d: env.materialize(d, instance) for d in ("2026-10-29", "2026-10-30", "2026-10-31")}
    status = env.tables()["gpu_budget_status"]
    last = status[status["partition_key"] == "2026-10-31"].set_index("budget")
    # Only 3 days of the month were materialized: spend is theirs; history 3 d -> a forecast.
    assert last.loc["nlp-monthly", "period_start"] == dt.date(2026, 10, 1)
    assert last.loc["nlp-monthly", "forecast_usd"] == pytest.approx(last.loc["nlp-monthly", "spend_usd"])  # the period ends with the day
    first = status[status["partition_key"] == "2026-10-29"].set_index("budget")
    assert pd.isna(first.loc["nlp-monthly", "forecast_usd"])  # one day of history
    assert last.loc["nlp-monthly", "spend_usd"] > first.loc["nlp-monthly", "spend_usd"]
    assert isinstance(last.loc["nlp-monthly", "thresholds_crossed"], list)
    # The daily budgets start afresh each day: nlp's ~$600/day exceeds $100; vision passes 1%.
    assert (last.loc["nlp-daily", "period_start"], last.loc["nlp-daily", "period_end"]) == (dt.date(2026, 10, 31), dt.date(2026, 10, 31))
    assert last.loc["nlp-daily", "status"] == "exceeded" and last.loc["nlp-daily", "thresholds_crossed"] == ["actual-80pct", "actual-100pct"]
    assert last.loc["vision-daily", "status"] == "warning" and last.loc["vision-daily", "thresholds_crossed"] == ["actual-1pct"]
    check = checks(results["2026-10-31"])["budgets_within_limit"]
    assert not check.passed and check.severity == dg.AssetCheckSeverity.ERROR and "nlp-daily" in check.description
    attribution = env.tables()["gpu_cost_attribution"]
    nlp_31 = attribution[(attribution["partition_key"] == "2026-10-31") & (attribution["team"] == "nlp")]["cost_usd"].sum()
    assert last.loc["nlp-daily", "spend_usd"] == pytest.approx(nlp_31)


def test_a_day_missing_from_a_budget_period_is_reported_and_budgets_read_only_the_daily_table(tmp_path):
    env = Env(tmp_path, f"sqlite:///{tmp_path / 'costs.db'}", start="2026-10-14")
    with dg.DagsterInstance.ephemeral() as instance:
        env.materialize("2026-10-14", instance)
        gap = env.materialize("2026-10-16", instance)  # the 15th was never materialized
        status = TableStore(env.url).read("gpu_budget_status", partition_keys=["2026-10-16"]).set_index("budget")
        assert status["days_missing"].tolist() == [1, 1]
        check = checks(gap)["period_days_present"]
        assert not check.passed and check.severity == dg.AssetCheckSeverity.WARN and "2026-10-15" in check.description
        daily = TableStore(env.url).read("gpu_cost_daily")
        assert set(daily["partition_key"]) == {"2026-10-14", "2026-10-16"}
        nlp = daily[(daily["team"] == "nlp") & (daily["kind"] == "allocated")]
        assert status.loc["nlp-monthly", "spend_usd"] == pytest.approx(nlp["cost_usd"].sum())  # 14th + 16th, no zero for the 15th

        env.materialize("2026-10-15", instance)
        # Budget status from the daily table alone: row-level usage gone, the day re-evaluated.
        with TableStore(env.url).engine.begin() as conn:
            conn.exec_driver_sql("DROP TABLE gpu_usage")
        again = env.materialize("2026-10-16", instance, selection=["gpu_budget_status"])
    assert checks(again)["period_days_present"].passed
    status = TableStore(env.url).read("gpu_budget_status", partition_keys=["2026-10-16"]).set_index("budget")
    attribution = TableStore(env.url).read("gpu_cost_attribution")
    assert status["days_missing"].tolist() == [0, 0]
    assert round(status.loc["nlp-monthly", "spend_usd"], 2) == round(attribution.loc[attribution["team"] == "nlp", "cost_usd"].sum(), 2)


def test_budget_status_before_any_daily_partition_reports_every_day_missing(tmp_path):
    """gpu_cost_daily never materialized (no table at all): the IO manager hands over the
    asset's empty typed table (its declared column schema), so every day is missing, none zero."""
    env = Env(tmp_path, f"sqlite:///{tmp_path / 'costs.db'}", start="2026-10-14")
    daily_out = next(a for a in env.assets if dg.AssetKey("gpu_cost_daily") in a.keys)
    schema = daily_out.specs_by_key[dg.AssetKey("gpu_cost_daily")].metadata["dagster/column_schema"]
    assert [c.name for c in schema.columns][:2] == ["day", "kind"]  # visible in the UI before the first run
    with dg.instance_for_test() as instance:
        result = env.materialize("2026-10-16", instance, selection=["gpu_budget_status"])
    assert not TableStore(env.url).has_table("gpu_cost_daily")
    status = TableStore(env.url).read("gpu_budget_status").set_index("budget")
    assert status["days_missing"].tolist() == [3, 3]
    assert (status["spend_usd"] == 0).all() and status["forecast_usd"].isna().all()
    assert not checks(result)["period_days_present"].passed


def test_row_level_usage_as_parquet_files_gives_the_same_tables(tmp_path):
    from gpu_ops.storage.files import PartitionFiles

    (tmp_path / "sql").mkdir()
    (tmp_path / "files").mkdir()
    sql = Env(tmp_path / "sql", f"sqlite:///{tmp_path / 'sql.db'}")
    files = Env(tmp_path / "files", f"sqlite:///{tmp_path / 'files.db'}", row_level_path=str(tmp_path / "rows"))
    with dg.DagsterInstance.ephemeral() as instance:
        for env in (sql, files):
            for day in ("2026-10-14", "2026-10-15", "2026-10-15"):  # a re-run replaces the day's file
                result = env.materialize(day, instance)
    usage_meta = {e.materialization.asset_key.to_user_string(): e.materialization.metadata for e in result.get_asset_materialization_events()}["gpu_usage"]
    assert usage_meta["storage"].value.endswith("gpu_usage/partition_key=2026-10-15/data.parquet")
    assert not TableStore(files.url).has_table("gpu_usage")
    rows = PartitionFiles(tmp_path / "rows").read("gpu_usage")
    expected = TableStore(sql.url).read("gpu_usage")
    assert PartitionFiles(tmp_path / "rows").partitions("gpu_usage") == ["2026-10-14", "2026-10-15"]
    key = ["partition_key", "kind", "namespace", "pod", "node", "start"]
    pd.testing.assert_frame_equal(
        rows[expected.columns].sort_values(key).reset_index(drop=True), expected.sort_values(key).reset_index(drop=True), check_dtype=False
    )
    a, b = sql.tables(), files.tables()
    for name in ("gpu_cost_attribution", "gpu_cost_daily", "gpu_budget_status", "gpu_roi_report"):
        pd.testing.assert_frame_equal(a[name].drop(columns="as_of", errors="ignore"), b[name].drop(columns="as_of", errors="ignore"))


def test_definitions_register_assets_checks_and_the_daily_schedule():
    from gpu_ops.dagster.cost.definitions import build_defs

    config = load_config()
    shared = dg.Definitions(resources={"gpu_ops": GpuOpsSettings(), "table_io_manager": TableIOManager(url="sqlite:///:memory:")})
    defs = dg.Definitions.merge(shared, build_defs(config))
    graph = defs.resolve_asset_graph()
    keys = {k.to_user_string() for k in graph.get_all_asset_keys()}
    assert {"gpu_usage", "gpu_usage_quarantine", "gpu_cost_attribution", "gpu_budget_status", "gpu_roi_report"} <= keys
    check_names = {k.name for k in graph.asset_check_keys}
    assert {"quarantine_empty", "conservation", "budgets_within_limit"} <= check_names
    schedule = defs.resolve_schedule_def(DAILY_SCHEDULE)
    assert schedule.cron_schedule == "15 0 * * *" and schedule.execution_timezone in (None, "UTC")
    ctx = dg.build_schedule_context(scheduled_execution_time=dt.datetime(2026, 10, 15, 0, 15, tzinfo=dt.timezone.utc), repository_def=defs.get_repository_def())
    requests = list(schedule.evaluate_tick(ctx).run_requests or [])
    assert [r.partition_key for r in requests] == ["2026-10-14"]
    partitions = graph.get(dg.AssetKey("gpu_usage")).partitions_def
    assert partitions.get_first_partition_key() == "2026-10-01"



def test_the_steps_that_read_row_level_usage_whole_are_tagged_to_run_one_at_a_time():
    """Attribution and ROI each load the day's pieces; the executor runs steps tagged
    ROW_LEVEL_READER one at a time, so their peaks never add up (the run-config test is
    in gpu_ops_tests/training/test_executor.py)."""
    from gpu_ops.dagster.cost.assets import build_assets
    from gpu_ops.dagster.io_manager import ROW_LEVEL_READER

    assets, _ = build_assets(load_config())
    tagged = {k.to_user_string() for a in assets for k in a.keys if ROW_LEVEL_READER in a.op.tags}
    assert tagged == {"gpu_cost_attribution", "gpu_cost_daily", "gpu_roi_report"}


# --------------------------------------------------------------------------- PostgreSQL


def _pg_instance(pg_url: str):
    # Dagster's own run/event storage on the same real server (SQLAlchemy 2.1 would pick psycopg 3).
    url = pg_url.replace("postgresql://", "postgresql+psycopg2://", 1)
    return dg.instance_for_test(overrides={"storage": {"postgres": {"postgres_url": url}}})


@pytest.mark.postgres
def test_same_day_three_times_gives_identical_tables(tmp_path, pg_url):
    env = Env(tmp_path, pg_url)
    with _pg_instance(pg_url) as instance:
        snapshots = []
        for _ in range(3):
            env.materialize("2026-10-14", instance)
            snapshots.append(env.tables())
    for name in TABLES:
        assert len(snapshots[0][name]) > 0 or name in ("gpu_usage_quarantine", "gpu_estimate_accuracy")  # no training run in this ledger
        for later in snapshots[1:]:
            pd.testing.assert_frame_equal(snapshots[0][name], later[name], check_like=False)


@pytest.mark.postgres
def test_thirty_day_backfill_lands_thirty_partitions_without_duplicates(tmp_path, pg_url):
    env = Env(tmp_path, pg_url)
    days = [(dt.date(2026, 10, 1) + dt.timedelta(days=i)).isoformat() for i in range(30)]
    per_run = env.config.usage.backfill_days_per_run
    assert per_run == 7
    # As Dagster runs a backfill of the month under the assets' policy (multi_run of 7
    # days): five range runs, 7+7+7+7+2 days, then a single day re-run in the middle. The
    # tables live on PostgreSQL; Dagster's own run and event records stay in memory.
    with dg.DagsterInstance.ephemeral() as instance:
        runs = [env.materialize_range(days[i], days[min(i + per_run, len(days)) - 1], instance) for i in range(0, len(days), per_run)]
        env.materialize(days[5], instance)  # a re-run in the middle replaces, never appends
        materialized = instance.get_materialized_partitions(dg.AssetKey("gpu_cost_attribution"))
    assert len(runs) == 5 and materialized == set(days)
    store = TableStore(pg_url)
    for name in ("gpu_usage", "gpu_cost_attribution", "gpu_budget_status", "gpu_roi_report"):
        assert store.partitions(name) == days, name
    usage = store.read("gpu_usage")
    assert not usage.duplicated(["partition_key", "kind", "namespace", "pod", "node", "start"]).any()
    attribution = store.read("gpu_cost_attribution")
    assert not attribution.duplicated(["partition_key", "team", "project"]).any()
    budgets = store.read("gpu_budget_status")
    assert len(budgets) == 30 * 2 and not budgets.duplicated(["partition_key", "budget"]).any()
    # Month to date on the 30th = the sum of the 30 days' row-level nlp usage, to the cent.
    nlp = budgets[(budgets["partition_key"] == days[-1]) & (budgets["budget"] == "nlp-monthly")].iloc[0]
    assert round(nlp["spend_usd"], 2) == round(usage.loc[(usage["team"] == "nlp") & (usage["kind"] != "idle"), "cost_usd"].sum(), 2)
    assert nlp["spend_usd"] == pytest.approx(attribution.loc[attribution["team"] == "nlp", "cost_usd"].sum())
    assert (budgets["days_missing"] == 0).all()
    assert {"actual-50pct", "actual-80pct", "actual-100pct", "forecast-120pct"} <= set(nlp["thresholds_crossed"])
    assert nlp["status"] == "exceeded"


def test_the_cli_reports_the_budgets_the_asset_does_when_the_period_began_before_the_tables(tmp_path):
    """`gpu-ops cost budgets --config` answers what gpu_budget_status (and so the budget
    sensor) says: the monthly period began on the 1st, the cost tables on the 14th
    (``usage.partitions_start``), and the usage files go back to the 1st. Both count
    spend from the 14th (the CLI read the files from the 1st: $ thousands more, a
    different forecast and status than the alerts fire on)."""
    import json

    from gpu_ops_tests.hostile.cli_driver import run_one

    env = Env(tmp_path, f"sqlite:///{tmp_path / 'costs.db'}", start="2026-10-14")
    with dg.DagsterInstance.ephemeral() as instance:
        env.materialize("2026-10-14", instance, selection=["gpu_usage", "gpu_cost_attribution", "gpu_cost_daily", "gpu_budget_status"])
    asset = TableStore(env.url).read("gpu_budget_status", partition_keys=["2026-10-14"]).set_index("budget")
    r = run_one(["cost", "budgets", "--config", str(env.path), "--date", "2026-10-14", "--format", "json"], str(tmp_path))
    assert r["exit"] == 0 and "Traceback" not in str(r["stderr"]), r["stderr"]
    cli = {b["budget"]: b for b in json.loads(str(r["stdout"]))}
    assert sorted(cli) == sorted(asset.index)
    for name, a in asset.iterrows():
        b = cli[name]
        assert b["spend_usd"] == pytest.approx(a["spend_usd"], abs=1e-6), name
        assert (b["forecast_usd"] is None) == pd.isna(a["forecast_usd"]), name
        if b["forecast_usd"] is not None:
            assert b["forecast_usd"] == pytest.approx(a["forecast_usd"], abs=1e-6), name
        assert (b["status"], b["thresholds_crossed"], b["days_missing"]) == (a["status"], list(a["thresholds_crossed"]), a["days_missing"]), name
    assert asset.loc["nlp-monthly", "spend_usd"] > 0 and asset.loc["nlp-monthly", "period_start"] == dt.date(2026, 10, 1)
