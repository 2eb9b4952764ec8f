"""Load time of the code location next to `import dagster` alone, in the same run.

Each figure is the median of fresh interpreter starts (imports are cached per process,
so every sample is a new process). Goal: gpu_ops.definitions at most 1.5x `import dagster`.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time

RUNS = 5


def sample(code: str) -> float:
    times = []
    for _ in range(RUNS):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    bare = sample("pass")
    dagster = sample("import dagster")
    location = sample("import gpu_ops.definitions")
    leaks = subprocess.run(
        [sys.executable, "-c", "import sys, gpu_ops.definitions; print(','.join(m for m in ('torch','kubetorch','pandas','numpy','pyarrow','sqlalchemy','httpx','kubernetes','fsspec') if m in sys.modules) or 'none')"],
        check=True, capture_output=True, text=True,
    ).stdout.strip()
    print(f"interpreter start        {bare:6.2f} s")
    print(f"import dagster           {dagster:6.2f} s")
    print(f"import gpu_ops.definitions {location:6.2f} s  ratio {location / dagster:.2f}x import dagster (goal <= 1.5x)")
    print(f"heavy modules imported by the code location: {leaks}")


if __name__ == "__main__":
    main()
