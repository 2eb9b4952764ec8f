"""README.md and every page of the manual parse as CommonMark (markdown-it-py) with every
code fence closed where it was meant to close.

The README once had a closing fence with text after it (```` ``` `ctx.attempt`, ````):
CommonMark does not take that line as a closer, so everything down to the next fence
(the rest of Training and the Cost heading) rendered as one code block. Each fence is
checked to end on a real closing line, and no line inside a code block may look like a
fence marker, which is how such a mistake shows."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from markdown_it import MarkdownIt

from gpu_ops_tests.conftest import REPO

PAGES = sorted([REPO / "README.md", *(REPO / "docs").rglob("*.md")])


def fence_problems(text: str) -> list[str]:
    """Each unclosed or malformed fence, as ``line N: what``."""
    lines = text.splitlines()
    problems = []
    for token in MarkdownIt("commonmark").parse(text):
        if token.type != "fence" or token.map is None:
            continue
        start, end = token.map
        char, size = token.markup[0], len(token.markup)
        closer = lines[end - 1] if end - 1 > start else ""
        if not re.fullmatch(rf"\s*(> ?)*{re.escape(char)}{{{size},}}\s*", closer):
            problems.append(f"line {start + 1}: the fence opened here is never closed (it runs to line {end})")
        marker = re.compile(rf"^\s*{re.escape(char)}{{3,}}")  # ``` inside a ~~~ block is content
        for offset, line in enumerate(token.content.splitlines(), start=start + 2):
            if marker.match(line):
                problems.append(f"line {offset}: a fence marker inside a code block does not close it: {line.strip()[:60]!r}")
    return problems


def test_the_check_finds_a_closing_fence_with_text_after_it_and_an_unclosed_fence():
    swallowed = "# t\n\n```bash\nmake run\n``` and more text\n\n## Cost\n\n```yaml\na: 1\n```\n"
    assert fence_problems(swallowed) == [  # the fence of line 3 runs to line 11, Cost heading included
        "line 5: a fence marker inside a code block does not close it: '``` and more text'",
        "line 9: a fence marker inside a code block does not close it: '```yaml'",
    ]
    assert fence_problems("```python\nx = 1\n") == ["line 1: the fence opened here is never closed (it runs to line 2)"]
    assert fence_problems("para\n\n- item\n\n  ```bash\n  make\n  ```\n\n~~~~\n```\n~~~~\n") == []


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(REPO)) for p in PAGES])
def test_every_fence_is_closed(page: Path):
    assert fence_problems(page.read_text()) == [], page


def test_the_manual_has_the_pages_the_nav_promises():
    import yaml

    class _Loader(yaml.SafeLoader):
        pass

    _Loader.add_multi_constructor("", lambda loader, suffix, node: None)  # mkdocs' !!python/name tags
    nav = yaml.load((REPO / "mkdocs.yml").read_text(), Loader=_Loader)["nav"]

    def pages(items):
        for item in items:
            if isinstance(item, str):
                yield item
            else:
                for value in item.values():
                    yield from ([value] if isinstance(value, str) else pages(value))

    listed = set(pages(nav))
    assert {"reference/usage.md", "reference/inventory.md", "reference/prices.md", "reference/budgets.md", "reference/channels.md", "reference/config.md",
            "reference/cli.md", "benchmarks/cost.md", "benchmarks/training.md", "benchmarks/remote.md"} <= listed
    api_pages = {f"reference/api/{p.name}" for p in (REPO / "docs" / "reference" / "api").glob("*.md")}
    assert len(api_pages) >= 7 and api_pages <= listed  # the Python API, one page per area
    for page in listed:
        assert (REPO / "docs" / page).is_file(), page
    assert len((REPO / "README.md").read_text().splitlines()) < 200


def test_the_readme_python_snippet_builds_a_loadable_code_location():
    """The front page's code is run, not just shown: its Definitions load."""
    import dagster as dg

    text = (REPO / "README.md").read_text()
    snippets = [t.content for t in MarkdownIt("commonmark").parse(text) if t.type == "fence" and t.info.strip() == "python"]
    assert len(snippets) == 1
    namespace: dict = {"__name__": "readme_snippet"}
    exec(compile(snippets[0], "README.md", "exec"), namespace)
    repo = namespace["defs"].get_repository_def()
    assert isinstance(repo, dg.RepositoryDefinition) and repo.assets_defs_by_key.keys() == {dg.AssetKey("finetune")}
