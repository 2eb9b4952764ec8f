"""Materialize `train_demo_model` with an injected preemption (for `gpu-ops demo`).

A real run on the local backend: once training is under way (its first checkpoint
exists) the worker process gets a real signal, SIGKILL by default (a spot node lost
without notice) or SIGTERM (a spot notice); the step is retried and resumes from the
newest valid checkpoint. Returns the materialization's metadata.
"""

from __future__ import annotations

import os
import signal
import tempfile
import threading
from pathlib import Path
from typing import Any, Callable

import dagster as dg

from gpu_ops.domain import formatting as fmt
from gpu_ops.domain.config import load_config
from gpu_ops.dagster.location import build_defs
from gpu_ops.flows.compute.local import PIDFILE_DIR_ENV



class _Injector(threading.Thread):
    def __init__(self, pid_dir: Path, ckpt_dir: Path, sig: int, after_s: float):
        super().__init__(name="gpu-ops-preemption-injector", daemon=True)
        self.pid_dir, self.ckpt_dir, self.sig, self.after_s = pid_dir, ckpt_dir, sig, after_s
        # The run's first checkpoint is the first file not there before (not a file time
        # compared with this process's clock: a checkpoint of an earlier run is not it).
        self.before = set(self._checkpoints())
        self.killed_pid: int | None = None
        self.stop = threading.Event()

    def _checkpoints(self) -> list[Path]:
        return list(self.ckpt_dir.glob("*/ckpt-*.json"))

    def _first_checkpoint(self) -> bool:
        return any(p not in self.before for p in self._checkpoints())

    def run(self) -> None:
        while not self.stop.is_set() and not self._first_checkpoint():
            self.stop.wait(0.05)
        if self.stop.wait(self.after_s):
            return
        for pidfile in self.pid_dir.glob("*.rank0.pid"):
            try:
                pid = int(pidfile.read_text())
                os.kill(pid, self.sig)
                self.killed_pid = pid
                return
            except (OSError, ValueError):
                continue


def materialize_with_preemption(
    config_path: str | None = None,
    *,
    sig: int = signal.SIGKILL,
    after_s: float = 2.0,
    instance: Any = None,
    echo: Callable[[str], None] = print,
    run_config: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Run the demo asset, kill its worker ``after_s`` after the first checkpoint, and
    return the materialization metadata (``attempts``, ``preemptions``, ...)."""
    config = load_config(config_path)
    asset = build_defs(config_path).resolve_assets_def("train_demo_model")
    pid_dir = Path(tempfile.mkdtemp(prefix="gpu-ops-pids-"))
    previous = os.environ.get(PIDFILE_DIR_ENV)
    os.environ[PIDFILE_DIR_ENV] = str(pid_dir)
    injector = _Injector(pid_dir, Path(config.checkpoint_root()) / "train_demo_model", sig, after_s)
    injector.start()
    try:
        own = instance is None
        inst = dg.DagsterInstance.ephemeral() if own else instance
        try:
            result = dg.materialize([asset], instance=inst, raise_on_error=False, run_config=run_config)
        finally:
            if own:
                inst.dispose()
    finally:
        injector.stop.set()
        injector.join(timeout=5)
        if previous is None:
            os.environ.pop(PIDFILE_DIR_ENV, None)
        else:
            os.environ[PIDFILE_DIR_ENV] = previous
    if not result.success:
        raise RuntimeError(f"train_demo_model failed in run {result.run_id}; see its event log")
    mats = result.asset_materializations_for_node("train_demo_model")
    md = {k: getattr(v, "value", v) for k, v in mats[-1].metadata.items()}
    name = signal.Signals(sig).name
    injected = f"{name} to worker pid {injector.killed_pid}" if injector.killed_pid else "no signal (training ended first)"
    echo(
        f"train_demo_model: injected {injected}; {md.get('attempts')} attempt(s), {md.get('preemptions')} preemption(s), "
        f"final_loss {md.get('final_loss'):.4f}, {fmt.gpu_hours(md.get('gpu_hours'))}, cost {fmt.money(md.get('cost_usd'), str(md.get('currency', 'USD')))}, "
        f"weights_sha256 {str(md.get('weights_sha256'))[:16]}…"
    )
    md["run_id"] = result.run_id
    md["injected_pid"] = injector.killed_pid
    return md
