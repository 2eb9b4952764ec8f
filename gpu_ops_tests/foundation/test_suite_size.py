"""The suite's size in docs/development.md is read off the collection, not typed: a run of
the whole suite fails when the page names another number of tests than pytest collected.
(Its wall time and pass counts come from the measured run the page describes.)"""

from __future__ import annotations

import re

import pytest

from gpu_ops_tests.conftest import REPO

PAGE = REPO / "docs" / "development.md"
SIZE = re.compile(r"collects \*\*([\d,]+) tests\*\*")


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
