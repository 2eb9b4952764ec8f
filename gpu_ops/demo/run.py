"""The main job behind `gpu-ops demo` and `make run`."""

from __future__ import annotations

import click

from gpu_ops.config import load_config
from gpu_ops.validate import run_checks


def run_demo(config_path: str | None = None) -> int:
    config = load_config(config_path)
    click.echo(f"gpu_ops demo: config {config.source_path}")
    failed = False
    for r in run_checks(config):
        click.echo(f"  {r.status:7} {r.name}: {r.detail}")
        failed |= r.failed
    from gpu_ops.definitions import build_defs

    defs = build_defs(config_path)
    graph = defs.resolve_asset_graph()
    keys = sorted(k.to_user_string() for k in graph.get_all_asset_keys())
    click.echo(f"  code location loads: {len(keys)} assets {keys}")
    return 1 if failed else 0
