"""Preemption benchmark: lost GPU-hours by checkpoint policy, and real recovery latency.

1. Checkpoint cost C: measured from real saves of the demo model (model + AdamW state,
   atomic write with fsync and checksum) through `CheckpointStore`.
2. Recovery latency R on the local backend: a real `train_demo_model` materialization,
   the worker SIGKILLed (and, separately, SIGTERMed) mid-training; from the kill to the
   first resumed training step (backoff set to 0, so this is the pure restart cost), by
   phase (process spawn, interpreter start, imports incl. torch, CUDA init, checkpoint
   load, first step), with a new worker and with the standby worker (compute.standby);
   under the in-process executor and under Dagster's multiprocess executor (each retry a
   new step process, as from the UI or ``dagster asset materialize``; the standby left by
   the killed attempt outlives its step process and the new one claims it).
   Then lost work with and without a preemption notice (SIGUSR1 N s before SIGKILL).
   Every figure is labelled with the device that ran the steps.
3. Simulation: exponential preemption traces with MTBP from 30 min to 8 h, a 24 GPU-hour
   job, restart cost R. Lost GPU-hours (wall time beyond the work itself: rework,
   checkpoint writes, restarts) of
     - restart from scratch (a plain Dagster RetryPolicy; Daly's closed form),
     - fixed intervals (the demo's 3 s; a common 30 min),
     - `auto` (the real `CheckpointSchedule` logic: measured C, MTBP learned from the
       trace with a 2 h prior, survived time counted),
   each as a ratio to the Young/Daly lower bound: the optimal fixed interval for the
   *true* MTBP (an oracle), run on the same preemption traces (common random numbers).
   Goal: auto within 1.2x of the bound.

4. With the DEFAULT settings (retry backoff 5 s, standby on), per kind of death (worker
   SIGKILL, worker SIGTERM, step process SIGKILL), in-process and multiprocess executors:
   kill -> first resumed step (``--deaths-only``); the step process's death also under
   Dagster's stock ``spawn`` start method (the baseline the forkserver default replaces).

5. Telemetry's cost to an attempt (``--telemetry-only``): real materializations of the
   demo asset (a short run, local backend, in-process executor) with no collector, a
   healthy OTLP collector, a dead one (connection refused), one that answers two bytes a
   second, and a tracking server that trickles likewise (``GPU_OPS_MLFLOW_TRACKING_URI``),
   side by side: the run's wall time (median), what it adds to the run without a
   collector, and how long the step waited for its telemetry after the bill was written
   (goal: at most about 1 s, ``training.telemetry_deadline_s``).

Prints figures only. Usage: ``python benchmarks/preemption.py [--trials N] [--quick] [--notices-only] [--multiprocess-only] [--deaths-only] [--telemetry-only]``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from gpu_ops.domain.training.interval import (  # noqa: E402
    estimate_mtbp,
    expected_wall_time,
    expected_wall_time_from_scratch,
    optimal_interval,
    young_daly_interval,
)

HOUR = 3600.0
MTBPS_H = [0.5, 1.0, 2.0, 4.0, 8.0]
PRIOR_S = 2 * HOUR


# --------------------------------------------------------------------------- 1. checkpoint cost


def measure_checkpoint_cost(saves: int = 20) -> tuple[float, int, list[float]]:
    """Median seconds of real saves of the demo model's training state; bytes; step times."""
    from gpu_ops.flows.training.context import TrainingContext, WorkerSpec
    from gpu_ops.flows.training.demo import train_demo

    with tempfile.TemporaryDirectory() as d:
        # Checkpoint every step for `saves` steps: each save is a real one of the real state.
        spec = WorkerSpec("m", "f", "bench", "train_demo_model", 1, d, keep_last=saves + 5, checkpoint_interval=1e-9, progress_every_s=1e9)
        ctx = TrainingContext(spec)
        _quiet(lambda: train_demo(ctx, steps=saves))
        infos = ctx.checkpoint.store.list()
        costs = [i.save_seconds for i in infos]
        size = infos[0].size
        # Step time without checkpoints and with the demo's 3 s interval, for the report.
        step_s = []
        for sub, interval in (("nock", 1e9), ("3s", 3.0)):
            spec2 = WorkerSpec("m", "f", "bench", "train_demo_model", 1, f"{d}/{sub}", checkpoint_interval=interval, progress_every_s=1e9)
            t = time.perf_counter()
            _quiet(lambda: train_demo(TrainingContext(spec2), steps=600))
            step_s.append((time.perf_counter() - t) / 600)
    return statistics.median(costs), size, step_s


def _quiet(fn):
    """Run ``fn`` with stdout and stderr (structured worker lines, Dagster's console log) muted."""
    saved = [os.dup(1), os.dup(2)]
    devnull = os.open(os.devnull, os.O_WRONLY)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    try:
        return fn()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, devnull):
            os.close(fd)


# --------------------------------------------------------------------------- 2. recovery latency


def device_label() -> str:
    """What the demo's steps run on here: the GPU's name, or CPU and the thread count."""
    import torch

    if torch.cuda.is_available():
        return f"{torch.cuda.get_device_name(0)}, CUDA {torch.version.cuda}"
    return f"CPU, 1 thread ({os.cpu_count()} cores)"


PHASES = ["process", "interpreter", "imports", "cuda_init", "activated", "payload", "checkpoint_loaded", "first_step"]


def demo_job():
    """The demo's job with the code location's executor (gpu_ops.definitions: Dagster's
    multiprocess executor, step processes forked from a preloaded forkserver), rebuilt
    from $GPU_OPS_CONFIG in each step process."""
    from gpu_ops.dagster.location import build_defs

    return build_defs(os.environ["GPU_OPS_CONFIG"]).resolve_job_def("train_demo_model_job")


# Run config of each executor measured: None is the code location's default.
EXECUTORS = {
    "in_process": None,
    "multiprocess": None,  # the default: forkserver, Dagster and the step's modules preloaded
    "multiprocess_spawn": {"multiprocess": {"start_method": {"spawn": {}}}},  # Dagster's stock multiprocess executor
}


def _materialize(asset, root: Path, executor: str):
    """One run of the demo asset: in this process (``dg.materialize``) or under the
    multiprocess executor on a persistent instance. Returns (success, run log)."""
    import dagster as dg

    if executor == "in_process":
        with dg.DagsterInstance.ephemeral() as instance:
            result = _quiet(lambda: dg.materialize([asset], instance=instance))
            return result.success, instance.all_logs(result.run_id)
    (root / "dagster_home").mkdir()
    config = EXECUTORS[executor]
    run_config = {"execution": {"config": config}} if config else None
    # Each run here has its own GPU_OPS_CONFIG: the code location's executor starts a
    # forkserver per run and stops it when the run ends (gpu_ops.dagster.training.definitions).
    with dg.DagsterInstance.local_temp(tempdir=str(root / "dagster_home")) as instance:
        result = _quiet(lambda: dg.execute_job(dg.reconstructable(demo_job), instance=instance, run_config=run_config))
        return result.success, instance.all_logs(result.run_id)


def _demo_with_preemption(compute: str, training: str, preempt, executor: str = "in_process", backoff_zero: bool = True) -> tuple[list, float, "object"]:
    """Materialize the demo asset on the local backend; once its first checkpoint exists,
    ``preempt(pid)`` (returns the kill's wall time). Returns (run log, kill time, ledger rows)."""

    from gpu_ops.dagster.location import build_defs
    from gpu_ops.storage.tables import TableStore
    from gpu_ops.storage import ledger

    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        cfg = root / "gpu_ops.yaml"
        cfg.write_text(
            f"storage: {{url: 'sqlite:///ledger.db'}}\nprices: {REPO / 'gpu_ops/demo/prices.yaml'}\n"
            f"compute: {{{compute}}}\ntraining: {{checkpoint_url: ckpts, {'retry_backoff_s: 0, ' if backoff_zero else ''}{training}}}\n"
        )
        os.environ["GPU_OPS_PIDFILE_DIR"] = str(root / "pids")
        os.environ["GPU_OPS_HOME"] = str(root)
        os.environ["GPU_OPS_CONFIG"] = str(cfg)
        asset = build_defs(str(cfg)).resolve_assets_def("train_demo_model")
        killed: dict[str, float] = {}

        def killer() -> None:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and not list((root / "ckpts").glob("*/*/ckpt-*.json")):
                time.sleep(0.01)
            killed["t"] = preempt(int(next((root / "pids").glob("*.rank0.pid")).read_text()))

        th = threading.Thread(target=killer, daemon=True)
        th.start()
        success, logs = _materialize(asset, root, executor)
        if not success:
            errors = [str(e.dagster_event.event_specific_data)[:1500] if e.dagster_event and e.dagster_event.event_type_value == "STEP_FAILURE" else e.message for e in logs if e.level >= 40][-5:]
            raise RuntimeError("the benchmark run failed: " + " | ".join(m for m in errors if m))
        th.join()
        rows = ledger.read(TableStore(f"sqlite:///{root / 'ledger.db'}")).sort_values("attempt")
        return logs, killed["t"], rows


def measure_recovery(sig: int, standby: bool, steps: int = 500, executor: str = "in_process") -> dict[str, float]:
    """Kill the worker of a real materialization; time kill -> first resumed step, by phase.

    Returns seconds after the kill: ``retry_requested``, ``step_process`` (multiprocess
    executor: the retry's new step process logs its first event; the orchestrating
    process's events do not count) and ``worker_started``
    (parent side), then the new worker's own phases (see gpu_ops.flows.compute.worker): a
    standby's process/interpreter/imports/CUDA times are negative (done before the kill)."""

    def preempt(pid: int) -> float:
        time.sleep(1.5)
        t = time.time()
        os.kill(pid, sig)
        return t

    logs, t0, _ = _demo_with_preemption(f"standby: {str(standby).lower()}", f"demo_steps: {steps}, demo_checkpoint_interval_s: 1.0", preempt, executor)

    def first(pred) -> float:
        return next(e.timestamp for e in logs if e.message and pred(e.message)) - t0

    startup = next(e.message for e in logs if e.message and e.message.startswith("attempt 2 startup_times="))
    times = json.loads(startup.split("startup_times=", 1)[1])
    out = {
        "retry_requested": first(lambda m: "-> retry:" in m),
        "worker_started": next(e.timestamp for e in logs if e.message and e.message.startswith("worker started") and e.timestamp > t0) - t0,
        "standby": bool(times.get("standby")),
    }
    if executor != "in_process":
        step_pid = next(e.dagster_event.pid for e in logs if e.dagster_event is not None and e.dagster_event.event_type_value == "STEP_UP_FOR_RETRY")
        out["step_process"] = next(
            e.timestamp for e in logs if e.dagster_event is not None and e.dagster_event.step_key and e.dagster_event.pid not in (None, step_pid, os.getpid()) and e.timestamp > t0
        ) - t0
    out.update({k: times[k] - t0 for k in PHASES if isinstance(times.get(k), (int, float))})
    return out


DEATHS = {
    "worker SIGKILL": lambda pid: os.kill(pid, signal.SIGKILL),
    "worker SIGTERM": lambda pid: os.kill(pid, signal.SIGTERM),
    # The worker's parent is the step process that launched it (a new worker).
    "step process SIGKILL": lambda pid: os.kill(int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1]), signal.SIGKILL),
}


def _first_step_process_event(logs, t0: float) -> float | None:
    """Seconds after the kill of the first event a new step process logs (multiprocess)."""
    retry_pid = next((e.dagster_event.pid for e in logs if e.dagster_event is not None and e.dagster_event.event_type_value in ("STEP_UP_FOR_RETRY", "STEP_FAILURE") and e.timestamp > t0), None)
    pids = {e.dagster_event.pid for e in logs if e.dagster_event is not None and e.dagster_event.step_key and e.timestamp <= t0}
    return next(
        (e.timestamp - t0 for e in logs if e.dagster_event is not None and e.dagster_event.step_key and e.dagster_event.pid not in (None, retry_pid, *pids) and e.timestamp > t0),
        None,
    )


def measure_death(death: str, executor: str, steps: int = 2000) -> dict[str, float]:
    """With the DEFAULT settings (retry backoff 5 s, standby on, the code location's
    executor): kill -> first resumed step, and when the new step process (if any) and the
    new attempt's worker started."""

    def preempt(pid: int) -> float:
        time.sleep(1.5)
        t = time.time()
        DEATHS[death](pid)
        return t

    logs, t0, _ = _demo_with_preemption("", f"demo_steps: {steps}, demo_checkpoint_interval_s: 1.0", preempt, executor, backoff_zero=False)
    startup = next(e.message for e in logs if e.message and e.message.startswith("attempt 2 startup_times="))
    times = json.loads(startup.split("startup_times=", 1)[1])
    out = {"first_step": float(times["first_step"]) - t0, "standby": bool(times.get("standby"))}
    step_process = _first_step_process_event(logs, t0) if executor != "in_process" else None
    if step_process is not None:
        out["step_process"] = step_process
    return out


def print_deaths(executors: list[str], deaths: list[str]) -> None:
    print(
        "recovery with the DEFAULT settings (retry backoff 5 s, standby on, the code location's executor; "
        "multiprocess_spawn: Dagster's stock start method, the baseline), kill -> first resumed step:"
    )
    for executor in executors:
        for death in deaths:
            if death.startswith("step process") and executor == "in_process":
                continue  # there the step process is the run worker: a run retry / re-execution, not a step retry
            if executor == "multiprocess_spawn" and not death.startswith("step process"):
                continue  # the baseline for a new step process; a worker's death stays in its step process
            r = measure_death(death, executor)
            s = r["first_step"]
            extra = (f"; new step process's first event +{r['step_process']:.2f} s" if "step_process" in r else "") + ("; standby worker" if r["standby"] else "; new worker")
            print(f"  {executor:13s} {death:21s} {s:6.2f} s (goal < 3 s: {'met' if s < 3.0 else 'NOT met'}{extra}); load average {os.getloadavg()[0]:.2f}", flush=True)


def measure_lost_work(notice_s: float | None, run_s: float = 3.0, interval_s: float = 10.0, steps: int = 4000) -> tuple[float, int] | None:
    """The demo checkpoints every ``interval_s``; ``run_s`` after its first checkpoint its
    worker gets a notice ``notice_s`` before a SIGKILL (None: no notice). Returns the
    ledger's lost seconds of the killed attempt and the steps attempt 2 redid."""
    from gpu_ops.flows.compute.local import simulate_preemption

    def preempt(pid: int) -> float:
        time.sleep(max(0.0, run_s - (notice_s or 0.0)))
        simulate_preemption(pid, notice_s).join()
        return time.time()

    logs, _, rows = _demo_with_preemption("standby: true", f"demo_steps: {steps}, demo_checkpoint_interval_s: {interval_s}", preempt)
    if len(rows) < 2:
        return None  # the run finished before the kill: no figure
    last_step_1 = max((int(m.split()[1].split("/")[0]) for m in (e.message or "" for e in logs) if m.startswith("step ") and "[attempt 1]" in m), default=0)
    resumed = next((int(m.split("(step ")[1].split(",")[0]) for m in (e.message or "" for e in logs) if m.startswith("attempt 2 resumes from checkpoint")), 0)
    return float(rows.iloc[0]["lost_seconds"]), max(0, last_step_1 - resumed)


def print_recovery(name: str, r: dict[str, float]) -> None:
    who = "standby worker" if r["standby"] else "new worker"
    parts = [f"retry decided +{r['retry_requested']:.2f}"]
    parts += [f"new step process +{r['step_process']:.2f}"] if "step_process" in r else []
    parts += [f"launch +{r['worker_started']:.2f}"]
    parts += [f"{k} {r[k]:+.2f}" for k in PHASES if k in r]
    verdict = "met" if r["first_step"] < 3.0 else "NOT met"
    print(f"  after {name}, {who}: " + ", ".join(parts) + f" s -> first resumed step {r['first_step']:.2f} s (goal < 3 s: {verdict})")


# --------------------------------------------------------------------------- 3. simulation


def simulate_fixed(work: float, tau: float, cost: float, restart: float, failures: list[float]) -> tuple[float, int]:
    """Wall time to finish ``work`` checkpointing every ``tau`` s; ``failures`` are the
    successive times-to-preemption (exponential draws), consumed in order."""
    done, wall, i = 0.0, 0.0, 0
    while True:
        f = failures[i] if i < len(failures) else math.inf
        i += 1
        remaining = work - done
        full = math.ceil(remaining / tau - 1e-12)
        need = restart + remaining + full * cost
        if f >= need:
            return wall + need, i - 1
        k = max(0, math.floor((f - restart) / (tau + cost))) if f > restart else 0
        done += min(k * tau, remaining)
        wall += f


def simulate_auto(work: float, cost: float, restart: float, failures: list[float], prior: float = PRIOR_S) -> tuple[float, int]:
    """The `auto` schedule: tau = sqrt(2 C M_hat), M_hat from exposure and preemptions so far."""
    done, wall, exposure, n, i = 0.0, 0.0, 0.0, 0, 0
    while True:
        f = failures[i] if i < len(failures) else math.inf
        i += 1
        elapsed = restart
        if f < elapsed:
            wall, exposure, n = wall + f, exposure + f, n + 1
            continue
        while True:
            tau = max(1.0, young_daly_interval(cost, estimate_mtbp(exposure + elapsed, n, prior)))
            seg = min(tau, work - done)
            if elapsed + seg + cost > f:
                wall, exposure, n = wall + f, exposure + f, n + 1
                break
            elapsed += seg + cost
            done += seg
            if done >= work - 1e-9:
                return wall + elapsed, n


def trace(rng: random.Random, mtbp: float, n: int = 100_000) -> list[float]:
    return [rng.expovariate(1.0 / mtbp) for _ in range(n)]


def compare(cost: float, restart: float, work: float, trials: int, seed: int = 1) -> list[dict[str, float]]:
    rows = []
    for mtbp_h in MTBPS_H:
        mtbp = mtbp_h * HOUR
        rng = random.Random(seed)
        tau_opt = optimal_interval(cost, mtbp, restart)
        lost = {"oracle": 0.0, "auto": 0.0, "fixed_3s": 0.0, "fixed_30m": 0.0}
        for _ in range(trials):
            fails = trace(rng, mtbp, n=int(8 * work / mtbp) + 50)
            lost["oracle"] += simulate_fixed(work, tau_opt, cost, restart, fails)[0] - work
            lost["auto"] += simulate_auto(work, cost, restart, fails)[0] - work
            lost["fixed_3s"] += simulate_fixed(work, 3.0, cost, restart, fails)[0] - work
            lost["fixed_30m"] += simulate_fixed(work, 1800.0, cost, restart, fails)[0] - work
        lost = {k: v / trials / HOUR for k, v in lost.items()}
        analytic = (expected_wall_time(work, tau_opt, cost, mtbp, restart) - work) / HOUR
        scratch = (expected_wall_time_from_scratch(work, mtbp, restart) - work) / HOUR
        rows.append({"mtbp_h": mtbp_h, "tau_opt_s": tau_opt, "bound_h": analytic, "scratch_h": scratch, **{f"{k}_h": v for k, v in lost.items()}})
    return rows


def print_table(title: str, rows: list[dict[str, float]]) -> None:
    print(f"\n{title}")
    print(f"{'MTBP':>6} {'tau*':>8} {'bound GPU-h':>12} {'scratch (RetryPolicy)':>22} {'fixed 3s':>16} {'fixed 30m':>16} {'auto':>16}")
    for r in rows:
        b = r["oracle_h"]

        def cell(v: float) -> str:
            return f"{v:7.3f} ({v / b:.2f}x)" if v < 1e4 else f"{v:.2e} ({v / b:.1e}x)"

        print(
            f"{r['mtbp_h']:>5g}h {r['tau_opt_s']:>7.1f}s {r['bound_h']:>12.4f} {cell(r['scratch_h']):>22} "
            f"{cell(r['fixed_3s_h']):>16} {cell(r['fixed_30m_h']):>16} {cell(r['auto_h']):>16}"
        )
    worst = max(r["auto_h"] / r["oracle_h"] for r in rows)
    print(f"auto / Young-Daly bound: worst {worst:.3f}x (goal <= 1.2x) -> {'met' if worst <= 1.2 else 'NOT met'}")


def print_recoveries(device: str, *, multiprocess_only: bool) -> float:
    """Recovery from kill to the first resumed step, per executor, with and without a
    standby; the restart cost the simulation uses (in-process, SIGKILL, with a standby)."""
    restart = 5.0
    print(f"recovery, kill -> first resumed step (local backend, backoff 0, {device}); phases as seconds after the kill:")
    about = {
        "multiprocess": " (the code location's default: each Dagster step attempt a new step process, forked from a preloaded forkserver)",
        "multiprocess_spawn": " (start_method spawn, Dagster's stock multiprocess executor: each step process a new interpreter)",
    }
    for executor in list(EXECUTORS)[1 if multiprocess_only else 0 :]:
        print(f" {executor} executor" + about.get(executor, ""))
        for standby in (False, True):
            for name, sig in (("SIGKILL", signal.SIGKILL), ("SIGTERM", signal.SIGTERM))[: 1 if executor != "in_process" else 2]:
                r = measure_recovery(sig, standby, executor=executor)
                print_recovery(name, r)
                if sig == signal.SIGKILL and standby and executor == "in_process":
                    restart = r["first_step"]
    return restart


def print_lost_work(cost: float, device: str) -> None:
    """Work lost to a preemption 3 s after a checkpoint, with notices of several lengths and none."""
    print(f"lost work when the preemption comes 3 s after a checkpoint (checkpoint every 10 s, save {cost * 1000:.0f} ms, {device}):")
    for notice_s in (None, 0.2, 1.0, 5.0):
        measured = measure_lost_work(notice_s)
        what = "no notice (SIGKILL only)" if notice_s is None else f"notice {notice_s:g} s before the SIGKILL"
        if measured is None:
            print(f"  {what}: the run finished before the kill; no figure")
            continue
        lost, redone = measured
        print(f"  {what}: {lost:.2f} s of work lost (ledger lost_seconds: attempt end - last checkpoint), >= {redone} logged step(s) redone by attempt 2")


# --------------------------------------------------------------------------- 5. telemetry's cost


class _Collector:
    """A loopback collector: ``healthy`` (200 and an empty OTLP answer), ``trickling`` (two
    bytes a second, forever), or ``dead`` (a port nothing listens on)."""

    def __init__(self, kind: str):
        import socket
        import socketserver

        self.kind, self.server = kind, None
        if kind == "dead":
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                self.url = f"http://127.0.0.1:{s.getsockname()[1]}"
            return

        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                self.rfile.readline()
                try:
                    if kind == "healthy":
                        while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                            pass
                        self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/x-protobuf\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                        return
                    for b in b"HTTP/1.1 200 OK\r\n" + b"X-Pad: " + b"a" * 10_000:
                        self.wfile.write(bytes([b]))
                        time.sleep(0.5)
                except OSError:
                    pass  # the client hung up at its deadline

        class Server(socketserver.ThreadingTCPServer):
            daemon_threads, allow_reuse_address = True, True

        self.server = Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()


TELEMETRY_CASES = {
    "no collector": (None, None),
    "healthy OTLP collector": ("OTEL_EXPORTER_OTLP_ENDPOINT", "healthy"),
    "dead OTLP collector (refused)": ("OTEL_EXPORTER_OTLP_ENDPOINT", "dead"),
    "trickling OTLP collector (2 B/s)": ("OTEL_EXPORTER_OTLP_ENDPOINT", "trickling"),
    "trickling MLflow server (2 B/s)": ("GPU_OPS_MLFLOW_TRACKING_URI", "trickling"),
}


def measure_telemetry_run(case: str, steps: int = 60) -> tuple[float, float]:
    """One short demo materialization under ``case``: (its wall seconds, the seconds the step
    waited for its telemetry after settling)."""
    import dagster as dg

    from gpu_ops.definitions import build_defs
    from gpu_ops.flows.observability.sender import Flush

    var, kind = TELEMETRY_CASES[case]
    waited: list[float] = []
    original = Flush.wait

    def timed(self: Flush) -> list:
        t = time.perf_counter()
        try:
            return original(self)
        finally:
            waited.append(time.perf_counter() - t)

    collector = _Collector(kind) if kind else None
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        cfg = root / "gpu_ops.yaml"
        cfg.write_text(
            f"storage: {{url: 'sqlite:///ledger.db'}}\nprices: {REPO / 'gpu_ops/demo/prices.yaml'}\n"
            f"training: {{checkpoint_url: ckpts, demo_steps: {steps}, demo_checkpoint_interval_s: 1.0}}\n"
        )
        saved = {v: os.environ.pop(v, None) for v in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "GPU_OPS_MLFLOW_TRACKING_URI", "MLFLOW_RUN_ID")}
        os.environ.update({"GPU_OPS_HOME": str(root), "GPU_OPS_CONFIG": str(cfg), "GPU_OPS_PIDFILE_DIR": str(root / "pids"), **({var: collector.url} if collector and var else {})})
        Flush.wait = timed  # type: ignore[method-assign]
        try:
            asset = build_defs(str(cfg)).resolve_assets_def("train_demo_model")
            with dg.DagsterInstance.ephemeral() as instance:
                t = time.perf_counter()
                result = _quiet(lambda: dg.materialize([asset], instance=instance))
                wall = time.perf_counter() - t
            assert result.success, case
        finally:
            Flush.wait = original  # type: ignore[method-assign]
            for v, value in saved.items():
                os.environ.pop(v, None)
                if value is not None:
                    os.environ[v] = value
            if collector is not None:
                collector.close()
    return wall, sum(waited)


def print_telemetry(trials: int) -> None:
    print(f"telemetry's cost to an attempt: the demo asset (60 steps, local backend, in-process), median of {trials} runs per case; "
          "training.telemetry_deadline_s = 1 s (the default); load average before: "
          f"{os.getloadavg()[0]:.2f}")
    measure_telemetry_run("no collector")  # warm-up: imports, the first standby worker
    figures: dict[str, list[tuple[float, float]]] = {case: [] for case in TELEMETRY_CASES}
    for _ in range(trials):  # round robin: a change of load falls on every case alike
        for case in TELEMETRY_CASES:
            figures[case].append(measure_telemetry_run(case))
    base = statistics.median(w for w, _ in figures["no collector"])
    print(f"  {'case':34s} {'run wall s':>10s} {'added s':>8s} {'waited for telemetry s':>23s}  goal: <= 1 s added (judged on every run's wait; wall times are noisy)")
    for case, runs in figures.items():
        wall, waited = statistics.median(w for w, _ in runs), statistics.median(x for _, x in runs)
        added = wall - base
        verdict = "" if case == "no collector" else ("met" if max(x for _, x in runs) <= 1.1 else "NOT met")  # the deadline and the join's margin
        print(f"  {case:34s} {wall:10.2f} {added:+8.2f} {waited:23.2f}  {verdict}")
    print(f"load average after: {os.getloadavg()[0]:.2f}")


def main() -> None:
    import warnings

    warnings.simplefilter("ignore")  # Dagster's beta/preview notices are not figures
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=300)
    parser.add_argument("--work-hours", type=float, default=24.0)
    parser.add_argument("--quick", action="store_true", help="skip the real recovery measurements")
    parser.add_argument("--notices-only", action="store_true", help="of the real runs, only lost work with and without notices")
    parser.add_argument("--multiprocess-only", action="store_true", help="of the real runs, only recovery under the multiprocess executor")
    parser.add_argument("--deaths-only", action="store_true", help="only recovery with the default settings, per kind of death, in-process and multiprocess")
    parser.add_argument("--executor", dest="executors", action="append", choices=list(EXECUTORS), help="with --deaths-only: only this executor (repeatable)")
    parser.add_argument("--death", dest="deaths", action="append", choices=list(DEATHS), help="with --deaths-only: only this kind of death (repeatable)")
    parser.add_argument("--telemetry-only", action="store_true", help="only telemetry's cost to an attempt: no, healthy, dead and trickling collectors")
    parser.add_argument("--telemetry-trials", type=int, default=3, help="with --telemetry-only: runs per case")
    args = parser.parse_args()
    if args.telemetry_only:
        print_telemetry(args.telemetry_trials)
        return
    if args.deaths_only:
        print(f"device: {device_label()}; {os.cpu_count()} CPUs; load average {os.getloadavg()[0]:.2f}")
        print_deaths(args.executors or list(EXECUTORS), args.deaths or list(DEATHS))
        return

    device = device_label()
    print(f"device: {device}; load average {os.getloadavg()[0]:.2f}")
    cost, size, step_s = measure_checkpoint_cost()
    print(f"demo model checkpoint: {size / 1e6:.2f} MB, median save {cost * 1000:.1f} ms (atomic write + fsync + sha256, {os.cpu_count()} CPUs)")
    print(f"demo step time ({device}; includes set-up): {step_s[0] * 1000:.2f} ms without checkpoints, {step_s[1] * 1000:.2f} ms checkpointing every 3 s")

    restart = 5.0
    if not args.quick and not args.notices_only:
        restart = print_recoveries(device, multiprocess_only=args.multiprocess_only)
    if not args.quick and not args.multiprocess_only:
        print_lost_work(cost, device)
    print(f"restart cost used in the simulation: R = {restart:.2f} s")

    work = args.work_hours * HOUR
    print_table(
        f"lost GPU-hours per {args.work_hours:g} GPU-hour job, measured C = {cost * 1000:.1f} ms, R = {restart:.1f} s, {args.trials} traces per MTBP "
        "(ratio to the Young/Daly bound on the same traces)",
        compare(cost, restart, work, args.trials),
    )
    print_table(
        f"same, C = 60 s (a multi-GB model written to object storage), R = {restart:.1f} s",
        compare(60.0, restart, work, args.trials),
    )


if __name__ == "__main__":
    main()
