"""A training attempt's GPU-hours, cost, preemptions and hardware on its MLflow run.

Design: docs/concepts/observability.md#mlflow-runs
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import sys
import time
import urllib.parse
from collections.abc import Iterator, Mapping
from typing import Any

from gpu_ops.flows.bounded_http import Bounds, RemoteError, exchange
from gpu_ops.domain.config import is_http_url
from gpu_ops.domain.formatting import redact_url

URI_VAR = "GPU_OPS_MLFLOW_TRACKING_URI"
BOUNDS = {"MLFLOW_HTTP_REQUEST_TIMEOUT": "10", "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2"}
_MAX_ANSWER = 1 << 20


def wanted() -> bool:
    """Could an MLflow run apply? Cheap: imports nothing."""
    if os.environ.get("MLFLOW_RUN_ID") or os.environ.get(URI_VAR):
        return True
    mlflow = sys.modules.get("mlflow")
    return mlflow is not None and getattr(mlflow, "active_run", lambda: None)() is not None


def _without_userinfo(uri: str) -> str:
    """A server's URI as the outbox keeps it: no userinfo, query or fragment (no secret)."""
    parts = urllib.parse.urlsplit(uri)
    if not parts.netloc:
        return uri  # a local store (file:, sqlite:) or a profile name (databricks)
    return urllib.parse.urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2], query="", fragment=""))


def target(run_id: str, asset_key: str) -> dict[str, Any] | None:
    """Where the record of an attempt of Dagster run ``run_id`` and ``asset_key`` goes,
    known without a network call: ``tracking_uri`` (no userinfo) and the MLflow
    ``mlflow_run_id`` and ``experiment_id`` where they are known, else the experiment's name
    and the tags that find the run again."""
    if not wanted():
        return None
    mlflow = sys.modules.get("mlflow")
    active = mlflow.active_run() if mlflow is not None and hasattr(mlflow, "active_run") else None
    if mlflow is not None and active is not None:
        return {"tracking_uri": _without_userinfo(str(mlflow.get_tracking_uri())), "mlflow_run_id": active.info.run_id, "experiment_id": active.info.experiment_id}
    explicit = os.environ.get("MLFLOW_RUN_ID")
    if explicit:
        return {"tracking_uri": _without_userinfo(os.environ.get("MLFLOW_TRACKING_URI", "")), "mlflow_run_id": explicit}
    return {
        "tracking_uri": _without_userinfo(os.environ[URI_VAR]),
        "experiment_name": os.environ.get("MLFLOW_EXPERIMENT_NAME") or f"gpu_ops/{asset_key}",
        "run_tags": {"dagster.run_id": run_id, "dagster.asset_key": asset_key}, "run_name": f"{asset_key} {run_id[:8]}",
    }


def record(row: Any, *, cost_usd: float | None, so_far: Mapping[str, float], labelled_experiment: str = "") -> dict[str, Any]:
    """The attempt ``row`` (a ledger row) and the run's totals ``so_far`` as MLflow metrics and tags."""
    metrics = {
        "gpu_ops.attempt.gpu_hours": float(row.gpu_hours),
        "gpu_ops.attempt.seconds": float(row.duration_s),
        "gpu_ops.attempt.lost_seconds": float(row.lost_seconds),
        "gpu_ops.attempt.preempted": 1.0 if row.outcome == "preempted" else 0.0,
        **({"gpu_ops.attempt.cost_usd": float(cost_usd)} if cost_usd is not None else {}),
        **{f"gpu_ops.{k}": float(v) for k, v in so_far.items()},
    }
    tags = {
        "gpu_ops.gpu_type": row.gpu_type, "gpu_ops.gpu_count": str(row.gpu_count), "gpu_ops.capacity_type": row.capacity_type,
        "gpu_ops.sharing": row.sharing, "gpu_ops.hardware_source": row.hardware_source,
        "gpu_ops.declared_gpu": f"{row.declared_gpu_count}x {row.declared_gpu_type}",
        "gpu_ops.team": row.team, "gpu_ops.project": row.project, "gpu_ops.last_outcome": row.outcome,
        "dagster.run_id": row.run_id, "dagster.asset_key": row.asset_key, "gpu_ops.label.experiment_id": labelled_experiment,
    }
    return {
        "at_ms": int(row.end.timestamp() * 1000), "step": int(row.attempt), "metrics": metrics,
        "tags": {k: str(v) for k, v in tags.items() if v not in (None, "")},
    }


def export(payload: Mapping[str, Any], deadline_s: float) -> str:
    """Log a queued record (:func:`target` and :func:`record`) to its MLflow run, within
    ``deadline_s`` for an http(s) server; the run's experiment id."""
    uri = str(payload.get("tracking_uri") or "")
    client: _Rest | _Client = _Rest(uri, deadline_s) if is_http_url(uri) else _Client(uri)
    run_id, experiment_id = _resolve(client, payload)
    client.log_batch(run_id, payload)
    return experiment_id


def _resolve(client: _Rest | _Client, payload: Mapping[str, Any]) -> tuple[str, str]:
    explicit = payload.get("mlflow_run_id")
    if explicit:
        return str(explicit), str(payload.get("experiment_id") or client.run_experiment(str(explicit)))
    name, tags = str(payload["experiment_name"]), dict(payload["run_tags"])
    experiment_id = client.experiment_by_name(name) or client.create_experiment(name)
    run_id = client.find_run(experiment_id, tags) or client.create_run(experiment_id, tags, str(payload.get("run_name") or ""))
    return run_id, experiment_id


def _filter(tags: Mapping[str, str]) -> str:
    return " and ".join(f"tags.`{k}` = '{str(v).replace(chr(39), chr(39) * 2)}'" for k, v in tags.items())


# --------------------------------------------------------------------------- http(s): REST, one deadline


class _Missing(Exception):
    pass


def _same_server(a: str, b: str) -> bool:
    pa, pb = urllib.parse.urlsplit(a), urllib.parse.urlsplit(b)
    return (pa.scheme, pa.hostname, pa.port) == (pb.scheme, pb.hostname, pb.port)


def _auth(uri: str) -> dict[str, str]:
    """The sender's credentials for the server ``uri`` names (see the module docstring)."""
    for var in (URI_VAR, "MLFLOW_TRACKING_URI"):
        configured = os.environ.get(var, "")
        parts = urllib.parse.urlsplit(configured) if "://" in configured else None
        if parts is not None and parts.username is not None and _same_server(configured, uri):
            user, password = urllib.parse.unquote(parts.username), urllib.parse.unquote(parts.password or "")
            return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}
    if os.environ.get("MLFLOW_TRACKING_TOKEN"):
        return {"Authorization": f"Bearer {os.environ['MLFLOW_TRACKING_TOKEN']}"}
    if os.environ.get("MLFLOW_TRACKING_USERNAME"):
        pair = f"{os.environ['MLFLOW_TRACKING_USERNAME']}:{os.environ.get('MLFLOW_TRACKING_PASSWORD', '')}"
        return {"Authorization": "Basic " + base64.b64encode(pair.encode()).decode()}
    return {}


class _Rest:
    """MLflow's REST API (``/api/2.0/mlflow``); every call shares one deadline."""

    def __init__(self, uri: str, deadline_s: float):
        self.base, self.where = uri.rstrip("/"), redact_url(uri)
        self.deadline_s, self.until = deadline_s, time.monotonic() + deadline_s
        self.headers = {"Content-Type": "application/json", **_auth(uri)}
        self.ca_file = os.environ.get("MLFLOW_TRACKING_SERVER_CERT_PATH") or None

    def call(self, method: str, path: str, body: Mapping[str, Any] | None = None, query: Mapping[str, str] | None = None) -> dict[str, Any]:
        left = self.until - time.monotonic()
        if left <= 0:
            raise RemoteError(self.where, f"no complete answer within the deadline of {self.deadline_s:g} s", kind="deadline", sent=False)
        url = f"{self.base}/api/2.0/mlflow/{path}" + (f"?{urllib.parse.urlencode(query)}" if query else "")
        data = json.dumps(body).encode() if body is not None else b""
        with exchange(method, url, bounds=Bounds(left, _MAX_ANSWER), headers=self.headers, body=data, ca_file=self.ca_file) as ex:
            answer = ex.read()
        try:
            parsed = json.loads(answer.body or b"{}")
        except ValueError:
            parsed = {}
        if answer.status == 404 and isinstance(parsed, dict) and parsed.get("error_code") == "RESOURCE_DOES_NOT_EXIST":
            raise _Missing(path)
        if not 200 <= answer.status < 300 or not isinstance(parsed, dict):
            code = parsed.get("error_code", "") if isinstance(parsed, dict) else ""
            raise RemoteError(self.where, f"{path} answered HTTP {answer.status} {code}".rstrip(), kind="protocol", sent=True)
        return parsed

    def experiment_by_name(self, name: str) -> str | None:
        try:
            return str(self.call("GET", "experiments/get-by-name", query={"experiment_name": name})["experiment"]["experiment_id"])
        except _Missing:
            return None

    def create_experiment(self, name: str) -> str:
        return str(self.call("POST", "experiments/create", {"name": name})["experiment_id"])

    def find_run(self, experiment_id: str, tags: Mapping[str, str]) -> str | None:
        runs = self.call("POST", "runs/search", {"experiment_ids": [experiment_id], "filter": _filter(tags), "max_results": 1}).get("runs") or []
        return str(runs[0]["info"]["run_id"]) if runs else None

    def create_run(self, experiment_id: str, tags: Mapping[str, str], name: str) -> str:
        body = {"experiment_id": experiment_id, "start_time": int(time.time() * 1000), "run_name": name, "tags": [{"key": k, "value": v} for k, v in tags.items()]}
        return str(self.call("POST", "runs/create", body)["run"]["info"]["run_id"])

    def run_experiment(self, run_id: str) -> str:
        return str(self.call("GET", "runs/get", query={"run_id": run_id})["run"]["info"]["experiment_id"])

    def log_batch(self, run_id: str, payload: Mapping[str, Any]) -> None:
        at, step = int(payload["at_ms"]), int(payload["step"])
        metrics = [{"key": k, "value": float(v), "timestamp": at, "step": step} for k, v in payload["metrics"].items()]
        self.call("POST", "runs/log-batch", {"run_id": run_id, "metrics": metrics, "tags": [{"key": k, "value": v} for k, v in payload["tags"].items()]})


# --------------------------------------------------------------------------- any other store: the mlflow client


@contextlib.contextmanager
def bounded() -> Iterator[None]:
    """MLflow's HTTP timeout and retries bounded for the calls inside (unless the user set them)."""
    added = {k: v for k, v in BOUNDS.items() if k not in os.environ}
    os.environ.update(added)
    try:
        yield
    finally:
        for k in added:
            os.environ.pop(k, None)


class _Client:
    """The ``mlflow`` client, for tracking URIs that are not http(s) (local stores, Databricks)."""

    def __init__(self, uri: str):
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=uri or None)

    def experiment_by_name(self, name: str) -> str | None:
        with bounded():
            found = self.client.get_experiment_by_name(name)
        return str(found.experiment_id) if found is not None else None

    def create_experiment(self, name: str) -> str:
        with bounded():
            return str(self.client.create_experiment(name))

    def find_run(self, experiment_id: str, tags: Mapping[str, str]) -> str | None:
        with bounded():
            found = self.client.search_runs([experiment_id], filter_string=_filter(tags), max_results=1)
        return str(found[0].info.run_id) if found else None

    def create_run(self, experiment_id: str, tags: Mapping[str, str], name: str) -> str:
        with bounded():
            return str(self.client.create_run(experiment_id, tags=dict(tags), run_name=name).info.run_id)

    def run_experiment(self, run_id: str) -> str:
        with bounded():
            return str(self.client.get_run(run_id).info.experiment_id)

    def log_batch(self, run_id: str, payload: Mapping[str, Any]) -> None:
        from mlflow.entities import Metric, RunTag

        at, step = int(payload["at_ms"]), int(payload["step"])
        with bounded():
            self.client.log_batch(
                run_id, metrics=[Metric(k, float(v), at, step) for k, v in payload["metrics"].items()], tags=[RunTag(k, v) for k, v in payload["tags"].items()]
            )
