"""The demo training function in-process: resume determinism on CPU, and on CUDA where a
GPU exists (skipped cleanly without one)."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path
from typing import Any

import pytest

from gpu_ops.flows.training.context import TrainingContext, WorkerSpec

STEPS = 120


class PreemptAt(TrainingContext):
    """A context that receives a preemption notice at a given step."""

    def __init__(self, spec: WorkerSpec, at: int | None):
        super().__init__(spec)
        self.at = at

    def progress(self, step: int, total: int | None = None, **metrics: Any) -> None:
        super().progress(step, total, **metrics)
        if step == self.at:
            self.notify_preempted("test notice")


def run(folder: Path, attempt: int, at: int | None, **params: Any) -> tuple[dict[str, Any], PreemptAt]:
    from gpu_ops.flows.training.demo import train_demo

    spec = WorkerSpec("m", "f", "r", "train_demo_model", attempt, str(folder), checkpoint_interval=1000.0, progress_every_s=1e9)
    ctx = PreemptAt(spec, at)
    with contextlib.redirect_stdout(io.StringIO()):
        out = train_demo(ctx, steps=STEPS, **params)
    return out, ctx


def check_resume(tmp_path: Path, **params: Any) -> None:
    straight, _ = run(tmp_path / "a", 1, None, **params)
    # Preempted twice (one mid-epoch: 64 batches per epoch), resumed each time.
    first, ctx1 = run(tmp_path / "b", 1, 37, **params)
    assert first == {"stopped_at": 37} and ctx1.checkpoint.last.step == 37
    second, _ = run(tmp_path / "b", 2, 90, **params)
    assert second == {"stopped_at": 90}
    final, ctx3 = run(tmp_path / "b", 3, None, **params)
    assert ctx3.checkpoint.resumed_from.step == 90
    assert final["weights_sha256"] == straight["weights_sha256"]
    assert final["final_loss"] == straight["final_loss"]


def test_resumed_demo_matches_uninterrupted_on_cpu(tmp_path: Path) -> None:
    check_resume(tmp_path)


@pytest.mark.gpu
def test_resumed_demo_matches_uninterrupted_on_cuda(tmp_path: Path, cuda: None) -> None:
    out, _ = run(tmp_path / "probe", 1, None)
    assert out["device"].startswith("cuda")
    check_resume(tmp_path)
