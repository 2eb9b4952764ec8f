"""A small config for real training runs of train_demo_model (the demo's data, a short run)."""

from __future__ import annotations

from pathlib import Path

import yaml

from gpu_ops.domain.config import DEMO_CONFIG

DEMO = DEMO_CONFIG.parent
QUIET = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}


def write_config(folder: Path, *, ledger_only: bool = False) -> Path:
    cfg = yaml.safe_load(DEMO_CONFIG.read_text())
    cfg["storage"] = {"url": f"sqlite:///{folder / 'costs.db'}"}
    cfg["prices"] = str(DEMO / "prices.yaml")
    cfg["usage"]["sources"] = [{"type": "ledger"}] + ([] if ledger_only else [{"type": "file", "path": str(DEMO / "usage" / "*.csv")}])
    if ledger_only:
        cfg["usage"].pop("inventory", None)
    else:
        cfg["usage"]["inventory"] = {"type": "file", "path": str(DEMO / "inventory.csv")}
    # A generous telemetry deadline: these tests check what a healthy collector receives, on a loaded machine.
    cfg["training"].update(checkpoint_url=str(folder / "checkpoints"), demo_steps=900, demo_checkpoint_interval_s=0.5, retry_backoff_s=0.0, telemetry_deadline_s=10.0)
    path = folder / "gpu_ops.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path
