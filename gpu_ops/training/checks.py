"""`gpu-ops validate` check of the training flow: can checkpoints be written where configured?"""

from __future__ import annotations

import uuid
from pathlib import Path

from gpu_ops.config import GpuOpsConfig
from gpu_ops.validate import CheckResult, not_yet_created


def check_checkpoints(config: GpuOpsConfig) -> CheckResult:
    """Write, read back and delete a probe object under ``training.checkpoint_url``."""
    from gpu_ops.training.checkpoint import CheckpointStore, checkpoint_root

    url = checkpoint_root(config)
    if "://" not in url and (missing := not_yet_created("checkpoints", Path(url), "the first checkpoint", "training.checkpoint_url")) is not None:
        return missing  # validate writes nothing: a folder that is not there yet is not created to probe it
    fix = (
        "set training.checkpoint_url to a folder or fsspec URL the training workers can write "
        "(s3://bucket/prefix needs s3fs and credentials; a PVC path must be mounted in the workers)"
    )
    try:
        store = CheckpointStore(url, keep_last=1)
        probe = f"{store.root}/.gpu-ops-probe-{uuid.uuid4().hex[:8]}"
        store.fs.pipe_file(probe, b"ok")
        ok = store.fs.cat_file(probe) == b"ok"
        store.fs.rm(probe)
    except ImportError as exc:
        return CheckResult("checkpoints", "failed", f"{url}: the filesystem driver is missing ({exc})", f"pip install the fsspec driver for this URL; {fix}")
    except Exception as exc:  # any filesystem error is reported, not raised
        return CheckResult("checkpoints", "failed", f"{url}: cannot write a checkpoint: {type(exc).__name__}: {exc}", fix)
    if not ok:
        return CheckResult("checkpoints", "failed", f"{url}: a probe written there read back differently", fix)
    return CheckResult("checkpoints", "ok", f"{url} is writable (keep_last={config.training.keep_last})")
