"""The code location's executor: Dagster's multiprocess executor whose step processes fork
from a forkserver that has the training step's modules imported (never torch).

Real runs on a persistent instance, each step a real process: under the default the step
process is a fork of the forkserver (its parent is not the run's process) and finds
``gpu_ops.storage.tables`` (pandas, SQLAlchemy) already imported; the forkserver ends with
the run, so a second run with another environment in the same process forks from a server
with its own environment; a run whose config names ``spawn`` gets Dagster's stock new
interpreter, ``in_process`` runs the step in this process.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import dagster as dg
import pytest

from gpu_ops.dagster.io_manager import ROW_LEVEL_READER
from gpu_ops.dagster.training.definitions import STEP_PRELOAD, training_executor

PROBE = "gpu_ops.storage.tables"  # preloaded; imported neither by this module nor by Dagster


@dg.op
def where_am_i() -> dict:
    return {
        "parent": os.getppid(), "preloaded": PROBE in sys.modules, "torch": "torch" in sys.modules,
        "marker": os.environ.get("GPU_OPS_EXECUTOR_TEST"),
    }


@dg.job(executor_def=training_executor())
def probe_job() -> None:
    where_am_i()


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def run(instance: dg.DagsterInstance, run_config: dict | None = None) -> dict:
    with dg.execute_job(dg.reconstructable(probe_job), instance=instance, run_config=run_config) as result:
        assert result.success
        return result.output_for_node("where_am_i")


def test_step_processes_fork_from_a_preloaded_forkserver_unless_the_run_asks_for_spawn(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert PROBE in STEP_PRELOAD
    with dg.DagsterInstance.local_temp(tempdir=str(tmp_path)) as instance:
        monkeypatch.setenv("GPU_OPS_EXECUTOR_TEST", "first")
        forked = run(instance)
        assert forked["parent"] != os.getpid()  # the forkserver's child, not the run's
        assert forked["preloaded"] and not forked["torch"] and forked["marker"] == "first"

        assert not alive(forked["parent"])  # the run's forkserver ended with its run
        monkeypatch.setenv("GPU_OPS_EXECUTOR_TEST", "second")  # the next run's forkserver has the next run's environment
        again = run(instance)
        assert again["marker"] == "second" and again["parent"] != forked["parent"] and not alive(again["parent"])

        # The run config is Dagster's default executor's.
        spawned = run(instance, {"execution": {"config": {"multiprocess": {"start_method": {"spawn": {}}}}}})
        assert spawned["parent"] == os.getpid() and spawned["marker"] == "second"
        assert not spawned["preloaded"]  # a new interpreter imports only what the job needs
        in_process = run(instance, {"execution": {"config": {"in_process": {}}}})
        assert in_process["parent"] == os.getppid()  # the step ran in this process


# Steps that read a row-level table whole (a day's million usage pieces) run one at a time:
# side by side on a small machine their peaks add up (issue 19: the daily job's memory).
def _reader(name: str, other: str) -> dg.OpDefinition:
    @dg.op(name=name, tags={ROW_LEVEL_READER: "true"})
    def reader(root: str) -> bool:
        """Running, wait for the other reader to start: True if it did while this one ran."""
        here, there = Path(root) / name, Path(root) / other
        here.touch()
        try:
            for _ in range(40):  # up to 2 s for the other reader to show up
                if there.exists():
                    return True
                time.sleep(0.05)
            return False
        finally:
            here.unlink()

    return reader


@dg.op
def scratch_dir() -> str:
    return os.environ["GPU_OPS_EXECUTOR_TEST_DIR"]


@dg.job(executor_def=training_executor())
def two_readers_job() -> None:
    root = scratch_dir()
    _reader("reader_a", "reader_b")(root)
    _reader("reader_b", "reader_a")(root)


def test_steps_that_read_a_row_level_table_whole_run_one_at_a_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPU_OPS_EXECUTOR_TEST_DIR", str(tmp_path))

    def overlapped(multiprocess: dict) -> bool:
        with dg.execute_job(dg.reconstructable(two_readers_job), instance=instance, run_config={"execution": {"config": {"multiprocess": multiprocess}}}) as result:
            assert result.success
            return result.output_for_node("reader_a") or result.output_for_node("reader_b")

    (tmp_path / "home").mkdir()
    with dg.DagsterInstance.local_temp(tempdir=str(tmp_path / "home")) as instance:
        assert not overlapped({"max_concurrent": 3})
        # A run config's own limits are the run's: then the two readers do run side by side.
        assert overlapped({"max_concurrent": 3, "tag_concurrency_limits": [{"key": ROW_LEVEL_READER, "limit": 2}]})
