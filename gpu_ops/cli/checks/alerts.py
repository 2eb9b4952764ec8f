"""`gpu-ops validate` check for the alert channels: every secret a channel needs is set, and
each URL among them is an http(s) URL.

Register as ``"gpu_ops.cli.checks.alerts:check_channels"`` in ``gpu_ops.cli.validate.CHECKS``.
"""

from __future__ import annotations

from gpu_ops.domain.config import GpuOpsConfig, SecretRef, is_http_url
from gpu_ops.domain.check_result import CheckResult


def check_channels(config: GpuOpsConfig) -> CheckResult:
    """Every secret a channel reads is set, and each that is a URL reads as an http(s) URL
    (named by its variable; a value is never shown)."""
    if not config.channels:
        return CheckResult("channels", "skipped", "no channels configured (budgets notify nobody)")
    missing, not_urls = [], []
    for name, ch in sorted(config.channels.items()):
        for ref, is_url in ch.secrets().values():
            if not isinstance(ref, SecretRef):
                continue  # written in the file: checked as it loaded
            if not ref.is_set():
                missing.append(f"{name}: ${ref.env}")
            elif is_url and not is_http_url(ref.get()):
                not_urls.append(f"{name}: ${ref.env}")
    unused = sorted(set(config.channels) - {c for b in config.budgets for c in b.channels})
    note = f"; not used by any budget: {', '.join(unused)}" if unused else ""
    problems = "; ".join(p for p in (missing and "secrets not set: " + ", ".join(missing), not_urls and "not http(s) URLs: " + ", ".join(not_urls)) if p)
    if problems:
        return CheckResult(
            "channels",
            "failed",
            problems + note,
            "export those variables (URLs as https://host/...) where the Dagster daemon and run workers start (the Helm chart: a Secret in envFrom); "
            "then `gpu-ops alerts test <channel>` sends a marked test notification",
        )
    return CheckResult("channels", "ok", f"{len(config.channels)} channel(s), every secret set{note}")
