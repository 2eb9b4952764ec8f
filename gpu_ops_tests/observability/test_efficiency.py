"""The efficiency dashboard with DCGM measurements: a real Prometheus scrapes a loopback
dcgm-exporter endpoint and the gpu_ops exporter; today's partition is materialized through
the real cost assets with ``usage.utilization`` on that Prometheus; every query of the
efficiency dashboard then returns data, and the efficiency series equal the attribution
table's figures."""

from __future__ import annotations

import datetime as dt
import json
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

from gpu_ops.cli.dashboards import panel_queries
from gpu_ops_tests.conftest import REPO
from gpu_ops_tests.http_receiver import QuietHandler, reply, serving
from gpu_ops_tests.observability.servers import Exporter, free_port, prometheus, query, series, wait_for_scrape_after
from gpu_ops_tests.waiting import wait_until

pytestmark = pytest.mark.slow
DASHBOARD = REPO / "helm" / "gpu-ops" / "dashboards" / "gpu-ops-efficiency.json"
# (namespace, pod, gpu) -> engine-active ratio (constant while served)
ACTIVE = {("ml", "bert-0", "0"): 0.8, ("ml", "llama-0", "1"): 0.5}


def dcgm_text() -> str:
    lines = ["# TYPE DCGM_FI_PROF_GR_ENGINE_ACTIVE gauge", "# TYPE DCGM_FI_DEV_FB_USED gauge", "# TYPE DCGM_FI_DEV_FB_FREE gauge"]
    for (ns, pod, gpu), active in ACTIVE.items():
        labels = f'gpu="{gpu}",UUID="GPU-{gpu}",modelName="NVIDIA A100-SXM4-80GB",Hostname="n1",container="c",namespace="{ns}",pod="{pod}"'
        lines += [f"DCGM_FI_PROF_GR_ENGINE_ACTIVE{{{labels}}} {active}", f"DCGM_FI_DEV_FB_USED{{{labels}}} 1000", f"DCGM_FI_DEV_FB_FREE{{{labels}}} 80920"]
    return "\n".join(lines) + "\n"


class Dcgm(QuietHandler):
    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        reply(self, 200, dcgm_text().encode(), "text/plain; version=0.0.4")


def test_the_efficiency_dashboard_answers_from_dcgm_measured_tables(tmp_path: Path) -> None:
    import dagster as dg

    from gpu_ops.domain.config import load_config
    from gpu_ops.dagster.cost.assets import build_assets
    from gpu_ops.dagster.resources import GpuOpsSettings
    from gpu_ops.dagster.io_manager import TableIOManager
    from gpu_ops.storage.tables import TableStore

    port = free_port()
    target = f"127.0.0.1:{port}"
    with serving(Dcgm) as dcgm, prometheus(tmp_path, [target, dcgm.removeprefix("http://")], []) as url:
        assert wait_until(lambda: query(url, "DCGM_FI_PROF_GR_ENGINE_ACTIVE"), timeout=60, every=0.2)  # scraping has begun
        t0 = time.time()
        time.sleep(9)  # let Prometheus gather the usage interval's samples (one a second), [t0 + 1, t0 + 8)
        day = dt.datetime.fromtimestamp(t0, dt.timezone.utc).date()
        stamp = lambda s: pd.Timestamp(t0 + s, unit="s", tz="UTC").isoformat()  # noqa: E731
        pd.DataFrame([
            {"start": stamp(1), "end": stamp(8), "namespace": ns, "pod": pod, "node": "n1", "team": team, "project": "p", "gpu_type": "a100-80gb",
             "gpu_count": 1, "capacity_type": "on-demand", "sharing": "none", "gpu_share": 1}
            for (ns, pod, _), team in zip(ACTIVE, ("nlp", "vision"))
        ]).to_csv(tmp_path / "usage.csv", index=False)
        db = f"sqlite:///{tmp_path / 'costs.db'}"
        cfg = {
            "storage": {"url": db}, "prices": {"source": "test", "as_of": "2026-10-01", "gpus": {"a100-80gb": {"on-demand": 3.5}}},
            "usage": {"sources": [{"type": "file", "path": "usage.csv"}], "partitions_start": day.isoformat(), "group_by": ["team", "project"],
                      "utilization": {"type": "prometheus", "url": url, "step": "1s", "scrape_interval": "1s"}},
        }
        (tmp_path / "gpu_ops.yaml").write_text(yaml.safe_dump(cfg))
        assets, _ = build_assets(load_config(tmp_path / "gpu_ops.yaml"))
        resources = {"gpu_ops": GpuOpsSettings(config_path=str(tmp_path / "gpu_ops.yaml")), "table_io_manager": TableIOManager(url=db)}
        # Today's partition exists from tomorrow on: load partitions as of tomorrow (the asset clips the day at the real now).
        with dg.DagsterInstance.ephemeral() as instance, dg.partition_loading_context(effective_dt=dt.datetime.now(dt.timezone.utc) + dt.timedelta(days=1)):
            assert dg.materialize(assets, partition_key=day.isoformat(), resources=resources, instance=instance,
                                  selection=["gpu_usage", "gpu_cost_attribution", "gpu_cost_daily"]).success
        attribution = TableStore(db).read("gpu_cost_attribution").set_index("team")
        assert attribution.loc["nlp", "efficiency"] == pytest.approx(0.8, abs=1e-9)  # the table measured what DCGM served

        exporter = Exporter(tmp_path / "gpu_ops.yaml", port, tmp_path / "exporter.log")
        exporter.start()
        try:
            wait_for_scrape_after(url, time.time(), [target])
            got = series(url, instance=target)
            for team in ("nlp", "vision"):
                labels = frozenset({"team": team, "project": "p"}.items())
                assert got[("gpu_ops_efficiency_ratio", labels)] == pytest.approx(attribution.loc[team, "efficiency"], abs=1e-12)
                assert got[("gpu_ops_active_gpu_seconds", labels)] == pytest.approx(attribution.loc[team, "active_gpu_hours"] * 3600, rel=1e-12)
                assert got[("gpu_ops_unused_cost_usd", labels)] == pytest.approx(attribution.loc[team, "unused_cost_usd"], abs=0.005)
            for title, expr in panel_queries(json.loads(DASHBOARD.read_text())):
                assert query(url, expr), f"{title}: {expr} returns no data"
        finally:
            exporter.stop()
