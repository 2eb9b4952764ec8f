"""Why did a training attempt end? `preempted`, `oom`, `infrastructure` or `user_error`.

Pure functions over evidence; no Dagster, no kubetorch import (exceptions are matched
by class name through their MRO, which also covers Kubetorch's ``RemoteException``
wrappers and its dynamically created exception types).

Order of trust, most reliable first:

1. The Pod itself, read through the ``kubernetes`` client: an ``OOMKilled`` container,
   the ``DisruptionTarget`` condition, ``status.reason`` ``Evicted``/``Terminated``,
   the node's ``karpenter.sh/disrupted`` taint, ``SpotInterrupted`` and similar events,
   exit codes 143 (SIGTERM) and 137 (SIGKILL).
2. The exception Kubetorch raised. ``PodTerminatedError.evicted``/``.oom_killed`` are
   not used: Kubetorch raises it from the pod's SIGTERM handler with reason ``SIGTERM``
   whatever the cause, so only an explicit ``OOMKilled`` in it counts as OOM.
3. How the worker process ended (the local backend's report).
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from gpu_ops.domain.compute.backend import OOM_TEXT, WorkerExit, WorkerReport


class Outcome(str, enum.Enum):
    """How a training attempt ended, as the classifier decided from the worker's report
    (``completed``, ``preempted``, ``oom``, ``infrastructure`` or ``user_error``): what the
    :class:`~gpu_ops.domain.training.policy.PreemptionPolicy` counts and retries."""

    COMPLETED = "completed"
    PREEMPTED = "preempted"
    OOM = "oom"
    INFRASTRUCTURE = "infrastructure"
    USER_ERROR = "user_error"


@dataclass(frozen=True)
class Classification:
    outcome: Outcome
    reason: str  # one sentence for the run log and metadata
    evidence: tuple[str, ...] = ()  # the facts it rests on
    spot: bool | None = None  # True when the evidence says a spot reclaim
    traceback: str | None = None  # the remote traceback, for user errors

    def describe(self) -> str:
        facts = "; ".join(self.evidence)
        return f"{self.outcome.value}: {self.reason}" + (f" [{facts}]" if facts else "")


# DisruptionTarget condition reasons (Kubernetes >= 1.26) and what they mean.
DISRUPTION_REASONS: dict[str, str] = {
    "EvictionByEvictionAPI": "evicted through the Eviction API (node drain, Karpenter disruption or spot interruption)",
    "DeletionByTaintManager": "deleted by the taint manager (a NoExecute taint on a node that is going away)",
    "TerminationByKubelet": "terminated by the kubelet (node-pressure eviction or graceful node shutdown)",
    "PreemptionByScheduler": "preempted by the scheduler for a higher-priority pod",
    "DeletionByPodGC": "deleted by pod GC: its node no longer exists (node lost)",
}

# Events on the pod, its Node or NodeClaim that mean the node is being reclaimed.
# Karpenter's interruption controller emits these when its SQS queue is configured.
_SPOT_EVENTS = {"SpotInterrupted": True, "SpotRebalanceRecommendation": True, "InstanceTerminating": None, "InstanceStopping": None}
_PREEMPTION_EVENTS = {"Preempted", "Evicted", "Disrupting", "DisruptionTerminating", "NodeNotReady"}
DISRUPTED_TAINT = "karpenter.sh/disrupted"
CAPACITY_LABEL = "karpenter.sh/capacity-type"

_OOM_NAMES = {"MemoryError", "OutOfMemoryError", "OOMError"}
_OOM_TEXT = re.compile(r"out of memory|OOMKilled|OOM-killed|oom-kill|CUDA error: out of memory", re.IGNORECASE)
_MEMORY_PRESSURE = re.compile(r"low on resource: memory|memory pressure", re.IGNORECASE)
# Raised by gpu_ops' own worker wrapper after a graceful save on SIGTERM or a spot notice.
PREEMPTED_EXCEPTIONS = {"TrainingPreempted"}
# Kubetorch setup failures: configuration (not retried) versus capacity/timeouts (retried).
_CONFIG_ERRORS = {"ImagePullError", "KubernetesCredentialsError", "VersionMismatchError"}
_INFRA_ERRORS = {"ResourceNotAvailableError", "ServiceTimeoutError", "StartupError", "KnativeServiceError", "AutoScalingError"}
# httpx transport errors: the connection to the pod broke (pod vanished, SIGKILL, node loss).
_TRANSPORT_ERRORS = {
    "ConnectError",
    "ReadError",
    "WriteError",
    "RemoteProtocolError",
    "ReadTimeout",
    "ConnectTimeout",
    "PoolTimeout",
    "NetworkError",
    "TransportError",
    "TimeoutException",
}


def _names(exc: BaseException) -> set[str]:
    return {cls.__name__ for cls in type(exc).__mro__}


def _module_of(exc: BaseException, name: str) -> str:
    for cls in type(exc).__mro__:
        if cls.__name__ == name:
            return cls.__module__
    return ""


def _chain(exc: BaseException | None) -> list[BaseException]:
    out: list[BaseException] = []
    while exc is not None and exc not in out and len(out) < 10:
        out.append(exc)
        exc = exc.__cause__ or exc.__context__
    return out


def _get(obj: Any, *path: str) -> Any:
    for attr in path:
        if obj is None:
            return None
        obj = getattr(obj, attr, None)
    return obj


# --------------------------------------------------------------------------- Kubernetes


def _terminations(pod: Any) -> Iterable[tuple[str, Any]]:
    statuses = list(_get(pod, "status", "container_statuses") or []) + list(_get(pod, "status", "init_container_statuses") or [])
    for cs in statuses:
        for where in ("state", "last_state"):
            term = _get(cs, where, "terminated")
            if term is not None:
                yield cs.name, term


def _node_is_spot(node: Any, pod: Any) -> bool | None:
    labels = _get(node, "metadata", "labels") or {}
    if CAPACITY_LABEL in labels:
        return labels[CAPACITY_LABEL] == "spot"
    selector = _get(pod, "spec", "node_selector") or {}
    if selector.get(CAPACITY_LABEL) in ("spot", "on-demand"):
        return selector[CAPACITY_LABEL] == "spot"
    return None


@dataclass(frozen=True)
class _PodEvidence:
    """What the rules below read: the pod, its node, their events, and two facts derived once."""

    pod: Any
    node: Any
    events: list[Any]
    name: str
    spot: bool | None

    @property
    def node_name(self) -> Any:
        return _get(self.node, "metadata", "name")


def _event_fact(ev: Any, reason: str) -> str:
    return f"event {reason}: {ev.message or ''}".strip()


def _oom_killed_container(e: _PodEvidence) -> Classification | None:
    """An OOM-killed container is the most specific fact there is."""
    for container, term in _terminations(e.pod):
        if term.reason == "OOMKilled":
            return Classification(
                Outcome.OOM,
                f"container {container} of {e.name} was OOM-killed (exit {term.exit_code})",
                (f"containerStatuses[{container}].terminated.reason=OOMKilled", f"exitCode={term.exit_code}"),
                e.spot,
            )
    return None


def _disruption_target(e: _PodEvidence) -> Classification | None:
    """The DisruptionTarget condition says who removed the pod."""
    cond = next((c for c in _get(e.pod, "status", "conditions") or [] if c.type == "DisruptionTarget" and str(c.status) == "True"), None)
    if cond is None:
        return None
    reason = cond.reason or ""
    facts = (f"condition DisruptionTarget reason={reason}",) + ((f"message={cond.message}",) if cond.message else ())
    pressure = _MEMORY_PRESSURE.search(cond.message or "") or _MEMORY_PRESSURE.search(_get(e.pod, "status", "message") or "")
    if reason == "TerminationByKubelet" and pressure:
        return Classification(Outcome.OOM, f"{e.name} was evicted by the kubelet under node memory pressure", facts, e.spot)
    meaning = DISRUPTION_REASONS.get(reason, f"disrupted ({reason or 'no reason given'})")
    spot_now = True if _has_spot_event(e.events) else e.spot
    return Classification(Outcome.PREEMPTED, f"{e.name} was {meaning}", facts, spot_now)


_ENDED_STATUS_REASONS = ("Evicted", "Terminated", "Preempting", "NodeLost", "Shutdown", "NodeShutdown")


def _ended_status(e: _PodEvidence) -> Classification | None:
    """status.reason Evicted (node pressure, API eviction) / Terminated (node shutdown)."""
    status_reason = _get(e.pod, "status", "reason")
    if status_reason not in _ENDED_STATUS_REASONS:
        return None
    status_message = _get(e.pod, "status", "message") or ""
    facts = (f"status.reason={status_reason}",) + ((f"status.message={status_message}",) if status_message else ())
    if status_reason == "Evicted" and _MEMORY_PRESSURE.search(status_message):
        return Classification(Outcome.OOM, f"{e.name} was evicted under node memory pressure", facts, e.spot)
    return Classification(Outcome.PREEMPTED, f"{e.name} ended with status {status_reason}", facts, e.spot)


def _disrupted_taint(e: _PodEvidence) -> Classification | None:
    """The node is being reclaimed: Karpenter's taint."""
    taint = next((t for t in _get(e.node, "spec", "taints") or [] if t.key == DISRUPTED_TAINT), None)
    if taint is None:
        return None
    return Classification(
        Outcome.PREEMPTED,
        f"node {e.node_name} is being disrupted by Karpenter",
        (f"node taint {taint.key}={taint.value or ''}:{taint.effect}",),
        e.spot,
    )


def _first_event(events: Sequence[Any], matches: Callable[[str, str], bool]) -> tuple[Any, str] | None:
    """The first event whose reason (and message) ``matches``, with its reason."""
    for ev in events:
        reason = ev.reason or ""
        if matches(reason, ev.message or ""):
            return ev, reason
    return None


def _spot_interruption_event(e: _PodEvidence) -> Classification | None:
    """Interruption events on the pod, its Node or NodeClaim."""
    found = _first_event(e.events, lambda reason, _msg: reason in _SPOT_EVENTS)
    if found is None:
        return None
    ev, reason = found
    is_spot = _SPOT_EVENTS[reason] if _SPOT_EVENTS[reason] is not None else e.spot
    obj = _get(ev, "involved_object", "kind") or "object"
    return Classification(Outcome.PREEMPTED, f"{obj} event {reason}: the instance is being reclaimed", (_event_fact(ev, reason),), is_spot)


def _is_oom_event(reason: str, message: str) -> bool:
    return reason in ("OOMKilling", "OOMKilled") or (reason == "Evicted" and bool(_MEMORY_PRESSURE.search(message)))


def _oom_event(e: _PodEvidence) -> Classification | None:
    found = _first_event(e.events, _is_oom_event)
    if found is None:
        return None
    ev, reason = found
    return Classification(Outcome.OOM, f"event {reason}: the worker ran out of memory", (_event_fact(ev, reason),), e.spot)


def _preemption_event(e: _PodEvidence) -> Classification | None:
    found = _first_event(e.events, lambda reason, _msg: reason in _PREEMPTION_EVENTS)
    if found is None:
        return None
    ev, reason = found
    return Classification(Outcome.PREEMPTED, f"event {reason} on {e.name}", (_event_fact(ev, reason),), e.spot)


# Exit codes: 143 = SIGTERM (graceful termination), 137 = SIGKILL (grace expired or node gone).
_SIGNAL_EXITS = {143: "was terminated by SIGTERM (exit 143)", 137: "was killed by SIGKILL without an OOM (exit 137)"}


def _signal_exit(e: _PodEvidence) -> Classification | None:
    for container, term in _terminations(e.pod):
        if term.exit_code in _SIGNAL_EXITS:
            what = _SIGNAL_EXITS[term.exit_code]
            return Classification(Outcome.PREEMPTED, f"container {container} {what}", (f"exitCode={term.exit_code} reason={term.reason}",), e.spot)
    return None


def _node_not_ready(e: _PodEvidence) -> Classification | None:
    """The node went away or stopped reporting."""
    cond = next((c for c in _get(e.node, "status", "conditions") or [] if c.type == "Ready" and str(c.status) != "True"), None)
    if cond is None:
        return None
    return Classification(
        Outcome.PREEMPTED if e.spot else Outcome.INFRASTRUCTURE,
        f"node {e.node_name} is not ready ({cond.reason or cond.status})",
        (f"node condition Ready={cond.status} reason={cond.reason}",),
        e.spot,
    )


# The pod's evidence rules, most reliable first: the first that speaks decides.
_POD_RULES = (
    _oom_killed_container,
    _disruption_target,
    _ended_status,
    _disrupted_taint,
    _spot_interruption_event,
    _oom_event,
    _preemption_event,
    _signal_exit,
    _node_not_ready,
)


def classify_pod(pod: Any = None, node: Any = None, events: Sequence[Any] = ()) -> Classification | None:
    """Classify from a ``V1Pod``, its ``V1Node`` and ``CoreV1Event`` list; None if they say nothing."""
    evidence = _PodEvidence(pod, node, list(events or []), _get(pod, "metadata", "name") or "the pod", _node_is_spot(node, pod))
    for rule in _POD_RULES:
        found = rule(evidence)
        if found is not None:
            return found
    return None


def _has_spot_event(events: Sequence[Any]) -> bool:
    return any((ev.reason or "") == "SpotInterrupted" for ev in events)


# --------------------------------------------------------------------------- exceptions


def _pod_terminated(e: BaseException) -> Classification:
    reason = str(getattr(e, "reason", "") or "")
    evs = getattr(e, "events", None) or []
    ev_reasons = [str(ev.get("reason", "")) for ev in evs if isinstance(ev, dict)]
    facts = (f"PodTerminatedError reason={reason}",) + tuple(f"event {r}" for r in ev_reasons)
    if reason == "OOMKilled" or any("OOMKilled" in r for r in ev_reasons):
        return Classification(Outcome.OOM, f"pod {getattr(e, 'pod_name', '?')} was OOM-killed", facts)
    # Raised from the pod's SIGTERM handler whatever the cause: a termination.
    return Classification(Outcome.PREEMPTED, f"pod {getattr(e, 'pod_name', '?')} was terminated ({reason or 'unknown reason'})", facts)


def _membership_changed(e: BaseException) -> Classification:
    removed = getattr(e, "removed_ips", None) or set()
    if removed:
        return Classification(Outcome.PREEMPTED, f"{len(removed)} worker pod(s) disappeared during the run", (f"removed {sorted(removed)}",))
    return Classification(Outcome.INFRASTRUCTURE, "the set of worker pods changed during the run", (str(e),))


def _kubetorch_setup(e: BaseException, names: set[str], tb: str | None) -> Classification | None:
    if names & _CONFIG_ERRORS:
        kind = sorted(names & _CONFIG_ERRORS)[0]
        return Classification(Outcome.USER_ERROR, f"the launch is misconfigured ({kind}): {e}", (kind,), traceback=tb)
    if names & _INFRA_ERRORS:
        kind = sorted(names & _INFRA_ERRORS)[0]
        return Classification(Outcome.INFRASTRUCTURE, f"the workers could not be started ({kind}): {e}", (kind,))
    return None


def _one_exception(e: BaseException, tb: str | None) -> Classification | None:
    """What one exception of the chain says by its class; None: nothing."""
    names = _names(e)
    if names & PREEMPTED_EXCEPTIONS:
        return Classification(Outcome.PREEMPTED, f"the worker saved a checkpoint and stopped: {e}", (type(e).__name__,))
    if "PodTerminatedError" in names:
        return _pod_terminated(e)
    if "WorkerMembershipChanged" in names:
        return _membership_changed(e)
    setup = _kubetorch_setup(e, names, tb)
    if setup is not None:
        return setup
    if names & _TRANSPORT_ERRORS and _module_of(e, type(e).__name__).startswith(("httpx", "httpcore")):
        return Classification(
            Outcome.INFRASTRUCTURE,
            f"the connection to the worker pod broke ({type(e).__name__}); the pod vanished or its node was lost",
            (f"{type(e).__module__}.{type(e).__name__}: {e}",),
        )
    if names & _OOM_NAMES:
        return Classification(Outcome.OOM, f"the worker ran out of memory ({type(e).__name__})", (f"{type(e).__name__}: {str(e)[:200]}",))
    return None


def classify_exception(exc: BaseException | None, traceback: str | None = None) -> Classification | None:
    """Classify the exception a backend raised or re-raised; None if there is none."""
    if exc is None:
        return None
    chain = _chain(exc)
    tb = traceback or getattr(exc, "remote_traceback", None)
    for e in chain:
        found = _one_exception(e, tb)
        if found is not None:
            return found
    head = chain[0]
    last_line = tb.strip().splitlines()[-1] if tb and tb.strip() else ""
    if OOM_TEXT.search(str(head)) or "OutOfMemoryError" in last_line:
        return Classification(Outcome.OOM, "the worker ran out of memory", (str(head)[:200],))
    return Classification(Outcome.USER_ERROR, f"the training function raised {type(head).__name__}: {str(head)[:300]}", (type(head).__name__,), traceback=tb)


# --------------------------------------------------------------------------- worker reports

# Which rank's ending explains a distributed failure best: a killed or OOM rank is the
# cause, the others' connection errors are collateral.
_RANK_PRIORITY = {WorkerExit.OOM: 0, WorkerExit.SIGKILL: 1, WorkerExit.SIGTERM: 2, WorkerExit.LOST: 3, WorkerExit.ERROR: 4, WorkerExit.COMPLETED: 5}


def _from_exit(exit: WorkerExit, code: int | None, report: WorkerReport, where: str = "the worker") -> Classification:
    facts = (f"exit={exit.value}",) + ((f"exit_code={code}",) if code is not None else ())
    if exit is WorkerExit.OOM:
        return Classification(Outcome.OOM, f"{where} ran out of memory", facts)
    if exit is WorkerExit.SIGTERM:
        # gpu_ops' own wrapper says why it stopped (SIGTERM or a spot notice) and where it saved.
        detail = f": {report.error_message}" if report.error_message and report.error_message != "received SIGTERM" else ""
        return Classification(Outcome.PREEMPTED, f"{where} stopped on SIGTERM or a spot notice{detail}", facts)
    if exit is WorkerExit.SIGKILL:
        return Classification(Outcome.PREEMPTED, f"{where} was killed by SIGKILL without an OOM (node lost or spot reclaimed without notice)", facts)
    if exit is WorkerExit.LOST:
        return Classification(Outcome.INFRASTRUCTURE, f"{where} was lost or could not be reached", facts + ((report.error_message,) if report.error_message else ()))
    # ERROR: the function raised; the exception name and text decide.
    name = (report.error_type or "").rsplit(".", 1)[-1]
    text = f"{report.error_message or ''}\n{(report.traceback or '').strip().splitlines()[-1] if report.traceback and report.traceback.strip() else ''}"
    if name in PREEMPTED_EXCEPTIONS:
        return Classification(Outcome.PREEMPTED, f"{where} saved a checkpoint and stopped: {report.error_message or 'preemption notice'}", facts + (name,))
    if name in _OOM_NAMES or OOM_TEXT.search(text):
        return Classification(Outcome.OOM, f"{where} ran out of memory ({report.error_type})", facts + (f"{report.error_type}: {(report.error_message or '')[:200]}",))
    if code == 143:
        return Classification(Outcome.PREEMPTED, f"{where} exited 143 (SIGTERM)", facts)
    if code == 137:
        return Classification(Outcome.PREEMPTED, f"{where} exited 137 (SIGKILL) without OOM evidence", facts)
    return Classification(
        Outcome.USER_ERROR,
        f"the training function raised {report.error_type or 'an error'}: {(report.error_message or '')[:300]}",
        facts,
        traceback=report.traceback,
    )


def classify_report(report: WorkerReport) -> Classification:
    """The classification of one attempt, from everything the backend attached."""
    if report.ok:
        return Classification(Outcome.COMPLETED, "the training function returned", ())
    spot = _node_is_spot(report.node, report.pod)
    if report.pod is not None or report.node is not None or report.events:
        found = classify_pod(report.pod, report.node, report.events)
        if found is not None:
            return found
    if report.exception is not None:
        found = classify_exception(report.exception, report.traceback)
        if found is not None:
            return _with_spot(found, spot)
    exit, code, where = report.exit, report.exit_code, "the worker"
    if len(report.ranks) > 1:  # name the rank the backend picked as the root cause
        cause = next((r for r in report.ranks if r.exit is exit and r.exit_code == code), None)
        where = f"rank {cause.rank}" if cause is not None else where
    if report.ranks and exit in (WorkerExit.ERROR, WorkerExit.LOST):
        worst = min(report.ranks, key=lambda r: _RANK_PRIORITY[r.exit])
        if _RANK_PRIORITY[worst.exit] < _RANK_PRIORITY[exit]:
            exit, code, where = worst.exit, worst.exit_code, f"rank {worst.rank}"
    return _with_spot(_from_exit(exit, code, report, where), spot)


def _with_spot(c: Classification, spot: bool | None) -> Classification:
    if c.spot is None and spot is not None:
        return Classification(c.outcome, c.reason, c.evidence, spot, c.traceback)
    return c


__all__ = [
    "Classification",
    "DISRUPTION_REASONS",
    "Outcome",
    "classify_exception",
    "classify_pod",
    "classify_report",
]
