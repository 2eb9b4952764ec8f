"""The GPU_OPS_CONFIG file: loading, paths, secrets and error reporting."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from gpu_ops.domain.config import DEMO_CONFIG, ConfigError, LiteralSecret, SecretRef, load_config, parse_duration

PRICES = """
currency: USD
source: test
as_of: 2026-11-01
gpus:
  a100-80gb: {on-demand: 5.12, spot: 1.79}
  NVIDIA-H100-80GB-HBM3: {on-demand: 12.29}
"""


def write(tmp_path: Path, text: str, name: str = "gpu_ops.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def test_the_demo_config_keeps_its_database_under_gpu_ops_home_else_dot_gpu_ops(tmp_path, monkeypatch):
    monkeypatch.setenv("GPU_OPS_HOME", str(tmp_path / "home"))
    cfg = load_config(DEMO_CONFIG)
    assert cfg.source_path == DEMO_CONFIG.resolve()
    assert cfg.storage.resolved_url() == f"sqlite:///{(tmp_path / 'home' / 'costs.db').resolve()}"
    assert cfg.prices.gpus["a100-80gb"]["on-demand"] == pytest.approx(5.12)
    assert {b.name for b in cfg.budgets} >= {"nlp-monthly"} and cfg.training.simulate_gpu_pricing
    # Without GPU_OPS_HOME the demo (`make run`, `make dev`, in the repository root) keeps ./.gpu_ops.
    monkeypatch.delenv("GPU_OPS_HOME")
    monkeypatch.chdir(tmp_path)
    assert load_config(DEMO_CONFIG).storage.resolved_url() == f"sqlite:///{(tmp_path / '.gpu_ops' / 'costs.db').resolve()}"


def test_env_var_selects_the_file_and_relative_paths_resolve_against_it(tmp_path, monkeypatch):
    (tmp_path / "conf").mkdir()
    write(tmp_path / "conf", PRICES, "prices.yaml")
    path = write(tmp_path / "conf", "storage: {url: 'sqlite:///data/costs.db'}\nprices: prices.yaml\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GPU_OPS_CONFIG", str(path))
    cfg = load_config()
    assert cfg.storage.resolved_url() == f"sqlite:///{tmp_path / 'conf' / 'data' / 'costs.db'}"
    # aliases are canonicalised when the price table is read
    assert set(cfg.prices.gpus) == {"a100-80gb", "h100"}
    assert cfg.resolve_path("exports/x.csv") == tmp_path / "conf" / "exports" / "x.csv"


def test_three_mistakes_give_three_errors_each_naming_file_and_field(tmp_path):
    write(tmp_path, PRICES, "prices.yaml")
    path = write(
        tmp_path,
        """
        prices: prices.yaml
        budgets:
          - name: nlp
            amount_usd: 100
            thresholds:
              - {percent: 50}
              - {percent: -5}
          - name: vision
            amount_usd: 100
            period: fortnightly
        channels:
          slack-ml: {type: slack, webhook_url: {env: SLACK_URL}, colour: red}
        """,
    )
    with pytest.raises(ConfigError) as exc:
        load_config(path)
    problems = exc.value.problems
    assert len(problems) == 3, problems
    assert f"{path}: budgets[0].thresholds[1].percent: must be > 0" in problems
    assert any(p.startswith(f"{path}: budgets[1].period: must be one of") for p in problems)
    assert f"{path}: channels.slack-ml.colour: unknown field" in problems


def test_errors_in_a_separate_prices_file_name_that_file(tmp_path):
    prices = write(tmp_path, "currency: USD\nsource: s\nas_of: 2026-11-01\ngpus:\n  a10: {spot: 1.0}\n  t4: {on-demand: 0}\n", "prices.yaml")
    path = write(tmp_path, "prices: prices.yaml\n")
    with pytest.raises(ConfigError) as exc:
        load_config(path)
    text = str(exc.value)
    # a10 is not a100: an unknown name is an error with suggestions, never a guess
    assert f"{prices}: gpus.a10: unknown GPU type 'a10'" in text
    assert f"{prices}: gpus.t4.on-demand: must be > 0" in text
    assert "a10g" in text


def test_budget_amounts_are_finite_and_label_scopes_name_a_label(tmp_path):
    """An amount or threshold of .inf never crosses and a label scope keyed '' never
    matches: said, naming the field (they loaded, and a budget showed 'n/a' forever)."""
    write(tmp_path, PRICES, "prices.yaml")
    path = write(
        tmp_path,
        "prices: prices.yaml\nbudgets:\n  - {name: a, amount_usd: .inf}\n  - {name: b, amount_usd: 10, thresholds: [{percent: .inf}, {absolute_usd: .nan}]}\n"
        "  - {name: c, amount_usd: 10, scope: {labels: {'': x, ' ': y, tier: gold}}}\n",
    )
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    text = str(caught.value)
    assert f"{path}: budgets[0].amount_usd: must be a finite number" in text
    assert f"{path}: budgets[1].thresholds[0].percent: must be a finite number" in text
    assert f"{path}: budgets[1].thresholds[1].absolute_usd: must be a finite number" in text
    assert f"{path}: budgets[2].scope.labels: each key must be a label's name (e.g. {{tier: gold}}), not '', ' '" in text


@pytest.mark.parametrize(
    ("section", "said"),
    [
        ("storage: {url: 'not a url'}", "storage.url: must be sqlite:///<file> or postgresql://<user>@<host>/<database>"),
        ("storage: {url: ''}", "storage.url: must be sqlite:///<file> or postgresql://"),
        ("storage: {url: 'mysql://x/y'}", "storage.url: must be sqlite:///<file> or postgresql://"),
        ("storage: {row_level_path: ''}", "storage.row_level_path: must name a folder (or leave the setting out)"),
        ("training: {checkpoint_url: ''}", "training.checkpoint_url: must name a folder or URL"),
        ("alerts: {dagster_url: 'not a url'}", "alerts.dagster_url: 'not a url' is not an http(s) URL"),
        ("compute: {orphan_grace: forever}", "compute.orphan_grace: 'forever' is not a duration"),
        ("storage: {statement_timeout_s: 1e308}", "storage.statement_timeout_s: must be <= 2,147,483"),
        ("storage: {connect_timeout_s: 3000000}", "storage.connect_timeout_s: must be <= 2,147,483"),
        ("compute: {orphan_grace: 99999999999d}", "compute.orphan_grace: '99999999999d' is longer than a duration can be"),
        ("budgets: [{name: b, amount_usd: 1, forecast_min_history: 99999999999d}]", "budgets[0].forecast_min_history: '99999999999d' is longer than a duration can be"),
        ("budgets: [{name: b, amount_usd: 1, forecast_min_history: soon}]", "budgets[0].forecast_min_history: 'soon' is not a duration"),
        ("budgets: [{name: b, amount_usd: 1, enforcement: {grace_period: 99999999999d}}]", "budgets[0].enforcement.grace_period: '99999999999d' is longer than a duration can be"),
        ("compute: {kubetorch: {inactivity_ttl: x}}", "compute.kubetorch.inactivity_ttl: 'x' is not a duration"),
        ("compute: {karpenter: {consolidate_after: x}}", "compute.karpenter.consolidate_after: String should match pattern"),
        ("compute: {quotas: {team: {'': 3}}}", "compute.quotas.team: each key must be a team's name (e.g. {nlp: 8}), not ''"),
        ("usage: {partitions_start: 0001-01-01}", "usage: partitions_start: must be 1677-09-22 or later"),
        ("usage: {sources: [{type: kubernetes, namespaces: [ML]}]}", "usage.sources[0].namespaces[0]: 'ML' is not a Kubernetes namespace name"),
        ("usage: {sources: [{type: kubernetes, namespaces: ['']}]}", "usage.sources[0].namespaces[0]: '' is not a Kubernetes namespace name"),
        ("usage: {sources: [{type: kubernetes, label_keys: {teem: example.com/team}}]}", "usage.sources[0].label_keys: 'teem' is not an attribution key (one of team, project, cost_center, experiment_id)"),
        ("usage: {sources: [{type: kubernetes, label_keys: {team: 'a b'}}]}", "usage.sources[0].label_keys.team: 'a b' is not a Kubernetes label key"),
        ("usage: {sources: [{type: kubernetes, label_keys: {team: 'example.com/'}}]}", "usage.sources[0].label_keys.team: 'example.com/' is not a Kubernetes label key"),
    ],
)
def test_a_setting_that_fails_later_is_refused_when_the_file_loads(tmp_path, section, said):
    """Values that loaded and then failed at launch, in a sensor tick or in an engine (or
    matched nothing): refused as the file loads, naming the field."""
    write(tmp_path, PRICES, "prices.yaml")
    path = write(tmp_path, f"prices: prices.yaml\n{section}\n")
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert f"{path}: {said}" in str(caught.value)


def test_a_budget_scoped_on_an_unquoted_yaml_label_value_matches_it_as_labels_read(tmp_path):
    """YAML reads `tier: true` and `gpus: 8` as a boolean and a number: such a scope was
    refused ('Input should be a valid string'); it is the text a label's value reads as
    (rules.label_value: JSON's writing), so it matches the rows it names."""
    write(tmp_path, PRICES, "prices.yaml")
    path = write(tmp_path, "prices: prices.yaml\nbudgets: [{name: b, amount_usd: 1, scope: {labels: {tier: true, gpus: 8, share: 0.5, name: gold}}}]\n")
    assert load_config(path).budgets[0].scope.labels == {"tier": "true", "gpus": "8", "share": "0.5", "name": "gold"}
    path = write(tmp_path, "prices: prices.yaml\nbudgets: [{name: b, amount_usd: 1, scope: {labels: {tier: null}}}]\n")
    with pytest.raises(ConfigError, match=r"budgets\[0\].scope.labels.tier: Input should be a valid string"):
        load_config(path)


def test_the_settings_those_checks_let_through(tmp_path):
    write(tmp_path, PRICES, "prices.yaml")
    path = write(
        tmp_path,
        "prices: prices.yaml\nstorage: {url: 'postgresql+psycopg2://u@h/db', row_level_path: rows}\nalerts: {dagster_url: 'https://dagster.example.com/'}\n"
        "compute: {orphan_grace: 90m, kubetorch: {inactivity_ttl: 2h}, karpenter: {consolidate_after: Never}, quotas: {team: {nlp: 8}}}\n"
        "usage: {sources: [{type: kubernetes, namespaces: [ml, team-a], label_keys: {team: example.com/Team_Name, cost_center: billing.example.com/cost-center, project: project}}]}\n",
    )
    cfg = load_config(path)
    assert cfg.compute.karpenter.consolidate_after == "Never" and cfg.compute.quotas.team == {"nlp": 8}
    assert cfg.usage.sources[0].namespaces == ["ml", "team-a"] and cfg.usage.sources[0].label_keys["team"] == "example.com/Team_Name"


def test_budget_naming_an_undefined_channel_is_an_error(tmp_path):
    write(tmp_path, PRICES, "prices.yaml")
    path = write(tmp_path, "prices: prices.yaml\nbudgets:\n  - {name: b, amount_usd: 10, channels: [pager]}\n")
    with pytest.raises(ConfigError, match=r"budgets\[0\]\.channels\[0\]: no channel named 'pager'"):
        load_config(path)


def test_broken_yaml_names_file_and_line(tmp_path):
    path = write(tmp_path, "prices: [unclosed\nstorage: {}\n")
    with pytest.raises(ConfigError, match=rf"{path}: line \d+, column \d+: not valid YAML"):
        load_config(path)


def test_a_file_that_is_not_utf8_names_the_file_and_byte(tmp_path):
    """A configuration, or the prices file it names, saved in Latin-1: a ConfigError
    naming the file and the byte (it was a UnicodeDecodeError traceback)."""
    (tmp_path / "prices.yaml").write_bytes(PRICES.encode().replace(b"currency", b"# caf\xe9\ncurrency"))
    path = write(tmp_path, "prices: prices.yaml\n")
    with pytest.raises(ConfigError, match=rf"{tmp_path / 'prices.yaml'}: not UTF-8 text \(byte b'\\xe9' at offset \d+\)"):
        load_config(path)
    path.write_bytes(b"# Ren\xe9\nprices: prices.yaml\n")
    with pytest.raises(ConfigError, match=rf"{path}: not UTF-8 text \(byte b'\\xe9' at offset 5\)"):
        load_config(path)


def test_missing_file_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("GPU_OPS_CONFIG", str(tmp_path / "nope.yaml"))
    with pytest.raises(ConfigError, match="nope.yaml: cannot be read"):
        load_config()


@pytest.mark.parametrize("section", ["prices", "budgets", "channels"])
def test_a_section_file_named_with_a_nul_byte_is_a_clear_error(tmp_path, section):
    """A section given as a file name with a NUL in it was a raw 'ValueError: embedded null
    byte' from the open; it names the field's file now, like any file that cannot be read."""
    write(tmp_path, PRICES, "prices.yaml")
    text = f'prices: prices.yaml\n{section}: "a\\0b.yaml"\n' if section != "prices" else 'prices: "a\\0b.yaml"\n'
    path = write(tmp_path, text)
    with pytest.raises(ConfigError, match=r"a\\x00b.yaml: cannot be read: the name holds a NUL byte") as caught:
        load_config(path)
    assert "Traceback" not in str(caught.value)


def test_a_usage_file_name_too_long_for_the_file_system_is_a_clear_error(tmp_path):
    write(tmp_path, PRICES, "prices.yaml")
    path = write(tmp_path, f"prices: prices.yaml\nusage: {{sources: [{{type: file, path: {'x' * 3000}.csv}}]}}\n")
    with pytest.raises(ConfigError, match=r"usage.sources\[0\].path: .*xxx.csv: the name is too long"):
        load_config(path)


def test_secrets_stay_references_and_never_render_their_value(tmp_path, monkeypatch):
    write(tmp_path, PRICES, "prices.yaml")
    path = write(
        tmp_path,
        """
        prices: prices.yaml
        channels:
          slack: {type: slack, webhook_url: {env: GPU_OPS_TEST_SLACK}}
          hook: {type: webhook, url: "https://hooks.example.com/gpu", secret: {env: GPU_OPS_TEST_HOOK}}
        """,
    )
    monkeypatch.setenv("GPU_OPS_TEST_SLACK", "https://hooks.slack.com/services/T0/B0/s3cr3t")
    cfg = load_config(path)
    slack = cfg.channels["slack"]
    assert isinstance(slack.webhook_url, SecretRef)
    assert slack.webhook_url.get().endswith("s3cr3t")
    assert "s3cr3t" not in repr(cfg) and "s3cr3t" not in str(cfg.model_dump())
    hook = cfg.channels["hook"]
    assert isinstance(hook.url, LiteralSecret) and "hooks.example.com" not in repr(hook)
    with pytest.raises(ConfigError, match="GPU_OPS_TEST_HOOK is not set"):
        hook.secret.get()


def test_threshold_needs_exactly_one_amount_and_durations_parse(tmp_path):
    write(tmp_path, PRICES, "prices.yaml")
    path = write(tmp_path, "prices: prices.yaml\nbudgets:\n  - {name: b, amount_usd: 10, thresholds: [{percent: 50, absolute_usd: 5}]}\n")
    with pytest.raises(ConfigError, match=r"budgets\[0\]\.thresholds\[0\]: give exactly one of percent or absolute_usd"):
        load_config(path)
    assert parse_duration("60m").total_seconds() == 3600
    with pytest.raises(ValueError, match="not a duration"):
        parse_duration("soon")


def test_a_file_sources_lookback_is_bounded_and_a_larger_one_is_named(tmp_path):
    write(tmp_path, PRICES, "prices.yaml")
    for days, problem in ((3650, None), (3651, "must be <= 3,650"), (10**12, "must be <= 3,650")):
        path = write(tmp_path, f"""
            prices: prices.yaml
            usage:
              sources:
                - {{type: file, path: "day={{date}}/*.parquet", lookback_days: {days}}}
            """)
        if problem is None:
            assert load_config(path).usage.sources[0].lookback_days == days
            continue
        with pytest.raises(ConfigError) as exc:
            load_config(path)
        assert exc.value.problems == [f"{path}: usage.sources[0].lookback_days: {problem}"]
