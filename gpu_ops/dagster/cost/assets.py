"""Dagster wiring of the cost flow. Thin: every figure is computed in the pure modules.

Design: docs/concepts/cost-sources.md#the-cost-flow-end-to-end
"""

# pandas and the cost core (attribution, budgets, pipeline, roi, TableStore) are imported when an asset runs, not when the code location loads.
# (No `from __future__ import annotations` here: Dagster rejects a `context` annotation it gets as a string.)
import datetime as dt
import warnings
from typing import Any, Iterator

import dagster as dg

from gpu_ops.domain.config import Budget, GpuOpsConfig, UsageConfig
from gpu_ops.domain.cost.columns import BUDGET_READ_KEEP, BUDGET_READ_SUMS, DAILY_SCHEMA, attribution_input_columns, budget_groupings, roi_input_columns
from gpu_ops.dagster.cost.metadata import hours, money, per_key, schema_metadata, table_metadata, table_value, top_teams
from gpu_ops.domain.cost.sources import SourceSet
from gpu_ops.dagster.resources import GpuOpsSettings
from gpu_ops.dagster.io_manager import BY_REFERENCE, COLUMN_SCHEMA, COLUMNS, DATAFRAME_TYPE, GROUPED, ROW_LEVEL, ROW_LEVEL_READER

GROUP = "gpu_cost"
# Steps that load the day's row-level gpu_usage whole: the executor runs them one at a time.
READS_ROW_LEVEL = {ROW_LEVEL_READER: "true"}
IO = "table_io_manager"
COLLECT_JOB = "collect_gpu_usage_job"
COLLECT_SCHEDULE = "gpu_usage_collect_schedule"
# A monthly period is at most 31 days: the budget reads its day and the 30 before.
BUDGET_WINDOW_DAYS = 31

def _days(context: dg.AssetExecutionContext) -> tuple[dt.date, dt.date]:
    """The first and last UTC day of the run's partition key or partition key range."""
    window = context.partition_time_window
    return window.start.date(), (window.end - dt.timedelta(days=1)).date()


def _backfill_policy(usage: UsageConfig) -> dg.BackfillPolicy:
    """Backfills run up to ``usage.backfill_days_per_run`` days per run (each source read once)."""
    n = usage.backfill_days_per_run
    return dg.BackfillPolicy.single_run() if n is None else dg.BackfillPolicy.multi_run(max_partitions_per_run=n)


def _sum_totals(per_day: list[dict[str, Any]]) -> dict[str, Any]:
    """Attribution totals of several days as one (fleet cost known only when every day knows it)."""
    if len(per_day) == 1:
        return per_day[0]
    fleets = [t["fleet_cost_usd"] for t in per_day]
    return {
        **{k: sum(t[k] for t in per_day) for k in ("attributed_cost_usd", "gpu_hours", "idle_cost_usd", "off_fleet_cost_usd", "groups")},
        "fleet_cost_usd": None if any(f is None for f in fleets) else sum(fleets),
        "over_allocated_nodes": sorted({n for t in per_day for n in t["over_allocated_nodes"]}),
    }


def _efficiency_metadata(cov: dict[str, Any], steps: int | None) -> dict[str, Any]:
    """Coverage of the DCGM metrics (fraction of allocated GPU-hours with metrics) and efficiency."""
    out: dict[str, Any] = {} if steps is None else {"utilization_pod_steps": steps}
    if cov["coverage"] is None:
        return {**out, "metrics_coverage": "none (no utilisation metrics)"} if steps is not None else out
    out["metrics_coverage"] = round(cov["coverage"], 4)
    if cov["efficiency"] is not None:
        out.update(efficiency=round(cov["efficiency"], 4), active_gpu_hours=hours(cov["active_gpu_hours"]), unused_cost_usd=money(cov["unused_cost_usd"]))
    return out


def _billing_checks(config: GpuOpsConfig) -> list[dg.AssetCheckSpec]:
    if config.usage.billing is None:
        return []
    tol = config.usage.billing.tolerance_percent
    blocking = config.prices.from_bill  # attribution at the bill's prices must not run on a bill that does not reconcile
    return [dg.AssetCheckSpec(
        "billing_reconciled", asset="gpu_usage", blocking=blocking,
        description=f"Fleet cost (inventory × prices) against the AWS CUR's billed effective cost of the GPU instances, per day: ERROR beyond {tol:g}%, naming the nodes that explain it"
        + (" (blocking: prices.from_bill, so attribution of a day that does not reconcile is blocked)." if blocking else "."),
    )]


def _budget_window() -> dg.TimeWindowPartitionMapping:
    # The first month's windows reach before the first partition; allowing that is a beta
    # parameter whose warning would print at every code-location load.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dg.BetaWarning)
        return dg.TimeWindowPartitionMapping(start_offset=-(BUDGET_WINDOW_DAYS - 1), end_offset=0, allow_nonexistent_upstream_partitions=True)


def _asset(**kwargs: Any) -> Any:
    """``dg.asset(**kwargs)``; its ``backfill_policy`` parameter is beta in Dagster, whose
    warning would otherwise print at every code-location load (``multi_asset``'s is not)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dg.BetaWarning)
        return dg.asset(**kwargs)


def build_assets(config: GpuOpsConfig) -> tuple[list[dg.AssetsDefinition], dg.PartitionsDefinition]:
    end = config.usage.partitions_end
    partitions = dg.DailyPartitionsDefinition(  # end_date is exclusive
        start_date=config.usage.partitions_start.isoformat(), end_date=(end + dt.timedelta(days=1)).isoformat() if end else None, timezone="UTC"
    )
    backfill = _backfill_policy(config.usage)
    assets = [
        _usage_asset(config, partitions, backfill),
        _attribution_asset(config.usage, partitions, backfill),
        _budget_asset(config.budgets, partitions, backfill),
        _roi_asset(config.usage, partitions, backfill),
        _estimate_accuracy_asset(partitions, backfill),
        _anomaly_asset(partitions, backfill),
    ]
    return assets, partitions


# --------------------------------------------------------------------------- gpu_usage


def _usage_asset(config: GpuOpsConfig, partitions: dg.PartitionsDefinition, backfill: dg.BackfillPolicy) -> dg.AssetsDefinition:
    # Subsettable: `--select gpu_usage` (or the quarantine alone) materializes just that
    # table; both come from one read of the sources.
    @dg.multi_asset(
        name="gpu_usage",
        partitions_def=partitions,
        can_subset=True,
        outs={
            "gpu_usage": dg.AssetOut(
                io_manager_key=IO, group_name=GROUP, is_required=False,
                description="Usage intervals of the UTC day, clipped at midnight and priced, plus one idle row per fleet node "
                "(Parquet under storage.row_level_path when set, else a SQL table).",
                metadata={ROW_LEVEL: True},
            ),
            "gpu_usage_quarantine": dg.AssetOut(
                io_manager_key=IO, group_name=GROUP, is_required=False,
                description="Usage and inventory rows that failed validation, with the reason, file and row.",
            ),
        },
        check_specs=[
            dg.AssetCheckSpec("quarantine_empty", asset="gpu_usage", description="No usage row of the day was set aside as invalid."),
            # Blocking: a day priced without one of its files must not flow on into
            # attribution and budgets as if it were complete (a quieter $0).
            dg.AssetCheckSpec(
                "sources_complete", asset="gpu_usage", blocking=True,
                description="Every usage file pattern matched a file and every file could be read (ERROR, blocking: the day's cost would be short).",
            ),
            *_billing_checks(config),
        ],
        backfill_policy=backfill,
    )
    def gpu_usage_asset(context: dg.AssetExecutionContext, gpu_ops: GpuOpsSettings) -> Iterator[Any]:
        yield from _run_usage(context, gpu_ops)

    return gpu_usage_asset


def _priced_usage(context: dg.AssetExecutionContext, cfg: GpuOpsConfig) -> tuple[Any, Any, Any, Any, Any]:
    """(usage read, stored table, quarantine, measured utilisation, billing settlement or None)
    of the run's days. The stored table is the day files by reference, written from DuckDB;
    with utilisation metrics or a bill to settle against (both pandas) it is their frame."""
    from gpu_ops.flows.cost.pipeline import usage_for_days
    from gpu_ops.flows.cost.pricing import PriceMatrix
    from gpu_ops.storage.tables import TableStore

    first, last = _days(context)
    usage = usage_for_days(
        SourceSet.from_config(cfg), TableStore.from_config(cfg), PriceMatrix.from_table(cfg.prices), first, last, scratch_in=cfg.storage.row_level_path,
    )
    if cfg.usage.utilization is None and cfg.usage.billing is None:
        return usage, usage.parts, usage.quarantine, None, None
    return _measured_and_settled(context, cfg, usage)


def _measured_and_settled(context: dg.AssetExecutionContext, cfg: GpuOpsConfig, usage: Any) -> tuple[Any, Any, Any, Any, Any]:
    import pandas as pd

    from gpu_ops.flows.cost.attribution import day_window
    from gpu_ops.flows.cost.utilization import measured_rows
    from gpu_ops.storage.tables import TableStore

    first, last = _days(context)
    measured = measured_rows(cfg.usage.utilization, usage.table, day_window(first)[0], day_window(last)[1])
    table, q = measured.rows, usage.quarantine
    if measured.missing:
        context.log.warning(measured.missing)
    if cfg.usage.billing is None:
        return usage, table, q, measured, None
    from gpu_ops.flows.cost.billing import settle_billing

    settled = settle_billing(cfg, table, first, last, TableStore.from_config(cfg))
    return usage, settled.table, pd.concat([q, settled.quarantine], ignore_index=True), measured, settled


def _run_usage(context: dg.AssetExecutionContext, gpu_ops: GpuOpsSettings) -> Iterator[Any]:
    cfg = gpu_ops.load()
    usage, table, q, measured, settled = _priced_usage(context, cfg)
    selected = {k.to_user_string() for k in context.selected_asset_keys}
    if "gpu_usage" in selected:
        yield dg.Output(table, output_name="gpu_usage", metadata=_usage_metadata(context, cfg.usage, usage, table, q, measured, settled))
    if "gpu_usage_quarantine" in selected:
        yield dg.Output(
            q, output_name="gpu_usage_quarantine",
            metadata={**table_metadata(q), "quarantined_rows": len(q), "quarantine": table_value(q[["location", "row", "field", "reason"]])},
        )
    yield from _usage_checks({k.name for k in context.selected_asset_check_keys}, q, settled)


def _usage_figures(usage: Any, table: Any) -> tuple[dict[str, Any], dict[str, Any], int]:
    """(fleet totals, efficiency coverage, intervals) of the stored rows: summed as they were
    written, or (a measured or settled frame) from the frame."""
    from gpu_ops.flows.cost.attribution import fleet_totals
    from gpu_ops.flows.cost.utilization import coverage, coverage_of_sums

    if table is usage.parts:
        t = usage.totals
        totals = {"gpu_hours": t.gpu_hours, "allocated_cost_usd": t.allocated_cost_usd, "idle_cost_usd": t.idle_cost_usd, "fleet_cost_usd": t.fleet_cost_usd}
        return totals, coverage_of_sums(t.gpu_hours, t.measured), t.intervals
    return fleet_totals(table), coverage(table), int((table["kind"] != "idle").sum()) if len(table) else 0


def _usage_metadata(context: dg.AssetExecutionContext, config: UsageConfig, usage: Any, table: Any, q: Any, measured: Any, settled: Any) -> dict[str, Any]:
    first, last = _days(context)
    totals, cov, intervals = _usage_figures(usage, table)
    from_bill = settled.from_bill if settled is not None else None
    return {
        **(table_metadata(table) if table is not usage.parts else schema_metadata(usage.parts.schema, usage.parts.rows)),
        **({"days": f"{first} .. {last}"} if last > first else {}),
        "as_of": usage.as_of.isoformat(),
        "intervals": intervals,
        "gpu_hours": hours(totals["gpu_hours"]),
        "allocated_cost_usd": money(totals["allocated_cost_usd"]),
        "idle_cost_usd": money(totals["idle_cost_usd"]),
        "fleet_cost_usd": money(totals["fleet_cost_usd"]) if totals["fleet_cost_usd"] is not None else "unknown (no inventory)",
        "quarantined_rows": len(q),
        **usage.stats.metadata(),
        **_efficiency_metadata(cov, measured.pod_steps if config.utilization else None),
        **(measured.metadata() if measured is not None else {}),
        **({"priced_from_bill": f"{from_bill['billed_nodes']} node-day(s) at billed cost; list prices for: {', '.join(from_bill['unbilled_nodes']) or 'none'}"} if from_bill else {}),
    }


def _usage_checks(checks: set[str], q: Any, settled: Any) -> Iterator[dg.AssetCheckResult]:
    from gpu_ops.flows.cost.usage import file_problems

    if "quarantine_empty" in checks:
        yield dg.AssetCheckResult(
            asset_key="gpu_usage",
            check_name="quarantine_empty",
            passed=q.empty,
            severity=dg.AssetCheckSeverity.WARN,
            description=None if q.empty else f"{len(q)} row(s) quarantined; see table gpu_usage_quarantine",
            metadata={"quarantined_rows": len(q), "reasons": table_value(q[["location", "row", "field", "reason"]])},
        )
    if "billing_reconciled" in checks and settled is not None:
        md = settled.metadata()
        yield dg.AssetCheckResult(
            asset_key="gpu_usage",
            check_name="billing_reconciled",
            passed=settled.passed,
            severity=dg.AssetCheckSeverity.ERROR,
            description=settled.description(),
            metadata={**{k: v for k, v in md.items() if k != "nodes"}, **({"nodes": table_value(md["nodes"])} if "nodes" in md else {})},
        )
    if "sources_complete" in checks:
        unread = file_problems(q)
        yield dg.AssetCheckResult(
            asset_key="gpu_usage",
            check_name="sources_complete",
            passed=unread.empty,
            severity=dg.AssetCheckSeverity.ERROR,
            description=None if unread.empty else "; ".join(f"{r.location}: {r.reason}" for r in unread.itertuples(index=False)),
            metadata={"unread_sources": len(unread), "problems": table_value(unread.reindex(columns=["location", "reason"]))},
        )


# --------------------------------------------------------------------------- attribution and the daily table


def _attribution_asset(usage: UsageConfig, partitions: dg.PartitionsDefinition, backfill: dg.BackfillPolicy) -> dg.AssetsDefinition:
    @dg.multi_asset(
        name="gpu_cost_attribution",
        partitions_def=partitions,
        can_subset=True,  # each table can be materialized alone
        # The day files by reference (read by DuckDB where they lie); a SQL store: the frame of these columns.
        ins={"gpu_usage": dg.AssetIn(metadata={COLUMNS: attribution_input_columns(usage.group_by), BY_REFERENCE: True})},
        outs={
            "gpu_cost_attribution": dg.AssetOut(
                io_manager_key=IO, group_name=GROUP, dagster_type=DATAFRAME_TYPE, is_required=False,
                description="Cost per grouping key (usage.group_by) for the UTC day; idle fleet cost as __idle__ or shared.",
            ),
            "gpu_cost_daily": dg.AssetOut(
                io_manager_key=IO, group_name=GROUP, dagster_type=DATAFRAME_TYPE, is_required=False,
                description="Cost per UTC day, kind and budget scope keys (team, project, namespace, cost_center, scoped labels): "
                "what budget periods are summed from. A day without usage keeps one row of kind 'none'.",
                metadata={COLUMN_SCHEMA: dg.TableSchema(columns=[dg.TableColumn(name, kind) for name, kind in DAILY_SCHEMA])},
            ),
        },
        check_specs=[dg.AssetCheckSpec("conservation", asset="gpu_cost_attribution", description="Attributed cost equals fleet cost (plus usage on nodes outside the inventory); no node over-allocated.")],
        backfill_policy=backfill,
        op_tags=READS_ROW_LEVEL,
    )
    def gpu_cost_attribution(context: dg.AssetExecutionContext, gpu_ops: GpuOpsSettings, gpu_usage) -> Iterator[Any]:  # type: ignore[no-untyped-def]
        yield from _run_attribution(context, gpu_ops, gpu_usage)

    return gpu_cost_attribution


def _day_attribution(con: Any, rows: str, usage: UsageConfig) -> Any:
    """One day's attribution of its stored rows, grouped in DuckDB, with the groups' efficiency."""
    import pandas as pd

    from gpu_ops.flows.cost.allocate import METRIC_COLUMNS
    from gpu_ops.flows.cost.attribution import AttributedCosts
    from gpu_ops.flows.cost.stored import has_metrics, stored_attribution
    from gpu_ops.flows.cost.utilization import group_efficiency

    groups = stored_attribution(con, rows, usage.group_by, usage.idle)
    table = pd.DataFrame(groups.rows, columns=groups.columns).astype({c: float for c in METRIC_COLUMNS})
    measured = con.sql(rows).df() if has_metrics(con, rows) else pd.DataFrame()
    return AttributedCosts(group_efficiency(table, measured, usage.group_by), list(usage.group_by), groups.totals)


def _run_attribution(context: dg.AssetExecutionContext, gpu_ops: GpuOpsSettings, gpu_usage: Any) -> Iterator[Any]:
    import duckdb
    import pandas as pd

    from gpu_ops.flows.cost.budgets import daily_costs_sql, scope_keys, scope_label_keys
    from gpu_ops.flows.cost.pipeline import PARTITION_KEY
    from gpu_ops.flows.cost.stored import day_relations, measured_sums

    cfg = gpu_ops.load()
    keys = context.partition_keys
    con = duckdb.connect()
    try:
        per_day = day_relations(con, gpu_usage, keys)
        days = [(key, _day_attribution(con, rows, cfg.usage)) for key, rows in per_day]
        every = " UNION ALL BY NAME ".join(f"SELECT * FROM ({rows})" for _, rows in per_day)
        daily = daily_costs_sql(con, every, [dt.date.fromisoformat(k) for k in keys], scope_label_keys(cfg.budgets), scope_keys(cfg.budgets))
        sums = measured_sums(con, every)
    finally:
        con.close()
    table = pd.concat([r.table.assign(**{PARTITION_KEY: key}) for key, r in days], ignore_index=True)
    daily[PARTITION_KEY] = [d.isoformat() for d in daily["day"]]
    t = _sum_totals([r.totals for _, r in days])
    from gpu_ops.flows.observability.hooks import partition_materialized  # issue 23: the partition's span (nothing without OTEL_EXPORTER_OTLP_ENDPOINT)

    partition_materialized(context, "gpu_cost_attribution", {"cost.total": t["attributed_cost_usd"], "gpu_hours.allocated": t["gpu_hours"], "cost.idle": t["idle_cost_usd"]})
    selected = {k.to_user_string() for k in context.selected_asset_keys}
    if "gpu_cost_attribution" in selected:
        yield dg.Output(table, output_name="gpu_cost_attribution", metadata=_attribution_metadata(table, t, sums))
    if "gpu_cost_daily" in selected:
        yield dg.Output(
            daily, output_name="gpu_cost_daily",
            metadata={**table_metadata(daily), "cost_usd": money(daily["cost_usd"].sum()), "scope_rows": len(daily)},
        )
    if context.selected_asset_check_keys:
        yield _conservation_check(days, t)


def _attribution_metadata(table: Any, t: dict[str, Any], sums: tuple[float, dict[str, float]]) -> dict[str, Any]:
    from gpu_ops.flows.cost.utilization import coverage_of_sums

    teams = top_teams(table)
    return {
        **table_metadata(table),
        "total_cost_usd": money(t["attributed_cost_usd"]),
        "gpu_hours": hours(t["gpu_hours"]),
        "idle_cost_usd": money(t["idle_cost_usd"]),
        "fleet_cost_usd": money(t["fleet_cost_usd"]) if t["fleet_cost_usd"] is not None else "unknown (no inventory)",
        "savings_usd": money(table["savings_usd"].sum()),
        "groups": t["groups"],
        "top_teams": table_value(teams),
        **per_key("team", teams.to_dict("records"), "team", ["cost_usd", "gpu_hours"]),
        **_efficiency_metadata(coverage_of_sums(*sums), None),
    }


def _conservation_check(days: list[tuple[str, Any]], t: dict[str, Any]) -> dg.AssetCheckResult:
    from gpu_ops.flows.cost.attribution import conservation

    verdicts = [(key, *conservation(r.table, r.totals)) for key, r in days]
    ok = all(v[1] for v in verdicts)
    message = verdicts[0][2] if len(verdicts) == 1 else "; ".join(f"{k}: {m}" for k, good, m in verdicts if not good) or f"all {len(verdicts)} days conserve"
    return dg.AssetCheckResult(
        asset_key="gpu_cost_attribution",
        check_name="conservation",
        passed=ok,
        severity=dg.AssetCheckSeverity.ERROR,
        description=message,
        metadata={
            "attributed_cost_usd": money(t["attributed_cost_usd"]),
            "off_fleet_cost_usd": money(t["off_fleet_cost_usd"]),
            **({"fleet_cost_usd": money(t["fleet_cost_usd"])} if t["fleet_cost_usd"] is not None else {}),
            "over_allocated_nodes": ", ".join(t["over_allocated_nodes"]) or "none",
        },
    )


# --------------------------------------------------------------------------- budgets


def _budget_asset(budgets: list[Budget], partitions: dg.PartitionsDefinition, backfill: dg.BackfillPolicy) -> dg.AssetsDefinition:
    # The daily table summed per budget grain by the database: what the budgets read
    # grows with the values of their own scope keys, not with the table's other keys.
    grouped = {"groupings": budget_groupings(b.scope.as_filters() for b in budgets), "keep": list(BUDGET_READ_KEEP), "sums": list(BUDGET_READ_SUMS)}

    @_asset(
        partitions_def=partitions, io_manager_key=IO, group_name=GROUP,
        description="Each budget's period to date: spend, forecast, status and thresholds crossed (read by the budget alert sensor); "
        "days_missing counts days of the period without gpu_cost_daily.",
        ins={"gpu_cost_daily": dg.AssetIn(partition_mapping=_budget_window(), dagster_type=DATAFRAME_TYPE, metadata={GROUPED: grouped})},
        check_specs=[
            dg.AssetCheckSpec("budgets_within_limit", asset="gpu_budget_status", description="WARN when a budget is at warning, ERROR when one is exceeded."),
            dg.AssetCheckSpec("period_days_present", asset="gpu_budget_status", description="WARN when days of a budget period have no gpu_cost_daily partition (their spend is unknown, not zero)."),
        ],
        backfill_policy=backfill,
    )
    def gpu_budget_status(context: dg.AssetExecutionContext, gpu_ops: GpuOpsSettings, gpu_cost_daily) -> Iterator[Any]:  # type: ignore[no-untyped-def]
        yield from _run_budgets(context, gpu_ops, gpu_cost_daily)

    return gpu_budget_status


def _run_budgets(context: dg.AssetExecutionContext, gpu_ops: GpuOpsSettings, gpu_cost_daily: Any) -> Iterator[Any]:
    import pandas as pd

    from gpu_ops.flows.cost.budgets import check_outcome, evaluate_budget_days, missing_days_outcome
    from gpu_ops.flows.cost.pipeline import PARTITION_KEY, default_as_of

    cfg = gpu_ops.load()
    keys = context.partition_keys
    days = [(day, default_as_of(day)) for day in map(dt.date.fromisoformat, keys)]
    daily = gpu_cost_daily.drop(columns=[PARTITION_KEY], errors="ignore")
    per_day = evaluate_budget_days(cfg.budgets, daily, days, cfg.usage.idle, expected_from=cfg.usage.partitions_start)
    # A range run writes each day's rows to its partition; metadata and checks are the last day's (as day-by-day runs leave them).
    status = per_day[-1]
    table = status if len(keys) == 1 else pd.concat([t.assign(**{PARTITION_KEY: k}) for k, t in zip(keys, per_day)], ignore_index=True)
    counts = {"exceeded": int((status["status"] == "exceeded").sum()), "warning": int((status["status"] == "warning").sum())}
    yield dg.Output(table if len(table) else None, metadata=_budget_metadata(keys, status, counts))
    passed, severity, description = check_outcome(status)
    yield dg.AssetCheckResult(
        check_name="budgets_within_limit",
        passed=passed,
        severity=dg.AssetCheckSeverity.ERROR if severity == "error" else dg.AssetCheckSeverity.WARN,
        description=description,
        metadata=counts,
    )
    passed, description, missing = missing_days_outcome(status)
    yield dg.AssetCheckResult(
        check_name="period_days_present",
        passed=passed,
        severity=dg.AssetCheckSeverity.WARN,
        description=description,
        metadata={"missing_days": ", ".join(missing) or "none", "budgets_affected": len(status.attrs.get("missing_days", {}))},
    )


def _budget_metadata(keys: list[str], status: Any, counts: dict[str, int]) -> dict[str, Any]:
    view = status[["budget", "spend_usd", "amount_usd", "percent_used", "forecast_usd", "status", "thresholds_crossed", "days_missing"]]
    return {
        **table_metadata(status if len(status) else None, like=status),
        **({"days": f"{keys[0]} .. {keys[-1]} (figures: {keys[-1]})"} if len(keys) > 1 else {}),
        "budgets": len(status),
        **counts,
        "days_missing": int(status["days_missing"].max()) if len(status) else 0,
        "status": table_value(view),
        # One line per budget in the Plots tab: its burn over the period.
        **per_key("budget", status.to_dict("records"), "budget", ["spend_usd", "amount_usd", "percent_used", "forecast_usd"]),
    }


# --------------------------------------------------------------------------- ROI


def _roi_asset(usage: UsageConfig, partitions: dg.PartitionsDefinition, backfill: dg.BackfillPolicy) -> dg.AssetsDefinition:
    @_asset(
        partitions_def=partitions, io_manager_key=IO, group_name=GROUP,
        description="Measured spot, reserved and sharing savings, preemption and idle waste, with recommendations, per team.",
        # The day files by reference (read by DuckDB where they lie); a SQL store: the frame of these columns.
        ins={"gpu_usage": dg.AssetIn(metadata={COLUMNS: roi_input_columns(usage.utilization is not None), BY_REFERENCE: True})},
        dagster_type=DATAFRAME_TYPE,  # the output: a pandas DataFrame
        backfill_policy=backfill,
        op_tags=READS_ROW_LEVEL,
    )
    def gpu_roi_report(context: dg.AssetExecutionContext, gpu_ops: GpuOpsSettings, gpu_usage) -> dg.Output:  # type: ignore[no-untyped-def]
        return _run_roi(context, gpu_ops, gpu_usage)

    return gpu_roi_report


def _run_roi(context: dg.AssetExecutionContext, gpu_ops: GpuOpsSettings, gpu_usage: Any) -> dg.Output:
    import duckdb
    import pandas as pd

    from gpu_ops.flows.cost.pipeline import PARTITION_KEY
    from gpu_ops.flows.cost.pricing import PriceMatrix
    from gpu_ops.flows.cost.roi import TOTAL, roi_report_sql
    from gpu_ops.flows.cost.stored import day_relations

    prices = PriceMatrix.from_table(gpu_ops.load().prices)
    keys = context.partition_keys
    con = duckdb.connect()
    try:
        per_day = [(key, roi_report_sql(con, rows, prices)) for key, rows in day_relations(con, gpu_usage, keys)]
    finally:
        con.close()
    # A range run writes each day's report to its partition; metadata is the last day's (as day-by-day runs leave it).
    report = per_day[-1][1]
    table = report if len(keys) == 1 else pd.concat([r.assign(**{PARTITION_KEY: k}) for k, r in per_day], ignore_index=True)
    total = report[report["team"] == TOTAL].iloc[0]
    recs = sorted((r for rs in report["recommendations"] for r in rs), key=lambda r: -r["impact_usd"])
    recommendations = pd.DataFrame([{"impact_usd": r["impact_usd"], "kind": r["kind"], "detail": r["detail"]} for r in recs], columns=["impact_usd", "kind", "detail"])
    totals = ["cost_usd", "spot_savings_usd", "sharing_savings_usd", "preemption_waste_usd", "net_spot_savings_usd", "idle_waste_usd"]
    return dg.Output(
        table,
        metadata={
            **table_metadata(report),
            **({"days": f"{keys[0]} .. {keys[-1]} (figures: {keys[-1]})"} if len(keys) > 1 else {}),
            **{name: money(total[name]) for name in totals},
            "recommendations": table_value(recommendations),
        },
    )


# --------------------------------------------------------------------------- estimate against actual


def _estimate_accuracy_asset(partitions: dg.PartitionsDefinition, backfill: dg.BackfillPolicy) -> dg.AssetsDefinition:
    @_asset(
        name="gpu_estimate_accuracy", partitions_def=partitions, io_manager_key=IO, group_name=GROUP,
        description="Per training run completed on the UTC day: the cost estimated at its launch (gpu_launch_estimates) against what its "
        "attempts cost (usage ledger), with the error and whether the p90 covered it.",
        dagster_type=DATAFRAME_TYPE, backfill_policy=backfill,
    )
    def gpu_estimate_accuracy(context: dg.AssetExecutionContext, gpu_ops: GpuOpsSettings) -> dg.Output:
        return _run_estimate_accuracy(context, gpu_ops)

    return gpu_estimate_accuracy


def _run_estimate_accuracy(context: dg.AssetExecutionContext, gpu_ops: GpuOpsSettings) -> dg.Output:
    import pandas as pd

    from gpu_ops.flows.cost.attribution import day_window
    from gpu_ops.flows.cost.pipeline import PARTITION_KEY
    from gpu_ops.storage.tables import TableStore
    from gpu_ops.storage import estimate_store, ledger
    from gpu_ops.domain.training.estimate import accuracy

    cfg = gpu_ops.load()
    store = TableStore.from_config(cfg)
    keys = context.partition_keys
    # What can complete in these days: the runs with an attempt ending in them (with all
    # their attempts) and those runs' estimates, not the ledger's history.
    rows = ledger.runs_ending_in(store, day_window(keys[0])[0], day_window(keys[-1])[1])
    estimates = estimate_store.read(store, run_id=sorted(set(rows["run_id"]))) if len(rows) else pd.DataFrame()
    table = accuracy(rows, estimate_store.first_of_runs(estimates), cfg.prices.gpus, simulate_gpu_pricing=cfg.training.simulate_gpu_pricing)
    completed = pd.to_datetime(table["completed_at"], utc=True) if len(table) else pd.Series([], dtype="datetime64[us, UTC]")
    per_day = [(key, table[(completed >= day_window(key)[0]) & (completed < day_window(key)[1])].reset_index(drop=True)) for key in keys]
    day = per_day[-1][1]
    out = day if len(keys) == 1 else pd.concat([t.assign(**{PARTITION_KEY: k}) for k, t in per_day], ignore_index=True)
    known = day.dropna(subset=["abs_error_usd"]) if len(day) else day
    return dg.Output(
        out,
        metadata={
            **table_metadata(day),
            **({"days": f"{keys[0]} .. {keys[-1]} (figures: {keys[-1]})"} if len(keys) > 1 else {}),
            "runs": len(day),
            "runs_with_estimate": len(known),
            **({"median_abs_error_usd": money(float(known["abs_error_usd"].median())), "median_abs_pct_error": round(float(known["abs_pct_error"].median()), 2),
                "within_p90": int(known["within_p90"].sum())} if len(known) else {}),
            **({"runs_table": table_value(day[["run_id", "asset_key", "estimate_basis", "estimate_usd", "estimate_p90_usd", "actual_usd", "error_usd"]])} if len(day) else {}),
        },
    )


# --------------------------------------------------------------------------- spend anomalies


def _anomaly_asset(partitions: dg.PartitionsDefinition, backfill: dg.BackfillPolicy) -> dg.AssetsDefinition:
    @_asset(
        name="gpu_spend_anomalies", partitions_def=partitions, io_manager_key=IO, group_name=GROUP,
        deps=["gpu_cost_attribution", "gpu_estimate_accuracy"],
        description="Each team's, project's and training asset's spend of the UTC day against its trailing days (median and MAD by weekday; "
        "all days, a wider band, in the first weeks): the robust score, read by budget_alert_sensor (alerts.anomalies).",
        check_specs=[dg.AssetCheckSpec("spend_anomalies", asset="gpu_spend_anomalies", description="WARN when a key's spend of the day scores alerts.anomalies.check_score or more over its baseline.")],
        dagster_type=DATAFRAME_TYPE, backfill_policy=backfill,
    )
    def gpu_spend_anomalies(context: dg.AssetExecutionContext, gpu_ops: GpuOpsSettings) -> Iterator[Any]:
        yield from _run_anomalies(context, gpu_ops)

    return gpu_spend_anomalies


def _run_anomalies(context: dg.AssetExecutionContext, gpu_ops: GpuOpsSettings) -> Iterator[Any]:
    import pandas as pd

    from gpu_ops.flows.cost.anomaly import describe, score_day
    from gpu_ops.flows.cost.pipeline import PARTITION_KEY
    from gpu_ops.storage.tables import TableStore

    settings = gpu_ops.load().alerts.anomalies
    keys = context.partition_keys
    days = [dt.date.fromisoformat(k) for k in keys]
    daily, present = _daily_spend(TableStore.from_config(gpu_ops.load()), days[0] - dt.timedelta(days=settings.window_days), days[-1])
    per_day = [score_day(daily, d, sorted(set(present) | {d}), settings) for d in days]
    day = per_day[-1]
    out = day if len(keys) == 1 else pd.concat([t.assign(**{PARTITION_KEY: k}) for k, t in zip(keys, per_day)], ignore_index=True)
    flagged = day[day["anomalous"].astype(bool)].sort_values("score", ascending=False) if len(day) else day
    yield dg.Output(out, metadata={**table_metadata(day), "scored": len(day), "anomalies": len(flagged),
                                   **({"top_score": round(float(day["score"].max()), 2)} if day["score"].notna().any() else {})})
    listed = "; ".join(describe(r) for _, r in flagged.head(10).iterrows())
    yield dg.AssetCheckResult(
        check_name="spend_anomalies", passed=flagged.empty, severity=dg.AssetCheckSeverity.WARN,
        description=f"{len(flagged)} spend anomal{'y' if len(flagged) == 1 else 'ies'}: {listed}" if len(flagged) else f"no spend anomaly among {len(day)} key(s) scored",
        metadata={"anomalies": len(flagged), "check_score": settings.check_score},
    )


def _daily_spend(store: Any, first: dt.date, last: dt.date) -> tuple[Any, list[dt.date]]:
    """Daily aggregates of ``[first, last]``: spend per day of each team and project
    (gpu_cost_attribution, the idle row left out) and training asset (gpu_estimate_accuracy:
    its runs completed that day), as ``day, dimension, key, team, project, spend_usd``; and
    the days gpu_cost_attribution has (the others are unknown, not zero)."""
    import pandas as pd

    from gpu_ops.flows.cost.allocate import IDLE
    from gpu_ops.storage.tables import PARTITION_COLUMN

    keys = [(first + dt.timedelta(days=i)).isoformat() for i in range((last - first).days + 1)]
    attribution = store.read("gpu_cost_attribution", partition_keys=keys, columns=[PARTITION_COLUMN, "team", "project", "cost_usd"], missing_ok=True)
    runs = store.read("gpu_estimate_accuracy", partition_keys=keys, columns=[PARTITION_COLUMN, "asset_key", "team", "project", "actual_usd"], missing_ok=True)
    parts = []
    if len(attribution):
        attribution = attribution[attribution["team"].astype(str) != IDLE]
        for dim in ("team", "project"):
            if dim in attribution:
                g = attribution.groupby([PARTITION_COLUMN, dim], as_index=False)["cost_usd"].sum()
                parts.append(pd.DataFrame({"day": g[PARTITION_COLUMN], "dimension": dim, "key": g[dim].astype(str), "team": g[dim].astype(str) if dim == "team" else "",
                                           "project": g[dim].astype(str) if dim == "project" else "", "spend_usd": g["cost_usd"]}))
    if len(runs):
        g = runs.groupby([PARTITION_COLUMN, "asset_key"], as_index=False).agg(team=("team", "first"), project=("project", "first"), spend_usd=("actual_usd", "sum"))
        parts.append(pd.DataFrame({"day": g[PARTITION_COLUMN], "dimension": "asset", "key": g["asset_key"].astype(str), "team": g["team"].astype(str), "project": g["project"].astype(str), "spend_usd": g["spend_usd"]}))
    daily = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=["day", "dimension", "key", "team", "project", "spend_usd"])
    daily["day"] = [dt.date.fromisoformat(str(d)[:10]) for d in daily["day"]]
    present = sorted({dt.date.fromisoformat(str(d)[:10]) for d in attribution[PARTITION_COLUMN]}) if len(attribution) else []
    return daily, present


def build_collector(config: GpuOpsConfig) -> tuple[list[dg.JobDefinition], list[dg.ScheduleDefinition]]:
    """A job that records what the Kubernetes collector sees, every 10 minutes.

    Pods that are deleted (Kubetorch tears its workloads down) leave the API within the
    day; collecting only at the daily materialization would miss them. Registered only
    when a kubernetes usage source or a karpenter inventory is configured.
    """
    sources = SourceSet.from_config(config)
    if not (sources.kubernetes or sources.inventory_karpenter):
        return [], []

    @dg.op(description="List GPU pods and GPU nodes and record them (gpu_usage_collected, gpu_nodes_collected).")
    def collect_gpu_usage(context: dg.OpExecutionContext, gpu_ops: GpuOpsSettings) -> None:
        from gpu_ops.flows.cost.pipeline import collect
        from gpu_ops.storage.tables import TableStore

        cfg = gpu_ops.load()
        seen = collect(SourceSet.from_config(cfg), TableStore.from_config(cfg))
        context.log.info(f"recorded {seen['pods']} GPU pod(s) and {seen['nodes']} GPU node(s)")

    @dg.job(name=COLLECT_JOB, description="Record the GPU pods and nodes the Kubernetes collector sees.")
    def collect_job() -> None:
        collect_gpu_usage()

    schedule = dg.ScheduleDefinition(
        name=COLLECT_SCHEDULE, job=collect_job, cron_schedule="*/10 * * * *", execution_timezone="UTC",
        default_status=dg.DefaultScheduleStatus.RUNNING,
    )
    return [collect_job], [schedule]

