"""Helpers for a launched function that trains data-parallel, on either backend
(``init_process_group``, ``rank``, ``world_size``). Imported only inside workers; torch
is imported lazily.
"""

from __future__ import annotations

import datetime as dt
import os


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


def world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", "0"))


def is_distributed() -> bool:
    return world_size() > 1


def default_backend() -> str:
    """NCCL when every local rank can have a GPU of its own, else gloo.

    NCCL refuses two ranks on one device, so 2 local workers on a 1-GPU machine use gloo.
    """
    import torch

    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    return "nccl" if torch.cuda.is_available() and torch.cuda.device_count() >= local_world else "gloo"


def init_process_group(backend: str | None = None, timeout_s: float = 300.0) -> bool:
    """Join the process group from the environment; returns False when not distributed.

    ``timeout_s`` bounds how long a collective waits for a lost peer; the local backend
    also stops the survivors itself as soon as one rank dies.
    """
    if not is_distributed():
        return False
    import torch
    import torch.distributed as dist

    if dist.is_initialized():
        return True
    chosen = backend or default_backend()
    if chosen == "nccl":
        torch.cuda.set_device(local_rank() % torch.cuda.device_count())
    dist.init_process_group(backend=chosen, init_method="env://", rank=rank(), world_size=world_size(), timeout=dt.timedelta(seconds=timeout_s))
    return True


def destroy_process_group() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
