"""The forecast gate's figures (gpu_ops.flows.alerts.forecast): the period's spend, attempts settled
since, running attempts, from a real SQLite store at a given `now`; the pure decision."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pandas as pd
import pytest

from gpu_ops.flows.alerts.forecast import Spend, forecast_refusal, spend_to_date
from gpu_ops.dagster.compute.admission import assert_forecast_allowed
from gpu_ops.domain.compute.request import Attribution, GpuRequest
from gpu_ops.domain.config import parse_config
from gpu_ops.dagster.failures import LaunchRefused
from gpu_ops.storage.tables import TableStore
from gpu_ops.domain.training import attempts
from gpu_ops.storage import ledger
from gpu_ops.storage.attempt_store import AttemptStore
from gpu_ops.domain.training.estimate import Estimate, Leg

NOW = dt.datetime(2026, 3, 10, 12, tzinfo=dt.timezone.utc)
H = dt.timedelta(hours=1)
REQ = GpuRequest(gpu_type="a100-80gb", gpus=8, capacity="spot", labels=Attribution(team="nlp"))


def config(tmp_path: Path, enforcement: str = "{action: block}", forecast: str = "estimate"):  # type: ignore[no-untyped-def]
    return parse_config(
        {
            "storage": {"url": f"sqlite:///{tmp_path / 'costs.db'}"},
            "prices": {"currency": "USD", "source": "test", "as_of": dt.date(2026, 1, 1), "gpus": {"a100-80gb": {"spot": 2.0, "on-demand": 5.0}}},
            "budgets": [{"name": "nlp", "scope": {"team": "nlp"}, "amount_usd": 1000, "enforcement": _yaml(enforcement)}],
            "alerts": {"launch_forecast": forecast},
        },
        None,
    )


def _yaml(text: str):  # type: ignore[no-untyped-def]
    import yaml

    return yaml.safe_load(text)


def row(run: str, start: dt.datetime, end: dt.datetime, team: str = "nlp") -> ledger.LedgerRow:
    return ledger.LedgerRow(
        start=start, end=end, namespace="ml", pod=run, node="n", team=team, project="p", cost_center="", experiment_id="", gpu_type="a100-80gb",
        gpu_count=8, capacity_type="spot", sharing="none", gpu_share=1.0, run_id=run, asset_key="train", attempt=1, outcome="completed",
        last_checkpoint_at=None, lost_seconds=0.0, declared_gpu_type="a100-80gb", declared_gpu_count=8, hardware_source="worker",
    )


def seed(cfg, store: TableStore) -> None:  # type: ignore[no-untyped-def]
    # The period's status through the end of 2026-03-08: $600 spent.
    status = pd.DataFrame({"budget": ["nlp"], "period_start": ["2026-03-01"], "spend_usd": [600.0], "as_of": [pd.Timestamp("2026-03-09", tz="UTC")], "amount_usd": [1000.0]})
    store.append("gpu_budget_status", status)
    ledger.append(store, [
        row("before", NOW - 48 * H, NOW - 46 * H),  # in the status already: not counted again
        row("straddles", NOW - 40 * H, NOW - 34 * H),  # 2 of its 6 h after the status (from 2026-03-09 00:00)
        row("today", NOW - 3 * H, NOW - 1 * H),  # 2 h today
        row("other-team", NOW - 3 * H, NOW - 1 * H, team="cv"),
    ])
    # A running attempt of 8 GPUs, launched 30 min ago.
    owner = attempts.Owner("host", 1, None, "run", "step")
    a = attempts.plan("a1", "run", "train", 1, owner, launch_name="x", bill={"team": "nlp", "gpu_type": "a100-80gb", "gpu_count": 8, "gpu_share": 1.0, "capacity_type": "spot", "namespace": "ml"}, at=NOW.timestamp() - 1800)
    book = AttemptStore(store)
    book.create(a)
    book.move(a, attempts.launch(a, host="host", pids=(1,), started=(None,), at=NOW.timestamp() - 1800, workdir=None))


def test_spend_to_date_counts_the_status_the_ledger_since_and_running_attempts(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    store = TableStore.from_config(cfg)
    seed(cfg, store)
    spend = spend_to_date(cfg, store, cfg.budgets, NOW)["nlp"]
    assert spend.period_usd == 600.0 and "2026-03-09" in spend.through
    assert spend.settled_usd == pytest.approx(8 * 2.0 * (2 + 2))  # straddles' last 2 h + today's 2 h
    assert spend.running_usd == pytest.approx(8 * 2.0 * 0.5)
    assert spend.total == pytest.approx(600 + 64 + 8)


def estimate(usd: float, p90: float) -> Estimate:
    return Estimate("history", 3, 3600.0, 7200.0, 3600.0, 7200.0, 8.0, (Leg("spot", 2.0, 0.0, usd, p90),))


def test_the_gate_refuses_with_the_figures_and_p90_is_a_setting(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    store = TableStore.from_config(cfg)
    seed(cfg, store)
    # 672 spent: an estimate of 300 stays under 1000; its p90 of 400 would not.
    assert_forecast_allowed(cfg, REQ, estimate(300.0, 400.0), now=NOW, store=store)
    with pytest.raises(LaunchRefused) as refused:
        assert_forecast_allowed(config(tmp_path, forecast="p90"), REQ, estimate(300.0, 400.0), now=NOW, store=store)
    assert (
        "period spend $600.00 (through 2026-03-09T00:00:00+00:00) + settled since $64.00 + running attempts $8.00 "
        "+ this launch's p90 estimate $400.00 = $1,072.00, past the block line $1,000.00" in str(refused.value)
    )
    assert_forecast_allowed(config(tmp_path, forecast="off"), REQ, estimate(5000.0, 5000.0), now=NOW, store=store)


def test_a_throttle_refuses_only_what_it_would_throttle(tmp_path: Path) -> None:
    cfg = config(tmp_path, "{action: throttle, max_gpus: 4}")
    spend = {"nlp": Spend(900.0, "through 2026-03-09", 0.0, 0.0)}
    why = forecast_refusal(cfg.budgets, REQ, 200.0, "estimate", spend)
    assert why is not None and "throttle launches to 4 GPUs and this launch asks for 8" in why
    small = REQ.model_copy(update={"gpus": 4})
    assert forecast_refusal(cfg.budgets, small, 200.0, "estimate", spend) is None
    # Another team's launch, and a launch with no estimate, are not this budget's to refuse.
    assert forecast_refusal(cfg.budgets, REQ.model_copy(update={"labels": Attribution(team="cv")}), 200.0, "estimate", spend) is None
    assert forecast_refusal(cfg.budgets, REQ, None, "estimate", spend) is None
