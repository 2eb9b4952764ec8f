"""The main job behind `gpu-ops demo` and `make run`.

On the demo's configuration (``gpu_ops/demo/gpu_ops.yaml``: SQLite under ``$GPU_OPS_HOME``,
else ``./.gpu_ops``, the local backend, alerts to the log), with a persistent Dagster
instance in ``<that folder>/dagster_home`` so that `make dev` shows every run afterwards:

1. ``train_demo_model`` on the local backend; its worker is killed once training is
   under way, and the step retries and resumes from its newest checkpoint.
2. A month of daily cost partitions (``daily_gpu_cost_job``), day by day; after each day
   the budget sensor's evaluation runs with that day's end as "now", exactly as the
   daemon would have seen it, and the alert and enforcement runs it requests are
   launched (run keys deduplicated as the daemon does).
3. A summary: training, spend by team, budgets, alerts, enforcement, ROI.
"""

from __future__ import annotations

import datetime as dt
import shutil
from pathlib import Path
from typing import Any, Callable

import click
import dagster as dg
import pandas as pd

from gpu_ops.dagster.alerts.sensor import launch_requests, tick
from gpu_ops.domain.alerts.state import AlertCursor
from gpu_ops.domain.config import DEMO_CONFIG, GpuOpsConfig, UsageConfig, demo_home, load_config
from gpu_ops.dagster.cost.definitions import DAILY_JOB
from gpu_ops.domain.formatting import gpu_hours, money, percent
from gpu_ops.dagster.location import build_defs
from gpu_ops.storage.tables import TableStore
from gpu_ops.demo.training import materialize_with_preemption
from gpu_ops.cli.validate import run_checks

Echo = Callable[[str], None]
QUIET_LOGS = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}


def _reset_demo_state(config: GpuOpsConfig, home: Path, echo: Echo) -> None:
    """The bundled demo starts from nothing each time: its database, instance, checkpoints."""
    TableStore.dispose_all()
    url = config.storage.resolved_url()
    db = Path(url[len("sqlite:///") :]) if url.startswith("sqlite:///") else None
    for path in [p for p in (db, db and Path(f"{db}-wal"), db and Path(f"{db}-shm")) if p]:
        path.unlink(missing_ok=True)
    for folder in (home / "dagster_home", Path(config.checkpoint_root())):
        if folder.is_dir() and home in folder.resolve().parents:
            shutil.rmtree(folder)
    echo(f"fresh demo state under {home}")


def _demo_days(usage: UsageConfig) -> list[str]:
    start = usage.partitions_start
    last = min(start + dt.timedelta(days=30), usage.last_partition(dt.datetime.now(dt.timezone.utc).date()))
    return [(start + dt.timedelta(days=i)).isoformat() for i in range((last - start).days + 1)]


def run_demo(config_path: str | None = None, *, reset: bool = True, echo: Echo = click.echo) -> int:
    config_path = str(config_path or DEMO_CONFIG)  # the demo's configuration unless another is named
    config = load_config(config_path)
    home = demo_home()
    echo(f"gpu_ops demo — config {config.source_path}")
    if reset and config.source_path == DEMO_CONFIG.resolve():
        _reset_demo_state(config, home, echo)
    for r in run_checks(config, "storage"):
        echo(f"  {r.status}: {r.name}: {r.detail}")
        if r.failed:
            return 1

    instance_dir = home / "dagster_home"
    instance_dir.mkdir(parents=True, exist_ok=True)
    settings = instance_dir / "dagster.yaml"
    if not settings.exists():  # as the repo's dagster.yaml: no telemetry, so no banner about it
        settings.write_text("telemetry:\n  enabled: false\n")
    instance = dg.DagsterInstance.from_config(str(instance_dir))
    defs = build_defs(config_path)
    store = TableStore.from_config(config)

    echo("\n[1/3] training train_demo_model on the local backend, with an injected preemption")
    training = materialize_with_preemption(config_path, instance=instance, echo=lambda m: None, run_config=QUIET_LOGS)
    echo("  " + _training_line(training))

    days = _demo_days(config.usage)
    echo(f"\n[2/3] {len(days)} daily cost partitions ({days[0]} … {days[-1]}) with the budget sensor after each day")
    job = defs.resolve_job_def(DAILY_JOB)
    cursor = AlertCursor.decode(None)
    alert_runs: list[tuple[str, Any]] = []
    for n, day in enumerate(days, start=1):
        result = job.execute_in_process(partition_key=day, instance=instance, run_config=QUIET_LOGS, raise_on_error=False)
        if not result.success:
            echo(f"  {day}: daily_gpu_cost_job FAILED (run {result.run_id}); see `make dev`")
            return 1
        now = dt.datetime.fromisoformat(day).replace(tzinfo=dt.timezone.utc) + dt.timedelta(days=1, minutes=15)
        cursor, requests, _summary = tick(config, store, cursor, now=now)
        launched, _already = launch_requests(defs, instance, requests, run_config=QUIET_LOGS)
        echo(f"  [{n:>2}/{len(days)}] {day}: {_day_line(store, day)}; {len(launched)} alert/enforcement run(s)")
        for request, run in launched:
            alert_runs.append((day, request))
            status = "sent" if run.success else f"FAILED (run {run.run_id})"
            echo(f"  {day}: {request.run_key} — {status}")

    echo("\n[3/3] summary")
    _summarize(config, store, training, days, alert_runs, echo)
    echo("\nIn the UI:")
    for line in ui_notes(config.usage, store, days):
        echo(f"  - {line}")
    echo(f"\nEvery run is in the Dagster instance at {instance_dir}: `make dev` and open http://127.0.0.1:3000")
    return 0


def _training_line(md: dict[str, Any]) -> str:
    """``train_demo_model``'s outcome, figures rounded (money to the cent, hours to 3 decimals)."""
    injected = f"SIGKILL to worker pid {md['injected_pid']}" if md.get("injected_pid") else "no signal (training ended first)"
    pricing = f" ({md['pricing']})" if md.get("pricing") else ""
    loss = md.get("final_loss")
    return (
        f"train_demo_model: injected {injected}; {md.get('attempts')} attempt(s), {md.get('preemptions')} preemption(s), "
        f"final_loss {'n/a' if loss is None else f'{float(loss):.4f}'}, {gpu_hours(md.get('gpu_hours'))}, "
        f"cost {money(md.get('cost_usd'))}{pricing}, weights_sha256 {str(md.get('weights_sha256'))[:16]}…"
    )


def _day_line(store: Any, day: str) -> str:
    """One day's figures for the progress line: spend and GPU-hours."""
    table = store.read("gpu_cost_attribution", partition_keys=[day], missing_ok=True)
    if table.empty:
        return "no usage"
    return f"{money(table['cost_usd'].sum())} over {gpu_hours(table['gpu_hours'].sum())}"


def ui_notes(usage: UsageConfig, store: Any, days: list[str]) -> list[str]:
    """What a first look at the UI after the demo would otherwise leave unexplained: a red
    check that fails on purpose, and partition fill badges below 100 %."""
    notes = []
    status = store.read("gpu_budget_status", partition_keys=[days[-1]], missing_ok=True)
    exceeded = sorted(status.loc[status["status"] == "exceeded", "budget"]) if not status.empty else []
    warned = sorted(status.loc[status["status"] == "warning", "budget"]) if not status.empty else []
    if exceeded:
        notes.append(
            f"the check budgets_within_limit on gpu_budget_status fails (ERROR) on purpose: the demo's usage takes "
            f"{', '.join(exceeded)} past {'its' if len(exceeded) == 1 else 'their'} amount, which is what the alerts and the throttle above are about"
        )
    elif warned:
        notes.append(f"the check budgets_within_limit on gpu_budget_status warns: {', '.join(warned)} crossed a warning threshold")
    start = usage.partitions_start
    last = usage.last_partition(dt.datetime.now(dt.timezone.utc).date())
    total = max((last - start).days + 1, len(days))
    if total > len(days):
        notes.append(
            f"the cost assets are partitioned daily from {start} (usage.partitions_start) to {last}, {total} partitions; the demo's usage "
            f"covers {days[0]} … {days[-1]}, so {len(days)} of them are materialized ({percent(100 * len(days) / total)}): the others have no data, "
            "nothing failed"
        )
    quarantine = store.read("gpu_usage_quarantine", partition_keys=days, missing_ok=True)
    if not quarantine.empty:
        where = sorted(set(quarantine["partition_key"].astype(str))) if "partition_key" in quarantine else []
        notes.append(
            f"{len(quarantine)} usage row(s) are quarantined on purpose (gpu_usage_quarantine, check quarantine_empty)"
            + (f", in the partition(s) {', '.join(where)}: pick that partition on the asset's page" if where else "")
        )
    return notes


def _summarize(config: GpuOpsConfig, store: Any, training: dict[str, Any], days: list[str], alert_runs: list, echo: Echo) -> None:
    simulated = " simulated" if str(training.get("pricing", "")).startswith("simulated") else ""
    echo(
        f"  training: {training['attempts']} attempts, {training['preemptions']} preemption(s), final_loss "
        f"{float(training['final_loss']):.4f}, {gpu_hours(training.get('gpu_hours'))}, {money(training.get('cost_usd'))}{simulated}, "
        f"weights_sha256 {str(training['weights_sha256'])[:16]}…"
    )
    attribution = store.read("gpu_cost_attribution", partition_keys=days, missing_ok=True)
    if not attribution.empty:
        by_team = attribution.groupby("team")[["gpu_hours", "cost_usd", "savings_usd"]].sum().sort_values("cost_usd", ascending=False)
        total = by_team["cost_usd"].sum()
        echo(f"  spend {days[0]} … {days[-1]}: {money(total)} over {gpu_hours(by_team['gpu_hours'].sum())}")
        for team, row in by_team.iterrows():
            team = "(idle fleet)" if team == "__idle__" else team
            echo(f"    {team:<14} {gpu_hours(row.gpu_hours):>16}  {money(row.cost_usd):>12}  saved vs on-demand {money(row.savings_usd)}")
    status = store.read("gpu_budget_status", partition_keys=[days[-1]], missing_ok=True)
    for row in status.itertuples():
        forecast = "n/a (too little history)" if pd.isna(row.forecast_usd) else money(row.forecast_usd)
        echo(
            f"  budget {row.budget}: {money(row.spend_usd)} of {money(row.amount_usd)} ({percent(row.percent_used)}), "
            f"forecast {forecast}, {row.status}; crossed {', '.join(row.thresholds_crossed) or 'none'}"
        )
    alerts = [r for _, r in alert_runs if r.job_name == "budget_alert_job"]
    enforcement = [r for _, r in alert_runs if r.job_name != "budget_alert_job"]
    echo(f"  alerts: {len(alerts)} notifications; enforcement: {len(enforcement)} change(s)")
    quarantine = store.read("gpu_usage_quarantine", partition_keys=days, missing_ok=True)
    if not quarantine.empty:
        echo(f"  quarantined usage rows: {len(quarantine)} ({'; '.join(sorted(set(quarantine['reason'].astype(str))))})")
    roi = store.read("gpu_roi_report", partition_keys=days, missing_ok=True)
    if not roi.empty:
        totals = roi[roi["team"] == "__total__"]
        cols = ["spot_savings_usd", "sharing_savings_usd", "preemption_waste_usd", "net_spot_savings_usd", "idle_waste_usd"]
        sums = totals[cols].sum()
        echo(
            "  ROI (measured): spot savings {}, sharing savings {}, preemption waste {}, net spot savings {}, idle waste {}".format(
                *(money(sums[c]) for c in cols)
            )
        )
        # Daily reports repeat a standing recommendation every day: add them up per target.
        month: dict[tuple[str, str], list] = {}
        for recs in totals["recommendations"]:
            for rec in recs or []:
                entry = month.setdefault((rec["kind"], rec["target"]), [0.0, 0, rec["detail"]])
                entry[0] += float(rec["impact_usd"])
                entry[1] += 1
        for (kind, _target), (impact, n, detail) in sorted(month.items(), key=lambda kv: -kv[1][0])[:3]:
            echo(f"    recommendation ({kind}, {n} day(s), {money(impact)} in all): {detail}")
