"""The helm chart, rendered offline with helm-python (Helm v4) for three value sets and
every object checked: Karpenter objects against the real CRD schemas, core objects
against the Kubernetes OpenAPI schemas, RBAC, pod security, and the ConfigMap against
gpu_ops's own config loader."""

from __future__ import annotations

import copy
import json

import jsonschema
import kubernetes_validate
import pytest
import yaml

from gpu_ops.domain.compute.catalog import CATALOG
from gpu_ops.domain.config import SecretRef, load_config
from gpu_ops_tests.deploy.chart import (
    CHART,
    K8S_VERSION,
    NAMESPACE,
    VALUE_SETS,
    by_kind,
    code_server_objects,
    container_context,
    is_training_worker,
    container_env,
    objects,
    one,
    render,
    two_gpu_pools,
    write_config,
)

KARPENTER_KINDS = {"NodePool", "EC2NodeClass", "NodeClaim"}


@pytest.fixture(params=sorted(VALUE_SETS))
def value_set(request: pytest.FixtureRequest) -> tuple[str, dict]:
    return request.param, VALUE_SETS[request.param]()


def test_lint_passes_strict(value_set: tuple[str, dict]) -> None:
    import helm_python as helm

    name, values = value_set
    report = helm.lint(CHART, values, strict=True, namespace=NAMESPACE, kube_version="v1.33.0")
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    assert report["errors"] == [] and problems == [], f"{name}: {report}"


def test_every_object_is_valid_against_its_schema(value_set: tuple[str, dict], karpenter_crds: dict[str, dict]) -> None:
    name, values = value_set
    objs = objects(values)
    kinds = {o["kind"] for o in objs}
    assert {"Deployment", "Service", "ServiceAccount", "ConfigMap", "ClusterRole", "Role", "PriorityClass"} <= kinds
    for obj in objs:
        where = f"{name}: {obj['kind']}/{obj['metadata']['name']}"
        if obj["kind"] in KARPENTER_KINDS:
            assert obj["apiVersion"] in ("karpenter.sh/v1", "karpenter.k8s.aws/v1"), where
            try:
                jsonschema.validate(obj, karpenter_crds[obj["kind"]])
            except jsonschema.ValidationError as exc:
                pytest.fail(f"{where}: {exc.message} at {list(exc.absolute_path)}")
        else:
            try:
                kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
            except kubernetes_validate.ValidationError as exc:
                pytest.fail(f"{where}: {exc.message} at {list(exc.path)}")


def _assert_least_privilege(roles: list[dict]) -> None:
    """No wildcard, no access to Secrets, no verb that grants more than the role holds."""
    for role in roles:
        for rule in role["rules"]:
            for field in ("apiGroups", "resources", "verbs", "resourceNames", "nonResourceURLs"):
                assert "*" not in rule.get(field, []), f"wildcard in {role['metadata']['name']}: {rule}"
            assert "secrets" not in rule["resources"], f"secret access in {role['kind']}/{role['metadata']['name']}"
            assert not {"escalate", "bind", "impersonate"} & set(rule["verbs"])


def test_rbac_is_least_privilege(value_set: tuple[str, dict]) -> None:
    _, values = value_set
    every = objects(values)
    _assert_least_privilege(by_kind(every, "ClusterRole") + by_kind(every, "Role"))
    objs = code_server_objects(every)  # the training workers' identity: its own test below
    roles = by_kind(objs, "ClusterRole") + by_kind(objs, "Role")
    assert roles
    _assert_least_privilege(roles)

    cluster = one(objs, "ClusterRole")
    grants = {(g, r): set(rule["verbs"]) for rule in cluster["rules"] for g in rule["apiGroups"] for r in rule["resources"]}
    for resource in ("nodepools", "nodeclaims"):
        assert grants[("karpenter.sh", resource)] == {"get", "list", "watch", "create", "patch", "delete"}
    assert grants[("", "nodes")] == {"get", "list", "watch"}
    assert grants[("", "events")] == {"get", "list", "watch"}
    # Pods are namespaced grants here: every kubernetes source names its namespaces.
    assert ("", "pods") not in grants

    compute_ns = (values.get("config") or {}).get("compute", {}).get("namespace", "ml")
    workload_roles = {r["metadata"]["namespace"]: r for r in by_kind(objs, "Role") if r["metadata"]["namespace"] != "kubetorch"}
    assert compute_ns in workload_roles
    for ns, role in workload_roles.items():
        grants = {(g, r): set(rule["verbs"]) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"]}
        # In the compute namespace a stale GPU lease's pods (and the Deployment that would
        # bring them back) are deleted before the lease is handed on; elsewhere: reads only.
        reclaim = {"delete"} if ns == compute_ns else set()
        assert grants == {("", "pods"): {"get", "list", "watch"} | reclaim, ("apps", "deployments"): {"get", "list"} | reclaim}

    # The Kubetorch controller's health (its version) through one Service's proxy only.
    (kt_role,) = [r for r in by_kind(objs, "Role") if r["metadata"]["namespace"] == "kubetorch"]
    assert kt_role["rules"] == [{"apiGroups": [""], "resources": ["services/proxy"], "resourceNames": ["kubetorch-controller", "kubetorch-controller:8080"], "verbs": ["get"]}]

    # Every Role/ClusterRole is bound to the chart's ServiceAccount, and only to it.
    sa = one(objs, "ServiceAccount")["metadata"]["name"]
    bindings = by_kind(objs, "ClusterRoleBinding") + by_kind(objs, "RoleBinding")
    assert {(b["roleRef"]["kind"], b["roleRef"]["name"], b["metadata"].get("namespace")) for b in bindings} == {
        (r["kind"], r["metadata"]["name"], r["metadata"].get("namespace")) for r in roles
    }
    for b in bindings:
        assert b["subjects"] == [{"kind": "ServiceAccount", "name": sa, "namespace": NAMESPACE}]


def test_two_pools_grant_pod_reads_in_each_collected_namespace() -> None:
    objs = code_server_objects(objects(two_gpu_pools()))
    assert {r["metadata"]["namespace"] for r in by_kind(objs, "Role")} == {"ml", "nlp", "vision", "kubetorch"}


def test_collector_over_all_namespaces_reads_pods_cluster_wide_but_never_secrets() -> None:
    values = {"config": {**copy.deepcopy(yaml.safe_load((CHART / "values.yaml").read_text())["config"])}}
    values["config"]["usage"]["sources"] = [{"type": "kubernetes"}]
    cluster = one(code_server_objects(objects(values)), "ClusterRole")
    pod_rules = [r for r in cluster["rules"] if "pods" in r["resources"]]
    assert pod_rules == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]
    assert not any("secrets" in r["resources"] for r in cluster["rules"])


def test_every_container_is_non_root_read_only_and_drops_capabilities(value_set: tuple[str, dict]) -> None:
    _, values = value_set
    pods = [o["spec"]["template"]["spec"] for o in objects(values) if o["kind"] in ("Deployment", "StatefulSet", "DaemonSet", "Job")]
    assert pods
    for pod in pods:
        pod_sc = pod.get("securityContext", {})
        for c in pod.get("initContainers", []) + pod["containers"]:
            sc = c["securityContext"]
            assert sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot")) is True, c["name"]
            assert sc.get("runAsUser", pod_sc.get("runAsUser", 0)) != 0, c["name"]
            assert sc["readOnlyRootFilesystem"] is True, c["name"]
            assert sc["allowPrivilegeEscalation"] is False, c["name"]
            assert sc["capabilities"]["drop"] == ["ALL"] and "add" not in sc["capabilities"], c["name"]
            assert c["resources"]["requests"]["cpu"] and c["resources"]["requests"]["memory"], c["name"]
            assert c["resources"]["limits"]["memory"], c["name"]
            for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                assert probe in c, f"{c['name']} has no {probe}"
        # No GPU anywhere near the code server: no GPU request, no GPU toleration.
        assert not any("nvidia.com/gpu" in json.dumps(c["resources"]) for c in pod["containers"])
        assert not any(t.get("key") == "nvidia.com/gpu" for t in pod.get("tolerations", []))


def test_code_server_serves_gpu_ops_definitions_over_grpc() -> None:
    objs = objects()
    dep = one(objs, "Deployment")
    c = dep["spec"]["template"]["spec"]["containers"][0]
    assert c["command"] + c["args"] == [
        "dagster", "api", "grpc", "--module-name", "gpu_ops.definitions", "--attribute", "defs",
        "--host", "0.0.0.0", "--port", "3030", "--location-name", "gpu_ops",
    ]
    assert c["ports"] == [{"name": "grpc", "containerPort": 3030, "protocol": "TCP"}]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert c[probe]["grpc"] == {"port": 3030, "service": "DagsterApi"}
    svc = one(objs, "Service")
    assert svc["spec"]["selector"].items() <= dep["spec"]["template"]["metadata"]["labels"].items()
    assert svc["spec"]["ports"][0]["port"] == 3030 and svc["spec"]["ports"][0]["targetPort"] == "grpc"
    # The same module and attribute the repository's workspace.yaml loads.
    from gpu_ops_tests.conftest import REPO

    workspace = yaml.safe_load((REPO / "workspace.yaml").read_text())
    target = workspace["load_from"][0]["python_module"]
    assert (target["module_name"], target["attribute"]) == ("gpu_ops.definitions", "defs")


def test_container_context_is_valid_dagster_k8s_config_for_run_workers(value_set: tuple[str, dict]) -> None:
    from dagster._config import process_config
    from dagster_k8s.job import DagsterK8sJobConfig

    _, values = value_set
    objs = code_server_objects(objects(values))
    dep = one(objs, "Deployment")
    ctx = container_context(dep)
    result = process_config(DagsterK8sJobConfig.config_type_container_context(), ctx["k8s"])
    assert result.success, result.errors
    k8s = ctx["k8s"]
    assert k8s["service_account_name"] == one(objs, "ServiceAccount")["metadata"]["name"]
    assert {"name": "gpu-ops-config", "configMap": {"name": one(objs, "ConfigMap")["metadata"]["name"]}} in k8s["volumes"]
    assert "GPU_OPS_CONFIG=/etc/gpu-ops/gpu_ops.yaml" in k8s["env_vars"]
    # Run workers get exactly the code server's secret references.
    server_secret_env = {n: e["valueFrom"] for n, e in container_env(dep).items() if "valueFrom" in e}
    assert {e["name"]: e["valueFrom"] for e in k8s["env"]} == server_secret_env
    assert k8s["security_context"]["runAsNonRoot"] is True
    assert container_env(dep)["DAGSTER_CURRENT_IMAGE"]["value"] == dep["spec"]["template"]["spec"]["containers"][0]["image"]


def test_nodepools_follow_the_karpenter_rules_for_training(karpenter_crds: dict[str, dict]) -> None:
    objs = objects(two_gpu_pools())
    pools = {p["metadata"]["name"]: p for p in by_kind(objs, "NodePool")}
    assert set(pools) == {"a100-80gb-spot", "l4-small"}
    node_class = one(objs, "EC2NodeClass")["metadata"]["name"]
    karpenter_gpu_names = {spec.karpenter_gpu_name for spec in CATALOG.values()}
    for name, pool in pools.items():
        spec = pool["spec"]["template"]["spec"]
        assert spec["expireAfter"] == "Never", name
        assert pool["spec"]["disruption"]["consolidationPolicy"] == "WhenEmpty", name
        assert {"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"} in spec["taints"], name
        assert "nvidia.com/gpu" in pool["spec"]["limits"], name
        assert spec["nodeClassRef"] == {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": node_class}
        reqs = {r["key"]: r for r in spec["requirements"]}
        assert set(reqs["karpenter.k8s.aws/instance-gpu-name"]["values"]) <= karpenter_gpu_names, name
        # The selector Karpenter cannot provision for must never appear.
        assert "nvidia.com/gpu.product" not in json.dumps(pool), name
    a100 = pools["a100-80gb-spot"]
    reqs = {r["key"]: r for r in a100["spec"]["template"]["spec"]["requirements"]}
    assert reqs["karpenter.k8s.aws/instance-gpu-memory"] == {"key": "karpenter.k8s.aws/instance-gpu-memory", "operator": "Gt", "values": ["81919"]}
    assert reqs["karpenter.sh/capacity-type"]["values"] == ["spot"]
    assert a100["spec"]["limits"] == {"nvidia.com/gpu": "32"} and a100["spec"]["weight"] == 50
    assert "gpu-ops.io/team" not in pools["l4-small"]["metadata"]["labels"]
    assert pools["l4-small"]["spec"]["template"]["spec"]["terminationGracePeriod"] == "2h"


def test_budget_enforcement_selects_the_chart_pool_of_the_budgets_team() -> None:
    """The alerts code's own pool selection (label selector and per-object check) finds the
    chart's a100 pool for the nlp budget's scope, and nothing for another team."""
    from gpu_ops.flows.alerts.enforcement import is_managed, scope_selector

    pools = {p["metadata"]["name"]: p for p in by_kind(objects(two_gpu_pools()), "NodePool")}
    assert all(is_managed(p) for p in pools.values())

    def matches(pool: dict, selector: str) -> bool:
        labels = pool["metadata"]["labels"]
        return all(labels.get(k) == v for k, v in (part.split("=", 1) for part in selector.split(",")))

    assert [n for n, p in pools.items() if matches(p, scope_selector({"team": "nlp"}))] == ["a100-80gb-spot"]
    assert [n for n, p in pools.items() if matches(p, scope_selector({"team": "vision"}))] == []


def test_default_values_create_one_pool_and_the_node_class_it_references() -> None:
    objs = objects()
    pools = by_kind(objs, "NodePool")
    assert len(pools) == 1
    assert pools[0]["spec"]["template"]["spec"]["nodeClassRef"]["name"] == one(objs, "EC2NodeClass")["metadata"]["name"]


def test_nodepools_off_renders_no_karpenter_objects() -> None:
    objs = objects(VALUE_SETS["nodepools-off"]())
    assert not [o for o in objs if o["kind"] in KARPENTER_KINDS]
    # The RBAC for NodePools stays: gpu_ops may still manage pools itself.
    assert any("nodepools" in r["resources"] for r in one(code_server_objects(objs), "ClusterRole")["rules"])


def test_rendered_configmap_loads_with_the_projects_config_loader(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    objs = objects(two_gpu_pools())
    cfg = load_config(write_config(objs, tmp_path))

    # Prices inline, per GPU-hour, and exactly the user's table: nothing merged in from
    # the chart's example prices.
    assert set(cfg.prices.gpus) == {"a100-80gb", "l4"}
    assert cfg.prices.gpus["a100-80gb"]["spot"] == pytest.approx(1.79)
    assert cfg.prices.source.startswith("Negotiated")
    # Secrets are {env: ...} references, and each one is wired to an existing Secret in
    # the Deployment: the ConfigMap holds no secret value.
    dep = one(objs, "Deployment")
    env = container_env(dep)
    pd = cfg.channels["oncall"].routing_key
    smtp_password = cfg.channels["finance"].smtp.password
    storage = cfg.storage.url
    for ref, secret in ((pd, ("gpu-ops-alerts", "pagerduty-routing-key")), (smtp_password, ("gpu-ops-alerts", "smtp-password")), (storage, ("gpu-ops-db", "url"))):
        assert isinstance(ref, SecretRef)
        assert env[ref.env]["valueFrom"]["secretKeyRef"] == {"name": secret[0], "key": secret[1]}
    assert "secretKeyRef" not in one(objs, "ConfigMap")["data"]["gpu_ops.yaml"]
    # Resolved at use, from the environment the kubelet fills from the Secret.
    monkeypatch.setenv(pd.env, "R0UTING")
    assert pd.get() == "R0UTING"
    assert cfg.channels["finance"].to == ["finops@example.com"]
    assert cfg.budgets[0].channels == ["finance", "oncall"]
    assert cfg.compute.backend == "kubetorch"
    # The chart's PriorityClass is the one training pods ask for.
    assert cfg.compute.priority_class == one(objs, "PriorityClass")["metadata"]["name"]
    assert [s.type for s in cfg.usage.sources] == ["ledger", "kubernetes"]


def test_default_configmap_loads_and_plain_url_storage_stays_literal(tmp_path) -> None:
    cfg = load_config(write_config(objects(), tmp_path))
    assert set(cfg.prices.gpus) == {"h100", "a100-80gb", "a100", "l40s", "l4", "a10g"}
    assert isinstance(cfg.storage.url, SecretRef) and cfg.storage.url.env == "GPU_OPS_STORAGE_URL"
    (tmp_path / "plain").mkdir()
    values = {"storage": {"existingSecret": {"name": ""}, "url": "postgresql://gpu_ops@db.internal:5432/gpu_ops"}}
    objs = objects(values)
    cfg = load_config(write_config(objs, tmp_path / "plain"))
    assert cfg.storage.url == "postgresql://gpu_ops@db.internal:5432/gpu_ops"
    assert "GPU_OPS_STORAGE_URL" not in container_env(one(objs, "Deployment"))


def ref(name: str, key: str) -> dict:
    return {"secretKeyRef": {"name": name, "key": key}}


def every_secret_as_a_reference() -> dict:
    values = two_gpu_pools()
    values["storage"] = {"existingSecret": {"name": ""}, "url": "postgresql://gpu_ops@db.internal:5432/gpu_ops", "password": ref("gpu-ops-db", "password")}
    values["config"]["channels"] = {
        "slack": {"type": "slack", "webhook_url": ref("alerts", "slack-url")},
        "oncall": {"type": "pagerduty", "routing_key": ref("alerts", "pd-key")},
        "audit": {"type": "webhook", "url": ref("alerts", "hook-url"), "secret": ref("alerts", "hook-hmac"),
                  "headers": {"Authorization": ref("alerts", "hook-token"), "X-Team": "ml"}},
        "finance": {"type": "email", "to": ["finops@example.com"], "smtp": {"host": "smtp.internal", "username": "gpu-ops", "password": ref("alerts", "smtp")}},
    }
    values["config"]["budgets"][0]["channels"] = ["slack", "oncall", "audit", "finance"]
    return values


def test_every_secret_is_a_secret_reference_headers_and_storage_password_included(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    objs = objects(every_secret_as_a_reference())
    cfg = load_config(write_config(objs, tmp_path))
    env = container_env(one(objs, "Deployment"))
    run_env = {e["name"]: e for e in container_context(one(objs, "Deployment"))["k8s"]["env"]}
    audit = cfg.channels["audit"]
    refs = {
        ("gpu-ops-db", "password"): cfg.storage.password,
        ("alerts", "slack-url"): cfg.channels["slack"].webhook_url,
        ("alerts", "pd-key"): cfg.channels["oncall"].routing_key,
        ("alerts", "hook-url"): audit.url,
        ("alerts", "hook-hmac"): audit.secret,
        ("alerts", "hook-token"): audit.headers["Authorization"],
        ("alerts", "smtp"): cfg.channels["finance"].smtp.password,
    }
    for (secret, key), secret_ref in refs.items():
        assert isinstance(secret_ref, SecretRef), (secret, key)
        assert env[secret_ref.env]["valueFrom"]["secretKeyRef"] == {"name": secret, "key": key}
        assert run_env[secret_ref.env]["valueFrom"]["secretKeyRef"] == {"name": secret, "key": key}  # run workers too
    assert audit.headers["X-Team"].get() == "ml"
    assert "secretKeyRef" not in one(objs, "ConfigMap")["data"]["gpu_ops.yaml"]
    # The storage password joins the URL only in memory, where the connection opens.
    assert cfg.storage.url == "postgresql://gpu_ops@db.internal:5432/gpu_ops"
    monkeypatch.setenv(cfg.storage.password.env, "s3cret/pw")
    assert cfg.storage.resolved_url() == "postgresql://gpu_ops:s3cret%2Fpw@db.internal:5432/gpu_ops"
    assert cfg.storage.connect_timeout_s == 10 and cfg.storage.statement_timeout_s == 300


def test_a_config_mistake_in_values_is_reported_by_the_loader_naming_the_field(tmp_path) -> None:
    from gpu_ops.domain.config import ConfigError

    values = two_gpu_pools()
    values["config"]["budgets"][0]["thresholds"][1]["percent"] = -5
    path = write_config(objects(values), tmp_path)
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert f"{path}: budgets[0].thresholds[1].percent: must be > 0" in str(err.value)


@pytest.mark.parametrize(
    ("override", "field"),
    [
        ({"karpenter": {"nodePools": {"pools": [{"name": "p", "instanceGpuNames": ["a100"], "capacityTypes": ["spot"], "gpuLimit": "lots"}]}}}, "/karpenter/nodePools/pools/0/gpuLimit"),
        ({"karpenter": {"nodePools": {"pools": [{"name": "p", "instanceGpuNames": ["a100"], "capacityTypes": ["preemptible"], "gpuLimit": 4}]}}}, "/karpenter/nodePools/pools/0/capacityTypes/0"),
        ({"image": {"pullPolicy": "Sometimes"}}, "/image/pullPolicy"),
        ({"codeServer": {"port": 80}}, "/codeServer/port"),
        ({"config": {"storage": {"url": "sqlite:///x.db"}}}, "additional properties 'storage' not allowed"),
        ({"config": {"channels": {"oncall": {"type": "pagerduty", "routing_key": {"secretKeyRef": {"name": "pd"}}}}}}, "/config/channels/oncall/routing_key"),
        # Literal secrets: refused, naming the field, so none can reach the ConfigMap.
        ({"storage": {"existingSecret": {"name": ""}, "url": "postgresql://gpu_ops:hunter2@db:5432/costs"}}, "/storage/url"),
        ({"storage": {"password": "hunter2"}}, "/storage/password"),
        ({"config": {"channels": {"oncall": {"type": "pagerduty", "routing_key": "R0UTINGKEY"}}}}, "/config/channels/oncall/routing_key"),
        ({"config": {"channels": {"slack": {"type": "slack", "webhook_url": "https://hooks.slack.com/services/T0/B0/x"}}}}, "/config/channels/slack/webhook_url"),
        ({"config": {"channels": {"audit": {"type": "webhook", "url": "https://hooks.example.com/gpu?token=x"}}}}, "/config/channels/audit/url"),
        ({"config": {"channels": {"audit": {"type": "webhook", "url": {"env": "U"}, "secret": "hmac"}}}}, "/config/channels/audit/secret"),
        ({"config": {"channels": {"audit": {"type": "webhook", "url": {"env": "U"}, "headers": {"Authorization": "Bearer abc"}}}}}, "/config/channels/audit/headers/Authorization"),
        ({"config": {"channels": {"audit": {"type": "webhook", "url": {"env": "U"}, "headers": {"x-api-key": "abc"}}}}}, "/config/channels/audit/headers/x-api-key"),
        ({"config": {"channels": {"mail": {"type": "email", "to": ["a@b.c"], "smtp": {"password": "pw"}}}}}, "/config/channels/mail/smtp/password"),
    ],
)
def test_values_schema_rejects_bad_values_naming_the_field(override: dict, field: str) -> None:
    import helm_python as helm

    with helm.Chart.load(CHART) as chart:
        with pytest.raises(helm.HelmError) as err:
            chart.validate_schema(chart.merge_values(override))
        assert field in str(err.value), str(err.value)
        with pytest.raises(helm.HelmError) as err:
            chart.render(values=override, name="gpu-ops", namespace=NAMESPACE)
        assert field in str(err.value), str(err.value)
    report = helm.lint(CHART, override, namespace=NAMESPACE)
    assert any(field in e for e in report["errors"] + [m["error"] for m in report["messages"] if m["severity"] == 3]), report


def test_secret_env_names_are_valid_and_distinct() -> None:
    values = two_gpu_pools()
    values["config"]["channels"]["on-call.b"] = {"type": "pagerduty", "routing_key": {"secretKeyRef": {"name": "pd", "key": "k"}}}
    env = container_env(one(objects(values), "Deployment"))
    names = [n for n, e in env.items() if "valueFrom" in e]
    assert "GPU_OPS_SECRET_ON_CALL_B_ROUTING_KEY" in names
    assert all(n.replace("_", "").isalnum() and n.isupper() for n in names)
    assert len(names) == len(set(names))


def test_notes_tell_how_to_register_the_code_location() -> None:
    notes = render()["gpu-ops/templates/NOTES.txt"]
    assert "host: gpu-ops.dagster.svc.cluster.local" in notes and "port: 3030" in notes
    assert "clusterName is still" in notes
    assert "clusterName is still" not in render(two_gpu_pools())["gpu-ops/templates/NOTES.txt"]


# --------------------------------------------------------------------------- NetworkPolicy


def test_network_policies_admit_only_the_dagster_webserver_and_daemon(value_set: tuple[str, dict]) -> None:
    _, values = value_set
    objs = objects(values)
    policies = {p["metadata"]["name"]: p for p in by_kind(objs, "NetworkPolicy")}
    assert set(policies) == {"gpu-ops-code-server", "gpu-ops-run-workers"}
    for policy in policies.values():
        kubernetes_validate.validate(policy, K8S_VERSION, strict=True)
        assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"]

    server = policies["gpu-ops-code-server"]["spec"]
    dep = one(objs, "Deployment")
    assert server["podSelector"]["matchLabels"].items() <= dep["spec"]["template"]["metadata"]["labels"].items()
    (rule,) = server["ingress"]
    assert rule["ports"] == [{"port": dep["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"], "protocol": "TCP"}]
    assert [peer["podSelector"]["matchLabels"] for peer in rule["from"]] == [{"component": "dagster-webserver"}, {"component": "dagster-daemon"}]
    assert all(peer["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": NAMESPACE} for peer in rule["from"])

    # Run workers: selected by the labels the container context gives them; nothing may call them.
    workers = policies["gpu-ops-run-workers"]["spec"]
    assert workers["podSelector"]["matchLabels"].items() <= container_context(dep)["k8s"]["labels"].items()
    assert workers["ingress"] == []

    for spec in (server, workers):
        ports = {(p["port"], p["protocol"]) for rule in spec["egress"] for p in rule["ports"]}
        assert {(53, "UDP"), (53, "TCP"), (5432, "TCP"), (443, "TCP"), (6443, "TCP"), (8080, "TCP")} <= ports
        (kubetorch,) = [r for r in spec["egress"] if r["ports"] == [{"port": 8080, "protocol": "TCP"}]]
        assert kubetorch["to"] == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kubetorch"}}}]


def test_network_policy_egress_can_be_narrowed_and_the_policies_turned_off() -> None:
    database = [{"ipBlock": {"cidr": "10.0.12.0/24"}}]
    objs = objects({"networkPolicy": {"egress": {"database": {"to": database, "ports": [5432]}}, "dagster": {"namespace": "dagster-system"}}})
    for policy in by_kind(objs, "NetworkPolicy"):
        kubernetes_validate.validate(policy, K8S_VERSION, strict=True)
        assert {"to": database, "ports": [{"port": 5432, "protocol": "TCP"}]} in policy["spec"]["egress"]
    server = next(p for p in by_kind(objs, "NetworkPolicy") if p["metadata"]["name"].endswith("code-server"))
    assert {peer["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"] for peer in server["spec"]["ingress"][0]["from"]} == {"dagster-system"}

    assert by_kind(objects({"networkPolicy": {"enabled": False}}), "NetworkPolicy") == []


# --------------------------------------------------------------------------- training workers


def test_training_workers_may_get_their_own_node_and_pod_and_nothing_else() -> None:
    objs = [o for o in objects(two_gpu_pools()) if is_training_worker(o)]
    (sa,) = by_kind(objs, "ServiceAccount")
    compute_ns = two_gpu_pools()["config"]["compute"]["namespace"]
    assert sa["metadata"]["namespace"] == compute_ns
    (cluster_role,) = by_kind(objs, "ClusterRole")
    (role,) = by_kind(objs, "Role")
    assert cluster_role["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]}]
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]
    assert role["metadata"]["namespace"] == compute_ns
    bindings = by_kind(objs, "ClusterRoleBinding") + by_kind(objs, "RoleBinding")
    assert {(b["roleRef"]["kind"], b["roleRef"]["name"]) for b in bindings} == {(r["kind"], r["metadata"]["name"]) for r in (cluster_role, role)}
    for b in bindings:
        assert b["subjects"] == [{"kind": "ServiceAccount", "name": sa["metadata"]["name"], "namespace": compute_ns}]
    for obj in objs:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


# --------------------------------------------------------------------------- partitions in parallel


def test_partitions_run_in_parallel_as_separate_pods_within_the_queue_limits() -> None:
    """The deploy guide's settings (README, "Partitions in parallel"): each partition run
    is its own Kubernetes Job (K8sRunLauncher), the run queue admits backfill runs a few at
    a time, and a step pod launched by k8s_job_executor gets the same identity, config
    mount and secret references as the run worker."""
    from dagster._config import process_config
    from dagster_k8s import k8s_job_executor
    from dagster_k8s.job import DagsterK8sJobConfig

    from gpu_ops_tests.deploy.chart import EXAMPLES

    dagster = yaml.safe_load((EXAMPLES / "dagster-values.yaml").read_text())
    assert dagster["runLauncher"]["type"] == "K8sRunLauncher"
    queue = dagster["dagsterDaemon"]["runCoordinator"]
    assert queue["enabled"] and queue["type"] == "QueuedRunCoordinator"
    limits = {lim["key"]: lim for lim in queue["config"]["queuedRunCoordinator"]["tagConcurrencyLimits"]}
    max_runs = queue["config"]["queuedRunCoordinator"]["maxConcurrentRuns"]
    assert 2 <= limits["dagster/backfill"]["limit"] < max_runs  # parallel, but bounded below the whole queue
    assert limits["gpu-ops/gpu-launch"]["limit"] < max_runs

    # k8s_job_executor (one pod per step) accepts a bound on concurrent step pods, and the
    # chart's container context is valid step-pod configuration as well.
    assert process_config(k8s_job_executor.config_schema.config_type, {"max_concurrent": 4}).success
    ctx = container_context(one(objects(), "Deployment"))["k8s"]
    assert process_config(DagsterK8sJobConfig.config_type_container_context(), ctx).success


# --------------------------------------------------------------------------- metrics, rules, dashboards (issue 23)

METRICS_ON: dict = {
    "metrics": {"enabled": True, "perPod": True, "serviceMonitor": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}}, "prometheusRule": {"enabled": True}},
    "grafana": {"dashboards": {"enabled": True}},
}
MONITORING_KINDS = {"ServiceMonitor", "PrometheusRule"}


def _named(objs: list[dict], kind: str, suffix: str) -> dict:
    (found,) = [o for o in by_kind(objs, kind) if o["metadata"]["name"].endswith(suffix)]
    return found


def test_metrics_are_off_by_default_and_leave_the_code_server_objects_alone() -> None:
    default = objects()
    assert not [o for o in default if o["kind"] in MONITORING_KINDS or o["metadata"]["name"].endswith(("-exporter", "-dashboards"))]
    on = objects(METRICS_ON)
    assert {(o["kind"], o["metadata"]["name"]) for o in default} < {(o["kind"], o["metadata"]["name"]) for o in on}
    assert "exporter" not in render()["gpu-ops/templates/NOTES.txt"]
    assert f"http://gpu-ops-exporter.{NAMESPACE}.svc:9464/metrics" in render(METRICS_ON)["gpu-ops/templates/NOTES.txt"]


def test_metrics_objects_lint_and_validate(karpenter_crds: dict[str, dict]) -> None:
    import helm_python as helm

    report = helm.lint(CHART, METRICS_ON, strict=True, namespace=NAMESPACE, kube_version="v1.33.0")
    assert report["errors"] == [] and [m for m in report["messages"] if m["severity"] >= 2] == [], report
    for obj in objects(METRICS_ON):
        if obj["kind"] in MONITORING_KINDS:
            assert obj["apiVersion"] == "monitoring.coreos.com/v1"
        elif obj["kind"] not in KARPENTER_KINDS:
            kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def test_exporter_pod_serves_metrics_with_the_config_and_secrets_of_the_code_server() -> None:
    objs = objects(METRICS_ON)
    server, exporter = _named(objs, "Deployment", "gpu-ops"), _named(objs, "Deployment", "-exporter")
    pod = exporter["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["command"] + c["args"] == ["gpu-ops", "exporter", "--host", "0.0.0.0", "--port", "9464", "--cache-seconds", "15", "--history-seconds", "300",
                                        "--deadline-seconds", "8", "--per-pod"]
    assert c["ports"] == [{"name": "metrics", "containerPort": 9464, "protocol": "TCP"}]
    assert pod["automountServiceAccountToken"] is False
    sc = c["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["runAsNonRoot"] is True and sc["capabilities"]["drop"] == ["ALL"]
    assert all(p in c for p in ("startupProbe", "readinessProbe", "livenessProbe"))
    assert c["resources"]["requests"]["cpu"] and c["resources"]["limits"]["memory"]
    # The same GPU_OPS_CONFIG and secret references as the code server (storage URL from the Secret).
    server_env = {n: e for n, e in container_env(server).items() if n not in ("DAGSTER_CURRENT_IMAGE", "DAGSTER_CONTAINER_CONTEXT")}
    assert container_env(exporter) == server_env
    assert {"name": "gpu-ops-config", "configMap": {"name": _named(objs, "ConfigMap", "-config")["metadata"]["name"]}} in [
        v for v in pod["volumes"] if v["name"] == "gpu-ops-config"
    ]
    # The CLI the container runs has the subcommand.
    from click.testing import CliRunner

    from gpu_ops.cli import main

    assert "--per-pod" in CliRunner().invoke(main, ["exporter", "--help"]).output


def test_each_service_selects_only_its_own_pods_and_the_exporter_is_scrapeable() -> None:
    objs = objects(METRICS_ON)
    server_svc, exporter_svc = _named(objs, "Service", "gpu-ops"), _named(objs, "Service", "-exporter")
    server_pod = _named(objs, "Deployment", "gpu-ops")["spec"]["template"]["metadata"]["labels"]
    exporter_pod = _named(objs, "Deployment", "-exporter")["spec"]["template"]["metadata"]["labels"]
    assert exporter_svc["spec"]["selector"].items() <= exporter_pod.items()
    assert not server_svc["spec"]["selector"].items() <= exporter_pod.items()
    assert not exporter_svc["spec"]["selector"].items() <= server_pod.items()
    assert exporter_svc["metadata"]["annotations"]["prometheus.io/scrape"] == "true"
    assert exporter_svc["metadata"]["annotations"]["prometheus.io/port"] == "9464"
    monitor = one(objs, "ServiceMonitor")
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= exporter_svc["metadata"]["labels"].items()
    assert not monitor["spec"]["selector"]["matchLabels"].items() <= server_svc["metadata"]["labels"].items()
    assert monitor["spec"]["endpoints"][0]["port"] == exporter_svc["spec"]["ports"][0]["name"]
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    # Its NetworkPolicy admits scrapes on the metrics port and lets it reach only DNS and the database.
    policy = _named(objs, "NetworkPolicy", "-exporter")["spec"]
    assert policy["podSelector"]["matchLabels"].items() <= exporter_pod.items()
    assert policy["ingress"] == [{"ports": [{"port": 9464, "protocol": "TCP"}]}]
    assert {(p["port"], p["protocol"]) for r in policy["egress"] for p in r["ports"]} == {(53, "UDP"), (53, "TCP"), (5432, "TCP")}


def test_prometheus_rule_is_the_shipped_rule_file_and_promtool_accepts_it(tmp_path) -> None:
    import shutil
    import subprocess

    from gpu_ops.cli.dashboards import RULES_FILE

    rule = one(objects(METRICS_ON), "PrometheusRule")
    assert rule["spec"]["groups"] == yaml.safe_load(RULES_FILE.read_text())["groups"]
    assert (CHART / "rules" / RULES_FILE.name).read_text() == RULES_FILE.read_text()
    promtool = shutil.which("promtool")
    if promtool is None:
        from gpu_ops_tests.conftest import skip_or_fail

        skip_or_fail("promtool is not installed (apt-get install -y prometheus)")
    (tmp_path / "rendered.yml").write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    checked = subprocess.run([promtool, "check", "rules", str(tmp_path / "rendered.yml")], capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0 and "SUCCESS: 10 rules found" in checked.stdout, checked.stdout + checked.stderr


def test_dashboards_configmap_carries_the_sidecar_label_and_every_generated_dashboard(tmp_path) -> None:
    from gpu_ops.cli.dashboards import DASHBOARDS, to_json

    cm = _named(objects(METRICS_ON), "ConfigMap", "-dashboards")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["annotations"]["grafana_folder"] == "GPU cost"
    # The chart's files are what the generator writes today (regenerate: python -m gpu_ops.cli.dashboards).
    assert cm["data"] == {f"{d.uid}.json": to_json(d) for d in DASHBOARDS}
    titles = {json.loads(text)["title"] for text in cm["data"].values()}
    assert titles == {"GPU cost overview", "GPU cost attribution", "GPU savings and waste", "GPU budgets and alerts", "GPU training reliability", "GPU efficiency and cost"}
    assert len(json.dumps(cm["data"])) < 900_000  # a ConfigMap holds at most 1 MiB
    relabelled = _named(objects({**METRICS_ON, "grafana": {"dashboards": {"enabled": True, "label": "grafana.io/dashboard", "labelValue": "gpu"}}}), "ConfigMap", "-dashboards")
    assert relabelled["metadata"]["labels"]["grafana.io/dashboard"] == "gpu"


def test_the_scrape_deadline_is_below_the_scrape_timeout_and_the_exporters_default() -> None:
    """The chart, the CLI's default and the docs agree: 8 s, below the ServiceMonitor's 10 s
    (Prometheus' default scrape_timeout); a deadline at or past the timeout is refused."""
    import helm_python as helm

    from gpu_ops.flows.observability.readers import DEFAULT_DEADLINE_S

    monitor = _named(objects(METRICS_ON), "ServiceMonitor", "-exporter")
    assert monitor["spec"]["endpoints"][0]["scrapeTimeout"] == "10s"
    assert yaml.safe_load((CHART / "values.yaml").read_text())["metrics"]["deadlineSeconds"] == DEFAULT_DEADLINE_S == 8
    docs = (CHART.parents[1] / "docs" / "how-to" / "observability.md").read_text()
    assert "`--deadline-seconds` (8" in docs and "scrape_timeout: 10s" in docs
    for deadline, timeout in ((10, "10s"), (12, "10s"), (1, "500ms")):
        with helm.Chart.load(CHART) as chart, pytest.raises(helm.HelmError) as err:
            chart.render(values={**METRICS_ON, "metrics": {**METRICS_ON["metrics"], "deadlineSeconds": deadline,
                                                           "serviceMonitor": {**METRICS_ON["metrics"]["serviceMonitor"], "scrapeTimeout": timeout}}},
                         name="gpu-ops", namespace=NAMESPACE)
        assert "metrics.deadlineSeconds" in str(err.value) and "scrapeTimeout" in str(err.value), str(err.value)
    ok = {**METRICS_ON, "metrics": {**METRICS_ON["metrics"], "deadlineSeconds": 25, "serviceMonitor": {**METRICS_ON["metrics"]["serviceMonitor"], "scrapeTimeout": "1m"}}}
    (c,) = _named(objects(ok), "Deployment", "-exporter")["spec"]["template"]["spec"]["containers"]
    assert c["args"][c["args"].index("--deadline-seconds") + 1] == "25"


@pytest.mark.parametrize(
    ("override", "field"),
    [({"metrics": {"port": 80}}, "/metrics/port"), ({"metrics": {"deadlineSeconds": 0}}, "/metrics/deadlineSeconds"), ({"metrics": {"serviceMonitor": {"interval": "often"}}}, "/metrics/serviceMonitor/interval"),
     ({"grafana": {"dashboards": {"sidecar": True}}}, "additional properties 'sidecar' not allowed")],
)
def test_metrics_values_are_checked_by_the_schema(override: dict, field: str) -> None:
    import helm_python as helm

    with helm.Chart.load(CHART) as chart:
        with pytest.raises(helm.HelmError) as err:
            chart.validate_schema(chart.merge_values(override))
    assert field in str(err.value), str(err.value)
