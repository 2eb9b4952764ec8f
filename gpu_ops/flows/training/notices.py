"""Preemption notices: the signs that come *before* the kill, turned into ``ctx.preempted``.

A watcher thread in the worker polls one source and, on a notice, calls
``ctx.notify_preempted(reason)``: the training loop's next ``should_checkpoint()`` is
true at once, it saves, sees ``ctx.preempted`` and returns; the next attempt resumes
from that checkpoint with nothing to redo.

- :class:`KubernetesNoticeWatcher`: its own node's ``karpenter.sh/disrupted`` taint
  (and the AWS node termination handler's ``spot-itn`` taint), its own pod's
  ``deletionTimestamp`` — ``get`` on its node and pod is all the RBAC it needs — and,
  when ``list`` on events is granted, spot interruption events for the node (without it
  that source is switched off after the first 403);
- :class:`SpotNoticeWatcher`: EC2 instance metadata (``spot/instance-action``, IMDSv2)
  on EC2 without Karpenter, or any URL whose 200 answer is a notice;
- the local backend: SIGUSR1 (see ``context.NOTICE_SIGNAL``), sent N seconds before a
  SIGKILL by :func:`gpu_ops.flows.compute.local.simulate_preemption`.

:func:`cluster_notice` is the decision, pure, over real ``kubernetes.client`` models.
"""

from __future__ import annotations

import os
import threading
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gpu_ops.domain.training.classify import DISRUPTED_TAINT

IMDS = "http://169.254.169.254"
NTH_SPOT_TAINT = "aws-node-termination-handler/spot-itn"
# Karpenter's interruption controller records these on the node when EC2 warns.
NOTICE_EVENTS = ("SpotInterrupted", "InstanceTerminating", "InstanceStopping", "TerminatingOnInterruption")
SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def cluster_notice(node: Any, pod: Any, events: Sequence[Any] = ()) -> str | None:
    """Why this worker is about to be stopped (a ``V1Node``, ``V1Pod`` and ``CoreV1Event``s), or None."""
    meta = getattr(pod, "metadata", None)
    if meta is not None and meta.deletion_timestamp is not None:
        return f"pod {meta.name} is being deleted (deletionTimestamp {meta.deletion_timestamp.isoformat()})"
    node_name = getattr(getattr(node, "metadata", None), "name", None)
    for taint in getattr(getattr(node, "spec", None), "taints", None) or []:
        if taint.key == DISRUPTED_TAINT:
            return f"node {node_name} is tainted {DISRUPTED_TAINT} (Karpenter is disrupting it)"
        if taint.key == NTH_SPOT_TAINT:
            return f"node {node_name} is tainted {NTH_SPOT_TAINT} (spot interruption notice)"
    for ev in events:
        involved = ev.involved_object
        if ev.reason in NOTICE_EVENTS and involved is not None and involved.kind == "Node" and involved.name == node_name:
            return f"event {ev.reason} for node {node_name}: {ev.message or ''}".strip()
    return None


class _PollingWatcher(threading.Thread):
    """Polls ``_poll()`` every ``every_s`` seconds (backing off while it fails) and flags
    the context on the first notice."""

    def __init__(self, ctx: Any, every_s: float, name: str):
        super().__init__(name=name, daemon=True)
        self.ctx = ctx
        self.every_s = every_s
        self._stop_event = threading.Event()

    def stop(self) -> None:
        self._stop_event.set()

    def _poll(self) -> str | None:
        raise NotImplementedError

    def _is_transient(self, exc: Exception) -> bool:
        return isinstance(exc, (OSError, urllib.error.URLError))

    def check(self) -> str | None:
        """One poll; flags the context when there is a notice."""
        notice = self._poll()
        if notice is not None:
            self.ctx.notify_preempted(notice)
        return notice

    def run(self) -> None:
        failures = 0
        while not self._stop_event.wait(self.every_s if failures == 0 else min(60.0, self.every_s * 2**failures)):
            try:
                notice = self.check()
                failures = 0
            except Exception as exc:  # noqa: BLE001 - the endpoint is unreachable: back off, keep training
                if not self._is_transient(exc):
                    self.ctx.log(f"preemption notices from {self.name} stopped: {type(exc).__name__}: {exc}")
                    return
                failures += 1
                continue
            if notice is not None:
                return


class SpotNoticeWatcher(_PollingWatcher):
    """``imds``: EC2 instance metadata (IMDSv2 token, then
    ``/latest/meta-data/spot/instance-action``: 404 until AWS schedules the reclaim); any
    other value is a URL whose 200 answer is a notice."""

    def __init__(self, ctx: Any, source: str, every_s: float = 5.0):
        super().__init__(ctx, every_s, "gpu-ops-spot-notice")
        self.source = source

    def _poll(self) -> str | None:
        if self.source == "imds":
            token_req = urllib.request.Request(f"{IMDS}/latest/api/token", method="PUT", headers={"X-aws-ec2-metadata-token-ttl-seconds": "60"})
            with urllib.request.urlopen(token_req, timeout=1) as r:
                token = r.read().decode()
            req = urllib.request.Request(f"{IMDS}/latest/meta-data/spot/instance-action", headers={"X-aws-ec2-metadata-token": token})
        else:
            req = urllib.request.Request(self.source)
        try:
            with urllib.request.urlopen(req, timeout=2) as r:
                body = r.read().decode(errors="replace")[:200] if r.status == 200 else None
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            raise
        return f"spot interruption notice: {body}" if body is not None else None


class KubernetesNoticeWatcher(_PollingWatcher):
    """Reads its own pod and node (``get`` only) and, if allowed, the node's events."""

    def __init__(self, ctx: Any, api: Any, pod: str, namespace: str, node: str | None = None, every_s: float = 5.0, events: bool = True):
        super().__init__(ctx, every_s, "gpu-ops-kubernetes-notice")
        self.api, self.pod, self.namespace, self.node = api, pod, namespace, node
        self.events = events

    def _is_transient(self, exc: Exception) -> bool:
        status = getattr(exc, "status", None)
        if status in (401, 403):
            return False  # no RBAC for it: nothing will change by asking again
        return status is not None or super()._is_transient(exc)

    def _read_events(self) -> list[Any]:
        if not self.events or not self.node:
            return []
        try:
            return self.api.list_namespaced_event("default", field_selector=f"involvedObject.kind=Node,involvedObject.name={self.node}").items
        except Exception as exc:  # noqa: BLE001
            if getattr(exc, "status", None) in (401, 403):
                self.events = False  # `list events` not granted: taints and the pod still work
                return []
            raise

    def _poll(self) -> str | None:
        pod = self.api.read_namespaced_pod(self.pod, self.namespace)
        self.node = self.node or pod.spec.node_name
        node = self.api.read_node(self.node) if self.node else None
        return cluster_notice(node, pod, self._read_events())


def in_cluster_identity() -> tuple[str, str, str | None] | None:
    """(pod, namespace, node) of this process when it runs in a Kubernetes pod, else None.
    The pod name is $POD_NAME or the hostname; the node $NODE_NAME (downward API) or the
    pod's ``spec.nodeName``."""
    if not os.environ.get("KUBERNETES_SERVICE_HOST"):
        return None
    pod = os.environ.get("POD_NAME") or os.environ.get("HOSTNAME")
    namespace = os.environ.get("POD_NAMESPACE")
    if namespace is None and SERVICE_ACCOUNT_NAMESPACE.exists():
        namespace = SERVICE_ACCOUNT_NAMESPACE.read_text().strip()
    if not pod or not namespace:
        return None
    return pod, namespace, os.environ.get("NODE_NAME")


def start_watchers(ctx: Any, spot_notice: str | None, poll_s: float, kubernetes: bool) -> list[_PollingWatcher]:
    """The watchers that apply here, started: IMDS/URL when asked, Kubernetes in a pod."""
    watchers: list[_PollingWatcher] = []
    if spot_notice:
        watchers.append(SpotNoticeWatcher(ctx, spot_notice, poll_s))
    identity = in_cluster_identity() if kubernetes else None
    if identity is not None:
        try:
            from kubernetes import client

            from gpu_ops.flows.compute.kube import load_cluster_config

            load_cluster_config()
            pod, namespace, node = identity
            watchers.append(KubernetesNoticeWatcher(ctx, client.CoreV1Api(), pod, namespace, node, poll_s))
        except Exception as exc:  # noqa: BLE001 - no client or no credentials: train without this source
            ctx.log(f"no Kubernetes preemption notices: {type(exc).__name__}: {exc}")
    for w in watchers:
        w.start()
    return watchers
