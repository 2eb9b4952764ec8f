"""The daily cost schedule requests yesterday's partition on every date: its tick time is
an input (``scheduled_execution_time``), never the wall clock. Month ends, the year end,
29 February and the first of a month. The job runs in one process; the other jobs keep
the code location's executor."""

from __future__ import annotations

import datetime as dt

import dagster as dg
import pytest

from gpu_ops.domain.config import BUNDLED_PRICES
from gpu_ops.dagster.cost.definitions import DAILY_JOB, DAILY_SCHEDULE

UTC = dt.timezone.utc

TICKS = [  # the 00:15 UTC tick -> the day that just ended
    (dt.datetime(2027, 1, 1, 0, 15, tzinfo=UTC), "2026-12-31"),
    (dt.datetime(2027, 3, 1, 0, 15, tzinfo=UTC), "2027-02-28"),
    (dt.datetime(2028, 3, 1, 0, 15, tzinfo=UTC), "2028-02-29"),
    (dt.datetime(2028, 2, 29, 0, 15, tzinfo=UTC), "2028-02-28"),
    (dt.datetime(2027, 2, 1, 0, 15, tzinfo=UTC), "2027-01-31"),
    (dt.datetime(2026, 12, 2, 0, 15, tzinfo=UTC), "2026-12-01"),
]


@pytest.fixture(scope="module")
def location(tmp_path_factory: pytest.TempPathFactory) -> dg.Definitions:
    """The schedule of the reference code location on a configuration whose partitions
    have no end (the demo's stop at its month)."""
    from gpu_ops.dagster.location import build_defs

    folder = tmp_path_factory.mktemp("schedule")
    (folder / "gpu_ops.yaml").write_text(
        f"storage: {{url: 'sqlite:///{folder / 'costs.db'}'}}\nprices: {BUNDLED_PRICES}\n"
        "usage: {sources: [{type: ledger}], partitions_start: '2026-10-01'}\n"
    )
    return build_defs(str(folder / "gpu_ops.yaml"))


@pytest.mark.parametrize(("tick", "day"), TICKS, ids=[d for _, d in TICKS])
def test_the_tick_requests_the_day_that_ended(location: dg.Definitions, tick: dt.datetime, day: str) -> None:
    # No instance: one closed here would stay behind in Dagster's process-wide
    # definitions-load context and break the next test that builds Definitions.
    # The repository is passed as the daemon passes it (the partition key is checked against it).
    schedule = location.resolve_schedule_def(DAILY_SCHEDULE)
    context = dg.build_schedule_context(scheduled_execution_time=tick, repository_def=location.get_repository_def())
    data = schedule.evaluate_tick(context)
    assert [r.partition_key for r in data.run_requests or []] == [day]
    assert schedule.job_name == DAILY_JOB


def test_the_scheduled_job_runs_in_one_process_and_training_keeps_its_executor(location: dg.Definitions) -> None:
    # The daily partition's steps hand each other stored tables and need no isolation:
    # one process (issue 39). Every other job of the location, training's first, keeps the
    # location's executor (step processes forked from the preloaded forkserver).
    assert location.resolve_schedule_def(DAILY_SCHEDULE).job.executor_def is dg.in_process_executor
    others = {j.name: j.executor_def for j in location.resolve_all_job_defs() if j.name != DAILY_JOB}
    assert "train_demo_model_job" in others
    assert all(e is location.executor for e in others.values()), others
    assert location.executor is not None and location.executor.executor_creation_fn.__name__ == "multi_or_in_process_forkserver"
