"""Load time of the code location next to `import dagster` alone, in the same run, and
with fleet-sized configurations (10,000 and 100,000 budgets) next to the old loading path.

    flock /tmp/gpu_ops_bench.lock .venv/bin/python benchmarks/load.py [--budgets 10000,100000]

Each code-location figure is the median of fresh interpreter starts (imports are cached
per process, so every sample is a new process). Goals: gpu_ops.definitions at most 1.5x
`import dagster`; 10,000 budgets load in under 1.5 s.

The configuration figures, per size, in this process:
  - new: `load_config` (fastyaml + validation with shared thresholds, linear name check),
    median of 3 in this process at 10,000 budgets (one at 100,000), wall and CPU;
  - old path: `yaml.safe_load` (pure-Python PyYAML, what the loader used before), then
    the same validation without sharing, then the quadratic `names.count` check (skipped
    above 20,000 budgets: it grows with n^2; the line says so);
and `import gpu_ops.definitions` with GPU_OPS_CONFIG pointing at that file.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RUNS = 5
QUADRATIC_LIMIT = 20_000


def sample(code: str, runs: int = RUNS, env: dict[str, str] | None = None) -> float:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, env={**os.environ, **(env or {})})
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def fleet_config(n: int, folder: Path) -> Path:
    """The shared fleet configuration (benchmarks/fleet.py), written as YAML."""
    import yaml

    from fleet import fleet_data

    path = folder / f"gpu_ops_{n}.yaml"
    path.write_text(yaml.dump(fleet_data(n, folder), Dumper=getattr(yaml, "CSafeDumper", yaml.SafeDumper), sort_keys=False))
    return path


def old_path(path: Path) -> tuple[float, float, float | None]:
    """What loading cost before: pure-Python YAML, validation, quadratic name check."""
    import yaml

    from gpu_ops.domain.config import GpuOpsConfig

    t = time.perf_counter()
    data = yaml.safe_load(path.read_text())
    yaml_s = time.perf_counter() - t
    data["prices"] = {"source": "-", "as_of": "2000-01-01", "gpus": {}}
    t = time.perf_counter()
    cfg = GpuOpsConfig.model_validate(data)
    validate_s = time.perf_counter() - t
    names_s = None
    if len(cfg.budgets) <= QUADRATIC_LIMIT:
        names = [b.name for b in cfg.budgets]
        t = time.perf_counter()
        _ = [i for i, b in enumerate(cfg.budgets) if names.count(b.name) > 1 and names.index(b.name) != i]
        names_s = time.perf_counter() - t
    return yaml_s, validate_s, names_s


def new_path(path: Path, runs: int = 3) -> tuple[float, float, float]:
    """Median of ``runs`` `load_config` calls in this process (its cache cleared): (YAML s,
    the rest s, CPU s of the whole); the YAML part timed alone as load_config runs it (the
    collector deferred). On a shared machine the CPU time says more."""
    from gpu_ops.domain.memory import collection_deferred
    from gpu_ops.domain.config import _load_cached, load_config
    from gpu_ops.domain.fastyaml import load_yaml

    samples = []
    for _ in range(runs):
        _load_cached.cache_clear()
        cpu = time.process_time()
        t = time.perf_counter()
        load_config(path)
        total, cpu_s = time.perf_counter() - t, time.process_time() - cpu
        with collection_deferred():
            t = time.perf_counter()
            load_yaml(path.read_text())
            yaml_s = time.perf_counter() - t
        samples.append((total, yaml_s, cpu_s))
    total, yaml_s, cpu_s = sorted(samples)[len(samples) // 2]
    return yaml_s, total - yaml_s, cpu_s


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--budgets", default="10000,100000", help="comma-separated sizes; empty for none")
    ap.add_argument("--old-path-max", type=int, default=100_000, help="time the old path only up to this many budgets (it takes ~400 s at 100,000)")
    args = ap.parse_args()
    sizes = [int(s) for s in args.budgets.split(",") if s]

    bare = sample("pass")
    dagster = sample("import dagster")
    location = sample("import gpu_ops.definitions")
    leaks = subprocess.run(
        [sys.executable, "-c", "import sys, gpu_ops.definitions; print(','.join(m for m in ('torch','kubetorch','pandas','numpy','pyarrow','sqlalchemy','httpx','kubernetes','fsspec') if m in sys.modules) or 'none')"],
        check=True, capture_output=True, text=True,
    ).stdout.strip()
    print(f"load average: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f} on {os.cpu_count()} CPUs")
    print(f"interpreter start        {bare:6.2f} s")
    print(f"import dagster           {dagster:6.2f} s")
    print(f"import gpu_ops.definitions {location:6.2f} s  ratio {location / dagster:.2f}x import dagster (goal <= 1.5x)")
    print(f"heavy modules imported by the code location: {leaks}")

    with tempfile.TemporaryDirectory() as tmp:
        for n in sizes:
            path = fleet_config(n, Path(tmp))
            new_yaml, new_parse, new_cpu = new_path(path, runs=3 if n <= 10_000 else 1)
            old = old_path(path) if n <= args.old_path_max else None
            runs = 3 if n <= 10_000 else 1
            code_location = sample("import gpu_ops.definitions", runs=runs, env={"GPU_OPS_CONFIG": str(path), "GPU_OPS_HOME": tmp})
            if old is not None:
                old_yaml, old_validate, old_names = old
                old_total = old_yaml + old_validate + (old_names or 0.0)
                names = f"{old_names:.2f} s" if old_names is not None else f"skipped (quadratic: about {(n / 10_000) ** 2:.0f}x the 10,000-budget figure)"
            print(f"\n{n:,} budgets ({path.stat().st_size / 1e6:.1f} MB of YAML), load average {os.getloadavg()[0]:.2f}:")
            print(f"  new  load_config            {new_yaml + new_parse:7.2f} s  (YAML {new_yaml:.2f} s, validation and checks {new_parse:.2f} s; CPU {new_cpu:.2f} s)   goal at 10,000: < 1.5 s; load average now {os.getloadavg()[0]:.2f}")
            if old is not None:
                print(f"  old  path                   {old_total:7.2f} s  (yaml.safe_load {old_yaml:.2f} s, validation {old_validate:.2f} s, names.count {names})")
            else:
                print(f"  old  path                   not timed (--old-path-max {args.old_path_max})")
            print(f"  import gpu_ops.definitions  {code_location:7.2f} s  with GPU_OPS_CONFIG = this file (median of {runs}; {code_location - location:.2f} s over the plain defaults)")


if __name__ == "__main__":
    main()
