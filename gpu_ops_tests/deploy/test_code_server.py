"""The chart's code server, for real: `dagster api grpc` started with exactly the command,
arguments and environment the rendered Deployment gives the container, reading the
rendered ConfigMap. The webserver's view of it (the gRPC health check the probes use, the
container context handed to run launches, the schedule and sensor) is checked over gRPC."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpu_ops.flows.compute.local import free_port
from gpu_ops_tests.deploy.chart import container_context, container_env, objects, one, two_gpu_pools, write_config


def _wait_serving(port: int, proc: subprocess.Popen, log: Path, timeout_s: float = 90.0) -> None:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    deadline = time.monotonic() + timeout_s
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                pytest.fail(f"the code server exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
            try:
                # What the Deployment's grpc probes ask: service "DagsterApi".
                reply = stub.Check(health_pb2.HealthCheckRequest(service="DagsterApi"), timeout=2)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            time.sleep(0.5)
    pytest.fail(f"the code server did not become SERVING in {timeout_s}s:\n{log.read_text()[-3000:]}")


@pytest.mark.slow
def test_rendered_code_server_serves_gpu_ops_definitions(tmp_path: Path) -> None:
    from dagster import DagsterInstance
    from dagster._core.remote_origin import GrpcServerCodeLocationOrigin

    objs = objects(two_gpu_pools())
    deployment = one(objs, "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    config_path = write_config(objs, tmp_path)

    port = free_port()
    args = list(container["args"])
    args[args.index("--port") + 1] = str(port)
    args[args.index("--host") + 1] = "127.0.0.1"  # no need to listen beyond this machine
    command = [str(Path(sys.executable).parent / container["command"][0]), *container["command"][1:], *args]

    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPU_OPS_", "DAGSTER_"))}
    for name, entry in container_env(deployment).items():
        if "value" in entry:
            env[name] = entry["value"]
    # What the kubelet would do: the mount paths and the secretKeyRef values.
    env["GPU_OPS_CONFIG"] = str(config_path)
    env["GPU_OPS_HOME"] = str(tmp_path / "home")
    env["HOME"] = str(tmp_path)
    env["GPU_OPS_STORAGE_URL"] = f"sqlite:///{tmp_path / 'costs.db'}"
    for name, entry in container_env(deployment).items():
        if "valueFrom" in entry and name != "GPU_OPS_STORAGE_URL":
            env[name] = f"test-secret-for-{name.lower()}"

    log = tmp_path / "server.log"
    with log.open("w") as out:
        proc = subprocess.Popen(command, env=env, cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT)
    try:
        _wait_serving(port, proc, log)

        # The health check the Dagster tooling itself uses.
        check = subprocess.run([command[0], "api", "grpc-health-check", "-p", str(port)], env=env, capture_output=True, text=True, timeout=60)
        assert check.returncode == 0, check.stdout + check.stderr

        origin = GrpcServerCodeLocationOrigin(host="127.0.0.1", port=port, location_name="gpu_ops")
        with DagsterInstance.ephemeral() as instance:
            with origin.create_location(instance) as location:
                assert location.name == "gpu_ops"
                # Run launches from this location carry the chart's container context and image.
                assert location.container_context == container_context(deployment)
                assert location.container_image == container["image"]
                repo = location.get_repository("__repository__")
                assert "daily_gpu_cost_schedule" in {s.name for s in repo.get_schedules()}
                assert "budget_alert_sensor" in {s.name for s in repo.get_sensors()}
                keys = {n.asset_key.to_user_string() for n in repo.get_asset_node_snaps()}
                assert {"gpu_usage", "gpu_cost_attribution", "gpu_budget_status", "gpu_roi_report", "train_demo_model"} <= keys
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
