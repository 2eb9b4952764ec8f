"""Module-level functions the local-backend tests launch (workers import them by reference)."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path


def add(a: int, b: int, *, scale: int = 1) -> dict:
    print("adding", a, b, flush=True)
    print("to stderr", file=sys.stderr, flush=True)
    return {"sum": (a + b) * scale, "env": os.environ.get("GPU_OPS_TEST_VALUE"), "rank": os.environ["RANK"], "world": os.environ["WORLD_SIZE"]}


def crash(message: str) -> None:
    print("about to crash", flush=True)
    raise ValueError(message)


def run_out_of_memory() -> None:
    raise MemoryError("pretend allocation failure")


def sleep_forever(marker: str | None = None) -> None:
    """Prints, then sleeps; writes ``marker`` with 'terminated' when SIGTERM reaches it."""
    try:
        print("sleeping", flush=True)  # inside the try: the test signals as soon as it sees this
        while True:
            time.sleep(0.05)
    except BaseException as exc:
        if marker:
            Path(marker).write_text(type(exc).__name__)
        raise


def ignore_sigterm() -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    print("ignoring SIGTERM", flush=True)
    while True:
        time.sleep(0.05)


def exit_hard(code: int) -> None:
    os._exit(code)


def ddp_train(steps: int, out_dir: str, slow_s: float = 0.0) -> dict:
    """Tiny data-parallel training with gloo all-reduce; each rank saves its weights."""
    import torch
    import torch.distributed as dist

    from gpu_ops.flows.compute.distributed import destroy_process_group, init_process_group, rank, world_size

    init_process_group()
    torch.manual_seed(0)  # identical initial weights on every rank
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(100 + rank())  # different data per rank
    for step in range(steps):
        x = torch.randn(16, 4, generator=gen)
        y = x.sum(dim=1, keepdim=True)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
            p.grad /= world_size()
        opt.step()
        if slow_s:
            print(f"step {step} loss {loss.item():.4f}", flush=True)
            time.sleep(slow_s)
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    torch.save(flat, Path(out_dir) / f"weights-{rank()}.pt")
    destroy_process_group()
    return {"rank": rank(), "weights": flat.tolist()}


def getenv(name: str) -> str | None:
    return os.environ.get(name)


def cuda_out_of_memory() -> None:
    import torch

    raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")


def sleep_for(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


def tick(path: str) -> None:
    """Appends the time to ``path`` every 20 ms, forever, deaf to SIGTERM: only a kill
    stops it (what a training step that never looks at ``ctx.preempted`` looks like)."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    print("ticking", flush=True)
    with open(path, "a") as f:
        while True:
            f.write(f"{time.time()}\n")
            f.flush()
            time.sleep(0.02)


def fenced_loop(path: str, marker: str) -> str:
    """A training loop that looks at its fence as ``TrainingContext.preempted`` does: ticks
    every 20 ms; once the fence has lapsed, writes ``marker`` (its "checkpoint") and returns."""
    from gpu_ops.domain.compute.fence import FenceCheck

    check = FenceCheck(every_s=0.05)
    print("ticking", flush=True)
    with open(path, "a") as f:
        while True:
            reason = check.lapsed()
            if reason is not None:
                Path(marker).write_text(f"{time.time()} {reason}")
                return "stopped"
            f.write(f"{time.time()}\n")
            f.flush()
            time.sleep(0.02)


def tick_until(path: str, stop: str) -> int:
    """Like :func:`tick` (deaf to SIGTERM, a tick every 20 ms) until the file ``stop``
    exists; returns the number of ticks."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    n = 0
    with open(path, "a") as f:
        while not os.path.exists(stop):
            f.write(f"{time.time()}\n")
            f.flush()
            n += 1
            time.sleep(0.02)
    return n


def train_steps(path: str, steps: int, step_s: float) -> int:
    """A stand-in for training: ``steps`` steps of ``step_s``, each one's end appended to ``path``."""
    with open(path, "a") as f:
        for _ in range(steps):
            time.sleep(step_s)
            f.write(f"{time.time()}\n")
            f.flush()
    return steps
