"""A MkDocs hook for the Python API pages (docs/reference/api/).

- Each ``::: name`` line of those pages gets :data:`API_OPTIONS`: one heading per object
  (``h2``, members below it), its short name, and only documented members
  (``show_if_no_docstring: false``; mkdocs.yml's default shows every field, which the
  configuration pages want). A directive there takes no options block of its own.
- Their tables of contents list the page's objects, not each of their members: the page
  keeps every member's heading and anchor, and search still indexes them (it reads the
  whole table before this hook prunes it)."""

from __future__ import annotations

import re
from typing import Any

from mkdocs.plugins import event_priority

API_PAGES = "reference/api/"
API_OPTIONS = {
    "heading_level": 2,
    "show_root_full_path": False,
    "show_symbol_type_heading": True,
    "show_symbol_type_toc": True,
    "show_if_no_docstring": False,
}
DIRECTIVE = re.compile(r"^::: (\S+)[ \t]*$", re.M)


def with_api_options(markdown: str) -> str:
    block = "".join(f"\n      {key}: {str(value).lower()}" for key, value in API_OPTIONS.items())
    return DIRECTIVE.sub(lambda m: f"::: {m[1]}\n    options:{block}", markdown)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    return with_api_options(markdown) if page.file.src_uri.startswith(API_PAGES) else markdown


@event_priority(-100)  # after the search plugin's on_page_context, which reads the full table
def on_page_context(context: dict[str, Any], page: Any, config: Any, nav: Any) -> dict[str, Any]:
    if page.file.src_uri.startswith(API_PAGES):
        for title in page.toc.items:  # the page's h1, its objects under it
            for obj in title.children:
                obj.children = []
    return context
