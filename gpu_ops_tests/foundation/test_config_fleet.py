"""A fleet-sized configuration (10,000 budgets): each mistake still names the exact
field, and the fast validation builds the same configuration as the plain one."""

from __future__ import annotations

import copy
import importlib.util
from pathlib import Path
from typing import Any

import pytest

from gpu_ops.domain.config import Budget, ConfigError, GpuOpsConfig, load_config, parse_config
from gpu_ops_tests.conftest import REPO


def _bench_fleet() -> Any:
    """benchmarks/fleet.py (a script folder, not a package), loaded by path."""
    spec = importlib.util.spec_from_file_location("gpu_ops_bench_fleet", REPO / "benchmarks" / "fleet.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def fleet(n: int, folder: Path) -> dict[str, Any]:
    """benchmarks/fleet.py's configuration, with a little variety (every 7th budget differs)."""
    data = _bench_fleet().fleet_data(n, folder)
    for i in range(0, n, 7):
        b = data["budgets"][i]
        b.update(period="weekly", reset_day=3, amount_usd=2_500.5, scope={"project": f"p{i}", "labels": {"env": "prod"}}, notify_resolve=False)
        b["thresholds"] = [{"percent": 90.5, "severity": "warning"}]
    return data


def problems(data: dict[str, Any], source: Path) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_config(data, source)
    return info.value.problems


def test_mistakes_among_ten_thousand_budgets_name_their_exact_fields(tmp_path):
    source = tmp_path / "gpu_ops.yaml"
    data = fleet(10_000, tmp_path)
    b = data["budgets"]
    b[7123]["thresholds"][1] = {"percent": 0}
    b[42]["name"] = "Team-Bad"
    b[500]["enforcement"] = {"action": "throttle"}
    b[501]["amount_usd"] = "lots"
    b[502]["scope"] = {"team": "x", "tema": "y"}
    b[503]["thresholds"][4] = {"absolute_usd": 5, "percent": 3}
    b[9998]["thresholds"][0]["severity"] = "loud"
    assert problems(data, source) == [
        f"{source}: budgets[42].name: String should match pattern '^[a-z0-9]([a-z0-9._-]*[a-z0-9])?$'",
        f"{source}: budgets[500].enforcement: throttle needs max_gpus or spot_only: true",
        f"{source}: budgets[501].amount_usd: must be a number, got 'lots'",
        f"{source}: budgets[502].scope.tema: unknown field",
        f"{source}: budgets[503].thresholds[4]: give exactly one of percent or absolute_usd",
        f"{source}: budgets[7123].thresholds[1].percent: must be > 0",
        f"{source}: budgets[9998].thresholds[0].severity: must be one of 'info', 'warning' or 'critical'",
    ]


def test_a_duplicate_name_and_an_unknown_channel_among_ten_thousand(tmp_path):
    source = tmp_path / "gpu_ops.yaml"
    data = fleet(10_000, tmp_path)
    data["budgets"][9999]["name"] = data["budgets"][3]["name"]
    data["budgets"][5000]["channels"] = ["log", "nope"]
    assert problems(data, source) == [
        f"{source}: budgets[5000].channels[1]: no channel named 'nope' (channels: log)",
        f"{source}: budgets[9999].name: 'team-000003-monthly' is used by another budget (budgets[3])",
    ]


def test_a_fleet_loads_from_its_file_exactly_as_plain_validation_builds_it(tmp_path):
    import yaml

    data = fleet(2_000, tmp_path)
    path = tmp_path / "gpu_ops.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    loaded = load_config(path)
    plain = GpuOpsConfig.model_validate(copy.deepcopy(data))  # one full pydantic validation, nothing shared
    assert loaded.budgets == plain.budgets
    assert [b.model_dump() for b in loaded.budgets] == [b.model_dump() for b in plain.budgets]
    assert [b.model_fields_set for b in loaded.budgets] == [b.model_fields_set for b in plain.budgets]
    assert all(type(b) is Budget for b in loaded.budgets)
    assert loaded.budgets[7].scope.labels == {"env": "prod"} and loaded.budgets[7].amount_usd == 2_500.5
    assert isinstance(loaded.budgets[1].amount_usd, float)
