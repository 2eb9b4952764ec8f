"""The Kubernetes collector against real `kubernetes.client` model objects.

No API server runs here: a stand-in object answers `list_node` / `list_*_pod` with real
V1NodeList / V1PodList models, which is exactly what CoreV1Api returns.
"""

from __future__ import annotations

import datetime as dt
import os

import pandas as pd
import pytest
from kubernetes import client as k

from gpu_ops.flows.cost import kubernetes as k8s
from gpu_ops.flows.cost.attribution import attribute
from gpu_ops.flows.cost.pipeline import SourceSet, load_raw, price_window
from gpu_ops.storage.tables import TableStore

from .helpers import MATRIX

T0 = dt.datetime(2026, 10, 2, 0, 0, tzinfo=dt.timezone.utc)


def node(name, labels, gpus="8"):
    return k.V1Node(
        metadata=k.V1ObjectMeta(name=name, labels=labels, creation_timestamp=T0 - dt.timedelta(days=1)),
        status=k.V1NodeStatus(capacity={"nvidia.com/gpu": gpus, "cpu": "96"}),
    )


def pod(name, node_name, resources, labels=None, start=T0, phase="Running", finished=None, ns="ml"):
    statuses = None
    if finished:
        statuses = [k.V1ContainerStatus(name="main", image="img", image_id="", ready=False, restart_count=0,
                                        state=k.V1ContainerState(terminated=k.V1ContainerStateTerminated(exit_code=0, finished_at=finished)))]
    return k.V1Pod(
        metadata=k.V1ObjectMeta(name=name, namespace=ns, labels=labels or {}),
        spec=k.V1PodSpec(node_name=node_name, containers=[k.V1Container(name="main", image="img", resources=k.V1ResourceRequirements(limits=resources))]),
        status=k.V1PodStatus(phase=phase, start_time=start, container_statuses=statuses),
    )


TEAM = {"gpu-ops.io/team": "nlp", "gpu-ops.io/project": "llm", "app": "trainer"}
NODES = [
    node("spot-a100", {"karpenter.sh/nodepool": "gpu", "karpenter.sh/capacity-type": "spot", "node.kubernetes.io/instance-type": "p4de.24xlarge", "topology.kubernetes.io/region": "us-east-1"}),
    node("od-a100-mig", {"karpenter.sh/nodepool": "gpu", "karpenter.sh/capacity-type": "on-demand", "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB", "nvidia.com/gpu.count": "8"}, gpus="0"),
    node("ts-l4", {"karpenter.sh/nodepool": "gpu", "karpenter.sh/capacity-type": "on-demand", "karpenter.k8s.aws/instance-gpu-name": "l4",
                   "nvidia.com/gpu.replicas": "4", "nvidia.com/gpu.sharing-strategy": "time-slicing", "nvidia.com/gpu.count": "1"}, gpus="4"),
    node("cpu-only", {"node.kubernetes.io/instance-type": "m5.large"}, gpus="0"),
]


class StandInCoreV1:
    """Answers like CoreV1Api, with pagination, from real model objects."""

    def __init__(self, nodes, pods, page=2):
        self.nodes, self.pods, self.page, self.calls = nodes, pods, page, []

    def _paged(self, items, kind, _continue=None):
        start = int(_continue or 0)
        chunk = items[start : start + self.page]
        token = str(start + self.page) if start + self.page < len(items) else None
        meta = k.V1ListMeta(_continue=token)
        return (k.V1NodeList if kind == "node" else k.V1PodList)(items=chunk, metadata=meta)

    def list_node(self, _continue=None):
        self.calls.append("list_node")
        return self._paged(self.nodes, "node", _continue)

    def list_pod_for_all_namespaces(self, _continue=None):
        self.calls.append("list_pod_for_all_namespaces")
        return self._paged(self.pods, "pod", _continue)

    def list_namespaced_pod(self, namespace, _continue=None):
        self.calls.append(f"list_namespaced_pod:{namespace}")
        return self._paged([p for p in self.pods if p.metadata.namespace == namespace], "pod", _continue)


PODS = [
    pod("train-0", "spot-a100", {"nvidia.com/gpu": "4", "cpu": "8"}, TEAM),
    pod("mig-0", "od-a100-mig", {"nvidia.com/mig-1g.10gb": "2"}, {"gpu-ops.io/team": "vision"}),
    pod("nb-0", "ts-l4", {"nvidia.com/gpu": "1"}, {"gpu-ops.io/team": "vision"}, start=T0 + dt.timedelta(hours=2), phase="Succeeded", finished=T0 + dt.timedelta(hours=6)),
    pod("orphan-0", "spot-a100", {"nvidia.com/gpu": "1"}, {"app": "no-team"}),
    pod("cpu-0", "cpu-only", {"cpu": "2"}, TEAM),
    pod("pending-0", "", {"nvidia.com/gpu": "8"}, TEAM, start=None, phase="Pending"),
    pod("other-ns", "spot-a100", {"nvidia.com/gpu": "1"}, TEAM, ns="elsewhere"),
]


def test_collect_pods_reads_gpus_labels_and_node_facts():
    api = StandInCoreV1(NODES, PODS)
    df = k8s.collect_pods(api, ["ml"], observed_at=T0 + dt.timedelta(hours=12)).set_index("pod")
    assert sorted(df.index) == ["mig-0", "nb-0", "orphan-0", "train-0"]  # no CPU, pending or other-namespace pods
    t = df.loc["train-0"]
    assert (t["gpu_type"], t["gpu_count"], t["capacity_type"], t["sharing"], t["gpu_share"], t["region"]) == ("a100-80gb", 4.0, "spot", "none", 1.0, "us-east-1")
    assert (t["team"], t["project"]) == ("nlp", "llm") and pd.isna(t["end"])  # still running
    m = df.loc["mig-0"]
    assert (m["gpu_type"], m["gpu_count"], m["sharing"], m["capacity_type"]) == ("a100-80gb", 2.0, "mig", "on-demand")
    assert m["gpu_share"] == pytest.approx(1 / 7)
    n = df.loc["nb-0"]
    assert (n["gpu_type"], n["sharing"], n["gpu_share"]) == ("l4", "timeslice", 0.25)
    assert pd.Timestamp(n["end"]) == pd.Timestamp(T0 + dt.timedelta(hours=6))
    assert "list_namespaced_pod:ml" in api.calls and api.calls.count("list_node") == 2  # paginated


def test_collected_pods_price_and_quarantine_like_any_source():
    api = StandInCoreV1(NODES, PODS)
    raw = k8s.collect_pods(api, [], observed_at=T0 + dt.timedelta(hours=12))
    p = price_window(raw, None, MATRIX, T0, T0 + dt.timedelta(days=1), T0 + dt.timedelta(hours=12))
    t = attribute(p.rows, ["team"]).table.set_index("team")
    # nlp: train-0 4 spot A100 × 12 h × $1 + other-ns 1 × 12 h × $1 = $60
    assert t.loc["nlp", "cost_usd"] == pytest.approx(60.0)
    # vision: mig-0 2 × 1/7 × 12 h × $4 + nb-0 1/4 × 4 h × $0.80
    assert t.loc["vision", "cost_usd"] == pytest.approx(2 / 7 * 12 * 4 + 0.25 * 4 * 0.8)
    q = p.quarantine
    assert len(q) == 1 and q.loc[0, "field"] == "team" and "pod ml/orphan-0" in q.loc[0, "location"]


def test_recorded_snapshots_close_pods_that_disappeared(tmp_path):
    store = TableStore(f"sqlite:///{tmp_path / 'c.db'}")
    t1, t2 = T0 + dt.timedelta(hours=3), T0 + dt.timedelta(hours=5)
    k8s.record_pods(store, k8s.collect_pods(StandInCoreV1(NODES, PODS), ["ml"], observed_at=t1), t1)
    # Second collection: train-0 is gone (deleted with its node); the rest are still there.
    later = [p for p in PODS if p.metadata.name != "train-0"]
    merged = k8s.record_pods(store, k8s.collect_pods(StandInCoreV1(NODES, later), ["ml"], observed_at=t2), t2)
    assert len(merged) == 4  # recorded once each, not once per collection
    rows = store.read(k8s.COLLECTED_PODS_TABLE).set_index("pod")
    assert pd.Timestamp(rows.loc["train-0", "end"]) == pd.Timestamp(t1)  # closed at its last sighting
    assert rows.loc["mig-0", "end"] is None or pd.isna(rows.loc["mig-0", "end"])


def test_collect_nodes_gives_physical_gpus_of_karpenter_nodes():
    inv = k8s.collect_nodes(StandInCoreV1(NODES, [])).set_index("node")
    assert sorted(inv.index) == ["od-a100-mig", "spot-a100", "ts-l4"]
    assert inv.loc["spot-a100", "gpu_count"] == 8 and inv.loc["spot-a100", "capacity_type"] == "spot"
    assert inv.loc["od-a100-mig", "gpu_count"] == 8 and inv.loc["od-a100-mig", "gpu_type"] == "a100-80gb"
    assert inv.loc["ts-l4", "gpu_count"] == 1 and inv.loc["ts-l4", "gpu_type"] == "l4"  # 4 replicas of 1 GPU


def test_load_raw_collects_through_the_factory_and_records(tmp_path):
    store = TableStore(f"sqlite:///{tmp_path / 'c.db'}")
    from gpu_ops.domain.config import KubernetesSource

    sources = SourceSet(kubernetes=[KubernetesSource(type="kubernetes", namespaces=["ml"])], inventory_karpenter=True)
    usage, inv = load_raw(sources, store, core_api_factory=lambda: StandInCoreV1(NODES, PODS), now=T0 + dt.timedelta(hours=1))
    assert set(pd.concat(usage.frames)["pod"]) == {"train-0", "mig-0", "orphan-0", "nb-0"}
    assert store.has_table(k8s.COLLECTED_PODS_TABLE) and store.has_table(k8s.COLLECTED_NODES_TABLE)
    assert not inv.files and set(pd.concat(inv.frames)["node"]) == {"spot-a100", "od-a100-mig", "ts-l4"}


def test_node_gpu_type_from_labels():
    assert k8s.gpu_type_from_node_labels({"node.kubernetes.io/instance-type": "g5.xlarge"}) == "a10g"
    assert k8s.gpu_type_from_node_labels({"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3-SHARED"}) == "h100"
    assert k8s.gpu_type_from_node_labels({"karpenter.k8s.aws/instance-gpu-name": "a100", "karpenter.k8s.aws/instance-gpu-memory": "40960"}) == "a100"
    assert k8s.gpu_type_from_node_labels({"karpenter.k8s.aws/instance-gpu-name": "a100", "karpenter.k8s.aws/instance-gpu-memory": "81920"}) == "a100-80gb"
    assert k8s.gpu_type_from_node_labels({}) == ""


@pytest.mark.cluster
def test_collect_from_a_live_cluster():
    api = k8s.core_v1_api()
    df = k8s.collect_pods(api)
    assert set(df.columns) >= {"start", "team", "gpu_type", "gpu_count"}
    assert os.environ.get("KUBECONFIG")


def test_collector_job_records_every_run_through_dagster(tmp_path, monkeypatch):
    import dagster as dg
    import yaml

    from gpu_ops.domain.config import BUNDLED_PRICES, load_config
    from gpu_ops.dagster.cost.assets import COLLECT_JOB, COLLECT_SCHEDULE
    from gpu_ops.dagster.cost.definitions import build_defs
    from gpu_ops.dagster.resources import GpuOpsSettings
    from gpu_ops.dagster.io_manager import TableIOManager

    url = f"sqlite:///{tmp_path / 'c.db'}"
    cfg = {
        "storage": {"url": url},
        "prices": str(BUNDLED_PRICES),
        "usage": {"sources": [{"type": "kubernetes", "namespaces": ["ml"]}], "inventory": {"type": "karpenter"}},
    }
    path = tmp_path / "gpu_ops.yaml"
    path.write_text(yaml.safe_dump(cfg))
    monkeypatch.setattr(k8s, "core_v1_api", lambda: StandInCoreV1(NODES, PODS))
    defs = dg.Definitions.merge(
        dg.Definitions(resources={"gpu_ops": GpuOpsSettings(config_path=str(path)), "table_io_manager": TableIOManager(url=url)}),
        build_defs(load_config(path)),
    )
    assert defs.resolve_schedule_def(COLLECT_SCHEDULE).cron_schedule == "*/10 * * * *"
    result = defs.resolve_job_def(COLLECT_JOB).execute_in_process(instance=dg.DagsterInstance.ephemeral())
    assert result.success
    store = TableStore(url)
    assert set(store.read(k8s.COLLECTED_PODS_TABLE)["pod"]) == {"train-0", "mig-0", "nb-0", "orphan-0"}
    assert set(store.read(k8s.COLLECTED_NODES_TABLE)["node"]) == {"spot-a100", "od-a100-mig", "ts-l4"}


def test_no_collector_without_kubernetes_sources():
    from gpu_ops.domain.config import load_config
    from gpu_ops.dagster.cost.assets import build_collector

    assert build_collector(load_config()) == ([], [])
