"""The Kubetorch backend: real kt.Compute manifests, real kubetorch exceptions, pod evidence
read through real kubernetes.client models (the API server itself is the only stand-in)."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import httpx
import kubernetes_validate
import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpu_ops.domain.compute.backend import LeaseLost, WorkerExit
from gpu_ops.flows.compute.kubetorch_backend import (
    ComputeSetupError,
    KubetorchBackend,
    PodEvidence,
    build_compute,
    collect_evidence,
    explain_setup_error,
    first_guess_exit,
    workload_manifest,
)
from gpu_ops.domain.compute.naming import launch_labels
from gpu_ops.storage.quota import Lease, LeaseBook, Quotas
from gpu_ops.domain.compute.request import Attribution, GpuRequest
from gpu_ops.dagster.compute.resource import KarpenterPools, KubetorchGpuCompute, KubetorchLaunch
from gpu_ops.storage.tables import TableStore
from gpu_ops_tests.compute import worker_fns
from gpu_ops_tests.fake_k8s import FakeAppsV1, FakeCoreV1, FakeCustomObjects
from gpu_ops_tests.waiting import wait_until

NLP = Attribution(team="nlp", project="llm")
# The resource itself is what the backend reads (its nested settings as they are).
SETTINGS = KubetorchGpuCompute(namespace="ml", kubetorch=KubetorchLaunch(priority_class="gpu-training", launch_timeout_s=1200, inactivity_ttl="45m"))


def _labels(request: GpuRequest) -> dict[str, str]:
    return launch_labels("0f3a9c2e-1111-2222", ["nlp", "train"], request, 0)


def _pod_spec(compute) -> dict:
    return compute.manifest["spec"]["template"]["spec"]


def test_compute_selects_karpenter_nodes_never_gpu_product() -> None:
    request = GpuRequest(gpu_type="a100-80gb", gpus=8, capacity="spot", cpus=32, memory="512Gi", labels=NLP)
    compute = build_compute(request, labels=_labels(request), target=SETTINGS, env={"WANDB_MODE": "offline"})
    spec = _pod_spec(compute)
    assert spec["nodeSelector"] == {"karpenter.k8s.aws/instance-gpu-name": "a100", "karpenter.sh/capacity-type": "spot", "gpu-ops.io/team": "nlp"}
    assert "nvidia.com/gpu.product" not in json.dumps(compute.manifest)
    # a100 is also the 40 GB part: only the instance type says 80 GB
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]["matchExpressions"]
    assert terms == [{"key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["p4de.24xlarge"]}]
    container = spec["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "8"
    assert container["resources"]["requests"]["memory"] == "512Gi" and container["resources"]["requests"]["cpu"] == "32"
    assert {"name": "WANDB_MODE", "value": "offline"} in container["env"]
    assert any(t["key"] == "nvidia.com/gpu" and t["effect"] == "NoSchedule" for t in spec["tolerations"])
    assert spec["priorityClassName"] == "gpu-training"
    template_meta = compute.manifest["spec"]["template"]["metadata"]
    assert template_meta["annotations"]["karpenter.sh/do-not-disrupt"] == "true"
    for meta in (compute.manifest["metadata"], template_meta):
        assert meta["labels"]["gpu-ops.io/run-id"] == "0f3a9c2e-1111-2222"
        assert meta["labels"]["gpu-ops.io/asset-key"] == "nlp.train"
        assert meta["labels"]["gpu-ops.io/team"] == "nlp"
    assert compute.manifest["metadata"]["annotations"]["kubetorch.com/inactivity-ttl"] == "45m"
    assert compute.launch_timeout == 1200
    assert compute.namespace == "ml"
    assert compute.pod_spec is not None and compute.pod_spec["nodeSelector"] == spec["nodeSelector"]


def test_spot_then_on_demand_prefers_spot_by_affinity() -> None:
    request = GpuRequest(gpu_type="h100", gpus=8, capacity="spot-then-on-demand", labels=NLP)
    spec = _pod_spec(build_compute(request, labels=_labels(request), target=SETTINGS))
    assert "karpenter.sh/capacity-type" not in spec["nodeSelector"]
    aff = spec["affinity"]["nodeAffinity"]
    required = aff["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]["matchExpressions"]
    assert {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["spot", "on-demand"]} in required
    assert aff["preferredDuringSchedulingIgnoredDuringExecution"][0]["preference"]["matchExpressions"][0]["values"] == ["spot"]


def test_distributed_uses_kubetorch_pytorch_distribution() -> None:
    request = GpuRequest(gpu_type="l4", gpus=1, workers=4, capacity="spot", labels=NLP)
    compute = build_compute(request, labels=_labels(request), target=SETTINGS)
    assert compute.replicas == 4 and compute.manifest["spec"]["replicas"] == 4
    assert compute.distributed_config["distribution_type"] == "pytorch"
    assert compute.distributed_config["quorum_workers"] == 4


def test_mig_slice_requests_its_own_resource() -> None:
    request = GpuRequest(gpu_type="a100-80gb", gpus=1, mig_profile="1g.10gb", capacity="on-demand", labels=NLP)
    resources = _pod_spec(build_compute(request, labels=_labels(request), target=SETTINGS))["containers"][0]["resources"]
    assert resources["limits"] == {"nvidia.com/mig-1g.10gb": "1"}
    assert "nvidia.com/gpu" not in resources["requests"]


def test_workload_manifest_is_a_valid_deployment() -> None:
    request = GpuRequest(gpu_type="a100-80gb", gpus=8, workers=2, capacity="spot", labels=NLP)
    compute = build_compute(request, labels=_labels(request), target=SETTINGS)
    manifest = workload_manifest(compute, "train-0f3a9c2e-0")
    assert manifest["metadata"]["name"] == "train-0f3a9c2e-0"
    assert manifest["spec"]["selector"]["matchLabels"] == {"kubetorch.com/service": "train-0f3a9c2e-0"}
    assert manifest["spec"]["template"]["metadata"]["labels"]["kubetorch.com/service"] == "train-0f3a9c2e-0"
    assert None not in manifest["metadata"]["labels"].values()
    kubernetes_validate.validate(manifest, kubernetes_validate.latest_version(), strict=True)


# ---------------------------------------------------------------------- setup errors


@pytest.mark.parametrize(
    ("make", "problem", "fix"),
    [
        (lambda kt: kt.KubernetesCredentialsError("Kubernetes credentials not found"), "no Kubernetes credentials", "set KUBECONFIG"),
        (lambda kt: kt.VersionMismatchError("client=0.5.1, cluster=0.4.2"), "does not match this client (0.5.1)", "helm chart version 0.5.1"),
        (lambda kt: kt.ImagePullError("ErrImagePull: ghcr.io/acme/train:v9"), "ghcr.io/acme/train:v9 cannot be pulled", "imagePullSecrets"),
        (lambda kt: kt.ServiceTimeoutError("service not ready after 1200s"), "launch_timeout (1200s)", "launch_timeout_s"),
        (lambda kt: kt.ResourceNotAvailableError("0/3 nodes available: insufficient nvidia.com/gpu"), "cannot provide 8 x a100-80gb on spot", "nvidia.com/gpu limit"),
        (lambda kt: kt.ControllerRequestError("POST", "http://kubetorch-controller/apply", 503, "unavailable"), "controller is unreachable", "kubectl get pods -n kubetorch"),
        (lambda kt: httpx.ConnectError("[Errno 111] Connection refused"), "controller is unreachable", "install the kubetorch helm chart"),
    ],
)
def test_setup_errors_say_what_to_fix(make, problem: str, fix: str) -> None:
    import kubetorch as kt

    request = GpuRequest(gpu_type="a100-80gb", gpus=8, capacity="spot", image="ghcr.io/acme/train:v9", labels=NLP)
    exc = make(kt)
    err = explain_setup_error(exc, request=request, launch=SETTINGS.kubetorch)
    assert isinstance(err, ComputeSetupError) and err.cause is exc
    assert problem in err.problem and fix in err.fix and "fix:" in str(err)


def test_other_errors_are_not_setup_errors() -> None:
    assert explain_setup_error(ValueError("bad"), request=GpuRequest(gpu_type="t4"), launch=SETTINGS.kubetorch) is None


# ---------------------------------------------------------------------- evidence


def _pod(name: str, node: str, *, disrupted: bool = False, oom: bool = False, phase: str = "Running") -> client.V1Pod:
    conditions = [client.V1PodCondition(type="Ready", status="True")]
    if disrupted:
        conditions.append(client.V1PodCondition(type="DisruptionTarget", status="True", reason="EvictionByEvictionAPI", message="Eviction API: evicting"))
    terminated = client.V1ContainerStateTerminated(exit_code=137, reason="OOMKilled") if oom else None
    statuses = [
        client.V1ContainerStatus(
            name="kubetorch", image="img", image_id="", ready=not (oom or disrupted), restart_count=1 if oom else 0,
            state=client.V1ContainerState(running=client.V1ContainerStateRunning()), last_state=client.V1ContainerState(terminated=terminated),
        )
    ]
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name, namespace="ml", labels={"kubetorch.com/service": "train-0f3a9c2e-0"}),
        spec=client.V1PodSpec(node_name=node, containers=[client.V1Container(name="kubetorch")]),
        status=client.V1PodStatus(phase=phase, conditions=conditions, container_statuses=statuses),
    )


def _event(kind: str, name: str, reason: str, message: str, namespace: str = "ml") -> client.CoreV1Event:
    return client.CoreV1Event(
        metadata=client.V1ObjectMeta(name=f"{name}.{reason.lower()}", namespace=namespace),
        involved_object=client.V1ObjectReference(kind=kind, name=name, namespace=namespace if kind == "Pod" else None),
        reason=reason, message=message, type="Warning", last_timestamp=dt.datetime(2026, 11, 20, 3, 0, tzinfo=dt.timezone.utc),
    )


def _node(name: str) -> client.V1Node:
    return client.V1Node(
        metadata=client.V1ObjectMeta(name=name, labels={"karpenter.sh/capacity-type": "spot"}),
        spec=client.V1NodeSpec(taints=[client.V1Taint(key="karpenter.sh/disrupted", effect="NoSchedule")]),
    )


def test_evidence_picks_the_troubled_pod_its_node_and_events() -> None:
    healthy, preempted = _pod("train-a", "ip-10-0-0-1"), _pod("train-b", "ip-10-0-0-2", disrupted=True)
    core = FakeCoreV1(
        pods=[healthy, preempted],
        nodes=[_node("ip-10-0-0-1"), _node("ip-10-0-0-2")],
        events=[
            _event("Pod", "train-b", "Evicted", "evicted by karpenter"),
            _event("Node", "ip-10-0-0-2", "SpotInterrupted", "Spot interruption warning", namespace="default"),
            _event("Pod", "train-a", "Pulled", "unrelated"),
        ],
    )
    ev = collect_evidence(core, "ml", "train-0f3a9c2e-0")
    assert ev.pod is preempted and ev.node.metadata.name == "ip-10-0-0-2"
    assert [e.reason for e in ev.events] == ["Evicted", "SpotInterrupted"]
    assert first_guess_exit(RuntimeError("connection reset"), ev) is WorkerExit.SIGTERM


def test_evidence_when_the_node_is_already_gone() -> None:
    core = FakeCoreV1(pods=[_pod("train-b", "ip-gone")], events=[_event("Node", "ip-gone", "SpotInterrupted", "reclaimed", namespace="default")])
    ev = collect_evidence(core, "ml", "train-0f3a9c2e-0", pod_name="train-b")
    assert ev.node is None and [e.reason for e in ev.events] == ["SpotInterrupted"]


def test_first_guess_exit_from_real_kubetorch_failures() -> None:
    import kubetorch as kt
    from kubetorch.serving.http_client import CustomResponse

    oom_pod = PodEvidence(pod=_pod("train-b", "n", oom=True))
    assert first_guess_exit(httpx.RemoteProtocolError("Server disconnected"), oom_pod) is WorkerExit.OOM
    assert first_guess_exit(httpx.RemoteProtocolError("Server disconnected"), PodEvidence()) is WorkerExit.LOST
    assert first_guess_exit(kt.PodTerminatedError(pod_name="train-b", reason="SIGTERM"), PodEvidence()) is WorkerExit.SIGTERM

    # A user exception comes back through Kubetorch's own response parsing.
    body = {"error_type": "ValueError", "message": "bad batch", "traceback": "Traceback ...\nValueError: bad batch", "pod_name": "train-b"}
    response = CustomResponse(500, json=body, request=httpx.Request("POST", "http://svc/call"))
    with pytest.raises(ValueError) as info:
        response.raise_for_status()
    assert first_guess_exit(info.value, PodEvidence()) is WorkerExit.ERROR
    backend = KubetorchBackend(GpuRequest(gpu_type="t4"), name="train-0f3a9c2e-0", labels={}, target=KubetorchGpuCompute())
    report = backend._failure_report(info.value, PodEvidence(pod=_pod("train-b", "n")), 3.0)
    assert report.exit is WorkerExit.ERROR and report.error_type == "ValueError" and report.error_message == "bad batch"
    assert report.traceback.endswith("ValueError: bad batch") and report.exception is info.value and report.pod is not None


# ---------------------------------------------------------------------- run without a cluster


@pytest.fixture
def no_kubeconfig(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing-kubeconfig"))
    if Path("/var/run/secrets/kubernetes.io/serviceaccount/token").exists():
        pytest.skip("running inside a cluster: credentials exist")


def test_run_without_credentials_explains_and_cleanup_removes_run_pools(no_kubeconfig: None, karpenter_crds: dict) -> None:
    custom = FakeCustomObjects(schemas=karpenter_crds)
    request = GpuRequest(gpu_type="l4", gpus=1, capacity="spot-then-on-demand", labels=NLP)
    settings = KubetorchGpuCompute(namespace="ml", karpenter=KarpenterPools(pool_scope="run"))
    backend = KubetorchBackend(request, name="train-0f3a9c2e-0", labels=_labels(request), target=settings, run_id="0f3a9c2e-1111-2222", clients=lambda: (FakeCoreV1(), custom))
    lines: list[str] = []
    with pytest.raises(ComputeSetupError, match="no Kubernetes credentials") as err:
        backend.run(worker_fns.add, (1, 2), log=lines.append)
    assert "KUBECONFIG" in err.value.fix
    assert sorted(n for (_g, _p, n) in custom.objects) == ["gpu-ops-nlp-l4-on-demand-0f3a9c2e", "gpu-ops-nlp-l4-spot-0f3a9c2e"]
    assert "NodePool gpu-ops-nlp-l4-spot-0f3a9c2e created" in lines
    backend.teardown()  # nothing was deployed; the run's pools go
    assert custom.objects == {}


def test_team_pools_survive_a_runs_cleanup(no_kubeconfig: None, karpenter_crds: dict) -> None:
    custom = FakeCustomObjects(schemas=karpenter_crds)
    request = GpuRequest(gpu_type="l4", gpus=1, capacity="spot", labels=NLP)
    backend = KubetorchBackend(request, name="x-0f3a9c2e-0", labels=_labels(request), target=KubetorchGpuCompute(), run_id="0f3a9c2e", clients=lambda: (FakeCoreV1(), custom))
    with pytest.raises(ComputeSetupError):
        backend.run(worker_fns.add, (1, 2), log=lambda _l: None)
    backend.teardown()
    assert [n for (_g, _p, n) in custom.objects] == ["gpu-ops-nlp-l4-spot"]


@pytest.mark.parametrize("error_type", ["OutOfMemoryError", "MemoryError"])
def test_remote_out_of_memory_is_oom(error_type: str) -> None:
    from kubetorch.serving.http_client import CustomResponse

    body = {"error_type": error_type, "message": "CUDA out of memory. Tried to allocate 2.00 GiB", "traceback": "Traceback ...", "pod_name": "train-b"}
    with pytest.raises(Exception) as info:
        CustomResponse(500, json=body, request=httpx.Request("POST", "http://svc/call")).raise_for_status()
    assert first_guess_exit(info.value, PodEvidence()) is WorkerExit.OOM


def test_no_gpu_means_no_gpu_placement() -> None:
    request = GpuRequest(gpu_type="t4", gpus=0, labels=NLP)
    spec = _pod_spec(build_compute(request, labels=_labels(request), target=SETTINGS))
    assert "nodeSelector" not in spec or not spec["nodeSelector"]
    assert "affinity" not in spec
    assert "nvidia.com/gpu" not in json.dumps(spec["containers"][0]["resources"])


def test_training_pods_run_as_the_configured_service_account() -> None:
    """The preemption-notice watcher needs `get` on its node and pod: the chart's
    gpu-ops-training-worker ServiceAccount, named in compute.kubetorch.service_account."""
    from gpu_ops.dagster.compute.resource import GpuCompute
    from gpu_ops.domain.config import ComputeConfig

    request = GpuRequest(gpu_type="a100-80gb", gpus=8, labels=Attribution(team="nlp"))
    settings = SETTINGS.model_copy(update={"kubetorch": SETTINGS.kubetorch.model_copy(update={"service_account": "gpu-ops-training-worker"})})
    assert _pod_spec(build_compute(request, labels=_labels(request), target=settings))["serviceAccountName"] == "gpu-ops-training-worker"
    assert _pod_spec(build_compute(request, labels=_labels(request), target=SETTINGS))["serviceAccountName"] == "kubetorch-service-account"  # Kubetorch's default
    config = ComputeConfig.model_validate({"backend": "kubetorch", "kubetorch": {"service_account": "gpu-ops-training-worker"}})
    resource = GpuCompute.from_config(config)
    assert _pod_spec(build_compute(request, labels=_labels(request), target=resource))["serviceAccountName"] == "gpu-ops-training-worker"


# ---------------------------------------------------------------------- a frozen holder's pods


SERVICE = "train-0f3a9c2e-0"


def _service_objects(extra_pod_meta: dict | None = None) -> tuple[FakeCoreV1, FakeAppsV1, dict]:
    """A frozen holder's Kubetorch service (its Deployment and two pods, labelled as the
    backend labels them) and another service's pod; the holder's lease record."""
    request = GpuRequest(gpu_type="l4", gpus=1, labels=NLP)
    frozen = KubetorchBackend(request, name=SERVICE, labels=_labels(request), target=SETTINGS)
    manifest = workload_manifest(build_compute(request, labels=_labels(request), target=SETTINGS), SERVICE)
    pod_labels = manifest["spec"]["template"]["metadata"]["labels"]
    apps = FakeAppsV1([
        client.V1Deployment(
            metadata=client.V1ObjectMeta(name=SERVICE, namespace="ml", labels=manifest["metadata"]["labels"]),
            spec=client.V1DeploymentSpec(selector=client.V1LabelSelector(match_labels=manifest["spec"]["selector"]["matchLabels"]), template=client.V1PodTemplateSpec()),
        )
    ])

    def pod(name: str, labels: dict[str, str]) -> client.V1Pod:
        return client.V1Pod(
            metadata=client.V1ObjectMeta(name=name, namespace="ml", labels=dict(labels), **(extra_pod_meta or {})),
            spec=client.V1PodSpec(node_name="ip-10-0-0-1", containers=[client.V1Container(name="kubetorch")]),
            status=client.V1PodStatus(phase="Running"),
        )

    other = dict(pod_labels, **{"kubetorch.com/service": "other-1111aaaa-0", "gpu-ops.io/run-id": "1111aaaa"})
    core = FakeCoreV1(pods=[pod(f"{SERVICE}-abc-1", pod_labels), pod(f"{SERVICE}-abc-2", pod_labels), pod("other-1111aaaa-0-x", other)], apps=apps)
    return core, apps, frozen.holding()


def _stale_lease(tmp_path: Path, reclaimer: KubetorchBackend, record: dict) -> tuple[LeaseBook, Lease]:
    book = LeaseBook(TableStore(f"sqlite:///{tmp_path / 'leases.db'}"), ttl_s=0.3, reclaimer=reclaimer)
    held = book.try_acquire(Quotas(team={"nlp": 1}), team="nlp", pools=[], gpus=1, run_id="frozen", asset_key="train").lease
    assert held is not None and book.record_workers(held, record)
    assert wait_until(lambda: book.snapshot()[0] > held.expires_at + 0.05, timeout=10)
    return book, held


def test_the_lease_records_the_pods_of_its_service(tmp_path: Path) -> None:
    _core, _apps, record = _service_objects()
    assert record == {
        "backend": "kubetorch", "namespace": "ml",
        "selector": {"gpu-ops.io/managed-by": "gpu-ops", "kubetorch.com/service": SERVICE, "gpu-ops.io/run-id": "0f3a9c2e-1111-2222", "gpu-ops.io/attempt": "0"},
    }


def test_a_stale_kubetorch_lease_is_reclaimed_once_its_pods_are_deleted_with_grace_0_and_listed_gone(tmp_path: Path) -> None:
    core, apps, record = _service_objects()
    reclaimer = KubetorchBackend(GpuRequest(gpu_type="l4", gpus=1, labels=NLP), name="train-2222bbbb-0", labels={}, target=SETTINGS,
                                 clients=lambda: (core, FakeCustomObjects()), apps=lambda: apps)
    book, held = _stale_lease(tmp_path, reclaimer, record)
    adm = book.try_acquire(Quotas(team={"nlp": 1}), team="nlp", pools=[], gpus=1, run_id="second", asset_key="train")
    assert adm.granted and [le.lease_id for le in adm.reclaimed] == [held.lease_id]
    assert [p.metadata.name for p in core.pods] == ["other-1111aaaa-0-x"]  # another service's pod is left alone
    assert apps.deployments == []  # nothing brings the pods back
    assert {name for name, _ns, _b in core.deletions} == {f"{SERVICE}-abc-1", f"{SERVICE}-abc-2"}
    assert all(isinstance(b, client.V1DeleteOptions) and b.grace_period_seconds == 0 for _n, _ns, b in core.deletions)
    assert "deleted with grace period 0" in adm.stopped[held.lease_id] and "none is listed" in adm.stopped[held.lease_id]


def test_a_stale_kubetorch_lease_whose_pods_stay_listed_is_not_reclaimed(tmp_path: Path) -> None:
    core, apps, record = _service_objects({"finalizers": ["example.com/keep"]})
    reclaimer = KubetorchBackend(GpuRequest(gpu_type="l4", gpus=1, labels=NLP), name="train-2222bbbb-0", labels={}, target=SETTINGS,
                                 clients=lambda: (core, FakeCustomObjects()), apps=lambda: apps, reap_wait_s=0.3)
    book, held = _stale_lease(tmp_path, reclaimer, record)
    adm = book.try_acquire(Quotas(team={"nlp": 1}), team="nlp", pools=[], gpus=1, run_id="second", asset_key="train")
    assert not adm.granted and adm.reclaimed == ()
    assert "expired but is not reclaimed" in adm.reason and f"{SERVICE}-abc-1, {SERVICE}-abc-2 in ml are still listed" in adm.reason
    assert [le.lease_id for le in book.snapshot()[1]] == [held.lease_id]

    def unreachable() -> tuple:
        raise ApiException(status=503, reason="Service Unavailable")

    blind = KubetorchBackend(GpuRequest(gpu_type="l4"), name="x-0", labels={}, target=SETTINGS, clients=unreachable, apps=lambda: apps)
    gone = blind.make_gone(record)
    assert not gone.confirmed and "could not delete its pods" in gone.why and "503" in gone.why
    assert not blind.make_gone({"backend": "local", "host": "h", "workers": [[1, "2"]]}).confirmed


def test_a_kubetorch_launch_that_lost_its_lease_creates_nothing(no_kubeconfig: None) -> None:
    """The pods are written on the lease before the service is deployed; a lease found gone
    then ends the launch as LOST before anything reaches the cluster (without a kubeconfig
    a deployment would raise ComputeSetupError)."""
    request = GpuRequest(gpu_type="l4", gpus=1, labels=NLP)
    custom = FakeCustomObjects()
    backend = KubetorchBackend(request, name=SERVICE, labels=_labels(request), target=KubetorchGpuCompute(namespace="ml", karpenter=KarpenterPools(manage_nodepools=False)),
                               clients=lambda: (FakeCoreV1(), custom))
    held: list[dict] = []

    def hold(workers: dict) -> None:
        held.append(dict(workers))
        raise LeaseLost("GPU lease 1234abcd expired before its workers were recorded on it")

    report = backend.run(worker_fns.add, (1, 2), hold=hold, log=lambda _l: None)
    assert report.exit is WorkerExit.LOST and "expired before its workers were recorded" in (report.error_message or "")
    assert held == [backend.holding()]
