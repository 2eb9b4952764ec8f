"""Where the node inventory comes from, read once for every consumer (:func:`load_inventory`).

Design: docs/concepts/cost-sources.md#the-cost-flow-end-to-end
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpu_ops.flows.cost.engine import UsageInput
from gpu_ops.flows.cost.read import INVENTORY, read_files
from gpu_ops.domain.cost.sources import SourceSet

if TYPE_CHECKING:
    from gpu_ops.flows.cost.window import ReadStats, Window


def load_inventory(sources: SourceSet, store: Any = None, window: Window | None = None, stats: ReadStats | None = None) -> UsageInput | None:
    """The node inventory as the engine takes it, or None without one: its files (a CSV
    line that cannot be split, an unreadable file: problems the quarantine names, never a
    shifted row) and the Karpenter nodes recorded in ``store`` (with a ``window``, those
    that can touch it)."""
    if not sources.has_inventory:
        return None
    inventory = UsageInput(source="inventory")
    if sources.inventory_files:
        got = read_files(sources.inventory_files, sources.base_dir, kind=INVENTORY)
        inventory.files, inventory.problems = got.files, got.problems
    if sources.inventory_karpenter:
        from gpu_ops.flows.cost import kubernetes as k8s
        from gpu_ops.flows.cost.usage import read_intervals

        inventory.frames.append(read_intervals(store, k8s.COLLECTED_NODES_TABLE, window, stats))
    return inventory
