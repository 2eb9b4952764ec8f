"""Per-GPU-hour prices as a lookup matrix: gpu type × capacity type (× region multiplier).

A :class:`~gpu_ops.config.PriceTable` is turned into a small dense matrix so that pricing
ten million intervals is two integer look-ups, not a join. A missing price is ``NaN`` and
the caller quarantines the row: nothing is ever priced at zero or at a default.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpu_ops.config import PriceTable

CAPACITY_TYPES = ("spot", "on-demand", "reserved")
SHARING_MODES = ("none", "mig", "mps", "timeslice")


@dataclass(frozen=True)
class PriceMatrix:
    gpu_types: tuple[str, ...]
    matrix: np.ndarray  # [gpu, capacity] -> USD per GPU-hour, NaN when not priced
    regions: dict[str, float]
    currency: str
    source: str

    @classmethod
    def from_table(cls, table: PriceTable) -> "PriceMatrix":
        gpu_types = tuple(sorted(table.gpus))
        matrix = np.full((len(gpu_types), len(CAPACITY_TYPES)), np.nan)
        for i, gpu in enumerate(gpu_types):
            for capacity, price in table.gpus[gpu].items():
                matrix[i, CAPACITY_TYPES.index(capacity)] = float(price)
        regions = {name: float(adj.multiplier) for name, adj in table.regions.items()}
        return cls(gpu_types, matrix, regions, table.currency, table.source)

    def gpu_index(self, gpu_type: str) -> int:
        try:
            return self.gpu_types.index(gpu_type)
        except ValueError:
            return -1

    def price(self, gpu_type: str, capacity_type: str) -> float:
        i = self.gpu_index(gpu_type)
        if i < 0 or capacity_type not in CAPACITY_TYPES:
            return float("nan")
        return float(self.matrix[i, CAPACITY_TYPES.index(capacity_type)])

    def lookup(self, gpu_codes: np.ndarray, capacity_codes: np.ndarray) -> np.ndarray:
        """Vectorised price; codes of -1 (unknown type or capacity) give NaN."""
        # A NaN row and column at the end: index -1 lands there, no masking pass needed.
        padded = np.full((self.matrix.shape[0] + 1, self.matrix.shape[1] + 1), np.nan)
        padded[:-1, :-1] = self.matrix
        return padded[gpu_codes, capacity_codes]

    def on_demand(self, gpu_codes: np.ndarray) -> np.ndarray:
        """On-demand price per row (what the GPU-hour would have cost without a discount)."""
        col = np.append(self.matrix[:, CAPACITY_TYPES.index("on-demand")], np.nan)
        return col[gpu_codes]

    def region_multiplier(self, region: str) -> float:
        """1.0 for no region or when the table has no regional prices; NaN for an unlisted region."""
        if not region or not self.regions:
            return 1.0
        return self.regions.get(region, float("nan"))

    def describe_missing(self, gpu_type: str, capacity_type: str) -> str:
        have = [c for c in CAPACITY_TYPES if not np.isnan(self.price(gpu_type, c))]
        if not have:
            return f"no price for gpu type {gpu_type!r} (priced: {', '.join(self.gpu_types)})"
        return f"no price for {gpu_type} × {capacity_type} (priced capacities: {', '.join(have)})"
