"""Where the node inventory comes from, read once for every consumer.

The CLI, ``gpu_usage`` (idle rows) and the CUR reconciliation (instance ids) take the
inventory from :func:`load_inventory`: files through the one reader
(:func:`gpu_ops.cost.read.read_files`, ``kind`` inventory), the Karpenter nodes the
collector recorded as a table. The engine then checks it with the rule book (``kind``
inventory: ``node`` required, a node in the fleet once at any time). No pandas unless
the Karpenter table is read: `gpu-ops cost attribution --inventory` starts light.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpu_ops.cost.engine import UsageInput
from gpu_ops.cost.read import INVENTORY, read_files
from gpu_ops.cost.sources import SourceSet

if TYPE_CHECKING:
    from gpu_ops.cost.window import ReadStats, Window


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
        from gpu_ops.cost import kubernetes as k8s
        from gpu_ops.cost.usage import read_intervals

        inventory.frames.append(read_intervals(store, k8s.COLLECTED_NODES_TABLE, window, stats))
    return inventory
