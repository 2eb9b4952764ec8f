"""The callable every backend runs: build a `TrainingContext` and call the function.

Backends receive :func:`run_training` (module level, so it pickles by reference and
Kubetorch can import it) and a plain-data :class:`WorkerSpec`. The training function
is found again by module and qualified name through :data:`_REGISTRY`: ``@gpu_asset``
replaces the module attribute with an ``AssetsDefinition``, so the function itself
cannot be pickled by reference.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any, Callable

from gpu_ops.flows.training import hardware
from gpu_ops.domain.compute.backend import WorkerTerminated
from gpu_ops.flows.training import notices
from gpu_ops.flows.training.context import (
    TrainingContext,
    TrainingPreempted,
    WorkerSpec,
    emit,
    install_sigterm_handler,
)
from gpu_ops.errors import TrainingFunctionError

# (module, qualname) -> the undecorated training function; filled by gpu_asset/gpu_op
# at import time in the parent and again in the worker when it imports the module.
_REGISTRY: dict[tuple[str, str], Callable[..., Any]] = {}


def register(fn: Callable[..., Any]) -> tuple[str, str]:
    """Remember ``fn`` so a worker can find it by name; rejects what a worker cannot import."""
    module, qualname = fn.__module__, fn.__qualname__
    if "<locals>" in qualname or "<lambda>" in qualname:
        raise TrainingFunctionError(
            f"{module}.{qualname}: training functions must be defined at module level (workers import them by name)"
        )
    if module == "__main__":
        raise TrainingFunctionError(
            f"{qualname} is defined in __main__: move it into an importable module (workers import it by module name)"
        )
    _REGISTRY[(module, qualname)] = fn
    return module, qualname


def import_root(module: str) -> str | None:
    """The sys.path entry ``module`` was imported from (the folder holding its top-level
    package), or None. Dagster puts a code location's working directory on sys.path only
    while it loads the code, so a local worker started later is told it explicitly."""
    mod = sys.modules.get(module)
    file = getattr(mod, "__file__", None)
    if not file:
        return None
    root = os.path.dirname(os.path.abspath(file))
    if os.path.basename(file).startswith("__init__."):
        root = os.path.dirname(root)
    for _ in range(module.count(".")):
        root = os.path.dirname(root)
    return root


def resolve(module: str, qualname: str) -> Callable[..., Any]:
    fn = _REGISTRY.get((module, qualname))
    if fn is not None:
        return fn
    mod = importlib.import_module(module)  # re-runs the decorators, filling the registry
    fn = _REGISTRY.get((module, qualname))
    if fn is not None:
        return fn
    obj: Any = mod
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
    if callable(obj) and not hasattr(obj, "op"):
        return obj
    raise TrainingFunctionError(f"cannot find the training function {module}.{qualname} in the worker")


def run_training(spec: WorkerSpec | dict[str, Any]) -> dict[str, Any]:
    """Worker entry point. Returns the function's value and a summary of the attempt.

    When SIGTERM or a preemption notice (see :mod:`gpu_ops.flows.training.notices`) arrived, the attempt ends with
    :class:`TrainingPreempted` (locally :class:`WorkerTerminated`) even if the function returned: the pod is going away and
    the next attempt resumes from the checkpoint the function saved.
    """
    if isinstance(spec, dict):
        spec = WorkerSpec(**spec)
    fn = resolve(spec.fn_module, spec.fn_qualname)
    ctx = TrainingContext(spec)
    # What this worker really has, reported before any work so that even an attempt
    # killed a moment later is recorded (and priced) as the hardware that ran it.
    ctx.hardware = hardware.detect()
    emit("hardware", rank=ctx.rank, **ctx.hardware.as_dict())
    restore = install_sigterm_handler(ctx)
    watchers = notices.start_watchers(ctx, spec.spot_notice, spec.spot_notice_poll_s, spec.kubernetes_notice)
    try:
        value = fn(ctx, **spec.params)
    finally:
        for watcher in watchers:
            watcher.stop()
    summary = ctx.summary()
    if ctx.preempted:
        last = ctx.checkpoint.last
        where = f"checkpoint #{last.seq} at step {last.step}" if last else "no checkpoint saved in this attempt"
        emit("stopped", reason=ctx.preempt_reason, **summary)
        sys.stdout.flush()
        restore()
        message = f"{ctx.preempt_reason}; {where}"
        if os.environ.get("GPU_OPS_WORKER") == "1":  # the local backend's worker: reported as SIGTERM (exit 143)
            raise WorkerTerminated(message)
        raise TrainingPreempted(message)
    restore()
    emit("finished", **summary)
    return {"value": value, "summary": summary}
