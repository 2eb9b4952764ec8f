"""A bill is checked before it prices anything (prices.from_bill).

The same October CUR as test_billing.py, delivered in JPY, in EUR (with and without an
explicit, dated rate), with every line twice (twice in one file and once more in a
redelivered file), and restated: attribution equals the USD bill to the cent, or the day
is blocked by the ERROR, blocking ``billing_reconciled`` check that says why.
"""

from __future__ import annotations

import os
from pathlib import Path

import dagster as dg
import pandas as pd
import pytest
import yaml

from gpu_ops.flows.cost.billing import CurIndex, cur_files, gpu_bill
from gpu_ops_tests.cost.test_billing import NODES, REFUND_DAY, check, cur_month, materialize, write

DAY = REFUND_DAY
MONEY = ["line_item_unblended_cost", "line_item_net_unblended_cost", "savings_plan_savings_plan_effective_cost", "reservation_effective_cost"]
JPY_PER_USD = 153.0
USD_PER_EUR = 1.0825


def in_currency(cur: pd.DataFrame, code: str, units_per_usd: float) -> pd.DataFrame:
    """The same bill in another currency (amounts × units_per_usd, as the CUR writes them)."""
    out = cur.copy()
    for c in MONEY:
        values = pd.to_numeric(out[c].replace("", None), errors="coerce")
        out[c] = [("" if pd.isna(v) else f"{v * units_per_usd:.10f}") if t != "n/a" else t for v, t in zip(values, out[c])]
    out["line_item_currency_code"] = code
    return out


def configure(path: Path, **billing: object) -> Path:
    cfg = yaml.safe_load(path.read_text())
    cfg["usage"]["billing"].update(billing)
    path.write_text(yaml.safe_dump(cfg))
    return path


def attributed(attribution: pd.DataFrame | None) -> float:
    assert attribution is not None
    return round(float(attribution["cost_usd"].sum()), 2)


@pytest.fixture(scope="session")  # once per worker (see conftest.py)
def usd_bill(tmp_path_factory: pytest.TempPathFactory) -> float:
    """Attribution of the day at the USD bill: what every other delivery must equal."""
    tmp = tmp_path_factory.mktemp("usd")
    result, usage, attribution = materialize(write(tmp, cur_month(), "csv", from_bill=True), DAY)
    assert result.success and check(result, "billing_reconciled").passed
    total = attributed(attribution)
    assert total == round(24 * sum(r for *_x, r in NODES), 2)
    return total


def test_a_bill_in_yen_without_a_rate_blocks_attribution_and_says_why(tmp_path, usd_bill):
    config = write(tmp_path, in_currency(cur_month(), "JPY", JPY_PER_USD), "csv", from_bill=True)
    result, usage, _ = materialize(config, DAY)
    ev = check(result, "billing_reconciled")
    assert not ev.passed and ev.severity == dg.AssetCheckSeverity.ERROR
    assert "attribution blocked" in ev.description and "JPY, not the prices' USD" in ev.description and "currency_rates has no JPY rate" in ev.description
    assert ev.metadata["attribution_blocked_days"].value == DAY
    # Blocking: the attribution step did not run; the usage rows kept list prices (never ¥ as $).
    assert not result.success
    assert not result.asset_materializations_for_node("gpu_cost_attribution")
    assert float(usage["cost_usd"].sum()) < 2 * usd_bill


@pytest.mark.parametrize(("code", "units_per_usd"), [("JPY", JPY_PER_USD), ("EUR", 1 / USD_PER_EUR)])
def test_a_bill_in_another_currency_with_a_dated_rate_equals_the_usd_bill_to_the_cent(tmp_path, usd_bill, code, units_per_usd):
    config = write(tmp_path, in_currency(cur_month(), code, units_per_usd), "csv", from_bill=True)
    configure(config, currency_rates={code: {"rate": 1 / units_per_usd, "as_of": "2026-10-31", "source": "test reference rate"}})
    result, _, attribution = materialize(config, DAY)
    assert result.success
    ev = check(result, "billing_reconciled")
    assert ev.passed, ev.description
    assert attributed(attribution) == usd_bill
    assert f"{code}:" in ev.metadata["currency_converted"].value and "as of 2026-10-31" in ev.metadata["currency_converted"].value


def test_a_euro_bill_without_a_rate_is_blocked_not_reported_as_dollars(tmp_path):
    result, _, _ = materialize(write(tmp_path, in_currency(cur_month(), "EUR", 1 / USD_PER_EUR), "csv", from_bill=True), DAY)
    ev = check(result, "billing_reconciled")
    assert not ev.passed and "EUR, not the prices' USD" in ev.description
    assert not result.asset_materializations_for_node("gpu_cost_attribution")


def test_every_line_twice_and_a_redelivered_file_count_once(tmp_path, usd_bill):
    cur = cur_month()
    twice = pd.concat([cur, cur], ignore_index=True)  # every line twice in the file
    config = write(tmp_path, twice, "csv", from_bill=True)
    (tmp_path / "cur" / "cur-00001-redelivered.csv").write_bytes((tmp_path / "cur" / "cur-00001.csv").read_bytes())
    result, _, attribution = materialize(config, DAY)
    assert result.success
    ev = check(result, "billing_reconciled")
    assert ev.passed, ev.description
    assert attributed(attribution) == usd_bill  # was: twice the bill
    # Four copies of each of the day's 97 GPU instance lines (4 nodes × 24 h and the refund): 3 × 97 set aside.
    assert ev.metadata["duplicate_bill_lines"].value == 3 * (4 * 24 + 1)
    assert "291 duplicate line(s) counted once" in ev.description


def test_a_restated_line_counts_at_the_newest_files_amount(tmp_path):
    cur = cur_month()
    day = cur["line_item_usage_start_date"].str.startswith("2026-10-20")
    old = cur.copy()
    l40s = day & (old["line_item_resource_id"] == NODES[3][1])
    old.loc[l40s, "reservation_effective_cost"] = "99.00000000"  # the first version of the bill
    (tmp_path / "cur").mkdir()
    old.to_csv(tmp_path / "cur" / "v1.csv", index=False)
    cur.to_csv(tmp_path / "cur" / "v2.csv", index=False)
    os.utime(tmp_path / "cur" / "v1.csv", (1_700_000_000, 1_700_000_000))  # older
    index = CurIndex(tmp_path / "index")
    lines = index.day_lines(cur_files([str(tmp_path / "cur" / "*.csv")]), "2026-10-20")
    bill = gpu_bill(lines, [n[1] for n in NODES])
    billed = bill.lines.set_index("instance_id")["billed_usd"]
    assert billed[NODES[3][1]] == pytest.approx(24 * NODES[3][7])
    assert bill.restated == 24 and any("24 restated line(s)" in n for n in bill.notes())


def test_lines_without_a_currency_are_quarantined_with_file_and_row(tmp_path):
    cur = cur_month()
    i = int(cur.index[cur["line_item_usage_start_date"].str.startswith("2026-10-20") & (cur["line_item_usage_type"] == "USE1-SpotUsage:p4de.24xlarge")][3])
    cur.loc[i, "line_item_currency_code"] = ""
    cur.to_csv(tmp_path / "cur.csv", index=False)
    lines = CurIndex(tmp_path / "index").day_lines([tmp_path / "cur.csv"], "2026-10-20")
    bill = gpu_bill(lines, [n[1] for n in NODES], currency="USD")
    q = bill.quarantine
    assert len(q) == 1 and q.iloc[0]["field"] == "line_item_currency_code" and q.iloc[0]["row"] == i + 1
    assert "cannot be checked against the prices' USD" in q.iloc[0]["reason"]


def test_the_cur_is_read_once_into_a_day_index_with_batches_of_any_size(tmp_path):
    cur = cur_month()
    cur.to_parquet(tmp_path / "cur.parquet", index=False, row_group_size=500)
    files = [tmp_path / "cur.parquet"]
    small, default = CurIndex(tmp_path / "small", batch_rows=97), CurIndex(tmp_path / "default")
    for day in ("2026-10-01", "2026-10-10", "2026-10-31"):
        a = gpu_bill(small.day_lines(files, day), [n[1] for n in NODES])
        b = gpu_bill(default.day_lines(files, day), [n[1] for n in NODES])
        pd.testing.assert_frame_equal(a.lines, b.lines)
        assert a.lines["day"].unique().tolist() == [pd.Timestamp(day, tz="UTC")]
    (folder,) = [p for p in (tmp_path / "default").iterdir() if p.is_dir()]
    assert len(list(folder.glob("2026-10-*.parquet"))) == 31
    built = (folder / "_done").stat().st_mtime_ns
    default.day_lines(files, "2026-10-05")
    assert (folder / "_done").stat().st_mtime_ns == built  # indexed once, read by day afterwards
    # A new version of the file (AWS rewrites the month's files) is indexed anew; the old index goes.
    cur.to_parquet(tmp_path / "cur.parquet", index=False, row_group_size=500)
    os.utime(tmp_path / "cur.parquet", ns=(built + 10**9, built + 10**9))
    default.day_lines(files, "2026-10-05")
    (newer,) = [p for p in (tmp_path / "default").iterdir() if p.is_dir()]
    assert newer != folder
    folder = newer
    # Only instance-hour lines of i-… resources are indexed (the SP fee lines are not).
    indexed = sum(len(pd.read_parquet(p)) for p in folder.glob("*.parquet"))
    assert indexed == int((cur["line_item_resource_id"].str.startswith("i-") & cur["line_item_usage_type"].str.contains("Usage:")).sum())


def test_a_parquet_export_with_typed_columns_gives_the_same_bill_as_its_csv(tmp_path):
    """CUR 2.0 Parquet stores the start as a timestamp and costs as doubles."""
    cur = cur_month()
    cur.to_csv(tmp_path / "cur.csv", index=False)
    typed = cur.copy()
    typed["line_item_usage_start_date"] = pd.to_datetime(typed["line_item_usage_start_date"], utc=True)
    for c in ("line_item_unblended_cost", "savings_plan_savings_plan_effective_cost", "reservation_effective_cost"):
        typed[c] = pd.to_numeric(typed[c].replace("", None), errors="coerce")
    typed.to_parquet(tmp_path / "cur.parquet", index=False)
    index = CurIndex(tmp_path / "index")
    for day in ("2026-10-03", "2026-10-20"):
        a = gpu_bill(index.day_lines([tmp_path / "cur.csv"], day), [n[1] for n in NODES])
        b = gpu_bill(index.day_lines([tmp_path / "cur.parquet"], day), [n[1] for n in NODES])
        pd.testing.assert_series_equal(a.lines["billed_usd"], b.lines["billed_usd"], rtol=1e-12)
        assert a.lines["instance_id"].tolist() == b.lines["instance_id"].tolist() and len(a.quarantine) == len(b.quarantine)


def test_in_a_two_day_run_only_the_day_that_does_not_reconcile_is_blocked(tmp_path):
    """A backfill of the 20th and 21st: the 21st's lines are in yen without a rate."""
    cur = cur_month()
    day21 = cur["line_item_usage_start_date"].str.startswith("2026-10-21")
    cur = pd.concat([cur[~day21], in_currency(cur[day21], "JPY", JPY_PER_USD)], ignore_index=True)
    config = write(tmp_path, cur, "parquet", from_bill=True)
    from gpu_ops.domain.config import load_config
    from gpu_ops.dagster.cost.assets import build_assets
    from gpu_ops.dagster.resources import GpuOpsSettings
    from gpu_ops.dagster.io_manager import TableIOManager
    from gpu_ops.storage.tables import TableStore

    cfg = load_config(config)
    url = cfg.storage.resolved_url()
    assets, _ = build_assets(cfg)
    resources = {"gpu_ops": GpuOpsSettings(config_path=str(config)), "table_io_manager": TableIOManager(url=url)}
    tags = {"dagster/asset_partition_range_start": "2026-10-20", "dagster/asset_partition_range_end": "2026-10-21"}
    with dg.DagsterInstance.ephemeral() as instance:
        result = dg.materialize(assets, resources=resources, instance=instance, tags=tags, selection=["gpu_usage", "gpu_cost_attribution"], raise_on_error=False)
    ev = check(result, "billing_reconciled")
    assert not ev.passed and ev.metadata["attribution_blocked_days"].value == "2026-10-21"
    assert ev.description.startswith("2026-10-21: attribution blocked") and "2026-10-20" not in ev.description
    usage = TableStore(url).read("gpu_usage")
    day = pd.to_datetime(usage["day"], utc=True)
    idle20 = usage[(day == pd.Timestamp("2026-10-20", tz="UTC")) & (usage["kind"] == "idle")]
    # The 20th is at the bill (all of it idle: allocated + idle = billed); the 21st keeps list prices.
    assert round(float(idle20["cost_usd"].sum()), 2) == round(24 * sum(r for *_x, r in NODES), 2)
    on21 = usage[day == pd.Timestamp("2026-10-21", tz="UTC")]  # at the yen bill they would be 153× these
    assert len(on21) and (on21.loc[on21["kind"] != "idle", "price_per_gpu_hour"].isin([5.12, 7.0, 1.5, 12.29, 2.25])).all()


def _spot_rows(cur: pd.DataFrame, day: str) -> list[int]:
    return [int(i) for i in cur.index[cur["line_item_usage_start_date"].str.startswith(day) & (cur["line_item_usage_type"] == "USE1-SpotUsage:p4de.24xlarge")]]


@pytest.mark.parametrize("batch_rows", [16_384, 7])
def test_a_csv_line_that_cannot_be_read_costs_its_line_not_the_bill(tmp_path, batch_rows):
    """A CUR CSV with lines of the wrong number of fields (one of them not UTF-8, which
    Arrow cannot hand over), a cell that is not UTF-8 and a start outside what a time can
    hold: each was a raw ArrowInvalid/UnicodeDecodeError/OutOfBoundsDatetime that lost the
    whole bill. Now each such line is quarantined with file, row and reason, the other
    lines keep their row numbers, and the day's bill is the rest of its lines."""
    cur = cur_month()
    cur = cur[cur["line_item_usage_start_date"].str.startswith(("2026-10-19", "2026-10-20"))].reset_index(drop=True)
    cur.to_csv(tmp_path / "clean.csv", index=False)
    spot = _spot_rows(cur, "2026-10-20")
    lines = (tmp_path / "clean.csv").read_bytes().split(b"\n")  # lines[0] is the header; data row r is lines[r]
    lines[spot[1] + 1] += b",one field too many"
    lines[spot[2] + 1] = b",".join(lines[spot[2] + 1].split(b",")[:5])  # too few fields
    lines[spot[3] + 1] += b",caf\xe9"  # too many fields, and not UTF-8
    lines[spot[4] + 1] = lines[spot[4] + 1].replace(b"p4de.24xlarge,", b"p4de.24xl\xffarge,", 1)  # the usage type: GPU or not cannot be told
    lines[spot[5] + 1] = lines[spot[5] + 1].replace(b"2026-10-20T05:00:00Z", b"0001-01-01T00:00:00+14:00", 1)
    (tmp_path / "cur.csv").write_bytes(b"\n".join(lines))
    bad = {spot[1] + 1: "<line>", spot[2] + 1: "<line>", spot[3] + 1: "<line>", spot[4] + 1: "line_item_usage_type", spot[5] + 1: "line_item_usage_start_date"}

    index = CurIndex(tmp_path / "index", batch_rows=batch_rows)
    bill = gpu_bill(index.day_lines([tmp_path / "cur.csv"], "2026-10-20"), [n[1] for n in NODES])
    q = bill.quarantine
    assert dict(zip(q["row"].astype(int), q["field"])) == bad, q[["row", "field", "reason"]].to_string()
    assert (q["location"] == str(tmp_path / "cur.csv")).all()
    reasons = dict(zip(q["row"].astype(int), q["reason"]))
    assert "expected 16 fields, saw 17" in reasons[spot[1] + 1] and "expected 16 fields, saw 5" in reasons[spot[2] + 1]
    assert "not UTF-8 text" in reasons[spot[4] + 1] and "0001-01-01T00:00:00+14:00" in reasons[spot[5] + 1]
    billed = bill.lines.set_index("instance_id")["billed_usd"]
    assert billed[NODES[0][1]] == pytest.approx(19 * NODES[0][7])  # 24 hours less the five lines set aside
    assert billed[NODES[1][1]] == pytest.approx(24 * NODES[1][7])
    # the lines after the bad ones kept their own row numbers: the day before reads as its clean file does
    clean = gpu_bill(CurIndex(tmp_path / "clean-index").day_lines([tmp_path / "clean.csv"], "2026-10-19"), [n[1] for n in NODES])
    before = gpu_bill(index.day_lines([tmp_path / "cur.csv"], "2026-10-19"), [n[1] for n in NODES])
    pd.testing.assert_frame_equal(before.lines, clean.lines)
    no_day = set(bad) - {spot[4] + 1}  # its start reads: it belongs to the 20th alone
    assert set(before.quarantine["row"].astype(int)) == no_day  # lines with no readable day: shown on every day, as unreadable starts are


def test_a_cur_path_no_file_system_takes_or_a_fifo_is_a_billing_source_error(tmp_path):
    """A FIFO matched by the bill's glob blocked the read for ever; a name past the file
    system's limit was a raw OSError."""
    from gpu_ops.flows.cost.billing import BillingSourceError

    os.mkfifo(tmp_path / "cur-00001.csv")
    with pytest.raises(BillingSourceError, match=r"cur-00001.csv: not a regular file"):
        cur_files([str(tmp_path / "*.csv")])
    with pytest.raises(BillingSourceError, match="the name is too long"):
        cur_files([str(tmp_path / ("x" * 3000 + ".csv"))])


def test_text_that_is_not_utf8_in_a_cur_file_costs_its_line_or_names_the_file(tmp_path):
    """A CSV header that is not UTF-8 was a raw UnicodeDecodeError: it is a BillingSourceError
    naming the file. Parquet text is not checked as it is read: a string column holding
    bytes that are not UTF-8 was a raw ArrowException ('Wrapping … failed') that lost the
    bill; that line is quarantined now."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from gpu_ops.flows.cost.billing import BillingSourceError

    (tmp_path / "cur.csv").write_bytes(b"line_item_usage_start_date,line_item_resource_id,caf\xe9\n")
    with pytest.raises(BillingSourceError, match=r"cur.csv: not UTF-8 text \(byte b'\\xe9' at offset 52\)"):
        CurIndex(tmp_path / "csv-index").day_lines([tmp_path / "cur.csv"], "2026-10-20")

    cur = cur_month()
    cur = cur[cur["line_item_usage_start_date"].str.startswith("2026-10-20")].reset_index(drop=True)
    table = pa.Table.from_pandas(cur, preserve_index=False)
    raw = pa.array([v.encode() for v in table.column("product_instance_type").to_pylist()], pa.binary())
    data = bytearray(raw.buffers()[2].to_pybytes())
    data[3] = 0xFF  # the first line's instance type
    text = pa.Array.from_buffers(pa.string(), len(raw), [None, raw.buffers()[1], pa.py_buffer(bytes(data))])
    table = table.set_column(table.schema.get_field_index("product_instance_type"), "product_instance_type", text)
    pq.write_table(table, tmp_path / "cur.parquet")
    bill = gpu_bill(CurIndex(tmp_path / "index").day_lines([tmp_path / "cur.parquet"], "2026-10-20"), [n[1] for n in NODES])
    q = bill.quarantine
    assert list(zip(q["row"].astype(int), q["field"])) == [(1, "product_instance_type")] and "not UTF-8 text" in q.iloc[0]["reason"]
    assert len(bill.lines) == 4  # every node still billed, from its other lines
