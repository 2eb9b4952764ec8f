"""Usage sources and validation: bad rows are quarantined with file, row and reason, never priced."""

from __future__ import annotations

import csv

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gpu_ops.flows.cost.attribution import attribute
from gpu_ops.flows.cost.pipeline import price_window
from gpu_ops.flows.cost.engine import validate
from gpu_ops.flows.cost.pipeline import load_raw
from gpu_ops.flows.cost.read import read_files
from gpu_ops.domain.cost.sources import SourceSet
from gpu_ops.flows.cost.read import USAGE_COLUMNS

from .oracle import validate_usage
from .helpers import MATRIX, raw, row

DAY = pd.Timestamp("2026-10-02", tz="UTC")


def one_reader(patterns):
    """The usage files of ``patterns`` as the package reads them (the one reader)."""
    return load_raw(SourceSet(usage_files=list(patterns)))[0]

NEXT = DAY + pd.Timedelta(days=1)

GOOD = row("2026-10-02T00:00:00Z", "2026-10-02T01:00:00Z")  # $4
BAD = [
    (row("2026-10-02T00:00:00Z", "2026-10-02T01:00:00Z", gpu_type="a10"), "gpu_type", "unknown GPU type 'a10'; did you mean a10g"),
    (row("2026-10-02T05:00:00Z", "2026-10-02T04:00:00Z"), "end", "is before start"),
    (row("yesterday", "2026-10-02T04:00:00Z"), "start", "unparseable time 'yesterday'"),
    (row("2026-10-02T00:00:00Z", "2026-10-02T01:00:00Z", team=""), "team", "missing"),
    (row("2026-10-02T00:00:00Z", "2026-10-02T01:00:00Z", gpu_type="h100", capacity_type="reserved"), "price", "no price for h100 × reserved"),
    (row("2026-10-02T00:00:00Z", "2026-10-02T01:00:00Z", sharing="mig"), "gpu_share", "required when sharing is mig"),
    (row("2026-10-02T00:00:00Z", "2026-10-02T01:00:00Z", capacity_type="preemptible"), "capacity_type", "'preemptible' is not one of"),
    (row("2026-10-02T00:00:00Z", "2026-10-02T01:00:00Z", gpu_count="two"), "gpu_count", "not a number: 'two'"),
    (row("2026-10-02T00:00:00Z", "2026-10-02T01:00:00Z", gpu_count=0), "gpu_count", "must be > 0"),
    (row("2026-10-02T00:00:00Z", "2026-10-02T01:00:00Z", region="ap-south-9"), "region", "no price multiplier for region 'ap-south-9'"),
]


def _write_csv(path, rows):
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def test_bad_rows_are_quarantined_with_file_row_and_reason(tmp_path):
    path = tmp_path / "export.csv"
    rows = [GOOD] + [{**r, "region": r.get("region", "")} for r, _, _ in BAD] + [{**GOOD, "pod": "another"}]
    _write_csv(path, [{**r, "region": r.get("region", "")} for r in rows])
    p = price_window(one_reader([str(path)]), None, MATRIX, DAY, NEXT, NEXT)
    q = p.quarantine.set_index("row")
    assert len(q) == len(BAD)
    for i, (_, field, text) in enumerate(BAD, start=2):  # data row 1 is GOOD
        assert q.loc[i, "location"] == str(path)
        assert q.loc[i, "field"] == field, q.loc[i, "reason"]
        assert text in q.loc[i, "reason"], q.loc[i, "reason"]
    # Nothing bad was priced, at zero or otherwise: only the two good hours remain.
    t = attribute(p.rows, ["team"]).table
    assert t["cost_usd"].sum() == pytest.approx(8.0)
    assert len(p.rows) == 2


def test_a_row_with_several_problems_lists_them_all():
    v = validate_usage(raw([row("nope", "", team="", gpu_type="a10", capacity_type="od")]), MATRIX)
    reason = v.quarantine.loc[0, "reason"]
    for part in ("start: unparseable", "team: missing", "gpu_type: unknown GPU type 'a10'", "capacity_type: 'od'"):
        assert part in reason


def test_quarantined_rows_land_in_their_own_day_and_unknown_days_in_every_day():
    rows = [row("2026-10-05T00:00:00Z", "2026-10-05T01:00:00Z", team=""), row("garbage", "", team="x")]
    on_2nd = price_window(raw(rows), None, MATRIX, DAY, NEXT, NEXT).quarantine
    on_5th = price_window(raw(rows), None, MATRIX, pd.Timestamp("2026-10-05", tz="UTC"), pd.Timestamp("2026-10-06", tz="UTC"), pd.Timestamp("2026-10-06", tz="UTC")).quarantine
    assert list(on_2nd["row"]) == [2]
    assert sorted(on_5th["row"]) == [1, 2]


def test_parquet_with_typed_columns_and_naive_times_as_utc(tmp_path):
    path = tmp_path / "u.parquet"
    table = pa.table(
        {
            "start": pa.array([pd.Timestamp("2026-10-02 00:00"), pd.Timestamp("2026-10-02 02:00")], pa.timestamp("us")),
            "end": pa.array([pd.Timestamp("2026-10-02 03:00"), None], pa.timestamp("us")),
            "namespace": ["ml", "ml"], "pod": ["a", "b"], "node": ["n", "n"],
            "team": pa.array(["nlp", "vision"]).dictionary_encode(), "project": ["p", "p"],
            "cost_center": ["", ""], "experiment_id": ["", ""],
            "gpu_type": pa.array(["NVIDIA-H100-80GB-HBM3", "h100"]).dictionary_encode(), "gpu_count": [2, 1],
            "capacity_type": ["spot", "on-demand"], "sharing": ["none", "none"], "gpu_share": [1.0, 1.0],
        }
    )
    pq.write_table(table, path)
    p = price_window(one_reader([str(tmp_path / "*.parquet")]), None, MATRIX, DAY, NEXT, pd.Timestamp("2026-10-02T06:00:00Z"))
    t = attribute(p.rows, ["team"]).table.set_index("team")
    assert t.loc["nlp", "cost_usd"] == pytest.approx(2 * 3 * 3.0)  # 2 spot H100s × 3 h × $3
    assert t.loc["vision", "cost_usd"] == pytest.approx(4 * 10.0)  # open, clipped at 06:00
    assert p.quarantine.empty


def test_label_columns_of_a_file_become_labels(tmp_path):
    path = tmp_path / "l.csv"
    _write_csv(path, [{**GOOD, "label:tier": "gold"}, {**GOOD, "label:tier": ""}])
    p = price_window(one_reader([str(path)]), None, MATRIX, DAY, NEXT, NEXT)
    t = attribute(p.rows, ["label:tier"]).table.set_index("label_tier")
    assert t["cost_usd"].to_dict() == {"gold": pytest.approx(4.0), "": pytest.approx(4.0)}


def test_unreadable_sources_are_file_level_quarantine_rows_and_the_rest_is_read(tmp_path):
    good = tmp_path / "good.csv"
    _write_csv(good, [GOOD])
    bad = tmp_path / "short.csv"
    bad.write_text("start,end,team\n2026-10-02T00:00:00Z,,nlp\n")
    v = validate(one_reader([str(tmp_path / "missing.csv"), str(bad), str(good), str(tmp_path / "none-*.parquet")]), MATRIX)
    assert len(v.rows) == 1  # the readable file is still priced
    q = v.quarantine
    assert list(q["field"]) == ["<file>"] * 3 and q["row"].isna().all()
    reasons = dict(zip(q["location"], q["reason"]))
    assert reasons[str(tmp_path / "missing.csv")] == "no such file"
    assert reasons[str(bad)].startswith("missing column(s) gpu_type, gpu_count, capacity_type")
    assert reasons[str(tmp_path / "none-*.parquet")].startswith("no file matches")
    assert "gpu_share" in USAGE_COLUMNS


def test_a_file_matched_by_several_patterns_is_read_once(tmp_path):
    good = tmp_path / "good.csv"
    _write_csv(good, [GOOD])
    usage = one_reader([str(good), str(tmp_path / "*.csv"), str(tmp_path / "." / "good.csv")])
    assert len(usage.files) == 1 and not usage.problems


def test_the_same_pod_from_two_sources_is_counted_once():
    a = raw([row("2026-10-02T00:00:00Z", "", pod="p1")])
    b = raw([row("2026-10-02T00:00:00Z", "2026-10-02T05:00:00Z", pod="p1"), row("2026-10-02T00:00:00Z", "2026-10-02T01:00:00Z", pod="")])
    d = validate(pd.concat([a, b], ignore_index=True), MATRIX).rows  # the engine's interval identity
    assert len(d) == 2
    kept = d[d["pod"].astype(str) == "p1"].iloc[0]
    assert kept["end"] == pd.Timestamp("2026-10-02T05:00:00Z")


def test_parquet_reads_only_the_columns_asked_for_and_bad_files_name_themselves(tmp_path):
    good = tmp_path / "a.parquet"
    pq.write_table(pa.table({k: [v] for k, v in GOOD.items() if k in USAGE_COLUMNS}), good)
    cols = ["start", "end", "namespace", "pod", "team", "gpu_type", "gpu_count", "capacity_type"]
    table = read_files([str(good)], None, cols).files[0].load()[0]
    assert table.column("team").to_pylist() == ["nlp"]
    assert "node" not in table.column_names and "pod" in table.column_names  # only the columns asked for

    bad = tmp_path / "b.parquet"
    bad.write_bytes(b"not parquet at all")
    got = read_files([str(bad)], None, cols)
    assert not got.files and got.problems[0][0] == str(bad) and got.problems[0][1].startswith("not a readable Parquet file")


def test_validate_usage_is_a_deprecated_wrapper_over_the_engine():
    """`gpu_ops.validate_usage` still answers (rows, quarantine), now from the engine, and
    says it is deprecated; its figures are the oracle's."""
    import gpu_ops

    rows = raw([row("2026-10-01T00:00:00Z", "2026-10-01T02:00:00Z"), row("2026-10-01T00:00:00Z", "", team=""), row("x", "2026-10-01T01:00:00Z", pod="p9")])
    with pytest.warns(DeprecationWarning, match="deprecated"):
        v = gpu_ops.validate_usage(rows, MATRIX)
    want = validate_usage(rows, MATRIX)
    assert len(v.rows) == len(want.rows) == 1
    assert (v.rows["price_per_gpu_hour"].astype(float).tolist(), v.rows["team"].astype(str).tolist()) == (want.rows["price_per_gpu_hour"].astype(float).tolist(), want.rows["team"].astype(str).tolist())
    assert sorted(zip(v.quarantine["row"].tolist(), v.quarantine["field"])) == sorted(zip(want.quarantine["row"].tolist(), want.quarantine["field"])) == [(2, "team"), (3, "start")]


def test_the_inventory_through_the_engine_matches_the_oracle():
    """The node inventory is checked by the engine's rule book (kind inventory): the node
    is required instead of the team, a blank GPU type and count come from a known instance
    type; the same good nodes and the same quarantine as the pandas oracle."""
    from gpu_ops.flows.cost.read import INVENTORY

    from .helpers import inventory
    from .oracle import validate_inventory

    nodes = inventory([
        {"node": "n1", "instance_type": "p4de.24xlarge", "gpu_type": "", "gpu_count": None, "capacity_type": "spot", "start": "2026-10-01T00:00:00Z", "end": ""},
        {"node": "n2", "instance_type": "", "gpu_type": "l4", "gpu_count": 2, "capacity_type": "on-demand", "start": "2026-10-01T00:00:00Z", "end": "2026-10-01T06:00:00Z"},
        {"node": "", "instance_type": "", "gpu_type": "l4", "gpu_count": 1, "capacity_type": "on-demand", "start": "2026-10-01T00:00:00Z", "end": ""},
        {"node": "n4", "instance_type": "nope.large", "gpu_type": "", "gpu_count": None, "capacity_type": "spot", "start": "2026-10-01T00:00:00Z", "end": ""},
        {"node": "n5", "instance_type": "", "gpu_type": "l4", "gpu_count": 1, "capacity_type": "weekly", "start": "2026-10-01T00:00:00Z", "end": ""},
    ])
    got, want = validate(nodes, MATRIX, kind=INVENTORY), validate_inventory(nodes, MATRIX)
    cols = ["node", "gpu_type", "gpu_count", "capacity_type", "price_per_gpu_hour"]
    as_rows = lambda df: sorted(tuple(str(v) if not isinstance(v, float) else round(v, 9) for v in r) for r in df[cols].astype({"gpu_count": float, "price_per_gpu_hour": float}).itertuples(index=False))
    assert as_rows(got.rows) == as_rows(want.rows) and len(got.rows) == 2
    assert sorted(zip(got.quarantine["row"].tolist(), got.quarantine["field"])) == sorted(zip(want.quarantine["row"].tolist(), want.quarantine["field"]))
    assert len(got.quarantine) == 3
