"""Checkpoint on notice: the watcher's decision over real kubernetes.client models, and a
notice simulated on the local backend before a real SIGKILL (nothing left to redo)."""

from __future__ import annotations

import datetime as dt
import threading
import time
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpu_ops.flows.compute.local import simulate_preemption
from gpu_ops.flows.training.context import TrainingContext, WorkerSpec
from gpu_ops.flows.training.notices import KubernetesNoticeWatcher, cluster_notice, in_cluster_identity
from gpu_ops_tests.fake_k8s import FakeCoreV1
from gpu_ops_tests.training.test_gpu_asset import counting_asset, ledger_rows, messages, metadata, run, write_config

NODE = "ip-10-0-1-7.ec2.internal"


@pytest.fixture
def config_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("GPU_OPS_PIDFILE_DIR", str(tmp_path / "pids"))
    return write_config(tmp_path)


def node(*taints: tuple[str, str]) -> client.V1Node:
    return client.V1Node(
        metadata=client.V1ObjectMeta(name=NODE, labels={"karpenter.sh/capacity-type": "spot"}),
        spec=client.V1NodeSpec(taints=[client.V1Taint(key=k, effect=e) for k, e in taints] or None),
    )


def pod(deleting: bool = False) -> client.V1Pod:
    ts = dt.datetime(2026, 11, 23, 12, 0, tzinfo=dt.timezone.utc) if deleting else None
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name="train-0", namespace="ml", deletion_timestamp=ts),
        spec=client.V1PodSpec(containers=[client.V1Container(name="worker")], node_name=NODE),
    )


def event(reason: str, name: str = NODE) -> client.CoreV1Event:
    return client.CoreV1Event(
        metadata=client.V1ObjectMeta(name=f"{name}.{reason}", namespace="default"),
        involved_object=client.V1ObjectReference(kind="Node", name=name),
        reason=reason,
        message="Spot interruption warning",
    )


def context(tmp_path: Path) -> TrainingContext:
    return TrainingContext(WorkerSpec("m", "f", "run", "asset", 1, str(tmp_path), checkpoint_interval=3600.0, progress_every_s=1e9))


def test_the_decision_reads_taints_deletion_and_events() -> None:
    assert cluster_notice(node(), pod()) is None
    assert "karpenter.sh/disrupted" in cluster_notice(node(("karpenter.sh/disrupted", "NoSchedule")), pod())
    assert "spot-itn" in cluster_notice(node(("aws-node-termination-handler/spot-itn", "NoSchedule")), pod())
    assert "being deleted" in cluster_notice(node(), pod(deleting=True))
    assert "SpotInterrupted" in cluster_notice(node(), pod(), [event("SpotInterrupted")])
    assert cluster_notice(node(), pod(), [event("SpotInterrupted", name="another-node")]) is None
    assert cluster_notice(node(("node.kubernetes.io/unschedulable", "NoSchedule")), pod(), [event("SpotRebalanceRecommendation")]) is None


def test_a_tainted_node_forces_a_checkpoint_at_once(tmp_path: Path) -> None:
    api = FakeCoreV1(pods=[pod()], nodes=[node()])
    ctx = context(tmp_path)
    watcher = KubernetesNoticeWatcher(ctx, api, "train-0", "ml")
    assert watcher.check() is None and not ctx.should_checkpoint() and not ctx.preempted
    api.nodes = [node(("karpenter.sh/disrupted", "NoSchedule"))]
    assert "karpenter.sh/disrupted" in watcher.check()
    assert watcher.node == NODE  # learnt from the pod's spec.nodeName (a get on its own pod)
    assert ctx.should_checkpoint() and ctx.preempted  # long before the hour-long interval


class NoEventsRbac(FakeCoreV1):
    def list_namespaced_event(self, *args: Any, **kwargs: Any) -> Any:
        raise ApiException(status=403, reason="Forbidden: events is forbidden")


def test_without_list_events_the_watcher_still_sees_taints_and_deletion(tmp_path: Path) -> None:
    api = NoEventsRbac(pods=[pod()], nodes=[node()], events=[event("SpotInterrupted")])
    ctx = context(tmp_path)
    watcher = KubernetesNoticeWatcher(ctx, api, "train-0", "ml", NODE)
    assert watcher.check() is None and watcher.events is False  # switched off, not an error
    api.pods = [pod(deleting=True)]
    assert "being deleted" in watcher.check() and ctx.preempted


def test_the_watcher_thread_polls_until_a_notice(tmp_path: Path) -> None:
    api = FakeCoreV1(pods=[pod()], nodes=[node()])
    ctx = context(tmp_path)
    watcher = KubernetesNoticeWatcher(ctx, api, "train-0", "ml", NODE, every_s=0.02)
    watcher.start()
    time.sleep(0.1)
    assert not ctx.preempted
    api.events = [event("SpotInterrupted")]
    watcher.join(timeout=5)
    assert not watcher.is_alive() and ctx.preempted and "SpotInterrupted" in ctx.preempt_reason


def test_in_cluster_identity(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    assert in_cluster_identity() is None
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.setenv("HOSTNAME", "train-0")
    monkeypatch.setenv("POD_NAMESPACE", "ml")
    monkeypatch.setenv("NODE_NAME", NODE)
    assert in_cluster_identity() == ("train-0", "ml", NODE)


class NoticeThenKill(threading.Thread):
    """Once the run's worker has made progress, a notice and, ``notice_s`` later, SIGKILL."""

    def __init__(self, root: Path, notice_s: float | None):
        super().__init__(daemon=True)
        self.root, self.notice_s = root, notice_s
        self.pid: int | None = None

    def run(self) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            pids = list((self.root / "pids").glob("*.rank0.pid")) if (self.root / "pids").exists() else []
            if pids:
                self.pid = int(pids[0].read_text())
                break
            time.sleep(0.01)
        time.sleep(0.8)  # some steps in: work an hour-long checkpoint interval has not saved
        if self.pid is not None:
            simulate_preemption(self.pid, self.notice_s).join()


@pytest.mark.parametrize("notice_s", [1.0, None], ids=["notice-1s-before", "no-notice"])
def test_a_notice_before_the_kill_leaves_nothing_to_redo(config_path: Path, notice_s: float | None) -> None:
    steps = 150
    asset = counting_asset(config_path, "noticed_kill", {"steps": steps, "step_s": 0.01}, checkpoint_interval=3600)
    killer = NoticeThenKill(config_path.parent, notice_s)
    killer.start()
    instance = dg.DagsterInstance.ephemeral()
    result = run(asset, instance)
    killer.join(timeout=10)
    assert result.success and killer.pid is not None
    md = metadata(result, "noticed_kill")
    assert md["final_loss"] == float(sum(range(steps)))  # every step counted exactly once
    rows = ledger_rows(config_path)
    assert list(rows["outcome"]) == ["preempted", "completed"]
    first = rows.iloc[0]
    if notice_s is not None:
        # The notice forced a checkpoint at once and the worker stopped: attempt 2
        # resumed where attempt 1 stopped, and (almost) nothing was lost.
        assert md["resumed_from_step"] > 0
        assert first["lost_seconds"] < 0.5, first
        assert any("preemption notice (SIGUSR1)" in m for m in messages(instance, result.run_id))
    else:
        assert md.get("resumed_from_step") in (None, 0)  # nothing saved: attempt 2 started over
        assert first["lost_seconds"] > 0.5
