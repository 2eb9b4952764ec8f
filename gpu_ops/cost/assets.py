"""Dagster wiring of the cost flow. Thin: every figure is computed in the pure modules.

gpu_usage[day] (+ gpu_usage_quarantine[day]) ─► gpu_cost_attribution[day] + gpu_cost_daily[day]
                                            │     gpu_cost_daily[period] ─► gpu_budget_status[day]
                                            └─► gpu_roi_report[day]

Steps read only the columns they use (``AssetIn(metadata={"columns": [...]})``, honoured
by the table IO manager); budgets read the compact daily table, never row-level usage.
"""

# pandas and the cost core (attribution, budgets, pipeline, roi, TableStore) are imported when an asset runs, not when the code location loads.
# (No `from __future__ import annotations` here: Dagster rejects a `context` annotation it gets as a string.)
import datetime as dt
import warnings
from typing import TYPE_CHECKING, Any, Iterator

import dagster as dg

from gpu_ops.config import GpuOpsConfig
from gpu_ops.cost.columns import ROI_INPUT_COLUMNS, attribution_input_columns
from gpu_ops.cost.sources import SourceSet
from gpu_ops.resources import GpuOpsSettings
from gpu_ops.storage.io_manager import COLUMNS, DATAFRAME_TYPE, ROW_LEVEL

if TYPE_CHECKING:
    import pandas as pd

GROUP = "gpu_cost"
IO = "table_io_manager"
COLLECT_JOB = "collect_gpu_usage_job"
COLLECT_SCHEDULE = "gpu_usage_collect_schedule"
# A monthly period is at most 31 days: the budget reads its day and the 30 before.
BUDGET_WINDOW_DAYS = 31

def _md_table(df: "pd.DataFrame", limit: int = 10) -> str:
    if df.empty:
        return "(none)"
    df = df.head(limit)
    head = "| " + " | ".join(map(str, df.columns)) + " |\n|" + "---|" * len(df.columns) + "\n"
    body = "".join("| " + " | ".join(_cell(v) for v in row) + " |\n" for row in df.itertuples(index=False, name=None))
    return head + body


def _cell(v: Any) -> str:
    import pandas as pd

    if isinstance(v, float):
        return "" if pd.isna(v) else f"{v:,.2f}"
    if isinstance(v, (list, tuple)):
        return ", ".join(map(str, v))
    return str(v).replace("|", "\\|")


def _top_teams(table: "pd.DataFrame") -> "pd.DataFrame":
    if table.empty or "team" not in table:
        return table
    return table.groupby("team", as_index=False)[["gpu_hours", "cost_usd", "savings_usd"]].sum().sort_values("cost_usd", ascending=False)


def _budget_window() -> dg.TimeWindowPartitionMapping:
    # The first month's windows reach before the first partition; allowing that is a beta
    # parameter whose warning would print at every code-location load.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dg.BetaWarning)
        return dg.TimeWindowPartitionMapping(start_offset=-(BUDGET_WINDOW_DAYS - 1), end_offset=0, allow_nonexistent_upstream_partitions=True)


def build_assets(config: GpuOpsConfig) -> tuple[list[dg.AssetsDefinition], dg.PartitionsDefinition]:
    partitions = dg.DailyPartitionsDefinition(start_date=config.usage.partitions_start.isoformat(), timezone="UTC")

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
            dg.AssetCheckSpec(
                "sources_complete", asset="gpu_usage",
                description="Every usage file pattern matched a file and every file could be read (ERROR: the day's cost would be short).",
            ),
        ],
    )
    def gpu_usage_asset(context: dg.AssetExecutionContext, gpu_ops: GpuOpsSettings) -> Iterator[Any]:
        from gpu_ops.cost.attribution import day_window, fleet_totals
        from gpu_ops.cost.pipeline import default_as_of, load_raw, price_window, usage_table
        from gpu_ops.cost.pricing import PriceMatrix
        from gpu_ops.cost.usage import file_problems
        from gpu_ops.storage.tables import TableStore

        cfg = gpu_ops.load()
        day = dt.date.fromisoformat(context.partition_key)
        start, end = day_window(day)
        as_of = default_as_of(day)
        sources = SourceSet.from_config(cfg)
        store = TableStore.from_config(cfg)
        raw, inventory = load_raw(sources, store)
        priced = price_window(raw, inventory, PriceMatrix.from_table(cfg.prices), start, end, as_of, dedupe=sources.count > 1)
        table = usage_table(priced.rows)
        totals = fleet_totals(table)
        q = priced.quarantine
        selected = {k.to_user_string() for k in context.selected_asset_keys}
        if "gpu_usage" in selected:
            yield dg.Output(
                table,
                output_name="gpu_usage",
                metadata={
                    "as_of": as_of.isoformat(),
                    "intervals": int((table["kind"] != "idle").sum()) if len(table) else 0,
                    "gpu_hours": round(totals["gpu_hours"], 4),
                    "allocated_cost_usd": round(totals["allocated_cost_usd"], 2),
                    "idle_cost_usd": round(totals["idle_cost_usd"], 2),
                    "fleet_cost_usd": round(totals["fleet_cost_usd"], 2) if totals["fleet_cost_usd"] is not None else "unknown (no inventory)",
                    "quarantined_rows": len(q),
                },
            )
        if "gpu_usage_quarantine" in selected:
            yield dg.Output(q, output_name="gpu_usage_quarantine", metadata={"quarantined_rows": len(q), "preview": dg.MetadataValue.md(_md_table(q[["location", "row", "reason"]]))})
        checks = {k.name for k in context.selected_asset_check_keys}
        if "quarantine_empty" in checks:
            yield dg.AssetCheckResult(
                asset_key="gpu_usage",
                check_name="quarantine_empty",
                passed=q.empty,
                severity=dg.AssetCheckSeverity.WARN,
                description=None if q.empty else f"{len(q)} row(s) quarantined; see table gpu_usage_quarantine",
                metadata={"quarantined_rows": len(q), "reasons": dg.MetadataValue.md(_md_table(q[["location", "row", "reason"]]))},
            )
        if "sources_complete" in checks:
            unread = file_problems(q)
            yield dg.AssetCheckResult(
                asset_key="gpu_usage",
                check_name="sources_complete",
                passed=unread.empty,
                severity=dg.AssetCheckSeverity.ERROR,
                description=None if unread.empty else "; ".join(f"{r.location}: {r.reason}" for r in unread.itertuples(index=False)),
                metadata={"unread_sources": len(unread), "problems": dg.MetadataValue.md(_md_table(unread[["location", "reason"]] if len(unread) else unread))},
            )

    @dg.multi_asset(
        name="gpu_cost_attribution",
        partitions_def=partitions,
        ins={"gpu_usage": dg.AssetIn(dagster_type=DATAFRAME_TYPE, metadata={COLUMNS: attribution_input_columns(config.usage.group_by)})},
        outs={
            "gpu_cost_attribution": dg.AssetOut(
                io_manager_key=IO, group_name=GROUP, dagster_type=DATAFRAME_TYPE,
                description="Cost per grouping key (usage.group_by) for the UTC day; idle fleet cost as __idle__ or shared.",
            ),
            "gpu_cost_daily": dg.AssetOut(
                io_manager_key=IO, group_name=GROUP, dagster_type=DATAFRAME_TYPE,
                description="Cost per UTC day, kind and budget scope keys (team, project, namespace, cost_center, scoped labels): "
                "what budget periods are summed from. A day without usage keeps one row of kind 'none'.",
            ),
        },
        check_specs=[dg.AssetCheckSpec("conservation", asset="gpu_cost_attribution", description="Attributed cost equals fleet cost (plus usage on nodes outside the inventory); no node over-allocated.")],
    )
    def gpu_cost_attribution(context: dg.AssetExecutionContext, gpu_ops: GpuOpsSettings, gpu_usage) -> Iterator[Any]:  # type: ignore[no-untyped-def]
        from gpu_ops.cost.attribution import attribute, conservation
        from gpu_ops.cost.budgets import daily_costs, scope_label_keys

        cfg = gpu_ops.load()
        day = dt.date.fromisoformat(context.partition_key)
        result = attribute(gpu_usage, cfg.usage.group_by, cfg.usage.idle)
        daily = daily_costs(gpu_usage, [day], scope_label_keys(cfg.budgets))
        t = result.totals
        ok, message = conservation(result.table, t)
        yield dg.Output(
            result.table,
            output_name="gpu_cost_attribution",
            metadata={
                "total_cost_usd": round(t["attributed_cost_usd"], 2),
                "gpu_hours": round(t["gpu_hours"], 4),
                "idle_cost_usd": round(t["idle_cost_usd"], 2),
                "fleet_cost_usd": round(t["fleet_cost_usd"], 2) if t["fleet_cost_usd"] is not None else "unknown (no inventory)",
                "savings_usd": round(float(result.table["savings_usd"].sum()), 2),
                "groups": t["groups"],
                "top_teams": dg.MetadataValue.md(_md_table(_top_teams(result.table))),
            },
        )
        yield dg.Output(daily, output_name="gpu_cost_daily", metadata={"cost_usd": round(float(daily["cost_usd"].sum()), 2), "scope_rows": len(daily)})
        yield dg.AssetCheckResult(
            asset_key="gpu_cost_attribution",
            check_name="conservation",
            passed=ok,
            severity=dg.AssetCheckSeverity.ERROR,
            description=message,
            metadata={
                "attributed_cost_usd": round(t["attributed_cost_usd"], 2),
                "off_fleet_cost_usd": round(t["off_fleet_cost_usd"], 2),
                **({"fleet_cost_usd": round(t["fleet_cost_usd"], 2)} if t["fleet_cost_usd"] is not None else {}),
                "over_allocated_nodes": ", ".join(t["over_allocated_nodes"]) or "none",
            },
        )

    @dg.asset(
        partitions_def=partitions, io_manager_key=IO, group_name=GROUP,
        description="Each budget's period to date: spend, forecast, status and thresholds crossed (read by the budget alert sensor); "
        "days_missing counts days of the period without gpu_cost_daily.",
        ins={"gpu_cost_daily": dg.AssetIn(partition_mapping=_budget_window(), dagster_type=DATAFRAME_TYPE)},
        check_specs=[
            dg.AssetCheckSpec("budgets_within_limit", asset="gpu_budget_status", description="WARN when a budget is at warning, ERROR when one is exceeded."),
            dg.AssetCheckSpec("period_days_present", asset="gpu_budget_status", description="WARN when days of a budget period have no gpu_cost_daily partition (their spend is unknown, not zero)."),
        ],
    )
    def gpu_budget_status(context: dg.AssetExecutionContext, gpu_ops: GpuOpsSettings, gpu_cost_daily) -> Iterator[Any]:  # type: ignore[no-untyped-def]
        from gpu_ops.cost.budgets import check_outcome, evaluate_budgets, missing_days_outcome
        from gpu_ops.cost.pipeline import default_as_of

        cfg = gpu_ops.load()
        day = dt.date.fromisoformat(context.partition_key)
        as_of = default_as_of(day)
        daily = gpu_cost_daily.drop(columns=["partition_key"], errors="ignore")
        status = evaluate_budgets(cfg.budgets, daily, day, as_of, cfg.usage.idle, expected_from=cfg.usage.partitions_start)
        view = status[["budget", "spend_usd", "amount_usd", "percent_used", "forecast_usd", "status", "thresholds_crossed", "days_missing"]]
        counts = {"exceeded": int((status["status"] == "exceeded").sum()), "warning": int((status["status"] == "warning").sum())}
        yield dg.Output(
            status if len(status) else None,
            metadata={"budgets": len(status), **counts, "days_missing": int(status["days_missing"].max()) if len(status) else 0, "status": dg.MetadataValue.md(_md_table(view, 50))},
        )
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

    @dg.asset(
        partitions_def=partitions, io_manager_key=IO, group_name=GROUP,
        description="Measured spot, reserved and sharing savings, preemption and idle waste, with recommendations, per team.",
        ins={"gpu_usage": dg.AssetIn(dagster_type=DATAFRAME_TYPE, metadata={COLUMNS: list(ROI_INPUT_COLUMNS)})},
        dagster_type=DATAFRAME_TYPE,  # the output: a pandas DataFrame
    )
    def gpu_roi_report(context: dg.AssetExecutionContext, gpu_usage) -> dg.Output:  # type: ignore[no-untyped-def]
        import pandas as pd

        from gpu_ops.cost.roi import TOTAL, roi_report

        report = roi_report(gpu_usage)
        total = report[report["team"] == TOTAL].iloc[0]
        recs = sorted((r for rs in report["recommendations"] for r in rs), key=lambda r: -r["impact_usd"])
        return dg.Output(
            report,
            metadata={
                "cost_usd": round(float(total["cost_usd"]), 2),
                "spot_savings_usd": round(float(total["spot_savings_usd"]), 2),
                "sharing_savings_usd": round(float(total["sharing_savings_usd"]), 2),
                "preemption_waste_usd": round(float(total["preemption_waste_usd"]), 2),
                "net_spot_savings_usd": round(float(total["net_spot_savings_usd"]), 2),
                "idle_waste_usd": round(float(total["idle_waste_usd"]), 2),
                "recommendations": dg.MetadataValue.md(_md_table(pd.DataFrame([{"impact_usd": r["impact_usd"], "kind": r["kind"], "detail": r["detail"]} for r in recs]))),
            },
        )

    return [gpu_usage_asset, gpu_cost_attribution, gpu_budget_status, gpu_roi_report], partitions


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
        from gpu_ops.cost.pipeline import collect
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

