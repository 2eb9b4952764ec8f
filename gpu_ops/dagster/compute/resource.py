"""`GpuCompute`: the Dagster resource that runs a function on GPUs and reports how it ended,
one subclass per backend (`LocalGpuCompute`, `KubetorchGpuCompute`). Imports neither torch
nor kubetorch.

Design: docs/concepts/compute.md#the-resource-and-its-lifecycle
"""


import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Literal, dataclass_transform

import dagster as dg
from pydantic import Field, PrivateAttr

from gpu_ops.domain.compute import fence
from gpu_ops.dagster.compute.admission import BudgetGate, GpuAdmission
from gpu_ops.domain.compute.backend import Backend, HoldSink, LogSink, StartSink, WorkerReport
from gpu_ops.domain.compute.naming import launch_labels, launch_name
from gpu_ops.domain.compute.request import GpuRequest
from gpu_ops.domain.config import KARPENTER_DURATION, ComputeConfig, gpu_ops_home

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


class Lifecycle(dg.Config):
    """What happens to what a launch created, after it (as dagster-ray's ``Lifecycle``)."""

    cleanup: CleanupPolicy = Field(default="always", description="When launched objects are removed: always, on_exception or never.")
    grace_period_s: float = Field(default=10.0, gt=0, allow_inf_nan=False, description="SIGTERM-to-SIGKILL grace for workers.")


class StandbySettings(dg.Config):
    """Local backend: a standby worker (interpreter, warm imports, CUDA done) takes over a retry."""

    enabled: bool = Field(
        default=True,
        description="While an attempt runs, keep a standby worker that takes over the retry, also when the retry is a new step process (multiprocess executor).",
    )
    idle_s: float = Field(default=600.0, gt=0, allow_inf_nan=False, description="A standby worker no attempt claims for this long after its own attempt ended exits.")


class KubetorchLaunch(dg.Config):
    """What a Kubetorch launch asks for."""

    priority_class: str | None = Field(default=None, description="PriorityClass of GPU pods.")
    launch_timeout_s: int = Field(default=900, gt=0, description="How long Kubetorch waits for pods to become ready.")
    inactivity_ttl: str = Field(default="30m", description="Kubetorch tears an idle service down after this long.")
    image: str | None = Field(default=None, description="Container image of Kubetorch workers (default: Kubetorch's).")
    service_account: str | None = Field(
        default=None, description="ServiceAccount of training pods (the chart's gpu-ops-training-worker may get its node and pod, for preemption notices)."
    )


class KarpenterPools(dg.Config):
    """The Karpenter NodePools (and EC2NodeClass) launches create or patch."""

    manage_nodepools: bool = Field(default=True, description="Create/patch Karpenter NodePools for launches.")
    manage_ec2nodeclass: bool = Field(default=False, description="Also create the EC2NodeClass the NodePools reference.")
    node_class: str = Field(default="gpu-ops", description="EC2NodeClass the generated NodePools reference.")
    node_role: str | None = Field(default=None, description="IAM role of a managed EC2NodeClass.")
    cluster_name: str | None = Field(default=None, description="Cluster name for a managed EC2NodeClass's discovery tags.")
    consolidate_after: str = Field(default="10m", pattern=KARPENTER_DURATION, description="Karpenter consolidateAfter of generated pools (30s, 10m, 1h, Never).")
    gpu_limit: int = Field(default=64, gt=0, description="nvidia.com/gpu limit of generated pools.")
    pool_scope: Literal["team", "run"] = Field(default="team", description="NodePools shared by a team, or created and deleted per run.")


# No `from __future__ import annotations` here: Dagster reads the ResourceDependency
# annotations at class creation.
if TYPE_CHECKING:  # the metaclass every ConfigurableResource has (it carries the dataclass transform)
    from dagster._config.pythonic_config.typing_utils import BaseResourceMeta as _ResourceMeta
else:
    _ResourceMeta = type(dg.ConfigurableResource)

@dataclass_transform(kw_only_default=True, field_specifiers=(Field,))
class _DefaultBackend(_ResourceMeta):
    """Calling the abstract ``GpuCompute`` builds the default backend, ``LocalGpuCompute``,
    with the same keywords (``resources={"gpu_compute": GpuCompute()}``); a keyword that is
    no field of the class built is refused (Dagster resources would ignore it)."""

    if not TYPE_CHECKING:  # type checkers see the classes' own signatures

        def __call__(cls, *args: Any, **kwargs: Any) -> Any:
            target = LocalGpuCompute if cls is GpuCompute else cls
            unknown = sorted(set(kwargs) - set(target.model_fields))
            if unknown:
                raise TypeError(f"{target.__name__} got unexpected keyword(s): {', '.join(unknown)} (the settings are nested: lifecycle=Lifecycle(...), standby=StandbySettings(...), kubetorch=KubetorchLaunch(...), karpenter=KarpenterPools(...))")
            return super().__call__(*args, **kwargs) if cls is not GpuCompute else LocalGpuCompute(*args, **kwargs)


class GpuCompute(dg.ConfigurableResource, metaclass=_DefaultBackend):
    """Runs functions on GPUs; one subclass per backend (see the module docstring)."""

    lifecycle: Lifecycle = Field(default_factory=Lifecycle, description="Cleanup policy and SIGTERM grace of launches.")
    # Injected: the GPU quota admission (compute.quotas) and the budget gate.
    admission: dg.ResourceDependency[GpuAdmission] = Field(default_factory=GpuAdmission)  # type: ignore[arg-type]
    budget_gate: dg.ResourceDependency[BudgetGate] = Field(default_factory=BudgetGate)  # type: ignore[arg-type]
    config_path: str | None = Field(default=None, description="gpu_ops YAML of this deployment (default: $GPU_OPS_CONFIG, then the plain defaults).")

    _run_id: str | None = PrivateAttr(default=None)
    _pending: list[Backend] = PrivateAttr(default_factory=list)
    _last_admission: Any = PrivateAttr(default=None)

    backend: ClassVar[str] = ""

    @classmethod
    def from_config(cls, config: ComputeConfig, config_path: str | None = None) -> "GpuCompute":
        """The resource the ``compute`` section describes (its backend's subclass)."""
        target = LocalGpuCompute if config.backend == "local" else KubetorchGpuCompute
        return target.from_config(config, config_path)

    @staticmethod
    def _common(config: ComputeConfig, config_path: str | None) -> dict[str, Any]:
        return {
            "config_path": config_path,
            "lifecycle": Lifecycle(cleanup=config.cleanup),
            "admission": GpuAdmission(config_path=config_path),
            "budget_gate": BudgetGate(config_path=config_path),
        }

    # ------------------------------------------------------------------ what a backend provides

    def make_backend(self, request: GpuRequest, name: str, labels: dict[str, str], warm: tuple[str, ...] = (), standby: Any = None) -> Backend:
        """The backend of one launch: each subclass builds its own (``GpuCompute`` itself is
        never instantiated: calling it builds ``LocalGpuCompute``)."""
        raise NotImplementedError(f"{type(self).__name__} is not a backend: use LocalGpuCompute or KubetorchGpuCompute")

    def pool_scope(self) -> str:
        return "team"

    def standby_scope(self, run_id: str | None, asset_key: list[str] | None) -> Any:
        """Where this launch's standby workers meet the next attempt; None: no standby."""
        return None

    def discard_standbys(self, context: Any) -> None:
        """No retry will follow this launch: stop its standbys (none by default)."""

    def release_standbys(self) -> None:
        """The step is over (standbys of backends that keep them)."""

    def after_launch(self, backend: Backend, failed: bool, log: LogSink) -> None:
        """A backend's own bookkeeping once a launch ended (local: park or stop standbys)."""

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

    def _settle_pending(self, log: LogSink) -> None:
        pending, self._pending = self._pending, []
        for backend in pending:
            if self.lifecycle.cleanup == "always":
                _safe_teardown(backend, log)
            else:
                log(f"cleanup={self.lifecycle.cleanup}: leaving {backend.name} in place (the orphan sensor reclaims it after the run)")

    # ------------------------------------------------------------------ launch

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
        launch_index: int | None = None,
        estimate: Any = None,
    ) -> WorkerReport:
        """Run ``fn(*args, **kwargs)`` on the GPUs of ``request``; report how it ended.

        ``context`` is the asset/op execution context (run id, asset key, retry number
        name and label what is created; its log receives the workers' output unless
        ``log`` is given). Worker failures are *reported*, not raised; only an
        inability to launch at all raises (a budget that blocks the launch raises
        ``dg.Failure(allow_retries=False)``, a cluster setup problem ``ComputeSetupError``).
        ``on_admitted(lease)`` is called once the quota admitted the launch (``lease`` is
        None when no quota applies), ``on_launched(pids, workdir)`` once its workers exist:
        the training layer writes its attempt record there, before the next step.
        ``launch_index`` names the launch (default: the step's retry number). ``estimate``
        (:class:`gpu_ops.domain.training.estimate.Estimate`): what the launch is expected to cost;
        the budget gate's forecast refuses it when it would carry an enforced budget past
        its threshold.
        """
        run_id = _run_id_of(context) or self._run_id
        asset_key = _asset_key_of(context)
        attempt = launch_index if launch_index is not None else int(getattr(context, "retry_number", 0) or 0)
        launch = _Launch(self, run_id, asset_key, launch_name(run_id, asset_key, attempt), launch_labels(run_id, asset_key, request, attempt))
        log = log or _context_log(context)
        # Before anything is created: a blocked or throttled budget scope, or one this
        # launch's estimate would carry past its threshold, refuses the launch with
        # dg.Failure(allow_retries=False) saying why and how to lift it.
        self.budget_gate.check(request, estimate, self.config_path)
        with _fence_folder(self.fence_parent()) as fence_path:
            # The launch's backend exists before the admission: it is the reclaimer that
            # makes an expired lease's workers gone before their GPUs are handed on.
            backend = launch.backend(request, warm)
            heartbeat = self._admit(context, request, run_id, asset_key, fence_path, backend)
            if on_admitted is not None:
                on_admitted(heartbeat.lease if heartbeat is not None else None)
            try:
                hold = heartbeat.hold if heartbeat is not None else None
                return launch.run(backend, fn, args, kwargs, _fenced_env(env, heartbeat, fence_path), log, _started(on_start, on_launched), hold)
            finally:
                if heartbeat is not None:
                    heartbeat.stop()  # the GPUs go back to the quota

    def fence_parent(self) -> str | None:
        """Where the launcher writes the fence file of a launch under a GPU lease (local
        workers read it; the Kubetorch backend relays it to its pods)."""
        return tempfile.gettempdir()

    @property
    def last_admission(self) -> Any:
        """The :class:`~gpu_ops.storage.quota.Admission` of the latest launch under a quota."""
        return self._last_admission

    def _admit(self, context: Any, request: GpuRequest, run_id: str | None, asset_key: list[str] | None, fence_path: str | None, backend: Backend) -> Any:
        """A lease on the request's GPUs under ``compute.quotas`` (waiting while they are
        full, the reason in the run log, ``backend`` reclaiming expired leases); None when
        no quota applies."""
        from gpu_ops.flows.compute.karpenter import nodepool_name

        scoped_run = run_id if self.pool_scope() == "run" else None
        pools = [nodepool_name(request.labels.team, request.gpu_type, cap, scoped_run) for cap in request.capacity_types]
        log = getattr(context, "log", None)
        heartbeat = self.admission.admit(
            request, pools=pools, run_id=run_id or "", asset_key="/".join(asset_key or []),
            info=log.info if log is not None else print, warn=log.warning if log is not None else print, fence_path=fence_path, reclaimer=backend, config_path=self.config_path,
        )
        if heartbeat is not None:
            self._last_admission = heartbeat.admission
        return heartbeat


@dataclass
class _Launch:
    """One launch's names and its run of the backend (cleanup by policy afterwards)."""

    compute: GpuCompute
    run_id: str | None
    asset_key: list[str] | None
    name: str
    labels: dict[str, str]

    def backend(self, request: GpuRequest, warm: tuple[str, ...]) -> Backend:
        compute = self.compute
        return compute.make_backend(request, self.name, self.labels, tuple(warm), compute.standby_scope(self.run_id, self.asset_key))

    def run(
        self, backend: Backend, fn: Callable[..., Any], args: tuple, kwargs: dict[str, Any] | None, env: dict[str, str], log: LogSink,
        started: Callable[[Backend], StartSink], hold: HoldSink | None,
    ) -> WorkerReport:
        compute = self.compute
        compute._pending.append(backend)
        failed = True
        try:
            report = backend.run(fn, args, kwargs or {}, env=env, log=log, on_start=started(backend), hold=hold)
            failed = not report.ok
            return report
        finally:
            compute.after_launch(backend, failed, log)
            if should_clean_up(compute.lifecycle.cleanup, failed):
                compute._pending.remove(backend)
                _safe_teardown(backend, log)


class LocalGpuCompute(GpuCompute):
    """Launches as subprocess workers on this machine (CPU, or its GPUs)."""

    local_workdir: str | None = Field(default=None, description="Folder for local workers' payloads and results (default: the system temp).")
    standby: StandbySettings = Field(default_factory=StandbySettings, description="Standby workers that take over a retry.")

    # Local standby workers this process parked for a retry (see release_standbys).
    _parked: list[Any] = PrivateAttr(default_factory=list)

    backend: ClassVar[str] = "local"

    @classmethod
    def from_config(cls, config: ComputeConfig, config_path: str | None = None) -> "LocalGpuCompute":
        return cls(**cls._common(config, config_path), standby=StandbySettings(enabled=config.standby, idle_s=config.standby_idle_s))

    def make_backend(self, request: GpuRequest, name: str, labels: dict[str, str], warm: tuple[str, ...] = (), standby: Any = None) -> Backend:
        from gpu_ops.flows.compute.local import LocalBackend

        return LocalBackend(
            workers=request.workers, gpus=request.gpus, name=name, grace_period_s=self.lifecycle.grace_period_s, workdir=self.local_workdir, warm=warm, standby=standby,
        )

    def fence_parent(self) -> str | None:
        if self.local_workdir:
            os.makedirs(self.local_workdir, exist_ok=True)
        return self.local_workdir or tempfile.gettempdir()

    def standby_scope(self, run_id: str | None, asset_key: list[str] | None) -> Any:
        if not self.standby.enabled:
            return None
        from gpu_ops.flows.compute.standby import StandbyScope

        launch = launch_name(run_id, asset_key, 0)  # the same for every attempt of this launch
        return StandbyScope(run_id=run_id or launch, launch="/".join(asset_key or []) or launch, folder=gpu_ops_home() / "standby", idle_s=self.standby.idle_s)

    def after_launch(self, backend: Backend, failed: bool, log: LogSink) -> None:
        from gpu_ops.flows.compute.local import LocalBackend

        assert isinstance(backend, LocalBackend)
        if not failed:
            backend.stop_spares()
            return
        for spare in backend.park_spares():  # a retry is likely: its workers are already warm
            log(
                f"standby worker pid={spare.worker_pid} rank={spare.rank} left running for the next attempt (keeper pid={spare.proc.pid}; "
                f"it exits after {self.standby.idle_s:g} s unclaimed, or when the run ends)"
            )
            self._parked.append(spare)

    def release_standbys(self) -> None:
        """The step is over. Standbys parked for a retry stay only where the retry runs in
        another process of the same run (multiprocess executor: the run's process owns
        them, and they end with it or after ``standby.idle_s``); where this process is the
        run's (in-process executor), the run is over: they are stopped."""
        parked, self._parked = self._parked, []
        for spare in parked:
            if spare.scope.owner_pid == os.getpid() or not spare.alive:
                spare.stop()

    def discard_standbys(self, context: Any) -> None:
        """No retry will follow this launch: stop its standbys, whichever process started them."""
        scope = self.standby_scope(_run_id_of(context) or self._run_id, _asset_key_of(context))
        if scope is not None:
            from gpu_ops.flows.compute import standby

            standby.discard(scope)


class KubetorchGpuCompute(GpuCompute):
    """Launches through Kubetorch on Karpenter GPU nodes."""

    namespace: str = Field(default="default", description="Kubernetes namespace of Kubetorch services.")
    kubeconfig_path: str | None = Field(default=None, description="kubeconfig for the cluster (default: the pod's service account, then $KUBECONFIG or ~/.kube/config).")
    kubetorch: KubetorchLaunch = Field(default_factory=KubetorchLaunch, description="What a Kubetorch launch asks for.")
    karpenter: KarpenterPools = Field(default_factory=KarpenterPools, description="The NodePools launches create or patch.")

    backend: ClassVar[str] = "kubetorch"

    @classmethod
    def from_config(cls, config: ComputeConfig, config_path: str | None = None) -> "KubetorchGpuCompute":
        # The compute section's nested settings, passed through as they are (same fields).
        return cls(
            **cls._common(config, config_path),
            namespace=config.namespace,
            kubetorch=KubetorchLaunch(priority_class=config.priority_class, **config.kubetorch.model_dump()),
            karpenter=KarpenterPools(**config.karpenter.model_dump()),
        )

    def pool_scope(self) -> str:
        return self.karpenter.pool_scope

    def make_backend(self, request: GpuRequest, name: str, labels: dict[str, str], warm: tuple[str, ...] = (), standby: Any = None) -> Backend:
        from gpu_ops.flows.compute.kubetorch_backend import KubetorchBackend

        return KubetorchBackend.from_resource(self, request, name=name, labels=labels)


def _context_log(context: Any) -> LogSink:
    log = getattr(context, "log", None)
    return log.info if log is not None else print


@contextlib.contextmanager
def _fence_folder(parent: str | None) -> Iterator[str | None]:
    """A private folder for one launch's fence file (none for remote workers)."""
    if parent is None:
        yield None
        return
    folder = tempfile.mkdtemp(prefix="gpu-ops-fence-", dir=parent)
    try:
        yield os.path.join(folder, "fence.json")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _fenced_env(env: dict[str, str] | None, heartbeat: Any, fence_path: str | None) -> dict[str, str]:
    out = dict(env or {})
    if heartbeat is not None and fence_path is not None:
        out[fence.FENCE_ENV] = fence_path
        out[fence.GRACE_ENV] = str(heartbeat.book.ttl_s * fence.GRACE_FRACTION)
    return out


def _started(on_start: StartSink | None, on_launched: Callable[[list[int], str | None], None] | None) -> Callable[[Backend], StartSink]:
    def for_backend(backend: Backend) -> StartSink:
        def started(pids: list[int]) -> None:
            if on_start is not None:
                on_start(pids)
            if on_launched is not None:
                on_launched(pids, str(backend.workdir) if backend.workdir is not None else None)

        return started

    return for_backend


def _safe_teardown(backend: Backend, log: LogSink) -> None:
    # A failed teardown is logged, never allowed to replace the launch's own outcome.
    try:
        backend.teardown()
    except Exception as exc:
        log(f"cleanup of {backend.name} failed: {type(exc).__name__}: {exc}")


__all__ = [
    "BudgetGate", "CleanupPolicy", "GpuAdmission", "GpuCompute", "KarpenterPools", "KubetorchGpuCompute", "KubetorchLaunch", "Lifecycle",
    "LocalGpuCompute", "StandbySettings", "should_clean_up",
]
