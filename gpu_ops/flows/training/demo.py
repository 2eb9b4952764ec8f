"""The demo training function behind `train_demo_model`.

A small MLP classifier on synthetic Gaussian clusters, deterministic end to end: a run
that is preempted and resumed ends with the same ``weights_sha256`` as one that is not.
Everything that decides the next step is in the checkpoint: model, optimizer and LR
schedule state, the torch RNG (dropout) and the data-loader position (epoch, batch;
each epoch's shuffle is seeded by the epoch number). One intra-op thread on CPU, since
the thread count changes floating-point reduction order; deterministic algorithms on
CUDA.

torch is imported inside the function only: loading the code location must not import it.
"""

from __future__ import annotations

import hashlib
import math
import os
from typing import Any

from gpu_ops.flows.training.context import TrainingContext


def weights_sha256(model: Any) -> str:
    """sha256 over parameter names and float bytes, in state-dict order."""
    h = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        h.update(name.encode())
        h.update(tensor.detach().to("cpu").contiguous().numpy().tobytes())
    return h.hexdigest()


def train_demo(
    ctx: TrainingContext,
    steps: int = 3000,
    batch_size: int = 128,
    features: int = 64,
    hidden: int = 512,
    classes: int = 10,
    samples: int = 8192,
    lr: float = 1e-3,
    seed: int = 0,
    threads: int = 1,
) -> dict[str, Any]:
    """Train the demo MLP for ``steps`` steps, checkpointing per the context's schedule."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # before CUDA initialises
    import torch
    from torch import nn

    torch.set_num_threads(threads)
    device = ctx.device()
    if device.startswith("cuda"):
        # warn_only: an op without a deterministic kernel on some GPU warns (and the
        # weights_sha256 contract may break there) rather than failing the demo.
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.backends.cudnn.benchmark = False

    # The dataset is a pure function of the seed: regenerated, never checkpointed.
    g = torch.Generator().manual_seed(seed)
    centers = torch.randn(classes, features, generator=g) * 0.35  # overlapping clusters: a real loss curve
    labels = torch.randint(0, classes, (samples,), generator=g)
    inputs = centers[labels] + torch.randn(samples, features, generator=g)
    inputs, labels = inputs.to(device), labels.to(device)
    batches_per_epoch = samples // batch_size

    torch.manual_seed(seed)
    model = nn.Sequential(
        nn.Linear(features, hidden),
        nn.ReLU(),
        nn.Dropout(0.1),
        nn.Linear(hidden, hidden),
        nn.ReLU(),
        nn.Dropout(0.1),
        nn.Linear(hidden, classes),
    ).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 0.5 * (1.0 + math.cos(math.pi * min(s, steps) / steps)))
    loss_fn = nn.CrossEntropyLoss()

    start = _resume(ctx, device, model, optimizer, schedule, batches_per_epoch)

    def snapshot(step: int) -> dict[str, Any]:
        epoch, batch = divmod(step, batches_per_epoch)
        return {
            "step": step,
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "schedule": schedule.state_dict(),
            "rng": torch.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state(device) if device.startswith("cuda") else None,
            "data": {"epoch": epoch, "batch": batch},
        }

    perm_epoch, perm = -1, None
    model.train()
    for step in range(start, steps):
        epoch, batch = divmod(step, batches_per_epoch)
        if epoch != perm_epoch:  # the loader's shuffle for this epoch
            perm = torch.randperm(samples, generator=torch.Generator().manual_seed(seed + 1 + epoch)).to(device)
            perm_epoch = epoch
        assert perm is not None  # set at the first step of every epoch
        idx = perm[batch * batch_size : (batch + 1) * batch_size]
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(inputs[idx]), labels[idx])
        loss.backward()
        optimizer.step()
        schedule.step()
        done = step + 1
        ctx.progress(done, steps, loss=float(loss.item()), lr=schedule.get_last_lr()[0])
        if ctx.should_checkpoint() or done == steps:
            ctx.checkpoint.save(snapshot(done), step=done)
        if ctx.preempted:
            return {"stopped_at": done}

    model.eval()
    with torch.no_grad():
        final_loss = float(loss_fn(model(inputs), labels).item())
        accuracy = float((model(inputs).argmax(dim=1) == labels).float().mean().item())
    return {
        "final_loss": final_loss,
        "accuracy": accuracy,
        "weights_sha256": weights_sha256(model),
        "steps": steps,
        "device": device,
        "parameters": sum(p.numel() for p in model.parameters()),
    }


def _resume(ctx: TrainingContext, device: str, model: Any, optimizer: Any, schedule: Any, batches_per_epoch: int) -> int:
    """Restore model, optimizer, schedule and RNG state from the latest checkpoint; the
    step to start from (0 without one). A checkpoint whose data position does not match
    its step is refused."""
    import torch

    state = ctx.checkpoint.load(map_location=device)
    if state is None:
        return 0
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    schedule.load_state_dict(state["schedule"])
    torch.set_rng_state(state["rng"].cpu())
    if device.startswith("cuda") and state.get("cuda_rng") is not None:
        torch.cuda.set_rng_state(state["cuda_rng"].cpu(), device)
    start: int = state["step"]
    if divmod(start, batches_per_epoch) != (state["data"]["epoch"], state["data"]["batch"]):
        raise RuntimeError(f"checkpoint data position {state['data']} does not match step {start}")
    return start
