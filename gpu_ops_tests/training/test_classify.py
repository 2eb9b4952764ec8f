"""Failure classification from real kubernetes.client objects, real Kubetorch and httpx
exceptions, and the local backend's reports."""

from __future__ import annotations

import datetime as dt

import httpx
import pytest
from kubernetes import client as k8s

from gpu_ops.domain.compute.backend import RankReport, WorkerExit, WorkerReport
from gpu_ops.domain.training.classify import DISRUPTION_REASONS, Outcome, classify_exception, classify_pod, classify_report

NOW = dt.datetime(2026, 11, 20, 12, 0, tzinfo=dt.timezone.utc)


def pod(
    *,
    conditions: list[k8s.V1PodCondition] | None = None,
    reason: str | None = None,
    message: str | None = None,
    terminated: k8s.V1ContainerStateTerminated | None = None,
    last_terminated: k8s.V1ContainerStateTerminated | None = None,
    node: str = "ip-10-0-1-7.ec2.internal",
    phase: str = "Failed",
) -> k8s.V1Pod:
    status = k8s.V1ContainerStatus(
        name="kubetorch",
        image="ghcr.io/run-house/kubetorch:0.5.1",
        image_id="",
        ready=False,
        restart_count=0,
        state=k8s.V1ContainerState(terminated=terminated) if terminated else k8s.V1ContainerState(running=k8s.V1ContainerStateRunning(started_at=NOW)),
        last_state=k8s.V1ContainerState(terminated=last_terminated) if last_terminated else None,
    )
    return k8s.V1Pod(
        api_version="v1",
        kind="Pod",
        metadata=k8s.V1ObjectMeta(name="train-demo-model-1a2b3c4d-0-abcde", namespace="ml", labels={"gpu-ops.io/team": "nlp"}),
        spec=k8s.V1PodSpec(containers=[k8s.V1Container(name="kubetorch")], node_name=node, node_selector={"karpenter.sh/capacity-type": "spot"}),
        status=k8s.V1PodStatus(phase=phase, reason=reason, message=message, conditions=conditions or [], container_statuses=[status]),
    )


def disruption(reason: str, message: str = "") -> k8s.V1PodCondition:
    return k8s.V1PodCondition(type="DisruptionTarget", status="True", reason=reason, message=message, last_transition_time=NOW)


def node(*, spot: bool = True, taints: list[k8s.V1Taint] | None = None, ready: str = "True") -> k8s.V1Node:
    return k8s.V1Node(
        metadata=k8s.V1ObjectMeta(
            name="ip-10-0-1-7.ec2.internal",
            labels={"karpenter.sh/capacity-type": "spot" if spot else "on-demand", "karpenter.k8s.aws/instance-gpu-name": "a100"},
        ),
        spec=k8s.V1NodeSpec(taints=taints or []),
        status=k8s.V1NodeStatus(conditions=[k8s.V1NodeCondition(type="Ready", status=ready, reason="KubeletReady" if ready == "True" else "NodeStatusUnknown")]),
    )


def event(reason: str, message: str, kind: str = "Node") -> k8s.CoreV1Event:
    return k8s.CoreV1Event(
        metadata=k8s.V1ObjectMeta(name=f"x.{reason.lower()}", namespace="default"),
        involved_object=k8s.V1ObjectReference(kind=kind, name="ip-10-0-1-7.ec2.internal"),
        reason=reason,
        message=message,
        type="Warning",
        first_timestamp=NOW,
        last_timestamp=NOW,
    )


def failed_report(**kw) -> WorkerReport:
    return WorkerReport(exit=WorkerExit.LOST, error_message="connection lost", **kw)


@pytest.mark.parametrize("reason", sorted(DISRUPTION_REASONS))
def test_every_disruption_target_reason_is_a_preemption(reason: str) -> None:
    c = classify_report(failed_report(pod=pod(conditions=[disruption(reason, "Eviction API: evicting")]), node=node()))
    assert c.outcome is Outcome.PREEMPTED
    assert reason in c.evidence[0]
    assert c.spot is True  # the node's karpenter.sh/capacity-type label


def test_kubelet_memory_pressure_eviction_is_oom() -> None:
    msg = "The node was low on resource: memory. Threshold quantity: 100Mi, available: 3404Ki. Container kubetorch was using 30Gi, request is 16Gi."
    c = classify_pod(pod(conditions=[disruption("TerminationByKubelet", msg)], reason="Evicted", message=msg))
    assert c is not None and c.outcome is Outcome.OOM


def test_oomkilled_exit_137_wins_over_everything() -> None:
    term = k8s.V1ContainerStateTerminated(exit_code=137, reason="OOMKilled", finished_at=NOW)
    c = classify_pod(pod(terminated=term, conditions=[disruption("EvictionByEvictionAPI")]), node(taints=[k8s.V1Taint(key="karpenter.sh/disrupted", effect="NoSchedule")]))
    assert c is not None and c.outcome is Outcome.OOM
    assert "exitCode=137" in c.evidence


def test_oomkilled_in_last_state_after_a_restart() -> None:
    last = k8s.V1ContainerStateTerminated(exit_code=137, reason="OOMKilled", finished_at=NOW)
    c = classify_pod(pod(last_terminated=last, phase="Running"))
    assert c is not None and c.outcome is Outcome.OOM


@pytest.mark.parametrize(
    ("reason", "message"),
    [("Evicted", "The node had condition: [DiskPressure]."), ("Terminated", "Pod was terminated in response to imminent node shutdown.")],
)
def test_status_reason_evicted_or_terminated(reason: str, message: str) -> None:
    c = classify_pod(pod(reason=reason, message=message))
    assert c is not None and c.outcome is Outcome.PREEMPTED
    assert f"status.reason={reason}" in c.evidence


def test_status_evicted_for_memory_is_oom() -> None:
    c = classify_pod(pod(reason="Evicted", message="The node was low on resource: memory."))
    assert c is not None and c.outcome is Outcome.OOM


def test_karpenter_disrupted_taint() -> None:
    taint = k8s.V1Taint(key="karpenter.sh/disrupted", effect="NoSchedule")
    c = classify_pod(pod(phase="Running"), node(taints=[taint]))
    assert c is not None and c.outcome is Outcome.PREEMPTED and c.spot is True
    assert "karpenter.sh/disrupted" in c.evidence[0]


def test_spot_interrupted_event() -> None:
    ev = event("SpotInterrupted", "Spot interruption warning was triggered")
    c = classify_pod(pod(phase="Running"), node(spot=False), [event("Scheduled", "ok", "Pod"), ev])
    assert c is not None and c.outcome is Outcome.PREEMPTED
    assert c.spot is True  # the event itself says spot, whatever the label


def test_scheduler_preempted_event_and_oom_killing_event() -> None:
    c = classify_pod(pod(phase="Running"), None, [event("Preempted", "Preempted by pod 1234 on node x", "Pod")])
    assert c is not None and c.outcome is Outcome.PREEMPTED
    c = classify_pod(pod(phase="Running"), None, [event("OOMKilling", "Memory cgroup out of memory: Killed process 4242 (python)")])
    assert c is not None and c.outcome is Outcome.OOM


@pytest.mark.parametrize(("code", "outcome"), [(143, Outcome.PREEMPTED), (137, Outcome.PREEMPTED)])
def test_exit_codes_143_and_137(code: int, outcome: Outcome) -> None:
    term = k8s.V1ContainerStateTerminated(exit_code=code, reason="Error", finished_at=NOW)
    c = classify_pod(pod(terminated=term))
    assert c is not None and c.outcome is outcome


def test_node_not_ready_spot_is_preemption_on_demand_is_infrastructure() -> None:
    c = classify_pod(pod(phase="Running"), node(spot=True, ready="Unknown"))
    assert c is not None and c.outcome is Outcome.PREEMPTED
    c = classify_pod(k8s.V1Pod(metadata=k8s.V1ObjectMeta(name="p"), spec=k8s.V1PodSpec(containers=[])), node(spot=False, ready="Unknown"))
    assert c is not None and c.outcome is Outcome.INFRASTRUCTURE


def test_a_healthy_pod_says_nothing() -> None:
    assert classify_pod(pod(phase="Running"), node()) is None


# --------------------------------------------------------------------------- Kubetorch


def test_pod_terminated_error_with_sigterm_is_preemption_despite_evicted_false() -> None:
    from kubetorch import PodTerminatedError

    exc = PodTerminatedError(
        pod_name="train-0",
        reason="SIGTERM",
        events=[{"timestamp": NOW.isoformat(), "reason": "Terminating", "message": "Pod received SIGTERM signal and is shutting down gracefully"}],
    )
    assert exc.evicted is False  # Kubetorch's own flag is useless here
    c = classify_report(WorkerReport(exit=WorkerExit.ERROR, exception=exc))
    assert c.outcome is Outcome.PREEMPTED
    assert "PodTerminatedError reason=SIGTERM" in c.evidence


def test_pod_evidence_beats_the_kubetorch_exception() -> None:
    from kubetorch import PodTerminatedError

    term = k8s.V1ContainerStateTerminated(exit_code=137, reason="OOMKilled", finished_at=NOW)
    c = classify_report(WorkerReport(exit=WorkerExit.ERROR, exception=PodTerminatedError(reason="SIGTERM"), pod=pod(terminated=term)))
    assert c.outcome is Outcome.OOM


def test_pod_terminated_error_with_oomkilled_event() -> None:
    from kubetorch import PodTerminatedError

    exc = PodTerminatedError(pod_name="p", reason="Unknown", events=[{"timestamp": NOW, "reason": "OOMKilled", "message": "container killed"}])
    assert classify_exception(exc).outcome is Outcome.OOM


def test_worker_membership_changed() -> None:
    from kubetorch import WorkerMembershipChanged

    removed = WorkerMembershipChanged(removed_ips={"10.0.1.7"}, previous_ips={"10.0.1.7", "10.0.1.8"}, current_ips={"10.0.1.8"})
    assert classify_exception(removed).outcome is Outcome.PREEMPTED
    added = WorkerMembershipChanged(added_ips={"10.0.1.9"})
    assert classify_exception(added).outcome is Outcome.INFRASTRUCTURE


def test_remote_exception_wrapper_keeps_the_original_name() -> None:
    # Kubetorch re-raises remote errors as a subclass named RemoteException.
    class RemoteException(MemoryError):
        pass

    exc = RemoteException("CUDA out of memory. Tried to allocate 2.00 GiB")
    exc.remote_traceback = "Traceback ...\ntorch.OutOfMemoryError: CUDA out of memory"
    assert classify_exception(exc).outcome is Outcome.OOM


@pytest.mark.parametrize(
    "exc",
    [
        httpx.RemoteProtocolError("Server disconnected without sending a response."),
        httpx.ConnectError("[Errno 111] Connection refused"),
        httpx.ReadError("connection reset by peer"),
    ],
)
def test_raw_httpx_errors_when_the_pod_vanished(exc: Exception) -> None:
    c = classify_report(WorkerReport(exit=WorkerExit.LOST, exception=exc))
    assert c.outcome is Outcome.INFRASTRUCTURE
    assert "vanished" in c.reason


def test_wrapped_httpx_error_found_in_the_chain() -> None:
    try:
        try:
            raise httpx.RemoteProtocolError("Server disconnected")
        except httpx.RemoteProtocolError as inner:
            raise RuntimeError("call failed") from inner
    except RuntimeError as outer:
        c = classify_exception(outer)
    assert c.outcome is Outcome.INFRASTRUCTURE


def test_httpx_errors_with_a_spot_node_stay_infrastructure_unless_the_pod_says_so() -> None:
    c = classify_report(WorkerReport(exit=WorkerExit.LOST, exception=httpx.ReadError("reset"), node=node(spot=True, taints=[k8s.V1Taint(key="karpenter.sh/disrupted", effect="NoSchedule")])))
    assert c.outcome is Outcome.PREEMPTED  # the node's taint explains the vanished pod


def test_kubetorch_setup_errors() -> None:
    from kubetorch.resources.compute.utils import ImagePullError, ResourceNotAvailableError

    assert classify_exception(ImagePullError("ErrImagePull: repo does not exist")).outcome is Outcome.USER_ERROR
    assert classify_exception(ResourceNotAvailableError("no nodes")).outcome is Outcome.INFRASTRUCTURE


def test_user_exception_keeps_its_traceback() -> None:
    try:
        raise ValueError("loss is NaN")
    except ValueError as exc:
        c = classify_exception(exc, traceback="Traceback (most recent call last):\n  File train.py\nValueError: loss is NaN")
    assert c.outcome is Outcome.USER_ERROR and "loss is NaN" in (c.traceback or "")


# --------------------------------------------------------------------------- local reports


@pytest.mark.parametrize(
    ("report", "outcome"),
    [
        (WorkerReport(exit=WorkerExit.COMPLETED, exit_code=0), Outcome.COMPLETED),
        (WorkerReport(exit=WorkerExit.SIGTERM, exit_code=143), Outcome.PREEMPTED),
        (WorkerReport(exit=WorkerExit.SIGKILL, exit_code=-9), Outcome.PREEMPTED),
        (WorkerReport(exit=WorkerExit.OOM, exit_code=1, error_type="MemoryError"), Outcome.OOM),
        (WorkerReport(exit=WorkerExit.LOST, exit_code=3), Outcome.INFRASTRUCTURE),
        (WorkerReport(exit=WorkerExit.ERROR, exit_code=1, error_type="ValueError", error_message="bad lr", traceback="Traceback\nValueError: bad lr"), Outcome.USER_ERROR),
        (WorkerReport(exit=WorkerExit.ERROR, exit_code=1, error_type="gpu_ops.flows.training.context.TrainingPreempted", error_message="SIGTERM"), Outcome.PREEMPTED),
        (WorkerReport(exit=WorkerExit.ERROR, exit_code=1, error_type="torch.OutOfMemoryError", error_message="CUDA out of memory"), Outcome.OOM),
    ],
)
def test_local_reports(report: WorkerReport, outcome: Outcome) -> None:
    assert classify_report(report).outcome is outcome


def test_user_error_carries_the_remote_traceback() -> None:
    c = classify_report(WorkerReport(exit=WorkerExit.ERROR, error_type="ValueError", error_message="bad lr", traceback="Traceback...\nValueError: bad lr"))
    assert c.traceback and c.traceback.endswith("ValueError: bad lr")


def test_distributed_collateral_errors_point_at_the_killed_rank() -> None:
    report = WorkerReport(
        exit=WorkerExit.ERROR,
        error_type="RuntimeError",
        error_message="rank 1: Connection closed by peer",
        ranks=[RankReport(0, WorkerExit.SIGKILL, -9), RankReport(1, WorkerExit.ERROR, 1)],
    )
    c = classify_report(report)
    assert c.outcome is Outcome.PREEMPTED and "rank 0" in c.reason


def test_gpu_ops_preemption_raised_in_a_kubetorch_pod_after_a_spot_notice() -> None:
    # Kubetorch re-creates unknown remote exception types by name.
    remote = type("TrainingPreempted", (Exception,), {})("spot interruption notice; checkpoint #4 at step 800")
    c = classify_report(WorkerReport(exit=WorkerExit.ERROR, exception=remote, pod=pod(phase="Running"), node=node(spot=True)))
    assert c.outcome is Outcome.PREEMPTED and c.spot is True


HOST_OOM = "DefaultCPUAllocator: can't allocate memory: you tried to allocate 17179869184 bytes. Error code 12 (Cannot allocate memory)"


def test_host_out_of_memory_from_torch_is_oom_not_a_user_error() -> None:
    """torch's CPU allocator raises a RuntimeError, not a MemoryError: it is still OOM."""
    from gpu_ops.flows.compute.worker import is_oom

    assert is_oom(RuntimeError(HOST_OOM)) and is_oom(OSError(12, "Cannot allocate memory"))
    assert not is_oom(RuntimeError("shape mismatch"))
    report = WorkerReport(exit=WorkerExit.ERROR, exit_code=1, error_type="RuntimeError", error_message=HOST_OOM, traceback=f"Traceback ...\nRuntimeError: {HOST_OOM}\n")
    assert classify_report(report).outcome is Outcome.OOM
    assert classify_exception(RuntimeError(HOST_OOM)).outcome is Outcome.OOM  # type: ignore[union-attr]
    assert classify_exception(RuntimeError("shape mismatch")).outcome is Outcome.USER_ERROR  # type: ignore[union-attr]
