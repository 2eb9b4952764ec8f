"""`gpu_ops.domain.fastyaml.load_yaml` gives `yaml.safe_load`'s answer (and its errors), and a
fleet-sized configuration validates with the same problems as before the fast paths."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml

from gpu_ops.domain.config import ConfigError, parse_config
from gpu_ops.domain.fastyaml import load_yaml

REPO = Path(__file__).resolve().parents[2]

DOCS = [
    "a: 1\nb: [1, 2.5, .inf, -.inf, 0o17, 0x1f, 1_000, 1e3, yes, no, On, ~, null, '', 2026-11-01, 2026-11-01T10:00:00Z, '5', \"x\"]\n",
    "base: &b {x: 1, y: 2}\nother:\n  <<: *b\n  y: 3\n",  # merge key
    "a: &a [1, 2]\nb: *a\n",  # alias
    "a: !!set {x, y}\n",
    "a: !!omap [{x: 1}, {y: 2}]\n",
    "a: !!binary aGVsbG8=\n",
    "a: 1\na: 2\n",  # duplicate key: the last wins, as in PyYAML
    "",
    "# only a comment\n",
    "- 1\n- [2, {3: 4, 5.5: x, true: y, null: z}]\n",
    "k: !!str 5\nn: !!int '7'\nf: !!float 1\ns: ! 5\n",
    "text: |\n  line one\n  line two\nfolded: >\n  a\n  b\n",
    "nested: {a: [{b: [[], {}]}]}\n",
    "plain string\n",
    "team: nlp\nkey: 'yes'\nnum: \"80\"\n",
]
BAD = ["&a [*a]\n", "? [1, 2]\n: x\n", "a: !foo x\n", "a: [1\n", "a: 1\n---\nb: 2\n", "a: b: c\n", "\tx: 1\n"]


def _outcome(load, text):
    try:
        return "ok", load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        return "error", type(exc).__name__, mark and (mark.line, mark.column)


@pytest.mark.parametrize("text", DOCS + BAD + [p.read_text() for p in sorted(REPO.glob("gpu_ops/demo/*.yaml")) + [REPO / "helm/gpu-ops/values.yaml"]])
def test_same_answer_and_errors_as_safe_load(text):
    expected, got = _outcome(yaml.safe_load, text), _outcome(load_yaml, text)
    assert repr(got) == repr(expected)  # types included: 1, 1.0 and True stay apart


def test_a_nan_and_shared_scalars():
    data = load_yaml("a: .nan\nb: [80, 80, 80.0]\n")
    assert math.isnan(data["a"]) and [type(v) for v in data["b"]] == [int, int, float]


def _budget(i: int, **over) -> dict:
    return {"name": f"team-{i:05d}", "scope": {"team": f"t{i}"}, "amount_usd": 1000, "thresholds": [{"percent": 50}, {"percent": 80, "severity": "warning"}], "enforcement": {"action": "alert"}, **over}


def test_fleet_config_problems_are_found_and_named_linearly(tmp_path):
    budgets = [_budget(i) for i in range(3_000)]
    budgets[7] = _budget(7, thresholds=[{"percent": 50}, {"percent": -1}])  # same as the others but one
    budgets[2_000]["name"] = budgets[5]["name"]
    budgets[2_001]["enforcement"] = {"action": "throttle"}
    data = {"prices": {"source": "t", "as_of": "2026-11-01", "gpus": {"h100": {"on-demand": 12.0}}}, "budgets": budgets}
    with pytest.raises(ConfigError) as err:
        parse_config(data, tmp_path / "gpu_ops.yaml")
    problems = err.value.problems
    assert any("budgets[7].thresholds[1].percent: must be > 0" in p for p in problems)
    assert any("budgets[2001].enforcement" in p and "throttle needs max_gpus" in p for p in problems)
    assert len(problems) == 2

    budgets[7], budgets[2_001] = _budget(7), _budget(2_001)  # then the names are checked
    with pytest.raises(ConfigError) as err:
        parse_config(data, tmp_path / "gpu_ops.yaml")
    assert err.value.problems == [f"{tmp_path / 'gpu_ops.yaml'}: budgets[2000].name: 'team-00005' is used by another budget (budgets[5])"]

    budgets[2_000] = _budget(2_000)  # valid: thresholds shared, equal to their own validation
    cfg = parse_config(data, tmp_path / "gpu_ops.yaml")
    assert len(cfg.budgets) == 3_000 and cfg.budgets[0].thresholds[1].severity == "warning"
    assert cfg.budgets[0].thresholds == cfg.budgets[-1].thresholds and cfg.budgets[0].scope.labels == {}
