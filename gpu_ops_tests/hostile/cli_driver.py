"""Run many `gpu-ops` command lines in one real process (the corpus test's CLI leg).

Starting Python, pandas and pyarrow costs about a second per process; the corpus has
almost a hundred cases. This driver is started once as a subprocess, runs the real
console entry point (``gpu_ops.cli:main``, standalone mode: click's own exit codes and
error printing) once per JSON line on stdin, and writes one JSON line per case with the
exit status and what the command wrote to stdout and stderr. An exception that escapes
the command is printed the way Python prints it (a ``Traceback``), so the test sees it.
A few cases are also run as separate ``gpu-ops`` processes to check that both agree.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import traceback


def run_one(argv: list[str], cwd: str) -> dict[str, object]:
    from gpu_ops.cli import main

    out, err = io.StringIO(), io.StringIO()
    code: object = 0
    old = os.getcwd()
    os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                main(argv, prog_name="gpu-ops", standalone_mode=True)
            except SystemExit as exc:
                code = exc.code if exc.code is not None else 0
            except BaseException:  # what an uncaught exception looks like on a terminal
                traceback.print_exc()
                code = 1
    finally:
        os.chdir(old)
    return {"exit": code if isinstance(code, int) else 1, "stdout": out.getvalue(), "stderr": err.getvalue()}


def main() -> None:
    for line in sys.stdin:
        if line.strip():
            req = json.loads(line)
            sys.__stdout__.write(json.dumps({"id": req["id"], **run_one(req["argv"], req["cwd"])}) + "\n")
            sys.__stdout__.flush()


if __name__ == "__main__":
    main()
