"""Dagster wiring of the alerts flow: `budget_alert_sensor`, the alert and enforcement jobs.

Design: docs/concepts/budgets-and-alerts.md#delivery-run-requests-not-sends-from-the-sensor
"""

from __future__ import annotations

# httpx, pandas and SQLAlchemy (channels, enforcement, records, TableStore) are imported when the sensor evaluates or an op runs, not when the code location loads.
import datetime as dt
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import dagster as dg
from dagster._core.storage.dagster_run import RunsFilter
from dagster._core.storage.tags import RUN_KEY_TAG, SENSOR_NAME_TAG

from gpu_ops.domain.memory import collection_deferred, freeze_long_lived
from gpu_ops.domain.alerts.model import Alert
from gpu_ops.domain.alerts.redelivery import DeadLetter, Pending, Policy, RunOutcome, advance
from gpu_ops.domain.alerts.state import AlertCursor, EnforcementEvent, ThresholdPlan, evaluate_table, queue_alerts
from gpu_ops.domain.config import AlertsConfig, Budget, ComputeConfig, GpuOpsConfig
from gpu_ops.dagster.resources import bound_jobs

if TYPE_CHECKING:
    from gpu_ops.flows.alerts.enforcement import EnforcementOrder, EnforcementOutcome, NodePools
    from gpu_ops.storage.tables import TableStore

SENSOR_NAME = "budget_alert_sensor"
ALERT_JOB = "budget_alert_job"
ENFORCEMENT_JOB = "budget_enforcement_job"
ALERT_OP = "deliver_budget_alert"
ENFORCEMENT_OP = "apply_budget_enforcement"
BUDGET_STATUS = dg.AssetKey("gpu_budget_status")
DEAD_LETTER_CHECK = "alerts_delivered"
ALERT_TAG = "gpu-ops/alert"  # the alert's first run key, on every run of it (redeliveries too)
DEAD_LETTER_TAG = "gpu-ops/dead-letter"
TICK_INTERVAL_S = 30
# Runs are followed by their update time: each pass re-reads this much before the last one.
RUNS_OVERLAP_S = 120
DEAD_LETTER_WINDOW_DAYS = 7  # the alerts_delivered check fails this long after a dead letter
Clock = Callable[[], dt.datetime]


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def redelivery_policy(alerts: AlertsConfig) -> Policy:
    return Policy(alerts.redelivery_interval_s, alerts.max_pending_s)


# --------------------------------------------------------------------------- requests


def order_for(event: EnforcementEvent, budget: Budget | None, config_path: str | None) -> EnforcementOrder:
    from gpu_ops.flows.alerts.enforcement import EnforcementOrder

    enf = budget.enforcement if budget else None
    row = event.row
    return EnforcementOrder(
        event=event.kind,
        budget=event.budget,
        action=event.action,  # type: ignore[arg-type]
        period_start=event.period_start,
        period_end=event.period_end,
        scope=budget.scope.as_filters() if budget else {},
        max_gpus=enf.max_gpus if enf else None,
        spot_only=enf.spot_only if enf else False,
        zero_pool_limit=enf.zero_pool_limit if enf else False,
        amount_usd=budget.amount_usd if budget else 0.0,
        spend_usd=row.spend_usd if row else 0.0,
        reason=event.reason,
        run_key=event.run_key,
        config_path=config_path,
    )


def alert_run_request(alert: Alert, pending: Pending, policy: Policy) -> dg.RunRequest:
    """The run of one request of ``alert``: its first (run key ``alert.run_key``) or a
    redelivery (``.../redelivery-<n>``); the payload, and so every idempotency key, is the same."""
    tags = {"gpu-ops/budget": alert.budget, "gpu-ops/threshold": alert.threshold, "gpu-ops/event": alert.kind, "gpu-ops/period": alert.period_start, ALERT_TAG: alert.run_key}
    if pending.n > 1:
        tags["gpu-ops/redelivery"] = str(pending.n)
    return dg.RunRequest(
        run_key=pending.run_key(alert.run_key),
        job_name=ALERT_JOB,
        run_config={"ops": {ALERT_OP: {"config": {"alert": alert.to_dict(), "delivery": policy.delivery(pending)}}}},
        tags=tags,
    )


def enforcement_run_request(order: EnforcementOrder) -> dg.RunRequest:
    return dg.RunRequest(
        run_key=order.run_key,
        job_name=ENFORCEMENT_JOB,
        run_config={"ops": {ENFORCEMENT_OP: {"config": {"order": order.to_dict()}}}},
        tags={"gpu-ops/budget": order.budget, "gpu-ops/event": f"enforce-{order.action}-{order.event}", "gpu-ops/period": order.period_start},
    )


_PLAN: list[Any] = [None, None]  # the last configuration object and its ThresholdPlan


FREEZE_AT_BUDGETS = 10_000


def threshold_plan(config: GpuOpsConfig) -> ThresholdPlan:
    """The plan of ``config``, built once per loaded configuration (load_config caches
    the object until the file changes).

    With a fleet configuration (``FREEZE_AT_BUDGETS`` or more) the objects alive now (the
    configuration, the plan, the loaded definitions) are frozen out of garbage collection
    once per configuration (``freeze_long_lived``): they live as long as the code server,
    and every full collection would walk all of them again (about a million objects and
    0.5 s of CPU at 100,000 budgets, once or twice per tick)."""
    if _PLAN[0] is not config:
        _PLAN[:] = [config, ThresholdPlan.build(config.budgets)]
        if len(config.budgets) >= FREEZE_AT_BUDGETS:
            freeze_long_lived()
    return _PLAN[1]


def tick(config: GpuOpsConfig, store: TableStore | None, cursor: AlertCursor, *, now: dt.datetime, evaluate: bool = True) -> tuple[AlertCursor, list[dg.RunRequest], str]:
    """One tick's own work: with ``evaluate``, a full evaluation (newest status rows +
    previous state -> new state; its alerts join the queue, its enforcement changes are
    requested at once); then up to ``alerts.max_runs_per_tick`` alert runs from the
    queue, oldest first. ``cursor`` is left as it was."""
    new_cursor = AlertCursor(
        cursor.last_storage_id, cursor.evaluated_at, cursor.budgets, dict(cursor.pending), cursor.runs_seen_at,
        cursor.queue.copy(), cursor.ledger_mark, dict(cursor.anomalies),
    )
    enforcement: list[dg.RunRequest] = []
    summary: list[str] = []
    if evaluate:
        assert store is not None, "a full evaluation reads the status table"
        enforcement, summary = _evaluate(config, store, new_cursor, now)
    requests: list[dg.RunRequest] = []
    if evaluate or cursor.queue:
        requests, superseded = request_queued(config.alerts, new_cursor, now)
        summary.append(f"{len(requests)} alert run(s) requested, {len(new_cursor.queue)} waiting for the next ticks (alerts.max_runs_per_tick {config.alerts.max_runs_per_tick})")
        if superseded:
            summary.append(f"undelivered trigger(s) superseded by their resolve, not redelivered: {', '.join(superseded)}")
    return new_cursor, requests + enforcement, "; ".join(summary)


def _evaluate(config: GpuOpsConfig, store: TableStore, cursor: AlertCursor, now: dt.datetime) -> tuple[list[dg.RunRequest], list[str]]:
    """The newest status rows against ``cursor``'s state: the state advances in place,
    the alerts join its queue; returns the enforcement runs (never held back: they gate
    launches, and there is at most one per budget) and a summary."""
    from gpu_ops.flows.alerts.anomalies import queue_anomalies
    from gpu_ops.flows.alerts.intraday import with_intraday
    from gpu_ops.flows.alerts.records import read_latest_status

    partition, table = read_latest_status(store)
    plan = threshold_plan(config)
    table, intraday = with_intraday(config, store, plan, table, now)
    result, in_detail = evaluate_table(plan, table, cursor.budgets, now)
    cursor.budgets, cursor.evaluated_at = result.state, now.timestamp()
    queue_alerts(cursor.queue, result.alerts, plan, config.alerts.dagster_url)
    anomalies = queue_anomalies(config, store, plan, table, cursor, now)
    enforcement = [enforcement_run_request(order_for(ev, plan.budgets.get(ev.budget), str(config.source_path) if config.source_path else None)) for ev in result.enforcement]
    return enforcement, [
        f"evaluated {len(table)} budget rows ({in_detail} in detail) of partition {partition or '(none yet)'}: "
        f"{sum(e.kind == 'trigger' for e in result.alerts)} triggered, {sum(e.kind == 'resolve' for e in result.alerts)} resolved, "
        f"{len(result.enforcement)} enforcement changes"
    ] + ([intraday] if intraday else []) + ([anomalies] if anomalies else [])


def request_queued(alerts: AlertsConfig, cursor: AlertCursor, now: dt.datetime) -> tuple[list[dg.RunRequest], list[str]]:
    """Up to ``alerts.max_runs_per_tick`` waiting alerts become runs (and pending, until
    delivered). A resolve supersedes its trigger's redelivery (never page after the
    resolve); returns the runs and the triggers superseded."""
    policy = redelivery_policy(alerts)
    requests, superseded = [], []
    for alert in cursor.queue.pop(alerts.max_runs_per_tick):
        first = cursor.pending[alert.run_key] = Pending(now.timestamp(), now.timestamp())
        requests.append(alert_run_request(alert, first, policy))
        if alert.kind == "resolve" and cursor.pending.pop(alert.trigger_run_key, None) is not None:
            superseded.append(alert.trigger_run_key)
    return requests, superseded


def _latest_storage_id(instance: dg.DagsterInstance | None) -> int | None:
    if instance is None:
        return None
    records = instance.fetch_materializations(BUDGET_STATUS, limit=1).records
    return records[0].storage_id if records else None


# --------------------------------------------------------------------------- redelivery

_OUTCOMES: dict[str, RunOutcome] = {"SUCCESS": "success", "FAILURE": "failure", "CANCELED": "failure"}
_RANK = {"failure": 0, "active": 1, "success": 2}


@dataclass
class FollowUp:
    """What one tick does about pending alerts: redeliveries, and the alerts to dead-letter
    (:func:`dead_letter`)."""

    requests: list[dg.RunRequest] = field(default_factory=list)
    dead: list[DeadLetter] = field(default_factory=list)
    summary: str = ""


def _alert_run_outcomes(instance: dg.DagsterInstance, cursor: AlertCursor) -> dict[str, RunOutcome]:
    """Outcome of the alert runs updated since the last pass (by run key; a key with a
    successful run counts as delivered). Without a previous pass: the pending keys' runs."""
    base = {SENSOR_NAME_TAG: SENSOR_NAME}
    if cursor.runs_seen_at is None:
        keys = [p.run_key(k) for k, p in cursor.pending.items()]
        filters = [dg.RunsFilter(job_name=ALERT_JOB, tags={**base, RUN_KEY_TAG: keys[i : i + 500]}) for i in range(0, len(keys), 500)]
    else:
        since = dt.datetime.fromtimestamp(cursor.runs_seen_at - RUNS_OVERLAP_S, dt.timezone.utc)
        filters = [dg.RunsFilter(job_name=ALERT_JOB, tags=base, updated_after=since)]
    outcomes: dict[str, RunOutcome] = {}
    for f in filters:
        for run in instance.get_runs(filters=f):
            key = run.tags.get(RUN_KEY_TAG)
            outcome = _OUTCOMES.get(run.status.value, "active")
            if key and (key not in outcomes or _RANK[outcome] > _RANK[outcomes[key]]):
                outcomes[key] = outcome
    return outcomes


def _runs_of_alert(instance: dg.DagsterInstance, key: str) -> list[Any]:
    return list(instance.get_runs(filters=dg.RunsFilter(job_name=ALERT_JOB, tags={ALERT_TAG: key})))


def _alert_of_run(run: Any) -> Alert:
    return Alert.from_dict(run.run_config["ops"][ALERT_OP]["config"]["alert"])


def follow_pending(alerts: AlertsConfig, cursor: AlertCursor, instance: dg.DagsterInstance | None, now: dt.datetime, log: Any, *, limit: int | None = None) -> FollowUp:
    """Every tick: what became of the runs of pending alerts; request the failed ones again
    (each ``redelivery_interval_s``; at most ``limit``, the others at a later tick) or
    hand them to be dead-lettered (after ``max_pending_s``). Updates ``cursor.pending`` and
    ``cursor.runs_seen_at``."""
    out = FollowUp()
    if instance is None:
        return out  # a test context without an instance: nothing to follow
    seen_at = time.time()
    if not cursor.pending:
        cursor.runs_seen_at = seen_at
        return out
    policy = redelivery_policy(alerts)
    step = advance(cursor.pending, _alert_run_outcomes(instance, cursor), now.timestamp(), policy, limit=limit)
    cursor.pending, cursor.runs_seen_at = step.pending, seen_at
    for key, again in step.redeliver:
        runs = _runs_of_alert(instance, key)
        if not runs:  # cannot happen for a run seen failing; never lose it silently
            step.dead.append(DeadLetter(key, again, "its runs are gone from the instance: nothing to redeliver"))
            del cursor.pending[key]
            continue
        out.requests.append(alert_run_request(_alert_of_run(runs[0]), again, policy))
        log.warning(f"alert {key}: not delivered to every channel yet; request {again.n} of at most {policy.max_requests()} (dead-letter at {policy.delivery(again)['dead_letter_at']})")
    out.dead = step.dead
    out.summary = f"{len(cursor.pending)} alert(s) pending delivery, {len(step.redeliver)} redelivered, {len(step.dead)} dead-lettered, {len(step.delivered)} delivered since the last tick"
    return out


def dead_letter(store: TableStore, instance: dg.DagsterInstance, dead: list[DeadLetter], now: dt.datetime, log: Any) -> dg.AssetCheckEvaluation:
    """Record alerts that will not be requested again: a row each in
    ``gpu_alert_dead_letters``, a tag on each of their runs, an ERROR log line, and a
    failed ``alerts_delivered`` check evaluation on ``gpu_budget_status``."""
    from gpu_ops.flows.alerts.records import dead_letter_row, delivered_channels, record_dead_letters

    rows = []
    for d in dead:
        runs = _runs_of_alert(instance, d.key)
        for run in runs:
            instance.add_run_tags(run.run_id, {DEAD_LETTER_TAG: "true"})
        alert = _alert_of_run(runs[0]) if runs else None
        done = delivered_channels(store, alert.idempotency_key) if alert else set()
        row = dead_letter_row(d, alert, done, now=now, last_run_id=runs[0].run_id if runs else None)
        log.error(
            f"alert {d.key} DEAD-LETTERED: {d.reason}. Undelivered channels: {row['undelivered'] or 'unknown'}; "
            f"delivered: {row['delivered'] or 'none'}. Recorded in gpu_alert_deliveries' sibling table gpu_alert_dead_letters; runs tagged {DEAD_LETTER_TAG}."
        )
        rows.append(row)
    record_dead_letters(store, rows)
    passed, description, metadata = dead_letter_outcome(rows)
    return dg.AssetCheckEvaluation(
        asset_key=BUDGET_STATUS, check_name=DEAD_LETTER_CHECK, passed=passed, severity=dg.AssetCheckSeverity.ERROR, description=description, metadata=metadata,
    )


def dead_letter_outcome(rows: list[dict[str, Any]]) -> tuple[bool, str, dict[str, Any]]:
    """``alerts_delivered``: fails while there are dead letters (the sensor's and the check's)."""
    if not rows:
        return True, "no dead-lettered alert", {"dead_letters": 0}
    listed = "; ".join(f"{r['alert']} (undelivered: {r['undelivered'] or 'unknown'})" for r in rows[:20])
    return (
        False,
        f"{len(rows)} alert(s) were never delivered to every channel within alerts.max_pending_s and are dead-lettered: {listed}",
        {"dead_letters": len(rows), "alerts": dg.MetadataValue.json([{k: v.item() if hasattr(v, "item") else v for k, v in r.items()} for r in rows[:100]])},
    )


def build_sensor(alerts: AlertsConfig, jobs: list[dg.JobDefinition], *, clock: Clock = _now) -> dg.SensorDefinition:
    interval = alerts.evaluation_interval_s

    @dg.sensor(
        name=SENSOR_NAME,
        minimum_interval_seconds=min(TICK_INTERVAL_S, interval),
        jobs=jobs,
        required_resource_keys={"gpu_ops"},
        default_status=dg.DefaultSensorStatus.RUNNING,
        description="Budget thresholds and enforcement from gpu_budget_status: one run per notification or enforcement change; failed alerts are requested again until delivered or dead-lettered.",
    )
    def budget_alert_sensor(context: dg.SensorEvaluationContext) -> dg.SensorResult | dg.SkipReason:
        cfg: GpuOpsConfig = context.resources.gpu_ops.load()
        with collection_deferred():
            cursor = AlertCursor.decode(context.cursor)
        instance = _instance_or_none(context)
        now = clock()
        latest = _latest_storage_id(instance)
        new_data = latest is not None and latest != cursor.last_storage_id
        store, settled = _ledger_moved(cfg, cursor)
        due = new_data or settled is not None or cursor.evaluated_at is None or now.timestamp() - cursor.evaluated_at >= cfg.alerts.evaluation_interval_s
        skip = f"no new gpu_budget_status materialization or settled attempt; next full evaluation within {cfg.alerts.evaluation_interval_s}s"
        if not (due or cursor.pending or cursor.queue):
            return dg.SkipReason(skip)
        from gpu_ops.storage.tables import TableStore

        with collection_deferred():
            new_cursor, requests, summary = tick(cfg, (store or TableStore.from_config(cfg)) if due else None, cursor, now=now, evaluate=due)
        if due and latest is not None:
            new_cursor.last_storage_id = latest
        if due and settled is not None:
            new_cursor.ledger_mark = settled
        if summary:
            context.log.info(summary)
        # Redeliveries share the tick's cap with the queue's alerts, which go first.
        room = max(0, cfg.alerts.max_runs_per_tick - sum(r.job_name == ALERT_JOB for r in requests))
        follow = follow_pending(cfg.alerts, new_cursor, instance, now, context.log, limit=room)
        if follow.summary:
            context.log.info(follow.summary)
        events = [dead_letter(store or TableStore.from_config(cfg), instance, follow.dead, now, context.log)] if follow.dead and instance else []
        with collection_deferred():
            encoded = new_cursor.encode()
        run_requests = follow.requests + requests
        return dg.SensorResult(run_requests=run_requests, skip_reason=None if run_requests or due else skip, cursor=encoded, asset_events=events)

    return budget_alert_sensor


def build_dead_letter_check(clock: Clock = _now) -> dg.AssetChecksDefinition:
    @dg.asset_check(
        asset=BUDGET_STATUS, name=DEAD_LETTER_CHECK, required_resource_keys={"gpu_ops"}, blocking=False,
        description=f"ERROR while an alert was dead-lettered in the last {DEAD_LETTER_WINDOW_DAYS} days (never delivered to every channel within alerts.max_pending_s); budget_alert_sensor also reports it the moment it happens.",
    )
    def alerts_delivered(context) -> dg.AssetCheckResult:
        from gpu_ops.flows.alerts.records import recent_dead_letters

        _, store = _settings_and_store(context)
        passed, description, metadata = dead_letter_outcome(recent_dead_letters(store, since=clock() - dt.timedelta(days=DEAD_LETTER_WINDOW_DAYS)))
        return dg.AssetCheckResult(passed=passed, severity=dg.AssetCheckSeverity.ERROR, description=description, metadata=metadata)

    return alerts_delivered


def _ledger_moved(config: GpuOpsConfig, cursor: AlertCursor) -> tuple[TableStore | None, list[Any] | None]:
    """Under ``alerts.intraday``: the store and the ledger's new mark when an attempt has
    settled since the last full evaluation (that tick evaluates: budgets within the hour),
    else None. An unreadable ledger waits for the interval's evaluation."""
    if not config.alerts.intraday:
        return None, None
    from gpu_ops.storage.tables import TableStore
    from gpu_ops.storage.ledger import watermark

    store = TableStore.from_config(config)
    try:
        mark = watermark(store)
    except Exception:  # the database is down: the full evaluation reports it
        return store, None
    return store, mark if mark is not None and mark != cursor.ledger_mark else None


def _instance_or_none(context: dg.SensorEvaluationContext) -> dg.DagsterInstance | None:
    try:
        return context.instance
    except dg.DagsterInvariantViolationError:  # a test context built without an instance
        return None


# --------------------------------------------------------------------------- the jobs


class KarpenterAccess(dg.ConfigurableResource):
    """How the enforcement op reaches the cluster's NodePools (in-cluster, else kubeconfig)."""

    kubeconfig: str | None = None
    context: str | None = None

    def node_pools(self, compute: ComputeConfig) -> NodePools | None:
        if compute.backend != "kubetorch":
            return None  # local backend: no cluster; launches are still gated
        # Even with manage_nodepools off, pools the Helm chart created carry the managed-by
        # label and are enforced on.
        from kubernetes import client

        from gpu_ops.flows.alerts.enforcement import NodePools
        from gpu_ops.flows.compute.kube import load_cluster_config

        load_cluster_config(self.kubeconfig, context=self.context)
        return NodePools(client.CustomObjectsApi())


def _run_op(alerts: AlertsConfig, name: str, payload: str, description: str, resources: frozenset[str] = frozenset(), optional: tuple[str, ...] = ()) -> Any:
    """``dg.op`` for a job the sensor launches: one ``payload`` (and ``optional`` parts)
    in its run config, the ``gpu_ops`` settings resource (and ``resources``), the alerts'
    ``RetryPolicy``."""
    retry = dg.RetryPolicy(max_retries=alerts.run_retries, delay=alerts.run_retry_delay_s, backoff=dg.Backoff.EXPONENTIAL)
    schema = {payload: dg.Permissive(), **{k: dg.Field(dg.Permissive(), is_required=False) for k in optional}}
    return dg.op(name=name, config_schema=schema, required_resource_keys={"gpu_ops", *resources}, retry_policy=retry, description=description)


def _run_job(name: str, op: dg.OpDefinition, description: str) -> dg.JobDefinition:
    return dg.GraphDefinition(name=name, node_defs=[op]).to_job(description=description, tags={"gpu-ops/flow": "alerts"})


def _settings_and_store(context: Any) -> tuple[GpuOpsConfig, TableStore]:
    """The loaded configuration and its table store, as an op of these jobs starts."""
    from gpu_ops.storage.tables import TableStore

    cfg: GpuOpsConfig = context.resources.gpu_ops.load()
    return cfg, TableStore.from_config(cfg)


def _after_this_run(delivery: dict[str, Any]) -> str:
    """What becomes of the alert if this run fails for good (its redelivery schedule)."""
    if not delivery:
        return ""
    if delivery.get("final"):
        return (
            f" This was request {delivery['request']}, the last before alerts.max_pending_s ends at {delivery['dead_letter_at']}: "
            f"the alert is DEAD-LETTERED (table gpu_alert_dead_letters, check {DEAD_LETTER_CHECK} on gpu_budget_status)."
        )
    return (
        f" If this run fails, budget_alert_sensor requests the alert again every {delivery['redelivery_interval_s']:g}s "
        f"(pending since {delivery['pending_since']}) until {delivery['dead_letter_at']}, then dead-letters it."
    )


def build_alert_job(alerts: AlertsConfig) -> dg.JobDefinition:
    @_run_op(alerts, ALERT_OP, "alert", "Deliver one budget alert to its channels; delivered channels are skipped on retry.", optional=("delivery",))
    def deliver_budget_alert(context) -> dg.Output:
        from gpu_ops.flows.alerts.channels import DeliverySettings, deliver
        from gpu_ops.flows.alerts.records import delivered_channels, record_delivery, top_spenders

        cfg, store = _settings_and_store(context)
        alert = Alert.from_dict(context.op_config["alert"])
        if alert.kind == "trigger" and cfg.alerts.top_spenders and not alert.top_spenders:
            try:
                alert = alert.with_top_spenders(top_spenders(store, alert, cfg.alerts.top_spenders))
            except Exception as exc:  # enrichment must never stop the alert itself
                context.log.warning(f"top spenders unavailable ({type(exc).__name__}); sending without them")
        done = delivered_channels(store, alert.idempotency_key)
        if done:
            context.log.info(f"already delivered to {', '.join(sorted(done))} (earlier attempt); not sending there again")

        def on_result(r: Any) -> None:
            record_delivery(store, alert, r, run_id=context.run_id)
            (context.log.info if r.ok else context.log.warning)(f"{r.channel_type} channel {r.channel!r}: {'delivered' if r.ok else 'FAILED'} ({r.detail}; {r.attempts} attempt(s))")

        results = deliver(alert, cfg.channels, settings=DeliverySettings.from_config(cfg.alerts), skip=done, log=context.log.info, on_result=on_result)
        metadata: dict[str, Any] = {
            "budget": alert.budget,
            "threshold": alert.threshold,
            "event": alert.kind,
            "period": alert.period_label,
            "spend_usd": dg.MetadataValue.float(round(alert.spend_usd, 2)),
            "percent_used": dg.MetadataValue.float(round(alert.percent_used, 2)),
            "dedup_key": alert.dedup_key,
            "idempotency_key": alert.idempotency_key,
            "deliveries": dg.MetadataValue.json(
                {**{c: {"ok": True, "detail": "delivered by an earlier attempt"} for c in sorted(done)},
                 **{r.channel: {"ok": r.ok, "attempts": r.attempts, "detail": r.detail} for r in results}}
            ),
        }
        delivery = context.op_config.get("delivery") or {}
        if delivery:
            metadata["delivery"] = dg.MetadataValue.json(delivery)
        failed = [r for r in results if not r.ok]
        if failed:
            retry = any(not r.permanent for r in failed)
            delivered = sorted(done | {r.channel for r in results if r.ok})
            metadata["dead_letter"] = bool(delivery.get("final"))
            from gpu_ops.dagster.failures import AlertDeliveryFailed

            raise AlertDeliveryFailed(
                description=(
                    f"alert {alert.run_key}: delivery failed for "
                    + "; ".join(f"{r.channel} ({r.detail})" for r in failed)
                    + f". Delivered: {', '.join(delivered) or 'none'}."
                    + (" The op's retry policy will try the failed channels again." if retry else " Not retried in this run: the failures are permanent (fix the channel configuration).")
                    + _after_this_run(delivery)
                ),
                metadata=metadata,
                allow_retries=retry,
            )
        return dg.Output(None, metadata=metadata)

    return _run_job(ALERT_JOB, deliver_budget_alert, "Deliver one budget notification (launched by budget_alert_sensor, run key budget/period/threshold).")


def build_enforcement_job(alerts: AlertsConfig) -> dg.JobDefinition:
    @_run_op(
        alerts, ENFORCEMENT_OP, "order", "Apply or revert a budget's throttle/block: NodePool patches and the enforcement record.",
        resources=frozenset({"gpu_ops_karpenter"}),
    )
    def apply_budget_enforcement(context) -> dg.Output:
        from gpu_ops.flows.alerts.enforcement import ENFORCEMENT_TABLE, EnforcementOrder, EnforcementOutcome, execute, plan, record_frame

        cfg, store = _settings_and_store(context)
        order = EnforcementOrder.from_dict(context.op_config["order"])
        existing = store.read(ENFORCEMENT_TABLE, where={"run_key": order.run_key}, missing_ok=True)
        now = _now()

        def record_once(outcome: EnforcementOutcome) -> None:
            if existing.empty:  # a retried op records once
                store.append(ENFORCEMENT_TABLE, record_frame(outcome, at=now, run_id=context.run_id))

        # The record goes first: it is what GpuCompute's launch gate reads, so a block (or
        # its lifting) takes effect even while the cluster is unreachable; the NodePool
        # changes follow, and the op's RetryPolicy retries them.
        try:
            pools = context.resources.gpu_ops_karpenter.node_pools(cfg.compute)
            outcome = plan(order, pools)
        except Exception as exc:
            record_once(EnforcementOutcome(order, note=f"NodePools not reachable ({type(exc).__name__}); the run retries them"))
            raise
        record_once(outcome)
        execute(outcome, pools)
        context.log.info(
            f"{order.event} {order.action} for budget {order.budget} ({order.reason}): "
            f"{len(outcome.plans)} NodePool(s) patched{'; ' + outcome.note if outcome.note else ''}"
        )
        return dg.Output(
            None,
            metadata={
                "budget": order.budget,
                "event": order.event,
                "action": order.action,
                "reason": order.reason,
                "period_start": order.period_start,
                "nodepools": dg.MetadataValue.json(sorted(outcome.plans)),
                "changes": dg.MetadataValue.json(outcome.describe()),
                "note": outcome.note,
            },
        )

    return _run_job(ENFORCEMENT_JOB, apply_budget_enforcement, "Apply or revert one budget enforcement (launched by budget_alert_sensor).")


@dataclass
class TickOutcome:
    cursor: str | None
    requests: list[dg.RunRequest]
    results: list[dg.ExecuteInProcessResult]  # the runs launched by this tick
    skipped: list[str]  # run keys this sensor had already launched
    skip_reason: str | None


def launch_requests(
    defs: dg.Definitions,
    instance: dg.DagsterInstance,
    requests: list[dg.RunRequest],
    *,
    run_config: dict[str, Any] | None = None,
) -> tuple[list[tuple[dg.RunRequest, dg.ExecuteInProcessResult]], list[str]]:
    """Launch a tick's run requests in process as the daemon would: a run key this sensor
    already launched is skipped; the rest run with their jobs' RetryPolicy.

    Returns the launched (request, result) pairs and the skipped run keys.
    """
    launched, skipped = [], []
    for rr in requests:
        assert rr.run_key is not None and rr.job_name is not None  # every request of this sensor names both
        tags = {**rr.tags, RUN_KEY_TAG: rr.run_key, SENSOR_NAME_TAG: SENSOR_NAME}
        if instance.get_runs(filters=RunsFilter(tags={RUN_KEY_TAG: rr.run_key, SENSOR_NAME_TAG: SENSOR_NAME}), limit=1):
            skipped.append(rr.run_key)
            continue
        job = defs.resolve_job_def(rr.job_name)
        config = {**(rr.run_config or {}), **(run_config or {})}
        launched.append((rr, job.execute_in_process(run_config=config, instance=instance, tags=tags, raise_on_error=False)))
    return launched, skipped


def run_sensor_once(defs: dg.Definitions, instance: dg.DagsterInstance, cursor: str | None, *, resources: dict[str, Any] | None = None) -> TickOutcome:
    """One daemon tick in this process, for tests (no daemon running).

    As Dagster's sensor daemon does: evaluate, skip run keys this sensor already launched,
    launch the rest (here in process, with the jobs' RetryPolicy), and hand back the
    cursor to store after the runs.
    """
    sensor = defs.resolve_sensor_def(SENSOR_NAME)
    context = dg.build_sensor_context(instance=instance, cursor=cursor, resources=resources)
    data = sensor.evaluate_tick(context)
    for event in data.asset_events:  # the daemon stores a tick's asset events (check evaluations)
        instance.report_runless_asset_event(event)
    requests = list(data.run_requests or [])
    launched, skipped = launch_requests(defs, instance, requests)
    return TickOutcome(data.cursor if data.cursor is not None else cursor, requests, [r for _, r in launched], skipped, data.skip_message)


def build_alert_definitions(
    config: GpuOpsConfig, *, karpenter: KarpenterAccess | None = None, clock: Clock = _now, bind_to: dg.Definitions | None = None
) -> dg.Definitions:
    """``bind_to``: the definitions whose resources, executor and loggers the jobs run with
    (the shared ones); the jobs are bound to them before the sensor targets them
    (:func:`gpu_ops.dagster.resources.bound_jobs`: no `owners` BetaWarning)."""
    resources = {"gpu_ops_karpenter": karpenter or KarpenterAccess()}
    jobs = [build_alert_job(config.alerts), build_enforcement_job(config.alerts)]
    if bind_to is not None:
        jobs = bound_jobs(jobs, bind_to, resources)
    return dg.Definitions(
        jobs=jobs,
        sensors=[build_sensor(config.alerts, jobs, clock=clock)],
        asset_checks=[build_dead_letter_check(clock)],
        resources=resources,
    )


__all__ = [
    "ALERT_JOB",
    "launch_requests",
    "ENFORCEMENT_JOB",
    "KarpenterAccess",
    "SENSOR_NAME",
    "build_alert_definitions",
    "run_sensor_once",
    "tick",
]
