"""GPU-weighted admission: quotas in GPUs, leases with heartbeats in the gpu_ops database.

Real SQLite and PostgreSQL (``pg_url``), real Dagster materializations running at the same
time in two threads, real worker subprocesses, and a real lease holder SIGKILLed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import dagster as dg
import pytest
import yaml

from gpu_ops.storage.quota import Lease, LeaseBook, QuotaExceeded, Quotas, decide
from gpu_ops.domain.compute.request import Attribution, GpuRequest
from gpu_ops.dagster.compute.resource import GpuCompute, LocalGpuCompute, StandbySettings
from gpu_ops.storage.tables import TableStore
from gpu_ops_tests.compute import worker_fns

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'costs.db'}" if request.param == "sqlite" else request.getfixturevalue("pg_url")


def write_config(tmp_path: Path, url: str, ttl_s: float = 60.0, timeout_s: float = 60.0) -> Path:
    cfg = tmp_path / "gpu_ops.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "storage": {"url": url},
                "prices": {"source": "t", "as_of": "2026-11-01", "gpus": {"t4": {"spot": 0.2}}},
                "compute": {
                    "quotas": {"team": {"nlp": 4}, "pool": {"gpu-ops-vision-t4-spot": 8}},
                    "admission": {"lease_ttl_s": ttl_s, "backoff_s": 0.1, "backoff_max_s": 0.3, "wait_timeout_s": timeout_s},
                },
            }
        )
    )
    return cfg


def lease(team: str, gpus: int, pools: tuple[str, ...] = ()) -> Lease:
    return Lease(f"{team}-{gpus}", team, pools, gpus, "run", "asset", "host:1", 0.0, 1e12)


def test_the_decision_counts_gpus_per_team_and_pool() -> None:
    quotas = Quotas(team={"nlp": 32}, pool={"gpu-ops-nlp-h100-spot": 40})
    held = [lease("nlp", 30, ("gpu-ops-nlp-h100-spot",)), lease("vision", 8, ("gpu-ops-nlp-h100-spot",))]
    assert decide(quotas, lease("nlp", 4), held) == (False, "nlp holds 30 of 32 GPUs; waiting for 4")
    assert decide(quotas, lease("nlp", 2), held)[0]
    granted, reason = decide(quotas, lease("ml", 3, ("gpu-ops-nlp-h100-spot",)), held)
    assert not granted and reason == "gpu-ops-nlp-h100-spot holds 38 of 40 GPUs; waiting for 3"
    assert decide(quotas, lease("ml", 64), held)[0]  # no quota for team ml
    with pytest.raises(QuotaExceeded, match="more than its whole quota of 32"):
        decide(quotas, lease("nlp", 33), [])


def _asset(name: str, gpus: int, seconds: float) -> dg.AssetsDefinition:
    request = GpuRequest(gpu_type="t4", gpus=gpus, capacity="spot", labels=Attribution(team="nlp"))

    @dg.asset(name=name)
    def launches(context, gpu_compute: GpuCompute) -> float:  # type: ignore[no-untyped-def]
        report = gpu_compute.launch(context, request, worker_fns.sleep_for, args=(seconds,))
        assert report.ok, report.error_message
        return report.value

    return launches


def _messages(instance: dg.DagsterInstance, run_id: str) -> list[tuple[float, str]]:
    return [(e.timestamp, e.message) for e in instance.all_logs(run_id) if e.message]


def test_a_launch_over_quota_waits_then_runs_when_the_first_ends(tmp_path: Path, db_url: str) -> None:
    cfg = write_config(tmp_path, db_url)
    compute = LocalGpuCompute(local_workdir=str(tmp_path / "work"), config_path=str(cfg), standby=StandbySettings(enabled=False))
    results: dict[str, tuple[dg.DagsterInstance, dg.ExecuteInProcessResult]] = {}

    def materialize(name: str, gpus: int, seconds: float) -> None:
        instance = dg.DagsterInstance.ephemeral()
        results[name] = (instance, dg.materialize([_asset(name, gpus, seconds)], instance=instance, resources={"gpu_compute": compute}))

    first = threading.Thread(target=materialize, args=("holds_four", 4, 2.5))
    first.start()
    book = LeaseBook(TableStore(db_url))
    deadline = time.monotonic() + 60
    while not book.holders() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [le.gpus for le in book.holders()] == [4]
    second = threading.Thread(target=materialize, args=("wants_two", 2, 0.1))
    second.start()
    first.join(timeout=120)
    second.join(timeout=120)
    (i1, r1), (i2, r2) = results["holds_four"], results["wants_two"]
    assert r1.success and r2.success
    logs2 = _messages(i2, r2.run_id)
    waiting = [t for t, m in logs2 if m.startswith("nlp holds 4 of 4 GPUs; waiting for 2")]
    admitted = [t for t, m in logs2 if m.startswith("GPU quota: admitted") and "after waiting" in m]
    first_done = max(t for t, m in _messages(i1, r1.run_id) if m.startswith("GPU quota: admitted")) + 2.5
    assert waiting and admitted and admitted[0] >= first_done - 0.5  # it ran once the first had ended
    assert book.holders() == []  # both released


HOLDER = textwrap.dedent(
    """
    import sys, time
    # This host's clock is off by argv[2] seconds (a skewed node): leases must not care.
    _real, _skew = time.time, float(sys.argv[2])
    time.time = lambda: _real() + _skew
    from gpu_ops.storage.quota import Heartbeat, LeaseBook, Quotas
    from gpu_ops.storage.tables import TableStore
    book = LeaseBook(TableStore(sys.argv[1]), ttl_s=float(sys.argv[5]))
    adm = book.try_acquire(Quotas(team={"nlp": 4}), team="nlp", pools=["gpu-ops-nlp-t4-spot"], gpus=int(sys.argv[3]), run_id=sys.argv[4], asset_key="a")
    print("held" if adm.granted else "refused: " + adm.reason, "reclaimed", len(adm.reclaimed), flush=True)
    if adm.granted:
        Heartbeat(book, adm.lease, 0.2).start()
        time.sleep(600)
    """
)


def holder(db_url: str, skew_s: float, gpus: int = 4, run_id: str = "killed-run", ttl_s: float = 1.0) -> tuple[subprocess.Popen, str]:
    """A lease holder in its own process whose clock is ``skew_s`` off, heartbeating every
    0.2 s a lease of ``ttl_s``; returns it and its first line."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, db_url, str(skew_s), str(gpus), run_id, str(ttl_s)], stdout=subprocess.PIPE, text=True, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}
    )
    assert proc.stdout is not None
    return proc, proc.stdout.readline().strip()


@pytest.mark.parametrize("skew_s", [0.0, 3600.0, -3600.0], ids=["same-clock", "holder-1h-ahead", "holder-1h-behind"])
def test_a_sigkilled_holders_lease_expires_and_its_gpus_return(tmp_path: Path, db_url: str, skew_s: float) -> None:
    proc, said = holder(db_url, skew_s)
    try:
        assert said == "held reclaimed 0"
        time.sleep(1.5)  # longer than the TTL: only the heartbeat keeps it
        book = LeaseBook(TableStore(db_url), ttl_s=1.0)
        (held,) = book.holders()
        assert (held.run_id, held.gpus) == ("killed-run", 4)
        # since, last heartbeat and expiry are on the database's clock, whatever the holder's says
        assert held.renewed_at is not None and held.acquired_at < held.renewed_at < held.expires_at <= held.renewed_at + 1.0 + 1e-6
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    # The next launch's own lease lives 10 s: the killed holder's (1 s, its own TTL) is what
    # must expire. A 1 s lease of its own expired under a loaded CI run before its worker was
    # recorded on it (the launch then refuses to start the worker, as it must).
    cfg = write_config(tmp_path, db_url, ttl_s=10.0)
    compute = LocalGpuCompute(local_workdir=str(tmp_path / "work"), config_path=str(cfg), standby=StandbySettings(enabled=False))
    instance = dg.DagsterInstance.ephemeral()
    result = dg.materialize([_asset("after_the_crash", 4, 0.1)], instance=instance, resources={"gpu_compute": compute})
    assert result.success
    logs = [m for _, m in _messages(instance, result.run_id)]
    assert any("reclaimed an expired GPU lease: 4 GPU(s) of nlp, run killed-r" in m for m in logs)
    assert book.holders() == []


def test_a_host_whose_clock_runs_ahead_does_not_take_live_leases(db_url: str) -> None:
    """A live holder on a correct clock; an admission from a host an hour ahead sees its
    lease as live (the database decides), so it waits instead of reclaiming it."""
    live, said = holder(db_url, 0.0, gpus=3, run_id="live-run", ttl_s=10.0)  # live through a late heartbeat
    try:
        assert said == "held reclaimed 0"
        ahead, said = holder(db_url, 3600.0, gpus=2, run_id="ahead-run")
        ahead.kill()
        assert said == "refused: nlp holds 3 of 4 GPUs; waiting for 2 reclaimed 0"
        assert [le.run_id for le in LeaseBook(TableStore(db_url)).holders()] == ["live-run"]
    finally:
        live.kill()
        live.wait()


def test_a_launch_larger_than_the_quota_fails_at_once(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, f"sqlite:///{tmp_path / 'costs.db'}")
    compute = LocalGpuCompute(local_workdir=str(tmp_path / "work"), config_path=str(cfg), standby=StandbySettings(enabled=False))
    request = GpuRequest(gpu_type="t4", gpus=8, capacity="spot", labels=Attribution(team="nlp"))
    with dg.build_asset_context() as context:
        with pytest.raises(dg.Failure, match="more than its whole quota of 4") as info:
            compute.launch(context, request, worker_fns.add, args=(1, 2))
    assert info.value.allow_retries is False


def test_a_training_asset_shows_who_holds_what(tmp_path: Path) -> None:
    from gpu_ops.dagster.training.asset import gpu_asset
    from gpu_ops_tests.training import workloads

    cfg = write_config(tmp_path, f"sqlite:///{tmp_path / 'costs.db'}")
    request = GpuRequest(gpu_type="t4", gpus=2, capacity="spot", labels=Attribution(team="nlp"))
    asset = gpu_asset(workloads.counting, name="quota_visible", request=request, params={"steps": 3, "step_s": 0.0}, config_path=str(cfg))
    compute = LocalGpuCompute(local_workdir=str(tmp_path / "work"), config_path=str(cfg), standby=StandbySettings(enabled=False))
    result = dg.materialize([asset], instance=dg.DagsterInstance.ephemeral(), resources={"gpu_compute": compute})
    assert result.success
    md = result.asset_materializations_for_node("quota_visible")[-1].metadata
    assert md["gpu_quota"].value == "admitted: nlp 2 of 4 GPUs"
    table = md["gpu_quota_holders"].value
    assert "| team nlp | 2 | 4 |" in table and "| quota_visible | nlp | 2 |" in table


def test_the_gpu_leases_asset_shows_who_holds_what_in_the_ui_and_in_sql(tmp_path: Path, db_url: str) -> None:
    """A live holder (its own process, heartbeating) and a SIGKILLed one whose lease has
    expired but is not reclaimed yet; `gpu_leases` materialized from the code location's
    definitions on a real instance: a typed table with one row per lease, the quota usage,
    the row count, and the same rows in the gpu_ops database's table gpu_leases."""
    from gpu_ops.dagster.location import build_defs

    # The live holder's lease outlasts a heartbeat held up by a loaded machine (with 1 s, a
    # suite at load 8 once saw it lapse); the dead one's expires within the sleep below.
    live, said = holder(db_url, 0.0, gpus=3, run_id="live-run", ttl_s=10.0)
    dead, said_dead = holder(db_url, 0.0, gpus=1, run_id="dead-run")
    try:
        assert said == said_dead == "held reclaimed 0"
        dead.kill()
        dead.wait()
        time.sleep(1.5)  # longer than the TTL: the dead holder's lease has expired
        cfg = write_config(tmp_path, db_url, ttl_s=1.0)
        defs = build_defs(str(cfg))
        assert "gpu_leases_schedule" in {s.name for s in defs.schedules or []}
        with dg.DagsterInstance.ephemeral() as instance:
            result = dg.materialize([defs.resolve_assets_def("gpu_leases")], instance=instance)
            assert result.success
            (mat,) = instance.fetch_materializations(dg.AssetKey("gpu_leases"), limit=1).records
            md = mat.asset_materialization.metadata
    finally:
        live.kill()
        live.wait()
    assert md["dagster/row_count"].value == 2 and md["gpus_held"].value == 3 and md["runs_holding"].value == 1
    rows = {r.data["run_id"]: r.data for r in md["leases"].value.records}
    assert set(rows) == {"live-run", "dead-run"}
    assert rows["live-run"]["state"] == "live" and rows["live-run"]["gpus"] == 3 and rows["live-run"]["team"] == "nlp"
    assert rows["live-run"]["pools"] == "gpu-ops-nlp-t4-spot" and rows["live-run"]["last_heartbeat"] is not None
    assert rows["dead-run"]["state"] == "expired" and rows["dead-run"]["expires_in_s"] < 0
    assert {c.name for c in md["leases"].value.schema.columns} >= {"team", "pools", "run_id", "asset_key", "gpus", "since", "last_heartbeat", "expires"}
    usage = {(r.data["scope"], r.data["name"]): (r.data["held"], r.data["quota"]) for r in md["quota_usage"].value.records}
    assert usage[("team", "nlp")] == (3, 4)
    stored = TableStore(db_url).read("gpu_leases")  # the same rows, from SQL
    assert sorted(stored["run_id"]) == ["dead-run", "live-run"] and stored.set_index("run_id").loc["live-run", "gpus"] == 3
