"""Command-line value types shared by every ``gpu-ops`` command.

``click.FloatRange`` takes ``nan`` and ``inf`` (``float()`` parses both and neither is
below a minimum): a cache of ``nan`` seconds or a deadline of ``inf`` would start and
then misbehave. :class:`Finite` refuses them as a usage error naming the option, as the
configuration file refuses non-finite numbers.
"""

from __future__ import annotations

import math
from typing import Any

import click


class Finite(click.FloatRange):
    """A finite float within ``[min, max]`` (``min_open``/``max_open`` as FloatRange);
    ``unit`` names what it counts in the error (``seconds``)."""

    def __init__(self, min: float | None = None, max: float | None = None, *, min_open: bool = False, max_open: bool = False, unit: str = "") -> None:  # noqa: A002 - FloatRange's names
        super().__init__(min, max, min_open=min_open, max_open=max_open)
        self.unit = unit

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = click.FLOAT.convert(value, param, ctx)
        if not math.isfinite(number):
            what = f"a finite number of {self.unit}" if self.unit else "a finite number"
            self.fail(f"{value!r} is not {what}", param, ctx)
        return super().convert(number, param, ctx)


def seconds(min: float = 0.0, *, min_open: bool = False) -> Finite:  # noqa: A002 - FloatRange's name
    """A duration option's type: finite seconds, at least ``min`` (above it with ``min_open``)."""
    return Finite(min, min_open=min_open, unit="seconds")
