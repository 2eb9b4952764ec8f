"""The sensor against what the real cost assets write (not hand-made status rows)."""

from __future__ import annotations

import dagster as dg
import yaml

from gpu_ops.domain.config import DEMO_CONFIG
from gpu_ops.dagster.cost.assets import build_assets
from gpu_ops.dagster.io_manager import TableIOManager

from .conftest import SensorHarness

DEMO = DEMO_CONFIG.parent


def test_alerts_from_materialized_budget_status(tmp_path, dagster_instance, receiver, monkeypatch):
    hook = receiver()
    monkeypatch.setenv("HOOK_SECRET", "integration-secret")
    url = f"sqlite:///{tmp_path / 'costs.db'}"
    path = tmp_path / "gpu_ops.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "storage": {"url": url},
                "prices": str(DEMO / "prices.yaml"),
                "usage": {"sources": [{"type": "file", "path": str(DEMO / "usage" / "*.csv")}], "group_by": ["team", "project"]},
                # Tiny amounts, so that one demo day crosses every actual threshold.
                "budgets": [
                    {"name": "nlp-tiny", "scope": {"team": "nlp"}, "amount_usd": 10, "thresholds": [{"percent": 50}, {"percent": 120, "basis": "forecast"}], "channels": ["audit"]},
                    {"name": "vision-huge", "scope": {"team": "vision"}, "amount_usd": 10_000_000, "thresholds": [{"percent": 80}], "channels": ["audit"]},
                ],
                "channels": {"audit": {"type": "webhook", "url": hook.url + "/hook", "secret": {"env": "HOOK_SECRET"}}},
                "alerts": {"delivery_attempts": 2, "delivery_backoff_s": 0.05, "delivery_timeout_s": 2, "run_retry_delay_s": 0.1},
            }
        )
    )
    h = SensorHarness(dagster_instance, path)
    assets, _ = build_assets(h.config)
    resources = {"gpu_ops": h.settings, "table_io_manager": TableIOManager(url=url)}
    result = dg.materialize(assets, partition_key="2026-10-01", resources=resources, instance=dagster_instance, selection=["gpu_usage", "gpu_usage_quarantine", "gpu_cost_attribution", "gpu_cost_daily", "gpu_budget_status"])
    assert result.success

    requests, results = h.tick(force=False)  # due: a new gpu_budget_status materialization
    # Day one of the period: the forecast is withheld (minimum history), so only actual fires.
    assert [r.run_key for r in requests] == ["nlp-tiny/2026-10-01/actual-50pct"]
    assert all(r.success for r in results)
    body = hook.acknowledged[0].json()
    assert body["budget"] == "nlp-tiny" and body["period_start"] == "2026-10-01" and body["period_end"] == "2026-11-01"
    assert body["forecast_usd"] is None and body["spend_usd"] > 5
    assert body["top_spenders"] and all(s["name"].startswith("project=") for s in body["top_spenders"])
    assert sum(s["cost_usd"] for s in body["top_spenders"]) <= body["spend_usd"] + 0.01

    requests, _ = h.tick()
    assert requests == []
