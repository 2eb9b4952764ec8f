"""The cost engine (DuckDB, rule book compiled to SQL) against an independent oracle.

The oracle is the pandas path kept for this purpose: the files read by pandas'
readers, every row judged by :func:`gpu_ops_tests.cost.oracle.validate_usage` (vectorised
pandas, written independently of the SQL rule book), intervals de-duplicated row by row
here in Python (the closed record supersedes the open one, the later end the earlier,
the last delivered the others), split at midnights and priced by the pandas functions.

Files are random and hostile (seeded): time units and zones, naive and aware times,
text spellings (case, edge spaces, GPU aliases), bad numbers, inverted and open
intervals, identical copies, running-then-finished snapshots of one interval across
files, dictionary and plain pages, empty row groups, CSV with offsets and a BOM.
Totals per team must agree to 1e-6 and the quarantine must name the same (file, row,
field) rows.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gpu_ops.flows.cost.pipeline import load_raw, price_window
from gpu_ops.domain.cost.sources import SourceSet
from gpu_ops.flows.cost.usage import quarantine_in_window
from gpu_ops.flows.cost.window import Window

from .helpers import MATRIX
from .random_files import DAY, WE, WS, random_files
from .oracle import price_pieces, split_by_day, validate_usage
from .oracle_read import read_usage_files

# --------------------------------------------------------------------------- the oracle


def _supersede(rows: pd.DataFrame) -> tuple[pd.DataFrame, list[tuple[str, int]]]:
    """Row by row: per (namespace, pod, start, gpu_type), the closed, latest-ending,
    last-delivered record wins; the others are (location, row) of superseded records."""
    best: dict[tuple[Any, ...], int] = {}
    for i, r in enumerate(rows.itertuples(index=False)):
        if r.pod == "":
            continue
        key = (r.namespace, r.pod, r.start, r.gpu_type)
        j = best.get(key)
        if j is None:
            best[key] = i
            continue
        w = rows.iloc[j]
        mine = (0 if pd.isna(r.end) else 1, r.end if not pd.isna(r.end) else pd.Timestamp.min.tz_localize("UTC"), i)
        theirs = (0 if pd.isna(w["end"]) else 1, w["end"] if not pd.isna(w["end"]) else pd.Timestamp.min.tz_localize("UTC"), j)
        if mine > theirs:
            best[key] = i
    keep = sorted(set(best.values()) | {i for i, p in enumerate(rows["pod"]) if p == ""})
    lost = [(rows["location"].iloc[i], int(rows["row"].iloc[i])) for i in range(len(rows)) if i not in set(keep)]
    return rows.iloc[keep].reset_index(drop=True), lost


def oracle(paths: list[Path]) -> tuple[dict[str, float], set[tuple[str, int, str]]]:
    raw = read_usage_files([str(p) for p in paths])
    v = validate_usage(raw, MATRIX)
    rows, lost = _supersede(v.rows)
    pieces = price_pieces(split_by_day(rows, WS, WE, WE))
    totals = {str(k): float(x) for k, x in pieces.groupby(pieces["team"].astype(str))["cost_usd"].sum().items()}
    q = quarantine_in_window(v.quarantine, WS, WE)
    got = {(Path(str(r.location)).name, int(r.row), str(r.field)) for r in q.itertuples(index=False)}
    sup = pd.DataFrame([(loc, n) for loc, n in lost], columns=["location", "row"])
    touching = v.rows.merge(sup, on=["location", "row"]) if len(sup) else v.rows.iloc[0:0]
    touching = touching[(touching["start"] < WE) & (touching["end"].isna() | (touching["end"] >= WS))]
    got |= {(Path(str(loc)).name, int(n), "<row>") for loc, n in zip(touching["location"], touching["row"])}
    return {k: x for k, x in totals.items() if x}, got


def engine(paths: list[Path]) -> tuple[dict[str, float], set[tuple[str, int, str]]]:
    usage, _ = load_raw(SourceSet(usage_files=[str(p) for p in paths]), window=Window(WS, WE))
    priced = price_window(usage, None, MATRIX, WS, WE, WE)
    rows = priced.rows
    totals = {str(k): float(x) for k, x in rows.groupby(rows["team"].astype(str))["cost_usd"].sum().items()}
    q = priced.quarantine
    return {k: x for k, x in totals.items() if x}, {(Path(str(r.location)).name, int(r.row), str(r.field)) for r in q.itertuples(index=False)}


@pytest.mark.parametrize("seed", range(6))
def test_random_hostile_files_price_and_quarantine_as_the_oracle(tmp_path: Path, seed: int) -> None:
    paths = random_files(tmp_path, seed)
    want_totals, want_q = oracle(paths)
    got_totals, got_q = engine(paths)
    assert sorted(got_totals) == sorted(want_totals)
    for team, usd in want_totals.items():
        assert got_totals[team] == pytest.approx(usd, rel=1e-6, abs=1e-6), team
    assert got_q == want_q, (sorted(got_q - want_q)[:10], sorted(want_q - got_q)[:10])
    assert len(want_q) > 10 and len(want_totals) >= 2  # the files are hostile and still priced


def _both_screens(paths: list[Path]) -> list[tuple[Any, Any, bool]]:
    """(good rows, quarantine, whether the lookup failed somewhere) of ``paths`` through
    the engine as it chooses, then with the lookup joined in the screening pass (the
    general path)."""
    from gpu_ops.flows.cost.engine import UsageEngine

    out = []
    for screen_lookup in (None, True):
        usage, _ = load_raw(SourceSet(usage_files=[str(p) for p in paths]), window=Window(WS, WE))
        eng = UsageEngine(MATRIX)
        try:
            usage.add_to(eng)
            eng.screen_lookup = screen_lookup
            got = eng.run()
            out.append((got.rows, got.quarantine, eng.lookup_fails()))
        finally:
            eng.close()
    return out


@pytest.mark.parametrize("seed", range(4))
def test_the_screen_without_the_lookup_gives_what_the_general_path_gives(tmp_path: Path, seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Files whose GPU types, capacity types and regions all have a price (the rules that
    read the lookup cannot fail on any row), hostile otherwise — bad times and numbers,
    edge spaces, GPU aliases of one catalog name, copies, snapshots: the screening pass
    without the lookup join gives the same good rows and byte-identical quarantine as the
    general path; with an unknown GPU type the engine takes the general path itself."""
    monkeypatch.setattr("gpu_ops_tests.cost.random_files.GPUS", ["a100-80gb", "NVIDIA-A100-SXM4-80GB", "h100", "NVIDIA-H100-80GB-HBM3", " h100"])
    monkeypatch.setattr("gpu_ops_tests.cost.random_files.CAPACITY", ["spot", "on-demand", "SPOT", "preemptible", ""])  # no reserved price for h100 here
    (tmp_path / "priced").mkdir()
    (tmp_path / "unknown").mkdir()
    paths = random_files(tmp_path / "priced", seed)
    (fast_rows, fast_q, fails), (general_rows, general_q, _) = _both_screens(paths)
    assert not fails
    pd.testing.assert_frame_equal(fast_rows, general_rows)
    pd.testing.assert_frame_equal(fast_q, general_q)
    assert len(fast_q) > 10 and len(fast_rows) > 10 and (fast_q["field"] == "<row>").any()  # hostile, copies and snapshots, still priced
    monkeypatch.setattr("gpu_ops_tests.cost.random_files.GPUS", ["h100", "a10"])
    (_, _, fails), _ = _both_screens(random_files(tmp_path / "unknown", seed))
    assert fails


def test_a_record_that_disagrees_beyond_its_end_is_superseded_whole_and_the_reason_names_the_fields(tmp_path: Path) -> None:
    header = "start,end,namespace,pod,team,gpu_type,gpu_count,capacity_type\n"
    (tmp_path / "a.csv").write_text(header + "2026-10-01T00:00:00Z,2026-10-01T02:00:00Z,ml,p1,nlp,h100,1,on-demand\n")
    (tmp_path / "b.csv").write_text(header + "2026-10-01T00:00:00Z,2026-10-01T03:00:00Z,ml,p1,vision,h100,2,on-demand\n")
    totals, q = engine([tmp_path / "a.csv", tmp_path / "b.csv"])
    assert totals == {"vision": pytest.approx(60.0)}  # 3 h × 2 GPUs × $10: the later end wins, whole
    assert q == {("a.csv", 1, "<row>")}
    usage, _ = load_raw(SourceSet(usage_files=[str(tmp_path / "a.csv"), str(tmp_path / "b.csv")]))
    reason = price_window(usage, None, MATRIX, WS, WE, WE).quarantine["reason"].iloc[0]
    assert "superseded by" in reason and "b.csv row 1" in reason and "differs in: end, team, gpu_count" in reason


def test_rows_of_other_days_are_not_quarantined_in_this_one(tmp_path: Path) -> None:
    header = "start,end,namespace,pod,team,gpu_type,gpu_count,capacity_type\n"
    (tmp_path / "u.csv").write_text(header + "2026-10-05T00:00:00Z,2026-10-05T02:00:00Z,ml,p1,,h100,1,on-demand\n2026-10-01T00:00:00Z,2026-10-01T01:00:00Z,ml,p2,nlp,h100,1,on-demand\n")
    totals, q = engine([tmp_path / "u.csv"])
    assert totals == {"nlp": pytest.approx(10.0)} and q == set()


def test_the_ledger_and_the_collector_seeing_one_pod_count_it_once() -> None:
    from gpu_ops.flows.cost.engine import UsageInput

    t0 = pd.Timestamp("2026-10-01T00:00:00Z")
    base = {"start": [t0], "namespace": ["ml"], "pod": ["p1"], "team": ["nlp"], "gpu_type": ["h100"], "gpu_count": [1], "capacity_type": ["on-demand"]}
    ledger = pd.DataFrame({**base, "end": [t0 + pd.Timedelta(hours=2)], "source": ["ledger"], "location": ["gpu_usage_ledger run r attempt 1"], "row": pd.array([None], dtype="Int64")})
    collected = pd.DataFrame({**base, "end": [pd.NaT], "source": ["kubernetes"], "location": ["gpu_usage_collected"], "row": pd.array([None], dtype="Int64")})
    priced = price_window(UsageInput(frames=[collected, ledger]), None, MATRIX, WS, WE, WE)
    assert float(priced.rows["cost_usd"].sum()) == pytest.approx(20.0)
    assert list(priced.quarantine["source"]) == ["kubernetes"] and "closed there, open here" in priced.quarantine["reason"].iloc[0]
    assert np.isnan(priced.quarantine["row"].astype(float).iloc[0])


def test_text_columns_are_clean_exactly_when_no_value_needs_a_trim_or_holds_a_control_character() -> None:
    """The byte-level check (numpy, the pattern only near a possible space) against the
    pattern itself, value by value: plain and large strings, dictionaries, slices, nulls."""
    import re

    from gpu_ops.domain.cost import rules
    from gpu_ops.flows.cost.engine import clean_text_columns

    spaces = re.escape(rules.SPACES)
    pattern = re.compile(f"^[{spaces}]|[{spaces}]$|{rules.CONTROL}")
    chars = ["a", "Z", "é", "ж", "€", " ", "\t", "\n", "\r", "\x00", "\x1c", "\x7f", "\x85", "\xa0", "\u1680", "\u2000", "\u205f", "\u3000", "~"]
    rng = random.Random(5)
    for _ in range(3000):
        values: list[Any] = ["".join(rng.choice(chars) for _ in range(rng.randint(0, 3))) for _ in range(rng.randint(1, 4))]
        values += [None] * rng.randint(0, 1)
        array = pa.array(values, rng.choice([pa.string(), pa.large_string()]))
        array = array.slice(1) if len(array) > 1 and rng.random() < 0.3 else array
        array = array.dictionary_encode() if rng.random() < 0.3 else array
        table = pa.table({"team": array, "capacity_type": array})
        layout = {c: rules.Stored(rules.STORED_TEXT) for c in table.column_names}
        clean = clean_text_columns([table], layout, False)
        plain = array.dictionary if pa.types.is_dictionary(array.type) else array
        want = not any(v is not None and pattern.search(v) for v in plain.to_pylist())
        assert ("team" in clean) == want, values
        assert ("lower:capacity_type" in clean) == all(v is None or v == v.lower() for v in plain.to_pylist()), values


def test_printable_ascii_text_is_clean_at_one_look_and_a_space_or_control_byte_still_counts() -> None:
    """The one-look path (every byte 33-126) and the byte-by-byte path agree with the
    pattern on text that is nearly all printable ASCII: pod names with one space, tab,
    NUL, no-break space or DEL somewhere, or none."""
    import re

    from gpu_ops.domain.cost import rules
    from gpu_ops.flows.cost.engine import clean_text_columns

    spaces = re.escape(rules.SPACES)
    pattern = re.compile(f"^[{spaces}]|[{spaces}]$|{rules.CONTROL}")
    layout = {"pod": rules.Stored(rules.STORED_TEXT)}
    base = [f"pod-{i}" for i in range(1000)]
    for odd in [None, " ", "\t", "\x00", "\x7f", "\xa0", "\u3000", "é"]:
        for where in ("start", "middle", "end"):
            values = list(base)
            if odd is not None:
                values[500] = odd + values[500] if where == "start" else values[500] + odd if where == "end" else "pod-" + odd + "500"
            want = not any(pattern.search(v) for v in values)
            for array in (pa.array(values), pa.array(values, pa.large_string()), pa.array(values).slice(400, 200)):
                sub = array.to_pylist()
                clean = clean_text_columns([pa.table({"pod": array})], layout, False)
                assert ("pod" in clean) == (not any(pattern.search(v) for v in sub)), (odd, where)
            if odd is None:
                assert want


def _priced_both_ways(path: Path) -> tuple[Any, Any]:
    """The engine's good rows and quarantine of ``path`` read as a DuckDB scan and as Arrow."""
    from gpu_ops.flows.cost.engine import UsageInput, validate
    from gpu_ops.flows.cost.read import FileRows, read_files

    got = read_files([str(path)], None)
    scanned = got.files[0]
    assert scanned.scan is not None and scanned.table is None  # DuckDB reads it
    arrow = FileRows(path, *scanned.load())
    both = [validate(UsageInput([f]), MATRIX) for f in (scanned, arrow)]
    return both[0], both[1]


def test_a_parquet_file_duckdb_scans_gives_what_its_arrow_read_gives(tmp_path: Path) -> None:
    start = pd.Timestamp("2026-10-01T01:00:00Z")
    n = 40
    df = pd.DataFrame({
        "start": [start + pd.Timedelta(minutes=i) for i in range(n)],
        "end": [None if i % 7 == 0 else start + pd.Timedelta(hours=2, minutes=i) for i in range(n)],
        "namespace": ["ml"] * n,
        "pod": [f"p{i % 30}" if i != 5 else "p\x00" for i in range(n)],  # ten copies, one NUL
        "team": pd.Categorical([" nlp" if i == 3 else ("" if i == 4 else "vision") for i in range(n)]),
        "gpu_type": pd.Categorical(["NVIDIA-H100-80GB-HBM3" if i % 2 else "h100" for i in range(n)]),
        "gpu_count": [0 if i == 6 else 2 for i in range(n)],
        "capacity_type": pd.Categorical(["Spot" if i == 8 else "spot" for i in range(n)]),
    })
    df.loc[30:, "start"] = df.loc[:9, "start"].to_numpy()  # the copies share their originals' start
    df.loc[30:, "end"] = df.loc[:9, "end"].to_numpy()
    path = tmp_path / "u.parquet"
    df.to_parquet(path, row_group_size=16)
    scanned, arrow = _priced_both_ways(path)
    pd.testing.assert_frame_equal(scanned.rows, arrow.rows)
    pd.testing.assert_frame_equal(scanned.quarantine, arrow.quarantine)
    assert set(scanned.quarantine["row"]) >= {5, 6, 7} and len(scanned.quarantine) >= 10  # NUL, 0 GPUs, copies


@pytest.mark.parametrize("case", ["sentinel", "ms", "binary"])
def test_a_parquet_file_duckdb_would_read_otherwise_is_read_as_arrow(tmp_path: Path, case: str) -> None:
    from gpu_ops.flows.cost.read import read_files

    end = pa.array([1_790_000_000_000_000, 2**63 - 1 if case == "sentinel" else 1_790_000_100_000_000], pa.int64()).cast(pa.timestamp("us", tz="UTC"))
    start = pa.array([1_789_990_000_000_000] * 2, pa.int64()).cast(pa.timestamp("us", tz="UTC"))
    if case == "ms":
        start, end = start.cast(pa.timestamp("ms", tz="UTC")), end.cast(pa.timestamp("ms", tz="UTC"))
    team = pa.array([b"nlp", b"vision"], pa.binary()) if case == "binary" else pa.array(["nlp", "vision"])
    table = pa.table({"start": start, "end": end, "team": team, "gpu_type": ["h100"] * 2, "gpu_count": [1, 1], "capacity_type": ["spot"] * 2})
    pq.write_table(table, tmp_path / "u.parquet")
    got = read_files([str(tmp_path / "u.parquet")], None).files[0]
    assert got.scan is None and got.table.num_rows == 2


def _lookup_and_result(paths: list[Path], gathered: bool) -> tuple[set[tuple[Any, ...]], Any, bool]:
    """(the engine's lookup rows, its result, whether every part came with its lookup
    keys' values) of ``paths``; ``gathered`` False: the values found by the scan instead."""
    from gpu_ops.flows.cost.engine import UsageEngine

    usage, _ = load_raw(SourceSet(usage_files=[str(p) for p in paths]), window=Window(WS, WE))
    eng = UsageEngine(MATRIX)
    try:
        usage.add_to(eng)
        known = all(p.choices is not None for p in eng.parts)
        if not gathered:
            for p in eng.parts:
                p.choices = None
        got = eng.run()
        lookup = {tuple(r) for r in eng.con.execute("SELECT * FROM lookup").fetchall()}
        return lookup, got, known
    finally:
        eng.close()


def _key_file(path: Path, seed: int) -> Path:
    """Lookup keys with edge spaces, upper case, aliases and missing values: dictionary-
    encoded GPU and capacity types, a plain region."""
    rng = random.Random(seed)
    gpus, caps, regions = [" H100", "a100-80gb", None, "h100", "l4 ", "T4"], ["SPOT ", "on-demand", "spot", None, "Reserved"], [" us-east-1", None, "us-east-1", "eu-west-1"]
    n = 40
    start = [DAY + pd.Timedelta(minutes=rng.randrange(0, 1200)) for _ in range(n)]
    pq.write_table(
        pa.table({
            "start": pa.array(start, pa.timestamp("us", tz="UTC")),
            "end": pa.array([s + pd.Timedelta(minutes=rng.randrange(1, 300)) for s in start], pa.timestamp("us", tz="UTC")),
            "pod": [f"k{seed}-{i}" for i in range(n)], "team": [rng.choice(["nlp", "vision"]) for _ in range(n)], "gpu_count": [1] * n,
            "gpu_type": pa.array([rng.choice(gpus) for _ in range(n)]).dictionary_encode(),
            "capacity_type": pa.array([rng.choice(caps) for _ in range(n)]).dictionary_encode(),
            "region": pa.array([rng.choice(regions) for _ in range(n)]),
        }),
        path,
        row_group_size=16,
    )
    return path


@pytest.mark.parametrize("seed", range(3))
def test_the_lookup_keys_met_by_the_text_check_give_what_the_scan_gives(tmp_path: Path, seed: int) -> None:
    """The lookup built from the GPU types, capacity types and regions the text check met
    (a few values, through the rule book's typed expressions) holds every row the scan over
    every row finds, and the engine gives the same good rows and quarantine either way;
    with the hostile random files beside them (CSV, whose text is checked as bytes) the
    engine scans."""
    keys = [_key_file(tmp_path / f"keys{seed}-{i}.parquet", seed * 10 + i) for i in range(2)]
    (tmp_path / "random").mkdir()
    for paths, all_known in ((keys, True), (keys + random_files(tmp_path / "random", seed), False)):
        gathered, fast, known = _lookup_and_result(paths, True)
        scanned, general, _ = _lookup_and_result(paths, False)
        assert known == all_known or (not all_known and all(p.suffix == ".parquet" for p in paths))
        assert scanned <= gathered and len(scanned) >= 8
        pd.testing.assert_frame_equal(fast.rows, general.rows)
        pd.testing.assert_frame_equal(fast.quarantine, general.quarantine)
        assert len(fast.rows) >= 20 and (fast.quarantine["field"] == "capacity_type").any()  # priced, and 'missing' capacity quarantined


def _attribution(paths: list[Path], by: list[str], tally: bool, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Any, bool]:
    """(groups, quarantine, whether the sums came from the screening pass) of one day of
    ``paths`` by ``by``, as `gpu-ops cost attribution` computes them; ``tally`` False:
    through the pieces of the good rows instead."""
    from gpu_ops.flows.cost import allocate
    from gpu_ops.flows.cost.engine import UsageEngine

    used: list[bool] = []
    real = UsageEngine.tallied_sql
    with monkeypatch.context() as m:
        m.setattr(UsageEngine, "tallied_sql", lambda self: used.append(True) or real(self))
        if not tally:
            m.setattr(allocate, "gpu_hours_tally", lambda *a: None)
        usage, _ = load_raw(SourceSet(usage_files=[str(p) for p in paths]), window=Window(WS, WE))
        span = allocate.Span(WS.value // 1000, WE.value // 1000, WE.value // 1000)
        groups, quarantine = allocate.attribution_of(usage, None, MATRIX, span, by, keep=[*by, "labels"])
    return groups, quarantine.to_pylist(), bool(used)


@pytest.mark.parametrize("seed", range(3))
def test_sums_from_the_screening_pass_equal_the_sums_of_the_good_rows_pieces(tmp_path: Path, seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """One day's attribution whose GPU-hours come from the screening pass itself and
    through the good rows' pieces give the same groups, totals and quarantine: files whose
    intervals are each delivered once, and hostile files with copies and snapshots among
    them (counted once by the identity rules: their sums are taken out of the tally)."""
    (tmp_path / "once").mkdir()
    (tmp_path / "random").mkdir()
    once = [_key_file(tmp_path / "once" / f"k{i}.parquet", seed * 10 + i) for i in range(2)]
    hostile = random_files(tmp_path / "random", seed)
    cases = ((once, ["team"], False), (once, ["team", "project"], False), (hostile, ["team", "namespace"], True), (hostile, ["namespace"], True), (hostile, ["gpu_type", "capacity_type", "region"], True))
    for paths, by, twice in cases:
        got, got_q, used = _attribution(paths, by, True, monkeypatch)
        want, want_q, _ = _attribution(paths, by, False, monkeypatch)
        assert used
        assert any(q["field"] == "<row>" for q in got_q) == twice  # copies and superseded records: in the hostile files only
        assert got_q == want_q
        assert [r[: len(by)] for r in got.rows] == [r[: len(by)] for r in want.rows] and len(got.rows) >= 2
        for g, w in zip(got.rows, want.rows):
            assert g[len(by):] == pytest.approx(w[len(by):], rel=1e-12, abs=1e-9)
        assert got.totals == pytest.approx(want.totals, rel=1e-12)


def test_the_rules_that_read_only_the_lookups_keys_are_told_by_what_they_read() -> None:
    """A rule reads only the lookup's keys when every name in it (outside string literals,
    SQL's comparison words aside) is one of them: an empty GPU type or capacity type, an
    unknown capacity type; a rule that also reads another column, or a function, does not;
    and every rule the engine leaves out of its screen when the lookup passes is one of them."""
    from gpu_ops.domain.cost import rules as R

    assert R.reads_only_lookup_keys("capacity_type <> '' AND capacity_type NOT IN ('spot', 'on-demand', 'reserved')")
    assert R.reads_only_lookup_keys('"gpu_type_raw" = \'\'')
    assert not R.reads_only_lookup_keys("capacity_type = '' OR team = ''")  # another column
    assert not R.reads_only_lookup_keys("lower(capacity_type) = 'spot'")  # a function
    assert not R.reads_only_lookup_keys("'capacity_type' = 'region'")  # names in literals only
    assert not R.reads_only_lookup_keys("gpu_type IS NULL")  # the lookup's catalog name, not a key
    keys = [cond for _, cond, _ in R.row_rules() if R.reads_only_lookup_keys(cond)]
    assert {f for f, cond, _ in R.row_rules() if cond in keys} == {"gpu_type", "capacity_type"} and len(keys) == 3
    every, without = R.rules_bad(lookup=False), R.rules_bad(lookup=False, keys=False)
    assert all(f"({cond})" in every and f"({cond})" not in without for cond in keys)
    assert R.key_rules_bad() == "coalesce(" + " OR ".join(f"({c})" for c in keys) + ", false)"
