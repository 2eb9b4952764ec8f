"""`gpu-ops demo` (what `make run` runs), end to end as a real process."""

from __future__ import annotations

import re

import pytest

from gpu_ops_tests.demo.conftest import DemoRun


@pytest.mark.slow
def test_the_main_job_trains_through_a_preemption_then_costs_a_month_and_alerts(demo_run: DemoRun):
    text = demo_run.stdout
    assert demo_run.returncode == 0, text + demo_run.stderr[-4000:]
    # training: the worker was really killed and the step resumed
    assert re.search(r"injected SIGKILL to worker pid \d+; 2 attempt\(s\), 1 preemption\(s\)", text), text
    # a month of partitions, with the alerts on the days the demo data crosses them
    assert "31 daily cost partitions (2026-10-01 … 2026-10-31)" in text
    for line in (
        "2026-10-13: nlp-monthly/2026-10-01/actual-50pct — sent",
        "2026-10-25: nlp-monthly/2026-10-01/actual-100pct — sent",
        "2026-10-26: nlp-monthly/2026-10-01/enforce-throttle/apply — sent",
        "2026-10-31: vision-monthly/2026-10-01/actual-100pct — sent",
    ):
        assert line in text
    assert text.count(" — sent") == 8 and "FAILED" not in text
    assert re.search(r"budget nlp-monthly: \$18,833\.01 of \$15,000\.00 \(125\.6%\)", text)
    assert "quarantined usage rows: 2" in text
    # a progress line per day, whether or not it alerted
    days = re.findall(r"^  \[\s*(\d+)/31\] (2026-10-\d\d): \$[\d,]+\.\d\d over [\d,]+\.\d{3} GPU-h; \d+ alert/enforcement run\(s\)$", text, re.M)
    assert [int(n) for n, _ in days] == list(range(1, 32)), text
    # figures read at a glance: no NaN, no unrounded floats
    assert "NaN" not in text and "nan" not in text.lower().split()
    assert not re.search(r"\d\.\d{5,}", text), re.findall(r".*\d\.\d{5,}.*", text)
    # what the UI would otherwise leave unexplained
    assert "budgets_within_limit on gpu_budget_status fails (ERROR) on purpose" in text
    assert "the others have no data" not in text, text  # the demo's partitions end with its data (usage.partitions_end)
    assert "quarantined on purpose (gpu_usage_quarantine, check quarantine_empty), in the partition(s) 2026-10-" in text
    # the persistent instance holds the runs for `make dev`
    assert (demo_run.home / "dagster_home").is_dir()
