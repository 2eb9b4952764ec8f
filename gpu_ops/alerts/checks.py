"""`gpu-ops validate` check for the alert channels: every secret a channel needs is set.

Register as ``"gpu_ops.alerts.checks:check_channels"`` in ``gpu_ops.validate.CHECKS``.
"""

from __future__ import annotations

from gpu_ops.config import GpuOpsConfig, SecretRef
from gpu_ops.validate import CheckResult


def check_channels(config: GpuOpsConfig) -> CheckResult:
    if not config.channels:
        return CheckResult("channels", "skipped", "no channels configured (budgets notify nobody)")
    missing = []
    for name, ch in sorted(config.channels.items()):
        refs = [getattr(ch, attr, None) for attr in ("webhook_url", "routing_key", "url", "secret")]
        smtp = getattr(ch, "smtp", None)
        refs.append(getattr(smtp, "password", None) if smtp else None)
        missing += [f"{name}: ${ref.env}" for ref in refs if isinstance(ref, SecretRef) and not ref.is_set()]
    unused = sorted(set(config.channels) - {c for b in config.budgets for c in b.channels})
    note = f"; not used by any budget: {', '.join(unused)}" if unused else ""
    if missing:
        return CheckResult(
            "channels",
            "failed",
            "secrets not set: " + ", ".join(missing) + note,
            "export those variables where the Dagster daemon and run workers start (the Helm chart: a Secret in envFrom); "
            "then `gpu-ops alerts test <channel>` sends a marked test notification",
        )
    return CheckResult("channels", "ok", f"{len(config.channels)} channel(s), every secret set{note}")
