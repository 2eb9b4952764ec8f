"""Every number a `gpu-ops` command takes on its command line is checked where it is read:
a float option is :class:`gpu_ops.cli.types.Finite` (``nan``, ``inf`` and ``-inf`` are
usage errors naming the option, as the configuration file refuses non-finite numbers), and
each duration option (``--*-seconds``) says so in its unit."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from gpu_ops.cli import main
from gpu_ops.cli.types import Finite


def options(group: click.Group, ctx: click.Context, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], click.Option]]:
    out = []
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        assert command is not None
        if isinstance(command, click.Group):
            out += options(command, ctx, (*path, name))
        else:
            out += [((*path, name), p) for p in command.params if isinstance(p, click.Option)]
    return out


ALL = options(main, click.Context(main))
NUMBERS = [(path, opt) for path, opt in ALL if isinstance(opt.type, click.types.FloatParamType)]


def test_every_float_option_of_every_command_is_finite() -> None:
    assert {"exporter"} <= {path[0] for path, _ in NUMBERS} and len(ALL) > 40
    assert [(path, opt.name) for path, opt in NUMBERS if not isinstance(opt.type, Finite)] == []
    durations = [(path, opt) for path, opt in ALL if opt.name and opt.name.endswith("_seconds")]
    assert len(durations) >= 3 and all(isinstance(opt.type, Finite) and opt.type.unit == "seconds" for _, opt in durations)


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "Infinity", "-NaN"])
@pytest.mark.parametrize(("path", "option"), [(path, opt) for path, opt in NUMBERS], ids=lambda x: "-".join(x) if isinstance(x, tuple) else x.opts[0])
def test_a_non_finite_value_is_a_usage_error_naming_the_option(path: tuple[str, ...], option: click.Option, value: str) -> None:
    flag = option.opts[0]
    required = {("plan",): ["--gpu-type", "h100"]}.get(path, [])
    out = CliRunner().invoke(main, [*path, *required, f"{flag}={value}"])
    assert out.exit_code == 2 and isinstance(out.exception, SystemExit), out.output
    assert flag in out.output and "is not a finite number" in out.output, out.output
