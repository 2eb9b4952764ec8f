"""The Prometheus metric catalog (:data:`CATALOG`) and pure functions from table rows to
metric families. No I/O, no third-party imports.

Design: docs/concepts/observability.md#the-metric-catalog
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

GAUGE, COUNTER = "gauge", "counter"
COST_KEYS = ("team", "project", "namespace", "cost_center")
WINDOWS = ("day", "month")
BUDGET_STATES = ("ok", "warning", "exceeded")
SAVINGS_KINDS = {"spot": "spot_savings_usd", "reserved": "reserved_savings_usd", "sharing": "sharing_savings_usd"}
FRESHNESS_TABLES = ("gpu_usage", "gpu_cost_attribution", "gpu_cost_daily", "gpu_budget_status", "gpu_roi_report")


@dataclass(frozen=True)
class MetricDef:
    """One metric: ``name`` is the sample name as exposed (counters end in ``_total``)."""

    name: str
    kind: str
    unit: str
    labels: tuple[str, ...]
    source: str
    help: str
    # Where the labels are the source table's own grouping keys, known only once it is
    # read (``labels`` is then the default grain): what the reference says instead.
    grain: str = ""

    @property
    def family(self) -> str:
        """The family name (a counter's samples add ``_total`` to it)."""
        return self.name[: -len("_total")] if self.kind == COUNTER else self.name


def _m(name: str, kind: str, unit: str, labels: Sequence[str], source: str, help_: str, grain: str = "") -> MetricDef:
    return MetricDef(name, kind, unit, tuple(labels), source, help_, grain)


_COST = ("window", "kind", *COST_KEYS)
_HW = ("kind", "team", "gpu_type", "capacity_type")
_ATTEMPT = ("asset_key", "team", "gpu_type", "capacity_type")
_ESTIMATE = ("asset_key", "capacity", "basis")  # gpu_launch_estimates' keys
_ANOMALY = ("dimension", "key")  # gpu_spend_anomalies' keys
# gpu_cost_attribution's grouping keys: usage.group_by (team, project by default).
_GROUP_BY = ("team", "project")
_BY_GROUP = "the table's grouping keys (`usage.group_by`; `team`, `project` by default)"
BUDGET_SEVERITIES = ("none", "info", "warning", "critical")  # gpu_ops.flows.cost.budgets.SEVERITIES

CATALOG: dict[str, MetricDef] = {
    m.name: m
    for m in (
        # cost (gpu_cost_daily: the grain budgets are summed from)
        _m("gpu_ops_cost_usd", GAUGE, "USD", _COST, "gpu_cost_daily",
           "GPU cost of the window per budget-scope key; kind is allocated, idle (fleet capacity nobody held) or none."),
        _m("gpu_ops_gpu_seconds", GAUGE, "seconds", _COST, "gpu_cost_daily",
           "Physical GPU-seconds of the window (gpu_count x gpu_share x seconds); divide by 3600 for GPU-hours."),
        _m("gpu_ops_on_demand_equivalent_usd", GAUGE, "USD", _COST, "gpu_cost_daily",
           "What the window's GPU time would have cost at on-demand prices."),
        # cost by hardware (gpu_usage, newest partition, aggregated in the database)
        _m("gpu_ops_hardware_cost_usd", GAUGE, "USD", _HW, "gpu_usage",
           "Cost of the newest day per GPU type and capacity type (spot, on-demand, reserved)."),
        _m("gpu_ops_hardware_gpu_seconds", GAUGE, "seconds", _HW, "gpu_usage",
           "Physical GPU-seconds of the newest day per GPU type and capacity type."),
        _m("gpu_ops_pod_cost_usd", GAUGE, "USD", ("namespace", "pod", "gpu_type", "capacity_type"), "gpu_usage",
           "Cost of the newest day per pod (only with `gpu-ops exporter --per-pod`: pod names are unbounded)."),
        _m("gpu_ops_pod_gpu_seconds", GAUGE, "seconds", ("namespace", "pod", "gpu_type", "capacity_type"), "gpu_usage",
           "GPU-seconds of the newest day per pod (only with --per-pod)."),
        # savings and waste (gpu_roi_report)
        _m("gpu_ops_savings_usd", GAUGE, "USD", ("window", "team", "source"), "gpu_roi_report",
           "Measured savings against on-demand prices; source is spot, reserved or sharing (MIG, MPS, time-slicing)."),
        _m("gpu_ops_preemption_waste_usd", GAUGE, "USD", ("window", "team"), "gpu_roi_report",
           "Cost of the work spot preemptions threw away (GPU time after the last checkpoint)."),
        _m("gpu_ops_preemption_lost_gpu_seconds", GAUGE, "seconds", ("window", "team"), "gpu_roi_report",
           "GPU-seconds of work lost to preemptions."),
        # efficiency (gpu_cost_attribution: DCGM measurements, when usage.utilization is set)
        _m("gpu_ops_efficiency_ratio", GAUGE, "ratio", _GROUP_BY, "gpu_cost_attribution",
           "DCGM-measured active share of the metered GPU time of the newest day (0-1); absent without measurements.", _BY_GROUP),
        _m("gpu_ops_active_gpu_seconds", GAUGE, "seconds", _GROUP_BY, "gpu_cost_attribution",
           "DCGM-measured busy GPU-seconds of the newest day.", _BY_GROUP),
        _m("gpu_ops_unused_cost_usd", GAUGE, "USD", _GROUP_BY, "gpu_cost_attribution",
           "Cost of the metered GPU time that DCGM measured idle, newest day.", _BY_GROUP),
        # budgets (gpu_budget_status, newest partition)
        _m("gpu_ops_budget_amount_usd", GAUGE, "USD", ("budget", "period"), "gpu_budget_status", "The budget's amount for its period."),
        _m("gpu_ops_budget_spend_usd", GAUGE, "USD", ("budget", "period"), "gpu_budget_status", "Spend of the budget's period to date."),
        _m("gpu_ops_budget_used_ratio", GAUGE, "ratio", ("budget", "period"), "gpu_budget_status",
           "Spend over amount (percent_used / 100): 1 is the whole budget."),
        _m("gpu_ops_budget_forecast_usd", GAUGE, "USD", ("budget", "period"), "gpu_budget_status",
           "Forecast spend at the period's end (absent while the period has too little history)."),
        _m("gpu_ops_budget_status", GAUGE, "", ("budget", "period", "status"), "gpu_budget_status",
           "1 for the budget's current status (ok, warning, exceeded), 0 for the others."),
        _m("gpu_ops_budget_thresholds_crossed", GAUGE, "", ("budget", "period"), "gpu_budget_status", "How many of the budget's thresholds are crossed."),
        _m("gpu_ops_budget_severity", GAUGE, "", ("budget", "period", "severity"), "gpu_budget_status",
           "1 for the highest severity of the thresholds the budget crossed (none, info, warning, critical; critical once spend reaches the amount), 0 for the others."),
        _m("gpu_ops_budget_days_missing", GAUGE, "", ("budget", "period"), "gpu_budget_status",
           "Days of the period without daily costs (their spend is unknown, not zero)."),
        # alerts
        _m("gpu_ops_alert_deliveries_total", COUNTER, "", ("budget", "channel", "channel_type", "status"), "gpu_alert_deliveries",
           "Alert delivery attempts per channel; status is delivered or failed."),
        _m("gpu_ops_alert_dead_letters_total", COUNTER, "", ("budget",), "gpu_alert_dead_letters",
           "Alerts given up on after alerts.max_pending_s (visible, never silently dropped)."),
        # training (gpu_usage_ledger)
        _m("gpu_ops_training_attempts_total", COUNTER, "", (*_ATTEMPT, "outcome"), "gpu_usage_ledger",
           "Training attempts settled, by outcome (completed, preempted, oom, ...)."),
        _m("gpu_ops_training_preemptions_total", COUNTER, "", _ATTEMPT, "gpu_usage_ledger", "Training attempts that ended in a preemption."),
        _m("gpu_ops_training_gpu_seconds_total", COUNTER, "seconds", _ATTEMPT, "gpu_usage_ledger", "GPU-seconds training attempts ran."),
        _m("gpu_ops_training_lost_gpu_seconds_total", COUNTER, "seconds", _ATTEMPT, "gpu_usage_ledger",
           "GPU-seconds of work failed attempts lost (after their last checkpoint)."),
        _m("gpu_ops_training_recoveries_total", COUNTER, "", ("asset_key", "team"), "gpu_usage_ledger",
           "Attempts that resumed a run after a preemption."),
        _m("gpu_ops_training_recovery_seconds_total", COUNTER, "seconds", ("asset_key", "team"), "gpu_usage_ledger",
           "Seconds from a preempted attempt's end to the next attempt's start, summed (divide by recoveries for the mean)."),
        # quota leases (gpu_ops_gpu_leases, compute.quotas)
        _m("gpu_ops_quota_gpus_held", GAUGE, "", ("scope", "name"), "gpu_ops_gpu_leases", "GPUs held by live leases against each quota (scope team or pool)."),
        _m("gpu_ops_quota_gpus_limit", GAUGE, "", ("scope", "name"), "compute.quotas", "Each quota's limit in GPUs."),
        _m("gpu_ops_quota_leases", GAUGE, "", ("team", "state"), "gpu_ops_gpu_leases",
           "Lease rows per team; state live, or expired (holder stopped renewing; reclaimed at the next admission)."),
        _m("gpu_ops_quota_waiting_attempts", GAUGE, "", ("team",), "gpu_ops_training_attempts",
           "Training attempts waiting for GPU quota admission (state planned, owner live)."),
        _m("gpu_ops_quota_waiting_gpus", GAUGE, "", ("team",), "gpu_ops_training_attempts", "GPUs the waiting attempts ask for."),
        # before and within the day (gpu_launch_estimates, gpu_usage_ledger, gpu_spend_anomalies)
        _m("gpu_ops_launch_estimate_usd", GAUGE, "USD", _ESTIMATE, "gpu_launch_estimates",
           "Expected cost of the newest launch of each training asset (median run; basis history, declared or no history)."),
        _m("gpu_ops_launch_estimate_p90_usd", GAUGE, "USD", _ESTIMATE, "gpu_launch_estimates", "p90 of the expected cost of the newest launch of each training asset."),
        _m("gpu_ops_intraday_cost_usd", GAUGE, "USD", ("team", "project", "asset_key", "state"), "gpu_usage_ledger",
           "Training cost after the newest gpu_budget_status partition, as budget_alert_sensor adds it: state settled (ledger) or running (attempt records, to now)."),
        _m("gpu_ops_spend_anomaly_score", GAUGE, "", _ANOMALY, "gpu_spend_anomalies",
           "Robust score of the newest day's spend of each team, project and training asset against its trailing days (dimension team, project or asset)."),
        _m("gpu_ops_spend_anomaly_baseline_usd", GAUGE, "USD", _ANOMALY, "gpu_spend_anomalies", "The usual spend the newest day is scored against (median by weekday, or of all days)."),
        # freshness and quarantine
        _m("gpu_ops_cost_partition_timestamp_seconds", GAUGE, "seconds", ("table",), "cost tables",
           "Start (UTC midnight, Unix time) of the newest materialized daily partition of each cost table."),
        _m("gpu_ops_usage_quarantined_rows", GAUGE, "", ("source", "field"), "gpu_usage_quarantine",
           "Usage rows of the newest day set aside as invalid, by source and field."),
        # the exporter itself
        _m("gpu_ops_exporter_read_ok", GAUGE, "", ("source",), "exporter", "1 when the last read of a source succeeded, 0 when it failed (see the exporter's log)."),
        _m("gpu_ops_exporter_read_seconds", GAUGE, "seconds", (), "exporter", "How long the last read of every table took."),
    )
}


@dataclass
class Family:
    """A metric's samples: label values in the order of ``metric.labels``."""

    metric: MetricDef
    samples: list[tuple[tuple[str, ...], float]] = field(default_factory=list)

    def add(self, labels: Mapping[str, Any], value: Any) -> None:
        v = _number(value)
        if v is None:  # a missing figure is absent, never a quiet zero
            return
        self.samples.append((tuple(_text(labels.get(k)) for k in self.metric.labels), v))

    def add_values(self, labels: tuple[str, ...], value: Any) -> None:
        """:meth:`add` with the label values already in ``metric.labels`` order, as text."""
        v = _number(value)
        if v is not None:
            self.samples.append((labels, v))


@dataclass
class Snapshot:
    """What the readers found, as plain rows (dicts). ``errors``: source -> reason."""

    newest: dict[str, str | None] = field(default_factory=dict)
    daily: list[dict[str, Any]] = field(default_factory=list)
    hardware: list[dict[str, Any]] = field(default_factory=list)
    pods: list[dict[str, Any]] | None = None
    roi: list[dict[str, Any]] = field(default_factory=list)
    efficiency: list[dict[str, Any]] = field(default_factory=list)
    budgets: list[dict[str, Any]] = field(default_factory=list)
    deliveries: list[dict[str, Any]] = field(default_factory=list)
    dead_letters: list[dict[str, Any]] = field(default_factory=list)
    attempts: list[dict[str, Any]] = field(default_factory=list)
    recoveries: list[dict[str, Any]] = field(default_factory=list)
    leases: list[dict[str, Any]] = field(default_factory=list)
    waiting: list[dict[str, Any]] = field(default_factory=list)
    quotas: dict[str, dict[str, int]] = field(default_factory=dict)
    quarantine: list[dict[str, Any]] = field(default_factory=list)
    estimates: list[dict[str, Any]] = field(default_factory=list)
    intraday: list[dict[str, Any]] = field(default_factory=list)
    anomalies: list[dict[str, Any]] = field(default_factory=list)
    # gpu_cost_attribution's grouping keys as read (the efficiency families' labels).
    efficiency_keys: tuple[str, ...] = _GROUP_BY
    sources: list[str] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)
    read_seconds: float | None = None


def _number(value: Any) -> float | None:
    if value is None or isinstance(value, str):
        return None
    v = float(value)
    return None if math.isnan(v) else v


def _text(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return str(value)


def month_start(partition_key: str) -> str:
    """The first day of the partition's calendar month (``2026-10-31`` -> ``2026-10-01``)."""
    return partition_key[:8] + "01"


def _windows(partition_key: Any, newest: str | None) -> Iterable[str]:
    """The windows a row of ``partition_key`` counts in: the month always, the day when it is the newest."""
    yield "month"
    if newest is not None and str(partition_key) == newest:
        yield "day"


def _summed(rows: Iterable[Mapping[str, Any]], keys: Sequence[str], values: Sequence[str], newest: str | None) -> dict[tuple, dict[str, float]]:
    """Rows of several partitions summed per (window, *keys)."""
    out: dict[tuple, dict[str, float]] = {}
    for r in rows:
        for w in _windows(r.get("partition_key"), newest):
            acc = out.setdefault((w, *(_text(r.get(k)) for k in keys)), {v: 0.0 for v in values})
            for v in values:
                x = _number(r.get(v))
                if x is not None:
                    acc[v] += x
    return out


def cost_families(s: Snapshot) -> list[Family]:
    cost, seconds, od = (Family(CATALOG[n]) for n in ("gpu_ops_cost_usd", "gpu_ops_gpu_seconds", "gpu_ops_on_demand_equivalent_usd"))
    keys = ("kind", *COST_KEYS)
    for (window, *key), acc in _summed(s.daily, keys, ("cost_usd", "gpu_hours", "on_demand_usd"), s.newest.get("gpu_cost_daily")).items():
        labels = {"window": window, **dict(zip(keys, key))}
        cost.add(labels, acc["cost_usd"])
        seconds.add(labels, acc["gpu_hours"] * 3600.0)
        od.add(labels, acc["on_demand_usd"])
    hw_cost, hw_seconds = Family(CATALOG["gpu_ops_hardware_cost_usd"]), Family(CATALOG["gpu_ops_hardware_gpu_seconds"])
    for r in s.hardware:
        hw_cost.add(r, r.get("cost_usd"))
        hw_seconds.add(r, None if _number(r.get("gpu_hours")) is None else float(r["gpu_hours"]) * 3600.0)
    out = [cost, seconds, od, hw_cost, hw_seconds]
    if s.pods is not None:
        pod_cost, pod_seconds = Family(CATALOG["gpu_ops_pod_cost_usd"]), Family(CATALOG["gpu_ops_pod_gpu_seconds"])
        for r in s.pods:
            pod_cost.add(r, r.get("cost_usd"))
            pod_seconds.add(r, None if _number(r.get("gpu_hours")) is None else float(r["gpu_hours"]) * 3600.0)
        out += [pod_cost, pod_seconds]
    return out


def roi_families(s: Snapshot) -> list[Family]:
    savings, waste, lost = (Family(CATALOG[n]) for n in ("gpu_ops_savings_usd", "gpu_ops_preemption_waste_usd", "gpu_ops_preemption_lost_gpu_seconds"))
    values = (*SAVINGS_KINDS.values(), "preemption_waste_usd", "preemption_lost_gpu_hours")
    for (window, team), acc in _summed(s.roi, ("team",), values, s.newest.get("gpu_roi_report")).items():
        for source, column in SAVINGS_KINDS.items():
            savings.add({"window": window, "team": team, "source": source}, acc[column])
        waste.add({"window": window, "team": team}, acc["preemption_waste_usd"])
        lost.add({"window": window, "team": team}, acc["preemption_lost_gpu_hours"] * 3600.0)
    ratio, active, unused = (
        Family(dataclasses.replace(CATALOG[n], labels=tuple(s.efficiency_keys))) for n in ("gpu_ops_efficiency_ratio", "gpu_ops_active_gpu_seconds", "gpu_ops_unused_cost_usd")
    )
    for r in s.efficiency:
        ratio.add(r, r.get("efficiency"))
        active.add(r, None if _number(r.get("active_gpu_hours")) is None else float(r["active_gpu_hours"]) * 3600.0)
        unused.add(r, r.get("unused_cost_usd"))
    return [savings, waste, lost, ratio, active, unused]


def budget_families(s: Snapshot) -> list[Family]:
    names = ("amount_usd", "spend_usd", "used_ratio", "forecast_usd", "thresholds_crossed", "days_missing")
    fam = {n: Family(CATALOG[f"gpu_ops_budget_{n}"]) for n in names}
    status, severity = Family(CATALOG["gpu_ops_budget_status"]), Family(CATALOG["gpu_ops_budget_severity"])
    for r in s.budgets:  # 10,000 budgets are 130,000 samples: the label values are made once per budget
        b = (_text(r.get("budget")), _text(r.get("period")))
        pct = _number(r.get("percent_used"))
        values = {"amount_usd": r.get("amount_usd"), "spend_usd": r.get("spend_usd"), "used_ratio": None if pct is None else pct / 100.0,
                  "forecast_usd": r.get("forecast_usd"), "thresholds_crossed": r.get("thresholds_crossed"), "days_missing": r.get("days_missing")}
        for name, value in values.items():
            fam[name].add_values(b, value)
        for state in BUDGET_STATES:
            status.add_values((*b, state), 1.0 if r.get("status") == state else 0.0)
        if r.get("severity") in BUDGET_SEVERITIES:  # absent from partitions written before it was a column
            for level in BUDGET_SEVERITIES:
                severity.add_values((*b, level), 1.0 if r["severity"] == level else 0.0)
    deliveries, dead = Family(CATALOG["gpu_ops_alert_deliveries_total"]), Family(CATALOG["gpu_ops_alert_dead_letters_total"])
    for r in s.deliveries:
        deliveries.add(r, r.get("n"))
    for r in s.dead_letters:
        dead.add(r, r.get("n"))
    return [*fam.values(), status, severity, deliveries, dead]


def training_families(s: Snapshot) -> list[Family]:
    names = ("attempts", "preemptions", "gpu_seconds", "lost_gpu_seconds", "recoveries", "recovery_seconds")
    fam = {n: Family(CATALOG[f"gpu_ops_training_{n}_total"]) for n in names}
    preempted: dict[tuple, float] = {}
    for r in s.attempts:
        fam["attempts"].add(r, r.get("n"))
        key = tuple(_text(r.get(k)) for k in _ATTEMPT)
        preempted[key] = preempted.get(key, 0.0) + (float(r["n"]) if r.get("outcome") == "preempted" else 0.0)
    summed = _summed(({**r, "partition_key": None} for r in s.attempts), _ATTEMPT, ("gpu_seconds", "lost_gpu_seconds"), None)
    for (_w, *attempt), acc in summed.items():
        labels = dict(zip(_ATTEMPT, attempt))
        fam["preemptions"].add(labels, preempted.get(tuple(attempt), 0.0))
        fam["gpu_seconds"].add(labels, acc["gpu_seconds"])
        fam["lost_gpu_seconds"].add(labels, acc["lost_gpu_seconds"])
    for r in s.recoveries:
        fam["recoveries"].add(r, r.get("n"))
        fam["recovery_seconds"].add(r, r.get("seconds"))
    return list(fam.values())


def quota_families(s: Snapshot) -> list[Family]:
    held, limit, leases = Family(CATALOG["gpu_ops_quota_gpus_held"]), Family(CATALOG["gpu_ops_quota_gpus_limit"]), Family(CATALOG["gpu_ops_quota_leases"])
    live = [r for r in s.leases if r.get("live")]
    scopes = {(scope, name) for scope, limits in s.quotas.items() for name in limits}
    scopes |= {("team", str(r["team"])) for r in live} | {("pool", str(p)) for r in live for p in r.get("pools", ())}
    for scope, name in sorted(scopes):
        gpus = sum(int(r["gpus"]) for r in live if (str(r["team"]) == name if scope == "team" else name in r.get("pools", ())))
        held.add({"scope": scope, "name": name}, gpus)
        if name in s.quotas.get(scope, {}):
            limit.add({"scope": scope, "name": name}, s.quotas[scope][name])
    counts: dict[tuple[str, str], int] = {}
    for r in s.leases:
        key = (str(r["team"]), "live" if r.get("live") else "expired")
        counts[key] = counts.get(key, 0) + 1
    for (team, state), n in sorted(counts.items()):
        leases.add({"team": team, "state": state}, n)
    return [held, limit, leases, *waiting_families(s)]


def waiting_families(s: Snapshot) -> list[Family]:
    attempts, gpus = Family(CATALOG["gpu_ops_quota_waiting_attempts"]), Family(CATALOG["gpu_ops_quota_waiting_gpus"])
    for team in sorted({r["team"] for r in s.waiting}):
        mine = [r for r in s.waiting if r["team"] == team]
        attempts.add({"team": team}, len(mine))
        gpus.add({"team": team}, sum(int(r["gpus"]) for r in mine))
    return [attempts, gpus]


def health_families(s: Snapshot) -> list[Family]:
    fresh, quarantined = Family(CATALOG["gpu_ops_cost_partition_timestamp_seconds"]), Family(CATALOG["gpu_ops_usage_quarantined_rows"])
    for table in FRESHNESS_TABLES:
        key = s.newest.get(table)
        if key:
            fresh.add({"table": table}, partition_timestamp(key))
    for r in s.quarantine:
        quarantined.add(r, r.get("n"))
    ok, seconds = Family(CATALOG["gpu_ops_exporter_read_ok"]), Family(CATALOG["gpu_ops_exporter_read_seconds"])
    for source in s.sources:
        ok.add({"source": source}, 0.0 if source in s.errors else 1.0)
    seconds.add({}, s.read_seconds)
    return [fresh, quarantined, ok, seconds]


def partition_timestamp(partition_key: str) -> float:
    """A daily partition key's UTC midnight as Unix seconds."""
    day = dt.date.fromisoformat(str(partition_key)[:10])
    return dt.datetime(day.year, day.month, day.day, tzinfo=dt.timezone.utc).timestamp()


def families(s: Snapshot) -> list[Family]:
    """Every family of the catalog the snapshot has data for (pod families only when read)."""
    return [*cost_families(s), *roi_families(s), *budget_families(s), *training_families(s), *quota_families(s), *foresight_families(s), *health_families(s)]


def foresight_families(s: Snapshot) -> list[Family]:
    """The launch estimates, the spend not in a partition yet, and the anomaly scores."""
    est, p90 = Family(CATALOG["gpu_ops_launch_estimate_usd"]), Family(CATALOG["gpu_ops_launch_estimate_p90_usd"])
    for r in s.estimates:
        est.add(r, r.get("estimate_usd"))
        p90.add(r, r.get("estimate_p90_usd"))
    intraday = Family(CATALOG["gpu_ops_intraday_cost_usd"])
    for r in s.intraday:
        intraday.add(r, r.get("cost_usd"))
    score, baseline = Family(CATALOG["gpu_ops_spend_anomaly_score"]), Family(CATALOG["gpu_ops_spend_anomaly_baseline_usd"])
    for r in s.anomalies:
        score.add(r, r.get("score"))
        baseline.add(r, r.get("baseline_usd"))
    return [est, p90, intraday, score, baseline]


def reference_markdown() -> str:
    """The metric table of docs/reference/metrics.md, from the catalog."""
    lines = ["| Metric | Type | Unit | Labels | Source table | Meaning |", "|---|---|---|---|---|---|"]
    for m in CATALOG.values():
        labels = m.grain or ", ".join(f"`{label}`" for label in m.labels) or "none"
        lines.append(f"| `{m.name}` | {m.kind} | {m.unit or '1'} | {labels} | `{m.source}` | {m.help} |")
    return "\n".join(lines) + "\n"
