"""`gpu-ops demo`: the main job on the demo's configuration (SQLite, local backend)."""

from __future__ import annotations

import click


@click.command()
@click.option("--config", "config_path", type=click.Path(dir_okay=False), help="gpu_ops YAML file (default: the bundled demo)")
def demo(config_path: str | None) -> None:
    """Run the main job on the demo's configuration (SQLite, local backend)."""
    from gpu_ops.demo.run import run_demo

    raise SystemExit(run_demo(config_path))
