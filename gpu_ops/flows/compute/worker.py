"""The local backend's worker process: ``python -m gpu_ops.flows.compute.worker --payload P --result R``
(``--standby``: started ahead of need). Free of Dagster imports.

Design: docs/concepts/compute.md#the-local-backend
"""

from __future__ import annotations

import time

_T_INTERPRETER = time.time()  # before any other import: "interpreter ready"

import argparse  # noqa: E402
import importlib  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import pickle  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
import traceback  # noqa: E402
from typing import Any  # noqa: E402

from gpu_ops.domain.compute import fence  # noqa: E402
from gpu_ops.domain.compute.backend import NOTICE_RECEIVED, NOTICE_SIGNAL, OOM_TEXT, WorkerTerminated  # noqa: E402

EXIT_ERROR = 1
EXIT_SIGTERM = 128 + signal.SIGTERM  # 143, what a shell reports for a SIGTERMed process

_terminating = False


def _on_notice(signum: int, frame: Any) -> None:
    # NOTICE_SIGNAL (SIGUSR1) = a preemption notice (the kill comes later). Noted from the
    # first instant, so that one arriving during start-up does not kill the worker
    # (SIGUSR1's default action); the training layer turns it into ``ctx.preempted``.
    NOTICE_RECEIVED.set()


def _on_sigterm(signum: int, frame: Any) -> None:
    global _terminating
    if _terminating:  # a second SIGTERM while unwinding: keep unwinding
        return
    _terminating = True
    raise WorkerTerminated("received SIGTERM")


def _watch_parent(parent: int, grace_s: float) -> None:
    """If the launching process dies (kill -9 of a Dagster step), do not live on as an orphan."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(grace_s)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="gpu-ops-parent-watch", daemon=True).start()


def _watch_fence(result: str) -> None:
    """Under a GPU quota: stop when the launcher's lease lapses (see gpu_ops.domain.compute.fence).
    A worker the fence kills writes ``<result>.ended`` (the time) first: its launcher may be
    the paused one, and bills the attempt to that time, not to when it looked again."""
    path = os.environ.get(fence.FENCE_ENV)
    if not path:
        return

    def ended() -> None:
        with open(f"{result}.ended", "w") as f:
            f.write(repr(time.time()))

    def notice(reason: str) -> None:  # the training loop sees it as ctx.preempted (it reads the fence too)
        sys.stderr.write(f"gpu_ops: {reason}: stopping (checkpoint, then exit)\n")
        sys.stderr.flush()

    fence.start_watchdog(path, float(os.environ.get(fence.GRACE_ENV, "10")), notice, before_kill=ended)


def is_oom(exc: BaseException | None) -> bool:
    """MemoryError, ``torch.cuda.OutOfMemoryError``, or an out-of-memory message (CUDA's, or the
    host's: ``RuntimeError: DefaultCPUAllocator: can't allocate memory``), anywhere in the chain."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, MemoryError):
            return True
        for cls in type(exc).__mro__:
            if cls.__name__ == "OutOfMemoryError" and cls.__module__.startswith("torch"):
                return True
        if isinstance(exc, (RuntimeError, OSError)) and OOM_TEXT.search(str(exc)):
            return True  # CUDA's, or the host's (torch's DefaultCPUAllocator, ENOMEM)
        exc = exc.__cause__ or exc.__context__
    return False


def _qualname(exc: BaseException) -> str:
    cls = type(exc)
    return cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"


def _write(path: str, result: dict[str, Any]) -> None:
    try:
        data = pickle.dumps(result, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:  # the function returned something that cannot travel back
        data = pickle.dumps(
            {
                "status": "error",
                "error_type": "PicklingError",
                "error_message": f"the function's result cannot be pickled: {type(exc).__name__}: {exc}",
                "traceback": traceback.format_exc(),
            }
        )
    tmp = f"{path}.tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    now = time.time()
    os.utime(tmp, (now, now))  # its time is this process's clock, the one launched_at was read from (recorded_end)
    os.replace(tmp, path)  # the parent never reads half a result


def process_start_time() -> float | None:
    """When this process was created (wall clock, 10 ms resolution), from /proc; None where unreadable."""
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return time.time() - (uptime - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None


def _exercise_torch(cuda: bool) -> None:
    """One tiny training step: the first optimizer alone imports torch._dynamo (seconds).
    The RNG states are put back, so a function's results do not depend on the warm-up."""
    torch = sys.modules["torch"]
    device = "cuda" if cuda and torch.cuda.is_available() else "cpu"
    cpu_rng = torch.get_rng_state()
    cuda_rng = torch.cuda.get_rng_state_all() if device == "cuda" else None
    model = torch.nn.Linear(4, 4).to(device)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.zeros(2, 4, device=device)).sum().backward()
    opt.step()
    torch.set_rng_state(cpu_rng)
    if cuda_rng is not None:
        torch.cuda.set_rng_state_all(cuda_rng)


def warm_up(modules: list[str], cuda: bool, phases: dict[str, float]) -> None:
    """Import ``modules`` (missing ones are skipped) and, with ``cuda``, create the CUDA
    context, so that a function calling them finds them ready."""
    _import_warm(modules, phases)
    warm_cuda(modules, cuda, phases)


def _import_warm(modules: list[str], phases: dict[str, float]) -> None:
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - a warm-up import is an optimisation, never an error
            pass
    torch = sys.modules.get("torch") if "torch" in modules else None
    if torch is not None:
        try:
            _exercise_torch(cuda=False)
        except Exception:  # noqa: BLE001 - the function meets the same error and reports it
            pass
    phases["imports"] = time.time()


def warm_cuda(modules: list[str], cuda: bool, phases: dict[str, float]) -> None:
    """With ``cuda`` and torch among ``modules``: create the CUDA context (the GPU is used from here on)."""
    torch = sys.modules.get("torch") if "torch" in modules else None
    if cuda and torch is not None:
        try:
            if torch.cuda.is_available():
                # cuBLAS reads its workspace setting when the first handle is made: the
                # deterministic one (what torch asks for with deterministic algorithms).
                os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
                torch.cuda.init()
                _exercise_torch(cuda=True)  # the context, cuBLAS handles, the CUDA kernels of a step
        except Exception:  # noqa: BLE001 - the function meets the same error and reports it
            pass
    phases["cuda_init"] = time.time()


def _emit_phases(phases: dict[str, float], standby: bool) -> None:
    sys.stdout.write(f"gpu_ops:phase {json.dumps({'phases': phases, 'standby': standby, 't': time.time()})}\n")
    sys.stdout.flush()


def _await_activation() -> dict[str, Any] | None:
    """A standby's wait: one JSON line on stdin makes it a worker; EOF or SIGTERM ends it."""
    try:
        line = sys.stdin.readline()
    except WorkerTerminated:
        return None
    if not line.strip():
        return None
    order = json.loads(line)
    os.environ.update(order.get("env") or {})
    return order


def _start_up(opts: argparse.Namespace, phases: dict[str, float]) -> None:
    """Warm up, wait for the payload (a standby), then for the go-ahead (under a GPU lease:
    the launcher has written this pid on the lease); only then touch the GPU. A standby
    makes its CUDA context ahead of need (it is the next attempt of the same lease holder)."""
    modules = [m for m in opts.warm.split(",") if m]
    warm_up(modules, opts.cuda and opts.standby, phases)
    if opts.standby:
        order = _await_activation()
        if order is None:
            os._exit(0)
        opts.payload, opts.result = order["payload"], order["result"]
        phases["activated"] = time.time()
    fence.wait_for_go()
    if not opts.standby:
        warm_cuda(modules, opts.cuda, phases)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpu_ops.flows.compute.worker")
    parser.add_argument("--payload")
    parser.add_argument("--result")
    parser.add_argument("--standby", action="store_true", help="warm up, then wait on stdin for the payload")
    parser.add_argument("--warm", default="", help="comma-separated modules to import before the payload")
    parser.add_argument("--cuda", action="store_true", help="initialise CUDA before the payload")
    opts = parser.parse_args(argv)
    if not opts.standby and not (opts.payload and opts.result):
        parser.error("--payload and --result are required without --standby")

    signal.signal(signal.SIGTERM, _on_sigterm)
    signal.signal(NOTICE_SIGNAL, _on_notice)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {NOTICE_SIGNAL})  # the local backend starts us with it blocked
    _watch_parent(os.getppid(), float(os.environ.get("GPU_OPS_GRACE_S", "30")))
    phases = {"process": process_start_time() or _T_INTERPRETER, "interpreter": _T_INTERPRETER}
    try:
        _start_up(opts, phases)
    except WorkerTerminated:
        os._exit(EXIT_SIGTERM)  # stopped before any work: nothing to report

    _watch_fence(opts.result)
    code = 0
    try:
        with open(opts.payload, "rb") as f:
            payload = pickle.load(f)
        phases["payload"] = time.time()
        _emit_phases(phases, opts.standby)
        value = payload["fn"](*payload["args"], **payload["kwargs"])
        result: dict[str, Any] = {"status": "ok", "value": value}
    except WorkerTerminated as exc:
        result = {"status": "sigterm", "error_type": "WorkerTerminated", "error_message": str(exc), "traceback": traceback.format_exc()}
        code = EXIT_SIGTERM
    except BaseException as exc:  # everything the function raised is reported, never swallowed
        result = {
            "status": "oom" if is_oom(exc) else "error",
            "error_type": _qualname(exc),
            "error_message": str(exc),
            "traceback": traceback.format_exc(),
        }
        code = EXIT_ERROR
        traceback.print_exc()  # also into the streamed log
    # No more SIGTERM exceptions once the outcome is known: the result must be written.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _write(opts.result, result)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # the launcher is gone (broken pipe): exit all the same, now
            pass
    # os._exit: a process group, a DataLoader or a stray non-daemon thread must not keep
    # a finished worker alive.
    os._exit(code)


if __name__ == "__main__":
    main()
