"""What a launch of a training asset is expected to cost, before it starts (pure).

    estimate = GPUs × workers × GPU share × price of the capacity × expected duration

The expected duration comes from the asset's own *successful* runs in the usage ledger
(``gpu_usage_ledger``): a run's work is the wall time of its attempts less the work they
lost (``lost_seconds``), so a run that was preempted and resumed counts what training
needed, not what it paid. The median of those runs is the estimate, their 90th
percentile its p90. Each capacity then adds the preemption overhead the ledger has seen
*on that capacity* for this asset: work lost by preempted attempts per second of work
there (spot loses work, on-demand usually none). ``spot-then-on-demand`` has two legs,
both shown: the estimate is the leg the launch starts on (spot), its p90 the dearest
leg's p90 (a run that falls back to on-demand).

A run's duration is measured in wall seconds and priced at the request's GPUs, so a
CPU run of the demo (``gpu_count`` 0) still says how long the asset trains.

Without a successful run the author's declared duration (``gpu_asset(expected_duration=...)``)
is the estimate (median and p90 alike); without either the estimate says "no history"
and has no figure. Time is an input: nothing here reads a clock. No Dagster, no storage.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpu_ops.domain.compute.request import GpuRequest

if TYPE_CHECKING:
    import pandas as pd

COMPLETED = "completed"
PREEMPTED = "preempted"
HISTORY, DECLARED, NO_HISTORY = "history", "declared", "no history"


@dataclass(frozen=True)
class Leg:
    """One capacity the launch may run on: its price and what the run costs there."""

    capacity: str
    price: float | None  # per GPU-hour; None: not priced
    overhead: float  # work lost to preemptions per second of work, on this capacity
    usd: float | None
    p90_usd: float | None


@dataclass(frozen=True)
class Estimate:
    basis: str  # history | declared | no history
    runs: int  # successful runs of the asset the figures come from
    median_s: float | None  # a run's work, seconds
    p90_s: float | None
    remaining_s: float | None  # what this run still has to do (after done_s)
    remaining_p90_s: float | None
    gpus: float  # GPUs × workers × share
    legs: tuple[Leg, ...]
    currency: str = "USD"

    @property
    def usd(self) -> float | None:
        """The expected cost: the leg the launch starts on."""
        return self.legs[0].usd if self.legs else None

    @property
    def p90_usd(self) -> float | None:
        """The p90 of the dearest leg (a fallback to on-demand included); None when a leg is unknown."""
        values = [leg.p90_usd for leg in self.legs]
        return None if not values or any(v is None for v in values) else max(v for v in values if v is not None)

    def figure(self, basis: str = "estimate") -> float | None:
        """``estimate`` or ``p90``: the figure a forecast gate counts."""
        return self.p90_usd if basis == "p90" else self.usd

    def describe(self) -> str:
        if self.basis == NO_HISTORY:
            return "no history: the asset has no successful run in the usage ledger and declares no expected_duration; no estimate"
        what = f"{self.runs} successful run(s)" if self.basis == HISTORY else "the declared expected_duration"
        legs = "; ".join(_leg_text(leg, self.currency) for leg in self.legs)
        left = "" if self.remaining_s == self.median_s else f", {_hours(self.remaining_s)} left after this run's earlier attempts"
        return f"{legs} (from {what}: median {_hours(self.median_s)}, p90 {_hours(self.p90_s)} of work{left}; {self.gpus:g} GPU(s))"

    def metadata(self) -> dict[str, Any]:
        """Plain values for a table row or materialization metadata."""
        return {
            "estimate_usd": self.usd, "estimate_p90_usd": self.p90_usd, "estimate_basis": self.basis, "estimate_runs": self.runs,
            "estimate_median_s": self.median_s, "estimate_p90_s": self.p90_s, "estimate_detail": self.describe(),
        }


def _hours(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    return f"{seconds / 3600:.2f} h" if seconds >= 3600 else f"{seconds / 60:.1f} min" if seconds >= 60 else f"{seconds:.0f} s"


def _money(value: float | None, currency: str) -> str:
    return "unknown" if value is None else f"{value:,.2f} {currency}"


def _leg_text(leg: Leg, currency: str) -> str:
    if leg.price is None:
        return f"{leg.capacity}: unknown (no price for this capacity)"
    return f"{leg.capacity}: {_money(leg.usd, currency)} (p90 {_money(leg.p90_usd, currency)}; at {leg.price:g}/GPU-h, preemption overhead {leg.overhead:.0%})"


def run_work(rows: pd.DataFrame) -> pd.DataFrame:
    """Per run of ledger ``rows``: ``run_id``, ``work_s`` (attempts' seconds less lost work),
    ``completed`` (the run has a completed attempt)."""
    import pandas as pd
    if rows.empty:
        return pd.DataFrame({"run_id": pd.Series([], dtype=object), "work_s": pd.Series([], dtype=float), "completed": pd.Series([], dtype=bool)})
    seconds = (pd.to_datetime(rows["end"], utc=True) - pd.to_datetime(rows["start"], utc=True)).dt.total_seconds()
    frame = pd.DataFrame({"run_id": rows["run_id"].astype(str), "work_s": (seconds - rows["lost_seconds"].astype(float)).clip(lower=0.0), "completed": rows["outcome"] == COMPLETED})
    return frame.groupby("run_id", as_index=False, sort=True).agg(work_s=("work_s", "sum"), completed=("completed", "any"))


def preemption_overhead(rows: pd.DataFrame, capacity: str) -> float:
    """Work lost by preempted attempts on ``capacity`` per second of work there (0 without any)."""
    import pandas as pd
    if rows.empty:
        return 0.0
    on = rows[rows["capacity_type"] == capacity]
    seconds = (pd.to_datetime(on["end"], utc=True) - pd.to_datetime(on["start"], utc=True)).dt.total_seconds()
    lost = on["lost_seconds"].astype(float)
    work = float((seconds - lost).clip(lower=0.0).sum())
    lost_to_preemption = float(lost[on["outcome"] == PREEMPTED].sum())
    return lost_to_preemption / work if work > 0 else 0.0


def _durations(rows: pd.DataFrame, declared_s: float | None) -> tuple[str, int, float | None, float | None]:
    """(basis, runs, median, p90) of a run's work."""
    import numpy as np
    work = run_work(rows)
    done = work.loc[work["completed"], "work_s"].to_numpy(dtype=float)
    if len(done):
        return HISTORY, len(done), float(np.median(done)), float(np.percentile(done, 90))
    if declared_s is not None:
        return DECLARED, 0, float(declared_s), float(declared_s)
    return NO_HISTORY, 0, None, None


def _cost(gpus: float, price: float | None, seconds: float | None, overhead: float) -> float | None:
    if price is None or seconds is None or not math.isfinite(price):
        return None
    return gpus * price * seconds * (1.0 + overhead) / 3600.0


def estimate_launch(
    request: GpuRequest,
    ledger_rows: pd.DataFrame,
    prices: Mapping[str, Mapping[Any, float]],
    *,
    declared_s: float | None = None,
    asset_key: str | None = None,
    done_s: float = 0.0,
    currency: str = "USD",
    capacities: Sequence[str] | None = None,
) -> Estimate:
    """The estimate of a launch of ``request`` from the asset's ledger rows (columns of
    ``gpu_usage_ledger``; ``asset_key`` keeps that asset's rows only), ``prices`` per
    GPU-hour (``{gpu_type: {capacity: price}}``, the configuration's ``prices.gpus``).
    ``done_s``: work this run's earlier attempts did already (a retry is estimated for
    what is left). ``capacities``: the legs (default: the request's capacity types)."""
    rows = ledger_rows
    if asset_key is not None and not rows.empty:
        rows = rows[rows["asset_key"] == asset_key]
    basis, runs, median, p90 = _durations(rows, declared_s)
    left = None if median is None else max(0.0, median - done_s)
    left_p90 = None if p90 is None else max(0.0, p90 - done_s)
    gpus = request.total_gpus * request.gpu_share
    legs = []
    for capacity in capacities or request.capacity_types:
        price = prices.get(request.gpu_type, {}).get(capacity)  # type: ignore[call-overload]
        overhead = preemption_overhead(rows, capacity)
        legs.append(Leg(capacity, price, overhead, _cost(gpus, price, left, overhead), _cost(gpus, price, left_p90, overhead)))
    return Estimate(basis, runs, median, p90, left, left_p90, gpus, tuple(legs), currency)


# --------------------------------------------------------------------------- estimate against actual

ACCURACY_COLUMNS = (
    "run_id", "asset_key", "team", "project", "completed_at", "attempts", "estimate_basis", "estimate_usd", "estimate_p90_usd",
    "actual_usd", "error_usd", "abs_error_usd", "abs_pct_error", "within_p90",
)


def run_cost(rows: pd.DataFrame, prices: Mapping[str, Mapping[Any, float]], simulate_gpu_pricing: bool = False) -> pd.Series:
    """Each ledger row's cost at ``prices`` (CPU rows: 0, or as the declared GPUs with
    ``simulate_gpu_pricing``, as the asset's ``cost_usd`` prices them); NaN when unpriced."""
    import pandas as pd
    seconds = (pd.to_datetime(rows["end"], utc=True) - pd.to_datetime(rows["start"], utc=True)).dt.total_seconds()
    simulated = (rows["gpu_type"] == "cpu") & simulate_gpu_pricing
    gpu_type = rows["gpu_type"].where(~simulated, rows["declared_gpu_type"])
    count = rows["gpu_count"].astype(float).where(~simulated, rows["declared_gpu_count"].astype(float))
    price = [float("nan") if n > 0 and prices.get(g, {}).get(c) is None else float(prices.get(g, {}).get(c) or 0.0) for g, c, n in zip(gpu_type, rows["capacity_type"], count)]
    return count * rows["gpu_share"].astype(float) * seconds * pd.Series(price, index=rows.index) / 3600.0


def accuracy(ledger_rows: pd.DataFrame, estimates: pd.DataFrame, prices: Mapping[str, Mapping[Any, float]], *, simulate_gpu_pricing: bool = False) -> pd.DataFrame:
    """One row per completed run of ``ledger_rows`` that has an ``estimates`` row (the
    run's first, :func:`gpu_ops.storage.estimate_store.first_of_runs`): what it was
    estimated to cost at launch against what its attempts cost (:data:`ACCURACY_COLUMNS`)."""
    import pandas as pd
    if ledger_rows.empty or estimates.empty:
        return pd.DataFrame({c: pd.Series([], dtype=object) for c in ACCURACY_COLUMNS})
    rows = ledger_rows.assign(_cost=run_cost(ledger_rows, prices, simulate_gpu_pricing), _done=ledger_rows["outcome"] == COMPLETED)
    runs = rows.groupby(["run_id", "asset_key"], as_index=False, sort=True).agg(
        team=("team", "first"), project=("project", "first"), completed_at=("end", "max"), attempts=("attempt", "count"),
        actual_usd=("_cost", lambda c: float(c.sum()) if c.notna().all() else float("nan")), done=("_done", "any"),
    )
    runs = runs[runs["done"]].drop(columns="done")
    est = estimates[["run_id", "asset_key", "basis", "estimate_usd", "estimate_p90_usd"]].rename(columns={"basis": "estimate_basis"})
    table = runs.merge(est, on=["run_id", "asset_key"], how="inner")
    table["error_usd"] = table["actual_usd"] - table["estimate_usd"]
    table["abs_error_usd"] = table["error_usd"].abs()
    table["abs_pct_error"] = table["abs_error_usd"] / table["actual_usd"].where(table["actual_usd"] > 0) * 100.0
    table["within_p90"] = table["actual_usd"] <= table["estimate_p90_usd"]
    return table[list(ACCURACY_COLUMNS)].reset_index(drop=True)


__all__ = ["ACCURACY_COLUMNS", "accuracy", "run_cost", "DECLARED", "HISTORY", "NO_HISTORY", "Estimate", "Leg", "estimate_launch", "preemption_overhead", "run_work"]
