"""Training functions the tests run in real worker processes (module level: workers
import them by name). No torch: these exercise the machinery, the demo exercises torch."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

from gpu_ops.flows.training.context import TrainingContext


def counting(
    ctx: TrainingContext,
    steps: int = 40,
    step_s: float = 0.01,
    fail_on_attempt: int = 0,
    oom_on_attempts: int = 0,
    sigterm_self_on_attempts: int = 0,
    wait_for_notice: bool = False,
) -> dict[str, Any]:
    """A counter 'trained' step by step, checkpointed per the schedule.

    - ``fail_on_attempt``: raise a user error (ValueError) on that attempt;
    - ``oom_on_attempts``: raise MemoryError on the first N attempts (a fake OOM);
    - ``sigterm_self_on_attempts``: the process sends itself SIGTERM five steps into
      each of the first N attempts (a real signal, handled like a spot notice);
    - ``wait_for_notice``: on attempt 1, spin until a spot notice flags preemption.
    """
    state = ctx.checkpoint.load() or {"step": 0, "total": 0}
    if ctx.attempt == fail_on_attempt:
        raise ValueError("bad hyperparameter: learning rate must be positive")
    if ctx.attempt <= oom_on_attempts:
        raise MemoryError(f"fake OOM at memory {ctx.request['memory']}")
    if wait_for_notice and ctx.attempt == 1:
        deadline = time.monotonic() + 20
        while not ctx.preempted and time.monotonic() < deadline:
            time.sleep(0.05)
        ctx.checkpoint.save(state, step=state["step"])
        return {"gave_up_waiting": not ctx.preempted}
    first = state["step"]
    for step in range(first, steps):
        time.sleep(step_s)
        state = {"step": step + 1, "total": state["total"] + step}
        ctx.progress(step + 1, steps, running_sum=state["total"])
        if ctx.attempt <= sigterm_self_on_attempts and step + 1 == first + 5:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.2)  # the handler runs between bytecodes; let it
        if ctx.should_checkpoint() or step + 1 == steps:
            ctx.checkpoint.save(state, step=step + 1)
        if ctx.preempted:
            return {"stopped_at": step + 1}
    return {
        "final_loss": float(state["total"]),
        "memory": ctx.request["memory"],
        "capacity": ctx.request["capacity"],
        "attempt": ctx.attempt,
    }


def checkpoint_writer(url: str, payload_mb: int, keep_last: int) -> None:
    """Write checkpoints in a loop until killed (the kill-during-write test)."""
    from gpu_ops.flows.training.checkpoint import CheckpointStore

    store = CheckpointStore(url, keep_last)
    blob = os.urandom(payload_mb * 2**20)  # made once: the loop's time is spent writing
    i = 0
    while True:
        i += 1
        store.save({"i": i, "blob": blob}, step=i)


def ddp_train(ctx: TrainingContext, steps: int = 60, step_s: float = 0.03) -> dict[str, Any]:
    """Data-parallel training with gloo: rank 0 checkpoints, every rank resumes from it."""
    import hashlib

    import torch
    import torch.distributed as dist

    from gpu_ops.flows.compute.distributed import init_process_group

    torch.set_num_threads(1)
    init_process_group()
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    state = ctx.checkpoint.load()
    start = 0
    if state is not None:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start = state["step"]
    for step in range(start, steps):
        g = torch.Generator().manual_seed(1000 * step + ctx.rank)  # each rank's shard of the step
        x = torch.randn(16, 8, generator=g)
        y = x.sum(dim=1, keepdim=True)
        opt.zero_grad()
        loss = ((ddp(x) - y) ** 2).mean()
        loss.backward()
        opt.step()
        time.sleep(step_s)
        ctx.progress(step + 1, steps, loss=float(loss.item()))
        if ctx.should_checkpoint() or step + 1 == steps:
            ctx.checkpoint.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step + 1}, step=step + 1)
        if ctx.preempted:
            return {"stopped_at": step + 1}
    h = hashlib.sha256()
    for t in model.state_dict().values():
        h.update(t.detach().numpy().tobytes())
    # Every rank must hold the same weights: gather the digests and compare.
    digests: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(digests, h.hexdigest())
    dist.destroy_process_group()
    return {"weights_sha256": h.hexdigest(), "ranks_agree": len(set(digests)) == 1, "world_size": ctx.world_size}


def on_a_reported_gpu(ctx: TrainingContext, steps: int = 5) -> dict[str, Any]:
    """``counting`` on a worker that reports one A100 80GB, as a worker on a GPU node
    reports its device (the ``hardware`` event the launcher reads), after the real
    report of this machine: the cost flow's tests need a GPU row on a machine without one."""
    from gpu_ops.flows.training import hardware
    from gpu_ops.flows.training.context import emit

    emit("hardware", rank=ctx.rank, **hardware.Hardware("a100-80gb", 1, names=("NVIDIA A100-SXM4-80GB",), source="test").as_dict())
    return counting(ctx, steps=steps, step_s=0.01)
