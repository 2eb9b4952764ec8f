"""The local backend's worker process: ``python -m gpu_ops.compute.worker --payload P --result R``.

Runs one rank of a launch. The callable arrives pickled *by reference* (module + name),
exactly as Kubetorch ships it, so the worker imports the author's module itself. The
outcome is written to the result file (pickle) before exiting:

- ``{"status": "ok", "value": ...}``, exit 0
- ``{"status": "error" | "oom", "error_type", "error_message", "traceback"}``, exit 1
- ``{"status": "sigterm", ...}``, exit 143: SIGTERM arrived; :class:`WorkerTerminated`
  was raised inside the function so it could checkpoint on the way out.

The command line names the payload, so a worker is identifiable with ``ps``. Kept free
of Dagster imports: a worker must start fast.
"""

from __future__ import annotations

import argparse
import os
import pickle
import signal
import sys
import threading
import time
import traceback
from typing import Any

from gpu_ops.compute.backend import WorkerTerminated

EXIT_ERROR = 1
EXIT_SIGTERM = 128 + signal.SIGTERM  # 143, what a shell reports for a SIGTERMed process

_terminating = False


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


def is_oom(exc: BaseException | None) -> bool:
    """MemoryError, ``torch.cuda.OutOfMemoryError`` (or CUDA OOM text), anywhere in the chain."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, MemoryError):
            return True
        for cls in type(exc).__mro__:
            if cls.__name__ == "OutOfMemoryError" and cls.__module__.startswith("torch"):
                return True
        if isinstance(exc, RuntimeError) and "CUDA out of memory" in str(exc):
            return True
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
    os.replace(tmp, path)  # the parent never reads half a result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpu_ops.compute.worker")
    parser.add_argument("--payload", required=True)
    parser.add_argument("--result", required=True)
    opts = parser.parse_args(argv)

    signal.signal(signal.SIGTERM, _on_sigterm)
    _watch_parent(os.getppid(), float(os.environ.get("GPU_OPS_GRACE_S", "30")))

    code = 0
    try:
        with open(opts.payload, "rb") as f:
            payload = pickle.load(f)
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
    sys.stdout.flush()
    sys.stderr.flush()
    # os._exit: a process group, a DataLoader or a stray non-daemon thread must not keep
    # a finished worker alive.
    os._exit(code)


if __name__ == "__main__":
    main()
