"""Per-GPU-hour prices as a lookup matrix: gpu type × capacity type (× region multiplier).

A :class:`~gpu_ops.domain.config.PriceTable` is turned into a small dense matrix so that pricing
ten million intervals is two integer look-ups, not a join. A missing price is ``NaN`` and
the caller quarantines the row: nothing is ever priced at zero or at a default.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from gpu_ops.domain.compute.catalog import PRICE_CHECK_CURRENCIES, UnknownGpuType, canonical_gpu_type, price_problem
from gpu_ops.domain.cost.columns import CAPACITY_TYPES

if TYPE_CHECKING:
    from gpu_ops.domain.config import PriceTable



@dataclass(frozen=True)
class PriceMatrix:
    """USD per GPU-hour by GPU type and capacity type (spot, on-demand, reserved), with the
    regions' multipliers: what every usage row is priced from (``from_table`` builds it
    from the configuration's ``prices``)."""

    gpu_types: tuple[str, ...]
    matrix: np.ndarray  # [gpu, capacity] -> USD per GPU-hour, NaN when not priced
    regions: dict[str, float]
    currency: str
    source: str

    @classmethod
    def from_table(cls, table: "PriceTable") -> "PriceMatrix":
        regions = {name: float(adj.multiplier) for name, adj in table.regions.items()}
        return cls.of(table.gpus, regions, table.currency, table.source)

    @classmethod
    def of(cls, gpus: Mapping[str, Mapping[Any, float]], regions: dict[str, float], currency: str, source: str) -> "PriceMatrix":
        gpu_types = tuple(sorted(gpus))
        matrix = np.full((len(gpu_types), len(CAPACITY_TYPES)), np.nan)
        for i, gpu in enumerate(gpu_types):
            for capacity, price in gpus[gpu].items():
                matrix[i, CAPACITY_TYPES.index(capacity)] = float(price)
        return cls(gpu_types, matrix, regions, currency, source)

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


# --------------------------------------------------------------------------- a light reading
# The `cost attribution` command reads a prices file without loading pydantic: the plain,
# valid shape is read here; anything else (a problem, or a form this reading does not
# know) is left to :class:`gpu_ops.domain.config.PriceTable`, the one home of the rules' wording.
# This reading never accepts what the model refuses (a test holds the two together).

_PRICE_KEYS = {"currency", "source", "as_of", "gpus", "regions"}


def _positive(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def _gpu_entry(name: Any, entry: Any, check: bool) -> tuple[str, dict[str, float]] | None:
    """(canonical name, prices) of one plain, plausible entry, or None."""
    if not isinstance(name, str) or not isinstance(entry, Mapping) or not entry:
        return None
    deliberate = entry.get("deliberate", False)
    prices = {k: v for k, v in entry.items() if k != "deliberate"}
    if not isinstance(deliberate, bool) or not prices or not all(k in CAPACITY_TYPES and _positive(v) for k, v in prices.items()):
        return None
    try:
        canonical = canonical_gpu_type(name)
    except UnknownGpuType:
        return None
    if check and not deliberate and any(price_problem(canonical, k, float(v)) for k, v in prices.items()):
        return None
    return canonical, {k: float(v) for k, v in prices.items()}


def _regions(data: Any) -> dict[str, float] | None:
    if not isinstance(data, Mapping):
        return None
    out = {}
    for name, adj in data.items():
        if not isinstance(name, str) or not isinstance(adj, Mapping) or set(adj) - {"multiplier"}:
            return None
        multiplier = adj.get("multiplier", 1.0)
        if not _positive(multiplier):
            return None
        out[name] = float(multiplier)
    return out


def plain_price_matrix(data: Any) -> PriceMatrix | None:
    """A :class:`PriceMatrix` from a prices file's plain, valid mapping; None when the
    :class:`~gpu_ops.domain.config.PriceTable` model must judge it (errors, unusual forms)."""
    if not isinstance(data, Mapping) or set(data) - _PRICE_KEYS or not isinstance(data.get("gpus"), Mapping):
        return None
    currency, source = data.get("currency", "USD"), data.get("source")
    if not isinstance(currency, str) or not isinstance(source, str) or type(data.get("as_of")) is not dt.date:
        return None
    regions = _regions(data.get("regions", {}))
    gpus: dict[str, dict[str, float]] = {}
    for name, entry in data["gpus"].items():
        got = _gpu_entry(name, entry, currency.upper() in PRICE_CHECK_CURRENCIES)
        if got is None or got[0] in gpus:
            return None
        gpus[got[0]] = got[1]
    return None if regions is None else PriceMatrix.of(gpus, regions, currency, source)
