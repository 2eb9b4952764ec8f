"""The usage ledger: the exact contract columns and dtypes, through real TableStore SQLite."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pandas as pd
import pytest

from gpu_ops.storage.tables import TableStore
from gpu_ops.training import ledger
from gpu_ops.training.classify import Outcome

T0 = dt.datetime(2026, 11, 20, 23, 50, tzinfo=dt.timezone.utc)


def row(attempt: int, outcome: str, *, minutes: float = 10, ckpt_after: float | None = None, capacity: str = "spot", run: str = "run-1") -> ledger.LedgerRow:
    start = T0 + dt.timedelta(minutes=20 * (attempt - 1))
    end = start + dt.timedelta(minutes=minutes)
    last = start + dt.timedelta(minutes=ckpt_after) if ckpt_after is not None else None
    return ledger.LedgerRow(
        start=start,
        end=end,
        namespace="ml",
        pod=f"train-{attempt}",
        node="ip-10-0-1-7",
        team="nlp",
        project="llm",
        cost_center="cc-42",
        experiment_id="exp-7",
        gpu_type="a100-80gb",
        gpu_count=8,
        capacity_type=capacity,
        sharing="none",
        gpu_share=1.0,
        run_id=run,
        asset_key="train_demo_model",
        attempt=attempt,
        outcome=outcome,
        last_checkpoint_at=last,
        lost_seconds=ledger.lost_seconds(Outcome(outcome), start, end, last),
    )


def test_frame_has_exactly_the_contract_columns_and_types() -> None:
    df = ledger.to_frame([row(1, "preempted", ckpt_after=7), row(2, "completed")])
    assert tuple(df.columns) == ledger.LEDGER_COLUMNS
    for col in ("start", "end", "last_checkpoint_at"):
        assert isinstance(df[col].dtype, pd.DatetimeTZDtype) and str(df[col].dt.tz) == "UTC"
    assert df["gpu_count"].dtype == "int64" and df["attempt"].dtype == "int64"
    assert df["gpu_share"].dtype == "float64" and df["lost_seconds"].dtype == "float64"
    assert df.loc[0, "lost_seconds"] == pytest.approx(180.0)  # 10 min attempt, checkpoint at 7 min
    assert df.loc[1, "lost_seconds"] == 0.0 and pd.isna(df.loc[1, "last_checkpoint_at"])


def test_append_read_and_history(tmp_path: Path) -> None:
    store = TableStore(f"sqlite:///{tmp_path / 'ledger.db'}")
    ledger.append(store, [row(1, "preempted", ckpt_after=4)])
    ledger.append(store, [row(2, "oom"), row(3, "completed")])
    ledger.append(store, [row(1, "completed", run="run-2")])
    df = ledger.read(store)
    assert list(df.columns) == list(ledger.LEDGER_COLUMNS)
    assert str(df["start"].dt.tz) == "UTC" and df["gpu_count"].dtype == "int64"
    history = ledger.run_history(store, "run-1", "train_demo_model")
    assert [(h.attempt, h.outcome) for h in history] == [(1, Outcome.PREEMPTED), (2, Outcome.OOM), (3, Outcome.COMPLETED)]
    assert history[0].lost_seconds == pytest.approx(360.0)
    exposure, preemptions = ledger.preemption_exposure(store, "train_demo_model")
    assert exposure == pytest.approx(4 * 600.0) and preemptions == 1
    assert ledger.run_history(store, "nope", "train_demo_model") == []


def test_missing_table_reads_empty(tmp_path: Path) -> None:
    store = TableStore(f"sqlite:///{tmp_path / 'empty.db'}")
    assert ledger.run_history(store, "r", "a") == [] and ledger.preemption_exposure(store, "a") == (0.0, 0)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"capacity_type": "preemptible"}, "capacity_type"),
        ({"sharing": "vgpu"}, "sharing"),
        ({"outcome": "crashed"}, "outcome"),
        ({"start": dt.datetime(2026, 11, 20)}, "timezone-aware"),
    ],
)
def test_row_validation(change: dict, message: str) -> None:
    good = row(1, "preempted").__dict__
    with pytest.raises(ValueError, match=message):
        ledger.LedgerRow(**{**good, **change})
