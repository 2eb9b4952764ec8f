"""Spend anomalies (gpu_ops.flows.cost.anomaly): a generated month with a weekly rhythm stays quiet,
a seeded spike fires, the first week scores with the wider band; and the real
`gpu_spend_anomalies` asset and its check materialized from stored daily tables."""

from __future__ import annotations

import datetime as dt
from typing import Any

import dagster as dg
import numpy as np
import pandas as pd
import pytest

from gpu_ops.domain.config import AnomalyConfig, load_config
from gpu_ops.flows.cost.anomaly import baseline, score_day
from gpu_ops.dagster.cost.assets import build_assets
from gpu_ops.dagster.resources import GpuOpsSettings
from gpu_ops.dagster.io_manager import TableIOManager
from gpu_ops.storage.tables import TableStore

from .anomaly_data import START, month, write_daily_tables

SETTINGS = AnomalyConfig()
def scores(daily: pd.DataFrame, dates: list[dt.date]) -> pd.DataFrame:
    return pd.concat([score_day(daily, d, dates, SETTINGS) for d in dates], ignore_index=True)


def test_a_weekly_rhythm_stays_quiet_from_the_first_week() -> None:
    daily, dates = month()
    s = scores(daily, dates)
    assert not s["anomalous"].any(), s[s["anomalous"]]
    scored = s[s["basis"] != "none"]
    # Scored from the fifth day (four days of history); by weekday once three of them are in the window.
    assert scored["day"].min() == START + dt.timedelta(days=4)
    assert set(s[s["day"] >= START + dt.timedelta(days=21)]["basis"]) == {"weekday"}
    # Weekends scored against all days read low, never high.
    first_weeks = s[(s["basis"] == "all days") & (s["key"] == "nlp")]
    assert (first_weeks[[d.weekday() >= 5 for d in first_weeks["day"]]]["score"] < 0).all()


@pytest.mark.parametrize("offset", [9, 30])  # in the all-days band (second week) and by weekday
def test_a_seeded_spike_fires(offset: int) -> None:
    daily, dates = month()
    spike = START + dt.timedelta(days=offset)
    assert spike.weekday() < 5
    daily.loc[(daily["day"] == spike) & (daily["key"] == "nlp"), "spend_usd"] = 4000.0
    s = scores(daily, dates)
    flagged = s[s["anomalous"]]
    assert list(zip(flagged["day"], flagged["key"])) == [(spike, "nlp")]
    assert flagged["score"].iloc[0] >= SETTINGS.alert_score
    # The spike is one point of the later days' history: the median does not move, no echo.
    assert not s[(s["day"] > spike) & (s["key"] == "nlp")]["anomalous"].any()


def test_the_first_weeks_band_is_wider() -> None:
    history = np.array([1000.0, 1010.0, 990.0, 1005.0, 995.0])
    weekdays = np.array([0, 1, 2, 3, 4])
    wide = baseline(history, weekdays, 0, SETTINGS)  # one Monday in the history: all days, widened
    assert wide.basis == "all days" and wide.points == 5
    narrow = baseline(np.concatenate([history, [1000.0, 1002.0]]), np.concatenate([weekdays, [0, 0]]), 0, SETTINGS)
    assert narrow.basis == "weekday" and narrow.points == 3
    assert wide.spread == pytest.approx(narrow.spread * SETTINGS.fallback_widen, rel=0.05)
    assert baseline(history[:3], weekdays[:3], 0, SETTINGS).basis == "none"  # three days: no score
    # $24 over a $10 baseline scores high but is under min_excess_usd: not an anomaly.
    tiny = pd.DataFrame([(START + dt.timedelta(days=i), "team", "t", "t", "", 10.0) for i in range(7)] + [(START + dt.timedelta(days=7), "team", "t", "t", "", 34.0)],
                        columns=["day", "dimension", "key", "team", "project", "spend_usd"])
    day = score_day(tiny, START + dt.timedelta(days=7), [START + dt.timedelta(days=i) for i in range(8)], SETTINGS).iloc[0]
    assert day["score"] > SETTINGS.check_score and not day["anomalous"]


def test_the_asset_check_on_stored_daily_tables(tmp_path: Any) -> None:
    """gpu_cost_attribution and gpu_estimate_accuracy partitions in a real SQLite store; the
    real asset and check materialized on a real instance for a quiet day and a spike day."""
    daily, dates = month(days=35)
    spike = dates[-1]
    daily.loc[(daily["day"] == spike) & (daily["key"] == "nlp"), "spend_usd"] = 5000.0
    cfg_path = tmp_path / "gpu_ops.yaml"
    cfg_path.write_text(f"storage: {{url: 'sqlite:///{tmp_path / 'costs.db'}'}}\nprices: {{currency: USD, source: t, as_of: 2026-01-01, gpus: {{}}}}\n")
    cfg = load_config(cfg_path)
    store = TableStore.from_config(cfg)
    write_daily_tables(store, daily, dates)
    assets, _ = build_assets(cfg)
    resources = {"gpu_ops": GpuOpsSettings(config_path=str(cfg_path)), "table_io_manager": TableIOManager(url=cfg.storage.resolved_url())}
    with dg.instance_for_test() as instance:
        outcome = {}
        for d in (dates[-2], spike):
            result = dg.materialize(assets, partition_key=d.isoformat(), resources=resources, instance=instance, selection=["gpu_spend_anomalies"])
            [check] = result.get_asset_check_evaluations()
            outcome[d] = check
    assert outcome[dates[-2]].passed
    assert not outcome[spike].passed and "team nlp spent $5,000.00 on " + spike.isoformat() in str(outcome[spike].description)
    stored = store.read("gpu_spend_anomalies", partition_keys=[spike.isoformat()]).set_index(["dimension", "key"])
    assert set(stored.index) == {("team", "nlp"), ("team", "cv"), ("project", "p"), ("asset", "train_llm")}
    assert bool(stored.loc[("team", "nlp"), "anomalous"]) and not stored.drop(index=[("team", "nlp"), ("project", "p")])["anomalous"].astype(bool).any()
