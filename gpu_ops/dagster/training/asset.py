"""`gpu_asset` / `gpu_op`: training functions as Dagster assets and ops that survive preemption.

    @gpu_asset(request=GpuRequest(gpu_type="a100-80gb", gpus=8), policy=PreemptionPolicy(max_preemptions=10))
    def finetune(ctx: TrainingContext, lr: float = 3e-4): ...

One Dagster step attempt = one training attempt:

1. read this run's earlier attempts from the usage ledger; plan the request (more
   memory after OOMs, on-demand after ``fallback_after`` spot preemptions);
2. launch :func:`gpu_ops.flows.training.worker.run_training` through the ``gpu_compute``
   resource; the worker resumes from the newest valid checkpoint;
3. classify how it ended, append a ledger row, decide (pure policy) and turn the
   decision into ``dg.RetryRequested`` (with backoff), ``dg.Failure(allow_retries=False)``
   or the materialization with its metadata.

The Dagster layer is this module only; classification, policy, checkpoints and the
ledger are plain Python.
"""

from __future__ import annotations

# The ledger and TableStore (pandas, SQLAlchemy) are imported when an attempt runs, not when the code location loads.
import contextlib
import dataclasses
import datetime as dt
import json
import multiprocessing
import os
import random
import signal
import socket
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import dagster as dg

from gpu_ops.domain import formatting as fmt

from gpu_ops.flows.training import hardware
from gpu_ops.domain.compute.backend import WorkerReport
from gpu_ops.domain.compute.catalog import gpu_share
from gpu_ops.domain.compute.naming import launch_name
from gpu_ops.domain.compute.request import GpuRequest
from gpu_ops.dagster.compute.resource import GpuCompute
from gpu_ops.domain.config import GpuOpsConfig, load_config, parse_duration
from gpu_ops.domain.cost.columns import CAPACITY_TYPES
from gpu_ops.flows.training.checkpoint import CheckpointStore, checkpoint_url_for
from gpu_ops.domain.training.classify import Classification, Outcome, classify_exception, classify_report
from gpu_ops.dagster.training.compute_requirement import GpuOpDefinition, asset_with_handover, handover_key
from gpu_ops.flows.training.context import WorkerSpec, parse_event
from gpu_ops.dagster.training.cost_link import cost_rows_metadata
from gpu_ops.domain.training.policy import Action, AttemptRecord, Counts, Decision, PreemptionPolicy, decide, max_attempts, plan_attempt
from gpu_ops.flows.training.worker import import_root, register, run_training

if TYPE_CHECKING:
    from gpu_ops.storage.tables import TableStore

PARAMS_CONFIG = "params"


# Every GPU step takes a slot of this Dagster pool, whatever launched it (the asset page,
# a job, a schedule): `dagster instance concurrency set gpu 16` caps GPU steps at once.
GPU_POOL = "gpu"


def gpu_run_tags(request: GpuRequest) -> dict[str, str]:
    """Run tags that the run queues (deploy/dagster.yaml, dagster.yaml) limit: put them on
    jobs that launch GPU work, ``dg.define_asset_job(..., tags=gpu_run_tags(request))``."""
    return {"gpu-ops/gpu-launch": "true", "gpu-ops/team": request.labels.team}


@dataclass(frozen=True)
class TrainingSpec:
    """What a decorated training function was declared with."""

    fn_module: str
    fn_qualname: str
    request: GpuRequest
    policy: PreemptionPolicy
    params: Mapping[str, Any] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)
    checkpoint_url: str | None = None  # default: training.checkpoint_url of the config
    keep_last: int | None = None
    compute_resource_key: str = "gpu_compute"
    settings_resource_key: str | None = None  # None: load_config(config_path) ($GPU_OPS_CONFIG, else the plain defaults)
    config_path: str | None = None
    # Modules a worker imports before the function (standby workers import them while
    # the previous attempt runs): e.g. ("torch",). The function's own module is added.
    warm_imports: tuple[str, ...] = ()
    # How long a run trains (seconds), as the author declares it (``expected_duration="2h"``):
    # the launch estimate until the asset has a successful run in the ledger.
    expected_duration_s: float | None = None


# --------------------------------------------------------------------------- helpers


def _utcnow() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


# The worker's structured events (gpu_ops.flows.training.context.emit) the sink turns into log lines.
_EVENTS = frozenset({"progress", "checkpoint", "start", "preempted", "stopped", "phase", "hardware", "log", "finished"})


class _EventSink:
    """Receives the workers' output lines: structured events become readable log lines."""

    def __init__(self, log: Any, attempt: int, on_first_step: Callable[[float], None] | None = None):
        self.log = log
        self.attempt = attempt
        self.on_first_step = on_first_step
        self.pids: list[int] = []
        self.started_at: dt.datetime | None = None
        self.first_progress_at: float | None = None
        self.last_progress: dict[str, Any] | None = None
        self.last_checkpoint: dict[str, Any] | None = None
        self.resumed: dict[str, Any] | None = None
        self.hardware: dict[int, hardware.Hardware] = {}  # rank -> what its worker reported
        self.startup: dict[str, Any] = {}  # rank 0's start-up phases (wall clock), see compute.worker

    @property
    def actual_hardware(self) -> hardware.Hardware | None:
        return hardware.combine([self.hardware[r] for r in sorted(self.hardware)])

    def worker_metadata(self) -> dict[str, Any]:
        """Which worker served this attempt: a standby left warm by the attempt before it, or a new one."""
        md: dict[str, Any] = {"worker_start": "standby" if self.startup.get("standby") else "new worker"}
        if self.pids:
            md["worker_pid"] = dg.MetadataValue.int(self.pids[0])
        return md

    def on_start(self, pids: list[int]) -> None:
        self.pids = list(pids)
        self.started_at = _utcnow()

    def __call__(self, line: str) -> None:
        parsed = parse_event(line)
        if parsed is None:
            self.log.info(line)
            return
        event, data = parsed
        handler = getattr(self, f"_on_{event}", None) if event in _EVENTS else None
        if handler is None:
            self.log.info(line)
        else:
            handler(data, line)

    def _on_progress(self, data: dict[str, Any], line: str) -> None:
        if self.first_progress_at is None:
            self.first_progress_at = data.get("t")
            self._log_startup(data.get("t"))
            if self.on_first_step is not None:
                self.on_first_step(float(data.get("t") or time.time()))
        self.last_progress = data
        total = data.get("total")
        pct = f" ({100 * data['step'] / total:.0f}%)" if total else ""
        metrics = " ".join(f"{k}={_fmt(v)}" for k, v in (data.get("metrics") or {}).items())
        self.log.info(f"step {data.get('step')}/{total or '?'}{pct} {metrics} [attempt {self.attempt}]".replace("  ", " "))

    def _on_checkpoint(self, data: dict[str, Any], line: str) -> None:
        self.last_checkpoint = data
        self.log.info(f"checkpoint #{data.get('seq')} at step {data.get('step')}: {data.get('bytes', 0) / 1e6:.1f} MB in {data.get('seconds', 0):.3f} s")

    def _on_start(self, data: dict[str, Any], line: str) -> None:
        self.startup["checkpoint_loaded"] = data.get("t")
        self.resumed = data if data.get("resumed") else None
        if data.get("resumed"):
            self.log.info(f"attempt {self.attempt} resumes from checkpoint #{data.get('seq')} (step {data.get('step')}, written {data.get('written_at')})")
        else:
            self.log.info(f"attempt {self.attempt} starts from scratch (no checkpoint yet)")

    def _on_preempted(self, data: dict[str, Any], line: str) -> None:
        self.log.warning(f"preemption notice in the worker ({data.get('reason')}): saving a checkpoint and stopping")

    def _on_stopped(self, data: dict[str, Any], line: str) -> None:
        self.log.warning(f"worker stopped after the preemption notice at step {data.get('last_step')}")

    def _on_phase(self, data: dict[str, Any], line: str) -> None:
        if not line.startswith("[rank") or line.startswith("[rank 0]"):
            self.startup = {"standby": bool(data.get("standby")), **(data.get("phases") or {})}

    def _on_hardware(self, data: dict[str, Any], line: str) -> None:
        hw = hardware.Hardware.from_dict(data)
        self.hardware[int(data.get("rank") or 0)] = hw
        names = ", ".join(dict.fromkeys(hw.names))
        self.log.info(f"worker rank {data.get('rank') or 0} runs on {hw.describe()}" + (f" ({names})" if names else "") + f" [{hw.source}]")

    def _on_log(self, data: dict[str, Any], line: str) -> None:
        self.log.info(str(data.get("message")))

    def _on_finished(self, data: dict[str, Any], line: str) -> None:
        if self.first_progress_at is None:  # resumed with no step left to train: the start-up still happened
            self._log_startup(data.get("t") or time.time(), "finished")
        last = data.get("last_step")
        self.log.info("training function returned" + (f" after step {last}" if last is not None else " (it reported no step)"))

    def _log_startup(self, at: float | None, last: str = "first_step") -> None:
        """One line: how long each start-up phase took up to the first step (or, with no
        step, to ``last``) at ``at``, and the absolute times (JSON)."""
        if not self.startup or at is None:
            return
        times = {**self.startup, last: at}
        order = ["process", "interpreter", "imports", "cuda_init", "activated", "payload", "checkpoint_loaded", last]
        marks = [(k, times[k]) for k in order if isinstance(times.get(k), (int, float))]
        steps = ", ".join(f"{k} +{t - prev:.2f} s" for (_, prev), (k, t) in zip(marks, marks[1:]))
        who = "a standby worker (warm before the attempt began)" if times.get("standby") else "a new worker"
        self.log.info(f"attempt {self.attempt} start-up on {who}: {steps}")
        self.log.debug(f"attempt {self.attempt} startup_times={json.dumps(times)}")  # absolute times, for benchmarks/preemption.py


def _fmt(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def _capacity_type(report: WorkerReport | None, request: GpuRequest) -> str:
    labels = getattr(getattr(getattr(report, "node", None), "metadata", None), "labels", None) or {}
    value = labels.get("karpenter.sh/capacity-type")
    if value in CAPACITY_TYPES:
        return value
    return request.capacity_types[0]


def _pod_and_node(report: WorkerReport | None, name: str) -> tuple[str, str]:
    pod = getattr(report, "pod", None)
    pod_name = getattr(getattr(pod, "metadata", None), "name", None)
    node_name = getattr(getattr(pod, "spec", None), "node_name", None)
    return pod_name or name, node_name or socket.gethostname()


# --------------------------------------------------------------------------- one attempt
#
# The steps of one attempt, each small; the attempt's durable record (planned -> admitted
# -> launched -> running -> settled -> decided, gpu_ops.domain.training.attempts) is written by
# the AttemptRecorder before each step takes effect, so a step process that dies leaves a
# record the next attempt (or the orphan sensor, or `gpu-ops validate`) settles.


@dataclass
class AttemptResult:
    value: Any
    metadata: dict[str, Any]


@dataclass
class _Step:
    """What one attempt's steps share (the Dagster side: context, resources)."""

    context: Any
    spec: TrainingSpec
    asset_key: str
    launch_key: list[str]
    config: GpuOpsConfig
    compute: GpuCompute
    store: TableStore
    run_id: str
    attempt: int
    partition_key: str | None
    history: list[AttemptRecord] = field(default_factory=list)
    exposure_s: float = 0.0
    past_preemptions: int = 0
    request: GpuRequest | None = None
    notes: tuple[str, ...] = ()
    ckpt_url: str = ""
    ckpts: CheckpointStore | None = None
    recorder: Any = None  # gpu_ops.flows.training.recorder.AttemptRecorder
    estimate: Any = None  # gpu_ops.domain.training.estimate.Estimate of this launch; None when the ledger could not be read

    @property
    def name(self) -> str:
        return launch_name(self.run_id, self.launch_key, self.attempt - 1)  # as GpuCompute names it (launch_index)

    @property
    def log(self) -> Any:
        return self.context.log


@dataclass
class _Launched:
    sink: "_EventSink"
    report: WorkerReport | None
    error: Exception | None
    ended_at: dt.datetime
    lost_owner: str | None  # the run worker died / the run ended under the attempt


def _open_step(context: Any, spec: TrainingSpec, asset_key: str, launch_key: list[str]) -> _Step:
    from gpu_ops.storage.tables import TableStore

    if spec.settings_resource_key:
        config: GpuOpsConfig = getattr(context.resources, spec.settings_resource_key).load()
    else:
        config = load_config(spec.config_path)
    partition_key = context.partition_key if getattr(context, "has_partition_key", False) else None
    return _Step(
        context, spec, asset_key, launch_key, config, getattr(context.resources, spec.compute_resource_key), TableStore.from_config(config),
        context.run.run_id, int(context.retry_number) + 1, partition_key,
    )


def _settle_orphans(step: _Step) -> None:
    """Attempts whose owner died (this run's previous step process, or any other) are
    settled before this one plans: billed, workers stopped, leases released."""
    from gpu_ops.flows.training.settle import settle_orphans

    ttl = step.config.compute.admission.lease_ttl_s
    try:
        found = settle_orphans(
            step.store, found_by=f"the next attempt of run {step.run_id[:8]}", successor=(step.run_id, step.asset_key), stale_s=ttl,
            last_checkpoint=lambda a: _orphans_last_checkpoint(step, a), log=step.log, pricing=_pricing(step),
        )
    except Exception as exc:  # noqa: BLE001 - the database is down: this attempt still runs
        step.log.error(f"could not look for orphaned attempts: {type(exc).__name__}: {exc}")
        return
    for s in found:
        step.log.warning(s.message)


def _orphans_last_checkpoint(step: _Step, orphan: Any) -> dt.datetime | None:
    """When an orphan of this asset and run lineage last saved (its ledger row's lost work
    ends there): the newest checkpoint its attempt wrote to the checkpoints this step resumes."""
    run = step.context.run
    if orphan.asset_key != step.asset_key or orphan.run_id not in {step.run_id, run.root_run_id, run.parent_run_id}:
        return None
    scope = run.root_run_id or step.run_id
    url = checkpoint_url_for(step.config.checkpoint_root(step.spec.checkpoint_url), step.asset_key, step.partition_key, scope)
    infos = CheckpointStore(url, step.spec.keep_last or step.config.training.keep_last, log=step.log.warning).list()
    return max((i.written_at_dt for i in infos if i.attempt == orphan.attempt), default=None)


def _read_history(step: _Step) -> None:
    from gpu_ops.storage import ledger

    try:
        step.history = ledger.run_history(step.store, step.run_id, step.asset_key)
        step.exposure_s, step.past_preemptions = ledger.preemption_exposure(step.store, step.asset_key)
    except Exception as exc:  # the ledger is down: train anyway; Dagster's count still caps retries
        step.log.error(f"cannot read {ledger.LEDGER_TABLE} ({type(exc).__name__}: {exc}); planning attempt {step.attempt} without history")
    # Attempts retried inside one step process count too (the ledger has them all).
    step.attempt = max(step.attempt, 1 + max((r.attempt for r in step.history), default=0))
    planned = plan_attempt(step.spec.policy, step.spec.request, step.history)
    step.request, step.notes = planned.request, planned.notes


def _estimate(step: _Step) -> None:
    """What this launch is expected to cost (the asset's successful runs, or its declared
    duration), said in the run log and recorded (``gpu_launch_estimates``) before it starts."""
    from gpu_ops.storage import estimate_store, ledger
    from gpu_ops.domain.training.estimate import estimate_launch

    assert step.request is not None
    done_s = sum(max(0.0, r.duration_s - r.lost_seconds) for r in step.history)
    try:
        rows = ledger.read(step.store, asset_key=step.asset_key)
        step.estimate = estimate_launch(
            step.request, rows, step.config.prices.gpus, declared_s=step.spec.expected_duration_s, done_s=done_s, currency=step.config.prices.currency,
        )
        step.log.info(f"estimate of attempt {step.attempt}: {step.estimate.describe()}")
        estimate_store.record(step.store, step.run_id, step.asset_key, step.attempt, _utcnow(), step.request.capacity, step.estimate)
    except Exception as exc:  # noqa: BLE001 - the database is down: the launch goes ahead without an estimate
        step.log.error(f"could not estimate attempt {step.attempt} ({type(exc).__name__}: {exc}); launching without an estimate")


def _prepare_checkpoints(step: _Step) -> None:
    run = step.context.run
    scope = run.root_run_id or step.run_id  # a re-execution continues its parent's checkpoints
    step.ckpt_url = checkpoint_url_for(step.config.checkpoint_root(step.spec.checkpoint_url), step.asset_key, step.partition_key, scope)
    step.ckpts = CheckpointStore(step.ckpt_url, step.spec.keep_last or step.config.training.keep_last, log=step.log.warning)
    removed = step.ckpts.remove_partial()  # no writer is alive between attempts
    if removed:
        step.log.info(f"removed {removed} partial checkpoint file(s) left by the previous attempt")
    if not _is_local(step.compute) and "://" not in step.ckpt_url:
        step.log.warning(
            f"checkpoints go to the path {fmt.redact_url(step.ckpt_url, keep_path=True)} inside the worker pods: unless that is a mounted volume (PVC) "
            "they die with the pod; set training.checkpoint_url to s3://, gs:// or a PVC mount"
        )


def _is_local(compute: GpuCompute) -> bool:
    return compute.backend == "local"


def _worker_spec(step: _Step) -> WorkerSpec:
    assert step.request is not None
    spec = step.spec
    return WorkerSpec(
        fn_module=spec.fn_module, fn_qualname=spec.fn_qualname, run_id=step.run_id, asset_key=step.asset_key, attempt=step.attempt,
        checkpoint_url=step.ckpt_url, keep_last=spec.keep_last or step.config.training.keep_last, params={**spec.params, **_op_params(step.context)},
        partition_key=step.partition_key, checkpoint_interval=spec.policy.checkpoint_interval, mtbp_prior_s=spec.policy.mtbp_prior_s,
        past_exposure_s=step.exposure_s, past_preemptions=step.past_preemptions, spot_notice=spec.policy.spot_notice,
        spot_notice_poll_s=spec.policy.spot_notice_poll_s, kubernetes_notice=spec.policy.kubernetes_notice, request=step.request.model_dump(mode="json"),
    )


def _log_plan(step: _Step) -> None:
    assert step.request is not None and step.ckpts is not None
    request, counts = step.request, Counts.of(step.history)
    newest = next(iter(step.ckpts.list()), None)  # manifest only; the worker verifies the data
    step.log.info(
        f"attempt {step.attempt}: {request.gpus}× {request.gpu_type} x{request.workers} worker(s), capacity {request.capacity}, "
        f"memory {request.memory} ({'; '.join(step.notes) or 'as declared'}); history: {counts.preemptions} preemption(s), {counts.ooms} OOM(s), "
        f"{counts.infrastructure} infrastructure failure(s), {counts.user_errors} user error(s); "
        + (f"newest checkpoint #{newest.seq} (step {newest.step})" if newest else "no checkpoint yet")
        + f" in {fmt.redact_url(step.ckpt_url, keep_path=True)}"
    )


def _plan_record(step: _Step) -> None:
    from gpu_ops.flows.training.recorder import AttemptRecorder

    assert step.request is not None
    inner = getattr(step.context, "op_execution_context", step.context)
    step_key = getattr(inner, "op_handle", None) or step.launch_key[-1]
    step.recorder = AttemptRecorder.plan(
        step.store, run_id=step.run_id, step_key=str(step_key), asset_key=step.asset_key, attempt=step.attempt, launch_name=step.name,
        bill=_bill(step.request, None, step.name, None, used_gpus=True), log_error=step.log.error, log=step.log, pricing=_pricing(step),
        deadline_s=step.config.training.telemetry_deadline_s,
    )


def _pricing(step: _Step) -> Any:
    from gpu_ops.flows.observability.hooks import Pricing

    return Pricing.of(step.config)


class _OwnerWatch(threading.Thread):
    """Stops the workers when the run this step belongs to is gone: the run worker died
    (the parent of a multiprocess step process) or the run ended (FAILURE, CANCELED)
    while the attempt still ran. No orphan keeps training after its run."""

    def __init__(self, step: _Step, sink: "_EventSink", every_s: float = 1.0):
        super().__init__(name="gpu-ops-owner-watch", daemon=True)
        self.step, self.sink, self.every_s = step, sink, every_s
        self.lost: str | None = None
        self._done = threading.Event()
        self._parent = multiprocessing.parent_process()

    def _why_lost(self) -> str | None:
        if self._parent is not None and not self._parent.is_alive():
            return f"the run worker (pid {self._parent.pid}) of run {self.step.run_id[:8]} died"
        try:
            run = self.step.context.instance.get_run_by_id(self.step.run_id)
        except Exception:  # noqa: BLE001 - the run storage is unreachable for a moment
            return None
        if run is not None and run.is_finished:
            return f"run {self.step.run_id[:8]} ended ({run.status.value}) while the attempt ran (its run worker died or it was terminated)"
        return None

    def run(self) -> None:
        while not self._done.wait(self.every_s):
            self.lost = self._why_lost()
            if self.lost is not None:
                for pid in self.sink.pids:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGTERM)  # the worker checkpoints and stops
                return

    def stop(self) -> None:
        self._done.set()


def _launch(step: _Step) -> _Launched:
    assert step.request is not None
    spec, compute, recorder, request = step.spec, step.compute, step.recorder, step.request
    env = dict(spec.env)
    root = import_root(spec.fn_module)
    if root and _is_local(compute):  # local workers import the function from where it was loaded
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", os.environ.get("PYTHONPATH"))) if p)
    sink = _EventSink(step.log, step.attempt, lambda t: recorder.running(t, _bill(request, None, step.name, sink.actual_hardware, True)))
    watch = _OwnerWatch(step, sink)
    watch.start()
    report, error = None, None
    try:
        report = compute.launch(
            step.context, step.request, run_training, args=(asdict(_worker_spec(step)),), env=env, log=sink, on_start=sink.on_start,
            warm=(*spec.warm_imports, spec.fn_module), on_admitted=recorder.admitted, on_launched=recorder.launched, launch_index=step.attempt - 1,
            estimate=step.estimate,
        )
    except dg.Failure:
        # A deliberate refusal (a budget block names itself and how to lift it): no GPU
        # was used and nothing is retried, so it reaches the run as it is.
        _settle_refused(step, "the launch was refused")
        raise
    except Exception as exc:
        # The launch itself failed (no capacity, image pull, controller timeout): the
        # classifier reads the exception chain; no GPU was used unless workers started.
        error = exc
    except BaseException as exc:
        # Interrupted (run terminated, Ctrl-C): still account for the GPUs, then stop.
        _settle(step, _Launched(sink, None, None, _utcnow(), None), Classification(Outcome.PREEMPTED, f"interrupted by {type(exc).__name__}"))
        raise
    finally:
        watch.stop()
    return _Launched(sink, report, error, _utcnow(), watch.lost)


def _settle_refused(step: _Step, why: str) -> None:
    from gpu_ops.domain.training.attempts import Decision as Final

    step.recorder.settle(Outcome.INFRASTRUCTURE.value, why, time.time(), None, None, billed=False)
    step.recorder.decide(Final.FAIL, why)


def _classify(step: _Step, launched: _Launched) -> Classification:
    if launched.error is not None:
        c = classify_exception(launched.error)
        assert c is not None
        step.log.error(f"launch failed: {type(launched.error).__name__}: {launched.error}")
        return c
    assert launched.report is not None
    c = classify_report(launched.report)
    if launched.lost_owner is not None:
        return Classification(Outcome.PREEMPTED, f"stopped because {launched.lost_owner}", c.evidence)
    return c


def _settle(step: _Step, launched: _Launched, c: Classification) -> tuple[float, float]:
    """Write the settled record and the ledger row; (billed seconds, lost seconds)."""
    assert step.request is not None and step.ckpts is not None
    sink, request = launched.sink, step.request
    actual = sink.actual_hardware or _reported_hardware(launched.report)
    used_gpus = sink.started_at is not None
    bill = _bill(request, launched.report, step.name, actual, used_gpus)
    newest = next(iter(step.ckpts.list()), None)  # manifests only: the next attempt verifies the data
    ended = launched.ended_at.timestamp()
    recorded = launched.report.ended_at if launched.report is not None else None  # the workers' own record (this process may have been paused)
    if recorded is not None and used_gpus:
        ended = min(ended, max(recorded, step.recorder.record.launched_at or recorded))
    row = step.recorder.settle(c.outcome.value, c.reason, ended, bill, newest.written_at_dt if newest else None)
    if row is None and step.recorder.taken_over is not None:
        step.log.warning(f"attempt {step.attempt} was settled by {step.recorder.taken_over.settled_by} while its step still ran")
    if row is not None:
        step.log.info(f"ledger: attempt {step.attempt} {c.outcome.value} ({c.reason}); {_ledger_usage(row, request, step.config.training.simulate_gpu_pricing)}")
        return row.duration_s, row.lost_seconds
    return 0.0, 0.0


def _ledger_usage(row: Any, request: GpuRequest, simulated: bool) -> str:
    """What a settled ledger row holds, in words: GPU-hours on what ran, or that it ran on
    CPU (or never started) and is not priced."""
    work = f"{row.duration_s:.1f} s of worker time, lost {row.lost_seconds:.1f} s of work"
    if row.gpu_count:
        return f"{fmt.gpu_hours(row.gpu_hours)} on {row.capacity_type} {row.gpu_count}x {row.gpu_type} ({row.hardware_source}) for {work}"
    if row.hardware_source == "none":
        return f"no worker started, so no GPU time: not priced ({work})"
    also = f"; the asset's metadata prices it as the declared {hardware.declared(request.gpu_type, request.total_gpus)} (simulated: training.simulate_gpu_pricing)" if simulated else ""
    return f"ran on CPU (the worker had no GPU): not GPU usage, not priced{also}; {work}"


def _decide(step: _Step, launched: _Launched, c: Classification, seconds: tuple[float, float]) -> Decision:
    from gpu_ops.domain.training.attempts import Decision as Final

    assert step.request is not None
    this = AttemptRecord(step.attempt, c.outcome, _capacity_type(launched.report, step.request), *seconds)
    decision = decide(step.spec.policy, step.spec.request, [*step.history, this], c, random.Random(), attempt=step.attempt)
    if launched.lost_owner is not None and decision.action is Action.RETRY:
        # The run itself is gone: its retry (run_retries) or a re-execution resumes from the checkpoint.
        decision = Decision(Action.FAIL, f"{launched.lost_owner}; the run's retry or a re-execution from failure resumes from the newest checkpoint", 0.0, decision.counts)
    final = {Action.RETRY: Final.RETRY, Action.COMPLETE: Final.DONE, Action.FAIL: Final.FAIL}[decision.action]
    step.recorder.decide(final, decision.reason)
    _log_decision(step.context, step.attempt, c, decision)
    if decision.action is not Action.RETRY:
        step.compute.discard_standbys(step.context)  # no attempt will claim them
    return decision


def _fail(step: _Step, launched: _Launched, c: Classification, decision: Decision) -> BaseException:
    from gpu_ops.dagster.failures import TrainingFailed

    err = launched.error
    tb = c.traceback or (launched.report.traceback if launched.report else None) or ("".join(traceback.format_exception(err)) if err else None)
    return TrainingFailed(
        description=f"{step.asset_key}: attempt {step.attempt} {c.describe()}. Not retried: {decision.reason}.",
        metadata={"outcome": c.outcome.value, "reason": c.reason, "decision": decision.reason, "attempts": step.attempt, "remote_traceback": dg.MetadataValue.text(tb or "(none)")},
        allow_retries=False,
    )


def _result(step: _Step, launched: _Launched, decision: Decision) -> AttemptResult:
    assert launched.report is not None and step.request is not None  # a completed attempt has a report
    report, request, sink = launched.report, step.request, launched.sink
    returned = report.value if isinstance(report.value, dict) else {"value": report.value, "summary": {}}
    value = returned.get("value")
    actual = sink.actual_hardware or _reported_hardware(report)
    simulated = step.config.training.simulate_gpu_pricing and actual is not None and actual.is_cpu
    warning = hardware.mismatch(request.gpu_type, request.total_gpus, request.mig_profile, actual, simulated) if actual else None
    if warning:  # a CPU run priced as asked (simulated) is what the configuration wants: said, not warned
        (step.log.info if simulated else step.log.warning)(f"attempt {step.attempt}: {warning}")
    metadata = _materialization_metadata(step.store, step.config, step.run_id, step.asset_key, decision, returned.get("summary") or {}, value, step.ckpt_url, request, sink)
    metadata.update(_hardware_metadata(request, actual, warning))
    metadata.update(_estimate_metadata(step, metadata.get("cost_usd")))
    metadata.update(sink.worker_metadata())
    admission = step.compute.last_admission
    if admission is not None:
        from gpu_ops.storage.quota import Quotas, holders_markdown

        quotas = Quotas(team=dict(step.config.compute.quotas.team), pool=dict(step.config.compute.quotas.pool))
        metadata["gpu_quota"] = admission.reason
        metadata["gpu_quota_holders"] = dg.MetadataValue.md(holders_markdown(admission.holders, quotas))
    return AttemptResult(value, metadata)


def _one_attempt(step: _Step) -> tuple[_Launched, Classification, Decision]:
    _read_history(step)
    _estimate(step)
    _prepare_checkpoints(step)
    _log_plan(step)
    _plan_record(step)
    try:
        launched = _launch(step)
        c = _classify(step, launched)
        return launched, c, _decide(step, launched, c, _settle(step, launched, c))
    finally:
        step.recorder.stop()


def _retry_here(step: _Step, launched: _Launched, decision: Decision) -> bool:
    """A retry with nothing to wait for runs in this step process at once (its standby is
    already warm here): a new Dagster step process would cost seconds of start-up. Retries
    that wait (backoff) go back to Dagster (``RetryRequested``), as ``retry_in_step=False`` does."""
    return decision.action is Action.RETRY and decision.wait_s == 0 and launched.lost_owner is None and step.spec.policy.retry_in_step


def run_attempt(context: Any, spec: TrainingSpec, asset_key: str, launch_key: list[str]) -> AttemptResult:
    """Run training attempts for the current step until one completes, fails, or a retry
    must wait; raise to retry (through Dagster) or fail."""
    step = _open_step(context, spec, asset_key, launch_key)
    _settle_orphans(step)
    launched, c, decision = _one_attempt(step)
    while _retry_here(step, launched, decision):
        step.log.info(f"attempt {step.attempt + 1} starts in this step process at once (nothing to wait for)")
        step = dataclasses.replace(step, attempt=step.attempt + 1, history=[], recorder=None)
        launched, c, decision = _one_attempt(step)
    if decision.action is Action.RETRY:
        raise dg.RetryRequested(max_retries=int(context.retry_number) + 1, seconds_to_wait=decision.wait_s)
    if decision.action is Action.FAIL:
        raise _fail(step, launched, c, decision)
    return _result(step, launched, decision)


def _hardware_metadata(request: GpuRequest, actual: hardware.Hardware | None, warning: str | None) -> dict[str, Any]:
    md: dict[str, Any] = {
        "declared_gpu": hardware.declared(request.gpu_type, request.total_gpus, request.mig_profile),
        "actual_gpu": actual.describe() if actual is not None and actual.determined else "unreported (recorded as declared)",
    }
    if actual is not None and actual.names:
        md["actual_gpu_names"] = ", ".join(dict.fromkeys(actual.names))
    if warning:
        md["hardware_warning"] = warning
    return md


def _estimate_metadata(step: _Step, cost: Any) -> dict[str, Any]:
    """The run's estimate (recorded at its first attempt) beside what it cost, also in the run log."""
    from gpu_ops.storage import estimate_store

    try:
        first = estimate_store.first_of_runs(estimate_store.read(step.store, run_id=step.run_id, asset_key=step.asset_key))
    except Exception as exc:  # noqa: BLE001 - the database is down: the materialization still happens
        step.log.error(f"could not read the run's estimate ({type(exc).__name__}: {exc})")
        return {}
    if first.empty:
        return {"estimate_basis": "none recorded"}
    r = first.iloc[0]
    usd, p90 = estimate_store.known(r["estimate_usd"]), estimate_store.known(r["estimate_p90_usd"])
    actual = getattr(cost, "value", None)
    actual = actual if isinstance(actual, (int, float)) else None
    md: dict[str, Any] = {"estimate_basis": str(r["basis"]), "estimate_detail": str(r["detail"])}
    if usd is not None:
        md["estimate_usd"] = dg.MetadataValue.float(fmt.round_money(usd) or 0.0)
    if p90 is not None:
        md["estimate_p90_usd"] = dg.MetadataValue.float(fmt.round_money(p90) or 0.0)
    if usd is not None and actual is not None:
        md["estimate_error_usd"] = dg.MetadataValue.float(fmt.round_money(actual - usd) or 0.0)
    step.log.info(
        f"estimate against actual: estimated {'unknown' if usd is None else f'{usd:.2f}'} (p90 {'unknown' if p90 is None else f'{p90:.2f}'}, {r['basis']}), "
        f"actual {'unknown' if actual is None else f'{actual:.2f}'} {step.config.prices.currency}"
    )
    return md


def _op_params(context: Any) -> dict[str, Any]:
    inner = getattr(context, "op_execution_context", context)
    cfg = inner.op_config or {}
    return dict(cfg.get(PARAMS_CONFIG) or {})


def _bill(request: GpuRequest, report: WorkerReport | None, name: str, actual: hardware.Hardware | None, used_gpus: bool) -> dict[str, Any]:
    """The ledger row's fixed part: what ran (or was declared), where, for whom."""
    pod, node = _pod_and_node(report, name)
    labels, used = request.labels, _used_hardware(request, actual, used_gpus)
    return {
        "namespace": request.namespace, "pod": pod, "node": node, "team": labels.team, "project": labels.project, "cost_center": labels.cost_center,
        "experiment_id": labels.experiment_id, "gpu_type": used.gpu_type, "gpu_count": used.gpu_count, "capacity_type": _capacity_type(report, request),
        "sharing": used.sharing, "gpu_share": used.gpu_share, "declared_gpu_type": request.gpu_type, "declared_gpu_count": request.total_gpus,
        "hardware_source": used.source,
    }



def _reported_hardware(report: WorkerReport | None) -> hardware.Hardware | None:
    """The hardware in a completed attempt's summary (Kubetorch: the workers' log lines
    may not reach us); None when there is none."""
    value = report.value if report is not None else None
    found = value.get("summary", {}).get("hardware") if isinstance(value, dict) and isinstance(value.get("summary"), dict) else None
    return hardware.Hardware.from_dict(found) if isinstance(found, dict) else None


@dataclass(frozen=True)
class UsedHardware:
    """What the ledger records for an attempt: the reported hardware when there is a
    report, the request when the worker died before reporting, nothing when none started."""

    gpu_type: str
    gpu_count: int
    sharing: str
    gpu_share: float
    source: str


def _used_hardware(request: GpuRequest, actual: hardware.Hardware | None, used_gpus: bool) -> UsedHardware:
    if not used_gpus:  # a launch that never started held no GPU
        return UsedHardware(request.gpu_type, 0, "none", 1.0, "none")
    if actual is None or not actual.determined:
        return UsedHardware(request.gpu_type, request.total_gpus, "mig" if request.mig_profile else "none", request.gpu_share, "declared")
    if actual.is_cpu:
        return UsedHardware(hardware.CPU, 0, "none", 1.0, "worker")
    share = gpu_share(actual.gpu_type, actual.mig_profile) if actual.known else 1.0
    return UsedHardware(actual.gpu_type, actual.gpu_count, "mig" if actual.mig_profile else "none", share, "worker")


def _log_decision(context: Any, attempt: int, c: Classification, d: Decision) -> None:
    message = f"attempt {attempt} {c.describe()} -> {d.action.value}: {d.reason}"
    if d.action is Action.COMPLETE:
        context.log.info(message)
    elif d.action is Action.RETRY:
        context.log.warning(message)
    else:
        context.log.error(message + (f"\nremote traceback:\n{c.traceback}" if c.traceback else ""))


def _materialization_metadata(
    store: TableStore,
    config: GpuOpsConfig,
    run_id: str,
    asset_key: str,
    decision: Decision,
    summary: Mapping[str, Any],
    value: Any,
    ckpt_url: str,
    request: GpuRequest,
    sink: _EventSink,
) -> dict[str, Any]:
    from gpu_ops.storage import ledger

    rows = ledger.read(store, run_id=run_id, asset_key=asset_key)
    rows = rows.sort_values("attempt") if not rows.empty else rows
    gpu_hours = 0.0
    cost: float | None = 0.0
    missing: list[str] = []
    simulated = 0
    lines = ["| attempt | outcome | capacity | hardware | seconds | lost s |", "|---|---|---|---|---|---|"]
    for r in rows.itertuples(index=False):
        seconds = (r.end - r.start).total_seconds()
        gpu_type, count, share = r.gpu_type, r.gpu_count, r.gpu_share
        if gpu_type == hardware.CPU and config.training.simulate_gpu_pricing:
            # The demo's opt-in: a CPU run priced as if it had the declared GPUs (said in the metadata).
            gpu_type, count, share, simulated = request.gpu_type, request.total_gpus, request.gpu_share, simulated + 1
        hours = count * share * seconds / 3600.0
        gpu_hours += hours
        price = config.prices.per_gpu_hour(gpu_type, r.capacity_type) if count else 0.0
        if price is None:
            missing.append(f"{gpu_type}/{r.capacity_type}")
        elif cost is not None:
            cost += hours * price
        lines.append(f"| {r.attempt} | {r.outcome} | {r.capacity_type} | {hardware.declared(r.gpu_type, r.gpu_count)} | {seconds:.1f} | {r.lost_seconds:.1f} |")
    if missing:
        cost = None
    outcomes = list(rows["outcome"]) if not rows.empty else [Outcome.COMPLETED.value]
    md: dict[str, Any] = {
        "attempts": dg.MetadataValue.int(len(outcomes)),
        "preemptions": dg.MetadataValue.int(outcomes.count(Outcome.PREEMPTED.value)),
        "oom_retries": dg.MetadataValue.int(outcomes.count(Outcome.OOM.value)),
        "infrastructure_retries": dg.MetadataValue.int(outcomes.count(Outcome.INFRASTRUCTURE.value)),
        "gpu_hours": dg.MetadataValue.float(fmt.round_hours(gpu_hours) or 0.0),
        "lost_gpu_hours": dg.MetadataValue.float(
            fmt.round_hours(sum(r.gpu_count * r.gpu_share * r.lost_seconds / 3600.0 for r in rows.itertuples(index=False))) or 0.0
        ),
        "cost_usd": dg.MetadataValue.float(fmt.round_money(cost) or 0.0) if cost is not None else dg.MetadataValue.text(f"unknown: no price for {', '.join(sorted(set(missing)))}"),
        "currency": config.prices.currency,
        "decision": decision.reason,
        "attempt_history": dg.MetadataValue.md("\n".join(lines)),
        "checkpoint_url": fmt.redact_url(ckpt_url, keep_path=True),
        "gpu_request": f"{request.gpus}x {request.gpu_type}, {request.workers} worker(s), {request.capacity}, {request.memory}",
        "pricing": (
            f"simulated: {simulated} CPU attempt(s) priced as the declared {hardware.declared(request.gpu_type, request.total_gpus)} "
            "(training.simulate_gpu_pricing)"
            if simulated
            else "as run: the hardware each worker reported (CPU attempts are not priced)"
        ),
    }
    md.update(_summary_metadata(summary))
    md.update(cost_rows_metadata(config, run_id, asset_key, rows))  # where the cost rows are
    if isinstance(value, Mapping):
        # only scalars are metadata; the rest stays the function's value
        md.update({str(k): v for k, v in value.items() if isinstance(v, (bool, int, float, str))})
    return md


def _summary_metadata(summary: Mapping[str, Any]) -> dict[str, Any]:
    kinds = {"checkpoint_seconds": dg.MetadataValue.float, "checkpoint_interval_s": dg.MetadataValue.float, "resumed_from_step": dg.MetadataValue.int}
    cast = {"checkpoint_seconds": float, "checkpoint_interval_s": float, "resumed_from_step": int}
    return {k: kinds[k](cast[k](summary[k])) for k in kinds if summary.get(k) is not None}  # type: ignore[operator]


# --------------------------------------------------------------------------- decorators


_CONFIG_SCHEMA = {
    PARAMS_CONFIG: dg.Field(
        dg.Permissive(),
        is_required=False,
        default_value={},
        description="Keyword arguments for the training function; override the decorator's params.",
    )
}


def _training_definition(
    decorator: str,
    f: Callable[..., Any],
    dagster_kwargs: dict[str, Any],
    *,
    request: GpuRequest | Mapping[str, Any],
    policy: PreemptionPolicy | Mapping[str, Any] | None,
    params: Mapping[str, Any] | None,
    env: Mapping[str, str] | None,
    name: str | None,
    compute_resource_key: str,
    settings_resource_key: str | None,
    **spec_kw: Any,
) -> tuple[TrainingSpec, dict[str, Any]]:
    """What ``gpu_asset`` and ``gpu_op`` share: the spec, and the keywords of ``dg.asset`` /
    ``dg.op`` (``dagster_kwargs`` are the caller's; ``description`` and ``pool`` are settled here)."""
    module, qualname = register(f)
    spec = TrainingSpec(
        fn_module=module,
        fn_qualname=qualname,
        request=request if isinstance(request, GpuRequest) else GpuRequest.model_validate(request),
        policy=policy if isinstance(policy, PreemptionPolicy) else PreemptionPolicy.model_validate(policy or {}),
        params=dict(params or {}),
        env=dict(env or {}),
        compute_resource_key=compute_resource_key,
        settings_resource_key=settings_resource_key,
        **spec_kw,
    )
    keys = {compute_resource_key} | ({settings_resource_key} if settings_resource_key else set())
    if "retry_policy" in dagster_kwargs:
        raise TypeError(f"{decorator} decides retries itself (policy=PreemptionPolicy(...)); do not pass retry_policy")
    dagster_kwargs.setdefault("pool", GPU_POOL)
    # Not a retry rule (run_attempt decides every retry itself, raising RetryRequested or a
    # Failure that allows none): it is what makes Dagster retry the step when its process
    # *dies* (SIGKILL, host OOM killer) under the multiprocess executor, at once; the next
    # attempt settles the dead one and resumes from its checkpoint.
    dagster_kwargs["retry_policy"] = dg.RetryPolicy(max_retries=max_attempts(spec.policy) - 1, delay=0)
    common = {
        "name": name or f.__name__,
        "required_resource_keys": keys,
        "config_schema": _CONFIG_SCHEMA,
        "description": dagster_kwargs.pop("description", None) or (f.__doc__ or "").strip() or None,
    }
    return spec, common


def _declared_seconds(value: str | float | None) -> float | None:
    """``expected_duration`` in seconds (a duration such as ``2h``, or a number of seconds)."""
    if value is None:
        return None

    seconds = parse_duration(value).total_seconds()
    if not seconds > 0:
        raise ValueError(f"expected_duration must be a positive duration (e.g. 2h or 90m), got {value!r}")
    return seconds


def gpu_asset(
    fn: Callable[..., Any] | None = None,
    *,
    request: GpuRequest | Mapping[str, Any],
    policy: PreemptionPolicy | Mapping[str, Any] | None = None,
    params: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    checkpoint_url: str | None = None,
    keep_last: int | None = None,
    compute_resource_key: str = "gpu_compute",
    settings_resource_key: str | None = None,
    config_path: str | None = None,
    name: str | None = None,
    warm_imports: tuple[str, ...] | list[str] = (),
    expected_duration: str | float | None = None,
    **asset_kwargs: Any,
) -> Any:
    """Decorate ``def train(ctx: TrainingContext, **params)`` into a preemption-aware asset.

    ``request`` is the GPUs to ask for, ``policy`` the retry/checkpoint policy,
    ``params`` keyword arguments for the function (run config ``params`` overrides them
    per run). Other keywords (``key_prefix``, ``group_name``, ``deps``,
    ``partitions_def``, ``owners``, ``tags``, ``kinds``, ...) go to ``dg.asset``. The
    function runs in a worker process; a returned mapping's scalars become
    materialization metadata. Requires the ``gpu_compute`` resource (and
    ``settings_resource_key`` when given; otherwise the configuration comes from
    ``config_path``, ``$GPU_OPS_CONFIG`` or the plain defaults). ``warm_imports`` (e.g.
    ``("torch",)``) are imported by workers before the function, and by the standby
    worker that takes over a retry while the attempt before it still runs.
    ``expected_duration`` (``"2h"``, ``"90m"`` or seconds) is how long a run trains: the
    launch estimate until the asset has a successful run in the usage ledger.
    """

    options: dict[str, Any] = dict(
        request=request, policy=policy, params=params, env=env, checkpoint_url=checkpoint_url, keep_last=keep_last,
        compute_resource_key=compute_resource_key, settings_resource_key=settings_resource_key, config_path=config_path, name=name,
        warm_imports=tuple(warm_imports), expected_duration_s=_declared_seconds(expected_duration),
    )

    def decorate(f: Callable[..., Any]) -> dg.AssetsDefinition:
        spec, common = _training_definition("gpu_asset", f, asset_kwargs, **options)
        kinds = set(asset_kwargs.pop("kinds", None) or ()) | {"gpu"}
        # The step reads its GpuCompute through an asset-level handover resource, whose
        # requirement says how to add a missing one (gpu_ops.dagster.training.compute_requirement).
        compute_key = spec.compute_resource_key
        spec = dataclasses.replace(spec, compute_resource_key=handover_key(compute_key))
        common["required_resource_keys"] = (common["required_resource_keys"] - {compute_key}) | {spec.compute_resource_key}

        def _training_asset(context) -> dg.MaterializeResult:  # type: ignore[no-untyped-def]
            result = run_attempt(context, spec, context.asset_key.to_user_string(), list(context.asset_key.path))
            return dg.MaterializeResult(metadata=result.metadata)

        return asset_with_handover(_training_asset, compute_key, **common, kinds=kinds, **asset_kwargs)

    return decorate(fn) if fn is not None else decorate


def gpu_op(
    fn: Callable[..., Any] | None = None,
    *,
    request: GpuRequest | Mapping[str, Any],
    policy: PreemptionPolicy | Mapping[str, Any] | None = None,
    params: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    checkpoint_url: str | None = None,
    keep_last: int | None = None,
    compute_resource_key: str = "gpu_compute",
    settings_resource_key: str | None = None,
    config_path: str | None = None,
    name: str | None = None,
    warm_imports: tuple[str, ...] | list[str] = (),
    expected_duration: str | float | None = None,
    **op_kwargs: Any,
) -> Any:
    """The op twin of :func:`gpu_asset`: outputs the function's return value, with the
    same metadata on the output. The ledger's ``asset_key`` column is ``op/<job>/<op>``."""

    options: dict[str, Any] = dict(
        request=request, policy=policy, params=params, env=env, checkpoint_url=checkpoint_url, keep_last=keep_last,
        compute_resource_key=compute_resource_key, settings_resource_key=settings_resource_key, config_path=config_path, name=name,
        warm_imports=tuple(warm_imports), expected_duration_s=_declared_seconds(expected_duration),
    )

    def decorate(f: Callable[..., Any]) -> dg.OpDefinition:
        spec, common = _training_definition("gpu_op", f, op_kwargs, **options)

        @dg.op(**common, **op_kwargs)
        def _training_op(context):  # type: ignore[no-untyped-def]
            result = run_attempt(context, spec, f"op/{context.job_name}/{context.op.name}", [context.op.name])
            yield dg.Output(result.value, metadata=result.metadata)

        return GpuOpDefinition.of(_training_op, compute_resource_key)

    return decorate(fn) if fn is not None else decorate
