"""How a ``gpu_asset`` gets its ``GpuCompute``, and what a Definitions without one is told.

Dagster checks resource requirements when the definitions load
(``Definitions.validate_loadable``, which ``dg check defs`` and ``dagster dev`` run), and a
missing one reads "resource with key 'gpu_compute' required by op 'finetune' was not
provided": nothing says it is a ``GpuCompute`` or how to add it. So a ``gpu_asset`` does
not require ``gpu_compute`` itself: it carries a small asset-level resource,
``<key>_for_gpu_assets``, that requires it and hands the author's ``GpuCompute`` to the
step. That resource's requirement describes itself: when the key is missing, the load
fails with a message that names ``GpuCompute``, the line to add and any ``GpuCompute``
the Definitions hold under another key.

A ``gpu_op`` cannot carry resources (ops have none): it is a ``GpuOpDefinition``, an
``OpDefinition`` whose requirement of its compute key is that same self-describing
requirement, so a job or Definitions without it is refused with the same guidance.

Why this shape (Dagster 1.13.27, pinned): an asset-level resource under the author's key
itself would conflict with the author's own resource (Dagster allows one definition per
key), and the op's own requirement (``OpDefinitionResourceRequirement``) is built by
``OpDefinition`` with a fixed wording. The requirement below subclasses Dagster's
``ResourceKeyRequirement`` (``dagster._core.definitions.resource_requirement``, not
public API) and the resource overrides ``ResourceDefinition.get_resource_requirements``,
as Dagster's own nested-resource requirement does; nothing of Dagster is patched. If a
Dagster upgrade moves them, ``gpu_ops_tests/training/test_missing_compute.py`` fails.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import dagster as dg
from dagster._core.definitions.resource_requirement import OpDefinitionResourceRequirement, ResourceKeyRequirement, ResourceRequirement

from gpu_ops.dagster.compute.resource import GpuCompute

SUFFIX = "_for_gpu_assets"


def handover_key(compute_key: str) -> str:
    """The asset-level resource a ``gpu_asset`` requires instead of ``compute_key``."""
    return f"{compute_key}{SUFFIX}"


def _is_gpu_compute(resource: Any) -> bool:
    """A ``GpuCompute`` as given, or as Dagster wraps it in the Definitions (a resource
    definition whose resource function is bound to the ``GpuCompute``)."""
    return isinstance(resource, GpuCompute) or isinstance(getattr(getattr(resource, "resource_fn", None), "__self__", None), GpuCompute)


def missing_compute_message(compute_key: str, resource_defs: Mapping[str, Any]) -> str:
    """What a Definitions without the ``GpuCompute`` under ``compute_key`` is told."""
    others = sorted(k for k, r in resource_defs.items() if _is_gpu_compute(r))
    message = (
        f"gpu_ops training steps (gpu_asset, gpu_op, GpuTrainingComponent) need a GpuCompute resource under key '{compute_key}', "
        "and these Definitions provide none. Add it where the Definitions are built: "
        f"dg.Definitions(assets=[...], resources={{'{compute_key}': gpu_ops.GpuCompute()}}) "
        "(workers on this machine; gpu_ops.KubetorchGpuCompute(...) launches on a cluster, "
        "and GpuCompute(config_path='gpu_ops.yaml') shares the project's configuration). "
        "In a dg project, a module under defs/ with "
        f"`defs = dg.Definitions(resources={{'{compute_key}': gpu_ops.GpuCompute()}})`, "
        "as `dg scaffold defs gpu_ops.components.GpuTrainingComponent` writes; "
        f"a job of gpu_op steps: @dg.job(resource_defs={{'{compute_key}': gpu_ops.GpuCompute()}})."
    )
    if others:
        message += f" These Definitions hold a GpuCompute under {others}: use it with gpu_asset(..., compute_resource_key='{others[0]}')."
    return message


@dataclass(frozen=True)
class ComputeRequirement(ResourceKeyRequirement):
    """A ``gpu_asset``'s need for the ``GpuCompute`` under ``compute_key``."""

    compute_key: str
    source_key: str | None
    needed_by: str = "gpu_ops training assets"

    @property
    def key(self) -> str:
        return self.compute_key

    def describe_requirement(self) -> str:
        return f"GpuCompute resource with key '{self.compute_key}' required by {self.needed_by}"

    def ensure_satisfied(self, resource_defs: Mapping[str, dg.ResourceDefinition]) -> None:
        if self.compute_key not in resource_defs:
            raise dg.DagsterInvalidDefinitionError(f"{self.describe_requirement()} was not provided. {missing_compute_message(self.compute_key, resource_defs)}")
        super().ensure_satisfied(resource_defs)


class GpuOpDefinition(dg.OpDefinition):
    """A ``gpu_op``: its requirement of ``gpu_compute_key`` describes itself (see the module
    docstring); every other requirement is Dagster's own."""

    gpu_compute_key: str

    @classmethod
    def of(cls, op: dg.OpDefinition, compute_key: str) -> GpuOpDefinition:
        """``op`` (as ``dg.op`` built it) as a ``GpuOpDefinition``: the same object, whose
        requirements and copies (``configured``) are this class's."""
        op.__class__ = cls
        assert isinstance(op, GpuOpDefinition)
        op.gpu_compute_key = compute_key
        return op

    def get_resource_requirements(self, handle: Any, asset_layer: Any) -> Iterator[ResourceRequirement]:
        for requirement in super().get_resource_requirements(handle, asset_layer):
            if isinstance(requirement, OpDefinitionResourceRequirement) and requirement.key == self.gpu_compute_key:
                yield ComputeRequirement(compute_key=self.gpu_compute_key, source_key=None, needed_by=f"gpu_op '{handle or self.name}'")
            else:
                yield requirement

    def with_replaced_properties(self, *args: Any, **kwargs: Any) -> dg.OpDefinition:
        return GpuOpDefinition.of(super().with_replaced_properties(*args, **kwargs), self.gpu_compute_key)


class _ComputeHandover(dg.ResourceDefinition):
    """Hands the ``GpuCompute`` under one key to the steps of ``gpu_asset``s."""

    def __init__(self, compute_key: str):
        self.compute_key = compute_key
        super().__init__(
            resource_fn=lambda init_context: getattr(init_context.resources, compute_key),
            required_resource_keys={compute_key},
            description=f"gpu_ops: hands the GpuCompute resource '{compute_key}' to gpu_asset steps (and says how to add it when it is missing).",
        )

    def get_resource_requirements(self, source_key: str | None) -> Iterator[ResourceRequirement]:
        yield ComputeRequirement(compute_key=self.compute_key, source_key=source_key)


# One definition per key, shared by every gpu_asset: Dagster requires the asset-level
# resources of one key to be the same object across the assets of a Definitions.
_HANDOVERS: dict[str, _ComputeHandover] = {}


def compute_handover(compute_key: str) -> dict[str, dg.ResourceDefinition]:
    """``resource_defs`` for a ``gpu_asset`` whose compute is under ``compute_key``."""
    if compute_key not in _HANDOVERS:
        _HANDOVERS[compute_key] = _ComputeHandover(compute_key)
    return {handover_key(compute_key): _HANDOVERS[compute_key]}


def asset_with_handover(fn: Callable[..., Any], compute_key: str, **asset_kwargs: Any) -> dg.AssetsDefinition:
    """``dg.asset(**asset_kwargs)(fn)`` with the handover among its ``resource_defs`` (an
    author's own ``resource_defs`` kept). Asset ``resource_defs`` is a beta parameter of
    Dagster; its warning is not shown, since the choice is gpu_ops's, not the author's."""
    resource_defs = {**(asset_kwargs.pop("resource_defs", None) or {}), **compute_handover(compute_key)}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=dg.BetaWarning, message=".*resource_defs.*")
        return dg.asset(resource_defs=resource_defs, **asset_kwargs)(fn)
