"""`gpu-ops validate` check of the cost flow: do the configured usage files exist and open?"""

from __future__ import annotations

from gpu_ops.config import GpuOpsConfig
from gpu_ops.validate import CheckResult


def check_usage_sources(config: GpuOpsConfig) -> CheckResult:
    """Every file pattern of ``usage.sources`` (and a file inventory) matches at least one
    file, and the files open with the format's columns, judged as the read judges them
    (headers and Parquet footers only).
    A ``{date}`` placeholder is checked as any day (``*``)."""
    from gpu_ops.cost.read import INVENTORY, probe_files
    from gpu_ops.cost.sources import SourceSet

    sources = SourceSet.from_config(config)
    if not sources.usage_files and not sources.inventory_files:
        return CheckResult("usage_sources", "skipped", "no file sources configured (usage comes from the ledger or the collector)")
    any_day = [p.replace("{date}", "*") for p in sources.usage_files]
    seen, problems = probe_files(any_day, sources.base_dir)
    if sources.inventory_files:
        inv_seen, inv_problems = probe_files([p.replace("{date}", "*") for p in sources.inventory_files], sources.base_dir, INVENTORY)
        seen, problems = seen + inv_seen, problems + inv_problems
    if problems:
        return CheckResult(
            "usage_sources", "failed", "; ".join(problems),
            "fix usage.sources[].path (patterns resolve against the config file's folder) or the files named: "
            "a pattern that matches nothing would price the day at $0",
        )
    return CheckResult("usage_sources", "ok", f"{len(sources.usage_files) + len(sources.inventory_files)} pattern(s) match {seen} file(s), each with the usage columns")
