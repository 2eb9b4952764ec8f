"""The two gates a GPU launch passes, as Dagster resources that ``GpuCompute`` depends on:
:class:`BudgetGate` and :class:`GpuAdmission`.

Design: docs/concepts/compute.md#admission
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import dagster as dg
from pydantic import Field

from gpu_ops.dagster.failures import LaunchRefused
from gpu_ops.domain.alerts.model import Refusal
from gpu_ops.domain.compute.request import GpuRequest
from gpu_ops.domain.config import load_config

Say = Callable[[str], None]


def assert_launch_allowed(source: Any, request: Any, *, now: dt.datetime | None = None) -> None:
    """Raise :class:`gpu_ops.dagster.failures.LaunchRefused` (a ``dg.Failure``, never retried) when
    a budget blocks or throttles this launch; ``source`` is a GpuOpsConfig, a TableStore, a
    storage URL or None (the loaded configuration). An unreadable enforcement table lets the
    launch go ahead (logged): see :func:`gpu_ops.flows.alerts.enforcement.check_launch`."""
    from gpu_ops.flows.alerts.enforcement import check_launch

    _refuse(check_launch(source, request, now=now))


def assert_forecast_allowed(config: Any, request: Any, estimate: Any, *, now: dt.datetime | None = None, store: Any = None) -> None:
    """Raise :class:`gpu_ops.dagster.failures.LaunchRefused` when ``estimate`` would carry an
    enforced budget past its line (``alerts.launch_forecast``): see
    :func:`gpu_ops.flows.alerts.forecast.check_forecast`."""
    from gpu_ops.flows.alerts.forecast import check_forecast

    _refuse(check_forecast(config, request, estimate, now=now, store=store))


def _refuse(refusal: Refusal | None) -> None:
    if refusal is not None:
        raise LaunchRefused(refusal.reason, metadata=dict(refusal.metadata))


class BudgetGate(dg.ConfigurableResource):
    """Refuses launches that an enforced budget blocks or throttles (``alerts.enforcement``)."""

    enabled: bool = Field(default=True, description="Refuse launches that an enforced budget blocks or throttles.")
    config_path: str | None = Field(default=None, description="gpu_ops YAML whose storage holds budget enforcement (default: $GPU_OPS_CONFIG, then the demo).")

    def check(self, request: GpuRequest, estimate: Any = None, config_path: str | None = None) -> None:
        """Refuse the launch when an enforced budget blocks or throttles it, or when its
        ``estimate`` (:class:`gpu_ops.domain.training.estimate.Estimate`) would carry one past its
        threshold (``alerts.launch_forecast``). A gate that names no configuration reads
        ``config_path`` (the launching resource's)."""
        if not self.enabled:
            return
        config = load_config(self.config_path or config_path)
        assert_launch_allowed(config, request)
        if estimate is not None:
            assert_forecast_allowed(config, request, estimate)


@dataclass
class _Waiting:
    """The admission loop's state: since when, the next pause, what was said last."""

    started: float
    wait_s: float
    said: tuple[str | None, float] = (None, 0.0)

    def waited(self) -> float:
        return time.monotonic() - self.started


class GpuAdmission(dg.ConfigurableResource):
    """Takes a fenced lease on a launch's GPUs under ``compute.quotas`` (see the module docstring)."""

    config_path: str | None = Field(default=None, description="gpu_ops YAML with compute.quotas and compute.admission (default: $GPU_OPS_CONFIG, then the demo).")

    def admit(
        self, request: GpuRequest, *, pools: list[str], run_id: str, asset_key: str, info: Say, warn: Say, fence_path: str | None = None, reclaimer: Any = None,
        config_path: str | None = None,
    ) -> Any:
        """``reclaimer``: the launch's backend (``make_gone``), which stops the workers of
        expired leases before they are handed on; without one only leases that recorded no
        worker are reclaimed. An admission that names no configuration reads
        ``config_path`` (the launching resource's)."""
        config = load_config(self.config_path or config_path)
        from gpu_ops.storage.quota import LeaseBook, Quotas
        from gpu_ops.storage.tables import TableStore

        quotas = Quotas(team=dict(config.compute.quotas.team), pool=dict(config.compute.quotas.pool))
        if not quotas or request.total_gpus == 0:
            return None
        settings = config.compute.admission
        book = LeaseBook(TableStore.from_config(config), settings.lease_ttl_s, reclaimer=reclaimer)
        state = _Waiting(time.monotonic(), settings.backoff_s)
        while True:
            admission = _try(book, quotas, request, pools, run_id, asset_key)
            _report_reclaimed(admission, settings.lease_ttl_s, warn)
            if admission.granted and admission.lease is not None:
                return _hold(book, admission, settings.lease_ttl_s, state, info, warn, fence_path)
            _wait(admission.reason, state, settings, warn)


def _try(book: Any, quotas: Any, request: GpuRequest, pools: list[str], run_id: str, asset_key: str) -> Any:
    from gpu_ops.storage.quota import Admission, QuotaExceeded

    try:
        return book.try_acquire(quotas, team=request.labels.team, pools=pools, gpus=request.total_gpus, run_id=run_id, asset_key=asset_key)
    except QuotaExceeded as exc:
        raise LaunchRefused(f"launch refused: {exc} (compute.quotas)", metadata={"refused_by": "compute.quotas"}) from None
    except Exception as exc:
        unavailable = book.store.unavailable(exc)
        if unavailable is None:
            raise
        # Nothing can be read or written: no lease can be checked, reclaimed or granted.
        return Admission(False, f"{unavailable} (admitting nobody until it answers)")


def _report_reclaimed(admission: Any, ttl_s: float, warn: Say) -> None:
    for lease in admission.reclaimed:
        how = admission.stopped.get(lease.lease_id)
        warn(
            f"reclaimed an expired GPU lease: {lease.gpus} GPU(s) of {lease.team}, run {lease.run_id[:8]} on {lease.holder}, not renewed for {ttl_s:g} s"
            + (f"; {how}" if how else "")
        )


def _hold(book: Any, admission: Any, ttl_s: float, state: _Waiting, info: Say, warn: Say, fence_path: str | None) -> Any:
    from gpu_ops.storage.quota import Heartbeat

    waited = state.waited()
    info(f"GPU quota: {admission.reason}" + (f" after waiting {waited:.1f} s" if waited >= 0.5 else ""))
    # Renewed six times per TTL; each renewal is good for half the TTL in the workers'
    # fence, so a launcher that cannot renew has its workers stopped before the lease can
    # expire (gpu_ops.domain.compute.fence).
    heartbeat = Heartbeat(book, admission.lease, ttl_s / 6, on_error=warn, fence_path=fence_path)
    heartbeat.admission = admission
    heartbeat.start()
    return heartbeat


def _wait(reason: str, state: _Waiting, settings: Any, warn: Say) -> None:

    waited = state.waited()
    if waited >= settings.wait_timeout_s:
        raise LaunchRefused(f"launch not admitted after {waited:.0f} s (compute.admission.wait_timeout_s): {reason}", metadata={"refused_by": "compute.quotas"})
    if reason != state.said[0] or time.monotonic() - state.said[1] >= 60:
        warn(f"{reason} (waited {waited:.0f} s of at most {settings.wait_timeout_s:g} s)")
        state.said = (reason, time.monotonic())
    time.sleep(min(state.wait_s, max(0.0, settings.wait_timeout_s - waited)))
    state.wait_s = min(state.wait_s * 1.5, settings.backoff_max_s)


__all__ = ["BudgetGate", "GpuAdmission"]
