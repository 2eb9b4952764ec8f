"""A griffe extension for the Python API pages (docs/reference/api/).

Sphinx roles (``:class:`~gpu_ops.x.Y```, ``:func:`...```), which mkdocstrings shows as
they are written, become code (``Y``; the full path without ``~``). A private base class
(``_Model``) is not listed among a class's bases.

An attribute without a docstring takes its documentation from where this code base
writes it, so that it is listed (the pages render documented members only):

- ``Field(..., description="...")`` (pydantic and Dagster config fields): the description,
  and the shown value becomes the field's ``default`` (not the whole ``Field(...)`` call);
- the ``#`` comment lines right above it (``PreemptionPolicy``'s fields, ``GPU_POOL``), else the comment
  at the end of its line (``WorkerExit``'s members).

An attribute with neither stays undocumented, so the pages leave it out. An attribute set
in ``__init__`` is shown without the right side of its assignment."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from typing import Any

import griffe

PRAGMA = re.compile(r"(type|pragma|fmt):|noqa")  # comments for tools, not readers
ROLE = re.compile(r":(?:py:)?(?:class|func|meth|attr|mod|data|exc|obj):`(~?)([^`]+)`")


def plain_roles(text: str) -> str:
    """A role with ``~`` becomes its last name in backticks, one without its whole target."""
    return ROLE.sub(lambda m: f"`{m[2].rsplit('.', 1)[-1] if m[1] else m[2]}`", text)


def _field_call(node: ast.AST) -> ast.Call | None:
    value = getattr(node, "value", None)
    if isinstance(value, ast.Call) and (getattr(value.func, "id", None) or getattr(value.func, "attr", None)) == "Field":
        return value
    return None


def _keyword(call: ast.Call, name: str) -> ast.expr | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


def _comment_above(lines: list[str], lineno: int) -> str:
    """The ``#`` lines right above line ``lineno`` (1-based), without the ``#``."""
    block: list[str] = []
    index = lineno - 2
    while index >= 0 and lines[index].strip().startswith("#"):
        block.insert(0, lines[index].strip().lstrip("#").strip())
        index -= 1
    return " ".join(block)


def _comment_after(line: str) -> str:
    """The ``#`` comment that ends ``line`` (an enum member's ``ERROR = "error"  # ...``)."""
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(line.strip() + "\n").readline))
    except (tokenize.TokenError, SyntaxError):
        return ""
    comment = next((t.string.lstrip("#").strip() for t in tokens if t.type == tokenize.COMMENT), "")
    return "" if PRAGMA.match(comment) else comment


class ApiDocstrings(griffe.Extension):
    def on_instance(self, *, node: Any, obj: griffe.Object, agent: Any, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = plain_roles(obj.docstring.value)

    def on_class_instance(self, *, node: Any, cls: griffe.Class, agent: Any, **kwargs: Any) -> None:
        cls.bases = [base for base in cls.bases if not str(base).rsplit(".", 1)[-1].startswith("_")]

    def on_attribute_instance(self, *, node: Any, attr: griffe.Attribute, agent: Any, **kwargs: Any) -> None:
        if attr.labels == {"instance-attribute"}:
            attr.value = None  # `self.attempt = spec.attempt` in __init__: the right side says nothing to a reader
        if attr.docstring is not None or not isinstance(node, ast.AST):
            return
        text = ""
        call = _field_call(node)
        if call is not None:
            description = _keyword(call, "description")
            if isinstance(description, ast.Constant) and isinstance(description.value, str):
                text = description.value
            default = _keyword(call, "default") or (call.args[0] if call.args else None)
            factory = _keyword(call, "default_factory")
            attr.value = ast.unparse(default) if default is not None else f"{ast.unparse(factory)}()" if factory is not None else None
        if not text and attr.lineno is not None:
            lines = agent.code.splitlines()
            text = _comment_above(lines, attr.lineno) or (_comment_after(lines[attr.lineno - 1]) if attr.lineno == attr.endlineno else "")
        if text:
            attr.docstring = griffe.Docstring(text, parent=attr, parser=agent.docstring_parser, parser_options=agent.docstring_options)
