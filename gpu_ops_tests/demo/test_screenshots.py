"""Screenshots of the Dagster UI that the manual shows, taken from a real `dagster-webserver`
on a real instance by headless Chromium (Debian's `chromium`, installed by .ci/run):
the asset graph, a cost table, the budget plots and a training run.

The instance holds a training run of `train_demo_model` and eight days of the bundled
demo's cost partitions (2026-10-20 … 2026-10-27). Each picture must be a real page (a PNG
of the asked size with more than a blank screen's few colours). With
``GPU_OPS_SCREENSHOTS=docs/images`` the pictures are written there (how the ones in the
manual were made: ``make screenshots``); otherwise into the test's temporary folder."""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import pytest

from gpu_ops_tests.conftest import REPO, skip_or_fail
from gpu_ops_tests.training.test_ui_launch import dagster_ui_processes, gql, wait_for_location

WIDTH, HEIGHT = 1400, 1000
DAYS = [f"2026-10-{d}" for d in range(20, 28)]
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


def shoot(browser: str, url: str, out: Path) -> None:
    cmd = [browser, "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", f"--window-size={WIDTH},{HEIGHT}",
           "--virtual-time-budget=20000", "--run-all-compositor-stages-before-draw", f"--screenshot={out}", url]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and out.exists(), f"{' '.join(cmd)}\n{done.stderr[-2000:]}"


def build_instance(home: Path, gpu_ops_home: Path, config: Path) -> str:
    """A training run and eight cost days in the instance at ``home``; the training run's id."""
    import dagster as dg

    from gpu_ops.cost.definitions import DAILY_JOB
    from gpu_ops.definitions import build_defs

    defs = build_defs(str(config))
    with dg.DagsterInstance.from_config(str(home)) as instance:
        trained = dg.materialize([defs.resolve_assets_def("train_demo_model")], instance=instance, raise_on_error=True)
        job = defs.resolve_job_def(DAILY_JOB)
        for day in DAYS:
            assert job.execute_in_process(partition_key=day, instance=instance, raise_on_error=False).success, day
        return trained.run_id


@pytest.mark.slow
def test_the_ui_pages_the_manual_shows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    browser = chromium()
    out_dir = Path(os.environ.get("GPU_OPS_SCREENSHOTS") or tmp_path / "shots")
    out_dir = out_dir if out_dir.is_absolute() else REPO / out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    # The bundled demo's data, with a short training run.
    demo = tmp_path / "demo"
    shutil.copytree(REPO / "gpu_ops" / "demo", demo, ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    config = demo / "gpu_ops.yaml"
    text = config.read_text().replace("training:\n", "training:\n  demo_steps: 300\n  demo_checkpoint_interval_s: 1\n", 1)
    # The cost partitions are the eight days materialized, so that the plots (one point per
    # partition) and the fill badges cover the days that have data.
    bounds = "  partitions_start: 2026-10-01\n  partitions_end: 2026-10-31"
    assert bounds in text
    config.write_text(text.replace(bounds, f"  partitions_start: {DAYS[0]}\n  partitions_end: {DAYS[-1]}", 1))
    monkeypatch.setenv("GPU_OPS_HOME", str(tmp_path / "gpu_ops_home"))
    monkeypatch.setenv("GPU_OPS_CONFIG", str(config))

    with dagster_ui_processes(tmp_path, config, daemon=False) as (url, home):
        run_id = build_instance(home, tmp_path / "gpu_ops_home", config)
        wait_for_location(url, tmp_path)
        runs = gql(url, RUNS)["runsOrError"]["results"]
        assert run_id in {r["runId"] for r in runs}
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
