"""`gpu-ops validate` checks of the cost flow: do the configured usage files exist and
open, and can the CUR index be kept where ``usage.billing.index_path`` says?"""

from __future__ import annotations

from gpu_ops.domain.config import GpuOpsConfig
from gpu_ops.domain.check_result import CheckResult, folder_setting
from gpu_ops.flows.cost.billing import index_folder
from gpu_ops.flows.cost.read import INVENTORY, probe_files
from gpu_ops.domain.cost.sources import SourceSet


def check_cur_index(config: GpuOpsConfig) -> CheckResult:
    """``usage.billing.index_path`` (default ``<GPU_OPS_HOME>/cur_index``): the folder the
    per-day index of each CUR file is written to."""
    if config.usage.billing is None:
        return CheckResult("cur_index", "skipped", "no usage.billing: no CUR file is indexed")
    path = index_folder(config)
    problem = folder_setting("cur_index", path, "usage.billing.index_path", "the first read of the bill")
    return problem or CheckResult("cur_index", "ok", f"{path} (usage.billing.index_path) is a writable folder")


def check_usage_sources(config: GpuOpsConfig) -> CheckResult:
    """Every file pattern of ``usage.sources`` (and a file inventory) matches at least one
    file, and the files open with the format's columns, judged as the read judges them
    (headers and Parquet footers only).
    A ``{date}`` placeholder is checked as any day (``*``)."""
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
