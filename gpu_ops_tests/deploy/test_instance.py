"""The two Dagster instances of the repository, loaded through Dagster's own config schema.

- deploy/dagster.yaml, the production instance: turned into the run-worker Job the
  K8sRunLauncher would create for a gpu_ops run, kept equal to the Dagster chart values
  example, and its storage section used for a real run on PostgreSQL.
- dagster.yaml (top level), the local instance Dagster's commands use in the repository
  root when DAGSTER_HOME is unset: SQLite under .gpu_ops, the GPU pool limit, the run
  queue's tag limits, run monitoring (the commands themselves: foundation/test_code_location.py)."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import dagster as dg
import pytest
import yaml

from gpu_ops import gpu_run_tags
from gpu_ops.domain.compute.request import Attribution, GpuRequest
from gpu_ops_tests.conftest import REPO
from gpu_ops_tests.deploy.chart import EXAMPLES, K8S_VERSION, code_server_objects, container_context, objects, one, two_gpu_pools

PRODUCTION = REPO / "deploy" / "dagster.yaml"
LOCAL = REPO / "dagster.yaml"

INSTANCE_ENV = {
    "DAGSTER_PG_USERNAME": "dagster",
    "DAGSTER_PG_PASSWORD": "not-a-real-password",
    "DAGSTER_PG_HOST": "dagster-postgresql.dagster.svc",
    "DAGSTER_PG_DB": "dagster",
    "DAGSTER_PG_PORT": "5432",
    "DAGSTER_HOME": "/opt/dagster/dagster_home",
    "DAGSTER_K8S_JOB_NAMESPACE": "dagster",
    "DAGSTER_K8S_INSTANCE_CONFIG_MAP": "dagster-instance",
    "DAGSTER_K8S_PG_PASSWORD_SECRET": "dagster-postgresql-secret",
    "DAGSTER_K8S_PIPELINE_RUN_ENV_CONFIGMAP": "dagster-pipeline-env",
}


@pytest.fixture
def instance_env(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    for k, v in INSTANCE_ENV.items():
        monkeypatch.setenv(k, v)
    return INSTANCE_ENV


def _instance_config(path: Path = PRODUCTION) -> dict:
    """The file as Dagster's instance schema validates it (environment variables resolved)."""
    from dagster._core.instance.config import dagster_instance_config

    config, custom_class = dagster_instance_config(str(path.parent), path.name)
    assert custom_class is None
    return dict(config)


def _process(config_type, value) -> dict:
    from dagster._config import process_config

    result = process_config(config_type, value)
    assert result.success, [e.message for e in result.errors]
    return result.value


def test_dagster_yaml_passes_dagsters_instance_schema(instance_env: dict[str, str]) -> None:
    from dagster._core.run_coordinator import QueuedRunCoordinator
    from dagster_k8s import K8sRunLauncher
    from dagster_postgres import DagsterPostgresStorage

    config = _instance_config()

    storage = _process(DagsterPostgresStorage.config_type(), config["storage"]["postgres"])
    assert storage["postgres_db"] == {
        "username": "dagster", "password": "not-a-real-password", "hostname": "dagster-postgresql.dagster.svc",
        "db_name": "dagster", "port": 5432, "params": {}, "scheme": "postgresql+psycopg2",
    }

    assert (config["run_launcher"]["module"], config["run_launcher"]["class"]) == ("dagster_k8s", "K8sRunLauncher")
    launcher = _process(K8sRunLauncher.config_type(), config["run_launcher"]["config"])
    assert launcher["job_namespace"] == "dagster" and launcher["instance_config_map"] == "dagster-instance"
    assert launcher["env_config_maps"] == ["dagster-pipeline-env"]

    coordinator = _process(QueuedRunCoordinator.config_type(), config["run_coordinator"]["config"])
    limits = {(l["key"], json.dumps(l.get("value"))): l["limit"] for l in coordinator["tag_concurrency_limits"]}
    assert limits[("gpu-ops/gpu-launch", "null")] > 0
    assert limits[("gpu-ops/team", json.dumps({"applyLimitPerUniqueValue": True}))] > 0
    assert limits[("gpu-ops/team", json.dumps({"applyLimitPerUniqueValue": True}))] < limits[("gpu-ops/gpu-launch", "null")]

    # Lost run workers are resumed, then retried; asset/op failures are not run-retried.
    assert config["run_monitoring"]["enabled"] is True and config["run_monitoring"]["max_resume_run_attempts"] >= 1
    assert config["run_retries"] == {"enabled": True, "max_retries": 2, "retry_on_asset_or_op_failure": False}


def test_dagster_yaml_run_pods_tolerate_nothing_gpu_specific(instance_env: dict[str, str]) -> None:
    k8s = _instance_config()["run_launcher"]["config"]["run_k8s_config"]
    text = json.dumps(k8s)
    assert "nvidia.com/gpu" not in text, "run workers must not request, select or tolerate GPUs"
    assert k8s["pod_spec_config"]["tolerations"] == []
    terms = k8s["pod_spec_config"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms == [{"matchExpressions": [{"key": "karpenter.k8s.aws/instance-gpu-count", "operator": "DoesNotExist"}]}]


def test_missing_environment_variable_is_named(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from dagster import DagsterInstance
    from dagster._core.errors import DagsterInvalidConfigError

    for k, v in INSTANCE_ENV.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("DAGSTER_PG_HOST")
    storage_only = {"storage": yaml.safe_load(PRODUCTION.read_text())["storage"]}
    (tmp_path / "dagster.yaml").write_text(yaml.safe_dump(storage_only))
    with pytest.raises(DagsterInvalidConfigError, match="DAGSTER_PG_HOST"):
        DagsterInstance.from_config(str(tmp_path))


def test_run_worker_job_for_a_gpu_ops_run(instance_env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The Job the K8sRunLauncher creates for a run of this chart's code location, built by
    dagster-k8s itself from dagster.yaml plus the chart's container context, captured at
    the Kubernetes API call and validated against the Kubernetes schema."""
    import kubernetes
    import kubernetes_validate
    from dagster import DagsterInstance
    from dagster._core.code_pointer import ModuleCodePointer
    from dagster._core.origin import JobPythonOrigin, RepositoryPythonOrigin
    from dagster._core.storage.dagster_run import DagsterRun
    from dagster_k8s import K8sRunLauncher

    chart_objs = objects(two_gpu_pools())
    deployment = one(chart_objs, "Deployment")
    image = deployment["spec"]["template"]["spec"]["containers"][0]["image"]

    # Outside a cluster: the launcher loads a kubeconfig (never contacted) instead.
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "test",
        "clusters": [{"name": "test", "cluster": {"server": "https://127.0.0.1:1"}}],
        "users": [{"name": "test", "user": {"token": "x"}}],
        "contexts": [{"name": "test", "context": {"cluster": "test", "user": "test"}}],
    }))
    launcher_config = _process(K8sRunLauncher.config_type(), _instance_config()["run_launcher"]["config"])
    launcher_config.update(load_incluster_config=False, kubeconfig_file=str(kubeconfig))
    launcher = K8sRunLauncher.from_config_value(None, launcher_config)  # as DagsterInstance does

    with DagsterInstance.ephemeral() as instance:
        launcher.register_instance(instance)
        origin = JobPythonOrigin(
            "__ASSET_JOB",
            RepositoryPythonOrigin(
                executable_path="/opt/venv/bin/python",
                code_pointer=ModuleCodePointer("gpu_ops.definitions", "defs", working_directory=None),
                container_image=image,
                container_context=container_context(deployment),
            ),
        )
        run = instance.add_run(DagsterRun(job_name="__ASSET_JOB", run_id=str(uuid.uuid4()), job_code_origin=origin,
                                          tags={"gpu-ops/gpu-launch": "true", "gpu-ops/team": "nlp"}))
        created: list = []
        monkeypatch.setattr(launcher._api_client, "create_namespaced_job_with_retries", lambda body, namespace: created.append((body, namespace)))
        launcher._launch_k8s_job_with_args("dagster-run-test", ["dagster", "api", "execute_run", "{}"], run)

    (job, namespace), = created
    assert namespace == "dagster"
    manifest = kubernetes.client.ApiClient().sanitize_for_serialization(job)
    manifest.setdefault("apiVersion", "batch/v1")
    manifest.setdefault("kind", "Job")
    kubernetes_validate.validate(manifest, K8S_VERSION, strict=True)

    pod = manifest["spec"]["template"]
    spec = pod["spec"]
    container = spec["containers"][0]
    assert container["image"] == image
    assert spec["serviceAccountName"] == one(code_server_objects(chart_objs), "ServiceAccount")["metadata"]["name"]
    assert "nvidia.com/gpu" not in json.dumps(manifest)
    assert not spec.get("tolerations")
    assert pod["metadata"]["annotations"]["karpenter.sh/do-not-disrupt"] == "true"
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    # The GPU_OPS_CONFIG file and the secrets reach the run worker exactly as the code server has them.
    env = {e["name"]: e for e in container["env"]}
    assert env["GPU_OPS_CONFIG"]["value"] == "/etc/gpu-ops/gpu_ops.yaml"
    server_env = {e["name"]: e for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    for name, entry in server_env.items():
        if "valueFrom" in entry:
            assert env[name]["valueFrom"] == entry["valueFrom"], name
    assert {"name": "gpu-ops-config", "mountPath": "/etc/gpu-ops", "readOnly": True} in container["volumeMounts"]
    assert {"configMap": {"name": one(chart_objs, "ConfigMap")["metadata"]["name"]}, "name": "gpu-ops-config"} in spec["volumes"]
    # The Dagster chart's instance and database password reach the worker as configured.
    assert {"configMapRef": {"name": "dagster-pipeline-env"}} in container["envFrom"]
    assert env["DAGSTER_PG_PASSWORD"]["valueFrom"]["secretKeyRef"]["name"] == "dagster-postgresql-secret"


def test_dagster_chart_values_carry_the_same_instance_settings(instance_env: dict[str, str]) -> None:
    """helm/gpu-ops/examples/dagster-values.yaml (for the official Dagster chart) and
    deploy/dagster.yaml must not drift apart."""
    config = _instance_config()
    values = yaml.safe_load((EXAMPLES / "dagster-values.yaml").read_text())
    daemon = values["dagsterDaemon"]

    queued = daemon["runCoordinator"]["config"]["queuedRunCoordinator"]
    assert queued["tagConcurrencyLimits"] == config["run_coordinator"]["config"]["tag_concurrency_limits"]
    assert queued["maxConcurrentRuns"] == config["run_coordinator"]["config"]["max_concurrent_runs"]

    monitoring = config["run_monitoring"]
    assert daemon["runMonitoring"] == {
        "enabled": monitoring["enabled"],
        "startTimeoutSeconds": monitoring["start_timeout_seconds"],
        "pollIntervalSeconds": monitoring["poll_interval_seconds"],
        "maxResumeRunAttempts": monitoring["max_resume_run_attempts"],
        "cancelTimeoutSeconds": monitoring["cancel_timeout_seconds"],
        "freeSlotsAfterRunEndSeconds": monitoring["free_slots_after_run_end_seconds"],
    }
    retries = config["run_retries"]
    assert daemon["runRetries"] == {
        "enabled": retries["enabled"], "maxRetries": retries["max_retries"],
        "retryOnAssetOrOpFailure": retries["retry_on_asset_or_op_failure"],
    }

    k8s = values["runLauncher"]["config"]["k8sRunLauncher"]
    run_k8s = config["run_launcher"]["config"]["run_k8s_config"]
    assert k8s["runK8sConfig"]["podTemplateSpecMetadata"] == run_k8s["pod_template_spec_metadata"]
    pod_spec = dict(k8s["runK8sConfig"]["podSpecConfig"])
    assert pod_spec.pop("securityContext") == run_k8s["pod_spec_config"]["security_context"]
    assert pod_spec == {k: v for k, v in run_k8s["pod_spec_config"].items() if k != "security_context"}
    assert k8s["runK8sConfig"]["containerConfig"]["resources"] == run_k8s["container_config"]["resources"]
    assert k8s["runK8sConfig"]["containerConfig"]["securityContext"] == run_k8s["container_config"]["security_context"]

    assert values["postgresql"]["postgresqlScheme"] == config["storage"]["postgres"]["postgres_db"]["scheme"]

    # The workspace points at this chart's Service.
    svc = one(objects(), "Service")
    server = values["dagsterWebserver"]["workspace"]["servers"][0]
    assert server == {"host": f"{svc['metadata']['name']}.dagster.svc.cluster.local", "port": svc["spec"]["ports"][0]["port"], "name": "gpu_ops"}


@pytest.mark.postgres
def test_a_run_on_the_production_storage_section_lands_in_postgresql(pg_url: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """deploy/dagster.yaml's storage section, unchanged, pointed by its environment variables at
    a scratch database: a real materialization succeeds and its events are read back."""
    import sqlalchemy as sa
    from dagster import DagsterInstance

    url = sa.engine.make_url(pg_url)
    monkeypatch.setenv("DAGSTER_PG_USERNAME", url.username or "postgres")
    monkeypatch.setenv("DAGSTER_PG_PASSWORD", url.password or "")
    monkeypatch.setenv("DAGSTER_PG_HOST", url.host or "127.0.0.1")
    monkeypatch.setenv("DAGSTER_PG_DB", url.database)
    monkeypatch.setenv("DAGSTER_PG_PORT", str(url.port or 5432))
    production = yaml.safe_load(PRODUCTION.read_text())
    # The storage section as is; the run launcher and coordinator need a cluster and a daemon.
    storage_only = {"storage": production["storage"], "telemetry": production["telemetry"]}
    (tmp_path / "dagster.yaml").write_text(yaml.safe_dump(storage_only))

    @dg.asset(partitions_def=dg.DailyPartitionsDefinition(start_date="2026-11-01"))
    def gpu_hours_smoke(context):  # unannotated: this module's annotations are strings
        return dg.MaterializeResult(metadata={"gpu_hours": 1.5, "partition": context.partition_key})

    with DagsterInstance.from_config(str(tmp_path)) as instance:
        from dagster_postgres import PostgresEventLogStorage, PostgresRunStorage

        assert isinstance(instance.run_storage, PostgresRunStorage)
        assert isinstance(instance.event_log_storage, PostgresEventLogStorage)
        result = dg.materialize([gpu_hours_smoke], instance=instance, partition_key="2026-11-20", tags={"gpu-ops/team": "nlp"})
        assert result.success
        run_id = result.run_id

    # A fresh instance (as the webserver would be) reads the run and its events back.
    with DagsterInstance.from_config(str(tmp_path)) as instance:
        run = instance.get_run_by_id(run_id)
        assert run is not None and run.is_success and run.tags["gpu-ops/team"] == "nlp"
        event = instance.get_latest_materialization_event(dg.AssetKey("gpu_hours_smoke"))
        assert event is not None and event.run_id == run_id
        mat = event.asset_materialization
        assert mat.partition == "2026-11-20" and mat.metadata["gpu_hours"].value == 1.5
        types = [e.dagster_event.event_type for e in instance.all_logs(run_id) if e.dagster_event]
        assert dg.DagsterEventType.RUN_SUCCESS in types and dg.DagsterEventType.ASSET_MATERIALIZATION in types

    # And the rows really are in that PostgreSQL database.
    engine = sa.create_engine(pg_url.replace("postgresql://", "postgresql+psycopg2://"))
    try:
        with engine.connect() as conn:
            status = conn.execute(sa.text("SELECT status FROM runs WHERE run_id = :r"), {"r": run_id}).scalar_one()
            n_events = conn.execute(sa.text("SELECT count(*) FROM event_logs WHERE run_id = :r"), {"r": run_id}).scalar_one()
    finally:
        engine.dispose()
    assert status == "SUCCESS" and n_events >= 5


def test_local_instance_needs_no_environment_and_limits_gpu_work(monkeypatch: pytest.MonkeyPatch) -> None:
    """The top-level dagster.yaml passes Dagster's instance schema with no DAGSTER_* set,
    keeps its state in the gitignored .gpu_ops folder, and carries the GPU limits."""
    for name in INSTANCE_ENV:
        monkeypatch.delenv(name, raising=False)
    config = _instance_config(LOCAL)

    base = Path(config["storage"]["sqlite"]["base_dir"])
    assert not base.is_absolute() and base.parts[0] == ".gpu_ops"
    assert ".gpu_ops/" in (REPO / ".gitignore").read_text().split()
    assert "run_launcher" not in config  # runs are local subprocesses

    # One GPU step at a time: gpu_asset steps take slots of the `gpu` pool.
    assert config["concurrency"]["pools"]["default_limit"] == 1
    limits = {l["key"]: l for l in config["concurrency"]["runs"]["tag_concurrency_limits"]}
    tags = gpu_run_tags(GpuRequest(gpu_type="t4", labels=Attribution(team="nlp")))
    assert set(tags) <= set(limits)
    assert limits["gpu-ops/team"]["value"] == {"applyLimitPerUniqueValue": True}
    assert config["run_monitoring"]["enabled"] is True
    assert config["run_monitoring"]["max_resume_run_attempts"] == 0  # the local launcher cannot resume a run


def test_local_instance_opens_and_admits_gpu_runs_under_its_limits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A real instance from the top-level dagster.yaml (in a scratch working directory, as
    the repository root would be): SQLite storage, the queued coordinator's tag limits and
    the `gpu` pool's default limit as Dagster reads them."""
    import shutil

    from dagster import DagsterInstance
    from dagster._core.storage.runs import SqliteRunStorage

    for name in INSTANCE_ENV:
        monkeypatch.delenv(name, raising=False)
    shutil.copy(LOCAL, tmp_path / "dagster.yaml")
    monkeypatch.chdir(tmp_path)
    with DagsterInstance.from_config(str(tmp_path)) as instance:
        assert isinstance(instance.run_storage, SqliteRunStorage)
        assert (tmp_path / ".gpu_ops" / "dagster_home" / "history").is_dir()
        queue = instance.get_concurrency_config().run_queue_config
        assert {l["key"] for l in queue.tag_concurrency_limits} >= {"gpu-ops/gpu-launch", "gpu-ops/team"}
        assert instance.get_concurrency_config().pool_config.default_pool_limit == 1
