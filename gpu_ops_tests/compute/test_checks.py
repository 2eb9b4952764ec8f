"""`gpu-ops validate` compute checks, through the real kubernetes client over real HTTP to a
stand-in API server on 127.0.0.1 that serves the real Karpenter CRDs."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote

import pytest
import yaml
from click.testing import CliRunner

from gpu_ops.cli.checks.compute import check_gpu, check_karpenter, check_kubeconfig, check_kubetorch
from gpu_ops.domain.config import parse_config
from gpu_ops_tests.conftest import CRD_DIR

PRICES = {"source": "test", "as_of": "2026-11-01", "gpus": {"h100": {"spot": 4.3}}}


def _config(backend: str, **compute):
    return parse_config({"prices": PRICES, "compute": {"backend": backend, **compute}}, None)


_NOT_FOUND = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404}
_VERSION = {"major": "1", "minor": "31", "gitVersion": "v1.31.2", "gitCommit": "abc", "gitTreeState": "clean",
            "buildDate": "2026-01-01T00:00:00Z", "goVersion": "go1.22", "compiler": "gc", "platform": "linux/amd64"}
_HEALTH = "/api/v1/namespaces/kubetorch/services/kubetorch-controller:8080/proxy/health"
_CRD_PREFIX = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/"


class _StubHandler(BaseHTTPRequestHandler):
    """The API server's answers; what it knows is the StubApiServer at ``self.server.stub``."""

    def log_message(self, *args) -> None:
        pass

    def _send(self, code: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        stub = self.server.stub
        path = unquote(self.path.split("?")[0])
        if path.rstrip("/") == "/version":
            return self._send(200, _VERSION)
        if path == _HEALTH:
            if stub.controller_version is None:
                return self._send(404, _NOT_FOUND)
            return self._send(200, {"status": "healthy", "version": stub.controller_version})
        if path.startswith(_CRD_PREFIX) and path[len(_CRD_PREFIX):] in stub.crds:
            return self._send(200, stub.crds[path[len(_CRD_PREFIX):]])
        return self._send(404, _NOT_FOUND)


class StubApiServer:
    """Answers the few GETs the checks make, with what a real API server returns."""

    def __init__(self) -> None:
        self.controller_version: str | None = "0.5.1"
        self.crds: dict[str, dict] = {}
        if CRD_DIR.is_dir():
            for path in CRD_DIR.glob("*.yaml"):
                crd = yaml.safe_load(path.read_text())
                self.crds[crd["metadata"]["name"]] = crd
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _StubHandler)
        self.server.stub = self
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def _kubeconfig(path: Path, server: str) -> Path:
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "test",
        "clusters": [{"name": "test", "cluster": {"server": server}}],
        "users": [{"name": "test", "user": {"token": "not-a-secret"}}],
        "contexts": [{"name": "test", "context": {"cluster": "test", "user": "test"}}],
    }))
    return path


@pytest.fixture
def api(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, karpenter_crds: dict) -> Iterator[StubApiServer]:
    stub = StubApiServer()
    monkeypatch.setenv("KUBECONFIG", str(_kubeconfig(tmp_path / "kubeconfig", stub.url)))
    monkeypatch.delenv("KT_INSTALL_NAMESPACE", raising=False)
    yield stub
    stub.server.shutdown()


def test_all_cluster_checks_pass(api: StubApiServer) -> None:
    cfg = _config("kubetorch")
    assert check_kubeconfig(cfg).detail == "API server reachable (Kubernetes v1.31.2)"
    kt = check_kubetorch(cfg)
    assert kt.status == "ok" and "version 0.5.1" in kt.detail
    karp = check_karpenter(cfg)
    assert karp.status == "ok" and karp.detail == "Karpenter v1 CRDs installed (NodePool, EC2NodeClass)"


def test_controller_version_mismatch_says_how_to_fix(api: StubApiServer) -> None:
    api.controller_version = "0.4.2"
    result = check_kubetorch(_config("kubetorch"))
    assert result.status == "failed" and result.detail == "controller 0.4.2 does not match the client 0.5.1"
    assert "--version 0.5.1" in result.fix


def test_controller_missing(api: StubApiServer) -> None:
    api.controller_version = None
    result = check_kubetorch(_config("kubetorch"))
    assert result.status == "failed" and result.detail == "no kubetorch-controller service in namespace kubetorch"
    assert "helm upgrade --install kubetorch" in result.fix


def test_missing_crd(api: StubApiServer) -> None:
    del api.crds["ec2nodeclasses.karpenter.k8s.aws"]
    result = check_karpenter(_config("kubetorch"))
    assert result.status == "failed" and result.detail == "Karpenter v1 CRDs missing: EC2NodeClass"
    assert check_karpenter(_config("kubetorch", karpenter={"manage_nodepools": False})).status == "skipped"


def test_unreachable_api_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("KUBECONFIG", str(_kubeconfig(tmp_path / "kc", f"http://127.0.0.1:{port}")))
    result = check_kubeconfig(_config("kubetorch"))
    assert result.status == "failed" and result.detail.startswith("the API server is not reachable")
    assert "kubectl version" in result.fix


def test_no_kubeconfig(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "absent"))
    if Path("/var/run/secrets/kubernetes.io/serviceaccount/token").exists():
        pytest.skip("running inside a cluster")
    cfg = _config("kubetorch")
    result = check_kubeconfig(cfg)
    assert result.status == "failed" and "no kubeconfig at" in result.detail and "KUBECONFIG" in result.fix
    downstream = check_karpenter(cfg)
    assert downstream.status == "failed" and "fix the kubeconfig check first" in downstream.fix


def test_local_backend_skips_cluster_checks_with_reason() -> None:
    cfg = _config("local")
    for check in (check_kubeconfig, check_kubetorch, check_karpenter):
        result = check(cfg)
        assert result.status == "skipped" and result.detail == "compute.backend is local: no cluster is used"
    gpu = check_gpu(cfg)
    assert gpu.status in ("ok", "skipped") and "GPU" in gpu.detail
    assert check_gpu(_config("kubetorch")).status == "skipped"


def test_validate_command_lists_compute_checks() -> None:
    from gpu_ops.cli import main

    result = CliRunner().invoke(main, ["validate"])
    for name in ("kubeconfig", "kubetorch", "karpenter", "gpu"):
        assert f" {name}: " in result.output
