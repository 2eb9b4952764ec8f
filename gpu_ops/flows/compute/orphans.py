"""Finding and deleting what finished runs left behind: :func:`select_orphans` (pure) and
:class:`OrphanReaper`.

Design: docs/concepts/compute.md#orphans
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any, Callable

from gpu_ops.flows.compute.karpenter import NodePoolClient
from gpu_ops.domain.compute.naming import RUN_ID, managed_selector

FINISHED = ("SUCCESS", "FAILURE", "CANCELED")


@dataclass(frozen=True)
class Owned:
    kind: str  # "KubetorchService" | "NodePool"
    name: str
    namespace: str | None
    run_id: str


@dataclass(frozen=True)
class RunState:
    status: str  # DagsterRunStatus value
    ended_at: dt.datetime | None


@dataclass(frozen=True)
class Verdict:
    obj: Owned
    orphan: bool
    reason: str


def select_orphans(objects: list[Owned], runs: Callable[[str], RunState | None], now: dt.datetime, grace: dt.timedelta) -> list[Verdict]:
    """Decide, per object, whether its run is over for longer than ``grace``."""
    out = []
    for obj in objects:
        state = runs(obj.run_id)
        if state is None:
            out.append(Verdict(obj, False, f"run {obj.run_id} is unknown to this Dagster instance: left alone"))
        elif state.status not in FINISHED:
            out.append(Verdict(obj, False, f"run {obj.run_id} is {state.status}"))
        elif state.ended_at is None or now - state.ended_at < grace:
            out.append(Verdict(obj, False, f"run {obj.run_id} ended {state.status} less than {grace} ago"))
        else:
            ago = now - state.ended_at
            out.append(Verdict(obj, True, f"run {obj.run_id} ended {state.status} {int(ago.total_seconds() // 60)} min ago"))
    return out


def dagster_run_states(instance: Any) -> Callable[[str], RunState | None]:
    """Look runs up in a DagsterInstance (by full run id, as the labels carry it)."""

    def lookup(run_id: str) -> RunState | None:
        record = instance.get_run_record_by_id(run_id)
        if record is None:
            return None
        ended = record.end_time
        ended_at = dt.datetime.fromtimestamp(ended, dt.timezone.utc) if ended else record.update_timestamp
        if ended_at is not None and ended_at.tzinfo is None:
            ended_at = ended_at.replace(tzinfo=dt.timezone.utc)
        return RunState(record.dagster_run.status.value, ended_at)

    return lookup


def _delete_kubetorch_service(name: str, namespace: str) -> None:
    from kubetorch.resources.compute.utils import delete_resources_for_services

    delete_resources_for_services(services=[name], namespace=namespace, force=True, exact_match=True)


class OrphanReaper:
    """List gpu_ops objects that carry a run id and delete those whose run is long over."""

    def __init__(
        self,
        apps_api: Any,
        custom_api: Any,
        namespaces: list[str],
        *,
        delete_service: Callable[[str, str], None] = _delete_kubetorch_service,
    ):
        self.apps = apps_api
        self.custom = custom_api
        self.namespaces = namespaces
        self.delete_service = delete_service

    def owned(self) -> list[Owned]:
        selector = managed_selector()
        found: list[Owned] = []
        for ns in self.namespaces:
            for d in self.apps.list_namespaced_deployment(ns, label_selector=selector).items:
                run_id = (d.metadata.labels or {}).get(RUN_ID)
                if run_id:
                    found.append(Owned("KubetorchService", d.metadata.name, ns, run_id))
        for pool in NodePoolClient(self.custom).list_owned():
            run_id = (pool["metadata"].get("labels") or {}).get(RUN_ID)
            if run_id:  # shared team pools have none
                found.append(Owned("NodePool", pool["metadata"]["name"], None, run_id))
        return found

    def sweep(self, runs: Callable[[str], RunState | None], now: dt.datetime, grace: dt.timedelta, log: Callable[[str], None]) -> list[Verdict]:
        verdicts = select_orphans(self.owned(), runs, now, grace)
        pools = NodePoolClient(self.custom)
        for v in verdicts:
            if not v.orphan:
                continue
            where = f" in {v.obj.namespace}" if v.obj.namespace else ""
            try:
                if v.obj.kind == "KubetorchService":
                    self.delete_service(v.obj.name, v.obj.namespace or "default")
                else:
                    pools.delete(v.obj.name, run_id=v.obj.run_id)
                log(f"deleted orphaned {v.obj.kind} {v.obj.name}{where}: {v.reason}")
            except Exception as exc:  # one failure must not stop the sweep
                log(f"could not delete orphaned {v.obj.kind} {v.obj.name}{where}: {type(exc).__name__}: {exc}")
        return verdicts
