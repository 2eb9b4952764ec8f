"""Fixtures for the alerts tests: real HTTP receivers on 127.0.0.1, a local SMTP server,
configuration files, budget status rows, and a harness that evaluates the real sensor
against a real Dagster instance and executes the runs it requests.
"""

from __future__ import annotations

import datetime as dt
import http.server
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import yaml

from gpu_ops.flows.compute.local import free_port
from gpu_ops_tests.http_receiver import QuietHandler, reply

PRICES = {"currency": "USD", "source": "test", "as_of": "2026-11-01", "gpus": {"a100-80gb": {"on-demand": 5.12, "spot": 1.79}}}


# --------------------------------------------------------------------------- HTTP receivers


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    status: int | None  # what the receiver answered; None when it hung up / timed out

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class Receiver:
    """An HTTP server that answers from a script: ``[500, 500]`` then 200s, ``"hang"`` sleeps."""

    script: list[Any] = field(default_factory=list)
    hang_s: float = 2.0
    requests: list[Received] = field(default_factory=list)
    server: http.server.ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    @property
    def acknowledged(self) -> list[Received]:
        return [r for r in self.requests if r.status is not None and 200 <= r.status < 300]

    def start(self, port: int = 0) -> "Receiver":
        receiver = self

        class Handler(QuietHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                step = receiver.script.pop(0) if receiver.script else 200
                rec = Received(self.path, dict(self.headers), body, None)
                receiver.requests.append(rec)
                if step == "hang":
                    time.sleep(receiver.hang_s)
                    return  # the client has given up; answer nothing
                rec.status = int(step)
                reply(self, rec.status, b'{"status":"success"}' if rec.status < 300 else b'{"error":"try again"}', "application/json")

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self.server:
            self.server.shutdown()
            self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Any]:
    started: list[Receiver] = []

    def make(script: list[Any] | None = None, *, hang_s: float = 2.0, port: int = 0) -> Receiver:
        r = Receiver(list(script or []), hang_s).start(port)
        started.append(r)
        return r

    yield make
    for r in started:
        r.stop()


# --------------------------------------------------------------------------- SMTP


@pytest.fixture
def smtp_server() -> Iterator[Any]:
    from aiosmtpd.controller import Controller
    from aiosmtpd.handlers import Message

    servers = []

    class Inbox(Message):
        def __init__(self) -> None:
            super().__init__()
            self.messages: list[Any] = []

        def handle_message(self, message: Any) -> None:
            self.messages.append(message)

    def make(*, tls_context: Any = None, require_starttls: bool = False) -> tuple[Any, Any]:
        inbox = Inbox()
        kwargs: dict[str, Any] = {"hostname": "127.0.0.1", "port": free_port()}
        if tls_context is not None:
            kwargs.update(tls_context=tls_context, require_starttls=require_starttls)
        controller = Controller(inbox, **kwargs)
        controller.start()
        servers.append(controller)
        return controller, inbox

    yield make
    for c in servers:
        c.stop()


# --------------------------------------------------------------------------- config and data


def write_config(tmp_path: Path, *, budgets: list[dict], channels: dict, alerts: dict | None = None, compute: dict | None = None, storage_url: str | None = None) -> Path:
    data: dict[str, Any] = {
        "storage": {"url": storage_url or f"sqlite:///{tmp_path / 'costs.db'}"},
        "prices": PRICES,
        "budgets": budgets,
        "channels": channels,
        "alerts": {
            "dagster_url": "http://dagster.example:3000",
            "delivery_attempts": 3,
            "delivery_backoff_s": 0.05,
            "delivery_timeout_s": 0.5,
            "run_retries": 2,
            "run_retry_delay_s": 0.1,
            **(alerts or {}),
        },
    }
    if compute:
        data["compute"] = compute
    path = tmp_path / "gpu_ops.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    # load_config caches by modification time: make sure every rewrite is seen.
    stamp = time.time_ns()
    os.utime(path, ns=(stamp, stamp))
    return path


def status_row(budget: str, *, day: str, spend: float, amount: float, forecast: float | None = None, period_start: str | None = None, period_end: str | None = None) -> dict[str, Any]:
    d = dt.date.fromisoformat(day)
    start = dt.date.fromisoformat(period_start) if period_start else d.replace(day=1)
    end = dt.date.fromisoformat(period_end) if period_end else (start + dt.timedelta(days=32)).replace(day=1)
    return {  # the cost asset's columns; period_end is the period's last day, inclusive
        "budget": budget,
        "period_start": start,
        "period_end": end - dt.timedelta(days=1),
        "amount_usd": float(amount),
        "spend_usd": float(spend),
        "percent_used": spend / amount * 100.0,
        "forecast_usd": forecast,
        "status": "exceeded" if spend >= amount else "warning" if spend >= 0.8 * amount else "ok",
        "thresholds_crossed": [],
        "scope": json.dumps({}),
        "as_of": pd.Timestamp(d + dt.timedelta(days=1), tz="UTC"),
    }


def write_status(store: Any, day: str, rows: list[dict[str, Any]]) -> None:
    df = pd.DataFrame(rows)
    df["forecast_usd"] = df["forecast_usd"].astype(float)
    store.write("gpu_budget_status", df, partition_keys=[day])


# --------------------------------------------------------------------------- sensor harness


HARNESS_NOW = dt.datetime(2026, 11, 20, 6, 0, tzinfo=dt.timezone.utc)


class SensorHarness:
    """Evaluates the real `budget_alert_sensor` with a real instance and runs what it asks
    (through `run_sensor_once`: a run key this sensor already launched is skipped, new
    ones execute in process with the job's real RetryPolicy, the cursor is stored after)."""

    def __init__(self, instance: Any, config_path: Path, *, karpenter: Any = None):
        self.instance = instance
        self.config_path = config_path
        self.karpenter = karpenter
        self.cursor: str | None = None
        self.launched: list[Any] = []
        self.skipped: list[str] = []
        # The sensor's clock, an input: the morning after the 2026-11-19 partition the tests
        # write, so that every test reads the same day whatever the wall clock says.
        self.now: dt.datetime = HARNESS_NOW
        self.reload()

    def clock(self) -> dt.datetime:
        return self.now

    def reload(self) -> None:
        import dagster as dg

        from gpu_ops.dagster.alerts.definitions import build_defs
        from gpu_ops.domain.config import load_config
        from gpu_ops.dagster.resources import GpuOpsSettings

        self.config = load_config(self.config_path)
        self.settings = GpuOpsSettings(config_path=str(self.config_path))
        self.defs = dg.Definitions.merge(build_defs(self.config, karpenter=self.karpenter, clock=self.clock), dg.Definitions(resources={"gpu_ops": self.settings}))

    @property
    def store(self) -> Any:
        from gpu_ops.storage.tables import TableStore

        return TableStore(self.config.storage.resolved_url())

    def evaluate(self, cursor: str | None = None) -> Any:
        import dagster as dg

        sensor = self.defs.resolve_sensor_def("budget_alert_sensor")
        ctx = dg.build_sensor_context(instance=self.instance, cursor=self.cursor if cursor is None else cursor, resources={"gpu_ops": self.settings})
        return sensor.evaluate_tick(ctx)

    def launch(self, run_requests: list[Any]) -> list[Any]:
        """Launch requests as the daemon would (used to replay a tick from an old cursor)."""
        from dagster._core.storage.dagster_run import RunsFilter
        from dagster._core.storage.tags import RUN_KEY_TAG, SENSOR_NAME_TAG

        results = []
        for rr in run_requests:
            if self.instance.get_runs(filters=RunsFilter(tags={RUN_KEY_TAG: rr.run_key, SENSOR_NAME_TAG: "budget_alert_sensor"})):
                self.skipped.append(rr.run_key)
                continue
            tags = {**rr.tags, RUN_KEY_TAG: rr.run_key, SENSOR_NAME_TAG: "budget_alert_sensor"}
            results.append(self.defs.resolve_job_def(rr.job_name).execute_in_process(run_config=rr.run_config, instance=self.instance, tags=tags, raise_on_error=False))
        return results

    def tick(self, *, force: bool = True) -> tuple[list[Any], list[Any]]:
        """One daemon tick (`run_sensor_once`). ``force`` makes the interval safety net due
        (as if evaluation_interval_s had passed)."""
        from gpu_ops.dagster.alerts.sensor import run_sensor_once
        from gpu_ops.domain.alerts.state import AlertCursor

        if force and self.cursor:
            c = AlertCursor.decode(self.cursor)
            c.evaluated_at = None
            self.cursor = c.encode()
        out = run_sensor_once(self.defs, self.instance, self.cursor, resources={"gpu_ops": self.settings})
        self.skipped += out.skipped
        self.cursor = out.cursor
        return out.requests, out.results


def evaluate_in_new_process(h: SensorHarness, tmp_path: Path) -> list[str]:
    """The run keys a fresh process (a restarted daemon) requests from the harness's
    stored cursor, with a full evaluation due."""
    from dagster._serdes import serialize_value

    from gpu_ops.domain.alerts.state import AlertCursor

    cursor = AlertCursor.decode(h.cursor)
    cursor.evaluated_at = None  # make the full evaluation due
    (tmp_path / "cursor.txt").write_text(cursor.encode())
    (tmp_path / "instance_ref.json").write_text(serialize_value(h.instance.get_ref()))
    script = """
import datetime, json, sys
import dagster as dg
from dagster._serdes import deserialize_value
from gpu_ops.dagster.alerts.definitions import build_defs
from gpu_ops.domain.config import load_config
from gpu_ops.dagster.resources import GpuOpsSettings
ref, cursor, config, now = sys.argv[1:5]
instance = dg.DagsterInstance.from_ref(deserialize_value(open(ref).read()))
settings = {"gpu_ops": GpuOpsSettings(config_path=config)}
clock = lambda: datetime.datetime.fromisoformat(now)  # the harness's clock, not the wall clock
defs = dg.Definitions.merge(build_defs(load_config(config), clock=clock), dg.Definitions(resources=settings))
sensor = defs.resolve_sensor_def("budget_alert_sensor")
ctx = dg.build_sensor_context(instance=instance, cursor=open(cursor).read(), resources=settings)
data = sensor.evaluate_tick(ctx)
print(json.dumps([r.run_key for r in data.run_requests or []]))
"""
    out = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "instance_ref.json"), str(tmp_path / "cursor.txt"), str(h.config_path), h.now.isoformat()],
        capture_output=True, text=True, timeout=120,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture
def dagster_instance(tmp_path: Path) -> Iterator[Any]:
    import dagster as dg

    home = tmp_path / "dagster_home"
    home.mkdir()
    with dg.instance_for_test(temp_dir=str(home)) as instance:
        yield instance
