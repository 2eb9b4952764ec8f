"""`gpu-ops validate` checks of the compute flow: kubeconfig, Kubetorch controller,
Karpenter CRDs, local GPU. Each says what is wrong and how to fix it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from gpu_ops.domain.config import GpuOpsConfig
from gpu_ops.domain.check_result import CheckResult

KT_CONTROLLER = "kubetorch-controller"
KT_CONTROLLER_PORT = 8080
CRDS = {"nodepools.karpenter.sh": "NodePool", "ec2nodeclasses.karpenter.k8s.aws": "EC2NodeClass"}
_TIMEOUT_S = 5


def _kubeconfig_path() -> Path:
    return Path(os.environ.get("KUBECONFIG") or Path.home() / ".kube" / "config").expanduser()


def _in_cluster() -> bool:
    return Path("/var/run/secrets/kubernetes.io/serviceaccount/token").exists()


def _skip_local(name: str, config: GpuOpsConfig) -> CheckResult | None:
    if config.compute.backend == "local":
        return CheckResult(name, "skipped", "compute.backend is local: no cluster is used")
    return None


def _api_client() -> Any:
    from kubernetes import client, config

    if _in_cluster() and not os.environ.get("KUBECONFIG"):
        config.load_incluster_config()
        return client.ApiClient()
    # A client of its own: validating must not change the process-wide default config.
    return config.new_client_from_config(config_file=str(_kubeconfig_path()))


def _connect(name: str, api_client: Any) -> tuple[Any, CheckResult | None]:
    if api_client is not None:
        return api_client, None
    try:
        return _api_client(), None
    except Exception as exc:
        return None, CheckResult(name, "failed", f"cannot reach the cluster: {_reason(exc)}", "fix the kubeconfig check first (KUBECONFIG must name the cluster's kubeconfig)")


def _reason(exc: BaseException) -> str:
    status = getattr(exc, "status", None)
    if status:
        return f"HTTP {status} {getattr(exc, 'reason', '')}".strip()
    return str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__


def check_kubeconfig(config: GpuOpsConfig, api_client: Any = None) -> CheckResult:
    skipped = _skip_local("kubeconfig", config)
    if skipped:
        return skipped
    from kubernetes import client

    if api_client is None:
        path = _kubeconfig_path()
        if not _in_cluster() and not path.exists():
            return CheckResult("kubeconfig", "failed", f"no kubeconfig at {path} and not running in a cluster", "set KUBECONFIG to the cluster's kubeconfig (e.g. `aws eks update-kubeconfig --name <cluster>`)")
        try:
            api_client = _api_client()
        except Exception as exc:
            return CheckResult("kubeconfig", "failed", f"{path} cannot be loaded: {_reason(exc)}", "check the file's current-context, cluster and user entries (`kubectl config view`)")
    try:
        version = client.VersionApi(api_client).get_code(_request_timeout=_TIMEOUT_S)
    except Exception as exc:
        return CheckResult("kubeconfig", "failed", f"the API server is not reachable: {_reason(exc)}", "check network access to the cluster and that the credentials are valid (`kubectl version`)")
    return CheckResult("kubeconfig", "ok", f"API server reachable (Kubernetes {version.git_version})")


def check_kubetorch(config: GpuOpsConfig, api_client: Any = None) -> CheckResult:
    skipped = _skip_local("kubetorch", config)
    if skipped:
        return skipped
    from importlib.metadata import version

    from kubernetes import client

    client_version = version("kubetorch")
    namespace = os.environ.get("KT_INSTALL_NAMESPACE", "kubetorch")
    api_client, failed = _connect("kubetorch", api_client)
    if failed:
        return failed
    try:
        core = client.CoreV1Api(api_client)
        # Raw body: the generated client would turn a JSON body into a Python repr.
        body = core.connect_get_namespaced_service_proxy_with_path(
            f"{KT_CONTROLLER}:{KT_CONTROLLER_PORT}", namespace, "health", _request_timeout=_TIMEOUT_S, _preload_content=False
        ).data
    except Exception as exc:
        if getattr(exc, "status", None) == 404:
            detail = f"no {KT_CONTROLLER} service in namespace {namespace}"
        else:
            detail = f"the Kubetorch controller is not reachable: {_reason(exc)}"
        return CheckResult(
            "kubetorch",
            "failed",
            detail,
            f"install the kubetorch helm chart {client_version} (`helm upgrade --install kubetorch ... --version {client_version} -n {namespace}`); set KT_INSTALL_NAMESPACE if it lives elsewhere",
        )
    try:
        data = json.loads(body or b"{}")
        data = data if isinstance(data, dict) else {}
    except ValueError:  # an older controller answers plain text
        data = {}
    cluster_version = data.get("version")
    if cluster_version and cluster_version != client_version:
        return CheckResult(
            "kubetorch",
            "failed",
            f"controller {cluster_version} does not match the client {client_version}",
            f"upgrade the chart to {client_version} (`helm upgrade kubetorch ... --version {client_version}`) or install kubetorch=={cluster_version}",
        )
    return CheckResult("kubetorch", "ok", f"controller reachable in {namespace} (version {cluster_version or 'not reported'}, client {client_version})")


def check_karpenter(config: GpuOpsConfig, api_client: Any = None) -> CheckResult:
    skipped = _skip_local("karpenter", config)
    if skipped:
        return skipped
    if not config.compute.karpenter.manage_nodepools:
        return CheckResult("karpenter", "skipped", "compute.karpenter.manage_nodepools is false: NodePools are not managed")
    from kubernetes import client

    api_client, failed = _connect("karpenter", api_client)
    if failed:
        return failed
    try:
        missing, found = _karpenter_crds(client.ApiextensionsV1Api(api_client))
    except Exception as exc:
        return CheckResult("karpenter", "failed", f"cannot read CRDs: {_reason(exc)}", "check cluster access (`gpu-ops validate --only kubeconfig`) and RBAC to read customresourcedefinitions")
    if missing:
        return CheckResult(
            "karpenter",
            "failed",
            f"Karpenter v1 CRDs missing: {', '.join(missing)}",
            "install Karpenter v1 (helm chart oci://public.ecr.aws/karpenter/karpenter with its CRDs), or set compute.karpenter.manage_nodepools: false",
        )
    return CheckResult("karpenter", "ok", f"Karpenter v1 CRDs installed ({', '.join(found)})")


def _karpenter_crds(ext: Any) -> tuple[list[str], list[str]]:
    """Karpenter's CRDs that are missing (or do not serve v1), and those that are there."""
    missing, found = [], []
    for name, kind in CRDS.items():
        try:
            crd = ext.read_custom_resource_definition(name, _request_timeout=_TIMEOUT_S)
        except Exception as exc:
            if getattr(exc, "status", None) == 404:
                missing.append(kind)
                continue
            raise
        served = [v.name for v in crd.spec.versions if v.served]
        if "v1" not in served:
            missing.append(f"{kind} v1 (served: {', '.join(served)})")
        else:
            found.append(kind)
    return missing, found


def check_gpu(config: GpuOpsConfig) -> CheckResult:
    if config.compute.backend != "local":
        return CheckResult("gpu", "skipped", "compute.backend is kubetorch: GPUs are on cluster nodes, not this machine")
    try:
        import torch
    except ImportError:
        return CheckResult("gpu", "skipped", "torch is not installed here: the local backend cannot train", "pip install 'gpu_ops[train]'")
    if torch.cuda.is_available():
        names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        return CheckResult("gpu", "ok", f"{len(names)} CUDA GPU(s) visible: {', '.join(names)}")
    hint = "a CPU-only torch build" if torch.version.cuda is None else f"CUDA {torch.version.cuda} build, but no device is visible"
    return CheckResult(
        "gpu",
        "skipped",
        f"no CUDA GPU visible ({hint}): local launches run on CPU",
        "to use this machine's GPU: install the NVIDIA driver and a CUDA build of torch, and leave CUDA_VISIBLE_DEVICES unset",
    )
