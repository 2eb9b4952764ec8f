"""`gpu-ops validate`: each check says what is wrong and how to fix it.

Checks are plain functions ``(config) -> CheckResult``; each flow contributes its own
(registered in ``CHECKS`` below). The command exits non-zero when any check fails.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Callable

import click

from gpu_ops.domain.check_result import CheckResult, folder_setting, not_yet_created
from gpu_ops.domain.config import ConfigError, GpuOpsConfig, load_config
from gpu_ops.errors import UnknownCheck


def check_row_level_path(config: GpuOpsConfig) -> CheckResult:
    """``storage.row_level_path``: the folder the row-level tables' Parquet files go to."""
    if not config.storage.row_level_path:
        return CheckResult("row_level_path", "skipped", "storage.row_level_path is not set: row-level tables are SQL tables")
    path = Path(config.storage.row_level_path)
    problem = folder_setting("row_level_path", path, "storage.row_level_path", "the first materialization of gpu_usage")
    return problem or CheckResult("row_level_path", "ok", f"{path} (storage.row_level_path) is a writable folder")


def check_storage(config: GpuOpsConfig) -> CheckResult:
    from gpu_ops.storage.tables import StorageError, TableStore, display_url

    url = config.storage.resolved_url() if isinstance(config.storage.url, str) and config.storage.url.startswith("sqlite:///") else ""
    if url and url != "sqlite:///:memory:":  # opening a SQLite file creates it: look, don't touch
        missing = not_yet_created("storage", Path(url[len("sqlite:///"):]), "the first write (a materialization or a training run)", "storage.url", shown=url)
        if missing is not None:
            return missing
    try:
        store = TableStore.from_config(config)
        store.ping()
    except ConfigError as exc:
        return CheckResult("storage", "failed", str(exc), "export the variable, or set storage.url in the config file")
    except StorageError as exc:  # names the database (password hidden) and what to check
        return CheckResult("storage", "failed", str(exc), "check storage.url and the database server it names (the message says what failed)")
    return CheckResult("storage", "ok", f"{display_url(store.url)} ({store.dialect}) accepts connections")


# "module:function" so that a check's heavy imports (kubernetes, torch) stay in the check.
CHECKS: list[str] = [
    "gpu_ops.cli.validate:check_storage",
    "gpu_ops.cli.validate:check_row_level_path",
    "gpu_ops.cli.checks.compute:check_kubeconfig",
    "gpu_ops.cli.checks.compute:check_kubetorch",
    "gpu_ops.cli.checks.compute:check_karpenter",
    "gpu_ops.cli.checks.compute:check_gpu",
    "gpu_ops.cli.checks.training:check_checkpoints",
    "gpu_ops.cli.checks.training:check_orphaned_attempts",
    "gpu_ops.cli.checks.alerts:check_channels",
    "gpu_ops.cli.checks.cost:check_usage_sources",
    "gpu_ops.cli.checks.cost:check_cur_index",
]


def check_names() -> list[str]:
    """What ``--only`` takes: each registered check's function name without ``check_``."""
    return [ref.partition(":")[2].removeprefix("check_") for ref in CHECKS]


def _same_name(a: str, b: str) -> bool:
    return a.replace(" ", "_").lower() == b.replace(" ", "_").lower()


def run_checks(config: GpuOpsConfig, only: str | None = None) -> list[CheckResult]:
    """Every check, or only the one named (by its registered name or the name it prints).

    An ``only`` that names no check raises :class:`UnknownCheck`: a typo must not pass
    for a clean bill of health.
    """
    refs = CHECKS if only is None else [r for r in CHECKS if _same_name(r.partition(":")[2].removeprefix("check_"), only)] or CHECKS
    results: list[CheckResult] = []
    for ref in refs:
        module, _, attr = ref.partition(":")
        check: Callable[[GpuOpsConfig], CheckResult | list[CheckResult]] = getattr(importlib.import_module(module), attr)
        try:
            out = check(config)
        except Exception as exc:  # a crashing check is itself a failed check, not a crash
            out = CheckResult(attr.removeprefix("check_"), "failed", f"the check itself failed: {type(exc).__name__}: {exc}")
        for result in out if isinstance(out, list) else [out]:
            if only is None or len(refs) == 1 or _same_name(result.name, only):
                results.append(result)
    if only is not None and not results:
        raise UnknownCheck(f"no check named {only!r}; the checks are: {', '.join(check_names())}")
    return results


_MARK = {"ok": "ok  ", "failed": "FAIL", "skipped": "skip"}


@click.command()
@click.option("--config", "config_path", type=click.Path(dir_okay=False), help="gpu_ops YAML file (default: $GPU_OPS_CONFIG, then the plain defaults)")
@click.option("--only", help="run only the check with this name, as printed: " + ", ".join(check_names()))
@click.option("--settle-orphans", is_flag=True, help="settle training attempts whose owner is gone (bill what ran, stop workers, release leases) and send the telemetry still queued; validate writes nothing otherwise")
def validate(config_path: str | None, only: str | None, settle_orphans: bool) -> None:
    """Check configuration, storage, cluster and GPU; say how to fix each problem."""
    try:
        config = load_config(config_path)
    except ConfigError as exc:
        click.echo("FAIL config: the configuration file has problems:")
        for problem in exc.problems:
            click.echo(f"     - {problem}")
        click.echo("     fix: correct the fields named above")
        raise SystemExit(1) from None
    click.echo(f"ok   config: {config.source_path}")
    if settle_orphans:
        from gpu_ops.cli.checks.training import check_orphaned_attempts

        settled = check_orphaned_attempts(config, settle=True)
        click.echo(f"{_MARK[settled.status]} {settled.name}: {settled.detail}")
    try:
        results = run_checks(config, only)
    except UnknownCheck as exc:
        raise click.BadParameter(str(exc), param_hint="--only") from None
    for r in results:
        click.echo(f"{_MARK[r.status]} {r.name}: {r.detail}")
        if r.failed and r.fix:
            click.echo(f"     fix: {r.fix}")
    if any(r.failed for r in results):
        raise SystemExit(1)
