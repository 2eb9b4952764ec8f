"""Grafana dashboards generated from code (grafanalib), over the exporter's metrics only.

Each dashboard is a list of :class:`PanelSpec` (title, what it shows in words, PromQL
queries); :func:`build` turns them into grafanalib objects and JSON. The chart ships the
JSON (``helm/gpu-ops/dashboards/*.json``) in a ConfigMap with the Grafana dashboard
sidecar's label; regenerate after a change with::

    python -m gpu_ops.cli.dashboards

which also copies the rule file into the chart. A test holds every query to the metric
catalog (:data:`gpu_ops.domain.metrics.CATALOG`) and runs it against a real
Prometheus scraping the exporter.

Queries use ``$team`` (a multi-value variable over the ``team`` label) and the data source
variable ``$datasource``; nothing else needs Grafana to be evaluated.
"""

from __future__ import annotations

import json
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

RULES_FILE = Path(__file__).parent / "rules" / "gpu_ops.rules.yml"
DATASOURCE = "${datasource}"
TEAM = 'team=~"$team"'
# Metrics Prometheus itself makes (the alerting rules' state), which panels may also query.
PROMETHEUS_METRICS = {"ALERTS"}


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str = ""
    instant: bool = False


@dataclass(frozen=True)
class PanelSpec:
    kind: str  # stat | timeseries | bargauge | table
    title: str
    description: str
    queries: tuple[Query, ...]
    unit: str = "currencyUSD"
    width: int = 12
    thresholds: tuple[tuple[str, float | None], ...] = ()
    # Needs DCGM measurements in the cost tables (usage.utilization): no data without them.
    needs_dcgm: bool = False


@dataclass(frozen=True)
class DashboardSpec:
    uid: str
    title: str
    description: str
    panels: tuple[PanelSpec, ...]
    team_variable: bool = False
    tags: tuple[str, ...] = field(default=("gpu-ops",))


def _p(kind: str, title: str, description: str, *queries: Query, **kw: Any) -> PanelSpec:
    return PanelSpec(kind, title, description, tuple(queries), **kw)


Q = Query
BUDGET_THRESHOLDS = (("green", None), ("orange", 0.8), ("red", 1.0))

DASHBOARDS: tuple[DashboardSpec, ...] = (
    DashboardSpec(
        "gpu-ops-cost-overview", "GPU cost overview", "Spend of the newest day and of the month, idle cost, hardware mix and how fresh the figures are.",
        (
            _p("stat", "Spend, newest day", "All GPU cost of the newest materialized day (allocated and idle).", Q('sum(gpu_ops_cost_usd{window="day"})'), width=6),
            _p("stat", "Spend, month to date", "All GPU cost of the calendar month up to the newest day.", Q('sum(gpu_ops_cost_usd{window="month"})'), width=6),
            _p("stat", "Idle cost, month to date", "Cost of fleet GPU capacity no workload held (idle rows of the daily table).",
               Q('sum(gpu_ops_cost_usd{window="month",kind="idle"})'), width=6),
            _p("stat", "GPU-hours, month to date", "Physical GPU-hours of the month, allocated and idle.", Q('sum(gpu_ops_gpu_seconds{window="month"}) / 3600'), unit="short", width=6),
            _p("timeseries", "Month-to-date spend by team", "Each team's month-to-date spend as the exporter saw it over time (steps once a day).",
               Q('sum by (team) (gpu_ops_cost_usd{window="month"})', "{{team}}")),
            _p("bargauge", "Newest day by GPU type and capacity", "The newest day's cost per GPU type and capacity type (spot, on-demand, reserved).",
               Q("sum by (gpu_type, capacity_type) (gpu_ops_hardware_cost_usd)", "{{gpu_type}} {{capacity_type}}", instant=True)),
            _p("stat", "Age of the cost data", "Seconds since the start of the newest daily partition; about a day is normal, past two days the stale-data alert fires.",
               Q('time() - max(gpu_ops_cost_partition_timestamp_seconds{table="gpu_cost_daily"})'), unit="s", width=8,
               thresholds=(("green", None), ("orange", 129600.0), ("red", 194400.0))),
            _p("stat", "Quarantined usage rows, newest day", "Usage rows set aside as invalid (table gpu_usage_quarantine): their cost is not in any figure here.",
               Q("sum(gpu_ops_usage_quarantined_rows)"), unit="short", width=8, thresholds=(("green", None), ("orange", 1.0))),
            _p("stat", "Exporter reads failing", "Sources the exporter could not read on its last scrape (0 is healthy).",
               Q("count(gpu_ops_exporter_read_ok == 0) or vector(0)"), unit="short", width=8, thresholds=(("green", None), ("red", 1.0))),
        ),
    ),
    DashboardSpec(
        "gpu-ops-attribution", "GPU cost attribution", "Who spent what: by team, project, namespace and cost center, and on which hardware.",
        (
            _p("table", "Month to date by team and project", "Allocated cost per team and project this month.",
               Q(f'sum by (team, project) (gpu_ops_cost_usd{{window="month",kind="allocated",{TEAM}}})', instant=True)),
            _p("bargauge", "Month to date by namespace", "Allocated cost per Kubernetes namespace this month.",
               Q(f'sum by (namespace) (gpu_ops_cost_usd{{window="month",kind="allocated",{TEAM}}})', "{{namespace}}", instant=True)),
            _p("bargauge", "Month to date by cost center", "Allocated cost per cost center this month.",
               Q(f'sum by (cost_center) (gpu_ops_cost_usd{{window="month",kind="allocated",{TEAM}}})', "{{cost_center}}", instant=True)),
            _p("bargauge", "GPU-hours by team, month to date", "Physical GPU-hours each team held this month.",
               Q(f'sum by (team) (gpu_ops_gpu_seconds{{window="month",kind="allocated",{TEAM}}}) / 3600', "{{team}}", instant=True), unit="short"),
            _p("timeseries", "Newest day by team", "Each team's cost of the newest day.", Q(f'sum by (team) (gpu_ops_cost_usd{{window="day",kind="allocated",{TEAM}}})', "{{team}}")),
            _p("table", "Newest day by team and hardware", "The newest day's allocated cost per team, GPU type and capacity type.",
               Q(f'sum by (team, gpu_type, capacity_type) (gpu_ops_hardware_cost_usd{{kind="allocated",{TEAM}}})', instant=True)),
        ),
        team_variable=True,
    ),
    DashboardSpec(
        "gpu-ops-savings", "GPU savings and waste", "Measured savings against on-demand prices (spot, reserved, sharing), preemption waste and idle capacity.",
        (
            _p("stat", "Savings, month to date", "Spot, reserved and sharing savings measured against on-demand prices.", Q('sum(gpu_ops_savings_usd{window="month"})'), width=6),
            _p("stat", "Preemption waste, month to date", "Cost of the work spot preemptions threw away.", Q('sum(gpu_ops_preemption_waste_usd{window="month"})'), width=6),
            _p("stat", "Net spot savings, month to date", "Spot savings minus preemption waste: what spot really saved.",
               Q('sum(gpu_ops_savings_usd{window="month",source="spot"}) - sum(gpu_ops_preemption_waste_usd{window="month"})'), width=6),
            _p("stat", "Idle cost, month to date", "Fleet capacity nobody held.", Q('sum(gpu_ops_cost_usd{window="month",kind="idle"})'), width=6),
            _p("bargauge", "Savings by source", "Month-to-date savings per source: spot, reserved, sharing (MIG, MPS, time-slicing).",
               Q('sum by (source) (gpu_ops_savings_usd{window="month"})', "{{source}}", instant=True)),
            _p("table", "Savings by team and source", "Month-to-date savings per team and source.", Q('sum by (team, source) (gpu_ops_savings_usd{window="month"})', instant=True)),
            _p("timeseries", "Spend against its on-demand equivalent", "Month-to-date spend and what the same GPU time would have cost on demand.",
               Q('sum(gpu_ops_cost_usd{window="month"})', "spend"), Q('sum(gpu_ops_on_demand_equivalent_usd{window="month"})', "on-demand equivalent")),
            _p("bargauge", "Idle cost of the newest day by GPU type", "Idle capacity cost per GPU type and capacity type, newest day.",
               Q('sum by (gpu_type, capacity_type) (gpu_ops_hardware_cost_usd{kind="idle"})', "{{gpu_type}} {{capacity_type}}", instant=True)),
        ),
    ),
    DashboardSpec(
        "gpu-ops-budgets", "GPU budgets and alerts", "Each budget's spend against its amount and thresholds, the forecast, and the alerts sent.",
        (
            _p("bargauge", "Budget used", "Spend over amount per budget; orange from 80 %, red from 100 %.",
               Q("gpu_ops_budget_used_ratio", "{{budget}}", instant=True), unit="percentunit", thresholds=BUDGET_THRESHOLDS),
            _p("stat", "Budgets exceeded", "Budgets whose status is exceeded.", Q('sum(gpu_ops_budget_status{status="exceeded"})'), unit="short", width=6,
               thresholds=(("green", None), ("red", 1.0))),
            _p("stat", "Budgets at warning", "Budgets whose status is warning.", Q('sum(gpu_ops_budget_status{status="warning"})'), unit="short", width=6,
               thresholds=(("green", None), ("orange", 1.0))),
            _p("table", "Spend, amount and forecast", "Per budget: the period's spend, its amount and the forecast at the period's end.",
               Q("gpu_ops_budget_spend_usd", instant=True), Q("gpu_ops_budget_amount_usd", instant=True), Q("gpu_ops_budget_forecast_usd", instant=True)),
            _p("timeseries", "Spend against amount", "Each budget's spend over time with its amount as a line.",
               Q("gpu_ops_budget_spend_usd", "{{budget}} spend"), Q("gpu_ops_budget_amount_usd", "{{budget}} amount")),
            _p("bargauge", "Thresholds crossed", "How many of each budget's thresholds its spend or forecast has crossed.",
               Q("gpu_ops_budget_thresholds_crossed", "{{budget}}", instant=True), unit="short"),
            _p("table", "Budget alerts firing (Prometheus rules)", "The shipped alerting rules' alerts about budgets, as Alertmanager receives them.",
               Q('ALERTS{alertname=~"GpuOpsBudget.*"}', instant=True), unit="short"),
            _p("table", "Alert deliveries", "Alert notifications sent by the budget sensor, per budget, channel and outcome (all time).",
               Q("sum by (budget, channel, status) (gpu_ops_alert_deliveries_total)", instant=True), unit="short"),
            _p("timeseries", "Alert deliveries per hour", "Notifications sent per hour, by outcome.",
               Q("sum by (status) (increase(gpu_ops_alert_deliveries_total[1h]))", "{{status}}"), unit="short"),
            _p("stat", "Dead-lettered alerts", "Alerts the sensor gave up on after alerts.max_pending_s (see table gpu_alert_dead_letters).",
               Q("sum(gpu_ops_alert_dead_letters_total)"), unit="short", width=6, thresholds=(("green", None), ("red", 1.0))),
            _p("bargauge", "Training spend since the newest partition", "What budget_alert_sensor adds to each team's budgets before the day's partition lands: "
               "attempts settled since and attempts running now, at their price.",
               Q("sum by (team, state) (gpu_ops_intraday_cost_usd)", "{{team}} {{state}}", instant=True)),
            _p("table", "Launch estimates", "The expected cost of each training asset's newest launch (median run and p90), and what the estimate came from.",
               Q("gpu_ops_launch_estimate_usd", instant=True), Q("gpu_ops_launch_estimate_p90_usd", instant=True)),
            _p("bargauge", "Spend anomaly score, newest day", "Robust score of the newest day's spend of each team, project and asset against its trailing days; "
               "the asset check warns from alerts.anomalies.check_score (3.5), the channels hear from alert_score (6).",
               Q("topk(10, gpu_ops_spend_anomaly_score)", "{{dimension}} {{key}}", instant=True), unit="short",
               thresholds=(("green", None), ("orange", 3.5), ("red", 6.0))),
        ),
    ),
    DashboardSpec(
        "gpu-ops-training", "GPU training reliability", "Attempts, preemptions, recovery time and lost work of training assets, and GPU quota leases.",
        (
            _p("timeseries", "Attempts per hour by outcome", "Training attempts settled per hour: completed, preempted, failed ...",
               Q("sum by (outcome) (increase(gpu_ops_training_attempts_total[1h]))", "{{outcome}}"), unit="short"),
            _p("stat", "Preemptions", "Attempts that ended in a preemption (all time).", Q("sum(gpu_ops_training_preemptions_total)"), unit="short", width=6),
            _p("stat", "Mean recovery time", "From a preempted attempt's end to the resuming attempt's start.",
               Q("sum(gpu_ops_training_recovery_seconds_total) / sum(gpu_ops_training_recoveries_total)"), unit="s", width=6),
            _p("bargauge", "Lost GPU-hours by asset", "GPU-hours of work lost after the last checkpoint of failed attempts.",
               Q("sum by (asset_key) (gpu_ops_training_lost_gpu_seconds_total) / 3600", "{{asset_key}}", instant=True), unit="short"),
            _p("bargauge", "Preempted share of attempts by asset", "Preemptions over attempts per training asset.",
               Q("sum by (asset_key) (gpu_ops_training_preemptions_total) / sum by (asset_key) (gpu_ops_training_attempts_total)", "{{asset_key}}", instant=True),
               unit="percentunit"),
            _p("table", "Training GPU-hours by asset and capacity", "GPU-hours training attempts ran, per asset, GPU type and capacity type.",
               Q("sum by (asset_key, gpu_type, capacity_type) (gpu_ops_training_gpu_seconds_total) / 3600", instant=True), unit="short"),
            _p("bargauge", "Preemption waste by team, month to date", "Cost of work lost to preemptions.",
               Q('sum by (team) (gpu_ops_preemption_waste_usd{window="month"})', "{{team}}", instant=True)),
            _p("timeseries", "GPUs held against quota", "GPUs held by live leases and each quota's limit (compute.quotas).",
               Q("gpu_ops_quota_gpus_held", "{{scope}} {{name}} held"), Q("gpu_ops_quota_gpus_limit", "{{scope}} {{name}} limit"), unit="short"),
            _p("table", "Leases by team and state", "Lease rows per team: live, or expired (a holder that stopped renewing).",
               Q("sum by (team, state) (gpu_ops_quota_leases)", instant=True), unit="short"),
        ),
    ),
    DashboardSpec(
        "gpu-ops-efficiency", "GPU efficiency and cost", "DCGM-measured efficiency (usage.utilization) beside what the same GPUs cost.",
        (
            _p("bargauge", "Efficiency by team, newest day", "DCGM-measured busy share of the metered GPU time (needs usage.utilization).",
               Q("gpu_ops_efficiency_ratio", "{{team}} {{project}}", instant=True), unit="percentunit", needs_dcgm=True,
               thresholds=(("red", None), ("orange", 0.3), ("green", 0.6))),
            _p("bargauge", "Unused cost by team, newest day", "Cost of metered GPU time DCGM measured idle.",
               Q("sum by (team) (gpu_ops_unused_cost_usd)", "{{team}}", instant=True), needs_dcgm=True),
            _p("timeseries", "Active against allocated GPU-hours", "DCGM-busy GPU-hours beside the GPU-hours held, newest day.",
               Q("sum by (team) (gpu_ops_active_gpu_seconds) / 3600", "{{team}} active"), unit="short", needs_dcgm=True),
            _p("timeseries", "Allocated GPU-hours, newest day", "GPU-hours each team held on the newest day.",
               Q('sum by (team) (gpu_ops_gpu_seconds{window="day",kind="allocated"}) / 3600', "{{team}}"), unit="short"),
            _p("bargauge", "Cost by team, newest day", "The same day's allocated cost, to read beside the efficiency.",
               Q('sum by (team) (gpu_ops_cost_usd{window="day",kind="allocated"})', "{{team}}", instant=True)),
        ),
    ),
)


def _grafanalib_panel(spec: PanelSpec, x: int, y: int) -> Any:
    from grafanalib import core as g

    targets = [
        g.Target(expr=q.expr, legendFormat=q.legend, refId=chr(ord("A") + i), instant=q.instant, format="table" if spec.kind == "table" else "time_series", datasource=DATASOURCE)
        for i, q in enumerate(spec.queries)
    ]
    steps = [g.Threshold(color, i, 0.0 if value is None else value) for i, (color, value) in enumerate(spec.thresholds or (("green", None),))]
    common: dict[str, Any] = {
        "title": spec.title, "description": spec.description, "dataSource": DATASOURCE, "targets": targets,
        "gridPos": g.GridPos(h=8, w=spec.width, x=x, y=y),
    }
    if spec.kind == "stat":
        return g.Stat(**common, format=spec.unit, reduceCalc="lastNotNull", thresholdType="absolute", thresholds=steps)
    if spec.kind == "bargauge":
        return g.BarGauge(**common, format=spec.unit, calc="lastNotNull", displayMode="gradient", orientation="horizontal",
                          max=1 if spec.unit == "percentunit" else None,
                          thresholds=[{"color": c, "value": v} for c, v in (spec.thresholds or (("green", None),))])
    if spec.kind == "table":
        return g.Table(**common, unit=spec.unit, transformations=[{"id": "merge", "options": {}}])
    return g.TimeSeries(**common, unit=spec.unit, legendDisplayMode="table", legendPlacement="bottom")


def build(spec: DashboardSpec) -> Any:
    """The grafanalib Dashboard of a spec (panels laid out left to right, 24 columns a row)."""
    from grafanalib import core as g

    panels, x, y = [], 0, 0
    for p in spec.panels:
        if x + p.width > 24:
            x, y = 0, y + 8
        panels.append(_grafanalib_panel(p, x, y))
        x += p.width
    variables = [g.Template(name="datasource", label="Data source", query="prometheus", type="datasource", default="Prometheus")]
    if spec.team_variable:
        variables.append(g.Template(
            name="team", label="Team", query="label_values(gpu_ops_cost_usd, team)", dataSource=DATASOURCE,
            includeAll=True, multi=True, allValue=".*", default="All", refresh=2,
        ))
    return g.Dashboard(
        title=spec.title, uid=spec.uid, description=spec.description, tags=list(spec.tags), panels=panels,
        templating=g.Templating(list=variables), time=g.Time("now-30d", "now"), timezone="utc", refresh="5m",
    ).auto_panel_ids()


def _encode(obj: Any) -> Any:
    return obj.to_json_data()  # grafanalib objects nest; json calls this for each one


def to_json(spec: DashboardSpec) -> str:
    return json.dumps(build(spec).to_json_data(), default=_encode, indent=2, sort_keys=True) + "\n"


def panel_queries(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel title, PromQL) of every panel of a dashboard's JSON."""
    return [(p["title"], t["expr"]) for p in dashboard.get("panels", []) for t in p.get("targets", [])]


def write(folder: Path) -> list[Path]:
    """Write every dashboard as ``<uid>.json`` into ``folder`` and the rule file beside it."""
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for spec in DASHBOARDS:
        path = folder / f"{spec.uid}.json"
        path.write_text(to_json(spec))
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> None:
    """``python -m gpu_ops.cli.dashboards [CHART_DIR]``: regenerate the chart's dashboards and rules."""
    args = sys.argv[1:] if argv is None else argv
    chart = Path(args[0]) if args else Path(__file__).resolve().parents[2] / "helm" / "gpu-ops"
    for path in write(chart / "dashboards"):
        print(f"wrote {path}")
    (chart / "rules").mkdir(exist_ok=True)
    shutil.copyfile(RULES_FILE, chart / "rules" / RULES_FILE.name)
    print(f"copied {RULES_FILE.name} to {chart / 'rules'}")


if __name__ == "__main__":
    main()


def panels_markdown() -> str:
    """Each dashboard and each of its panels in words, for docs/how-to/observability.md."""
    out = []
    for d in DASHBOARDS:
        out += [f"### {d.title} (`{d.uid}`)", "", d.description, ""]
        for p in d.panels:
            queries = "; ".join(f"`{q.expr}`" for q in p.queries)
            out.append(f"- **{p.title}** ({p.kind}): {p.description} Query: {queries}.")
        out.append("")
    return "\n".join(out)
