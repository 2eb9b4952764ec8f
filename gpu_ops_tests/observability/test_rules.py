"""The shipped alerting rules through promtool (Debian's `prometheus` package): they parse,
and each alert fires (and stays quiet) where rules_test.yml says."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from gpu_ops.cli.dashboards import RULES_FILE
from gpu_ops_tests.conftest import skip_or_fail

HERE = Path(__file__).parent


@pytest.fixture(scope="session")  # once per worker (see conftest.py)
def promtool() -> str:
    binary = shutil.which("promtool")
    if binary is None:
        skip_or_fail("promtool is not installed (apt-get install -y prometheus)")
    assert binary is not None
    return binary


def test_promtool_checks_the_rule_file(promtool: str) -> None:
    done = subprocess.run([promtool, "check", "rules", str(RULES_FILE)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS: 10 rules found" in done.stdout


def test_promtool_unit_tests_of_every_alert_pass(promtool: str, tmp_path: Path) -> None:
    tests = tmp_path / "rules_test.yml"
    tests.write_text((HERE / "rules_test.yml").read_text().replace("  - RULES", f"  - {RULES_FILE}"))
    done = subprocess.run([promtool, "test", "rules", str(tests)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_a_wrong_expectation_fails_the_unit_tests(promtool: str, tmp_path: Path) -> None:
    """promtool really compares: the quota alert expected too early is a failure."""
    text = (HERE / "rules_test.yml").read_text().replace("  - RULES", f"  - {RULES_FILE}")
    tests = tmp_path / "rules_test.yml"
    tests.write_text(text.replace("      - eval_time: 40m\n        alertname: GpuOpsQuotaStarved", "      - eval_time: 20m\n        alertname: GpuOpsQuotaStarved"))
    done = subprocess.run([promtool, "test", "rules", str(tests)], capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "GpuOpsQuotaStarved" in done.stdout + done.stderr


def test_a_critical_threshold_crossed_fires_the_critical_alert_not_the_warning(promtool: str, tmp_path: Path) -> None:
    """The issue's case end to end: a budget of $1,000 with a 50 % threshold of severity
    critical and spend of $570 (57 %, status warning: the amount is not reached). Its status
    row as the budget asset evaluates it, stored, read by the exporter's reader; the series
    it serves are promtool's input: GpuOpsBudgetExceeded fires (critical), the warning does not."""
    import datetime as dt

    import pandas as pd

    from gpu_ops.domain.config import Budget
    from gpu_ops.flows.cost.budgets import daily_costs, evaluate_budgets
    from gpu_ops.flows.cost.pipeline import price_window
    from gpu_ops.domain.metrics import families
    from gpu_ops.flows.observability.readers import Reader
    from gpu_ops.storage.tables import TableStore
    from gpu_ops_tests.cost.helpers import MATRIX, raw, row

    budget = Budget(name="nlp-monthly", scope={"team": "nlp"}, amount_usd=1000, thresholds=[{"percent": 50, "severity": "critical"}, {"percent": 80}])
    start = pd.Timestamp("2026-10-01T01:00:00Z")
    usage = raw([row(start.isoformat(), (start + pd.Timedelta(hours=570 / 160)).isoformat(), gpu_count=40)])  # 40 A100s at $4: $160 an hour
    day = dt.date(2026, 10, 1)
    end = pd.Timestamp("2026-10-02", tz="UTC")
    pieces = price_window(usage, None, MATRIX, pd.Timestamp("2026-10-01", tz="UTC"), end, end).rows
    status = evaluate_budgets([budget], daily_costs(pieces, [day]), day, end)
    assert status.loc[0, "percent_used"] == pytest.approx(57.0) and status.loc[0, "status"] == "warning" and status.loc[0, "severity"] == "critical"
    store = TableStore(f"sqlite:///{tmp_path / 'costs.db'}")
    store.write("gpu_budget_status", status, partition_keys=[day.isoformat()])
    snap = Reader(store).read()
    served = [(f.metric.name, dict(zip(f.metric.labels, labels)), v) for f in families(snap) if f.metric.name.startswith("gpu_ops_budget_") for labels, v in f.samples]
    selectors = [(name + "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}", value) for name, labels, value in served]
    series = "".join(f"      - series: '{selector}'\n        values: '{value:g}x10'\n" for selector, value in selectors)
    expected = (
        "          - exp_labels: {severity: critical, budget: nlp-monthly, period: monthly}\n"
        "            exp_annotations:\n"
        "              summary: 'GPU budget nlp-monthly is past a critical threshold'\n"
        "              description: 'Budget nlp-monthly (monthly) has crossed a critical threshold of its amount (or spent all of it).'\n"
    )
    (tmp_path / "case.yml").write_text(
        f"rule_files:\n  - {RULES_FILE}\nevaluation_interval: 1m\ntests:\n  - interval: 1m\n    input_series:\n{series}"
        "    alert_rule_test:\n"
        f"      - eval_time: 5m\n        alertname: GpuOpsBudgetExceeded\n        exp_alerts:\n{expected}"
        "      - eval_time: 5m\n        alertname: GpuOpsBudgetWarning\n        exp_alerts: []\n"
    )
    done = subprocess.run([promtool, "test", "rules", str(tmp_path / "case.yml")], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr + (tmp_path / "case.yml").read_text()
