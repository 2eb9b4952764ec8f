"""The sample input files under examples/data/ (one per format, shown in the manual's
reference pages) load through the real code: the configuration loader for the
configuration, prices, budgets and channels, and `gpu-ops cost` (the cost core) for the
usage and inventory files, with the figures the usage reference page works out by hand."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpu_ops.cli import main
from gpu_ops.domain.config import EmailChannel, FileSource, LogChannel, PagerDutyChannel, SlackChannel, WebhookChannel, load_config
from gpu_ops_tests.conftest import REPO

DATA = REPO / "examples" / "data"
SAMPLES = ("gpu_ops.yaml", "usage.csv", "inventory.csv", "prices.yaml", "budgets.yaml", "channels.yaml")


@pytest.fixture
def data(tmp_path: Path) -> Path:
    """A copy, so that the ledger source's SQLite file is not written into the repository."""
    copy = tmp_path / "data"
    shutil.copytree(DATA, copy, ignore=shutil.ignore_patterns(".gpu_ops"))
    return copy


def _cli(*args: str) -> str:
    out = CliRunner().invoke(main, list(args), catch_exceptions=False)
    assert out.exit_code == 0, out.output
    return out.stdout  # stderr (notes, quarantine summaries) is kept apart


def test_every_format_has_its_sample_and_its_reference_page_shows_it():
    for name in SAMPLES:
        assert (DATA / name).is_file(), name
    for page, sample in [("usage", "usage.csv"), ("inventory", "inventory.csv"), ("prices", "prices.yaml"), ("budgets", "budgets.yaml"),
                         ("channels", "channels.yaml"), ("config", "gpu_ops.yaml")]:
        assert f'--8<-- "examples/data/{sample}"' in (REPO / "docs" / "reference" / f"{page}.md").read_text(), page


def test_the_configuration_sample_loads_with_its_prices_budgets_and_channels_files(data: Path):
    config = load_config(data / "gpu_ops.yaml")
    assert config.prices.currency == "USD" and config.prices.source and str(config.prices.as_of) == "2026-11-01"
    assert config.prices.gpus["a100-80gb"] == {"on-demand": 5.12, "spot": 1.79, "reserved": 3.40}
    assert config.prices.regions["eu-west-1"].multiplier == 1.10
    assert [b.name for b in config.budgets] == ["nlp-monthly", "vision-weekly"]
    nlp = config.budget("nlp-monthly")
    assert nlp.scope.team == "nlp" and nlp.amount_usd == 1500 and len(nlp.thresholds) == 5
    assert [t.key() for t in nlp.thresholds] == ["actual-50pct", "actual-80pct", "actual-100pct", "forecast-120pct", "actual-2000usd"]
    assert nlp.enforcement.action == "throttle" and nlp.enforcement.max_gpus == 8
    kinds = {name: type(ch) for name, ch in config.channels.items()}
    assert kinds == {"slack-ml": SlackChannel, "oncall": PagerDutyChannel, "audit": WebhookChannel, "finance": EmailChannel, "log": LogChannel}
    files = [s for s in config.usage.sources if isinstance(s, FileSource)]
    assert [s.path for s in files] == ["usage.csv"] and config.usage.inventory is not None
    assert config.storage.resolved_url().startswith(f"sqlite:///{data.resolve()}")  # relative to the file's folder


def test_the_usage_and_inventory_samples_price_to_the_cent(data: Path, tmp_path: Path):
    quarantine = tmp_path / "bad_rows.csv"
    rows = json.loads(_cli("cost", "attribution", "--config", str(data / "gpu_ops.yaml"), "--date", "2026-10-14", "--format", "json", "--quarantine", str(quarantine)))
    cost = {(r["team"], r["project"]): round(r["cost_usd"], 2) for r in rows}
    hours = {(r["team"], r["project"]): round(r["gpu_hours"], 3) for r in rows}
    assert cost == {
        ("nlp", "llm"): 57.28,  # 8 GPUs x 4 h x 1.79 (spot a100-80gb)
        ("nlp", "llm-eval"): 12.30,  # 1 x 1.5 h after midnight x 8.20 (reserved h100, an alias name)
        ("vision", "notebooks"): 4.09,  # 1 x 0.25 x 8 h x 1.86 x 1.10 (time-sliced l40s, eu-west-1)
        ("research", "sweeps"): 0.84,  # 1 x 4 h (still running: clipped at midnight) x 0.21
        ("__idle__", "__idle__"): 286.40,  # the inventory's node: 8 x 24 h x 1.79 = 343.68, less 57.28 allocated
    }
    assert hours[("vision", "notebooks")] == 2.0 and hours[("__idle__", "__idle__")] == 160.0
    assert not quarantine.exists() or quarantine.read_text().count("\n") <= 1  # nothing quarantined


def test_the_samples_work_as_command_line_files_too(data: Path, tmp_path: Path):
    rows = json.loads(_cli("cost", "attribution", "--usage", str(data / "usage.csv"), "--prices", str(data / "prices.yaml"),
                           "--date", "2026-10-14", "--by", "team", "--format", "json"))
    assert {r["team"]: round(r["cost_usd"], 2) for r in rows} == {"nlp": 69.58, "vision": 4.09, "research": 0.84}
    status = json.loads(_cli("cost", "budgets", "--usage", str(data / "usage.csv"), "--prices", str(data / "prices.yaml"),
                             "--budgets", str(data / "budgets.yaml"), "--date", "2026-10-14", "--format", "json"))
    by_name = {r["budget"]: r for r in status}
    assert round(by_name["nlp-monthly"]["spend_usd"], 2) == 85.98  # the 13th's 2 h of h100 (16.40) and the 14th's 69.58
    assert by_name["nlp-monthly"]["status"] == "ok"
    assert by_name["vision-weekly"]["status"] == "exceeded" and by_name["vision-weekly"]["thresholds_crossed"] == ["actual-100pct"]


def test_a_broken_copy_of_the_usage_sample_is_quarantined_not_priced(data: Path, tmp_path: Path):
    """The loader really checks the sample's columns: the same file with an unknown GPU is refused row by row."""
    usage = data / "usage.csv"
    usage.write_text(usage.read_text().replace(",l40s,", ",l40x,"))
    quarantine = tmp_path / "bad_rows.csv"
    rows = json.loads(_cli("cost", "attribution", "--usage", str(usage), "--prices", str(data / "prices.yaml"), "--date", "2026-10-14",
                           "--by", "team", "--format", "json", "--quarantine", str(quarantine)))
    assert "vision" not in {r["team"] for r in rows}
    text = quarantine.read_text()
    assert "usage.csv" in text and "gpu_type" in text and "l40x" in text


def test_the_output_shown_on_the_usage_page_is_what_the_command_prints(data: Path):
    """The manual's figures are checked, not typed: the usage page's example output is the CLI's."""
    page = (REPO / "docs" / "reference" / "usage.md").read_text()
    command = "$ gpu-ops cost attribution --config examples/data/gpu_ops.yaml --date 2026-10-14\n"
    shown = page[page.index(command) + len(command):].split("```", 1)[0]
    printed = _cli("cost", "attribution", "--config", str(data / "gpu_ops.yaml"), "--date", "2026-10-14")
    assert printed == shown
    assert "NaN" not in _cli("cost", "budgets", "--config", str(data / "gpu_ops.yaml"), "--date", "2026-10-14")  # no forecast yet: n/a
