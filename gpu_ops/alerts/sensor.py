"""Dagster wiring of the alerts flow: `budget_alert_sensor`, the alert and enforcement jobs.

Delivery design (why run requests, not sends from the sensor):

- The sensor never sends anything. Each state transition becomes a ``RunRequest`` whose
  ``run_key`` is ``budget/period/threshold`` (``.../resolve`` for a resolve,
  ``budget/period/enforce-<action>/apply|revert`` for enforcement). Dagster launches a
  run key once per sensor, and saves the cursor (our state) only after the tick's runs
  are submitted: a daemon that dies mid-tick re-evaluates with the old cursor, yields the
  same keys, and Dagster skips the ones already launched. Nothing is lost (the state is
  never saved ahead of the request) and nothing is requested twice.
- ``budget_alert_job`` delivers one alert. Its op tries each channel a few times with
  backoff, writes a ``delivered`` row right after each success, and fails (retryably)
  when a channel is still down; the op's ``RetryPolicy`` then re-runs it later and the
  delivered channels are skipped. Permanent failures (HTTP 4xx, SMTP 5xx, a missing
  secret) fail without retries. One failing channel never blocks the others.
- The only window left is a crash between a channel's 2xx and the ``delivered`` row; the
  retry resends, with the same PagerDuty ``dedup_key``, webhook ``Idempotency-Key`` and
  e-mail ``Message-ID``, so receivers that honour them see one notification.
- Every alert and enforcement change is a run: the history is the run list in the UI
  (filter by tag ``gpu-ops/budget``), with the outcome per channel in its metadata.

The sensor ticks every 30 s but evaluates fully only when ``gpu_budget_status`` has a new
materialization or ``alerts.evaluation_interval_s`` has passed (the safety net: wall-clock
period ends and config changes such as a raised budget need no new materialization).
"""

from __future__ import annotations

# httpx, pandas and SQLAlchemy (channels, enforcement, records, TableStore) are imported when the sensor evaluates or an op runs, not when the code location loads.
import contextlib
import datetime as dt
import gc
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import dagster as dg

from gpu_ops.alerts.model import Alert
from gpu_ops.alerts.state import AlertCursor, EnforcementEvent, ThresholdEvent, evaluate
from gpu_ops.config import Budget, GpuOpsConfig

if TYPE_CHECKING:
    from gpu_ops.alerts.enforcement import EnforcementOrder, EnforcementOutcome, NodePools
    from gpu_ops.storage.tables import TableStore

SENSOR_NAME = "budget_alert_sensor"
ALERT_JOB = "budget_alert_job"
ENFORCEMENT_JOB = "budget_enforcement_job"
ALERT_OP = "deliver_budget_alert"
ENFORCEMENT_OP = "apply_budget_enforcement"
BUDGET_STATUS = dg.AssetKey("gpu_budget_status")
TICK_INTERVAL_S = 30


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


# --------------------------------------------------------------------------- requests


def alert_for(event: ThresholdEvent, budget: Budget, config: GpuOpsConfig) -> Alert:
    th = next(t for t in budget.thresholds if t.key() == event.threshold)
    row = event.row
    return Alert(
        kind=event.kind,
        budget=budget.name,
        period_start=row.period_start,
        period_end=row.period_end,
        threshold=event.threshold,
        basis=th.basis,
        threshold_usd=th.amount_usd(budget.amount_usd),
        severity=th.effective_severity(budget.amount_usd),  # type: ignore[arg-type]
        amount_usd=budget.amount_usd,
        spend_usd=row.spend_usd,
        percent_used=row.spend_usd / budget.amount_usd * 100.0,
        forecast_usd=row.forecast_usd,
        scope=budget.scope.as_filters(),
        channels=tuple(budget.channels),
        episode=event.episode,
        partition_key=row.partition_key,
        as_of=row.as_of,
        enforcement=budget.enforcement.action,
        dagster_url=config.alerts.dagster_url,
    )


def order_for(event: EnforcementEvent, budget: Budget | None, config: GpuOpsConfig) -> EnforcementOrder:
    from gpu_ops.alerts.enforcement import EnforcementOrder

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
        config_path=str(config.source_path) if config.source_path else None,
    )


def alert_run_request(alert: Alert) -> dg.RunRequest:
    return dg.RunRequest(
        run_key=alert.run_key,
        job_name=ALERT_JOB,
        run_config={"ops": {ALERT_OP: {"config": {"alert": alert.to_dict()}}}},
        tags={"gpu-ops/budget": alert.budget, "gpu-ops/threshold": alert.threshold, "gpu-ops/event": alert.kind, "gpu-ops/period": alert.period_start},
    )


def enforcement_run_request(order: EnforcementOrder) -> dg.RunRequest:
    return dg.RunRequest(
        run_key=order.run_key,
        job_name=ENFORCEMENT_JOB,
        run_config={"ops": {ENFORCEMENT_OP: {"config": {"order": order.to_dict()}}}},
        tags={"gpu-ops/budget": order.budget, "gpu-ops/event": f"enforce-{order.action}-{order.event}", "gpu-ops/period": order.period_start},
    )


def tick(config: GpuOpsConfig, store: TableStore, cursor: AlertCursor, *, now: dt.datetime) -> tuple[AlertCursor, list[dg.RunRequest], str]:
    """One full evaluation: newest status rows + previous state -> new state + run requests."""
    from gpu_ops.alerts.records import read_latest_status

    partition, rows = read_latest_status(store)
    budgets = {b.name: b for b in config.budgets}
    result = evaluate(budgets, rows, cursor.budgets, now)
    requests: list[dg.RunRequest] = []
    for ev in result.alerts:
        budget = budgets[ev.budget]
        if budget.channels:  # no channels: the state still advances, nothing to send
            requests.append(alert_run_request(alert_for(ev, budget, config)))
    for ev in result.enforcement:
        requests.append(enforcement_run_request(order_for(ev, budgets.get(ev.budget), config)))
    new_cursor = AlertCursor(cursor.last_storage_id, now.timestamp(), result.state)
    summary = (
        f"evaluated {len(rows)} budget rows of partition {partition or '(none yet)'}: "
        f"{sum(e.kind == 'trigger' for e in result.alerts)} triggered, {sum(e.kind == 'resolve' for e in result.alerts)} resolved, "
        f"{len(result.enforcement)} enforcement changes"
    )
    return new_cursor, requests, summary


@contextlib.contextmanager
def _collection_deferred() -> Iterator[None]:
    """A tick allocates ~10 objects per budget; with a large configuration in memory each
    full garbage collection walks all of it, several times per tick (most of a 10,000-
    budget tick). Nothing a tick builds is cyclic, so collection waits until it is done."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _latest_storage_id(instance: dg.DagsterInstance | None) -> int | None:
    if instance is None:
        return None
    records = instance.fetch_materializations(BUDGET_STATUS, limit=1).records
    return records[0].storage_id if records else None


def build_sensor(config: GpuOpsConfig, jobs: list[dg.JobDefinition]) -> dg.SensorDefinition:
    interval = config.alerts.evaluation_interval_s

    @dg.sensor(
        name=SENSOR_NAME,
        minimum_interval_seconds=min(TICK_INTERVAL_S, interval),
        jobs=jobs,
        required_resource_keys={"gpu_ops"},
        default_status=dg.DefaultSensorStatus.RUNNING,
        description="Budget thresholds and enforcement from gpu_budget_status: one run per notification or enforcement change.",
    )
    def budget_alert_sensor(context: dg.SensorEvaluationContext) -> dg.SensorResult | dg.SkipReason:
        cfg: GpuOpsConfig = context.resources.gpu_ops.load()
        with _collection_deferred():
            cursor = AlertCursor.decode(context.cursor)
        latest = _latest_storage_id(_instance_or_none(context))
        now = _now()
        new_data = latest is not None and latest != cursor.last_storage_id
        due = cursor.evaluated_at is None or now.timestamp() - cursor.evaluated_at >= cfg.alerts.evaluation_interval_s
        if not (new_data or due):
            return dg.SkipReason(f"no new gpu_budget_status materialization; next full evaluation within {cfg.alerts.evaluation_interval_s}s")
        from gpu_ops.storage.tables import TableStore

        store = TableStore.from_config(cfg)
        with _collection_deferred():
            new_cursor, requests, summary = tick(cfg, store, cursor, now=now)
            new_cursor.last_storage_id = latest if latest is not None else cursor.last_storage_id
            encoded = new_cursor.encode()
        context.log.info(summary)
        return dg.SensorResult(run_requests=requests, cursor=encoded)

    return budget_alert_sensor


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

    def node_pools(self, config: GpuOpsConfig) -> NodePools | None:
        if config.compute.backend != "kubetorch":
            return None  # local backend: no cluster; launches are still gated
        # Even with manage_nodepools off, pools the Helm chart created carry the managed-by
        # label and are enforced on.
        from kubernetes import client

        from gpu_ops.alerts.enforcement import NodePools
        from gpu_ops.compute.kube import load_cluster_config

        load_cluster_config(self.kubeconfig, context=self.context)
        return NodePools(client.CustomObjectsApi())


def _run_op(config: GpuOpsConfig, name: str, payload: str, description: str, resources: frozenset[str] = frozenset()) -> Any:
    """``dg.op`` for a job the sensor launches: one ``payload`` in its run config, the
    ``gpu_ops`` settings resource (and ``resources``), the alerts' ``RetryPolicy``."""
    retry = dg.RetryPolicy(max_retries=config.alerts.run_retries, delay=config.alerts.run_retry_delay_s, backoff=dg.Backoff.EXPONENTIAL)
    return dg.op(name=name, config_schema={payload: dg.Permissive()}, required_resource_keys={"gpu_ops", *resources}, retry_policy=retry, description=description)


def _run_job(name: str, op: dg.OpDefinition, description: str) -> dg.JobDefinition:
    return dg.GraphDefinition(name=name, node_defs=[op]).to_job(description=description, tags={"gpu-ops/flow": "alerts"})


def _settings_and_store(context: Any) -> tuple[GpuOpsConfig, TableStore]:
    """The loaded configuration and its table store, as an op of these jobs starts."""
    from gpu_ops.storage.tables import TableStore

    cfg: GpuOpsConfig = context.resources.gpu_ops.load()
    return cfg, TableStore.from_config(cfg)


def build_alert_job(config: GpuOpsConfig) -> dg.JobDefinition:
    @_run_op(config, ALERT_OP, "alert", "Deliver one budget alert to its channels; delivered channels are skipped on retry.")
    def deliver_budget_alert(context) -> dg.Output:
        from gpu_ops.alerts.channels import DeliverySettings, deliver
        from gpu_ops.alerts.records import delivered_channels, record_delivery, top_spenders

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
        failed = [r for r in results if not r.ok]
        if failed:
            retry = any(not r.permanent for r in failed)
            delivered = sorted(done | {r.channel for r in results if r.ok})
            raise dg.Failure(
                description=(
                    f"alert {alert.run_key}: delivery failed for "
                    + "; ".join(f"{r.channel} ({r.detail})" for r in failed)
                    + f". Delivered: {', '.join(delivered) or 'none'}."
                    + (" The op's retry policy will try the failed channels again." if retry else " Not retried: the failures are permanent (fix the channel configuration).")
                ),
                metadata=metadata,
                allow_retries=retry,
            )
        return dg.Output(None, metadata=metadata)

    return _run_job(ALERT_JOB, deliver_budget_alert, "Deliver one budget notification (launched by budget_alert_sensor, run key budget/period/threshold).")


def build_enforcement_job(config: GpuOpsConfig) -> dg.JobDefinition:
    @_run_op(
        config, ENFORCEMENT_OP, "order", "Apply or revert a budget's throttle/block: NodePool patches and the enforcement record.",
        resources=frozenset({"gpu_ops_karpenter"}),
    )
    def apply_budget_enforcement(context) -> dg.Output:
        from gpu_ops.alerts.enforcement import ENFORCEMENT_TABLE, EnforcementOrder, EnforcementOutcome, execute, plan, record_frame

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
            pools = context.resources.gpu_ops_karpenter.node_pools(cfg)
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
    from dagster._core.storage.dagster_run import RunsFilter
    from dagster._core.storage.tags import RUN_KEY_TAG, SENSOR_NAME_TAG

    launched, skipped = [], []
    for rr in requests:
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
    requests = list(data.run_requests or [])
    launched, skipped = launch_requests(defs, instance, requests)
    return TickOutcome(data.cursor if data.cursor is not None else cursor, requests, [r for _, r in launched], skipped, data.skip_message)


def build_alert_definitions(config: GpuOpsConfig, *, karpenter: KarpenterAccess | None = None) -> dg.Definitions:
    alert_job = build_alert_job(config)
    enforcement_job = build_enforcement_job(config)
    sensor = build_sensor(config, [alert_job, enforcement_job])
    return dg.Definitions(
        jobs=[alert_job, enforcement_job],
        sensors=[sensor],
        resources={"gpu_ops_karpenter": karpenter or KarpenterAccess()},
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
