"""One launch attempt in its own process, as a Dagster step process runs it:
``python -m gpu_ops_tests.compute.standby_attempt FOLDER OWNER_PID add|sleep_forever``.
Its standbys are parked when it ends (a retry may follow), and its lines go to stdout."""

from __future__ import annotations

import sys
from pathlib import Path

from gpu_ops.flows.compute.local import LocalBackend
from gpu_ops.flows.compute.standby import StandbyScope
from gpu_ops_tests.compute import worker_fns


def main() -> None:
    folder, owner, fn = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    scope = StandbyScope(run_id="run-1", launch="train", folder=folder, idle_s=600.0, owner_pid=owner)
    backend = LocalBackend(name="attempt", workdir=folder.parent / "work", standby=scope, warm=("json",))
    args = (1, 2) if fn == "add" else ()
    report = backend.run(getattr(worker_fns, fn), args, env={"GPU_OPS_TEST_VALUE": "v"}, log=lambda line: print(line, flush=True))
    print(f"exit {report.exit.value}", flush=True)
    backend.park_spares()
    backend.teardown()


if __name__ == "__main__":
    main()
