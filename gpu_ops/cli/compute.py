"""`gpu-ops plan`: print every Kubernetes object a launch would create or patch.

    gpu-ops plan --gpu-type a100-80gb --gpus 8 --capacity spot --team nlp | kubectl apply --dry-run=server -f -

Multi-document YAML: the EC2NodeClass (when ``compute.karpenter.manage_ec2nodeclass``),
the NodePool(s) (when ``manage_nodepools``) and the Kubetorch workload exactly as
``kt.Compute(...).manifest`` builds it, named as the launch would name it. Nothing is
contacted but the gpu_ops database: the first lines (YAML comments) are the launch's
estimate from the ``--asset``'s successful runs in the usage ledger, or from
``--expected-duration`` ("no history" when there is neither).
"""

from __future__ import annotations

from typing import Any

import click
import yaml
from pydantic import ValidationError

from gpu_ops.cli.types import Finite
from gpu_ops.domain.compute.request import Attribution, GpuRequest
from gpu_ops.domain.config import ComputeConfig, ConfigError, load_config, parse_duration


def plan_objects(request: Any, compute: ComputeConfig, *, asset: str = "train", run_id: str | None = None) -> list[tuple[str, dict[str, Any]]]:
    """``[(comment, object), ...]`` in apply order."""
    from gpu_ops.flows.compute.karpenter import ec2nodeclass_manifest, nodepool_manifests
    from gpu_ops.flows.compute.kubetorch_backend import build_compute, workload_manifest
    from gpu_ops.domain.compute.naming import launch_labels, launch_name
    from gpu_ops.dagster.compute.resource import KubetorchGpuCompute

    # The settings a launch gets: the compute section as the GpuCompute resource reads it.
    resource = KubetorchGpuCompute.from_config(compute)
    karpenter = resource.karpenter
    out: list[tuple[str, dict[str, Any]]] = []
    if karpenter.manage_ec2nodeclass:
        out.append(("created, or merge-patched if it exists", ec2nodeclass_manifest(karpenter)))
    if karpenter.manage_nodepools:
        # Run-scoped pools are named after the run; a plan without one shows "plan".
        for pool in nodepool_manifests(request, karpenter, run_id=run_id or "plan"):
            how = "created per run, deleted by its cleanup" if karpenter.pool_scope == "run" else "created, or merge-patched if it exists (limits kept)"
            out.append((how, pool))
    name = launch_name(run_id or "plan", [asset], 0)
    labels = launch_labels(run_id, [asset], request, 0)
    kt_compute = build_compute(request, labels=labels, target=resource)
    out.append((f"the Kubetorch workload of kt.fn(...).to(kt.Compute(...)), service {name}", workload_manifest(kt_compute, name)))
    return out


def plan_estimate(request: Any, config: Any, asset: str, declared_s: float | None) -> str:
    """The launch's estimate (:mod:`gpu_ops.domain.training.estimate`) as YAML comment lines."""
    from gpu_ops.storage.tables import TableStore
    from gpu_ops.storage import ledger
    from gpu_ops.domain.training.estimate import estimate_launch

    try:
        rows = ledger.read(TableStore.from_config(config), asset_key=asset)
    except Exception as exc:  # noqa: BLE001 - the plan is still printed without the ledger
        rows, note = ledger.to_frame([]), f" (the usage ledger could not be read: {type(exc).__name__})"
    else:
        note = ""
    est = estimate_launch(request, rows, config.prices.gpus, declared_s=declared_s, currency=config.prices.currency)
    return f"# estimate of a run of {asset}{note}: {est.describe()}\n"


def render(objects: list[tuple[str, dict[str, Any]]]) -> str:
    docs = []
    for comment, obj in objects:
        head = f"# {obj['kind']} {obj['metadata']['name']}: {comment}\n"
        docs.append(head + yaml.safe_dump(obj, sort_keys=False, default_flow_style=False))
    return "---\n".join(docs)


@click.command()
@click.option("--gpu-type", required=True, help="Catalog name or alias: a100-80gb, h100, NVIDIA-L4, ...")
@click.option("--gpus", type=int, default=1, show_default=True, help="GPUs per worker.")
@click.option("--workers", type=int, default=1, show_default=True, help="Data-parallel workers (nodes).")
@click.option("--capacity", type=click.Choice(["spot", "on-demand", "spot-then-on-demand"]), default="spot-then-on-demand", show_default=True)
@click.option("--team", default="unassigned", show_default=True)
@click.option("--project", default="default", show_default=True)
@click.option("--cost-center", default="")
@click.option("--experiment-id", default="")
@click.option("--cpus", type=Finite(0, min_open=True), default=4.0, show_default=True)
@click.option("--memory", default="16Gi", show_default=True)
@click.option("--image", default=None, help="Worker image (default: compute.kubetorch.image, then Kubetorch's).")
@click.option("--namespace", default=None, help="Namespace (default: compute.namespace).")
@click.option("--priority-class", default=None)
@click.option("--mig-profile", default=None, help="A MIG slice instead of whole GPUs, e.g. 1g.10gb.")
@click.option("--asset", default="train", show_default=True, help="Asset name the launch names objects after.")
@click.option("--run-id", default=None, help="Dagster run id to label with (default: none; a plan is not a run).")
@click.option("--expected-duration", default=None, help="How long a run trains (2h, 90m): the estimate when the asset has no successful run in the ledger.")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), help="gpu_ops YAML file (default: $GPU_OPS_CONFIG, then the plain defaults)")
def plan(config_path: str | None, **opts: Any) -> None:
    """Print, as YAML, every Kubernetes object a launch would create or patch."""
    try:
        config = load_config(config_path)
    except ConfigError as exc:
        raise click.ClickException("the configuration file has problems:\n" + "\n".join(f"  - {p}" for p in exc.problems)) from None
    compute = config.compute
    try:
        request = GpuRequest(
            gpu_type=opts["gpu_type"],
            gpus=opts["gpus"],
            workers=opts["workers"],
            capacity=opts["capacity"],
            cpus=opts["cpus"],
            memory=opts["memory"],
            image=opts["image"],
            namespace=opts["namespace"] or compute.namespace,
            priority_class=opts["priority_class"] or compute.priority_class,
            mig_profile=opts["mig_profile"],
            labels=Attribution(team=opts["team"], project=opts["project"], cost_center=opts["cost_center"], experiment_id=opts["experiment_id"]),
        )
    except ValidationError as exc:
        problems = [f"--{'-'.join(str(p) for p in e['loc']).replace('_', '-') or 'request'}: {e['msg'].removeprefix('Value error, ')}" for e in exc.errors()]
        raise click.UsageError("; ".join(problems)) from None
    try:
        objects = plan_objects(request, compute, asset=opts["asset"], run_id=opts["run_id"])
    except ValueError as exc:  # e.g. a managed EC2NodeClass without node_role
        raise click.ClickException(str(exc)) from None
    declared = _declared_seconds(opts["expected_duration"])
    click.echo(plan_estimate(request, config, opts["asset"], declared) + render(objects), nl=False)


def _declared_seconds(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        seconds = parse_duration(value).total_seconds()
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--expected-duration") from None
    if not seconds > 0:
        raise click.BadParameter(f"{value!r} is not a positive duration", param_hint="--expected-duration")
    return seconds
