"""Budget enforcement: NodePool patches, the enforcement record, and the launch gate.

Design: docs/concepts/budgets-and-alerts.md#enforcement
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import pandas as pd

from gpu_ops.domain.alerts.model import Refusal, money, period_label, scope_label
from gpu_ops.domain.alerts.state import period_end_passed
from gpu_ops.flows.compute.karpenter import (
    CAPACITY_TYPE_LABEL,
    GPU_RESOURCE,
    KARPENTER_GROUP,
    KARPENTER_VERSION,
    NODEPOOLS,
    NodePoolClient,
    is_managed,
)
from gpu_ops.domain.compute.naming import MANAGED_BY, MANAGED_BY_VALUE, managed_selector
from gpu_ops.domain.config import GpuOpsConfig, load_config
from gpu_ops.storage.tables import StorageUnavailable, TableStore, display_url

ENFORCEMENT_TABLE = "gpu_budget_enforcement"
ENFORCED_BY = "gpu-ops.io/budget-enforced-by"
PRE_ENFORCEMENT = "gpu-ops.io/pre-enforcement"
MERGE_PATCH = "application/merge-patch+json"

# Budget scope key -> NodePool label (GpuCompute labels pools with the attribution).
SCOPE_LABELS = {
    "team": "gpu-ops.io/team",
    "project": "gpu-ops.io/project",
    "cost_center": "gpu-ops.io/cost-center",
    "namespace": "gpu-ops.io/namespace",
}


@dataclass(frozen=True)
class EnforcementOrder:
    """What the enforcement job does; its run config (JSON-safe, no secrets)."""

    event: Literal["apply", "revert"]
    budget: str
    action: Literal["throttle", "block"]
    period_start: str
    period_end: str  # exclusive: the first day of the next period
    scope: dict[str, str] = field(default_factory=dict)  # Budget.scope.as_filters()
    max_gpus: int | None = None
    spot_only: bool = False
    zero_pool_limit: bool = False
    amount_usd: float = 0.0
    spend_usd: float = 0.0
    reason: str = ""
    run_key: str = ""
    config_path: str | None = None  # named in the launch refusal (how to lift)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "EnforcementOrder":
        return cls(**{**data, "scope": dict(data.get("scope") or {})})


# --------------------------------------------------------------------------- plans (pure)


def scope_selector(scope: Mapping[str, str]) -> str:
    """Label selector of the managed NodePools in a budget's scope."""
    return managed_selector(sorted(_scope_labels(scope).items()))


def _scope_labels(scope: Mapping[str, str]) -> dict[str, str]:
    out = {}
    for key, value in scope.items():
        label = key[len("label:") :] if key.startswith("label:") else SCOPE_LABELS.get(key)
        if label:
            out[label] = value
    return out


def _parse_count(value: Any) -> int | None:
    if value is None:
        return None
    from kubernetes.utils import parse_quantity

    return int(parse_quantity(str(value)))


def _requirements(pool: Mapping[str, Any]) -> list[dict[str, Any]]:
    return list(((pool.get("spec") or {}).get("template") or {}).get("spec", {}).get("requirements") or [])


def _capacity_requirement(pool: Mapping[str, Any]) -> dict[str, Any] | None:
    return next((r for r in _requirements(pool) if r.get("key") == CAPACITY_TYPE_LABEL), None)


def _annotations(pool: Mapping[str, Any]) -> dict[str, str]:
    return dict((pool.get("metadata") or {}).get("annotations") or {})


def _enforcers(pool: Mapping[str, Any]) -> list[str]:
    return [b for b in _annotations(pool).get(ENFORCED_BY, "").split(",") if b]


def _snapshot(pool: Mapping[str, Any]) -> dict[str, Any]:
    """The pool before any budget touched it: saved once, by the first enforcer."""
    ann = _annotations(pool)
    if PRE_ENFORCEMENT in ann:
        return json.loads(ann[PRE_ENFORCEMENT])
    limits = (pool.get("spec") or {}).get("limits") or {}
    cap = _capacity_requirement(pool)
    return {"limit": None if limits.get(GPU_RESOURCE) is None else str(limits[GPU_RESOURCE]), "capacity": None if cap is None else list(cap.get("values") or [])}


REMOVE = "remove"  # in a plan: delete the limit / the capacity requirement


@dataclass(frozen=True)
class PoolPlan:
    """What to do to one NodePool. ``limit``/``capacity`` None means leave as is."""

    name: str
    annotations: dict[str, str | None]
    limit: int | str | None = None  # an int, or REMOVE
    capacity: list[str] | str | None = None  # capacity types, or REMOVE

    def describe(self) -> dict[str, Any]:
        return {k: v for k, v in {"annotations": self.annotations, "limit": self.limit, "capacity_types": self.capacity}.items() if v is not None}


def _require_managed(pool: Mapping[str, Any]) -> str:
    name = (pool.get("metadata") or {}).get("name")
    if not is_managed(pool):
        raise PermissionError(f"NodePool {name!r} is not labelled {MANAGED_BY}={MANAGED_BY_VALUE}; enforcement never touches it")
    return str(name)


def _marking(pool: Mapping[str, Any], budget: str) -> dict[str, str | None]:
    enforcers = sorted(set(_enforcers(pool)) | {budget})
    return {ENFORCED_BY: ",".join(enforcers), PRE_ENFORCEMENT: json.dumps(_snapshot(pool), sort_keys=True)}


def throttle_plan(pool: Mapping[str, Any], budget: str, *, max_gpus: int | None, spot_only: bool) -> PoolPlan:
    """Lower the GPU limit to ``max_gpus`` (never raise it) and/or allow spot only."""
    name = _require_managed(pool)
    limit = None
    if max_gpus is not None:
        current = _parse_count(((pool.get("spec") or {}).get("limits") or {}).get(GPU_RESOURCE))
        limit = max_gpus if current is None else min(current, max_gpus)
    return PoolPlan(name, _marking(pool, budget), limit, ["spot"] if spot_only else None)


def block_plan(pool: Mapping[str, Any], budget: str) -> PoolPlan:
    """GPU limit 0: Karpenter adds no GPU node to the pool (running ones stay)."""
    return PoolPlan(_require_managed(pool), _marking(pool, budget), 0, None)


def revert_plan(pool: Mapping[str, Any], budget: str) -> PoolPlan | None:
    """Undo ``budget``'s enforcement; None when it has none on this pool."""
    enforcers = _enforcers(pool)
    if budget not in enforcers or not is_managed(pool):
        return None
    name = str(pool["metadata"]["name"])
    remaining = [b for b in enforcers if b != budget]
    if remaining:
        # Another budget still enforces here: leave the pool as it is, forget this budget.
        return PoolPlan(name, {ENFORCED_BY: ",".join(remaining)})
    snap = _snapshot(pool)
    cap = _capacity_requirement(pool)
    current_cap = None if cap is None else list(cap.get("values") or [])
    limit = REMOVE if snap.get("limit") is None else _parse_count(snap["limit"])
    capacity = None if current_cap == snap.get("capacity") else (snap.get("capacity") or REMOVE)
    return PoolPlan(name, {ENFORCED_BY: None, PRE_ENFORCEMENT: None}, limit, capacity)


# --------------------------------------------------------------------------- the cluster


class NodePools:
    """Carries plans out through the compute flow's ``NodePoolClient`` (which refuses
    pools without the managed-by label), on a ``kubernetes.client.CustomObjectsApi``."""

    def __init__(self, api: Any):
        self.api = api
        self.client = NodePoolClient(api)

    def managed(self, scope: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
        scope = dict(scope or {})
        want = _scope_labels(scope)
        pools = self.client.list_owned(team=scope.get("team"))
        # The client selects on team only; the rest of the scope, and the managed-by
        # label itself, are checked here on every object.
        return [p for p in pools if is_managed(p) and all(((p["metadata"].get("labels") or {}).get(k) == v) for k, v in want.items())]

    def _merge(self, name: str, body: dict[str, Any]) -> None:
        self.api.patch_cluster_custom_object(KARPENTER_GROUP, KARPENTER_VERSION, NODEPOOLS, name, body, _content_type=MERGE_PATCH)

    def _spec(self, plan: PoolPlan) -> None:
        if plan.limit == REMOVE:
            self._merge(plan.name, {"spec": {"limits": {GPU_RESOURCE: None}}})
        elif plan.limit is not None:
            self.client.patch_limits(plan.name, int(plan.limit))
        if plan.capacity == REMOVE:
            pool = self.client.get(plan.name) or {}
            reqs = [r for r in _requirements(pool) if r.get("key") != CAPACITY_TYPE_LABEL]
            self._merge(plan.name, {"spec": {"template": {"spec": {"requirements": reqs}}}})
        elif plan.capacity is not None:
            self.client.patch_capacity_types(plan.name, list(plan.capacity))

    def enforce(self, plan: PoolPlan) -> None:
        # The annotation (with the original values) goes first: a crash after it leaves
        # a pool that a retry or a revert knows how to restore.
        self._merge(plan.name, {"metadata": {"annotations": plan.annotations}})
        self._spec(plan)

    def restore(self, plan: PoolPlan) -> None:
        # The spec first, the annotation last, for the same reason.
        self._spec(plan)
        self._merge(plan.name, {"metadata": {"annotations": plan.annotations}})


@dataclass
class EnforcementOutcome:
    order: EnforcementOrder
    plans: dict[str, PoolPlan] = field(default_factory=dict)  # pool name -> what to change
    note: str = ""

    def describe(self) -> dict[str, dict[str, Any]]:
        return {name: plan.describe() for name, plan in sorted(self.plans.items())}


def plan(order: EnforcementOrder, pools: NodePools | None) -> EnforcementOutcome:
    """What ``order`` changes on which NodePool (reads the pools, changes nothing)."""
    outcome = EnforcementOutcome(order)
    if pools is None:
        outcome.note = "no Kubernetes cluster configured: NodePools untouched; GpuCompute launches are gated"
        return outcome
    if order.event == "apply":
        if order.action == "block" and not order.zero_pool_limit:
            outcome.note = "block without zero_pool_limit: GpuCompute refuses launches; NodePools untouched"
            return outcome
        for pool in pools.managed(order.scope):
            if order.action == "throttle":
                p = throttle_plan(pool, order.budget, max_gpus=order.max_gpus, spot_only=order.spot_only)
            else:
                p = block_plan(pool, order.budget)
            outcome.plans[p.name] = p
        if not outcome.plans:
            outcome.note = f"no managed NodePool matches {scope_selector(order.scope)}"
    else:
        # Revert wherever this budget left its mark, even if its scope changed since.
        for pool in pools.managed({}):
            reverted = revert_plan(pool, order.budget)
            if reverted is not None:
                outcome.plans[reverted.name] = reverted
    return outcome


def execute(outcome: EnforcementOutcome, pools: NodePools | None) -> None:
    """Carry the plans out; running the same order again changes nothing more."""
    if pools is None:
        return
    for p in outcome.plans.values():
        pools.enforce(p) if outcome.order.event == "apply" else pools.restore(p)


def carry_out(order: EnforcementOrder, pools: NodePools | None) -> EnforcementOutcome:
    outcome = plan(order, pools)
    execute(outcome, pools)
    return outcome


# --------------------------------------------------------------------------- the record


def record_frame(outcome: EnforcementOutcome, *, at: dt.datetime, run_id: str | None) -> pd.DataFrame:
    o = outcome.order
    return pd.DataFrame(
        {
            "budget": [o.budget],
            "event": ["applied" if o.event == "apply" else "reverted"],
            "action": [o.action],
            "period_start": [o.period_start],
            "period_end": [o.period_end],
            "scope": [json.dumps(o.scope, sort_keys=True)],
            "max_gpus": [float("nan") if o.max_gpus is None else float(o.max_gpus)],
            "spot_only": [bool(o.spot_only)],
            "zero_pool_limit": [bool(o.zero_pool_limit)],
            "amount_usd": [float(o.amount_usd)],
            "spend_usd": [float(o.spend_usd)],
            "pools": [json.dumps(sorted(outcome.plans))],
            "reason": [o.reason],
            "note": [outcome.note],
            "run_key": [o.run_key],
            "config_path": [o.config_path or ""],
            "run_id": [run_id or ""],
            "at": [pd.Timestamp(at).tz_convert("UTC") if pd.Timestamp(at).tzinfo else pd.Timestamp(at, tz="UTC")],
        }
    )


def active_enforcements(records: pd.DataFrame, now: dt.datetime) -> list[dict[str, Any]]:
    """The newest record per budget, when it is an apply whose period has not ended."""
    if records is None or records.empty:
        return []
    newest = records.sort_values("at", kind="stable").groupby("budget", sort=False).tail(1)
    today = now.astimezone(dt.timezone.utc)
    out = []
    for rec in newest.to_dict("records"):
        if rec["event"] == "applied" and not period_end_passed(str(rec["period_end"])[:10], today):
            rec["scope"] = json.loads(rec["scope"]) if isinstance(rec["scope"], str) else dict(rec["scope"] or {})
            mg = rec.get("max_gpus")
            rec["max_gpus"] = None if mg is None or (isinstance(mg, float) and math.isnan(mg)) else int(mg)
            out.append(rec)
    return out


def _request_attrs(request: Any) -> dict[str, str]:
    if isinstance(request, Mapping):
        return {k: str(v) for k, v in request.items() if v is not None}
    labels = getattr(request, "labels", None)
    attrs = {k: str(getattr(labels, k)) for k in ("team", "project", "cost_center", "experiment_id") if labels is not None and getattr(labels, k, None)}
    if getattr(request, "namespace", None):
        attrs["namespace"] = str(request.namespace)
    return attrs


def scope_matches(scope: Mapping[str, str], attrs: Mapping[str, str]) -> bool:
    """All of the scope's keys must match; a ``label:`` key the request cannot show does not."""
    return all(attrs.get(key) == value for key, value in scope.items())


def launch_refusal(active: list[dict[str, Any]], request: Any) -> str | None:
    """Why a launch must not start, or None. Pure."""
    attrs = _request_attrs(request)
    total = getattr(request, "total_gpus", None)
    capacity = getattr(request, "capacity", None)
    for rec in active:
        if not scope_matches(rec["scope"], attrs):
            continue
        scope = scope_label(rec["scope"], "all GPU launches")
        end = dt.date.fromisoformat(str(rec["period_end"])[:10])
        where = f" in {rec['config_path']}" if rec.get("config_path") else ""
        spent = f"spent {money(rec['spend_usd'])} of {money(rec['amount_usd'])} in the period {period_label(rec['period_start'], end.isoformat())}"
        lift = (
            f"To lift it: raise budgets[{rec['budget']}].amount_usd{where} (the alert sensor lifts it at its next evaluation), "
            f"set that budget's enforcement.action to alert, or wait for the period to end on {end.isoformat()}."
        )
        if rec["action"] == "block":
            return f"GPU launches for {scope} are blocked by budget {rec['budget']!r}: it has {spent}. {lift}"
        if rec["action"] == "throttle":
            if rec["max_gpus"] is not None and total is not None and total > rec["max_gpus"]:
                return (
                    f"GPU launches for {scope} are throttled to {rec['max_gpus']} GPUs by budget {rec['budget']!r} "
                    f"(this launch asks for {total}): it has {spent}. {lift}"
                )
            if rec["spot_only"] and capacity == "on-demand":
                return (
                    f"GPU launches for {scope} are restricted to spot capacity by budget {rec['budget']!r} "
                    f"(this launch asks for on-demand; use capacity='spot' or 'spot-then-on-demand'): it has {spent}. {lift}"
                )
    return None


def _store_for(source: Any) -> Any:
    if isinstance(source, TableStore):
        return source
    if isinstance(source, str):
        return TableStore(source)
    config = source if isinstance(source, GpuOpsConfig) else load_config()
    return TableStore.from_config(config)


def check_launch(source: Any, request: Any, *, now: dt.datetime | None = None) -> Refusal | None:
    """The :class:`Refusal` of this launch when a budget blocks or throttles it, else None
    (:func:`gpu_ops.assert_launch_allowed` raises it as a step failure).

    ``source``: a GpuOpsConfig, a TableStore, a storage URL, or None (the loaded config).
    No enforcement table yet means nothing was ever enforced: the launch goes ahead. An
    unreachable database fails open (logged): the enforcement record lives there, and a
    storage outage should not stop every training run.
    """
    store = _store_for(source)
    try:
        records = store.read(ENFORCEMENT_TABLE, missing_ok=True)
    except Exception as exc:  # the database is down: do not stop training over it
        # Bounded by storage.connect_timeout_s / statement_timeout_s, never a hang.
        why = str(exc) if isinstance(exc, StorageUnavailable) else f"{type(exc).__name__} reading {ENFORCEMENT_TABLE} in {display_url(store.url)}"
        logging.getLogger("gpu_ops.alerts").warning(f"budget enforcement could not be checked ({why}); the launch goes ahead")
        return None
    reason = launch_refusal(active_enforcements(records, now or dt.datetime.now(dt.timezone.utc)), request)
    return None if reason is None else Refusal(reason, {"refused_by": "gpu_budget_enforcement"})
