"""Moves this Python process's wall clock by ``GPU_OPS_TEST_CLOCK_OFFSET_S`` seconds.

Put on ``PYTHONPATH`` by ``gpu_ops_tests/conftest.py`` when the suite runs with
``--clock``, so that every process of a test (xdist workers, Dagster run and step
processes, the CLI, workers) sees the same shifted wall clock; the clock ticks, and the
monotonic clock is left alone (timeouts keep their length). Without the variable it does
nothing. Only ``time.time``/``datetime.now`` and their kin move (time-machine); a
database server's clock does not.
"""

import os

_offset = os.environ.get("GPU_OPS_TEST_CLOCK_OFFSET_S")
if _offset:
    import time

    import time_machine

    time_machine.travel(time.time() + float(_offset), tick=True).start()
