"""Prometheus servers that answer badly, on 127.0.0.1: each ends within its documented
bound (``timeout_s`` per query, plus a margin for a loaded machine) with bounded memory
(the peak RSS of a child process), and the window is marked as missing metrics with the
reason — never a traceback, never a silent efficiency of 1.0.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from pydantic import ValidationError

from gpu_ops.domain.config import UtilizationConfig
from gpu_ops.flows.cost.utilization import ACTIVE, EFFICIENCY_COLUMNS, FB_FREE, FB_USED, GPU_UTIL, coverage, measured_rows
from gpu_ops_tests.hostile_http import endless, fixed, hostile, slow, trickle_body

REPO = Path(__file__).resolve().parents[2]
MARGIN_S = 3.0
MAX_GROWTH_MIB = 60
T0 = pd.Timestamp("2026-10-14T00:00:00Z")


def rows(pods: tuple[str, ...] = ("a-0", "b-0", "c-0")) -> pd.DataFrame:
    """Priced pieces of 10 minutes each at $4 per GPU-hour."""
    hours = 10 / 60
    return pd.DataFrame(
        [{"start": T0, "end": T0 + pd.Timedelta(minutes=10), "namespace": "ml", "pod": p, "gpu_count": 1.0, "gpu_share": 1.0, "kind": "allocated",
          "gpu_hours": hours, "price_per_gpu_hour": 4.0, "cost_usd": 4 * hours, "team": "t"} for p in pods]
    )


def config(url: str, **kw) -> UtilizationConfig:
    return UtilizationConfig.model_validate({"type": "prometheus", "url": url, "step": "60s", "scrape_interval": "30s", **kw})


def matrix(series: list[tuple[str, list[str]]]) -> bytes:
    """A query_range answer: one series per (pod, values) with points every 60 s from T0 + 60 s."""
    t = T0.timestamp()
    result = [{"metric": {"namespace": "ml", "pod": pod, "gpu": "0", "UUID": f"GPU-{pod}"}, "values": [[t + 60 * (i + 1), v] for i, v in enumerate(values)]} for pod, values in series]
    return json.dumps({"status": "success", "data": {"resultType": "matrix", "result": result}}).encode()


def by_query(answers: dict[str, bytes]):
    """A Prometheus that answers each metric's query from ``answers`` (else an empty matrix)."""

    def answer(h) -> None:
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(h.path).query).get("query", [""])[0]
        body = next((b for metric, b in answers.items() if metric in query), matrix([]))
        fixed(200, body)(h)

    return answer


def assert_missing(measured, *words: str) -> None:
    assert measured.missing is not None
    for w in words:
        assert w in measured.missing, measured.missing
    assert "127.0.0.1" in measured.missing
    for c in EFFICIENCY_COLUMNS:
        assert measured.rows[c].isna().all()
    assert coverage(measured.rows)["coverage"] == 0.0 and coverage(measured.rows)["efficiency"] is None


@pytest.mark.parametrize(
    ("body", "words"),
    [
        (b"<html>502 Bad Gateway</html>", ("not valid JSON",)),
        (b'{"status":"success","data":{"resultType":"scalar","result":[1760400000,"1"]}}', ("a scalar result, not a matrix",)),
        (b'{"status":"success"}', ("without data",)),
        (b'{"status":"error","errorType":"bad_data","error":"parse error"}', ("status 'error': parse error",)),
        (matrix([("a-0", ["0.5", "abc"])]), ("'abc'", "not a number", "pod='a-0'")),
        (b'{"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":[1,"1"]}]}}', ("a vector result",)),
    ],
    ids=["html", "scalar", "no-data", "error", "abc", "vector"],
)
def test_a_malformed_answer_is_a_clear_error_and_the_window_has_no_metrics(body, words):
    with hostile(then=fixed(200, body)) as server:
        measured = measured_rows(config(server.url), rows(), T0, T0 + pd.Timedelta(days=1))
    assert_missing(measured, "Prometheus at http://127.0.0.1:", *words)
    assert "query 'avg_over_time(DCGM_FI_PROF_GR_ENGINE_ACTIVE" in measured.missing


def test_non_finite_and_out_of_range_samples_are_no_measurement():
    answers = {
        ACTIVE: matrix([("a-0", ["+Inf"] * 10), ("c-0", ["0.5", "NaN", "0.5", "-0.2", "0.5", "0.5", "0.5", "0.5", "0.5", "0.5"])]),
        GPU_UTIL: matrix([("b-0", ["250"] * 10)]),
        FB_USED: matrix([(p, ["1000"] * 10) for p in ("a-0", "b-0", "c-0")]),
        FB_FREE: matrix([(p, ["79000"] * 10) for p in ("a-0", "b-0", "c-0")]),
    }
    with hostile(then=by_query(answers)) as server:
        measured = measured_rows(config(server.url), rows(), T0, T0 + pd.Timedelta(days=1))
    out = measured.rows.set_index("pod")
    assert measured.missing is None
    # +Inf activity and GPU_UTIL 250 %: no measurement at all (was efficiency 1.0 and unused cost $0).
    for pod in ("a-0", "b-0"):
        assert np.isnan(out.loc[pod, "efficiency"]) and np.isnan(out.loc[pod, "unused_cost_usd"]) and np.isnan(out.loc[pod, "metered_gpu_hours"])
    # c-0: the NaN and the -0.2 steps are gaps (coverage), the other 8 steps measure 0.5.
    assert out.loc["c-0", "efficiency"] == pytest.approx(0.5)
    assert out.loc["c-0", "metered_gpu_hours"] == pytest.approx(8 / 60)
    assert measured.rejected == {ACTIVE: 12, GPU_UTIL: 10}
    assert "DCGM_FI_DEV_GPU_UTIL: 10" in measured.metadata()["metrics_rejected_samples"]


def test_samples_at_times_no_clock_holds_are_rejected_not_cast_into_garbage():
    """A point whose time is 1e300 or -1e300 seconds was cast to an int64 of garbage
    (numpy's 'invalid value encountered in cast') and silently lost; it is a rejected
    sample now, counted like a non-finite value."""
    import warnings

    t = T0.timestamp()
    weird = {"status": "success", "data": {"resultType": "matrix", "result": [
        {"metric": {"namespace": "ml", "pod": "a-0", "gpu": "0", "UUID": "GPU-a-0"}, "values": [[t + 60, "0.5"], [1e300, "0.5"], [-1e300, "0.5"], [t + 120, "0.5"]]},
    ]}}
    body = json.dumps(weird).encode()
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        with hostile(then=by_query({ACTIVE: body})) as server:
            measured = measured_rows(config(server.url), rows(), T0, T0 + pd.Timedelta(days=1))
    assert measured.missing is None and measured.rejected == {ACTIVE: 2}


def test_a_slow_answer_ends_at_the_deadline():
    with hostile(then=slow(10.0, body=matrix([]))) as server:
        t0 = time.monotonic()
        measured = measured_rows(config(server.url, timeout_s=1.0), rows(), T0, T0 + pd.Timedelta(days=1))
        elapsed = time.monotonic() - t0
    assert elapsed < 1.0 + MARGIN_S  # the first query fails; the window has no metrics
    assert_missing(measured, "could not be queried", "deadline")


CHILD = r"""
import json, resource, sys, time
import pandas as pd
sys.path.insert(0, sys.argv[3])
from gpu_ops_tests.cost.test_utilization_bounds import T0, config, rows
from gpu_ops.flows.cost.utilization import measured_rows
cfg = config(sys.argv[1], **json.loads(sys.argv[2]))
r = rows()
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t0 = time.monotonic()
m = measured_rows(cfg, r, T0, T0 + pd.Timedelta(days=1))
print(json.dumps({"missing": m.missing, "elapsed": time.monotonic() - t0, "growth_mib": (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024}))
"""


def measure_in_child(url: str, **kw) -> dict:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", CHILD, url, json.dumps(kw), str(REPO)], capture_output=True, text=True, timeout=120, env=env, cwd=REPO)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_trickled_answer_ends_at_the_total_deadline_not_per_read():
    head = b'{"status":"success","data":{"resultType":"matrix","result":['
    with hostile(then=trickle_body(200, interval_s=0.05, prefix=head)) as server:
        out = measure_in_child(server.url, timeout_s=1.5)
    assert out["elapsed"] < 1.5 + MARGIN_S, out  # was: past 150 s with timeout_s 10
    assert "no complete answer within the deadline of 1.5 s" in out["missing"]
    assert out["growth_mib"] < MAX_GROWTH_MIB, out


def test_an_endless_body_ends_at_the_byte_cap_with_bounded_memory():
    with hostile(then=endless(200, fill=b" ")) as server:  # valid JSON whitespace, forever
        out = measure_in_child(server.url, timeout_s=20.0, max_response_bytes=8_000_000)
    assert "answer body larger than 8,000,000 bytes" in out["missing"], out
    assert out["elapsed"] < 20.0 + MARGIN_S
    assert out["growth_mib"] < MAX_GROWTH_MIB, out


def test_an_endless_nesting_ends_at_once_with_bounded_memory():
    """``[[[[…``: without a depth limit the parser's paths grow quadratically (10 GB seen)."""
    with hostile(then=endless(200, fill=b"[")) as server:
        out = measure_in_child(server.url, timeout_s=20.0)
    assert "JSON nested deeper than 8 levels" in out["missing"], out
    assert out["growth_mib"] < MAX_GROWTH_MIB, out


def test_an_endless_list_of_samples_ends_at_the_sample_limit_with_bounded_memory():
    point = b'[1760400060,"0.5"],'

    def samples_forever(h) -> None:
        h.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
        start = b'{"status":"success","data":{"resultType":"matrix","result":[{"metric":{"pod":"a-0","namespace":"ml"},"values":['
        h.wfile.write(b"%x\r\n%s\r\n" % (len(start), start))
        piece = point * 3000
        while True:
            h.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))

    with hostile(then=samples_forever) as server:
        out = measure_in_child(server.url, timeout_s=60.0, max_samples=200_000)
    assert "answered more than 200,000 samples (usage.utilization.max_samples)" in out["missing"], out
    assert out["growth_mib"] < MAX_GROWTH_MIB, out


def test_a_step_shorter_than_the_scrape_interval_is_refused():
    with pytest.raises(ValidationError, match="step 15s is shorter than scrape_interval 30s"):
        UtilizationConfig.model_validate({"type": "prometheus", "url": "http://prom:9090", "step": "15s", "scrape_interval": "30s"})
    with pytest.raises(ValidationError, match="shorter than scrape_interval 15s"):  # the default interval
        UtilizationConfig.model_validate({"type": "prometheus", "url": "http://prom:9090", "step": "5s"})
    assert UtilizationConfig.model_validate({"type": "prometheus", "url": "http://prom:9090", "step": "30s", "scrape_interval": "30s"}).step == "30s"


def test_the_usage_asset_marks_the_day_as_missing_metrics_and_says_why(tmp_path):
    """Through Dagster: a Prometheus answering a scalar does not fail gpu_usage."""
    import datetime as dt

    import dagster as dg
    import yaml

    from gpu_ops.domain.config import load_config
    from gpu_ops.dagster.cost.assets import build_assets
    from gpu_ops.dagster.resources import GpuOpsSettings
    from gpu_ops.dagster.io_manager import TableIOManager
    from gpu_ops.storage.tables import TableStore

    day = "2026-10-14"
    pd.DataFrame([{"start": f"{day}T01:00:00Z", "end": f"{day}T02:00:00Z", "namespace": "ml", "pod": "a-0", "node": "n1", "team": "nlp", "project": "p",
                   "gpu_type": "a100-80gb", "gpu_count": 1, "capacity_type": "on-demand", "sharing": "none", "gpu_share": 1}]).to_csv(tmp_path / "usage.csv", index=False)
    with hostile(then=fixed(200, b'{"status":"success","data":{"resultType":"scalar","result":[1760400000,"1"]}}')) as server:
        db = f"sqlite:///{tmp_path / 'costs.db'}"
        cfg = {"storage": {"url": db}, "prices": {"source": "t", "as_of": "2026-10-01", "gpus": {"a100-80gb": {"on-demand": 3.5}}},
               "usage": {"sources": [{"type": "file", "path": "usage.csv"}], "partitions_start": "2026-10-01", "group_by": ["team"],
                         "utilization": {"type": "prometheus", "url": server.url}}}
        (tmp_path / "gpu_ops.yaml").write_text(yaml.safe_dump(cfg))
        config_ = load_config(tmp_path / "gpu_ops.yaml")
        assets, _ = build_assets(config_)
        resources = {"gpu_ops": GpuOpsSettings(config_path=str(tmp_path / "gpu_ops.yaml")), "table_io_manager": TableIOManager(url=db)}
        with dg.DagsterInstance.ephemeral() as instance:
            result = dg.materialize(assets, partition_key=day, resources=resources, instance=instance, selection=["gpu_usage", "gpu_cost_attribution"])
    assert result.success
    md = result.asset_materializations_for_node("gpu_usage")[0].metadata
    assert md["metrics_coverage"].value == 0.0
    assert "a scalar result, not a matrix" in md["metrics_missing"].value and "Prometheus at http://127.0.0.1:" in md["metrics_missing"].value
    usage = TableStore(db).read("gpu_usage")
    assert usage.loc[usage["kind"] != "idle", "efficiency"].isna().all()
    assert dt.date.fromisoformat(day)  # the partition that was materialized
