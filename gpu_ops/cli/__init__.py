"""`gpu-ops`: the console script.

Subcommands are imported only when invoked, so `gpu-ops cost ...` never pays for Dagster
or torch imports, and a broken optional dependency only breaks its own command.
"""

from __future__ import annotations

import importlib
import sys

import click

# name -> "module:attribute" of a click command or group
_COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("gpu_ops.demo.cli:demo", "Run the main job on the demo's configuration (SQLite, local backend)."),
    "cost": ("gpu_ops.cli.cost:cost", "GPU cost attribution, budgets and ROI over usage files (no Dagster import)."),
    "alerts": ("gpu_ops.cli.alerts:alerts", "Budget alert channels: `gpu-ops alerts test <channel>` sends a marked test notification."),
    "plan": ("gpu_ops.cli.compute:plan", "Print, as YAML, every Kubernetes object a GPU launch would create or patch."),
    "validate": ("gpu_ops.cli.validate:validate", "Check configuration, storage, cluster and GPU; say how to fix each problem."),
    "exporter": ("gpu_ops.cli.exporter:exporter", "Serve cost, budget, training and quota metrics for Prometheus (/metrics)."),
}


class _LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(_COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in _COMMANDS:
            return None
        module, _, attr = _COMMANDS[name][0].partition(":")
        return getattr(importlib.import_module(module), attr)

    def invoke(self, ctx: click.Context) -> object:
        # A database that is down or a secret variable that is unset: one clear paragraph
        # and exit 1, not a driver traceback.
        from gpu_ops.storage.errors import StorageError

        try:
            return super().invoke(ctx)
        except StorageError as exc:
            raise click.ClickException(str(exc)) from None
        except Exception as exc:
            # A ConfigError can only come from gpu_ops.domain.config once it is loaded: a command
            # that never reads a configuration (`cost attribution --usage`) never loads it
            # (nor pydantic) for this check.
            config = sys.modules.get("gpu_ops.domain.config")
            if config is not None and isinstance(exc, config.ConfigError):
                raise click.ClickException(str(exc)) from None
            raise

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        with formatter.section("Commands"):
            formatter.write_dl([(name, help_) for name, (_, help_) in sorted(_COMMANDS.items())])


@click.group(cls=_LazyGroup)
@click.version_option(package_name="gpu_ops")
def main() -> None:
    """GPU training as Dagster assets, with the GPU bill visible and under control."""

