"""Generate the demo's month of GPU usage (October 2026) and its node inventory.

    python -m gpu_ops.demo.make_usage      # rewrites gpu_ops/demo/usage/2026-10.csv and inventory.csv

Deterministic (a fixed seed). Jobs are laid end to end on each GPU slot of each node, so
no node is ever over-allocated and idle time is real gaps. The mix exercises every rule:
spot / on-demand / reserved, MIG 1g.10gb slices, 4-way time-slicing, an alias GPU name
(``NVIDIA-A100-SXM4-80GB``), an eu-west-1 node (region multiplier), preempted spot jobs with
lost work, intervals across midnight, a node that lives only part of the month, and two
bad rows (an ambiguous ``a10`` GPU and a missing team) that the pipeline quarantines.
With the bundled budgets, nlp crosses 50/80/100% of its $15,000 during the month and its
forecast crosses 120%; vision crosses 80% of its $8,000 late in the month.
"""

from __future__ import annotations

import csv
import datetime as dt
import random
from pathlib import Path

HERE = Path(__file__).parent
MONTH_START = dt.datetime(2026, 10, 1, tzinfo=dt.timezone.utc)
MONTH_END = dt.datetime(2026, 11, 1, tzinfo=dt.timezone.utc)
FIELDS = [
    "start", "end", "namespace", "pod", "node", "team", "project", "cost_center", "experiment_id",
    "gpu_type", "gpu_count", "capacity_type", "sharing", "gpu_share", "region", "outcome", "lost_seconds",
]

# node, instance type, gpu type, GPUs, capacity, region, start, end
NODES = [
    ("ip-10-0-1-11.ec2.internal", "p4de.24xlarge", "a100-80gb", 8, "spot", "us-east-1", "2026-09-28T00:00:00Z", "2026-11-01T00:00:00Z"),
    ("ip-10-0-1-12.ec2.internal", "p4de.24xlarge", "a100-80gb", 8, "on-demand", "us-east-1", "2026-09-28T00:00:00Z", "2026-11-01T00:00:00Z"),
    ("ip-10-0-2-21.eu-west-1.compute.internal", "g6e.12xlarge", "l40s", 4, "on-demand", "eu-west-1", "2026-09-28T00:00:00Z", "2026-11-01T00:00:00Z"),
    ("ip-10-0-3-31.ec2.internal", "p5.48xlarge", "h100", 8, "reserved", "us-east-1", "2026-09-28T00:00:00Z", "2026-11-01T00:00:00Z"),
    ("ip-10-0-4-41.ec2.internal", "g5.12xlarge", "a10g", 4, "spot", "us-east-1", "2026-10-10T06:00:00Z", "2026-10-20T18:00:00Z"),
]

# (node index, slots, gpus per job, sharing, share, busy fraction, job hours range, team, project, namespace, name gpu_type as)
WORKLOADS = [
    (0, 2, 4, "none", 1.0, 0.70, (3, 12), "nlp", "llm-pretrain", "ml-nlp", "a100-80gb"),
    (1, 14, 1, "mig", 1 / 7, 0.60, (4, 16), "vision", "detector-serving", "ml-vision", "NVIDIA-A100-SXM4-80GB"),
    (1, 5, 1, "none", 1.0, 0.60, (1, 8), "nlp", "llm-eval", "ml-nlp", "NVIDIA-A100-SXM4-80GB"),
    (2, 8, 1, "timeslice", 0.25, 0.60, (1, 6), "vision", "notebooks", "ml-vision", "l40s"),
    (2, 2, 1, "none", 1.0, 0.60, (2, 10), "vision", "segmentation", "ml-vision", "l40s"),
    (3, 1, 8, "none", 1.0, 0.35, (4, 20), "research", "rl-agents", "ml-research", "h100"),
    (4, 4, 1, "none", 1.0, 0.60, (1, 6), "research", "ablations", "ml-research", "a10g"),
]
COST_CENTERS = {"nlp": "cc-1001", "vision": "cc-1002", "research": "cc-2001"}


def _ts(t: dt.datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def _parse(s: str) -> dt.datetime:
    return dt.datetime.fromisoformat(s.replace("Z", "+00:00"))


def generate(seed: int = 20261001) -> tuple[list[dict], list[dict]]:
    rng = random.Random(seed)
    rows: list[dict] = []
    pod_no = 0
    for node_i, slots, gpus, sharing, share, busy, (lo, hi), team, project, ns, type_name in WORKLOADS:
        node, _itype, _gtype, _n, capacity, region, n_start, n_end = NODES[node_i]
        life_start, life_end = max(_parse(n_start), MONTH_START), min(_parse(n_end), MONTH_END)
        for _slot in range(slots):
            t = life_start + dt.timedelta(hours=rng.uniform(0, hi))
            while t < life_end:
                hours = rng.uniform(lo, hi)
                end = min(t + dt.timedelta(hours=hours), life_end)
                preempted = capacity == "spot" and rng.random() < 0.10
                lost = round(rng.uniform(300, 2400)) if preempted else 0
                pod_no += 1
                rows.append(
                    {
                        "start": _ts(t), "end": _ts(end), "namespace": ns, "pod": f"{project}-{pod_no:05d}", "node": node,
                        "team": team, "project": project, "cost_center": COST_CENTERS[team],
                        "experiment_id": f"exp-{project[:3]}-{pod_no % 17:03d}", "gpu_type": type_name, "gpu_count": gpus,
                        "capacity_type": capacity, "sharing": sharing, "gpu_share": f"{share:.6f}" if sharing != "none" else "",
                        "region": region, "outcome": "preempted" if preempted else "completed", "lost_seconds": lost,
                    }
                )
                gap = hours * (1 - busy) / busy * rng.uniform(0.5, 1.5)
                t = end + dt.timedelta(hours=gap)
    rows.sort(key=lambda r: (r["start"], r["pod"]))
    bad = dict(rows[0])
    rows.append({**bad, "start": "2026-10-14T09:00:00Z", "end": "2026-10-14T11:00:00Z", "pod": "typo-gpu-00001", "gpu_type": "a10"})
    rows.append({**bad, "start": "2026-10-14T12:00:00Z", "end": "2026-10-14T13:30:00Z", "pod": "no-team-00001", "team": ""})
    inventory = [
        {"node": n, "instance_type": it, "gpu_type": g, "gpu_count": c, "capacity_type": cap, "region": r, "start": s, "end": e}
        for n, it, g, c, cap, r, s, e in NODES
    ]
    return rows, inventory


def write(out_dir: Path = HERE) -> tuple[Path, Path]:
    rows, inventory = generate()
    usage_path = out_dir / "usage" / "2026-10.csv"
    usage_path.parent.mkdir(parents=True, exist_ok=True)
    with usage_path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        w.writeheader()
        w.writerows(rows)
    inv_path = out_dir / "inventory.csv"
    with inv_path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(inventory[0]))
        w.writeheader()
        w.writerows(inventory)
    return usage_path, inv_path


if __name__ == "__main__":
    for p in write():
        print(p)
