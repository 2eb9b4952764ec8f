"""Screenshots of the Dagster UI that the manual shows, taken from a real `dagster-webserver`
on a real instance by headless Chromium (Debian's `chromium`, installed by .ci/run):
the asset graph, a cost table, the budget plots and a training run.

The instance is the one a real `gpu-ops demo` leaves (the session's ``demo_run``, shared
with the demo test): a training run of `train_demo_model` through a preemption and the
bundled demo's month of cost partitions, opened as `make dev` opens it. Each picture must be a real page (a PNG
of the asked size with more than a blank screen's few colours). With
``GPU_OPS_SCREENSHOTS=docs/images`` the pictures are written there (how the ones in the
manual were made: ``make screenshots``); otherwise into the test's temporary folder."""

from __future__ import annotations

import os
import shutil
import signal
import struct
import subprocess
import zlib
from pathlib import Path

import pytest

from gpu_ops.domain.config import DEMO_CONFIG
from gpu_ops_tests.conftest import REPO, skip_or_fail
from gpu_ops_tests.demo.conftest import DemoRun
from gpu_ops_tests.training.test_ui_launch import dagster_ui_processes, gql, wait_for_location

WIDTH, HEIGHT = 1400, 1000
RUNS = "{ runsOrError(limit: 20) { ... on Runs { results { runId jobName status } } } }"


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if path := shutil.which(name):
            return path
    skip_or_fail("no headless Chromium on PATH (Debian: apt-get install chromium; .ci/run installs it)")
    raise AssertionError  # not reached


def png_size_and_colours(path: Path) -> tuple[int, int, int]:
    """Width, height and the number of distinct byte values of the decoded image data."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    width, height = struct.unpack(">II", data[16:24])
    idat, pos = b"", 8
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos : pos + 8])
        if kind == b"IDAT":
            idat += data[pos + 8 : pos + 8 + length]
        pos += 12 + length
    return width, height, len(set(zlib.decompress(idat)))


def shoot(browser: str, url: str, out: Path, attempts: int = 2, timeout_s: float = 90) -> None:
    """A screenshot of ``url``. Headless Chromium can hang on a page that keeps polling (the
    UI's GraphQL) when the machine is loaded (once in a suite run beside a busy process:
    120 s without an answer): the hung browser, with every process it started, is killed
    and a fresh one tries once more."""
    cmd = [browser, "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", f"--window-size={WIDTH},{HEIGHT}",
           "--virtual-time-budget=20000", "--run-all-compositor-stages-before-draw", f"--screenshot={out}", url]
    for _ in range(attempts):
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            _, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # its renderer and GPU processes too, not only the browser
            proc.communicate()
            continue
        assert proc.returncode == 0 and out.exists(), f"{' '.join(cmd)}\n{err[-2000:]}"
        return
    pytest.fail(f"headless Chromium gave no screenshot of {url} in {attempts} tries of {timeout_s:.0f} s")


def training_run_id(home: Path) -> str:
    """The demo's training run (``dg.materialize`` of train_demo_model) in the instance at ``home``."""
    import dagster as dg

    with dg.DagsterInstance.from_config(str(home)) as instance:
        (run,) = instance.get_runs(filters=dg.RunsFilter(job_name="__ephemeral_asset_job__"))
        return run.run_id


@pytest.mark.slow
def test_the_ui_pages_the_manual_shows(demo_run: DemoRun, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    browser = chromium()
    assert demo_run.returncode == 0, demo_run.stderr[-3000:]
    out_dir = Path(os.environ.get("GPU_OPS_SCREENSHOTS") or tmp_path / "shots")
    out_dir = out_dir if out_dir.is_absolute() else REPO / out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    # What `make dev` opens after `make run`: the demo's instance and the demo's configuration
    # (`make dev` names it in GPU_OPS_CONFIG), whose partitions are the days that have data
    # (usage.partitions_end).
    monkeypatch.setenv("GPU_OPS_HOME", str(demo_run.home))
    run_id = training_run_id(demo_run.home / "dagster_home")

    with dagster_ui_processes(tmp_path, DEMO_CONFIG, daemon=False, home=demo_run.home / "dagster_home") as (url, _home):
        wait_for_location(url, tmp_path)
        runs = gql(url, RUNS)["runsOrError"]["results"]
        assert {r["status"] for r in runs} == {"SUCCESS"}, runs
        gql(url, "mutation { setNuxSeen }")  # the UI's first-visit "join the community" dialog, dismissed as its Skip button does
        base = url.removesuffix("/graphql")
        group = f"{base}/locations/gpu_ops/asset-groups/gpu_cost"
        pages = {
            "asset-graph.png": group,
            "cost-table.png": f"{base}/assets/gpu_cost_attribution?view=events",  # latest day: top teams as a typed table
            "column-schema.png": f"{base}/assets/gpu_cost_attribution",  # every column with its description
            "budget-plots.png": f"{group}/lineage/gpu_budget_status",  # the selected asset's sidebar: one plot per budget figure
            "training-run.png": f"{base}/runs/{run_id}",
        }
        for name, page in pages.items():
            shoot(browser, page, out_dir / name)

    for name in pages:
        width, height, colours = png_size_and_colours(out_dir / name)
        assert (width, height) == (WIDTH, HEIGHT), name
        assert colours > 40, f"{name} looks blank ({colours} distinct values)"
