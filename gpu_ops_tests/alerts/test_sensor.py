"""`budget_alert_sensor` end to end: real sensor evaluation on a real Dagster instance,
real job execution (with the op's RetryPolicy), real receivers on 127.0.0.1, a fresh
process reading the stored cursor, rollover, a raised budget, and enforcement."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pandas as pd
import pytest

import gpu_ops.flows.alerts.records as records_mod
from gpu_ops.flows.alerts.enforcement import ENFORCEMENT_TABLE, NodePools
from gpu_ops.dagster.compute.admission import assert_launch_allowed
from gpu_ops.flows.alerts.records import DELIVERIES_TABLE
from gpu_ops.dagster.alerts.sensor import KarpenterAccess
from gpu_ops.flows.compute.karpenter import nodepool_manifest
from gpu_ops.flows.compute.local import free_port
from gpu_ops.domain.compute.request import GpuRequest
from gpu_ops.domain.config import ComputeConfig

from .conftest import SensorHarness, evaluate_in_new_process, status_row, write_config, write_status
from gpu_ops_tests.fake_k8s import FakeCustomObjects

UTC = dt.timezone.utc
SLACK_TOKEN = "T0/B0/sLaCkSeCrEt123"
PD_KEY = "pdRoutingKey0123456789abcdef0000"
HOOK_SECRET = "hook-shared-secret-42"
_APIS: dict[str, FakeCustomObjects] = {}


class FakeKarpenter(KarpenterAccess):
    """The enforcement op's cluster access, pointed at an in-memory CustomObjectsApi."""

    api_id: str = "default"

    def node_pools(self, compute: ComputeConfig) -> NodePools | None:
        return NodePools(_APIS[self.api_id])


def budgets(amount: float = 10_000, enforcement: dict | None = None) -> list[dict]:
    return [
        {
            "name": "nlp-monthly",
            "scope": {"team": "nlp"},
            "amount_usd": amount,
            "thresholds": [{"percent": 50, "severity": "info"}, {"percent": 80}, {"percent": 100, "severity": "critical"}, {"percent": 120, "basis": "forecast"}],
            "channels": ["slack", "oncall", "audit", "log"],
            "enforcement": enforcement or {"action": "throttle", "grace_period": "0s", "max_gpus": 8},
        },
        {"name": "vision-monthly", "scope": {"team": "vision"}, "amount_usd": 5_000, "thresholds": [{"percent": 80}], "channels": ["audit"]},
    ]


def channels(slack_url: str, pd_url: str, hook_url: str) -> dict:
    return {
        "slack": {"type": "slack", "webhook_url": {"env": "SLACK_WEBHOOK_URL"}},
        "oncall": {"type": "pagerduty", "routing_key": {"env": "PD_ROUTING_KEY"}, "events_url": pd_url + "/v2/enqueue"},
        "audit": {"type": "webhook", "url": hook_url + "/gpu-ops", "secret": {"env": "HOOK_SECRET"}},
        "log": {"type": "log"},
    }


@pytest.fixture
def setup(tmp_path, receiver, dagster_instance, monkeypatch, request):
    """Receivers, secrets in the environment, a config, NodePools, a harness."""
    storage_url = request.getfixturevalue("pg_url") if getattr(request, "param", "sqlite") == "postgres" else None
    slack, pd, hook = receiver(), receiver(), receiver()
    monkeypatch.setenv("SLACK_WEBHOOK_URL", f"{slack.url}/services/{SLACK_TOKEN}")
    monkeypatch.setenv("PD_ROUTING_KEY", PD_KEY)
    monkeypatch.setenv("HOOK_SECRET", HOOK_SECRET)
    api_id = request.node.name
    req = GpuRequest(gpu_type="a100-80gb", gpus=8, labels={"team": "nlp"})
    _APIS[api_id] = FakeCustomObjects([nodepool_manifest(req, "spot"), nodepool_manifest(req, "on-demand")])

    def configure(**kw) -> Path:
        return write_config(
            tmp_path, budgets=kw.pop("budgets", budgets()), channels=kw.pop("channels", channels(slack.url, pd.url, hook.url)),
            compute={"backend": "kubetorch"}, storage_url=storage_url, **kw,
        )

    path = configure()
    h = SensorHarness(dagster_instance, path, karpenter=FakeKarpenter(api_id=api_id))
    yield {"h": h, "slack": slack, "pd": pd, "hook": hook, "api": _APIS[api_id], "configure": configure, "tmp": tmp_path}
    _APIS.pop(api_id, None)


def write_attribution(store, days: list[str]) -> None:
    for day in days:
        df = pd.DataFrame(
            {"team": ["nlp", "nlp", "vision", "__idle__"], "project": ["llm", "ner", "det", "__idle__"],
             "gpu_hours": [100.0, 20.0, 5.0, 3.0], "cost_usd": [400.0, 80.0, 20.0, 12.0],
             "on_demand_equivalent_usd": [500.0, 100.0, 25.0, 12.0], "savings_usd": [100.0, 20.0, 5.0, 0.0]}
        )
        store.write("gpu_cost_attribution", df, partition_keys=[day])


def keys(requests) -> list[str]:
    return [r.run_key for r in requests]


def all_run_text(instance) -> str:
    """Every event of every run (logs, metadata, failures), as text."""
    out = []
    for run in instance.get_runs():
        for entry in instance.all_logs(run.run_id):
            out.append(str(entry))
    return "\n".join(out)


@pytest.mark.parametrize("setup", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True)
def test_thresholds_notify_once_and_restarts_send_nothing_new(setup, tmp_path):
    h, slack, pd, hook = setup["h"], setup["slack"], setup["pd"], setup["hook"]
    write_attribution(h.store, ["2026-11-18", "2026-11-19"])
    write_status(h.store, "2026-11-19", [status_row("nlp-monthly", day="2026-11-19", spend=8_500, amount=10_000), status_row("vision-monthly", day="2026-11-19", spend=1_000, amount=5_000)])

    requests, results = h.tick()
    assert keys(requests) == ["nlp-monthly/2026-11-01/actual-50pct", "nlp-monthly/2026-11-01/actual-80pct"]
    assert all(r.success for r in results)
    assert len(slack.acknowledged) == len(pd.acknowledged) == len(hook.acknowledged) == 2

    msg = slack.acknowledged[1].json()
    text = json.dumps(msg, ensure_ascii=False)
    assert msg["text"] == "GPU budget nlp-monthly: spend $8,500.00 of $10,000.00 (85.0%) crossed 80% of budget ($8,000.00)"
    spenders = next(b["text"]["text"] for b in msg["blocks"] if b.get("text", {}).get("text", "").startswith("*Top spenders"))
    assert spenders == "*Top spenders this period*\n• project=llm: $800.00\n• project=ner: $160.00"  # in scope, idle excluded
    assert "team=nlp" in text
    assert "http://dagster.example:3000/assets/gpu_budget_status?view=partitions&partition=2026-11-19" in text
    assert slack.acknowledged[0].path == f"/services/{SLACK_TOKEN}"
    trig = pd.acknowledged[1].json()
    assert trig["payload"]["severity"] == "warning" and trig["dedup_key"] == "gpu-ops/nlp-monthly/2026-11-01/actual-80pct"

    deliveries = h.store.read(DELIVERIES_TABLE)
    assert sorted(deliveries["status"].unique()) == ["delivered"] and len(deliveries) == 8

    # Same data, another tick (the interval safety net): silent.
    requests, _ = h.tick()
    assert requests == []

    # A new process with the stored cursor: silent.
    assert evaluate_in_new_process(h, tmp_path) == []

    # The daemon died after launching the runs but before saving the cursor: the next
    # tick re-evaluates from the old cursor, yields the same run keys, and Dagster skips them.
    requests, results = _tick_with_cursor(h, None)
    assert keys(requests) == ["nlp-monthly/2026-11-01/actual-50pct", "nlp-monthly/2026-11-01/actual-80pct"]
    assert results == [] and h.skipped == keys(requests)
    assert len(slack.requests) == len(pd.requests) == len(hook.requests) == 2

    # No secret anywhere in the runs' logs and metadata, nor in another channel's body.
    run_text = all_run_text(h.instance)
    for secret in (SLACK_TOKEN, PD_KEY, HOOK_SECRET):
        assert secret not in run_text
        assert secret not in h.store.read(DELIVERIES_TABLE).to_string()
    for r in slack.requests + hook.requests:
        assert PD_KEY not in r.body.decode() and HOOK_SECRET not in r.body.decode() + json.dumps(r.headers)


def _tick_with_cursor(h: SensorHarness, cursor: str | None):
    data = h.evaluate(cursor=cursor or "")
    requests = list(data.run_requests or [])
    return requests, h.launch(requests)


def test_enforcement_raise_resolves_and_reverts_rollover_rearms(setup):
    h, pd, api = setup["h"], setup["pd"], setup["api"]
    write_status(h.store, "2026-11-19", [status_row("nlp-monthly", day="2026-11-19", spend=10_500, amount=10_000, forecast=13_000)])
    requests, results = h.tick()
    assert keys(requests) == [
        "nlp-monthly/2026-11-01/actual-50pct", "nlp-monthly/2026-11-01/actual-80pct", "nlp-monthly/2026-11-01/actual-100pct",
        "nlp-monthly/2026-11-01/forecast-120pct", "nlp-monthly/2026-11-01/enforce-throttle/apply",
    ]
    assert all(r.success for r in results)
    assert {o["spec"]["limits"]["nvidia.com/gpu"] for o in api.nodepools.values()} == {"8"}
    enforce_run = results[-1]
    assert enforce_run.success
    out_meta = next(e for e in enforce_run.all_events if e.event_type_value == "STEP_OUTPUT").event_specific_data.metadata
    assert out_meta["action"].value == "throttle" and sorted(out_meta["nodepools"].value) == sorted(api.nodepools)
    rows = h.store.read(ENFORCEMENT_TABLE)
    assert list(rows["event"]) == ["applied"] and json.loads(rows["pools"][0]) == sorted(api.nodepools)
    # A throttled scope refuses a launch that cannot fit.
    with pytest.raises(Exception, match="throttled to 8 GPUs by budget 'nlp-monthly'"):
        assert_launch_allowed(h.config, GpuRequest(gpu_type="a100-80gb", gpus=8, workers=2, labels={"team": "nlp"}), now=h.now)

    # The budget is raised mid-period: the alarms above the new lines resolve (PagerDuty
    # closes the same incident) and the throttle is reverted, without a new materialization.
    setup["configure"](budgets=budgets(amount=20_000))
    h.reload()
    requests, results = h.tick()
    assert keys(requests) == [
        "nlp-monthly/2026-11-01/actual-80pct/resolve", "nlp-monthly/2026-11-01/actual-100pct/resolve",
        "nlp-monthly/2026-11-01/forecast-120pct/resolve", "nlp-monthly/2026-11-01/enforce-throttle/revert",
    ]
    assert all(r.success for r in results)
    assert {o["spec"]["limits"]["nvidia.com/gpu"] for o in api.nodepools.values()} == {"64"}
    assert all(not o["metadata"].get("annotations") for o in api.nodepools.values())
    assert list(h.store.read(ENFORCEMENT_TABLE)["event"]) == ["applied", "reverted"]
    events = [r.json() for r in pd.acknowledged]
    trigger = next(e for e in events if e["event_action"] == "trigger" and e["dedup_key"].endswith("actual-100pct"))
    resolve = next(e for e in events if e["event_action"] == "resolve" and e["dedup_key"].endswith("actual-100pct"))
    assert trigger["dedup_key"] == resolve["dedup_key"] and trigger["payload"]["severity"] == "critical"

    # December: every threshold re-arms.
    h.now = dt.datetime(2026, 12, 2, 6, 0, tzinfo=UTC)
    write_status(h.store, "2026-12-01", [status_row("nlp-monthly", day="2026-12-01", spend=11_000, amount=20_000)])
    requests, results = h.tick()
    assert keys(requests) == ["nlp-monthly/2026-12-01/actual-50pct"]
    assert all(r.success for r in results)


def test_a_channel_down_longer_than_in_op_retries_is_retried_by_the_run(setup, receiver):
    """Slack answers 500 three times (the op's own tries), then 200; the op's RetryPolicy
    tries again and only Slack is resent. Everything else is delivered exactly once."""
    h, slack, pd, hook = setup["h"], setup["slack"], setup["pd"], setup["hook"]
    slack.script[:] = [500, 500, 500]
    write_status(h.store, "2026-11-19", [status_row("nlp-monthly", day="2026-11-19", spend=5_100, amount=10_000)])
    requests, results = h.tick()
    assert keys(requests) == ["nlp-monthly/2026-11-01/actual-50pct"]
    assert results[0].success
    assert [r.status for r in slack.requests] == [500, 500, 500, 200]
    assert len(pd.requests) == len(hook.requests) == 1
    starts = [e for e in results[0].all_events if e.event_type_value == "STEP_RESTARTED"]
    assert len(starts) == 1


def test_a_refused_channel_fails_the_run_and_a_reexecution_delivers_it_once(setup, receiver):
    h, slack = setup["h"], setup["slack"]
    port = free_port()
    chans = channels(slack.url, setup["pd"].url, setup["hook"].url)
    chans["audit"]["url"] = f"http://127.0.0.1:{port}/gpu-ops"
    setup["configure"](channels=chans)
    h.reload()
    write_status(h.store, "2026-11-19", [status_row("nlp-monthly", day="2026-11-19", spend=5_100, amount=10_000)])
    requests, results = h.tick()
    run = results[0]
    assert not run.success
    failure = next(e for e in run.all_events if e.event_type_value == "STEP_FAILURE")
    error, description = failure.event_specific_data.error, ""
    while error is not None:  # "Exceeded max_retries", caused by our Failure
        description, error = description + error.message, error.cause
    assert "delivery failed for audit (connection refused or unreachable" in description and f"127.0.0.1:{port}/…" in description
    assert len(slack.acknowledged) == 1 and len(setup["pd"].acknowledged) == 1  # not blocked, not repeated by retries
    delivered = h.store.read(DELIVERIES_TABLE, where={"status": "delivered"})
    assert sorted(delivered["channel"]) == ["log", "oncall", "slack"]

    # The endpoint comes back; re-executing the run (as from the UI) delivers only it.
    audit = receiver(port=port)
    rerun = h.defs.resolve_job_def(requests[0].job_name).execute_in_process(run_config=requests[0].run_config, instance=h.instance, raise_on_error=False)
    assert rerun.success
    assert len(audit.acknowledged) == 1 and len(slack.acknowledged) == 1 and len(setup["pd"].acknowledged) == 1


def test_a_crash_between_send_and_record_resends_with_the_same_keys(setup, monkeypatch):
    """The window at-least-once leaves open: the resend carries the same PagerDuty
    dedup_key and webhook Idempotency-Key, so those receivers see one notification."""
    h, pd, hook = setup["h"], setup["pd"], setup["hook"]
    real = records_mod.record_delivery
    crashed = []

    def crash_once(store, alert, result, *, run_id):
        if result.channel == "audit" and not crashed:
            crashed.append(True)
            raise RuntimeError("process killed after the send")
        real(store, alert, result, run_id=run_id)

    # The alert op imports record_delivery when it runs (not when the code location loads).
    monkeypatch.setattr(records_mod, "record_delivery", crash_once)
    write_status(h.store, "2026-11-19", [status_row("nlp-monthly", day="2026-11-19", spend=5_100, amount=10_000)])
    _, results = h.tick()
    assert results[0].success
    assert len(hook.acknowledged) == 2 and len({r.headers["Idempotency-Key"] for r in hook.acknowledged}) == 1
    assert len(pd.acknowledged) == 1  # recorded before the crash: not resent


def test_sensor_skips_when_nothing_is_new_and_evaluates_after_a_materialization(setup):
    import dagster as dg

    h = setup["h"]
    write_status(h.store, "2026-11-19", [status_row("nlp-monthly", day="2026-11-19", spend=100, amount=10_000)])
    h.tick()
    data = h.evaluate()
    assert data.skip_message and "no new gpu_budget_status materialization" in data.skip_message
    h.instance.report_runless_asset_event(dg.AssetMaterialization(asset_key="gpu_budget_status", partition="2026-11-19"))
    before = h.cursor
    data = h.evaluate()
    assert data.run_requests == [] and data.cursor != before  # evaluated: the cursor moved on
    assert "no new gpu_budget_status materialization" not in (data.skip_message or "")


def test_the_definitions_load_and_register_the_sensor_and_jobs():
    from gpu_ops.definitions import defs

    sensor = defs.resolve_sensor_def("budget_alert_sensor")
    assert sorted(t.job_name for t in sensor.targets) == ["budget_alert_job", "budget_enforcement_job"]
    assert defs.resolve_job_def("budget_alert_job") and defs.resolve_job_def("budget_enforcement_job")
