"""Attribution with DCGM utilisation joined, next to attribution without it.

    flock /tmp/gpu_ops_bench.lock .venv/bin/python benchmarks/efficiency.py [--rows 10M] [--covered 0.1] [--step 300] [--prom-samples 2M]

The usage file is benchmarks/cost.py's (``--data``, generated once and kept). Each mode is
a whole process, run interleaved ``--repeat`` times; best wall time and highest peak RSS:

  plain   read the Parquet file, validate, split by day, price per row
          (``price_window``), attribute by team (the gpu_usage + attribution path);
  joined  the same plus per-pod steps for a ``--covered`` share of the pods (one step per
          ``--step`` seconds over each pod's interval, as Prometheus would return them),
          ``join_efficiency`` over every row and ``group_efficiency`` by team.

The steps are built in the process before the clock of the join starts; the join's own
seconds are printed apart. Both must give the same team costs.

Then the Prometheus side: one ``query_range`` answer of ``--prom-samples`` samples served
by a loopback server (the body is built before the clock starts and held by both), read

  streamed  by gpu_ops (PrometheusClient: bounded exchange, ijson events, packed floats,
            then the per-device frame);
  whole     the way it was read before (httpx, ``response.json()``, a tuple per point): the
            peer, on the same body in the same kind of process (same modules imported
            before the peak RSS baseline is taken).

Both must find the same samples.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import textwrap
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cost import AS_OF, DAY, PRICES, REPO, generate, run_measured  # noqa: E402

SCRIPT = textwrap.dedent(
    """
    import json, sys, time
    import numpy as np, pandas as pd
    from gpu_ops.domain.config import PriceTable
    import yaml
    from gpu_ops.flows.cost.attribution import attribute
    from gpu_ops.flows.cost.pipeline import load_raw, price_window
    from gpu_ops.flows.cost.pricing import PriceMatrix
    from gpu_ops.domain.cost.sources import SourceSet
    from gpu_ops.flows.cost.utilization import SAMPLE_COLUMNS, group_efficiency, join_efficiency

    path, mode, covered, step, day, as_of = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4]), sys.argv[5], sys.argv[6]
    prices = PriceMatrix.from_table(PriceTable.model_validate(yaml.safe_load(open(sys.argv[7]))))
    t0 = time.perf_counter()
    raw = load_raw(SourceSet(usage_files=[path]))[0]
    priced = price_window(raw, None, prices, day, pd.Timestamp(day) + pd.Timedelta(days=1), as_of)
    rows = priced.rows
    t_price = time.perf_counter() - t0
    out = {"rows": len(rows), "price_s": t_price}
    if mode == "joined":
        rng = np.random.default_rng(3)
        alloc = rows
        take = np.flatnonzero(rng.random(len(alloc)) < covered)
        s = alloc["start"].array.asi8[take] // 10**6
        e = alloc["end"].array.asi8[take] // 10**6
        n = np.maximum((e - s) // (step * 1000), 1)
        rep = np.repeat(np.arange(len(take)), n)
        k = np.arange(len(rep)) - np.repeat(np.cumsum(n) - n, n)
        samples = pd.DataFrame({
            "namespace": alloc["namespace"].astype(str).to_numpy()[take][rep], "pod": alloc["pod"].astype(str).to_numpy()[take][rep],
            "t": s[rep] + (k + 1) * step * 1000, "activity": rng.random(len(rep)), "devices": 1,
            "memory_peak_mib": rng.integers(1000, 80000, len(rep)).astype(float), "memory_total_mib": 81920.0,
        })[list(SAMPLE_COLUMNS)]
        del s, e, rep, k
        out["samples"] = len(samples)
        t1 = time.perf_counter()
        rows = join_efficiency(rows, samples, step)
        out["join_s"] = time.perf_counter() - t1
        out["measured_rows"] = int(np.isfinite(rows["efficiency"].to_numpy()).sum())
    t2 = time.perf_counter()
    result = attribute(rows, ["team"])
    table = group_efficiency(result.table, rows, ["team"]) if mode == "joined" else result.table
    out["attribute_s"] = time.perf_counter() - t2
    out["teams"] = {r["team"]: round(float(r["cost_usd"]), 4) for _, r in table.iterrows()}
    if mode == "joined":
        out["efficiency"] = round(float(table["active_gpu_hours"].sum() / rows["metered_gpu_hours"].sum()), 6)
    print(json.dumps(out))
    """
)


PROM = textwrap.dedent(
    """
    import json, resource, sys, threading, time, http.server
    import httpx
    import numpy as np
    import pandas as pd
    from gpu_ops.domain.config import UtilizationConfig
    from gpu_ops.flows.cost.utilization import ACTIVE, PrometheusClient
    n, mode = int(sys.argv[1]), sys.argv[2]
    series, per = max(1, n // 1440), 1440
    t0 = 1791936000
    points = ",".join(f'[{t0 + 60 * (k + 1)},"{(k % 100) / 100:.2f}"]' for k in range(per))
    body = ('{"status":"success","data":{"resultType":"matrix","result":['
            + ",".join('{"metric":{"namespace":"ml","pod":"pod-%d","gpu":"%d","UUID":"GPU-%d"},"values":[%s]}' % (i, i % 8, i, points) for i in range(series))
            + "]}}").encode()

    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200); self.send_header("Content-Type", "application/json"); self.send_header("Content-Length", str(len(body))); self.end_headers()
            self.wfile.write(body)
        def log_message(self, *a): pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{srv.server_address[1]}"
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    if mode == "streamed":
        client = PrometheusClient(UtilizationConfig(type="prometheus", url=url, max_samples=n * 2, timeout_s=600))
        frame = client.frame(client.query_range("q", t0, t0 + 86400), ACTIVE)
        found = len(frame)
    else:
        data = httpx.get(url + "/api/v1/query_range", timeout=600).json()
        rows = [(s["metric"].get("pod", ""), float(t), float(v)) for s in data["data"]["result"] for t, v in s["values"]]
        found = len(rows)
    seconds = time.perf_counter() - start
    print(json.dumps({"samples": found, "seconds": seconds, "body_mib": len(body) / 2**20,
                      "growth_mib": (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024}))
    """
)


def prometheus(samples: int) -> None:
    out = {}
    for mode in ("streamed", "whole"):
        wall, rss, text, _ = run_measured([sys.executable, "-c", PROM, str(samples), mode])
        out[mode] = (rss, json.loads(text.strip().splitlines()[-1]))
    assert out["streamed"][1]["samples"] == out["whole"][1]["samples"], out
    body = out["streamed"][1]["body_mib"]
    print(f"# Prometheus answer: {out['streamed'][1]['samples']:,} samples, {body:.0f} MiB of JSON; load average {os.getloadavg()[0]:.1f}")
    for mode, label in (("streamed", "streamed (gpu_ops)"), ("whole", "whole body (peer: httpx + json)")):
        rss, res = out[mode]
        print(f"{label:34s} read {res['seconds']:6.1f} s  peak RSS {rss:6.0f} MiB  (+{res['growth_mib']:.0f} MiB over the served body)")


def parse_rows(text: str) -> int:
    return int(float(text[:-1]) * 1_000_000) if text.upper().endswith("M") else int(text)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="10M")
    ap.add_argument("--data", default="/work/bench_data")
    ap.add_argument("--covered", type=float, default=0.1, help="share of the pods with DCGM steps")
    ap.add_argument("--step", type=int, default=300, help="seconds per Prometheus step")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--prom-samples", default="2M", help="samples in the Prometheus answer read (0: skip)")
    args = ap.parse_args()
    n = parse_rows(args.rows)
    data = Path(args.data)
    data.mkdir(parents=True, exist_ok=True)
    path = data / f"usage-{args.rows}.parquet"
    if not path.exists():
        generate(path, n)
    print(f"# {n:,} intervals ({path}), {args.covered:.0%} of pods with steps every {args.step} s; load average {os.getloadavg()[0]:.1f}")
    best: dict[str, tuple[float, float, dict]] = {}
    for _ in range(args.repeat):
        for mode in ("plain", "joined"):
            cmd = [sys.executable, "-c", SCRIPT, str(path), mode, str(args.covered), str(args.step), DAY, AS_OF, str(PRICES)]
            wall, rss, out, _cpu = run_measured(cmd)
            res = json.loads(out.strip().splitlines()[-1])
            prev = best.get(mode)
            best[mode] = (min(wall, prev[0]) if prev else wall, max(rss, prev[1]) if prev else rss, res if not prev or wall < prev[0] else prev[2])
    plain, joined = best["plain"][2]["teams"], best["joined"][2]["teams"]
    assert all(abs(plain[t] - joined[t]) <= 1e-6 * max(1.0, abs(plain[t])) for t in plain), "joined attribution differs in cost"
    for mode, (wall, rss, res) in best.items():
        extra = f", join {res['join_s']:.1f} s over {res['samples']:,} pod steps ({res['measured_rows']:,} rows measured)" if mode == "joined" else ""
        print(f"{mode:7s} wall {wall:6.1f} s  peak RSS {rss:7.0f} MiB  (price {res['price_s']:.1f} s, attribute {res['attribute_s']:.1f} s{extra})")
    if parse_rows(args.prom_samples):
        prometheus(parse_rows(args.prom_samples))
    print(f"# load average after: {os.getloadavg()[0]:.1f}; repo {REPO}")


if __name__ == "__main__":
    main()
