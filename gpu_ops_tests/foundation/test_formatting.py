"""One way figures read (gpu_ops.domain.formatting), and a description for every column of every
table the UI shows (gpu_ops.domain.column_descriptions), checked on a real materialization."""

from __future__ import annotations

import math
import os

import dagster as dg
import pytest

from gpu_ops.domain.column_descriptions import COLUMN_DESCRIPTIONS, describe
from gpu_ops.domain.config import DEMO_CONFIG
from gpu_ops.domain.formatting import gpu_hours, hours, money, percent, round_hours, round_money


@pytest.mark.parametrize(
    "value, text, rounded",
    [
        (0.0014599169083333334, "$0.00", 0.0),
        (12345.678, "$12,345.68", 12345.68),
        (-3.456, "-$3.46", -3.46),
        (float("nan"), "n/a", None),
        (None, "n/a", None),
        (math.inf, "n/a", None),
        ("not a number", "n/a", None),
    ],
)
def test_money_is_to_the_cent_and_never_nan(value, text, rounded):
    assert money(value) == text
    assert round_money(value) == rounded


def test_hours_to_three_decimals_and_percentages_to_one():
    assert round_hours(0.01765254388888889) == 0.018 and gpu_hours(0.01765254388888889) == "0.018 GPU-h"
    assert hours(1234.5678) == "1,234.568" and hours(float("nan")) == "n/a" and gpu_hours(None) == "n/a"
    assert percent(125.5555) == "125.6%" and percent(float("nan")) == "n/a"
    assert money(-0.001) == "$0.00"  # no "-$0.00"
    assert money(2.5, "EUR") == "2.50 EUR"


def test_label_columns_and_unknown_columns():
    assert "label 'env'" in describe("label_env")
    assert describe("no_such_column") == ""


def test_every_column_of_every_cost_table_is_described_in_the_ui(tmp_path, monkeypatch):
    """The bundled demo's 2026-10-14, materialized for real: each stored table's
    dagster/column_schema and each typed metadata table carry a description per column."""
    monkeypatch.setenv("GPU_OPS_HOME", str(tmp_path / "home"))
    from gpu_ops.dagster.cost.definitions import DAILY_JOB
    from gpu_ops.dagster.location import build_defs

    defs = build_defs(str(DEMO_CONFIG))
    with dg.DagsterInstance.ephemeral() as instance:
        result = defs.resolve_job_def(DAILY_JOB).execute_in_process(partition_key="2026-10-14", instance=instance, raise_on_error=False)
        assert result.success
        seen = set()
        for event in result.get_asset_materialization_events():
            mat = event.step_materialization_data.materialization
            for label, value in mat.metadata.items():
                if isinstance(value, dg.TableSchemaMetadataValue):
                    columns = value.schema.columns
                elif isinstance(value, dg.TableMetadataValue):
                    columns = value.schema.columns
                else:
                    continue
                for column in columns:
                    seen.add(column.name)
                    assert column.description, f"{mat.asset_key.to_user_string()} {label}: column {column.name!r} has no description"
    # the row-level table, the aggregates, budgets and ROI were all among them
    assert {"interval_start", "gpu_share", "cost_usd", "spend_usd", "thresholds_crossed", "preemption_waste_usd", "reason"} <= seen
    assert seen <= set(COLUMN_DESCRIPTIONS) | {c for c in seen if c.startswith("label_")}


GLOSSARY_START = "<!-- column glossary: generated from gpu_ops/domain/column_descriptions.py by gpu_ops_tests/foundation/test_formatting.py -->"
GLOSSARY_END = "<!-- end of column glossary -->"


def glossary() -> str:
    rows = "\n".join(f"| `{name}` | {text} |" for name, text in sorted(COLUMN_DESCRIPTIONS.items()))
    return f"{GLOSSARY_START}\n\n| column | meaning |\n|---|---|\n{rows}\n| `label_<name>` | value of the label `<name>` (`usage.group_by: label:<name>`) |\n\n{GLOSSARY_END}"


def test_the_tables_page_shows_the_descriptions_the_ui_shows():
    """docs/reference/tables.md's column glossary is the code's, not retyped
    (GPU_OPS_UPDATE_DOCS=1 rewrites it after a description changes)."""
    from gpu_ops_tests.conftest import REPO

    page = REPO / "docs" / "reference" / "tables.md"
    text = page.read_text()
    start, end = text.index(GLOSSARY_START), text.index(GLOSSARY_END) + len(GLOSSARY_END)
    if os.environ.get("GPU_OPS_UPDATE_DOCS") == "1":
        page.write_text(text[:start] + glossary() + text[end:])
        text = page.read_text()
        start, end = text.index(GLOSSARY_START), text.index(GLOSSARY_END) + len(GLOSSARY_END)
    assert text[start:end] == glossary()


@pytest.mark.parametrize(
    "url, shown, with_path",
    [
        ("http://user:s3cret@mlflow.internal:5000/api?token=t0k", "http://mlflow.internal:5000/…", "http://mlflow.internal:5000/api"),
        ("https://hooks.slack.com/services/T0/B0/xyz", "https://hooks.slack.com/…", "https://hooks.slack.com/services/T0/B0/xyz"),
        ("postgresql+psycopg2://gpu_ops:pw@127.0.0.1:5432/costs?sslpassword=x", "postgresql+psycopg2://127.0.0.1:5432/…", "postgresql+psycopg2://127.0.0.1:5432/costs"),
        ("s3://AKIA:wJalr@bucket/ckpts#frag", "s3://bucket/…", "s3://bucket/ckpts"),
        ("http://[::1]:4318/v1/traces", "http://[::1]:4318/…", "http://[::1]:4318/v1/traces"),
        ("http://user@host", "http://host/…", "http://host"),
        ("sqlite:////tmp/a/costs.db", "sqlite:///…", "sqlite:////tmp/a/costs.db"),
        ("checkpoints/run-1", "<redacted>", "checkpoints/run-1"),  # a plain path holds no userinfo
    ],
)
def test_one_helper_takes_userinfo_and_query_out_of_every_url(url: str, shown: str, with_path: str) -> None:
    from gpu_ops.domain.formatting import redact_url

    assert redact_url(url) == shown
    assert redact_url(url, keep_path=True) == with_path


def test_urls_inside_a_message_lose_their_secrets() -> None:
    from gpu_ops.domain.formatting import redact_urls

    text = (
        "API request to http://alice:hunter2@127.0.0.1:5000/api/2.0/mlflow/runs/get?run_id=1 failed; "
        "retried 'https://bob:pw2@otel:4318/v1/traces?key=abc', then (ftp://x:y@z/)."
    )
    out = redact_urls(text)
    for secret in ("alice", "hunter2", "bob", "pw2", "run_id=1", "key=abc", "x:y"):
        assert secret not in out
    assert "http://127.0.0.1:5000/…" in out and "'https://otel:4318/…'" in out and "(ftp://z/…)" in out
