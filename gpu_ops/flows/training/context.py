"""`TrainingContext`: what a training function sees inside the worker.

    def train(ctx: TrainingContext, steps: int = 1000):
        state = ctx.checkpoint.load() or fresh_state()
        for step in range(state["step"], steps):
            ...
            ctx.progress(step + 1, steps, loss=loss)
            if ctx.should_checkpoint():
                ctx.checkpoint.save(state_at(step + 1), step=step + 1)
            if ctx.preempted:
                return          # the attempt counts as preempted; the next one resumes
        return {"final_loss": loss}

No Dagster here: the context talks to the parent through structured lines on stdout
(``gpu_ops:<event> {json}``), which the backend streams into the run log.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from gpu_ops.domain.compute.backend import NOTICE_RECEIVED, NOTICE_SIGNAL
from gpu_ops.domain.compute.fence import FenceCheck
from gpu_ops.errors import TrainingPreempted as TrainingPreempted
from gpu_ops.flows.training.checkpoint import CheckpointInfo, CheckpointStore
from gpu_ops.domain.training.interval import CheckpointSchedule

EVENT_PREFIX = "gpu_ops:"


def emit(event: str, **fields: Any) -> None:
    """One structured line on stdout, flushed at once (the parent parses it)."""
    fields.setdefault("t", time.time())
    try:
        sys.stdout.write(f"{EVENT_PREFIX}{event} {json.dumps(fields, default=str, separators=(',', ':'))}\n")
        sys.stdout.flush()
    except (BrokenPipeError, ValueError):
        # The launcher is gone (its step process died): nobody reads the line. The worker
        # is stopping anyway (its parent watch), and must still checkpoint on the way.
        pass


def parse_event(line: str) -> tuple[str, dict[str, Any]] | None:
    """``gpu_ops:progress {...}`` -> ("progress", {...}); None for any other line."""
    idx = line.find(EVENT_PREFIX)
    if idx < 0:
        return None
    head, _, body = line[idx + len(EVENT_PREFIX) :].partition(" ")
    try:
        data = json.loads(body) if body.strip() else {}
    except ValueError:
        return None
    return (head, data) if isinstance(data, dict) else None


@dataclass
class WorkerSpec:
    """Everything the worker needs; plain data so it pickles to any backend."""

    fn_module: str
    fn_qualname: str
    run_id: str
    asset_key: str
    attempt: int
    checkpoint_url: str
    keep_last: int = 3
    params: dict[str, Any] = field(default_factory=dict)
    partition_key: str | None = None
    checkpoint_interval: float | str = "auto"
    mtbp_prior_s: float = 7200.0
    past_exposure_s: float = 0.0
    past_preemptions: int = 0
    spot_notice: str | None = None
    spot_notice_poll_s: float = 5.0
    kubernetes_notice: bool = True
    request: dict[str, Any] = field(default_factory=dict)
    progress_every_s: float = 2.0


class Checkpoints:
    """``ctx.checkpoint``: the store, timed for the schedule, quiet on ranks other than 0."""

    def __init__(self, store: CheckpointStore, ctx: "TrainingContext"):
        self.store = store
        self._ctx = ctx
        self.last: CheckpointInfo | None = None
        self.resumed_from: CheckpointInfo | None = None

    def save(self, state: Any, *, step: int | None = None, metadata: dict[str, Any] | None = None) -> CheckpointInfo | None:
        """Save ``state`` (rank 0 only; all ranks hold the same state in data parallelism).

        Not when the GPU lease was revoked (another holder may be training): None then."""
        if self._ctx.fence.revoked():
            self._ctx.notify_preempted(self._ctx.fence.lapsed() or "GPU lease revoked")
            return None
        if self._ctx.rank != 0:
            self._ctx.schedule.record_save(self._ctx.schedule.cost_s())
            return None
        info = self.store.save(state, step=step, attempt=self._ctx.attempt, metadata=metadata)
        self._ctx.schedule.record_save(info.save_seconds)
        self.last = info
        emit("checkpoint", seq=info.seq, step=step, seconds=info.save_seconds, bytes=info.size, written_at=info.written_at)
        return info

    def load(self, map_location: Any = None) -> Any | None:
        """The newest valid checkpoint's state (older ones if it is corrupt); None if none."""
        found = self.store.load_with_info(map_location)
        # Training starts now: the first interval counts from here, not from worker start-up.
        self._ctx.schedule.restart()
        quiet = self._ctx.rank != 0  # every rank loads; rank 0 speaks for them
        if found is None:
            if not quiet:
                emit("start", attempt=self._ctx.attempt, resumed=False)
            return None
        state, info = found
        self.resumed_from = info
        if info.save_seconds and self._ctx.schedule.measured_cost_s is None:
            self._ctx.schedule.measured_cost_s = info.save_seconds
        if not quiet:
            emit("start", attempt=self._ctx.attempt, resumed=True, seq=info.seq, step=info.step, written_at=info.written_at)
        return state


class TrainingContext:
    """Passed to a training function as its first argument."""

    def __init__(self, spec: WorkerSpec, *, clock: Callable[[], float] = time.monotonic):
        self.spec = spec
        self.attempt = spec.attempt
        """This attempt's number, 1 for the first (a retry after a preemption is 2, ...)."""
        self.run_id = spec.run_id
        """The Dagster run this attempt belongs to."""
        self.asset_key = spec.asset_key
        """The asset's key, as a list of path components."""
        self.partition_key = spec.partition_key
        """The partition being materialized, None when the asset is not partitioned."""
        self.params = dict(spec.params)
        """The function's keyword arguments: the asset's ``params`` with the run config's overrides."""
        self.request = dict(spec.request)
        """The ``GpuRequest`` this attempt ran with (after the policy's changes), as a dict."""
        self.rank = int(os.environ.get("RANK", "0"))
        """This worker's rank among ``world_size`` (``$RANK``; 0 alone); only rank 0 writes checkpoints."""
        self.world_size = int(os.environ.get("WORLD_SIZE", "1"))
        """How many workers train together (``$WORLD_SIZE``; 1 alone)."""
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        """This worker's rank on its node (``$LOCAL_RANK``): its GPU, see :meth:`device`."""
        self.schedule = CheckpointSchedule(
            interval="auto" if spec.checkpoint_interval == "auto" else float(spec.checkpoint_interval),
            mtbp_prior_s=spec.mtbp_prior_s,
            past_exposure_s=spec.past_exposure_s,
            past_preemptions=spec.past_preemptions,
            clock=clock,
        )
        self.checkpoint = Checkpoints(CheckpointStore(spec.checkpoint_url, spec.keep_last, log=self.log), self)
        """This asset's checkpoints (a :class:`~gpu_ops.flows.training.checkpoint.CheckpointStore`
        under ``<asset key>/<partition>/<root run id>``): ``load()`` the newest valid one, or
        None; ``save(state, step=...)`` on rank 0."""
        self._preempted = threading.Event()
        # The launcher's GPU lease, as its fence file says (gpu_ops.domain.compute.fence): read
        # before each checkpoint and step batch; a lapsed lease stops the worker.
        self.fence = FenceCheck()
        self._announced = False
        self.preempt_reason: str | None = None
        """Why :attr:`preempted` became true (the signal or notice), None before."""
        self._last_progress = 0.0
        self.last_metrics: dict[str, Any] = {}
        self.last_step: int | None = None
        self.hardware: Any = None  # gpu_ops.flows.training.hardware.Hardware, set by the worker wrapper

    # ---- preemption

    @property
    def preempted(self) -> bool:
        """True once SIGTERM or a spot notice arrived: save, then return."""
        if not self._preempted.is_set():
            self._check_kubetorch()
            self._check_fence()
        if self._preempted.is_set() and not self._announced:
            self._announced = True
            emit("preempted", reason=self.preempt_reason)
        return self._preempted.is_set()

    def notify_preempted(self, reason: str) -> None:
        """Flag the preemption. Safe in a signal handler: it only sets state; the notice
        is logged by the training loop's next look at :attr:`preempted` (writing to
        stdout from a handler could re-enter a write the loop was in the middle of)."""
        if not self._preempted.is_set():
            self.preempt_reason = reason
            self._preempted.set()

    def _check_fence(self) -> None:
        lapsed = self.fence.lapsed()
        if lapsed is not None:
            self.notify_preempted(lapsed)

    def _check_kubetorch(self) -> None:
        # Inside a Kubetorch pod the server owns SIGTERM and sets its termination event.
        server = sys.modules.get("kubetorch.serving.http_server")
        event = getattr(server, "TERMINATION_EVENT", None)
        if event is not None and event.is_set():
            self.notify_preempted("the Kubetorch pod is terminating")

    def should_checkpoint(self) -> bool:
        """True when the interval has elapsed or a preemption notice arrived.

        With several ranks this is a collective: call it on every rank every step. The
        decision and the preemption flag are agreed across ranks so all of them stop
        together.
        """
        due = self.schedule.due() or self.preempted
        if self.world_size > 1:
            due = self._agree(due)
        return due

    def _agree(self, due: bool) -> bool:
        dist = sys.modules.get("torch.distributed")
        if dist is None or not dist.is_available() or not dist.is_initialized():
            return due
        import torch

        flags = torch.tensor([float(due), float(self._preempted.is_set())])
        if dist.get_backend() == "nccl":
            flags = flags.cuda()
        dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        if flags[1].item() > 0:
            self.notify_preempted("another rank received a preemption notice")
        return bool(flags[0].item() > 0)

    # ---- progress and logs

    def progress(self, step: int, total: int | None = None, **metrics: Any) -> None:
        """Report progress; shown in the run log at most every few seconds."""
        self.last_step = step
        self.last_metrics = {k: _plain(v) for k, v in metrics.items()}
        now = time.monotonic()
        first = self._last_progress == 0.0
        if first or step == total or now - self._last_progress >= self.spec.progress_every_s:
            self._last_progress = now
            if self.rank == 0:
                emit("progress", step=step, total=total, attempt=self.attempt, metrics=self.last_metrics)

    def log(self, message: str) -> None:
        """A line for the run log, tagged with this worker's rank."""
        emit("log", message=str(message), rank=self.rank)

    def device(self) -> str:
        """``cuda:<local rank>`` when torch sees a GPU, else ``cpu``."""
        import torch

        return f"cuda:{self.local_rank}" if torch.cuda.is_available() else "cpu"

    def summary(self) -> dict[str, Any]:
        last = self.checkpoint.last
        resumed = self.checkpoint.resumed_from
        return {
            "last_step": self.last_step,
            "metrics": self.last_metrics,
            "checkpoints_saved": self.schedule.saves,
            "checkpoint_seconds": self.schedule.measured_cost_s,
            "checkpoint_interval_s": self.schedule.current_interval(),
            "last_checkpoint_at": last.written_at if last else None,
            "resumed_from_step": resumed.step if resumed else None,
            # Structured, for backends whose workers' output does not reach the parent.
            "hardware": self.hardware.as_dict() if self.hardware is not None else None,
        }


def _plain(v: Any) -> Any:
    if isinstance(v, (int, float, str, bool)) or v is None:
        return v
    item = getattr(v, "item", None)  # numpy / torch scalars
    if callable(item):
        try:
            return item()
        except (TypeError, ValueError, RuntimeError):
            pass
    return str(v)


# --------------------------------------------------------------------------- SIGTERM


# A preemption *notice* (the kill comes later): checkpoint now, then stop. The local
# backend's way to simulate Karpenter's taint or EC2's two-minute warning.
NOTICE_SIGNAL_REASON = "preemption notice (SIGUSR1)"


def install_sigterm_handler(ctx: TrainingContext) -> Callable[[], None]:
    """Turn SIGTERM and the notice signal (SIGUSR1) into ``ctx.preempted``; returns a
    function that restores the old handlers.

    Only the main thread may install signal handlers; elsewhere (a Kubetorch server
    thread) the server's own termination event is checked instead.
    """
    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def on_sigterm(signum: int, frame: Any) -> None:
        ctx.notify_preempted("SIGTERM")

    def on_notice(signum: int, frame: Any) -> None:
        ctx.notify_preempted(NOTICE_SIGNAL_REASON)

    previous = signal.signal(signal.SIGTERM, on_sigterm)
    previous_notice = signal.signal(NOTICE_SIGNAL, on_notice)
    # A notice that reached the worker before this handler existed (compute.worker notes it).
    if NOTICE_RECEIVED.is_set():
        ctx.notify_preempted(NOTICE_SIGNAL_REASON)

    def restore() -> None:
        signal.signal(signal.SIGTERM, previous)
        signal.signal(NOTICE_SIGNAL, previous_notice)

    return restore

