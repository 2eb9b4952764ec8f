"""`gpu-ops alerts test <channel>`: a marked test notification and a clear outcome."""

from __future__ import annotations

import json
import subprocess
import sys

from click.testing import CliRunner

from gpu_ops.cli import main

from gpu_ops.flows.compute.local import free_port

from .conftest import write_config


def test_sends_a_marked_test_notification(tmp_path, receiver, monkeypatch):
    hook = receiver()
    monkeypatch.setenv("HOOK_SECRET", "cli-secret-value")
    path = write_config(tmp_path, budgets=[], channels={"audit": {"type": "webhook", "url": hook.url + "/x", "secret": {"env": "HOOK_SECRET"}}})
    result = CliRunner().invoke(main, ["alerts", "test", "audit", "--config", str(path)])
    assert result.exit_code == 0, result.output
    assert result.output.startswith("ok: test notification delivered through webhook channel 'audit' (HTTP 200 from http://127.0.0.1:")
    body = hook.acknowledged[0].json()
    assert body["test"] is True and body["type"] == "gpu_ops.budget.test" and body["budget"] == "gpu-ops-test"
    assert "cli-secret-value" not in result.output


def test_reports_a_failure_and_exits_non_zero(tmp_path, monkeypatch):
    monkeypatch.setenv("SLACK_WEBHOOK_URL", f"http://127.0.0.1:{free_port()}/services/T1/B1/topsecret")
    path = write_config(tmp_path, budgets=[], channels={"slack": {"type": "slack", "webhook_url": {"env": "SLACK_WEBHOOK_URL"}}})
    result = CliRunner().invoke(main, ["alerts", "test", "slack", "--config", str(path)])
    assert result.exit_code == 1
    assert "FAILED: slack channel 'slack': connection refused or unreachable (after 3 attempts)" in result.output
    assert "topsecret" not in result.output and "/services/" not in result.output


def test_unknown_channel_lists_the_configured_ones(tmp_path):
    path = write_config(tmp_path, budgets=[], channels={"log": {"type": "log"}})
    result = CliRunner().invoke(main, ["alerts", "test", "slak", "--config", str(path)])
    assert result.exit_code != 0 and "no channel named 'slak' (configured channels: log)" in result.output


def test_the_console_script_does_not_import_dagster(tmp_path):
    path = write_config(tmp_path, budgets=[], channels={"log": {"type": "log"}})
    code = (
        "import sys; from gpu_ops.cli import main\n"
        "try:\n    main(['alerts', 'test', 'log', '--config', sys.argv[1]])\n"
        "except SystemExit as e:\n    assert not e.code, e.code\n"
        "print('DAGSTER' if 'dagster' in sys.modules else 'NO-DAGSTER')"
    )
    out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "ok: test notification delivered through log channel 'log'" in out.stdout
    assert "[TEST] GPU budget gpu-ops-test" in out.stderr
    assert out.stdout.strip().splitlines()[-1] == "NO-DAGSTER", json.dumps(out.stdout)


def test_validate_check_names_missing_channel_secrets(tmp_path, monkeypatch):
    from gpu_ops.cli.checks.alerts import check_channels
    from gpu_ops.domain.config import load_config

    monkeypatch.delenv("PD_ROUTING_KEY", raising=False)
    path = write_config(
        tmp_path,
        budgets=[{"name": "b", "amount_usd": 10, "channels": ["oncall"]}],
        channels={"oncall": {"type": "pagerduty", "routing_key": {"env": "PD_ROUTING_KEY"}}, "log": {"type": "log"}},
    )
    result = check_channels(load_config(path))
    assert result.failed and result.detail == "secrets not set: oncall: $PD_ROUTING_KEY; not used by any budget: log"
    monkeypatch.setenv("PD_ROUTING_KEY", "x" * 32)
    ok = check_channels(load_config(path))
    assert ok.status == "ok" and "x" * 32 not in ok.detail


def test_validate_check_names_a_channel_url_secret_that_is_no_http_url(tmp_path, monkeypatch):
    """A webhook or Slack URL held in the environment was only read when a budget fired
    (then: 'not an http(s) URL', the alert lost). `gpu-ops validate` reads it now, naming
    the variable and never its value (a Slack URL's path is its token)."""
    from gpu_ops.cli.checks.alerts import check_channels
    from gpu_ops.domain.config import load_config

    monkeypatch.setenv("SLACK_WEBHOOK_URL", "hooks.slack.com/services/T1/B1/topsecret")  # no scheme: a common paste
    monkeypatch.setenv("HOOK_URL", "ftp://hooks.example.com/topsecret")
    monkeypatch.setenv("PD_ROUTING_KEY", "x" * 32)  # not a URL and need not be one
    path = write_config(
        tmp_path,
        budgets=[{"name": "b", "amount_usd": 10, "channels": ["slack", "hook", "oncall"]}],
        channels={
            "slack": {"type": "slack", "webhook_url": {"env": "SLACK_WEBHOOK_URL"}},
            "hook": {"type": "webhook", "url": {"env": "HOOK_URL"}},
            "oncall": {"type": "pagerduty", "routing_key": {"env": "PD_ROUTING_KEY"}},
        },
    )
    result = check_channels(load_config(path))
    assert result.failed and result.detail == "not http(s) URLs: hook: $HOOK_URL, slack: $SLACK_WEBHOOK_URL"
    assert "topsecret" not in result.detail + result.fix and "hooks." not in result.detail
    monkeypatch.setenv("SLACK_WEBHOOK_URL", "https://hooks.slack.com/services/T1/B1/topsecret")
    monkeypatch.setenv("HOOK_URL", "http://127.0.0.1:9/x")
    assert check_channels(load_config(path)).status == "ok"


def test_a_channel_url_written_in_the_file_must_be_an_http_url(tmp_path):
    import pytest

    from gpu_ops.domain.config import ConfigError, load_config

    for channel, field in (
        ({"type": "slack", "webhook_url": "hooks.slack.com/services/T1/B1/topsecret"}, "channels.c.webhook_url"),
        ({"type": "webhook", "url": "mailto:ops@example.com"}, "channels.c.url"),
        ({"type": "pagerduty", "routing_key": "k", "events_url": "events.pagerduty.com/v2/enqueue"}, "channels.c.events_url"),
    ):
        path = write_config(tmp_path, budgets=[], channels={"c": channel})
        with pytest.raises(ConfigError) as caught:
            load_config(path)
        assert f"{field}: not an http(s) URL" in str(caught.value), str(caught.value)
        assert "topsecret" not in str(caught.value)
