"""The shipped alerting rules through promtool (Debian's `prometheus` package): they parse,
and each alert fires (and stays quiet) where rules_test.yml says."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from gpu_ops.observability.dashboards import RULES_FILE
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
