"""The suite's size in docs/development.md is read off the collection, not typed: a run of
the whole suite fails when the page names another number of tests than pytest collected.
Its wall-time table is written by benchmarks/suite.py; each row's counts must add up to
that size (a table left from another suite fails)."""

from __future__ import annotations

import os
import re

import pytest

from gpu_ops_tests.conftest import REPO

PAGE = REPO / "docs" / "development.md"
MEASURING = "GPU_OPS_MEASURING_SUITE"  # set by benchmarks/suite.py in the runs it measures
SIZE = re.compile(r"collects \*\*([\d,]+) tests\*\*")
FIGURES = re.compile(r"<!-- suite figures: written by benchmarks/suite.py -->\n(.*?)<!-- end of suite figures -->", re.S)
ROW = re.compile(r"^\| (?P<beside>[^|]+) \| (?P<load>[\d.]+ / [\d.]+ / [\d.]+) \| (?P<counts>[^|]+) \| \*\*(?P<wall>\d+:\d\d)\*\* \| (?P<budget>8:00|15:00), (?P<verdict>met|\*\*missed\*\*) \|$", re.M)


def documented_size(text: str) -> int:
    found = SIZE.findall(text)
    assert len(found) == 1, f"{PAGE.name} must say once how many tests the suite collects ('collects **N tests**'), found {found}"
    return int(found[0].replace(",", ""))


def test_the_size_is_read_from_the_page():
    assert documented_size("the suite collects **1,234 tests** today") == 1234
    with pytest.raises(AssertionError):
        documented_size("no number here")


def test_the_documented_suite_size_is_the_collected_one(request: pytest.FixtureRequest):
    config = request.config
    whole = config.args_source is pytest.Config.ArgsSource.TESTPATHS and not config.option.keyword and not config.option.markexpr
    if not whole:
        pytest.skip("only a run of the whole suite (no paths, -k or -m) knows its size")
    assert documented_size(PAGE.read_text()) == len(request.session.items), (
        f"{PAGE.relative_to(REPO)} names another suite size than the {len(request.session.items)} tests collected: update it"
    )
def test_the_xdist_groups_hold(tmp_path):
    # make test runs `-n 3 --dist loadgroup`: a module's tests share a group (its session
    # fixtures are built on one worker). With a pytest that pytest-xdist cannot mark, every group is silently
    # ignored (see pyproject.toml), so this asks a real two-worker run where tests went.
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "-v", "-p", "no:cacheprovider", "--basetemp", str(tmp_path / "t"), "gpu_ops_tests/cost/test_pricing.py"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )
    ran = re.findall(r"\[(gw\d)\] .*PASSED (\S+)", out.stdout)
    assert out.returncode == 0 and len(ran) > 10, out.stdout[-3000:] + out.stderr[-3000:]
    assert {worker for worker, _ in ran} == {ran[0][0]}, ran
    assert all(nodeid.endswith("@gpu_ops_tests.cost.test_pricing") for _, nodeid in ran), ran


def measured_rows(text: str) -> list[dict[str, str]]:
    block = FIGURES.findall(text)
    assert len(block) == 1, f"{PAGE.name} must hold one block of suite figures written by benchmarks/suite.py"
    rows = [m.groupdict() for m in ROW.finditer(block[0])]
    assert rows, f"the suite figures in {PAGE.name} hold no measured row"
    return rows


def test_the_measured_runs_are_of_this_suite_and_say_met_only_under_the_budget():
    if os.environ.get(MEASURING):
        pytest.skip("this run is benchmarks/suite.py measuring the suite: it writes the table afterwards")
    text = PAGE.read_text()
    size = documented_size(text)
    for row in measured_rows(text):
        counts = {what: int(n) for n, what in re.findall(r"(\d+) (\w+)", row["counts"])}
        assert sum(counts.values()) == size, f"a measured run of {counts} is not of the {size}-test suite the page names: run benchmarks/suite.py --write-docs"
        m, s = map(int, row["wall"].split(":"))
        # 8 minutes on quiet cores, 15 with busy processes beside the suite (issue 38)
        budget = 8 * 60 if "no busy process" in row["beside"] else 15 * 60
        assert row["budget"] == f"{budget // 60}:00", row
        met = counts.get("failed", 0) == counts.get("errors", 0) == 0 and m * 60 + s <= budget
        assert (row["verdict"] == "met") == met, row
