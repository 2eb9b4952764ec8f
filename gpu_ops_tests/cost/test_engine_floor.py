"""The engine's short cuts give the answers of its general path: bad text values named by
value (not a whole column trimmed), the rows of repeated key hashes found from the hash
stream's fingerprints (not a second pass), the CLI's quarantine built for its first row
only when nobody keeps the rest."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gpu_ops_tests.conftest import REPO
from gpu_ops_tests.cost.helpers import MATRIX
from gpu_ops_tests.cost.random_files import WE, WS, random_files, random_rows

from gpu_ops.domain.cost import rules
from gpu_ops.flows.cost.engine import QUARANTINE_ROWS, UsageEngine, clean_text_columns
from gpu_ops.flows.cost.pipeline import load_raw
from gpu_ops.domain.cost.repeats import Fingerprints
from gpu_ops.domain.cost.sources import SourceSet
from gpu_ops.flows.cost.window import Window

PATTERN = re.compile(f"^[{re.escape(rules.SPACES)}]|[{re.escape(rules.SPACES)}]$|{rules.CONTROL}")


def test_a_dictionary_columns_values_that_need_a_trim_are_named_and_a_plain_columns_are_not() -> None:
    team = pa.array(["nlp", " nlp", "vision", "l\x01m", "nlp", None]).dictionary_encode()
    other = pa.array(["a", "b ", "c", "d", "e", "f"]).dictionary_encode()  # a second row group of the column
    pod = pa.array(["p1", "p2 ", "p3", "p4", "p5", "p6"])
    layout = {c: rules.Stored(rules.STORED_TEXT) for c in ("team", "pod", "project")}
    failing: dict[str, set[str] | None] = {}
    tables = [pa.table({"team": team, "pod": pod, "project": other}), pa.table({"team": other, "pod": pa.array(["q"] * 6), "project": other})]
    clean = clean_text_columns(tables, layout, False, failing=failing)
    assert not {"team", "pod", "project"} & clean  # the whole-column answer is unchanged
    assert failing == {"team": {" nlp", "l\x01m", "b "}, "pod": None, "project": {"b "}}
    for values in failing.values():
        assert values is None or all(PATTERN.search(v) for v in values)


TEXT = ("namespace", "pod", "node", "team", "project", "cost_center", "experiment_id", "gpu_type", "capacity_type", "sharing")


def dictionary_files(tmp_path: Path, seed: int) -> list[Path]:
    """The random rows as billing exports written from categoricals store them: every text
    column dictionary-typed, a dictionary per row group (edge spaces, upper case and a
    control character among their values); two files, the second partly a re-export."""
    rows = random_rows(seed, 200)
    paths = []
    for i, part in enumerate((rows[:150], rows[100:])):
        table = pa.table({
            "start": pa.array([r["start"] for r in part], pa.timestamp("us", tz="UTC")),
            "end": pa.array([r["end"] for r in part], pa.timestamp("us", tz="UTC")),
            **{c: pa.array([r[c] for r in part]).dictionary_encode() for c in TEXT},
            "gpu_count": pa.array([float(r["gpu_count"]) for r in part]),
            "gpu_share": pa.array([r["gpu_share"] for r in part], pa.float64()),
        })
        paths.append(tmp_path / f"d{seed}-{i}.parquet")
        pq.write_table(table, paths[-1], row_group_size=41)
    return paths


def _engine_result(paths: list[Path], by_value: bool) -> tuple[pd.DataFrame, pd.DataFrame]:
    usage, _ = load_raw(SourceSet(usage_files=[str(p) for p in paths]), window=Window(WS, WE))
    eng = UsageEngine(MATRIX)
    try:
        usage.add_to(eng)
        if not by_value:  # the general path: every row of those columns trimmed and searched
            for p in eng.parts:
                p.by_value = {}
        out = eng.run()
        return out.rows, out.quarantine
    finally:
        eng.close()


@pytest.mark.parametrize("seed", range(3))
def test_bad_text_values_named_by_value_price_and_quarantine_as_every_row_trimmed(tmp_path: Path, seed: int) -> None:
    paths = dictionary_files(tmp_path, seed)
    usage, _ = load_raw(SourceSet(usage_files=[str(p) for p in paths]), window=Window(WS, WE))
    eng = UsageEngine(MATRIX)
    try:
        usage.add_to(eng)
        named = sum(len(p.by_value) for p in eng.parts)
    finally:
        eng.close()
    assert named  # the files have dictionary columns with values that need a trim
    fast, general = _engine_result(paths, True), _engine_result(paths, False)
    pd.testing.assert_frame_equal(fast[0], general[0])
    pd.testing.assert_frame_equal(fast[1], general[1])
    assert fast[1]["reason"].str.contains("control character").any() and fast[1]["reason"].str.contains("superseded|duplicate").any()
    assert fast[0]["team"].isin(["nlp", "NLP", "vision"]).any()  # trimmed: " nlp" is "nlp"


def test_fingerprints_place_every_row_of_a_repeated_hash() -> None:
    rng = np.random.default_rng(3)
    h = rng.integers(0, 2**64 - 1, 300_000, dtype=np.uint64, endpoint=True)
    twins = rng.choice(len(h), 3_000, replace=False)
    h[twins] = h[rng.integers(0, len(h), len(twins))]
    h[:4] = [0, 0, 2**64 - 1, 2**64 - 1]
    prints = Fingerprints(1_000)  # fewer than come: it grows
    for lo in range(0, len(h), 7_001):
        prints.add(h[lo : lo + 7_001])
    values, counts = np.unique(h, return_counts=True)
    repeated = values[counts > 1]
    places = prints.places(repeated)
    want = np.flatnonzero(np.isin(h, repeated))
    assert np.all(np.isin(want, places))  # every place of a repeated hash
    assert np.all(np.isin(h[places] >> np.uint64(32), repeated >> np.uint64(32)))  # and only fingerprints of theirs
    assert len(places) < len(want) + 50 and np.all(np.diff(places) > 0)


def _cli(path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    prices = REPO / "gpu_ops" / "demo" / "prices.yaml"
    cmd = [sys.executable, "-m", "gpu_ops.cli", "cost", "attribution", "--usage", str(path), "--prices", str(prices), "--date", "2026-10-01", "--by", "team", "--format", "json", *extra]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})


def test_the_cli_says_the_same_of_its_quarantine_whether_or_not_it_is_written(tmp_path: Path) -> None:
    paths = random_files(tmp_path, 1)
    parquet = next(p for p in paths if p.suffix == ".parquet")
    written = _cli(parquet, "--quarantine", str(tmp_path / "q.csv"))
    said = _cli(parquet)
    assert written.returncode == said.returncode == 0, (written.stderr, said.stderr)
    assert written.stdout == said.stdout
    line = said.stderr.strip().splitlines()[-1]
    assert line.startswith("quarantined ") and written.stderr.strip().splitlines()[-1] == line.replace(" row(s);", f" row(s) (written to {tmp_path / 'q.csv'});")


def test_the_first_rows_of_a_quarantine_are_the_whole_ones_first_rows(tmp_path: Path) -> None:
    from gpu_ops.flows.cost import allocate
    from gpu_ops.flows.cost.allocate import Span

    paths = random_files(tmp_path, 2)
    span = Span(int(WS.value // 1000), int(WE.value // 1000), int(WE.value // 1000))
    out = []
    for first in (None, 1, 3):
        usage, _ = load_raw(SourceSet(usage_files=[str(p) for p in paths]), window=Window(WS, WE))
        out.append(allocate.attribution_of(usage, None, MATRIX, span, ["team"], first_quarantined=first)[1])
    whole, one, three = out
    assert whole.num_rows > 3 and QUARANTINE_ROWS.encode() not in (whole.schema.metadata or {})
    problems = sum(1 for f in whole.column("field").to_pylist() if f in (rules.FILE_FIELD, rules.LINE_FIELD))
    for part, n in ((one, 1), (three, 3)):
        assert int(part.schema.metadata[QUARANTINE_ROWS.encode()]) == whole.num_rows
        assert part.to_pylist() == whole.slice(0, problems + n).to_pylist()
