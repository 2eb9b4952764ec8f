"""`gpu-ops plan`: YAML a platform engineer can `kubectl apply --dry-run=server`."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml
from click.testing import CliRunner

from gpu_ops.cli import main


def _plan(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["plan", *args])
    return result.exit_code, result.output


def test_plan_prints_valid_objects(karpenter_crds: dict) -> None:
    code, out = _plan("--gpu-type", "a100-80gb", "--gpus", "8", "--capacity", "spot", "--team", "nlp")
    assert code == 0, out
    docs = list(yaml.safe_load_all(out))
    assert [d["kind"] for d in docs] == ["NodePool", "Deployment"]
    pool, workload = docs
    jsonschema.validate(pool, karpenter_crds["NodePool"])
    kubernetes_validate.validate(workload, kubernetes_validate.latest_version(), strict=True)
    assert pool["metadata"]["name"] == "gpu-ops-nlp-a100-80gb-spot"
    assert pool["spec"]["template"]["spec"]["expireAfter"] == "Never"
    spec = workload["spec"]["template"]["spec"]
    assert spec["nodeSelector"]["karpenter.k8s.aws/instance-gpu-name"] == "a100"
    assert spec["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "8"
    assert "nvidia.com/gpu.product" not in out
    estimate, rest = out.split("\n", 1)
    assert estimate.startswith("# estimate of a run of train")
    assert rest.startswith("# NodePool gpu-ops-nlp-a100-80gb-spot: ")


def test_plan_prints_the_estimate_beside_the_objects(tmp_path: Path) -> None:
    import datetime as dt

    from gpu_ops.domain.config import load_config
    from gpu_ops.storage.tables import TableStore
    from gpu_ops.storage import ledger

    cfg = tmp_path / "gpu_ops.yaml"
    cfg.write_text(yaml.safe_dump({"storage": {"url": "sqlite:///costs.db"}, "prices": {"source": "test", "as_of": "2026-11-01", "gpus": {"h100": {"spot": 4.0, "on-demand": 12.0}}}}))
    args = ("--config", str(cfg), "--gpu-type", "h100", "--gpus", "8", "--team", "vision", "--asset", "finetune")
    code, out = _plan(*args)
    assert code == 0, out
    assert out.startswith("# estimate of a run of finetune: no history: the asset has no successful run")
    code, out = _plan(*args, "--expected-duration", "2h")
    assert out.startswith("# estimate of a run of finetune: spot: 64.00 USD (p90 64.00 USD;") and "on-demand: 192.00 USD" in out.split("\n")[0]
    t0 = dt.datetime(2026, 11, 2, tzinfo=dt.timezone.utc)
    ledger.append(TableStore.from_config(load_config(cfg)), [ledger.LedgerRow(
        start=t0, end=t0 + dt.timedelta(hours=1), namespace="ml", pod="p", node="n", team="vision", project="p", cost_center="", experiment_id="",
        gpu_type="h100", gpu_count=8, capacity_type="spot", sharing="none", gpu_share=1.0, run_id="r1", asset_key="finetune", attempt=1,
        outcome="completed", last_checkpoint_at=None, lost_seconds=0.0,
    )])
    code, out = _plan(*args, "--expected-duration", "2h")
    first = out.split("\n")[0]
    assert first.startswith("# estimate of a run of finetune: spot: 32.00 USD") and "from 1 successful run(s)" in first
    assert [d["kind"] for d in yaml.safe_load_all(out)] == ["NodePool", "NodePool", "Deployment"]
    code, out = _plan(*args, "--expected-duration", "soon")
    assert code != 0 and "--expected-duration" in out


def test_plan_with_managed_node_class_and_run_scoped_pools(tmp_path: Path, karpenter_crds: dict) -> None:
    cfg = tmp_path / "gpu_ops.yaml"
    cfg.write_text(yaml.safe_dump({
        "prices": {"source": "test", "as_of": "2026-11-01", "gpus": {"h100": {"spot": 4.3}}},
        "compute": {
            "backend": "kubetorch", "namespace": "ml", "priority_class": "gpu-training",
            "karpenter": {"manage_ec2nodeclass": True, "node_role": "KarpenterNodeRole-prod", "cluster_name": "prod", "pool_scope": "run", "gpu_limit": 16},
            "kubetorch": {"image": "ghcr.io/acme/train:1.2"},
        },
    }))
    code, out = _plan("--config", str(cfg), "--gpu-type", "h100", "--gpus", "8", "--workers", "2", "--team", "vision", "--run-id", "0f3a9c2e-aaaa")
    assert code == 0, out
    docs = list(yaml.safe_load_all(out))
    assert [d["kind"] for d in docs] == ["EC2NodeClass", "NodePool", "NodePool", "Deployment"]
    jsonschema.validate(docs[0], karpenter_crds["EC2NodeClass"])
    for pool in docs[1:3]:
        jsonschema.validate(pool, karpenter_crds["NodePool"])
        assert pool["metadata"]["labels"]["gpu-ops.io/run-id"] == "0f3a9c2e-aaaa"
        assert pool["spec"]["limits"] == {"nvidia.com/gpu": "16"}
    assert [p["metadata"]["name"] for p in docs[1:3]] == ["gpu-ops-vision-h100-spot-0f3a9c2e", "gpu-ops-vision-h100-on-demand-0f3a9c2e"]
    workload = docs[3]
    kubernetes_validate.validate(workload, kubernetes_validate.latest_version(), strict=True)
    assert workload["metadata"]["namespace"] == "ml" and workload["spec"]["replicas"] == 2
    assert workload["spec"]["template"]["spec"]["priorityClassName"] == "gpu-training"
    assert workload["spec"]["template"]["spec"]["containers"][0]["image"] == "ghcr.io/acme/train:1.2"
    assert workload["metadata"]["labels"]["gpu-ops.io/run-id"] == "0f3a9c2e-aaaa"


def test_plan_errors_name_the_option() -> None:
    code, out = _plan("--gpu-type", "a10", "--team", "nlp")
    assert code == 2 and "--gpu-type: unknown GPU type 'a10'" in out and "a10g" in out
    code, out = _plan("--gpu-type", "h100", "--gpus", "16")
    assert code == 2 and "no h100 instance has 16 GPUs" in out
    code, out = _plan("--gpu-type", "h100", "--team", "NLP team!")
    assert code == 2 and "--team: 'NLP team!' is not a valid Kubernetes label value" in out



@pytest.mark.parametrize(
    ("option", "value", "said"),
    [
        ("--memory", "1e400", "'1e400' is not a memory quantity"),  # was an OverflowError traceback
        ("--memory", "0", "'0' is no memory"),
        ("--memory", "1e30Ei", "more than Kubernetes can hold"),
        ("--cpus", "inf", "--cpus"),
        ("--cpus", "nan", "--cpus"),
        ("--cpus", "1e300", "--cpus"),
        ("--namespace", "UPPER", "'UPPER' is not a Kubernetes namespace name"),
        ("--namespace", "-x", "'-x' is not a Kubernetes namespace name"),
        ("--namespace", "a" * 64, "is not a Kubernetes namespace name"),
        ("--priority-class", "Not Valid", "'Not Valid' is not a Kubernetes object name"),
    ],
)
def test_a_request_kubernetes_would_refuse_is_an_error_naming_the_option(option: str, value: str, said: str) -> None:
    """Values the API server (or the scheduler) would refuse, or that no node can hold,
    are refused here, naming the option: nothing is printed for kubectl to fail on."""
    code, out = _plan("--gpu-type", "h100", option, value)
    assert code == 2 and said in out and "Traceback" not in out, out
    assert "kind: NodePool" not in out


def test_the_configured_namespace_is_checked_where_the_configuration_is(tmp_path: Path) -> None:
    from gpu_ops.domain.config import ConfigError, load_config

    cfg = tmp_path / "gpu_ops.yaml"
    cfg.write_text("prices: {source: s, as_of: 2026-11-01, gpus: {t4: {spot: 1}}}\ncompute: {namespace: ML_Team, priority_class: High Priority}\n")
    with pytest.raises(ConfigError) as caught:
        load_config(cfg)
    assert f"{cfg}: compute.namespace: 'ML_Team' is not a Kubernetes namespace name" in str(caught.value)
    assert f"{cfg}: compute.priority_class: 'High Priority' is not a Kubernetes object name" in str(caught.value)


def test_plan_is_json_clean() -> None:
    # Every value is a plain scalar (no Python objects) so kubectl and jq read it.
    code, out = _plan("--gpu-type", "l4", "--capacity", "spot-then-on-demand")
    assert code == 0
    for doc in yaml.safe_load_all(out):
        json.dumps(doc)
