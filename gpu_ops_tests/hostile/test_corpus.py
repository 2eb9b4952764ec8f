"""The hostile-input corpus (cases.yaml) through the CLI and through the `gpu_usage` asset.

Each case is checked twice, against the same expectation:
- `gpu-ops cost attribution ... --format json --quarantine q.csv` in a real process (one
  driver process runs every case through the console entry point; a sample also runs as
  separate `gpu-ops` processes): exit status, no traceback, total to the cent, exactly
  the expected quarantine rows, the error text;
- a real Dagster materialization of `gpu_usage` (one ephemeral instance for all cases):
  the stored `gpu_usage` and `gpu_usage_quarantine` tables, the `sources_complete`
  ERROR check, or the run's failure message for configuration errors.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import dagster as dg
import pandas as pd
import pytest
import yaml

from gpu_ops_tests.conftest import REPO
from gpu_ops_tests.hostile import build

HERE = Path(__file__).parent
CASES: list[dict[str, Any]] = yaml.safe_load((HERE / "cases.yaml").read_text())["cases"]
DAY = "2026-10-01"
# Run as separate `gpu-ops` processes too (one per kind of outcome).
STANDALONE = ("csv-end-9999-sentinel", "parquet-end-9999-seconds", "parquet-corrupt-page", "glob-matches-nothing", "prices-whole-instance-h100", "config-glob-matches-nothing")


def test_corpus_is_large_and_ids_are_unique():
    ids = [c["id"] for c in CASES]
    assert len(ids) == len(set(ids)) and len(ids) >= 40
    kinds = {c["id"].split("-")[0] for c in CASES}
    assert {"csv", "parquet", "prices", "config"} <= kinds


@pytest.fixture(scope="session")  # once per worker (see conftest.py)
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("hostile") / "corpus"
    shutil.copytree(HERE, folder, ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    build.build(folder)
    return folder


def _argv(case: dict[str, Any], corpus: Path, qpath: Path) -> list[str]:
    argv = ["cost", "attribution", "--date", case.get("date", DAY), "--format", "json", "--by", case.get("by", "team"), "--quarantine", str(qpath)]
    if "batch_rows" in case:
        argv += ["--batch-rows", str(case["batch_rows"])]
    if "config" in case:
        return [*argv, "--config", str(corpus / case["config"])]
    for pattern in case["usage"]:
        argv += ["--usage", pattern]
    return [*argv, "--prices", case.get("prices", "prices.yaml")]


@pytest.fixture(scope="session")  # once per worker (see conftest.py)
def cli_results(corpus: Path) -> dict[str, dict[str, Any]]:
    """Every case through the real console entry point, in one driver process."""
    requests = []
    for case in CASES:
        qpath = corpus / "out" / f"{case['id']}.quarantine.csv"
        qpath.parent.mkdir(exist_ok=True)
        requests.append(json.dumps({"id": case["id"], "argv": _argv(case, corpus, qpath), "cwd": str(corpus)}))
    proc = subprocess.run(
        [sys.executable, "-m", "gpu_ops_tests.hostile.cli_driver"], input="\n".join(requests) + "\n",
        capture_output=True, text=True, cwd=REPO, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {r["id"]: r for r in map(json.loads, proc.stdout.splitlines())}


# --------------------------------------------------------------------------- expectations


def _match_quarantine(actual: pd.DataFrame, expected: list[dict[str, Any]]) -> None:
    rows = [] if actual is None or actual.empty else actual.to_dict("records")
    shown = "\n".join(f"  {r.get('location')} row {r.get('row')} [{r.get('field')}] {r.get('reason')}" for r in rows)
    assert len(rows) == len(expected), f"expected {len(expected)} quarantined row(s), got {len(rows)}:\n{shown}"
    left = list(rows)
    for exp in expected:
        want_row = exp.get("row")
        for r in left:
            row = r.get("row")
            row = None if row is None or (isinstance(row, float) and math.isnan(row)) or row is pd.NA or row == "" else int(row)
            if str(r["location"]).endswith(exp["file"]) and row == want_row and r["field"] == exp["field"] and exp["reason"] in str(r["reason"]):
                left.remove(r)
                break
        else:
            raise AssertionError(f"no quarantined row like {exp}; got:\n{shown}")


def _teams(case: dict[str, Any], table: pd.DataFrame) -> None:
    """Cost per team, to the cent: a team stored as BINARY is priced under its text."""
    if "teams" in case:
        got = {str(k): round(float(v), 2) for k, v in table.groupby("team")["cost_usd"].sum().items()} if len(table) else {}
        assert got == {k: pytest.approx(v, abs=0.001) for k, v in case["teams"].items()}, got


def _total(case: dict[str, Any], value: float) -> None:
    assert round(value, 2) == pytest.approx(case["total_usd"], abs=0.001), f"priced ${value:.4f}, expected ${case['total_usd']:.2f}"


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_cli(case: dict[str, Any], cli_results: dict[str, dict[str, Any]], corpus: Path) -> None:
    r = cli_results[case["id"]]
    assert "Traceback" not in r["stderr"], r["stderr"]
    assert r["exit"] == case.get("exit", 0), f"exit {r['exit']}; stderr:\n{r['stderr']}"
    if "error" in case:
        assert case["error"] in r["stderr"], r["stderr"]
    if "warning" in case:
        assert case["warning"] in r["stderr"], r["stderr"]
    if "total_usd" in case:
        table = json.loads(r["stdout"])
        _total(case, sum(row["cost_usd"] for row in table))
        _teams(case, pd.DataFrame(table))
        qpath = corpus / "out" / f"{case['id']}.quarantine.csv"
        _match_quarantine(pd.read_csv(qpath) if qpath.exists() else None, case.get("quarantine", []))
    else:
        assert r["stdout"] == "", "a configuration error prints no table"


@pytest.mark.parametrize("case_id", STANDALONE)
def test_cli_as_its_own_process_agrees_with_the_driver(case_id: str, cli_results: dict[str, dict[str, Any]], corpus: Path, tmp_path: Path) -> None:
    case = next(c for c in CASES if c["id"] == case_id)
    qpath = tmp_path / "q.csv"
    proc = subprocess.run([sys.executable, "-m", "gpu_ops.cli", *_argv(case, corpus, qpath)], capture_output=True, text=True, cwd=corpus, timeout=120)
    driven = cli_results[case_id]
    assert "Traceback" not in proc.stderr
    assert (proc.returncode, proc.stdout) == (driven["exit"], driven["stdout"])
    assert proc.stderr.replace(str(qpath), "Q") == driven["stderr"].replace(str(corpus / "out" / f"{case_id}.quarantine.csv"), "Q")


# --------------------------------------------------------------------------- the asset


@pytest.fixture(scope="session")  # once per worker (see conftest.py)
def dagster_env(corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    from gpu_ops.domain.config import load_config
    from gpu_ops.dagster.cost.assets import build_assets

    stand_in = tmp_path_factory.mktemp("stand_in") / "gpu_ops.yaml"
    stand_in.write_text(yaml.safe_dump({"prices": str(corpus / "prices.yaml"), "usage": {"sources": [{"type": "file", "path": str(corpus / "csv" / "good.csv")}]}}))
    assets, _ = build_assets(load_config(stand_in))
    with dg.DagsterInstance.ephemeral() as instance:
        yield assets, instance


def _case_config(case: dict[str, Any], corpus: Path, folder: Path) -> Path:
    if "config" in case:
        return corpus / case["config"]
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "gpu_ops.yaml"
    cfg = {
        "storage": {"url": f"sqlite:///{folder / 'costs.db'}"},
        "prices": str(corpus / case.get("prices", "prices.yaml")),
        "usage": {"sources": [{"type": "file", "path": str(corpus / p)} for p in case["usage"]]},
    }
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_asset(case: dict[str, Any], corpus: Path, dagster_env: Any, tmp_path: Path) -> None:
    from gpu_ops.dagster.resources import GpuOpsSettings
    from gpu_ops.dagster.io_manager import TableIOManager
    from gpu_ops.storage.tables import TableStore

    assets, instance = dagster_env
    usage_asset = assets[0]
    expect = {**case, **case.get("asset", {})}
    url = f"sqlite:///{tmp_path / 'tables.db'}"
    resources = {"gpu_ops": GpuOpsSettings(config_path=str(_case_config(case, corpus, tmp_path / "cfg"))), "table_io_manager": TableIOManager(url=url)}
    result = dg.materialize([usage_asset], partition_key=expect.get("date", DAY), resources=resources, instance=instance, raise_on_error=False)
    if "run_fails" in expect or "total_usd" not in expect:  # a configuration error: the run fails and says why
        assert not result.success
        failures = [e.step_failure_data.error.to_string() for e in result.all_events if e.is_step_failure]
        assert any(expect.get("run_fails", expect.get("error")) in m for m in failures), failures
        return
    checks = {e.check_name: e for e in result.get_asset_check_evaluations()}
    complete = checks["sources_complete"]
    assert complete.passed == (expect.get("exit", 0) == 0), complete.description
    assert complete.severity == dg.AssetCheckSeverity.ERROR
    if "error" in expect:
        assert expect["error"] in (complete.description or "")
    store = TableStore(url)
    usage = store.read("gpu_usage")
    _total(expect, float(usage["cost_usd"].sum()) if len(usage) else 0.0)
    _teams(expect, usage)
    if "warning" in expect:
        assert any(expect["warning"] in str(v) for e in result.get_asset_materialization_events() for v in (e.materialization.metadata or {}).values()), "no warning in gpu_usage's metadata"
    _match_quarantine(store.read("gpu_usage_quarantine", missing_ok=True), expect.get("quarantine", []))


# --------------------------------------------------------------------------- gpu-ops validate


def _validate(corpus: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpu_ops.cli", "validate", *args], capture_output=True, text=True, cwd=corpus, timeout=120)


def test_validate_fails_on_a_pattern_that_matches_nothing(corpus: Path) -> None:
    r = _validate(corpus, "--config", str(corpus / "configs" / "empty_glob.yaml"), "--only", "usage_sources")
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "FAIL usage_sources:" in r.stdout and "no file matches '../exports/*.parquet'" in r.stdout and "fix:" in r.stdout
    ok = _validate(corpus, "--config", str(corpus / "configs" / "two_patterns_one_file.yaml"), "--only", "usage_sources")
    assert ok.returncode == 0 and "ok   usage_sources: 3 pattern(s) match 1 file(s)" in ok.stdout


def test_validate_judges_a_files_columns_as_the_read_does(corpus: Path) -> None:
    """`gpu-ops validate` opens each file with the reader's own header check: a file the read
    rejects (a column named twice, in usage or in the inventory) fails the check with the
    read's reason; a file whose header the read accepts passes (a bad byte further down
    costs its row, not the file)."""
    csv_dir = corpus / "csv"
    config = corpus / "configs" / "probe_as_read.yaml"
    (corpus / "configs" / "nodes_twice.csv").write_text("node,node,gpu_type,gpu_count,capacity_type,start,end\nn1,n1,l4,1,spot,2026-10-01T00:00:00Z,\n")
    config.write_text(
        'storage: {url: "sqlite:///costs.db"}\nprices: ../prices.yaml\nusage:\n  sources:\n'
        f"    - {{type: file, path: {csv_dir / 'dup_columns.csv'}}}\n    - {{type: file, path: {csv_dir / 'bad_utf8.csv'}}}\n"
        f"  inventory: {{type: file, path: {corpus / 'configs' / 'nodes_twice.csv'}}}\n"
    )
    r = _validate(corpus, "--config", str(config), "--only", "usage_sources")
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stdout + r.stderr
    assert "dup_columns.csv: duplicate column name(s) 'team': each column must appear once" in r.stdout, r.stdout
    assert "nodes_twice.csv: duplicate column name(s) 'node'" in r.stdout
    assert "bad_utf8.csv" not in r.stdout


def test_validate_only_with_an_unknown_name_is_an_error_listing_the_names(corpus: Path) -> None:
    r = _validate(corpus, "--config", str(corpus / "configs" / "two_patterns_one_file.yaml"), "--only", "typo")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "no check named 'typo'" in r.stderr and "storage, row_level_path, kubeconfig" in r.stderr and "usage_sources" in r.stderr and "cur_index" in r.stderr


def test_a_missing_source_blocks_the_days_attribution(corpus: Path, dagster_env: Any, tmp_path: Path) -> None:
    """sources_complete is a blocking check: a day priced without one of its files stops
    before attribution and budgets (the run fails, visibly); gpu_usage keeps what was read."""
    from gpu_ops.dagster.resources import GpuOpsSettings
    from gpu_ops.dagster.io_manager import TableIOManager

    assets, instance = dagster_env
    case = next(c for c in CASES if c["id"] == "glob-matches-nothing")
    resources = {"gpu_ops": GpuOpsSettings(config_path=str(_case_config(case, corpus, tmp_path / "cfg"))), "table_io_manager": TableIOManager(url=f"sqlite:///{tmp_path / 't.db'}")}
    result = dg.materialize(assets[:2], partition_key=DAY, resources=resources, instance=instance, raise_on_error=False)
    assert not result.success
    done = {e.asset_key.to_user_string() for e in result.get_asset_materialization_events()}
    assert "gpu_usage" in done and "gpu_cost_attribution" not in done
    check = next(e for e in result.get_asset_check_evaluations() if e.check_name == "sources_complete")
    assert not check.passed and "exports/*.parquet" in (check.description or "")
