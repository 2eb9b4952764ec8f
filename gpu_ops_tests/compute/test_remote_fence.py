"""The fence of a remote (Kubetorch) launch: a launcher that cannot renew its GPU lease
has its pod's workers stopped before the lease can be handed on.

No Kubernetes API server exists here, so the pod is a real subprocess running the pod
side for real (:func:`gpu_ops.domain.compute.fence.pod_call`: its own fence file, the watchdog,
the target), and the launcher is a real process holding a real lease (``LeaseBook`` +
``Heartbeat`` writing its fence file) whose :class:`~gpu_ops.flows.compute.kubetorch_backend.FencedCall`
makes the launch call and relays every renewal to the pod, as the Kubetorch backend does.
Only the transport is the test's: Kubetorch's HTTP call of the service becomes a line on
the pod's stdin, handled in a new thread of the pod (Kubetorch runs concurrent calls of a
service in threads of one worker process). The launcher is then SIGSTOPped past the TTL
(real signal, real time) while a contender asks for the same GPUs: when it is granted, the
pod's last tick must be older than the grant and the pod gone. The launcher side's
``kt.Compute`` manifest is checked as the other Kubetorch tests do.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from gpu_ops.domain.compute import fence
from gpu_ops.flows.compute.kubetorch_backend import POD_FENCE_DIR, FencedCall, KubetorchBackend, build_compute
from gpu_ops.storage.quota import LeaseBook
from gpu_ops.domain.compute.request import Attribution, GpuRequest
from gpu_ops.dagster.compute.resource import KubetorchGpuCompute
from gpu_ops.storage.tables import TableStore
from gpu_ops_tests.compute.test_fencing import contend, last_tick
from gpu_ops_tests.waiting import pinned, wait_until

REPO = Path(__file__).resolve().parents[2]
TTL = 4.0

# The pod: runs the launch payload (argv) through pod_call, and each stdin line (a
# renewal) through pod_call in a thread of its own, as Kubetorch's worker does.
POD = textwrap.dedent(
    """
    import json, sys, threading
    from gpu_ops.domain.compute import fence

    def renewals():
        for line in sys.stdin:
            threading.Thread(target=lambda d=json.loads(line): print("renewed", fence.pod_call(d), flush=True), daemon=True).start()

    threading.Thread(target=renewals, daemon=True).start()
    print("returned", fence.pod_call(json.loads(sys.argv[1])), flush=True)
    """
)

# The launcher: a lease under the quota, its heartbeat writing the launcher's fence file,
# and the Kubetorch backend's fenced call; `remote(payload)` is the service call.
LAUNCHER = textwrap.dedent(
    """
    import json, os, subprocess, sys
    from pathlib import Path
    from gpu_ops.domain.compute import fence
    from gpu_ops.flows.compute.kubetorch_backend import FencedCall, KubetorchBackend
    from gpu_ops.storage.quota import Heartbeat, LeaseBook, Quotas
    from gpu_ops.domain.compute.request import GpuRequest
    from gpu_ops.dagster.compute.resource import KubetorchGpuCompute
    from gpu_ops.storage.tables import TableStore
    from gpu_ops_tests.compute import worker_fns

    url, folder, ttl, target, pod_code = sys.argv[1], Path(sys.argv[2]), float(sys.argv[3]), sys.argv[4], sys.argv[5]
    book = LeaseBook(TableStore(url), ttl_s=ttl)
    adm = book.try_acquire(Quotas(team={"nlp": 4}), team="nlp", pools=[], gpus=4, run_id="first", asset_key="a")
    assert adm.granted, adm.reason
    launcher_fence = str(folder / "launcher-fence.json")
    hb = Heartbeat(book, adm.lease, ttl / 6, on_error=lambda m: print("heartbeat:", m, flush=True), fence_path=launcher_fence)
    hb.start()
    env = {fence.FENCE_ENV: launcher_fence, fence.GRACE_ENV: str(ttl * fence.GRACE_FRACTION)}
    backend = KubetorchBackend(GpuRequest(gpu_type="t4"), name="train-first-0", labels={}, target=KubetorchGpuCompute())
    call = FencedCall.of(backend, getattr(worker_fns, target), env, print)
    pod_env = {**os.environ, **call.pod_env, fence.FENCE_ENV: str(folder / "pod-fence.json")}  # the pod's own disk
    pod = None

    def remote(payload):
        global pod
        if "renew" in payload:
            pod.stdin.write(json.dumps(payload) + "\\n")
            pod.stdin.flush()
            return None
        pod = subprocess.Popen([sys.executable, "-c", pod_code, json.dumps(payload)], stdin=subprocess.PIPE, text=True, env=pod_env)
        print("pid-of-pod", pod.pid, flush=True)
        return pod.wait()

    args = (str(folder / "ticks"),) + ((str(folder / "checkpoint"),) if target == "fenced_loop" else ())
    print("ended", call.call(remote, args, {}), flush=True)
    """
)


def start_launcher(url: str, folder: Path, target: str) -> tuple[subprocess.Popen, int]:
    proc = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER, url, str(folder), str(TTL), target, POD], stdout=subprocess.PIPE, text=True, cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("pid-of-pod "):
            return proc, int(line.split()[1])
    raise AssertionError(f"the launcher ended before its pod started (exit {proc.wait()})")


@pytest.mark.slow
@pytest.mark.parametrize("target", ["fenced_loop", "tick"])
def test_a_pod_whose_launcher_stops_renewing_stops_before_the_lease_is_handed_on(tmp_path: Path, target: str) -> None:
    """``fenced_loop`` looks at its fence and stops itself ("checkpoint", then return);
    ``tick`` never looks and ignores SIGTERM: the pod's watchdog kills it."""
    url = f"sqlite:///{tmp_path / 'leases.db'}"
    launcher, pod = start_launcher(url, tmp_path, target)
    alive = pinned(pod)  # this pod's process, not a later one given its pid
    book = LeaseBook(TableStore(url), ttl_s=TTL)
    ticks = tmp_path / "ticks"
    try:
        assert wait_until(lambda: ticks.exists() and last_tick(ticks) > 0, 30)
        # Renewals reach the pod: it trains on well past the validity of the launch's fence.
        time.sleep(1.5 * TTL)
        assert alive() and time.time() - last_tick(ticks) < 1.0
        assert not (tmp_path / "checkpoint").exists()
        pod_fence = fence.read(tmp_path / "pod-fence.json")
        assert pod_fence is not None and not pod_fence.revoked and pod_fence.valid_until > time.time()
        (first,) = book.holders()

        os.kill(launcher.pid, signal.SIGSTOP)  # the launcher can renew nothing, send nothing
        stopped_at = time.time()
        granted_at, second = contend(book, 6 * TTL)
        assert not alive()
        assert last_tick(ticks) < granted_at, (last_tick(ticks), granted_at)
        assert last_tick(ticks) - stopped_at < fence.VALID_FRACTION * TTL + fence.GRACE_FRACTION * TTL + 0.5
        assert second.token > first.token
        if target == "fenced_loop":  # it saw the lapse and stopped itself: "checkpoint", then exit
            when, reason = (tmp_path / "checkpoint").read_text().split(" ", 1)
            assert "not renewed" in reason and float(when) < granted_at
    finally:
        os.kill(launcher.pid, signal.SIGCONT)
        launcher.kill()
        launcher.wait(timeout=30)
        if alive():
            os.kill(pod, signal.SIGKILL)


def test_a_remote_fence_travels_as_seconds_left_and_is_dated_on_the_pods_clock() -> None:
    sent = fence.to_remote(fence.Fence("lease-1", 7, valid_until=1000.0 + 2.0), now=1000.0)
    assert sent["valid_for_s"] == pytest.approx(2.0)
    # The pod's clock is an hour behind the launcher's: the fence still lasts 2 s there.
    assert fence.from_remote(sent, now=-2600.0) == fence.Fence("lease-1", 7, -2598.0)


def test_pod_renewals_never_shorten_the_fence_and_a_revocation_wins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "pod-fence.json"
    monkeypatch.setenv(fence.FENCE_ENV, str(path))
    good = {"lease_id": "lease-1", "token": 7, "valid_for_s": 30.0, "revoked": False}
    assert fence.pod_call({"renew": good}) == pytest.approx(30.0, abs=0.5)
    late = dict(good, valid_for_s=5.0)  # an older renewal delivered after a newer one
    assert fence.pod_call({"renew": late}) == pytest.approx(30.0, abs=0.5)
    other = dict(good, token=8, valid_for_s=300.0)  # not this launch's lease
    assert fence.pod_call({"renew": other}) == pytest.approx(30.0, abs=0.5)
    assert fence.pod_call({"renew": dict(good, revoked=True)}) == -1.0
    assert fence.pod_call({"renew": dict(good, valid_for_s=600.0)}) == -1.0  # nothing revives it
    assert fence.read(path) is not None and fence.read(path).revoked  # type: ignore[union-attr]


def test_a_fenced_kubetorch_launch_gives_the_pod_its_own_fence_file() -> None:
    """The launcher's fence path is the launcher's disk: the pod gets a path of its own
    (and the grace) in the real kt.Compute manifest; the deployed function is pod_call."""
    request = GpuRequest(gpu_type="l4", gpus=1, labels=Attribution(team="nlp"))
    target = KubetorchGpuCompute(namespace="ml")
    backend = KubetorchBackend(request, name="train-0f3a9c2e-0", labels={}, target=target)
    env = {fence.FENCE_ENV: "/var/folders/launcher/fence.json", fence.GRACE_ENV: "18.0", "WANDB_MODE": "offline"}
    from gpu_ops.flows.training.worker import run_training

    call = FencedCall.of(backend, run_training, env, print)
    assert call is not None and call.deployed is fence.pod_call and call.target == "gpu_ops.flows.training.worker:run_training"
    container = build_compute(request, labels={}, target=target, env=call.pod_env).manifest["spec"]["template"]["spec"]["containers"][0]
    pod_env = {e["name"]: e.get("value") for e in container["env"]}
    assert pod_env[fence.FENCE_ENV] == f"{POD_FENCE_DIR}/gpu-ops-fence-train-0f3a9c2e-0.json"
    assert pod_env[fence.GRACE_ENV] == "18.0" and pod_env["WANDB_MODE"] == "offline"
    assert "/var/folders/launcher" not in json.dumps(container)
    # Without a lease there is no fence: the function itself is deployed, as before.
    assert FencedCall.of(backend, run_training, {"WANDB_MODE": "offline"}, print) is None


def test_a_fenced_launch_refuses_to_start_without_the_launchers_fence(tmp_path: Path) -> None:
    backend = KubetorchBackend(GpuRequest(gpu_type="t4"), name="x-0", labels={}, target=KubetorchGpuCompute())
    call = FencedCall.of(backend, print, {fence.FENCE_ENV: str(tmp_path / "missing.json")}, print)
    assert call is not None
    calls: list[object] = []
    with pytest.raises(RuntimeError, match="refusing to launch unfenced"):
        call.call(calls.append, (), {})
    assert calls == []  # nothing was sent to the cluster
