"""`gpu-ops cost ...` as a real process: output formats, hand-computed figures, fast start."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
import textwrap
import traceback

import pytest

from gpu_ops_tests.conftest import REPO

PRICES = """\
currency: USD
source: test
as_of: 2026-10-01
gpus:
  a100-80gb: {on-demand: 4.0, spot: 1.0}
  l4: {on-demand: 0.8}
"""
USAGE = [
    "start,end,namespace,pod,node,team,project,cost_center,experiment_id,gpu_type,gpu_count,capacity_type,sharing,gpu_share",
    "2026-10-01T22:00:00Z,2026-10-02T03:00:00Z,ml,p1,n1,nlp,llm,,,a100-80gb,2,spot,none,",  # 6 GPU-h on the 2nd: $6
    "2026-10-02T00:00:00Z,2026-10-02T07:00:00Z,ml,p2,n1,vision,det,,,NVIDIA-A100-SXM4-80GB,3,on-demand,mig,0.142857142857",  # 3 GPU-h: $12
    "2026-10-02T00:00:00Z,,ml,p3,n2,vision,nb,,,l4,1,on-demand,timeslice,0.25",  # open: 6 GPU-h by the end of the day: $4.80
    "2026-10-02T00:00:00Z,2026-10-02T01:00:00Z,ml,p4,n1,,llm,,,a100-80gb,1,spot,none,",  # no team: quarantined
]


@pytest.fixture
def files(tmp_path):
    (tmp_path / "prices.yaml").write_text(PRICES)
    (tmp_path / "usage.csv").write_text("\n".join(USAGE) + "\n")
    (tmp_path / "budgets.yaml").write_text(
        textwrap.dedent(
            """\
            budgets:
              - name: vision
                scope: {team: vision}
                amount_usd: 20
                thresholds: [{percent: 50}, {percent: 80}, {percent: 100}]
            """
        )
    )
    return tmp_path


def gpu_ops(*args: str, cwd=None) -> subprocess.CompletedProcess:
    """`gpu-ops ARGS` run in this process by click's runner (a subprocess per command cost
    1.2 s of CPU in imports; what a process start shows is tested apart below: the cost
    commands start light and never import Dagster or torch). An exception that escaped
    the command is written to its stderr as the console script would print it."""
    from click.testing import CliRunner

    from gpu_ops.cli import main

    here = os.getcwd()
    os.chdir(cwd or REPO)
    try:
        r = CliRunner().invoke(main, list(args), prog_name="gpu-ops")
    finally:
        os.chdir(here)
    stderr = r.stderr
    if r.exception is not None and not isinstance(r.exception, SystemExit):
        stderr += "".join(traceback.format_exception(r.exception))
    return subprocess.CompletedProcess(["gpu-ops", *args], r.exit_code, r.stdout, stderr)


def gpu_ops_process(*args: str) -> subprocess.CompletedProcess:
    """`gpu-ops ARGS` in a process of its own: for what a process says once, at its start."""
    return subprocess.run([sys.executable, "-m", "gpu_ops.cli", *args], capture_output=True, text=True, cwd=REPO, timeout=120)


def common(files, *extra):
    return ["--usage", str(files / "usage.csv"), "--prices", str(files / "prices.yaml"), "--date", "2026-10-02", *extra]


def test_attribution_json_is_hand_computed(files):
    r = gpu_ops("cost", "attribution", *common(files, "--by", "team", "--format", "json"))
    assert r.returncode == 0, r.stderr
    rows = {x["team"]: x for x in json.loads(r.stdout)}
    assert rows["nlp"]["cost_usd"] == pytest.approx(6.0) and rows["nlp"]["savings_usd"] == pytest.approx(18.0)
    assert rows["vision"]["cost_usd"] == pytest.approx(12.0 + 4.8)
    assert rows["vision"]["gpu_hours"] == pytest.approx(3.0 + 6.0)
    assert "quarantined 1 row" in r.stderr and "team: missing" in r.stderr
    # the fourth data row is line 5 of the file: both are named, so an editor finds it
    assert "usage.csv row 4 (line 5, after the header): team: missing" in r.stderr


def test_attribution_csv_by_team_and_project_with_as_of(files):
    r = gpu_ops("cost", "attribution", *common(files, "--by", "team,project", "--format", "csv", "--as-of", "2026-10-02T04:00:00Z"))
    assert r.returncode == 0, r.stderr
    rows = {(x["team"], x["project"]): x for x in csv.DictReader(io.StringIO(r.stdout))}
    assert list(next(iter(rows.values())))[:6] == ["team", "project", "gpu_hours", "cost_usd", "on_demand_equivalent_usd", "savings_usd"]
    assert float(rows[("vision", "nb")]["cost_usd"]) == pytest.approx(0.25 * 4 * 0.8)  # open interval clipped at 04:00
    assert float(rows[("vision", "det")]["cost_usd"]) == pytest.approx(3 / 7 * 4 * 4.0)


def test_attribution_table_and_quarantine_file(files):
    qpath = files / "q.csv"
    r = gpu_ops("cost", "attribution", *common(files, "--quarantine", str(qpath)))
    assert r.returncode == 0, r.stderr
    assert "GPU cost 2026-10-02" in r.stdout and "nlp" in r.stdout
    q = list(csv.DictReader(qpath.open()))
    assert q[0]["row"] == "4" and q[0]["field"] == "team"


def test_budgets_and_roi_commands(files):
    r = gpu_ops("cost", "budgets", *common(files, "--budgets", str(files / "budgets.yaml"), "--format", "json"))
    assert r.returncode == 0, r.stderr
    b = json.loads(r.stdout)[0]
    assert b["spend_usd"] == pytest.approx(16.8) and b["status"] == "warning"
    assert b["thresholds_crossed"] == ["actual-50pct", "actual-80pct"] and b["forecast_usd"] is None
    r = gpu_ops("cost", "roi", *common(files))
    assert r.returncode == 0, r.stderr
    header = r.stdout.splitlines()[1].split()
    assert header[:5] == ["team", "gpu_hours", "cost_usd", "on_demand_equivalent_usd", "spot_savings_usd"] and "idle_waste_usd" in header
    r = gpu_ops("cost", "roi", *common(files, "--format", "json"))
    total = {x["team"]: x for x in json.loads(r.stdout)}["__total__"]
    # spot saved (4 - 1) × 6 GPU-h; MIG slices saved 21 - 3 GPU-h at $4; time-slicing 24 - 6 GPU-h at $0.80
    assert total["spot_savings_usd"] == pytest.approx(18.0)
    assert total["sharing_savings_usd"] == pytest.approx(18 * 4.0 + 18 * 0.8)


def test_errors_name_the_file_and_field(files):
    (files / "bad_prices.yaml").write_text("currency: USD\nsource: x\nas_of: 2026-10-01\ngpus:\n  a10: {on-demand: 1}\n")
    r = gpu_ops("cost", "attribution", "--usage", str(files / "usage.csv"), "--prices", str(files / "bad_prices.yaml"), "--date", "2026-10-02")
    assert r.returncode != 0 and "bad_prices.yaml: gpus" in r.stderr and "a10" in r.stderr
    r = gpu_ops("cost", "attribution", *common(files, "--by", "colour"))
    assert r.returncode != 0 and "unknown grouping key 'colour'" in r.stderr
    for by, said in (("team,label:", "'label:' names no label"), ("label: ", "'label:' names no label"), (",,", "no grouping key in ',,'"), (" , ", "no grouping key in ' , '")):
        r = gpu_ops("cost", "attribution", *common(files, "--by", by))
        assert r.returncode == 2 and "--by" in r.stderr and said in r.stderr and "Traceback" not in r.stderr and r.stdout == "", r.stderr
    r = gpu_ops("cost", "attribution", "--usage", str(files / "nope.csv"), "--prices", str(files / "prices.yaml"))
    assert r.returncode != 0 and "nope.csv: no such file" in r.stderr
    for command, day in (("attribution", "9999-12-31"), ("roi", "0001-01-01"), ("attribution", "2262-04-11")):  # a day whose times no engine holds: said, no traceback
        r = gpu_ops("cost", command, *common(files), "--date", day)
        assert r.returncode == 2 and "--date" in r.stderr and "1677-09-22 to 2262-04-10" in r.stderr and "Traceback" not in r.stderr, r.stderr
    for command, as_of in (("roi", "9999-12-31T23:59:59"), ("roi", "0001-01-01T00:00:00Z"), ("roi", "0001-01-01T00:00:00+01:00"), ("budgets", "9999-12-31"), ("attribution", "2262-04-12T00:00:00Z")):
        extra = ["--budgets", str(files / "budgets.yaml")] if command == "budgets" else []
        r = gpu_ops("cost", command, *common(files, *extra), "--as-of", as_of)  # roi: an OverflowError traceback
        assert r.returncode == 2 and "--as-of" in r.stderr and "1677-09-22 to 2262-04-10" in r.stderr and "Traceback" not in r.stderr, r.stderr
    r = gpu_ops("cost", "roi", *common(files), "--as-of", "2262-04-10T23:59:59Z")  # within the last day held
    assert r.returncode == 0, r.stderr
    r = gpu_ops("cost", "attribution", *common(files), "--date", "2262-04-10")  # the last day held: no rows, no error
    assert r.returncode == 0 and "(no rows)" in r.stdout, r.stderr
    for command in ("attribution", "roi"):  # a quarantine file with nowhere to go: said before any work, no traceback
        r = gpu_ops("cost", command, *common(files, "--quarantine", str(files / "no-folder" / "q.csv")))
        assert r.returncode == 2 and "--quarantine" in r.stderr and "no-folder" in r.stderr and "Traceback" not in r.stderr, r.stderr
        assert r.stdout == ""


def test_a_file_name_no_file_system_takes_is_said_naming_the_option(files):
    """A name longer than the file system takes (ENAMETOOLONG) was a raw OSError traceback
    from --usage and --inventory; it is a problem with that source now, as a missing file is."""
    long = str(files / ("x" * 3000 + ".csv"))
    for args in (["--usage", long], ["--usage", str(files / "usage.csv"), "--inventory", long]):
        r = gpu_ops("cost", "attribution", *args, "--prices", str(files / "prices.yaml"), "--date", "2026-10-02")
        assert r.returncode == 1 and "the name is too long" in r.stderr and "Traceback" not in r.stderr, r.stderr[-2000:]


def test_a_usage_path_that_is_no_regular_file_is_refused_not_waited_on(files):
    """A FIFO named like a usage file (alone or matched by a glob) blocked the command for
    ever on its open; a source must be a regular file."""
    import os

    os.mkfifo(files / "pipe.csv")
    for pattern in (str(files / "pipe.csv"), str(files / "*.csv")):
        r = gpu_ops("cost", "attribution", "--usage", pattern, "--prices", str(files / "prices.yaml"), "--date", "2026-10-02")
        assert r.returncode == 1 and "pipe.csv: not a regular file" in r.stderr and "Traceback" not in r.stderr, r.stderr[-2000:]


def test_a_label_value_that_is_not_text_groups_as_json_writes_it(files):
    """A null label was grouped under 'None' and true under 'True' (Python's str); a null is
    an absent label now, numbers and booleans read as JSON writes them."""
    head = USAGE[0] + ",labels"
    row = "2026-10-02T00:00:00Z,2026-10-02T01:00:00Z,ml,p{i},n1,nlp,llm,,,a100-80gb,1,on-demand,none,,"
    labels = ['"{""tier"": null}"', '"{""tier"": true}"', '"{""tier"": 5}"', '"{""tier"": 1.5}"', '"{""tier"": ""gold""}"', '"{}"']
    (files / "labelled.csv").write_text("\n".join([head, *(row.format(i=i) + text for i, text in enumerate(labels))]) + "\n")
    r = gpu_ops("cost", "attribution", "--usage", str(files / "labelled.csv"), "--prices", str(files / "prices.yaml"), "--date", "2026-10-02", "--by", "label:tier", "--format", "json")
    assert r.returncode == 0, r.stderr
    hours = {g["label_tier"]: g["gpu_hours"] for g in json.loads(r.stdout)}
    assert hours == {"": 2.0, "true": 1.0, "5": 1.0, "1.5": 1.0, "gold": 1.0}
    # a budget scoped on the unquoted YAML values reads them as the rows' labels read
    (files / "scoped.yaml").write_text("budgets:\n  - {name: t, amount_usd: 100, scope: {labels: {tier: true}}}\n  - {name: f, amount_usd: 100, scope: {labels: {tier: 5}}}\n")
    r = gpu_ops("cost", "budgets", "--usage", str(files / "labelled.csv"), "--prices", str(files / "prices.yaml"), "--date", "2026-10-02", "--budgets", str(files / "scoped.yaml"), "--format", "json")
    assert r.returncode == 0, r.stderr
    assert {b["budget"]: b["spend_usd"] for b in json.loads(r.stdout)} == {"t": 4.0, "f": 4.0}


def test_a_budgets_file_is_judged_as_the_configuration_judges_budgets(files):
    """--budgets: two budgets of one name are refused as in the configuration (the
    alert state is kept per name), and a field's place reads budgets[0].period."""
    (files / "twice.yaml").write_text("- {name: b, amount_usd: 10}\n- {name: b, amount_usd: 20}\n")
    r = gpu_ops("cost", "budgets", *common(files, "--budgets", str(files / "twice.yaml")))
    assert r.returncode == 1 and "twice.yaml: budgets[1].name: 'b' is used by another budget (budgets[0])" in r.stderr and r.stdout == "", r.stderr
    (files / "period.yaml").write_text("budgets:\n  - {name: b, amount_usd: 10, period: fortnight}\n")
    r = gpu_ops("cost", "budgets", *common(files, "--budgets", str(files / "period.yaml")))
    assert r.returncode == 1 and "period.yaml: budgets[0].period: must be one of" in r.stderr, r.stderr


def test_the_cost_commands_never_import_dagster_or_torch(files):
    probe = textwrap.dedent(
        f"""
        import sys
        from gpu_ops.cli import main
        sys.argv = ["gpu-ops", "cost", "attribution", "--usage", {str(files / 'usage.csv')!r}, "--prices", {str(files / 'prices.yaml')!r}, "--date", "2026-10-02"]
        try:
            main()
        except SystemExit as exc:
            assert not exc.code, exc.code
        heavy = sorted({{m.split(".")[0] for m in sys.modules}} & {{"dagster", "torch", "kubetorch", "dagster_k8s"}})
        print("HEAVY", heavy)
        """
    )
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "HEAVY []" in r.stdout


def test_the_default_config_is_the_plain_defaults_and_the_demo_is_named():
    # No configuration named: the plain defaults (usage from the training ledger, empty here),
    # said on stderr with where the tables are; never the demo's October.
    plain = gpu_ops_process("cost", "attribution", "--date", "2026-10-14", "--by", "team", "--format", "json")
    assert plain.returncode == 0, plain.stderr
    assert json.loads(plain.stdout) == [] and "no configuration named (GPU_OPS_CONFIG is unset)" in plain.stderr
    r = gpu_ops("cost", "attribution", "--config", str(REPO / "gpu_ops" / "demo" / "gpu_ops.yaml"), "--date", "2026-10-14", "--by", "team", "--format", "json")
    assert r.returncode == 0, r.stderr
    teams = {x["team"] for x in json.loads(r.stdout)}
    assert {"nlp", "vision", "research", "__idle__"} <= teams


def test_inventory_resolves_against_the_working_directory(tmp_path):
    """`--inventory nodes.csv` is the file in the working directory, as `--usage` is, even
    when the usage comes from a configuration in another folder (the demo's)."""
    demo = str(REPO / "gpu_ops" / "demo" / "gpu_ops.yaml")
    (tmp_path / "nodes.csv").write_text((REPO / "gpu_ops" / "demo" / "inventory.csv").read_text())
    r = gpu_ops("cost", "attribution", "--config", demo, "--date", "2026-10-14", "--by", "team", "--inventory", "nodes.csv", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "fleet $" in r.stdout and "__idle__" in r.stdout
    missing = gpu_ops("cost", "attribution", "--config", demo, "--date", "2026-10-14", "--inventory", "absent.csv", cwd=tmp_path)
    assert missing.returncode != 0 and str(tmp_path / "absent.csv") in missing.stdout + missing.stderr


def test_an_empty_default_day_says_where_the_data_is(files):
    closed = [line for line in USAGE if ",p3," not in line]  # the open interval runs up to now
    (files / "usage.csv").write_text("\n".join(closed) + "\n")
    r = gpu_ops("cost", "attribution", "--usage", "usage.csv", "--prices", "prices.yaml", cwd=files)
    assert r.returncode == 0, r.stderr
    assert "usage found from 2026-10-01 to 2026-10-02: try --date 2026-10-02" in r.stderr
    assert "(the default --date is yesterday, UTC)" in r.stderr
    explicit = gpu_ops("cost", "attribution", "--usage", "usage.csv", "--prices", "prices.yaml", "--date", "2026-09-01", cwd=files)
    assert explicit.returncode == 0 and "usage found" not in explicit.stderr  # a day asked for is answered as asked


def test_the_empty_day_hint_reads_the_times_of_every_source(files):
    """The hint spans Parquet and CSV files, times in any unit, and rows the rule book
    refuses for other fields (it says where usage is, good or bad)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    closed = [line for line in USAGE if ",p3," not in line]
    (files / "usage.csv").write_text("\n".join(closed) + "\n")
    ns = [1_790_553_600_000_000_000, 1_790_640_000_000_000_000]  # 2026-09-28, 2026-09-29 (UTC)
    pq.write_table(pa.table({
        "start": pa.array(ns, pa.timestamp("ns", "UTC")), "end": pa.array([ns[1], ns[1] + 3_600_000_000_000], pa.timestamp("ns", "UTC")),
        "team": ["nlp\x00", "vision"], "gpu_type": ["a100-80gb", "no-such-gpu"], "gpu_count": [1, 2], "capacity_type": ["spot", "spot"],
    }), files / "old.parquet")
    r = gpu_ops("cost", "attribution", "--usage", "usage.csv", "--usage", "old.parquet", "--prices", "prices.yaml", cwd=files)
    assert r.returncode == 0, r.stderr
    assert "usage found from 2026-09-28 to 2026-10-02: try --date 2026-10-02" in r.stderr


INVENTORY = [
    "node,instance_type,gpu_type,gpu_count,capacity_type,start,end",
    "n1,,a100-80gb,8,spot,2026-10-01T00:00:00Z,",
    "n2,g6.xlarge,,,on-demand,2026-10-02T00:00:00Z,2026-10-02T12:00:00Z",
]



def test_a_node_is_in_the_fleet_once_whatever_its_records_say(files):
    """An inventory exported while a node ran and again when it ended, and two records of
    one node that overlap: the CLI's fleet counts each node once at any time, the
    snapshot quarantined as superseded (issue 19: identity; the same rule as the assets)."""
    (files / "inventory.csv").write_text("\n".join([
        INVENTORY[0],
        "n1,,a100-80gb,8,spot,2026-10-01T00:00:00Z,",  # the running snapshot
        "n1,,a100-80gb,8,spot,2026-10-01T00:00:00Z,2026-10-03T00:00:00Z",  # the final export
        "n2,g6.xlarge,,,on-demand,2026-10-02T00:00:00Z,2026-10-02T12:00:00Z",
        "n2,g6.xlarge,,,on-demand,2026-10-02T06:00:00Z,2026-10-02T18:00:00Z",  # counted from 12:00
    ]) + "\n")
    r = gpu_ops("cost", "attribution", "--usage", "usage.csv", "--prices", "prices.yaml", "--inventory", "inventory.csv", "--date", "2026-10-02",
                "--by", "team", "--format", "json", "--quarantine", "q.csv", cwd=files)
    assert r.returncode == 0, r.stderr
    # n1: 8 spot A100s all day ($192); n2: one L4 for 18 h, not 24 ($14.40)
    assert sum(row["cost_usd"] for row in json.loads(r.stdout)) == pytest.approx(192 + 0.8 * 18)
    with open(files / "q.csv") as f:
        q = [(row["location"].rsplit("/", 1)[-1], row["row"], row["reason"].split(":")[0]) for row in csv.DictReader(f)]
    assert ("inventory.csv", "1", "superseded by row 2") in q and len(q) == 2  # and the usage row without a team

# The light run makes pandas and pydantic unimportable; the plain run must not load
# them either (pyarrow imports pandas, when installed, to probe what ``pa.array`` is
# given: the engine builds its arrays and lookup tables without it).
_LIGHT_PROBE = """
import sys
BLOCKED = {blocked!r}
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"{{name}} is blocked by the test")
sys.meta_path.insert(0, Block())
from gpu_ops.cli import main
sys.argv = {argv!r}
try:
    main()
except SystemExit as exc:
    assert not exc.code, exc.code
print("LOADED", sorted({{m.split(".")[0] for m in sys.modules if sys.modules[m] is not None}} & {{"pandas", "pydantic", "dagster", "torch", "sqlalchemy"}}))
"""


def _runs_light(argv: list[str]) -> subprocess.CompletedProcess:
    """Runs ``argv`` with pandas and pydantic importable and with both blocked: neither run
    loads them, and both print the same (the light run is returned)."""
    runs = {}
    for blocked in ((), ("pandas", "pydantic")):
        r = subprocess.run([sys.executable, "-c", _LIGHT_PROBE.format(blocked=blocked, argv=argv)], capture_output=True, text=True, cwd=REPO, timeout=120)
        assert r.returncode == 0, r.stderr
        runs[blocked] = r
    light, plain = runs[("pandas", "pydantic")], runs[()]
    assert "LOADED []" in light.stdout and "LOADED []" in plain.stdout, plain.stdout[-300:]
    assert light.stdout == plain.stdout and light.stderr == plain.stderr
    return light


@pytest.mark.parametrize("fmt", ["table", "csv", "json"])
def test_attribution_over_files_starts_light(files, fmt):
    """`cost attribution --usage --prices --inventory` loads neither pandas nor pydantic,
    and runs the same with both unimportable (issue 19: the CLI starts light); the
    figures are the hand-computed ones."""
    (files / "inventory.csv").write_text("\n".join(INVENTORY) + "\n")
    argv = ["gpu-ops", "cost", "attribution", "--usage", str(files / "usage.csv"), "--prices", str(files / "prices.yaml"), "--inventory", str(files / "inventory.csv"),
            "--date", "2026-10-02", "--by", "team,label:tier", "--format", fmt, "--quarantine", str(files / "q.csv")]
    light = _runs_light(argv)
    assert "quarantined 1 row(s)" in light.stderr
    with open(files / "q.csv") as f:
        q = list(csv.DictReader(f))
    assert [(row["field"], row["row"]) for row in q] == [("team", "4")]
    if fmt == "json":
        rows = json.loads(light.stdout[: light.stdout.rindex("LOADED")])
        by_team = {row["team"]: row["cost_usd"] for row in rows}
        # n1: 8 spot A100s all day ($192), n2: one L4 for 12 h ($9.60): fleet $201.60, $22.80 of it allocated
        assert by_team["nlp"] == pytest.approx(6.0) and by_team["vision"] == pytest.approx(16.8) and by_team["__idle__"] == pytest.approx(201.6 - 22.8)
        assert {row["label_tier"] for row in rows} == {"", "__idle__"}


@pytest.mark.parametrize("kind", ["csv", "parquet"])
@pytest.mark.parametrize("dirty", [False, True], ids=["clean", "dirty"])
def test_one_days_attribution_by_team_starts_light(files, kind, dirty):
    """The plain `cost attribution --by team` of one day (no inventory, no label: the sums
    come from the engine's screening pass) loads neither pandas nor pydantic either: on
    clean rows, and with a bad row and a snapshot re-exported closed among them (the
    identity rules and the quarantine run); the figures are the hand-computed ones."""
    usage = files / "usage.csv"
    snapshot = USAGE[1].replace("2026-10-02T03:00:00Z", "")  # p1 exported while running, then closed
    usage.write_text("\n".join([*USAGE, snapshot] if dirty else USAGE[:4]) + "\n")
    if kind == "parquet":
        import pyarrow.csv as pacsv
        import pyarrow.parquet as pq

        pq.write_table(pacsv.read_csv(usage), files / "usage.parquet")
        usage = files / "usage.parquet"
    argv = ["gpu-ops", "cost", "attribution", "--usage", str(usage), "--prices", str(files / "prices.yaml"), "--date", "2026-10-02",
            "--by", "team", "--format", "json", "--quarantine", str(files / "q.csv")]
    light = _runs_light(argv)
    by_team = {row["team"]: row["cost_usd"] for row in json.loads(light.stdout[: light.stdout.rindex("LOADED")])}
    assert by_team == pytest.approx({"nlp": 6.0, "vision": 16.8})  # p1 once: its closed record supersedes the snapshot
    with open(files / "q.csv") as f:
        q = sorted((row["field"], row["row"]) for row in csv.DictReader(f))
    assert q == ([("<row>", "5"), ("team", "4")] if dirty else [])
