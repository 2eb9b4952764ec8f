"""Deaths of the processes Dagster itself runs are preemptions of the orchestrator.

Real runs of ``train_demo_model_job`` (multiprocess executor, the UI's and the CLI's) on a
persistent instance, under a 1-GPU quota (leases, fences), with real SIGKILLs:

- the **step process** dies: Dagster retries the step at once (the op's crash retry), the
  next attempt settles the dead one (its worker stopped, its time billed, its lease
  released, a message naming what died) and resumes from the checkpoint;
- the **run worker** dies: the step process sees it and stops its worker (no orphan
  trains on), settling the attempt with the reason; re-execution from failure resumes
  from the checkpoint.

For each: final ``weights_sha256`` equal to an uninterrupted run's, ledger seconds equal
to the time the workers really ran (sampled from /proc, within 2 s per attempt), never
two training workers at once (sampled), and the next GPU run starts without help.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from collections.abc import Callable
from typing import Any

import dagster as dg
import pandas as pd
import pytest

from gpu_ops.storage.quota import LeaseBook
from gpu_ops.storage.tables import TableStore
from gpu_ops.storage import ledger
from gpu_ops.storage.attempt_store import AttemptStore
from gpu_ops_tests.training.test_gpu_asset import PRICES, messages, reference_weights
from gpu_ops_tests.waiting import pinned, wait_until

REPO = Path(__file__).resolve().parents[2]
STEPS = 250  # the demo's size here: long enough to be killed after its first checkpoint, short for the suite
OUTAGE_STEPS = 900  # an outage must outlast the fence (0.8 TTL) while the demo still trains, also when a loaded
# machine notices the first checkpoint late (at 400 steps a loaded CI run saw the worker finish before its fence)
AGAIN_STEPS = 20  # the run after the step process's death: it only has to be admitted and complete


def write_config(folder: Path, steps: int = STEPS, standby: bool = True, name: str = "gpu_ops.yaml") -> Path:
    """The tests' gpu_ops file. A run whose attempt cannot be retried (the one after the
    deaths, a re-execution, the second run of an outage) reads a copy of it with
    ``standby: false``: the standby it would start, warming torch for a retry that never
    comes, costs a worker's start-up (~3 s of CPU) and shows nothing."""
    path = folder / name
    path.write_text(
        f"""
storage: {{url: "sqlite:///ledger.db"}}
prices: {PRICES}
compute:
  standby: {str(standby).lower()}
  quotas: {{team: {{ml-platform: 1}}}}
  admission: {{lease_ttl_s: 6, backoff_s: 0.1, backoff_max_s: 0.3}}
training:
  checkpoint_url: ckpts
  demo_steps: {steps}
  demo_checkpoint_interval_s: 0.4
"""
    )
    return path


def demo_job() -> dg.JobDefinition:
    from gpu_ops.dagster.location import build_defs

    return build_defs(os.environ["GPU_OPS_CONFIG"]).resolve_job_def("train_demo_model_job")


def ppid(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


class Sampler(threading.Thread):
    """Every 20 ms: which training workers (pidfiles) are alive; their first and last time
    seen. Each pid is pinned to its start time at first sight: under a full suite pids wrap
    (pid_max is often 32768), and a dead worker's pid reused by another process is not it."""

    def __init__(self, pid_dir: Path):
        super().__init__(daemon=True)
        self.pid_dir = pid_dir
        self.seen: dict[int, list[float]] = {}
        self.alive: dict[int, Callable[[], bool]] = {}
        self.most_at_once = 0
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(0.02):
            now, alive = time.time(), []
            for f in self.pid_dir.glob("*.pid") if self.pid_dir.exists() else []:
                try:
                    pid = int(f.read_text())
                except (OSError, ValueError):
                    continue
                if pid not in self.seen:
                    self.alive[pid] = pinned(pid)
                    self.seen[pid] = [now, now]
            for pid, span in self.seen.items():
                if self.alive[pid]():
                    span[1] = now
                    alive.append(pid)
            self.most_at_once = max(self.most_at_once, len(alive))

    def lifetimes(self) -> list[float]:
        return [end - start for start, end in sorted(self.seen.values())]


def first_checkpoint(root: Path) -> bool:
    return bool(list(root.glob("ckpts/*/*/ckpt-*.json")))


def worker_pid(pid_dir: Path) -> int:
    (f,) = list(pid_dir.glob("*.pid"))
    return int(f.read_text())


def check_ledger(config: Path, run_ids: set[str], sampler: Sampler) -> Any:
    rows = ledger.read(TableStore(f"sqlite:///{config.parent / 'ledger.db'}")).sort_values("start")
    rows = rows[rows["run_id"].isin(run_ids)]
    billed = [(r.end - r.start).total_seconds() for r in rows.itertuples(index=False)]
    ran = sampler.lifetimes()
    assert len(billed) == len(ran), (billed, ran)
    for b, r in zip(billed, ran):
        assert abs(b - r) < 2.0, (billed, ran)  # GPU time billed is the time the workers ran
    assert sampler.most_at_once == 1  # never two workers under the 1-GPU quota
    return rows


@pytest.fixture(scope="session")  # once per worker (see conftest.py)
def demo_sha() -> str:
    return reference_weights(STEPS)


@pytest.fixture(scope="session")  # once per worker (see conftest.py)
def long_demo_sha() -> str:
    return reference_weights(OUTAGE_STEPS)


@pytest.fixture
def env(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    config = write_config(tmp_path, getattr(request, "param", STEPS))
    monkeypatch.setenv("GPU_OPS_CONFIG", str(config))
    monkeypatch.setenv("GPU_OPS_PIDFILE_DIR", str(tmp_path / "pids"))
    (tmp_path / "dagster_home").mkdir()
    return config


@pytest.mark.slow
def test_a_killed_step_process_is_retried_at_once_and_resumes(tmp_path: Path, env: Path, demo_sha: str, monkeypatch: pytest.MonkeyPatch) -> None:
    sampler = Sampler(tmp_path / "pids")
    sampler.start()
    killed: dict[str, int] = {}

    def kill_the_step_process() -> None:
        if wait_until(lambda: first_checkpoint(tmp_path), timeout=120):
            killed["step"] = ppid(worker_pid(tmp_path / "pids"))  # a new worker's parent is its step process
            os.kill(killed["step"], signal.SIGKILL)

    killer = threading.Thread(target=kill_the_step_process, daemon=True)
    killer.start()
    with dg.DagsterInstance.local_temp(tempdir=str(tmp_path / "dagster_home")) as instance:
        result = dg.execute_job(dg.reconstructable(demo_job), instance=instance)
        log = messages(instance, result.run_id)
        (mat,) = instance.fetch_materializations(dg.AssetKey("train_demo_model"), limit=1).records
        md = {k: getattr(v, "value", v) for k, v in mat.asset_materialization.metadata.items()}
        # The next GPU run starts without help: the dead step's lease and slot are gone
        # (a short run, with no standby: only its admission and its completion count).
        monkeypatch.setenv("GPU_OPS_CONFIG", str(write_config(tmp_path, AGAIN_STEPS, standby=False, name="again.yaml")))
        again = dg.execute_job(dg.reconstructable(demo_job), instance=instance)
    killer.join()
    sampler.done.set()
    sampler.join()
    assert result.success and again.success and "step" in killed
    died = [m for m in log if "its owner (pid " + str(killed["step"]) in m]
    assert died and "died while the attempt was running; settled by the next attempt of run" in died[0] and "lease released" in died[0], log
    assert md["weights_sha256"] == demo_sha and md["attempts"] == 2 and md["preemptions"] == 1
    assert any(m.startswith("attempt 2 resumes from checkpoint #") for m in log)
    # The standby started by the killed step process outlived it and served attempt 2.
    assert any(m.startswith("attempt 2 start-up on a standby worker") for m in log)
    rows = check_ledger(env, {result.run_id, again.run_id}, sampler)
    assert list(rows["outcome"]) == ["preempted", "completed", "completed"]
    # The dead attempt's lost work ends at its last checkpoint, not at its start.
    dead = rows.iloc[0]
    assert not pd.isna(dead["last_checkpoint_at"]) and dead["start"] <= dead["last_checkpoint_at"] <= dead["end"], dead
    assert dead["lost_seconds"] < (dead["end"] - dead["start"]).total_seconds()
    assert LeaseBook(TableStore.from_config(_config(env))).holders() == []
    assert AttemptStore(TableStore.from_config(_config(env))).open_attempts() == []


def _config(path: Path) -> Any:
    from gpu_ops.domain.config import load_config

    return load_config(path)


RUN_WORKER = """
import sys
import dagster as dg
from gpu_ops_tests.training.test_process_deaths import demo_job
with dg.DagsterInstance.local_temp(tempdir=sys.argv[1]) as instance:
    print("run-worker", flush=True)
    dg.execute_job(dg.reconstructable(demo_job), instance=instance)
"""


@pytest.mark.slow
# OUTAGE_STEPS: the 250-step demo can finish in the second after its first checkpoint on a
# fast machine, before the step process notices that its run worker is gone.
@pytest.mark.parametrize("env", [OUTAGE_STEPS], indirect=True)
def test_a_killed_run_worker_leaves_no_orphan_and_re_execution_resumes(tmp_path: Path, env: Path, long_demo_sha: str, monkeypatch: pytest.MonkeyPatch) -> None:
    sampler = Sampler(tmp_path / "pids")
    sampler.start()
    home = tmp_path / "dagster_home"
    proc = subprocess.Popen([sys.executable, "-c", RUN_WORKER, str(home)], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert wait_until(lambda: first_checkpoint(tmp_path), timeout=120)
    worker = worker_pid(tmp_path / "pids")
    proc.kill()  # SIGKILL of the run worker (its step process lives on)
    proc.wait()
    killed_at = time.monotonic()
    worker_alive = pinned(worker)
    assert wait_until(lambda: not worker_alive(), timeout=30)
    stopped_after = time.monotonic() - killed_at
    with dg.DagsterInstance.local_temp(tempdir=str(home)) as instance:
        (run,) = instance.get_runs()
        assert wait_until(lambda: not AttemptStore(TableStore.from_config(_config(env))).open_attempts(), timeout=30)
        # The step settles the attempt, then logs its decision naming the dead run worker:
        # wait for that line, not only for the settlement.
        said = lambda: any("run worker (pid " in m and "died" in m for m in messages(instance, run.run_id))
        assert wait_until(said, timeout=30, every=0.2), messages(instance, run.run_id)
        instance.report_run_failed(run, "run worker SIGKILLed (what run monitoring reports)")
        monkeypatch.setenv("GPU_OPS_CONFIG", str(write_config(tmp_path, OUTAGE_STEPS, standby=False, name="reexecution.yaml")))  # one attempt: no standby
        options = dg.ReexecutionOptions.from_failure(run.run_id, instance)
        again = dg.execute_job(dg.reconstructable(demo_job), instance=instance, reexecution_options=options)
        (mat,) = instance.fetch_materializations(dg.AssetKey("train_demo_model"), limit=1).records
        md = {k: getattr(v, "value", v) for k, v in mat.asset_materialization.metadata.items()}
        relog = messages(instance, again.run_id)
    sampler.done.set()
    sampler.join()
    assert stopped_after < 10  # the orphaned worker stopped (checkpoint, exit) within the step's watch
    assert again.success and md["weights_sha256"] == long_demo_sha
    assert any(m.startswith("attempt 1 resumes from checkpoint #") for m in relog)
    rows = check_ledger(env, {run.run_id, again.run_id}, sampler)
    assert list(rows["outcome"]) == ["preempted", "completed"]
    assert LeaseBook(TableStore.from_config(_config(env))).holders() == []


def run_worker(home: Path, config: Path | None = None) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO), **({"GPU_OPS_CONFIG": str(config)} if config else {})}
    return subprocess.Popen([sys.executable, "-c", RUN_WORKER, str(home)], cwd=REPO, env=env, stdout=subprocess.DEVNULL)


def materializations(home: Path) -> dict[str, dict[str, Any]]:
    with dg.DagsterInstance.local_temp(tempdir=str(home)) as instance:
        runs = {r.run_id: r for r in instance.get_runs()}
        out = {}
        for rec in instance.fetch_materializations(dg.AssetKey("train_demo_model"), limit=10).records:
            out[rec.run_id] = {k: getattr(v, "value", v) for k, v in rec.asset_materialization.metadata.items()}
        assert all(r.is_success for r in runs.values()), {k: r.status for k, r in runs.items()}
        return out


@pytest.mark.slow
@pytest.mark.parametrize("env", [OUTAGE_STEPS], indirect=True)
@pytest.mark.parametrize("outage", ["sigstop", "database"])
def test_a_quota_holder_that_cannot_renew_is_fenced_and_both_runs_finish_without_overlap(
    tmp_path: Path, env: Path, demo_sha: str, long_demo_sha: str, outage: str
) -> None:
    """Run A's step process (the lease holder) cannot renew past the lease TTL: it is
    SIGSTOPped while run B waits for the 1-GPU quota, or the gpu_ops database is locked
    (unreachable for writes) past the TTL before B starts. A's worker is stopped by its
    fence before B is admitted; A then finds its lease gone, waits its turn and resumes
    from its checkpoint. B trains the short demo: only A has to outlast its fence."""
    sampler = Sampler(tmp_path / "pids")
    sampler.start()
    home = tmp_path / "dagster_home"
    first = run_worker(home)
    # B never retries: no standby for it (A's attempt 2 is served by A's standby).
    b_config = write_config(tmp_path, STEPS, standby=False, name="run_b.yaml")
    assert wait_until(lambda: first_checkpoint(tmp_path), timeout=120)
    worker_a = worker_pid(tmp_path / "pids")
    worker_a_alive = pinned(worker_a)
    if outage == "sigstop":
        step_a = ppid(worker_a)
        os.kill(step_a, signal.SIGSTOP)
        try:
            second = run_worker(home, b_config)
            # B is admitted only after A's lease expired; by then A's worker is gone.
            assert wait_until(lambda: len(sampler.seen) >= 2, timeout=120)
            assert not worker_a_alive()
        finally:
            os.kill(step_a, signal.SIGCONT)
    else:
        import sqlite3

        db = sqlite3.connect(str(tmp_path / "ledger.db"), isolation_level=None, timeout=30)
        db.execute("BEGIN EXCLUSIVE")  # the gpu_ops database is unavailable to every writer
        try:
            assert wait_until(lambda: not worker_a_alive(), timeout=8.0)  # fenced within the TTL (6 s) + slack
        finally:
            db.execute("ROLLBACK")
            db.close()
        second = run_worker(home, b_config)
    assert first.wait(timeout=300) == 0 and second.wait(timeout=300) == 0
    sampler.done.set()
    sampler.join()
    mats = materializations(home)
    assert sorted((md["steps"], md["weights_sha256"]) for md in mats.values()) == [(STEPS, demo_sha), (OUTAGE_STEPS, long_demo_sha)]
    assert sampler.most_at_once == 1  # sampled every 20 ms: never two workers under the 1-GPU quota
    rows = check_ledger(env, set(mats), sampler)
    assert sorted(rows["outcome"]) == ["completed", "completed", "preempted"]
    assert LeaseBook(TableStore.from_config(_config(env))).holders() == []
