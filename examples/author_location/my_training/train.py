"""The training function: module level, so the GPU workers can import it by name.

torch is imported inside the function: loading the code location stays cheap.
"""

from __future__ import annotations

from typing import Any

from gpu_ops import TrainingContext


def finetune(ctx: TrainingContext, steps: int = 2000, hidden: int = 256, lr: float = 3e-3, seed: int = 0) -> dict[str, Any]:
    import torch

    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(seed)
    inputs = torch.randn(4096, 32, generator=g)
    targets = torch.sin(inputs @ torch.randn(32, 1, generator=g))  # a small regression task
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(32, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, 1)).to(ctx.device())
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    inputs, targets = inputs.to(ctx.device()), targets.to(ctx.device())

    start = 0
    state = ctx.checkpoint.load()  # the newest valid checkpoint of this asset's run, or None
    if state is not None:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = state["step"]

    for step in range(start, steps):
        batch = slice((step * 128) % 4096, (step * 128) % 4096 + 128)
        loss = torch.nn.functional.mse_loss(model(inputs[batch]), targets[batch])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        ctx.progress(step + 1, steps, loss=float(loss))
        if ctx.should_checkpoint() or step + 1 == steps:
            ctx.checkpoint.save({"step": step + 1, "model": model.state_dict(), "optimizer": optimizer.state_dict()}, step=step + 1)
        if ctx.preempted:  # SIGTERM or a spot notice: the checkpoint is saved, the next attempt resumes
            return {"stopped_at": step + 1}

    with torch.no_grad():
        final_loss = float(torch.nn.functional.mse_loss(model(inputs), targets))
    return {"final_loss": final_loss, "steps": steps}  # scalars become materialization metadata
