"""The contract between `GpuCompute`, its backends and the training layer.

Design: docs/concepts/compute.md#the-backend-contract
"""

from __future__ import annotations

import enum
import re
import signal
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from gpu_ops.errors import LeaseLost


class WorkerExit(str, enum.Enum):
    """How a launch's workers ended, as the backend saw it; the training layer's classifier
    turns it (with the evidence beside it) into an :class:`~gpu_ops.domain.training.classify.Outcome`."""

    COMPLETED = "completed"  # the function returned
    ERROR = "error"  # the function raised; traceback attached
    SIGTERM = "sigterm"  # terminated by SIGTERM (spot notice, eviction, drain)
    SIGKILL = "sigkill"  # killed without warning (node loss, OOM killer, kill -9)
    OOM = "oom"  # out of memory (exit 137 with an OOM cause, CUDA OOM, MemoryError)
    LOST = "lost"  # the worker vanished or could not be reached (infrastructure)


@dataclass
class RankReport:
    rank: int
    exit: WorkerExit
    exit_code: int | None = None
    pid: int | None = None
    error_message: str | None = None  # one line: what ended this rank
    value: Any = None  # this rank's return value when it completed


@dataclass
class WorkerReport:
    """What a backend returns for one launch: how the workers ended (``exit``), the
    function's return value or its error, each rank's report and the Kubernetes evidence
    the classifier reads. A backend never decides whether to retry."""

    exit: WorkerExit
    exit_code: int | None = None
    value: Any = None  # the function's return value (rank 0's when distributed)
    error_type: str | None = None
    error_message: str | None = None
    traceback: str | None = None  # the remote traceback, as text
    duration_s: float = 0.0
    ranks: list[RankReport] = field(default_factory=list)
    # When the workers ended as they recorded it (wall clock; local backend), None when
    # unknown: the launcher may have looked later (it was paused), the ledger bills this.
    ended_at: float | None = None
    # Kubernetes evidence for the classifier: kubernetes.client V1Pod, V1Node and
    # CoreV1Event objects, and the exception Kubetorch raised, when there is one.
    pod: Any = None
    node: Any = None
    events: list[Any] = field(default_factory=list)
    exception: BaseException | None = None

    @property
    def ok(self) -> bool:
        return self.exit is WorkerExit.COMPLETED


# A preemption notice delivered to a worker process: the kill comes later. The worker
# checkpoints at once and stops (the training layer's ``ctx.preempted``).
NOTICE_SIGNAL = signal.SIGUSR1
# Set by the local worker's handler when a notice arrives before the training layer has
# installed its own (a notice during start-up must not be lost, nor kill the worker).
NOTICE_RECEIVED = threading.Event()

# Out-of-memory messages that do not come as a MemoryError or torch's OutOfMemoryError:
# CUDA's, and the host's (torch's CPU allocator raises a RuntimeError; the kernel's ENOMEM).
OOM_TEXT = re.compile(
    r"CUDA out of memory|CUDA error: out of memory|DefaultCPUAllocator: can't allocate memory|can't allocate memory|"
    r"Cannot allocate memory|std::bad_alloc|failed to allocate \d+ bytes",
    re.IGNORECASE,
)

LogSink = Callable[[str], None]
StartSink = Callable[[list[int]], None]  # receives the worker pids (local backend), rank order
# Writes a launch's workers on its GPU lease (what Backend.make_gone reads back); raises
# (gpu_ops.storage.quota.LeaseLost) when the lease is gone: the workers must not start.
HoldSink = Callable[[Mapping[str, Any]], None]


@dataclass(frozen=True)
class Gone:
    """Whether the workers a lease recorded are confirmed gone, and what was done or why not."""

    confirmed: bool
    why: str


def hold_workers(hold: HoldSink | None, workers: Mapping[str, Any]) -> LeaseLost | None:
    """``hold(workers)`` (nothing without a lease); the :class:`LeaseLost` it raised, else None."""
    if hold is None:
        return None
    try:
        hold(workers)
    except LeaseLost as exc:
        return exc
    return None


def lost_report(lost: LeaseLost, duration_s: float, ranks: list[RankReport] | None = None) -> WorkerReport:
    """The report of a launch whose workers were stopped before they ran: the lease was lost."""
    return WorkerReport(exit=WorkerExit.LOST, error_type="LeaseLost", error_message=str(lost), duration_s=duration_s, ranks=list(ranks or []))


class WorkerTerminated(BaseException):
    """Raised inside a worker's function when the worker receives SIGTERM.

    The local backend installs the handler (Kubetorch raises its own ``PodTerminatedError``
    the same way). It derives from ``BaseException`` so ``except Exception`` in user code
    does not swallow it; catch it to write a last checkpoint, then re-raise.
    """


class Backend(Protocol):
    name: str
    workdir: Any  # a local folder holding the workers' result files, or None (remote workers)

    def run(
        self,
        fn: Callable[..., Any],
        args: tuple,
        kwargs: dict,
        *,
        env: dict[str, str],
        log: LogSink,
        on_start: StartSink | None = None,
        hold: HoldSink | None = None,
    ) -> WorkerReport: ...

    def make_gone(self, workers: Mapping[str, Any]) -> Gone:
        """Stop the workers that a stale lease recorded (``hold``'s mapping, possibly
        another process's or host's) and confirm they are gone; never raises."""
        ...

    def teardown(self) -> None: ...
