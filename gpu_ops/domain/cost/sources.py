"""`SourceSet`: which usage and inventory sources a configuration names.

Re-exported by :mod:`gpu_ops.flows.cost.pipeline`. Kept apart (no pandas, no pydantic) because the code
location decides at load time whether to register the collector job.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the configuration's models need pydantic: `cost attribution --usage` does not load it
    from gpu_ops.domain.config import GpuOpsConfig, KubernetesSource


@dataclass
class SourceSet:
    """What to read: files, the ledger table, Kubernetes, and the inventory."""

    usage_files: list[str] = field(default_factory=list)
    lookback_days: dict[str, int] = field(default_factory=dict)  # per usage file pattern (default 1)
    ledger: bool = False
    kubernetes: list["KubernetesSource"] = field(default_factory=list)
    inventory_files: list[str] = field(default_factory=list)
    inventory_karpenter: bool = False
    base_dir: Path | None = None
    collected_retention_days: int | None = None

    @classmethod
    def from_config(cls, config: "GpuOpsConfig") -> "SourceSet":
        from gpu_ops.domain.config import FileSource, KubernetesSource, LedgerSource

        s = cls(base_dir=config.base_dir, collected_retention_days=config.usage.collected_retention_days)
        for src in config.usage.sources:
            if isinstance(src, FileSource):
                s.usage_files.append(src.path)
                s.lookback_days[src.path] = src.lookback_days
            elif isinstance(src, LedgerSource):
                s.ledger = True
            elif isinstance(src, KubernetesSource):
                s.kubernetes.append(src)
        inv = config.usage.inventory
        if inv is not None:
            if inv.type == "file":
                s.inventory_files.append(inv.path or "")
            else:
                s.inventory_karpenter = True
        return s

    @property
    def has_inventory(self) -> bool:
        return bool(self.inventory_files) or self.inventory_karpenter

    @property
    def count(self) -> int:
        return (1 if self.usage_files else 0) + int(self.ledger) + len(self.kubernetes)
