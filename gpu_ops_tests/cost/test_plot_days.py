"""Per-day figures over the days that have data.

Dagster draws one plot point per partition of a partitioned asset, and counts the
partition fill and the partitions of the asset graph over its partitions definition.
The bundled demo's month therefore ends at ``usage.partitions_end`` (2026-10-31) instead
of running on to yesterday with weeks of empty partitions (the fill badges read 100 %),
and a scaffolded project's partitions start the day before it was scaffolded.

One part is Dagster's: the asset page's plots ask dagster-webserver 1.13.27 for
``partitionKeyConnection(limit: 120, ascending: false)``, and
``TimeWindowPartitionsDefinition.get_paginated_partition_keys`` walks back from the
current time without looking at ``end_date`` (the ascending walk does), so the axis still
reaches yesterday. ``test_the_plot_axis_of_a_bounded_partitioning`` is a strict xfail on
that: it fails (XPASS) once a Dagster upgrade fixes it.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pandas as pd
import pytest
import yaml
from dagster.components import ScaffoldRequest

from gpu_ops.domain.config import DEMO_CONFIG, ConfigError, load_config, parse_config
from gpu_ops.dagster.location import build_defs

UI_PLOT_PARTITIONS = 120  # what the asset page's plots ask for (see the module docstring)
COST_ASSETS = ("gpu_usage", "gpu_cost_attribution", "gpu_budget_status", "gpu_roi_report")


def usage_days(folder: Path) -> set[str]:
    days: set[str] = set()
    for path in sorted(folder.glob("*.csv")):
        frame = pd.read_csv(path, usecols=["start", "end"])
        for start, end in zip(pd.to_datetime(frame["start"], utc=True), pd.to_datetime(frame["end"], utc=True)):
            days.update(d.date().isoformat() for d in pd.date_range(start.normalize(), (end - pd.Timedelta(microseconds=1)).normalize(), freq="D"))
    return days


def test_the_demos_partitions_are_the_days_of_its_data() -> None:
    defs = build_defs(str(DEMO_CONFIG))
    have_data = usage_days(DEMO_CONFIG.parent / "usage")
    for key in COST_ASSETS:
        partitions = defs.resolve_assets_def(key).partitions_def
        assert partitions is not None
        keys = partitions.get_partition_keys()
        assert keys[0] == min(have_data) and keys[-1] == max(have_data) == "2026-10-31", key
        assert set(keys) == have_data, f"{key}: partitions without data: {sorted(set(keys) - have_data)}"


@pytest.mark.xfail(strict=True, reason="dagster 1.13.27: get_paginated_partition_keys(ascending=False) ignores end_date (see the module docstring)")
def test_the_plot_axis_of_a_bounded_partitioning() -> None:
    from dagster._core.definitions.partitions.context import PartitionLoadingContext
    from dagster._core.definitions.temporal_context import TemporalContext

    partitions = build_defs(str(DEMO_CONFIG)).resolve_assets_def("gpu_budget_status").partitions_def
    assert partitions is not None
    after_the_end = dt.datetime(2027, 3, 1, tzinfo=dt.timezone.utc)  # any day after partitions_end
    context = PartitionLoadingContext(temporal_context=TemporalContext(effective_dt=after_the_end, last_event_id=None), dynamic_partitions_store=None)
    axis = partitions.get_paginated_partition_keys(context=context, limit=UI_PLOT_PARTITIONS, ascending=False).results
    assert max(axis) == "2026-10-31"


def test_without_an_end_the_partitions_run_to_yesterday(tmp_path: Path) -> None:
    data = yaml.safe_load(DEMO_CONFIG.read_text())
    data["usage"].pop("partitions_end")
    config = parse_config(data, DEMO_CONFIG)
    today = dt.date(2026, 11, 25)
    assert config.usage.partitions_end is None and config.usage.last_partition(today) == dt.date(2026, 11, 24)
    assert load_config(DEMO_CONFIG).usage.last_partition(today) == dt.date(2026, 10, 31)
    assert load_config(DEMO_CONFIG).usage.last_partition(dt.date(2026, 10, 20)) == dt.date(2026, 10, 19)  # the end is not reached yet


def test_an_end_before_the_start_is_a_config_error() -> None:
    data = yaml.safe_load(DEMO_CONFIG.read_text())
    data["usage"]["partitions_end"] = "2026-09-30"
    with pytest.raises(ConfigError, match=r"partitions_end \(2026-09-30\) is before partitions_start \(2026-10-01\)"):
        parse_config(data, DEMO_CONFIG)


def test_a_scaffolded_project_partitions_from_the_day_before_it_was_scaffolded(tmp_path: Path) -> None:
    from gpu_ops.components.scaffolding import ensure_project_config

    request = ScaffoldRequest(type_name="gpu_ops.components.GpuCostComponent", target_path=tmp_path / "defs" / "gpu_costs", scaffold_format="yaml", project_root=tmp_path, params=None)
    config = load_config(ensure_project_config(request, today=dt.date(2027, 3, 1)))
    assert config.usage.partitions_start == dt.date(2027, 2, 28) and config.usage.partitions_end is None
