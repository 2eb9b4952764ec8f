"""The observability pages follow the code: the metric table is the catalog's, and every
dashboard panel and every shipped alert is described."""

from __future__ import annotations

import yaml

from gpu_ops.cli.dashboards import DASHBOARDS, RULES_FILE, panels_markdown
from gpu_ops.domain.metrics import CATALOG, reference_markdown
from gpu_ops_tests.conftest import REPO

HOW_TO = REPO / "docs" / "how-to" / "observability.md"
REFERENCE = REPO / "docs" / "reference" / "metrics.md"


def test_the_metrics_reference_is_the_catalog() -> None:
    text = REFERENCE.read_text()
    assert reference_markdown() in text
    assert all(f"`{name}`" in text for name in CATALOG)


def test_every_dashboard_panel_and_alert_is_described() -> None:
    text = HOW_TO.read_text()
    assert panels_markdown() in text
    assert all(p.title in text for d in DASHBOARDS for p in d.panels)
    alerts = [r["alert"] for g in yaml.safe_load(RULES_FILE.read_text())["groups"] for r in g["rules"]]
    assert len(alerts) == 10 and all(f"`{a}`" in text for a in alerts)
