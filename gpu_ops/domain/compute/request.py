"""`GpuRequest`: what a launch asks for. A frozen value object; pure (no Dagster)."""

from __future__ import annotations

import math
import re
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

from gpu_ops.domain.compute.catalog import canonical_gpu_type, gpu_share, gpu_spec

Capacity = Literal["spot", "on-demand", "spot-then-on-demand"]
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


# RFC 1123: a namespace is a label, most other objects' names (a PriorityClass) a subdomain.
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
# The largest quantity Kubernetes holds (an int64); CPU quantities are held in millicores.
MAX_QUANTITY = 2**63 - 1


def namespace_name(value: str) -> str:
    """``value`` if it can name a namespace (an RFC 1123 label), else ValueError."""
    if len(value) > 63 or not _DNS_LABEL.match(value):
        raise ValueError(f"{value!r} is not a Kubernetes namespace name (at most 63 lower-case letters, digits and '-', starting and ending with a letter or digit)")
    return value


def object_name(value: str) -> str:
    """``value`` if it can name a Kubernetes object such as a PriorityClass (an RFC 1123
    subdomain), else ValueError."""
    if len(value) > 253 or not _DNS_SUBDOMAIN.match(value):
        raise ValueError(f"{value!r} is not a Kubernetes object name (at most 253 lower-case letters, digits, '-' and '.', starting and ending with a letter or digit)")
    return value


def label_key(value: str) -> str:
    """``value`` if it can be a Kubernetes label's key (``name`` or ``prefix/name``: a
    prefix is an RFC 1123 subdomain, a name at most 63 letters, digits, '-', '_' and '.',
    starting and ending with a letter or digit), else ValueError."""
    prefix, _, name = value.rpartition("/")
    if not name or len(name) > 63 or not _LABEL_VALUE.match(name) or ("/" in value and (len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix))):
        raise ValueError(f"{value!r} is not a Kubernetes label key (name or prefix/name, e.g. example.com/team)")
    return value


# Settings that name a namespace, an object or a label (GpuRequest, the configuration's
# compute section and Kubernetes usage source).
NamespaceName = Annotated[str, AfterValidator(namespace_name)]
ObjectName = Annotated[str, AfterValidator(object_name)]
LabelKey = Annotated[str, AfterValidator(label_key)]

_QUANTITY = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE]([+-]?[0-9]+))?\s*(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E|m)?\s*$")
_SUFFIX = {
    None: 1, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18,
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
}


def parse_memory(value: str | int) -> int:
    """Kubernetes quantity (``32Gi``, ``500M``, ``1e9``, bytes) -> bytes.

    Parsed here rather than with ``kubernetes.utils``: importing that loads the whole
    client, and requests are built while the code location loads.
    """
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    m = _QUANTITY.match(str(value))
    if not m:
        raise ValueError(f"{value!r} is not a memory quantity (use e.g. 32Gi or 512Mi)")
    number, exponent, suffix = m.groups()
    try:
        n_bytes = float(number) * 10.0 ** int(exponent or 0) * _SUFFIX[suffix]
    except OverflowError:  # 1e400: no float holds it
        n_bytes = math.inf
    if not math.isfinite(n_bytes):
        raise ValueError(f"{value!r} is not a memory quantity (use e.g. 32Gi or 512Mi)")
    return math.ceil(n_bytes)


def format_memory(n_bytes: int) -> str:
    gib = n_bytes / 2**30
    return f"{math.ceil(gib)}Gi" if gib >= 1 else f"{math.ceil(n_bytes / 2**20)}Mi"


class Attribution(BaseModel):
    """Who pays: these become pod/NodePool labels and usage-ledger columns."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    team: str = "unassigned"
    """The team the cost is attributed to (and budgets are held against)."""
    project: str = "default"
    """The team's project."""
    cost_center: str = ""
    """A cost center, when the finance side wants one."""
    experiment_id: str = ""
    """An experiment or sweep id, to group runs."""

    @field_validator("team", "project", "cost_center", "experiment_id")
    @classmethod
    def _label_safe(cls, v: str) -> str:
        if len(v) > 63 or not _LABEL_VALUE.match(v):
            raise ValueError(f"{v!r} is not a valid Kubernetes label value (<=63 chars, alphanumerics, '-', '_', '.')")
        return v

    def as_labels(self, prefix: str = "gpu-ops.io/") -> dict[str, str]:
        return {f"{prefix}{k.replace('_', '-')}": v for k, v in self.model_dump().items() if v}


class GpuRequest(BaseModel):
    """GPUs for one launch: ``gpus`` per worker, ``workers`` nodes for data parallelism."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    gpu_type: str
    """A GPU of the catalog (``a100-80gb``, ``h100``, ``t4``, ...); vendor names such as
    ``NVIDIA-A100-SXM4-80GB`` are mapped to it (:func:`canonical_gpu_type`)."""
    gpus: int = Field(default=1, ge=0)
    """GPUs per worker: at most what one node of that type has."""
    workers: int = Field(default=1, ge=1)
    """Workers (nodes) that train together, data parallel."""
    capacity: Capacity = "spot-then-on-demand"
    """``spot``, ``on-demand``, or ``spot-then-on-demand`` (the policy's ``fallback_after``
    moves to on-demand after that many spot preemptions)."""
    cpus: float = Field(default=4, gt=0, le=MAX_QUANTITY / 1000, allow_inf_nan=False)
    """CPUs per worker."""
    memory: str = "16Gi"
    """Memory per worker, as a Kubernetes quantity; raised after an OOM (the policy's
    ``oom_memory_factor``)."""
    image: str | None = None
    """Container image of the worker pods (Kubetorch); None: the deployment's."""
    namespace: NamespaceName = "default"
    """Kubernetes namespace of the worker pods."""
    priority_class: ObjectName | None = None
    """PriorityClass of the worker pods."""
    mig_profile: str | None = None
    """A MIG profile (``1g.10gb``, ...) to run on a slice of the GPU, priced as that share."""
    labels: Attribution = Attribution()
    """Who pays: the pods' and NodePools' labels and the usage ledger's columns."""

    @field_validator("gpu_type")
    @classmethod
    def _canonical(cls, v: str) -> str:
        return canonical_gpu_type(v)

    @field_validator("memory")
    @classmethod
    def _memory(cls, v: str) -> str:
        n_bytes = parse_memory(v)
        if n_bytes <= 0:
            raise ValueError(f"{v!r} is no memory: a worker needs some (use e.g. 32Gi or 512Mi)")
        if n_bytes > MAX_QUANTITY:
            raise ValueError(f"{v!r} is more than Kubernetes can hold in a quantity (2^63 - 1 bytes)")
        return v

    @model_validator(mode="after")
    def _fits(self) -> "GpuRequest":
        spec = gpu_spec(self.gpu_type)
        if self.mig_profile:
            spec.mig_profile(self.mig_profile)
        elif self.gpus and not spec.instance_types_for(self.gpus):
            most = max(spec.instance_types.values())
            raise ValueError(f"no {self.gpu_type} instance has {self.gpus} GPUs (at most {most} per node; use workers for more)")
        return self

    @property
    def memory_bytes(self) -> int:
        return parse_memory(self.memory)

    @property
    def gpu_share(self) -> float:
        return gpu_share(self.gpu_type, self.mig_profile)

    @property
    def total_gpus(self) -> int:
        return self.gpus * self.workers

    @property
    def capacity_types(self) -> list[str]:
        """Karpenter capacity types in preference order."""
        return {"spot": ["spot"], "on-demand": ["on-demand"], "spot-then-on-demand": ["spot", "on-demand"]}[self.capacity]

    def with_memory_factor(self, factor: float, cap: str | None = None) -> "GpuRequest":
        new = int(self.memory_bytes * factor)
        if cap is not None:
            new = min(new, parse_memory(cap))
        return self.model_copy(update={"memory": format_memory(new)})

    def with_capacity(self, capacity: Capacity) -> "GpuRequest":
        return self.model_copy(update={"capacity": capacity})
