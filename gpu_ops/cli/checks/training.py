"""`gpu-ops validate` check of the training flow: can checkpoints be written where configured?"""

from __future__ import annotations

import uuid
from pathlib import Path

from gpu_ops.domain.config import GpuOpsConfig
from gpu_ops.domain.formatting import redact_url, redact_urls
from gpu_ops.domain.check_result import CheckResult, folder_setting
from gpu_ops.flows.observability.hooks import Pricing
from gpu_ops.flows.observability.sender import drain
from gpu_ops.storage.tables import TableStore
from gpu_ops.storage.attempt_store import ATTEMPT_TABLE, AttemptStore
from gpu_ops.flows.training.checkpoint import CheckpointStore
from gpu_ops.flows.training.settle import owner_gone, settle_orphans


def check_checkpoints(config: GpuOpsConfig) -> CheckResult:
    """Write, read back and delete a probe object under ``training.checkpoint_url``."""
    url = config.checkpoint_root()
    shown = redact_url(url, keep_path=True)  # never a userinfo (sftp://user:pw@host/...) in a message
    local = url.removeprefix("file://") if url.startswith("file://") or "://" not in url else None
    if local is not None and (problem := folder_setting("checkpoints", Path(local), "training.checkpoint_url", "the first checkpoint")) is not None:
        return problem  # validate writes nothing: a folder that is not there yet is not created to probe it
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
        return CheckResult("checkpoints", "failed", f"{shown}: the filesystem driver is missing ({redact_urls(str(exc))})", f"pip install the fsspec driver for this URL; {fix}")
    except Exception as exc:  # any filesystem error is reported, not raised
        return CheckResult("checkpoints", "failed", f"{shown}: cannot write a checkpoint: {type(exc).__name__}: {redact_urls(str(exc))}", fix)
    if not ok:
        return CheckResult("checkpoints", "failed", f"{shown}: a probe written there read back differently", fix)
    return CheckResult("checkpoints", "ok", f"{shown} (training.checkpoint_url) is writable (keep_last={config.training.keep_last})")


def _orphans(config: GpuOpsConfig, settle: bool) -> tuple[list[str], str | None]:
    """Messages for attempts left in a non-final state by an owner that is gone (settled
    when ``settle``), or why none could be looked for. Reads only, unless ``settle``."""
    url = config.storage.resolved_url() if isinstance(config.storage.url, str) else ""
    if url.startswith("sqlite:///") and url != "sqlite:///:memory:" and not Path(url[len("sqlite:///"):]).exists():
        return [], "no training attempt recorded yet (the database does not exist)"
    store = TableStore.from_config(config)
    if not store.has_table(ATTEMPT_TABLE):
        return [], "no training attempt recorded yet"
    if settle:
        found = [s.message for s in settle_orphans(store, found_by="gpu-ops validate", pricing=Pricing.of(config))]
        sent = drain(store, deadline_s=config.training.telemetry_deadline_s, due_only=False)  # telemetry their owners could not send
        return found + ([sent.describe()] if sent.tried else []), None
    stale = [a for a, quiet_s in AttemptStore(store).open_attempts() if owner_gone(a, quiet_s, stale_s=60.0)]
    return [f"{a.run_id} {a.asset_key} attempt {a.attempt} is {a.state.value} and its owner (pid {a.owner.pid} on {a.owner.host}) is gone" for a in stale], None


def check_orphaned_attempts(config: GpuOpsConfig, settle: bool = False) -> CheckResult:
    """Attempts whose owner died (a killed step process or run worker) and nobody settled yet."""
    try:
        found, nothing = _orphans(config, settle)
    except Exception as exc:  # a storage problem is reported by the storage check too
        return CheckResult("orphaned_attempts", "failed", f"could not read the attempt records: {type(exc).__name__}: {exc}", "see the storage check")
    if nothing is not None:
        return CheckResult("orphaned_attempts", "ok", nothing)
    if settle:
        settled = [m for m in found if not m.startswith("telemetry: ")]
        return CheckResult("orphaned_attempts", "ok", f"settled {len(settled)} orphaned attempt(s)" + "".join(f"\n     - {m}" for m in found))
    if not found:
        return CheckResult("orphaned_attempts", "ok", "every attempt in a non-final state has a live owner")
    return CheckResult(
        "orphaned_attempts", "failed", f"{len(found)} attempt(s) left by an owner that is gone:" + "".join(f"\n     - {m}" for m in found),
        "gpu-ops validate --settle-orphans bills what ran, stops the workers, releases their leases and sends their telemetry "
        "(gpu_orphaned_attempts_sensor does the same every 30 s where the Dagster daemon runs)",
    )
