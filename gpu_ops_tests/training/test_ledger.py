"""The usage ledger: the exact contract columns and dtypes, through real TableStore SQLite."""

from __future__ import annotations

import dataclasses
import datetime as dt
from pathlib import Path

import pandas as pd
import pytest

from gpu_ops.storage.tables import TableStore
from gpu_ops.storage import ledger
from gpu_ops.domain.training.classify import Outcome

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


def test_rows_of_attempts_without_gpus_pass_the_cost_flow(tmp_path: Path) -> None:
    """Ledger rows for attempts that held no GPU (gpu_count 0: a launch that never
    started) are the project's own data: gpu_usage prices the GPU rows and the
    quarantine_empty check passes, through real cost assets on SQLite."""
    import dagster as dg

    from gpu_ops.domain.config import BUNDLED_PRICES, load_config
    from gpu_ops.dagster.cost.assets import build_assets
    from gpu_ops.dagster.resources import GpuOpsSettings
    from gpu_ops.dagster.io_manager import TableIOManager

    url = f"sqlite:///{tmp_path / 'costs.db'}"
    cfg = tmp_path / "gpu_ops.yaml"
    cfg.write_text(
        f"storage: {{url: '{url}'}}\nprices: {BUNDLED_PRICES}\n"
        "usage: {sources: [{type: ledger}], partitions_start: 2026-11-01}\n"
    )
    store = TableStore(url)
    never_started = ledger.LedgerRow(**{**row(1, "infrastructure").__dict__, "gpu_count": 0, "lost_seconds": 0.0})
    ledger.append(store, [never_started, row(2, "preempted", ckpt_after=5), row(3, "completed")])
    assets, _ = build_assets(load_config(cfg))
    with dg.instance_for_test() as instance:
        result = dg.materialize(
            [a for a in assets if "gpu_usage" in {k.to_user_string() for k in a.keys}],
            partition_key="2026-11-21",
            instance=instance,
            resources={"gpu_ops": GpuOpsSettings(config_path=str(cfg)), "table_io_manager": TableIOManager(url=url)},
        )
    check = {e.check_name: e for e in result.get_asset_check_evaluations()}["quarantine_empty"]
    assert check.passed, check.description
    usage = store.read("gpu_usage")
    usage = usage[usage["kind"] != "idle"] if "kind" in usage else usage
    # Attempts 2 and 3 (8 GPUs, 10 minutes each) start on 2026-11-21; attempt 1 held no GPU.
    assert usage["gpu_hours"].sum() == pytest.approx(2 * 8 * 10 / 60)
    assert len(store.read("gpu_usage_quarantine")) == 0


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def test_a_days_runs_are_read_with_their_earlier_attempts_and_nothing_else(tmp_path: Path, backend: str, request: pytest.FixtureRequest) -> None:
    """``runs_ending_in``: the runs with an attempt ending in the window, each with all its
    attempts (one started the day before), and no other run of the history."""
    url = f"sqlite:///{tmp_path / 'ledger.db'}" if backend == "sqlite" else request.getfixturevalue("pg_url")
    store = TableStore(url)
    day = dt.datetime(2026, 11, 21, tzinfo=dt.timezone.utc)

    def moved(r: ledger.LedgerRow, days: float) -> ledger.LedgerRow:
        shift = dt.timedelta(days=days)
        return dataclasses.replace(r, start=r.start + shift, end=r.end + shift, last_checkpoint_at=None)

    # run-1: attempt 1 ends on the 20th, attempt 2 (completed) on the 21st. run-old: ten days
    # earlier. run-next: ends on the 22nd. run-edge: ends at the 22nd's midnight exactly.
    rows = [row(1, "preempted", minutes=5), row(2, "completed")]
    rows += [moved(row(1, "completed", run="run-old"), -10), moved(row(1, "completed", run="run-next"), 1.2)]
    edge = row(1, "completed", run="run-edge")
    rows.append(dataclasses.replace(edge, start=day + dt.timedelta(hours=23), end=day + dt.timedelta(days=1)))
    ledger.append(store, rows)
    assert [r.end.date() for r in rows[:2]] == [dt.date(2026, 11, 20), dt.date(2026, 11, 21)]

    got = ledger.runs_ending_in(store, day, day + dt.timedelta(days=1))
    assert sorted(zip(got["run_id"], got["attempt"])) == [("run-1", 1), ("run-1", 2)]
    assert ledger.runs_ending_in(TableStore(f"sqlite:///{tmp_path / 'none.db'}"), day, day + dt.timedelta(days=1)).empty
