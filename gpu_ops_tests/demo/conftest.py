"""One real `gpu-ops demo` run (what `make run` runs) for the whole session: the demo
test reads its output, the screenshot test opens the instance it leaves in the UI (what
`make dev` shows after `make run`). Both tests are in the same xdist group, so the demo
runs once, on one worker."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class DemoRun:
    returncode: int
    stdout: str
    stderr: str
    home: Path  # GPU_OPS_HOME: the cost tables, checkpoints and the Dagster instance (dagster_home)


@pytest.fixture(scope="session")
def demo_run(tmp_path_factory: pytest.TempPathFactory) -> DemoRun:
    home = tmp_path_factory.mktemp("demo") / "home"
    env = {**os.environ, "GPU_OPS_HOME": str(home), "PYTHONUNBUFFERED": "1"}
    env.pop("GPU_OPS_CONFIG", None)
    out = subprocess.run(
        [str(Path(sys.executable).parent / "gpu-ops"), "demo"], cwd=REPO, env=env, capture_output=True, text=True, timeout=600
    )
    return DemoRun(out.returncode, out.stdout, out.stderr, home)
