"""`KubetorchBackend`: run a launch on Kubernetes GPUs through Kubetorch 0.5.1.

kubetorch and kubernetes are imported inside functions.
Design: docs/concepts/compute.md#the-kubetorch-backend
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Protocol

import httpx

from gpu_ops.domain.compute import fence
from gpu_ops.domain.compute.backend import Gone, HoldSink, LeaseLost, LogSink, RankReport, StartSink, WorkerExit, WorkerReport, hold_workers, lost_report
from gpu_ops.domain.compute.catalog import gpu_spec
from gpu_ops.flows.compute.karpenter import (
    DO_NOT_DISRUPT,
    NodePoolClient,
    PoolSettings,
    ec2nodeclass_manifest,
    gpu_tolerations,
    nodepool_manifests,
    pod_affinity,
    pod_node_selector,
)
from gpu_ops.flows.compute.kube import TOLERATED, api_call, load_cluster_config
from gpu_ops.domain.compute.naming import ATTEMPT, MANAGED_BY, MANAGED_BY_VALUE, RUN_ID
from gpu_ops.domain.compute.request import GpuRequest
from gpu_ops.flows.compute.worker import is_oom
from gpu_ops.errors import ComputeSetupError

if TYPE_CHECKING:
    import kubetorch as kt

KUBETORCH_VERSION = "0.5.1"  # the client is pinned; the controller chart must match
SERVICE_LABEL = "kubetorch.com/service"


class LaunchSettings(Protocol):
    """What a launch asks of Kubetorch: the resource's nested ``KubetorchLaunch``."""

    @property
    def priority_class(self) -> str | None: ...
    @property
    def launch_timeout_s(self) -> int: ...
    @property
    def inactivity_ttl(self) -> str: ...
    @property
    def image(self) -> str | None: ...
    @property
    def service_account(self) -> str | None: ...


class KubetorchTarget(Protocol):
    """Where and how launches go: the :class:`~gpu_ops.dagster.compute.resource.KubetorchGpuCompute`
    resource itself, its nested ``kubetorch`` (:class:`LaunchSettings`) and ``karpenter``
    (:class:`~gpu_ops.flows.compute.karpenter.PoolSettings`) settings read as they are (one home
    for each setting: nothing here copies them)."""

    @property
    def namespace(self) -> str: ...
    @property
    def kubeconfig_path(self) -> str | None: ...
    @property
    def kubetorch(self) -> LaunchSettings: ...
    @property
    def karpenter(self) -> PoolSettings: ...


# ---------------------------------------------------------------------- manifests


def build_compute(
    request: GpuRequest,
    *,
    labels: dict[str, str],
    target: KubetorchTarget,
    env: dict[str, str] | None = None,
) -> "kt.Compute":
    """The ``kt.Compute`` for ``request`` (offline: no cluster is contacted)."""
    import kubetorch as kt

    launch, image = target.kubetorch, request.image or target.kubetorch.image
    affinity = pod_affinity(request)
    mig = request.mig_profile
    compute = kt.Compute(
        cpus=f"{request.cpus:g}",
        memory=request.memory,
        # A MIG slice is its own extended resource (set below), not nvidia.com/gpu.
        gpus=None if mig or not request.gpus else request.gpus,
        namespace=request.namespace if request.namespace != "default" else target.namespace,
        image=kt.Image(image_id=image) if image else None,
        labels=dict(labels),
        annotations={DO_NOT_DISRUPT: "true"},
        node_selector=pod_node_selector(request, team_pools=target.karpenter.manage_nodepools),
        tolerations=gpu_tolerations(),
        priority_class_name=request.priority_class or launch.priority_class,
        launch_timeout=launch.launch_timeout_s,
        inactivity_ttl=launch.inactivity_ttl,
        env_vars=dict(env or {}),
        kubeconfig_path=target.kubeconfig_path,
        service_account_name=launch.service_account,
        service_template={"spec": {"template": {"spec": {"affinity": affinity}}}} if affinity else None,
    )
    if mig:
        resource = gpu_spec(request.gpu_type).mig_profile(mig).resource_name
        # kt.Compute has no MIG argument; this is the same container it builds.
        compute._set_container_resource(resource, str(max(request.gpus, 1)), limits=True)
    if request.workers > 1:
        compute.distribute("pytorch", workers=request.workers)
    return compute


def workload_manifest(compute: "kt.Compute", service_name: str, module_name: str = "gpu-ops") -> dict[str, Any]:
    """The workload as the controller will apply it: named, selector set, no null labels."""
    sm = compute.service_manager  # offline: builds manifests, contacts nothing
    manifest = sm._preprocess_manifest_for_launch(copy.deepcopy(compute.manifest))
    manifest = sm._update_launchtime_manifest(manifest, service_name, module_name, "")

    def drop_nulls(meta: dict[str, Any]) -> None:
        for key in ("labels", "annotations"):
            if key in meta:
                meta[key] = {k: str(v) for k, v in meta[key].items() if v is not None}

    drop_nulls(manifest["metadata"])
    drop_nulls(manifest["spec"]["template"].setdefault("metadata", {}))
    return manifest


# ---------------------------------------------------------------------- errors


def explain_setup_error(exc: BaseException, *, request: GpuRequest, launch: LaunchSettings) -> ComputeSetupError | None:
    """Turn Kubetorch's setup failures into what to fix; None for anything else."""
    import kubetorch as kt

    name = type(exc).__name__
    if isinstance(exc, kt.KubernetesCredentialsError):
        return ComputeSetupError(
            "no Kubernetes credentials were found",
            "set KUBECONFIG to a kubeconfig for the cluster (or run inside it with a service account); `gpu-ops validate` checks it",
            exc,
        )
    if isinstance(exc, kt.VersionMismatchError):
        return ComputeSetupError(
            f"the Kubetorch controller's version does not match this client ({KUBETORCH_VERSION}): {exc}",
            f"install the kubetorch helm chart version {KUBETORCH_VERSION} in the cluster (helm upgrade --install kubetorch ... --version {KUBETORCH_VERSION}), or pin the client to the chart's version",
            exc,
        )
    if isinstance(exc, kt.ImagePullError):
        image = request.image or launch.image or "Kubetorch's default server image"
        return ComputeSetupError(
            f"the image {image} cannot be pulled: {exc}",
            "check compute.kubetorch.image (name and tag) and that the namespace has imagePullSecrets for its registry",
            exc,
        )
    if isinstance(exc, kt.ResourceNotAvailableError):
        return ComputeSetupError(
            f"the cluster cannot provide {request.gpus} x {request.gpu_type} on {request.capacity} capacity: {exc}",
            "check the gpu-ops NodePools (`kubectl get nodepools -l gpu-ops.io/managed-by=gpu-ops`): their nvidia.com/gpu limit (a budget throttle lowers it), "
            "instance types and capacity type; or ask for capacity spot-then-on-demand",
            exc,
        )
    if isinstance(exc, kt.ServiceTimeoutError):
        return ComputeSetupError(
            f"the workers were not ready within launch_timeout ({launch.launch_timeout_s}s): {exc}",
            "see `kubectl get nodeclaims` and the pods' events: no GPU capacity (NodePool limits, spot availability) or a slow image pull; "
            "raise compute.kubetorch.launch_timeout_s if nodes are merely slow to start",
            exc,
        )
    unreachable = isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout, ConnectionError)) or (
        isinstance(exc, kt.ControllerRequestError) and getattr(exc, "status_code", 0) in (502, 503, 504)
    )
    if unreachable:
        return ComputeSetupError(
            f"the Kubetorch controller is unreachable ({name}: {exc})",
            "install the kubetorch helm chart in the cluster and check `kubectl get pods -n kubetorch`; `gpu-ops validate` checks it",
            exc,
        )
    return None


# ---------------------------------------------------------------------- evidence


@dataclass
class PodEvidence:
    pod: Any = None  # kubernetes.client.V1Pod
    node: Any = None  # kubernetes.client.V1Node
    events: list[Any] = field(default_factory=list)  # kubernetes.client.CoreV1Event


def _pod_trouble(pod: Any) -> int:
    """Rank pods so the one that went wrong is the evidence (higher is worse)."""
    status = pod.status
    score = 0
    if status is None:
        return score
    if status.phase in ("Failed", "Unknown"):
        score += 4
    if status.reason in ("Evicted", "Terminated", "NodeLost"):
        score += 4
    for cond in status.conditions or []:
        if cond.type == "DisruptionTarget" and cond.status == "True":
            score += 8
    for cs in status.container_statuses or []:
        term = (cs.state and cs.state.terminated) or (cs.last_state and cs.last_state.terminated)
        if term is not None:
            score += 2 + (4 if term.reason == "OOMKilled" else 0)
    if pod.metadata.deletion_timestamp is not None:
        score += 1
    return score


def collect_evidence(core: Any, namespace: str, service_name: str, pod_name: str | None = None) -> PodEvidence:
    """Read the pod (the named one, else the service's most troubled), its node and events.

    ``core`` is a ``kubernetes.client.CoreV1Api``. A node that no longer exists (spot
    reclaimed it) is not an error: ``node`` is None and the events still tell.
    """
    evidence = PodEvidence()
    pod = None
    if pod_name:
        pod = api_call(core.read_namespaced_pod, pod_name, namespace, tolerate=404)
        pod = None if pod is TOLERATED else pod
    if pod is None:
        pods = core.list_namespaced_pod(namespace, label_selector=f"{SERVICE_LABEL}={service_name}").items
        pod = max(pods, key=_pod_trouble) if pods else None
    evidence.pod = pod
    if pod is None:
        return evidence
    evidence.events.extend(core.list_namespaced_event(namespace, field_selector=f"involvedObject.kind=Pod,involvedObject.name={pod.metadata.name}").items)
    node_name = pod.spec.node_name if pod.spec else None
    if node_name:
        node = api_call(core.read_node, node_name, tolerate=404)
        if node is not TOLERATED:
            evidence.node = node
        # SpotInterrupted / Disrupted events are recorded on the Node.
        evidence.events.extend(core.list_event_for_all_namespaces(field_selector=f"involvedObject.kind=Node,involvedObject.name={node_name}").items)
    return evidence


def first_guess_exit(exc: BaseException, evidence: PodEvidence) -> WorkerExit:
    """A first reading of how the call ended; the training classifier has the last word."""
    if getattr(exc, "remote_traceback", None) is not None and type(exc).__name__ != "PodTerminatedError":
        return WorkerExit.OOM if is_oom(exc) or "OutOfMemoryError" in type(exc).__mro__[1].__name__ else WorkerExit.ERROR
    pod = evidence.pod
    if pod is not None and pod.status is not None:
        for cs in pod.status.container_statuses or []:
            term = (cs.state and cs.state.terminated) or (cs.last_state and cs.last_state.terminated)
            if term is not None and term.reason == "OOMKilled":
                return WorkerExit.OOM
        if any(c.type == "DisruptionTarget" and c.status == "True" for c in pod.status.conditions or []) or pod.status.reason in ("Evicted", "Terminated"):
            return WorkerExit.SIGTERM
    if type(exc).__name__ == "PodTerminatedError":
        return WorkerExit.SIGTERM
    return WorkerExit.LOST


# ---------------------------------------------------------------------- backend


class _LogBridge(logging.Handler):
    """Kubetorch streams the workers' output through its logger; pass it to our sink."""

    def __init__(self, sink: LogSink):
        super().__init__(logging.INFO)
        self.sink = sink

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.sink(record.getMessage())
        except Exception:  # a log sink must never break the call
            pass


def _kube_clients(kubeconfig_path: str | None) -> tuple[Any, Any]:
    from kubernetes import client

    load_cluster_config(kubeconfig_path)
    return client.CoreV1Api(), client.CustomObjectsApi()


def _apps_client(kubeconfig_path: str | None) -> Any:
    from kubernetes import client

    load_cluster_config(kubeconfig_path)
    return client.AppsV1Api()


POD_FENCE_DIR = "/tmp"  # in the pod: where pod_call keeps the pod's own fence file


@dataclass
class FencedCall:
    """A launch under a GPU lease, on remote workers (see :mod:`gpu_ops.domain.compute.fence`):
    the pod runs :func:`~gpu_ops.domain.compute.fence.pod_call`, which keeps the pod's own fence
    file and watchdog; the launcher's fence file (renewed by its lease heartbeat) is relayed
    to it by further calls of the same service while the launch call runs."""

    launcher_path: str
    pod_env: dict[str, str]
    target: str
    log: LogSink
    deployed: Callable[..., Any] = field(default=fence.pod_call)

    @classmethod
    def of(cls, backend: "KubetorchBackend", fn: Callable[..., Any], env: dict[str, str] | None, log: LogSink) -> "FencedCall | None":
        """None when the launch holds no lease (no fence file in ``env``)."""
        pod_env = dict(env or {})
        launcher_path = pod_env.pop(fence.FENCE_ENV, None)
        if not launcher_path:
            return None
        pod_env[fence.FENCE_ENV] = f"{POD_FENCE_DIR}/gpu-ops-fence-{backend.name}.json"
        return cls(launcher_path, pod_env, f"{fn.__module__}:{fn.__qualname__}", log)

    def payload(self, relay: fence.FenceRelay, args: tuple, kwargs: dict[str, Any] | None) -> dict[str, Any]:
        initial = relay.initial()
        if initial is None:  # the heartbeat writes it before the launch: its absence is a bug, not a state
            raise RuntimeError(f"the launcher's fence file {self.launcher_path} is missing: refusing to launch unfenced under a GPU lease")
        return {"fence": initial, "target": self.target, "args": list(args), "kwargs": dict(kwargs or {})}

    def call(self, remote: Any, args: tuple, kwargs: dict[str, Any] | None) -> Any:
        """The launch call, with the relay renewing the pod's fence while it runs."""
        relay = fence.FenceRelay(self.launcher_path, send=lambda f: remote({"renew": f}), on_error=self.log)
        payload = self.payload(relay, args, kwargs)
        relay.start()
        try:
            return remote(payload)
        finally:
            relay.stop()


class KubetorchBackend:
    """One launch on Kubetorch; ``teardown`` removes its service and run-scoped pools."""

    workdir = None  # the workers' results come back over HTTP, not through a local folder

    def __init__(
        self,
        request: GpuRequest,
        *,
        name: str,
        labels: dict[str, str],
        target: KubetorchTarget,
        run_id: str | None = None,
        clients: Callable[[], tuple[Any, Any]] | None = None,
        apps: Callable[[], Any] | None = None,
        reap_wait_s: float = 30.0,
    ):
        self.request = request
        self.name = name
        self.labels = labels
        self.target = target
        self.run_id = run_id
        # (CoreV1Api, CustomObjectsApi) and AppsV1Api of the cluster, made when first needed.
        self._clients = clients or (lambda: _kube_clients(target.kubeconfig_path))
        self._apps = apps or (lambda: _apps_client(target.kubeconfig_path))
        self.reap_wait_s = reap_wait_s  # make_gone: how long deleted pods may stay listed
        self._remote: Any = None
        self._created_pools: list[str] = []

    @classmethod
    def from_resource(cls, resource: KubetorchTarget, request: GpuRequest, *, name: str, labels: dict[str, str]) -> "KubetorchBackend":
        return cls(request, name=name, labels=labels, target=resource, run_id=labels.get(RUN_ID))

    @property
    def namespace(self) -> str:
        return self.request.namespace if self.request.namespace != "default" else self.target.namespace

    def ensure_nodepools(self, custom_api: Any, log: LogSink) -> None:
        pools = NodePoolClient(custom_api)
        settings = self.target.karpenter
        if settings.manage_ec2nodeclass:
            pools.apply_node_class(ec2nodeclass_manifest(settings))
        for manifest in nodepool_manifests(self.request, settings, run_id=self.run_id):
            outcome = pools.apply(manifest)
            name = manifest["metadata"]["name"]
            log(f"NodePool {name} {outcome}")
            if outcome == "created" and settings.pool_scope == "run":
                self._created_pools.append(name)

    def run(
        self,
        fn: Callable[..., Any],
        args: tuple = (),
        kwargs: dict | None = None,
        *,
        env: dict[str, str] | None = None,
        log: LogSink = print,
        on_start: StartSink | None = None,
        hold: HoldSink | None = None,
    ) -> WorkerReport:
        fenced = FencedCall.of(self, fn, env, log)
        compute = build_compute(self.request, labels=self.labels, target=self.target, env=fenced.pod_env if fenced else env)
        core, custom = self._clients()
        if self.target.karpenter.manage_nodepools:
            self.ensure_nodepools(custom, log)
        started = time.monotonic()
        lost = hold_workers(hold, self.holding())  # before any pod of it can exist
        if lost is not None:
            return lost_report(lost, 0.0)
        bridge = _LogBridge(log)
        kt_logger = logging.getLogger("kubetorch")
        kt_logger.addHandler(bridge)
        try:
            self._deploy(fenced.deployed if fenced else fn, compute)
            log(f"service {self.name} ready in namespace {self.namespace} ({self.request.workers} worker(s))")
            lost = hold_workers(hold, self.holding())  # the launcher may have been frozen while it deployed
            if lost is not None:
                return self._lost_after_deploy(lost, log, time.monotonic() - started)
            if on_start is not None:
                on_start([])  # remote workers have no local pids
            try:
                value = fenced.call(self._remote, args, kwargs) if fenced else self._remote(*args, **(kwargs or {}))
            except Exception as exc:
                evidence = collect_evidence(core, self.namespace, self.name, getattr(exc, "pod_name", None))
                return self._failure_report(exc, evidence, time.monotonic() - started)
        finally:
            kt_logger.removeHandler(bridge)
        return self._success_report(value, time.monotonic() - started)

    def _deploy(self, deployed: Callable[..., Any], compute: "kt.Compute") -> None:
        import kubetorch as kt

        # Kept before deploying: a launch that times out has already created the
        # service, and teardown must still find it.
        self._remote = kt.fn(deployed, name=self.name)
        try:
            self._remote.to(compute, prefix_username=False)
        except Exception as exc:
            explained = explain_setup_error(exc, request=self.request, launch=self.target.kubetorch)
            if explained is not None:
                raise explained from exc
            raise

    def _lost_after_deploy(self, lost: LeaseLost, log: LogSink, duration: float) -> WorkerReport:
        """The lease was handed on while the service deployed: never call it; remove it
        now, whatever the cleanup policy (its pods would hold GPUs outside any lease)."""
        log(f"{lost}; tearing down service {self.name}")
        try:
            self.teardown()
        except Exception as exc:  # noqa: BLE001 - the orphan sensor removes it; the report says what happened
            log(f"cleanup of {self.name} failed: {exc}")
        return lost_report(lost, duration)

    # ------------------------------------------------------------------ holders

    def selector(self) -> dict[str, str]:
        """The labels every pod of this launch carries (and only its pods): the Kubetorch
        service's name with the gpu_ops managed-by label, run id and attempt."""
        wanted = {MANAGED_BY: MANAGED_BY_VALUE, SERVICE_LABEL: self.name}
        return wanted | {k: self.labels[k] for k in (RUN_ID, ATTEMPT) if k in self.labels}

    def holding(self) -> dict[str, Any]:
        """This launch's workers as its lease records them: the namespace and label selector of its pods."""
        return {"backend": "kubetorch", "namespace": self.namespace, "selector": self.selector()}

    def make_gone(self, workers: Mapping[str, Any]) -> Gone:
        """Delete the pods a stale lease recorded (:meth:`holding`): first the Deployments
        that would recreate them, then every pod of the selector with grace period 0;
        confirmed once a list of the selector is empty (within ``reap_wait_s``)."""
        if workers.get("backend") != "kubetorch":
            return Gone(False, f"its workers were started by the {workers.get('backend')!r} backend, which a Kubetorch admission cannot stop")
        namespace, selector = str(workers.get("namespace") or ""), dict(workers.get("selector") or {})
        if not namespace or SERVICE_LABEL not in selector:  # never delete by a broader selector than one service's
            return Gone(False, f"its record names no Kubetorch service's pods ({dict(workers)}): they cannot be found to be deleted")
        labels = ",".join(f"{k}={v}" for k, v in sorted(selector.items()))
        try:
            return self._delete_pods(namespace, labels)
        except Exception as exc:  # noqa: BLE001 - the cluster did not answer: nothing is confirmed
            return Gone(False, f"could not delete its pods ({labels} in {namespace}): {type(exc).__name__}: {exc}")

    def _delete_pods(self, namespace: str, labels: str) -> Gone:
        from kubernetes import client

        core, _custom = self._clients()
        apps = self._apps()
        now = client.V1DeleteOptions(grace_period_seconds=0)
        for d in apps.list_namespaced_deployment(namespace, label_selector=labels).items:  # nothing may bring the pods back
            api_call(apps.delete_namespaced_deployment, d.metadata.name, namespace, body=client.V1DeleteOptions(grace_period_seconds=0, propagation_policy="Background"), tolerate=404)
        deleted: set[str] = set()
        deadline = time.monotonic() + self.reap_wait_s
        while True:
            pods = core.list_namespaced_pod(namespace, label_selector=labels).items
            if not pods:
                return Gone(True, f"its pods were deleted with grace period 0 ({', '.join(sorted(deleted)) or 'none were left'}) and none is listed for {labels} in {namespace}")
            if time.monotonic() >= deadline:
                names = ", ".join(sorted(p.metadata.name for p in pods))
                return Gone(False, f"pod(s) {names} in {namespace} are still listed {self.reap_wait_s:g} s after deletion with grace period 0 (a finalizer?)")
            for pod in pods:
                api_call(core.delete_namespaced_pod, pod.metadata.name, namespace, body=now, tolerate=404)
                deleted.add(pod.metadata.name)
            time.sleep(0.2)

    def _success_report(self, value: Any, duration: float) -> WorkerReport:
        if self.request.workers > 1 and isinstance(value, list) and len(value) == self.request.workers:
            ranks = [RankReport(rank=i, exit=WorkerExit.COMPLETED, exit_code=0, value=v) for i, v in enumerate(value)]
            return WorkerReport(exit=WorkerExit.COMPLETED, exit_code=0, value=value[0], duration_s=duration, ranks=ranks)
        return WorkerReport(exit=WorkerExit.COMPLETED, exit_code=0, value=value, duration_s=duration, ranks=[RankReport(0, WorkerExit.COMPLETED, 0, value=value)])

    def _failure_report(self, exc: BaseException, evidence: PodEvidence, duration: float) -> WorkerReport:
        exit = first_guess_exit(exc, evidence)
        cls = type(exc)
        # Kubetorch wraps remote exceptions in a RemoteException subclass of the original.
        error_type = cls.__mro__[1].__name__ if cls.__name__ == "RemoteException" else cls.__name__
        return WorkerReport(
            exit=exit,
            error_type=error_type,
            error_message=str(exc).split("\n\n", 1)[0],
            traceback=getattr(exc, "remote_traceback", None),
            duration_s=duration,
            pod=evidence.pod,
            node=evidence.node,
            events=evidence.events,
            exception=exc,
        )

    def teardown(self) -> None:
        """Delete the Kubetorch service, then any NodePool this run created."""
        errors: list[str] = []
        # Module.to() assigns .compute before deploying anything: without it there is nothing to delete.
        if self._remote is not None and getattr(self._remote, "compute", None) is not None:
            try:
                self._remote.teardown()
            except Exception as exc:
                errors.append(f"service {self.name}: {exc}")
            self._remote = None
        if self._created_pools:
            _core, custom = self._clients()
            pools = NodePoolClient(custom)
            for name in self._created_pools:
                try:
                    pools.delete(name, run_id=self.run_id)
                except Exception as exc:
                    errors.append(f"NodePool {name}: {exc}")
            self._created_pools = []
        if errors:
            raise RuntimeError("cleanup incomplete: " + "; ".join(errors))
