"""`GpuCompute`: the Dagster resource that runs a function on GPUs and reports how it ended.

    @dg.asset
    def train(context, gpu_compute: GpuCompute):
        request = GpuRequest(gpu_type="a100-80gb", gpus=8, labels=Attribution(team="nlp"))
        report = gpu_compute.launch(context, request, my_module.train, args=(cfg,))

Lifecycle, after dagster-ray: objects are created per launch (a Kubetorch service, run
scoped NodePools, or local worker processes and their folder), named from the asset key,
run id and retry number, labelled with the run id, asset key and attribution. After a
launch they are removed according to ``cleanup``:

- ``always``: after every launch, whatever happened;
- ``on_exception``: only when the launch failed or was interrupted (a successful one is
  left for inspection; Kubetorch's ``inactivity_ttl`` and the orphan sensor reclaim it);
- ``never``: left in place (the orphan sensor reclaims them once the run is over).

Interrupts (``BaseException``: Dagster run termination, Ctrl-C) count as failures, and
``yield_for_execution`` removes anything a launch left behind when the step ends, so an
interrupted run does not orphan GPUs. Local worker *processes* never outlive a launch,
whatever the policy: only their folder is kept.

This module imports neither torch nor kubetorch (the Kubetorch backend is imported when
a launch uses it).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from typing import Any, Callable, Literal

import dagster as dg
from pydantic import Field, PrivateAttr

from gpu_ops.compute.backend import Backend, LogSink, StartSink, WorkerReport
from gpu_ops.compute.naming import launch_labels, launch_name
from gpu_ops.compute.request import GpuRequest
from gpu_ops.config import ComputeConfig

CleanupPolicy = Literal["always", "on_exception", "never"]


def should_clean_up(policy: str, failed: bool) -> bool:
    """The cleanup decision for one launch; ``failed`` includes interrupts."""
    if policy == "always":
        return True
    if policy == "on_exception":
        return failed
    if policy == "never":
        return False
    raise ValueError(f"cleanup: unknown policy {policy!r} (use always, on_exception or never)")


def _run_id_of(context: Any) -> str | None:
    try:
        run = context.run  # DagsterRun on execution and init contexts
        return run.run_id if run is not None else None
    except Exception:  # a bare or direct-invocation context
        return None


def _asset_key_of(context: Any) -> list[str] | None:
    try:
        return list(context.asset_key.path)
    except Exception:  # a multi-asset, op or directly invoked context has no single key
        pass
    try:
        op_context = getattr(context, "op_execution_context", context)
        return [op_context.op.name]
    except Exception:
        return None


class GpuCompute(dg.ConfigurableResource):
    """Runs functions on GPUs: local subprocess workers, or Kubetorch on Karpenter nodes."""

    backend: Literal["local", "kubetorch"] = Field(default="local", description="Where launches run.")
    namespace: str = Field(default="default", description="Kubernetes namespace of Kubetorch services (kubetorch backend).")
    cleanup: CleanupPolicy = Field(default="always", description="When launched objects are removed: always, on_exception or never.")
    grace_period_s: float = Field(default=10.0, gt=0, description="SIGTERM-to-SIGKILL grace for local workers.")
    priority_class: str | None = Field(default=None, description="PriorityClass of GPU pods.")
    launch_timeout_s: int = Field(default=900, gt=0, description="How long Kubetorch waits for pods to become ready.")
    inactivity_ttl: str = Field(default="30m", description="Kubetorch tears an idle service down after this long.")
    image: str | None = Field(default=None, description="Container image of Kubetorch workers (default: Kubetorch's).")
    service_account: str | None = Field(
        default=None, description="ServiceAccount of Kubetorch training pods (the chart's gpu-ops-training-worker may get its node and pod, for preemption notices)."
    )
    manage_nodepools: bool = Field(default=True, description="Create/patch Karpenter NodePools for launches.")
    manage_ec2nodeclass: bool = Field(default=False, description="Also create the EC2NodeClass the NodePools reference.")
    node_class: str = Field(default="gpu-ops", description="EC2NodeClass the generated NodePools reference.")
    node_role: str | None = Field(default=None, description="IAM role of a managed EC2NodeClass.")
    cluster_name: str | None = Field(default=None, description="Cluster name for a managed EC2NodeClass's discovery tags.")
    consolidate_after: str = Field(default="10m", description="Karpenter consolidateAfter of generated pools.")
    gpu_limit: int = Field(default=64, gt=0, description="nvidia.com/gpu limit of generated pools.")
    pool_scope: Literal["team", "run"] = Field(default="team", description="NodePools shared by a team, or created and deleted per run.")
    kubeconfig_path: str | None = Field(default=None, description="kubeconfig for the cluster (default: the pod's service account, then $KUBECONFIG or ~/.kube/config).")
    local_workdir: str | None = Field(default=None, description="Folder for local workers' payloads and results (default: the system temp).")
    budget_gate: bool = Field(default=True, description="Refuse launches that an enforced budget blocks or throttles.")
    config_path: str | None = Field(default=None, description="gpu_ops YAML whose storage holds budget enforcement (default: $GPU_OPS_CONFIG, then the bundled demo).")
    standby: bool = Field(
        default=True,
        description="Local backend: while an attempt runs, keep a standby worker (interpreter started, warm imports and CUDA done) that takes over the retry, "
        "also when the retry is a new step process (multiprocess executor).",
    )
    standby_idle_s: float = Field(default=600.0, gt=0, description="A standby worker no attempt claims for this long after its own attempt ended exits.")

    _run_id: str | None = PrivateAttr(default=None)
    _pending: list[Backend] = PrivateAttr(default_factory=list)
    # Local standby workers this process parked for a retry (see release_standbys).
    _parked: list[Any] = PrivateAttr(default_factory=list)
    _last_admission: Any = PrivateAttr(default=None)

    @classmethod
    def from_config(cls, config: ComputeConfig, config_path: str | None = None) -> "GpuCompute":
        k, kt = config.karpenter, config.kubetorch
        return cls(
            config_path=config_path,
            backend=config.backend,
            namespace=config.namespace,
            cleanup=config.cleanup,
            standby=config.standby,
            standby_idle_s=config.standby_idle_s,
            priority_class=config.priority_class,
            launch_timeout_s=kt.launch_timeout_s,
            inactivity_ttl=kt.inactivity_ttl,
            image=kt.image,
            service_account=kt.service_account,
            manage_nodepools=k.manage_nodepools,
            manage_ec2nodeclass=k.manage_ec2nodeclass,
            node_class=k.node_class,
            node_role=k.node_role,
            cluster_name=k.cluster_name,
            consolidate_after=k.consolidate_after,
            gpu_limit=k.gpu_limit,
            pool_scope=k.pool_scope,
        )

    # ------------------------------------------------------------------ lifecycle

    @contextlib.contextmanager
    def yield_for_execution(self, context: dg.InitResourceContext) -> Iterator["GpuCompute"]:
        self._run_id = _run_id_of(context)
        log = context.log.info if context.log else (lambda _m: None)
        try:
            yield self
        finally:
            # Whatever a launch left behind (kept by policy, or interrupted before it
            # could clean up) is settled when the step ends, BaseException included.
            self._settle_pending(log)
            self.release_standbys()

    def release_standbys(self) -> None:
        """The step is over. Standbys parked for a retry stay only where the retry runs in
        another process of the same run (multiprocess executor: the run's process owns
        them, and they end with it or after ``standby_idle_s``); where this process is the
        run's (in-process executor), the run is over: they are stopped."""
        parked, self._parked = self._parked, []
        for spare in parked:
            if spare.scope.owner_pid == os.getpid() or not spare.alive:
                spare.stop()

    def discard_standbys(self, context: Any) -> None:
        """No retry will follow this launch: stop its standbys, whichever process started them."""
        scope = self._standby_scope(_run_id_of(context) or self._run_id, _asset_key_of(context))
        if scope is not None:
            from gpu_ops.compute import standby

            standby.discard(scope)

    def _standby_scope(self, run_id: str | None, asset_key: list[str] | None) -> Any:
        if self.backend != "local" or not self.standby:
            return None
        from gpu_ops.compute.standby import StandbyScope
        from gpu_ops.config import gpu_ops_home

        launch = launch_name(run_id, asset_key, 0)  # the same for every attempt of this launch
        return StandbyScope(run_id=run_id or launch, launch="/".join(asset_key or []) or launch, folder=gpu_ops_home() / "standby", idle_s=self.standby_idle_s)

    def _settle_pending(self, log: LogSink) -> None:
        pending, self._pending = self._pending, []
        for backend in pending:
            if self.cleanup == "always":
                _safe_teardown(backend, log)
            else:
                log(f"cleanup={self.cleanup}: leaving {getattr(backend, 'name', backend)} in place (the orphan sensor reclaims it after the run)")

    # ------------------------------------------------------------------ launch

    def make_backend(self, request: GpuRequest, name: str, labels: dict[str, str], warm: tuple[str, ...] = (), standby: Any = None) -> Backend:
        if self.backend == "local":
            from gpu_ops.compute.local import LocalBackend

            return LocalBackend(
                workers=request.workers,
                gpus=request.gpus,
                name=name,
                grace_period_s=self.grace_period_s,
                workdir=self.local_workdir,
                warm=warm,
                standby=standby,
            )
        from gpu_ops.compute.kubetorch_backend import KubetorchBackend

        return KubetorchBackend.from_resource(self, request, name=name, labels=labels)

    def launch(
        self,
        context: Any,
        request: GpuRequest,
        fn: Callable[..., Any],
        args: tuple = (),
        kwargs: dict[str, Any] | None = None,
        *,
        env: dict[str, str] | None = None,
        log: LogSink | None = None,
        on_start: StartSink | None = None,
        warm: tuple[str, ...] = (),
        on_admitted: Callable[[Any], None] | None = None,
        on_launched: Callable[[list[int], str | None], None] | None = None,
    ) -> WorkerReport:
        """Run ``fn(*args, **kwargs)`` on the GPUs of ``request``; report how it ended.

        ``on_admitted(lease)`` is called once the quota admitted the launch (``lease`` is
        None when no quota applies), ``on_launched(pids, workdir)`` once its workers exist:
        the training layer writes its attempt record there, before the next step.

        ``context`` is the asset/op execution context (run id, asset key, retry number
        name and label what is created; its log receives the workers' output unless
        ``log`` is given). Worker failures are *reported*, not raised; only an
        inability to launch at all raises (a budget that blocks the launch raises
        ``dg.Failure(allow_retries=False)``, a cluster setup problem ``ComputeSetupError``).
        """
        run_id = _run_id_of(context) or self._run_id
        asset_key = _asset_key_of(context)
        attempt = int(getattr(context, "retry_number", 0) or 0)
        name = launch_name(run_id, asset_key, attempt)
        labels = launch_labels(run_id, asset_key, request, attempt)
        if log is None:
            log = context.log.info if getattr(context, "log", None) is not None else print
        if self.budget_gate:
            # Before anything is created: a blocked or throttled budget scope refuses the
            # launch with dg.Failure(allow_retries=False) saying how to lift it.
            from gpu_ops.alerts.enforcement import assert_launch_allowed
            from gpu_ops.config import load_config

            assert_launch_allowed(load_config(self.config_path), request)
        if self.local_workdir:
            os.makedirs(self.local_workdir, exist_ok=True)
        fence_dir = tempfile.mkdtemp(prefix="gpu-ops-fence-", dir=self.local_workdir) if self.backend == "local" else None
        fence_path = os.path.join(fence_dir, "fence.json") if fence_dir else None
        heartbeat = self._admit(context, request, run_id, asset_key, fence_path)
        if on_admitted is not None:
            on_admitted(heartbeat.lease if heartbeat is not None else None)
        env = dict(env or {})
        if heartbeat is not None and fence_path is not None:
            from gpu_ops.compute import fence

            env[fence.FENCE_ENV] = fence_path
            env[fence.GRACE_ENV] = str(heartbeat.book.ttl_s * fence.GRACE_FRACTION)
        try:
            return self._launch(
                request, fn, args, kwargs, env=env, log=log, on_start=on_start, on_launched=on_launched, warm=warm, run_id=run_id, asset_key=asset_key, name=name, labels=labels
            )
        finally:
            if heartbeat is not None:
                heartbeat.stop()  # the GPUs go back to the quota
            if fence_dir is not None:
                shutil.rmtree(fence_dir, ignore_errors=True)

    @property
    def last_admission(self) -> Any:
        """The :class:`~gpu_ops.compute.quota.Admission` of the latest launch under a quota."""
        return self._last_admission

    def _admit(self, context: Any, request: GpuRequest, run_id: str | None, asset_key: list[str] | None, fence_path: str | None = None) -> Any:
        """Take a lease on the request's GPUs under ``compute.quotas``, waiting while the
        quotas are full (the reason in the run log); None when no quota applies."""
        import time

        from gpu_ops.config import load_config

        config = load_config(self.config_path)
        from gpu_ops.compute.quota import Heartbeat, LeaseBook, QuotaExceeded, Quotas
        from gpu_ops.errors import LaunchRefused

        quotas = Quotas(team=dict(config.compute.quotas.team), pool=dict(config.compute.quotas.pool))
        if not quotas or request.total_gpus == 0:
            return None
        from gpu_ops.compute.karpenter import nodepool_name
        from gpu_ops.storage.tables import TableStore

        adm_cfg = config.compute.admission
        scoped_run = run_id if self.pool_scope == "run" else None
        pools = [nodepool_name(request.labels.team, request.gpu_type, cap, scoped_run) for cap in request.capacity_types]
        book = LeaseBook(TableStore.from_config(config), adm_cfg.lease_ttl_s)
        log = getattr(context, "log", None)
        info = log.info if log is not None else print
        warn = log.warning if log is not None else print
        started, wait = time.monotonic(), adm_cfg.backoff_s
        last_said: tuple[str | None, float] = (None, 0.0)
        while True:
            try:
                admission = book.try_acquire(quotas, team=request.labels.team, pools=pools, gpus=request.total_gpus, run_id=run_id or "", asset_key="/".join(asset_key or []))
            except QuotaExceeded as exc:
                raise LaunchRefused(f"launch refused: {exc} (compute.quotas)", metadata={"refused_by": "compute.quotas"}) from None
            for lease in admission.reclaimed:
                warn(f"reclaimed an expired GPU lease: {lease.gpus} GPU(s) of {lease.team}, run {lease.run_id[:8]} on {lease.holder}, not renewed for {adm_cfg.lease_ttl_s:g} s")
            waited = time.monotonic() - started
            if admission.granted and admission.lease is not None:
                info(f"GPU quota: {admission.reason}" + (f" after waiting {waited:.1f} s" if waited >= 0.5 else ""))
                self._last_admission = admission
                # Renewed six times per TTL; each renewal is good for half the TTL in the
                # workers' fence, so a launcher that cannot renew has its workers stopped
                # before the lease can expire (gpu_ops.compute.fence).
                heartbeat = Heartbeat(book, admission.lease, adm_cfg.lease_ttl_s / 6, on_error=warn, fence_path=fence_path)
                heartbeat.start()
                return heartbeat
            if waited >= adm_cfg.wait_timeout_s:
                raise LaunchRefused(
                    f"launch not admitted after {waited:.0f} s (compute.admission.wait_timeout_s): {admission.reason}",
                    metadata={"refused_by": "compute.quotas"},
                )
            if admission.reason != last_said[0] or time.monotonic() - last_said[1] >= 60:
                warn(f"{admission.reason} (waited {waited:.0f} s of at most {adm_cfg.wait_timeout_s:g} s)")
                last_said = (admission.reason, time.monotonic())
            time.sleep(min(wait, max(0.0, adm_cfg.wait_timeout_s - waited)))
            wait = min(wait * 1.5, adm_cfg.backoff_max_s)

    def _launch(
        self,
        request: GpuRequest,
        fn: Callable[..., Any],
        args: tuple,
        kwargs: dict[str, Any] | None,
        *,
        env: dict[str, str] | None,
        log: LogSink,
        on_start: StartSink | None,
        on_launched: Callable[[list[int], str | None], None] | None = None,
        warm: tuple[str, ...] = (),
        run_id: str | None,
        asset_key: list[str] | None,
        name: str,
        labels: dict[str, str],
    ) -> WorkerReport:
        backend = self.make_backend(request, name, labels, tuple(warm), self._standby_scope(run_id, asset_key))
        self._pending.append(backend)
        failed = True
        try:
            report = backend.run(fn, args, kwargs or {}, env=dict(env or {}), log=log, on_start=_started(backend, on_start, on_launched))
            failed = not report.ok
            return report
        finally:
            if failed and hasattr(backend, "park_spares"):  # a retry is likely: its workers are already warm
                for spare in backend.park_spares():
                    log(
                        f"standby worker pid={spare.worker_pid} rank={spare.rank} left running for the next attempt (keeper pid={spare.proc.pid}; "
                        f"it exits after {self.standby_idle_s:g} s unclaimed, or when the run ends)"
                    )
                    self._parked.append(spare)
            elif hasattr(backend, "stop_spares"):
                backend.stop_spares()
            if should_clean_up(self.cleanup, failed):
                self._pending.remove(backend)
                _safe_teardown(backend, log)


def _started(backend: Backend, on_start: StartSink | None, on_launched: Callable[[list[int], str | None], None] | None) -> StartSink:
    def started(pids: list[int]) -> None:
        if on_start is not None:
            on_start(pids)
        if on_launched is not None:
            on_launched(pids, str(backend.workdir) if backend.workdir is not None else None)

    return started


def _safe_teardown(backend: Backend, log: LogSink) -> None:
    # A failed teardown is logged, never allowed to replace the launch's own outcome.
    try:
        backend.teardown()
    except Exception as exc:
        log(f"cleanup of {getattr(backend, 'name', backend)} failed: {type(exc).__name__}: {exc}")


__all__ = ["GpuCompute", "CleanupPolicy", "should_clean_up"]
