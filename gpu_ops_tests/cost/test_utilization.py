"""DCGM efficiency against a real Prometheus (Debian's `prometheus`) scraping a loopback
dcgm-exporter endpoint every second.

The endpoint serves ``data/dcgm_exporter.prom`` (the label layout of dcgm-exporter 3.x
output: whole A100s, a 1g.10gb MIG instance, a T4 without profiling metrics, a GPU no pod
holds) with values set per pod over a few seconds. Expected efficiencies are worked out
by hand from those values; the one time-varying series is checked against the samples
Prometheus actually stored.
"""

from __future__ import annotations

import datetime as dt
import re
import shutil
import socket
import subprocess
import time
from pathlib import Path

import httpx
import numpy as np
import pandas as pd
import pytest

from gpu_ops.domain.config import UtilizationConfig
from gpu_ops.flows.cost.utilization import EFFICIENCY_COLUMNS, PrometheusClient, UtilizationError, coverage, fetch_samples, join_efficiency, measured_rows
from gpu_ops_tests.conftest import skip_or_fail
from gpu_ops_tests.http_receiver import QuietHandler, reply, serving

TEMPLATE = (Path(__file__).parent / "data" / "dcgm_exporter.prom").read_text()
RUN_S = 9.0  # how long the schedule below is served after Prometheus is ready
GAP = (3.0, 6.0)  # etl-0 is absent from the exporter's output in this part of the run
SWITCH_S = 4.5  # sweep-0 goes from fully active to idle
A100_MIB, MIG_MIB, T4_MIB = 81920, 9856, 15360

# (pod, gpu index) -> (GR_ENGINE_ACTIVE, GPU_UTIL %, FB_USED MiB, total MiB)
VALUES = {
    ("bert-0", "0"): (0.8, 99, 30000, A100_MIB),  # GPU_UTIL disagrees: the profiling metric wins
    ("llama-0", "1"): (0.9, 90, 60000, A100_MIB),
    ("llama-0", "2"): (0.3, 30, 20000, A100_MIB),
    ("infer-0", "3"): (0.5, None, 4000, MIG_MIB),
    ("", "3"): (0.7, None, 1000, MIG_MIB),  # a MIG instance no pod holds: never joined
    ("etl-0", "4"): (0.6, 60, 10000, A100_MIB),
    ("sweep-0", "5"): (1.0, 100, 5000, A100_MIB),
    ("legacy-0", "0"): (None, 35, 2000, T4_MIB),  # no profiling metrics: GPU_UTIL / 100
}
_LINE = re.compile(r'^(?P<metric>\w+)\{(?P<labels>.*)\} (?P<value>\S+)$')


def exporter_text(elapsed: float) -> str:
    out = []
    for line in TEMPLATE.splitlines():
        m = _LINE.match(line)
        if not m:
            out.append(line)
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m["labels"]))
        pod = labels.get("pod", "")
        if pod == "etl-0" and GAP[0] <= elapsed < GAP[1]:
            continue
        active, util, used, total = VALUES[(pod, labels["gpu"])]
        if pod == "sweep-0" and elapsed >= SWITCH_S:
            active, util = 0.0, 0
        value = {"DCGM_FI_PROF_GR_ENGINE_ACTIVE": active, "DCGM_FI_DEV_GPU_UTIL": util, "DCGM_FI_DEV_FB_USED": used, "DCGM_FI_DEV_FB_FREE": total - used}[m["metric"]]
        out.append(f'{m["metric"]}{{{m["labels"]}}} {value}')
    return "\n".join(out) + "\n"


class _Exporter(QuietHandler):
    t0: float | None = None

    def do_GET(self) -> None:  # noqa: N802
        if type(self).t0 is None:  # the schedule starts at Prometheus's first scrape
            type(self).t0 = time.time()
        elapsed = time.time() - type(self).t0  # type: ignore[operator]
        reply(self, 200, exporter_text(elapsed).encode(), "text/plain; version=0.0.4")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")  # once per worker (see conftest.py)
def prometheus(tmp_path_factory: pytest.TempPathFactory):
    binary = shutil.which("prometheus")
    if binary is None:
        skip_or_fail("the prometheus binary is not installed (apt-get install -y prometheus)")
    handler = type("Exporter", (_Exporter,), {})
    with serving(handler) as exporter:
        yield from _prometheus_scraping(binary, exporter, handler, tmp_path_factory.mktemp("prometheus"))


def _prometheus_scraping(binary: str, exporter: str, handler: type[_Exporter], folder: Path):
    (folder / "prometheus.yml").write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n"
        f"  - {{job_name: dcgm, honor_labels: true, static_configs: [{{targets: ['{exporter.removeprefix('http://')}']}}]}}\n"
    )
    port = _free_port()
    log = open(folder / "prometheus.log", "wb")
    proc = subprocess.Popen(
        [binary, f"--config.file={folder / 'prometheus.yml'}", f"--storage.tsdb.path={folder / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
        stdout=log, stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 30
        while True:
            try:
                if httpx.get(url + "/-/ready", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.time() > deadline:
                pytest.fail(f"prometheus did not start: {(folder / 'prometheus.log').read_text()[-2000:]}")
            time.sleep(0.2)
        while handler.t0 is None:  # Prometheus applies its targets every 5 s
            if time.time() > deadline:
                pytest.fail("prometheus never scraped the exporter")
            time.sleep(0.1)
        t0 = handler.t0
        time.sleep(max(0.0, t0 + RUN_S + 1.5 - time.time()))  # the schedule, and the last scrape after it
        yield url, t0
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


def ts(t: float) -> pd.Timestamp:
    return pd.Timestamp(t, unit="s", tz="UTC")


def usage_rows(t0: float, a: float = 1.0, b: float = 8.0) -> pd.DataFrame:
    """Priced usage pieces for the pods, all over [t0 + a, t0 + b), at $3.50 per GPU-hour."""
    pods = [  # namespace, pod, gpu_count, gpu_share, sharing
        ("ml", "bert-0", 1, 1.0, "none"), ("ml", "llama-0", 2, 1.0, "none"), ("serve", "infer-0", 1, 1 / 7, "mig"),
        ("data", "etl-0", 1, 1.0, "none"), ("ml", "sweep-0", 1, 1.0, "none"), ("legacy", "legacy-0", 1, 1.0, "none"),
        ("ml", "ghost-0", 1, 1.0, "none"),  # no metrics at all
    ]
    hours = (b - a) / 3600
    rows = pd.DataFrame(
        [{"start": ts(t0 + a), "end": ts(t0 + b), "namespace": ns, "pod": pod, "gpu_count": float(n), "gpu_share": share, "sharing": sharing,
          "kind": "allocated", "hours": hours, "gpu_hours": n * share * hours, "price_per_gpu_hour": 3.5, "cost_usd": n * share * hours * 3.5, "team": pod.split("-")[0]}
         for ns, pod, n, share, sharing in pods]
    )
    idle = {"start": ts(t0 + a), "end": ts(t0 + b), "namespace": "__idle__", "pod": "", "gpu_count": 8.0, "gpu_share": 1.0, "sharing": "none", "kind": "idle",
            "hours": hours, "gpu_hours": 1.0, "price_per_gpu_hour": 3.5, "cost_usd": 3.5, "team": "__idle__"}
    return pd.concat([rows, pd.DataFrame([idle])], ignore_index=True)


def stored_switch_time(url: str, t0: float) -> float:
    """When sweep-0's first stored sample of 0 was scraped (what Prometheus holds, not what we served)."""
    r = httpx.get(url + "/api/v1/query", params={"query": 'DCGM_FI_PROF_GR_ENGINE_ACTIVE{pod="sweep-0"}[1m]', "time": f"{t0 + RUN_S + 1:.3f}"}).json()
    values = [(float(t), float(v)) for t, v in r["data"]["result"][0]["values"]]
    return min(t for t, v in values if v == 0.0)


def test_efficiency_of_whole_gpus_mig_fallback_and_gaps_from_a_real_prometheus(prometheus):
    url, t0 = prometheus
    rows = usage_rows(t0)
    client = PrometheusClient(UtilizationConfig(type="prometheus", url=url, step="1s", scrape_interval="1s"))
    samples = fetch_samples(client, ts(t0), ts(t0 + RUN_S))
    assert set(samples["pod"]) == {"bert-0", "llama-0", "infer-0", "etl-0", "sweep-0", "legacy-0"}  # the pod-less MIG instance is not read
    out = join_efficiency(rows, samples, client.step_s).set_index("pod")
    hours = 7 / 3600

    # Constant activity: efficiency is the served value whatever the step alignment.
    assert out.loc["bert-0", "efficiency"] == pytest.approx(0.8, abs=1e-9)  # GR_ENGINE_ACTIVE preferred to GPU_UTIL 99 %
    assert out.loc["llama-0", "efficiency"] == pytest.approx((0.9 + 0.3) / 2, abs=1e-9)  # two GPUs: 1.2 of 2 GPU-hours per hour
    assert out.loc["infer-0", "efficiency"] == pytest.approx(0.5, abs=1e-9)  # MIG activity is relative to the 1g.10gb instance
    assert out.loc["legacy-0", "efficiency"] == pytest.approx(0.35, abs=1e-9)  # T4: GPU_UTIL 35 % as the fallback
    assert out.loc["etl-0", "efficiency"] == pytest.approx(0.6, abs=1e-9)  # the gap is not counted as idle
    for pod, gpus in (("bert-0", 1), ("llama-0", 2), ("infer-0", 1 / 7), ("legacy-0", 1)):
        r = out.loc[pod]
        assert r["metered_gpu_hours"] == pytest.approx(gpus * hours, rel=0.02)  # a metric in every 1 s step
        assert r["active_gpu_hours"] == pytest.approx(r["efficiency"] * r["metered_gpu_hours"], rel=1e-9)
        assert r["unused_cost_usd"] == pytest.approx((r["metered_gpu_hours"] - r["active_gpu_hours"]) * 3.5, rel=1e-9)
    assert out.loc["infer-0", "active_gpu_hours"] == pytest.approx(0.5 / 7 * hours, rel=0.02)
    assert out.loc["llama-0", "memory_peak_mib"] == 60000 and out.loc["llama-0", "memory_total_mib"] == A100_MIB
    assert out.loc["infer-0", "memory_peak_mib"] == 4000 and out.loc["infer-0", "memory_total_mib"] == MIG_MIB

    # The gap (3 of the 7 seconds, give or take a scrape at each edge) is reported as coverage.
    etl = out.loc["etl-0"]
    assert (7 - 3 - 1.5) / 3600 < etl["metered_gpu_hours"] < (7 - 3 + 1.5) / 3600

    # Time-varying: fully active until the switch Prometheus stored, idle after.
    switch = stored_switch_time(url, t0)
    expected = (switch - (t0 + 1)) / 7
    assert 0.2 < expected < 0.8
    assert out.loc["sweep-0", "efficiency"] == pytest.approx(expected, abs=1 / 7 + 0.02)  # within one 1 s step
    assert out.loc["sweep-0", "activity_peak"] == pytest.approx(1.0)

    # No metrics: empty, never 0 or 100 %; idle rows carry none.
    for c in EFFICIENCY_COLUMNS:
        assert np.isnan(out.loc["ghost-0", c]) and np.isnan(out.loc[""].loc[c])
    cov = coverage(out.reset_index())
    alloc_hours = float(rows.loc[rows["kind"] == "allocated", "gpu_hours"].sum())
    assert cov["coverage"] == pytest.approx(float(out["metered_gpu_hours"].sum()) / alloc_hours)
    assert 0.5 < cov["coverage"] < 0.9  # ghost-0 and the gap are not covered


def test_a_piece_inside_one_pod_lifetime_gets_only_its_own_steps(prometheus):
    """Two pieces of sweep-0 (before and after the switch) split its activity between them."""
    url, t0 = prometheus
    switch = stored_switch_time(url, t0) - t0
    rows = pd.concat([usage_rows(t0, 1.0, switch - 1.5), usage_rows(t0, switch + 1.5, 8.5)], ignore_index=True)
    rows = rows[rows["pod"] == "sweep-0"].reset_index(drop=True)
    measured = measured_rows(UtilizationConfig(type="prometheus", url=url, step="1s", scrape_interval="1s"), rows, ts(t0), ts(t0 + RUN_S + 1))
    out = measured.rows
    assert measured.pod_steps > 0 and measured.missing is None
    assert out["efficiency"].tolist() == pytest.approx([1.0, 0.0], abs=1e-9)


def test_prometheus_errors_name_the_server_and_never_the_credentials(prometheus, monkeypatch):
    url, t0 = prometheus
    monkeypatch.setenv("PROM_TOKEN", "tok-5ecret-marker")
    cfg = UtilizationConfig.model_validate({"type": "prometheus", "url": url, "step": "1s", "scrape_interval": "1s", "auth": {"bearer": {"env": "PROM_TOKEN"}}})
    client = PrometheusClient(cfg)
    with pytest.raises(UtilizationError) as err:
        client.query_range("sum(", t0, t0 + 5)  # a PromQL syntax error: HTTP 400 from the real server
    assert "127.0.0.1" in str(err.value) and "400" in str(err.value) and "tok-5ecret-marker" not in str(err.value)
    dead = PrometheusClient(UtilizationConfig.model_validate({"type": "prometheus", "url": f"http://127.0.0.1:{_free_port()}", "auth": {"basic": {"username": "u", "password": {"env": "PROM_TOKEN"}}}}))
    with pytest.raises(UtilizationError, match="could not be queried") as err:
        dead.query_range("up", t0, t0 + 5)
    assert "tok-5ecret-marker" not in str(err.value)


def test_bearer_and_basic_auth_reach_the_server(monkeypatch):
    """The Authorization header a server sees (a loopback receiver standing in for an authenticating proxy)."""
    seen: list[str] = []

    class Receiver(QuietHandler):
        def do_GET(self) -> None:  # noqa: N802
            seen.append(self.headers.get("Authorization", ""))
            reply(self, 200, b'{"status":"success","data":{"resultType":"matrix","result":[]}}')

    with serving(Receiver) as url:
        monkeypatch.setenv("PROM_TOKEN", "abc")
        for auth in ({"bearer": {"env": "PROM_TOKEN"}}, {"basic": {"username": "grafana", "password": {"env": "PROM_TOKEN"}}}):
            PrometheusClient(UtilizationConfig.model_validate({"type": "prometheus", "url": url, "auth": auth})).query_range("up", 0, 60)
    assert seen == ["Bearer abc", "Basic Z3JhZmFuYTphYmM="]


def test_utilization_config_refuses_credentials_in_the_url_and_literal_secrets():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="credentials"):
        UtilizationConfig.model_validate({"type": "prometheus", "url": "http://u:p@prom:9090"})
    with pytest.raises(ValidationError):
        UtilizationConfig.model_validate({"type": "prometheus", "url": "http://prom:9090", "auth": {"bearer": "literal-token"}})
    assert UtilizationConfig.model_validate({"type": "prometheus", "url": "http://prom:9090"}).step == "60s"


def test_without_metrics_every_efficiency_column_is_empty():
    rows = usage_rows(dt.datetime(2026, 10, 14, tzinfo=dt.timezone.utc).timestamp())
    measured = measured_rows(None, rows, rows["start"].min(), rows["end"].max())
    out, steps = measured.rows, measured.pod_steps
    assert steps == 0 and out[list(EFFICIENCY_COLUMNS)].isna().all().all()
    assert coverage(out)["efficiency"] is None


def test_usage_and_attribution_tables_carry_efficiency_from_prometheus(prometheus, tmp_path):
    """Through the Dagster assets: today's partition, a usage file, the real Prometheus."""
    import dagster as dg
    import yaml

    from gpu_ops.domain.config import load_config
    from gpu_ops.dagster.cost.assets import build_assets
    from gpu_ops.dagster.resources import GpuOpsSettings
    from gpu_ops.dagster.io_manager import TableIOManager
    from gpu_ops.storage.tables import TableStore

    url, t0 = prometheus
    day = ts(t0).date()
    usage = pd.DataFrame(
        [
            {"start": ts(t0 + 1).isoformat(), "end": ts(t0 + 8).isoformat(), "namespace": ns, "pod": pod, "node": "n1", "team": team, "project": "p",
             "gpu_type": "a100-80gb", "gpu_count": n, "capacity_type": "on-demand", "sharing": sharing, "gpu_share": share}
            for ns, pod, team, n, sharing, share in (
                ("ml", "bert-0", "nlp", 1, "none", 1), ("ml", "llama-0", "nlp", 2, "none", 1), ("serve", "infer-0", "search", 1, "mig", 1 / 7), ("ml", "ghost-0", "vision", 1, "none", 1),
            )
        ]
    )
    usage.to_csv(tmp_path / "usage.csv", index=False)
    db = f"sqlite:///{tmp_path / 'costs.db'}"
    cfg = {
        "storage": {"url": db},
        "prices": {"source": "test", "as_of": "2026-10-01", "gpus": {"a100-80gb": {"on-demand": 3.5}}},
        "usage": {"sources": [{"type": "file", "path": "usage.csv"}], "partitions_start": day.isoformat(), "group_by": ["team"],
                  "utilization": {"type": "prometheus", "url": url, "step": "1s", "scrape_interval": "1s"}},
    }
    (tmp_path / "gpu_ops.yaml").write_text(yaml.safe_dump(cfg))
    config = load_config(tmp_path / "gpu_ops.yaml")
    assets, _ = build_assets(config)
    resources = {"gpu_ops": GpuOpsSettings(config_path=str(tmp_path / "gpu_ops.yaml")), "table_io_manager": TableIOManager(url=db)}
    # Today's partition exists only from tomorrow on: load partitions as of tomorrow (the
    # asset itself clips the day at the real now).
    with dg.DagsterInstance.ephemeral() as instance, dg.partition_loading_context(effective_dt=dt.datetime.now(dt.timezone.utc) + dt.timedelta(days=1)):
        result = dg.materialize(assets, partition_key=day.isoformat(), resources=resources, instance=instance, selection=["gpu_usage", "gpu_cost_attribution", "gpu_cost_daily"])
    assert result.success
    store = TableStore(db)
    usage_t = store.read("gpu_usage").set_index("pod")
    attribution = store.read("gpu_cost_attribution").set_index("team")
    assert usage_t.loc["bert-0", "efficiency"] == pytest.approx(0.8, abs=1e-9)
    assert usage_t.loc["infer-0", "efficiency"] == pytest.approx(0.5, abs=1e-9)
    assert pd.isna(usage_t.loc["ghost-0", "efficiency"]) and pd.isna(usage_t.loc["ghost-0", "active_gpu_hours"])
    nlp = usage_t.loc[["bert-0", "llama-0"]]
    assert attribution.loc["nlp", "efficiency"] == pytest.approx(nlp["active_gpu_hours"].sum() / nlp["metered_gpu_hours"].sum(), rel=1e-9)
    assert attribution.loc["nlp", "efficiency"] == pytest.approx((0.8 + 2 * 0.6) / 3, abs=1e-9)  # one GPU at 0.8, two averaging 0.6
    assert attribution.loc["nlp", "unused_cost_usd"] == pytest.approx(nlp["unused_cost_usd"].sum(), rel=1e-9)
    assert pd.isna(attribution.loc["vision", "efficiency"]) and pd.isna(attribution.loc["vision", "unused_cost_usd"])  # no metrics: empty, not 0
    md = result.asset_materializations_for_node("gpu_usage")[0].metadata
    metered = float(usage_t["metered_gpu_hours"].sum())
    assert md["metrics_coverage"].value == pytest.approx(round(metered / float(usage_t["gpu_hours"].sum()), 4))
    assert 0.5 < md["metrics_coverage"].value < 1  # ghost-0 has none
