"""The main job behind `gpu-ops demo` and `make run`.

On the embedded default (SQLite under ``$GPU_OPS_HOME``, the local backend, alerts to
the log), with a persistent Dagster instance in ``$GPU_OPS_HOME/dagster_home`` so that
`make dev` shows every run afterwards:

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

from gpu_ops.alerts.model import money
from gpu_ops.config import BUNDLED_CONFIG, GpuOpsConfig, gpu_ops_home, load_config

Echo = Callable[[str], None]
QUIET_LOGS = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}


def _reset_demo_state(config: GpuOpsConfig, home: Path, echo: Echo) -> None:
    """The bundled demo starts from nothing each time: its database, instance, checkpoints."""
    from gpu_ops.storage.tables import TableStore
    from gpu_ops.training.checkpoint import checkpoint_root

    TableStore.dispose_all()
    url = config.storage.resolved_url()
    db = Path(url[len("sqlite:///") :]) if url.startswith("sqlite:///") else None
    for path in [p for p in (db, db and Path(f"{db}-wal"), db and Path(f"{db}-shm")) if p]:
        path.unlink(missing_ok=True)
    for folder in (home / "dagster_home", Path(checkpoint_root(config))):
        if folder.is_dir() and home in folder.resolve().parents:
            shutil.rmtree(folder)
    echo(f"fresh demo state under {home}")


def _demo_days(config: GpuOpsConfig) -> list[str]:
    start = config.usage.partitions_start
    yesterday = dt.datetime.now(dt.timezone.utc).date() - dt.timedelta(days=1)
    last = min(start + dt.timedelta(days=30), yesterday)
    return [(start + dt.timedelta(days=i)).isoformat() for i in range((last - start).days + 1)]


def run_demo(config_path: str | None = None, *, reset: bool = True, echo: Echo = click.echo) -> int:
    import warnings

    import dagster as dg

    warnings.filterwarnings("ignore", category=dg.BetaWarning)  # Dagster's own sensor internals

    from gpu_ops.alerts.sensor import launch_requests, tick
    from gpu_ops.alerts.state import AlertCursor
    from gpu_ops.cost.definitions import DAILY_JOB
    from gpu_ops.definitions import build_defs
    from gpu_ops.storage.tables import TableStore
    from gpu_ops.training.demo_run import materialize_with_preemption
    from gpu_ops.validate import run_checks

    config = load_config(config_path)
    home = gpu_ops_home()
    echo(f"gpu_ops demo — config {config.source_path}")
    if reset and config.source_path == BUNDLED_CONFIG.resolve():
        _reset_demo_state(config, home, echo)
    for r in run_checks(config, "storage"):
        echo(f"  {r.status}: {r.name}: {r.detail}")
        if r.failed:
            return 1

    instance_dir = home / "dagster_home"
    instance_dir.mkdir(parents=True, exist_ok=True)
    instance = dg.DagsterInstance.from_config(str(instance_dir))
    defs = build_defs(config_path)
    store = TableStore.from_config(config)

    echo("\n[1/3] training train_demo_model on the local backend, with an injected preemption")
    training = materialize_with_preemption(config_path, instance=instance, echo=lambda m: echo(f"  {m}"), run_config=QUIET_LOGS)

    days = _demo_days(config)
    echo(f"\n[2/3] {len(days)} daily cost partitions ({days[0]} … {days[-1]}) with the budget sensor after each day")
    job = defs.resolve_job_def(DAILY_JOB)
    cursor = AlertCursor.decode(None)
    alert_runs: list[tuple[str, Any]] = []
    for day in days:
        result = job.execute_in_process(partition_key=day, instance=instance, run_config=QUIET_LOGS, raise_on_error=False)
        if not result.success:
            echo(f"  {day}: daily_gpu_cost_job FAILED (run {result.run_id}); see `make dev`")
            return 1
        now = dt.datetime.fromisoformat(day).replace(tzinfo=dt.timezone.utc) + dt.timedelta(days=1, minutes=15)
        cursor, requests, _summary = tick(config, store, cursor, now=now)
        launched, _already = launch_requests(defs, instance, requests, run_config=QUIET_LOGS)
        for request, run in launched:
            alert_runs.append((day, request))
            status = "sent" if run.success else f"FAILED (run {run.run_id})"
            echo(f"  {day}: {request.run_key} — {status}")

    echo("\n[3/3] summary")
    _summarize(config, store, training, days, alert_runs, echo)
    echo(f"\nEvery run is in the Dagster instance at {instance_dir}: `make dev` and open http://127.0.0.1:3000")
    return 0


def _summarize(config: GpuOpsConfig, store: Any, training: dict[str, Any], days: list[str], alert_runs: list, echo: Echo) -> None:
    import pandas as pd

    echo(
        f"  training: {training['attempts']} attempts, {training['preemptions']} preemption(s), final_loss "
        f"{training['final_loss']:.4f}, {training['gpu_hours']:.4f} GPU-h, ${training['cost_usd']:.4f}, "
        f"weights_sha256 {str(training['weights_sha256'])[:16]}…"
    )
    attribution = store.read("gpu_cost_attribution", partition_keys=days, missing_ok=True)
    if not attribution.empty:
        by_team = attribution.groupby("team")[["gpu_hours", "cost_usd", "savings_usd"]].sum().sort_values("cost_usd", ascending=False)
        total = by_team["cost_usd"].sum()
        echo(f"  spend {days[0]} … {days[-1]}: {money(total)} over {by_team['gpu_hours'].sum():,.1f} GPU-hours")
        for team, row in by_team.iterrows():
            team = "(idle fleet)" if team == "__idle__" else team
            echo(f"    {team:<14} {row.gpu_hours:>9,.1f} GPU-h  {money(row.cost_usd):>12}  saved vs on-demand {money(row.savings_usd)}")
    status = store.read("gpu_budget_status", partition_keys=[days[-1]], missing_ok=True)
    for row in status.itertuples():
        forecast = "n/a (too little history)" if pd.isna(row.forecast_usd) else money(row.forecast_usd)
        echo(
            f"  budget {row.budget}: {money(row.spend_usd)} of {money(row.amount_usd)} ({row.percent_used:.0f}%), "
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
