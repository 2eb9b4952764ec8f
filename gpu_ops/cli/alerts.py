"""`gpu-ops alerts ...`: send a test notification through a configured channel.

No Dagster import on this path: it uses the same channel code as the alert job.
"""

from __future__ import annotations

import sys

import click

from gpu_ops.domain.config import ConfigError, load_config


@click.group(name="alerts")
def alerts() -> None:
    """Budget alert channels."""


@alerts.command(name="test")
@click.argument("channel")
@click.option("--config", "config_path", default=None, help="gpu_ops YAML file (default: $GPU_OPS_CONFIG, then the plain defaults).")
def test_channel(channel: str, config_path: str | None) -> None:
    """Send a clearly marked test notification through CHANNEL and report the outcome."""
    from gpu_ops.flows.alerts.channels import DeliverySettings, Redactor, send
    from gpu_ops.domain.alerts.model import test_alert

    try:
        config = load_config(config_path)
    except ConfigError as exc:
        raise click.ClickException(f"the configuration has problems:\n{exc}") from None
    if channel not in config.channels:
        known = ", ".join(sorted(config.channels)) or "none"
        raise click.ClickException(f"no channel named {channel!r} (configured channels: {known})")
    ch = config.channels[channel]
    alert = test_alert(channel, config.alerts.dagster_url)
    result = send(
        channel, ch, alert,
        settings=DeliverySettings.from_config(config.alerts),
        redact=Redactor(config.channels),
        log=lambda line: click.echo(f"  {line}", err=True),
    )
    if result.ok:
        click.echo(f"ok: test notification delivered through {ch.type} channel {channel!r} ({result.detail}; {result.attempts} attempt(s))")
        return
    kind = "permanent failure, not retried" if result.permanent else f"gave up after {result.attempts} attempt(s)"
    click.echo(f"FAILED: {ch.type} channel {channel!r}: {result.detail} ({kind})", err=True)
    sys.exit(1)
