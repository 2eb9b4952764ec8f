"""`gpu-ops demo` (what `make run` runs), end to end as a real process."""

from __future__ import annotations

import re

import pytest

from gpu_ops_tests.conftest import cuda_available
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


@pytest.mark.slow
def test_the_main_job_prints_no_warning_and_says_a_simulated_cost_once(demo_run: DemoRun):
    """A quiet console: no Python warning (Dagster's `owners` BetaWarning was filtered, not
    fixed), the demo names its configuration (no "no configuration named"), the only Dagster
    WARNING is the injected preemption, and a CPU run's cost is said one way: simulated as
    the declared GPU (training.simulate_gpu_pricing), never also "not priced as a GPU"."""
    everything = demo_run.stdout + demo_run.stderr
    assert demo_run.returncode == 0, everything[-4000:]
    assert "Warning:" not in everything and "no configuration named" not in everything, everything[-4000:]
    warned = [line for line in everything.splitlines() if " - WARNING - " in line]
    assert len(warned) == 1 and "attempt 1 preempted" in warned[0], warned
    assert "not priced as a GPU" not in everything
    if not cuda_available():  # CI and this machine: the demo's t4 ran on CPU
        assert re.search(r"cost \$\d+\.\d\d \(simulated: 2 CPU attempt\(s\) priced as the declared 1x t4 \(training\.simulate_gpu_pricing\)\)", demo_run.stdout), demo_run.stdout
        assert re.search(r"training: 2 attempts, .*, \$\d+\.\d\d simulated, weights_sha256", demo_run.stdout), demo_run.stdout
