"""A month of AWS CUR at fleet scale, read by day for billing reconciliation.

    flock /tmp/gpu_ops_bench.lock .venv/bin/python benchmarks/cur.py [--size-gb 1.2] [--gpu-nodes 400] [--days 3]

Generates (once, kept under ``--data``) an October CUR 2.0 CSV of about ``--size-gb``:
``--gpu-nodes`` GPU instances billed every hour (spot, on-demand, Savings Plan and RI lines)
and, for the bulk of the bytes, the rest of a fleet's bill (non-GPU instances, EBS, data
transfer, S3), ~40 columns wide. Each contender is a whole process (peak RSS from wait4):

  index      gpu_ops: the one indexed read of the file (CurIndex.build: streamed in
             batches of ``usage.billing.batch_rows``, only instance-hour lines kept, one
             Parquet file per day);
  day        gpu_ops: one day from the index (CurIndex.day_lines + gpu_bill), per day;
  peer       DuckDB scanning the whole CSV for the same day's GPU lines (what a day costs
             without an index), per day.

The day's billed total must be the same for ``day`` and ``peer``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import textwrap
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cost import run_measured  # noqa: E402

COLUMNS = [
    "identity_line_item_id", "identity_time_interval", "bill_billing_period_start_date", "line_item_usage_start_date", "line_item_usage_end_date",
    "line_item_line_item_type", "line_item_resource_id", "line_item_usage_type", "line_item_product_code", "line_item_operation",
    "line_item_usage_amount", "line_item_currency_code", "line_item_unblended_rate", "line_item_unblended_cost", "line_item_net_unblended_cost",
    "savings_plan_savings_plan_effective_cost", "reservation_effective_cost", "pricing_term", "product_instance_type", "product_region_code",
    "line_item_usage_account_id", "line_item_availability_zone", "line_item_line_item_description", "product_product_family",
    *[f"resource_tags_user_{t}" for t in ("team", "project", "cost_center", "env", "owner", "service")],
    *[f"product_{p}" for p in ("vcpu", "memory", "storage", "network_performance", "tenancy", "operating_system", "physical_processor", "clock_speed", "ecu", "gpu")],
]
GPU_TYPES = [("p4de.24xlarge", 8, 40.96), ("p5.48xlarge", 8, 98.32), ("g6e.12xlarge", 4, 10.49), ("g5.12xlarge", 4, 5.67)]
DAY = "2026-10-14"

INDEX = textwrap.dedent(
    """
    import sys, time, json
    from pathlib import Path
    from gpu_ops.flows.cost.billing import CurIndex
    t0 = time.perf_counter()
    where = CurIndex(Path(sys.argv[2]), int(sys.argv[3])).build(Path(sys.argv[1]))
    print(json.dumps({"seconds": time.perf_counter() - t0, "index_mib": sum(p.stat().st_size for p in where.glob("*.parquet")) / 2**20}))
    """
)
DAY_READ = textwrap.dedent(
    """
    import sys, time, json
    from pathlib import Path
    from gpu_ops.flows.cost.billing import CurIndex, gpu_bill
    index = CurIndex(Path(sys.argv[2]), int(sys.argv[3]))
    out = []
    for day in sys.argv[4].split(","):
        t0 = time.perf_counter()
        bill = gpu_bill(index.day_lines([Path(sys.argv[1])], day), [])
        out.append({"day": day, "seconds": time.perf_counter() - t0, "billed": round(float(bill.lines["billed_usd"].sum()), 2), "lines": int(bill.lines["lines"].sum())})
    print(json.dumps(out))
    """
)
PEER = textwrap.dedent(
    """
    import sys, time, json, duckdb
    con = duckdb.connect()
    con.execute("SET threads TO 2")
    out = []
    for day in sys.argv[2].split(","):
        t0 = time.perf_counter()
        billed, lines = con.execute(
            "SELECT sum(CAST(CASE line_item_line_item_type WHEN 'SavingsPlanCoveredUsage' THEN savings_plan_savings_plan_effective_cost "
            "WHEN 'DiscountedUsage' THEN reservation_effective_cost ELSE line_item_net_unblended_cost END AS DOUBLE)), count(*) "
            "FROM read_csv(?, all_varchar=true) WHERE line_item_usage_start_date LIKE ? AND line_item_resource_id LIKE 'i-%' "
            "AND regexp_matches(line_item_usage_type, '(^|:|-)(BoxUsage|SpotUsage)(:|$)') AND product_instance_type IN ('p4de.24xlarge','p5.48xlarge','g6e.12xlarge','g5.12xlarge') "
            "AND line_item_line_item_type IN ('Usage','SavingsPlanCoveredUsage','DiscountedUsage')",
            [sys.argv[1], day + "%"],
        ).fetchone()
        out.append({"day": day, "seconds": time.perf_counter() - t0, "billed": round(float(billed or 0), 2), "lines": int(lines)})
    print(json.dumps(out))
    """
)


def generate(path: Path, size_gb: float, gpu_nodes: int) -> None:
    """An October CUR CSV of about ``size_gb``: the GPU fleet's hourly lines and filler lines."""
    import pyarrow as pa
    import pyarrow.csv as pacsv

    rng = np.random.default_rng(7)
    hours = np.arange(np.datetime64("2026-10-01T00"), np.datetime64("2026-11-01T00"), np.timedelta64(1, "h"))
    nodes = [(f"i-{0x0a00000000000000 + i:017x}", *GPU_TYPES[i % len(GPU_TYPES)]) for i in range(gpu_nodes)]
    tmp = path.with_suffix(".tmp")
    written, line_no = 0, 0
    target = int(size_gb * 2**30)
    with pacsv.CSVWriter(str(tmp), pa.schema([(c, pa.string()) for c in COLUMNS])) as writer:
        for h in hours:
            start = f"{h.astype(object):%Y-%m-%dT%H:%M:%SZ}"
            end = f"{(h + np.timedelta64(1, 'h')).astype(object):%Y-%m-%dT%H:%M:%SZ}"
            n_gpu = len(nodes)
            # Filler: the rest of the bill, sized so that the month reaches the target.
            per_hour = max(0, target // len(hours) // 420 - n_gpu)
            n = n_gpu + per_hour
            kinds = np.array(["Usage"] * n, dtype=object)
            rid = np.empty(n, dtype=object)
            utype = np.empty(n, dtype=object)
            itype = np.empty(n, dtype=object)
            cost = np.empty(n, dtype=object)
            sp = np.full(n, "", dtype=object)
            ri = np.full(n, "", dtype=object)
            for i, (iid, t, _g, rate) in enumerate(nodes):
                rid[i], itype[i] = iid, t
                mode = i % 4
                utype[i] = f"USE1-{'SpotUsage' if mode == 0 else 'BoxUsage'}:{t}"
                if mode == 2:
                    kinds[i], sp[i], cost[i] = "SavingsPlanCoveredUsage", f"{rate * 0.6:.8f}", f"{rate:.8f}"
                elif mode == 3:
                    kinds[i], ri[i], cost[i] = "DiscountedUsage", f"{rate * 0.7:.8f}", "0.0"
                else:
                    cost[i] = f"{rate * (0.35 if mode == 0 else 1.0):.8f}"
            k = np.arange(per_hour)
            rid[n_gpu:] = np.where(k % 3 == 0, [f"i-{0x0f00000000000000 + j:017x}" for j in k % 5000], [f"vol-{j:017x}" for j in k % 20000])
            utype[n_gpu:] = np.where(k % 3 == 0, "USE1-BoxUsage:m5.2xlarge", np.where(k % 3 == 1, "USE1-EBS:VolumeUsage.gp3", "USE1-DataTransfer-Regional-Bytes"))
            itype[n_gpu:] = np.where(k % 3 == 0, "m5.2xlarge", "")
            cost[n_gpu:] = [f"{v:.8f}" for v in rng.random(per_hour) * 0.4]
            data = {c: np.full(n, "", dtype=object) for c in COLUMNS}
            data.update({
                "identity_line_item_id": [f"{line_no + j:052x}" for j in range(n)], "identity_time_interval": np.full(n, f"{start}/{end}", dtype=object),
                "bill_billing_period_start_date": "2026-10-01T00:00:00Z", "line_item_usage_start_date": start, "line_item_usage_end_date": end,
                "line_item_line_item_type": kinds, "line_item_resource_id": rid, "line_item_usage_type": utype, "line_item_product_code": "AmazonEC2",
                "line_item_operation": "RunInstances", "line_item_usage_amount": "1.0", "line_item_currency_code": "USD", "line_item_unblended_rate": cost,
                "line_item_unblended_cost": cost, "line_item_net_unblended_cost": cost, "savings_plan_savings_plan_effective_cost": sp,
                "reservation_effective_cost": ri, "pricing_term": "OnDemand", "product_instance_type": itype, "product_region_code": "us-east-1",
                "line_item_usage_account_id": "123456789012", "line_item_availability_zone": "us-east-1a",
                "line_item_line_item_description": "On Demand Linux instance hour", "product_product_family": "Compute Instance",
                "resource_tags_user_team": "ml-platform", "product_operating_system": "Linux", "product_tenancy": "Shared",
            })
            line_no += n
            batch = pa.table({c: pa.array(np.broadcast_to(np.asarray(data[c], dtype=object), (n,)).tolist(), pa.string()) for c in COLUMNS})
            writer.write_table(batch)
            written += n
    tmp.rename(path)
    print(f"# generated {path} ({path.stat().st_size / 2**30:.2f} GiB, {written:,} lines, {gpu_nodes} GPU nodes)", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-gb", type=float, default=1.2)
    ap.add_argument("--gpu-nodes", type=int, default=400)
    ap.add_argument("--days", type=int, default=3, help="days read after the index (per-day figures)")
    ap.add_argument("--batch-rows", type=int, default=16_384)
    ap.add_argument("--data", default="/work/bench_data")
    args = ap.parse_args()
    data = Path(args.data)
    data.mkdir(parents=True, exist_ok=True)
    path = data / f"cur-{args.size_gb:g}gb-{args.gpu_nodes}.csv"
    if not path.exists():
        generate(path, args.size_gb, args.gpu_nodes)
    index = data / f"cur-index-{time.time_ns()}"
    days = ",".join(f"2026-10-{d:02d}" for d in range(14, 14 + args.days))
    print(f"# {path.name}: {path.stat().st_size / 2**30:.2f} GiB; {os.cpu_count()} CPUs; load average before {os.getloadavg()[0]:.2f}", flush=True)
    py = sys.executable
    wall, rss, out, cpu = run_measured([py, "-c", INDEX, str(path), str(index), str(args.batch_rows)])
    built = json.loads(out.strip().splitlines()[-1])
    print(f"index (one read of the month)  wall {wall:7.1f} s  CPU {cpu:6.1f} s  peak RSS {rss:6.0f} MiB  index {built['index_mib']:.1f} MiB  batch_rows {args.batch_rows:,}")
    wall, rss, out, _ = run_measured([py, "-c", DAY_READ, str(path), str(index), str(args.batch_rows), days])
    ours = json.loads(out.strip().splitlines()[-1])
    wall_p, rss_p, out_p, _ = run_measured([py, "-c", PEER, str(path), days])
    peer = json.loads(out_p.strip().splitlines()[-1])
    for a, b in zip(ours, peer):
        assert abs(a["billed"] - b["billed"]) <= 0.01 and a["lines"] == b["lines"], (a, b)
        print(f"day {a['day']}  gpu_ops {a['seconds']:6.2f} s  |  DuckDB full scan (peer) {b['seconds']:6.2f} s  |  billed ${a['billed']:,.2f} in {a['lines']:,} lines (same)")
    print(f"per-day process peak RSS: gpu_ops {rss:.0f} MiB ({args.days} days in {wall:.1f} s), peer {rss_p:.0f} MiB ({wall_p:.1f} s)")
    print(f"# load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
